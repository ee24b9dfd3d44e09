"""The op table of a trace's recorded steps, as torch.profiler's ``key_averages()`` gives it during a run: calls per
op, self host time (the op's time less that of the ops nested in it, on its own thread), and self device time (the
kernels launched from inside the op and no deeper one, through the launch's correlation id).

Ops are ``cpu_op`` events starting within the host window of the steps; ranges such as ``ProfilerStep#N`` or
``## forward ##`` are annotations, not ops.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuscope.analysis.intervals import Span
from gpuscope.analysis.trace import LAUNCH_CATEGORIES, Thread, TraceIndex
from gpuscope.record import OpStat

_US_PER_S = 1e6


@dataclass(frozen=True, slots=True)
class OpTable:
    """Per-op totals over the steps, by name, and the number of op calls in all."""

    stats: tuple[OpStat, ...]
    ops: int
    self_host_s: float


def op_table(index: TraceIndex, window: Span) -> OpTable:
    """Every op starting in ``window`` (trace microseconds): calls, self host time and self device time."""
    device_us = _kernel_time_by_correlation(index)
    totals: dict[str, list[float]] = {}  # name -> [calls, self host us, device us]
    for thread_events in _by_thread(index, window).values():
        _walk(thread_events, device_us, totals)
    stats = tuple(OpStat(name, int(calls), host_us / _US_PER_S, dev_us / _US_PER_S)
                  for name, (calls, host_us, dev_us) in sorted(totals.items()))
    ops = sum(s.calls for s in stats)
    return OpTable(stats, ops, sum(s.self_host_s for s in stats))


def _by_thread(index: TraceIndex, window: Span) -> dict[Thread, list[Mapping[str, Any]]]:
    """The window's ops and launch calls by thread, each thread's in start order (outer before inner)."""
    threads: dict[Thread, list[Mapping[str, Any]]] = {}
    events: Iterable[Mapping[str, Any]] = (*index.op_events, *index.host_calls)
    for e in events:
        ts = e.get("ts")
        if isinstance(ts, (int, float)) and window[0] <= ts < window[1]:
            threads.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for thread_events in threads.values():
        thread_events.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur") or 0.0)))
    return threads


def _walk(events: list[Mapping[str, Any]], device_us: Mapping[int, float], totals: dict[str, list[float]]) -> None:
    """One thread's ops as a stack of nested ranges: each op's self time is its duration less its direct
    children's; a launch call gives its kernels' time to the innermost op open around it."""
    stack: list[tuple[float, list[float]]] = []  # (end, the op's row in ``totals``)
    for e in events:
        ts = float(e["ts"])
        while stack and stack[-1][0] <= ts:
            stack.pop()
        if e.get("cat") in LAUNCH_CATEGORIES or e.get("cat") == "cuda_sync":
            corr = (e.get("args") or {}).get("correlation")
            if stack and isinstance(corr, int):
                stack[-1][1][2] += device_us.get(corr, 0.0)
            continue
        dur = float(e.get("dur") or 0.0)
        row = totals.setdefault(str(e.get("name", "")), [0, 0.0, 0.0])
        row[0] += 1
        row[1] += dur
        if stack:
            stack[-1][1][1] -= dur
        stack.append((ts + dur, row))


def _kernel_time_by_correlation(index: TraceIndex) -> dict[int, float]:
    times: dict[int, float] = {}
    for kernels in index.kernels.values():
        for k in kernels:
            if k.correlation is not None:
                times[k.correlation] = times.get(k.correlation, 0.0) + (k.end_us - k.start_us)
    return times
