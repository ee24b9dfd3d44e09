"""torch.profiler over a few steady-state steps: ``trace.json`` (Perfetto, chrome://tracing) under a size cap, the
top ops by host and device time, op counts per step, and on CUDA the kernel timeline figures.

The window is placed by ``trace_window``, a pure function of the step index (like ``torch.profiler.schedule``):
after the cProfile window and a clean step, one warm-up step (the profiler runs, nothing is kept) and
``active`` recorded steps. Steps in the window are marked profiled and left out of the steady-state figures.
Where the steps' pace moves afterwards (``RETRACE_PACE``), the window is placed again, at the new pace.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from gpuscope.collect import warning_filters
from gpuscope.collect.allocator import return_freed_heap
from gpuscope.collect.captures import TraceCapture
from gpuscope.collect.children import schedstat
from gpuscope.collect.framework.base import CollectorResult, StepFollower, WindowRequest, register
from gpuscope.collect.framework.options import TRACE_MAX_BYTES, TRACE_STEPS
from gpuscope.collect.framework.schedule import PER_CLOSURE_CALLS
from gpuscope.collect.lazy_dynamo import inductor_left_unimported
from gpuscope.collect.process_group import default_group
from gpuscope.record import CollectorStatus
from gpuscope.versions import parse_version

if TYPE_CHECKING:
    from gpuscope.collect.framework.options import CollectOptions
    from gpuscope.collect.framework.schedule import Plan, Window

TRACE_FILE = "trace.json"
DEFAULT_START = 6
"""First step of the window: after cProfile's default window (steps 0-4) and one clean step."""
DEFAULT_ACTIVE = TRACE_STEPS
WARMUP_STEPS = 1
"""torch.profiler's own warm-up: the profiler runs a step before recording, so its start-up cost is not traced."""
LONG_STEP_S = 1.2
"""A warm-up step this long or longer: one step is recorded instead of ``active``. Each recorded step costs the run
its events' processing at the window's end (three LBFGS steps of 1.4-2.4 s and 670k ops each: 8.5 s), and so long a
step holds ops enough for the table; the trace's cap would keep only the first step of several anyway. (The
samples' steps, loading included, take at most 0.55 s alone, 0.7 s three runs to two cores.)"""
DEFAULT_MAX_BYTES = TRACE_MAX_BYTES
RETRACE_PACE = 2.0
"""After every window has closed, the steps' pace (the median of the last ``PACE_LOOKS`` looks' mean step times) this
many times the pace just after the windows (the first looks'), or this fraction of it: the trace is taken again,
over steps at the new pace. A reinforcement-learning loop's episodes lengthen as its policy learns (pytorch/examples'
REINFORCE: steps 7-9 13 ms, the median step 54 ms), and a trace of its first steps left the verdict inconclusive
(``evidence.unlike_steps``)."""
RETRACES = 2
"""Traces taken again at most, in a run."""
PACE_LOOKS = 3
"""Looks whose median is a pace: one slow step among them (an evaluation, a checkpoint) is no change of pace."""
PACE_STEPS = (13, 17, 19)
"""Steps between two looks at the pace (each a clock read), in turn: no loop's period lines up with them all."""
TOP_OPS = 15
SHORT_OP_US = 10.0
"""When a trace must shrink, CPU ops shorter than this (microseconds) go first: they are the most numerous."""

Phase = Literal["before", "warmup", "active", "after"]


def trace_window(index: int, start: int, active: int, warmup: int = WARMUP_STEPS) -> Phase:
    """Where step ``index`` lies relative to the window starting at ``start``."""
    if index < start:
        return "before"
    if index < start + warmup:
        return "warmup"
    if index < start + warmup + active:
        return "active"
    return "after"


@register
class TorchTraceCollector(StepFollower):
    """torch.profiler over a window of steps."""

    name: ClassVar[str] = "torch-trace"
    field: ClassVar[str | None] = "op_profile"

    def __init__(self, start: int = DEFAULT_START, active: int = DEFAULT_ACTIVE,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.start_step = start
        self.active = active
        self._asked_active = active  # the steps asked for: fewer where steps turned out long
        self.warmup = WARMUP_STEPS
        self.max_bytes = max_bytes
        self._prof: Any = None
        self._finished = False
        self._saved = False
        self._recorded: list[int] = []
        self._last_index = -1
        self._began_at: float | None = None  # when the warm-up step began, the window begun at it
        self._error: str | None = None
        self._cuda = False
        self._cupti_teardown = False
        self._waits: list[tuple[int, float, float]] = []  # (step index, the loop thread's time on and waiting for a
        # CPU so far, s)
        self._marks: list[tuple[int, float]] = []  # (step index, the clock) as each recorded part began and ended
        self._calls_seen = 0  # the optimizer's closure calls by the last step boundary
        self._calls_before = 0  # ...in the step before it
        self._closure_base: int | None = None  # recording one closure call: the calls before the recorded step's
        self._scaled_by = 0  # ...and the recorded step's calls, once known
        self._shapes = False  # the ops' shapes recorded: the one step traced may be the run's last profiled one
        self._quiet_from = {False: start + WARMUP_STEPS + active, True: start + WARMUP_STEPS + active}  # no window
        # after this step (CPU, CUDA runs): where the pace is watched from
        self._pace_mark: tuple[int, float] | None = None  # (step, clock) of the last look at the pace
        self._clock: Callable[[], float] = time.perf_counter
        self._paces: list[float] = []  # each look's mean step time since the one before, after the windows
        self._loop = 1  # the training loop the trace recorded steps of (``StepEvents.loops_begun``)
        self._retraces: list[tuple[int, int, float]] = []  # (first step, last step, the pace's ratio) of the traces
        # taken again, the last one under way until saved
        self._previous: tuple[list[int], list[tuple[int, float]], list[tuple[int, float, float]]] | None = None
        # the saved trace's recorded steps, marks and waits, while one is taken again
        self._forward_range: Any = None  # the open ``## forward ##`` range (``_mark_forward``)

    @classmethod
    def wants(cls, options: CollectOptions) -> WindowRequest:
        """Its warm-up step and the recorded ones, one clean step after cProfile's window (0 steps: turned off)."""
        steps = WARMUP_STEPS + options.trace_steps if options.trace_steps > 0 else 0
        return WindowRequest(steps, after="cprofile", gap=1)

    @classmethod
    def create(cls, options: CollectOptions, plan: Plan) -> TorchTraceCollector:
        start = plan.start(cls.name)
        collector = cls(start if start is not None else DEFAULT_START, options.trace_steps, options.trace_max_bytes)
        collector._quiet_from = {cuda: plan.end(cuda) for cuda in (False, True)}
        return collector

    def unavailable_reason(self) -> str | None:
        if self.active <= 0:
            return "turned off (--trace-steps 0)"
        return None

    def move_window(self, cpu: Window | None, cuda: Window | None) -> None:
        """Steps are long: one step recorded, with no warm-up step before it (the profiler's start-up is
        milliseconds of a step of seconds), and the shapes of its ops: its FLOPs are read from them where the FLOP
        counter has no step of its own, or the run ends before it (``collect/trace_flops.py``)."""
        if cpu is not None and self._prof is None and not self._finished and self.active > 0:
            self.start_step, self.warmup, self.active = cpu.start, 0, 1
            self._shapes = True


    def start(self, run_dir: Path) -> None:
        self._run_dir = run_dir

    # -- at each step boundary -----------------------------------------------------------------------------
    def _on_step(self, index: int) -> int | None:
        calls = self._events.closure_calls()  # type: ignore[union-attr]
        self._calls_before, self._calls_seen = calls - self._calls_seen, calls
        if self._closure_base is not None and not self._scaled_by:
            self._scaled_by = max(1, calls - self._closure_base)  # the recorded step's closure calls, all of them
        if self._error is not None:
            self._unfollow()
            return None
        if self._finished:
            return self._watch(index)
        if "torch" not in sys.modules:
            return
        if index == self.start_step + self.warmup and self._began_at is not None and self.active > 1 \
                and time.perf_counter() - self._began_at >= LONG_STEP_S:
            self.active = 1
        phase = trace_window(index, self.start_step, self.active, self.warmup)
        try:
            if self._prof is not None and index < self._last_index:  # (an epoch's first batch repeats its index)
                self._restart()
            self._last_index = index
            if self._prof is None:
                if phase != "before":
                    self._begin(index)
                    if phase == "active":  # no warm-up step (long steps): this one is recorded
                        self._recorded.append(index)
                        self._note_wait(index)
                        self._one_closure_call()
                return
            if phase == "active":
                self._recorded.append(index)
                self._loop = self._events.loops_begun()  # type: ignore[union-attr]
                self._one_closure_call()
            if phase in ("active", "after"):
                self._note_wait(index)
            with kineto_quiet(), inductor_left_unimported():
                self._prof.step()
            if phase == "after":
                self._end()
        except Exception as exc:  # the user's step goes on; this collector reports failed
            self._error = f"torch.profiler failed: {exc}"
            self._abandon()

    def _watch(self, index: int) -> int | None:
        """After the trace: a look at the steps' pace every few steps, once every window has closed; where it has moved
        ``RETRACE_PACE`` times from the pace just after the windows, the trace is taken again from the next step
        (``RETRACES`` times at most). None on a job of several ranks, whose traces must hold the same steps, on a run
        of long steps (one step traced, a few in all), after an optimizer closure's call was recorded, and once
        another training loop has begun: the figures describe the loop the windows fell in."""
        events = self._events
        if len(self._retraces) >= RETRACES or self.active != self._asked_active or self._shapes \
                or self._closure_base is not None or _several_ranks() \
                or events.loops_begun() != self._loop:  # type: ignore[union-attr]
            self._unfollow()
            return None
        now = self._clock()
        mark = self._pace_mark
        if index < self._quiet_from[events.cuda_in_use()] or events.in_window() \
                or (mark is not None and index <= mark[0]):  # (a window open, or the steps counted anew)
            self._pace_mark = None
            return None
        self._pace_mark = (index, now)
        if mark is None:
            return PACE_STEPS[len(self._paces) % len(PACE_STEPS)]
        self._paces.append((now - mark[1]) / (index - mark[0]))
        if len(self._paces) >= 2 * PACE_LOOKS:
            ratio = statistics.median(self._paces[-PACE_LOOKS:]) / statistics.median(self._paces[:PACE_LOOKS])
            if not 1 / RETRACE_PACE < ratio < RETRACE_PACE:
                self._trace_again(index + 1, ratio)
                return None
        return PACE_STEPS[len(self._paces) % len(PACE_STEPS)]

    def _trace_again(self, start: int, ratio: float) -> None:
        """Take the trace again from step ``start`` (its warm-up step), the saved one kept until the new one is."""
        self._previous = (self._recorded, self._marks, self._waits)
        self._recorded, self._marks, self._waits = [], [], []
        self._finished, self._saved, self._began_at = False, False, None
        self.start_step, self.warmup = start, WARMUP_STEPS
        self._retraces.append((start + WARMUP_STEPS, start + WARMUP_STEPS + self.active - 1, ratio))
        self._quiet_from = {cuda: start + WARMUP_STEPS + self.active for cuda in (False, True)}
        self._pace_mark, self._paces = None, []

    def _one_closure_call(self) -> None:
        """A single recorded step whose optimizer called its closure ``PER_CLOSURE_CALLS`` times or more the step
        before (LBFGS: each call a forward and backward pass) is recorded up to its first call's end: every call runs
        the same passes, and the op table is that call's times the step's calls (the FLOP count's way). The trace of a
        whole 3 s LBFGS step of 373k ops, 4 calls, cost the run 13 s after its end and 3 s in it."""
        if self.active == 1 and self._calls_before >= PER_CLOSURE_CALLS:
            self._closure_base = self._calls_seen
            self._events.on_closure_end(self._first_closure_ended)  # type: ignore[union-attr]

    def _first_closure_ended(self) -> None:
        self._events.off_closure_end(self._first_closure_ended)  # type: ignore[union-attr]
        if self._prof is None:
            return
        self._note_wait(self._recorded[-1] + 1)  # the recorded part's wait for a CPU ends here
        try:
            self._end()  # stops the profiler, which saves the trace so far: the step up to here
        except Exception as exc:  # the user's step goes on; this collector reports failed
            self._error = f"torch.profiler failed: {exc}"
            self._abandon()

    def _begin(self, index: int) -> None:
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        self._cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if self._cuda:
            activities.append(ProfilerActivity.CUDA)
        def schedule(step: int) -> ProfilerAction:
            phase = trace_window(step, self.start_step, self.active, self.warmup)
            if phase == "warmup":
                return ProfilerAction.WARMUP
            if phase == "active":
                last = step == self.start_step + self.warmup + self.active - 1
                return ProfilerAction.RECORD_AND_SAVE if last else ProfilerAction.RECORD
            return ProfilerAction.NONE

        if self._cuda:
            self._cupti_teardown = release_cupti_after_trace(torch.version.cuda)
        with _no_cycle_warning():
            self._prof = profile(
                activities=activities,
                schedule=schedule,
                on_trace_ready=self._trace_ready,
                # (where the step calls its closure several times, the FLOP count is its second call's)
                record_shapes=self._shapes and self._calls_before < PER_CLOSURE_CALLS,
                with_stack=False,  # stacks make traces many times larger; cProfile has the Python side
            )
        # count the profiler's steps as gpuscope does, so trace.json's ProfilerStep#N is run.json's step N
        self._prof.step_num = index
        self._prof.current_action = schedule(index)
        with kineto_quiet(), inductor_left_unimported():
            self._prof.start()
        self._began_at = time.perf_counter() if index == self.start_step else None
        self._events.window_opened()  # type: ignore[union-attr]
        self._events.add_phase_listener(self._mark_forward)  # type: ignore[union-attr]

    def _mark_forward(self, phase: str) -> None:
        """While the profiler runs: the forward passes gpuscope times (the step figures' forward) as ``## forward ##``
        ranges, so that the trace's phases hold them where the script marks none (a collective issued in forward
        tells a tensor-parallel all-reduce from a gradient's)."""
        import torch

        if phase == "forward":
            if self._forward_range is None:
                self._forward_range = torch.ops.profiler._record_function_enter_new("## forward ##", None)
        elif self._forward_range is not None:
            record, self._forward_range = self._forward_range, None
            torch.ops.profiler._record_function_exit._RecordFunction(record)

    def _note_wait(self, index: int) -> None:
        """As step ``index`` begins: how long the loop's thread has waited for a CPU so far (the kernel's schedstat),
        so that each recorded step's share of it is known (a busy machine's, not the step's own work)."""
        self._marks.append((index, time.perf_counter()))
        times = schedstat("thread-self")
        if times is not None:
            self._waits.append((index, *times))

    def _trace_ready(self, prof: Any) -> None:
        """The recorded steps are done: save the trace, nothing more. The op table is read from its events after
        the run (``reduce.optable``): torch's ``key_averages()`` took 12 s and kept 1.8M objects alive on a loop of
        55k ops a step."""
        path = self._run_dir / TRACE_FILE
        part = path.with_name(path.name + ".part")  # a trace taken again replaces the saved one only once whole
        prof.export_chrome_trace(str(part))
        os.replace(part, path)
        self._saved, self._previous = True, None

    def _end(self) -> None:
        prof, self._prof = self._prof, None
        self._finished = True
        self._events.remove_phase_listener(self._mark_forward)  # type: ignore[union-attr]
        if self._forward_range is not None:  # (the profiler stops at a step's boundary, outside forward)
            self._mark_forward("other")
        try:
            with kineto_quiet():
                prof.stop()
        finally:
            # the profile object is in a cycle (its action map holds its own bound methods): only a full collection,
            # rare, would free it. Its recorded events go now, with the inner profiler that holds them.
            prof.profiler = None
            return_freed_heap()
        self._events.window_closed()  # type: ignore[union-attr]

    def _restart(self) -> None:
        """The steps are counted anew, from 0: another kind of marker defines them from now on (an optimizer that
        first stepped after a gradient accumulation's batches, each counted as a step until then). The window so far
        held other steps (trace.json's first steps held one batch each): it is dropped, unsaved, and waits for its
        steps again."""
        self._prof.on_trace_ready = None
        self._end()
        self._finished, self._saved, self._recorded = False, False, []
        (self._run_dir / TRACE_FILE).unlink(missing_ok=True)

    def _abandon(self) -> None:
        if self._prof is not None:
            try:
                self._end()
            except Exception:
                self._prof = None

    # -- end of the run ------------------------------------------------------------------------------------
    def stop(self) -> CollectorResult:
        unfinished = None
        if self._previous is not None:  # the run ended before the trace taken again was whole: the saved one stays
            if self._prof is not None:
                self._prof.on_trace_ready = None
                self._abandon()
            (self._run_dir / (TRACE_FILE + ".part")).unlink(missing_ok=True)
            self._recorded, self._marks, self._waits = self._previous
            self._finished, self._saved, self._previous = True, True, None
            self._retraces.pop()
            self._error = None  # (one taken again that failed leaves the saved trace as it was)
        if self._prof is not None:
            # the run ended inside the window: the span the last boundary opened ended with the script, not a step
            unfinished = self._recorded[-1] if self._recorded else None
            try:
                self._end()  # the run ended inside the window: keep what was recorded
            except Exception as exc:
                self._error = self._error or f"torch.profiler failed: {exc}"
        restore_cupti_setting(self._cupti_teardown)
        self._cupti_teardown = False
        if self._closure_base is not None:
            self._events.off_closure_end(self._first_closure_ended)  # type: ignore[union-attr]
            if not self._scaled_by:  # the run ended inside the recorded step
                self._scaled_by = max(1, self._events.closure_calls() - self._closure_base)  # type: ignore[union-attr]
        if self._error is not None:
            return CollectorResult(CollectorStatus("failed", self._error))
        if not self._saved:
            return CollectorResult(CollectorStatus(
                "unavailable",
                f"the run ended before the profiled steps ({self.start_step + self.warmup}-"
                f"{self.start_step + self.warmup + self.active - 1}); run more steps to get trace.json"))
        capture = capture_trace(self._run_dir / TRACE_FILE, self.max_bytes, recorded=self._recorded, cuda=self._cuda,
                                unfinished=unfinished)
        pairs = list(zip(self._waits, self._waits[1:]))
        part = self._scaled_by if self._closure_base is not None else 1
        notes = (f"trace.json holds step {self._recorded[0]} up to the end of its first call of the optimizer's "
                 f"closure, of {part}: the op figures are that call's, times {part}",) if part > 1 else ()
        if self._retraces:
            first, last, ratio = self._retraces[-1]
            how = f"{ratio:.1f}x longer" if ratio > 1 else f"{1 / ratio:.1f}x shorter"
            notes += (f"trace.json holds steps {first}-{last}, taken again there: the steps had become {how} than "
                      "just after the trace before",)
        call_s = self._marks[1][1] - self._marks[0][1] if part > 1 and len(self._marks) > 1 else 0.0
        return CollectorResult(CollectorStatus("ok"), dataclasses.replace(
            capture, cpu_s={a[0]: round(b[1] - a[1], 9) for a, b in pairs},
            cpu_wait_s={a[0]: round(b[2] - a[2], 9) for a, b in pairs}, scaled_by=part,
            call_s=round(call_s, 9)), notes=notes)


def _several_ranks() -> bool:
    """Whether the run is one rank of a job of several (torch.distributed initialised, world size above 1)."""
    try:
        group = default_group()
    except Exception:
        return True  # never trace the ranks of a job at different steps
    return group is not None and group[1] > 1


CUPTI_TEARDOWN_ENV = "TEARDOWN_CUPTI"
CUPTI_TEARDOWN_SAFE_CUDA = (12, 6)
"""Kineto leaves CUPTI attached after the profiler stops unless ``TEARDOWN_CUPTI=1``: every later kernel launch
then pays CUPTI's callbacks (measured on an H100: a launch-bound loop's steps 46% slower for the rest of the run;
pytorch/pytorch#144455). Tearing down crashed CUDA graphs before CUDA 12.6 (torch's own FIXME in
torch/_inductor), so it is asked for from 12.6 on, and never over the user's own setting."""


def release_cupti_after_trace(cuda_version: str | None, environ: dict[str, str] | None = None) -> bool:
    """Ask Kineto to detach CUPTI when the trace window ends; True if gpuscope set the variable (and must take
    it out again at the end of the run: ``restore_cupti_setting``)."""
    environ = os.environ if environ is None else environ  # type: ignore[assignment]
    version = parse_version(cuda_version)
    if CUPTI_TEARDOWN_ENV in environ or version is None or version < CUPTI_TEARDOWN_SAFE_CUDA:
        return False
    environ[CUPTI_TEARDOWN_ENV] = "1"
    return True


def restore_cupti_setting(set_by_us: bool, environ: dict[str, str] | None = None) -> None:
    """Take out the variable gpuscope set, unless something changed it since (torch.compile's CUDA graphs set
    it to 0)."""
    environ = os.environ if environ is None else environ  # type: ignore[assignment]
    if set_by_us and environ.get(CUPTI_TEARDOWN_ENV) == "1":
        del environ[CUPTI_TEARDOWN_ENV]


def _step_spans(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The (start, end) of each recorded step's ProfilerStep# range, in trace microseconds, in order."""
    return sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                  if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))


def window_wall_s(events: list[dict[str, Any]]) -> float:
    """Wall time of the recorded steps: from the first ProfilerStep# range's start to the last one's end."""
    spans = _step_spans(events)
    if not spans:
        return 0.0
    return (max(end for _, end in spans) - min(start for start, _ in spans)) / 1e6


def capture_trace(path: Path, max_bytes: int, recorded: Sequence[int] = (), cuda: bool = False,
                  unfinished: int | None = None) -> TraceCapture:
    """The exported trace for the figures: where it is under ``max_bytes`` the file itself, read after the run as a
    stream (parsed whole, a 36 MB trace's events took 198 MB at their peak, streamed 52 MB); else its events, every
    one, with the file capped: capping is about the file on disk, never about the figures (a capped trace keeps
    only the first recorded step, and per-step figures divided by every recorded step would shrink by that factor);
    the op table too is read from the whole trace."""
    size = path.stat().st_size
    if size <= max_bytes:
        return TraceCapture(events=None, path=path, recorded=tuple(recorded), cuda=cuda, trace_bytes=size,
                            trace_detail="full", unfinished=unfinished)
    trace = json.loads(path.read_text(errors="replace"))
    events = trace.get("traceEvents", [])
    detail = cap_trace(path, max_bytes, trace)[1]
    return TraceCapture(events=events, recorded=tuple(recorded), cuda=cuda, trace_bytes=path.stat().st_size,
                        trace_detail=detail, unfinished=unfinished)


def cap_trace(path: Path, max_bytes: int, trace: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], str]:
    """Keep ``path`` under ``max_bytes``, dropping detail in steps: short CPU ops first, then all but the first
    recorded step, then the shortest events. Returns the events kept and what was dropped ("full": nothing).
    ``trace``: the file's content, already parsed."""
    if trace is None:
        trace = json.loads(path.read_text(errors="replace"))
    events: list[dict[str, Any]] = trace.get("traceEvents", [])
    if path.stat().st_size <= max_bytes:
        return events, "full"
    cuts: list[tuple[str, Callable[[list[dict[str, Any]]], list[dict[str, Any]]]]] = [
        (f"CPU ops under {SHORT_OP_US:.0f} us dropped", lambda ev: [
            e for e in ev if not (e.get("cat") == "cpu_op" and e.get("dur", 0) < SHORT_OP_US)]),
        ("first recorded step only", _first_step_only),
        ("longest events only", lambda ev: sorted(ev, key=lambda e: -e.get("dur", 0))[: max(1, len(ev) // 2)]),
    ]
    detail = "full"
    for label, cut in cuts:
        events = cut(events)
        detail = label if detail == "full" else f"{detail}; {label}"
        if _write_trace(path, trace, events) <= max_bytes:
            return events, detail
    while len(events) > 1 and _write_trace(path, trace, events) > max_bytes:
        events = events[: len(events) // 2]
    return events, detail


def _first_step_only(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    steps = _step_spans(events)
    if not steps:
        return events
    start, end = steps[0]
    return [e for e in events if "ts" not in e or start <= e["ts"] <= end]


def _write_trace(path: Path, trace: dict[str, Any], events: list[dict[str, Any]]) -> int:
    trace["traceEvents"] = events
    path.write_text(json.dumps(trace, separators=(",", ":")))
    return path.stat().st_size


@contextmanager
def _no_cycle_warning() -> Iterator[None]:
    """torch 2.6+ warns on the user's stderr that a schedule's cycle clears its events: gpuscope records one
    cycle, and the user's stderr must read as it would without gpuscope."""
    with warning_filters.ignored("Warning: Profiler clears events", UserWarning):
        yield


UNKNOWN_BLOCK = b"Memory block of unknown size was allocated before the profiling started"
"""torch's CPU allocator warns once a process, on stderr, as a block made before a memory profile is freed
during it (the memory window's): gpuscope makes that happen inside ``kineto_quiet``."""
KINETO_NOISE = (b"USDT:", b"ERROR: External init callback must run in same thread as registerClient")
"""How the lines kineto prints straight to file descriptor 2 about gpuscope's own profiler begin: ``USDT: ...
profiler_start`` on each start and stop, and, for a loop trained in a thread other than the one that first used
torch.profiler, an "ERROR" whose trace is whole all the same (a threaded script's window: its 349 ops a step, all on
the loop's thread)."""


@contextmanager
def kineto_quiet() -> Iterator[None]:
    """Kineto prints lines about the profiler straight to file descriptor 2 (``KINETO_NOISE``), and no setting turns
    them off. Capture fd 2 around the profiler's calls and pass on every other line, so the user's stderr reads as it
    would without gpuscope."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        capture = tempfile.TemporaryFile()
        os.dup2(capture.fileno(), 2)
    except (OSError, ValueError):
        with _no_cycle_warning():
            yield
        return
    try:
        with _no_cycle_warning():
            yield
    finally:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)
        os.close(saved)
        capture.seek(0)
        kept = [line for line in capture.read().splitlines(keepends=True)
                if not line.startswith(KINETO_NOISE) and UNKNOWN_BLOCK not in line]
        capture.close()
        if kept:
            os.write(2, b"".join(kept))
