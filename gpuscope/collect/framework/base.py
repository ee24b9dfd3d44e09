"""What a collector is: a declaration (name, record field, stage, the steps it wants, its budget), a start and a
stop (live collectors) or one run after the script (post-run probes), and plain data back. Collectors never raise
into the user's run: a failure is a status in the record.

A live collector that follows the steps sees them through ``StepEvents``, a narrow interface the stage hands it
(``follow``): step and phase listeners, whether CUDA is in use, and the marks that keep its profiling window out of
the steady-state figures. It never sees the steps collector itself.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

from gpuscope.record import CollectorStatus

from gpuscope.collect.framework.schedule import WindowRequest

if TYPE_CHECKING:
    from gpuscope.collect.captures import PostRunFacts
    from gpuscope.collect.framework.options import CollectOptions
    from gpuscope.collect.framework.schedule import Plan, Window

Stage = Literal["live", "post-run"]
"""``live``: started before the script and stopped after it; ``post-run``: run once after the script has ended,
every live collector has stopped and the steps are reduced (it may re-run the user's code, so nothing may see it)."""


@dataclass(frozen=True, slots=True)
class CollectorResult:
    """What a collector hands back: its status, a small typed payload of numbers (no live objects), and plain
    statements about how it measured (the record's ``meta.notes``, after its name)."""

    status: CollectorStatus
    payload: object | None = None
    notes: tuple[str, ...] = ()


class StepEvents(Protocol):
    """The run's steps as a collector sees them."""

    def add_step_listener(self, listener: Callable[[int], int | None]) -> None:
        """Call ``listener(index)`` as each step begins (in the loop's thread, outside the step's figures). It may
        return how many steps on it next wants to be called (None: the next one; ``step_listeners.QUIET``: not until
        woken): the steps between cost it nothing."""
        ...

    def remove_step_listener(self, listener: Callable[[int], int | None]) -> None:
        """Stop calling ``listener``, from the next step on: a collector done with the steps leaves the hot path."""
        ...

    def wake_step_listener(self, listener: Callable[[int], int | None]) -> None:
        """Call ``listener`` at the next step again, however many steps on it asked to be called next."""
        ...

    def closure_calls(self) -> int:
        """Calls of the closures passed to ``optimizer.step`` so far (LBFGS calls its own many times a step)."""
        ...

    def epoch_steps(self) -> int | None:
        """The steps an epoch holds, where the loop's DataLoader has a length (``LoaderBook.epoch_steps``)."""
        ...

    def on_closure_end(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` as each such closure returns, in the loop's thread, until ``off_closure_end``."""
        ...

    def off_closure_end(self, listener: Callable[[], None]) -> None:
        """No more calls of ``listener`` (``on_closure_end``)."""
        ...

    def add_phase_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(phase)`` on each phase change (on the loop's hot path: microseconds at most)."""
        ...

    def remove_phase_listener(self, listener: Callable[[str], None]) -> None:
        """No more calls of ``listener`` (``add_phase_listener``)."""
        ...

    def cuda_in_use(self) -> bool:
        """Whether the script has initialised CUDA (gpuscope never does it first)."""
        ...

    def cuda_possible(self) -> bool:
        """False once torch is known to be built without CUDA (or ROCm): ``cuda_in_use()`` stays False all run, and a
        collector waiting for CUDA can leave the steps (every step of a CPU run pays for each one following them)."""
        ...

    def window_opened(self) -> None:
        """A profiler started: steps it touches are left out of the steady-state figures."""
        ...

    def window_closed(self) -> None:
        """A profiler stopped."""
        ...

    def in_window(self) -> bool:
        """Whether one of gpuscope's profilers is running now."""
        ...

    def loops_begun(self) -> int:
        """Training loops begun so far (an optimizer ending the steps over parameters unlike its predecessor's):
        1 until a second begins."""
        ...

    def steps_seen(self) -> int:
        """Steps counted so far."""
        ...

    def loop_thread(self) -> int:
        """The kernel's id for the thread the steps run in (``/proc/self/task/TID``): the thread that started the
        collectors, or the one training while it waits (``LoopThread``)."""
        ...

    def step_evaluated(self, index: int) -> bool:
        """Whether the trained model ran forward in eval mode or without gradients in step ``index`` (ended)."""
        ...

    def root_modules(self) -> list[Any]:
        """The outermost trained modules, once found (at the first steps)."""
        ...

    def frozen_modules(self) -> list[Any]:
        """The models the step runs without training them (a perceptual loss's network, a teacher), found with the
        roots."""
        ...


class Collector(Protocol):
    """One source of measurements, declared by its class attributes."""

    name: ClassVar[str]
    """Its key in run.json's ``collectors``."""
    field: ClassVar[str | None]
    """The record field its payload fills (None: a status only, or a payload another reduction reads)."""
    stage: ClassVar[Stage]
    provides_steps: ClassVar[bool]
    """The source of the step events the others follow (``StepSource``): the steps collector, one a run. It starts
    first and stops first, as the script ends."""
    gpu_only: ClassVar[bool]
    """It has something to say about a GPU only: on a CPU run, its reason (unavailable) explains the report's Device
    section."""

    def unavailable_reason(self) -> str | None:
        """None when the collector can run here, else why it cannot (a missing driver, say)."""
        ...


class LiveCollector(Collector, Protocol):
    """Started before the user's code, stopped after it; ``start`` and ``stop`` are called once each."""

    def start(self, run_dir: Path) -> None:
        """Begin collecting; artifacts go into ``run_dir``."""
        ...

    def stop(self) -> CollectorResult:
        """Stop, undo every hook, and return what was collected."""
        ...


@runtime_checkable
class Follower(Protocol):
    """A live collector that follows the run's steps: handed the step events before it starts."""

    def follow(self, events: StepEvents) -> None:
        ...


class StepSource(LiveCollector, StepEvents, Protocol):
    """The steps collector, as the stage drives it: the step events, an explicit step (``gpuscope.step()``), a stop
    at the loop's next safe point (``--profile-steps``), and what the probes load again after the run."""

    def mark_step(self) -> None:
        ...

    def stop_at_safe_point(self, action: Callable[[], None]) -> None:
        ...

    def probe_inputs(self) -> ProbeInputs:
        ...


@dataclass(frozen=True, slots=True)
class ProbeInputs:
    """What the steps collector keeps for the post-run probes: the slowest loader's settings and its dataset (to load
    again), and the optimizer the loop stepped first (to time again)."""

    loader: dict[str, object] | None = None
    dataset: object | None = None
    dataset_fetch: int | None = None
    optimizer: object | None = None
    peers: tuple[object, ...] = ()
    """The optimizers of ``optimizer``'s class stepped in the last step it stepped in, it among them: their updates
    share the phase (a GAN's two Adams, an optimizer per parameter)."""
    update_share: float | None = None
    """The share of the optimizers' steps spent inside the steps of ``optimizer``'s class (under 1 where a wrapper
    around them does more: ZeroRedundancyOptimizer's broadcast); None where not measured."""
    around: str = ""
    """The class of the outermost optimizer steps other than ``optimizer``'s that took the most time, or ""."""


class Probe(Collector, Protocol):
    """Runs once after the script, within ``budget_s``, told what the run measured."""

    budget_s: ClassVar[float]
    doing: ClassVar[str]
    """What the terminal says while it runs (a probe can take seconds after the script has ended)."""
    runs_user_code: ClassVar[bool]
    """Runs the user's code again (their dataset): then the stage runs it isolated, within its budget."""
    reads: ClassVar[tuple[str, ...]]
    """The collectors whose payloads it reads (``PostRunFacts.payloads`` holds only theirs)."""

    def run(self, run_dir: Path, facts: PostRunFacts) -> CollectorResult:
        """Probe, and return what was found."""
        ...


class CollectorClass(Protocol):
    """A registered collector class: its declarations, the steps it profiles, and how a run builds it."""

    name: ClassVar[str]
    stage: ClassVar[Stage]
    provides_steps: ClassVar[bool]
    gpu_only: ClassVar[bool]

    @classmethod
    def wants(cls, options: CollectOptions) -> WindowRequest | None:
        ...

    @classmethod
    def create(cls, options: CollectOptions, plan: Plan) -> LiveCollector | Probe:
        ...


REGISTRY: list[CollectorClass] = []
"""Collector classes, as ``register`` saw them (``collectors.collector_classes()`` imports every module first)."""


def register(cls: Any) -> Any:
    """Class decorator: make ``cls`` one of the collectors every run uses."""
    if any(c.name == cls.name for c in REGISTRY):
        raise ValueError(f"collector {cls.name} registered twice")
    REGISTRY.append(cls)
    return cls


class PostRunProbe:
    """Base of post-run probes: built from the options, off under ``--no-probes``."""

    budget_s: ClassVar[float] = 5.0
    doing: ClassVar[str] = "measuring after the run"
    stage: ClassVar[Stage] = "post-run"
    provides_steps: ClassVar[bool] = False
    gpu_only: ClassVar[bool] = False
    runs_user_code: ClassVar[bool] = False
    reads: ClassVar[tuple[str, ...]] = ()
    enabled = True

    @classmethod
    def wants(cls, options: CollectOptions) -> WindowRequest | None:
        return None

    @classmethod
    def create(cls, options: CollectOptions, plan: Plan) -> Any:
        probe = cls()
        probe.enabled = options.probes
        return probe

    def unavailable_reason(self) -> str | None:
        return None if self.enabled else "turned off (--no-probes)"

    def not_wanted(self, facts: PostRunFacts) -> str | None:
        """Why the finished run needs nothing of this probe (it is then not run, nor a process forked for it), or
        None."""
        return None


class Watcher:
    """Base of live collectors that own no window of steps: built with their defaults."""

    stage: ClassVar[Stage] = "live"
    provides_steps: ClassVar[bool] = False
    gpu_only: ClassVar[bool] = False
    before_windows: ClassVar[bool] = False
    """Told of each step before the windows' owners are (the long-steps collector moves their windows)."""

    @classmethod
    def wants(cls, options: CollectOptions) -> WindowRequest | None:
        """The steps this collector profiles (None: it profiles none, it only watches)."""
        return None

    @classmethod
    def create(cls, options: CollectOptions, plan: Plan) -> Any:
        """An instance for a run with ``options``, its window as ``plan`` placed it."""
        return cls()


class StepFollower(Watcher):
    """Base of live collectors that follow the run's steps: ``follow`` (called by the stage before ``start``)
    registers ``_on_step``, called with each step's index as it begins. Windowless by default."""

    _events: StepEvents | None = None

    def follow(self, events: StepEvents) -> None:
        """Follow the run's steps through ``events``."""
        self._events = events
        events.add_step_listener(self._on_step)

    def _unfollow(self) -> None:
        """Follow the steps no more (called from ``_on_step`` once the collector has done with them: its window has
        closed or failed), so that every later step of a long run costs it nothing."""
        if self._events is not None:
            self._events.remove_step_listener(self._on_step)

    def _on_step(self, index: int) -> None:
        pass

    def move_window(self, cpu: Window | None, cuda: Window | None) -> None:
        """Steps turned out long (``schedule.long_steps_plan``): the window is now ``cpu`` on a CPU run, ``cuda`` on
        a CUDA run (None: none there), called as step ``cpu.start`` begins at the latest, before this collector's
        own ``_on_step``. Windowless collectors, and windows already open or done, keep theirs."""


WindowState = Literal["waiting", "open", "done", "failed", "skipped"]


class StepWindow:
    """A window of steps a profiler owns, as the scheduler placed it: ``open(index)`` as its first step begins,
    ``close()`` once ``steps`` steps have run (or at the end of the run); each marks the window on the step events
    so its steps stay out of the figures. ``start`` and ``cuda_start`` are where it begins on a CPU and a CUDA run
    (None: not on that kind of run, ``skipped``). Whatever ``open`` or ``close`` raise closes the window and
    fails it with the reason; the user's step goes on. ``close`` must be safe to call after an ``open`` that
    raised part of the way (it undoes what took place)."""

    def __init__(self, start: int | None, steps: int, open: Callable[[int], None], close: Callable[[], None],
                 cuda_start: int | None = None) -> None:
        self.start = start
        self.cuda_start = cuda_start
        self.steps = steps
        self._open, self._close = open, close
        self.state: WindowState = "waiting"
        self.reason = ""
        self.counted: list[int] = []
        self._current: int | None = None
        self._events: StepEvents | None = None

    def on_step(self, index: int, events: StepEvents, what: str) -> None:
        """Step ``index`` begins; ``what`` names the profiler in a failure's reason."""
        self._events = events
        try:
            if self.state == "waiting":
                if index < min((s for s in (self.start, self.cuda_start) if s is not None), default=index + 1):
                    return
                # the kind of run is decided where the earliest window could begin
                start = self.cuda_start if events.cuda_in_use() else self.start
                if start is None:
                    self.state = "skipped"
                elif index >= start:
                    self._current = index
                    try:
                        self._open(index)
                    except Exception:
                        with contextlib.suppress(Exception):
                            self._close()  # undo whatever of the opening took place
                        raise
                    self.state = "open"
                    events.window_opened()
            elif self.state == "open":
                self.counted.append(self._current)  # type: ignore[arg-type]
                self._current = index
                if len(self.counted) >= self.steps:
                    self.finish()
        except Exception as exc:
            self.fail(f"{what} failed: {type(exc).__name__}: {exc}")

    def move(self, cpu: Window | None, cuda: Window | None) -> None:
        """Begin at ``cpu`` / ``cuda`` instead (``StepFollower.move_window``), unless already begun."""
        if self.state == "waiting":
            self.start = cpu.start if cpu is not None else None
            self.cuda_start = cuda.start if cuda is not None else None
            self.steps = min(w.steps for w in (cpu, cuda) if w is not None) if cpu or cuda else self.steps

    def again(self, start: int) -> None:
        """Wait again, for step ``start``: the steps counted do not stand for the run's (called from ``close``)."""
        self.state, self.start, self.cuda_start, self.counted, self._current = "waiting", start, start, [], None

    def finish(self) -> None:
        """Close the window now (its last step has ended, or the run has)."""
        if self.state != "open":
            return
        self.state = "done"
        try:
            self._close()
        finally:
            if self._events is not None:
                self._events.window_closed()

    def fail(self, reason: str) -> None:
        """Close the window if open, and record why it failed."""
        if self.state == "open":
            try:
                self.finish()
            except Exception as exc:
                reason = f"{reason}; closing it failed too: {exc}"
        self.state, self.reason = "failed", reason

    @property
    def current(self) -> int | None:
        """The step the window was last open in (under way, or ended with the run)."""
        return self._current

    @property
    def over(self) -> bool:
        """Whether the window will open no more (closed, failed, or not on this kind of run)."""
        return self.state in ("done", "failed", "skipped")

    @property
    def complete(self) -> bool:
        """Whether every step of the window ran."""
        return self.state == "done" and len(self.counted) >= self.steps


def patch(owner: Any, attr: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[[], None]:
    """Replace ``owner.attr`` with ``wrap(original)``, looking like the original (name, docstring, ``__wrapped__``);
    returns the undo. A function re-exported from the module that defines it (``torch.save``, defined in
    ``torch.serialization``) is replaced there too: pickle finds a function by its module and name and checks it is
    the same object, so ``pickle.dumps(torch.save)`` works as under python (and loads as torch's own elsewhere)."""
    original = getattr(owner, attr)
    replacement = wrap(original)
    replacement.__wrapped__ = original  # type: ignore[attr-defined]
    for name in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(replacement, name, getattr(original, name))
        except (AttributeError, TypeError):
            pass
    setattr(owner, attr, replacement)
    home = sys.modules.get(getattr(original, "__module__", None) or "")
    name = getattr(original, "__qualname__", None)
    if home is None or home is owner or not isinstance(name, str) or "." in name \
            or getattr(home, name, None) is not original:
        return lambda: setattr(owner, attr, original)
    setattr(home, name, replacement)

    def undo() -> None:
        setattr(owner, attr, original)
        setattr(home, name, original)

    return undo
