"""How the diagnosis names what it found: the verdict's label, the steps left out, a speed-up, a FLOP count, and
the sentences about a CUDA step's figures (``gpu_step``, ``clock``: numbers only). The verdict's evidence and every
renderer (the terminal summary, the HTML report, compare) say them alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuscope.diagnose import thresholds as th
from gpuscope.record import RunRecord

if TYPE_CHECKING:
    from gpuscope.diagnose.clock import HostPace
    from gpuscope.diagnose.gpu_step import GpuStep, OwnCost

BOUND_LABELS = {
    "data-loading": "data-loading-bound",
    "cpu-launch": "CPU-launch-bound",
    "communication": "communication-bound",
    "inconclusive": "inconclusive",
}


def flop_text(value: float) -> str:
    """A FLOP count with a prefix that suits it: "2.82 GFLOP", and "520.00 kFLOP" where GFLOP would read 0.00 (a policy
    network stepped one observation at a time)."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}FLOP"
    return f"{value:.0f} FLOP"


def speedup_text(speedup: float) -> str:
    """A predicted speed-up in words: "1.64x faster", or "1.30x slower" where the remedy would cost time."""
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
