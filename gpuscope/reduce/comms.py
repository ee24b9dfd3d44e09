"""Collective communication over the recorded steps: how long per step, and how much of it was *exposed* (nothing
else ran meanwhile: the step waited) rather than overlapped with compute.

On a GPU run (NCCL), measured on the device: NCCL's kernels (``ncclKernel_AllReduce...``) against the compute
kernels of the same device, both clipped to that device's window (``reduce.windows``). In flight: the union of
the NCCL kernels; exposed: the part of it during which no compute kernel ran on the device. This is Holistic Trace
Analysis's communication/computation overlap, per device and within the recorded steps. (The host's view cannot
tell: DDP's all-reduce is queued from the autograd thread, and the training thread only waits at the end.)

On a CPU run (gloo), on the host: gloo records each collective as a ``gloo:all_reduce`` range on its own worker
thread. In flight: their union within the recorded steps; exposed: the part during which the *training thread*
(the one that ran the ``ProfilerStep#N`` ranges) was inside no op, waiting (DDP waits at the end of
``backward()``). If the trace holds no op of the training thread inside the steps at all (a sampled or stripped
trace), what it did meanwhile is unknown, and no wait is claimed (``exposure_measured`` False).

Either way, every figure is clipped to the steps, so no share of a step exceeds the whole step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuscope.reduce.columns import Kernels
from gpuscope.reduce.intervals import Span, clip, intersect, length, union, union_in_order
from gpuscope.reduce.kernels import is_communication_kernel
from gpuscope.reduce.trace import StepSpan, TraceIndex, index_trace, recorded_steps
from gpuscope.reduce.windows import DeviceWindow, device_window
from gpuscope.record import Communication


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
        return device_communication(index.kernels[device], bounds, count, device)
    return host_communication(index, steps, count)


def device_communication(kernels: Kernels, window: Span | None, steps: int,
                         device: int | None = None) -> Communication | None:
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
    return _per_step(calls, comm_us, exposed_us, steps, "nccl", "device", device, True)


def _communication_names(kernels: Kernels) -> dict[int, bool]:
    """Whether each name of ``kernels`` (by index) is a collective's."""
    return {n: is_communication_kernel(kernels.names[n]) for n in set(kernels.name)}


def host_communication(index: TraceIndex, steps: Sequence[StepSpan], count: int) -> Communication | None:
    """gloo's collectives against the training thread's ops, within the steps (the whole trace when it has no
    step, and then the thread with the most ops stands for the training thread); None without a collective."""
    within = union((s.start_us, s.end_us) for s in steps) if steps else None
    in_flight = union(index.collectives)
    if within is not None:
        in_flight = intersect(in_flight, within)
    if not in_flight:
        return None
    if steps:
        thread = steps[0].thread
    else:
        thread = max(index.ops, key=lambda t: len(index.ops[t])) if index.ops else None
    ops = union_in_order(lambda: index.ops.get(thread, []))
    if within is not None:
        ops = intersect(ops, within)
    comm_us = length(in_flight)
    measured = bool(ops)
    exposed_us = comm_us - length(intersect(in_flight, ops)) if measured else 0.0
    calls = sum(1 for start, _ in index.collectives if within is None or _inside(start, within))
    return _per_step(calls, comm_us, exposed_us, count, "gloo", "host", None, measured)


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
