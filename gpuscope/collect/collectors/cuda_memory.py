"""CUDA caching-allocator memory at step boundaries (each of the first steps', then every few steps'): allocated,
reserved, and the peak so far. Read from the allocator's host-side counters (no synchronisation), only once the
script has initialised CUDA, in one call of ``torch.cuda.memory_stats_as_nested_dict()`` a reading:
``memory_allocated()`` and its siblings each build and flatten every statistic of the allocator
(benchmarks/cuda_calls.py).

Observe only: the peak is never reset (``reset_peak_memory_stats`` would change what the script itself may
read), so per-step peaks are "peak so far".
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

from gpuscope.collect.collectors.memory import BoundedSeries
from gpuscope.collect.framework.base import CollectorResult, StepFollower, register
from gpuscope.record import CollectorStatus, CudaMemory

MAX_STEPS_KEPT = 2000
"""Readings kept; a longer run keeps every other one, and reads half as often, as needed."""
EVERY_STEP_HEAD = 64
"""Steps read one by one from the first; after them, every ``READ_EVERY``-th: a reading is a call into the allocator
of about 27 us on an H100 (``benchmarks/cuda_calls.py``), 1% of a 2-3 ms step if made at every one, while the
allocator's peak is its own counter, kept whether read or not."""
READ_EVERY = 8


class _Reading(NamedTuple):
    step: int
    allocated: int
    reserved: int
    peak: int


@register
class CudaMemoryCollector(StepFollower):
    """Allocator memory per step on CUDA runs."""

    name: ClassVar[str] = "cuda-memory"
    gpu_only: ClassVar[bool] = True  # on a CPU run its reason explains the report's Device section
    field: ClassVar[str | None] = "cuda_memory"

    def __init__(self, cuda: Any = None, max_steps: int = MAX_STEPS_KEPT) -> None:
        self._cuda = cuda  # torch.cuda (tests pass a fake)
        self._series: BoundedSeries[_Reading] = BoundedSeries(1.0, max_steps)  # interval in steps
        self._active = False
        self._error: str | None = None

    def unavailable_reason(self) -> str | None:
        return None


    def start(self, run_dir: object) -> None:
        pass

    def _on_step(self, index: int) -> int | None:
        """Step ``index`` begins: the allocator's counters now are those at the end of step ``index - 1``. Returns
        how many steps on to read them next (one by one at first, then ``READ_EVERY``, more once the readings
        kept have been thinned)."""
        if self._error is not None:
            self._unfollow()
            return None
        if index < 1:
            return None
        try:
            if not self._active:
                if not self._events.cuda_in_use():  # type: ignore[union-attr]
                    if not self._events.cuda_possible():  # type: ignore[union-attr]
                        self._unfollow()  # a torch without CUDA: nothing to wait for
                    return None
                if self._cuda is None:
                    import torch.cuda

                    self._cuda = torch.cuda
                self._active = True
            allocated, reserved = _allocator_counters(self._cuda)
            self._series.add(_Reading(index - 1, allocated["current"], reserved["current"], allocated["peak"]))
        except Exception as exc:
            self._error = f"CUDA memory could not be read: {exc}"
            return None
        every = 1 if index < EVERY_STEP_HEAD else READ_EVERY
        return every * int(self._series.interval_s)

    def stop(self) -> CollectorResult:
        if self._error is not None:
            return CollectorResult(CollectorStatus("failed", self._error))
        if not self._active:
            return CollectorResult(CollectorStatus("unavailable", "the script did not use CUDA"))
        readings = self._series.samples
        try:
            allocated, reserved = _allocator_counters(self._cuda)
            peak_allocated, peak_reserved = int(allocated["peak"]), int(reserved["peak"])
        except Exception as exc:
            return CollectorResult(CollectorStatus("failed", f"CUDA memory could not be read: {exc}"))
        return CollectorResult(CollectorStatus("ok"), CudaMemory(
            peak_allocated_bytes=peak_allocated,
            peak_reserved_bytes=peak_reserved,
            step=tuple(r.step for r in readings),
            allocated_bytes=tuple(r.allocated for r in readings),
            reserved_bytes=tuple(r.reserved for r in readings),
            peak_bytes=tuple(r.peak for r in readings),
        ))


def _allocator_counters(cuda: Any) -> tuple[dict[str, int], dict[str, int]]:
    """The allocator's allocated and reserved bytes over all its pools, each ``{"current": ..., "peak": ...}``."""
    stats = cuda.memory_stats_as_nested_dict()
    return stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
