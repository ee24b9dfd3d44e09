"""The collector protocol: is it usable here, start, stop -> plain data. Collectors never raise into the run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
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


def patch(owner: Any, attr: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[[], None]:
    """Replace ``owner.attr`` with ``wrap(original)``, looking like the original (name, docstring, ``__wrapped__``);
    returns the undo."""
    original = getattr(owner, attr)
    replacement = wrap(original)
    replacement.__wrapped__ = original  # type: ignore[attr-defined]
    for name in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(replacement, name, getattr(original, name))
        except (AttributeError, TypeError):
            pass
    setattr(owner, attr, replacement)
    return lambda: setattr(owner, attr, original)
