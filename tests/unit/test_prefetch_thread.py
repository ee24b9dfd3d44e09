"""A loop fed by a prefetching thread: the thread iterates the DataLoader and hands batches over through a
``queue.Queue`` (as apex-style and BackgroundGenerator prefetchers do). The loop's wait on that queue is its data
wait, and the loader is recorded with the batches the thread took."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

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
