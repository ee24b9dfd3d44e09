"""Step listeners are told of the steps they ask for, and no others: a listener with nothing to do at most steps
costs those steps no call (the loop's hot path), yet hears of the steps it wants, and of the next one when woken."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

from conftest import collect_garbage
from gpuscope.collect.collectors.practices import READ_EACH, READ_EVERY, PracticesCollector
from gpuscope.collect.collectors.steps import StepsCollector
from gpuscope.collect.steps.loopthread import LoopThread
from gpuscope.collect.steps.step_listeners import QUIET, ListenerSchedule


@pytest.fixture(autouse=True)
def _no_models_left() -> Iterator[None]:
    """The models these tests train are gone before the next test: the steps collector looks for root modules
    among every module alive."""
    yield
    collect_garbage()


def told(schedule: ListenerSchedule, steps: int) -> None:
    """``steps`` step beginnings, each told as the steps tracker tells them (or passed over)."""
    for index in range(steps):
        if schedule.boundaries < schedule.next_due or not schedule.listeners:
            schedule.boundaries += 1
        else:
            schedule.tell(index)


def test_a_listener_is_told_of_every_step_or_every_nth_as_it_asks() -> None:
    schedule = ListenerSchedule()
    every, third = [], []
    schedule.add(every.append)  # returns None: the next step
    schedule.add(lambda index: third.append(index) or 3)
    told(schedule, 10)
    assert every == list(range(10))
    assert third == [0, 3, 6, 9]


def noting_until_woken(heard: list[int]) -> Callable[[int], int]:
    """A listener that notes each step it is told of in ``heard``, then asks to hear of none until woken."""

    def listener(index: int) -> int:
        heard.append(index)
        return QUIET

    return listener


def test_a_quiet_listener_costs_no_call_until_it_is_woken_and_then_hears_the_next_step() -> None:
    schedule = ListenerSchedule()
    heard: list[int] = []
    until_woken = noting_until_woken(heard)
    schedule.add(until_woken)
    told(schedule, 5)
    assert heard == [0]
    assert schedule.next_due > schedule.boundaries + 1000  # no one due: the tracker passes the steps over
    schedule.wake(until_woken)
    told(schedule, 3)
    assert heard == [0, 0]  # (told() numbers its steps from 0 again)


def test_a_listener_added_first_is_told_first_and_one_removed_while_told_hears_no_more() -> None:
    schedule = ListenerSchedule()
    order: list[str] = []

    def leaves(index: int) -> None:
        order.append("leaves")
        schedule.remove(leaves)

    schedule.add(lambda index: order.append("second"))
    schedule.add(leaves, first=True)
    told(schedule, 3)
    assert order == ["leaves", "second", "second", "second"]


def sgd_steps(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()


def test_once_the_root_modules_are_found_the_steps_collector_leaves_the_hot_path_until_an_optimizer_first_steps() -> None:
    collector = StepsCollector()
    model, other = nn.Linear(8, 1), nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    collector.start(Path("."))
    try:
        sgd_steps(model, optimizer, 10)
        schedule = collector.tracker.schedule  # type: ignore[union-attr]
        assert collector.forward.roots == ["Linear"]
        assert schedule.next_due > schedule.boundaries + 1000  # torch's CPU build: no device timing to wait for
        # a second optimizer's first step wakes it: its modules are found at the next boundary
        second = torch.optim.SGD(other.parameters(), lr=0.01)
        for _ in range(3):
            optimizer.zero_grad()
            second.zero_grad()
            (model(torch.randn(4, 8)).sum() + other(torch.randn(4, 8)).sum()).backward()
            second.step()
            optimizer.step()
        assert collector.forward.roots == ["Linear", "Linear"]
        assert schedule.next_due > schedule.boundaries + 1000
    finally:
        collector.stop()


def practices_record(train: Callable[[nn.Module, torch.optim.Optimizer], None]) -> Any:
    """The practices collector's record of ``train(model, optimizer)``, run under it and the steps collector."""
    steps, practices = StepsCollector(), PracticesCollector()
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps.start(Path("."))
    practices.follow(steps)
    practices.start(Path("."))
    try:
        train(model, optimizer)
    finally:
        record = practices.stop().payload
        steps.stop()
    return record


def test_the_debug_apis_are_read_at_each_of_the_first_steps_then_at_every_nth() -> None:
    def train(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        sgd_steps(model, optimizer, 100)  # 100 boundaries told: at each optimizer step's end
        with torch.autograd.set_detect_anomaly(True):
            sgd_steps(model, optimizer, 2 * READ_EVERY)

    record = practices_record(train)
    assert record.steps_checked == READ_EACH + (100 - READ_EACH) // READ_EVERY + 2  # 64 + 4, then 2 with anomaly on
    assert record.anomaly_steps == 2


def test_a_distribution_check_has_every_boundary_read_again() -> None:
    def train(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        sgd_steps(model, optimizer, READ_EACH + 3)  # reading every READ_EVERY-th boundary by now
        for _ in range(5):
            torch.distributions.Normal(torch.zeros(2), torch.ones(2))  # checks its arguments
            sgd_steps(model, optimizer, 1)

    record = practices_record(train)
    # each of the 5 steps with a check is kept, the first under the index of the step it ran in
    assert record.distribution_check_steps == tuple(range(READ_EACH + 3, READ_EACH + 8))
    assert all(count == 1 for count in record.distribution_check_counts)


def test_a_forked_child_follows_no_thread_of_its_parents_loop() -> None:
    loop = LoopThread()
    assert loop.mine()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the same thread id, another process
        os.write(write, b"1" if loop.mine() or loop.ident is not None else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"0"
    assert loop.mine()


def test_a_listener_woken_by_another_while_the_step_is_told_hears_the_next_step() -> None:
    schedule = ListenerSchedule()
    heard: list[int] = []
    sleeper = noting_until_woken(heard)
    schedule.add(sleeper)
    schedule.add(lambda index: schedule.wake(sleeper) if index == 2 else None)  # told of every step
    told(schedule, 5)
    assert heard == [0, 3]
