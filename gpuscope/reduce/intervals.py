"""Sets of time intervals as sorted lists of disjoint (start, end) pairs: union, intersection, clipping, length."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator

Span = tuple[float, float]


def union(spans: Iterable[Span]) -> list[Span]:
    """The union of any intervals, as a sorted list of disjoint ones (touching intervals merge)."""
    return merge_sorted(sorted(spans))


def merge_sorted(spans: Iterable[Span]) -> list[Span]:
    """The union of intervals that come in start order, in one pass."""
    merged: list[Span] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def union_in_order(spans: Callable[[], Iterable[Span]]) -> list[Span]:
    """``union(spans())`` without holding every span: in one pass where ``spans()`` come in start order and none
    ends before it starts (then the order of spans with one start cannot change the union), else by ``union``."""
    try:
        return merge_sorted(_in_order(spans()))
    except _OutOfOrder:
        return union(spans())


class _OutOfOrder(Exception):
    pass


def _in_order(spans: Iterable[Span]) -> Iterator[Span]:
    last = float("-inf")
    for start, end in spans:
        if start < last or end < start or start != start:  # out of order, backwards, NaN
            raise _OutOfOrder
        last = start
        yield start, end


def clip(spans: list[Span], window: Span | None) -> list[Span]:
    """Sorted disjoint ``spans`` cut to ``window`` (None: left whole)."""
    if window is None:
        return spans
    return [(max(s, window[0]), min(e, window[1])) for s, e in spans if e > window[0] and s < window[1]]


def intersect(a: list[Span], b: list[Span]) -> list[Span]:
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


def difference(spans: list[Span], taken: list[Span]) -> list[Span]:
    """Sorted disjoint ``spans`` less sorted disjoint ``taken`` (each span finds its place in ``taken`` by bisection:
    a few spans against a thread's many ops)."""
    out: list[Span] = []
    for start, end in spans:
        i = max(0, bisect.bisect_right(taken, (start, float("inf"))) - 1)
        at = start
        while i < len(taken) and taken[i][0] < end:
            s, e = taken[i]
            if e > at:
                if s > at:
                    out.append((at, s))
                at = e
            i += 1
        if at < end:
            out.append((at, end))
    return out


def length(spans: Iterable[Span]) -> float:
    """Total length of disjoint intervals."""
    return sum(end - start for start, end in spans)
