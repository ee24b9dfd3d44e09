"""The CUDA-only collectors, driven through a real step tracker with fake CUDA and NVTX modules: they stay idle
until the script initialises CUDA, then follow every step and phase."""

from __future__ import annotations

from typing import Any

from gpuscope.collect.collectors.cuda_memory import CudaMemoryCollector
from gpuscope.collect.collectors.nvtx import NvtxCollector
from gpuscope.collect.steps.steplog import StepTracker


class FakeSteps:
    """The part of the steps collector that windowed collectors use, over a real tracker."""

    def __init__(self) -> None:
        self.tracker = StepTracker(now=0.0)
        self.cuda = False
        self.cuda_built = True  # False: torch's CPU-only build

    def add_step_listener(self, listener: Any) -> None:
        self.tracker.listeners.append(listener)

    def remove_step_listener(self, listener: Any) -> None:
        self.tracker.schedule.remove(listener)

    def add_phase_listener(self, listener: Any) -> None:
        self.tracker.phase_listeners.append(listener)

    def cuda_in_use(self) -> bool:
        return self.cuda

    def cuda_possible(self) -> bool:
        return self.cuda_built

    def train_step(self, t: float) -> None:
        self.tracker.enter("forward", t + 0.1)
        self.tracker.exit("forward", t + 0.2)
        self.tracker.enter("optimizer", t + 0.8)
        self.tracker.exit("optimizer", t + 0.9)
        self.tracker.optimizer_stepped(1, t + 1.0)


class FakeNvtx:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.open: dict[int, str] = {}

    def start_range(self, message: str, domain: str) -> int:
        assert domain == "gpuscope"
        handle = len(self.log)
        self.log.append(f"+{message}")
        self.open[handle] = message
        return handle

    def end_range(self, handle: int) -> None:
        self.log.append(f"-{self.open.pop(handle)}")


class FakeCuda:
    def __init__(self) -> None:
        self.allocated = 0

    def memory_stats_as_nested_dict(self) -> dict[str, Any]:
        """The shape of torch's: each statistic by pool ("all", "large_pool", "small_pool"), then by counter."""
        return {
            "allocated_bytes": {"all": {"current": self.allocated, "peak": self.allocated + 100}},
            "reserved_bytes": {"all": {"current": 2 * self.allocated, "peak": 2 * self.allocated + 100}},
            "num_alloc_retries": 0,
        }


def test_nvtx_ranges_mark_steps_and_phases_once_cuda_is_in_use() -> None:
    # given a CPU step, then CUDA initialised by the script
    steps, nvtx = FakeSteps(), FakeNvtx()
    collector = NvtxCollector(nvtx)
    assert collector.unavailable_reason() is None
    collector.follow(steps)
    steps.train_step(0.0)
    assert nvtx.log == []
    steps.cuda = True
    # when two more steps run
    steps.train_step(1.0)
    steps.train_step(2.0)
    result = collector.stop()
    # then from the first step that begins with CUDA up, each step and each phase is a range, and every range
    # is closed at the end
    assert result.status.status == "ok"
    assert nvtx.log == [
        "+step 2", "+forward", "-forward", "+optimizer", "-optimizer", "-step 2", "+step 3", "-step 3",
    ]
    assert nvtx.open == {}


def test_nvtx_is_unavailable_when_the_script_never_used_cuda() -> None:
    steps = FakeSteps()
    collector = NvtxCollector(FakeNvtx())
    collector.follow(steps)
    steps.train_step(0.0)
    result = collector.stop()
    assert (result.status.status, result.status.reason) == ("unavailable", "the script did not use CUDA")


def test_on_a_torch_without_cuda_both_collectors_leave_the_steps_at_once() -> None:
    # given torch's CPU-only build: CUDA can never come up, and each collector following the steps costs every step
    steps = FakeSteps()
    steps.cuda_built = False
    collectors = [NvtxCollector(FakeNvtx()), CudaMemoryCollector(FakeCuda())]
    for collector in collectors:
        collector.follow(steps)
    # when steps run
    for i in range(3):
        steps.train_step(float(i))
    # then neither follows them any more, and each says why it has nothing
    assert steps.tracker.listeners == []
    for collector in collectors:
        result = collector.stop()
        assert (result.status.status, result.status.reason) == ("unavailable", "the script did not use CUDA")


def test_cuda_memory_is_read_at_each_of_the_first_steps_then_every_eighth() -> None:
    # given a long run: a reading is a call into the allocator, 27 us on an H100
    steps, cuda = FakeSteps(), FakeCuda()
    collector = CudaMemoryCollector(cuda)
    collector.follow(steps)
    steps.cuda = True
    for i in range(200):
        steps.train_step(float(i))
    memory = collector.stop().payload
    assert memory is not None
    # then each of the first 64 steps is read, and after them every 8th step
    assert list(memory.step[:64]) == list(range(64))
    assert all(b - a == 8 for a, b in zip(memory.step[63:], memory.step[64:]))
    assert memory.step[-1] >= 199 - 8


def test_cuda_memory_is_read_at_each_step_end_and_bounded() -> None:
    steps, cuda = FakeSteps(), FakeCuda()
    collector = CudaMemoryCollector(cuda, max_steps=8)
    collector.follow(steps)
    steps.cuda = True
    for i in range(40):
        cuda.allocated = 1000 * (i + 1)
        steps.train_step(float(i))
    memory = collector.stop().payload
    assert memory is not None
    assert len(memory.step) <= 8
    assert memory.step[0] == 0 and memory.allocated_bytes[0] == 1000
    assert all(a == 1000 * (s + 1) for s, a in zip(memory.step, memory.allocated_bytes))
    assert memory.reserved_bytes[0] == 2000
    assert memory.peak_allocated_bytes == 40_100
