"""A dataset that fetches whole batches: a ``BatchSampler`` passed as the DataLoader's ``sampler`` with
``batch_size=None`` (the fast path for tabular data), so that ``dataset[indices]`` gets a list. The probes fetch
from it as its loader did; given one index, the dataset fails, and the probes used to report that as the dataset's
own error (seen on a tabular regression script: both probes "unavailable: the dataset raised ValueError: zero-
dimensional arrays cannot be concatenated")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuscope.collect.collectors.data_probe import DataProbeCollector
from gpuscope.collect.collectors.loader_probe import ProbeBatches, _Source
from gpuscope.collect.steps.loaders import LoaderBook
from gpuscope.session import post_run_facts

torch = pytest.importorskip("torch")
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, default_convert  # noqa: E402

BATCH = 8


class Rows(Dataset):
    """100 rows of 4 features, fetched a batch at a time: each row gets its squares appended, row by row."""

    def __init__(self) -> None:
        self.x = np.arange(400, dtype=np.float32).reshape(100, 4)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, indices: Any) -> torch.Tensor:
        rows = self.x[indices]
        features = np.stack([np.concatenate([row, row ** 2]) for row in rows])  # an int index fails here
        return torch.from_numpy(features)


def batched_loader(dataset: Dataset) -> DataLoader:
    return DataLoader(dataset, sampler=BatchSampler(RandomSampler(dataset), batch_size=BATCH, drop_last=False),
                      batch_size=None)


def booked(loader: DataLoader) -> LoaderBook:
    """The loaders collector's book after one batch of ``loader``."""
    book = LoaderBook()
    iterator = iter(loader)
    book.count_batch(iterator, next(iterator), wait_s=0.01)
    return book


def test_the_loaders_collector_records_that_the_dataset_fetches_batches_of_the_samplers_size() -> None:
    dataset = Rows()
    book = booked(batched_loader(dataset))
    assert book.probe_dataset() == (dataset, BATCH)
    loader = book.probe_loader()
    assert loader is not None and loader["fetch"] == BATCH and loader["info"]["batch_size"] == BATCH
    # a loader that batches items itself gives its dataset one index a fetch
    plain = booked(DataLoader(torch.utils.data.TensorDataset(torch.ones(16, 4)), batch_size=BATCH))
    assert plain.probe_dataset()[1] is None and plain.probe_loader()["fetch"] is None  # type: ignore[index]


def test_the_data_probe_fetches_a_batch_at_a_time_as_the_loader_did() -> None:
    facts = post_run_facts(data_wait=0.5, median_s=0.1, steps=10, dataset=Rows(), dataset_fetch=BATCH)
    result = DataProbeCollector().run(Path("."), facts)
    assert result.status.status == "ok", result.status.reason
    assert result.payload.batch_items == BATCH and result.payload.items == 3  # type: ignore[union-attr]
    assert any(line.code.startswith("features = np.stack") for line in result.payload.lines)  # type: ignore[union-attr]
    # one index a fetch is not how this dataset is used: it fails
    one = DataProbeCollector().run(Path("."), post_run_facts(data_wait=0.5, median_s=0.1, steps=10, dataset=Rows()))
    assert one.status.status == "unavailable" and "ValueError" in one.status.reason


def test_the_loader_probe_gives_the_dataset_lists_of_indices_of_its_batch_size() -> None:
    # given: the probe's loader as built for a run whose batches of 8 were fetched whole (collated by
    # default_convert, as a DataLoader with batch_size=None does)
    source = _Source(Rows(), BATCH, default_convert, False, None, None, fetches_batches=True)
    loader = source.loader(torch, 0, False, 1.0)
    # then: each batch is one fetch of 8 random rows
    batch = next(iter(loader))
    assert batch.shape == (BATCH, 8)
    sampler = ProbeBatches(100, BATCH, batches=5)
    drawn = list(sampler)
    assert len(drawn) == len(sampler) == 5 and all(len(b) == BATCH and all(0 <= i < 100 for i in b) for b in drawn)
