"""Compact columns for what a trace holds many of: a few bytes a value in ``array`` columns rather than a tuple or an
object per event, so that the index of a trace of tens of millions of events fits in memory.

A column holds each value exactly: an integer column starts at 32 bits and widens to 64 when a value needs it, then
to a plain list (which holds anything) beyond; a time column turns into a list for an integer time a float cannot
hold exactly (beyond 2**53).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

EXACT_INT = 2**53
"""Integers a float holds exactly."""
EXACT_NS_INT = 2**43
"""Integers ``i`` for which ``float(i) * 1000`` is exact (the op table turns microseconds into nanoseconds)."""

Column = Any
"""An ``array`` column, or the list it turned into to hold a value exactly."""


def floats() -> Column:
    return array("d")


def ints() -> Column:
    return array("i")


def push_int(column: Column, value: int) -> Column:
    """``column`` with ``value`` appended: the column itself, or a wider one where the value needs it."""
    try:
        column.append(value)
    except OverflowError:
        column = array("q", column) if type(column) is array and column.typecode == "i" else list(column)
        return push_int(column, value)
    return column


def push_time(column: Column, value: float | int, limit: int = EXACT_INT) -> Column:
    """``column`` with a time (float or int, as the trace wrote it) appended exactly."""
    if type(value) is int and not -limit <= value <= limit:
        column = column if type(column) is list else list(column)
    column.append(value)
    return column


NEST = 1
"""A host row the op table nests: ``ph: "X"``, a number ``ts`` and ``dur``, a name torch lists."""
OP = 2
"""A host row that is a ``cpu_op`` interval of the index (``TraceIndex.ops``)."""
EXT = 4
"""A ``cpu_op`` with an integer ``External id``: the device events carrying it are its (when it is in the window)."""
FLAG_BITS = 3
KIND_BITS = 2
KINDS: tuple[str | None, ...] = (None, "op", "call")
"""Row kinds of host rows, by their code (None: a range, not a row)."""


@dataclass(slots=True)
class HostEvents:
    """One host thread's events, in file order: the rows of the op table and the ``cpu_op`` intervals of the index.

    ``code`` is ``name << 5 | kind << 3 | flags`` (``name``: an index into the trace's names; ``kind``: an index
    into ``KINDS``; flags: ``NEST``, ``OP``, ``EXT``). ``ts`` is as the trace wrote it; ``dur`` is in whole
    nanoseconds, ``round(dur * 1000)``, while every duration so far is that divided by 1000 exactly (Kineto writes
    three decimals), else as the trace wrote it (``ns`` says which; 0 on a row with no duration). ``ext`` is the
    ``External id`` (0 without ``EXT``). ``runs`` are the rows where a run of ``NEST`` rows in the op table's order
    (start, then longest first) begins.
    """

    ts: Column = field(default_factory=floats)
    dur: Column = field(default_factory=ints)
    code: Column = field(default_factory=lambda: array("i"))
    ext: Column = field(default_factory=ints)
    ns: bool = True
    runs: list[int] = field(default_factory=lambda: [0])
    ops: int = 0
    """Rows flagged ``OP``."""
    last: tuple[int, int] | None = None
    """(start ns, minus end ns) of the last ``NEST`` row."""

    def __len__(self) -> int:
        return len(self.code)

    def add(self, ts: float, dur: float, code: int, ext: int, key: tuple[int, int] | None) -> None:
        """Append a row (``dur`` 0 where it has none); ``key``: the op table's order of a ``NEST`` row (start ns,
        minus end ns; None for a row that has none). A row a little out of that order moves back into it; one far
        out starts a run."""
        if type(ts) is float:
            self.ts.append(ts)
        else:  # Kineto writes floats; an integer beyond 2**53 needs a list
            self.ts = push_time(self.ts, ts)
        self._add_duration(dur)
        self.code.append(code)
        try:
            self.ext.append(ext)
        except OverflowError:
            self.ext = push_int(self.ext, ext)
        if key is None:
            return
        if self.last is None or key >= self.last:
            self.last = key
            return
        at = self._place(key)
        if at is None:
            self.runs.append(len(self.code) - 1)
            self.last = key
            return
        for name in ("ts", "dur", "code", "ext"):
            column = getattr(self, name)
            column.insert(at, column.pop())

    def _add_duration(self, dur: float) -> None:
        if self.ns:
            try:
                if type(dur) is float:
                    ns = round(dur * 1000)
                    exact = ns / 1000 == dur
                else:
                    ns, exact = dur * 1000, -EXACT_NS_INT <= dur <= EXACT_NS_INT
            except (ValueError, OverflowError):  # NaN or infinite
                exact = False
            if exact:
                try:
                    self.dur.append(ns)
                except OverflowError:
                    self.dur = push_int(self.dur, ns)
                return
            self.dur, self.ns = array("d", (ns / 1000 for ns in self.dur)), False  # exact: each divides back
        self.dur = push_time(self.dur, dur, EXACT_NS_INT)

    def key(self, i: int) -> tuple[int, int] | None:
        """Row ``i``'s place in the op table's order (``nest_key``)."""
        try:
            whole = int(ts := self.ts[i])
            start = whole * 1000 + round((ts - whole) * 1000)
            return start, -start - (self.dur[i] if self.ns else round(self.dur[i] * 1000))
        except (ValueError, OverflowError):
            return None

    def _place(self, key: tuple[int, int]) -> int | None:
        """Where among the last rows of the current run the last row goes (after every ``NEST`` row whose key is
        not greater), or None when that is more than ``REORDER_ROWS`` back."""
        first = max(self.runs[-1], len(self.code) - 1 - REORDER_ROWS)
        for j in range(len(self.code) - 2, first - 1, -1):
            if self.code[j] & NEST:
                other = self.key(j)
                if other is not None and other <= key:
                    return j + 1
        return self.runs[-1] if first == self.runs[-1] else None


REORDER_ROWS = 64
"""How far back a host row out of order moves (Kineto writes a few ops after one that starts at the same time and is
shorter); further, it starts a new run (the runtime calls after the ops of their thread)."""


@dataclass(slots=True)
class OpIntervals:
    """The ``cpu_op`` intervals of one host thread, (start, end) in trace microseconds, in file order: a view of
    its ``HostEvents``."""

    events: HostEvents

    def __len__(self) -> int:
        return self.events.ops

    def __iter__(self) -> Iterator[tuple[float, float]]:
        e = self.events
        for ts, dur, code in zip(e.ts, e.dur, e.code):
            if code & OP:
                start = float(ts)
                yield start, start + (dur / 1000 if e.ns else dur)

    def any_start_in(self, start_us: float, end_us: float) -> bool:
        """Whether an interval starts in ``start_us``..``end_us`` (end excluded); from the end of the file, where
        the last steps' are."""
        e = self.events
        for ts, code in zip(reversed(e.ts), reversed(e.code)):
            if code & OP and start_us <= float(ts) < end_us:
                return True
        return False


@dataclass(slots=True)
class DeviceEvents:
    """The device events of the op table (kernels, copies, memsets, syncs with ``ph: "X"``), in file order:
    name (an index into the trace's names), duration in nanoseconds, and ``External id``.

    ``link`` says what the ``External id`` is: 0, none that an op's can equal; 1, an integer (it counts in the op's
    device time); 2, a number equal to an integer (``7.0``, ``true``: it makes the event the op's, as in a set of
    ids, but adds no device time to the op)."""

    name: Column = field(default_factory=lambda: array("i"))
    dur_ns: Column = field(default_factory=ints)
    ext: Column = field(default_factory=ints)
    link: bytearray = field(default_factory=bytearray)


@dataclass(slots=True)
class Kernels:
    """One device's kernels in start order, as columns: start and end in trace microseconds, the name (an index into
    ``names``), and the host call that queued each (its start, and an index into ``pids``; -1: none known)."""

    start_us: Column
    end_us: Column
    name: Column
    launch_us: Column
    launch_pid: Column
    names: Sequence[str]
    pids: Sequence[Any]

    def __len__(self) -> int:
        return len(self.start_us)

    def launch(self, i: int) -> tuple[float, Any] | None:
        """The host call that queued kernel ``i``: (its start, its pid), or None."""
        pid = self.launch_pid[i]
        return None if pid < 0 else (self.launch_us[i], self.pids[pid])

    def launches(self) -> Iterator[float | None]:
        """Each kernel's launch start, or None."""
        return (None if pid < 0 else ts for ts, pid in zip(self.launch_us, self.launch_pid))


DICT_ENTRY_BYTES = 100
"""About what a dict of int to int takes an entry (the key's int, the entry, the table)."""


class IdMap:
    """An integer value for each of a set of integer ids known up front (correlation ids, External ids): an ``array``
    over their range where they are dense, as ids from a counter are (a few bytes an id rather than a dict's
    hundred), else a dict. ``missing`` is the value of an id not in the set."""

    __slots__ = ("low", "values", "missing")

    def __init__(self, ids: Sequence[int], typecode: str, start: int, missing: int) -> None:
        self.missing = missing
        self.low: int | None = None
        self.values: Any = None
        size = array(typecode).itemsize
        if ids and ((high := max(ids)) - (low := min(ids))) * size < max(1 << 20, DICT_ENTRY_BYTES * len(ids)):
            self.low, self.values = low, array(typecode, [missing]) * (high - low + 1)
            for i in ids:
                self.values[i - low] = start
        else:
            self.values = dict.fromkeys(ids, start)

    def get(self, key: int, default: int | None = None) -> int:
        """The value of ``key``; ``default`` (else ``missing``) where it has none."""
        if default is None:
            default = self.missing
        if self.low is None:
            return self.values.get(key, default)
        at = key - self.low
        if 0 <= at < len(self.values) and (value := self.values[at]) != self.missing:
            return value
        return default

    def __setitem__(self, key: int, value: int) -> None:
        """Set the value of an id of the set."""
        self.values[key if self.low is None else key - self.low] = value


def sorted_by(columns: Sequence[Column], key: Column) -> list[Column]:
    """``columns`` reordered by ``key`` (stable: rows with equal keys keep their order)."""
    if all(a <= b for a, b in zip(key, key[1:])):
        return list(columns)
    order = sorted(range(len(key)), key=key.__getitem__)
    return [_take(c, order) for c in columns]


def _take(column: Column, order: list[int]) -> Column:
    if type(column) is list:
        return [column[i] for i in order]
    if type(column) is bytearray:
        return bytearray(column[i] for i in order)
    return array(column.typecode, (column[i] for i in order))
