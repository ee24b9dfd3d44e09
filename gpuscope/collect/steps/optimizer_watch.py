"""Steps counted by ``backward()`` or by DataLoader batches while an optimizer the script built has not stepped yet
are provisional: they are most likely the batches whose gradients the first ``optimizer.step()`` will take
(gradient accumulation, 16 or 32 batches an update in many fine-tuning scripts). The collectors that follow the
steps are not told of them: each profiling window would otherwise be placed, and spent, on single batches inside
the warm-up step (a loop accumulating 16 batches had its trace, Python profile and FLOP count each hold one batch:
"0.92 ms of torch ops in a 16.9 ms step"). Once the optimizer steps, its steps are counted from the first, and the
windows open on them.

An optimizer built and never stepped within ``HOLD_STEPS`` batches (one kept for a later phase) holds them no
longer: the steps counted so far are then dropped and counted again from there, so that the windows placed at the
first steps still open.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections.abc import Callable
from typing import Any

from gpuscope.collect.callsites import call_site, user_frame
from gpuscope.collect.framework.base import patch
from gpuscope.collect.steps.loops import LoopBook
from gpuscope.record import CallSite

HOLD_STEPS = 64
"""The most steps (``backward()`` calls or batches) the step events hold back for an optimizer built but not
stepped."""


class OptimizerWatch:
    """Sees optimizers built (``torch.optim.Optimizer.__init__``), and the user's line that built each. That one has
    stepped the tracker says itself: its steps are then the optimizer's, and where another takes over, a training
    loop may begin (``anchored``)."""

    def __init__(self) -> None:
        self.built = False
        self.sites: weakref.WeakKeyDictionary[Any, CallSite] = weakref.WeakKeyDictionary()
        self.loops = LoopBook()
        self._anchor: weakref.ref[Any] | None = None  # the optimizer ending the steps now
        self._holding = False  # some step was held back
        self._gave_up = False  # and no longer is
        self._same: dict[int, tuple[weakref.ref[Any], bool]] = {}  # id of an optimizer stepped -> it, and whether
        # it trains the anchor's parameters (the id may be a freed optimizer's)

    def anchored(self, optimizer: Any, step: int) -> None:
        """``optimizer`` has just begun to end the steps, ``step`` the first it ended: a loop begins where it trains
        other parameters than the one before (``LoopBook``)."""
        self._anchor = weakref.ref(optimizer)
        self._same.clear()
        try:
            site = self.sites.get(optimizer)
        except TypeError:  # unhashable
            site = None
        self.loops.anchored(optimizer, step, site)

    def anchor(self) -> Any:
        """The optimizer ending the steps now, while it is alive; None before any did."""
        return self._anchor() if self._anchor is not None else None

    def replaces_anchor(self, optimizer: Any) -> bool:
        """Whether ``optimizer`` ends the steps from its first step on, though another did until now: that one was
        freed, or ``optimizer`` trains the same parameters (the script builds its optimizer again each epoch)."""
        if self._anchor is None:
            return False
        anchor = self._anchor()
        if anchor is optimizer:
            return False
        if anchor is None:
            return True
        # worked out once per optimizer and anchor: a GAN's second optimizer steps at every step
        known = self._same.get(id(optimizer))
        if known is None or known[0]() is not optimizer:
            trains = frozenset(id(p) for group in optimizer.param_groups for p in group["params"])
            known = self._same[id(optimizer)] = (weakref.ref(optimizer), trains == self.loops.trains)
        return known[1]

    def stepped(self, optimizer_id: int | None) -> Any:
        """The optimizer of id ``optimizer_id`` that stepped since the anchor last changed, while it is alive (the
        steps may come to end at its step: ``StepTracker.optimizer_stepped``); None if none."""
        known = self._same.get(optimizer_id) if optimizer_id is not None else None
        return known[0]() if known is not None else None

    def install(self, torch: Any) -> Callable[[], None]:
        """Hook ``torch.optim``; returns the undo."""
        return patch(torch.optim.Optimizer, "__init__", self._wrap_init)

    def _wrap_init(self, original: Callable[..., None]) -> Callable[..., None]:
        watch = self

        @functools.wraps(original)
        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            watch.built = True
            original(optimizer, *args, **kwargs)
            with contextlib.suppress(TypeError):  # an optimizer class made unhashable: no line named
                watch.sites[optimizer] = call_site(user_frame(sys._getframe(1)))

        return __init__

    def holds(self, tracker: Any) -> bool:
        """Whether ``tracker`` (a ``StepTracker`` about to tell its listeners of a step) keeps it from them: a step
        ``backward()`` or a batch counted while an optimizer built has not stepped, up to ``HOLD_STEPS``. Past them,
        the steps counted so far are dropped, and the one beginning is step 0."""
        if tracker.source not in ("backward", "dataloader") or not self.built or self._gave_up:
            return False
        if tracker.log.count <= HOLD_STEPS:
            self._holding = True
            return True
        self._gave_up = True
        if self._holding:  # the optimizer never stepped: backward() or the batches define the steps after all
            tracker.dropped += tracker.log.count
            tracker.log.clear()
            if tracker.device is not None:
                tracker.device.reset()
        return False
