"""Training loops run one after another: a script that trains a teacher and then distils a student from it, or
trains a head and then the whole network, steps one optimizer for a while and then another, over other parameters.
The step tracker knows which optimizer ends the steps (``StepTracker.optimizer_stepped``); this book notes where
that optimizer changes to one over parameters unlike its predecessor's, so that the analysis can keep each loop's
steps apart (a median over both describes neither, and a FLOP count made on one loop's step does not divide by the
other's time). An optimizer built again over the same parameters (each epoch, say) continues the loop.
"""

from __future__ import annotations

from typing import Any

from gpuscope.captures import LoopStart
from gpuscope.record import CallSite

MAX_LOOPS = 256
"""Loops noted at most; in a script starting more (a new model each trial of a long search), the last one noted
holds the later ones' steps."""


class LoopBook:
    """The loops begun so far, each with the parameters its optimizer updates (by identity)."""

    def __init__(self) -> None:
        self._starts: list[LoopStart] = []
        self._trains: frozenset[int] = frozenset()

    def anchored(self, optimizer: Any, step: int, site: CallSite | None) -> None:
        """``optimizer`` has just begun to end the steps, the step ``step`` being the first it ended."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        trains = frozenset(id(p) for p in params)
        if (self._starts and trains == self._trains) or len(self._starts) >= MAX_LOOPS:
            return
        self._trains = trains
        if self._starts and step <= self._starts[-1].first_step:  # no step ended since that one began (explicit steps)
            self._starts.pop()
        self._starts.append(LoopStart(first_step=step if self._starts else 0, optimizer=type(optimizer).__name__,
                                      parameters=sum(int(p.numel()) for p in params), created_at=site))

    def starts(self) -> tuple[LoopStart, ...]:
        """Where each loop began; empty where the run had one loop (or none)."""
        return tuple(self._starts) if len(self._starts) > 1 else ()
