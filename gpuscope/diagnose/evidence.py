"""Figures derived from the record that several parts of the diagnosis rest on (computed in one place), and the
``Metric`` type with which each rule names the figure that shows its fix took (read by ``gpuscope compare``)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gpuscope.diagnose.clock import step_times, steady_times
from gpuscope.diagnose.thresholds import (ACCUMULATED_MFU, COUNTED_STEP_UNLIKE, EVALUATION_LOADING_WORTH_SAYING,
                                          EVALUATION_WORTH_SAYING, TWO_SPEED_GAP, TWO_SPEED_MIN_SHARE,
                                          TWO_SPEED_SEPARATION, WINDOW_UNLIKE)
from gpuscope.record import Communication, KernelTimeline, Loader, RunRecord

MIN_COMPUTE_S = 1e-9
"""Floor of ``median_compute_s``: a step that is all data wait still consumes batches at a finite rate."""


@dataclass(frozen=True, slots=True)
class Overhead:
    """Per-op fixed cost in a CPU run's step: ``ops_per_step`` x ``op_cost_s`` = ``seconds``, ``share`` of the
    steady-state median step (0..1)."""

    ops_per_step: float
    op_cost_s: float
    seconds: float
    share: float


def cpu_overhead(record: RunRecord) -> Overhead | None:
    """The share of the step that is per-op fixed cost, from the op profile and the calibration; None if either
    is missing."""
    ops, calibration, median = record.op_profile, record.calibration, record.steps.median_s
    if ops is None or not ops.ops or calibration is None or not calibration.op_overhead_s or not median:
        return None
    per_step = ops.compute_ops_per_step  # (the DataLoader's own ops build batches: the data wait's, not the step's)
    seconds = per_step * calibration.op_overhead_s
    return Overhead(per_step, calibration.op_overhead_s, seconds, min(1.0, seconds / median))


def profile_window(record: RunRecord) -> tuple[int, int] | None:
    """The first and last steps of the op profile's window, or None where it has none."""
    window = record.op_profile.window if record.op_profile is not None else None
    if window is None or window.first_step is None:
        return None
    return window.first_step, window.last_step if window.last_step is not None else window.first_step


@dataclass(frozen=True, slots=True)
class UnlikeSteps:
    """Steps ``first``..``last`` (a profiler's window) whose median wall time, ``median_s``, is ``ratio`` times the
    steady median, and the ``--skip-steps`` count that would move them onto steps like the steady ones."""

    first: int
    last: int
    median_s: float
    ratio: float
    skip: int


def unlike_steps(record: RunRecord, first: int, last: int) -> UnlikeSteps | None:
    """Steps ``first``..``last`` where they do not describe the steady-state ones, or None: their median wall time
    (kept in the step sample) is ``WINDOW_UNLIKE`` times longer or shorter than the steady median, the run having
    changed pace after them (a first phase that trains another model, a slow start)."""
    steps = record.steps
    times = [t for i, t in zip(steps.sample.index, step_times(steps)) if first <= i <= last and t > 0]
    if not times or not steps.median_s:
        return None
    ratio = statistics.median(times) / steps.median_s
    if 1 / WINDOW_UNLIKE < ratio < WINDOW_UNLIKE:
        return None
    return UnlikeSteps(first, last, statistics.median(times), ratio, _skip_to_steady(record, first, last))


NEIGHBOURS = 3
"""Steps on each side of the FLOP-counted one that tell whether it lies among steps like the steady ones."""


def steady_steps_near(record: RunRecord, step: int) -> list[float]:
    """The sampled steady steps' times nearest ``step``, ``NEIGHBOURS`` on each side at most."""
    return [t for i, t in _steady_walls(record).items() if 0 < abs(i - step) <= NEIGHBOURS]


def steps_around(record: RunRecord, step: int) -> UnlikeSteps | None:
    """The steady steps nearest ``step`` (``steady_steps_near``) where their median is ``COUNTED_STEP_UNLIKE`` times
    the steady median or more (or as far below), or None: a step counted there (its own time no guide: the FLOP
    counter sends every op through Python, and an LBFGS loop's 1.6 s steps took 10.5 s) is of another size than the
    median one, as a reinforcement-learning loop's early episodes are than its later ones."""
    near = steady_steps_near(record, step)
    if not near or not record.steps.median_s:
        return None
    ratio = statistics.median(near) / record.steps.median_s
    if 1 / COUNTED_STEP_UNLIKE < ratio < COUNTED_STEP_UNLIKE:
        return None
    return UnlikeSteps(step, step, statistics.median(near), ratio, _skip_to_steady(record, step, step))


def _steady_walls(record: RunRecord) -> dict[int, float]:
    """The sampled steady steps' times on the steps' clock, by step index."""
    return steady_times(record.steps)


def _skip_to_steady(record: RunRecord, first: int, last: int) -> int:
    """The ``--skip-steps`` count that moves steps ``first``..``last`` (a window: every window moves as far) onto
    steady steps like the median one (their median within a factor of sqrt(WINDOW_UNLIKE) of it, well inside): past
    the warm-up, and further where the steps after it are still unlike the median (a run whose steps lengthen as it
    goes, as a reinforcement-learning loop's episodes do). The warm-up's count where no such steps were sampled."""
    steps, usable = record.steps, _steady_walls(record)
    like = math.sqrt(WINDOW_UNLIKE)
    for skip in range(steps.warmup, max(usable, default=0) - last + 1):
        times = [usable[i] for i in range(first + skip, last + skip + 1) if i in usable]
        if len(times) == last - first + 1 and 1 / like <= statistics.median(times) / steps.median_s <= like:
            return skip
    return steps.warmup


@dataclass(frozen=True, slots=True)
class TwoSpeeds:
    """Steady steps at two speeds: how many of each, their medians, how far apart, and which steps are slow."""

    fast: int
    slow: int
    fast_s: float
    slow_s: float
    apart: float
    slow_steps: tuple[int, ...]


def two_speeds(record: RunRecord) -> TwoSpeeds | None:
    """Where the steady-state steps run at two speeds, what each group takes and which steps are slow: the median
    describes neither group then. The groups split the log step times where they are most apart (Otsu's threshold):
    two speeds where that split explains ``TWO_SPEED_SEPARATION`` of the log times' variance, the groups' medians are
    ``TWO_SPEED_GAP`` apart, and each group is at least ``TWO_SPEED_MIN_SHARE`` of the steps. None for one speed."""
    sample = record.steps.sample
    steady = sorted((t, i) for i, t, s in zip(sample.index, step_times(record.steps), sample.status)
                    if s == "steady" and t > 0)
    n = len(steady)
    least = max(2, math.ceil(TWO_SPEED_MIN_SHARE * n))
    logs = [math.log(t) for t, _ in steady]
    if n < 2 * least or not (total := statistics.pvariance(logs)):
        return None
    mean, split, best = sum(logs) / n, 0, 0.0
    below = sum(logs[:least - 1])  # the k fastest steps' log times, added up as k grows
    for k in range(least, n - least + 1):
        below += logs[k - 1]
        low = below / k
        between = k / n * (1 - k / n) * ((low - mean) / (1 - k / n)) ** 2  # w0 w1 (mu0 - mu1)^2, mu1 from the mean
        if between > best:
            split, best = k, between
    fast, slow = [t for t, _ in steady[:split]], [t for t, _ in steady[split:]]
    apart = statistics.median(slow) / statistics.median(fast) if split else 0.0
    if best / total < TWO_SPEED_SEPARATION or apart < TWO_SPEED_GAP:
        return None
    return TwoSpeeds(len(fast), len(slow), statistics.median(fast), statistics.median(slow), apart,
                     tuple(sorted(i for _, i in steady[split:])))


@dataclass(frozen=True, slots=True)
class EvaluationTime:
    """What the steps left out as evaluation passes took (with a pass after the last step), against the steady steps'
    time, and the loader the evaluation waited for where that wait is worth saying."""

    evaluated_s: float
    steady_s: float
    loader: Loader | None


def evaluation_time(record: RunRecord) -> EvaluationTime | None:
    """What the evaluation passes took, where it is ``EVALUATION_WORTH_SAYING`` of the steady steps' time or more;
    None otherwise. The loader is the one the evaluation waited for longest, where that is
    ``EVALUATION_LOADING_WORTH_SAYING`` of the passes' time."""
    steps = record.steps
    steady_s = steps.count * steps.mean_s
    evaluated_s = steps.evaluated_s + steps.final_evaluation_s
    if not evaluated_s or not steady_s or evaluated_s < EVALUATION_WORTH_SAYING * steady_s:
        return None
    loader = max(record.loaders, key=lambda loader: loader.eval_wait_s, default=None)
    if loader is not None and loader.eval_wait_s < EVALUATION_LOADING_WORTH_SAYING * evaluated_s:
        loader = None
    return EvaluationTime(evaluated_s, steady_s, loader)


def median_compute_s(record: RunRecord) -> float:
    """The part of the median step (s) that is not data wait: the time the step computes, at least
    ``MIN_COMPUTE_S``."""
    return compute_time_s(record.steps.median_s, record.breakdown.data_wait)


def slowest_loader(record: RunRecord) -> Loader | None:
    """The loader the training steps waited on longest (what the data rules and the loader probe are about), waits
    in steps that held an evaluation pass left out; None without one."""
    return max(record.loaders, key=training_wait_s, default=None)


def training_wait_s(loader: Loader) -> float:
    """The steps' wait for ``loader``, less the wait in steps that held an evaluation pass."""
    return loader.wait_s - loader.eval_wait_s


def training_batches(loader: Loader) -> int:
    """The batches ``loader`` gave, less those taken in steps that held an evaluation pass."""
    return loader.batches - loader.eval_batches


def batches_per_step(batches: int, steps: int) -> float:
    """Batches a step takes from a loader that delivered ``batches`` over the run's ``steps``: 4 in a loop that
    accumulates gradients over 4 batches before each optimizer step; 1 where either is unknown. Within 0.1 of a
    whole number it is that number (the first batch fetched before the steps were counted, the last one after)."""
    if batches <= 0 or steps <= 0:
        return 1.0
    ratio = batches / steps
    whole = round(ratio)
    return float(whole) if whole >= 1 and abs(ratio - whole) <= 0.1 else ratio


def compute_time_s(median_s: float, data_wait: float) -> float:
    """median step x (1 - data wait share), at least ``MIN_COMPUTE_S``: the time in which the next batch must be
    ready for the step never to wait (1 / it is the rate the step consumes batches)."""
    return max(median_s * (1 - data_wait), MIN_COMPUTE_S)


def launch_wait(record: RunRecord) -> float | None:
    """CUDA: the share of the step the GPU idles waiting for the host to launch its next kernel, as opposed to
    waiting for the next batch: the steady GPU step's wait for the host (``gpu_step``; the profiled steps' host wait
    where there is no steady step) less the data wait (a host blocked on the DataLoader launches nothing either, and
    no launch-side fix can take that time). None without a timeline."""
    from gpuscope.diagnose.gpu_step import gpu_step  # (gpu_step reads the clock, which this module's users need)

    kernels = _kernels(record)
    if kernels is None:
        return None
    data_wait = record.breakdown.data_wait if record.steps.count else 0.0
    step = gpu_step(record)
    waited = step.launch_wait_s / step.step_s if step is not None else kernels.idle_host_wait_fraction
    return max(0.0, waited - data_wait)


def batch_size(record: RunRecord) -> int:
    """The largest batch size among the run's loaders (0 when none is known)."""
    return max((loader.batch_size or 0 for loader in record.loaders), default=0)


def accumulated_passes(record: RunRecord) -> int | None:
    """Where each step takes k >= 2 batches from its loader (gradients accumulated over them before the optimizer
    steps) and the step's arithmetic ran at ``ACCUMULATED_MFU`` of the peak or less: k, the forward and backward
    passes a step, each of them mostly fixed cost. None otherwise."""
    sol, per_step = record.speed_of_light, step_batches(record)
    passes = round(per_step)
    if sol is None or sol.mfu is None or sol.mfu > ACCUMULATED_MFU or passes < 2 or abs(per_step - passes) > 0.1:
        return None
    return passes


def accumulation_saving(record: RunRecord) -> tuple[int, float] | None:
    """The ``accumulated_passes`` k, and the share of the step that one forward and backward over all of a step's k
    batches would save: (k - 1) / k of the forward and backward's share, less their arithmetic at the peak (the
    loader's per-batch work and a loss per batch, which fall too, left out); None where no such passes are
    accumulated."""
    passes, sol, median = accumulated_passes(record), record.speed_of_light, record.steps.median_s
    if passes is None or sol is None or not sol.peak_flops_per_s or not median:
        return None
    arithmetic = sol.flops_per_step / sol.peak_flops_per_s / median
    return passes, (passes - 1) / passes * max(0.0, record.breakdown.forward + record.breakdown.backward - arithmetic)


def step_batches(record: RunRecord) -> float:
    """Batches a step takes from the loader of the largest batch size (``batch_size``): 8 where gradients accumulate
    over 8 batches before each optimizer step; 1 where unknown."""
    loader = max(record.loaders, key=lambda l: l.batch_size or 0, default=None)
    return batches_per_step(training_batches(loader), record.steps.total) if loader is not None else 1.0


# -- the figures that show a fix took ----------------------------------------------------------------------------

Unit = Literal["share", "seconds", "number"]


@dataclass(frozen=True, slots=True)
class Metric:
    """A figure read from a record, by which a rule's fix shows in a later run (each rule's ``resolved_by``);
    ``read`` returns None where the record does not know it."""

    name: str
    unit: Unit
    read: Callable[[RunRecord], float | None]


def show(value: float, unit: Unit) -> str:
    """A metric's value as people read it: ``64%``, ``12.5 ms``, ``3``."""
    if unit == "share":
        return f"{value:.0%}"
    if unit == "seconds":
        return f"{value * 1e3:.1f} ms"
    return f"{value:.1f}".removesuffix(".0")


def _kernels(record: RunRecord) -> KernelTimeline | None:
    return record.op_profile.kernels if record.op_profile is not None else None


def kernel_share(attr: str) -> Callable[[RunRecord], float | None]:
    """A reader of one share of the CUDA kernel timeline (``tensor_core_share``...); None without a timeline."""
    def read(record: RunRecord) -> float | None:
        kernels = _kernels(record)
        return getattr(kernels, attr) if kernels is not None else None
    return read


def _fixed_cost(record: RunRecord) -> float | None:
    overhead = cpu_overhead(record) if record.device == "cpu" else None
    return overhead.share if overhead is not None else None


STEP = Metric("median step", "seconds", lambda r: r.steps.median_s if r.steps.count else None)
"""What every fix is for in the end; also shown where a rule's own figures are unknown in either run."""
DATA_WAIT = Metric("data wait", "share", lambda r: r.breakdown.data_wait if r.steps.count else None)
FIXED_COST = Metric("per-op fixed cost", "share", _fixed_cost)
LAUNCH_WAIT = Metric("GPU idle waiting for launches", "share", launch_wait)
OPTIMIZER = Metric("optimizer phase", "share", lambda r: r.breakdown.optimizer if r.steps.count else None)


def forward_comm_share(comm: Communication) -> float:
    """Of the time the training thread sat idle inside collectives whose issuing phase is known, the share inside
    those issued in forward (tensor parallelism's activations, sharded parameters' gathers: no gradients'), 0..1."""
    idle = {True: 0.0, False: 0.0}
    for call in comm.calls:
        if call.issued_in:
            idle[call.issued_in == "forward"] += sum(end - start for start, end, _ in call.idle)
    total = idle[True] + idle[False]
    return idle[True] / total if total else 0.0


def comm_share(comm: Communication, median_s: float) -> float:
    """The share of a step the training thread (device) sat idle on the collectives' own work, not waiting for a
    later rank: of the profiled steps the figures come from (of the median step in records without them), 0..1."""
    step_s = comm.step_s or median_s
    return min(1.0, comm.own_exposed_s / step_s) if step_s else 0.0
