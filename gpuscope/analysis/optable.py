"""The op table of a trace's recorded steps, as torch.profiler's ``key_averages()`` gives it during a run: calls per
op, self host time (the op's time less that of the ops nested in it, on its own thread), and self device time (the
kernels launched from inside the op and no deeper one, through the launch's correlation id).

Ops are ``cpu_op`` events starting within the host window of the steps; ranges such as ``ProfilerStep#N`` or
``## forward ##`` are annotations, not ops.

Not quite ``key_averages()``, which ``gpuscope run``'s table (``collectors.trace_table``) repeats exactly: there,
runtime calls and kernels are rows too and a runtime call's time is not its op's self time, copies count as device
time, and an op calling its namesake (``aten::mean``) is one call. On the H100 ``compute`` recording: 454 calls
here, 941 in run.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuscope.analysis.intervals import Span
from gpuscope.analysis.trace import Thread, TraceIndex
from gpuscope.record import OpStat

_US_PER_S = 1e6
Item = tuple[float, float, "str | None", float]


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
    for items in _by_thread(index, window, device_us).values():
        _walk(items, totals)
    stats = tuple(OpStat(name, int(calls), host_us / _US_PER_S, dev_us / _US_PER_S)
                  for name, (calls, host_us, dev_us) in sorted(totals.items()))
    ops = sum(s.calls for s in stats)
    return OpTable(stats, ops, sum(s.self_host_s for s in stats))


def _by_thread(index: TraceIndex, window: Span, device_us: Mapping[int, float]) -> dict[Thread, list[Item]]:
    """The window's ops, and the launch calls whose kernels ran, by thread: ``(start, -duration, name or None,
    kernel time)``, each thread's in start order (outer before inner at the same start)."""
    threads: dict[Thread, list[Item]] = {}
    lo, hi = window
    for e in index.op_events:
        ts = e["ts"]
        if lo <= ts < hi:
            item = (ts, -e["dur"], str(e.get("name", "")), 0.0)
            threads.setdefault((e.get("pid"), e.get("tid")), []).append(item)
    for e in index.host_calls:
        corr = (e.get("args") or {}).get("correlation")
        ts = e.get("ts")
        if corr in device_us and type(ts) in (int, float) and lo <= ts < hi:
            threads.setdefault((e.get("pid"), e.get("tid")), []).append((ts, 0.0, None, device_us[corr]))
    for items in threads.values():
        items.sort(key=lambda item: (item[0], item[1]))
    return threads


def _walk(items: list[Item], totals: dict[str, list[float]]) -> None:
    """One thread's ops as a stack of nested ranges: each op's self time is its duration less its direct
    children's; a launch call gives its kernels' time to the innermost op open around it."""
    stack: list[tuple[float, list[float]]] = []  # (end, the op's row in ``totals``)
    for ts, minus_dur, name, kernel_us in items:
        while stack and stack[-1][0] <= ts:
            stack.pop()
        if name is None:
            if stack:
                stack[-1][1][2] += kernel_us
            continue
        row = totals.get(name)
        if row is None:
            row = totals[name] = [0, 0.0, 0.0]
        row[0] += 1
        row[1] -= minus_dur
        if stack:
            stack[-1][1][1] += minus_dur
        stack.append((ts - minus_dur, row))


def _kernel_time_by_correlation(index: TraceIndex) -> dict[int, float]:
    times: dict[int, float] = {}
    for kernels in index.kernels.values():
        for k in kernels:
            if k.correlation is not None:
                times[k.correlation] = times.get(k.correlation, 0.0) + (k.end_us - k.start_us)
    return times
