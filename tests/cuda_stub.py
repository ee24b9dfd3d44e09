"""A stand-in for CUDA on a machine without a GPU: every function of ``torch.cuda`` (and NVTX's ranges, and the
timing events) counted, those gpuscope's hot path needs answering as a CUDA run's would. A CPU loop run under it,
with and without gpuscope, tells which CUDA-side calls gpuscope adds to each step (``tests/unit/
test_cuda_hot_path.py``; ``benchmarks/cuda_hot_path.py`` prices them with a GPU machine's per-call times)."""

from __future__ import annotations

import contextlib
import inspect
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch

ANSWERS: dict[str, Any] = {
    "is_available": True,
    "is_initialized": True,
    "is_current_stream_capturing": False,
    "device_count": 1,
    "current_device": 0,
    "synchronize": None,
    "get_device_name": "NVIDIA H200",
    "get_device_capability": (9, 0),
}
"""What the stubbed ``torch.cuda`` functions return (the others are counted and called through)."""
ALLOCATOR = {"allocated_bytes": {"all": {"current": 1 << 30, "peak": 2 << 30}},
             "reserved_bytes": {"all": {"current": 3 << 30, "peak": 3 << 30}}}


class FakeEvent:
    """A CUDA timing event the device passes as it is recorded: device time is the host's."""

    calls: Counter[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.calls["Event()"] += 1
        self.at = 0.0

    def record(self, *args: Any) -> None:
        self.calls["Event.record"] += 1
        self.at = time.perf_counter()

    def query(self) -> bool:
        self.calls["Event.query"] += 1
        return True

    def elapsed_time(self, end: FakeEvent) -> float:
        self.calls["Event.elapsed_time"] += 1
        return (end.at - self.at) * 1e3

    def synchronize(self) -> None:
        self.calls["Event.synchronize"] += 1


@contextlib.contextmanager
def stubbed_cuda() -> Iterator[Counter[str]]:
    """Inside: ``torch.cuda`` answers as on a CUDA machine with CUDA initialised, and every call of its functions,
    of the timing events and of NVTX's ranges is counted in the counter yielded (by name)."""
    import nvtx

    calls: Counter[str] = Counter()
    saved: list[tuple[Any, str, Any]] = []

    def replace(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def counted(name: str, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[f"torch.cuda.{name}"] += 1
            if name == "memory_stats_as_nested_dict":
                return ALLOCATOR
            if name in ANSWERS:
                return ANSWERS[name]
            return original(*args, **kwargs)
        return call

    for name, value in list(vars(torch.cuda).items()):
        if not name.startswith("_") and (inspect.isfunction(value) or inspect.isbuiltin(value)):
            replace(torch.cuda, name, counted(name, value))
    event = type("FakeEvent", (FakeEvent,), {"calls": calls})
    replace(torch, "Event", event)
    replace(torch.cuda, "Event", event)
    replace(torch.version, "cuda", "12.8")
    def nvtx_call(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> object:
            calls[f"nvtx.{name}"] += 1
            return name  # a range's handle
        return call

    for name in ("start_range", "end_range", "push_range", "pop_range", "mark"):
        replace(nvtx, name, nvtx_call(name))
    try:
        yield calls
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
