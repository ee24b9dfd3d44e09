"""The memory window's analysis walks only the events that hold tensors: the Python calls under which no op ran are
left out, and torch's memory profile over what is left is the one it builds over every event."""

from __future__ import annotations

import torch
from torch import nn
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import MemoryProfile, TensorKey

from gpuscope.collect.collectors import memory_window


def python_work(i: int) -> float:
    """A dataset's Python: many calls, no torch op."""
    return sum(float((i * j) % 7) for j in range(50))


def two_steps_profiled() -> profile:
    """Two steps of a small loop as the memory window records them: its batches made in Python, Adam, and gradients
    set to None (``zero_grad`` runs no op: only its call names the optimizer's tensors)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters())

    def step() -> None:
        x = torch.tensor([[python_work(i + j) for j in range(16)] for i in range(8)])
        optimizer.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        optimizer.step()

    step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
        step()
    return prof


def test_the_python_calls_without_ops_are_left_out_and_the_memory_profile_is_torchs_own() -> None:
    result = two_steps_profiled().profiler.kineto_results
    every = MemoryProfile(result)
    tree = memory_window._TorchOnly(result.experimental_event_tree(), _EventType)
    kept = memory_window._memory_profile(result, tree)
    # then most of the events (the dataset's Python) are left out
    assert tree.count < len(every._op_tree.sorted_nodes) / 3
    # and the timeline and each tensor's category are the same as over every event
    assert kept.timeline == every.timeline
    categories = {(key, version): (every._categories.get(key, version), kept._categories.get(key, version))
                  for _, _, (key, version), _ in every.timeline if isinstance(key, TensorKey)}
    assert all(a == b for a, b in categories.values())
    # among them the optimizer's state, named by the calls of zero_grad, which ran no op
    assert any(a is not None and a.name == "OPTIMIZER_STATE" for a, _ in categories.values())
    # torch's own class is left as it was
    from torch.profiler import _memory_profiler
    assert _memory_profiler.OpTree.__name__ == "OpTree"
