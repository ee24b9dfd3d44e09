"""Training loops run one after another: a script that trains a teacher and then distils a student from it, or
trains a head and then the whole network, steps one optimizer for a while and then another, over other parameters.
The step tracker knows which optimizer ends the steps (``StepTracker.optimizer_stepped``); this book notes where
that optimizer changes to one over parameters unlike its predecessor's, so that the analysis can keep each loop's
steps apart (a median over both describes neither, and a FLOP count made on one loop's step does not divide by the
other's time). An optimizer built again over the same parameters (each epoch, say) continues the loop, and so does one
taking over from parameters trained for fewer than ``MIN_LOOP_STEPS`` steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuscope.collect.captures import LoopStart
from gpuscope.record import CallSite

MAX_LOOPS = 256
"""Loops noted at most; in a script starting more (a new model each trial of a long search), the last one noted
holds the later ones' steps."""
MIN_LOOP_STEPS = 16
"""Parameters trained for fewer steps than this before an optimizer over others took over make no loop of their
own: the steps go on as one loop, described by the optimizer ending them now. A meta-learning loop builds an inner
optimizer over a copy of the model for each task and steps it a few times: each task is no training loop of its own
(its steps all do the same work), and a 5-step loop would leave the figures too few steps. The
knowledge-distillation tutorial's shortest loop, one epoch of its teacher on 2048 images, is 16 steps."""


class LoopBook:
    """The loops begun so far, each with the parameters its optimizer updates (by identity)."""

    def __init__(self) -> None:
        self._starts: list[LoopStart] = []
        self.trains: frozenset[int] = frozenset()
        """The ids of the parameters the optimizer ending the steps now trains."""
        self._since = 0  # the step from which the optimizers ending the steps have trained ``trains``

    def anchored(self, optimizer: Any, step: int, site: CallSite | None) -> None:
        """``optimizer`` has just begun to end the steps, the step ``step`` being the first it ended."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        trains = frozenset(id(p) for p in params)
        if self._starts and trains == self.trains:
            return
        start = LoopStart(first_step=step if self._starts else 0, optimizer=type(optimizer).__name__,
                          parameters=sum(int(p.numel()) for p in params), created_at=site)
        if self._starts and step - self._since < MIN_LOOP_STEPS:  # the parameters before were trained too briefly
            self._starts[-1] = dataclasses.replace(start, first_step=self._starts[-1].first_step)
        elif len(self._starts) < MAX_LOOPS:
            self._starts.append(start)
        self.trains, self._since = trains, step

    def begun(self) -> int:
        """Loops begun so far (at least 1)."""
        return max(1, len(self._starts))

    def starts(self) -> tuple[LoopStart, ...]:
        """Where each loop began; empty where the run had one loop (or none)."""
        return tuple(self._starts) if len(self._starts) > 1 else ()
