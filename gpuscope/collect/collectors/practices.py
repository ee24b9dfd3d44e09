"""Framework settings and training habits that cost time, read while the script trains.

- Debug APIs left on: anomaly detection (``torch.set_anomaly_enabled``, through which ``detect_anomaly`` and
  ``set_detect_anomaly`` switch it, is wrapped to name the line that turned it on; its state is read at the step
  boundaries checked: each of the first ``READ_EACH`` steps', then every ``READ_EVERY``th), torch's autograd profiler
  or ``emit_nvtx`` (on at a boundary checked, outside gpuscope's own windows), and ``torch.autograd.gradcheck`` /
  ``gradgradcheck`` calls.
  The stack anomaly detection keeps for each autograd node (``torch.fx.traceback.format_stack``) is kept without
  gpuscope's frames, as ``python`` would keep it, at the cost ``python`` pays (``callsites.script_format_stack``).
- How gradients are cleared: ``Optimizer.zero_grad`` and ``Module.zero_grad`` are wrapped to count the calls that
  zero-fill gradients (``set_to_none=False``) and name their lines.
- The model, once, at the first steps: layers with a bias feeding BatchNorm, ``DataParallel`` wrappers,
  convolutions and their memory format, dropout layers that drop in train mode and the classes holding them.
- Backend flags, once: ``cudnn.benchmark``, TF32 for matmuls and cuDNN, float32 matmul precision, and the GPU's
  compute capability on CUDA runs.
- Mixed precision on the CPU: ``torch.autocast.__enter__`` is wrapped to name the lines that enter it on the CPU,
  enabled, in bfloat16 or float16 (a CPU without matrix instructions for them runs those matmuls slower than
  float32's).
- ``torch.distributions``' checks (``validate_args``, on by default): ``Distribution.__init__`` and
  ``Distribution._validate_sample`` are wrapped to time the checks, step by step, and name the lines that built
  the distributions.
- Checkpoint saves: ``torch.save`` and ``safetensors.torch.save_file`` are wrapped to time each save to a file (or
  by a library), with the step under way, the user's line and the library that saved.

Every wrapper is one Python call and a counter (a save's, a walk up the stack too: saves are few); the reads at a
boundary are a few C calls.
"""

from __future__ import annotations

import inspect
import itertools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar

from gpuscope.collect.callsites import SiteCounter, calling_library, script_format_stack, user_frame
from gpuscope.collect.framework.base import CollectorResult, StepFollower, patch, register
from gpuscope.collect.importwatch import ImportWatch
from gpuscope.record import CollectorStatus, Practices

INSPECT_AT_STEP = 2
"""Model and flags are read at this step's start: the optimizer has stepped and the loop is set up."""
CHECKED_STEPS = 512
"""Steps whose distribution checks are kept, from the first step with one (a float and an int each)."""
SITED_CHECKS = 256
"""Distributions whose building line is looked up (a walk up the stack each): the first ones built."""
SAVES_KEPT = 4096
"""Checkpoint saves kept one by one (a step index and a float each): the first ones made."""
READ_EACH = 64
READ_EVERY = 8
"""The debug APIs' state is read at each of the first ``READ_EACH`` step boundaries, then at every ``READ_EVERY``th
(the shares of steps with them on are estimated as well from those, and the other steps' boundaries cost nothing),
and again at each once ``torch.distributions`` has checked anything (its checks are timed step by step)."""


@register
class PracticesCollector(StepFollower):
    """Reads the run's debug-API state, gradient clearing, model layers and backend flags."""

    name: ClassVar[str] = "practices"
    field: ClassVar[str | None] = "practices"

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []
        self._torch: Any = None
        self._steps_checked = 0
        self._anomaly_steps = 0
        self._anomaly_switched_on = False
        self._profiler_steps = 0
        self._anomaly_sites = SiteCounter()
        self._gradcheck_sites = SiteCounter()
        self._zero_grad_calls = 0
        self._fill_sites = SiteCounter()
        self._autocast_sites = SiteCounter()
        self._autocast_libraries: dict[Any, str] = {}  # the library each user line entered its autocast through
        self._optimizer_sites = SiteCounter()
        self._float64_sites = SiteCounter()
        self._half_sites = SiteCounter()
        self._inspected: dict[str, Any] = {}
        self._checks = _Checks(first=self._checked)
        self._save_steps: list[int] = []
        self._save_s: list[float] = []
        self._save_sites = SiteCounter()
        self._save_libraries: dict[Any, str] = {}  # the library each user line saved through ("": its own call)
        self.notes: list[str] = []

    def unavailable_reason(self) -> str | None:
        return None

    def start(self, run_dir: Path) -> None:
        watch = ImportWatch("torch", self._install)
        self._undo.append(watch.remove)
        watch.install()

    def stop(self) -> CollectorResult:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        torch = self._torch
        if torch is None:
            return CollectorResult(CollectorStatus("unavailable", "the script did not use torch"))
        if not self._inspected:  # fewer steps than INSPECT_AT_STEP: read the flags now, the model is unknown
            self._inspected = {"modules_inspected": False, **_flags(torch)}
        return CollectorResult(CollectorStatus("ok"), Practices(
            torch_version=str(getattr(torch, "__version__", "")),
            steps_checked=self._steps_checked,
            anomaly_steps=self._anomaly_steps,
            anomaly_sites=self._anomaly_sites.sites(),
            profiler_steps=self._profiler_steps,
            gradcheck_sites=self._gradcheck_sites.sites(),
            zero_grad_calls=self._zero_grad_calls,
            zero_grad_fill_calls=self._fill_sites.total(),
            zero_grad_fill_sites=self._fill_sites.sites(),
            cpu_autocast_sites=self._autocast_sites.sites(),
            cpu_autocast_by=",".join(sorted(set(self._autocast_libraries.values()) - {""})),
            optimizer_sites=self._optimizer_sites.sites(),
            float64_sites=self._float64_sites.sites(),
            half_precision_sites=self._half_sites.sites(),
            distribution_check_steps=tuple(self._checks.steps),
            distribution_check_s=tuple(self._checks.seconds),
            distribution_check_counts=tuple(self._checks.counts),
            distribution_sites=self._checks.sites.sites(),
            checkpoint_save_steps=tuple(self._save_steps),
            checkpoint_save_s=tuple(self._save_s),
            checkpoint_save_sites=self._save_sites.sites(),
            checkpoint_save_by=",".join(sorted(set(self._save_libraries.values()) - {""})),
            **self._inspected,
        ), notes=tuple(self.notes))

    # -- hooks -------------------------------------------------------------------------------------------
    def _install(self) -> None:
        import torch

        self._torch = torch
        self._undo.append(patch(torch, "set_anomaly_enabled", self._wrap_anomaly))
        fx_traceback = sys.modules.get("torch.fx.traceback")  # imported with torch; anomaly mode formats through it
        if callable(getattr(fx_traceback, "format_stack", None)):
            self._undo.append(patch(fx_traceback, "format_stack", lambda original: script_format_stack(fx_traceback)))
        for name in ("gradcheck", "gradgradcheck"):
            if callable(getattr(torch.autograd, name, None)):
                self._undo.append(patch(torch.autograd, name, self._wrap_counted(self._gradcheck_sites)))
        self._undo.append(patch(torch.optim.Optimizer, "zero_grad", self._wrap_zero_grad))
        # where each optimizer is built: a subclass's constructor calls this one, under the user's line
        self._undo.append(patch(torch.optim.Optimizer, "__init__", self._wrap_counted(self._optimizer_sites)))
        self._undo.append(patch(torch.nn.Module, "zero_grad", self._wrap_zero_grad))
        # where float64, or half precision, is made the model's dtype (.double(), .half(), .to(dtype)) or torch's
        half = (torch.float16, torch.bfloat16)

        def sites_of_dtype(*args: Any, **kwargs: Any) -> SiteCounter | None:
            for arg in (*args, *kwargs.values()):
                if arg is torch.float64:
                    return self._float64_sites
                if any(arg is dtype for dtype in half):
                    return self._half_sites
            return None

        self._undo.append(patch(torch.nn.Module, "double", self._wrap_counted(self._float64_sites)))
        for name in ("half", "bfloat16"):
            self._undo.append(patch(torch.nn.Module, name, self._wrap_counted(self._half_sites)))
        for owner, name in ((torch.nn.Module, "to"), (torch, "set_default_dtype")):
            self._undo.append(patch(owner, name, self._wrap_sited(sites_of_dtype)))
        autocast = getattr(getattr(torch, "amp", None), "autocast_mode", None)
        if autocast is not None and hasattr(autocast, "autocast"):
            self._undo.append(patch(autocast.autocast, "__enter__", self._wrap_autocast_enter))
        distribution = getattr(getattr(torch, "distributions", None), "Distribution", None)
        for name in ("__init__", "_validate_sample"):
            if callable(getattr(distribution, name, None)):
                self._undo.append(patch(distribution, name, self._checks.wrap(built=name == "__init__")))
        # checkpoint saves: torch's, and safetensors' (transformers saves a model's weights with it)
        self._undo.append(patch(torch, "save", self._wrap_save))
        watch = ImportWatch("safetensors.torch", self._install_safetensors)
        self._undo.append(watch.remove)
        watch.install()

    def _install_safetensors(self) -> None:
        saving = sys.modules.get("safetensors.torch")
        if saving is not None and callable(getattr(saving, "save_file", None)):
            self._undo.append(patch(saving, "save_file", self._wrap_save))

    def _wrap_save(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """A wrapper timing each checkpoint save, with the step under way and the user's line under it. A save is a
        checkpoint where it goes to a file (a path, or an open file) or a library made it (Lightning serialises into
        a buffer, then writes it): the script's own ``torch.save`` into a buffer (a tensor serialised to be sent
        somewhere) is no checkpoint."""
        collector, clock = self, time.perf_counter

        def save(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return original(*args, **kwargs)
            finally:
                if len(collector._save_s) < SAVES_KEPT:
                    seconds = clock() - start
                    caller = sys._getframe(1)
                    frame = user_frame(caller)
                    where = (frame.f_code, frame.f_lineno) if frame is not None else None
                    if where not in collector._save_libraries:  # once a line: a path lookup a frame
                        collector._save_libraries[where] = calling_library(caller, outermost=True)
                    target = args[1] if len(args) > 1 else kwargs.get("f", kwargs.get("filename"))
                    if isinstance(target, (str, os.PathLike)) or isinstance(getattr(target, "name", None), str) \
                            or collector._save_libraries[where]:
                        events = collector._events
                        collector._save_steps.append(events.steps_seen() if events is not None else 0)
                        collector._save_s.append(seconds)
                        collector._save_sites.count(frame)

        return save

    def _wrap_autocast_enter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        sites, libraries = self._autocast_sites, self._autocast_libraries
        low = {getattr(self._torch, name, None) for name in ("bfloat16", "float16")}

        def __enter__(mode: Any) -> Any:
            if getattr(mode, "_enabled", False) and getattr(mode, "device", None) == "cpu" and \
                    getattr(mode, "fast_dtype", None) in low:
                caller = sys._getframe(1)
                if not _torch_internal(caller, AUTOCAST_FILES):
                    frame = user_frame(caller)
                    sites.count(frame)
                    where = (frame.f_code, frame.f_lineno) if frame is not None else None
                    if where not in libraries:  # once a line: the stack walk is a path lookup a frame
                        libraries[where] = calling_library(caller, outermost=True)  # "": the user's own
            return original(mode)

        return __enter__

    def _wrap_anomaly(self, original: Callable[..., Any]) -> Callable[..., Any]:
        collector = self

        def set_anomaly_enabled(enabled: bool, *args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1)
            if enabled and not collector._torch.is_anomaly_enabled() and not _torch_internal(caller):
                collector._anomaly_switched_on = True  # switched on, not restored on exit
                collector._anomaly_sites.count(user_frame(caller))
            return original(enabled, *args, **kwargs)

        return set_anomaly_enabled

    def _wrap_counted(self, sites: SiteCounter) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A wrapper counting the user's line under each call in ``sites``."""
        return self._wrap_sited(lambda *args, **kwargs: sites)

    def _wrap_sited(self, pick: Callable[..., SiteCounter | None],
                    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A wrapper counting the user's line under each call in ``pick(*args, **kwargs)`` (None: not counted)."""
        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            def counted(*args: Any, **kwargs: Any) -> Any:
                sites = pick(*args, **kwargs)
                if sites is not None:
                    sites.count(user_frame(sys._getframe(1)))
                return original(*args, **kwargs)

            return counted

        return wrap

    def _wrap_zero_grad(self, original: Callable[..., Any]) -> Callable[..., Any]:
        collector = self
        # the default this torch gives set_to_none (False before torch 2.0, True since)
        default = inspect.signature(original).parameters.get("set_to_none")
        fills_by_default = default is not None and default.default is False

        def zero_grad(module_or_optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            collector._zero_grad_calls += 1
            set_to_none = kwargs.get("set_to_none", args[0] if args else not fills_by_default)
            if not set_to_none:
                collector._fill_sites.count(user_frame(sys._getframe(1)))
            return original(module_or_optimizer, *args, **kwargs)

        return zero_grad

    # -- at each step boundary ---------------------------------------------------------------------------
    def _on_step(self, index: int) -> int | None:
        torch = self._torch
        if torch is None:
            return None
        self._steps_checked += 1
        self._checks.step_began(index)
        on_now = bool(torch.is_anomaly_enabled())
        if on_now or self._anomaly_switched_on:
            self._anomaly_steps += 1
        self._anomaly_switched_on = on_now
        steps = self._events
        if torch.autograd._profiler_enabled() and not (steps is not None and steps.in_window()):
            self._profiler_steps += 1
        if index >= INSPECT_AT_STEP and not self._inspected:
            roots = steps.root_modules() if steps is not None else []
            try:
                self._inspected = {**inspect_modules(torch, roots), **_flags(torch)}
            except Exception as exc:  # an exotic module must not break the user's step
                self.notes.append(f"model not inspected: {exc}")
                self._inspected = {"modules_inspected": False, **_flags(torch)}
        return READ_EVERY if self._steps_checked >= READ_EACH and not self._checks.seen() else None

    def _checked(self) -> None:
        """``torch.distributions`` checked something: from the next boundary on, each is read (and the checks made
        before it are the step's under way)."""
        if self._events is not None:
            self._checks.began_unseen(self._events.steps_seen())
            self._events.wake_step_listener(self._on_step)


class _Checks:
    """The time ``torch.distributions`` spends checking arguments and samples, step by step."""

    def __init__(self, first: Callable[[], None] = lambda: None) -> None:
        """``first()`` is called at the first check."""
        self.steps: list[int] = []
        self.seconds: list[float] = []
        self.counts: list[int] = []
        self.sites = SiteCounter()
        self._first: Callable[[], None] | None = first
        self._step: int | None = None  # the step under way
        self._step_s = 0.0
        self._step_checks = 0
        self._built = 0

    def seen(self) -> bool:
        """Whether anything was checked yet."""
        return self._first is None

    def began_unseen(self, index: int) -> None:
        """Step ``index`` is the one under way (its beginning was not told: the boundaries were read sparsely)."""
        self._step = index

    def wrap(self, built: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A wrapper timing ``Distribution.__init__`` (``built``), where it checked its arguments, or
        ``_validate_sample``, which only runs to check."""
        checks, clock = self, time.perf_counter

        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            def timed(distribution: Any, *args: Any, **kwargs: Any) -> Any:
                start = clock()
                try:
                    return original(distribution, *args, **kwargs)
                finally:
                    if not built or getattr(distribution, "_validate_args", False):
                        if checks._first is not None:
                            first, checks._first = checks._first, None
                            first()
                        checks._step_s += clock() - start
                        checks._step_checks += 1
                        if built and checks._built < SITED_CHECKS:
                            checks._built += 1
                            checks.sites.count(user_frame(sys._getframe(1)))

            return timed

        return wrap

    def step_began(self, index: int) -> None:
        """Keep the step that ended (from the first with a check on, up to CHECKED_STEPS), and start on ``index``."""
        if self._step is not None and (self._step_checks or self.steps) and len(self.steps) < CHECKED_STEPS:
            self.steps.append(self._step)
            self.seconds.append(self._step_s)
            self.counts.append(self._step_checks)
        self._step, self._step_s, self._step_checks = index, 0.0, 0


ANOMALY_FILES = (os.path.join("autograd", "anomaly_mode.py"),)
AUTOCAST_FILES = (os.path.join("amp", "autocast_mode.py"),)
"""torch's own files an autocast is entered through: ``torch.cpu.amp.autocast`` (``cpu/amp/autocast_mode.py``)
calls the base class's ``__enter__``, and ``@torch.autocast(...)`` on a function enters it from
``decorate_autocast``."""


def _torch_internal(frame: FrameType | None, own: tuple[str, ...] = ANOMALY_FILES) -> bool:
    """Whether anomaly mode (or an autocast) is being switched on by torch itself (AOTAutograd traces a compiled
    graph under ``detect_anomaly(check_nan=False)``; activation checkpointing recomputes under the autocast state it
    saved), not by the user or their framework: the first caller outside the mode's ``own`` files lies in torch's
    own package."""
    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch, "__file__", None):
        return False
    package = os.path.dirname(torch.__file__) + os.sep
    while frame is not None and frame.f_code.co_filename.endswith(own):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(package)


def inspect_modules(torch: Any, roots: list[Any]) -> dict[str, Any]:
    """Layer patterns of the models being trained. A layer "feeds" the BatchNorm registered right after it in the
    same parent (``nn.Sequential`` runs children in that order; hand-written blocks almost always declare
    ``conv1, bn1`` in the order they run), and the norm's feature count must match the layer's output."""
    nn = torch.nn
    norms = (nn.modules.batchnorm._BatchNorm,)
    biased = (nn.modules.conv._ConvNd, nn.Linear)
    pairs: list[str] = []
    wasted = 0
    parallel: list[str] = []
    convs = channels_last = 0
    dropouts: dict[str, int] = {}  # the class holding dropout layers -> how many
    rates: set[float] = set()
    seen: set[int] = set()
    for root in roots:
        by_name: dict[str, Any] = {}
        for prefix, module in root.named_modules():
            by_name[prefix] = module  # (parents come before their children)
            if id(module) in seen:
                continue
            seen.add(id(module))
            if (rate := _dropout_rate(nn, module)) is not None:
                # (a recurrent layer drops out between its own layers: it holds its dropout itself)
                inside = isinstance(module, nn.RNNBase) or not prefix
                owner = type(module if inside else by_name.get(prefix.rpartition(".")[0], root))
                name = f"{owner.__module__}.{owner.__qualname__}"
                dropouts[name] = dropouts.get(name, 0) + 1
                rates.add(rate)
            if isinstance(module, nn.DataParallel):
                devices = len(getattr(module, "device_ids", None) or ())
                where = f"{prefix}: " if prefix else ""
                parallel.append(f"{where}DataParallel({type(module.module).__name__}) "
                                f"on {devices} device{'s' if devices != 1 else ''}")
            if isinstance(module, nn.modules.conv._ConvNd):
                convs += 1
                weight = module.weight
                if weight.dim() == 4 and weight.is_contiguous(memory_format=torch.channels_last):
                    channels_last += 1
            for (first, layer), (second, norm) in itertools.pairwise(module.named_children()):
                if (isinstance(layer, biased) and getattr(layer, "bias", None) is not None
                        and isinstance(norm, norms) and norm.num_features == _out_features(layer)):
                    where = f"{prefix}." if prefix else ""
                    pairs.append(f"{where}{first} ({type(layer).__name__}) -> {where}{second} ({type(norm).__name__})")
                    wasted += layer.bias.numel()
    owners = sorted(dropouts, key=lambda name: -dropouts[name])[:4]
    return {"modules_inspected": True, "bias_before_norm": tuple(pairs), "wasted_bias_params": wasted,
            "data_parallel": tuple(parallel), "conv_layers": convs, "channels_last_convs": channels_last,
            "dropout_layers": sum(dropouts.values()), "dropout_rates": tuple(sorted(rates, reverse=True)),
            "dropout_owners": tuple(owners)}


def _dropout_rate(nn: Any, module: Any) -> float | None:
    """The probability a dropout layer in train mode drops with (``nn.Dropout`` and its kin,
    ``nn.MultiheadAttention``'s attention dropout, or a recurrent layer's between its layers); None for any other
    module, or one that drops nothing."""
    if not module.training:
        return None
    if isinstance(module, nn.modules.dropout._DropoutNd):
        rate = module.p
    elif isinstance(module, nn.MultiheadAttention) or (isinstance(module, nn.RNNBase) and module.num_layers > 1):
        rate = module.dropout
    else:
        return None
    return float(rate) if isinstance(rate, (int, float)) and rate > 0 else None


def _out_features(layer: Any) -> int | None:
    return getattr(layer, "out_channels", None) or getattr(layer, "out_features", None)


def _flags(torch: Any) -> dict[str, Any]:
    """The backend flags that decide which kernels run."""
    backends = torch.backends
    flags: dict[str, Any] = {
        "cudnn_benchmark": bool(backends.cudnn.benchmark),
        "cudnn_allow_tf32": bool(backends.cudnn.allow_tf32),
        "matmul_allow_tf32": bool(backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": str(torch.get_float32_matmul_precision()),
    }
    try:
        if torch.cuda.is_initialized():
            major, minor = torch.cuda.get_device_capability()
            flags["cuda_capability"] = f"{major}.{minor}"
    except Exception:  # a broken CUDA context: the capability stays unknown
        pass
    return flags
