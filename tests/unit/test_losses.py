"""The loss of each step: the tensor its outermost backward() was called on, kept unread during the run (no sync)
and read after it, in bounded memory."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from gpuscope.collect.collectors.steps import StepsCollector
from gpuscope.collect.steps.steplog import LossLog
from gpuscope.reduce.fields import steps_fields
from gpuscope.reduce.steady import summarize_capture


def train(steps: int, *, accumulate: int = 1, penalty: bool = False, poison_at: int | None = None):
    """A small regression loop under the steps collector; its losses as the collector read them, and as the loop
    computed them."""
    torch.manual_seed(0)
    collector = StepsCollector()
    collector.start(Path("."))
    seen: list[float] = []
    try:
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        x = torch.randn(32, 4)
        y = x.sum(1, keepdim=True)
        for step in range(steps):
            parts = []
            for _ in range(accumulate):
                out = model(x)
                loss = ((out - y) ** 2).mean()
                if step == poison_at:
                    loss = loss * float("nan")
                if penalty:  # a gradient penalty, whose autograd.grad is called on a one-element tensor too
                    (grad,) = torch.autograd.grad(out.sum(), model.weight, create_graph=True)
                    loss = loss + 0.0 * grad.pow(2).mean()
                loss.backward()
                parts.append(loss.item())
            seen.append(sum(parts) / len(parts))
            optimizer.step()
            optimizer.zero_grad()
    finally:
        capture = collector.stop().payload
    return capture, seen


def test_each_steps_loss_is_the_value_backward_was_called_on() -> None:
    capture, seen = train(20)
    assert [i for i, _ in capture.losses] == list(range(20))
    assert [v for _, v in capture.losses] == [float(torch.tensor(s, dtype=torch.float32)) for s in seen]


def test_a_cpu_runs_losses_are_kept_as_their_values_not_as_tensors_left_among_the_steps_blocks() -> None:
    # given a CPU loop under the steps collector, kept running (its losses held until the run's end)
    collector = StepsCollector()
    collector.start(Path("."))
    try:
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(5):
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        entries = collector.tracker.log.losses.entries
        # then each is a float, read at once: a scalar tensor kept for the run pinned glibc's heap under it, which
        # grew 3.3 MB a step on a small transformer whose logits came from the heap (benchmarks/README.md)
        assert len(entries) == 5 and all(type(loss) is float for _, loss, _ in entries)
    finally:
        collector.stop()


def test_a_step_of_accumulated_batches_has_their_mean_loss() -> None:
    capture, seen = train(6, accumulate=4)
    assert len(capture.losses) == 6
    for (_, value), expected in zip(capture.losses, seen):
        assert math.isclose(value, expected, rel_tol=1e-6)


def test_a_gradient_penaltys_autograd_grad_is_not_the_loss_where_the_step_calls_backward() -> None:
    capture, seen = train(5, penalty=True)
    assert [i for i, _ in capture.losses] == list(range(5))
    for (_, value), expected in zip(capture.losses, seen):
        assert math.isclose(value, expected, rel_tol=1e-6)


def test_a_loss_that_is_not_finite_is_kept_as_such_and_written_as_null() -> None:
    capture, _ = train(8, poison_at=5)
    assert math.isnan(dict(capture.losses)[5])
    record_loss = steps_fields(summarize_capture(capture), capture)["loss"]
    assert record_loss.index == tuple(range(8))
    assert math.isnan(record_loss.value[5])  # run.json writes it as null (record._to_plain)


def test_the_loss_log_keeps_every_step_then_every_second_fourth_as_it_fills() -> None:
    log = LossLog(capacity=8)
    for step in range(40):
        log.add(step, float(step))
    steps = [step for step, _, _ in log.entries]
    assert len(steps) <= 8
    assert steps == list(range(0, 40, log.stride))
    assert log.stride == 8


def test_one_steps_many_losses_stay_bounded() -> None:
    # an LBFGS closure calls backward() up to 20 times a step: the log must not grow without end
    log = LossLog(capacity=8)
    for _ in range(100):
        log.add(0, 1.0)
    assert len(log.entries) <= 8
