"""The line a DataLoader fix goes on: the steps collector notes where each dataset's first DataLoader was built
(the user's line, or the user's call into the library that built it), and the loader rules name that line."""

from __future__ import annotations

import dataclasses
import sys
import sysconfig
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from conftest import make_record
from gpuscope.collect.collectors.steps import StepsCollector
from gpuscope.collect.steps.loaders import LoaderBook
from gpuscope.diagnose.rules.dataloader import more_dataloader_workers
from gpuscope.record import Breakdown, CallSite, Loader, RunMeta, Steps

HERE = Path(__file__).name


def iterate_in_a_session(build: Any) -> tuple[Loader, ...]:
    """The loaders the steps collector records while ``build()`` makes a DataLoader that a loop then iterates."""
    collector = StepsCollector()
    collector.start(Path("."))
    try:
        loader = build()
        for x, in loader:
            x.sum()
    finally:
        result = collector.stop()
    return result.payload.loaders


def test_a_loader_built_in_the_users_code_names_that_line() -> None:
    data = TensorDataset(torch.arange(12.0))
    loaders = iterate_in_a_session(lambda: DataLoader(data, batch_size=4))  # the line to change
    site = loaders[0].created_at
    assert site is not None and site.file.endswith(HERE)
    assert site.code == "loaders = iterate_in_a_session(lambda: DataLoader(data, batch_size=4))  # the line to change"
    assert loaders[0].created_by == ""
    # and the hook is gone with the session: DataLoader is torch's own again
    assert not hasattr(DataLoader.__init__, "__wrapped__")


def test_a_framework_building_the_loader_again_over_the_same_dataset_keeps_the_users_line() -> None:
    # as Lightning does to add its distributed sampler, and accelerate's prepare() to shard it
    data = TensorDataset(torch.arange(12.0))

    def build() -> DataLoader:
        users = DataLoader(data, batch_size=4)  # the user's line
        return DataLoader(users.dataset, batch_size=4, shuffle=False)

    site = iterate_in_a_session(build)[0].created_at
    assert site is not None and site.code == "users = DataLoader(data, batch_size=4)  # the user's line"


def test_a_line_that_builds_a_loader_each_epoch_counts_the_loaders_it_built() -> None:
    data = TensorDataset(torch.arange(12.0))

    def build_each_epoch() -> list[Any]:
        batches = []
        for _ in range(3):
            batches += list(DataLoader(data, batch_size=4))  # a new DataLoader each epoch
        return batches

    site = iterate_in_a_session(build_each_epoch)[0].created_at
    assert site is not None and site.code.endswith("# a new DataLoader each epoch") and site.calls == 3


def test_a_library_building_the_loader_again_from_the_users_line_is_no_second_loader_of_the_users() -> None:
    # given: Lightning's way with trainer.fit(model, DataLoader(...)) on one line: the user's DataLoader, then the
    # library's own, built over the same dataset in its code, called from that same line
    namespace: dict[str, Any] = {"__name__": "pytorch_lightning.trainer"}
    exec(compile(LIBRARY, sysconfig.get_paths()["purelib"] + "/pytorch_lightning/trainer.py", "exec"), namespace)
    book, data = LoaderBook(), TensorDataset(torch.arange(4.0))
    book.loader_created(data, sys._getframe()); namespace["get_train_dataloader"](book, data)  # noqa: E702
    book.count_batch(iter(DataLoader(data, batch_size=2)), (torch.zeros(2),), 0.01)
    # then: the user's line built one
    site = book.records()[0].created_at
    assert site is not None and site.calls == 1


LIBRARY = '''
import sys
def get_train_dataloader(book, dataset):
    book.loader_created(dataset, sys._getframe())
'''


def test_a_loader_built_inside_a_library_names_the_library_and_the_users_call_into_it() -> None:
    # given: a function of transformers' (compiled as if from site-packages) builds the DataLoader
    namespace: dict[str, Any] = {"__name__": "transformers.trainer"}
    exec(compile(LIBRARY, sysconfig.get_paths()["purelib"] + "/transformers/trainer.py", "exec"), namespace)
    book, data = LoaderBook(), TensorDataset(torch.arange(4.0))
    namespace["get_train_dataloader"](book, data)  # trainer.train()
    book.count_batch(iter(DataLoader(data, batch_size=2)), (torch.zeros(2),), 0.01)
    # then: the user's line that called into transformers, and transformers as the builder
    loader = book.records()[0]
    assert loader.created_by == "transformers"
    assert loader.created_at is not None and loader.created_at.code.endswith("# trainer.train()")
    assert loader.created_at.line == sys._getframe().f_lineno - 6


def data_bound(loader: Loader) -> Any:
    return make_record(steps=Steps(count=40, median_s=0.1, total=42, source="optimizer"),
                       breakdown=Breakdown(data_wait=0.5, forward=0.3, backward=0.2), loaders=(loader,),
                       meta=RunMeta(cpu_count=4))


def test_the_workers_fix_goes_on_the_line_that_built_the_loader() -> None:
    site = CallSite(file="train.py", line=37, function="main", code="loader = DataLoader(ds, batch_size=32)")
    loader = Loader(dataset="Images", num_workers=0, batch_size=32, batches=40, wait_s=2.0, created_at=site)
    finding = more_dataloader_workers(data_bound(loader))
    assert finding is not None
    assert finding.fix == "DataLoader(..., num_workers=1, persistent_workers=True)  # train.py:37"
    assert "the Images loader is built at train.py:37 `loader = DataLoader(ds, batch_size=32)`" in finding.evidence
    # built by the Trainer: its arguments, and the user's call
    trainer = dataclasses.replace(loader, created_by="transformers", created_at=dataclasses.replace(
        site, line=52, code="trainer.train()"))
    finding = more_dataloader_workers(data_bound(trainer))
    assert finding is not None and finding.fix == (
        "TrainingArguments(..., dataloader_num_workers=1, dataloader_persistent_workers=True)  "
        "# transformers, called from train.py:52")
    assert any("built inside transformers, called from train.py:52 `trainer.train()`" in f for f in finding.evidence)
    # not seen (a record of an older gpuscope): the fix as before, with no line
    unseen = more_dataloader_workers(data_bound(dataclasses.replace(loader, created_at=None)))
    assert unseen is not None and unseen.fix == "DataLoader(..., num_workers=1, persistent_workers=True)"
