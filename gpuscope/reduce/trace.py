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

The index keeps no event: an ``Indexer`` is fed the events in file order (a list in memory, or the batches
``reduce.stream`` reads from a file) and keeps what is many in compact columns (``reduce.columns``): the host
events the op table nests and the ``cpu_op`` intervals, the runtime calls and flow arrows (until each kernel is
matched to its launch), the kernels, the device events of the op table.
"""

from __future__ import annotations

import gzip
import json
import zlib
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import Any

from gpuscope.errors import GpuscopeError
from gpuscope.reduce.columns import (
    EXT,
    FLAG_BITS,
    KIND_BITS,
    NEST,
    OP,
    Column,
    DeviceEvents,
    HostEvents,
    IdMap,
    Kernels,
    OpIntervals,
    floats,
    ints,
    push_int,
    sorted_by,
)
from gpuscope.reduce.optable import DEVICE_CATEGORIES, HOST_CATEGORIES, UNLISTED
from gpuscope.reduce.stream import GZIP_MAGIC, Progress, TraceStream, unreadable_as_one_line

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
HOST_BLOCKING_SYNC_KINDS = frozenset({"Stream Sync", "Event Sync", "Context Sync"})
"""``cuda_sync`` records that block the host (libkineto's ``syncTypeString``); ``Stream Wait Event`` makes a stream
wait on the device and leaves the host free."""

Thread = tuple[Any, Any]
"""A host thread: (pid, tid) as the trace names them."""
Sync = tuple[bool, str, "float | None", "float | None", Any]
"""A call or record that may block the host: (a ``cuda_sync`` record rather than a runtime or driver call, name,
start, duration, ``args.correlation``); start and duration None where the trace gives no number."""


@dataclass(frozen=True, slots=True)
class StepSpan:
    """One recorded step on the host: the ``ProfilerStep#N`` range of the thread that ran it (microseconds)."""

    number: int
    start_us: float
    end_us: float
    thread: Thread


@dataclass(slots=True)
class Copies:
    """One device's host-to-device copies (``gpu_memcpy`` named ``...HtoD...``), in file order, as columns: start and
    duration (trace microseconds) and ``flags`` (``TS``: the start is a number, ``DUR``: the duration is,
    ``PAGEABLE``: from pageable memory)."""

    TS = 1
    DUR = 2
    PAGEABLE = 4
    ts: Column = field(default_factory=floats)
    dur: Column = field(default_factory=floats)
    flags: bytearray = field(default_factory=bytearray)

    def __len__(self) -> int:
        return len(self.flags)


@dataclass(frozen=True, slots=True)
class TraceIndex:
    """A trace's events sorted out in one pass: what every figure, and the op table of any window, is computed
    from. No event is kept: what is many is in columns (``reduce.columns``)."""

    steps: dict[Any, list[StepSpan]]
    """Host steps by the pid whose thread ran them, in time order (a merged trace of several processes has several)."""
    kernels: dict[int, Kernels]
    """Kernels by device, in start order, each with the host call that queued it."""
    ops: dict[Thread, OpIntervals] = field(default_factory=dict)
    """``cpu_op`` intervals by host thread."""
    annotations: dict[Thread, list[tuple[float, float, str]]] = field(default_factory=dict)
    """``user_annotation`` ranges (``## forward ##``, ``Optimizer.step#SGD.step``...) and DataLoader ``__next__``
    ranges by host thread: start, end, name."""
    collectives: list[tuple[float, float]] = field(default_factory=list)
    """Host-side collectives (``gloo:all_reduce``...): start, end."""
    collective_names: list[str] = field(default_factory=list)
    """Their names, in the same order."""
    issued: list[tuple[float, float, str]] = field(default_factory=list)
    """The ``c10d::`` calls that issued a collective (``c10d::allreduce_``...), on whatever thread: start, end, name."""
    waits: dict[Thread, list[tuple[float, float]]] = field(default_factory=dict)
    """By host thread: the ops that only wait for a collective to finish (``is_collective_wait``): start, end. The
    thread is idle there, though inside an op."""
    autograd: dict[Any, tuple[Column, Column]] = field(default_factory=dict)
    """By pid: the starts and ends of autograd's ``evaluate_function`` ops, by start, on any of its threads (where
    backward ran when no range says so)."""
    copies: dict[int, Copies] = field(default_factory=dict)
    """Host-to-device copies by device (a device with other copies only has none)."""
    syncs: list[Sync] = field(default_factory=list)
    """The runtime and driver calls that may block the host (``SYNC_CALLS``, blocking copies), and the ``cuda_sync``
    records of a kind that blocks it."""
    host: dict[Thread, HostEvents] = field(default_factory=dict)
    """The op table's host events by thread."""
    device: DeviceEvents = field(default_factory=DeviceEvents)
    """The op table's device events."""
    names: list[str] = field(default_factory=list)
    """Names of ops, calls, kernels and other device events, by the index the columns hold."""


def read_trace(path: Path) -> dict[str, Any]:
    """The parsed trace at ``path`` (``.json`` or gzipped), whole in memory; a GpuscopeError in one line when it
    cannot be read or is not a Chrome trace. (``gpuscope analyze`` streams the file instead: ``reduce.stream``.)"""
    with unreadable_as_one_line(path):
        raw = Path(path).read_bytes()
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


def index_file(path: Path, progress: Progress | None = None) -> tuple[TraceIndex, dict[str, Any]]:
    """The trace file at ``path`` read as a stream (``reduce.stream``) into its index, and its other top-level keys:
    only the index is kept, never the events (``progress``: told how far the reading is)."""
    stream = TraceStream(path, progress)
    indexer = Indexer()
    for batch in stream.batches():
        if batch is None:  # a later traceEvents replaces the first
            indexer = Indexer()
        else:
            indexer.add(batch)
    return indexer.finish(), stream.header


def index_trace(events: Iterable[Mapping[str, Any]]) -> TraceIndex:
    """Sort a trace's events into a TraceIndex, in one pass."""
    indexer = Indexer()
    indexer.add(events)
    return indexer.finish()


class Indexer:
    """Builds a TraceIndex from a trace's events fed in file order (``add``, as many times as needed), without
    keeping them."""

    def __init__(self) -> None:
        self.steps: dict[Any, list[StepSpan]] = {}
        self.annotations: dict[Thread, list[tuple[float, float, str]]] = {}
        self.collectives: list[tuple[float, float]] = []
        self.collective_names: list[str] = []
        self.issued: list[tuple[float, float, str]] = []
        self.waits: dict[Thread, list[tuple[float, float]]] = {}
        self.autograd: dict[Any, tuple[Column, Column]] = {}
        self.copies: dict[int, Copies] = {}
        self.syncs: list[Sync] = []
        self.host: dict[Thread, HostEvents] = {}
        self.op_threads: list[Thread] = []  # in the order of their first cpu_op interval
        self.device = DeviceEvents()
        self.names: list[str] = []
        self.name_ids: dict[str, int] = {}
        self.pids: list[Any] = []
        self.pid_ids: dict[Any, int] = {}
        self.kernels: dict[int, list[Column]] = {}  # device -> [start, end, name, correlation, has correlation]
        self.launches: list[Column] = [ints(), floats(), array("i")]  # runtime calls: correlation, start, pid
        self.flows: list[Column] = [ints(), floats(), array("i")]  # ac2g flow starts: id, start, pid
        self.roles: dict[tuple[str, str], tuple[int, int]] = {}  # (category, name) -> row code, role bits
        self.last_pid: Any = None  # the thread of the last host row, and its rows
        self.last_tid: Any = None
        self.last_rows: HostEvents | None = None

    def add(self, events: Iterable[Any]) -> None:
        """Index ``events`` (the next ones of the trace, in file order); what is not an event object is skipped."""
        host, device, flows, pid_ids = self._host, self._device, self.flows, self.pid_ids
        for e in events:  # the most frequent categories first: this loop is most of the cost of a large trace
            if type(e) is not dict:
                continue
            cat = e.get("cat")
            if cat in HOST_CATEGORIES:
                host(e, cat)
            elif cat == "ac2g":
                if e.get("ph") == "s" and type(e.get("id")) is int and type(ts := e.get("ts")) in _NUMBER_TYPES:
                    flows[0] = push_int(flows[0], e["id"])
                    flows[1].append(float(ts))
                    pid = pid_ids.get(e.get("pid"))
                    flows[2].append(pid if pid is not None else self._pid(e.get("pid")))
            elif cat in DEVICE_CATEGORIES:
                device(e, cat)

    def _name(self, name: str) -> int:
        number = self.name_ids.get(name)
        if number is None:
            number = self.name_ids[name] = len(self.names)
            self.names.append(name)
        return number

    def _pid(self, pid: Any) -> int:
        number = self.pid_ids.get(pid)
        if number is None:
            number = self.pid_ids[pid] = len(self.pids)
            self.pids.append(pid)
        return number

    def _host(self, e: dict[str, Any], cat: str) -> None:
        ts, dur, ph = e.get("ts"), e.get("dur"), e.get("ph")
        name = e.get("name", "")
        if type(name) is not str:
            name = str(name)
        known = self.roles.get((cat, name))
        code, role = known if known is not None else self._role(cat, name)
        numbered = type(ts) in _NUMBER_TYPES
        timed = numbered and type(dur) in _NUMBER_TYPES
        flags = 0
        if role & _LAUNCH:
            args = e.get("args") or {}
            corr = args.get("correlation")
            if role & _SYNC:
                self.syncs.append((False, name, float(ts) if numbered else None,
                                   float(dur) if type(dur) in _NUMBER_TYPES else None, corr))
            if type(corr) is int and numbered:
                launches = self.launches
                launches[0] = push_int(launches[0], corr)
                launches[1].append(float(ts))
                launches[2].append(self._pid(e.get("pid")))
        elif ph == "X" and timed and role & _RANGE:
            flags = self._range(e, role, name, float(ts), dur)
        ext = (e.get("args") or {}).get("External id") if role & _CPU_OP else None
        if type(ext) is int and numbered:
            flags |= EXT
        if ph == "X" and timed and role & _LISTED:
            flags |= NEST
        if not flags:
            return
        pid, tid = e.get("pid"), e.get("tid")
        rows = self.last_rows
        if rows is None or pid != self.last_pid or tid != self.last_tid:  # most rows follow one of their thread
            thread = (pid, tid)
            rows = self.host.get(thread)
            if rows is None:
                rows = self.host[thread] = HostEvents()
            self.last_pid, self.last_tid, self.last_rows = pid, tid, rows
        if flags & OP:
            if not rows.ops:
                self.op_threads.append((pid, tid))
            rows.ops += 1
        if flags & NEST:
            try:  # the op table's order (``HostEvents.key``)
                whole = int(ts)
                start = whole * 1000 + round((ts - whole) * 1000)
                key: tuple[int, int] | None = (start, -start - round(dur * 1000))
            except (ValueError, OverflowError):
                key = None
        else:
            key = None
        rows.add(ts, dur if timed else 0, code | flags, ext if flags & EXT else 0, key)

    def _role(self, cat: str, name: str) -> tuple[int, int]:
        """What a host event's category and name make it: its row code less the flags, and its role bits
        (``_LISTED``...)."""
        kind = 0 if cat == "user_annotation" or name.startswith("ProfilerStep") else 1 if cat == "cpu_op" else 2
        role = _LISTED if name not in UNLISTED else 0
        if cat in LAUNCH_CATEGORIES:
            role |= _LAUNCH
            if name in SYNC_CALLS or (name.startswith(BLOCKING_COPY_PREFIXES) and "Async" not in name):
                role |= _SYNC
        if cat in _HOST_STEP_CATEGORIES:
            role |= _RANGE
        if cat == "cpu_op":
            role |= _CPU_OP
        known = self.roles[(cat, name)] = (self._name(name) << (KIND_BITS + FLAG_BITS) | kind << FLAG_BITS, role)
        return known

    def _range(self, e: dict[str, Any], role: int, name: str, start: float, dur: float) -> int:
        """Index a timed ``cpu_op`` or ``user_annotation``; ``OP`` where it is a ``cpu_op`` interval."""
        end = start + dur
        if name.startswith(STEP_PREFIX):
            number = name[len(STEP_PREFIX):]
            span = StepSpan(int(number) if number.isdigit() else -1, start, end, (e.get("pid"), e.get("tid")))
            self.steps.setdefault(e.get("pid"), []).append(span)
        elif name[:5].lower() == "gloo:" and is_collective_name(name):
            self.collectives.append((start, end))
            self.collective_names.append(name)
        elif role & _CPU_OP:
            if is_collective_call(name):
                self.issued.append((start, end, name))
            elif is_collective_wait(name):
                self.waits.setdefault((e.get("pid"), e.get("tid")), []).append((start, end))
            elif name[:16] == "autograd::engine":
                columns = self.autograd.get(pid := e.get("pid"))
                if columns is None:
                    columns = self.autograd[pid] = (floats(), floats())
                columns[0].append(start)
                columns[1].append(end)
            if "DataLoader" in name:
                self.annotations.setdefault((e.get("pid"), e.get("tid")), []).append((start, end, name))
            return OP
        else:
            self.annotations.setdefault((e.get("pid"), e.get("tid")), []).append((start, end, name))
        return 0

    def _device(self, e: dict[str, Any], cat: str) -> None:
        ts, dur = e.get("ts"), e.get("dur")
        timed = type(ts) in _NUMBER_TYPES and type(dur) in _NUMBER_TYPES
        if cat == "kernel":
            if timed:
                columns = self.kernels.get(device := device_of(e))
                if columns is None:
                    columns = self.kernels[device] = [floats(), floats(), array("i"), ints(), bytearray()]
                start = float(ts)
                columns[0].append(start)
                columns[1].append(start + float(dur))
                columns[2].append(self._name(str(e.get("name", ""))))
                corr = (e.get("args") or {}).get("correlation")
                linked = isinstance(corr, int)
                columns[3] = push_int(columns[3], int(corr) if linked else 0)
                columns[4].append(linked)
        elif cat == "gpu_memcpy":
            copies = self.copies.get(device := device_of(e))
            if copies is None:
                copies = self.copies[device] = Copies()
            name = str(e.get("name", "")).lower()
            if "htod" in name:
                numbered = type(ts) in _NUMBER_TYPES
                copies.ts.append(float(ts) if numbered else _NAN)
                copies.dur.append(float(dur) if type(dur) in _NUMBER_TYPES else _NAN)
                copies.flags.append(numbered * Copies.TS | (type(dur) in _NUMBER_TYPES) * Copies.DUR
                                    | ("pageable" in name) * Copies.PAGEABLE)
        elif cat == "cuda_sync":
            name = str(e.get("name", ""))
            if name in HOST_BLOCKING_SYNC_KINDS:
                self.syncs.append((True, name, float(ts) if type(ts) in _NUMBER_TYPES else None,
                                   float(dur) if type(dur) in _NUMBER_TYPES else None,
                                   (e.get("args") or {}).get("correlation")))
        if e.get("ph") == "X" and timed:
            name = e.get("name", "")
            try:
                dur_ns = round(dur * 1000)
            except (ValueError, OverflowError):  # NaN or infinite: no time to add up
                return
            rows = self.device
            rows.name.append(self._name(name if type(name) is str else str(name)))
            rows.dur_ns = push_int(rows.dur_ns, dur_ns)
            ext = (e.get("args") or {}).get("External id")
            link = 1 if type(ext) is int else 2 if type(ext) is bool or (
                type(ext) is float and ext.is_integer()) else 0
            rows.ext = push_int(rows.ext, int(ext) if link else 0)
            rows.link.append(link)

    def finish(self) -> TraceIndex:
        """The index of the events added."""
        for spans in self.steps.values():
            spans.sort(key=lambda s: s.start_us)
        return TraceIndex(steps=self.steps, kernels=self._kernels(), ops={t: OpIntervals(self.host[t])
                                                                          for t in self.op_threads},
                          annotations=self.annotations, collectives=self.collectives,
                          collective_names=self.collective_names, issued=self.issued, waits=self.waits,
                          autograd={pid: (*sorted_by(c, c[0]),)  # type: ignore[misc]
                                    for pid, c in self.autograd.items()},
                          copies=self.copies,
                          syncs=self.syncs, host=self.host, device=self.device, names=self.names)

    def _kernels(self) -> dict[int, Kernels]:
        """Each device's kernels in start order, each with the host call that queued it: the runtime or driver call
        with its correlation id (the first one; where processes share the id, the latest that does not start after
        the kernel), else the ``ac2g`` flow arrow with that id (the last one)."""
        wanted = [corr for columns in self.kernels.values() for corr in compress(columns[3], columns[4])]
        found = IdMap(wanted, "i", -1, _UNWANTED)  # correlation -> first call, last flow (-2 - its index), none (-1)
        del wanted
        clashes: dict[int, list[int]] = {}  # correlation -> its calls, where processes share it
        calls, call_us, call_pid = self.launches
        for i, corr in enumerate(calls):
            first = found.get(corr)
            if first == _UNWANTED:
                continue
            if first == -1:
                found[corr] = i
            elif call_pid[i] != call_pid[first]:
                clashes.setdefault(corr, [first]).append(i)
        for j, corr in enumerate(self.flows[0]):
            if found.get(corr, 0) < 0:
                found[corr] = -2 - j
        flow_us, flow_pid = self.flows[1], self.flows[2]
        self.launches = self.flows = []
        del calls
        kernels = {}
        for device, (start, end, name, corrs, links) in self.kernels.items():
            launch_us, launch_pid = floats(), array("i")
            for t, corr, linked in zip(start, corrs, links):
                at = -1
                if linked:
                    clash = clashes.get(corr)
                    if clash is not None:
                        before = [i for i in clash if call_us[i] <= t]
                        at = max(before, key=call_us.__getitem__) if before else -1
                    else:
                        at = found.get(corr)
                if at >= 0:
                    launch_us.append(call_us[at])
                    launch_pid.append(call_pid[at])
                elif at <= -2:
                    launch_us.append(flow_us[-2 - at])
                    launch_pid.append(flow_pid[-2 - at])
                else:
                    launch_us.append(_NAN)
                    launch_pid.append(-1)
            columns = sorted_by([start, end, name, launch_us, launch_pid], start)
            kernels[device] = Kernels(*columns, names=self.names, pids=self.pids)
        self.kernels = {}
        return kernels


COLLECTIVES = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "reducescatter", "broadcast",
               "all_to_all", "alltoall")


FUNCTIONAL_COLLECTIVES = ("_c10d_functional::", "c10d_functional::")
"""The namespaces of torch's functional collectives (DTensor's, tensor parallelism's, compiled code's): an op that
issues the collective (``_c10d_functional::all_reduce``, which calls ``c10d::allreduce_``) and ``wait_tensor``, where
the thread blocks until it is done."""


def is_collective_call(name: str) -> bool:
    """Whether a torch op is a call of a torch.distributed collective (``c10d::allreduce_``)."""
    return name[:6] == "c10d::" and is_collective_name(name)


def is_communication_op(name: str) -> bool:
    """Whether a torch op's time is communication, not arithmetic: a collective's call, or a functional
    collective's op (its ``wait_tensor`` among them)."""
    return is_collective_call(name) or name.startswith(FUNCTIONAL_COLLECTIVES)


def is_collective_wait(name: str) -> bool:
    """Whether a torch op only waits for a collective to finish (``_c10d_functional::wait_tensor``)."""
    return name.endswith("::wait_tensor") and name.startswith(FUNCTIONAL_COLLECTIVES)


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


def recorded_steps(index: TraceIndex) -> list[StepSpan]:
    """The steps the figures are per: those of the process with the most recorded steps (a merged trace of several
    processes has each one's), without a last step that holds no op of its thread (torch.profiler opens
    ``ProfilerStep#N+1`` at the last ``prof.step()`` and closes it at ``stop()``: an empty stub)."""
    if not index.steps:
        return []
    spans = max(index.steps.values(), key=len)
    return drop_stub(spans, index.ops.get(spans[-1].thread, []))


def drop_stub(spans: Sequence[StepSpan], ops: OpIntervals | Sequence[tuple[float, float]]) -> list[StepSpan]:
    """``spans`` less a last step with no op of its thread inside it, unless it is the only one."""
    spans = list(spans)
    if len(spans) > 1:
        last = spans[-1]
        if isinstance(ops, OpIntervals):
            inside = ops.any_start_in(last.start_us, last.end_us)
        else:
            inside = any(last.start_us <= start < last.end_us for start, _ in ops)
        if not inside:
            spans.pop()
    return spans


_NUMBER_TYPES = (int, float)  # not isinstance: True is no time
_LISTED, _LAUNCH, _SYNC, _RANGE, _CPU_OP = 1, 2, 4, 8, 16
"""What a host event's category and name make it: a row of the op table when timed (its name is not ``UNLISTED``),
a runtime or driver call, one that blocks the host, a ``cpu_op`` or ``user_annotation`` range, a ``cpu_op``."""
_NAN = float("nan")
_UNWANTED = -(2**31)  # a correlation id no kernel has (flows are -2 - their index, from -2 down)
