"""What gpuscope's live collectors ask of CUDA at each step of a training loop, counted on a CPU with CUDA stubbed
(``tests/cuda_stub.py``): on a GPU machine each of these calls costs the host microseconds (a timing event's record,
query and elapsed time 2-3 us each, an allocator reading 27 us: ``benchmarks/cuda_calls.py``), and on a loop of 2-3
ms steps a few dozen of them are percents of every step. The counts are the budget: a change that adds calls to the
hot path shows here."""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from cuda_stub import stubbed_cuda
from gpuscope.diagnose.gpu_step import own_cuda_cost
from gpuscope.diagnose.words import own_cost_text
from gpuscope.collect.collectors import CollectOptions, default_collectors
from gpuscope.record import RunRecord
from gpuscope.session import Session

STEPS = 400


def train(steps: int) -> None:
    """A training loop in the style of pytorch/examples: a DataLoader's batches, an MLP, Adam, no sync."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = iter(DataLoader(TensorDataset(torch.randn(8 * steps, 16), torch.randint(0, 4, (8 * steps,))),
                              batch_size=8))
    for _ in range(steps):
        x, y = next(batches)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def live_collectors() -> list:
    """Every live collector, their profiling windows off: what each step pays for the whole run."""
    options = CollectOptions(cprofile_steps=0, trace_steps=0, probes=False)
    return [c for c in default_collectors(options) if c.stage == "live"]


def gpuscopes_calls(steps: int = STEPS) -> tuple[Counter[str], RunRecord]:
    """The CUDA-side calls gpuscope adds to ``steps`` steps of the loop (those made under a session of every live
    collector less those the loop makes alone), and the run's record."""
    with stubbed_cuda() as alone:
        train(steps)
    with stubbed_cuda() as calls, tempfile.TemporaryDirectory() as run_dir:
        session = Session(Path(run_dir), ["train.py"], collectors=live_collectors())
        session.start()
        train(steps)
        record = session.stop(0)
    calls.subtract(alone)
    return +calls, record


def test_gpuscope_asks_little_of_cuda_at_each_step() -> None:
    # when: 400 steps of the loop run under every live collector
    calls, record = gpuscopes_calls()
    per_step = {name: count / STEPS for name, count in calls.items()}
    # then: each step is timed on the device with a marker at its end, and the eight phase changes of the first 32
    # steps and then of every 8th one are marked too, each marker recorded, checked for a capture, queried and timed
    phased = 32 + math.ceil((STEPS - 32) / 8)
    markers = (STEPS + 8 * phased) / STEPS
    for call in ("Event.record", "Event.query", "Event.elapsed_time", "torch.cuda.is_current_stream_capturing"):
        assert 1.0 < per_step[call] <= markers + 0.01, (call, per_step[call], markers)
    # and the allocator is read at each of the first 64 steps and every 8th after them
    assert per_step["torch.cuda.memory_stats_as_nested_dict"] <= (64 + (STEPS - 64) / 8 + 1) / STEPS
    # and NVTX ranges open and close with each step and its four phases
    assert per_step["nvtx.start_range"] <= 5.0 and per_step["nvtx.end_range"] <= 5.0
    # and nothing waits for the device during the run: one drain at its end
    assert calls["Event.synchronize"] <= 1 and calls["torch.cuda.synchronize"] == 0
    # and no other CUDA call is made as often as once every ten steps
    frequent = {name for name, n in calls.items() if n >= STEPS / 10}
    assert frequent <= {"Event.record", "Event.query", "Event.elapsed_time", "torch.cuda.is_current_stream_capturing",
                        "torch.cuda.memory_stats_as_nested_dict", "nvtx.start_range", "nvtx.end_range"}, frequent
    # and still every step is timed on the device, and the breakdown is the device's, from the phased steps
    assert record.device == "cuda" and record.steps.clock == "device"
    sample = record.steps.sample
    assert sum(d is None for d in sample.device_wall_s) <= 2  # the first (no timeline yet) and the last (open)
    assert record.steps.breakdown_basis == "device"
    # and the record states what those calls cost a step, from the run's own counts
    cost = own_cuda_cost(record)
    assert cost is not None
    assert cost.markers == pytest.approx(per_step["Event.record"], rel=0.01)
    assert cost.allocator_reads == pytest.approx(per_step["torch.cuda.memory_stats_as_nested_dict"], rel=0.02)
    assert cost.nvtx_ranges == pytest.approx(per_step["nvtx.start_range"], abs=0.02)
    assert "a step the host bounds includes them" in own_cost_text(cost, record.steps.median_s)
