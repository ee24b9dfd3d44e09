"""Reading a torch.profiler (Kineto) Chrome trace, and indexing it once: the recorded steps on the host, the
kernels of each device, the host calls that launched them.

Kineto writes ``ts`` and ``dur`` in microseconds. What is read (libkineto ``output_json.cpp``):

- ``ProfilerStep#N`` (``cat: "user_annotation"``; ``"cpu_op"`` in older torch): one recorded step on the thread that
  called ``prof.step()`` (the *training thread*); its ``gpu_user_annotation`` twin on the device is not a host step;
- ``cat: "kernel"``: a kernel on device ``args.device`` (else ``pid``), stream ``tid``, with ``args.correlation``;
- ``cat: "cuda_runtime"`` / ``"cuda_driver"``: the host call that queued it (``cudaLaunchKernel``,
  ``hipExtModuleLaunchKernel``...), same ``args.correlation``; ``cat: "ac2g"``, ``ph: "s"`` is the flow arrow from
  that call (``id`` the correlation, ``ts`` the call's start), read when the runtime event itself was dropped;
- ``gpu_memcpy`` copies and ``cuda_sync`` records, for the copy and sync figures.

Traces are read tolerantly: gzipped or not (by content, whatever the name), invalid UTF-8 replaced (names of ops
and kernels may hold any bytes), a bare JSON list of events taken as ``traceEvents``.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuscope.errors import GpuscopeError

GZIP_MAGIC = b"\x1f\x8b"
STEP_PREFIX = "ProfilerStep#"
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
_HOST_STEP_CATEGORIES = frozenset({"user_annotation", "cpu_op"})

SYNC_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
    "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize",
})
"""Runtime and driver calls that block the host until the GPU has finished the work they wait for."""
BLOCKING_COPY_PREFIXES = ("cudaMemcpy", "cuMemcpy", "hipMemcpy")
"""Copies named so block the host until they are done, unless their name says ``Async`` (``cudaMemcpy``,
``cudaMemcpy2D``, ``cuMemcpyDtoH_v2``, ``hipMemcpyWithStream``; not ``cudaMemcpyAsync``)."""

Thread = tuple[Any, Any]
"""A host thread: (pid, tid) as the trace names them."""


@dataclass(frozen=True, slots=True)
class StepSpan:
    """One recorded step on the host: the ``ProfilerStep#N`` range of the thread that ran it (microseconds)."""

    number: int
    start_us: float
    end_us: float
    thread: Thread


@dataclass(frozen=True, slots=True)
class Kernel:
    """One kernel on a device, in trace microseconds; ``correlation`` links it to the host call that queued it."""

    start_us: float
    end_us: float
    name: str
    correlation: int | None
    device: int


@dataclass(frozen=True, slots=True)
class TraceIndex:
    """A trace's events sorted out in one pass: what every figure is computed from."""

    steps: dict[Any, list[StepSpan]]
    """Host steps by the pid whose thread ran them, in time order (a merged trace of several processes has several)."""
    kernels: dict[int, list[Kernel]]
    """Kernels by device, in start order."""
    launches: dict[int, tuple[float, Any]]
    """Correlation id -> (start of the host call that queued the work, its pid)."""
    ops: dict[Thread, list[tuple[float, float]]] = field(default_factory=dict)
    """``cpu_op`` intervals by host thread."""
    annotations: dict[Thread, list[tuple[float, float, str]]] = field(default_factory=dict)
    """``user_annotation`` ranges (``## forward ##``, ``Optimizer.step#SGD.step``...) and DataLoader ``__next__``
    ranges by host thread: start, end, name."""
    collectives: list[tuple[float, float]] = field(default_factory=list)
    """Host-side collectives (``gloo:all_reduce``...): start, end."""
    copies: dict[int, list[Mapping[str, Any]]] = field(default_factory=dict)
    """``gpu_memcpy`` events by device."""
    syncs: list[Mapping[str, Any]] = field(default_factory=list)
    """The runtime and driver calls that may block the host (``SYNC_CALLS``, blocking copies), and the ``cuda_sync``
    records."""
    clashes: dict[int, list[tuple[float, Any]]] = field(default_factory=dict)
    """Correlation ids used by several processes (traces of several ranks merged into one list): every launch."""

    def launch_of(self, kernel: Kernel) -> tuple[float, Any] | None:
        """The host call that queued ``kernel``: (its start, its pid). Where processes share a correlation id, the
        latest launch that does not start after the kernel."""
        if kernel.correlation is None:
            return None
        clash = self.clashes.get(kernel.correlation)
        if clash is not None:
            before = [launch for launch in clash if launch[0] <= kernel.start_us]
            return max(before, key=lambda launch: launch[0]) if before else None
        return self.launches.get(kernel.correlation)


def read_trace(path: Path) -> dict[str, Any]:
    """The parsed trace at ``path`` (``.json`` or gzipped); a GpuscopeError in one line when it cannot be read or
    is not a Chrome trace."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise GpuscopeError(f"no such trace file: {path}") from None
    except IsADirectoryError:
        raise GpuscopeError(f"{path} is a folder, not a trace file") from None
    except OSError as exc:
        raise GpuscopeError(f"cannot read {path}: {exc.strerror}") from None
    return parse_trace(raw, str(path))


def parse_trace(raw: bytes, where: str) -> dict[str, Any]:
    """A trace from its bytes (gzipped or plain JSON); ``where`` names it in errors."""
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise GpuscopeError(f"{where} is not a readable gzip file (truncated?): {exc}") from None
    text = raw.decode("utf-8", errors="replace")
    del raw
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise GpuscopeError(f"{where} is not a JSON trace (truncated, or another kind of file): {exc}") from None
    if isinstance(data, list):  # the Chrome trace format's array form
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise GpuscopeError(f"{where} is not a torch.profiler trace: it has no traceEvents list")
    return data


def index_trace(events: Iterable[Mapping[str, Any]]) -> TraceIndex:
    """Sort a trace's events into a TraceIndex, in one pass (a 50 MB trace holds a few hundred thousand)."""
    steps: dict[Any, list[StepSpan]] = {}
    kernels: dict[int, list[Kernel]] = {}
    index = TraceIndex(steps=steps, kernels=kernels, launches={})
    flows: dict[int, tuple[float, Any]] = {}
    for e in events:  # the most frequent categories first: this loop is most of the cost of a large trace
        cat = e.get("cat")
        if cat in _HOST_STEP_CATEGORIES:
            if e.get("ph") == "X" and type(e.get("ts")) in _NUMBER_TYPES and type(e.get("dur")) in _NUMBER_TYPES:
                _host_event(e, index)
        elif cat in LAUNCH_CATEGORIES or cat == "cuda_sync":
            name = e.get("name")
            if cat == "cuda_sync" or name in SYNC_CALLS or (
                    type(name) is str and name.startswith(BLOCKING_COPY_PREFIXES) and "Async" not in name):
                index.syncs.append(e)
            corr = (e.get("args") or {}).get("correlation")
            if cat != "cuda_sync" and type(corr) is int and type(e.get("ts")) in _NUMBER_TYPES:
                _add_launch(index, corr, (float(e["ts"]), e.get("pid")))
        elif cat == "ac2g":
            if e.get("ph") == "s" and type(e.get("id")) is int and type(e.get("ts")) in _NUMBER_TYPES:
                flows[e["id"]] = (float(e["ts"]), e.get("pid"))
        elif cat == "kernel":
            kernel = _kernel(e)
            if kernel is not None:
                kernels.setdefault(kernel.device, []).append(kernel)
        elif cat == "gpu_memcpy":
            index.copies.setdefault(device_of(e), []).append(e)
    for corr, launch in flows.items():
        if corr not in index.launches:
            index.launches[corr] = launch
    for spans in steps.values():
        spans.sort(key=lambda s: s.start_us)
    for device_kernels in kernels.values():
        device_kernels.sort(key=lambda k: k.start_us)
    return index


def _add_launch(index: TraceIndex, corr: int, launch: tuple[float, Any]) -> None:
    known = index.launches.get(corr)  # the same id from another process: traces of several ranks merged
    if known is None:
        index.launches[corr] = launch
    elif known[1] != launch[1]:
        index.clashes.setdefault(corr, [known]).append(launch)


def _host_event(e: Mapping[str, Any], index: TraceIndex) -> None:
    name = e.get("name", "")
    if type(name) is not str:
        name = str(name)
    start = float(e["ts"])
    end = start + e["dur"]
    if name.startswith(STEP_PREFIX):
        number = name[len(STEP_PREFIX):]
        span = StepSpan(int(number) if number.isdigit() else -1, start, end, (e.get("pid"), e.get("tid")))
        index.steps.setdefault(e.get("pid"), []).append(span)
    elif name[:5].lower() == "gloo:" and is_collective_name(name):
        index.collectives.append((start, end))
    elif e["cat"] == "cpu_op":
        thread = (e.get("pid"), e.get("tid"))
        ops = index.ops.get(thread)
        if ops is None:
            ops = index.ops[thread] = []
        ops.append((start, end))
        if "DataLoader" in name:
            index.annotations.setdefault(thread, []).append((start, end, name))
    else:
        index.annotations.setdefault((e.get("pid"), e.get("tid")), []).append((start, end, name))


COLLECTIVES = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "reducescatter", "broadcast",
               "all_to_all", "alltoall")


def is_collective_name(name: str) -> bool:
    """Whether a range's name is a collective's execution (``gloo:all_reduce``), not its enqueueing."""
    lowered = name.lower()
    return any(c in lowered for c in COLLECTIVES)


def device_of(event: Mapping[str, Any]) -> int:
    """The device an event ran on: ``args.device``, else its ``pid`` (Kineto gives each device its own pid)."""
    device = (event.get("args") or {}).get("device")
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    pid = event.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else 0


def _kernel(e: Mapping[str, Any]) -> Kernel | None:
    if not _timed(e):
        return None
    start = float(e["ts"])
    corr = (e.get("args") or {}).get("correlation")
    return Kernel(start, start + float(e["dur"]), str(e.get("name", "")), corr if isinstance(corr, int) else None,
                  device_of(e))


def recorded_steps(index: TraceIndex) -> list[StepSpan]:
    """The steps the figures are per: those of the process with the most recorded steps (a merged trace of several
    processes has each one's), without a last step that holds no op of its thread (torch.profiler opens
    ``ProfilerStep#N+1`` at the last ``prof.step()`` and closes it at ``stop()``: an empty stub)."""
    if not index.steps:
        return []
    spans = max(index.steps.values(), key=len)
    return drop_stub(spans, index.ops.get(spans[-1].thread, []))


def drop_stub(spans: Sequence[StepSpan], ops: Sequence[tuple[float, float]]) -> list[StepSpan]:
    """``spans`` less a last step with no op of its thread inside it, unless it is the only one."""
    spans = list(spans)
    if len(spans) > 1:
        last = spans[-1]
        if not any(last.start_us <= start < last.end_us for start, _ in ops):
            spans.pop()
    return spans


_NUMBER_TYPES = (int, float)


def _number(value: Any) -> bool:
    return type(value) in _NUMBER_TYPES  # not isinstance: True is no time


def _timed(event: Mapping[str, Any]) -> bool:
    return type(event.get("ts")) in _NUMBER_TYPES and type(event.get("dur")) in _NUMBER_TYPES
