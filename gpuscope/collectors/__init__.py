"""One module per source of measurements; ``default_collectors()`` lists those a run starts with."""

from __future__ import annotations

from gpuscope.collectors.base import Collector, CollectorResult


def default_collectors() -> list[Collector]:
    """Fresh instances of the collectors a run uses by default, in start order."""
    from gpuscope.collectors.steps import StepsCollector

    return [StepsCollector()]


__all__ = ["Collector", "CollectorResult", "default_collectors"]
