"""A DataLoader over an IterableDataset: more workers help only where each takes its own part of the stream. The
loaders collector reads whether the dataset's code splits it (``torch.utils.data.get_worker_info()``), and the
more-dataloader-workers fix says how where it does not: on a streaming corpus reader of 6000 lines, the advised
``num_workers=2`` alone made the script see 12000 samples, each twice, and its epoch take longer."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from conftest import make_record
from gpuscope.analysis.rules import evaluate
from gpuscope.collectors.loaders import _describe, splits_its_stream
from gpuscope.record import Breakdown, Loader, RunMeta, Steps

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, IterableDataset, get_worker_info  # noqa: E402


class Lines(IterableDataset):
    """A stream every worker would read whole."""

    def __iter__(self) -> Any:
        for i in range(8):
            yield torch.tensor([i])


class OwnLines(IterableDataset):
    """A stream that gives each worker every Nth item (torch's documented way)."""

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        for i in range(8):
            if info is None or i % info.num_workers == info.id:
                yield torch.tensor([i])


def my_share(items: range) -> range:
    info = get_worker_info()
    return items if info is None else items[info.id::info.num_workers]


class HelperLines(IterableDataset):
    """A stream split by a function of the script's it calls."""

    def __iter__(self) -> Any:
        return (torch.tensor([i]) for i in my_share(range(8)))


class RangeLines(Lines):
    """The documentation's other way: ``worker_init_fn`` narrows each worker's copy."""

    start, end = 0, 8


def narrow(worker_id: int) -> None:
    info = get_worker_info()
    info.dataset.start = worker_id


@pytest.mark.parametrize(("dataset", "worker_init_fn", "splits"), [
    (Lines(), None, False),
    (OwnLines(), None, True),
    (HelperLines(), None, True),
    (RangeLines(), narrow, True),
    (RangeLines(), functools.partial(narrow), True),
    (RangeLines(), lambda worker_id: None, None),  # a worker_init_fn that may split it in ways not read here
], ids=["whole-stream", "every-nth", "through-a-helper", "worker-init-fn", "partial-worker-init-fn", "opaque-init"])
def test_whether_an_iterable_datasets_workers_would_split_its_stream_is_read_off_its_code(
        dataset: Any, worker_init_fn: Any, splits: bool | None) -> None:
    assert splits_its_stream(dataset, worker_init_fn) is splits


def test_a_stream_from_an_installed_library_is_not_judged() -> None:
    # torch's own ChainDataset: code the user did not write, which may split its stream in ways not read here
    assert splits_its_stream(torch.utils.data.ChainDataset([Lines()]), None) is None


def test_the_loaders_collector_records_it_for_iterable_datasets_only() -> None:
    stream = iter(DataLoader(Lines(), batch_size=2))
    assert _describe(stream)["shards_by_worker"] is False
    assert _describe(iter(DataLoader(torch.arange(8), batch_size=2)))["shards_by_worker"] is None


def streaming_run(shards: bool | None) -> Any:
    """A run that waits 60% of its 200 ms steps on a LineStream loader with no workers, on 8 cores."""
    return make_record(
        device="cpu",
        steps=Steps(count=40, median_s=0.2, total=50, warmup=1, profiled=9),
        breakdown=Breakdown(data_wait=0.6, forward=0.4),
        loaders=(Loader(dataset="LineStream", batch_size=2, batches=50, wait_s=1.0, iterable=True,
                        shards_by_worker=shards),),
        meta=RunMeta(cpu_count=8),
    )


def advice(shards: bool | None) -> Any:
    recommendations, _ = evaluate(streaming_run(shards))
    return next(r for r in recommendations if r.id == "more-dataloader-workers")


def test_workers_for_a_stream_that_is_not_split_come_with_the_lines_that_split_it() -> None:
    rec = advice(shards=False)
    assert rec.evidence[-1] == ("the LineStream IterableDataset's code never calls torch.utils.data.get_worker_info(): "
                                "with N workers each would yield the whole stream, N copies of every batch")
    first, *split = rec.fix.splitlines()
    assert first == "DataLoader(..., num_workers=2, persistent_workers=True)"
    assert split[0] == "# and in LineStream.__iter__, each worker reads and prepares only its own share of the stream:"
    assert split[1].startswith("info = torch.utils.data.get_worker_info()")
    # the other workers' items are skipped before any work on them (a filter at the yield would still have each
    # worker tokenise every line: measured, no faster than no workers)
    assert split[2].startswith("if info is not None and i % info.num_workers != info.id: continue")


def test_workers_for_a_stream_that_is_split_or_not_known_to_be_say_so_and_change_only_the_loader() -> None:
    split, unknown = advice(shards=True), advice(shards=None)
    assert split.fix == unknown.fix == "DataLoader(..., num_workers=2, persistent_workers=True)"
    assert split.evidence[-1] == ("the LineStream IterableDataset splits its stream among the workers (its code calls "
                                  "torch.utils.data.get_worker_info())")
    assert "else every worker yields all of it" in unknown.evidence[-1]
