"""A loop fed by a prefetching thread: the thread iterates the DataLoader and hands batches over through a
``queue.Queue`` (as apex-style and BackgroundGenerator prefetchers do). The loop's wait on that queue is its data
wait, and the loader is recorded with the batches the thread took."""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import queue
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from gpuscope.collect.captures import StepCapture
from gpuscope.collect.collectors.steps import StepsCollector

ITEM_S = 0.004
BATCH = 2
STEPS = 8


class SlowItems(Dataset):
    def __len__(self) -> int:
        return BATCH * STEPS

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(ITEM_S)  # the batch's build: 8 ms, while the step's own work is a fraction of a millisecond
        return torch.full((4,), float(index))


def train_with_a_prefetching_thread() -> StepCapture:
    collector = StepsCollector()
    collector.start(Path("."))
    try:
        loader = DataLoader(SlowItems(), batch_size=BATCH)
        handoff: queue.Queue = queue.Queue(maxsize=2)
        feeder = threading.Thread(target=lambda: [handoff.put(b) for b in loader] + [handoff.put(None)])
        feeder.start()
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        while (batch := handoff.get()) is not None:
            model(batch).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        feeder.join()
    finally:
        capture = collector.stop().payload
    return capture


def test_the_loops_wait_on_a_prefetching_threads_queue_is_data_wait() -> None:
    capture = train_with_a_prefetching_thread()
    assert capture.count == STEPS
    later = [r for r in capture.records if r.index >= 2]  # the thread has its first batch in by then
    waits = sorted(r.phases_s["data_wait"] / r.wall_s for r in later)
    assert waits[len(waits) // 2] > 0.5  # the step is mostly the wait for a batch the thread is building


def test_the_loader_a_thread_iterates_is_recorded_with_its_batches() -> None:
    loaders = train_with_a_prefetching_thread().loaders
    assert [(loader.dataset, loader.batches) for loader in loaders] == [("SlowItems", STEPS)]
    assert loaders[0].wait_s >= STEPS * BATCH * ITEM_S  # the time the thread took to build them


def test_queue_get_is_the_standard_librarys_own_again_after_the_session() -> None:
    train_with_a_prefetching_thread()
    assert not hasattr(queue.Queue.get, "__wrapped__")


def train_fed_through_a_queue(kind: str, get_inside_forward: bool = False) -> StepCapture:
    """A loop fed by a thread (``queue.Queue``) or a process (``multiprocessing.Queue``) of its own that builds each
    batch in ITEM_S x BATCH, no DataLoader anywhere; or, ``get_inside_forward``, one whose model waits on a queue
    itself (a wait that is its forward's)."""
    collector = StepsCollector()
    collector.start(Path("."))
    try:
        handoff: Any = queue.Queue(maxsize=2) if kind == "thread" else multiprocessing.get_context("fork").Queue(2)
        start = threading.Thread if kind == "thread" else multiprocessing.get_context("fork").Process
        feeder = start(target=_build_batches, args=(handoff,))
        feeder.start()
        model = _WaitingModel(handoff) if get_inside_forward else torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(STEPS):
            batch = torch.ones(4) if get_inside_forward else torch.tensor(handoff.get())
            model(batch).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        feeder.join()
    finally:
        capture = collector.stop().payload
    return capture


def _build_batches(handoff: Any) -> None:
    for index in range(STEPS):
        time.sleep(ITEM_S * BATCH)
        handoff.put([float(index)] * 4)  # (a tensor's shared memory would go with a process that ended)


class _WaitingModel(torch.nn.Linear):
    def __init__(self, handoff: Any) -> None:
        super().__init__(4, 1)
        self.handoff = handoff

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x + torch.tensor(self.handoff.get()))


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_loop_waiting_on_a_queue_of_its_own_waits_for_data_at_that_line(kind: str) -> None:
    capture = train_fed_through_a_queue(kind)
    assert capture.count == STEPS and not capture.loaders
    later = [r for r in capture.records if r.index >= 2]
    waits = sorted(r.phases_s["data_wait"] / r.wall_s for r in later)
    assert waits[len(waits) // 2] > 0.5  # the step is mostly the wait for the batch the feeder is building
    (site,) = capture.queue_waits
    assert site.file.endswith("test_prefetch_thread.py") and site.calls == STEPS
    assert site.code == "batch = torch.ones(4) if get_inside_forward else torch.tensor(handoff.get())"


def test_a_wait_on_a_queue_inside_the_models_forward_is_the_forwards() -> None:
    capture = train_fed_through_a_queue("thread", get_inside_forward=True)
    # once forwards are timed (from the second step: the first finds the trained model's modules) it is no data wait
    assert [site.calls for site in capture.queue_waits] == [1]
    assert all(r.phases_s["data_wait"] == 0.0 for r in capture.records if r.index >= 1)
    later = [r for r in capture.records if r.index >= 2]
    assert sorted(r.phases_s["forward"] / r.wall_s for r in later)[len(later) // 2] > 0.5


def test_multiprocessing_queue_get_is_its_own_again_after_the_session() -> None:
    train_fed_through_a_queue("process")
    assert not hasattr(multiprocessing.queues.Queue.get, "__wrapped__")
