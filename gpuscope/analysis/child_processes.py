"""Work done in processes the script started (``HostMemory.processes``), which gpuscope does not profile: where
they used notable CPU against the run's own process, the verdict says so, names what they ran and the line that
started them, and how to profile one. pytorch/examples' Hogwild trains in ``mp.Process(target=train)`` children and
evaluates in the main process: the verdict described 16 evaluation batches ("inconclusive, only 4 steady steps")
and said nothing of the two trainers' 27 s of CPU."""

from __future__ import annotations

from collections import defaultdict

from gpuscope.record import RunRecord, StartedProcess

CHILD_CPU_WORTH_SAYING = 0.5
"""Said where the processes the script started used at least half the CPU time of the run's own process (all its
threads: the steps, gpuscope's samplers, start-up), and at least ``CHILD_CPU_MIN_S``: a Pool that prepares a few
files, or a helper that waits all run long, is left unsaid."""
CHILD_CPU_MIN_S = 1.0
MAIN_PREFIXES = ("__main__.", "__mp_main__.")
"""How the script's own functions are named in a process's target (the second under spawn and forkserver)."""


def child_processes(record: RunRecord) -> str | None:
    """What the processes the script started ran and the CPU they used, where it is worth saying; None otherwise."""
    memory = record.host_memory
    if memory is None or not memory.processes or not memory.user_s:
        return None
    used = [p for p in memory.processes if p.cpu_s]
    theirs = sum(p.cpu_s or 0.0 for p in used)
    own = memory.user_s[-1] + (memory.sys_s[-1] if memory.sys_s else 0.0)
    if theirs < CHILD_CPU_MIN_S or theirs < CHILD_CPU_WORTH_SAYING * own:
        return None
    by_target: dict[str, list[StartedProcess]] = defaultdict(list)
    for process in used:
        by_target[process.target].append(process)
    ranked = sorted(by_target.items(), key=lambda item: -sum(p.cpu_s or 0.0 for p in item[1]))
    ran = "; ".join(_ran(target, processes) for target, processes in ranked[:2])
    more = f" (and {len(ranked) - 2} other functions)" if len(ranked) > 2 else ""
    ratio = f"{theirs / own:.1f}x" if own and theirs < 100 * own else "far more than"
    top = ranked[0][1][0]
    how = {"script": f"; to profile one, run the body of {_short(top.target)} inside `with gpuscope.profile():` "
                     "(each process then writes its own report)",
           "library": "; to profile one, open `with gpuscope.profile():` in the code of yours they run (a callback or "
                      "hook the library calls in each process; each then writes its own report)"}.get(top.kind, "")
    processes = "1 process" if len(used) == 1 else f"{len(used)} processes"
    return (f"{processes} the script started used {theirs:.1f} s of CPU, {ratio} this process's {own:.1f} s: "
            f"{ran}{more}. gpuscope profiles this process only, so their work is not in these figures{how}")


def _ran(target: str, processes: list[StartedProcess]) -> str:
    site = processes[0].started_at
    where = f", started at {site.file}:{site.line} `{site.code}`" if site and site.file else ""
    cpu = sum(p.cpu_s or 0.0 for p in processes)
    kind = " (a process pool's workers)" if processes[0].kind == "pool-worker" else ""
    return f"{len(processes)} ran {_short(target)}{kind}{where}, {cpu:.1f} s"


def _short(target: str) -> str:
    """``train`` for the script's own ``__main__.train``; a library's function keeps its module."""
    for prefix in MAIN_PREFIXES:
        if target.startswith(prefix):
            return target[len(prefix):]
    return target
