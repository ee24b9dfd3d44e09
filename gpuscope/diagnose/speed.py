"""Distances: to the hardware's limit (model FLOPs utilisation), and to the step without its bottleneck (what-if).

Pure functions of the record, shared by the verdict's what-if line and the ``more-dataloader-workers`` rule.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from gpuscope.collect.attention import CPU_FLASH
from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import (accumulation_saving, batches_per_step, cpu_overhead, launch_wait,
                                        median_compute_s, slowest_loader, training_batches)
from gpuscope.diagnose.iterator_wait import iterator_wait
from gpuscope.diagnose.words import (counted_step_unlike, duration_text, flop_text, sparse_flops_text,
                                     utilisation_text, workers_text)
from gpuscope.reduce.peaks import gpu_peak_flops
from gpuscope.diagnose.waiting_workers import waiting_workers
from gpuscope.record import LoaderRate, RunRecord, SpeedOfLight, Verdict, WhatIf


def complete_speed_of_light(record: RunRecord) -> SpeedOfLight | None:
    """The record's FLOP count with achieved FLOP/s (FLOPs per step / steady median step) and MFU filled in.

    A measured (CPU) peak below the run's own rate by at most ``MEASURED_PEAK_NOISE`` is the benchmark slowed by the
    machine's load: it is raised to the run's rate. Further below, it does not describe the run's matmuls (their
    dtype or shapes run faster than the benchmark's: bfloat16 on a CPU without bfloat16 instructions): MFU is
    left unset and ``peak_source`` says why. A datasheet (GPU) peak is never changed."""
    sol, steps = record.speed_of_light, record.steps
    if sol is not None and sol.flops_per_step and not steps.count and steps.total:
        return _from_profiled_step(record, sol)
    if sol is None or not steps.count or not steps.median_s or not sol.flops_per_step:
        return sol
    unlike = counted_step_unlike(record, sol.step) if sol.step is not None else None
    if unlike is not None:  # its FLOPs are not a steady step's: no achieved rate, no MFU
        return dataclasses.replace(sol, note=f"{sol.note}; {unlike}" if sol.note else unlike)
    return _rates(record, sol, steps.median_s)


def _from_profiled_step(record: RunRecord, sol: SpeedOfLight) -> SpeedOfLight:
    """Where no step ran unprofiled (a run of a few long steps), the achieved rate and MFU over the step(s) the
    verdict reads instead (``classify.profiled_figures``): lower bounds, the profiler slowing those steps."""
    from gpuscope.diagnose.classify import profiled_figures

    profiled = profiled_figures(record)
    if profiled is None or not profiled[0].median_s:
        why = "no step ran unprofiled (a run of a few long steps): the achieved rate and MFU need one"
        return dataclasses.replace(sol, note=_joined(sol.note, why))
    thin, _, which = profiled
    completed = _rates(dataclasses.replace(record, steps=thin), sol, thin.median_s)
    return dataclasses.replace(completed, note=_joined(completed.note, (
        f"no step ran unprofiled (a run of a few long steps): the achieved rate and MFU are over {which}, slowed by "
        "the profiler: at least these")))


def _rates(record: RunRecord, sol: SpeedOfLight, median_s: float) -> SpeedOfLight:
    """``sol`` with its achieved rate over a ``median_s`` step and its MFU (the peak checked against the run's)."""
    achieved = sol.flops_per_step / median_s
    measured = sol.peak_flops_per_s
    own = run_matmul_rate(record, sol) if sol.peak_measured and measured else None
    if own is not None and own > measured:  # type: ignore[operator]
        # the benchmark after the run was slowed (this 2-vCPU VM gives some runs half its rate for a while): a peak
        # is at least what the run's own matmuls did
        sol = dataclasses.replace(sol, peak_flops_per_s=own, peak_source=(
            f"{sol.peak_source}; raised to the run's own matmuls' {own / 1e9:.1f} GFLOP/s (their counted FLOPs over "
            f"their time in trace.json), above the {measured / 1e9:.1f} GFLOP/s the benchmark measured"))
        measured = own
    if sol.peak_measured and measured and achieved > measured * th.MEASURED_PEAK_NOISE:
        return dataclasses.replace(sol, achieved_flops_per_s=achieved, mfu=None, peak_source=(
            f"{sol.peak_source}; not this run's peak: the run did {achieved / 1e9:.1f} GFLOP/s, "
            f"{achieved / measured:.1f}x the {measured / 1e9:.2f} GFLOP/s the benchmark measured, more than a loaded "
            f"machine's {th.MEASURED_PEAK_NOISE}x: its matmuls ran at another rate than the benchmark's "
            f"{sol.dtype or 'float32'} ones, so no MFU is given"))
    if sol.peak_measured and measured and achieved > measured:
        # a peak is at least what the run itself did: the matmul benchmark after the run was slowed (a shared
        # machine's load), and an MFU over 1 would be wrong in the other direction
        sol = dataclasses.replace(sol, peak_flops_per_s=achieved, peak_source=(
            f"{sol.peak_source}; raised to the run's own {achieved / 1e9:.1f} GFLOP/s, above the "
            f"{measured / 1e9:.1f} GFLOP/s the benchmark measured"))
    mfu = achieved / sol.peak_flops_per_s if sol.peak_flops_per_s else None
    if mfu is not None and mfu > 1 and (tf32 := _tf32_peak(record, sol)) is not None:
        sol = dataclasses.replace(sol, dtype="tfloat32", peak_flops_per_s=tf32[0], peak_source=(
            f"{tf32[1]}; TF32: above the float32 peak, the float32 step ran on Tensor Cores (cuDNN's convolutions "
            "use TF32 by default)"))
        mfu = achieved / tf32[0]
    if mfu is not None and mfu > 1:  # above a datasheet peak: the step time or the FLOP count is not the run's
        return dataclasses.replace(sol, achieved_flops_per_s=achieved, mfu=None, note=_joined(sol.note, (
            f"{sol.flops_per_step / 1e9:.2f} GFLOP in a {median_s * 1e3:.2f} ms step would be {mfu:.0%} of "
            f"the {sol.peak_source.split(',')[0] or 'peak'}: no step runs above its GPU's peak, so the step time or "
            "the FLOP count does not describe the run, and no MFU is given")))
    return dataclasses.replace(sol, achieved_flops_per_s=achieved, mfu=mfu)


MATMUL_FLOP_OPS = ("mm", "addmm", "bmm", "baddbmm")
"""The FLOP counter's matmul ops, each an ``aten::`` row of the op table."""
TIMED_FLOP_OPS = (*MATMUL_FLOP_OPS, CPU_FLASH, CPU_FLASH + "_backward")
"""Counted ops whose self time in the op table is their whole time on a CPU (they call no op that does the work:
a convolution's is ``aten::mkldnn_convolution``'s or ``aten::_slow_conv2d_forward``'s)."""


def run_matmul_rate(record: RunRecord, sol: SpeedOfLight) -> float | None:
    """On a CPU run, the step's matmuls' own rate: their counted FLOPs a step over their self time a step in the op
    table (trace.json); None where a counted matmul op has no row there, or on CUDA (host time is no kernel's)."""
    matmuls = _ops_time(record, sol, MATMUL_FLOP_OPS)
    return matmuls[0] / matmuls[1] if matmuls is not None and matmuls[1] > 0 else None


def _ops_time(record: RunRecord, sol: SpeedOfLight, ops: tuple[str, ...]) -> tuple[int, float] | None:
    """On a CPU run, the step's counted FLOPs in ``ops`` and those ops' self time a step in the op table; None where
    one of them has no row there, or on CUDA."""
    profile = record.op_profile
    if record.device != "cpu" or profile is None or not profile.steps:
        return None
    counted = {op: flops for op, flops in sol.flops_by_op.items() if op in ops and flops}
    rows = {row.name: row for row in profile.host_ops or profile.top_host}
    if not counted or any(f"aten::{op}" not in rows for op in counted):
        return None
    return sum(counted.values()), sum(rows[f"aten::{op}"].self_host_s for op in counted) / profile.steps


def _tf32_peak(record: RunRecord, sol: SpeedOfLight) -> tuple[float, str] | None:
    """The GPU's TF32 peak and its source, for a float32 step whose kernels ran partly on Tensor Cores; None
    otherwise."""
    kernels = record.op_profile.kernels if record.op_profile is not None else None
    if sol.peak_measured or sol.dtype != "float32" or kernels is None or not kernels.tensor_core_share \
            or not sol.device_name:
        return None
    peak, source = gpu_peak_flops(sol.device_name, "tfloat32")
    return (peak, source) if peak is not None else None


def _joined(note: str, more: str) -> str:
    """``note`` and ``more`` (once: a record completed before keeps its note)."""
    return note if more in note else f"{note}; {more}" if note else more


@dataclass(frozen=True, slots=True)
class LoaderPlan:
    """The worker count the loader probe suggests and the step it predicts."""

    workers: int
    rate: LoaderRate
    keeps_up: bool
    compute_s: float
    step_s: float
    shared_cpu_s: float | None
    """On a CPU run, the step's floor when the workers and the step share the cores (None on CUDA)."""
    consume_batches_per_s: float
    threads: int | None = None
    """On a CPU run, the intra-op threads the main process should keep (``torch.set_num_threads``) where the
    workers and its current threads would be more busy threads than cores; None where nothing needs changing."""
    batches_per_step: float = 1.0
    """Batches a step takes from the loader (4 where gradients accumulate over 4 batches)."""
    handover_s: float = 0.0
    """What receiving a step's batches from the workers adds to it (``step_handover_s``)."""
    sampler_s: float = 0.0
    """What the user's own sampler, drawing a step's batches' indices in the main process, adds to it."""

    @property
    def batches_text(self) -> str:
        return batches_text(self.batches_per_step)


def batches_text(per_step: float) -> str:
    """"one batch", or "a step's 4 batches"."""
    return "one batch" if round(per_step, 1) == 1 else f"a step's {per_step:.3g} batches"


def loader_plan(record: RunRecord, file_system: bool = False) -> LoaderPlan | None:
    """From the loader probe's curve: the smallest measured worker count delivering batches at least
    ``LOADER_KEEPS_UP_MARGIN`` faster than the step consumes them (else the one predicting the shortest step), and
    the step it predicts: max(compute + the main process's time to receive a batch from the workers (as the probe
    timed it: ``step_handover_s``) and to draw its indices with the user's own sampler, one batch at that rate). On
    a CPU run the workers and the step share the cores, so also no less than the compute on the cores the N workers
    leave, nor all the CPU work of a step (one batch's build plus the compute on the main process's threads) spread
    over the cores. That step needs the main process to keep no more than cores - N intra-op threads (at least one):
    more busy threads than cores stall each other at every parallel region, so the plan names that count
    (``threads``) where the run had more. A batch's build is the run's main-process batch time where it had no
    workers, else the probe's one-worker time. ``file_system``: the plan of the worker count timed again with the
    file_system sharing strategy. None without a probe curve or step figures."""
    probe, median = record.loader_probe, record.steps.median_s
    if probe is None or not median or not record.steps.count or (file_system and probe.file_system is None):
        return None
    cores = record.meta.cpu_count or 1
    per = _batches_per_step(record)
    batch_s = _main_process_batch_s(record, per)
    base = [_completed(r, batch_s, cores) for r in probe.rates if r.batches_per_s and not r.pin_memory] or \
           [_completed(r, batch_s, cores) for r in probe.rates if r.batches_per_s]
    measured = base
    if file_system and probe.file_system is not None:
        measured = [_completed(probe.file_system, batch_s, cores)] if probe.file_system.batches_per_s else []
    # with 0 workers the main process builds each batch between steps: nothing is hidden, whatever its rate
    candidates = [r for r in measured if r.num_workers > 0]
    if not candidates:
        return None
    compute_s = median_compute_s(record)
    consume = per / compute_s
    needed = consume * (1 + th.LOADER_KEEPS_UP_MARGIN)
    threads = min(probe.main_threads or 1, cores)
    one = next((r for r in base if r.num_workers == 1), None) or next((r for r in base if r.num_workers == 0), None)
    shared = None
    build_s = batch_s or (1 / one.batches_per_s if one is not None else None)  # type: ignore[operator]
    step_build_s = per * build_s if build_s is not None else 0.0  # the step's batches' build
    cpu_share = build_cpu_share(record)
    if record.device == "cpu" and build_s is not None:
        shared = (step_build_s * cpu_share + compute_s * threads) / cores

    back = back_to_back_share(record)
    drawing = per * (probe.sampler_s or 0.0)  # the main process draws every batch's indices, workers or not

    def plan_with(rate: LoaderRate) -> tuple[float, float, int | None]:
        """The step with ``rate``'s workers, the hand-over in it, and the intra-op threads it needs kept."""
        handover = step_handover_s(rate, per, back)  # the main process receiving them (and drawing their indices)
        step = max(compute_s + handover + drawing, per / rate.batches_per_s)  # type: ignore[operator]
        threads_fix = None
        if shared is not None:
            on_cores, _, threads_fix = shared_cores(compute_s, step_build_s, rate.num_workers, threads, cores,
                                                    cpu_share)
            step = max(step, on_cores + handover + drawing)
        return step, handover, threads_fix

    keeping = [r for r in candidates if r.batches_per_s >= needed]  # type: ignore[operator]
    rate = min(keeping, key=lambda r: r.num_workers) if keeping else \
        min(candidates, key=lambda r: (plan_with(r)[0], r.num_workers))
    step_s, handover, threads_fix = plan_with(rate)
    return LoaderPlan(rate.num_workers, rate, bool(keeping), compute_s, step_s, shared, consume, threads_fix, per,
                      handover, drawing)


def step_handover_s(rate: LoaderRate, per_step: float, back_to_back: float) -> float:
    """What receiving a step's ``per_step`` batches from ``rate``'s workers adds to the step: the main process's CPU
    for each, and for the ``back_to_back`` share of them taken right after the previous one (the workers are then
    building the next), the probe's wall time to receive a built batch instead, where longer. A batch asked for
    after compute finds its worker done and idle: its hand-over is the CPU alone. 0 with no workers."""
    if not rate.num_workers:
        return 0.0
    cpu = rate.handover_s or 0.0
    return per_step * (cpu + back_to_back * max(0.0, (rate.receive_s or 0.0) - cpu))


def back_to_back_share(record: RunRecord) -> float:
    """The share of its batches the loader the steps waited on longest gave right after the previous one."""
    loader = slowest_loader(record)
    return loader.back_to_back / loader.batches if loader is not None and loader.batches else 0.0


def shared_cores(compute_s: float, build_s: float, workers: int, threads: int, cores: int,
                 cpu_share: float = 1.0) -> tuple[float, float, int | None]:
    """On a CPU run, where N busy workers and the step share the cores: (the step's floor, the floor of all a
    step's CPU work spread over the cores, the intra-op threads the main process should keep or None where its
    ``threads`` already fit). The step's compute gets the cores the workers leave (at least one), and no step is
    shorter than one batch's build plus the compute on ``threads`` threads, over all the cores. ``cpu_share``: the
    share of a batch's build on a CPU (``build_cpu_share``): workers that mostly wait (on a disk, a sleep) take
    that share of a core each."""
    spread = (build_s * cpu_share + compute_s * threads) / cores
    keep = max(1, cores - round(workers * cpu_share))
    floor = max(compute_s * threads / max(1, min(threads, keep)), spread)
    return floor, spread, keep if threads > keep else None


@dataclass(frozen=True, slots=True)
class LoaderEstimate:
    """Without the loader probe: the worker count and the step worked out from the run's own times."""

    workers: int
    needed: int
    """Workers that would keep up, before the cap at the cores."""
    batch_s: float
    """A step's batches' build: the data wait with no workers, else the workers' N steps for them."""
    compute_s: float
    step_s: float
    spread_s: float | None
    """On a CPU run with torch's thread count known, a step's CPU work spread over all the cores (else None)."""
    threads: int | None
    """The intra-op threads to keep where they and the workers would outnumber the cores (see ``shared_cores``)."""
    batches_per_step: float = 1.0
    """Batches a step takes from the loader (``batch_s`` builds them all)."""


def loader_estimate(record: RunRecord) -> LoaderEstimate | None:
    """The slowest loader's worker count from the run's times: a step's batches take ``batch_s`` to build and the step
    computes for ``compute_s``, so N = ceil(batch_s / compute_s) keep up, capped at the cores, and the step becomes
    max(compute, batch_s / N). On a CPU run with torch's thread count known the workers and the step share the
    cores: the count from 1 to that cap predicting the shortest step (``shared_cores``) is taken. None without a
    loader, step figures, or a core to spare."""
    median, cores = record.steps.median_s, record.meta.cpu_count or 1
    loader = slowest_loader(record)
    if loader is None or not median or not record.steps.count or loader.num_workers >= cores:
        return None
    compute_s = median_compute_s(record)
    # with no workers the main process built a step's batches in the wait; N workers deliver them in each step
    batch_s = record.breakdown.data_wait * median if loader.num_workers == 0 else median * loader.num_workers
    per_step = _batches_per_step(record)
    needed = max(loader.num_workers + 1, math.ceil(batch_s / compute_s))
    workers = min(needed, cores)
    threads = min(record.meta.torch_threads or 0, cores)
    if record.device != "cpu" or not threads:
        return LoaderEstimate(workers, needed, batch_s, compute_s, max(compute_s, batch_s / workers), None, None,
                              per_step)

    cpu_share = build_cpu_share(record)

    def step_with(n: int) -> float:
        return max(compute_s, batch_s / n, shared_cores(compute_s, batch_s, n, threads, cores, cpu_share)[0])

    workers = min(range(loader.num_workers + 1, workers + 1), key=lambda n: (step_with(n), n))
    _, spread, keep = shared_cores(compute_s, batch_s, workers, threads, cores, cpu_share)
    return LoaderEstimate(workers, needed, batch_s, compute_s, step_with(workers), spread, keep, per_step)


def build_cpu_share(record: RunRecord) -> float:
    """The share of building the slowest loader's items spent on a CPU, as the data probe measured it (the main
    thread's CPU time over the wall time of untraced fetches), 1 where it did not: a dataset that mostly waits (reads a
    disk, sleeps) leaves its workers' cores to the step."""
    probe, loader = record.data_probe, slowest_loader(record)
    if probe is None or probe.item_cpu_share is None or loader is None or probe.dataset != loader.dataset:
        return 1.0
    return probe.item_cpu_share


FIRST_ROUND_ONLY = "a lower bound"
"""How the loader probe marks a rate timed over its first round only (the workers' start-up included)."""


def _batches_per_step(record: RunRecord) -> float:
    """Batches a step takes from the loader it waited on longest (``batches_per_step``)."""
    loader = slowest_loader(record)
    return batches_per_step(training_batches(loader), record.steps.total) if loader is not None else 1.0


def _main_process_batch_s(record: RunRecord, per_step: float) -> float | None:
    """How long building one batch took in the main process during the run: the data wait of a run whose slowest
    loader had no workers (each wait is whole batches built between steps), over the ``per_step`` batches a step
    takes; None otherwise."""
    top = slowest_loader(record)
    if top is None or not record.steps.count or not record.steps.median_s:
        return None
    wait_s = record.breakdown.data_wait * record.steps.median_s
    return wait_s / per_step if top.num_workers == 0 and wait_s > 0 else None


def _completed(rate: LoaderRate, batch_s: float | None, cores: int) -> LoaderRate:
    """A rate the probe could time over its first round only is a lower bound (start-up included): when batches
    take long next to the probe's budget, N workers are better estimated as N batch-builders in parallel, on at
    most ``cores`` cores, each taking the main process's measured batch time."""
    if batch_s is None or rate.num_workers == 0 or FIRST_ROUND_ONLY not in rate.note:
        return rate
    parallel = min(rate.num_workers, cores) / batch_s
    if parallel <= (rate.batches_per_s or 0.0):
        return rate
    return dataclasses.replace(rate, batches_per_s=parallel, note=(
        f"estimated: {min(rate.num_workers, cores)} batches at a time, {batch_s * 1e3:.0f} ms each as in the run "
        f"(timed over the first round only: {rate.batches_per_s:.2f} batches/s, start-up included)"))


def what_if(record: RunRecord, verdict: Verdict) -> WhatIf | None:
    """An estimate of the median step with the verdict's bottleneck removed; None where none is sound. Where no step
    ran unprofiled, a compute-bound one's at the speed of light, against the profiled step the verdict reads."""
    from gpuscope.diagnose.classify import profiled_figures

    median = record.steps.median_s
    if verdict.bound == "compute" and (profiled := profiled_figures(record)) is not None and profiled[0].median_s:
        thin, sol = profiled[0].median_s, complete_speed_of_light(record)
        if sol is None or not sol.peak_flops_per_s or not sol.flops_per_step or sol.mfu is None \
                or sparse_flops_text(sol):
            return None
        step_s, explanation = _at_peak(record, sol, thin)
        return WhatIf(step_s=step_s, speedup=thin / step_s, explanation=(
            f"{explanation}, against the profiled step's {thin:.2f} s (slowed by the profiler)"))
    if not record.steps.count or not median:
        return None
    step_s, explanation = None, ""
    if verdict.bound == "data-loading" and record.breakdown.data_wait < th.DATA_WAIT_BOUND \
            and (wait := iterator_wait(record)) is not None:  # no DataLoader's wait: an iterator of its own
        step_s = median * (1 - wait.share)
        explanation = (f"with the batches ready when the step asks for them: without the {wait.share:.0%} of the "
                       f"profiled steps spent waiting under {wait.feeder.function} ({wait.feeder.file}:"
                       f"{wait.feeder.line})")
    elif verdict.bound == "data-loading" and record.steps.queue_waits and not record.loaders:
        site, share = record.steps.queue_waits[0], record.breakdown.data_wait  # fed through a queue: how fast more
        step_s = median * (1 - share)  # producers would deliver is unmeasured
        explanation = (f"with the batches ready when the step asks for them: without the {share:.0%} of each step "
                       f"spent waiting at {site.file}:{site.line} `{site.code}`")
    elif verdict.bound == "data-loading":
        step_s, explanation = _without_data_wait(record)
    elif verdict.bound == "cpu-launch":
        overhead = cpu_overhead(record) if record.device == "cpu" else None
        kernels = record.op_profile.kernels if record.op_profile is not None else None
        if (accumulated := accumulation_saving(record)) is not None:
            passes, saving = accumulated
            step_s = median * (1 - saving)
            explanation = (f"with one forward and backward over a step's {passes} accumulated batches at once: their "
                           "fixed cost paid once (larger-batch)")
        elif overhead is not None:
            step_s = max(median - overhead.seconds, 0.0)
            explanation = (f"without the per-op fixed cost ({overhead.ops_per_step:.0f} ops x "
                           f"{overhead.op_cost_s * 1e6:.2f} us = {overhead.seconds * 1e3:.2f} ms a step): fewer, "
                           "larger ops")
        elif kernels is not None:
            launching = launch_wait(record) or 0.0
            step_s = median * (1 - launching)
            explanation = f"without the GPU's idle time waiting for launches ({launching:.0%} of the step)"
    elif verdict.bound == "compute":
        sol = complete_speed_of_light(record)
        # no MFU: the measured peak does not describe the run's matmuls, and a step "at" it would mean nothing
        # sparse matmuls: their gathers are no dense peak's (sparse_flops_text says so where the speed of light is)
        if sol is not None and sol.peak_flops_per_s and sol.flops_per_step and sol.mfu is not None \
                and not sparse_flops_text(sol):
            step_s, explanation = _at_peak(record, sol, median)
    if step_s is None or step_s <= 0:
        return None
    return WhatIf(step_s=step_s, speedup=median / step_s, explanation=explanation)


def _at_peak(record: RunRecord, sol: SpeedOfLight, median_s: float) -> tuple[float, str]:
    """A compute-bound step with its counted FLOPs at the peak, and how it was worked out. On a CPU run whose counted
    FLOPs are mostly (``TIMED_FLOPS_SHARE``) in ops whose own time is theirs whole (matmuls, the CPU's flash
    attention: a row of the op table each), only those ops' time goes to the peak: the step's other ops and Python
    stay as they are (an embedding model's 3.9 MFLOP of bmm "at the speed of light" made a 13 ms step 0.02 ms, 645x,
    where its bmm took 1.3 ms of it); else the whole step is its FLOPs at the peak."""
    peak = sol.peak_flops_per_s or 0.0
    timed = _ops_time(record, sol, TIMED_FLOP_OPS)
    if timed is None or timed[0] < th.TIMED_FLOPS_SHARE * sum(sol.flops_by_op.values()) \
            or not 0 < timed[1] < median_s:
        return sol.flops_per_step / peak, (f"at the speed of light: {flop_text(sol.flops_per_step)} a step at the "
                                           f"{_peak_name(sol)} peak of {_rate_text(peak)}")
    flops, seconds = timed
    at_peak, rest = flops / peak, median_s - seconds
    which = "matmuls and attention" if any(op.startswith(CPU_FLASH) for op in sol.flops_by_op) else "matmuls"
    return rest + at_peak, (
        f"with its {which} at the {_peak_name(sol)} peak of {_rate_text(peak)}: their {flop_text(flops)} a step in "
        f"{duration_text(at_peak)}, against {duration_text(seconds)} in the profiled steps "
        f"({min(at_peak / seconds, 1):.0%} of the peak); the step's other {duration_text(rest)}, its other ops and "
        "Python, as they are")


def _without_data_wait(record: RunRecord) -> tuple[float, str]:
    """The what-if of a data-loading-bound run: the step with the loader keeping up, and how it was worked out."""
    median, share = record.steps.median_s, record.breakdown.data_wait
    plan, sharing = loader_plan(record), loader_plan(record, file_system=True)
    if sharing is not None and (plan is None or sharing.step_s <= plan.step_s * (1 - th.FILE_SYSTEM_SHORTER)):
        plan = sharing  # the file-system-sharing rule's plan
    if plan is not None:
        step_s = plan.step_s
        how = "estimated from the run's batch time to deliver" if plan.rate.note.startswith("estimated") else \
            "measured after the run delivering"
        delivery_s = plan.batches_per_step / plan.rate.batches_per_s  # type: ignore[operator]
        shared_by = " handing batches over by file_system" if plan is sharing else ""
        received = (f" + receiving them {plan.handover_s * 1e3:.1f} ms" if plan.handover_s >= 0.0005 else "") + (
            f" + the sampler drawing their indices {plan.sampler_s * 1e3:.1f} ms" if plan.sampler_s else "")
        explanation = (f"with {workers_text(plan.workers)}{shared_by}, {how} "
                       f"{plan.rate.batches_per_s:.1f} batches/s: max(compute {plan.compute_s * 1e3:.1f} ms"
                       f"{received}, {plan.batches_text} {delivery_s * 1e3:.1f} ms)")
        explanation += _shared_text(record, plan.workers, plan.shared_cpu_s, plan.threads)
    elif (estimate := loader_estimate(record)) is not None and estimate.spread_s is not None:
        step_s = estimate.step_s
        explanation = (f"with {workers_text(estimate.workers)}, from the run's batch time: max(compute "
                       f"{estimate.compute_s * 1e3:.1f} ms, {batches_text(estimate.batches_per_step)} "
                       f"{estimate.batch_s * 1e3:.1f} ms / "
                       f"{estimate.workers})" +
                       _shared_text(record, estimate.workers, estimate.spread_s, estimate.threads))
    elif (waiting := waiting_workers(record)) is not None:
        step_s = waiting.step_s
        explanation = (f"with {workers_text(waiting.workers)}, more than the cores (they were blocked "
                       f"{1 - waiting.busy:.0%} of their time): max(compute {waiting.compute_s * 1e3:.1f} ms, "
                       f"{batches_text(waiting.batches_per_step)} {waiting.batch_s * 1e3:.1f} ms / "
                       f"{waiting.workers})" + (f"; a step's CPU work over all cores takes at least "
                                                f"{waiting.spread_s * 1e3:.1f} ms" if waiting.spread_s else ""))
    else:
        data_s, compute_s = share * median, median_compute_s(record)
        step_s = max(data_s, compute_s)
        explanation = (f"data wait hidden behind compute by workers: max(data {data_s * 1e3:.1f} ms, compute "
                       f"{compute_s * 1e3:.1f} ms) a step")
    if step_s >= median:  # no worker count hides the loading on this machine: cheaper batches would
        compute_s = median_compute_s(record)
        explanation = (f"with batches cheap enough never to be waited for, the step's compute: workers do not hide "
                       f"the loading on this machine ({explanation}: {step_s * 1e3:.1f} ms)")
        step_s = compute_s
    return step_s, explanation


def _shared_text(record: RunRecord, workers: int, spread_s: float | None, threads: int | None) -> str:
    """The what-if's words for a CPU run's shared cores (empty where they were not counted)."""
    if spread_s is None:
        return ""
    share = build_cpu_share(record)
    taken = f"take {workers} of {record.meta.cpu_count} cores from the step" if share >= 1 else (
        f"share the {record.meta.cpu_count} cores with the step (on a CPU {share:.0%} of a batch's build, by the data "
        "probe: they mostly wait)")
    text = f"; on this CPU-only run the workers {taken}, whose CPU work over all cores takes {spread_s * 1e3:.1f} ms"
    return text + (f", with torch.set_num_threads({threads})" if threads is not None else "")


def _rate_text(flops_per_s: float) -> str:
    """``989.50 TFLOP/s``, or ``83.2 GFLOP/s`` for a rate under a TFLOP/s (a CPU's)."""
    return f"{flops_per_s / 1e12:.2f} TFLOP/s" if flops_per_s >= 1e12 else f"{flops_per_s / 1e9:.1f} GFLOP/s"


def _peak_name(sol: SpeedOfLight) -> str:
    dtype = sol.dtype or "float32"
    return f"measured {dtype} matmul" if sol.peak_measured else f"{sol.device_name or 'GPU'} {dtype}"


def headroom_text(record: RunRecord) -> str | None:
    """``at 31% of the H100 SXM's bfloat16 peak`` (or of this machine's measured float32 matmul peak), for a
    compute-bound run with an MFU; None otherwise."""
    sol = record.speed_of_light
    if record.verdict.bound != "compute" or sol is None or sol.mfu is None:
        return None
    dtype = sol.dtype or "float32"
    if sol.peak_measured:
        return f"at {utilisation_text(sol.mfu)} of this machine's measured {dtype} matmul peak"
    from gpuscope.reduce.peaks import find_gpu

    gpu = find_gpu(sol.device_name or "")
    return f"at {utilisation_text(sol.mfu)} of the {gpu.name if gpu else sol.device_name}'s {dtype} peak"
