"""Work done in processes the script started (``HostMemory.processes``), which gpuscope does not profile: where
they used notable CPU against the run's own process, the verdict says so, names what they ran and the line that
started them, and how to profile one (pytorch/examples' Hogwild trains in ``mp.Process(target=train)`` children and
evaluates in the main process). Where they also waited long for a core, the line says that they outnumber the cores,
and how many torch threads each should run."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from gpuscope.record import RunRecord, StartedProcess

CHILD_CPU_WORTH_SAYING = 0.5
"""Said where the processes the script started used at least half the CPU time of the run's own process (all its
threads: the steps, gpuscope's samplers, start-up), and at least ``CHILD_CPU_MIN_S``: a Pool that prepares a few
files, or a helper that waits all run long, is left unsaid."""
CHILD_CPU_MIN_S = 1.0
WAITING_FOR_CORES = 0.25
"""...and where they waited for a core (runnable, not running) a quarter of the time they were ready to run or more,
that they outnumber the cores (Hogwild's two trainers on 2 cores, each with torch's 2 threads, waited 43%; with
``torch.set_num_threads(1)`` in each, 2%: docs/usage.md)."""
MAIN_PREFIXES = ("__main__.", "__mp_main__.")
"""How the script's own functions are named in a process's target (the second under spawn and forkserver)."""


def started_work(record: RunRecord) -> tuple[float, float]:
    """(CPU seconds, seconds waiting for a core) of the processes the script started, summed."""
    processes = record.host_memory.processes if record.host_memory is not None else ()
    return sum(p.cpu_s or 0.0 for p in processes), sum(p.runnable_s or 0.0 for p in processes)


def notable(record: RunRecord) -> bool:
    """Whether the processes the script started used CPU worth saying (``CHILD_CPU_WORTH_SAYING``)."""
    memory = record.host_memory
    if memory is None or not memory.processes or not memory.user_s:
        return False
    theirs = started_work(record)[0]
    return theirs >= CHILD_CPU_MIN_S and theirs >= CHILD_CPU_WORTH_SAYING * _own_cpu(record)


def _own_cpu(record: RunRecord) -> float:
    memory = record.host_memory
    assert memory is not None and memory.user_s
    return memory.user_s[-1] + (memory.sys_s[-1] if memory.sys_s else 0.0)


def child_processes(record: RunRecord) -> str | None:
    """What the processes the script started ran and the CPU they used, where it is worth saying; None otherwise."""
    if not notable(record):
        return None
    assert record.host_memory is not None
    used = [p for p in record.host_memory.processes if p.cpu_s]
    theirs, own = started_work(record)[0], _own_cpu(record)
    by_target: dict[str, list[StartedProcess]] = defaultdict(list)
    for process in used:
        by_target[process.target].append(process)
    ranked = sorted(by_target.items(), key=lambda item: -sum(p.cpu_s or 0.0 for p in item[1]))
    ran = "; ".join(_ran(target, processes) for target, processes in ranked[:2])
    more = f" (and {len(ranked) - 2} other functions)" if len(ranked) > 2 else ""
    ratio = f"{theirs / own:.1f}x" if own and theirs < 100 * own else "far more than"
    top = ranked[0][1][0]
    how = {"script": f"; to profile one, run the body of {short(top.target)} inside `with gpuscope.profile():` "
                     "(each process then writes its own report)",
           "library": "; to profile one, open `with gpuscope.profile():` in the code of yours they run (a callback or "
                      "hook the library calls in each process; each then writes its own report)"}.get(top.kind, "")
    processes = "1 process" if len(used) == 1 else f"{len(used)} processes"
    return (f"{processes} the script started used {theirs:.1f} s of CPU, {ratio} this process's {own:.1f} s: "
            f"{ran}{more}. gpuscope profiles this process only, so their work is not in these figures{how}"
            + _crowded(record))


@dataclass(frozen=True, slots=True)
class Crowded:
    """Processes of one function the script started that waited for a core (``WAITING_FOR_CORES``), and the torch
    threads each should run so that together they fit the cores."""

    processes: tuple[StartedProcess, ...]
    waited_s: float
    ran_s: float
    threads: int
    most: int
    """The most threads doing work of any of them (0: not counted)."""

    @property
    def share(self) -> float:  # of the time they were ready to run
        return self.waited_s / (self.waited_s + self.ran_s)


def crowded(record: RunRecord) -> Crowded | None:
    """The busiest function's processes (by CPU), where they are worth saying (``notable``), waited for a core
    ``WAITING_FOR_CORES`` of the time they were ready to run or more, and ran more threads each than the cores share
    out among them (where their threads were counted); None otherwise."""
    if not notable(record):
        return None
    assert record.host_memory is not None
    by_target: dict[str, list[StartedProcess]] = defaultdict(list)
    for process in record.host_memory.processes:
        if process.cpu_s:
            by_target[process.target].append(process)
    processes = max(by_target.values(), key=lambda ps: sum(p.cpu_s or 0.0 for p in ps))
    waited = sum(p.runnable_s or 0.0 for p in processes)
    ran = sum(p.cpu_s or 0.0 for p in processes)
    if processes[0].kind != "script" or not ran or waited < WAITING_FOR_CORES * (ran + waited):
        return None
    cores = record.meta.cpu_count
    threads = max(1, cores // len(processes)) if cores else 1
    most = max(p.threads or 0 for p in processes)
    if most and most <= threads:  # as few threads as fit already: more processes than cores (or other programs)
        return None
    return Crowded(tuple(processes), waited, ran, threads, most)


def _crowded(record: RunRecord) -> str:
    """That the busiest function's processes waited for a core, where they did (``crowded``)."""
    found = crowded(record)
    if found is None:
        return ""
    cores = record.meta.cpu_count
    machine = f"the machine's {cores} cores" if cores else "the machine's cores"
    return (f". They waited for a core {found.share:.0%} of the time they were ready to run "
            f"({found.waited_s:.1f} s, against {found.ran_s:.1f} s on a CPU): {len(found.processes)} processes, each "
            f"running torch's own threads (by default as many as the cores), outnumber {machine}; "
            f"`torch.set_num_threads({found.threads})` at the start of {short(found.processes[0].target)} shares "
            "them out")


def _ran(target: str, processes: list[StartedProcess]) -> str:
    site = processes[0].started_at
    where = f", started at {site.file}:{site.line} `{site.code}`" if site and site.file else ""
    cpu = sum(p.cpu_s or 0.0 for p in processes)
    kind = " (a process pool's workers)" if processes[0].kind == "pool-worker" else ""
    return f"{len(processes)} ran {short(target)}{kind}{where}, {cpu:.1f} s"


def short(target: str) -> str:
    """``train`` for the script's own ``__main__.train``; a library's function keeps its module."""
    for prefix in MAIN_PREFIXES:
        if target.startswith(prefix):
            return target[len(prefix):]
    return target
