"""The collector protocol: is it usable here, start, stop -> plain data. Collectors never raise into the run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from gpuscope.record import CollectorStatus


@dataclass(frozen=True, slots=True)
class CollectorResult:
    """What a collector hands back: its status and a small typed payload of numbers (no live objects)."""

    status: CollectorStatus
    payload: object | None = None


class Collector(Protocol):
    """One source of measurements. ``start`` and ``stop`` are called once each, around the user's code."""

    name: ClassVar[str]

    def unavailable_reason(self) -> str | None:
        """None when the collector can run here, else why it cannot (a missing driver, say)."""
        ...

    def start(self, run_dir: Path) -> None:
        """Begin collecting; artifacts go into ``run_dir``."""
        ...

    def stop(self) -> CollectorResult:
        """Stop, undo every hook, and return what was collected."""
        ...


class StepFollower:
    """Base of collectors that follow the run's steps: ``bind_steps`` (called by the session before ``start``)
    registers ``_on_step``, called with each step's index as it begins."""

    _steps_collector: Any = None

    def bind_steps(self, steps_collector: Any) -> None:
        """Follow ``steps_collector``'s steps (a ``StepsCollector``)."""
        self._steps_collector = steps_collector
        steps_collector.add_step_listener(self._on_step)

    def _on_step(self, index: int) -> None:
        raise NotImplementedError
