"""From what the collectors captured to the record's fields: the reductions that turn raw, bounded payloads into
figures (the steady-state split of the steps, the speed of light against a peak). The collection stage calls
``record_fields`` once per collector result: each payload type's reduction is registered beside it here
(``reduces``); a payload that is already a record type passes through as it is."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuscope.reduce.figures import TraceFigures, trace_figures
from gpuscope.reduce.optable import OpTable, events_before, indexed_table, op_kind, op_table, window_events
from gpuscope.reduce.peaks import gpu_peak_flops
from gpuscope.reduce.steady import StepSummary, evaluation_passes, summarize_capture
from gpuscope.reduce.trace import index_file, is_communication_op, read_trace
from gpuscope.collect.autocast_timing import describe
from gpuscope.collect.captures import CpuPeak, FlopCount, StepCapture, TraceCapture
from gpuscope.record import AttentionTiming, AutocastTiming, Losses, OpProfile, SpeedOfLight, Window

TOP_OPS = 15
"""Ops listed by host and by device time."""
HOST_OPS = 256
"""Ops kept in ``OpProfile.host_ops``: every op a training step calls, within a bound on run.json's size."""


Reduction = Callable[[str, Any, Mapping[str, object]], dict[str, Any]]
"""How a payload type becomes record fields: ``(field, payload, payloads) -> {field name: value}``, ``payloads``
being every collector's by name (a reduction may combine two: FLOPs and a measured peak)."""


@dataclass(frozen=True, slots=True)
class _Registered:
    reduce: Reduction
    reads_others: bool


REDUCTIONS: dict[type, _Registered] = {}
"""Each payload type's reduction, as ``reduces`` registered it. A payload of any other type is a record type
already, and fills its collector's field as it is."""


def reduces(payload_type: type, *, reads_others: bool = False) -> Callable[[Reduction], Reduction]:
    """Register the decorated function as ``payload_type``'s reduction. ``reads_others``: it reads payloads the
    post-run probes add, so its result cannot be reused from before they ran."""
    def register(reduction: Reduction) -> Reduction:
        if payload_type in REDUCTIONS:
            raise ValueError(f"{payload_type.__name__} has a reduction already")
        REDUCTIONS[payload_type] = _Registered(reduction, reads_others)
        return reduction
    return register


def record_fields(field: str, payload: object, payloads: Mapping[str, object]) -> dict[str, Any]:
    """The record fields ``payload`` (a collector's result for record field ``field``) fills: its type's reduction
    (``reduces``), or the payload itself in ``field``."""
    registered = REDUCTIONS.get(type(payload))
    return registered.reduce(field, payload, payloads) if registered is not None else {field: payload}


def reads_others(payload: object) -> bool:
    """Whether ``record_fields`` of ``payload`` reads payloads the post-run probes add (the FLOP count is held
    against the cpu-peak probe's measurement), so that its reduction cannot be reused once they ran. (The op table
    reads the steps collector's, which is done when the probes start.)"""
    registered = REDUCTIONS.get(type(payload))
    return registered is not None and registered.reads_others


@reduces(StepCapture)
def _steps(field: str, capture: StepCapture, payloads: Mapping[str, object]) -> dict[str, Any]:
    return steps_fields(summarize_capture(capture), capture)


@reduces(TraceCapture)
def _trace(field: str, capture: TraceCapture, payloads: Mapping[str, object]) -> dict[str, Any]:
    steps = next((p for p in payloads.values() if isinstance(p, StepCapture)), None)
    passes = evaluation_passes(steps, capture.recorded) if steps is not None else set()
    return {field: trace_op_profile(capture, passes)}


@reduces(FlopCount, reads_others=True)
def _flops(field: str, count: FlopCount, payloads: Mapping[str, object]) -> dict[str, Any]:
    peak = next((p for p in payloads.values() if isinstance(p, CpuPeak)), None)
    return {field: speed_of_light(count, peak)}


def steps_fields(summary: StepSummary, capture: StepCapture) -> dict[str, Any]:
    """The record fields the steps fill: their figures, the breakdowns, the loaders and the device."""
    return {
        "steps": summary.steps,
        "breakdown": summary.breakdown,
        "host_breakdown": summary.host_breakdown,
        "loaders": capture.loaders,
        "device": capture.device,
        "loss": Losses(tuple(i for i, _ in capture.losses), tuple(v for _, v in capture.losses))
        if capture.losses else None,
    }


def trace_op_profile(capture: TraceCapture, evaluated: set[int] | frozenset[int] = frozenset()) -> OpProfile:
    """torch.profiler's window as figures: the op table, and from every event of the trace the kernel timeline
    (per device), communication and the recorded steps. The op table leaves out the ``evaluated`` steps (a test
    pass between epochs that fell in the window) while some other recorded step is left, and, where the run ended
    inside the window, the script's last lines after its last step (``unfinished``), which are no step. Where the
    events were not held (``trace.json`` is the whole trace), the file is read as a stream into an index, as
    ``gpuscope analyze`` reads one; and whole only where steps must be left out of it (rare)."""
    events, recorded = capture.events, capture.recorded
    left_out: tuple[int, ...] = ()
    if events is None:
        index, _ = index_file(capture.path)  # type: ignore[arg-type]
        figures = trace_figures((), index)
        steps = len(recorded)
        if capture.unfinished in recorded or evaluated.intersection(s.number for s in figures.steps):
            del index
            events = read_trace(capture.path)["traceEvents"]  # type: ignore[arg-type]
        else:
            table = indexed_table(index.host, index.device, index.names, -math.inf, math.inf, every_device_event=True)
    if events is not None:
        figures = trace_figures(events)
        tail = next((s for s in figures.steps if s.number == capture.unfinished), None)
        if tail is not None and len(recorded) > 1:
            events, recorded = events_before(events, tail.start_us), tuple(i for i in recorded if i != tail.number)
            figures = trace_figures(events)
        training = [s for s in figures.steps if s.number not in evaluated]
        left_out = tuple(sorted(s.number for s in figures.steps if s.number in evaluated)) if training else ()
        if left_out:
            events = [e for s in training for e in window_events(events, s.start_us, s.end_us)]
        table, steps = op_table(events), len(training) if left_out else len(recorded)
    window = Window(recorded[0], recorded[-1]) if recorded else Window()
    if capture.scaled_by > 1:  # one closure call of the step's recorded: the step's table is that call's times its calls
        table = table.times(capture.scaled_by)
    profile = op_profile(table, window, steps, figures, cuda=capture.cuda, trace_bytes=capture.trace_bytes,
                         trace_detail=capture.trace_detail)
    closure = {"closure_calls": capture.scaled_by, "closure_call_s": capture.call_s} if capture.scaled_by > 1 else {}
    return replace(_with_cpu_waits(profile, capture), evaluated_steps=left_out, **closure)


def _with_cpu_waits(profile: OpProfile, capture: TraceCapture) -> OpProfile:
    """Each profiled step's wait for a CPU, beside its phases in the communication figures."""
    comm = profile.communication
    if comm is None or not capture.cpu_wait_s:
        return profile
    return replace(profile, communication=replace(comm, profiled_steps=tuple(
        replace(s, cpu_s=capture.cpu_s.get(s.number), cpu_wait_s=capture.cpu_wait_s.get(s.number))
        for s in comm.profiled_steps)))


def op_profile(table: OpTable, window: Window, steps: int, figures: TraceFigures, *, cuda: bool,
               trace_bytes: int, trace_detail: str = "full") -> OpProfile:
    """The op profile of ``steps`` recorded steps: the op table (as ``key_averages()`` gives it), the top rows by
    host and device time, the torch ops' calls (by kind, and their mean self time: runtime calls and device events
    are no ops), and the trace's figures (kernels only on a CUDA run)."""
    ops = table.op_calls
    self_host_s = sum(s.self_host_s for s in table.ops)
    comm = [o for o in table.ops if is_communication_op(o.name)]
    kinds: dict[str, int] = {}
    for op in table.ops:
        kinds[op_kind(op.name)] = kinds.get(op_kind(op.name), 0) + op.calls
    stats = table.rows
    by_device = sorted((o for o in stats if o.device_s > 0), key=lambda o: (-o.device_s, o.name))
    return OpProfile(
        window=window, steps=steps, trace_bytes=trace_bytes, trace_detail=trace_detail, ops=ops,
        ops_per_step=ops / max(1, steps), mean_op_s=self_host_s / ops if ops else 0.0,
        calls_by_kind=dict(sorted(kinds.items())),
        top_host=tuple(sorted(stats, key=lambda o: (-o.self_host_s, o.name))[:TOP_OPS]),
        top_device=tuple(by_device[:TOP_OPS]), device_s=table.device_s,
        kernels=figures.kernels if cuda else None, devices=figures.devices if cuda else (),
        communication=figures.communication,
        host_ops=tuple(sorted(table.ops, key=lambda o: (-o.self_host_s, o.name))[:HOST_OPS]),
        phase_calls=figures.phase_calls, data_ops=table.data_calls, data_ops_self_s=table.data_self_s,
        comm_ops=sum(o.calls for o in comm), comm_ops_self_s=sum(o.self_host_s for o in comm),
    )


def speed_of_light(count: FlopCount, cpu_peak: CpuPeak | None) -> SpeedOfLight:
    """One step's FLOPs against the device's peak: the GPU model's datasheet figure for the matmuls' dtype (TF32
    when float32 matmuls were allowed it), or on a CPU run this machine's measured matmul rate (none when the
    probe did not run), with its float32 rate where the matmuls were in another dtype. ``achieved_flops_per_s``
    and ``mfu`` are filled in later, from the median step."""
    call = count.attention
    attention = None if call is None else AttentionTiming(
        call.query, call.key, call.value, call.dtype, call.is_causal, call.called_at,
        dict(cpu_peak.attention_s) if cpu_peak is not None else {})
    result = SpeedOfLight(flops_per_step=count.flops_per_step, flops_by_op=dict(count.flops_by_op), step=count.step,
                          dtype=count.dtype, device_name=count.device_name, note=count.note,
                          flops_by_dtype=dict(count.flops_by_dtype), attention=attention,
                          sparse_flops=count.sparse_flops, probability_loss=count.probability_loss)
    if count.cuda and count.device_name is not None:
        dtype = count.dtype or "float32"
        table_dtype = "tfloat32" if dtype == "float32" and count.tf32 else dtype
        peak, source = gpu_peak_flops(count.device_name, table_dtype)
        return replace(result, peak_flops_per_s=peak, peak_source=source, dtype=table_dtype if peak else dtype,
                       note=count.note or ("" if peak is not None else source))
    if not count.cuda and cpu_peak is not None:
        return replace(result, device_name=cpu_peak.device_name, peak_flops_per_s=cpu_peak.flops_per_s,
                       peak_measured=True, peak_source=cpu_peak.source,
                       float32_flops_per_s=cpu_peak.float32_flops_per_s,
                       conv_flops_per_s=dict(cpu_peak.conv_flops_per_s), autocast=tuple(
                           AutocastTiming(op.kind, describe(op), op.flops / op.kind_flops if op.kind_flops else 0.0,
                                          *seconds) for op, *seconds in cpu_peak.autocast))
    return result
