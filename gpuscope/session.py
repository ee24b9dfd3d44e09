"""A profiling session: starts the collectors around the user's code, then builds, analyses and writes the
record. Shared by ``gpuscope run`` and the notebook API."""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from gpuscope.analysis import analyze
from gpuscope.collectors import Collector, CollectorResult, default_collectors
from gpuscope.collectors.steps import StepsCollector, StepsPayload
from gpuscope.errors import GpuscopeError
from gpuscope.record import (
    Calibration,
    CollectorStatus,
    CudaMemory,
    DataProbe,
    Distributed,
    GpuSamples,
    HostMemory,
    LoaderProbe,
    OpProfile,
    Practices,
    PythonProfile,
    RunMeta,
    RunRecord,
    SpeedOfLight,
    SyncProfile,
    write_record,
)

_PAYLOAD_FIELDS: dict[type, str] = {
    PythonProfile: "python_profile",
    OpProfile: "op_profile",
    HostMemory: "host_memory",
    GpuSamples: "gpus",
    CudaMemory: "cuda_memory",
    Calibration: "calibration",
    Practices: "practices",
    DataProbe: "data_probe",
    SyncProfile: "syncs",
    LoaderProbe: "loader_probe",
    SpeedOfLight: "speed_of_light",
}
"""Collector payloads that go into the record as they are, and the record field each fills."""


class _Active:
    """The one session running in this process, so ``gpuscope.step()`` can reach it from anywhere."""

    session: Session | None = None


def active_session() -> Session | None:
    """The session currently collecting, if any."""
    return _Active.session


class Session:
    """Collectors around a stretch of the user's code; ``stop`` returns the finished record."""

    def __init__(self, run_dir: Path, command: Sequence[str], collectors: Sequence[Collector] | None = None,
                 distributed: Distributed | None = None) -> None:
        """``collectors`` default to ``default_collectors()``; the steps collector must come before those
        that follow its steps. Collectors stop in reverse order. ``distributed``: this process's rank in a
        torchrun job (its backend is read when the session stops)."""
        self.run_dir = Path(run_dir)
        self.distributed = distributed
        self.command = tuple(command)
        self.collectors = list(collectors) if collectors is not None else default_collectors()
        self._started: list[Collector] = []
        self._statuses: dict[str, CollectorStatus] = {}
        self.record: RunRecord | None = None

    def start(self) -> None:
        """Start every collector that can run here; one that cannot, or fails, is recorded and skipped."""
        if _Active.session is not None:
            raise GpuscopeError("a gpuscope session is already running in this process")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._started_at = datetime.now().astimezone()
        self._t0 = time.perf_counter()
        steps: StepsCollector | None = None
        for collector in self.collectors:
            try:
                reason = collector.unavailable_reason()
                if reason is not None:
                    self._statuses[collector.name] = CollectorStatus("unavailable", reason)
                    continue
                bind = getattr(collector, "bind_steps", None)
                if bind is not None and steps is not None:
                    bind(steps)  # a collector that profiles a window of steps follows them
                collector.start(self.run_dir)
                if isinstance(collector, StepsCollector):
                    steps = collector
            except Exception as exc:
                self._statuses[collector.name] = CollectorStatus("failed", _describe(exc))
                continue
            self._started.append(collector)
        _Active.session = self

    def mark_step(self) -> None:
        """An explicit step boundary (``gpuscope.step()``)."""
        for collector in self._started:
            if isinstance(collector, StepsCollector):
                collector.mark_step()

    def stop(self, exit_status: int) -> RunRecord:
        """Stop the collectors, build and analyse the record, write ``run.json``; idempotent."""
        if self.record is not None:
            return self.record
        if _Active.session is self:
            _Active.session = None
        duration = time.perf_counter() - self._t0
        results: dict[str, CollectorResult] = {}
        collector_notes: list[str] = []
        for collector in reversed(self._started):
            try:
                results[collector.name] = collector.stop()
            except Exception as exc:
                results[collector.name] = CollectorResult(CollectorStatus("failed", _describe(exc)))
            collector_notes += [f"{collector.name}: {note}" for note in getattr(collector, "notes", ())]
        meta = RunMeta(
            started_at=self._started_at.isoformat(timespec="seconds"),
            duration_s=duration,
            python=platform.python_version(),
            torch=getattr(sys.modules.get("torch"), "__version__", None),
            cpu_count=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
            platform=platform.platform(terse=True),
            notes=tuple(collector_notes),
        )
        record = assemble(self.command, exit_status, meta, self._statuses, results)
        if self.distributed is not None:
            from gpuscope.distributed import backend_now

            # most scripts destroy their process group before the end: then the trace's collectives name it
            comm = record.op_profile.communication if record.op_profile is not None else None
            backend = backend_now() or (comm.backend if comm is not None else None)
            record = dataclasses.replace(record, distributed=dataclasses.replace(self.distributed, backend=backend))
        self.record = analyze(record)
        write_record(self.record, self.run_dir)
        return self.record


def assemble(
    command: Sequence[str],
    exit_status: int,
    meta: RunMeta,
    statuses: dict[str, CollectorStatus],
    results: dict[str, CollectorResult],
) -> RunRecord:
    """The record of measurements (no verdict yet) from what each collector returned."""
    from gpuscope import __version__

    collectors = dict(statuses)
    fields: dict[str, object] = {}
    notes: list[str] = []
    for name, result in results.items():
        collectors[name] = result.status
        payload = result.payload
        field_name = _PAYLOAD_FIELDS.get(type(payload))
        if field_name is not None:
            fields[field_name] = payload
        elif isinstance(payload, StepsPayload):
            summary = payload.summary
            fields.update(
                steps=summary.steps,
                breakdown=summary.breakdown,
                host_breakdown=summary.host_breakdown,
                loaders=payload.loaders,
                device=payload.device,
            )
            notes.extend(payload.notes)
    return RunRecord(
        gpuscope_version=__version__,
        command=tuple(command),
        exit_status=exit_status,
        collectors=dict(sorted(collectors.items())),
        meta=dataclasses.replace(meta, notes=(*notes, *meta.notes)),
        **fields,  # type: ignore[arg-type]
    )


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
