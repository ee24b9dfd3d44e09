"""Whether the training dataset gives the same item each time it is read: a few of its items read again and again after
the run and compared. Asked only where a frozen model (``steps.frozen_models``) runs on the DataLoader's batches as
loaded and the dataset is not one whose items are the same by what it is (a TensorDataset): then its outputs for an
item are the same every epoch exactly where the items are (``cache-frozen-outputs``). A dataset that draws an
augmentation at random gives two different fetches; one that seeds its draws by the item's index, or draws none,
gives the same one twice."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpuscope.collect.framework.base import CollectorResult, PostRunProbe, register
from gpuscope.collect.framework.probing import unseen
from gpuscope.record import CollectorStatus, ItemRepeat

if TYPE_CHECKING:
    from gpuscope.collect.captures import PostRunFacts

ITEMS = 8
"""Items read, spread evenly over the dataset (the first and the last among them)."""
READS = 4
"""Reads of each: an augmentation drawn with probability p gives the same item twice with probability about
(1 - p)^2 + p^2, so one comparison misses a coin-flip augmentation half the time; the 24 comparisons of 8 items read
4 times each miss it once in 16 million times, and one applied a tenth of the time (0.82 a comparison) under 1%."""
BUDGET_S = 1.0


@register
class RepeatProbeCollector(PostRunProbe):
    """Reads a few items of the training dataset again and again after the run and compares them."""

    name: ClassVar[str] = "repeat-probe"
    field: ClassVar[str | None] = "item_repeat"
    budget_s: ClassVar[float] = BUDGET_S
    doing: ClassVar[str] = "reading a few of the dataset's items again"
    runs_user_code: ClassVar[bool] = True

    def not_wanted(self, facts: PostRunFacts) -> str | None:
        return None if facts.frozen_fed else (
            "not run: no frozen model took a notable share of the step on the DataLoader's batches as loaded from a "
            "dataset other than a TensorDataset")

    def run(self, run_dir: Path, facts: PostRunFacts) -> CollectorResult:
        if (why := self.not_wanted(facts)) is not None:
            return CollectorResult(CollectorStatus("unavailable", why))
        dataset = facts.dataset
        if dataset is None or facts.dataset_fetch:
            return CollectorResult(CollectorStatus("unavailable", "no map-style dataset read one item at a time"))
        try:
            with unseen():
                found = read_twice(dataset, time.perf_counter() + self.budget_s)
        except Exception as exc:  # the user's code failing is not gpuscope's failure
            return CollectorResult(CollectorStatus("unavailable", f"the dataset raised when read again after the run: "
                                                                  f"{type(exc).__name__}: {exc}"))
        if found is None:
            return CollectorResult(CollectorStatus("unavailable", "the dataset was empty after the run"))
        return CollectorResult(CollectorStatus("ok"), found)


def read_twice(dataset: Any, deadline: float) -> ItemRepeat | None:
    """``ITEMS`` items of ``dataset`` spread over it, each read ``READS`` times (as far as ``deadline`` allows, at
    least one item twice) and compared with its first read; None where the dataset is empty."""
    length = len(dataset)
    if length < 1:
        return None
    indices = sorted({k * (length - 1) // max(1, ITEMS - 1) for k in range(ITEMS)})
    compared: list[int] = []
    reads = READS
    for index in indices:
        if compared and time.perf_counter() > deadline:
            break
        first = dataset[index]
        compared.append(index)
        for read in range(1, READS):
            if read > 1 and time.perf_counter() > deadline:
                reads = min(reads, read)
                break
            if not same(first, dataset[index]):
                return ItemRepeat(dataset=type(dataset).__name__, indices=tuple(compared), reads=read + 1,
                                  same=False)
    return ItemRepeat(dataset=type(dataset).__name__, indices=tuple(compared), reads=reads, same=True)


def same(a: Any, b: Any) -> bool:
    """Whether two fetches of an item are equal: tensors and arrays element by element (NaN equal to NaN), tuples,
    lists and dicts member by member, anything else by ``==``."""
    if hasattr(a, "shape") and hasattr(a, "dtype") and hasattr(b, "shape"):
        if type(a) is not type(b) or tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            return False
        if hasattr(a, "equal"):  # a torch tensor (NaN is not equal to itself: compared apart where it may be there)
            return bool(a.equal(b) or (a.is_floating_point() and ((a == b) | (a.isnan() & b.isnan())).all()))
        import numpy
        return bool(numpy.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:
        return False
