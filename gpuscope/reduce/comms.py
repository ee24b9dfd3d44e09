"""Collective communication over the recorded steps: how long per step, and how much of it was *exposed* (nothing
else ran meanwhile: the step waited) rather than overlapped with compute.

On a GPU run (NCCL), measured on the device: NCCL's kernels (``ncclKernel_AllReduce...``) against the compute
kernels of the same device, both clipped to that device's window (``reduce.windows``). In flight: the union of
the NCCL kernels; exposed: the part of it during which no compute kernel ran on the device. This is Holistic Trace
Analysis's communication/computation overlap, per device and within the recorded steps. (The host's view cannot
tell: DDP's all-reduce is queued from the autograd thread, and the training thread only waits at the end.)

On a CPU run (gloo), on the host: gloo records each collective as a ``gloo:all_reduce`` range on its own worker
thread, from when its worker picked it up; the training thread issued it earlier (its ``c10d::`` call) and may
wait on it while it is queued (a worker busy with an earlier one, or waiting for a core). In flight: each collective
from its issue to gloo's end, their union within the recorded steps; exposed: the part during which the *training
thread* (the one that ran the ``ProfilerStep#N`` ranges) was inside no op, waiting (DDP waits at the end of
``backward()``). If the trace holds no op of the training thread inside the steps at all (a sampled or stripped
trace), what it did meanwhile is unknown, and no wait is claimed (``exposure_measured`` False).

Either way, every figure is clipped to the steps, so no share of a step exceeds the whole step, and
``step_s`` is the length of those same steps, what any share of a step is of.

Each collective is also kept as a call (``CollectiveCall``): when this rank arrived at it, when it ended, and where
meanwhile the training thread (the device) sat idle, and in which phase. One rank cannot tell waiting for a late
rank from the collective's own time; set beside the other ranks' calls it can (``diagnose.arrival``).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gpuscope.reduce.columns import Kernels
from gpuscope.reduce.intervals import Span, clip, difference, intersect, length, union, union_in_order
from gpuscope.reduce.kernels import is_communication_kernel
from gpuscope.reduce.trace import StepSpan, TraceIndex, index_trace, recorded_steps
from gpuscope.reduce.windows import DeviceWindow, device_window
from gpuscope.reduce.phases import phase_spans, step_phases
from gpuscope.record import CollectiveCall, Communication, ProfiledStep

MAX_CALLS = 2048
"""Calls kept a record: a few steps of an FSDP model of many layers stay under it."""
IDLE_MIN_US = 20.0
"""Idle spans shorter than this are the gaps between one op and the next, not a wait: not kept with a call."""
KINDS = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
         ("broadcast", "broadcast"), ("alltoall", "all_to_all"), ("sendrecv", "send_recv"), ("send", "send_recv"),
         ("recv", "send_recv"))


def communication(events: Sequence[Mapping[str, Any]], steps: int) -> Communication | None:
    """Per-step communication figures of a trace's ``traceEvents`` over ``steps`` recorded steps, or None when
    the steps hold no collective."""
    index = index_trace(events)
    spans = recorded_steps(index)
    windows = {d: device_window(index, d, spans) for d in index.kernels}
    return trace_communication(index, spans, steps, {d: w for d, w in windows.items() if w is not None})


def trace_communication(index: TraceIndex, steps: Sequence[StepSpan], count: int,
                        windows: Mapping[int, DeviceWindow], device: int | None = None) -> Communication | None:
    """On the device when it ran NCCL kernels (``device``, else the one with the most NCCL time), else gloo's on
    the host; per step over ``count`` steps."""
    comm = {d: _communication_names(ks) for d, ks in index.kernels.items()}
    nccl_us = {d: sum(end - start for start, end, n in zip(ks.start_us, ks.end_us, ks.name) if comm[d][n])
               for d, ks in index.kernels.items()}
    if device is None or not nccl_us.get(device):
        device = max(nccl_us, key=lambda d: nccl_us[d]) if any(nccl_us.values()) else None
    if device is not None:
        window = windows.get(device)
        bounds = (window.start_us, window.end_us) if window is not None else None
        return device_communication(index.kernels[device], bounds, count, device, steps)
    return host_communication(index, steps, count)


def device_communication(kernels: Kernels, window: Span | None, steps: int,
                         device: int | None = None, spans: Sequence[StepSpan] = ()) -> Communication | None:
    """NCCL kernels against the compute kernels of the same device, within ``window``; None without NCCL
    kernels there."""
    comm = _communication_names(kernels)
    nccl = [(start, end) for start, end, n in zip(kernels.start_us, kernels.end_us, kernels.name) if comm[n]]
    in_flight = clip(union(nccl), window)
    if not in_flight:
        return None
    calls = sum(1 for start, _ in nccl if window is None or window[0] <= start < window[1])
    comm_us = length(in_flight)
    compute = union_in_order(lambda: ((start, end) for start, end, n in zip(kernels.start_us, kernels.end_us,
                                                                             kernels.name) if not comm[n]))
    exposed_us = comm_us - length(intersect(in_flight, clip(compute, window)))
    figures = _per_step(calls, comm_us, exposed_us, steps, "nccl", "device", device, True)
    step_s = (window[1] - window[0]) / 1e6 / max(1, steps) if window is not None else None
    return dataclasses.replace(figures, step_s=step_s, calls=tuple(device_calls(kernels, comm, compute, spans)),
                               profiled_steps=tuple(ProfiledStep(s.number, s.start_us, s.end_us) for s in spans))


def device_calls(kernels: Kernels, comm: Mapping[int, bool], compute: list[Span],
                 steps: Sequence[StepSpan]) -> list[CollectiveCall]:
    """The NCCL kernels launched in ``steps``, in launch order (the order the host issued them): each arrives when
    its kernel starts (it then waits on the device for the other ranks' kernels) and ends with it; idle where no
    compute kernel of the device ran."""
    starts = [s.start_us for s in steps]
    found = []
    for start, end, name, launch in zip(kernels.start_us, kernels.end_us, kernels.name, kernels.launch_us):
        if comm[name] and (step := _step_at(steps, starts, launch)) is not None:
            found.append((launch, start, end, step.number, kernels.names[name]))
    found.sort()
    return [CollectiveCall(number, collective_kind(name), start, end,
                           tuple((a, b, "") for a, b in _gaps(compute, start, end)))
            for _, start, end, number, name in found[:MAX_CALLS]]


def _communication_names(kernels: Kernels) -> dict[int, bool]:
    """Whether each name of ``kernels`` (by index) is a collective's."""
    return {n: is_communication_kernel(kernels.names[n]) for n in set(kernels.name)}


def host_communication(index: TraceIndex, steps: Sequence[StepSpan], count: int) -> Communication | None:
    """gloo's collectives against the training thread's ops, within the steps (the whole trace when it has no
    step, and then the thread with the most ops stands for the training thread); None without a collective."""
    within = union((s.start_us, s.end_us) for s in steps) if steps else None
    in_flight = union(_from_issue(index.issued, sorted(index.collectives)))
    if within is not None:
        in_flight = intersect(in_flight, within)
    if not in_flight:
        return None
    if steps:
        thread = steps[0].thread
    else:
        thread = max(index.ops, key=lambda t: len(index.ops[t])) if index.ops else None
    ops = union_in_order(lambda: index.ops.get(thread, []))
    if index.waits.get(thread):  # an op that waits for a collective leaves the thread idle
        ops = difference(ops, union(index.waits[thread]))
    if within is not None:
        ops = intersect(ops, within)
    comm_us = length(in_flight)
    measured = bool(ops)
    exposed_us = comm_us - length(intersect(in_flight, ops)) if measured else 0.0
    calls = sum(1 for start, _ in index.collectives if within is None or _inside(start, within))
    figures = _per_step(calls, comm_us, exposed_us, count, "gloo", "host", None, measured)
    if not steps:
        return figures
    return dataclasses.replace(
        figures, step_s=sum(s.end_us - s.start_us for s in steps) / 1e6 / max(1, count),
        calls=tuple(host_calls(index, steps, ops if measured else None)),
        profiled_steps=tuple(ProfiledStep(s.number, s.start_us, s.end_us, step_phases(index, s)) for s in steps))


def host_calls(index: TraceIndex, steps: Sequence[StepSpan], ops: list[Span] | None) -> list[CollectiveCall]:
    """gloo's collectives issued in ``steps``, in order. Each arrives when its ``c10d::`` call started, where the
    calls and gloo's ranges pair one to one (else when gloo's range started: its worker picked it up), is of the
    call's kind, and ends with gloo's range; idle where the training thread ran no op (``ops``; None: not known), by
    the phase it was in."""
    starts = [s.start_us for s in steps]
    names = index.collective_names or ["gloo:collective"] * len(index.collectives)
    runs = sorted((span, name) for span, name in zip(index.collectives, names)
                  if _step_at(steps, starts, span[0]) is not None)
    issued = sorted(call for call in index.issued if _step_at(steps, starts, call[0]) is not None)
    paired = len(issued) == len(runs)
    arrivals = _from_issue(issued, [span for span, _ in runs])
    phases = {s.number: phase_spans(index, s) for s in steps}
    found = []
    for k, ((start, end), name) in enumerate(runs[:MAX_CALLS]):
        arrival = arrivals[k][0]
        step = _step_at(steps, starts, arrival) or _step_at(steps, starts, start)
        assert step is not None  # runs are within the steps
        idle = () if ops is None else tuple(_by_phase(_gaps(ops, arrival, end), phases[step.number]))
        kind = collective_kind(issued[k][2] if paired else name)  # gloo runs a reduce-scatter as an all-reduce
        found.append(CollectiveCall(step.number, kind, arrival, end, idle, _phase_at(phases[step.number], arrival)))
    return found


def _from_issue(issued: Sequence[tuple[float, float, str]], runs: Sequence[Span]) -> list[Span]:
    """gloo's ``runs`` (by start) each from when it was issued: the ``c10d::`` calls (by start) pair with them one to
    one where there are as many; else the runs as they are."""
    if len(issued) != len(runs):
        return list(runs)
    return [(min(call[0], start), end) for call, (start, end) in zip(sorted(issued), runs)]


def _phase_at(phases: Mapping[str, list[Span]], t: float) -> str:
    """The phase of ``phases`` (each one's disjoint spans) that holds the time ``t``; ``other`` where none does."""
    return next((phase for phase, spans in phases.items() if any(s <= t < e for s, e in spans)), "other")


def collective_kind(name: str) -> str:
    """``all_reduce``, ``all_gather``... from a gloo range's, a ``c10d::`` call's or an NCCL kernel's name."""
    flat = name.lower().replace("_", "")
    return next((kind for pattern, kind in KINDS if pattern in flat), name)


def _step_at(steps: Sequence[StepSpan], starts: Sequence[float], t: float) -> StepSpan | None:
    """The step of ``steps`` (in time order, ``starts`` theirs) that holds the time ``t``, if any."""
    i = bisect.bisect_right(starts, t) - 1
    return steps[i] if i >= 0 and t < steps[i].end_us else None


def _gaps(busy: list[Span], start: float, end: float) -> list[Span]:
    """The parts of [start, end] outside the sorted disjoint ``busy`` spans, each at least ``IDLE_MIN_US`` long."""
    return [(s, e) for s, e in difference([(start, end)], busy) if e - s >= IDLE_MIN_US]


def _by_phase(gaps: list[Span], phases: Mapping[str, list[Span]]) -> list[tuple[float, float, str]]:
    """``gaps`` cut where the step's phases change, each part with its phase."""
    parts = [(s, e, phase) for phase, spans in phases.items() for s, e in intersect(gaps, spans)]
    return sorted(p for p in parts if p[1] > p[0])


def _per_step(calls: int, comm_us: float, exposed_us: float, steps: int, backend: str, where: str,
              device: int | None, measured: bool) -> Communication:
    steps = max(1, steps)
    return Communication(
        calls_per_step=calls / steps,
        comm_s=comm_us / 1e6 / steps,
        exposed_s=exposed_us / 1e6 / steps,
        overlap=1 - exposed_us / comm_us if comm_us > 0 and measured else 0.0,
        backend=backend,
        measured_on=where,
        device=device,
        exposure_measured=measured,
    )


def _inside(t: float, spans: list[Span]) -> bool:
    return any(start <= t < end for start, end in spans)
