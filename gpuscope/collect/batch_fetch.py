"""One batch built again three ways, for the data probe: as a loader without workers builds it (``dataset[i]`` for each
of its items, then torch's ``default_collate``); fetched through the loader in one call for all its indices
(``dataset[indices]``, as a ``BatchSampler`` passed as ``sampler`` with ``batch_size=None`` makes it); and sliced
without a loader, its tensors indexed by a tensor of its indices (a shuffled ``torch.randperm`` split into batches).
Where the items are small, the per-item calls, the collation of many small tensors and the loader's own work can be
most of a batch's time, which workers do not take off the step."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

BUILDS = 3
"""Timings of each way; the fastest counts (the first runs cold)."""
ESTIMATED_BUILDS = 3 * BUILDS
"""The builds the budget check counts, each at a batch's items' untraced time: the one-call fetch may cost as much."""
LIGHT_ITEM_S = 50e-6
"""Items that take longer than this each (untraced) are not built again: their time is their own work, which one
call for the batch does not take away, not the per-item call and collation (microseconds)."""


@dataclass(frozen=True, slots=True)
class BatchFetch:
    """One batch built item by item, fetched in one call and sliced, untraced."""

    built_s: float
    """Its items fetched one call each and collated (the fastest of ``BUILDS``)."""
    fetched_s: float | None
    """``dataset[indices]``, converted as a loader with ``batch_size=None`` does, where that gives the collated batch;
    None where it does not."""
    sliced_s: float | None
    """The collated batch's tensors indexed by a tensor of the indices, with a batch's share of drawing an epoch's
    permutation; None where the batch holds more than tensors or ``sliceable`` was false."""


def is_default_collate(collate_fn: object) -> bool:
    """Whether ``collate_fn`` is torch's ``default_collate`` (the loader's own, with ``batch_size`` set)."""
    torch = sys.modules.get("torch")
    return torch is not None and collate_fn is torch.utils.data.default_collate


def draws_plainly(index_sampler: object) -> bool:
    """Whether a loader's batches are torch's ``BatchSampler`` over its ``RandomSampler`` (without replacement or a
    sample count) or ``SequentialSampler``: the order a permutation (or a range) split into batches gives too."""
    torch = sys.modules.get("torch")
    if torch is None or type(index_sampler) is not torch.utils.data.BatchSampler:
        return False
    sampler = getattr(index_sampler, "sampler", None)
    if type(sampler) is torch.utils.data.SequentialSampler:
        return True
    return (type(sampler) is torch.utils.data.RandomSampler and not sampler.replacement
            and sampler._num_samples is None)


def time_batch_fetch(dataset: Any, batch_size: int, item_s: float, budget_s: float, clock: Callable[[], float],
                     sliceable: bool = True) -> BatchFetch | None:
    """Build one batch of ``batch_size`` shuffled indices (its own generator) each way; None where the items take
    longer than ``LIGHT_ITEM_S`` each (``item_s``), or where the builds would not fit ``budget_s``. ``sliceable``: the
    loader draws its indices as a permutation would. Raises what the dataset raises while built item by item."""
    torch = sys.modules["torch"]
    collate, convert = torch.utils.data.default_collate, torch.utils.data.default_convert
    if item_s > LIGHT_ITEM_S or item_s * batch_size * ESTIMATED_BUILDS > budget_s:
        return None
    length = len(dataset)
    order = random.Random(0).sample(range(length), min(length, batch_size))
    indices = [order[k % len(order)] for k in range(batch_size)]
    built_s, batch = _fastest(lambda: collate([dataset[i] for i in indices]), clock)
    try:
        same = _same(convert(dataset[indices]), batch, torch)  # what a loader with batch_size=None hands the loop
    except Exception:  # a dataset that takes one index only: its TypeError, KeyError, IndexError...
        same = False
    fetched_s = _fastest(lambda: convert(dataset[indices]), clock)[0] if same else None
    tensors = _tensors(batch, torch)
    if not sliceable or tensors is None or any(t.dim() == 0 or t.shape[0] != batch_size for t in tensors):
        return BatchFetch(built_s, fetched_s, None)
    rows = torch.as_tensor(random.Random(1).sample(range(batch_size), batch_size))
    drawn_s = _fastest(lambda: torch.randperm(length).split(batch_size), clock)[0]  # once an epoch
    gathered_s = _fastest(lambda: tuple(t[rows] for t in tensors), clock)[0]
    return BatchFetch(built_s, fetched_s, gathered_s + drawn_s * batch_size / length)


def _fastest(action: Callable[[], Any], clock: Callable[[], float]) -> tuple[float, Any]:
    """The fastest of ``BUILDS`` timings of ``action``, and what it returned."""
    best, result = float("inf"), None
    for _ in range(BUILDS):
        before = clock()
        result = action()
        best = min(best, clock() - before)
    return best, result


def _same(a: Any, b: Any, torch: Any, depth: int = 0) -> bool:
    """Whether two batches hold the same tensors in the same structure (a tuple and a list alike)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and bool(torch.equal(a, b)))
    if depth > 4:
        return False
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k], torch, depth + 1) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, torch, depth + 1) for x, y in zip(a, b))
    return type(a) is type(b) and isinstance(a, (str, int, float, bool)) and a == b


def _tensors(batch: Any, torch: Any, depth: int = 0) -> list[Any] | None:
    """The collated batch's tensors, where it holds nothing else (in tuples, lists and dicts); None otherwise."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if depth > 4 or not isinstance(batch, (list, tuple, Mapping)):
        return None
    found: list[Any] = []
    for part in batch.values() if isinstance(batch, Mapping) else batch:
        tensors = _tensors(part, torch, depth + 1)
        if tensors is None:
            return None
        found.extend(tensors)
    return found or None
