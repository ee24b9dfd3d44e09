"""One module per source of measurements. A collector is a class in this package decorated with ``@register``,
declaring its name, the record field it fills, its stage (live or post-run) and the steps it wants; the stage
(``session.py``) builds them with ``default_collectors`` and the scheduler places their windows."""

from __future__ import annotations

import importlib
import pkgutil

from gpuscope.collect.collectors import long_steps
from gpuscope.collect.framework.base import (
    REGISTRY,
    Collector,
    CollectorClass,
    CollectorResult,
    Follower,
    LiveCollector,
    Probe,
    ProbeInputs,
    StepEvents,
    StepSource,
    WindowRequest,
)
from gpuscope.collect.framework.options import CollectOptions
from gpuscope.collect.framework.schedule import Plan, compact_plan, schedule


def collector_classes() -> list[CollectorClass]:
    """Every registered collector class (importing each module of this package once), by name."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return sorted(REGISTRY, key=lambda cls: cls.name)


def window_requests(classes: list[CollectorClass], options: CollectOptions) -> list[tuple[str, WindowRequest | None]]:
    """Each class's window request, in window order: a window follows the one it names in ``after``."""
    wanted = {cls.name: cls.wants(options) for cls in classes}
    ordered: list[tuple[str, WindowRequest | None]] = []
    placed: set[str | None] = {None, *(name for name, request in wanted.items() if request is None)}
    pending = [name for name in wanted if wanted[name] is not None]
    while pending:
        ready = [n for n in pending if wanted[n].after in placed or wanted[n].after not in wanted]  # type: ignore[union-attr]
        if not ready:
            raise ValueError(f"windows that follow each other in a circle: {', '.join(pending)}")
        for name in ready:
            ordered.append((name, wanted[name]))
            placed.add(name)
            pending.remove(name)
    return ordered


def plan_windows(options: CollectOptions) -> Plan:
    """Where each collector's window lies for a run with ``options``."""
    requests = window_requests(collector_classes(), options)
    if options.compact_windows:
        return compact_plan(requests, first=options.skip_steps)
    return schedule(requests, first=options.skip_steps)


def default_collectors(options: CollectOptions | None = None) -> list[LiveCollector | Probe]:
    """Fresh instances of the collectors a run uses, in start order: the source of the steps (the steps
    collector), the window owners in window order, the other live collectors, then the post-run probes."""
    options = options or CollectOptions()
    classes = collector_classes()
    requests = window_requests(classes, options)
    plan = schedule(requests, first=options.skip_steps)
    rank = {name: i for i, (name, _) in enumerate(requests)}
    live = sorted((c for c in classes if c.stage == "live"),
                  key=lambda c: (not c.provides_steps, not getattr(c, "before_windows", False),
                                 rank.get(c.name, len(rank)), c.name))
    probes = [c for c in classes if c.stage == "post-run"]
    collectors = [cls.create(options, plan) for cls in (*live, *probes)]
    owners = [c for c in collectors if c.name in rank]
    for collector in collectors:
        if isinstance(collector, long_steps.LongStepsCollector):  # it moves the others' windows
            collector.owners = owners
    if options.compact_windows:  # one step each from the start, as for long steps (the same moves)
        compact = compact_plan(requests, first=options.skip_steps)
        for owner in owners:
            owner.move_window(compact.window(owner.name), compact.window(owner.name, cuda=True))
    return collectors


__all__ = ["CollectOptions", "Collector", "CollectorClass", "CollectorResult", "Follower", "LiveCollector", "Plan",
           "Probe", "ProbeInputs", "StepEvents", "StepSource", "collector_classes", "default_collectors",
           "plan_windows", "window_requests"]
