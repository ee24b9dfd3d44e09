"""The GPU's kernel timeline over the profiled steps, from a torch.profiler (Kineto) Chrome trace.

A pure function of the trace's ``traceEvents`` (the caller keeps only the profiled steps): how much of the steps'
wall time a kernel was running, why the GPU sat idle otherwise (Holistic Trace Analysis's host wait / kernel wait
/ other), which shares of kernel time went to Tensor Core kernels, convolutions, float32 GEMMs on CUDA cores and
NCHW <-> NHWC conversions (the kinds the backend flags decide), how many host-to-device copies came from pageable
memory, and how often and how long the host blocked waiting for the GPU.

Kineto writes ``ts`` and ``dur`` in microseconds. The events read here (libkineto ``output_json.cpp`` and
``CuptiActivity.cpp``):

- ``cat: "kernel"``: a kernel on the device (``pid`` is the device, ``tid`` the stream), with ``args.correlation``;
- ``cat: "cuda_runtime"`` / ``"cuda_driver"``: the host call that queued it (``cudaLaunchKernel``,
  ``cuLaunchKernel``, ``cudaMemcpyAsync``...), with the same ``args.correlation``;
- ``cat: "ac2g"``, ``ph: "s"``: the flow arrow from that call to the kernel, ``id`` the correlation, ``ts`` the
  call's start (read when the runtime events themselves were dropped);
- ``cat: "gpu_memcpy"``: copies, named ``Memcpy HtoD (Pageable -> Device)``, ``Memcpy HtoD (Pinned -> Device)``...
- ``cat: "cuda_sync"``: CUPTI's synchronisation records (``Stream Sync``, ``Event Sync``, ``Context Sync``,
  ``Stream Wait Event``), on the device's track, with the ``args.correlation`` of the host call that waited.

Copies, memsets, ``cuda_sync`` and ``gpu_user_annotation`` events are not kernels: the GPU counts as idle under them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpuscope.analysis.thresholds import (
    CONV_KERNEL_PATTERNS,
    FP32_GEMM_KERNEL_PATTERNS,
    KERNEL_WAIT_MAX_GAP_S,
    LAYOUT_TRANSFORM_KERNEL_PATTERNS,
    TENSOR_CORE_KERNEL_PATTERNS,
)
from gpuscope.record import KernelTimeline

_US_PER_S = 1e6  # Kineto (like the Chrome trace format) writes ts and dur in microseconds
_LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
SYNC_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
})
"""Runtime and driver calls that block the host until the GPU has finished the work they wait for."""
BLOCKING_COPY_PREFIXES = ("cudaMemcpy", "cuMemcpy")
"""Copies named so block the host until they are done, unless their name says ``Async`` (``cudaMemcpy``,
``cudaMemcpy2D``, ``cuMemcpyDtoH_v2``; not ``cudaMemcpyAsync``)."""
HOST_BLOCKING_SYNC_KINDS = frozenset({"Stream Sync", "Event Sync", "Context Sync"})
"""``cuda_sync`` records that block the host (libkineto's ``syncTypeString``); ``Stream Wait Event`` makes a stream
wait on the device and leaves the host free."""

IdleCategory = Literal["host_wait", "kernel_wait", "other"]


@dataclass(frozen=True, slots=True)
class Busy:
    """One stretch of time with at least one kernel running (all streams merged), in trace microseconds;
    ``first_launch_us`` is when the host queued the kernel that opened it (None where the trace does not say)."""

    start_us: float
    end_us: float
    first_launch_us: float | None


def kernel_timeline(events: Sequence[Mapping[str, Any]], window_wall_s: float, steps: int) -> KernelTimeline | None:
    """The kernel timeline of the profiled steps: ``events`` is a Kineto trace's ``traceEvents`` list restricted to
    those steps, ``window_wall_s`` their wall time, ``steps`` how many there were. None when no kernel ran.

    Fractions are of ``window_wall_s`` and add up to 1: ``busy_fraction`` is the union of kernel intervals (capped
    to 1); each gap between busy stretches is host wait, kernel wait or other (``classify_gap``); whatever is left
    of the window (before the first kernel, after the last one) is other. If the kernels span more than the window
    (the GPU ran on after the host's steps ended), the idle shares are scaled down to fit what ``busy`` leaves.
    Without a positive ``window_wall_s`` the kernels' own span stands in for it (HTA's denominator). The kernel
    kinds (Tensor Core, convolution, float32 GEMM, layout conversion) are shares of the kernels' summed time, which
    counts concurrent kernels each in full; the host's waits are ``host_syncs``.
    """
    launches = index_launches(events)
    kernels = [e for e in events if e.get("cat") == "kernel" and _timed(e)]
    if not kernels:
        return None

    busy = merge_kernels(kernels, launches)
    busy_us = sum(b.end_us - b.start_us for b in busy)
    idle_us = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
    for prev, nxt in zip(busy, busy[1:]):
        idle_us[classify_gap(prev.end_us, nxt.start_us, nxt.first_launch_us)] += nxt.start_us - prev.end_us

    window_us = window_wall_s * _US_PER_S if window_wall_s > 0 else busy[-1].end_us - busy[0].start_us
    busy_f, host_f, kernel_f, other_f = _fractions(busy_us, idle_us, window_us)

    names = [str(k.get("name", "")) for k in kernels]
    durations_us = [float(k["dur"]) for k in kernels]
    total_us = sum(durations_us)

    def share(kind: Callable[[str], bool]) -> float:
        return sum(d for n, d in zip(names, durations_us) if kind(n)) / total_us if total_us > 0 else 0.0

    h2d = [e for e in events if e.get("cat") == "gpu_memcpy" and "htod" in str(e.get("name", "")).lower()]
    sync_calls, sync_wait_us = host_syncs(events)
    return KernelTimeline(
        busy_fraction=busy_f,
        idle_host_wait_fraction=host_f,
        idle_kernel_wait_fraction=kernel_f,
        idle_other_fraction=other_f,
        kernels=len(kernels),
        kernels_per_step=len(kernels) / steps if steps > 0 else 0.0,
        mean_kernel_s=total_us / len(kernels) / _US_PER_S,
        tensor_core_share=share(uses_tensor_cores),
        h2d_copies=len(h2d),
        h2d_pageable_copies=sum("pageable" in str(e.get("name", "")).lower() for e in h2d),
        h2d_copy_s=sum(float(e["dur"]) for e in h2d if _timed(e)) / _US_PER_S,
        conv_share=share(is_convolution),
        fp32_gemm_share=share(is_fp32_cuda_core_gemm),
        layout_transform_share=share(is_layout_transform),
        sync_calls=sync_calls,
        sync_wait_s=sync_wait_us / _US_PER_S,
    )


def index_launches(events: Iterable[Mapping[str, Any]]) -> dict[int, float]:
    """When the host queued each piece of GPU work: correlation id -> start of the runtime/driver call (us).

    The ``ac2g`` flow start (same id, same time) fills in correlations whose runtime event is missing.
    """
    calls: dict[int, float] = {}
    flows: dict[int, float] = {}
    for e in events:
        cat = e.get("cat")
        if cat in _LAUNCH_CATEGORIES:
            corr = (e.get("args") or {}).get("correlation")
            if isinstance(corr, int) and _number(e.get("ts")):
                calls[corr] = float(e["ts"])
        elif cat == "ac2g" and e.get("ph") == "s" and isinstance(e.get("id"), int) and _number(e.get("ts")):
            flows[e["id"]] = float(e["ts"])
    return {**flows, **calls}


def merge_kernels(kernels: Iterable[Mapping[str, Any]], launches: Mapping[int, float]) -> list[Busy]:
    """The union of the kernels' intervals over all streams, in time order: overlapping or touching kernels make
    one busy stretch. A stretch opened by several kernels at once takes the earliest launch among them."""
    spans = []
    for k in kernels:
        start = float(k["ts"])
        corr = (k.get("args") or {}).get("correlation")
        launch = launches.get(corr) if isinstance(corr, int) else None
        spans.append((start, start + float(k["dur"]), launch))
    spans.sort(key=lambda s: (s[0], float("inf") if s[2] is None else s[2]))

    merged: list[Busy] = []
    for start, end, launch in spans:
        if merged and start <= merged[-1].end_us:
            last = merged[-1]
            merged[-1] = Busy(last.start_us, max(last.end_us, end), last.first_launch_us)
        else:
            merged.append(Busy(start, end, launch))
    return merged


def classify_gap(prev_end_us: float, next_start_us: float, next_launch_us: float | None) -> IdleCategory:
    """Why the GPU sat idle between two busy stretches (HTA's ``_analyze_idle_time_for_stream``).

    ``host_wait``: the next kernel was queued only after the previous stretch ended, so the host was late;
    ``kernel_wait``: it was already queued and the gap is under ``KERNEL_WAIT_MAX_GAP_S``, the cost of starting it;
    ``other``: queued, yet the GPU waited longer (a sync, a copy, an event on another stream). A kernel whose launch
    the trace does not show is never blamed on the host.
    """
    if next_launch_us is not None and next_launch_us > prev_end_us:
        return "host_wait"
    if next_start_us - prev_end_us < KERNEL_WAIT_MAX_GAP_S * _US_PER_S:
        return "kernel_wait"
    return "other"


def uses_tensor_cores(kernel_name: str) -> bool:
    """Whether a kernel's name shows Tensor Core use (any of ``TENSOR_CORE_KERNEL_PATTERNS``, any case)."""
    name = kernel_name.lower()
    return any(pattern in name for pattern in TENSOR_CORE_KERNEL_PATTERNS)


def is_convolution(kernel_name: str) -> bool:
    """Whether a kernel's name shows a convolution (any of ``CONV_KERNEL_PATTERNS``, any case): the kernels
    ``cudnn.benchmark`` chooses among."""
    name = kernel_name.lower()
    return any(pattern in name for pattern in CONV_KERNEL_PATTERNS)


def is_fp32_cuda_core_gemm(kernel_name: str) -> bool:
    """Whether a kernel is a float32 matrix multiply on CUDA cores (``FP32_GEMM_KERNEL_PATTERNS``): the kernels TF32
    would move to Tensor Cores. Tensor Core kernels and cuDNN's convolutions (``implicit_convolve_sgemm``, under
    ``cudnn.allow_tf32``, which is on by default) do not count."""
    name = kernel_name.lower()
    return (any(pattern in name for pattern in FP32_GEMM_KERNEL_PATTERNS)
            and not uses_tensor_cores(kernel_name) and not is_convolution(kernel_name))


def is_layout_transform(kernel_name: str) -> bool:
    """Whether a kernel converts between NCHW and NHWC (``LAYOUT_TRANSFORM_KERNEL_PATTERNS``): cuDNN's work around
    Tensor Core convolutions of tensors that are not channels_last."""
    name = kernel_name.lower()
    return any(pattern in name for pattern in LAYOUT_TRANSFORM_KERNEL_PATTERNS)


def host_syncs(events: Iterable[Mapping[str, Any]]) -> tuple[int, float]:
    """How many times the host blocked waiting for the GPU, and for how long in all (trace microseconds).

    Counted: runtime/driver calls in ``SYNC_CALLS``, blocking copies (``BLOCKING_COPY_PREFIXES`` without
    ``Async``), and ``cuda_sync`` records of a host-blocking kind whose host call is not in the trace already
    (the two share ``args.correlation``; a sync is counted once, with the host call's duration).
    """
    calls = 0
    wait_us = 0.0
    seen: set[int] = set()
    records: list[Mapping[str, Any]] = []
    for e in events:
        cat, name = e.get("cat"), str(e.get("name", ""))
        if cat == "cuda_sync":
            records.append(e)
        elif cat in _LAUNCH_CATEGORIES and (name in SYNC_CALLS or _blocking_copy(name)):
            calls += 1
            wait_us += float(e["dur"]) if _number(e.get("dur")) else 0.0
            corr = (e.get("args") or {}).get("correlation")
            if isinstance(corr, int):
                seen.add(corr)
    for e in records:
        corr = (e.get("args") or {}).get("correlation")
        if str(e.get("name", "")) in HOST_BLOCKING_SYNC_KINDS and not (isinstance(corr, int) and corr in seen):
            calls += 1
            wait_us += float(e["dur"]) if _number(e.get("dur")) else 0.0
    return calls, wait_us


def _blocking_copy(name: str) -> bool:
    return name.startswith(BLOCKING_COPY_PREFIXES) and "Async" not in name


def _fractions(busy_us: float, idle_us: Mapping[str, float], window_us: float) -> tuple[float, float, float, float]:
    """Busy, host-wait, kernel-wait and other shares of the window; ``other`` takes the remainder, so the four add
    up to 1 (within float rounding) however the gaps and the window compare."""
    if window_us <= 0:  # one kernel of zero duration: nothing to divide
        return 0.0, 0.0, 0.0, 1.0
    busy = min(1.0, busy_us / window_us)
    host, kernel, gaps_other = (idle_us[c] / window_us for c in ("host_wait", "kernel_wait", "other"))
    room = 1.0 - busy
    gaps = host + kernel + gaps_other
    if gaps > room:  # the kernels spanned more than the window: share what is left in proportion
        host, kernel = host * room / gaps, kernel * room / gaps
    return busy, host, kernel, max(0.0, 1.0 - busy - host - kernel)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _timed(event: Mapping[str, Any]) -> bool:
    return _number(event.get("ts")) and _number(event.get("dur"))
