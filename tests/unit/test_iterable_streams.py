"""A DataLoader over an IterableDataset: more workers help only where each takes its own part of the stream. The
loaders collector reads whether the dataset's code splits it (``torch.utils.data.get_worker_info()``), and the
more-dataloader-workers fix says how where it does not: on a streaming corpus reader of 6000 lines, the advised
``num_workers=2`` alone made the script see 12000 samples, each twice, and its epoch take longer."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest

from conftest import make_record
from gpuscope.collect.steps.loaders import LoaderBook, _describe, fingerprint, splits_its_stream
from gpuscope.diagnose.rules import evaluate
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
    # nor a class of the script's own derived from one (a library's base may split the stream itself)
    library = type("LibraryStream", (IterableDataset,), {"__module__": "json", "__iter__": lambda self: iter(())})
    assert splits_its_stream(type("Mine", (library,), {"__module__": __name__})(), None) is None


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


def first_batches(dataset: Any, workers: int) -> Loader:
    """The record of a loader of ``workers`` workers over ``dataset`` whose first batches the book saw."""
    book = LoaderBook()
    stream = iter(DataLoader(dataset, batch_size=2, num_workers=workers))
    for _ in range(workers + 1):
        book.count_batch(stream, next(stream), 0.01)
    (loader,) = book.records()
    return loader


@pytest.mark.slow  # starts worker processes
def test_workers_that_each_yield_the_whole_stream_give_the_same_first_batch() -> None:
    whole, split = first_batches(Lines(), 2), first_batches(OwnLines(), 2)
    assert (whole.shards_by_worker, whole.repeated_first_batches) == (False, 1)
    assert (split.shards_by_worker, split.repeated_first_batches) == (True, 0)


def test_a_batch_is_fingerprinted_by_its_tensors_contents_within_a_bound() -> None:
    batch = (torch.arange(6).reshape(3, 2), torch.tensor([0.5, 1.5]))
    assert fingerprint(batch) == fingerprint((batch[0].clone(), batch[1].clone()))
    assert fingerprint(batch) != fingerprint((batch[0] + 1, batch[1]))
    assert fingerprint({"ids": torch.ones(2, dtype=torch.bfloat16)}) is not None  # bytes of any dtype
    assert fingerprint(batch, limit=8) is None and fingerprint(["no tensor"]) is None


def repeating_run(shards: bool | None, repeated: int) -> Any:
    """A run whose LineStream loader's 2 workers gave ``repeated`` of their first 2 batches again."""
    record = streaming_run(shards)
    loader = dataclasses.replace(record.loaders[0], num_workers=2, repeated_first_batches=repeated)
    return dataclasses.replace(record, loaders=(loader,), breakdown=Breakdown(data_wait=0.01, forward=0.99))


def test_workers_that_repeat_the_stream_are_told_how_to_split_it_with_no_step_gain_promised() -> None:
    recommendations, checks = evaluate(repeating_run(shards=False, repeated=1))
    rec = next(r for r in recommendations if r.id == "split-iterable-stream")
    assert rec.expected_gain is None  # the step is no slower: the epoch takes half the steps
    assert rec.evidence[:2] == (
        "the LineStream loader's 2 workers gave the same first batch (1 of the first 2 batches repeated an earlier "
        "one)",
        "the LineStream IterableDataset's code never calls torch.utils.data.get_worker_info(): each worker yields the "
        "whole stream, so every batch is trained on 2 times and an epoch takes 2x the steps its data needs")
    assert rec.fix.splitlines()[0] == ("# in LineStream.__iter__, each worker reads and prepares only its own share "
                                       "of the stream:")


@pytest.mark.parametrize(("shards", "repeated"), [(False, 0), (None, 1), (True, 0)],
                         ids=["different-first-batches", "code-not-read", "split"])
def test_workers_not_shown_to_repeat_the_stream_are_left_alone(shards: bool | None, repeated: int) -> None:
    # a random stream each worker seeds differently yields different batches unsplit: no repeat, nothing said
    _, checks = evaluate(repeating_run(shards, repeated))
    assert checks["split-iterable-stream"].status == "clear"
