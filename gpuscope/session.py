"""The collection stage: starts the live collectors around the user's code, stops them, reduces the steps, runs
the post-run probes, then reduces every payload into the record, analyses and writes it. Shared by ``gpuscope run``
and the notebook API.

Order, all of it derived from the collectors' declarations (``collectors.default_collectors``):
1. the steps collector starts first: it is the source of the step events the others follow;
2. live collectors start in window order (the scheduler's), the rest after them, and stop in reverse, but for the
   steps collector, which stops first, as the script ends: what the others do as they stop (a trace of many ops
   written out: 15 s) is no part of the script's time after its last step;
3. the steps are reduced (``reduce.steady``) so the probes know what the run measured;
4. post-run probes run one at a time, each after every live hook is gone (they may run the user's code again);
5. every payload becomes record fields (``reduce.fields``), and the record is analysed and written.

With ``profile_steps`` (``--profile-steps``), stages 2-5 run as the step after the profiled ones begins (at the
steps collector's next safe point, ``hand_over``), in the loop's thread; the script then goes on with no collector
in it, and ``stop`` at its end only writes its exit status into the record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuscope.collect.captures import PostRunFacts, StepCapture, TraceCapture
from gpuscope.collect.collectors import CollectorResult, Follower, LiveCollector, Probe, StepSource, default_collectors
from gpuscope.collect.framework.base import ProbeInputs
from gpuscope.collect.framework.probing import run_isolated, user_torch_threads
from gpuscope.diagnose import thresholds
from gpuscope.diagnose.classify import profiled_steps
from gpuscope.diagnose.evidence import batches_per_step, compute_time_s
from gpuscope.diagnose.words import command_text
from gpuscope.errors import GpuscopeError
from gpuscope.pipeline import conclude
from gpuscope.record import CollectorStatus, Distributed, ProfilingWindow, RunMeta, RunRecord, Window
from gpuscope.reduce.fields import reads_others, record_fields


PROGRESS_AFTER_S = 1.0
"""A post-run probe still running after this long says what it is doing: the script has ended, and the terminal
would otherwise sit silent for seconds. One that ends sooner says nothing."""


class _Active:
    """The one session running in this process, so ``gpuscope.step()`` can reach it from anywhere."""

    session: Session | None = None


def active_session() -> Session | None:
    """The session currently collecting, if any."""
    return _Active.session


def _forget_inherited_session() -> None:
    """In a forked child the parent's session collects nothing (its hooks ignore a forked child's events), so it is
    not this process's: the child may profile itself (``gpuscope.profile()`` in a ``multiprocessing`` worker of a
    script run under ``gpuscope run``, as under plain python)."""
    _Active.session = None


os.register_at_fork(after_in_child=_forget_inherited_session)


@contextlib.contextmanager
def _collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while gpuscope reduces what it collected: a trace's events are millions
    of objects (an LBFGS step's 373k ops, a 36 MB trace), and the collections that loading them sets off walk them
    again and again (its load took 4.6 s instead of 6.7, the run's end 11.2 s instead of 12.0, on 2 cores). What the
    reduction allocates is freed by reference counting, and it runs no user code."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Session:
    """Collectors around a stretch of the user's code; ``stop`` returns the finished record."""

    def __init__(self, run_dir: Path, command: Sequence[str], collectors: Sequence[LiveCollector | Probe] | None = None,
                 distributed: Distributed | None = None, *, skip_steps: int = 0,
                 profile_steps: int | None = None) -> None:
        """``collectors`` default to ``default_collectors()``, in start order; the steps collector among them is
        the source of step events the others follow. ``distributed``: this process's rank in a torchrun job (its
        backend is read when the session stops). ``skip_steps`` and ``profile_steps``: the steps the collectors
        were built to measure (``CollectOptions``); after them the session hands the record over (``hand_over``)
        and the rest of the run goes unprofiled."""
        self.run_dir = Path(run_dir)
        self.window = ProfilingWindow(skip_steps, profile_steps) if skip_steps or profile_steps else None
        self.on_hand_over: Callable[[Session], None] = Session.hand_over
        """What runs when the profiled steps are over: ``hand_over``, or a caller's stand-in that calls it (and
        writes the report)."""
        self._handed_over = False
        self._ended = False
        self.distributed = distributed
        self.command = tuple(command)
        self.collectors: list[LiveCollector | Probe] = list(collectors) if collectors is not None \
            else default_collectors()
        self._steps: StepSource | None = next((c for c in self.collectors if c.provides_steps), None)  # type: ignore[misc]
        self._started: list[LiveCollector] = []
        self._statuses: dict[str, CollectorStatus] = {}
        self._reduced: dict[str, tuple[object, dict[str, Any]]] = {}  # name -> (payload, its record fields)
        self.record: RunRecord | None = None

    def start(self) -> None:
        """Start every live collector that can run here; one that cannot, or fails, is recorded and skipped."""
        if _Active.session is not None:
            raise GpuscopeError("a gpuscope session is already running in this process")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._started_at = datetime.now().astimezone()
        self._t0 = time.perf_counter()
        for collector in self._live():
            try:
                if not self._available(collector):
                    continue
                if collector is not self._steps and self._steps is not None and isinstance(collector, Follower):
                    collector.follow(self._steps)
                collector.start(self.run_dir)
            except Exception as exc:
                self._statuses[collector.name] = _status(collector, "failed", describe(exc))
                continue
            self._started.append(collector)
        _Active.session = self
        if self.window is not None and self.window.profile_steps is not None and self._steps in self._started:
            self._steps.add_step_listener(self._profiled_steps_over)  # after every window's listener

    @property
    def steps(self) -> StepSource | None:
        """The source of the run's steps (the steps collector), while it runs."""
        return self._steps if self._steps in self._started else None

    def _profiled_steps_over(self, index: int) -> None:
        window = self.window
        if window is not None and window.profile_steps is not None and self._steps is not None \
                and index == window.skip_steps + window.profile_steps:
            self._steps.stop_at_safe_point(self._hand_over_softly)

    def _hand_over_softly(self) -> None:
        """``on_hand_over``, in the user's loop: whatever goes wrong is one line on stderr, never their exception."""
        try:
            self.on_hand_over(self)
        except Exception as exc:
            print(f"gpuscope: error: could not hand the record over: {describe(exc)}", file=sys.stderr)

    def mark_step(self) -> None:
        """An explicit step boundary (``gpuscope.step()``)."""
        if self._steps is not None and self._steps in self._started and not self._handed_over:
            self._steps.mark_step()

    def stop(self, exit_status: int, say: Callable[[str], None] | None = None) -> RunRecord:
        """Stop the collectors, run the probes, build and analyse the record, write ``run.json``; idempotent.
        ``say``: where to tell the user what a probe of a second or more is doing (the terminal waits on it).
        After a hand-over, the record gets the script's exit status and nothing else changes."""
        if _Active.session is self:
            _Active.session = None
        if self._handed_over and self.record is not None and not self._ended:
            self._ended = True
            window = dataclasses.replace(self.record.profiling_window, script_ended=True)  # type: ignore[arg-type]
            self.record = conclude(dataclasses.replace(self.record, exit_status=exit_status, profiling_window=window),
                                   self.run_dir, diagnosed=True)
        if self.record is None:
            self._handed_over = False  # a hand-over that failed part of the way: the record is the end's own
            self.record = self._collect(exit_status, say)
        return self.record

    def hand_over(self, say: Callable[[str], None] | None = None,
                  written: Callable[[RunRecord], None] | None = None) -> RunRecord:
        """The profiled steps are over, the script goes on: stop every collector, run the probes, write the record
        (exit status 0 and ``profiling_window.script_ended`` False until ``stop``). ``written`` is called with each
        record written (before the probes, and after)."""
        if self.record is None:
            self._handed_over, self._ended = True, False
            self.record = self._collect(0, say, written)
            # what the collectors gathered (trace events, step records) would stay reachable for the rest of the
            # run, and every full garbage collection of the user's would walk it: only the record is kept
            self.collectors, self._started, self._steps = [], [], None
            self._reduced.clear()
        return self.record

    def _collect(self, exit_status: int, say: Callable[[str], None] | None,
                 written: Callable[[RunRecord], None] | None = None) -> RunRecord:
        """Stages 2-5: stop the live collectors, write the record, run the probes, write it again."""
        duration = time.perf_counter() - self._t0
        with _collection_paused():
            results = self._stop_live()
        probes = self._probes()
        if probes:  # the record is safe before any probe runs the user's code again
            pending = CollectorResult(CollectorStatus("unavailable", "not run: gpuscope stopped before it"))
            with _collection_paused():
                record = self._write(exit_status, duration, {**results, **{p.name: pending for p in probes}})
            if written is not None:
                written(record)
        results.update(self._run_probes(self._facts(results), probes, say))
        with _collection_paused():
            record = self._write(exit_status, duration, results)
        if written is not None:
            written(record)
        return record

    def _write(self, exit_status: int, duration: float, results: dict[str, CollectorResult]) -> RunRecord:
        """Build the record from ``results``, analyse it and write run.json."""
        meta = RunMeta(
            started_at=self._started_at.isoformat(timespec="seconds"),
            duration_s=duration,
            python=platform.python_version(),
            torch=getattr(sys.modules.get("torch"), "__version__", None),
            cpu_count=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
            torch_threads=_torch_threads(),
            platform=platform.platform(terse=True),
        )
        record = assemble(self.command, exit_status, meta, self._statuses, results, self._fields(), self._reduce)
        if self.window is not None:
            window = dataclasses.replace(self.window, handed_over_s=duration if self._handed_over else None,
                                         script_ended=not self._handed_over)
            record = dataclasses.replace(record, profiling_window=window)
        if self.distributed is not None:
            from gpuscope.distributed import backend_now

            # most scripts destroy their process group before the end: then the trace's collectives name it
            comm = record.op_profile.communication if record.op_profile is not None else None
            backend = backend_now() or (comm.backend if comm is not None else None)
            record = dataclasses.replace(record, distributed=dataclasses.replace(self.distributed, backend=backend))
        else:
            from gpuscope.distributed import alone_note, group_now

            if (alone := group_now()) is not None:  # a rank of a job whose other ranks run without gpuscope
                note = alone_note(alone, command_text(record))
                record = dataclasses.replace(record, distributed=alone, meta=dataclasses.replace(
                    record.meta, notes=(*record.meta.notes, note)))
        return conclude(record, self.run_dir)

    # -- stages ----------------------------------------------------------------------------------------------
    def _live(self) -> list[LiveCollector]:
        return [c for c in self.collectors if c.stage == "live"]  # type: ignore[misc]

    def _probes(self) -> list[Probe]:
        return [c for c in self.collectors if c.stage == "post-run"]  # type: ignore[misc]

    def _fields(self) -> dict[str, str | None]:
        return {c.name: c.field for c in self.collectors}

    def _available(self, collector: LiveCollector | Probe) -> bool:
        reason = collector.unavailable_reason()
        if reason is not None:
            self._statuses[collector.name] = _status(collector, "unavailable", reason)
        return reason is None

    def _stop_live(self) -> dict[str, CollectorResult]:
        """Stop the live collectors, the steps collector first, then the last started first; one that fails is
        recorded as failed."""
        results: dict[str, CollectorResult] = {}
        for collector in sorted(reversed(self._started), key=lambda c: not c.provides_steps):
            try:
                results[collector.name] = collector.stop()
            except Exception as exc:
                results[collector.name] = CollectorResult(CollectorStatus("failed", describe(exc)))
        return results

    def _facts(self, results: Mapping[str, CollectorResult]) -> PostRunFacts:
        """What the probes are told: the steps reduced, the slowest loader, the live collectors' payloads."""
        payloads = {name: r.payload for name, r in results.items() if r.payload is not None}
        capture = payloads.get("steps")
        inputs = self._steps.probe_inputs() if self._steps is not None else ProbeInputs()
        loader = inputs.loader
        figures: dict[str, Any] = {}
        if isinstance(capture, StepCapture):
            reduced = self._reduce("steps", "steps", capture, payloads)
            steps, breakdown = reduced["steps"], reduced["breakdown"]
            trace = payloads.get("torch-trace")
            traced = Window(trace.recorded[0], trace.recorded[-1]) \
                if isinstance(trace, TraceCapture) and trace.recorded else None  # as the op table's (reduce.fields)
            call = (trace.scaled_by, trace.call_s) if isinstance(trace, TraceCapture) and trace.call_s > 0 else None
            if not steps.count and (profiled := profiled_steps(steps, traced, call)) is not None:
                steps, breakdown, _ = profiled  # a few long steps, all profiled: the verdict will be theirs
            figures = {"data_wait": breakdown.data_wait, "median_s": steps.median_s,
                       "steps": steps.count, "cuda": capture.device == "cuda",
                       "optimizer_share": breakdown.optimizer,
                       "frozen_fed": any(f.reads_batches and not f.fixed_items for f in steps.frozen_models
                                         if (f.step_share or 0.0) >= thresholds.FROZEN_MODEL_NOTABLE)}
            if loader is not None:
                figures["batches_per_step"] = batches_per_step(loader["batches"], capture.count)
        return post_run_facts(**figures, loader=loader, dataset=inputs.dataset, dataset_fetch=inputs.dataset_fetch,
                              payloads=payloads, optimizer=inputs.optimizer, optimizer_peers=inputs.peers,
                              optimizer_update_share=inputs.update_share, optimizer_around=inputs.around)

    def _reduce(self, name: str, field: str, payload: object, payloads: Mapping[str, object]) -> dict[str, Any]:
        """``record_fields`` of collector ``name``'s payload, computed once (the record is written before and after
        the probes, and a trace's figures take seconds) unless it reads payloads the probes may add."""
        cached = self._reduced.get(name)
        if cached is not None and cached[0] is payload:
            return cached[1]
        values = record_fields(field, payload, payloads)
        if not reads_others(payload):
            self._reduced[name] = (payload, values)
        return values

    def _run_probes(self, facts: PostRunFacts, probes: list[Probe],
                    say: Callable[[str], None] | None = None) -> dict[str, CollectorResult]:
        """Run each post-run probe in turn; each one's time is in its status, a failure is its status. Probes that
        run the user's code again run isolated, within their budget (``probing.run_isolated``)."""
        results: dict[str, CollectorResult] = {}
        for probe in probes:
            started = time.perf_counter()
            try:
                if self._steps is not None and not facts.steps:  # no step of the run to compare their times with
                    self._statuses[probe.name] = _status(probe, "unavailable", NO_STEP_TO_PROBE)
                    continue
                if not self._available(probe):
                    continue
                if (why := getattr(probe, "not_wanted", lambda _: None)(facts)) is not None:
                    results[probe.name] = CollectorResult(CollectorStatus("unavailable", why))
                    continue
                told = dataclasses.replace(facts, payloads={name: payload for name, payload in facts.payloads.items()
                                                            if name in probe.reads})
                with _said_after(PROGRESS_AFTER_S, say, f"gpuscope: {probe.doing} (up to {probe.budget_s:.0f} s; "
                                                        "--no-probes skips this)"):
                    if probe.runs_user_code:
                        result = run_isolated(partial(probe.run, self.run_dir, told), probe.budget_s, probe.name)
                    else:
                        result = probe.run(self.run_dir, told)
            except Exception as exc:
                result = CollectorResult(CollectorStatus("failed", describe(exc)))
            elapsed = time.perf_counter() - started
            results[probe.name] = dataclasses.replace(
                result, status=dataclasses.replace(result.status, elapsed_s=elapsed))
        return results


NO_STEP_TO_PROBE = "not run: no steady-state step was measured (the script ended or failed first)"


@contextlib.contextmanager
def _said_after(delay_s: float, say: Callable[[str], None] | None, message: str) -> Iterator[None]:
    """``say(message)`` if the block is still running after ``delay_s`` (from a timer thread); nothing otherwise."""
    if say is None:
        yield
        return
    timer = threading.Timer(delay_s, say, (message,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def post_run_facts(*, data_wait: float = 0.0, median_s: float | None = None, steps: int = 0, cuda: bool = False,
                   batches_per_step: float = 1.0, loader: dict[str, object] | None = None,
                   dataset: object | None = None, dataset_fetch: int | None = None,
                   payloads: dict[str, object] | None = None, optimizer: object | None = None,
                   optimizer_peers: tuple[object, ...] = (), optimizer_update_share: float | None = None,
                   optimizer_around: str = "", optimizer_share: float | None = None,
                   frozen_fed: bool = False) -> PostRunFacts:
    """The facts the probes get from the run's steady steps (``data_wait`` share, ``median_s``, ``steps``): whether
    data wait was notable, and the rate the step consumes batches (``batches_per_step`` of the slowest loader)."""
    compute_s = compute_time_s(median_s, data_wait) if steps and median_s else None
    return PostRunFacts(
        data_wait=data_wait, median_s=median_s, steps=steps, cuda=cuda,
        data_wait_notable=data_wait >= thresholds.DATA_WAIT_NOTABLE, notable_share=thresholds.DATA_WAIT_NOTABLE,
        consume_batches_per_s=batches_per_step / compute_s if compute_s else None,
        keeps_up_margin=thresholds.LOADER_KEEPS_UP_MARGIN,
        loader=loader, dataset=dataset, dataset_fetch=dataset_fetch, payloads=payloads or {}, optimizer=optimizer,
        optimizer_peers=optimizer_peers, optimizer_update_share=optimizer_update_share,
        optimizer_around=optimizer_around,
        optimizer_notable=optimizer_share is None or optimizer_share >= thresholds.OPTIMIZER_SHARE_NOTABLE,
        frozen_fed=frozen_fed,
    )


def assemble(
    command: Sequence[str],
    exit_status: int,
    meta: RunMeta,
    statuses: dict[str, CollectorStatus],
    results: dict[str, CollectorResult],
    fields: Mapping[str, str | None] | None = None,
    reduce: Callable[[str, str, object, Mapping[str, object]], dict[str, Any]] | None = None,
) -> RunRecord:
    """The record of measurements (no verdict yet) from what each collector returned: each payload fills the
    record field its collector declares (``fields``, by collector name), reduced by ``reduce.fields``
    (``reduce(name, field, payload, payloads)``: a stand-in for ``record_fields`` that may reuse a reduction)."""
    from gpuscope import __version__

    fields = fields or {}
    collectors = dict(statuses)
    values: dict[str, object] = {}
    notes: list[str] = []
    payloads = {name: r.payload for name, r in results.items() if r.payload is not None}
    for name, result in results.items():
        field = fields.get(name)
        collectors[name] = dataclasses.replace(result.status, field=field)
        notes.extend(f"{name}: {note}" for note in result.notes)
        if result.payload is None or field is None:
            continue
        values.update(reduce(name, field, result.payload, payloads) if reduce is not None
                      else record_fields(field, result.payload, payloads))
    return RunRecord(
        gpuscope_version=__version__,
        command=tuple(command),
        exit_status=exit_status,
        collectors=dict(sorted(collectors.items())),
        meta=dataclasses.replace(meta, notes=(*notes, *meta.notes)),
        **values,  # type: ignore[arg-type]
    )


def _status(collector: LiveCollector | Probe, state: str, reason: str) -> CollectorStatus:
    return CollectorStatus(state, reason, field=collector.field)  # type: ignore[arg-type]


def describe(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _torch_threads() -> int | None:
    """torch's intra-op threads in this process now, if the script imported torch."""
    torch = sys.modules.get("torch")
    try:
        return user_torch_threads(torch) if torch is not None else None
    except Exception:  # a partly imported or broken torch
        return None
