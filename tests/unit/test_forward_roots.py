"""The steps collector on real torch modules in this process: which modules it times the forward of (the
outermost module holding the parameters, whichever marker defines the steps), and whose events it counts."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch
import torch.nn as nn

from gpuscope.captures import StepCapture
from gpuscope.collectors.steps import StepsCollector


class Net(nn.Module):
    """A model whose own forward does work besides its children's (as word_language_model's does)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(20, 8)
        self.decoder = nn.Linear(8, 20)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.decoder(torch.tanh(self.encoder(tokens))), dim=-1)


def run_hand_written_loop(steps: int) -> StepCapture:
    """A loop updating its parameters by hand, its batch sliced from a tensor: backward() is its only marker."""
    collector = StepsCollector()
    torch.manual_seed(0)
    model = Net()
    tokens = torch.randint(20, (16,))
    collector.start(Path("."))
    try:
        for _ in range(steps):
            model.zero_grad()
            loss = nn.functional.nll_loss(model(tokens), tokens)
            loss.backward()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.1)
    finally:
        result = collector.stop()
    return result.payload


def test_a_loop_with_no_optimizer_times_the_forward_on_the_model_itself() -> None:
    capture = run_hand_written_loop(steps=8)
    assert capture.source == "backward" and capture.count == 8
    assert any(note.startswith("forward timed on root modules: Net ") for note in capture.notes), capture.notes
    # no step was lost to a search for the forward: the hooked module's forward ran in every step
    assert not any(r.profiled for r in capture.records)
    assert all(r.phases_s["forward"] > 0 for r in capture.records[2:])


def test_events_from_a_forked_child_or_another_thread_are_not_the_loops() -> None:
    collector = StepsCollector()
    collector.start(Path("."))
    try:
        seen_in_thread: list[bool] = []
        thread = threading.Thread(target=lambda: seen_in_thread.append(collector._mine()))
        thread.start()
        thread.join()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a DataLoader worker forked from the loop's thread has the loop's thread id
            os.write(write, b"1" if collector._mine() else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        seen_in_child = os.read(read, 1)
        os.close(read)
        os.close(write)
        assert collector._mine() and seen_in_thread == [False] and seen_in_child == b"0"
    finally:
        collector.stop()
