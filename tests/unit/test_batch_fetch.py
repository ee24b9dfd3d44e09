"""The data probe's batch built again three ways, on small datasets defined here: item by item as a loader without
workers builds it, in one ``dataset[indices]`` call where the dataset answers one with the same batch, and sliced
from its tensors where the batch holds only tensors and the loader draws its indices as a permutation would."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
)

from gpuscope.collect import batch_fetch
from gpuscope.collect.batch_fetch import draws_plainly, time_batch_fetch
from gpuscope.collect.collectors.data_probe import DataProbeCollector
from gpuscope.record import DataProbe
from gpuscope.session import post_run_facts

ROWS = torch.arange(64 * 4, dtype=torch.float32).view(64, 4)
LABELS = torch.arange(64) % 2


class Listed(Dataset):
    """Items kept apart in a list, one index a fetch: ``dataset[[1, 2]]`` raises."""

    def __init__(self) -> None:
        self.items = [(row, float(label)) for row, label in zip(ROWS, LABELS)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, float]:
        return self.items[index]


class Named(Dataset):
    """Items with a string in them: no tensor to slice."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str]:
        return ROWS[index], f"row {index}"


class Doubled(Dataset):
    """Takes a list of indices, but gives back something else than the batch of its items."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: Any) -> torch.Tensor:
        return ROWS[index] * (2 if isinstance(index, list) else 1)


def fetch(dataset: Dataset, sliceable: bool = True, item_s: float = 1e-6) -> Any:
    return time_batch_fetch(dataset, 16, item_s, budget_s=1.0, clock=time.perf_counter, sliceable=sliceable)


def test_a_tensor_dataset_is_timed_item_by_item_in_one_call_and_sliced() -> None:
    # when
    found = fetch(TensorDataset(ROWS, LABELS))
    # then: dataset[indices] gives the collated batch, and the batch is tensors only
    assert found is not None and found.built_s > 0
    assert found.fetched_s is not None and found.fetched_s > 0
    assert found.sliced_s is not None and found.sliced_s > 0


def test_items_kept_apart_are_sliced_only_as_a_dataset_holding_them_stacked_would() -> None:
    # given a dataset that takes one index only; then no one-call fetch, but the collated batch's tensors sliced
    found = fetch(Listed())
    assert found is not None and found.fetched_s is None and found.sliced_s is not None


def test_a_one_call_answer_unlike_the_collated_batch_is_not_taken_for_it() -> None:
    found = fetch(Doubled())
    assert found is not None and found.fetched_s is None


def test_a_batch_holding_more_than_tensors_or_drawn_otherwise_is_not_sliced() -> None:
    # a string in each item; a loader whose sampler is not a plain permutation
    assert fetch(Named()).sliced_s is None
    assert fetch(TensorDataset(ROWS, LABELS), sliceable=False).sliced_s is None


def test_items_that_are_work_or_too_slow_for_the_budget_are_not_built_again() -> None:
    # items of 1 ms: their own work, which one call does not take away
    assert fetch(TensorDataset(ROWS, LABELS), item_s=0.001) is None
    # 16 items of 40 us, built nine times, would take 5.8 ms of the 5 ms left
    found = time_batch_fetch(TensorDataset(ROWS, LABELS), 16, 40e-6, budget_s=0.005, clock=time.perf_counter)
    assert found is None


def test_a_permutation_or_a_range_split_into_batches_draws_as_the_loader_did() -> None:
    dataset = TensorDataset(ROWS, LABELS)

    def sampler(loader: DataLoader) -> object:
        return loader._index_sampler

    assert draws_plainly(sampler(DataLoader(dataset, batch_size=8, shuffle=True)))
    assert draws_plainly(sampler(DataLoader(dataset, batch_size=8)))
    assert draws_plainly(BatchSampler(SequentialSampler(dataset), 8, drop_last=False))
    # with replacement, weighted, or a sampler of the user's: no permutation gives its order
    assert not draws_plainly(BatchSampler(RandomSampler(dataset, replacement=True), 8, drop_last=False))
    assert not draws_plainly(sampler(DataLoader(dataset, batch_size=8, sampler=WeightedRandomSampler([1.0] * 64, 64))))
    assert not draws_plainly(sampler(DataLoader(dataset, batch_size=8, sampler=list(range(64)))))


def loader_facts(dataset: Dataset, workers: int = 0, shuffle: bool = True) -> Any:
    """A finished run whose steps waited half their time on ``dataset`` in batches of 16, collated by torch."""
    loader = DataLoader(dataset, batch_size=16, shuffle=shuffle)
    return post_run_facts(data_wait=0.5, median_s=0.01, steps=10, dataset=dataset, loader={
        "info": {"batch_size": 16, "num_workers": workers}, "collate_fn": default_collate,
        "index_sampler": loader._index_sampler})


def test_the_data_probe_records_the_three_builds_of_a_loader_without_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    # (the light-item gate measures the item: on a loaded machine a 3 us item can time over it; not what is tested)
    monkeypatch.setattr(batch_fetch, "LIGHT_ITEM_S", 1.0)
    # when
    probe = DataProbeCollector().run(Path("."), loader_facts(TensorDataset(ROWS, LABELS))).payload
    # then
    assert isinstance(probe, DataProbe)
    assert probe.batch_built_s and probe.batch_fetched_s and probe.batch_sliced_s


def test_a_loader_with_workers_is_not_built_again() -> None:
    probe = DataProbeCollector().run(Path("."), loader_facts(TensorDataset(ROWS, LABELS), workers=2)).payload
    assert isinstance(probe, DataProbe)
    assert probe.batch_built_s is None and probe.batch_fetched_s is None and probe.batch_sliced_s is None
