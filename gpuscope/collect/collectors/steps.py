"""Step and phase timing with no change to the user's code.

Hooks, all global and all removed at stop:
- ``optimizer.step()``: torch's global optimizer step pre/post hooks: the optimizer phase, and the step's end. A
  closure passed to it (Lightning's automatic optimisation runs the whole training step in one; LBFGS calls it up to
  20 times a step) is wrapped: its time is no part of the optimizer phase (its forward and backward are timed as
  such, the rest is "other"), and its ``backward()`` begins no step.
- DataLoader: ``_BaseDataLoaderIter.__next__`` is wrapped: the time spent in it is the step's data wait. A batch
  taken in another thread (a prefetching thread handing batches over) counts for its loader, and from then on the
  loop's waits in ``queue.Queue.get`` are its data wait.
- backward: ``torch.autograd.backward`` and ``torch.autograd.grad`` are wrapped (``Tensor.backward`` calls the
  former). In a loop with no optimizer, explicit mark or DataLoader, each top-level one begins a step. The tensor
  the outermost one is called on is kept, unread, as the step's loss (``steplog.LossLog``): read after the run.
- forward: after the first step, the calls of the *root* modules only are timed (their class's ``__call__`` wrapped,
  nothing put on the modules: see ``forward_modules``): the outermost modules holding the parameters the optimizer
  trains (or, with no optimizer, every outermost module with parameters). A root whose forward does not run in the
  step that follows (a LightningModule: Lightning calls its ``training_step``, which calls ``self.model``) is
  replaced by its children that hold trained parameters, one level a step, until the timed modules are the
  outermost ones whose forward runs; a step that timed only part of the forward pass is left out of the figures.
  A forward in eval mode or without gradients marks its step (an evaluation pass).
- CUDA: once the script has initialised CUDA, events on the current stream at each phase change, resolved when the
  GPU has passed them (never synchronising the loop), give the device-side breakdown.

Only events from the training loop's thread count: the one that started the collector, or the one whose
step-defining events come first (a script training in a ``threading.Thread``: see ``loopthread``).

Taken out in the middle of the run (``--profile-steps``): a step begins inside torch's optimizer hook, while torch
iterates over its hooks, where no hook can be removed. So the stop is asked for (``stop_at_safe_point``) and runs
at the next *safe point*: the next DataLoader ``__next__``, forward of a timed module, ``backward()`` or
``gpuscope.step()``, each entered from the user's code (torch calls forward pre-hooks from a copy of its hook list).
"""

from __future__ import annotations

import multiprocessing.queues
import queue
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from threading import get_ident
from types import FrameType
from typing import TYPE_CHECKING, Any, ClassVar

from gpuscope.collect.callsites import SITE_CALLS, SiteCounter, calling_library, user_frame
from gpuscope.collect.captures import StepCapture
from gpuscope.collect.framework.base import CollectorResult, ProbeInputs, Stage, WindowRequest, patch, register
from gpuscope.collect.importwatch import ImportWatch
from gpuscope.collect.steps.device_timeline import timing_event
from gpuscope.collect.steps.forward_modules import ForwardModules
from gpuscope.collect.steps.frozen_models import FrozenModels
from gpuscope.collect.steps.loaders import LoaderBook
from gpuscope.collect.steps.loopthread import LoopThread
from gpuscope.collect.steps.no_grad_passes import NoGradPasses
from gpuscope.collect.steps.optimizer_watch import OptimizerWatch
from gpuscope.collect.steps.phase_clock import OTHER
from gpuscope.collect.steps.recompute import Recompute
from gpuscope.collect.steps.step_listeners import QUIET
from gpuscope.collect.steps.steplog import DeviceTimeline, StepLog, StepTracker
from gpuscope.record import CollectorStatus

if TYPE_CHECKING:
    from gpuscope.collect.framework.options import CollectOptions
    from gpuscope.collect.framework.schedule import Plan


@register
class StepsCollector:
    """Finds training steps and times their phases on the host (and on the GPU, under CUDA): the source of the step
    events every other live collector follows."""

    name: ClassVar[str] = "steps"
    field: ClassVar[str | None] = "steps"
    stage: ClassVar[Stage] = "live"
    provides_steps: ClassVar[bool] = True
    gpu_only: ClassVar[bool] = False

    @classmethod
    def wants(cls, options: CollectOptions) -> WindowRequest | None:
        return None  # it times every step, and profiles none

    @classmethod
    def create(cls, options: CollectOptions, plan: Plan) -> StepsCollector:
        return cls(skip=options.skip_steps)

    def __init__(self, clock: Callable[[], float] = time.perf_counter, skip: int = 0) -> None:
        """``skip``: the first steps are counted, not kept (``--skip-steps``)."""
        self._clock = clock
        self._skip = skip
        self._at_safe_point: Callable[[], None] | None = None
        self._undo: list[Callable[[], None]] = []
        self._optimizers: dict[int, weakref.ref[Any]] = {}  # stepped in the loop's thread, by id, in order
        self._last_stepped: dict[int, int] = {}  # id of each of them -> the step it last stepped in
        self._open_steps: list[tuple[int, str, float]] = []  # optimizer steps open, outermost first: id, class, start
        self._step_s: dict[str, float] = {}  # time inside the steps of each optimizer class, nested ones too
        self._outermost_s: dict[str, float] = {}  # time inside the outermost ones, by class (ZeroRedundancyOptimizer)
        self._optimizer_by: str | None = None  # the library that stepped the first optimizer ("": the script)
        self.probed_optimizer: Any = None  # kept alive for the post-run optimizer probe: the first, or the windows'
        self.loaders = LoaderBook()  # the DataLoaders iterated (the post-run probes load the slowest one again)
        self._loader_depth = 0
        self._queue_sites = SiteCounter()  # the lines whose waits on a queue were data wait (the first SITE_CALLS)
        self._forward_sites = SiteCounter()  # the lines that called a training forward (the first SITE_CALLS)
        self._closure_calls = 0  # calls of the closures passed to optimizer.step that ran a backward, to the end
        self._backwards = 0  # backward() and autograd.grad() calls begun, to the end
        self._closure_end: list[Callable[[], None]] = []
        self._backward_depth = 0  # backward() in backward() (a gradient penalty) or in a closure marks no step
        self._in_backward = 0  # backward() calls open: the outermost one's tensor is the step's loss
        self._stepped_in_backward: list[weakref.ref[Any]] = []  # optimizers stepped by gradient hooks, in order
        self._inner: dict[int, weakref.ref[Any]] = {}  # id of a wrapper optimizer -> the one its step stepped
        self._roots_found = False
        self._rooted: set[int] = set()  # ids of the optimizers whose modules were looked for
        self._discovery_s = 0.0
        # the modules whose forward is timed, and the models no optimizer trains, timed apart
        self.forward = ForwardModules(self._forward_pre, self._forward_post,
                                      FrozenModels(self._clock, self._frozen_step, self.loaders))
        self.recompute = Recompute(self._clock, self._frozen_step)  # activation checkpointing's recomputation
        self.no_grad = NoGradPasses()  # the trained model's passes without gradients in the steps (an evaluation)
        self._optimizer_watch = OptimizerWatch()  # the steps are provisional while an optimizer built has not stepped
        self._device_failed = False
        self._cuda_built = True  # False for a torch built without CUDA (or ROCm): no step asks whether CUDA is up
        self._failures: list[str] = []
        self._torch: Any = None
        self.tracker: StepTracker | None = None

    def unavailable_reason(self) -> str | None:
        return None

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self, run_dir: Path) -> None:
        self._loop = LoopThread()
        self.tracker = StepTracker(self._clock(), StepLog(skip=self._skip), self._clock)
        self.tracker.hold = self._optimizer_watch.holds
        self.loaders.follow(self.tracker)
        self.tracker.schedule.add(self._after_boundary)  # first: its one-time work before any window opens
        watch = ImportWatch("torch", self._install_torch_hooks)
        self._undo.append(watch.remove)
        watch.install()

    def mark_step(self) -> None:
        """An explicit step marker (``gpuscope.step()``)."""
        if self._defines_step():
            self.tracker.explicit(self._clock())  # type: ignore[union-attr]
            self._safe_point()

    def stop_at_safe_point(self, action: Callable[[], None]) -> None:
        """Call ``action`` (which stops this collector) at the next safe point in the loop's thread (see the
        module's documentation); a step listener may ask for it, where stopping would break torch's hook loop."""
        self._at_safe_point = action

    def _safe_point(self) -> bool:
        """Run the action asked for, if any: True when it ran (the caller's hook has been taken out)."""
        action, self._at_safe_point = self._at_safe_point, None
        if action is None:
            return False
        action()
        return True

    # -- the step events other collectors follow (framework.base.StepEvents) ----------------------------------
    def add_step_listener(self, listener: Callable[[int], int | None]) -> None:
        """``listener(index)`` as each step begins, in the loop's thread; its time is kept out of the step's. It
        may return how many steps on it next wants to be told (``step_listeners``)."""
        self.tracker.schedule.add(listener)  # type: ignore[union-attr]

    def remove_step_listener(self, listener: Callable[[int], int | None]) -> None:
        self.tracker.schedule.remove(listener)  # type: ignore[union-attr]

    def wake_step_listener(self, listener: Callable[[int], int | None]) -> None:
        self.tracker.schedule.wake(listener)  # type: ignore[union-attr]

    def add_phase_listener(self, listener: Callable[[str], None]) -> None:
        """``listener(phase)`` on each phase change ("other" between phases), on the hot path: microseconds."""
        self.tracker.phase_listeners.append(listener)  # type: ignore[union-attr]

    def remove_phase_listener(self, listener: Callable[[str], None]) -> None:
        listeners = self.tracker.phase_listeners  # type: ignore[union-attr]
        if listener in listeners:
            listeners.remove(listener)

    def closure_calls(self) -> int:
        return self._closure_calls

    def on_closure_end(self, listener: Callable[[], None]) -> None:
        self._closure_end.append(listener)

    def off_closure_end(self, listener: Callable[[], None]) -> None:
        if listener in self._closure_end:
            self._closure_end.remove(listener)

    def window_closed(self) -> None:  # a profiler stopped
        self.tracker.window_closed()  # type: ignore[union-attr]

    def in_window(self) -> bool:  # whether one of gpuscope's profilers is running now
        return self.tracker.in_window  # type: ignore[union-attr]

    def loops_begun(self) -> int:  # training loops begun so far (``LoopBook.begun``)
        return self._optimizer_watch.loops.begun()

    def steps_seen(self) -> int:  # steps counted so far
        return self.tracker.log.count  # type: ignore[union-attr]

    def loop_thread(self) -> int:  # the kernel's id for the loop's thread (``LoopThread.native_id``)
        return self._loop.native_id

    def epoch_steps(self) -> int | None:
        return self.loaders.epoch_steps(self.tracker.log.count)  # type: ignore[union-attr]

    def step_evaluated(self, index: int) -> bool:
        """Whether the trained model ran forward in eval mode or without gradients in step ``index`` (ended)."""
        return getattr(self.tracker.log.find(index), "evaluated", False)  # type: ignore[union-attr]

    def cuda_possible(self) -> bool:
        return self._torch is None or self._cuda_built

    def window_opened(self) -> None:
        """A profiler started: its steps are left out of the figures, and their optimizer is the one probed after."""
        self.tracker.window_opened()  # type: ignore[union-attr]
        self.probed_optimizer = self._optimizer_watch.anchor() or self.probed_optimizer

    def stop(self) -> CollectorResult:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        self.forward.remove()
        tracker = self.tracker
        assert tracker is not None, "stop() before start()"
        notes = list(self._failures)
        try:
            tracker.finish(self._clock())
        except Exception as exc:  # a broken CUDA context must not cost the host figures
            notes.append(f"device timing could not be resolved: {exc}")
        log = tracker.log
        losses: tuple[tuple[int, float], ...] = ()
        try:
            losses = self._read_losses()
        except Exception as exc:  # a CUDA error that ended the script leaves its tensors unreadable
            notes.append(f"the losses could not be read: {exc}")
        if tracker.dropped:
            notes.append(f"{tracker.dropped} steps first counted by another kind of marker were dropped when "
                         f"{tracker.source} markers appeared")
        if self._loop.adopted:
            notes.append(f"the training loop ran in the thread {self._loop.adopted!r}, followed from its first step")
        if (forward := self.forward.note(self._discovery_s)) is not None:
            notes.append(forward)
        if tracker.device is not None and tracker.device.gave_up:
            notes.append("device timing stopped: its markers could not be recorded or read (see the host figures)")
        return CollectorResult(CollectorStatus("ok"), StepCapture(
            records=tuple(log.records()), count=log.count, head=log.skip + log.head_size,
            body_weight=log.body_weight, source=tracker.source or "none", loaders=self.loaders.records(),
            device="cuda" if self.cuda_in_use() else "cpu", skipped=min(log.skip, log.count),
            passes=(tracker.passes[0], tracker.passes[1]), final_evaluation_s=tracker.final_evaluation_s,
            loops=self._optimizer_watch.loops.starts(), no_grad_modes=(*self.forward.no_grad_modes,),
            device_markers=tracker.device.marked if tracker.device is not None else 0, losses=losses,
            closure_calls=self._closure_calls, no_grad_s=self.no_grad.seconds(log.count),
            no_grad_sites=self.no_grad.sites.sites(limit=3), no_grad_by=self.no_grad.by,
            forward_sites=self._forward_sites.sites(limit=3),
            optimizer_by=self._optimizer_by or "",
            frozen_models=self.forward.frozen.records(),
            queue_waits=self._queue_sites.sites(limit=3),
            checkpointing=self.recompute.record()),
            notes=tuple(notes))

    def probe_inputs(self) -> ProbeInputs:
        """The slowest loader and its dataset, and the optimizer stepped first and its peers, for the post-run
        probes."""
        dataset, fetch = self.loaders.probe_dataset()
        probed = self._innermost(self.probed_optimizer)
        name = type(probed).__name__
        own, outermost = self._step_s.get(name), sum(self._outermost_s.values())
        share = min(1.0, own / outermost) if probed is not None and own is not None and outermost > 0 else None
        _, around = max(((s, n) for n, s in self._outermost_s.items() if n != name), default=(0.0, ""))
        return ProbeInputs(self.loaders.probe_loader(), dataset, fetch, probed, self._peers(probed), share, around)

    def _innermost(self, optimizer: Any) -> Any:
        """The optimizer whose update ``optimizer``'s step runs: the one a wrapper's step steps, or itself."""
        for _ in range(4):
            ref = self._inner.get(id(optimizer))
            inner = ref() if ref is not None else None
            if inner is None:
                break
            optimizer = inner
        return optimizer

    def _peers(self, probed: Any) -> tuple[Any, ...]:
        """The optimizers of ``probed``'s class that stepped in the last step it stepped in."""
        last = self._last_stepped.get(id(probed))
        if probed is None or last is None:
            return ()
        alive = (ref() for key, ref in self._optimizers.items() if self._last_stepped.get(key) == last)
        return tuple(o for o in alive if o is not None and type(o) is type(probed))

    # -- hook installation -------------------------------------------------------------------------------
    def _install_torch_hooks(self) -> None:
        try:
            import torch
            import torch.autograd
            import torch.utils.checkpoint
            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
            from torch.utils.data import dataloader
        except Exception as exc:  # torch too old or broken: explicit markers still work
            self._failures.append(f"torch hooks not installed: {exc}")
            return
        self._torch = torch
        self._cuda_built = bool(getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None))
        self._undo += [register_optimizer_step_pre_hook(self._optimizer_pre).remove,
                       register_optimizer_step_post_hook(self._optimizer_post).remove]
        self._undo.append(self._optimizer_watch.install(torch))
        self._undo.append(patch(dataloader._BaseDataLoaderIter, "__next__", self._wrap_next))
        self._undo.append(patch(dataloader.DataLoader, "__init__", self.loaders.wrap_init))
        self._undo.append(patch(queue.Queue, "get", self._wrap_handoff))
        self._undo.append(patch(multiprocessing.queues.Queue, "get", self._wrap_handoff))
        self._undo.append(self.recompute.install(torch.utils.checkpoint))
        self._undo.append(patch(torch.autograd, "backward", self._wrap_phase("backward")))
        self._undo.append(patch(torch.autograd, "grad", self._wrap_phase("backward", by_grad=True)))

    def _defines_step(self) -> bool:
        """A step-defining event (an optimizer step, ``backward()``, ``gpuscope.step()``): whether it is the loop's,
        the calling thread followed from now on if the followed one has defined no step yet (``LoopThread.adopt``;
        its first batches were taken for a prefetching thread's, ``LoaderBook.take_elsewhere``: from now on they
        are the loop's own)."""
        if not self._loop.mine():
            if not self._loop.adopt():
                return False
            self.loaders.fed_by_thread = False
        self._loop.stepped = True
        return True

    # -- hooks -------------------------------------------------------------------------------------------
    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        loop = self._loop
        if not (loop.stepped and get_ident() == loop.ident):
            if self._by_device_thread():  # known, its time left in backward's, its step told of at backward's end
                self._known(optimizer)
                self._stepped_in_backward.append(weakref.ref(optimizer))
                return None
            if not self._defines_step():
                return None
        self._known(optimizer)
        tracker = self.tracker
        now = self._clock()
        if self._open_steps:  # inside another's step, or left open by a step that raised
            self._drop_ended_steps(sys._getframe(1))
        self._open_steps.append((id(optimizer), type(optimizer).__name__, now))
        tracker.enter("optimizer", now)  # type: ignore[union-attr]
        # step(self, closure) or step(self, closure=closure): the closure's time is not the update's
        if "closure" in kwargs and callable(kwargs["closure"]):
            return args, {**kwargs, "closure": self._timed_closure(kwargs["closure"])}
        if len(args) > 1 and callable(args[1]):
            return (args[0], self._timed_closure(args[1]), *args[2:]), kwargs
        return None

    def _by_device_thread(self) -> bool:
        """Whether an optimizer stepping on another thread than the loop's, the loop's inside backward(), is stepped
        by a gradient hook on autograd's device thread (CUDA runs a device's backward there, the loop's waiting)."""
        return bool(self._in_backward) and self._loop.stepped

    def _known(self, optimizer: Any) -> None:
        """``optimizer`` steps: kept, and the step it last stepped in."""
        known = self._optimizers.get(id(optimizer))
        if known is None or known() is not optimizer:  # new (its id may be a freed one's): its modules are to be
            self._optimizers[id(optimizer)] = weakref.ref(optimizer)  # found at the next boundary
            self._rooted.discard(id(optimizer))
            self.tracker.schedule.wake(self._after_boundary)  # type: ignore[union-attr]
            self.no_grad.stepper(sys._getframe(2))  # (the optimizer's step, calling _optimizer_pre)
            if self._optimizer_by is None:
                by = calling_library(sys._getframe(2), outermost=True)
                self._optimizer_by = "" if by == "gpuscope" else by
        if self.probed_optimizer is None:
            self.probed_optimizer = optimizer
        self._last_stepped[id(optimizer)] = self.tracker.log.count  # type: ignore[union-attr]

    def _timed_closure(self, closure: Callable[..., Any]) -> Callable[..., Any]:
        collector = self

        def timed_closure(*args: Any, **kwargs: Any) -> Any:  # any arguments: a custom step's callable may take some
            tracker = collector.tracker
            tracker.enter(OTHER, collector._clock())  # type: ignore[union-attr]
            collector._backward_depth += 1  # its backward() is the optimizer step's, no step of its own
            backwards = collector._backwards
            try:
                return closure(*args, **kwargs)
            finally:
                collector._backward_depth -= 1
                tracker.exit(OTHER, collector._clock())  # type: ignore[union-attr]
                # a call is a pass where it ran a backward: Lightning's manual optimisation hands each optimizer a
                # closure that does nothing (its backward ran before), and a GAN's two were taken for 2 passes a step
                if collector._backwards > backwards:
                    collector._closure_calls += 1
                    for listener in tuple(collector._closure_end):  # a listener may take itself off
                        listener()

        return timed_closure

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if get_ident() == self._loop.ident:
            now = self._clock()
            self.tracker.exit("optimizer", now)  # type: ignore[union-attr]
            self._step_ended(id(optimizer), now)
            if self._open_steps:  # stepped by a wrapper's step (ZeroRedundancyOptimizer's): that one is the step's
                self._inner[self._open_steps[-1][0]] = weakref.ref(optimizer)
            elif self._in_backward:  # stepped from a gradient hook (the optimizer fused into backward)
                self._stepped_in_backward.append(weakref.ref(optimizer))
            else:
                self._optimizer_stepped(optimizer, now)

    def _drop_ended_steps(self, wrapper: FrameType) -> None:
        """Keep in ``_open_steps`` only the optimizers whose step is running: a frame above ``wrapper`` (torch's
        hooked step, the same code for every optimizer) with that optimizer as its ``self``."""
        running = set()
        frame = wrapper.f_back
        while frame is not None:
            if frame.f_code is wrapper.f_code:
                running.add(id(frame.f_locals.get("self")))
            frame = frame.f_back
        self._open_steps[:] = [opened for opened in self._open_steps if opened[0] in running]

    def _step_ended(self, key: int, now: float) -> None:
        """The step of the optimizer of id ``key`` ended at ``now``: its time counted for its class, and for the
        outermost steps where it was one (those opened inside it and left open by an exception, dropped); not in
        the first step, whose first optimizer step imports torch._dynamo and builds the state."""
        opened = self._open_steps
        for i in range(len(opened) - 1, -1, -1):
            if opened[i][0] == key:
                _, name, began = opened[i]
                del opened[i:]
                if not self.tracker.log.count:  # type: ignore[union-attr]
                    return
                self._step_s[name] = self._step_s.get(name, 0.0) + now - began
                if not i:
                    self._outermost_s[name] = self._outermost_s.get(name, 0.0) + now - began
                return

    def _optimizer_stepped(self, optimizer: Any, now: float) -> None:
        """``optimizer`` stepped at ``now``: the step may end here. One stepped by a gradient hook is told of at
        backward's end: a step boundary inside backward stops the profilers there, and kineto's export crashes."""
        replaces = self._optimizer_watch.replaces_anchor(optimizer)
        tracker = self.tracker
        if tracker.optimizer_stepped(id(optimizer), now, replaces):  # type: ignore[union-attr]
            anchor_id = tracker.anchor_optimizer  # type: ignore[union-attr]
            # (another where the steps now end at the optimizer that stepped last before this one)
            anchor = optimizer if anchor_id == id(optimizer) else self._optimizer_watch.stepped(anchor_id)
            if anchor is not None:
                self._optimizer_watch.anchored(anchor, tracker.log.count - 1)  # type: ignore[union-attr]

    def _wrap_next(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        collector = self

        def __next__(iterator: Any) -> Any:
            # (the methods are called only when the thread is another or an action waits: this is the hot path)
            clock, loop = collector._clock, collector._loop
            if get_ident() != loop.ident:  # a prefetching thread's batch is counted; a forked worker's is not
                forked = loop.forked()
                return original(iterator) if forked else collector.loaders.take_elsewhere(original, iterator, clock)
            if collector._loader_depth or (collector._at_safe_point and collector._safe_point()):
                return original(iterator)
            tracker = collector.tracker
            tracker.batch_requested(clock())  # type: ignore[union-attr]
            if collector._at_safe_point and collector._safe_point():  # the step that began here ends the profiled
                return original(iterator)
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
            collector.loaders.count_batch(iterator, batch, now - start, requested=start)
            return batch

        return __next__

    def _wrap_handoff(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``queue.Queue.get`` and ``multiprocessing.Queue.get`` on the loop's thread (not inside a DataLoader's
        ``__next__``: its pin-memory thread and workers hand batches over through queues too): the loop waits for a
        batch once a thread takes DataLoader batches, and wherever it waits on a queue between its passes (a thread
        or process of the script's own building the batches, a BackgroundGenerator); the line is kept."""
        collector = self

        def get(handoff: Any, *args: Any, **kwargs: Any) -> Any:
            loop = collector._loop
            if collector._loader_depth or not loop.mine() or loop.forked() or not (
                    collector.loaders.fed_by_thread or collector.tracker.clock.current == OTHER):  # type: ignore
                return original(handoff, *args, **kwargs)
            if collector._queue_sites.total() < SITE_CALLS:
                collector._queue_sites.count(user_frame(sys._getframe(1)))
            tracker = collector.tracker
            tracker.enter("data_wait", collector._clock())  # type: ignore[union-attr]
            try:
                return original(handoff, *args, **kwargs)
            finally:
                tracker.exit("data_wait", collector._clock())  # type: ignore[union-attr]

        return get

    def _wrap_phase(self, phase: str, by_grad: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        collector = self

        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            def timed(*args: Any, **kwargs: Any) -> Any:
                # (the methods are called only when the thread is new or an action waits: this is the hot path)
                collector._backwards += 1  # (a closure call that ran one is a pass: _timed_closure)
                loop = collector._loop
                if (not (loop.stepped and get_ident() == loop.ident) and not collector._defines_step()) \
                        or (collector._at_safe_point and collector._safe_point()):
                    return original(*args, **kwargs)
                tracker = collector.tracker
                if not collector._in_backward:
                    collector._keep_loss(args[0] if args else kwargs.get("tensors", kwargs.get("outputs")), by_grad)
                    collector.no_grad.training()  # (a backward between two evaluations: no part of them)
                tracker.enter(phase, collector._clock())  # type: ignore[union-attr]
                collector._backward_depth += 1
                collector._in_backward += 1
                try:
                    return original(*args, **kwargs)
                finally:
                    collector._in_backward -= 1
                    collector._backward_depth -= 1
                    now = collector._clock()
                    tracker.exit(phase, now)  # type: ignore[union-attr]
                    if not collector._backward_depth:
                        stepped, collector._stepped_in_backward = collector._stepped_in_backward, []
                        for optimizer in stepped:
                            if (alive := optimizer()) is not None:
                                collector._optimizer_stepped(alive, now)
                        tracker.backward_ended(now)  # type: ignore[union-attr]
                        if collector._at_safe_point:
                            collector._safe_point()

            return timed

        return wrap

    def _keep_loss(self, loss: Any, by_grad: bool) -> None:
        """Keep the step's loss (the one-element tensor backward() was called on), detached, unread (``LossLog``); a
        CPU one read at once: a scalar tensor kept for the run, a small block among the step's large ones, keeps glibc
        from reusing the heap below it, which then grows every step (3.3 MB a step, to 1.3 GB in 300, on a small
        transformer whose 8 MB logits came from the heap)."""
        if isinstance(loss, (tuple, list)) and len(loss) == 1:
            loss = loss[0]
        if isinstance(loss, self._torch.Tensor) and loss.numel() == 1:
            log = self.tracker.log  # type: ignore[union-attr]
            kept = loss.detach()
            if kept.device.type == "cpu" and not kept.is_complex():
                try:
                    kept = float(kept)  # (no device to wait for)
                except Exception:  # a compiler's fake tensor, traced: kept as it is
                    pass
            log.losses.add(log.count, kept, by_grad)

    def _read_losses(self) -> tuple[tuple[int, float], ...]:
        """Each kept step's loss (the mean of its backward() calls'), read now that the run is over: one copy to
        the host per device and dtype."""
        entries = self.tracker.log.losses.entries  # type: ignore[union-attr]
        if not entries:
            return ()
        torch = self._torch
        groups: dict[tuple[Any, Any], list[int]] = {}
        values = [0.0] * len(entries)
        for position, (_, loss, _) in enumerate(entries):
            if isinstance(loss, float):  # read when kept (a CPU loss)
                values[position] = loss
            else:
                groups.setdefault((loss.device, loss.dtype), []).append(position)
        for positions in groups.values():
            read = torch.stack([entries[i][1].reshape(()) for i in positions]).double().cpu().tolist()
            for i, value in zip(positions, read):
                values[i] = value
        by_step: dict[int, tuple[list[float], list[float]]] = {}  # backward()'s, autograd.grad's
        for (step, _, by_grad), value in zip(entries, values):
            by_step.setdefault(step, ([], []))[by_grad].append(value)
        return tuple((step, sum(kept) / len(kept)) for step, (backward, grad) in sorted(by_step.items())
                     for kept in (backward or grad,))

    def _forward_pre(self, module: Any) -> bool:
        """A timed module's forward begins: True when it is timed, as the loop's (``_forward_post`` at its end)."""
        if get_ident() != self._loop.ident or (self._at_safe_point and self._safe_point()):
            return False
        if self.forward.checking:
            self.forward.ran(module)
        tracker = self.tracker
        nested = tracker.clock.current == "forward"  # type: ignore[union-attr]  # a wrapped module in its wrapper's
        now = self._clock()
        tracker.enter("forward", now)  # type: ignore[union-attr]
        if not nested and not (module.training and self._torch.is_grad_enabled()):  # eval(), no_grad: evaluation
            self.forward.evaluation_pass(module, tracker)
            self.no_grad.began(tracker.log.count, now, sys._getframe(2))  # type: ignore[union-attr]  # (the timed
            # call's caller: this is called by forward_modules' wrapper)
        elif not nested:
            self.no_grad.training()
            if self._forward_sites.total() < SITE_CALLS:  # (the caller of the timed call, as above)
                self._forward_sites.count(user_frame(sys._getframe(2)))
        return True

    def _frozen_step(self) -> int | None:
        """The open step's index, where a frozen model's call is the loop's (None: another thread's)."""
        if get_ident() != self._loop.ident or self.tracker is None:
            return None
        return self.tracker.log.count

    def _forward_post(self) -> None:
        """The forward timed (``_forward_pre`` said so) ended."""
        now = self._clock()
        self.tracker.exit("forward", now)  # type: ignore[union-attr]
        if self.no_grad.open and self.tracker.clock.current != "forward":  # type: ignore[union-attr]
            self.no_grad.ended(now)

    # -- after each step boundary ------------------------------------------------------------------------
    def _after_boundary(self, index: int) -> int | None:
        """A step begins (a step listener): once steps are being counted, hook the root modules; start device
        timing when CUDA is up. The tracker keeps the time this takes out of the step. Once both are settled, no
        step until an optimizer first steps (``_optimizer_pre`` wakes it)."""
        tracker = self.tracker
        if self._torch is None or tracker is None:
            return None
        # Wait for the kind of marker that defines the steps: an optimizer steps within the first batch, and then
        # only the modules it trains are hooked; a loop with no optimizer has shown itself after two batches.
        settled = tracker.source != "dataloader" or index >= 2
        # an optimizer stepped for the first time since the roots were found (a GAN's second one)
        late = self._roots_found and len(self._optimizers) > len(self._rooted)
        if (not self._roots_found and settled) or self.forward.checking or late:
            started = self._clock()
            try:
                if not self._roots_found:
                    self._roots_found = True
                    self.forward.hook_roots(self._torch.nn, self._trained_parameters(), tracker.log.count)
                    self._rooted = set(self._optimizers)
                else:  # the step that just ended timed only part of the forward pass: keep it out of the figures
                    ended = tracker.log.find(index - 1)
                    if (self.forward.check(tracker, index) if self.forward.checking else self._root_late_optimizers()) \
                            and ended is not None:
                        ended.profiled = True
            except Exception as exc:
                self.forward.remove()
                self._failures.append(f"forward not timed: {exc}")
            self._discovery_s += self._clock() - started
        if tracker.device is None and self._cuda_built and not self._device_failed and self.cuda_in_use():
            torch = self._torch
            try:
                # a timing event may not be recorded on a stream that is capturing a CUDA graph
                tracker.attach_device(DeviceTimeline(timing_event(torch),
                                                     can_mark=lambda: not torch.cuda.is_current_stream_capturing()))
            except Exception as exc:
                self._failures.append(f"device timing unavailable: {exc}")
                self._device_failed = True
        roots_settled = self._roots_found and not self.forward.checking and len(self._optimizers) == len(self._rooted)
        device_settled = tracker.device is not None or not self._cuda_built or self._device_failed
        return QUIET if roots_settled and device_settled else None

    def _trained_parameters(self, ids: set[int] | None = None) -> set[int]:
        """The ids of the parameters the optimizers stepped so far train (those of ``ids``, by default all)."""
        return {id(p) for key, ref in self._optimizers.items() if (ids is None or key in ids)
                and (opt := ref()) is not None for group in opt.param_groups for p in group["params"]}

    def _root_late_optimizers(self) -> bool:
        """Hook the modules trained by optimizers first stepped since the roots were found; True when the step that
        just ended ran some of their forward untimed."""
        new = set(self._optimizers) - self._rooted
        self._rooted |= new
        return self.forward.add_roots(self._torch.nn, self._trained_parameters(new))

    def cuda_in_use(self) -> bool:
        """Whether the script has initialised CUDA (gpuscope never does it first)."""
        torch = self._torch if self._torch is not None else sys.modules.get("torch")
        try:
            return bool(torch is not None and torch.cuda.is_initialized())
        except Exception:
            return False

    def root_modules(self) -> list[Any]:
        """The root modules, while they are alive (found at the first steps)."""
        return self.forward.root_modules()

    def frozen_modules(self) -> list[Any]:
        """The models the step runs without training them, timed apart (found with the roots), while alive."""
        return [m for entry in self.forward.frozen.timed.values() if (m := entry.ref()) is not None]

