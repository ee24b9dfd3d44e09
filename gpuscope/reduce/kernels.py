"""The GPU's kernel timeline over the recorded steps, from a torch.profiler (Kineto) Chrome trace, one device at a time.

How much of the device window a kernel was running, why the GPU sat idle otherwise (Holistic Trace Analysis's host
wait / kernel wait / other), which shares of compute-kernel time went to Tensor Core (matrix-core) kernels,
convolutions, GEMMs, float32 GEMMs on CUDA cores and NCHW <-> NHWC conversions (the kinds the backend flags decide),
how many host-to-device copies came from pageable memory, and how often and how long the host blocked waiting.

The window is the device's (``reduce.windows``): the GPU may run well behind the host, so the host's steps are
not the span of the kernels they launched. Numerator and denominator both come from that window: kernels are
clipped to it, and busy + host wait + kernel wait + other = 1. Communication kernels (NCCL's, RCCL's) count as busy
time but not in the kind shares, which are of compute-kernel time: mixed precision or TF32 do not speed up an
all-reduce. Event layout: ``reduce.trace``. Copies, memsets, ``cuda_sync`` and ``gpu_user_annotation`` events
are not kernels: the GPU counts as idle under them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from gpuscope.reduce.thresholds import (
    CONV_KERNEL_PATTERNS,
    CUDA_CORE_KERNEL_PATTERNS,
    FP32_GEMM_KERNEL_PATTERNS,
    KERNEL_WAIT_MAX_GAP_S,
    LAYOUT_TRANSFORM_KERNEL_PATTERNS,
    TENSOR_CORE_KERNEL_PATTERNS,
)
from gpuscope.reduce.trace import (
    BLOCKING_COPY_PREFIXES,
    LAUNCH_CATEGORIES,
    SYNC_CALLS,
    Kernel,
    TraceIndex,
    index_trace,
)
from gpuscope.record import KernelTimeline

_US_PER_S = 1e6  # Kineto (like the Chrome trace format) writes ts and dur in microseconds
HOST_BLOCKING_SYNC_KINDS = frozenset({"Stream Sync", "Event Sync", "Context Sync"})
"""``cuda_sync`` records that block the host (libkineto's ``syncTypeString``); ``Stream Wait Event`` makes a stream
wait on the device and leaves the host free."""
COMMUNICATION_KERNEL_PATTERNS = ("nccl", "rccl")
"""Substrings (any case) of collective communication kernels: ``ncclKernel_AllReduce_RING_LL_Sum_float``,
``ncclDevKernel_...`` (RCCL, ROCm's NCCL, keeps the ``nccl`` names). Holistic Trace Analysis's test is the same."""
ROCM_MATRIX_CORE = re.compile(r"(?:^|_)mi\d+x\d+x\d+", re.IGNORECASE)
"""ROCm Tensile / hipBLASLt GEMMs on matrix cores (MFMA) carry the instruction shape: ``Cijk_..._MI16x16x1_...``."""
GEMM_KERNEL_PATTERNS = ("gemm", "cijk_", "nvjet", "matmul")
"""Substrings (any case) of matrix-multiply kernels: cuBLAS ``ampere_sgemm_...``/``nvjet_...``, CUTLASS
``..._s16816gemm_...``, ROCm Tensile ``Cijk_Ailk_Bljk_...``, Triton ``triton_..._matmul...``."""

IdleCategory = Literal["host_wait", "kernel_wait", "other"]
Window = tuple[float, float]
"""(start, end) in trace microseconds."""


class Busy(NamedTuple):
    """One stretch of time with at least one kernel running (all streams merged), in trace microseconds;
    ``first_launch_us`` is when the host queued the kernel that opened it (None where the trace does not say).
    A named tuple rather than a frozen dataclass: a large trace makes tens of thousands, and a tuple is built
    several times faster."""

    start_us: float
    end_us: float
    first_launch_us: float | None


def kernel_timeline(events: Sequence[Mapping[str, Any]], window_wall_s: float, steps: int,
                    window: Window | None = None, device: int | None = None) -> KernelTimeline | None:
    """The kernel timeline of ``events`` (a Kineto trace's ``traceEvents``) over ``steps`` steps. None when no
    kernel ran.

    With ``window`` (trace microseconds), kernels are clipped to it and the fractions are of its length. Without
    it, the fractions are of ``window_wall_s``, or of the kernels' own span when that is not positive (HTA's
    denominator); if the kernels then span more than ``window_wall_s``, the idle shares are scaled down to fit what
    ``busy`` leaves. ``device``: that device's kernels only (default: all devices' together).
    """
    index = index_trace(events)
    if device is None:
        kernels = sorted((k for ks in index.kernels.values() for k in ks), key=lambda k: k.start_us)
    else:
        kernels = index.kernels.get(device, [])
    length_us = window_wall_s * _US_PER_S if window is None else window[1] - window[0]
    return device_timeline(index, kernels, steps, window, length_us, device=device)


def device_timeline(index: TraceIndex, kernels: Sequence[Kernel], steps: int, window: Window | None,
                    length_us: float, device: int | None = None, basis: str = "") -> KernelTimeline | None:
    """The timeline of ``kernels`` (one device's, in start order) in ``window`` of ``length_us`` (see
    ``kernel_timeline``); copies and host waits are counted in the window too."""
    if window is not None:
        kernels = [k for k in kernels if k.end_us > window[0] and k.start_us < window[1]]
    if not kernels:
        return None
    busy = merge_kernels(kernels, index.launch_of)
    if window is not None:
        busy = clip_busy(busy, window)
    busy_us = sum(b.end_us - b.start_us for b in busy)
    idle_us = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
    for prev, nxt in zip(busy, busy[1:]):
        idle_us[classify_gap(prev.end_us, nxt.start_us, nxt.first_launch_us)] += nxt.start_us - prev.end_us
    if length_us <= 0:
        length_us = busy[-1].end_us - busy[0].start_us if busy else 0.0
    busy_f, host_f, kernel_f, other_f = _fractions(busy_us, idle_us, length_us)

    counted = [k for k in kernels if window is None or window[0] <= k.start_us < window[1]]
    kinds = {name: kernel_kinds(name) for name in {k.name for k in kernels}}  # names repeat: classify each once
    compute = [k for k in kernels if not kinds[k.name][0]]
    compute_us = _clipped_us(compute, window)
    total_us = _clipped_us(kernels, window)
    compute_busy = sum(b.end_us - b.start_us for b in clip_busy(merge_kernels(compute, _no_launch), window or _ALL))

    def share(kind: int) -> float:
        return _clipped_us([k for k in compute if kinds[k.name][kind]], window) / compute_us if compute_us else 0.0

    h2d = [e for d, copies in index.copies.items() if device is None or d == device for e in copies
           if "htod" in str(e.get("name", "")).lower() and _inside(e, window)]
    sync_calls, sync_wait_us = host_syncs(e for e in index.syncs if _inside(e, window))
    return KernelTimeline(
        busy_fraction=busy_f,
        idle_host_wait_fraction=host_f,
        idle_kernel_wait_fraction=kernel_f,
        idle_other_fraction=other_f,
        kernels=len(counted),
        kernels_per_step=len(counted) / steps if steps > 0 else 0.0,
        mean_kernel_s=sum(k.end_us - k.start_us for k in counted) / max(1, len(counted)) / _US_PER_S,
        tensor_core_share=share(1),
        h2d_copies=len(h2d),
        h2d_pageable_copies=sum("pageable" in str(e.get("name", "")).lower() for e in h2d),
        h2d_copy_s=sum(float(e["dur"]) for e in h2d if _number(e.get("dur"))) / _US_PER_S,
        conv_share=share(2),
        fp32_gemm_share=share(3),
        layout_transform_share=share(4),
        sync_calls=sync_calls,
        sync_wait_s=sync_wait_us / _US_PER_S,
        device=device,
        window_s=length_us / _US_PER_S,
        window_basis=basis,
        compute_busy_fraction=min(1.0, compute_busy / length_us) if length_us > 0 else 0.0,
        communication_share=1 - compute_us / total_us if total_us > 0 else 0.0,
        gemm_share=share(5),
    )


_ALL: Window = (float("-inf"), float("inf"))


def _no_launch(kernel: Kernel) -> None:
    return None


def kernel_kinds(name: str) -> tuple[bool, bool, bool, bool, bool, bool]:
    """What a kernel's name says it is: communication, Tensor Core, convolution, float32 CUDA-core GEMM, layout
    conversion, GEMM (in that order; ``device_timeline`` indexes them)."""
    return (is_communication_kernel(name), uses_tensor_cores(name), is_convolution(name),
            is_fp32_cuda_core_gemm(name), is_layout_transform(name), is_gemm(name))


def merge_kernels(kernels: Iterable[Kernel], launch_of: Callable[[Kernel], tuple[float, Any] | None]) -> list[Busy]:
    """The union of the kernels' intervals over all streams, in time order: overlapping or touching kernels make
    one busy stretch. A stretch opened by several kernels at once takes the earliest launch among them
    (``launch_of``: the host call that queued a kernel, as ``TraceIndex.launch_of`` finds it)."""
    spans = []
    for k in kernels:
        launch = launch_of(k)
        spans.append((k.start_us, k.end_us, launch[0] if launch is not None else None))
    spans.sort(key=lambda s: (s[0], float("inf") if s[2] is None else s[2]))

    merged: list[list[Any]] = []
    for start, end, launch in spans:
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1][1] = end
        else:
            merged.append([start, end, launch])
    return [Busy(start, end, launch) for start, end, launch in merged]


def clip_busy(busy: Sequence[Busy], window: Window) -> list[Busy]:
    """Busy stretches cut to ``window``; those wholly outside it are dropped."""
    start, end = window
    kept = [b for b in busy if b.end_us > start and b.start_us < end]
    if kept and kept[0].start_us < start:  # sorted and disjoint: only the first and last can stick out
        kept[0] = Busy(start, kept[0].end_us, kept[0].first_launch_us)
    if kept and kept[-1].end_us > end:
        kept[-1] = Busy(kept[-1].start_us, end, kept[-1].first_launch_us)
    return kept


def _clipped_us(kernels: Iterable[Kernel], window: Window | None) -> float:
    """Summed kernel time (concurrent kernels each in full) within ``window``."""
    if window is None:
        return sum(k.end_us - k.start_us for k in kernels)
    return sum(max(0.0, min(k.end_us, window[1]) - max(k.start_us, window[0])) for k in kernels)


def _inside(event: Mapping[str, Any], window: Window | None) -> bool:
    return window is None or (_number(event.get("ts")) and window[0] <= float(event["ts"]) < window[1])


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
    """Whether a kernel's name shows Tensor Core use (any of ``TENSOR_CORE_KERNEL_PATTERNS``, any case, unless it
    also names CUDA-core instructions: ``CUDA_CORE_KERNEL_PATTERNS``), or matrix-core use on ROCm
    (``ROCM_MATRIX_CORE``)."""
    name = kernel_name.lower()
    if any(pattern in name for pattern in CUDA_CORE_KERNEL_PATTERNS):
        return False
    return any(pattern in name for pattern in TENSOR_CORE_KERNEL_PATTERNS) or bool(ROCM_MATRIX_CORE.search(name))


def is_communication_kernel(kernel_name: str) -> bool:
    """Whether a kernel is a collective's (``COMMUNICATION_KERNEL_PATTERNS``), not compute."""
    name = kernel_name.lower()
    return any(pattern in name for pattern in COMMUNICATION_KERNEL_PATTERNS)


def is_gemm(kernel_name: str) -> bool:
    """Whether a kernel is a matrix multiply (``GEMM_KERNEL_PATTERNS``); convolutions run as implicit GEMMs do not
    count (they are convolutions)."""
    name = kernel_name.lower()
    return any(pattern in name for pattern in GEMM_KERNEL_PATTERNS) and not is_convolution(kernel_name)


def is_convolution(kernel_name: str) -> bool:
    """Whether a kernel's name shows a convolution (any of ``CONV_KERNEL_PATTERNS``, any case): the kernels
    ``cudnn.benchmark`` chooses among."""
    name = kernel_name.lower()
    return any(pattern in name for pattern in CONV_KERNEL_PATTERNS)


def is_fp32_cuda_core_gemm(kernel_name: str) -> bool:
    """Whether a kernel is a float32 matrix multiply on CUDA cores (``FP32_GEMM_KERNEL_PATTERNS``): the kernels TF32
    would move to Tensor Cores; ROCm Tensile single-precision GEMMs off the matrix cores likewise. Tensor Core
    kernels and cuDNN's convolutions (``implicit_convolve_sgemm``, under
    ``cudnn.allow_tf32``, which is on by default) do not count."""
    name = kernel_name.lower()
    tensile_fp32 = name.startswith("cijk_") and ("_sb_" in name or "_s_" in name)  # ROCm: S = single precision
    return ((any(pattern in name for pattern in FP32_GEMM_KERNEL_PATTERNS) or tensile_fp32)
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
        elif cat in LAUNCH_CATEGORIES and (name in SYNC_CALLS or _blocking_copy(name)):
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
    return type(value) in (int, float)  # not isinstance: True is no time
