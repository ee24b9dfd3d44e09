"""NVTX ranges for each step and its phases, so ``nsys profile gpuscope run train.py`` shows them on the
timeline (domain "gpuscope"). Only once the script has initialised CUDA; a no-op otherwise.

NVTX calls cost little (a function-pointer call until a tool such as Nsight Systems injects itself), so the
ranges are on by default; start/end ranges rather than push/pop, because a step's phases do not nest in it
strictly (a DataLoader wait can begin one step and the optimizer end the previous one).
"""

from __future__ import annotations

import importlib.util
from typing import Any, ClassVar

from gpuscope.collect.framework.base import CollectorResult, StepFollower, register
from gpuscope.record import CollectorStatus

DOMAIN = "gpuscope"


@register
class NvtxCollector(StepFollower):
    """Emits NVTX ranges ``step N`` and ``data_wait`` / ``forward`` / ``backward`` / ``optimizer``."""

    name: ClassVar[str] = "nvtx"
    gpu_only: ClassVar[bool] = True  # on a CPU run its reason explains the report's Device section
    field: ClassVar[str | None] = None

    def __init__(self, nvtx: Any = None) -> None:
        self._nvtx = nvtx  # the nvtx module (tests pass a fake)
        self._active = False
        self._step_range: Any = None
        self._phase_range: Any = None
        self.ranges = 0
        self._error: str | None = None

    def unavailable_reason(self) -> str | None:
        # imported once CUDA is in use (the package imports NumPy: a tenth of a second of every CPU run's start-up)
        if self._nvtx is None and importlib.util.find_spec("nvtx") is None:
            return "the nvtx package is not installed"
        return None


    def start(self, run_dir: object) -> None:
        pass

    def _on_step(self, index: int) -> None:
        if self._error is not None:
            self._unfollow()
            return
        try:
            if not self._active:
                if not self._events.cuda_in_use():  # type: ignore[union-attr]
                    if not self._events.cuda_possible():  # type: ignore[union-attr]
                        self._unfollow()  # a torch without CUDA: nothing to wait for
                    return
                if self._nvtx is None:
                    import nvtx

                    self._nvtx = nvtx
                self._active = True
                self._events.add_phase_listener(self._on_phase)  # type: ignore[union-attr]
            self._end(self._step_range)
            self._step_range = self._begin(f"step {index}")
        except Exception as exc:
            self._error = f"NVTX failed: {exc}"

    def _on_phase(self, phase: str) -> None:
        if self._error is not None:
            return
        try:
            self._end(self._phase_range)
            self._phase_range = self._begin(phase) if phase != "other" else None
        except Exception as exc:
            self._error = f"NVTX failed: {exc}"

    def _begin(self, message: str) -> Any:
        self.ranges += 1
        return self._nvtx.start_range(message=message, domain=DOMAIN)

    def _end(self, handle: Any) -> None:
        if handle is not None:
            self._nvtx.end_range(handle)

    def stop(self) -> CollectorResult:
        if self._active and self._error is None:
            try:
                self._end(self._phase_range)
                self._end(self._step_range)
            except Exception as exc:
                self._error = f"NVTX failed: {exc}"
        if self._error is not None:
            return CollectorResult(CollectorStatus("failed", self._error))
        if not self._active:
            return CollectorResult(CollectorStatus("unavailable", "the script did not use CUDA"))
        return CollectorResult(CollectorStatus("ok"))
