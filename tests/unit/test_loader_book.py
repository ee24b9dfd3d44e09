"""What the record says of each DataLoader the loop iterated, read off its iterator: here, the workers' start
method, whichever way the script chose it."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from gpuscope.collectors.loaders import LoaderBook


def iterator_with(worker: Any) -> SimpleNamespace:
    """What a two-worker DataLoader's iterator shows of itself (torch's private attributes), one worker given."""
    return SimpleNamespace(_dataset=[1, 2, 3], _num_workers=2, _workers=[worker], _batch_size=1)


def start_method_recorded(worker: Any) -> str | None:
    book = LoaderBook()
    book.count_batch(iterator_with(worker), batch=[1], wait_s=0.01)
    return book.records()[0].start_method


@pytest.fixture
def default_start_method() -> Iterator[None]:
    """The process's default start method, put back after the test."""
    before = multiprocessing.get_start_method(allow_none=True)
    yield
    multiprocessing.set_start_method(before, force=True)


def test_a_loader_given_a_multiprocessing_context_records_its_method() -> None:
    worker = multiprocessing.get_context("forkserver").Process()  # DataLoader(..., multiprocessing_context=...)
    assert start_method_recorded(worker) == "forkserver"


def test_a_loader_on_the_default_context_records_the_method_the_script_set(default_start_method: None) -> None:
    # torch.multiprocessing.set_start_method("spawn") at the top of main(), as pytorch/examples' scripts do:
    # the workers are plain Process objects of the default context
    multiprocessing.set_start_method("spawn", force=True)
    assert start_method_recorded(multiprocessing.Process()) == "spawn"
