"""A fix applied to an unchanged script as it runs (``gpuscope run --try``'s trials): each recommendation that can
be applied at run time, applied with the values its fix is written from, and a trial's end at a step boundary.

Each fix installs what it needs when torch is imported (``ImportWatch``): a setting (``tf32``), a default argument
(``fused=True`` where an optimizer is built, ``num_workers`` where the recommended DataLoader is), or, once the steps
collector has found the modules the optimizer trains, a change to them (``torch.compile``, bfloat16 autocast around
their forward, channels_last). ``Applied.step`` is the first step the fix was in effect for all of.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuscope.collect.callsites import call_site, user_frame
from gpuscope.collect.framework.base import StepSource, patch
from gpuscope.collect.importwatch import ImportWatch
from gpuscope.collect.steps.step_listeners import QUIET


class TrialStop(BaseException):
    """Ends a trial's script at a step boundary once its steps are measured: raised at the next safe point, in the
    user's loop, so that their ``finally`` blocks and ``with`` statements close what they opened, and no file of
    theirs is left half-written (a checkpoint saved after the last step is whole)."""


@dataclass
class Applied:
    """What a fix did in this process: the first step it was in effect for all of (None: not yet), and notes."""

    id: str
    step: int | None = None
    notes: list[str] = field(default_factory=list)
    undo: list[Callable[[], None]] = field(default_factory=list)
    loaders: list[str] = field(default_factory=list)
    """The lines whose DataLoader the fix changed (a DataLoader fix's)."""

    def remove(self) -> None:
        for undo in reversed(self.undo):
            try:
                undo()
            except Exception:
                pass
        self.undo.clear()


def apply(fix_id: str, settings: dict[str, Any], steps: StepSource) -> Applied:
    """Install ``fix_id`` with its ``settings`` (its rule's and its finding's: ``diagnose.trials.plan``), following
    ``steps``."""
    applied = Applied(fix_id)
    install = INSTALLERS[fix_id]

    def on_torch() -> None:
        import torch

        try:
            now = install(torch, settings, applied, steps)
        except Exception as exc:
            applied.notes.append(f"{fix_id} could not be applied: {type(exc).__name__}: {exc}")
            return
        if now:  # in effect from the next step on
            applied.step = steps.steps_seen() + 1

    watch = ImportWatch("torch", on_torch)
    applied.undo.append(watch.remove)
    watch.install()
    return applied


class StopAfter:
    """Ends the script (``TrialStop``) at the first safe point of step ``count`` (0-based): once ``count`` steps
    ran. ``stopped``: whether it did (the script may end first)."""

    def __init__(self, steps: StepSource, count: int) -> None:
        self.count, self.stopped, self._steps = count, False, steps
        steps.add_step_listener(self._listener)

    def _listener(self, index: int) -> int | None:
        if index >= self.count:
            self._steps.stop_at_safe_point(self._stop)
            return QUIET
        return self.count - index

    def _stop(self) -> None:
        self.stopped = True
        raise TrialStop


# -- the fixes -------------------------------------------------------------------------------------------------
Installer = Callable[[Any, dict[str, Any], Applied, StepSource], bool]
"""Installs a fix once torch is imported; True where it is in effect from the next step on, False where it takes
effect later (on the trained modules, once found: ``on_roots``)."""


def _tf32(torch: Any, settings: dict[str, Any], applied: Applied, steps: StepSource) -> bool:
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    return True


def _cudnn_benchmark(torch: Any, settings: dict[str, Any], applied: Applied, steps: StepSource) -> bool:
    torch.backends.cudnn.benchmark = True
    return True


def _file_system(torch: Any, settings: dict[str, Any], applied: Applied, steps: StepSource) -> bool:
    """The file_system sharing strategy and, where the fix names them, the workers its prediction was made for."""
    import torch.multiprocessing

    torch.multiprocessing.set_sharing_strategy("file_system")
    return _dataloader(torch, settings, applied, steps) if "num_workers" in settings else True


def _skip_distribution_checks(torch: Any, settings: dict[str, Any], applied: Applied, steps: StepSource) -> bool:
    import torch.distributions

    torch.distributions.Distribution.set_default_validate_args(False)
    return True


def _environment_only(torch: Any, settings: dict[str, Any], applied: Applied, steps: StepSource) -> bool:
    return True  # the trial's environment carries it (the allocator's thresholds, read by glibc at start-up)


def _zero_grad_to_none(torch: Any, settings: dict[str, Any], applied: Applied, steps: StepSource) -> bool:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def zero_grad(self: Any, set_to_none: bool = True) -> Any:
            return original(self, set_to_none=True)
        return zero_grad

    applied.undo += [patch(torch.optim.Optimizer, "zero_grad", wrap), patch(torch.nn.Module, "zero_grad", wrap)]
    return True


def _no_checkpointing(torch: Any, settings: dict[str, Any], applied: Applied, steps: StepSource) -> bool:
    """``torch.utils.checkpoint.checkpoint`` calls the function directly (a library that imports it after torch, as
    transformers does, binds this one; ``checkpoint_sequential`` calls it through the module)."""
    import torch.utils.checkpoint

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def checkpoint(function: Callable[..., Any], *args: Any, use_reentrant: bool | None = None,
                       context_fn: Any = None, determinism_check: Any = None, debug: Any = None,
                       preserve_rng_state: bool = True, early_stop: Any = None, **kwargs: Any) -> Any:
            return function(*args, **kwargs)
        return checkpoint

    applied.undo.append(patch(torch.utils.checkpoint, "checkpoint", wrap))
    return True


FUSED_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad")
"""torch's optimizers that take ``fused=True`` (on the CPU since torch 2.4)."""


def _fused_optimizer(torch: Any, settings: dict[str, Any], applied: Applied, steps: StepSource) -> bool:
    """``fused=True`` where the optimizer the fix names is built (its class, or a subclass of the user's that calls
    torch's ``__init__``; every one of ``FUSED_OPTIMIZERS`` where it names none), unless the script chose foreach."""
    named = settings.get("optimizer")

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if (named is None or type(self).__name__ == named) and kwargs.get("fused") is None:
                if kwargs.get("foreach"):
                    applied.notes.append(f"{type(self).__name__} was built with foreach=True: left so")
                else:
                    kwargs["fused"] = True
            original(self, *args, **kwargs)
        return __init__

    for name in FUSED_OPTIMIZERS:
        cls = getattr(torch.optim, name, None)
        if cls is not None and "fused" in inspect.signature(cls.__init__).parameters:
            applied.undo.append(patch(cls, "__init__", wrap))
    return True


def _disable_debug_apis(torch: Any, settings: dict[str, Any], applied: Applied, steps: StepSource) -> bool:
    import torch.autograd

    class NoAnomalyMode:  # set_detect_anomaly(True) and detect_anomaly() as no-ops: anomaly detection stays off
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: Any) -> None:
            return None

        def __call__(self, function: Callable[..., Any]) -> Callable[..., Any]:
            return function

    torch.autograd.set_detect_anomaly(False)
    for owner in (torch.autograd, torch.autograd.anomaly_mode):
        for name in ("set_detect_anomaly", "detect_anomaly"):
            if hasattr(owner, name):
                original = getattr(owner, name)
                setattr(owner, name, NoAnomalyMode)
                applied.undo.append(functools.partial(setattr, owner, name, original))
    return True


def _dataloader(torch: Any, settings: dict[str, Any], applied: Applied, steps: StepSource) -> bool:
    """The DataLoader built at the recommended line (every one, where the fix names no line) gets the fix's
    arguments: num_workers, persistent_workers, prefetch_factor, pin_memory; the thread count the fix names, at
    once."""
    from torch.utils.data import dataloader

    wanted = {name: settings[name] for name in ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory")
              if name in settings}
    site = settings.get("site")

    def wrap(original: Callable[..., None]) -> Callable[..., None]:
        parameters = list(inspect.signature(inspect.unwrap(original)).parameters)[1:]  # (the steps collector's
        # wrapper may be the one patched: its signature is *args)

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            here = call_site(user_frame(sys._getframe(1)))
            if site is None or f"{here.file}:{here.line}" == site:
                kwargs.update(dict(zip(parameters, args)))
                args = ()
                workers = wanted.get("num_workers", kwargs.get("num_workers", 0))
                kwargs.update({k: v for k, v in wanted.items()
                               if k not in ("persistent_workers", "prefetch_factor") or workers})
                applied.loaders.append(f"{here.file}:{here.line}")
            original(loader, *args, **kwargs)

        return __init__

    applied.undo.append(patch(dataloader.DataLoader, "__init__", wrap))
    if "threads" in settings:
        torch.set_num_threads(int(settings["threads"]))
    return True


RootChange = Callable[[Any, Any, dict[str, Any]], None]
"""A change to one trained module: ``(torch, module, settings)``."""


def _on_roots(change: RootChange, frozen: bool = False) -> Installer:
    """A fix made to the trained modules once the steps collector has found them (after the first step or two:
    those run without it, and fall in warm-up); ``frozen``: to the models the step runs without training them too
    (a perceptual loss's network, a teacher), found with them."""

    def install(torch: Any, settings: dict[str, Any], applied: Applied, steps: StepSource) -> bool:
        def listener(index: int) -> int | None:
            roots = steps.root_modules()
            if not roots:
                return None
            try:
                for module in [*roots, *steps.frozen_modules()] if frozen else roots:
                    change(torch, module, settings)
            except Exception as exc:  # the fix is not in effect: the trial says why
                applied.notes.append(f"{applied.id} could not be applied: {type(exc).__name__}: {exc}")
                return QUIET
            applied.step = index + 1
            return QUIET

        steps.add_step_listener(listener)
        return False

    return install


def _compile(torch: Any, module: Any, settings: dict[str, Any]) -> None:
    """``model = torch.compile(model[, mode=...])``, in place: the module's calls run compiled."""
    module.compile(**({"mode": settings["mode"]} if "mode" in settings else {}))


def _autocast_bf16(torch: Any, module: Any, settings: dict[str, Any]) -> None:
    """The module's forward under bfloat16 autocast, its floating outputs given back in its parameters' dtype: the
    script's code after it (a loss, a frozen network's call outside the autocast) sees the dtypes it was written for,
    where a bfloat16 output fed to a float32 module fails ("Input type (BFloat16) and bias type (float) should be the
    same")."""
    parameter = next(module.parameters(), None)
    device = parameter.device.type if parameter is not None else "cuda"
    dtype = parameter.dtype if parameter is not None else torch.float32
    forward = module.forward
    from torch.utils._pytree import tree_map

    def back(value: Any) -> Any:
        return value.to(dtype) if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 else value

    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device, dtype=torch.bfloat16):
            out = forward(*args, **kwargs)
        return tree_map(back, out) if dtype != torch.bfloat16 else out

    module.forward = autocast_forward


def _checkpoint_blocks(torch: Any, module: Any, settings: dict[str, Any]) -> None:
    """Activation checkpointing of the model's repeated block (``reduce-memory``'s fix that needs no edit): each
    submodule whose class is ``settings["block"]`` (the memory window's name for it, ``GPT2Block``) runs its forward
    under ``torch.utils.checkpoint``, where gradients are on: its activations are made again in backward, not kept."""
    import torch.utils.checkpoint

    wrapped = 0
    for sub in module.modules():
        if type(sub).__name__ != settings.get("block") or getattr(sub.forward, "_gpuscope_checkpointed", False):
            continue
        forward = sub.forward

        @functools.wraps(forward)
        def checkpointed(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return _forward(*args, **kwargs)
            return torch.utils.checkpoint.checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        checkpointed._gpuscope_checkpointed = True  # type: ignore[attr-defined]
        sub.forward = checkpointed
        wrapped += 1
    if not wrapped:
        raise LookupError(f"no {settings.get('block')} module in the trained model")


def _channels_last(torch: Any, module: Any, settings: dict[str, Any]) -> None:
    module.to(memory_format=torch.channels_last)
    forward = module.forward

    def to_channels_last(value: Any) -> Any:
        return value.to(memory_format=torch.channels_last) if isinstance(value, torch.Tensor) and value.dim() == 4 \
            else value

    @functools.wraps(forward)
    def channels_last_forward(*args: Any, **kwargs: Any) -> Any:
        return forward(*(to_channels_last(a) for a in args), **{k: to_channels_last(v) for k, v in kwargs.items()})

    module.forward = channels_last_forward


def _cpu_float32(torch: Any, settings: dict[str, Any], applied: Applied, steps: StepSource) -> bool:
    """``torch.autocast('cpu', ...)`` entered disabled: the step runs in float32, as the fix's first form says."""
    def wrap(init: Callable[..., None]) -> Callable[..., None]:
        def __init__(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
            if device_type == "cpu":
                kwargs["enabled"] = False
            init(self, device_type, *args, **kwargs)
        return __init__

    applied.undo.append(patch(torch.autocast, "__init__", wrap))
    return True


INSTALLERS: dict[str, Installer] = {
    "tf32": _tf32,
    "cudnn-benchmark": _cudnn_benchmark,
    "file-system-sharing": _file_system,
    "skip-distribution-checks": _skip_distribution_checks,
    "tune-host-allocator": _environment_only,
    "zero-grad-set-to-none": _zero_grad_to_none,
    "fused-optimizer": _fused_optimizer,
    "disable-debug-apis": _disable_debug_apis,
    "more-dataloader-workers": _dataloader,
    "persistent-workers": _dataloader,
    "pin-memory": _dataloader,
    "jit-fusion": _on_roots(_compile),
    "static-graph": _on_roots(_compile),
    "mixed-precision": _on_roots(_autocast_bf16),
    "cpu-mixed-precision": _on_roots(_autocast_bf16, frozen=True),
    "channels-last": _on_roots(_channels_last),
    "cpu-fp32-over-low-precision": _cpu_float32,
    "reduce-memory": _on_roots(_checkpoint_blocks),
    "skip-activation-checkpointing": _no_checkpointing,
}
"""How each fix whose rule is tried at run time (``AtRunTime``, ``diagnose.trials.APPLIED_AT_RUN_TIME``) is applied:
one installer an id, tied to the rules by tests/unit/test_trials.py."""


__all__ = ["Applied", "INSTALLERS", "StopAfter", "TrialStop", "apply"]
