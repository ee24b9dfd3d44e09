"""The few lines printed at the end of ``gpuscope run``: plain text, readable in a terminal and in CI logs."""

from __future__ import annotations

from pathlib import Path

from gpuscope.diagnose.words import (bound_label, command_text, flop_text, left_out, other_text, sparse_flops_text,
                                    speedup_text)
from gpuscope.record import RunRecord

PEAK_PHASES = {"forward": " in forward", "backward": " in backward", "optimizer": " at the optimizer"}
"""How the memory line says where in the step the peak fell (nothing for ``other``)."""


def byte_text(value: float) -> str:
    """Bytes in decimal units for a line of text: "30.3 MB", "1.2 GB", "512.0 kB"."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def memory_lines(record: RunRecord) -> list[str]:
    """What fills memory at the peak, the four categories a model holds by size and the rest as "other"; a leak's
    growth and the line that makes it (the allocation a run died of heads the summary). Empty without a memory
    record."""
    memory = record.memory
    if memory is None:
        return []
    lines = []
    if memory.peak_bytes:
        parts = sorted((("parameters", memory.parameters_bytes), ("gradients", memory.gradients_bytes),
                        ("optimizer state", memory.optimizer_state_bytes), ("activations", memory.activations_bytes),
                        ("inputs", memory.inputs_bytes), ("temporaries", memory.temporaries_bytes)),
                       key=lambda part: -part[1])
        small = [part for part in parts if part[1] < memory.peak_bytes / 100]  # said as "other", with the unplaced
        parts = [part for part in parts if part not in small]
        parts.append(("other", memory.unknown_bytes + sum(value for _, value in small)))
        split = ", ".join(f"{name} {byte_text(value)}" for name, value in parts if value)
        lines.append(f"  memory: peak {byte_text(memory.peak_bytes)}{PEAK_PHASES.get(memory.peak_phase, '')}"
                     f"{f' ({split})' if split else ''}")
    growth = memory.growth
    if growth is not None and growth.leak:
        top = next((k for k in memory.kept if k.line), None)
        made = f": made at {top.line}" + (f", kept by {top.held_by}" if top.held_by else "") if top else ""
        kept = f", {byte_text(growth.kept_per_step_bytes)} of it tensors kept" if growth.kept_per_step_bytes else ""
        lines.append(f"  memory grows {byte_text(growth.per_step_bytes)} a step (leak{kept}){made}")
    return lines


def window_line(record: RunRecord) -> str | None:
    """What ``--profile-steps`` measured and when the record was handed over (None: the whole run was profiled)."""
    window = record.profiling_window
    if window is None or window.profile_steps is None or window.handed_over_s is None:
        return None
    first = window.skip_steps
    return (f"  measured steps {first}-{first + window.profile_steps - 1}; the report was ready "
            f"{window.handed_over_s:.1f} s into the run, which went on unprofiled")


def summary_lines(record: RunRecord, run_dir: Path, report_path: Path | None = None) -> list[str]:
    """The end-of-run summary: verdict and its evidence, the steps, what fills memory, the top three recommendations,
    and where the files are (``report_path``: the report, where one was written)."""
    verdict = record.verdict
    steps = record.steps
    from gpuscope.diagnose.speed import headroom_text

    headroom = headroom_text(record)
    lines = [f"gpuscope: {bound_label(record)}{' ' + headroom if headroom else ''} "
             f"(confidence {verdict.confidence:.2f})"]
    died = record.memory.out_of_memory if record.memory is not None else None
    if died is not None:  # what the run died of comes first; the speed's verdict after it
        lines = [f"gpuscope: the script ran out of memory at step {died.step}; its speed: {lines[0][10:]}"]
    lines += [f"  - {fact}" for fact in verdict.evidence]
    sol = record.speed_of_light
    if sol is not None and sol.achieved_flops_per_s is not None:
        peak = f" of a {sol.peak_flops_per_s / 1e9:.1f} GFLOP/s peak" if sol.peak_flops_per_s else ""
        if sol.peak_flops_per_s and sol.mfu is None and sol.peak_measured:  # too far below the run's rate
            peak = (f"; this machine's {sol.dtype or 'float32'} matmul benchmark measured "
                    f"{sol.peak_flops_per_s / 1e9:.2f} GFLOP/s, not this run's peak: no MFU")
        elif sol.peak_flops_per_s and sol.mfu is None:  # above a datasheet peak: the note says why
            peak = f"; no MFU: {sol.note}"
        sparse = sparse_flops_text(sol)
        lines.append(f"  speed of light: {flop_text(sol.flops_per_step)} a step, achieved {flop_text(sol.achieved_flops_per_s)}/s"
                     f"{peak}{'; ' + sparse if sparse else ''}")
    if record.what_if is not None:
        lines.append(f"  what if (estimate): step {record.what_if.step_s * 1e3:.1f} ms, "
                     f"{speedup_text(record.what_if.speedup)}, {record.what_if.explanation}")
    if steps.count:
        shares = ", ".join(f"{name.replace('_', ' ')} {share:.0%}" for name, share in record.breakdown.as_dict().items())
        clock = (f" on the GPU's timeline (the host's own {steps.host_median_s * 1e3:.1f} ms)"
                 if steps.clock == "device" and steps.host_median_s is not None else "")
        closure = f", {steps.closure_calls_per_step:.1f} calls of the optimizer's closure a step" \
            if steps.closure_calls_per_step and steps.closure_calls_per_step >= 1.5 else ""
        lines.append(f"  steps: {steps.count} steady of {steps.total} ({left_out(record)}), "
                     f"median {steps.median_s * 1e3:.1f} ms{clock}{closure}; {shares}")
        if other := other_text(record):
            lines.append(f"    other {record.breakdown.other:.0%}: {other}")
    measured = window_line(record)
    if measured is not None:
        lines.append(measured)
    where = record.distributed
    if where is not None and where.profiled_alone:
        lines.append(f"  rank {where.rank} of {where.world_size} profiled alone: the script started the other ranks "
                     f"without gpuscope; `gpuscope run --nproc-per-node {where.world_size} {command_text(record)}` "
                     "profiles them all")
    lines += memory_lines(record)
    for rec in record.recommendations[:3]:
        gain = f" (~{rec.expected_gain:.0%} of step time)" if rec.expected_gain is not None else ""
        lines.append(f"  * {rec.title}{gain}")
    lines.append(f"  run record: {run_dir / 'run.json'}")
    if report_path is not None:
        lines.append(f"  report: {report_path}")
    return lines
