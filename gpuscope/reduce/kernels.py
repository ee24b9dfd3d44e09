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
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, Literal

from gpuscope.reduce.thresholds import (
    CONV_KERNEL_PATTERNS,
    CUDA_CORE_KERNEL_PATTERNS,
    FP32_GEMM_KERNEL_PATTERNS,
    KERNEL_WAIT_MAX_GAP_S,
    LAYOUT_TRANSFORM_KERNEL_PATTERNS,
    TENSOR_CORE_KERNEL_PATTERNS,
)
from gpuscope.reduce.columns import Kernels, sorted_by
from gpuscope.reduce.trace import Copies, Sync, TraceIndex, index_trace
from gpuscope.record import KernelTimeline

_US_PER_S = 1e6  # Kineto (like the Chrome trace format) writes ts and dur in microseconds
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


@dataclass(slots=True)
class Busy:
    """Stretches of time with at least one kernel running (all streams merged), in time order, as columns: start and
    end in trace microseconds, and when the host queued the kernel that opened each (``launched`` 0 where the trace
    does not say)."""

    start_us: Any = field(default_factory=lambda: array("d"))
    end_us: Any = field(default_factory=lambda: array("d"))
    launch_us: Any = field(default_factory=lambda: array("d"))
    launched: bytearray = field(default_factory=bytearray)

    def __len__(self) -> int:
        return len(self.start_us)

    def lengths(self) -> Iterator[float]:
        return (end - start for start, end in zip(self.start_us, self.end_us))


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
    kernels = _all_kernels(index) if device is None else index.kernels.get(device)
    length_us = window_wall_s * _US_PER_S if window is None else window[1] - window[0]
    return device_timeline(index, kernels, steps, window, length_us, device=device) if kernels else None


def _all_kernels(index: TraceIndex) -> Kernels | None:
    """Every device's kernels in one start order (devices in the order the trace first names them)."""
    if not index.kernels:
        return None
    parts = list(index.kernels.values())
    columns = [array("d"), array("d"), array("i"), array("d"), array("i")]
    for kernels in parts:
        for column, part in zip(columns, (kernels.start_us, kernels.end_us, kernels.name, kernels.launch_us,
                                          kernels.launch_pid)):
            column.extend(part)
    return Kernels(*sorted_by(columns, columns[0]), names=parts[0].names, pids=parts[0].pids)


def device_timeline(index: TraceIndex, kernels: Kernels, steps: int, window: Window | None,
                    length_us: float, device: int | None = None, basis: str = "") -> KernelTimeline | None:
    """The timeline of ``kernels`` (one device's, in start order) in ``window`` of ``length_us`` (see
    ``kernel_timeline``); copies and host waits are counted in the window too."""
    if window is not None:
        low, high = window
        chosen: bytearray | None = bytearray(end > low and start < high
                                             for start, end in zip(kernels.start_us, kernels.end_us))
        if not any(chosen):  # type: ignore[arg-type]
            return None
    elif not len(kernels):
        return None
    else:
        chosen = None

    def rows(*columns: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        """The chosen kernels' values of ``columns``, in start order."""
        return compress(zip(*columns), chosen) if chosen is not None else zip(*columns)

    starts, ends, names = kernels.start_us, kernels.end_us, kernels.name
    busy = merge_kernels(rows(starts, ends, kernels.launches()))
    if window is not None:
        busy = clip_busy(busy, window)
    busy_us = sum(busy.lengths())
    idle_us = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
    for prev_end, start, launch, launched in zip(busy.end_us, busy.start_us[1:], busy.launch_us[1:],
                                                 busy.launched[1:]):
        idle_us[classify_gap(prev_end, start, launch if launched else None)] += start - prev_end
    if length_us <= 0:
        length_us = busy.end_us[-1] - busy.start_us[0] if busy else 0.0
    busy_f, host_f, kernel_f, other_f = _fractions(busy_us, idle_us, length_us)

    counted = array("d", (end - start for start, end in rows(starts, ends)
                          if window is None or window[0] <= start < window[1]))
    kinds = {n: kernel_kinds(kernels.names[n]) for (n,) in set(rows(names))}  # names repeat: classify each once
    clipped = _clipped(rows(starts, ends), window)
    compute_us = sum(c for c, (n,) in zip(clipped, rows(names)) if not kinds[n][0])
    total_us = sum(clipped)
    compute = merge_kernels((s, e, None) for s, e, n in rows(starts, ends, names) if not kinds[n][0])
    compute_busy = sum(clip_busy(compute, window or _ALL).lengths())

    def share(kind: int) -> float:
        if not compute_us:
            return 0.0
        return sum(c for c, (n,) in zip(clipped, rows(names)) if not kinds[n][0] and kinds[n][kind]) / compute_us

    h2d_copies, h2d_pageable, h2d_s = _host_to_device(index.copies, device, window)
    sync_calls, sync_wait_us = host_syncs(s for s in index.syncs if _inside(s[2], window))
    return KernelTimeline(
        busy_fraction=busy_f,
        idle_host_wait_fraction=host_f,
        idle_kernel_wait_fraction=kernel_f,
        idle_other_fraction=other_f,
        kernels=len(counted),
        kernels_per_step=len(counted) / steps if steps > 0 else 0.0,
        mean_kernel_s=sum(counted) / max(1, len(counted)) / _US_PER_S,
        tensor_core_share=share(1),
        h2d_copies=h2d_copies,
        h2d_pageable_copies=h2d_pageable,
        h2d_copy_s=h2d_s,
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


def kernel_kinds(name: str) -> tuple[bool, bool, bool, bool, bool, bool]:
    """What a kernel's name says it is: communication, Tensor Core, convolution, float32 CUDA-core GEMM, layout
    conversion, GEMM (in that order; ``device_timeline`` indexes them)."""
    return (is_communication_kernel(name), uses_tensor_cores(name), is_convolution(name),
            is_fp32_cuda_core_gemm(name), is_layout_transform(name), is_gemm(name))


def merge_kernels(kernels: Iterable[tuple[float, float, float | None]]) -> Busy:
    """The union of kernels' intervals over all streams, in time order: overlapping or touching kernels make one busy
    stretch. ``kernels``: (start, end, when the host queued it or None), in start order. A stretch opened by several
    kernels at once takes the earliest launch among them (kernels with no launch last; in their order on a tie)."""
    busy = Busy()
    starts, ends, launches, launched = busy.start_us, busy.end_us, busy.launch_us, busy.launched
    group: list[tuple[float, float, float | None]] = []  # kernels of one start, put in launch order

    def place(start: float, end: float, launch: float | None) -> None:
        if starts and start <= ends[-1]:
            if end > ends[-1]:
                ends[-1] = end
        else:
            starts.append(start)
            ends.append(end)
            launches.append(0.0 if launch is None else launch)
            launched.append(launch is not None)

    for kernel in kernels:
        if group and kernel[0] != group[0][0]:
            _place_group(group, place)
            group = []
        group.append(kernel)
    _place_group(group, place)
    return busy


def _place_group(group: list[tuple[float, float, float | None]], place: Any) -> None:
    if len(group) > 1:
        group.sort(key=lambda k: float("inf") if k[2] is None else k[2])
    for kernel in group:
        place(*kernel)


def clip_busy(busy: Busy, window: Window) -> Busy:
    """Busy stretches cut to ``window``; those wholly outside it are dropped."""
    start, end = window
    keep = bytearray(e > start and s < end for s, e in zip(busy.start_us, busy.end_us))
    kept = Busy(array("d", compress(busy.start_us, keep)), array("d", compress(busy.end_us, keep)),
                array("d", compress(busy.launch_us, keep)), bytearray(compress(busy.launched, keep)))
    if kept and kept.start_us[0] < start:  # sorted and disjoint: only the first and last can stick out
        kept.start_us[0] = start
    if kept and kept.end_us[-1] > end:
        kept.end_us[-1] = end
    return kept


def _clipped(kernels: Iterable[tuple[float, float]], window: Window | None) -> array:
    """Each kernel's time within ``window`` (its whole time without one)."""
    if window is None:
        return array("d", (end - start for start, end in kernels))
    low, high = window
    return array("d", (max(0.0, min(end, high) - max(start, low)) for start, end in kernels))


def _host_to_device(copies: Mapping[int, Copies], device: int | None, window: Window | None) -> tuple[int, int, float]:
    """Host-to-device copies starting in ``window`` on ``device`` (None: every device): how many, how many from
    pageable memory, and their time in seconds."""
    chosen = [(dur, flags) for d, c in copies.items() if device is None or d == device
              for ts, dur, flags in zip(c.ts, c.dur, c.flags)
              if window is None or (flags & Copies.TS and window[0] <= ts < window[1])]
    return (len(chosen), sum(bool(flags & Copies.PAGEABLE) for _, flags in chosen),
            sum(dur for dur, flags in chosen if flags & Copies.DUR) / _US_PER_S)


def _inside(ts: float | None, window: Window | None) -> bool:
    return window is None or (ts is not None and window[0] <= ts < window[1])


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


def host_syncs(syncs: Iterable[Sync]) -> tuple[int, float]:
    """How many times the host blocked waiting for the GPU, and for how long in all (trace microseconds).

    Counted: runtime/driver calls in ``SYNC_CALLS``, blocking copies (``BLOCKING_COPY_PREFIXES`` without
    ``Async``), and ``cuda_sync`` records of a host-blocking kind whose host call is not in the trace already
    (the two share ``args.correlation``; a sync is counted once, with the host call's duration).
    """
    calls = 0
    wait_us = 0.0
    seen: set[int] = set()
    records: list[Sync] = []
    for sync in syncs:
        record, _, _, dur, corr = sync
        if record:
            records.append(sync)
        else:
            calls += 1
            wait_us += dur if dur is not None else 0.0
            if isinstance(corr, int):
                seen.add(corr)
    for _, _, _, dur, corr in records:
        if not (isinstance(corr, int) and corr in seen):
            calls += 1
            wait_us += dur if dur is not None else 0.0
    return calls, wait_us


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

