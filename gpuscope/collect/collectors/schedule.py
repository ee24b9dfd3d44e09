"""Which steps each profiler owns: one pure function, ``schedule``, places the windows the collectors ask for one
after another, so no two profilers ever run in the same step (each would distort what the other measures), like
``torch.profiler.schedule`` but for all of gpuscope's profilers at once.

Windows are placed in the order of the requests, each after the previous one (and its ``gap`` of clean steps), none
on step 0 but one that covers the start-up (cProfile's). ``first`` (``--skip-steps``) moves them all past the steps
before it, the start-up one too.
A CUDA-only window (the sync count) is placed on CUDA runs only: the plan holds one placement per kind of run, and
a collector reads its own when it knows which kind of run it is in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuscope.collect.collectors.base import WindowRequest

FIRST_STEADY_STEP = 1
"""Step 0 pays for lazy initialisation and is always left out: no window but a start-up one is placed on it."""


@dataclass(frozen=True, slots=True)
class Window:
    """Steps ``start`` to ``start + steps - 1``, owned by one collector."""

    start: int
    steps: int

    @property
    def stop(self) -> int:
        """The first step after the window."""
        return self.start + self.steps


@dataclass(frozen=True, slots=True)
class Plan:
    """The windows of a run, by collector name, on a CPU run and on a CUDA run."""

    cpu: dict[str, Window] = field(default_factory=dict)
    cuda: dict[str, Window] = field(default_factory=dict)

    def window(self, name: str, cuda: bool = False) -> Window | None:
        """``name``'s window on that kind of run (None: it has none there)."""
        return (self.cuda if cuda else self.cpu).get(name)

    def start(self, name: str, cuda: bool = False) -> int | None:
        """The first step of ``name``'s window on that kind of run (None: it has none there)."""
        window = self.window(name, cuda)
        return window.start if window is not None else None

    def end(self, cuda: bool = False) -> int:
        """The first step after every window on that kind of run (0: no window)."""
        return max((w.stop for w in (self.cuda if cuda else self.cpu).values()), default=0)

    def overlaps(self) -> list[tuple[str, str]]:
        """Pairs of windows that share a step (none, by construction: the tests hold it to that)."""
        found = []
        for placed in (self.cpu, self.cuda):
            items = sorted(placed.items(), key=lambda kv: kv[1].start)
            for (a, wa), (b, wb) in zip(items, items[1:]):
                if wb.start < wa.stop and wa.steps and wb.steps:
                    found.append((a, b))
        return found


def schedule(requests: Sequence[tuple[str, WindowRequest | None]], first: int = 0) -> Plan:
    """Place each ``(name, request)`` after the ones before it, none before step ``first``. A None request, or one
    of zero steps, is not placed and reserves no step."""
    plan = Plan()
    for cuda, placed in ((False, plan.cpu), (True, plan.cuda)):
        cursor = first
        for name, request in requests:
            if request is None or request.steps <= 0 or (request.cuda_only and not cuda):
                continue
            floor = first if first > 0 else 0 if request.startup else FIRST_STEADY_STEP
            start = max(cursor + request.gap, floor)
            placed[name] = Window(start, request.steps)
            cursor = start + request.steps
    return plan
