"""How the diagnosis names what it found: the verdict's label, the steps left out, a speed-up, a FLOP count, and
the sentences about a CUDA step's figures (``gpu_step``, ``clock``: numbers only). The verdict's evidence and every
renderer (the terminal summary, the HTML report, compare) say them alike."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import (UnlikeSteps, comm_share, evaluation_time, profile_window, steady_steps_near,
                                        steps_around, two_speeds, unlike_steps)
from gpuscope.diagnose.loops import other_loop
from gpuscope.record import Communication, FrozenModel, RunRecord, SpeedOfLight

if TYPE_CHECKING:
    from gpuscope.diagnose.clock import HostPace
    from gpuscope.diagnose.gpu_step import GpuStep, OwnCost

BOUND_LABELS = {
    "data-loading": "data-loading-bound",
    "cpu-launch": "CPU-launch-bound",
    "communication": "communication-bound",
    "inconclusive": "inconclusive",
}


def command_text(run: RunRecord) -> str:
    """The run's command as a user types it after ``python``, shortened where long."""
    whole = shlex.join(run.command)
    if len(whole) <= 60:
        return whole
    return shlex.join(run.command[:2] if run.command[:1] == ("-m",) else run.command[:1]) + " ..."


def flop_text(value: float) -> str:
    """A FLOP count with a prefix that suits it: "2.82 GFLOP", and "520.00 kFLOP" where GFLOP would read 0.00 (a policy
    network stepped one observation at a time)."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}FLOP"
    return f"{value:.0f} FLOP"


def utilisation_text(share: float) -> str:
    """A share of a peak: ``31%``, with a decimal under 1% (``0.2%``, where ``0%`` would read as nothing done)."""
    return f"{share:.1%}" if 0 < share < 0.01 else f"{share:.0%}"


def duration_text(seconds: float) -> str:
    """A short duration: ``23 us`` under a millisecond (where ``0.0 ms`` would say nothing), else ``1.2 ms``."""
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.1f} ms"


def frozen_model_text(model: FrozenModel) -> str:
    """A frozen model's share of the step and where it is called: "Sequential (9.5M parameters, none trained), called
    at distill.py:49 `t_logits = teacher(x)` with gradients off, in eval mode: 18.4 ms a call, 1 a step, 62% of the
    step"."""
    size = f"{model.parameters / 1e6:.1f}M" if model.parameters >= 1e5 else f"{model.parameters:,}"
    site = model.called_at
    where = f", called at {site.file}:{site.line} `{site.code}`" if site is not None else ""
    modes = [m for m, on in (("with gradients off", model.without_gradients), ("in eval mode", model.eval_mode)) if on]
    calls = f"{model.calls_per_step:.0f}" if abs(model.calls_per_step - round(model.calls_per_step)) < 0.05 \
        else f"{model.calls_per_step:.1f}"
    return (f"{model.module} ({size} parameters, none trained){where}{' ' + ', '.join(modes) if modes else ''}: "
            f"{duration_text(model.call_s or 0.0)} a call, {calls} a step, {model.step_share:.0%} of the step")


def other_text(record: RunRecord) -> str:
    """What the step's "other" phase holds, where gpuscope timed it: the models the script runs but does not train
    (a perceptual loss's VGG, a distillation's teacher: their forward is neither the trained model's forward nor its
    backward), each a notable share of the step (``frozen_model_text``); else "". A model whose share the "other"
    phase cannot hold ran elsewhere (inside the trained model's forward, in a collate function): left out."""
    other = record.breakdown.other
    return "; ".join(frozen_model_text(f) for f in record.steps.frozen_models
                     if th.FROZEN_MODEL_NOTABLE <= (f.step_share or 0.0) <= other + th.FROZEN_IN_OTHER_SLACK)


def sparse_flops_text(sol: SpeedOfLight) -> str:
    """Where a notable share of the counted FLOPs are sparse matmuls' (``SPARSE_FLOPS_NOTABLE``), what that means for
    the step's speed of light; else ""."""
    if not sol.flops_per_step or sol.sparse_flops < th.SPARSE_FLOPS_NOTABLE * sol.flops_per_step:
        return ""
    return (f"{sol.sparse_flops / sol.flops_per_step:.0%} of them in matmuls with a sparse operand (counted by the "
            "elements it stores), whose gathers no dense matmul peak describes: no what-if at the peak")


def workers_text(workers: int) -> str:
    """``2 DataLoader workers``; ``1 DataLoader worker``."""
    return f"{workers} DataLoader worker{'s' if workers != 1 else ''}"


def speedup_text(speedup: float) -> str:
    """A predicted speed-up in words: "1.64x faster", "1.30x slower" where the remedy would cost time, "no
    faster" where it rounds to 1.00x either way."""
    if round(speedup, 2) == 1 or round(1 / speedup, 2) == 1:
        return "no faster"
    return f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup:.2f}x slower"


def bound_label(record: RunRecord) -> str:
    """The verdict as people say it: ``compute`` is GPU-compute-bound on CUDA runs, CPU-compute-bound otherwise."""
    bound = record.verdict.bound
    if bound == "compute":
        return "GPU-compute-bound" if record.device == "cuda" else "CPU-compute-bound"
    return BOUND_LABELS.get(bound, bound)


def left_out(record: RunRecord) -> str:
    """Why steps are not in the steady-state figures, e.g. "left out: 1 warm-up, 8 profiled, 0 outliers"."""
    steps = record.steps
    skipped = f", {steps.skipped} of them skipped" if steps.skipped else ""
    passes = "a rollout" if steps.rollouts else "an evaluation pass"
    evaluated = f", {steps.evaluated} with {passes}" if steps.evaluated else ""
    loops = f", {steps.other_loops} of {len(steps.loops) - 1} other training loop{'s' * (len(steps.loops) > 2)}" \
        if steps.other_loops else ""
    return (f"left out: {steps.warmup} warm-up{skipped}, {steps.profiled} profiled, {steps.outliers} outlier{'s' * (steps.outliers != 1)}"
            f"{evaluated}{loops}")


# -- a CUDA step ---------------------------------------------------------------------------------------------------
def gpu_busy(step: GpuStep) -> str:
    """How busy the steady step's GPU is, and how that was measured."""
    if step.steady:
        return (f"the GPU runs kernels {step.busy:.0%} of the steady step: {step.kernel_s * 1e3:.1f} ms of "
                f"kernels a step (as in the profiled steps) in {step.step_s * 1e3:.1f} ms on the GPU's clock")
    return f"the GPU ran kernels {step.busy:.0%} of the profiled steps"


def step_after(step: GpuStep, kernel_saved_s: float) -> str:
    """What the step would take after a fix that saves ``kernel_saved_s`` of kernels, with the host's floor where it
    binds."""
    after = step.after_s(kernel_saved_s)
    text = f"the step would take about {after * 1e3:.1f} ms of its {step.step_s * 1e3:.1f} ms"
    if step.host_floor_s and after <= step.host_floor_s:
        text += f", no less than the {step.host_floor_s * 1e3:.1f} ms the host takes to queue it"
    return text


def datasheet_rates(step: GpuStep, slow: str, fast: str) -> str:
    """``the H200's datasheet: tfloat32 494.5 against float32 67 TFLOP/s dense (7.4x)``."""
    assert step.gpu is not None
    ratio = step.peak_ratio(slow, fast) or 0.0
    return (f"the {step.gpu.name}'s datasheet: {fast} {step.gpu.tflops[fast]:g} against {slow} "
            f"{step.gpu.tflops[slow]:g} TFLOP/s dense ({ratio:.1f}x)")


def host_pace_text(pace: HostPace) -> str:
    """How fast the host queues a step, and how that is known."""
    if pace.how == "ran ahead":
        which = f"median of the {pace.steps}" if pace.steps >= th.HOST_AHEAD_MIN_STEPS else \
            f"the fastest of the {pace.steps}"
        return (f"the host queues a step in {pace.seconds * 1e3:.1f} ms ({which} steady steps it finished well "
                "ahead of the GPU)")
    if pace.how == "less its syncs":
        return (f"the host queues a step in {pace.seconds * 1e3:.1f} ms at most (its median step less the time "
                "it waited in syncs)")
    return f"the host keeps pace with the GPU: {pace.seconds * 1e3:.1f} ms a step"


def own_cost_text(cost: OwnCost, step_s: float) -> str:
    """What gpuscope's own CUDA calls cost a step on the host."""
    share = f": {cost.seconds / step_s:.1%} of the {step_s * 1e3:.1f} ms step" if step_s else ""
    return (f"gpuscope's own CUDA calls take about {cost.seconds * 1e6:.0f} us of host time a step "
            f"({cost.markers:.1f} timing markers, {cost.allocator_reads:.2f} allocator readings and "
            f"{cost.nvtx_ranges:.0f} NVTX ranges a step, at an H100's cost of each){share}; a step the host "
            "bounds includes them, one the GPU bounds does not")


# -- the steps -----------------------------------------------------------------------------------------------------
def two_speeds_line(record: RunRecord) -> str | None:
    """Where the steady steps run at two speeds (``evidence.two_speeds``): each group's median and which steps are
    slow, the median step standing for the mix; None for one speed."""
    speeds = two_speeds(record)
    if speeds is None:
        return None
    kept = " sampled" if record.steps.sampled else ""
    text = (f"the steps run at two speeds: {speeds.fast} of {speeds.fast + speeds.slow}{kept} steady steps take a "
            f"median {speeds.fast_s * 1e3:.1f} ms, {speeds.slow} take {speeds.slow_s * 1e3:.1f} ms "
            f"({speeds.apart:.0f}x); the {record.steps.median_s * 1e3:.1f} ms median step stands for the mix")
    return text + _which_are_slow(list(speeds.slow_steps), record.steps.sampled)


def _which_are_slow(slow: list[int], sampled: bool) -> str:
    """", every 2nd step" or ", steps 65-101 in a row" where the slow steps' indices say so (every step kept)."""
    strides = [b - a for a, b in zip(slow, slow[1:])]
    if sampled or not strides:
        return ""
    common = max(set(strides), key=strides.count)
    if strides.count(common) < 0.8 * len(strides):
        return ""
    if common == 1:
        return f": steps {slow[0]}-{slow[-1]} in a row (a phase of the run)"
    return f": every {common}{_ordinal(common)} step"


def _ordinal(n: int) -> str:
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def evaluation_line(record: RunRecord) -> str | None:
    """What the steps left out as evaluation passes took (``evidence.evaluation_time``), where it is worth saying.
    Where most of the passes without gradients ran in train mode, they are named as the rollout they most likely are
    (CleanRL's PPO: 1.0 s of rollouts against 0.5 s of updates had been called evaluation)."""
    time = evaluation_time(record)
    if time is None:
        return None
    steps, loader = record.steps, time.loader
    ratio = time.evaluated_s / time.steady_s
    than = f"{ratio:.1f}x" if ratio >= 1 else f"{ratio:.0%} of"
    waited = ""
    if loader is not None:
        waited = (f"; the evaluation waited {loader.eval_wait_s:.1f} s in all for the {loader.dataset} loader's "
                  f"{loader.eval_batches} batches ({loader.num_workers} worker processes"
                  + (f", built at {loader.created_at.file}:{loader.created_at.line}" if loader.created_at else "")
                  + (f" by {loader.created_by}" if loader.created_by else "") + ")")
    held = " and".join(filter(None, (f"{steps.evaluated} step{'s' * (steps.evaluated != 1)}" if steps.evaluated else "",
                                     " the run's end, after the last step," if steps.final_evaluation_s else "")))
    held_what, described = (
        ("forward passes of the trained model without gradients, in train mode (a rollout collecting the next batch, "
         "as a reinforcement-learning loop runs, or an evaluation pass without model.eval())", "the updates only")
        if steps.rollouts else
        ("an evaluation pass (the trained model ran forward in eval mode or without gradients)", "the training steps"))
    return (f"{held.strip()} held {held_what}: {time.evaluated_s:.1f} s in all, {than} the {time.steady_s:.1f} s of "
            f"the {steps.count} steady steps; the step figures leave them out and describe {described}{waited}"
            f"{_waited_out(record)}")


def _waited_out(record: RunRecord) -> str:
    """In a job's record, the ranks that held no evaluation pass and waited for this one's (rank 0 evaluating alone):
    ``; the other ranks held none and waited for it in those steps: rank 1 0.85 s, ...``; "" where none did."""
    waited = [r for r in record.ranks if r.waited_for_evaluation_s > 0]
    if not waited:
        return ""
    shown = ", ".join(f"rank {r.rank} {r.waited_for_evaluation_s:.2f} s" for r in waited[:3])
    more = f" and {len(waited) - 3} more" if len(waited) > 3 else ""
    return (f"; the other ranks held none and waited for it at the next collective, beyond their median step: "
            f"{shown}{more} (left out of their figures too)")


# -- a job's collectives -------------------------------------------------------------------------------------------
def comm_wait_text(comm: Communication, median_s: float) -> str:
    """The collectives' own wait as a fact, with the wait for later ranks beside it where it is known."""
    step_s = comm.step_s or median_s
    which = "profiled" if comm.step_s else "median"
    who = "the device" if comm.measured_on == "device" else "the training thread"
    text = (f"{who} waits on {comm.backend} collectives' own work {comm_share(comm, median_s):.0%} of "
            f"each step: {comm.own_exposed_s * 1e3:.1f} ms of the {step_s * 1e3:.1f} ms {which} step")
    if comm.waiting_s:
        text += (f"; another {comm.waiting_s * 1e3:.1f} ms a step it waits for a later rank to arrive, which is "
                 "imbalance, not communication")
    beyond = comm.exposed_s - (comm.waiting_s or 0.0) - comm.own_exposed_s
    if beyond > 0:
        text += (f"; {beyond * 1e3:.1f} ms more it sat idle after them than the rank that waited least on them, "
                 "waiting to run again, not communicating")
    return text


def comm_flight_text(comm: Communication) -> str:
    """How many collectives a step issues, how long they are in flight and how much of that overlaps compute: the
    one wording of the verdict, its wait line and the advice to send less."""
    calls = f"{comm.calls_per_step:.0f}"
    return (f"{calls} collective{'' if calls == '1' else 's'} a step, in flight {comm.comm_s * 1e3:.1f} ms, "
            f"{comm.overlap:.0%} of it overlapped with compute")


# -- steps unlike the steady ones ----------------------------------------------------------------------------------
def _how_paced(ratio: float) -> str:
    """Steps at ``ratio`` times the steady median, in words: "3x longer", "4x shorter"."""
    return f"{ratio:.0f}x longer" if ratio > 1 else f"{1 / ratio:.0f}x shorter"


def unlike_text(unlike: UnlikeSteps, what: str, steady_median_s: float) -> str:
    """Steps a profiler's window held (``what``) that are unlike the steady ones, and the ``--skip-steps`` that
    profiles steps like them."""
    how = _how_paced(unlike.ratio)
    one = unlike.first == unlike.last
    took = f"{unlike.first}," if one else f"{unlike.first}-{unlike.last}, median"
    return (f"{what} ({took} {unlike.median_s * 1e3:.1f} ms) {'is' if one else 'are'} {how} than the "
            f"steady-state steps (median {steady_median_s * 1e3:.1f} ms): the run changed pace after "
            f"{'it' if one else 'them'}; `gpuscope run --skip-steps {unlike.skip} ...` "
            "profiles steps like the steady ones")


def unlike_reason(record: RunRecord, first: int, last: int, what: str) -> str | None:
    """Why steps ``first``..``last`` (a profiler's window: ``what``) do not describe the steady-state ones, or None:
    some ran in another training loop than the measured one (``loops.other_loop``), or their pace is another
    (``evidence.unlike_steps``)."""
    if (other := other_loop(record, first, last, what)) is not None:
        return other
    unlike = unlike_steps(record, first, last)
    return unlike_text(unlike, what, record.steps.median_s) if unlike is not None else None


def unlike_window(record: RunRecord) -> str | None:
    """Why the op profile's steps do not describe the steady-state ones (``unlike_reason``), or None."""
    window = profile_window(record)
    return unlike_reason(record, *window, "the op profile's steps") if window is not None else None


def counted_step_unlike(record: RunRecord, step: int) -> str | None:
    """Why the step whose FLOPs were counted does not describe the steady-state ones, or None: it ran in another
    training loop, or the steady steps around it run at another pace than the median one (``steps_around``: the
    counted step's own time is slowed by the counter); where none was sampled around it, its own time
    (``unlike_reason``)."""
    what = "the step whose FLOPs were counted"
    if (other := other_loop(record, step, step, what)) is not None:
        return other
    around = steps_around(record, step)
    if around is not None:
        return (f"the steady steps around step {step}, whose FLOPs were counted (median {around.median_s * 1e3:.1f} "
                f"ms), are {_how_paced(around.ratio)} than the steady-state steps (median "
                f"{record.steps.median_s * 1e3:.1f} ms): the run changed pace after them; `gpuscope run --skip-steps "
                f"{around.skip} ...` counts a step like the steady ones")
    return None if steady_steps_near(record, step) else unlike_reason(record, step, step, what)
