"""Rules about torch's threads outnumbering the cores. In processes the script started (``HostMemory.processes``):
trainers that each run torch's own threads, as many as the cores, and together outnumber them (pytorch/examples'
Hogwild: two ``mp.Process(target=train)`` trainers on a 2-core machine waited for a core 42-57% of the time they were
ready to run, and trained 1.9-3.2x longer than with ``torch.set_num_threads(1)`` in each). In the run's own process:
its threads waiting for cores that other processes hold (benchmarks/README.md)."""

from __future__ import annotations

from gpuscope.diagnose.child_processes import WAITING_FOR_CORES, crowded, short, started_work
from gpuscope.diagnose.contention import own_times, waited
from gpuscope.diagnose.evidence import STEP, Metric
from gpuscope.diagnose.rules.base import Finding, Refused, rule
from gpuscope.record import RunRecord


def _started_wait(run: RunRecord) -> float | None:
    """The processes the script started: their share of the time they were ready to run spent waiting for a core."""
    cpu, waited = started_work(run)
    return waited / (cpu + waited) if cpu else None


def _own_wait(run: RunRecord) -> float | None:
    """This process's threads: their share of the time they were ready to run spent waiting for a core."""
    found = own_times(run)
    return found[0] / (found[0] + found[1]) if found is not None and found[1] else None


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
    most = found.most
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


@rule(id="fewer-torch-threads",
      title="Run fewer torch threads: this process's threads wait for cores that other processes hold",
      fix="`torch.set_num_threads(K)` before the training loop, K the cores this process gets",
      needs=("cpu", "host_memory"),
      resolved_by=(Metric("this process's wait for a core", "share", _own_wait), STEP),
      trial=Refused("its gain depends on what else holds the cores while it runs, which a trial run later does not "
                    "share"))
def fewer_torch_threads(run: RunRecord) -> Finding | None:
    """Signal: on a CPU run with no DataLoader workers (``more-dataloader-workers`` shares the cores out with them),
    the process's threads waited for a core ``WAITING_FOR_CORES`` of the time they were ready to run or more
    (``contention.waited``) while torch ran more intra-op threads (``meta.torch_threads``) than the cores they got,
    their threads times the share of their ready time they ran: sibling trainers (a Hogwild trainer profiled with
    ``gpuscope.profile()``) or other programs hold the rest.
    Why it matters: a parallel op ends when its last thread does; a thread waiting for a core holds the others
    spinning, so threads past the cores the process gets slow every op down.
    Fix: ``torch.set_num_threads(K)``, K those cores (at least 1).
    Gain: the wait's share of the ready time, a floor (the spinning is saved too: an MLP beside a busy process, 33%
    waiting, 48% faster with one thread; Hogwild's trainers, 50% waiting, 73%: benchmarks/README.md)."""
    threads = run.meta.torch_threads or 0
    found = waited(run)
    if threads < 2 or found is None or any(loader.num_workers for loader in run.loaders):
        return None
    wait_s, ran_s = found
    share = wait_s / (wait_s + ran_s)
    cores = max(1, int(threads * (1 - share)))
    if share < WAITING_FOR_CORES or cores >= threads:
        return None
    machine = f" of the machine's {run.meta.cpu_count}" if run.meta.cpu_count else ""
    evidence = (f"this process's threads waited for a core {share:.0%} of the time they were ready to run "
                f"({wait_s:.1f} s, against {ran_s:.1f} s on a CPU) with torch's {threads} intra-op threads: it got "
                f"about {threads * (1 - share):.1f} cores{machine}, other processes holding the rest",)
    fix = (f"`torch.set_num_threads({cores})` before the training loop, in the process that runs it (or "
           f"`OMP_NUM_THREADS={cores}` in its environment): {threads} threads on the {threads * (1 - share):.1f} "
           "cores it gets")
    return Finding(share, evidence, fix=fix)
