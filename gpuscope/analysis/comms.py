"""Collective communication in a torch.profiler trace: how long per step, and how much of it the training thread
spent waiting rather than computing.

gloo records each collective as a ``gloo:all_reduce`` range on its own worker thread, from start to completion;
NCCL's are kernels (``ncclKernel_AllReduce...``, ``ncclDevKernel_...``) on a GPU stream. Time "in flight" is the
union of those ranges. *Exposed* is the part of it during which the training thread (the one that ran the most
ops) was inside no op: it was waiting for the collective to finish (DDP waits at the end of ``backward()``).
The rest overlapped with compute, which is what DDP's bucketing aims at.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuscope.record import Communication

COLLECTIVES = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "reducescatter", "broadcast",
               "all_to_all", "alltoall")


def is_collective(event: Mapping[str, Any]) -> str | None:
    """``gloo`` or ``nccl`` if the event is a collective's execution (not its enqueueing), else None."""
    name = str(event.get("name", "")).lower()
    if name.startswith("gloo:") and any(c in name for c in COLLECTIVES):
        return "gloo"
    if name.startswith("nccl") and event.get("cat") == "kernel":
        return "nccl"
    return None


def communication(events: Sequence[Mapping[str, Any]], steps: int) -> Communication | None:
    """Per-step communication figures over ``steps`` profiled steps, or None when the trace has no collective."""
    spans: list[tuple[float, float]] = []
    backends: Counter[str] = Counter()
    ops_by_thread: dict[Any, list[tuple[float, float]]] = {}
    for event in events:
        if event.get("ph") != "X" or not _number(event.get("ts")) or not _number(event.get("dur")):
            continue
        start, end = float(event["ts"]), float(event["ts"]) + float(event["dur"])
        backend = is_collective(event)
        if backend is not None:
            spans.append((start, end))
            backends[backend] += 1
        elif event.get("cat") == "cpu_op":
            ops_by_thread.setdefault(event.get("tid"), []).append((start, end))
    if not spans:
        return None
    in_flight = _union(spans)
    comm_us = _length(in_flight)
    training = max(ops_by_thread.values(), key=len) if ops_by_thread else []
    exposed_us = comm_us - _length(_intersect(in_flight, _union(training)))
    steps = max(1, steps)
    return Communication(
        calls_per_step=sum(backends.values()) / steps,
        comm_s=comm_us / 1e6 / steps,
        exposed_s=exposed_us / 1e6 / steps,
        overlap=1 - exposed_us / comm_us if comm_us > 0 else 0.0,
        backend=backends.most_common(1)[0][0],
    )


def _union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The overlap of two sorted, disjoint interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(spans: Iterable[tuple[float, float]]) -> float:
    return sum(end - start for start, end in spans)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
