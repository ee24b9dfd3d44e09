"""From measured steps to steady-state figures: which steps were warm-up or outliers, the step-time
distribution, and the breakdown of step time into phases. A pure function of the kept step records."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuscope.reduce import loops as loops_of
from gpuscope.reduce import thresholds as th
from gpuscope.collect.captures import TIMED_PHASES, LoopStart, StepCapture, StepRecord
from gpuscope.record import PHASES, Breakdown, Checkpointing, FrozenModel, Steps, StepSample, TimeBasis


@dataclass(frozen=True, slots=True)
class StepSummary:
    """What ``summarize`` finds: the steps' figures and breakdowns (device-based where the device was timed)."""

    steps: Steps
    breakdown: Breakdown
    host_breakdown: Breakdown | None


def summarize(
    records: Sequence[StepRecord],
    total: int,
    head: int,
    body_weight: float,
    source: str,
    skipped: int = 0,
    loops: Sequence[LoopStart] = (),
) -> StepSummary:
    """Summarise kept step records of a run that had ``total`` steps marked by ``source``: the steps before
    ``head`` one by one, each later one standing for ``body_weight`` steps of the run. The first ``skipped`` steps
    (``--skip-steps``) were not kept, and count as warm-up. Of several training ``loops`` run one after another, the
    figures are those of the one the profilers measured (``reduce.loops.measured``), the others' steps left out."""
    if not records:
        warmup = min(skipped, total)
        return StepSummary(Steps(total=total, warmup=warmup, skipped=warmup,  # type: ignore[arg-type]
                                 source=source if total else "none"), Breakdown(), None)

    weights = [1.0 if r.index < head else body_weight for r in records]
    chosen = loops_of.measured(records, weights, loops, total) if loops else 0
    start, end = loops_of.bounds(loops, total)[chosen]
    first = max(skipped, start + 1) if start else skipped
    clock = step_clock([r for r in records if first <= r.index < end])
    times = clock_times(records, clock)
    split = _split(records, weights, start, first, end, times)
    warmup, steady = split.warmup, split.steady
    walls = [times[i] for i in steady]
    w = [weights[i] for i in steady]
    count = round(sum(w))  # each kept step stands for its weight in steps of the run
    profiled_count = round(sum(weights[i] for i in split.profiled))
    evaluated_count = round(sum(weights[i] for i in split.evaluated))

    host = _host_breakdown([records[i] for i in steady], w)
    device = _device_breakdown([records[i] for i in steady], w)
    device_walls = [(records[i].device_wall_s, weights[i]) for i in steady if records[i].device_wall_s is not None]
    figures = step_figures(walls, w)
    steps = Steps(
        count=count,
        **figures,
        total=total,
        warmup=min(warmup, end) - start,
        skipped=max(0, min(skipped, end) - start),
        profiled=profiled_count,
        outliers=max(0, end - warmup - profiled_count - evaluated_count - count),
        evaluated=evaluated_count,
        evaluated_s=sum(times[i] * weights[i] for i in split.evaluated),
        source=source,  # type: ignore[arg-type]
        breakdown_basis="device" if device is not None else "host",
        device_median_s=_quantile([d for d, _ in device_walls], [k for _, k in device_walls], 0.5) if device_walls else None,
        clock=clock,
        host_median_s=_quantile([records[i].wall_s for i in steady], w, 0.5) if clock == "device" else None,
        sampled=body_weight > 1.0,
        sample=_sample(records, split.status),
        loops=loops_of.training_loops(records, weights, loops, total, chosen, figures["median_s"]) if loops else (),
        other_loops=start + total - end,
    )
    if device is not None:
        return StepSummary(steps, device, host)
    return StepSummary(steps, host, None)


def step_clock(records: Sequence[StepRecord]) -> TimeBasis:
    """The clock a loop's steps are read on (``Steps.clock``): the device's where at least half of them were timed
    on it (a CUDA run: the steps collector queues a marker on the stream at each step's end), else the host's. The
    steps before the device's timeline was attached are few (it is attached at the first step after CUDA is up)."""
    timed = sum(r.device_wall_s is not None for r in records)
    return "device" if timed and 2 * timed >= len(records) else "host"


def clock_times(records: Sequence[StepRecord], clock: TimeBasis) -> list[float]:
    """Each record's time on ``clock``: on the device's, its device time where resolved, its host time where not
    (a step before the device timeline was attached, the last one left open at the end)."""
    if clock == "host":
        return [r.wall_s for r in records]
    return [r.device_wall_s if r.device_wall_s is not None else r.wall_s for r in records]


def step_figures(times: Sequence[float], weights: Sequence[float]) -> dict[str, float]:
    """The step-time figures of ``Steps`` (median, mean, p10, p90, min, max) of the steady steps' ``times``, each
    standing for its weight in steps of the run."""
    return {
        "median_s": _quantile(times, weights, 0.5),
        "mean_s": sum(x * k for x, k in zip(times, weights)) / sum(weights) if weights else 0.0,
        "p10_s": _quantile(times, weights, 0.1),
        "p90_s": _quantile(times, weights, 0.9),
        "min_s": min(times, default=0.0),
        "max_s": max(times, default=0.0),
    }


@dataclass(frozen=True, slots=True)
class _Split:
    """A loop's kept steps (positions in the records) by what the figures make of them."""

    warmup: int
    """The loop's first step past its warm-up (a step number)."""
    profiled: list[int]
    evaluated: set[int]
    steady: list[int]
    status: list[str]
    """Each record's status (``StepSample.status``), the other loops' steps included."""


def _split(records: Sequence[StepRecord], weights: Sequence[float], start: int, first: int, end: int,
           times: Sequence[float]) -> _Split:
    """The records of the loop of steps ``start``..``end`` (exclusive), from ``first`` on (the skipped steps, or a
    later loop's first: the hand-over from the loop before, left out as warm-up), split into warm-up, profiled,
    evaluation, outlier and steady steps by their ``times`` (on the run's clock)."""
    inside = [i for i, r in enumerate(records) if first <= r.index < end]
    warmup = _count_warmup([records[i] for i in inside], end, first, [times[i] for i in inside]) if inside else first
    profiled = [i for i in inside if records[i].index >= warmup and records[i].profiled]
    later = [i for i in inside if records[i].index >= warmup and not records[i].profiled]
    evaluated = _evaluation_steps(records, weights, later, times=times)
    outlier_at = outliers(times, weights, [i for i in later if i not in evaluated])
    status = ["other-loop" if not start <= r.index < end else "warmup" if r.index < warmup else "profiled"
              if r.profiled else "eval" if i in evaluated else "outlier" if i in outlier_at else "steady"
              for i, r in enumerate(records)]
    steady = [i for i in later if i not in evaluated and i not in outlier_at]
    return _Split(warmup, profiled, evaluated, steady, status)


def outliers(times: Sequence[float], weights: Sequence[float], later: Sequence[int]) -> set[int]:
    """Of the ``later`` steps (positions in ``times``), those over ``OUTLIER_FACTOR`` times their median, unless there
    are too many of them to be accidents (over ``MAX_OUTLIER_SHARE``: a pattern of the loop, and part of its cost)."""
    median = _quantile([times[i] for i in later], [weights[i] for i in later], 0.5)
    outlier_at = {i for i in later if times[i] > th.OUTLIER_FACTOR * median}
    return set() if len(outlier_at) > max(1.0, th.MAX_OUTLIER_SHARE * len(later)) else outlier_at


def _evaluation_steps(records: Sequence[StepRecord], weights: Sequence[float], later: Sequence[int],
                      among: Sequence[int] | None = None, times: Sequence[float] | None = None) -> set[int]:
    """Of the ``later`` steps (positions in ``records``), those in which the trained model ran a forward pass in
    eval mode or with gradients off and that took ``EVALUATION_LONGER`` times the other steps' median (a test pass
    between epochs): left out where the steps with such a pass are at most ``MAX_EVALUATED_SHARE`` of the steps.
    Where more are, forward passes without gradients are part of the loop's work (a rollout each step) and none is
    left out. ``among``: the steps judged instead, each against the median of their own unmarked ones (a profiler's
    window, whose steps the profiler slows alike); the share is still that of ``later``. ``times``: each record's
    time on the run's clock (by default the host's)."""
    among = later if among is None else among
    if sum(weights[i] for i in later if records[i].evaluated) > th.MAX_EVALUATED_SHARE * sum(weights[i] for i in later):
        return set()
    rest = [i for i in among if not records[i].evaluated]
    if not rest:
        return set()
    times = times if times is not None else [r.wall_s for r in records]
    median = _quantile([times[i] for i in rest], [weights[i] for i in rest], 0.5)
    return {i for i in among if records[i].evaluated and times[i] > th.EVALUATION_LONGER * median}


def evaluation_passes(capture: StepCapture, steps: Sequence[int]) -> set[int]:
    """Of ``steps`` (step numbers: a profiler's window, whose steps the step figures leave out as profiled), those
    that held an evaluation pass as ``_evaluation_steps`` tells them, among the run's kept steps."""
    records = capture.records
    weights = [1.0 if r.index < capture.head else capture.body_weight for r in records]
    wanted = set(steps)
    window = [i for i, r in enumerate(records) if r.index in wanted]
    return {records[i].index for i in _evaluation_steps(records, weights, range(len(records)), window)}


def _count_warmup(records: Sequence[StepRecord], total: int, skipped: int = 0,
                  times: Sequence[float] | None = None) -> int:
    """Leading steps left out: the ``skipped`` ones (not kept), the first always (given enough steps, and none
    skipped: a run measured from step 0 pays its lazy initialisation there), then those still far slower than
    the slow end of the run's second half (its 90th percentile: past any warm-up, and high enough that a loop
    whose steps alternate fast and slow loses none), up to a profiler's window: a profiled step is slow because it
    is profiled (cProfile slows a loader's Python several times over), and is left out as such."""
    if total - skipped < th.MIN_STEPS_FOR_WARMUP:
        return skipped
    times = times if times is not None else [r.wall_s for r in records]
    rest = list(times[max(1, len(records) // 2):])
    reference = _quantile(rest, [1.0] * len(rest), 0.9)
    limit = skipped + max(1, math.floor(th.MAX_WARMUP_SHARE * (total - skipped)))
    at = 0 if skipped else 1  # position in ``records`` of the first step that may be steady
    while skipped + at < limit and at < len(records) and records[at].index == skipped + at:
        if records[at].profiled or times[at] <= th.WARMUP_FACTOR * reference:
            break
        at += 1
    return skipped + at


def _host_breakdown(records: Sequence[StepRecord], weights: Sequence[float]) -> Breakdown:
    wall = sum(r.wall_s * k for r, k in zip(records, weights))
    if wall <= 0:
        return Breakdown()
    shares = {p: sum(r.phases_s.get(p, 0.0) * k for r, k in zip(records, weights)) / wall for p in TIMED_PHASES}
    return normalised(shares)


def _device_breakdown(records: Sequence[StepRecord], weights: Sequence[float]) -> Breakdown | None:
    """The device's timeline split by phase, over the steady steps whose phases were timed on the device (every
    step's up to ``PHASED_HEAD``, then every ``PHASED_EVERY``-th), where at least ``MIN_PHASED_STEPS`` were (all
    of them, in a run with fewer steady steps) and at least half the steady steps were timed on the device."""
    timed = [(r, k) for r, k in zip(records, weights) if r.device_phases_s is not None]
    on_device = sum(r.device_wall_s is not None for r in records)
    if not timed or 2 * on_device < len(records) or len(timed) < min(th.MIN_PHASED_STEPS, len(records)):
        return None
    wall = sum((r.device_wall_s or 0.0) * k for r, k in timed)
    if wall <= 0:
        return None
    shares = {p: sum(r.device_phases_s.get(p, 0.0) * k for r, k in timed) / wall for p in TIMED_PHASES}  # type: ignore[union-attr]
    return normalised(shares)


def normalised(shares: dict[str, float]) -> Breakdown:
    """Phase shares plus "other", the rest; float error never makes "other" negative."""
    timed = sum(shares.values())
    if timed > 1.0:
        shares = {p: v / timed for p, v in shares.items()}
        timed = 1.0
    return Breakdown(other=max(0.0, 1.0 - timed), **shares)


def _quantile(values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """Weighted quantile (lower value at ties): each value stands for ``weight`` steps."""
    if not values:
        return 0.0
    pairs = sorted(zip(values, weights))
    total = sum(weights)
    if len(pairs) % 2 == 0 and q == 0.5 and all(k == 1 for _, k in pairs):
        mid = len(pairs) // 2
        return (pairs[mid - 1][0] + pairs[mid][0]) / 2  # the usual median of an even count
    target = q * total
    seen = 0.0
    for value, k in pairs:
        seen += k
        if seen >= target:
            return value
    return pairs[-1][0]


def _sample(records: Sequence[StepRecord], status: Sequence[str]) -> StepSample:
    """An evenly thinned copy of the kept records, small enough for run.json."""
    every = max(1, math.ceil(len(records) / th.SAMPLE_IN_RECORD))
    picked = range(0, len(records), every)
    return StepSample(
        index=tuple(records[i].index for i in picked),
        wall_s=tuple(records[i].wall_s for i in picked),
        phases_s={
            p: tuple(_phase_seconds(records[i], p) for i in picked) for p in PHASES
        },
        status=tuple(status[i] for i in picked),
        device_wall_s=tuple(records[i].device_wall_s for i in picked),
    )


def _phase_seconds(record: StepRecord, phase: str) -> float:
    if phase == "other":
        return max(0.0, record.wall_s - sum(record.phases_s.get(p, 0.0) for p in TIMED_PHASES))
    return record.phases_s.get(phase, 0.0)


def summarize_capture(capture: StepCapture) -> StepSummary:
    """``summarize`` of what the steps collector captured, with the forward passes per backward."""
    summary = summarize(capture.records, capture.count, capture.head, capture.body_weight, capture.source,
                        capture.skipped, capture.loops)
    forwards, backwards = capture.passes
    eval_mode, train_mode = capture.no_grad_modes
    steps = dataclasses.replace(summary.steps, final_evaluation_s=capture.final_evaluation_s,
                                device_markers=capture.device_markers,
                                evaluated_in_train_mode=train_mode / (eval_mode + train_mode) if eval_mode + train_mode
                                else None)
    if backwards:
        steps = dataclasses.replace(steps, forwards_per_backward=forwards / backwards)
    if capture.closure_calls and capture.count:
        steps = dataclasses.replace(steps, closure_calls_per_step=capture.closure_calls / capture.count)
    if capture.queue_waits:
        steps = dataclasses.replace(steps, queue_waits=capture.queue_waits)
    if capture.optimizer_by:
        steps = dataclasses.replace(steps, optimizer_by=capture.optimizer_by)
    if capture.forward_sites:
        steps = dataclasses.replace(steps, forward_sites=capture.forward_sites)
    if capture.no_grad_s:
        # over every step but the first, as the passes' seconds are (NoGradPasses.seconds)
        total = sum(r.wall_s * (1.0 if r.index < capture.head else capture.body_weight) for r in capture.records
                    if r.index >= 1)
        steps = dataclasses.replace(steps, no_grad_share=min(1.0, capture.no_grad_s / total) if total else None,
                                    no_grad_sites=capture.no_grad_sites, no_grad_by=capture.no_grad_by)
    if capture.checkpointing is not None:
        steps = dataclasses.replace(steps, checkpointing=_checkpointing_figures(*capture.checkpointing, steps.sample,
                                                                               capture.device))
    if capture.frozen_models:
        models = [_frozen_figures(model, by_step, kept, steps.sample, capture.device) for model, by_step, kept in
                  capture.frozen_models]
        steps = dataclasses.replace(steps, frozen_models=tuple(sorted(models, key=lambda f: -(f.step_share or 0.0))))
    return dataclasses.replace(summary, steps=steps)


def _checkpointing_figures(checkpointing: Checkpointing, by_step: dict[int, tuple[float, int]], kept_to: int,
                           sample: StepSample, device: str) -> Checkpointing:
    """``checkpointing``'s calls and recomputation over the steady steps of ``sample`` kept (before ``kept_to``)."""
    summed = _over_steady(by_step, sample, 0, kept_to)
    if summed is None:
        return checkpointing
    seconds, calls, wall, steps = summed
    timed = device != "cuda" and calls > 0
    return dataclasses.replace(checkpointing, calls_per_step=calls / steps,
                               recompute_s=seconds / steps if timed else None,
                               step_share=min(1.0, seconds / wall) if timed and wall > 0 else None)


def _over_steady(by_step: dict[int, tuple[float, int]], sample: StepSample, first: int,
                 end: int) -> tuple[float, int, float, int] | None:
    """``by_step``'s seconds and calls summed over the steady steps of ``sample`` (the steps the breakdown is read
    from) from ``first`` to before ``end`` (-1: to the end), with those steps' wall time and number; None without
    any."""
    steady = [(i, wall) for i, wall, status in zip(sample.index, sample.wall_s, sample.status)
              if status == "steady" and i >= first and (end < 0 or i < end)]
    if not steady:
        return None
    seconds = sum(by_step.get(i, (0.0, 0))[0] for i, _ in steady)
    calls = sum(by_step.get(i, (0.0, 0))[1] for i, _ in steady)
    return seconds, calls, sum(w for _, w in steady), len(steady)


def _frozen_figures(model: FrozenModel, by_step: dict[int, tuple[float, int]], kept: tuple[int, int],
                    sample: StepSample, device: str) -> FrozenModel:
    """``model``'s calls and time over the steady steps of ``sample`` (the steps the breakdown is read from) that its
    calls were kept for (``kept``: from, to; -1: to the end)."""
    summed = _over_steady(by_step, sample, *kept)
    if summed is None:
        return model
    seconds, calls, wall, steps = summed
    return dataclasses.replace(
        model, calls_per_step=calls / steps, call_s=seconds / calls if calls else None,
        step_share=min(1.0, seconds / wall) if calls and wall > 0 and device != "cuda" else None)
