"""The few lines printed at the end of ``gpuscope run``: plain text, readable in a terminal and in CI logs."""

from __future__ import annotations

from pathlib import Path

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
    return (f"left out: {steps.warmup} warm-up{skipped}, {steps.profiled} profiled, {steps.outliers} outliers"
            f"{evaluated}{loops}")


def window_line(record: RunRecord) -> str | None:
    """What ``--profile-steps`` measured and when the record was handed over (None: the whole run was profiled)."""
    window = record.profiling_window
    if window is None or window.profile_steps is None or window.handed_over_s is None:
        return None
    first = window.skip_steps
    return (f"  measured steps {first}-{first + window.profile_steps - 1}; the report was ready "
            f"{window.handed_over_s:.1f} s into the run, which went on unprofiled")


def summary_lines(record: RunRecord, run_dir: Path, report_path: Path | None = None) -> list[str]:
    """The end-of-run summary: verdict and its evidence, the steps, the top three recommendations, and where the
    files are (``report_path``: the report, where one was written)."""
    verdict = record.verdict
    steps = record.steps
    from gpuscope.analysis.speed import headroom_text

    headroom = headroom_text(record)
    lines = [f"gpuscope: {bound_label(record)}{' ' + headroom if headroom else ''} "
             f"(confidence {verdict.confidence:.2f})"]
    lines += [f"  - {fact}" for fact in verdict.evidence]
    sol = record.speed_of_light
    if sol is not None and sol.achieved_flops_per_s is not None:
        peak = f" of a {sol.peak_flops_per_s / 1e9:.1f} GFLOP/s peak" if sol.peak_flops_per_s else ""
        if sol.peak_flops_per_s and sol.mfu is None and sol.peak_measured:  # too far below the run's rate
            peak = (f"; this machine's {sol.dtype or 'float32'} matmul benchmark measured "
                    f"{sol.peak_flops_per_s / 1e9:.2f} GFLOP/s, not this run's peak: no MFU")
        elif sol.peak_flops_per_s and sol.mfu is None:  # above a datasheet peak: the note says why
            peak = f"; no MFU: {sol.note}"
        lines.append(f"  speed of light: {flop_text(sol.flops_per_step)} a step, achieved {flop_text(sol.achieved_flops_per_s)}/s"
                     f"{peak}")
    if record.what_if is not None:
        lines.append(f"  what if (estimate): step {record.what_if.step_s * 1e3:.1f} ms, "
                     f"{speedup_text(record.what_if.speedup)}, {record.what_if.explanation}")
    if steps.count:
        shares = ", ".join(f"{name.replace('_', ' ')} {share:.0%}" for name, share in record.breakdown.as_dict().items())
        clock = (f" on the GPU's timeline (the host's own {steps.host_median_s * 1e3:.1f} ms)"
                 if steps.clock == "device" and steps.host_median_s is not None else "")
        lines.append(f"  steps: {steps.count} steady of {steps.total} ({left_out(record)}), "
                     f"median {steps.median_s * 1e3:.1f} ms{clock}; {shares}")
    measured = window_line(record)
    if measured is not None:
        lines.append(measured)
    for rec in record.recommendations[:3]:
        gain = f" (~{rec.expected_gain:.0%} of step time)" if rec.expected_gain is not None else ""
        lines.append(f"  * {rec.title}{gain}")
    lines.append(f"  run record: {run_dir / 'run.json'}")
    if report_path is not None:
        lines.append(f"  report: {report_path}")
    return lines
