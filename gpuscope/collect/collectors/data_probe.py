"""Where building one dataset item spends its time, line by line, and how much of it on float16 data.

After the script has ended and every other collector has stopped (no hook, profiler or step window sees it), a
few items of the map-style dataset the steps waited on longest are fetched again, ``dataset[i]`` (or, where its
loader gave the dataset a list of indices a fetch, ``dataset[[i, ...]]``, a batch a fetch, as it did), under a
``sys.settrace`` line tracer that follows the user's own code only. Per line it keeps the line's own time (the
time to its next line, less the time in traced user functions it called: NumPy's and torch's calls count as the
line's) and whether the line produced float16 arrays or tensors. NumPy float16 arithmetic is emulated on most
CPUs and many times slower than float32; so that the advice rests on this machine rather than on folklore, the
same element-wise expression is also timed in both precisions here. Where the loader builds its batches with a
collate function of the user's own (a padding loop), one batch's items are collated again the same way, untraced
and then traced: a batch can be built mostly outside the dataset. Where a loader without workers fetches its
items one call each and collates them with torch's default_collate, one batch is built so again, untraced, then
fetched in one call for all its indices and sliced from its tensors (``batch_fetch.py``): for small items the
calls and the loader's own work are the batch's cost.

The probe leaves no trace: the global RNG states (Python's, NumPy's, torch's CPU generator) and any trace
function already set are restored, and an item that fails to build says so in the collector's status.
"""

from __future__ import annotations

import linecache
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any, ClassVar

from gpuscope.collect.callsites import is_user_file
from gpuscope.collect.framework.base import CollectorResult, PostRunProbe, register
from gpuscope.collect.batch_fetch import (
    BatchFetch,
    draws_plainly,
    is_default_collate,
    time_batch_fetch,
)
from gpuscope.collect.collectors.cprofile import short_path
from gpuscope.collect.framework.probing import DatasetError, dataset_error, fastest, unseen, wait_under_the_bar
from gpuscope.record import CollectorStatus, DataProbe, LineCost

if TYPE_CHECKING:
    from gpuscope.collect.captures import PostRunFacts

ITEMS = 3
"""Items fetched, spread over the dataset (first, a third and two thirds in): one item can be an odd one."""
BUDGET_S = 2.0
"""No further item is fetched once the probe has taken this long: the run is over and the user is waiting."""
TOP_LINES = 8
"""Lines kept in the record, heaviest first."""
SLOWDOWN_ELEMENTS = 256 * 1024
"""Elements per array in the float16/float32 timing: a 96x96 RGB image is 27k, so a small batch of them; large
enough that the per-call overhead of a ufunc (microseconds) is noise."""
SLOWDOWN_REPEATS = 5
"""The slowdown is the ratio of the medians of this many timings in each precision."""
NOTE = ("times measured under a line tracer: every traced Python line costs a few microseconds more; the "
        "NumPy and torch calls the lines make run at full speed")
_OPERATOR = r"(?://|\*\*|>>|<<|[-+*/%@&|^])"
_AUGMENTED = re.compile(rf"\s*([A-Za-z_]\w*)\s*(?:\[.*\]\s*{_OPERATOR}?|{_OPERATOR})=(?!=)")
"""A line that writes into an existing array by name: ``x *= 0.5``, ``x[..., 0] += m``, ``x[:] = y``."""


@register
class DataProbeCollector(PostRunProbe):
    """Fetches a few items of the slowest loader's dataset after the run, timing the user's lines; only when the
    steps waited for data a notable share of their time."""

    name: ClassVar[str] = "data-probe"
    field: ClassVar[str | None] = "data_probe"
    budget_s: ClassVar[float] = BUDGET_S
    doing: ClassVar[str] = "timing the dataset's own lines"
    runs_user_code: ClassVar[bool] = True

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock

    def run(self, run_dir: Path, facts: PostRunFacts) -> CollectorResult:
        dataset = facts.dataset
        if dataset is None:
            return CollectorResult(CollectorStatus("unavailable", "no map-style dataset was iterated"))
        if not facts.data_wait_notable:  # the user's dataset code runs again only when loading matters
            return CollectorResult(CollectorStatus(
                "unavailable", f"{wait_under_the_bar(facts.data_wait, facts.notable_share)}: not probed"))
        began = self._clock()
        try:
            with unseen():
                probe = probe_dataset(dataset, self._clock, fetch=facts.dataset_fetch)
        except DatasetError as exc:
            return CollectorResult(CollectorStatus("unavailable", str(exc)))
        collate, left_s = None, BUDGET_S - (self._clock() - began)
        if (collating := _users_collate(facts)) is not None and left_s > 0:
            try:
                with unseen():
                    collate = probe_collate(dataset, *collating, self._clock, budget_s=left_s)
            except DatasetError:
                collate = None  # the items' own probe stands; a failing collate function is the loader probe's to say
        fetch = _batch_fetch(dataset, facts, probe, BUDGET_S - (self._clock() - began), self._clock)
        numpy = sys.modules.get("numpy")
        # timed only where it matters: some line of the item's made float16 data
        slowdown = measure_float16_slowdown(numpy, self._clock) if numpy is not None and probe.float16_s else None
        return CollectorResult(CollectorStatus("ok"), DataProbe(
            dataset=type(dataset).__name__,
            items=probe.items,
            item_s=probe.item_s,
            float16_s=probe.float16_s,
            lines=probe.lines,
            lines_s=probe.lines_s,
            item_cpu_share=probe.cpu_share,
            item_untraced_s=probe.untraced_s,
            numpy_float16_slowdown=slowdown,
            note=NOTE,
            batch_items=facts.dataset_fetch,
            collate_s=collate.untraced_s if collate is not None else None,
            collate_lines=collate.lines if collate is not None else (),
            collate_lines_s=collate.lines_s if collate is not None else 0.0,
            batch_built_s=fetch.built_s if fetch is not None else None,
            batch_fetched_s=fetch.fetched_s if fetch is not None else None,
            batch_sliced_s=fetch.sliced_s if fetch is not None else None,
        ))


def _batch_fetch(dataset: Any, facts: PostRunFacts, probe: Probe, left_s: float,
                 clock: Callable[[], float]) -> BatchFetch | None:
    """One batch built item by item, fetched in one call and sliced (``batch_fetch``), where the slowest loader
    builds its batches item by item in the main process: no workers, torch's default_collate, one index a fetch;
    None elsewhere, where it would not fit ``left_s``, or where the dataset raised."""
    loader = facts.loader or {}
    info: dict[str, Any] = loader.get("info") or {}  # type: ignore[assignment]
    size = info.get("batch_size")
    if (facts.dataset_fetch or info.get("num_workers") or not isinstance(size, int) or size < 2
            or not is_default_collate(loader.get("collate_fn")) or not probe.untraced_s or left_s <= 0):
        return None
    try:
        with unseen():
            return time_batch_fetch(dataset, size, probe.untraced_s, left_s, clock,
                                    sliceable=draws_plainly(loader.get("index_sampler")))
    except Exception:  # the items' own probe stands; a batch that fails to build is the loader probe's to say
        return None


def _users_collate(facts: PostRunFacts) -> tuple[Callable[[list[Any]], Any], int] | None:
    """The slowest loader's collate function and batch size, where the function is the user's own code (not
    torch's default_collate) and the dataset gives one item a fetch; None otherwise."""
    loader = facts.loader or {}
    collate, size = loader.get("collate_fn"), (loader.get("info") or {}).get("batch_size")  # type: ignore[union-attr]
    if collate is None or not isinstance(size, int) or size < 1 or facts.dataset_fetch:
        return None
    function = getattr(collate, "func", collate)  # functools.partial
    call = getattr(type(function), "__call__", None)  # a callable object's
    code = getattr(function, "__code__", None) or getattr(call, "__code__", None)
    if code is None or not is_user_file(code.co_filename):
        return None
    return collate, size  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Collated:
    """One batch collated again: untraced, and its lines under the tracer."""

    untraced_s: float
    lines: tuple[LineCost, ...]
    lines_s: float


def probe_collate(dataset: Any, collate_fn: Callable[[list[Any]], Any], batch_size: int,
                  clock: Callable[[], float] = time.perf_counter, budget_s: float = BUDGET_S) -> Collated | None:
    """Fetch one batch's items (``batch_size`` of them, from the first), then collate them with ``collate_fn`` twice
    untraced (the second, warm, call counts) and once under the line tracer; None where fetching the items took the
    budget. Raises DatasetError if the dataset or the function raises."""
    started = clock()
    try:
        length = len(dataset)
    except TypeError:
        length = batch_size
    previous = sys.gettrace()
    tracer = LineTracer(clock)
    try:
        items = []
        for index in range(batch_size):
            items.append(dataset[index % max(length, 1)])
            if clock() - started > budget_s:
                return None
        # a warm-up first: the first call runs cold
        untraced_s, _ = fastest(lambda: collate_fn(items), 1, budget_s, clock)
        sys.settrace(tracer)
        try:
            collate_fn(items)
        finally:
            sys.settrace(previous)
    except Exception as exc:
        raise dataset_error(exc, "when its batch was collated again after the run") from None
    lines = tracer.line_costs(1)
    return Collated(untraced_s, heaviest(lines), sum(c.own_s for c in lines))


@dataclass(frozen=True, slots=True)
class Probe:
    """What fetching the items showed, per item."""

    items: int
    item_s: float
    float16_s: float
    lines: tuple[LineCost, ...]
    lines_s: float = 0.0
    """Every traced line's own time per item, summed (the tracer's own work left out)."""
    cpu_share: float | None = None
    """The share of an item's fetch on the main thread's CPU, untraced."""
    untraced_s: float | None = None
    """An item's fetch, untraced (other items than the traced ones)."""


def probe_dataset(dataset: Any, clock: Callable[[], float] = time.perf_counter, items: int = ITEMS,
                  budget_s: float = BUDGET_S, fetch: int | None = None) -> Probe:
    """Fetch up to ``items`` items of ``dataset`` under the line tracer, within ``budget_s`` (at least one), after
    one untraced fetch of the last item (warming up); where ``fetch`` is given, each a batch: ``dataset[[i, i + 1,
    ...]]`` of ``fetch`` indices (wrapping around).

    Raises DatasetError if the dataset raises. Restores the trace function that was set before.
    """
    try:
        length = len(dataset)
    except TypeError:  # a map-style dataset need not have a length
        length = 1
    if length < 1:
        raise DatasetError("the dataset was empty when fetched again after the run")
    indices = sorted({k * length // items for k in range(items)})
    tracer = LineTracer(clock)
    fetched, wall_s = 0, 0.0
    started = clock()
    previous = sys.gettrace()

    def key(index: int) -> Any:
        return [(index + k) % length for k in range(fetch)] if fetch else index

    try:
        # one fetch first, untraced, of another item: in the probe's forked child the first touches of the dataset's
        # memory fault its pages in (copy-on-write), many times an indexing's time, which the first line traced took
        dataset[key(length - 1)]
        for index in indices:
            if fetched and clock() - started > budget_s:
                break
            item = key(index)
            before = clock()
            sys.settrace(tracer)
            try:
                dataset[item]
            finally:
                sys.settrace(previous)
            wall_s += clock() - before
            fetched += 1
        share, untraced_s = _cpu_share(dataset, [key(i + max(1, length // (2 * items))) for i in indices[:fetched]],
                           started + budget_s, clock)
    except Exception as exc:  # the user's code failing is not gpuscope's to report as its own failure
        raise dataset_error(exc, "when fetched again after the run") from None
    lines = tracer.line_costs(fetched)
    float16_s = sum(c.own_s for c in lines if c.float16)
    return Probe(fetched, wall_s / fetched, float16_s, heaviest(lines), sum(c.own_s for c in lines), share, untraced_s)


def heaviest(lines: list[LineCost]) -> tuple[LineCost, ...]:
    """The TOP_LINES lines of most own time, heaviest first."""
    return tuple(sorted(lines, key=lambda c: (-c.own_s, c.file, c.line))[:TOP_LINES])


def _cpu_share(dataset: Any, keys: list[Any], deadline: float,
               clock: Callable[[], float]) -> tuple[float | None, float | None]:
    """The share of fetching ``keys`` (other items than the traced ones, whose reads the page cache now holds)
    spent on the main thread's CPU, and the time a fetch took, untraced, as far as ``deadline`` allows; None and
    None where none was fetched. Each the median fetch's: a fetch of a few microseconds that the thread lost its core
    in (a busy machine) would otherwise count the other process's time slice as the item's."""
    walls: list[float] = []
    shares: list[float] = []
    for item in keys:
        if clock() > deadline:
            break
        before, cpu_before = clock(), time.thread_time()
        dataset[item]
        wall_s, cpu_s = clock() - before, time.thread_time() - cpu_before
        walls.append(wall_s)
        shares.append(min(1.0, cpu_s / wall_s) if wall_s > 0 else 1.0)
    if not walls or max(walls) <= 0:
        return None, None
    return statistics.median(shares), statistics.median(walls)


@dataclass(slots=True)
class _Frame:
    """A traced call of a user function: the line running now, since when, and the time in traced calls it made."""

    parent: _Frame | None
    entered: float
    line: int = 0
    started: float = 0.0
    child_s: float = 0.0
    arrays: dict[str, Any] | None = None
    """The frame's locals bound to arrays or tensors when the current line began."""


class LineTracer:
    """A ``sys.settrace`` function that times the user's lines and tells which produced float16 data.

    The tracer's own work is kept out of the lines' times: a line's clock starts when the tracer returns and stops
    when the next event comes in; a traced call's whole time (the tracer's work in it included) is taken off the
    calling line.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._user: dict[CodeType, bool] = {}
        self._current: _Frame | None = None
        self._own: dict[tuple[str, int], float] = {}
        self._float16: set[tuple[str, int]] = set()
        self._functions: dict[tuple[str, int], str] = {}
        self._targets: dict[tuple[str, int], str | None] = {}
        numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
        self._ndarray = numpy.ndarray if numpy is not None else None
        self._tensor = torch.Tensor if torch is not None else None
        self._torch_half = torch.float16 if torch is not None else None
        self._array_types = tuple(t for t in (self._ndarray, self._tensor) if t is not None)

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if event != "call":
            return None
        code = frame.f_code
        user = self._user.get(code)
        if user is None:
            began = self._clock()
            user = self._user[code] = code.co_name != "<module>" and is_user_file(code.co_filename)
            if self._current is not None:  # telling a file apart (a realpath) is the tracer's work, not the line's
                self._current.started += self._clock() - began
        if not user:
            return None
        state = _Frame(parent=self._current, entered=self._clock())
        self._current = state

        def local(frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
            self._event(state, frame, event, arg)
            return local

        return local

    def _event(self, state: _Frame, frame: FrameType, event: str, arg: Any) -> None:
        now = self._clock()
        if event == "exception":  # the line has not finished: its time goes on
            state.started += self._clock() - now
            return
        if state.line:
            self._close_line(state, frame, now - state.started - state.child_s, event == "return", arg)
        if event == "line":
            state.line = frame.f_lineno
            state.arrays = self._arrays(frame)
            state.child_s = 0.0
            state.started = self._clock()
        elif event == "return":
            self._current = state.parent
            if state.parent is not None:
                state.parent.child_s += self._clock() - state.entered

    def _close_line(self, state: _Frame, frame: FrameType, own_s: float, returning: bool, value: Any) -> None:
        code = frame.f_code
        key = (code.co_filename, state.line)
        self._own[key] = self._own.get(key, 0.0) + max(own_s, 0.0)
        if key not in self._functions:
            self._functions[key] = getattr(code, "co_qualname", code.co_name)
        if key in self._float16:
            return
        if self._produced_float16(state, frame, key) or (returning and self._holds_float16(value, 0)):
            self._float16.add(key)

    def _produced_float16(self, state: _Frame, frame: FrameType, key: tuple[str, int]) -> bool:
        before = state.arrays or {}
        after = self._arrays(frame)
        for name, value in after.items():
            if before.get(name) is not value and self._is_float16(value):
                return True  # a name newly bound to float16 data
        target = self._targets.get(key, "")
        if target == "":
            match = _AUGMENTED.match(linecache.getline(*key))
            target = self._targets[key] = match.group(1) if match else None
        return target is not None and target in after and self._is_float16(after[target])

    def _arrays(self, frame: FrameType) -> dict[str, Any]:
        types = self._array_types
        if not types:
            return {}
        return {name: value for name, value in frame.f_locals.items() if isinstance(value, types)}

    def _is_float16(self, value: Any) -> bool:
        if self._ndarray is not None and isinstance(value, self._ndarray):
            return value.dtype.char == "e"
        return self._tensor is not None and isinstance(value, self._tensor) and value.dtype is self._torch_half

    def _holds_float16(self, value: Any, depth: int) -> bool:
        if isinstance(value, self._array_types):
            return self._is_float16(value)
        if depth < 3 and isinstance(value, (tuple, list, dict)):
            values = value.values() if isinstance(value, dict) else value
            return any(self._holds_float16(v, depth + 1) for v in list(values)[:32])
        return False

    def line_costs(self, items: int) -> list[LineCost]:
        """Every traced line with its own time per item (``items`` fetched)."""
        return [
            LineCost(file=short_path(file), line=line, function=self._functions[(file, line)],
                     code=linecache.getline(file, line).strip()[:160], own_s=own_s / max(items, 1),
                     float16=(file, line) in self._float16)
            for (file, line), own_s in self._own.items()
        ]


def measure_float16_slowdown(numpy: Any, clock: Callable[[], float] = time.perf_counter,
                             elements: int = SLOWDOWN_ELEMENTS, repeats: int = SLOWDOWN_REPEATS) -> float:
    """How many times longer the same element-wise NumPy expression takes in float16 than in float32 here.

    The expression mixes what preprocessing does: multiply-add (scaling, normalising), a division and an ``exp``.
    """
    base = numpy.random.default_rng(0).random(elements)  # its own generator: the global state is not touched

    def median_s(dtype: Any) -> float:
        a = base.astype(dtype)
        b = (base[::-1] + 0.5).astype(dtype)
        c = (base * 0.25).astype(dtype)
        timings = []
        for _ in range(repeats + 1):  # the first run warms caches and allocations up and is not kept
            started = clock()
            a * b + c
            numpy.exp(-a) / (b + c)
            timings.append(clock() - started)
        return statistics.median(timings[1:])

    float32_s = median_s(numpy.float32)
    return median_s(numpy.float16) / float32_s if float32_s > 0 else 1.0
