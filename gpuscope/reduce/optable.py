"""A trace's op table, as torch.profiler's ``key_averages()`` gives it for the same recording
(torch.autograd.profiler_util), read from the exported events: ``gpuscope run``'s table of its window
(``key_averages()`` itself builds a Python object per event and a tree of them: 12 s, 1.8M objects, on a loop of 55k
ops a step) and ``gpuscope analyze``'s of the steps it found, one and the same count.

What torch does, and this module repeats over the trace's events:
- every host event (op, user annotation, runtime call) is a child of the innermost open event of its thread that
  contains it; its self time is its duration less its direct children's;
- an event whose only child has its own name absorbs it (``_remove_dup_nodes``: ``aten::mean`` calling
  ``aten::mean``): one call, the child's children and device time;
- device events (kernels, copies, memsets, syncs) are rows of their own (device time only), and give their time to
  the op whose ``External id`` they carry (the op that launched them; not the runtime call: torch also credits a
  runtime call whose CUDA correlation id happens to equal some op's id, a mix-up of two id spaces not repeated here);
- a few utility names are dropped (``_filter_name``); user annotations are ranges, not rows.
Beyond torch's table: the ops inside a DataLoader's ``__next__`` range (a main-process loader building the batch item
by item: the data wait's, not the step's compute) are counted apart as well (``OpTable.data_calls``).
Of the rows, only torch ops (``cpu_op`` events) are ops: runtime calls (``cudaLaunchKernel``) and device events
are rows of the table, never counted as ops (``OpTable.op_calls``): on a CUDA run they would double the count.

``op_table`` reads event dicts (``gpuscope run``'s window); ``indexed_table`` reads the columns a ``TraceIndex``
keeps of a streamed trace (``gpuscope analyze``) and gives the same table: each thread's rows are kept in runs
already in the nesting order, merged rather than sorted.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import compress
from dataclasses import dataclass
from typing import Any, Literal

from gpuscope.reduce.columns import EXT, FLAG_BITS, KIND_BITS, KINDS, NEST, DeviceEvents, HostEvents, IdMap
from gpuscope.record import OpStat

HOST_CATEGORIES = frozenset({"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver",
                             "xpu_runtime", "privateuse1_runtime", "privateuse1_driver", "mtia_runtime"})
"""Host events: torch nests them by time on each thread (the op table's self time)."""
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"})
"""Device events: rows of their own, and device time of the op whose ``External id`` they carry."""
UNLISTED = frozenset({"[memory]", "[OutOfMemory]", "profiler::_record_function_enter",
                      "profiler::_record_function_enter_new", "profiler::_record_function_exit", "aten::is_leaf",
                      "aten::output_nr", "aten::_version"})
"""Names torch leaves out of its events (``profiler_util._filter_name``): neither rows nor children."""
_NUMBERS = (int, float)


RowKind = Literal["op", "call", "device", "data"]
"""A row of the table: a torch op, a runtime or driver call, or a device event (kernel, copy, memset, sync); and the
one tally of the ops inside DataLoader ``__next__`` ranges (``DATA``)."""
DATA = (-1, "data")
"""The key of that tally among the rows (no name's: names are strings, or indices from 0)."""


def data_range(name: str) -> bool:
    """Whether a user annotation is a DataLoader iterator's ``__next__``
    (``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__``)."""
    return "DataLoader" in name and "__next__" in name


@dataclass(frozen=True, slots=True)
class OpTable:
    """Per-name totals of a trace's events: the rows of torch ops (the op calls, their kinds and self time), of
    runtime and driver calls, and of device events."""

    ops: tuple[OpStat, ...]
    calls: tuple[OpStat, ...] = ()
    device: tuple[OpStat, ...] = ()
    data_calls: int = 0
    """Of the op calls, those inside a DataLoader ``__next__`` range (building the batch in the main process)."""
    data_self_s: float = 0.0
    """Their self host time."""

    @property
    def rows(self) -> tuple[OpStat, ...]:
        """Every row, by name."""
        return tuple(sorted((*self.ops, *self.calls, *self.device), key=lambda o: o.name))

    @property
    def op_calls(self) -> int:
        """Calls of torch ops."""
        return sum(o.calls for o in self.ops)

    @property
    def device_s(self) -> float:
        """The device events' time in all, each counted once."""
        return sum(o.device_s for o in self.device)

    def times(self, k: int) -> OpTable:
        """The table of ``k`` runs of what this one holds (one closure call of a step of ``k``): every row's calls and
        times ``k`` times."""
        def scaled(rows: tuple[OpStat, ...]) -> tuple[OpStat, ...]:
            return tuple(OpStat(o.name, o.calls * k, o.self_host_s * k, o.device_s * k) for o in rows)
        return OpTable(scaled(self.ops), scaled(self.calls), scaled(self.device), self.data_calls * k,
                       self.data_self_s * k)


def op_table(events: Iterable[Mapping[str, Any]]) -> OpTable:
    """Per-op totals of a trace's events, as torch's ``key_averages()`` gives them for the same recording: calls,
    self host time (the event's time less its direct children's on its thread) and self device time (the kernels,
    copies and syncs whose ``External id`` is the op's). Rows: ops, runtime calls, device events by name (device
    time only). User annotations (ProfilerStep#, Optimizer.step#...) are ranges, not ops, and are left out."""
    threads: dict[tuple[Any, Any], list[tuple[Any, ...]]] = {}
    device_ns: dict[int, int] = {}
    rows: dict[tuple[str, RowKind], list[int]] = {}  # (name, kind) -> [calls, self host ns, device ns]
    for index, e in enumerate(events):
        cat = e.get("cat")
        on_host = cat in HOST_CATEGORIES
        if not on_host and cat not in DEVICE_CATEGORIES:
            continue
        ts, dur, name = e.get("ts"), e.get("dur"), e.get("name", "")
        if e.get("ph") != "X" or type(ts) not in _NUMBERS or type(dur) not in _NUMBERS:
            continue
        if type(name) is not str:
            name = str(name)
        dur_ns = round(dur * 1000)
        if not on_host:
            row = rows.setdefault((name, "device"), [0, 0, 0])
            row[0] += 1
            row[2] += dur_ns
            ext = (e.get("args") or {}).get("External id")
            if type(ext) is int:
                device_ns[ext] = device_ns.get(ext, 0) + dur_ns
        elif name not in UNLISTED:
            whole = int(ts)  # whole nanoseconds, exactly: round(ts * 1000) can miss by one on 10^12 us
            start = whole * 1000 + round((ts - whole) * 1000)
            ext = (e.get("args") or {}).get("External id") if cat == "cpu_op" else None
            thread = threads.get((e.get("pid"), e.get("tid")))
            if thread is None:
                thread = threads[(e.get("pid"), e.get("tid"))] = []
            kind = None if cat == "user_annotation" or name.startswith("ProfilerStep") else \
                "op" if cat == "cpu_op" else "call"
            thread.append((start, -start - dur_ns, index, name, kind, ext))
    for items in threads.values():
        items.sort()  # by start, outer before inner, then in trace order: (start, -end, index) is unique
        _nest(items, device_ns, rows, data_range)
    return _table(rows)


def _table(rows: dict[tuple[Any, RowKind], list[int]]) -> OpTable:
    data = rows.pop(DATA, [0, 0, 0])  # type: ignore[call-overload]
    stats = {key: OpStat(key[0], calls, host_ns / 1e9, dev_ns / 1e9)
             for key, (calls, host_ns, dev_ns) in sorted(rows.items())}
    return OpTable(*(tuple(s for (_, kind), s in stats.items() if kind == wanted)
                     for wanted in ("op", "call", "device")), data_calls=data[0], data_self_s=data[1] / 1e9)


def indexed_table(host: Mapping[Any, HostEvents], device: DeviceEvents, names: Sequence[str], start_us: float,
                  end_us: float, every_device_event: bool = False) -> OpTable:
    """``op_table(window_events(events, start_us, end_us))`` from what a ``TraceIndex`` keeps of the events (its
    ``host``, ``device`` and ``names``) rather than from the events themselves: the same table, to the last digit.
    ``every_device_event``: ``op_table(events)`` of the whole trace, whose device events are rows whichever op
    launched them (on a GPU, kernels queued by ops before the recording began run inside it)."""
    ids = list(compress(device.ext, device.link))
    device_ns = IdMap(ids, "q", 0, 0)  # External id -> device time of the events carrying it
    launched = IdMap(ids, "b", 1, 0)  # 2: an op of the window has it
    del ids
    for ext, link, ns in zip(device.ext, device.link, device.dur_ns):
        if link == 1:
            device_ns[ext] = device_ns.get(ext) + ns
    for events in host.values():
        for ts, code, ext in zip(events.ts, events.code, events.ext):
            if code & EXT and start_us <= ts < end_us:
                if launched.get(ext) == 1:
                    launched[ext] = 2
    rows: dict[tuple[Any, RowKind], list[int]] = {}  # (name index, kind) -> [calls, self host ns, device ns]
    for name, ns, ext, link in zip(device.name, device.dur_ns, device.ext, device.link):
        if every_device_event or link and launched.get(ext) == 2:
            row = rows.setdefault((name, "device"), [0, 0, 0])
            row[0] += 1
            row[2] += ns
    for events in host.values():
        runs = [_run(events, first, last, start_us, end_us)
                for first, last in zip(events.runs, [*events.runs[1:], len(events)])]
        _nest(runs[0] if len(runs) == 1 else heapq.merge(*runs), device_ns, rows,
              lambda name: data_range(names[name]))
    data = rows.pop(DATA, None)  # type: ignore[call-overload]
    named: dict[tuple[Any, RowKind], list[int]] = {(names[name], kind): row for (name, kind), row in rows.items()}
    if data is not None:
        named[DATA] = data  # type: ignore[index]
    return _table(named)


def _run(events: HostEvents, first: int, last: int, start_us: float, end_us: float) -> Iterator[tuple[Any, ...]]:
    """The ``NEST`` rows of ``events[first:last]`` (a run in the op table's order) that start in the window, as
    ``op_table`` sorts them."""
    columns = [_slice(c, first, last) for c in (events.ts, events.dur, events.code, events.ext)]
    ns = events.ns
    for i, (ts, dur, code, ext) in enumerate(zip(*columns), first):
        if code & NEST and start_us <= ts < end_us:
            whole = int(ts)  # whole nanoseconds, exactly: round(ts * 1000) can miss by one on 10^12 us
            start = whole * 1000 + round((ts - whole) * 1000)
            yield (start, -start - (dur if ns else round(dur * 1000)), i, code >> (KIND_BITS + FLAG_BITS),
                   KINDS[code >> FLAG_BITS & (1 << KIND_BITS) - 1], ext if code & EXT else None)


def _slice(column: Any, first: int, last: int) -> Any:
    """``column[first:last]`` without copying an ``array``."""
    return column[first:last] if type(column) is list else memoryview(column)[first:last]


def window_events(events: Iterable[Mapping[str, Any]], start_us: float, end_us: float) -> list[Mapping[str, Any]]:
    """The events of the host window ``start_us``..``end_us`` (trace microseconds): host events starting in it, and
    the device events launched by its ops (their ``External id``), wherever they ran."""
    host: list[Mapping[str, Any]] = []
    device: list[Mapping[str, Any]] = []
    launched: set[int] = set()
    for e in events:
        cat = e.get("cat")
        if cat in DEVICE_CATEGORIES:
            device.append(e)
        elif cat in HOST_CATEGORIES and type(ts := e.get("ts")) in _NUMBERS and start_us <= ts < end_us:
            host.append(e)
            ext = (e.get("args") or {}).get("External id") if cat == "cpu_op" else None
            if type(ext) is int:
                launched.add(ext)
    return host + [e for e in device if (e.get("args") or {}).get("External id") in launched]


Frame = list[Any]
"""An open host event: [end ns, name, duration ns, device ns, row kind (None: not a row), children, children's ns,
its only child, inside a DataLoader ``__next__`` range (itself one, or within one)]."""


def _nest(items: Iterable[tuple[Any, ...]], device_ns: Mapping[int, int] | IdMap,
          rows: dict[tuple[Any, RowKind], list[int]], data: Callable[[Any], bool]) -> None:
    """One thread's host events nested as torch nests them (``EventList._populate_cpu_children``): an event is a
    child of the innermost open one it fits in; then, as ``_remove_dup_nodes``, an event whose only child has its
    name absorbs it (one call, the child's children and device time). Each event is tallied once its parent closes,
    when that is known."""
    stack: list[Frame] = []
    ranges: dict[Any, bool] = {}  # name -> whether it is a DataLoader __next__ range (annotations only)
    for start, minus_end, _, name, kind, ext in items:
        end = -minus_end
        while stack and (start >= stack[-1][0] or end > stack[-1][0]):
            _close(stack, rows)
        inside = bool(stack) and stack[-1][8]
        if kind is None and not inside:
            inside = ranges[name] if name in ranges else ranges.setdefault(name, data(name))
        stack.append([end, name, end - start, device_ns.get(ext, 0) if ext is not None else 0, kind, 0, 0, None,
                      inside])
    while stack:
        _close(stack, rows)


def _close(stack: list[Frame], rows: dict[tuple[Any, RowKind], list[int]]) -> None:
    frame = stack.pop()
    only = frame[7]
    if frame[5] == 1:
        if only[1] == frame[1]:
            frame[3], frame[6] = only[3], only[6]
        else:
            _tally(only, rows)
    if not stack:
        _tally(frame, rows)
        return
    parent = stack[-1]
    parent[5] += 1
    parent[6] += frame[2]
    if parent[5] == 1:
        parent[7] = frame
        return
    if parent[5] == 2:
        _tally(parent[7], rows)
    _tally(frame, rows)


def _tally(frame: Frame, rows: dict[tuple[Any, RowKind], list[int]]) -> None:
    if frame[4] is not None:
        row = rows.setdefault((frame[1], frame[4]), [0, 0, 0])
        row[0] += 1
        row[1] += frame[2] - frame[6]
        row[2] += frame[3]
        if frame[8] and frame[4] == "op":
            data = rows.setdefault(DATA, [0, 0, 0])  # type: ignore[arg-type]
            data[0] += 1
            data[1] += frame[2] - frame[6]


def events_before(events: Iterable[Mapping[str, Any]], end_us: float) -> list[Mapping[str, Any]]:
    """``events`` less the host events starting at ``end_us`` or later and the device events those launched (their
    ``External id``): the trace up to a point, its metadata kept."""
    dropped: set[int] = set()
    kept: list[Mapping[str, Any]] = []
    for e in events:
        if e.get("cat") in HOST_CATEGORIES and type(ts := e.get("ts")) in _NUMBERS and ts >= end_us:
            ext = (e.get("args") or {}).get("External id") if e.get("cat") == "cpu_op" else None
            if type(ext) is int:
                dropped.add(ext)
            continue
        kept.append(e)
    return [e for e in kept if e.get("cat") not in DEVICE_CATEGORIES
            or (e.get("args") or {}).get("External id") not in dropped]


ELEMENTWISE = frozenset({
    "abs", "add", "addcdiv", "addcmul", "clamp", "clamp_min", "cos", "div", "erf", "exp", "fill", "gelu",
    "hardtanh", "leaky_relu", "lerp", "log", "log_sigmoid", "maximum", "minimum", "mul", "neg", "pow", "reciprocal",
    "relu", "rsqrt", "rsub", "sigmoid", "sigmoid_backward", "silu", "sin", "sqrt", "sub", "tanh", "tanh_backward",
    "threshold_backward", "gelu_backward", "silu_backward", "where", "zero",
})
"""aten ops that compute each output element from the matching input elements: chains of them are what a fusing
compiler turns into one kernel (in-place forms, ``add_``, count too)."""
MATMUL = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "addbmm"})


def op_kind(name: str) -> str:
    """``elementwise``, ``matmul``, ``conv`` or ``other``, from an op's profiler name (``aten::add_``)."""
    base = name.removeprefix("aten::").rstrip("_")
    if base in ELEMENTWISE:
        return "elementwise"
    if base in MATMUL:
        return "matmul"
    if "conv" in base:
        return "conv"
    return "other"
