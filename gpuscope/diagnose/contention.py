"""The run's own process waiting for a core: its threads' time runnable but not running (``HostMemory.own_runnable_s``,
the kernel's schedstat), against their time on a CPU. DataLoader workers, processes the script started, torch's
threads and other programs share the cores; where the training process waited a notable share of the time it was
ready to run, its step times hold that wait, and the verdict says so (the data-loading sample with 2 workers on the
2-core machine: 2.7 s waiting against 8.1 s on a CPU, 25%; the launch-bound and compute-bound samples alone: 0%)."""

from __future__ import annotations

from gpuscope.record import RunRecord

CONTENDED = 0.2
"""Said where the process's threads waited for a core a fifth of the time they were ready to run or more..."""
CONTENDED_MIN_S = 0.5
"""...and at least this long."""


def own_times(record: RunRecord) -> tuple[float, float] | None:
    """The run's own process's seconds waiting for a core and on a CPU, its threads summed; None where not read."""
    memory = record.host_memory
    if memory is None or memory.own_cpu_s is None or memory.own_runnable_s is None:
        return None
    return memory.own_runnable_s, memory.own_cpu_s


def waited(record: RunRecord) -> tuple[float, float] | None:
    """``own_times`` where the wait is notable (``CONTENDED``, ``CONTENDED_MIN_S``); None otherwise."""
    found = own_times(record)
    if found is None:
        return None
    wait, ran = found
    return None if wait < CONTENDED_MIN_S or wait < CONTENDED * (wait + ran) else found


def contention(record: RunRecord) -> str | None:
    """How long the run's own process waited for a core, and what else ran on them; None where it is not notable."""
    found = waited(record)
    if found is None:
        return None
    waited_s, ran = found
    memory = record.host_memory
    others = []
    workers = max((loader.num_workers for loader in record.loaders), default=0)
    if workers:
        others.append(f"its DataLoader's {workers} worker process{'es' if workers != 1 else ''}")
    if started := [p for p in (memory.processes if memory is not None else ()) if p.cpu_s]:
        others.append(f"{len(started)} process{'es' if len(started) != 1 else ''} the script started")
    cores = f"the machine's {record.meta.cpu_count} cores" if record.meta.cpu_count else "the machine's cores"
    shared = (f"{cores} also ran {' and '.join(others)} (and whatever else runs there)" if others else
              f"{cores} were busy with other programs too, or with more threads than cores")
    share = waited_s / (waited_s + ran)
    return (f"this process's threads waited for a core {share:.0%} of the time they were ready to run "
            f"({waited_s:.1f} s, against {ran:.1f} s on a CPU): {shared}; the step times hold that wait")
