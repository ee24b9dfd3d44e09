"""What the memory sampler learns of the run's child processes besides their memory: where their time went
(``ChildrenCpu``, from the kernel's ``/proc/PID/schedstat``), and which of them are multiprocessing's own helpers
(``helper_verdict``): its resource tracker (spawn, forkserver) and forkserver, which wait all run long and are no
DataLoader workers; and how they are found (``descendants``)."""

from __future__ import annotations

import os

PROC = "/proc"
HELPERS = ("from multiprocessing.resource_tracker import", "from multiprocessing.forkserver import")
"""How the command line of multiprocessing's helper processes begins, after ``python -c`` (a direct child's)."""
EXEC_GRACE_S = 2.0
"""A child showing the run's own command line is judged only once it is this old. multiprocessing starts its
helpers by fork and exec, and until the exec, a few milliseconds on (more on a loaded machine), the child still
shows its parent's command line: judged then, the resource tracker passed for a worker all run long (seen in CI:
``max_helpers`` 0 under spawn). A worker started by fork shows the parent's command line all its life."""
STARTED_BUSY = 0.5
"""A child's figures begin with its first interval between scans in which it was busy (on a CPU or waiting for one)
less than this share of the time: a worker started by spawn or forkserver first imports torch and the script's
modules, seconds of CPU that say nothing of how busy its batches keep it (a short run's waiting workers passed for
busy ones). A child busy from start to end keeps them all."""
WORKING_THREAD = 0.1
"""A thread of a process the script started did work where it ran at least this share of the CPU time of the
process's busiest thread (Hogwild's trainers: their first thread and torch's intra-op threads, near alike; the
helper thread each spawned trainer keeps, next to none)."""


class ChildrenCpu:
    """Where child processes spent the time they were watched: for each, the CPU time and the time runnable but
    waiting for a core that it added between the reading its figures begin with (its first, or the start of its
    first interval busy less than ``STARTED_BUSY``: its start-up is then behind it) and its last reading, and the
    time between those readings (a child seen once adds nothing)."""

    def __init__(self) -> None:
        self._first: dict[int, tuple[float, float, float]] = {}  # pid -> (when, CPU s, runnable s) figures begin
        self._last: dict[int, tuple[float, float, float]] = {}
        self._started: set[int] = set()  # children whose start-up is behind them

    def read(self, now: float, pid: int, cpu_s: float, runnable_s: float) -> None:
        last = self._last.get(pid)
        if last is None:
            self._first[pid] = (now, cpu_s, runnable_s)
        elif pid not in self._started and (cpu_s + runnable_s - last[1] - last[2]) < STARTED_BUSY * (now - last[0]):
            self._started.add(pid)
            self._first[pid] = last
        self._last[pid] = (now, cpu_s, runnable_s)

    def totals(self) -> tuple[float, float, float]:
        """(CPU seconds, seconds waiting for a core, watched seconds), summed over the children."""
        cpu = runnable = watched = 0.0
        for pid, (t0, c0, r0) in self._first.items():
            t1, c1, r1 = self._last[pid]
            cpu, runnable, watched = cpu + max(0.0, c1 - c0), runnable + max(0.0, r1 - r0), watched + (t1 - t0)
        return cpu, runnable, watched

    def cpu_by_pid(self) -> dict[int, tuple[float, float]]:
        """Each child's (CPU seconds, seconds runnable waiting for a core) from its start, as last read."""
        return {pid: (cpu, runnable) for pid, (_, cpu, runnable) in self._last.items()}


def schedstat(pid: int | str, proc: str = PROC) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable waiting for one) of process ``pid`` from ``/proc/PID/schedstat``
    (``"thread-self"``: the calling thread's); None
    where the kernel keeps no such file (not Linux, or built without scheduler statistics) or the process is gone."""
    try:
        with open(f"{proc}/{pid}/schedstat", "rb") as stat:
            on_cpu, waiting = stat.read().split()[:2]
        return int(on_cpu) / 1e9, int(waiting) / 1e9
    except (OSError, ValueError):
        return None


class _Threads:
    """Each of a process's threads' last reading of its time on a CPU and runnable but waiting for one (the kernel's
    ``/proc/PID/task/TID/schedstat``: the process's own ``/proc/PID/schedstat`` is its first thread's alone); a
    thread that ends keeps its last reading."""

    def __init__(self, pid: int, proc: str = PROC) -> None:
        self._tasks = f"{proc}/{pid}/task"
        self._last: dict[int, tuple[float, float]] = {}

    def read(self) -> bool:
        """Read every thread; False where the process is gone."""
        try:
            tids = [int(tid) for tid in os.listdir(self._tasks)]
        except (OSError, ValueError):
            return False
        for tid in tids:
            times = schedstat(tid, self._tasks)
            if times is not None:
                self._last[tid] = times
        return True


class OwnThreads(_Threads):
    """The run's own process's time on a CPU and runnable but waiting for one, summed over its threads, from the
    first reading to the last: a thread that begins counts from zero."""

    def __init__(self, pid: int, proc: str = PROC) -> None:
        super().__init__(pid, proc)
        self._first: dict[int, tuple[float, float]] | None = None

    def read(self) -> bool:
        if not super().read():
            return False
        if self._first is None:
            self._first = dict(self._last)
        return True

    def totals(self) -> tuple[float, float] | None:
        """(CPU seconds, seconds runnable waiting for a core) since the first reading; None where none was made."""
        if self._first is None:
            return None
        first = self._first
        cpu = sum(c - first.get(tid, (0.0, 0.0))[0] for tid, (c, _) in self._last.items())
        waiting = sum(w - first.get(tid, (0.0, 0.0))[1] for tid, (_, w) in self._last.items())
        return max(0.0, cpu), max(0.0, waiting)


class ProcessThreads(_Threads):
    """A process the script started: its time on a CPU and runnable but waiting for one since it started, summed
    over all its threads (a trainer's torch threads among them), and how many of its threads did work."""

    def totals(self) -> tuple[float, float, int] | None:
        """(CPU seconds, seconds waiting for a core, threads that did work) as last read; None where it never was.
        A thread did work where it ran ``WORKING_THREAD`` of its busiest thread's CPU time or more (a spawned
        trainer's helper thread, which waits all run, does not)."""
        if not self._last:
            return None
        busiest = max(c for c, _ in self._last.values())
        working = sum(1 for c, _ in self._last.values() if c >= WORKING_THREAD * busiest)
        return sum(c for c, _ in self._last.values()), sum(w for _, w in self._last.values()), working


def helper_verdict(command: list[str], own_command: list[str], age_s: float, direct: bool) -> bool | None:
    """Whether a child process is one of multiprocessing's helpers, from its command line (``own_command``: the
    run's), its age and whether it is a direct child; None while it cannot be told yet (``EXEC_GRACE_S``)."""
    if command == own_command and age_s < EXEC_GRACE_S:
        return None
    return direct and len(command) > 2 and command[-2] == "-c" and command[-1].startswith(HELPERS)


def descendants(pid: int, proc: str = PROC) -> list[int] | None:
    """The pids of ``pid``'s child processes and theirs, from the kernel's list of each thread's children
    (``/proc/PID/task/TID/children``); None where the kernel keeps no such list (not Linux, or a kernel built
    without it). A process that exits mid-walk is passed over."""
    if not os.path.exists(f"{proc}/{pid}/task/{pid}/children"):
        return None
    found: list[int] = []
    seen = {pid}
    todo = [pid]
    while todo:
        parent = todo.pop()
        for child in _children_of(parent, proc):
            if child not in seen:
                seen.add(child)
                found.append(child)
                todo.append(child)
    return found


def _children_of(pid: int, proc: str) -> list[int]:
    """The children of every thread of ``pid`` (a process may be started from any thread)."""
    tasks = f"{proc}/{pid}/task"
    try:
        threads = os.listdir(tasks)
    except OSError:
        return []
    children: list[int] = []
    for tid in threads:
        try:
            with open(f"{tasks}/{tid}/children", "rb") as listing:
                children.extend(map(int, listing.read().split()))
        except (OSError, ValueError):
            continue
    return children
