"""Step and phase timing with no change to the user's code.

Hooks, all global and all removed at stop:
- ``optimizer.step()``: torch's global optimizer step pre/post hooks: the optimizer phase, and the step's end.
- DataLoader: ``_BaseDataLoaderIter.__next__`` is wrapped: the time spent in it is the step's data wait.
- backward: ``torch.autograd.backward`` and ``torch.autograd.grad`` are wrapped (``Tensor.backward`` calls the
  former).
- forward: after the first step, forward hooks on the *root* modules only: the outermost modules holding the
  parameters the optimizer trains (or, with no optimizer, every outermost module with parameters). Global module
  hooks would put every submodule call on torch's slow path and cost a launch-bound loop several percent.
- CUDA: once the script has initialised CUDA, events on the current stream at each phase change, resolved
  when the GPU has passed them (never synchronising the loop), give the device-side breakdown.

Only events from the thread that started the collector are counted (the training loop's thread).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gpuscope.analysis import thresholds as th
from gpuscope.analysis.steady import StepSummary, summarize
from gpuscope.collectors.base import CollectorResult, patch
from gpuscope.collectors.steplog import DeviceTimeline, StepLog, StepTracker
from gpuscope.importwatch import ImportWatch
from gpuscope.record import CollectorStatus, Loader

MAX_ROOT_MODULES = 32
"""Forward hooks go on at most this many root modules."""
MAX_LOADERS = 16
"""Distinct DataLoader configurations described in the record."""


@dataclass(frozen=True, slots=True)
class StepsPayload:
    """The steps collector's result."""

    summary: StepSummary
    loaders: tuple[Loader, ...]
    device: str
    notes: tuple[str, ...]


class StepsCollector:
    """Finds training steps and times their phases on the host (and on the GPU, under CUDA)."""

    name: ClassVar[str] = "steps"

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._undo: list[Callable[[], None]] = []
        self._optimizers: dict[int, weakref.ref[Any]] = {}
        self._loaders: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._loader_depth = 0
        self._roots_found = False
        self._discovery_s = 0.0
        self._device_failed = False
        self._roots: list[str] = []
        self._root_refs: list[weakref.ref[Any]] = []
        self._failures: list[str] = []
        self._torch: Any = None
        self.tracker: StepTracker | None = None
        self.summary: StepSummary | None = None
        """The steady-state figures, once stopped (collectors stopped after this one read them)."""

    def unavailable_reason(self) -> str | None:
        return None

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self, run_dir: Path) -> None:
        self._thread = threading.get_ident()
        self._pid = os.getpid()
        self.tracker = StepTracker(self._clock(), StepLog(th.STEP_HEAD, th.STEP_CAPACITY), self._clock)
        # first listener, so its one-time work comes before any profiler window opens or switches
        self.tracker.listeners.append(self._after_boundary)
        watch = ImportWatch("torch", self._install_torch_hooks)
        self._undo.append(watch.remove)
        watch.install()

    def mark_step(self) -> None:
        """An explicit step marker (``gpuscope.step()``)."""
        if self._mine():
            now = self._clock()
            self.tracker.explicit(now)  # type: ignore[union-attr]

    # -- for collectors that profile a window of steps -------------------------------------------------
    def add_step_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(index)`` as each step begins (in the training loop's thread, at the step boundary).
        Time the listener takes is gpuscope's and is kept out of the step's figures."""
        self.tracker.listeners.append(listener)  # type: ignore[union-attr]

    def add_phase_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(phase)`` whenever the phase being timed changes ("other" between phases). Called on
        the loop's hot path: keep it to a few microseconds."""
        self.tracker.phase_listeners.append(listener)  # type: ignore[union-attr]

    def cuda_in_use(self) -> bool:
        """Whether the script has initialised CUDA (gpuscope never does it first)."""
        return self._cuda_initialized()

    def window_opened(self) -> None:
        """A profiler started: steps it touches are left out of the steady-state figures."""
        self.tracker.window_opened()  # type: ignore[union-attr]

    def window_closed(self) -> None:
        """A profiler stopped."""
        self.tracker.window_closed()  # type: ignore[union-attr]

    def in_window(self) -> bool:
        """Whether one of gpuscope's profilers is running now."""
        return self.tracker.in_window  # type: ignore[union-attr]

    def steps_seen(self) -> int:
        """Steps counted so far."""
        return self.tracker.log.count  # type: ignore[union-attr]

    def stop(self) -> CollectorResult:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        tracker = self.tracker
        assert tracker is not None, "stop() before start()"
        notes = list(self._failures)
        try:
            tracker.finish()
        except Exception as exc:  # a broken CUDA context must not cost the host figures
            notes.append(f"device timing could not be resolved: {exc}")
        log = tracker.log
        summary = summarize(log.records(), log.count, log.head_size, log.body_weight, tracker.source or "none")
        self.summary = summary
        if tracker.dropped:
            notes.append(
                f"{tracker.dropped} steps first counted by a coarser marker were dropped when "
                f"{tracker.source} markers appeared"
            )
        if self._roots:
            notes.append(
                "forward timed on root modules: " + ", ".join(self._roots)
                + f" (finding them took {self._discovery_s * 1e3:.0f} ms once, left out of the steps)"
            )
        if tracker.device is not None and tracker.device.gave_up:
            notes.append("device timing stopped: its markers could not be recorded or read (see the host figures)")
        device = "cuda" if self._cuda_initialized() else "cpu"
        payload = StepsPayload(summary, self._loader_records(), device, tuple(notes))
        return CollectorResult(CollectorStatus("ok"), payload)

    # -- hook installation -------------------------------------------------------------------------------
    def _install_torch_hooks(self) -> None:
        try:
            import torch
            import torch.autograd
            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
            from torch.utils.data import dataloader
        except Exception as exc:  # torch too old or broken: explicit markers still work
            self._failures.append(f"torch hooks not installed: {exc}")
            return
        self._torch = torch
        for handle in (
            register_optimizer_step_pre_hook(self._optimizer_pre),
            register_optimizer_step_post_hook(self._optimizer_post),
        ):
            self._undo.append(handle.remove)
        self._undo.append(patch(dataloader._BaseDataLoaderIter, "__next__", self._wrap_next))
        self._undo.append(patch(torch.autograd, "backward", self._wrap_phase("backward")))
        self._undo.append(patch(torch.autograd, "grad", self._wrap_phase("backward")))

    def _mine(self) -> bool:
        return threading.get_ident() == self._thread and os.getpid() == self._pid

    # -- hooks -------------------------------------------------------------------------------------------
    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._mine():
            self._optimizers.setdefault(id(optimizer), weakref.ref(optimizer))
            self.tracker.enter("optimizer", self._clock())  # type: ignore[union-attr]

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._mine():
            now = self._clock()
            tracker = self.tracker
            tracker.exit("optimizer", now)  # type: ignore[union-attr]
            tracker.optimizer_stepped(id(optimizer), now)  # type: ignore[union-attr]

    def _wrap_next(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        collector = self

        def __next__(iterator: Any) -> Any:
            if collector._loader_depth or not collector._mine():
                return original(iterator)
            tracker = collector.tracker
            clock = collector._clock
            tracker.batch_requested(clock())  # type: ignore[union-attr]
            start = clock()  # after any listener that ran at the step boundary
            tracker.enter("data_wait", start)  # type: ignore[union-attr]
            collector._loader_depth += 1
            try:
                batch = original(iterator)
            except StopIteration:
                now = clock()
                tracker.exit("data_wait", now)  # type: ignore[union-attr]
                tracker.batch_exhausted(now)  # type: ignore[union-attr]
                raise
            except BaseException:
                tracker.exit("data_wait", clock())  # type: ignore[union-attr]
                raise
            finally:
                collector._loader_depth -= 1
            now = clock()
            tracker.exit("data_wait", now)  # type: ignore[union-attr]
            collector._count_batch(iterator, batch, now - start)
            return batch

        return __next__

    def _wrap_phase(self, phase: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        collector = self

        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            def timed(*args: Any, **kwargs: Any) -> Any:
                if not collector._mine():
                    return original(*args, **kwargs)
                tracker = collector.tracker
                tracker.enter(phase, collector._clock())  # type: ignore[union-attr]
                try:
                    return original(*args, **kwargs)
                finally:
                    tracker.exit(phase, collector._clock())  # type: ignore[union-attr]

            return timed

        return wrap

    def _forward_pre(self, module: Any, args: Any) -> None:
        if self._mine():
            self.tracker.enter("forward", self._clock())  # type: ignore[union-attr]

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        if self._mine():
            self.tracker.exit("forward", self._clock())  # type: ignore[union-attr]

    # -- after each step boundary ------------------------------------------------------------------------
    def _after_boundary(self, index: int) -> None:
        """A step begins (a step listener): once steps are being counted, hook the root modules; start device
        timing when CUDA is up. The tracker keeps the time this takes out of the step."""
        tracker = self.tracker
        if self._torch is None or tracker is None:
            return
        # Wait for the kind of marker that will define the steps: an optimizer usually steps within the first
        # batch, and then only the modules it trains are hooked. A loop with no optimizer has shown itself
        # after two batches.
        settled = tracker.source != "dataloader" or index >= 2
        if not self._roots_found and settled:
            self._roots_found = True
            started = self._clock()
            try:
                self._hook_root_modules()
            except Exception as exc:
                self._failures.append(f"forward not timed: {exc}")
            self._discovery_s = self._clock() - started
        if tracker.device is None and not self._device_failed and self._cuda_initialized():
            torch = self._torch
            try:
                tracker.attach_device(DeviceTimeline(
                    lambda: torch.cuda.Event(enable_timing=True),
                    # a timing event may not be recorded on a stream that is capturing a CUDA graph
                    can_mark=lambda: not torch.cuda.is_current_stream_capturing(),
                ))
            except Exception as exc:
                self._failures.append(f"device timing unavailable: {exc}")
                self._device_failed = True

    def _hook_root_modules(self) -> None:
        nn = self._torch.nn
        trained = {
            id(p)
            for ref in self._optimizers.values()
            if (opt := ref()) is not None
            for group in opt.param_groups
            for p in group["params"]
        }
        # type() rather than isinstance(): isinstance reads __class__, which some lazy objects answer with a warning
        modules = [m for m in gc.get_objects() if issubclass(type(m), nn.Module)]
        if trained:
            owners = [m for m in modules if any(id(p) in trained for p in m.parameters())]
        else:
            owners = [m for m in modules if next(m.parameters(), None) is not None]
        inner = {id(c) for m in owners for c in m.modules() if c is not m}
        roots = [m for m in owners if id(m) not in inner][:MAX_ROOT_MODULES]
        for module in roots:
            pre = module.register_forward_pre_hook(self._forward_pre)
            try:
                post = module.register_forward_hook(self._forward_post, always_call=True)
            except TypeError:  # torch without always_call
                post = module.register_forward_hook(self._forward_post)
            self._undo.extend((pre.remove, post.remove))
        self._roots = sorted(type(m).__name__ for m in roots)
        self._root_refs = [weakref.ref(m) for m in roots]

    def _cuda_initialized(self) -> bool:
        torch = self._torch if self._torch is not None else sys.modules.get("torch")
        try:
            return bool(torch is not None and torch.cuda.is_initialized())
        except Exception:
            return False

    # -- DataLoader descriptions -------------------------------------------------------------------------
    def _count_batch(self, iterator: Any, batch: Any, wait_s: float) -> None:
        dataset = getattr(iterator, "_dataset", None)
        key = (type(dataset).__name__, id(dataset), getattr(iterator, "_num_workers", 0), _batch_size(iterator))
        entry = self._loaders.get(key)
        if entry is None:
            if len(self._loaders) >= MAX_LOADERS:
                return
            info = _describe(iterator)
            info["batch_tensors"] = tuple(describe_tensors(batch))
            # kept (strongly: the script's loader may be gone by the end) for the data probe, after the run
            entry = self._loaders[key] = {"info": info, "batches": 0, "wait_s": 0.0, "dataset": dataset,
                                          "loading": _loading(iterator)}
        entry["batches"] += 1
        entry["wait_s"] += wait_s

    def probe_dataset(self) -> Any:
        """The map-style dataset the steps waited on longest (for the data probe), or None."""
        for entry in sorted(self._loaders.values(), key=lambda e: -e["wait_s"]):
            if not entry["info"]["iterable"] and entry["dataset"] is not None:
                return entry["dataset"]
        return None

    def probe_loader(self) -> dict[str, Any] | None:
        """What the loader probe needs of the loader the steps waited on longest: its description (``info``),
        ``batches`` and ``wait_s`` as measured, and the ``dataset``, ``collate_fn``, ``drop_last`` and
        ``worker_init_fn`` it loaded with (kept strongly); None when no DataLoader was iterated."""
        for entry in sorted(self._loaders.values(), key=lambda e: -e["wait_s"]):
            return {"info": entry["info"], "batches": entry["batches"], "wait_s": entry["wait_s"],
                    "dataset": entry["dataset"], **entry.get("loading", {})}
        return None

    def root_modules(self) -> list[Any]:
        """The root modules whose forward is timed, while they are alive (found at the first steps)."""
        return [m for ref in self._root_refs if (m := ref()) is not None]

    def _loader_records(self) -> tuple[Loader, ...]:
        return tuple(
            Loader(batches=e["batches"], wait_s=e["wait_s"], **e["info"])
            for e in sorted(self._loaders.values(), key=lambda e: -e["wait_s"])
        )


def _batch_size(iterator: Any) -> int | None:
    sampler = getattr(iterator, "_index_sampler", None)
    size = getattr(sampler, "batch_size", None)
    return size if isinstance(size, int) else None


MAX_BATCH_TENSORS = 8


def describe_tensors(batch: Any, depth: int = 0) -> list[str]:
    """The tensors (and NumPy arrays) in a batch, as ``dtype[shape] device``, first MAX_BATCH_TENSORS of them."""
    shape = getattr(batch, "shape", None)
    dtype = getattr(batch, "dtype", None)
    if shape is not None and dtype is not None:
        name = str(dtype).removeprefix("torch.")
        return [f"{name}[{', '.join(str(int(d)) for d in shape)}] {getattr(batch, 'device', 'cpu')}"]
    if isinstance(batch, dict):
        batch = list(batch.values())
    found: list[str] = []
    if isinstance(batch, (list, tuple)) and depth < 4:
        for item in batch:
            found.extend(describe_tensors(item, depth + 1))
            if len(found) >= MAX_BATCH_TENSORS:
                return found[:MAX_BATCH_TENSORS]
    return found


def _loading(iterator: Any) -> dict[str, Any]:
    """How a DataLoader builds its batches, read off its iterator, for the loader probe to rebuild it."""
    sampler = getattr(iterator, "_index_sampler", None)
    return {
        "collate_fn": getattr(iterator, "_collate_fn", None),
        "drop_last": bool(getattr(sampler, "drop_last", getattr(iterator, "_drop_last", False))),
        "worker_init_fn": getattr(iterator, "_worker_init_fn", None),
    }


def _describe(iterator: Any) -> dict[str, Any]:
    """A DataLoader's settings, read off its iterator (private attributes, so every read is optional)."""
    dataset = getattr(iterator, "_dataset", None)
    kind = getattr(iterator, "_dataset_kind", 0)
    workers = getattr(iterator, "_num_workers", 0)
    context = None
    if workers:
        for worker in getattr(iterator, "_workers", ()) or ():
            context = type(worker).__name__.replace("Process", "").lower() or None
            break
    prefetch = getattr(iterator, "_prefetch_factor", None)
    return {
        "dataset": type(dataset).__name__,
        "num_workers": workers if isinstance(workers, int) else 0,
        "batch_size": _batch_size(iterator),
        "pin_memory": bool(getattr(iterator, "_pin_memory", False)),
        "persistent_workers": bool(getattr(iterator, "_persistent_workers", False)),
        "prefetch_factor": prefetch if isinstance(prefetch, int) else None,
        "start_method": {"fork": "fork", "spawn": "spawn", "forkserver": "forkserver"}.get(context or ""),
        "iterable": kind == 1,
    }
