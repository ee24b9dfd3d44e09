"""An optimizer that calls its closure many times a step (LBFGS evaluates the model up to 25 times in one
``optimizer.step(closure)``): each ``optimizer.step()`` is one step, and the collectors that follow the steps hear
of those steps only, never of a closure's ``backward()``."""

from __future__ import annotations

from pathlib import Path

import torch

from gpuscope.collectors.steps import StepsCollector


def test_each_lbfgs_step_is_one_step_whatever_its_closure_calls(tmp_path: Path) -> None:
    # given: LBFGS, four passes of its closure (forward and backward) in each of six steps
    collector = StepsCollector()
    collector.start(tmp_path)
    heard: list[int] = []
    collector.add_step_listener(heard.append)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=4, tolerance_grad=0, tolerance_change=0)
    inputs, targets = torch.randn(16, 4), torch.randn(16, 1)
    passes = 0

    def closure() -> torch.Tensor:
        nonlocal passes
        passes += 1
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        return loss

    # when
    for _ in range(6):
        optimizer.step(closure)
    capture = collector.stop().payload
    # then: six steps, counted by the optimizer from the first, each with its passes' backward inside it
    assert passes >= 4 * 6
    assert (capture.source, capture.count) == ("optimizer", 6)
    assert collector.tracker.dropped == 0
    assert heard == [1, 2, 3, 4, 5, 6]
    assert all(record.phases_s["backward"] > 0 for record in capture.records)
