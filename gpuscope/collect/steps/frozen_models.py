"""Models the optimizers do not train whose forward runs in the steps: a distillation's teacher, a frozen encoder
(a latent diffusion's VAE and text encoder), a perceptual loss's network. Their work is the step's, outside the
trained model's forward and backward, and often most of it; found with the roots (``forward_modules``) and timed
the same way, through their class's wrapped ``__call__``: each call on the loop's thread, by the step it ran in, and
the user's line that made it."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuscope.collect.callsites import SITE_CALLS, SiteCounter, user_frame
from gpuscope.collect.steps.tally import StepTally
from gpuscope.record import FrozenModel

if TYPE_CHECKING:
    from gpuscope.collect.steps.loaders import LoaderBook

MAX_FROZEN = 8
"""Frozen models timed at most, the largest first (an EMA copy of the model, which no step calls, takes a place)."""


class _Frozen:
    """One frozen model's calls so far."""

    __slots__ = ("name", "parameters", "ref", "calls", "tally", "since", "with_gradients", "training", "sites",
                 "depth", "fed", "fixed")

    def __init__(self, module: Any, since: int) -> None:
        self.name = type(module).__name__
        self.parameters = sum(p.numel() for p in module.parameters())
        self.ref = weakref.ref(module)
        self.calls = 0
        self.tally = StepTally()  # its seconds and calls by step
        self.since = since  # the step it was found in: its calls are kept from then on
        self.with_gradients = self.training = False  # any call so
        self.sites = SiteCounter()
        self.depth = 0  # calls of it running now (a model calling itself)
        self.fed = self.fixed = 0  # calls given a tensor of the last DataLoader batch; of those, one of fixed items


def _fed(refs: tuple[Any, ...], values: tuple[Any, ...]) -> bool:
    """Whether the tensors among ``values`` (at least one) are all tensors of the batch (``refs``, weakly): the
    model's outputs depend on the batch alone (a perceptual loss given the reconstruction beside it does not)."""
    batch = [ref() for ref in refs]
    tensors = [v for v in values if getattr(v, "shape", None) is not None and getattr(v, "dtype", None) is not None]
    return bool(tensors) and all(any(t is b for b in batch) for t in tensors)


class FrozenModels:
    """The frozen models found, by id, and their calls' timing (``call``, from the wrapped ``__call__``), step by
    step: the summary reads them over the steady steps, as it reads the phases."""

    def __init__(self, clock: Callable[[], float], step: Callable[[], int | None],
                 loaders: LoaderBook | None = None) -> None:
        self._clock, self._step = clock, step  # step: the open step's index, None off the loop's thread
        self._loaders = loaders  # whose ``last_batch`` tells whether a call was given the batch as loaded
        self.timed: dict[int, _Frozen] = {}
        """The frozen models timed, by id (read by the wrapped ``__call__`` on every call of their classes)."""

    @staticmethod
    def candidates(modules: list[Any], roots: list[Any], holds_trained: Callable[[Any], bool]) -> list[Any]:
        """Of ``modules``, the outermost that hold parameters, none of them trained, outside every root (a frozen
        part of the trained model runs in its forward, and is timed there): the largest first."""
        inside = {id(c) for root in roots for c in root.modules()}
        frozen = [m for m in modules if id(m) not in inside and next(m.parameters(), None) is not None
                  and not holds_trained(m)]
        inner = {id(c) for m in frozen for c in m.modules() if c is not m}
        outer = [m for m in frozen if id(m) not in inner]
        return sorted(outer, key=lambda m: -sum(p.numel() for p in m.parameters()))[:MAX_FROZEN]

    def add(self, modules: list[Any], since: int) -> None:
        """Time ``modules`` from step ``since`` (the open one) on."""
        for module in modules:
            self.timed.setdefault(id(module), _Frozen(module, since))
        if modules and self._loaders is not None:
            self._loaders.watch_batches = True

    def forget(self, trained: Callable[[Any], bool]) -> None:
        """Stop timing the models an optimizer has since been seen training (a GAN's generator, stepped late)."""
        for key, entry in list(self.timed.items()):
            if (module := entry.ref()) is None or trained(module):
                del self.timed[key]

    def call(self, entry: _Frozen, module: Any, original: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
        """``original(module, *args, **kwargs)``, timed where it is the loop's call."""
        step = self._step()
        if step is None or entry.depth:  # another thread's, or inside its own call
            return original(module, *args, **kwargs)
        entry.calls += 1
        entry.with_gradients |= sys.modules["torch"].is_grad_enabled()
        entry.training |= bool(module.training)
        if entry.calls <= SITE_CALLS:
            entry.sites.count(user_frame(sys._getframe(2)))
        refs, fixed = self._loaders.last_batch if self._loaders is not None else ((), False)
        if refs and _fed(refs, (*args, *kwargs.values())):
            entry.fed += 1
            entry.fixed += fixed
        entry.depth += 1
        started = self._clock()
        try:
            return original(module, *args, **kwargs)
        finally:
            entry.depth -= 1
            entry.tally.add(step, self._clock() - started, 1)

    def records(self) -> tuple[tuple[FrozenModel, dict[int, tuple[float, int]], tuple[int, int]], ...]:
        """The models called, for the record, each with its seconds and calls by step index and the steps those
        cover (from, to; -1: to the end): the summary adds the figures of the steady steps (``reduce.steady``)."""
        found = []
        for entry in self.timed.values():
            if not entry.calls:
                continue
            sites = entry.sites.sites(limit=1)
            found.append((FrozenModel(
                module=entry.name, parameters=entry.parameters, calls=entry.calls,
                without_gradients=not entry.with_gradients, eval_mode=not entry.training,
                fed_batch=entry.fed == entry.calls, fixed_items=entry.fed == entry.calls and entry.fixed == entry.fed,
                called_at=sites[0] if sites and sites[0].file else None),
                entry.tally.figures(), (entry.since, entry.tally.kept_to)))
        return tuple(found)
