"""Which modules' forward the steps collector times: the outermost modules holding the trained parameters whose
forward actually runs.

Forward hooks go on a few modules only, never globally: a global module hook puts every submodule call on torch's
slow path (a launch-bound loop pays several percent) and makes every ``torch.compile``d module warn. The roots
(outermost modules holding the parameters the optimizers train, or any parameters without an optimizer) are found
once, at the first steps. Some roots never run their own forward: Lightning calls a LightningModule's
``training_step``, never its ``forward``. So at the next step boundary, a hooked module whose forward did not run
is unhooked and replaced by its children that hold trained parameters, one level a step, a few levels at most; the
step that timed only part of the forward pass is left out of the figures.

A hooked module copies and pickles as it would without gpuscope: ``copy.deepcopy(model)`` (an EMA, the best model
so far) and ``torch.save(model)`` go through ``Module.__getstate__``, which, while hooks of ours are on, leaves them
out of the state (they hold the collector, which neither copies nor pickles; the copy would not be timed anyway).
"""

from __future__ import annotations

import gc
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from gpuscope.collectors.base import patch

MAX_ROOT_MODULES = 32
"""Forward hooks go on at most this many modules."""
MAX_DESCENT = 3
"""Levels below the roots the hooks may move down to (a LightningModule's model is one level down)."""

Hook = Callable[..., Any]
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks")


class ForwardModules:
    """The modules whose forward is timed, with ``pre`` and ``post`` as their forward pre- and post-hooks."""

    def __init__(self, pre: Hook, post: Hook) -> None:
        self._pre, self._post = pre, post
        self._trained: set[int] | None = None  # ids of the parameters the optimizers train (None: no optimizer)
        self._hooked: dict[int, tuple[str, list[Callable[[], None]]]] = {}  # id -> class name, hook removers
        self._checking: list[weakref.ref[Any]] = []  # hooked at the last boundary: did their forward run?
        self._ran: set[int] = set()  # ids of checked modules whose forward ran since
        self._descended = 0
        self._silent: list[str] = []  # modules hooked whose forward did not run (replaced by their children)
        self._root_refs: list[weakref.ref[Any]] = []
        self._covered: set[int] = set()  # ids of the parameters the hooked modules hold
        self._unhide: Callable[[], None] | None = None  # undoes the patch of Module.__getstate__
        self.roots: list[str] = []
        """Class names of the roots found (empty until then)."""
        self.left_out = 0
        """Steps that timed only part of the forward pass (left out of the figures)."""

    @property
    def checking(self) -> bool:
        """Whether modules hooked at the last boundary are still to be checked for having run."""
        return bool(self._checking)

    def ran(self, module: Any) -> None:
        """``module``'s forward began (called from the pre-hook while ``checking``)."""
        self._ran.add(id(module))

    def hook_roots(self, nn: Any, trained: set[int]) -> None:
        """Find the root modules (``trained``: the ids of the optimizers' parameters, empty without one) and hook
        them; whether their forward ran is checked at the next boundary (``check``)."""
        self._trained = trained or None
        if self._unhide is None:
            self._unhide = patch(nn.Module, "__getstate__", self._without_our_hooks)
        roots = self._outermost(nn)[:MAX_ROOT_MODULES]
        self._hook(roots)
        self.roots = sorted(type(m).__name__ for m in roots)
        self._root_refs = [weakref.ref(m) for m in roots]

    def add_roots(self, nn: Any, trained: set[int]) -> bool:
        """An optimizer first stepped after the roots were found (a GAN's generator, stepped after its
        discriminator): hook the outermost modules holding its parameters (``trained``) that no hooked module holds.
        True when there were any: the step that just ended ran their forward untimed (to be left out)."""
        if self._trained is None or trained <= self._covered:
            return False  # every module held parameters already, or a hooked module holds these
        self._trained |= trained
        roots = [m for m in self._outermost(nn) if id(m) not in self._hooked
                 and not any(id(p) in self._covered for p in m.parameters())]
        roots = roots[:MAX_ROOT_MODULES - len(self._hooked)]
        if not roots:
            return False
        self._hook(roots)
        self.roots = sorted([*self.roots, *(type(m).__name__ for m in roots)])
        self._root_refs += [weakref.ref(m) for m in roots]
        self.left_out += 1
        return True

    def _outermost(self, nn: Any) -> list[Any]:
        """The modules holding trained parameters that no other such module contains."""
        # type() rather than isinstance(): isinstance reads __class__, which some lazy objects answer with a warning
        modules = [m for m in gc.get_objects() if issubclass(type(m), nn.Module)]
        owners = [m for m in modules if self._holds_trained(m)]
        inner = {id(c) for m in owners for c in m.modules() if c is not m}
        return [m for m in owners if id(m) not in inner]

    def check(self) -> bool:
        """The step that just ended ran with the modules hooked at its start: those whose forward did not run are
        replaced by their children that hold trained parameters (checked in turn at the next boundary). True when
        that step timed only part of the forward pass (it is to be left out of the figures)."""
        silent = [m for ref in self._checking if (m := ref()) is not None and id(m) not in self._ran]
        self._checking = []
        self._ran.clear()
        if not silent:
            return False
        self.left_out += 1
        for module in silent:
            name, removers = self._hooked.pop(id(module))
            self._silent.append(name)
            for remove in removers:
                remove()
        if self._descended < MAX_DESCENT:
            self._descended += 1
            children: dict[int, Any] = {}
            for module in silent:
                for child in module.children():
                    if id(child) not in self._hooked and self._holds_trained(child):
                        children.setdefault(id(child), child)
            self._hook(list(children.values())[: MAX_ROOT_MODULES - len(self._hooked)])
        return True

    def remove(self) -> None:
        """Take every forward hook out."""
        for _, removers in self._hooked.values():
            for remove in removers:
                remove()
        self._checking = []
        if self._unhide is not None:
            self._unhide()
            self._unhide = None

    def root_modules(self) -> list[Any]:
        """The root modules, while they are alive (found at the first steps)."""
        return [m for ref in self._root_refs if (m := ref()) is not None]

    def note(self, discovery_s: float) -> str | None:
        """What the record says of the forward timing (None before the roots were found)."""
        if not self.roots:
            return None
        timed = sorted(name for name, _ in self._hooked.values())
        partial = (f"; {self.left_out} " + ("step that timed" if self.left_out == 1 else "steps that timed")
                   + " only part of the forward pass left out of the figures") if self.left_out else ""
        if not self._silent:
            return ("forward timed on root modules: " + ", ".join(timed)
                    + f" (finding them took {discovery_s * 1e3:.0f} ms, left out of the steps{partial})")
        return ("forward timed on the outermost modules whose forward runs: " + (", ".join(timed) or "none")
                + f" (the forward of {', '.join(self._silent)} never ran; finding them took"
                f" {discovery_s * 1e3:.0f} ms, left out of the steps{partial})")

    def _holds_trained(self, module: Any) -> bool:
        """Whether ``module`` holds parameters the optimizers train (with no optimizer: any parameters)."""
        if self._trained is None:
            return next(module.parameters(), None) is not None
        return any(id(p) in self._trained for p in module.parameters())

    def _without_our_hooks(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``Module.__getstate__`` leaving our hooks out of the state it returns (the module keeps them)."""
        ours = (self._pre, self._post)

        def __getstate__(module: Any) -> Any:
            state = original(module)
            if not isinstance(state, dict) or not any(
                    hook in ours for key in _HOOK_DICTS for hook in (state.get(key) or {}).values()):
                return state
            state = dict(state)  # a copy: the module's own dicts are left as they are
            for key in _HOOK_DICTS:
                state[key] = OrderedDict((i, hook) for i, hook in (state.get(key) or {}).items() if hook not in ours)
            always = state.get("_forward_hooks_always_called")
            if always:
                state["_forward_hooks_always_called"] = OrderedDict(
                    (i, flag) for i, flag in always.items() if i in state["_forward_hooks"])
            return state

        return __getstate__

    def _hook(self, modules: list[Any]) -> None:
        for module in modules:
            pre = module.register_forward_pre_hook(self._pre)
            try:
                post = module.register_forward_hook(self._post, always_call=True)
            except TypeError:  # torch without always_call
                post = module.register_forward_hook(self._post)
            self._hooked[id(module)] = (type(module).__name__, [pre.remove, post.remove])
            self._covered.update(id(p) for p in module.parameters())
        self._checking = [weakref.ref(m) for m in modules]

