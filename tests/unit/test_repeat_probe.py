"""The repeat probe: a few of the training dataset's items read twice after the run and compared, where a frozen
model runs on the DataLoader's batches as loaded from a dataset not known to give the same items."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import torch

from gpuscope.collect.collectors.repeat_probe import RepeatProbeCollector, read_twice, same
from gpuscope.diagnose.rules import evaluate
from gpuscope.record import ItemRepeat, RunRecord
from gpuscope.session import post_run_facts

RECORDS = Path(__file__).resolve().parent.parent / "fixtures" / "records"


class Seeded:
    """Items drawn at random, but seeded by their index: the same every time."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> tuple[torch.Tensor, np.ndarray, dict[str, float]]:
        g = torch.Generator().manual_seed(index)
        return torch.randn(3, 4, generator=g), np.random.default_rng(index).normal(size=2), {"label": index % 7}


class Augmented(Seeded):
    """An augmentation drawn from the global generator at each read."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, np.ndarray, dict[str, float]]:
        x, y, z = super().__getitem__(index)
        return x + torch.rand(()), y, z


def test_items_seeded_by_their_index_read_the_same_twice_and_augmented_ones_do_not() -> None:
    assert read_twice(Seeded(), deadline=float("inf")) == ItemRepeat(
        "Seeded", (0, 14, 28, 42, 56, 70, 84, 99), 4, True)
    # the first item already differs at its second read: no more are read
    assert read_twice(Augmented(), deadline=float("inf")) == ItemRepeat("Augmented", (0,), 2, False)


class Flipped(Seeded):
    """A coin-flip augmentation (RandomHorizontalFlip's): two reads are the same half the time."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, np.ndarray, dict[str, float]]:
        x, y, z = super().__getitem__(index)
        return (x.flip(-1) if torch.rand(()) < 0.5 else x), y, z


def test_a_coin_flip_augmentation_is_caught_however_the_coins_fall() -> None:
    # 24 comparisons: all the same once in 16 million seeds
    for seed in range(200):
        torch.manual_seed(seed)
        assert not read_twice(Flipped(), deadline=float("inf")).same  # type: ignore[union-attr]


def test_equal_means_element_by_element_nan_included() -> None:
    nan = torch.tensor([1.0, float("nan")])
    assert same(nan, nan.clone()) and same(np.array([np.nan]), np.array([np.nan]))
    assert not same(torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64))
    assert not same((torch.zeros(2),), [torch.zeros(3)]) and same({"a": [1, "x"]}, {"a": [1, "x"]})


def test_the_probe_reads_only_where_a_frozen_model_reads_the_batches() -> None:
    state = torch.get_rng_state(), random.getstate()
    probe = RepeatProbeCollector()
    facts = post_run_facts(steps=10, median_s=0.1, dataset=Augmented())
    assert probe.not_wanted(facts) is not None  # (the session then forks no process for it)
    quiet = probe.run(Path("."), facts)
    assert quiet.status.status == "unavailable" and quiet.payload is None
    found = probe.run(Path("."), post_run_facts(steps=10, median_s=0.1, dataset=Augmented(), frozen_fed=True))
    assert found.status.status == "ok" and found.payload == ItemRepeat("Augmented", (0,), 2, False)
    # the script's random generators as it left them
    assert torch.equal(torch.get_rng_state(), state[0]) and random.getstate() == state[1]


def test_a_dataset_of_its_own_whose_items_read_the_same_twice_gets_the_advice() -> None:
    record = RunRecord.from_json(json.loads((RECORDS / "distill_frozen_teacher.json").read_text()))
    own = dataclasses.replace(record.steps, frozen_models=tuple(
        dataclasses.replace(f, fixed_items=False) for f in record.steps.frozen_models))
    found, checks = evaluate(dataclasses.replace(record, steps=own))
    assert checks["cache-frozen-outputs"].status == "clear"  # not read twice: not known
    read = dataclasses.replace(record, steps=own, item_repeat=ItemRepeat("Images", (0, 2048, 4095), 4, True))
    found, checks = evaluate(read)
    (advice,) = [r for r in found if r.id == "cache-frozen-outputs"]
    assert "from a dataset (Images) whose items 0, 2048, 4095 read the same 4 times each after the run" in advice.why
    drawn = dataclasses.replace(read, item_repeat=ItemRepeat("Images", (0,), 2, False))
    assert evaluate(drawn)[1]["cache-frozen-outputs"].status == "clear"
