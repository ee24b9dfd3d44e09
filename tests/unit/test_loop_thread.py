"""The thread the steps collector follows: the training loop's, even where a script trains in a thread of its own
while its main thread waits (``gpuscope.collect.steps.loopthread``)."""

from __future__ import annotations

import threading
from pathlib import Path

import torch
import torch.nn as nn

from gpuscope.collect.collectors.steps import StepsCollector
from gpuscope.collect.framework.base import CollectorResult


def train(model: nn.Module, steps: int) -> None:
    """Steps of SGD by hand: each backward() ends one."""
    data = torch.randn(16, 8)
    for _ in range(steps):
        model.zero_grad()
        model(data).pow(2).mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad


def in_thread(target, name: str = "trainer") -> None:  # type: ignore[no-untyped-def]
    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join()


def collected(loop) -> CollectorResult:  # type: ignore[no-untyped-def]
    collector = StepsCollector()
    collector.start(Path("."))
    try:
        loop()
    finally:
        result = collector.stop()
    return result


def test_a_loop_in_a_thread_of_its_own_is_followed_from_its_first_step() -> None:
    # given: the script's main thread starts a thread that trains, and waits for it
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    result = collected(lambda: in_thread(lambda: train(model, 12)))
    capture = result.payload
    # then: its steps are counted and timed, forward included, and the record says whose they are
    assert capture.count >= 11
    assert all(r.phases_s.get("backward", 0) > 0 for r in capture.records[1:])
    assert any(r.phases_s.get("forward", 0) > 0 for r in capture.records[2:])
    assert "the training loop ran in the thread 'trainer', followed from its first step" in result.notes


def test_once_the_main_thread_has_stepped_another_threads_steps_are_not_its_loops() -> None:
    # given: the main thread trains, then a helper thread runs a backward of its own (a probe, a side computation)
    model = nn.Linear(8, 1)

    def loop() -> None:
        train(model, 6)
        in_thread(lambda: train(nn.Linear(8, 1), 6), name="helper")

    result = collected(loop)
    # then: only the main thread's steps are counted
    assert result.payload.count == 6
    assert not any("ran in the thread" in note for note in result.notes)
