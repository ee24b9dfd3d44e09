"""How the diagnosis names what it found: the verdict's label, the steps left out, a speed-up, a FLOP count. The
verdict's evidence and every renderer (the terminal summary, the HTML report, compare) say them alike."""

from __future__ import annotations

from gpuscope.record import RunRecord

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
