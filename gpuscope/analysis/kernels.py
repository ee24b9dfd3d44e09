"""The GPU's kernel timeline over the profiled steps, from a torch.profiler (Kineto) Chrome trace.

A pure function of the trace's ``traceEvents`` (the caller keeps only the profiled steps): how much of the steps'
wall time a kernel was running, why the GPU sat idle otherwise (Holistic Trace Analysis's host wait / kernel wait
/ other), which share of kernel time went to Tensor Core kernels, and how many host-to-device copies came from
pageable memory.

Kineto writes ``ts`` and ``dur`` in microseconds. The events read here (libkineto ``output_json.cpp`` and
``CuptiActivity.cpp``):

- ``cat: "kernel"``: a kernel on the device (``pid`` is the device, ``tid`` the stream), with ``args.correlation``;
- ``cat: "cuda_runtime"`` / ``"cuda_driver"``: the host call that queued it (``cudaLaunchKernel``,
  ``cuLaunchKernel``, ``cudaMemcpyAsync``...), with the same ``args.correlation``;
- ``cat: "ac2g"``, ``ph: "s"``: the flow arrow from that call to the kernel, ``id`` the correlation, ``ts`` the
  call's start (read when the runtime events themselves were dropped);
- ``cat: "gpu_memcpy"``: copies, named ``Memcpy HtoD (Pageable -> Device)``, ``Memcpy HtoD (Pinned -> Device)``...

Copies, memsets, ``cuda_sync`` and ``gpu_user_annotation`` events are not kernels: the GPU counts as idle under them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpuscope.analysis.thresholds import KERNEL_WAIT_MAX_GAP_S, TENSOR_CORE_KERNEL_PATTERNS
from gpuscope.record import KernelTimeline

_US_PER_S = 1e6  # Kineto (like the Chrome trace format) writes ts and dur in microseconds
_LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})

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
    Without a positive ``window_wall_s`` the kernels' own span stands in for it (HTA's denominator).
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

    durations_us = [float(k["dur"]) for k in kernels]
    total_us = sum(durations_us)
    tensor_core_us = sum(d for k, d in zip(kernels, durations_us) if uses_tensor_cores(str(k.get("name", ""))))
    h2d = [e for e in events if e.get("cat") == "gpu_memcpy" and "htod" in str(e.get("name", "")).lower()]
    return KernelTimeline(
        busy_fraction=busy_f,
        idle_host_wait_fraction=host_f,
        idle_kernel_wait_fraction=kernel_f,
        idle_other_fraction=other_f,
        kernels=len(kernels),
        kernels_per_step=len(kernels) / steps if steps > 0 else 0.0,
        mean_kernel_s=total_us / len(kernels) / _US_PER_S,
        tensor_core_share=tensor_core_us / total_us if total_us > 0 else 0.0,
        h2d_copies=len(h2d),
        h2d_pageable_copies=sum("pageable" in str(e.get("name", "")).lower() for e in h2d),
        h2d_copy_s=sum(float(e["dur"]) for e in h2d if _timed(e)) / _US_PER_S,
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
