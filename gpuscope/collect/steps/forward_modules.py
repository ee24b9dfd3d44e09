"""Which modules' forward the steps collector times: the outermost modules holding the trained parameters whose
forward actually runs.

The timing goes on a few modules only, never on every module: a global module hook puts every submodule call on
torch's slow path (a launch-bound loop pays several percent) and makes every ``torch.compile``d module warn. The roots
(outermost modules holding the parameters the optimizers train, or any parameters without an optimizer) are found
once, at the first steps. Some roots never run their own forward: Lightning calls a LightningModule's
``training_step``, never its ``forward``. So at the next step boundary, a timed module whose forward did not run
is replaced by its children that hold trained parameters, one level a step, a few levels at most; the step that
timed only part of the forward pass is left out of the figures.

Nothing is put on the modules themselves: the ``__call__`` of a timed module's class is wrapped, and times the call
when it is one of the timed modules (any other instance, or a call inside ``torch.compile``'s tracing, goes straight
through). A module hook would be part of the module: ``copy.deepcopy(model)`` (an EMA, the best model so far) and
``torch.save(model)`` would copy it with the collector it holds, which neither copies nor pickles, and
``torch.jit.script(model)`` would try to compile it; and a hook puts the module's own call on torch's slow path.

A script may call a module's ``forward`` directly (``self.forward(x)``, as pytorch/examples' forward-forward layers
train themselves), bypassing ``__call__``: a silent module of the script's own class that holds trained parameters
of its own gets its class's ``forward`` wrapped the same way (only then, and never torch's own classes:
``torch.jit.script`` compiles a class's ``forward`` from its source, and the wrapper has none of the module's).
"""

from __future__ import annotations

import functools
import gc
import sys
import weakref
from collections.abc import Callable
from typing import Any

from gpuscope.collect.steps.frozen_models import MAX_FROZEN, FrozenModels

MAX_ROOT_MODULES = 32
"""Forward hooks go on at most this many modules."""
MAX_INNER_CALLS = 8
"""A frozen model is timed only where the trained model holds at most this many instances of its class (or its class
is wrapped already): each of those calls pays the wrapper's half microsecond."""
MAX_DESCENT = 3
"""Levels below the roots the hooks may move down to (a LightningModule's model is one level down)."""
FETCH_AHEAD = 16
"""DataLoader batches a loop may fetch before its first ``backward()`` (gradient accumulation's, fetched first)."""

class ForwardModules:
    """The modules whose forward is timed: ``pre(module)`` as a call of one begins, which says whether the call is
    timed (False: another thread's), and then ``post()`` as it ends."""

    def __init__(self, pre: Callable[[Any], bool], post: Callable[[], None],
                 frozen: FrozenModels | None = None) -> None:
        self._pre, self._post = pre, post
        self.frozen = frozen if frozen is not None else FrozenModels(lambda: 0.0, lambda: None)
        """The models no optimizer trains whose forward is timed apart (found with the roots)."""
        self._trained: set[int] | None = None  # ids of the parameters the optimizers train (None: no optimizer)
        self._hooked: dict[int, tuple[type, weakref.ref[Any]]] = {}  # the timed modules: id -> class, module
        self._inner: set[int] = set()  # ids of the hooked modules a root wraps (``wrapped``): timed inside it
        self._wrapped: list[tuple[type, str, Callable[..., Any] | None]] = []  # classes whose __call__ (or forward)
        # is wrapped, the attribute, and the one of their own that it replaced (None: it was inherited)
        self._direct: set[int] = set()  # ids of the silent modules whose forward was wrapped for direct calls
        self._direct_classes: set[type] = set()  # the classes whose forward is wrapped
        self.checking: list[weakref.ref[Any]] = []
        """The modules hooked at the last boundary, still to be checked for having run (a list, not a property:
        the forward hook reads it on every call)."""
        self._ran: set[int] = set()  # ids of checked modules whose forward ran since
        self.no_grad_modes = [0, 0]
        """The trained model's forward passes in eval mode, and in train mode with gradients off."""
        self._descended = 0
        self._silent: list[str] = []  # modules hooked whose forward did not run (replaced by their children)
        self._silent_ids: set[int] = set()  # ...their ids
        self._root_refs: list[weakref.ref[Any]] = []
        self.roots: list[str] = []
        """Class names of the roots found (empty until then)."""
        self.left_out = 0
        """Steps that timed only part of the forward pass (left out of the figures)."""

    def evaluation_pass(self, module: Any, tracker: Any) -> None:
        """``module``'s forward began in eval mode or with gradients off: its step holds an evaluation pass (or a
        rollout collecting the next batch, which runs in train mode in most reinforcement-learning loops): so marked
        in ``tracker``, and counted by the mode."""
        tracker.evaluation_forward()
        self.no_grad_modes[bool(module.training)] += 1

    def ran(self, module: Any) -> None:
        """``module``'s forward began (called from the pre-hook while ``checking``)."""
        self._ran.add(id(module))

    def hook_roots(self, nn: Any, trained: set[int], step: int = 0) -> None:
        """Find the root modules (``trained``: the ids of the optimizers' parameters, empty without one) and hook
        them; whether their forward ran is checked at the next boundary (``check``). The models no optimizer trains
        are timed from ``step`` on (``frozen``)."""
        self._trained = trained or None
        modules = _modules(nn)
        roots = self._outermost(modules)[:MAX_ROOT_MODULES]
        self._hook(_with_wrapped(roots)[:MAX_ROOT_MODULES])
        if self._trained is not None:  # (without an optimizer every model is the trained one)
            self._time_frozen(self.frozen.candidates(modules, roots, self._updates), roots, step)
        self.roots = sorted(type(m).__name__ for m in roots)
        self._root_refs = [weakref.ref(m) for m in roots]
        self._inner = {id(child) for m in roots if (child := wrapped(m)) is not None}

    def add_roots(self, nn: Any, trained: set[int]) -> bool:
        """An optimizer first stepped after the roots were found (a GAN's generator, stepped after its
        discriminator): its parameters (``trained``) are trained, not a frozen model's, and the outermost modules
        holding them that no hooked module holds are hooked. True when there were any: the step that just ended ran
        their forward untimed (to be left out)."""
        if self._trained is None:
            return False  # every module held parameters already
        self._trained |= trained
        self.frozen.forget(self._updates)
        # (the modules hooked now, not every one hooked so far: a LightningModule holding both of a GAN's models
        # was hooked first and replaced by the generator, the one its first optimizer trains)
        held = {id(p) for _, ref in self._hooked.values() if (m := ref()) is not None for p in m.parameters()}
        if trained <= held:
            return False
        holders = [m for m in _modules(nn) if id(m) not in self._hooked and id(m) not in self._silent_ids
                   and any(id(p) in trained for p in m.parameters())
                   and not any(id(p) in held for p in m.parameters())]
        roots = self._outermost(holders)[:MAX_ROOT_MODULES - len(self._hooked)]
        if not roots:
            return False
        self._hook(_with_wrapped(roots)[:MAX_ROOT_MODULES - len(self._hooked)])
        self.roots = sorted([*self.roots, *(type(m).__name__ for m in roots)])
        self._root_refs += [weakref.ref(m) for m in roots]
        self._inner |= {id(child) for m in roots if (child := wrapped(m)) is not None}
        self.left_out += 1
        return True

    def _outermost(self, modules: list[Any]) -> list[Any]:
        """Of ``modules``, those holding trained parameters that no other such module contains."""
        owners = [m for m in modules if self._holds_trained(m)]
        inner = {id(c) for m in owners for c in m.modules() if c is not m}
        return [m for m in owners if id(m) not in inner]

    def check(self, tracker: Any = None, index: int = 0) -> bool:
        """The step that just ended (``index - 1`` of ``tracker``'s) ran with the modules hooked at its start: those
        whose forward did not run are replaced by their children that hold trained parameters (checked in turn at
        the next boundary), and their children that hold parameters, none trained, are timed as frozen models (a
        LightningModule's teacher, beside the student it trains). True when that step timed only part of the forward
        pass (it is to be left out of the figures). Steps counted by DataLoader batches before any ``backward()`` may
        only be batches fetched ahead (the transformers Trainer fetches a step's accumulated batches first: 8 of them
        took its model for one whose forward never runs, down to its leaves), so the modules are checked once one ran
        or at ``FETCH_AHEAD``."""
        if tracker is not None and tracker.source == "dataloader" and not tracker.passes[1] and index < FETCH_AHEAD:
            return False
        silent = [m for ref in self.checking if (m := ref()) is not None and id(m) not in self._ran]
        self.checking = []
        self._ran.clear()
        if not silent:
            return False
        self.left_out += 1
        direct = [m for m in silent if id(m) not in self._direct and self._holds_trained(m, recurse=False)
                  and not type(m).__module__.startswith("torch.")]
        for module in direct:  # its forward may be called directly: timed from the next step, checked again then
            self._direct.add(id(module))
            if not getattr(type(module).forward, "_gpuscope_timed", False):
                self._wrap(type(module), "forward")
                self._direct_classes.add(type(module))
        silent = [m for m in silent if not any(m is d for d in direct)]
        for module in silent:
            del self._hooked[id(module)]
            self._silent.append(type(module).__name__)
            self._silent_ids.add(id(module))
        if self._descended < MAX_DESCENT:
            self._descended += 1
            children: dict[int, Any] = {}
            frozen: dict[int, Any] = {}
            for module in silent:
                for child in module.children():
                    if self._trained is not None and next(child.parameters(), None) is not None \
                            and not self._updates(child):
                        frozen.setdefault(id(child), child)
                    elif id(child) not in self._hooked and self._holds_trained(child):
                        children.setdefault(id(child), child)
            self._hook(list(children.values())[: MAX_ROOT_MODULES - len(self._hooked)])
            if frozen:
                self._time_frozen(list(frozen.values())[:MAX_FROZEN], self.root_modules(), index)
        self.checking += [weakref.ref(m) for m in direct]
        return True

    def remove(self) -> None:
        """Stop timing: every wrapped ``__call__`` and ``forward`` is its class's own again."""
        self.checking = []
        for cls, name, own in reversed(self._wrapped):
            if own is None:
                delattr(cls, name)
            else:
                setattr(cls, name, own)
        self._wrapped = []

    def root_modules(self) -> list[Any]:
        """The root modules, while they are alive (found at the first steps)."""
        return [m for ref in self._root_refs if (m := ref()) is not None]

    def note(self, discovery_s: float) -> str | None:
        """What the record says of the forward timing (None before the roots were found)."""
        if not self.roots:
            return None
        # (from the classes kept at hooking: a model made inside the script's train() is gone by the run's end)
        classes = [cls for key, (cls, _) in self._hooked.items() if key not in self._inner]
        direct = sorted(cls.__name__ for cls in classes if cls in self._direct_classes)
        timed = sorted(cls.__name__ for cls in classes if cls not in self._direct_classes)
        if direct:
            timed.append(", ".join(direct) + " (forward called directly, not as a module call)")
        partial = (f"; {self.left_out} " + ("step that timed" if self.left_out == 1 else "steps that timed")
                   + " only part of the forward pass left out of the figures") if self.left_out else ""
        if not self._silent:
            return ("forward timed on root modules: " + ", ".join(timed)
                    + f" (finding them took {discovery_s * 1e3:.0f} ms, left out of the steps{partial})")
        return ("forward timed on the outermost modules whose forward runs: " + (", ".join(timed) or "none")
                + f" (the forward of {', '.join(self._silent)} never ran; finding them took"
                f" {discovery_s * 1e3:.0f} ms, left out of the steps{partial})")

    def _holds_trained(self, module: Any, recurse: bool = True) -> bool:
        """Whether ``module`` holds parameters the optimizers train (with no optimizer: any parameters);
        ``recurse=False``: as its own, not its children's."""
        if self._trained is None:
            return next(module.parameters(recurse), None) is not None
        return any(id(p) in self._trained for p in module.parameters(recurse))

    def _time_frozen(self, frozen: list[Any], roots: list[Any], step: int) -> None:
        """Time the ``frozen`` models from ``step`` on, but those whose class the trained model (``roots``) holds more
        than ``MAX_INNER_CALLS`` instances of, unless it is wrapped already: every call of an instance of a wrapped
        class goes through the wrapper (0.5 us on this VM), and a frozen ``nn.Linear`` of the script's own would put
        every Linear of the model there."""
        inside: dict[type, int] = {}
        for root in roots:
            for module in root.modules():
                inside[type(module)] = inside.get(type(module), 0) + 1
        timed = [m for m in frozen if getattr(type(m).__call__, "_gpuscope_timed", False)
                 or inside.get(type(m), 0) <= MAX_INNER_CALLS]
        self.frozen.add(timed, step)
        self._wrap_classes(timed)

    def _updates(self, module: Any) -> bool:
        """Whether ``module`` holds parameters the optimizers update: theirs, and not frozen (``requires_grad``
        off: a teacher whose parameters the optimizer was handed with the student's, ``self.parameters()``)."""
        trained = self._trained or set()
        return any(id(p) in trained and p.requires_grad for p in module.parameters())

    def _hook(self, modules: list[Any]) -> None:
        for module in modules:
            self._hooked[id(module)] = (type(module), weakref.ref(module))
        self._wrap_classes(modules)
        self.checking = [weakref.ref(m) for m in modules]

    def _wrap_classes(self, modules: list[Any]) -> None:
        for module in modules:
            if not getattr(type(module).__call__, "_gpuscope_timed", False):  # its class (or a base) not yet wrapped
                self._wrap(type(module), "__call__")

    def _wrap(self, cls: type, name: str) -> None:
        """Wrap ``cls.__call__`` (or ``cls.forward``): a call of a timed module runs between the pre and post
        hooks (a forward called by the timed ``__call__`` is nested in it: one pass). Frozen models are timed at
        their ``__call__`` only."""
        original = getattr(cls, name)
        hooked, pre, post = self._hooked, self._pre, self._post
        frozen, frozen_call = self.frozen.timed if name == "__call__" else {}, self.frozen.call
        compiler = getattr(sys.modules.get("torch"), "compiler", None)
        # is_dynamo_compiling: True as torch.compile traces the call (dynamo folds it), else a call less than
        # is_compiling (which asks torch.jit.is_scripting first)
        compiling = (getattr(compiler, "is_dynamo_compiling", None) or getattr(compiler, "is_compiling", None)
                     or (lambda: False))

        def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
            timed = hooked.get(id(module))
            if timed is None:
                entry = frozen.get(id(module))
                if entry is None or entry.ref() is not module or compiling():
                    return original(module, *args, **kwargs)
                return frozen_call(entry, module, original, args, kwargs)
            if timed[1]() is not module or compiling() or not pre(module):
                return original(module, *args, **kwargs)
            try:
                return original(module, *args, **kwargs)
            finally:
                post()

        if name == "forward":  # its name, doc and signature are the method's (transformers reads forward's)
            functools.update_wrapper(__call__, original)
        __call__._gpuscope_timed = True  # type: ignore[attr-defined]
        __call__.__wrapped__ = original  # type: ignore[attr-defined]
        self._wrapped.append((cls, name, vars(cls).get(name)))
        setattr(cls, name, __call__)


def _modules(nn: Any) -> list[Any]:
    """Every module alive."""
    # type() rather than isinstance(): isinstance reads __class__, which some lazy objects answer with a warning
    return [m for m in gc.get_objects() if issubclass(type(m), nn.Module)]


WRAPPED = ("module", "_orig_mod", "_fsdp_wrapped_module")
"""The one child of a wrapper module, by its name: DistributedDataParallel's and DataParallel's ``module``,
torch.compile's ``_orig_mod``, FSDP's ``_fsdp_wrapped_module``."""


def wrapped(module: Any) -> Any:
    """The module ``module`` wraps (``WRAPPED``), or None where it is no wrapper."""
    children = getattr(module, "_modules", None) or {}
    if len(children) != 1 or next(module.parameters(recurse=False), None) is not None:
        return None
    name, child = next(iter(children.items()))
    return child if name in WRAPPED else None


def _with_wrapped(roots: list[Any]) -> list[Any]:
    """``roots``, each followed by the module it wraps, if any (``wrapped``): a script may call that one directly,
    bypassing the wrapper (``model.module(x)`` to evaluate on rank 0 alone), and the call is then timed and seen for
    an evaluation pass. Called through its wrapper, it runs inside the wrapper's timed call: one forward, not two."""
    return [module for root in roots for module in (root, wrapped(root)) if module is not None]
