"""What gpuscope's hooks cost each step of a real training loop, measured directly rather than by comparing runs.

The manual-SGD language model sample's loop (``sample_workloads/manual_sgd_language_model.py``, tiny model, about
1.7 ms a step on the project's 2-core machine, no optimizer: each ``backward()`` ends a step) times, each step, the
call of the model and of ``loss.backward()`` from outside, and the model's own ``forward`` and the autograd engine
from inside. What is left is the Python around them: torch's module call and ``Tensor.backward``, and under
gpuscope its forward wrapper and the backward wrapper that ends the step (and runs every step listener). Run it under
both and subtract:

    python benchmarks/hook_time.py
    gpuscope run -q --no-probes -o /tmp/hook-time benchmarks/hook_time.py

A whole run's step time swings by tens of percent from one run to the next on a shared machine (``overhead.py``);
the time around the calls, a median over 1,500 steps, moves by a few microseconds. Take the smallest of a few runs
of each: on 2026-11-25, 39 us under python and 86 us under gpuscope, so its hooks cost 47 us of a 1.7 ms step
(2.7%), about 15 us around the forward and 32 us around the backward.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from pathlib import Path

import torch
import torch.autograd

STEPS, SETTLE = 1500, 50
clock = time.perf_counter


def load_sample() -> object:
    path = Path(__file__).resolve().parent.parent / "sample_workloads" / "manual_sgd_language_model.py"
    spec = importlib.util.spec_from_file_location("manual_sgd_language_model", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def main() -> None:
    sample = load_sample()
    torch.manual_seed(0)
    model = sample.RNNModel(200, 16, 16, nlayers=2)  # type: ignore[attr-defined]
    data = sample.batchify(torch.randint(200, (200_000,)), 4)  # type: ignore[attr-defined]
    criterion, hidden, i = torch.nn.NLLLoss(), model.init_hidden(4), 0

    inside = {"forward": 0.0, "backward": 0.0}  # this step's time inside the model's forward and the engine
    own_forward, run_backward = model.forward, torch.autograd._engine_run_backward

    def forward(*args: object) -> object:
        started = clock()
        try:
            return own_forward(*args)
        finally:
            inside["forward"] += clock() - started

    def engine(*args: object, **kwargs: object) -> object:
        started = clock()
        try:
            return run_backward(*args, **kwargs)
        finally:
            inside["backward"] += clock() - started

    model.forward = forward  # type: ignore[method-assign]
    torch.autograd._engine_run_backward = engine  # what torch.autograd.backward calls
    around: dict[str, list[float]] = {"forward": [], "backward": []}
    steps, last = [], clock()
    for _ in range(STEPS):
        if i >= data.size(0) - 2:
            i, hidden = 0, model.init_hidden(4)
        batch, targets = sample.get_batch(data, i, 8)  # type: ignore[attr-defined]
        hidden = hidden.detach()
        model.zero_grad()
        inside["forward"] = inside["backward"] = 0.0
        started = clock()
        output, hidden = model(batch, hidden)
        around["forward"].append(clock() - started - inside["forward"])
        loss = criterion(torch.log_softmax(output, dim=-1), targets)
        started = clock()
        loss.backward()
        around["backward"].append(clock() - started - inside["backward"])
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-20.0)
        i += 8
        now = clock()
        steps.append(now - last)
        last = now
    forward_us, backward_us = (statistics.median(around[k][SETTLE:]) * 1e6 for k in ("forward", "backward"))
    print(f"around the forward {forward_us:.1f} us, around the backward {backward_us:.1f} us, "
          f"in all {forward_us + backward_us:.1f} us; median step {statistics.median(steps[SETTLE:]) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
