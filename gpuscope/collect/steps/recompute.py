"""Activation checkpointing (``torch.utils.checkpoint``): each checkpointed call's forward runs again in backward,
and that recomputation is the price of the memory it saves. Both of torch's implementations are followed through the
module's own names, which ``checkpoint`` looks up at every call (a ``checkpoint`` bound before gpuscope started, as
transformers binds it, goes through them too): the non-reentrant one's recomputation is the function its generator
is given, the reentrant one's every call of the function after the first. Each recomputation is timed by the step
it ran in (on the loop's thread: a CPU run's backward runs there; a CUDA run's on autograd's device threads, where it
is counted, not timed), with the line that checkpointed."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from gpuscope.collect.callsites import SITE_CALLS, SiteCounter, calling_library, user_frame
from gpuscope.collect.steps.tally import StepTally
from gpuscope.record import Checkpointing


class Recompute:
    """Checkpointed calls and their recomputations, step by step."""

    def __init__(self, clock: Callable[[], float], step: Callable[[], int | None]) -> None:
        self._clock, self._step = clock, step  # step: the open step's index, None off the loop's thread
        self.calls = 0  # checkpointed calls (forward)
        self.recomputed = 0  # their recomputations, on any thread
        self.reentrant = False
        self.tally = StepTally()  # seconds recomputing and checkpointed calls, by step
        self.sites = SiteCounter()
        self.library = ""

    def install(self, checkpoint_module: Any) -> Callable[[], None]:
        """Follow ``torch.utils.checkpoint``'s two implementations; the undo (nothing where this torch has neither)."""
        undo: list[Callable[[], None]] = []
        generator = getattr(checkpoint_module, "_checkpoint_without_reentrant_generator", None)
        if callable(generator):
            def without_reentrant(fn: Any, *args: Any, **kwargs: Any) -> Any:
                self._checkpointed(reentrant=False)
                return generator(self._recomputing(fn), *args, **kwargs)

            undo.append(_set(checkpoint_module, "_checkpoint_without_reentrant_generator", without_reentrant))
        function = getattr(checkpoint_module, "CheckpointFunction", None)
        if function is not None and callable(getattr(function, "apply", None)):
            undo.append(_set(checkpoint_module, "CheckpointFunction", _Reentrant(function, self)))

        def remove() -> None:
            for step in reversed(undo):
                step()

        return remove

    def _checkpointed(self, reentrant: bool) -> None:
        """A checkpointed call begins (its forward, once)."""
        self.calls += 1
        self.reentrant |= reentrant
        if self.calls <= SITE_CALLS:
            frame = sys._getframe(2)
            self.sites.count(user_frame(frame))
            self.library = self.library or calling_library(frame, outermost=True)
        if (step := self._step()) is not None:
            self.tally.add(step, 0.0, 1)

    def _recomputing(self, fn: Any) -> Callable[..., Any]:
        """``fn``, whose every call is a recomputation, timed."""
        def recompute(*args: Any, **kwargs: Any) -> Any:
            self.recomputed += 1
            step = self._step()
            if step is None:  # autograd's device thread (CUDA): counted only
                return fn(*args, **kwargs)
            started = self._clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.tally.add(step, self._clock() - started, 0)

        return recompute

    def record(self) -> tuple[Checkpointing, dict[int, tuple[float, int]], int] | None:
        """What was checkpointed, with the seconds recomputing and checkpointed calls by step index and the step from
        which none were kept (-1: none dropped); the summary reads them over the steady steps. None without any."""
        if not self.calls:
            return None
        sites = self.sites.sites(limit=1)
        return (Checkpointing(calls=self.calls, recomputed=self.recomputed, reentrant=self.reentrant,
                              called_at=sites[0] if sites and sites[0].file else None, called_by=self.library),
                self.tally.figures(), self.tally.kept_to)


class _Reentrant:
    """Stands for ``CheckpointFunction`` where ``checkpoint`` looks it up: its ``apply`` gets the function wrapped
    so that each call after the first (which is the forward's) is a timed recomputation."""

    def __init__(self, function: Any, recompute: Recompute) -> None:
        self._function, self._recompute = function, recompute

    def __getattr__(self, name: str) -> Any:
        return getattr(self._function, name)

    def apply(self, fn: Any, *args: Any) -> Any:
        self._recompute._checkpointed(reentrant=True)
        timed = self._recompute._recomputing(fn)
        first = [True]

        def once_then_timed(*inner: Any, **kwargs: Any) -> Any:
            if first[0]:
                first[0] = False
                return fn(*inner, **kwargs)
            return timed(*inner, **kwargs)

        return self._function.apply(once_then_timed, *args)


def _set(module: Any, name: str, value: Any) -> Callable[[], None]:
    original = getattr(module, name)
    setattr(module, name, value)
    return lambda: setattr(module, name, original)
