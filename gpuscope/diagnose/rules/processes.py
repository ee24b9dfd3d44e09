"""Rules about processes the script started (``HostMemory.processes``): trainers that each run torch's own threads,
as many as the cores, and together outnumber them (pytorch/examples' Hogwild: two ``mp.Process(target=train)``
trainers on a 2-core machine waited for a core 42-57% of the time they were ready to run, and trained 1.9-3.2x longer
than with ``torch.set_num_threads(1)`` in each: benchmarks/README.md)."""

from __future__ import annotations

from gpuscope.diagnose.child_processes import crowded, short, started_work
from gpuscope.diagnose.evidence import Metric
from gpuscope.diagnose.rules.base import Finding, Refused, rule
from gpuscope.record import RunRecord


def _started_wait(run: RunRecord) -> float | None:
    """The processes the script started: their share of the time they were ready to run spent waiting for a core."""
    cpu, waited = started_work(run)
    return waited / (cpu + waited) if cpu else None


@rule(id="fewer-threads-per-process",
      title="Run fewer torch threads in each process the script starts: together they outnumber the cores",
      fix="`torch.set_num_threads(max(1, os.cpu_count() // N))` as the first line of the function each of the N "
          "processes runs",
      needs=("host_memory",),
      resolved_by=(Metric("the started processes' wait for a core", "share", _started_wait),),
      trial=Refused("it is made in the processes the script starts, which gpuscope neither runs under its "
                    "collectors nor changes"))
def fewer_threads_per_process(run: RunRecord) -> Finding | None:
    """Signal: processes the script started, running one function of its own, used notable CPU
    (``child_processes.notable``) and waited for a core ``WAITING_FOR_CORES`` of the time they were ready to run or
    more, with more threads each than the cores share out among them (``child_processes.crowded``).
    Why it matters: torch gives every process as many intra-op threads as the machine has cores; N processes run N
    times that, and a thread of a parallel op that waits for a core holds its siblings spinning at the op's end.
    Fix: ``torch.set_num_threads(cores // N)`` (at least 1) at the start of the function they run.
    Gain: none given as a share of the step (this process's steps are not theirs), nor one of their time: it is
    mostly their spinning threads' CPU time, which their wait does not tell (Hogwild's trainers on 2 cores: 2 waiting
    42-57% of their time saved 47-69% with one thread each; 4 waiting 71% saved 59-64%: benchmarks/README.md)."""
    found = crowded(run)
    if found is None:
        return None
    processes, cores = found.processes, run.meta.cpu_count
    target = short(processes[0].target)
    site = processes[0].started_at
    where = f" (started at {site.file}:{site.line} `{site.code}`)" if site and site.file else ""
    most = max(p.threads or 0 for p in processes)
    each = f", {most} threads each doing work," if most else ""
    machine = f"the machine's {cores} cores" if cores else "the machine's cores"
    outnumber = f", {len(processes) * most} threads on {cores} cores" if most and cores else ""
    evidence = (f"{len(processes)} processes the script started ran {target}{where}{each} on {machine}: they "
                f"waited for a core {found.share:.0%} of the time they were ready to run ({found.waited_s:.1f} s, "
                f"against {found.ran_s:.1f} s on a CPU){outnumber}; this process's step figures do not hold their "
                "time",)
    fix = (f"`torch.set_num_threads({found.threads})` as the first line of {target}{where}: {len(processes)} "
           f"processes sharing {machine}")
    return Finding(None, evidence, fix=fix)
