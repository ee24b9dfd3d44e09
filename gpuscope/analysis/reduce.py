"""From what the collectors captured to the record's fields: the reductions that turn raw, bounded payloads into
figures (the steady-state split of the steps, the speed of light against a peak). The collection stage calls
``record_fields`` once per collector result; a payload that is already a record type passes through as it is."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuscope.analysis.peaks import gpu_peak_flops
from gpuscope.analysis.steady import StepSummary, summarize_capture
from gpuscope.captures import CpuPeak, FlopCount, StepCapture
from gpuscope.record import SpeedOfLight


def record_fields(field: str, payload: object, payloads: Mapping[str, object]) -> dict[str, Any]:
    """The record fields ``payload`` (a collector's result for record field ``field``) fills; ``payloads`` are all
    the collectors' results by collector name, for reductions that combine two (FLOPs and a measured peak)."""
    if isinstance(payload, StepCapture):
        return steps_fields(summarize_capture(payload), payload)
    if isinstance(payload, FlopCount):
        peak = next((p for p in payloads.values() if isinstance(p, CpuPeak)), None)
        return {field: speed_of_light(payload, peak)}
    return {field: payload}


def steps_fields(summary: StepSummary, capture: StepCapture) -> dict[str, Any]:
    """The record fields the steps fill: their figures, the breakdowns, the loaders and the device."""
    return {
        "steps": summary.steps,
        "breakdown": summary.breakdown,
        "host_breakdown": summary.host_breakdown,
        "loaders": capture.loaders,
        "device": capture.device,
    }


def speed_of_light(count: FlopCount, cpu_peak: CpuPeak | None) -> SpeedOfLight:
    """One step's FLOPs against the device's peak: the GPU model's datasheet figure for the matmuls' dtype (TF32
    when float32 matmuls were allowed it), or on a CPU run this machine's measured matmul rate (none when the
    probe did not run). ``achieved_flops_per_s`` and ``mfu`` are filled in later, from the median step."""
    result = SpeedOfLight(flops_per_step=count.flops_per_step, flops_by_op=dict(count.flops_by_op), step=count.step,
                          dtype=count.dtype, device_name=count.device_name, note=count.note)
    if count.cuda and count.device_name is not None:
        dtype = count.dtype or "float32"
        table_dtype = "tfloat32" if dtype == "float32" and count.tf32 else dtype
        peak, source = gpu_peak_flops(count.device_name, table_dtype)
        return replace(result, peak_flops_per_s=peak, peak_source=source, dtype=table_dtype if peak else dtype,
                       note=count.note or ("" if peak is not None else source))
    if not count.cuda and cpu_peak is not None:
        return replace(result, device_name=cpu_peak.device_name, peak_flops_per_s=cpu_peak.flops_per_s,
                       peak_measured=True, peak_source=cpu_peak.source)
    return result
