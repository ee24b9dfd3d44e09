"""One module per source of measurements. A collector is a class in this package decorated with ``@register``,
declaring its name, the record field it fills, its stage (live or post-run) and the steps it wants; the stage
(``session.py``) builds them with ``default_collectors`` and the scheduler places their windows."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

from gpuscope.collect.collectors import cprofile, long_steps, torch_trace
from gpuscope.collect.collectors.base import (
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
from gpuscope.collect.collectors.schedule import Plan, schedule


@dataclass(frozen=True, slots=True)
class CollectOptions:
    """What the user chose on the command line (or in ``gpuscope.profile()``); defaults are the collectors' own."""

    cprofile_steps: int | None = cprofile.DEFAULT_STEPS
    """Steps cProfile covers after the start-up; None: the whole run."""
    trace_steps: int = torch_trace.DEFAULT_ACTIVE
    """Steps torch.profiler records; 0: no torch.profiler."""
    trace_max_bytes: int = torch_trace.DEFAULT_MAX_BYTES
    probe_loader: bool = False
    """Time the slowest loader with several worker counts after the run even when data wait was under
    ``thresholds.DATA_WAIT_NOTABLE`` (it always runs above)."""
    probes: bool = True
    """Run the post-run probes (data probe, loader probe, calibration, the CPU's matmul peak), which run code
    after the script; False (``--no-probes``): a fast exit with the timings only."""
    skip_steps: int = 0
    """Steps before any window (``--skip-steps``): a learning-rate warm-up, a first epoch that fills caches. They
    are left out of the figures."""
    profile_steps: int | None = None
    """Steps measured after the skipped ones (``--profile-steps``), every window among them; then the collectors
    hand the record over and come out (None: they stay to the end of the run)."""
    memory_window: bool = True
    """Two steps under the memory timeline after the other windows; off where ``--profile-steps`` is too few to hold
    them beside the others and the steady steps."""


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
    return schedule(window_requests(collector_classes(), options), first=options.skip_steps)


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
    for collector in collectors:
        if isinstance(collector, long_steps.LongStepsCollector):  # it moves the others' windows
            collector.owners = [c for c in collectors if c is not collector and c.name in rank]
    return collectors


__all__ = ["CollectOptions", "Collector", "CollectorClass", "CollectorResult", "Follower", "LiveCollector", "Plan",
           "Probe", "ProbeInputs", "StepEvents", "StepSource", "collector_classes", "default_collectors",
           "plan_windows", "window_requests"]
