"""Host memory over the run: resident memory (RSS) of this process and of its child processes.

A daemon thread samples every ``interval_s``. Children are found recursively, so DataLoader workers count under
every start method: fork and spawn workers are our children, forkserver workers the forkserver's. The series
stays bounded: when ``max_samples`` are held, every other sample is dropped and the interval doubles, so a run
of any length is covered evenly. Peaks are kept over every sample taken, thinned ones included.

Each sample also reads this process's own CPU time, user and kernel, and its page faults (``getrusage``), the
training thread's own CPU time, with the steps counted by then: how much of the steps' time the kernel takes
faulting in fresh memory (the ``tune-host-allocator`` rule), at no cost to the steps themselves.

At each scan the children's CPU time, and their time waiting for a core, are read too (``ChildrenCpu``, from the
kernel's ``/proc/PID/schedstat``): how much of their time DataLoader workers spend on a CPU or waiting for one,
rather than blocked on files or the network, tells whether more workers than cores would help. multiprocessing's
own helpers, its resource tracker (spawn, forkserver) and forkserver (whose forked workers share its command line,
but not its parent), are counted (``max_helpers``) and left out of that time: they wait all run long.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

from gpuscope.collect import last_reading
from gpuscope.collect.allocator import allocator_in_use, malloc_settings, own_usage, page_bytes, thread_usage
from gpuscope.collect.children import (ChildrenCpu, OwnThreads, ProcessThreads, descendants, helper_verdict,
                                      schedstat)
from gpuscope.collect.framework.base import CollectorResult, StepEvents, Watcher, register
from gpuscope.collect.process_starts import ProcessStarts
from gpuscope.record import CollectorStatus, HostMemory

T = TypeVar("T")

DEFAULT_INTERVAL_S = 0.1
DEFAULT_MAX_SAMPLES = 2000
CHILDREN_SCAN_S = 0.5
"""How often the list of child processes is rebuilt; between scans only the known children's RSS is read. On Linux
a scan reads the kernel's list of each thread's children (``descendants``); psutil, the fallback elsewhere, reads
every process's ``/proc/PID/stat`` in Python, holding the GIL, which costs the training thread more than all the
samples themselves (figures in docs/measurements.md)."""
JOIN_TIMEOUT_S = 2.0
MIB = 1 << 20


def thin(samples: Sequence[T]) -> list[T]:
    """Every other sample, starting with the first: half as many, at twice the spacing."""
    return list(samples[::2])


def next_deadline(deadline: float, interval_s: float, now: float) -> float:
    """When the next sample is due. Deadlines rather than sleeps keep the spacing even; after an overrun the
    schedule starts afresh from ``now`` rather than bursting to catch up."""
    deadline += interval_s
    return deadline if deadline > now else now + interval_s


class BoundedSeries(Generic[T]):
    """Samples taken every ``interval_s``, at most ``max_samples`` of them.

    When full, ``add`` thins the series (``thin``) and doubles ``interval_s``, which the sampler then uses
    for its next deadline, so the kept samples stay evenly spaced over the whole run.
    """

    def __init__(self, interval_s: float, max_samples: int) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, not {interval_s}")
        if max_samples < 2:
            raise ValueError(f"max_samples must be at least 2, not {max_samples}")
        # An even capacity keeps the spacing across a thinning: the last kept sample is then two old intervals
        # (one new interval) before the sample being added.
        self.max_samples = max_samples + max_samples % 2
        self.interval_s = interval_s
        self.samples: list[T] = []

    def add(self, sample: T) -> None:
        """Append a sample, thinning first if the series is full."""
        if len(self.samples) >= self.max_samples:
            self.samples = thin(self.samples)
            self.interval_s *= 2
        self.samples.append(sample)


class MemorySample(NamedTuple):
    """One reading: seconds since start, RSS of the process, summed RSS of its children, and how many; the
    process's CPU seconds so far in user mode and in the kernel, its minor page faults so far, the steps
    counted by then, and the training thread's own CPU seconds so far, user and kernel, and its seconds runnable
    but waiting for a core (None: not read)."""

    t_s: float
    process_bytes: int
    workers_bytes: int
    workers: int
    user_s: float = 0.0
    sys_s: float = 0.0
    minor_faults: int = 0
    steps: int = 0
    thread_user_s: float | None = None
    thread_sys_s: float | None = None
    thread_runnable_s: float | None = None


@dataclass(frozen=True, slots=True)
class MemoryPeaks:
    """Highest readings seen; ``total_bytes`` is the highest process + children sum at one sample."""

    total_bytes: int = 0
    process_bytes: int = 0
    workers_bytes: int = 0
    workers: int = 0


def merge_peaks(peaks: MemoryPeaks, sample: MemorySample) -> MemoryPeaks:
    """``peaks`` raised by one more sample."""
    return MemoryPeaks(
        total_bytes=max(peaks.total_bytes, sample.process_bytes + sample.workers_bytes),
        process_bytes=max(peaks.process_bytes, sample.process_bytes),
        workers_bytes=max(peaks.workers_bytes, sample.workers_bytes),
        workers=max(peaks.workers, sample.workers),
    )


def peaks_of(samples: Iterable[MemorySample], start: MemoryPeaks | None = None) -> MemoryPeaks:
    """The peaks over ``samples`` (and over ``start``, peaks of samples seen before)."""
    peaks = start or MemoryPeaks()
    for sample in samples:
        peaks = merge_peaks(peaks, sample)
    return peaks


def build_host_memory(
    samples: Sequence[MemorySample], interval_s: float, peaks: MemoryPeaks | None = None,
    children_cpu: tuple[float, float, float] = (0.0, 0.0, 0.0), max_helpers: int = 0,
    allocator: tuple[str, tuple[str, ...]] = ("", ()),
) -> HostMemory:
    """The record's ``HostMemory`` from kept samples; ``peaks`` adds those of samples thinned away;
    ``children_cpu``: the children's (CPU, waiting for a core, watched) seconds (``ChildrenCpu.totals``), less
    multiprocessing's helpers (``max_helpers`` of them at once); ``allocator``: the C allocator serving malloc and
    the names of glibc's malloc settings set (``allocator_in_use``, ``malloc_settings``)."""
    top = peaks_of(samples, peaks)
    return HostMemory(
        interval_s=interval_s,
        peak_bytes=top.total_bytes,
        peak_process_bytes=top.process_bytes,
        peak_workers_bytes=top.workers_bytes,
        max_workers=top.workers,
        t_s=tuple(s.t_s for s in samples),
        process_bytes=tuple(s.process_bytes for s in samples),
        workers_bytes=tuple(s.workers_bytes for s in samples),
        workers_cpu_s=children_cpu[0],
        workers_runnable_s=children_cpu[1],
        workers_watched_s=children_cpu[2],
        max_helpers=max_helpers,
        user_s=tuple(round(s.user_s, 4) for s in samples),
        sys_s=tuple(round(s.sys_s, 4) for s in samples),
        minor_faults=tuple(s.minor_faults for s in samples),
        steps_seen=tuple(s.steps for s in samples),
        **_thread_times(samples),
        page_bytes=page_bytes(),
        allocator=allocator[0],
        malloc_settings=allocator[1],
    )


def _thread_times(samples: Sequence[MemorySample]) -> dict[str, tuple[float, ...]]:
    """The training thread's times, one a sample, each series where every sample read it; none otherwise."""
    names = ("thread_user_s", "thread_sys_s", "thread_runnable_s")
    return {name: tuple(round(getattr(s, name), 4) for s in samples) for name in names
            if samples and all(getattr(s, name) is not None for s in samples)}


@contextlib.contextmanager
def _without_ipython() -> Iterator[None]:
    """memory_profiler imports IPython, when it is installed, for its notebook magics (which gpuscope does not use):
    about 60 ms of every run's start-up. Outside a notebook that import is made to fail, as if IPython were
    not installed (memory_profiler then leaves the magics out); in a notebook IPython is already imported."""
    if "IPython" in sys.modules:
        yield
        return
    sys.modules["IPython"] = None  # type: ignore[assignment]  # "import IPython" raises ImportError
    try:
        yield
    finally:
        if sys.modules.get("IPython", 0) is None:
            del sys.modules["IPython"]


@register
class HostMemoryCollector(Watcher):
    """Samples the RSS of this process and of its child processes (DataLoader workers) over the run."""

    name: ClassVar[str] = "memory"
    field: ClassVar[str | None] = "host_memory"

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        children_scan_s: float = CHILDREN_SCAN_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._series: BoundedSeries[MemorySample] = BoundedSeries(interval_s, max_samples)
        self._children_scan_s = children_scan_s
        self._clock = clock
        self._peaks = MemoryPeaks()
        self._children_cpu = ChildrenCpu()
        self._started_threads: dict[int, ProcessThreads] = {}  # the processes the script started, by pid
        self._helpers: dict[int, bool] = {}  # pid -> whether it is one of multiprocessing's helpers
        self._max_helpers = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._children: list[Any] = []
        self._last_scan = -math.inf
        self._failures = 0
        self._events: StepEvents | None = None
        self._allocator: tuple[str, tuple[str, ...]] = ("", ())
        self._starts = ProcessStarts()
        self._own = OwnThreads(os.getpid())
        self._tid = 0  # the training thread, from start()
        self._thread_times: tuple[int, tuple[float, float, float]] | None = None  # its id and last reading
        self._unwatch: Callable[[], None] = lambda: None
        self._last_error = ""
        self._scan_error = ""
        self._run_dir: Path | None = None
        self._last_written = -math.inf
        self.notes: tuple[str, ...] = ()
        """Plain statements about how memory was measured, for the run's notes."""

    def unavailable_reason(self) -> str | None:
        try:
            with _without_ipython():
                import memory_profiler  # noqa: F401
            import psutil  # noqa: F401
        except Exception as exc:  # a broken install is as unusable as a missing one
            return f"memory_profiler or psutil could not be imported: {exc}".splitlines()[0]
        return None

    # -- lifecycle ---------------------------------------------------------------------------------------
    def follow(self, events: StepEvents) -> None:
        """Read the steps counted so far at each sample (no listener: the steps pay nothing for it)."""
        self._events = events

    def start(self, run_dir: Path) -> None:
        import memory_profiler
        import psutil

        self._psutil = psutil
        self._pid = os.getpid()
        self._me = psutil.Process(self._pid)
        self._command = self._me.cmdline()
        # The design names memory_profiler for RSS; its per-pid reader is private, so fall back to psutil
        # (which it uses underneath) should a later release drop it.
        self._get_memory: Callable[..., Any] | None = getattr(memory_profiler, "_get_memory", None)
        self._t0 = self._clock()
        self._run_dir = Path(run_dir) if Path(run_dir).is_dir() else None
        self._allocator = (allocator_in_use(), malloc_settings())
        self._unwatch = self._starts.install()
        self._own = OwnThreads(self._pid)
        self._tid = threading.get_native_id()  # the loop's thread where no steps are followed: the one starting them
        self._sample(rescan=True)  # synchronous, so even a run shorter than one interval has a first point
        self._thread = threading.Thread(target=self._run, name="gpuscope-memory", daemon=True)
        self._thread.start()

    def stop(self) -> CollectorResult:
        self._stopping.set()
        self._unwatch()
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)
        self._sample(rescan=True)  # and a last point, with the children as they are now
        if self._run_dir is not None:
            (self._run_dir / last_reading.LAST).unlink(missing_ok=True)
            self._run_dir = None
        with self._lock:
            samples = list(self._series.samples)
            interval_s = self._series.interval_s
            peaks = self._peaks
        notes = []
        if self._failures:
            notes.append(f"{self._failures} host memory samples failed (last: {self._last_error})")
        if self._scan_error:
            notes.append(f"child processes could not always be listed (last: {self._scan_error})")
        if self._get_memory is None:
            notes.append("memory_profiler has no _get_memory: process RSS read with psutil")
        self.notes = tuple(notes)
        if not samples:
            return CollectorResult(CollectorStatus("failed", f"no memory sample succeeded: {self._last_error}"),
                                   notes=self.notes)
        memory = build_host_memory(
            samples, interval_s, peaks, self._children_cpu.totals(), self._max_helpers, self._allocator)
        own = self._own.totals()
        return CollectorResult(CollectorStatus("ok"), dataclasses.replace(
            memory, processes=self._starts.record(self._children_cpu.cpu_by_pid(), self._threads_by_pid()),
            processes_not_listed=self._starts.more, own_cpu_s=own and round(own[0], 3),
            own_runnable_s=own and round(own[1], 3)), notes=self.notes)

    # -- sampling ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        with self._lock:
            deadline = self._t0 + self._series.interval_s
        while not self._stopping.wait(max(0.0, deadline - self._clock())):
            self._sample(rescan=False)
            with self._lock:
                interval_s = self._series.interval_s
            deadline = next_deadline(deadline, interval_s, self._clock())

    def _sample(self, rescan: bool) -> None:
        """Take one reading; a failure is counted, never raised (this runs on the sampling thread)."""
        try:
            now = self._clock()
            process = self._process_rss()
            if rescan or now - self._last_scan >= self._children_scan_s:
                self._scan_children(now)
                self._read_children_cpu(now)
                self._own.read()
            workers_bytes, workers = self._children_rss()
            steps = self._events.steps_seen() if self._events is not None else 0
            sample = MemorySample(now - self._t0, process, workers_bytes, workers, *own_usage(), steps,
                                  *self._loop_thread_times())
            with self._lock:
                self._series.add(sample)
                self._peaks = merge_peaks(self._peaks, sample)
            if self._run_dir is not None and now - self._last_written >= last_reading.WRITE_EVERY_S:
                self._last_written = now  # for the watcher of a run killed outright (gpuscope/sentinel.py)
                last_reading.write_last(self._run_dir, steps, process, self._peaks.process_bytes)
        except Exception as exc:
            self._failures += 1
            self._last_error = f"{type(exc).__name__}: {exc}".splitlines()[0]

    def _loop_thread_times(self) -> tuple[float | None, float | None, float | None]:
        """The loop's thread's CPU time, user and kernel, and its wait for a core, so far; a thread that has ended
        keeps its last reading (None where it never had one)."""
        tid = self._events.loop_thread() if self._events is not None else self._tid
        usage, waits = thread_usage(tid), schedstat(tid, "/proc/self/task")
        if usage is not None and waits is not None:
            self._thread_times = (tid, (*usage, waits[1]))
        elif self._thread_times is None or self._thread_times[0] != tid:
            return None, None, None
        return self._thread_times[1]

    def _process_rss(self) -> int:
        if self._get_memory is None:
            return int(self._me.memory_info().rss)
        mib = self._get_memory(self._pid, backend="psutil", include_children=False)
        if mib is None:  # memory_profiler's answer to psutil.AccessDenied
            raise PermissionError("RSS of this process could not be read")
        return round(mib * MIB)

    def _scan_children(self, now: float) -> None:
        # Not memory_profiler's include_children: that walk gives up at the first child that exits mid-walk
        # (normal as workers come and go) and does not say how many children there are.
        self._last_scan = now
        try:
            pids = descendants(self._pid)
            if pids is None:
                self._children = self._me.children(recursive=True)
                return
            known = {child.pid: child for child in self._children}
            children = []
            for pid in pids:
                with contextlib.suppress(self._psutil.NoSuchProcess):  # exited since the kernel listed it
                    children.append(known.get(pid) or self._psutil.Process(pid))
            self._children = children
        except Exception as exc:  # /proc hidden from us, say: keep the children already known, and the sample
            self._scan_error = f"{type(exc).__name__}: {exc}".splitlines()[0]

    def _read_children_cpu(self, now: float) -> None:
        helpers = 0
        started = self._starts.pids()
        for child in self._children:
            if self._is_helper(child):
                helpers += 1
                continue
            times = schedstat(child.pid)
            if times is not None:  # else exited since the scan, or no such statistics here: nothing is claimed
                self._children_cpu.read(now, child.pid, *times)
            if child.pid in started:  # the script's own processes: every thread read
                self._started_threads.setdefault(child.pid, ProcessThreads(child.pid)).read()
        self._max_helpers = max(self._max_helpers, helpers)

    def _threads_by_pid(self) -> dict[int, tuple[float, float, int]]:
        """The started processes' (CPU seconds, seconds waiting for a core, threads that did work), over all their
        threads."""
        return {pid: totals for pid, threads in self._started_threads.items()
                if (totals := threads.totals()) is not None}

    def _is_helper(self, child: Any) -> bool:
        """Whether ``child`` is multiprocessing's resource tracker or forkserver (decided once a process, once it can
        be told: ``helper_verdict``)."""
        known = self._helpers.get(child.pid)
        if known is None:
            try:
                known = helper_verdict(child.cmdline(), self._command, time.time() - child.create_time(),
                                       child.ppid() == self._pid)
            except Exception:  # exited, or hidden from us: a worker, as before
                known = False
            if known is None:
                return False  # asked again at the next scan
            self._helpers[child.pid] = known
        return known

    def _children_rss(self) -> tuple[int, int]:
        psutil = self._psutil
        total = count = 0
        for child in self._children:
            try:
                rss = child.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):  # exited since the scan (ZombieProcess too)
                continue
            if rss:  # a zombie holds no memory and is no worker
                total += rss
                count += 1
        return total, count
