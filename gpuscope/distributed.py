"""Data-parallel jobs: every rank profiled into ``RUN_DIR/rank-N/``, and one merged record and report in RUN_DIR.

Two ways in, one layout:
- ``gpuscope run --nproc-per-node N SCRIPT ARGS`` starts ``torch.distributed.run`` with N copies of
  ``gpuscope run`` (``launch``), then merges once every rank has ended, killed ones included;
- ``torchrun [its options] -m gpuscope run SCRIPT ARGS`` (multi-node: the launcher runs on every node, RUN_DIR on a
  shared filesystem): each rank finds its place in torchrun's environment (``rank_env``).
Each rank merges what the folder holds when it ends, under a lock, so the last one to end leaves the complete
merge; a rank that never ends (killed) is named as missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path

from gpuscope.errors import GpuscopeError
from gpuscope.pipeline import conclude
from gpuscope.record import RUN_JSON, Communication, Distributed, RankSummary, RunRecord, load_record
from gpuscope.rundirs import RUNS_FOLDER, new_run_dir

RANK_DIR = "rank-{rank}"
LAUNCHED = "--launched-by-gpuscope"
"""The option ``launch`` gives each rank's ``gpuscope run``: the launcher merges once all ranks have ended, so the
ranks themselves do not."""
LOCK_FILE = ".merge.lock"


def rank_env() -> Distributed | None:
    """This process's place in a torchrun job (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), or None outside one."""
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return Distributed(rank=rank, world_size=world, local_rank=int(os.environ.get("LOCAL_RANK", "0") or 0),
                       host=socket.gethostname())


def backend_now() -> str | None:
    """The backend of the script's default process group, if it still has one."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return str(dist.get_backend())
    except Exception:
        pass
    return None


def job_run_dir(output: str | None, stem: str) -> Path:
    """The job's folder, the same for every rank: ``output``, else ``./gpuscope-runs/<stem>-<time the local launcher
    started>`` (ranks on one node share their launcher; a multi-node job needs ``-o`` on a shared path)."""
    if output is None:  # not new_run_dir's own default: that one differs between ranks that start a second apart
        started = _process_start(os.getppid()) or datetime.now()
        output = Path(RUNS_FOLDER) / f"{stem}-{started:%Y%m%d-%H%M%S}"
    return new_run_dir(output, stem)


def _process_start(pid: int) -> datetime | None:
    try:
        import psutil

        return datetime.fromtimestamp(psutil.Process(pid).create_time())
    except Exception:
        return None


def rank_dir(job_dir: Path, rank: int) -> Path:
    return job_dir / RANK_DIR.format(rank=rank)


def launch(nproc: int, job_dir: Path, own_options: Sequence[str], target: Sequence[str]) -> int:
    """Run ``target`` on ``nproc`` ranks through torch.distributed.run, each under ``gpuscope run``; torchrun's
    exit status (non-zero when a rank failed)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "gpuscope", "run", LAUNCHED, "--quiet", "--output", str(job_dir), *own_options, *target]
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        from gpuscope.collect.runner import EXIT_SIGINT

        return EXIT_SIGINT


@contextlib.contextmanager
def _locked(job_dir: Path) -> Iterator[None]:
    import fcntl

    with open(job_dir / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def merge_job(job_dir: Path) -> RunRecord:
    """Merge the rank records in ``job_dir`` into ``job_dir/run.json`` (under a lock) and return the merge."""
    with _locked(job_dir):
        record = conclude(merge(rank_records(job_dir)), job_dir, diagnosed=True)
    return record


def rank_records(job_dir: Path) -> list[RunRecord]:
    """Every readable ``rank-N/run.json`` in the job's folder, by rank."""
    records = []
    for path in sorted(job_dir.glob(RANK_DIR.format(rank="*"))):
        if (path / RUN_JSON).is_file():
            with contextlib.suppress(GpuscopeError):
                records.append(load_record(path))
    return sorted(records, key=lambda r: (r.distributed or Distributed()).rank)


def is_job_dir(run_dir: Path) -> bool:
    """True when ``run_dir`` holds rank records (``gpuscope report`` then merges them)."""
    return any((p / RUN_JSON).is_file() for p in Path(run_dir).glob(RANK_DIR.format(rank="*")))


def merge(records: Sequence[RunRecord]) -> RunRecord:
    """One record for the job: the figures of the rank the others wait for (the straggler; else the lowest rank),
    every rank's summary, the straggler finding and the ranks that left no record."""
    from gpuscope.diagnose import analyze
    from gpuscope.diagnose.arrival import arrivals
    from gpuscope.diagnose.ranks import job_verdict, straggler

    if not records:
        raise GpuscopeError("no rank records (rank-N/run.json) in this run folder")
    world = max(r.distributed.world_size if r.distributed else 1 for r in records)
    ranks = [(r.distributed or Distributed()).rank for r in records]
    comms = {rank: c for rank, r in zip(ranks, records) if (c := _communication(r)) is not None}
    found = arrivals(comms, {rank: (r.distributed or Distributed()).host for rank, r in zip(ranks, records)})
    waits = {a.rank: a.waiting_s for a in found.ranks} if found is not None else {}
    summaries = tuple(summarise(r, waits.get(rank)) for rank, r in zip(ranks, records))
    late = straggler(summaries, found)
    shown = late.rank if late else summaries[0].rank
    critical = records[ranks.index(shown)]
    comm = _communication(critical)
    if comm is not None and shown in waits:  # of its wait on collectives, what was waiting for a later rank
        critical = dataclasses.replace(critical, op_profile=dataclasses.replace(
            critical.op_profile, communication=dataclasses.replace(comm, waiting_s=waits[shown])))
    notes = (f"a {world}-rank job: the figures below are rank {shown}'s "
             f"({'the straggler' if late else 'the lowest rank present'}); every rank is in the Ranks section",)
    job = dataclasses.replace(
        critical,
        exit_status=max((r.exit_status for r in records), key=abs),
        ranks=summaries,
        missing_ranks=tuple(sorted(set(range(world)) - {s.rank for s in summaries})),
        straggler=late,
        meta=dataclasses.replace(critical.meta, notes=(*notes, *critical.meta.notes)),
    )
    job = analyze(job)  # diagnosed again as the job: its waits for a late rank are not communication
    return dataclasses.replace(job, verdict=job_verdict(job, late))


def _communication(record: RunRecord) -> Communication | None:
    return record.op_profile.communication if record.op_profile is not None else None


def summarise(record: RunRecord, waiting_s: float | None = None) -> RankSummary:
    comm = _communication(record)
    where = record.distributed or Distributed()
    return RankSummary(
        rank=where.rank, host=where.host, exit_status=record.exit_status, steps=record.steps.count,
        median_s=record.steps.median_s, breakdown=record.breakdown,
        comm_s=comm.comm_s if comm else None, comm_exposed_s=comm.exposed_s if comm else None,
        bound=record.verdict.bound,
        spread_s=record.steps.p90_s - record.steps.p10_s if record.steps.count else None,
        waiting_s=waiting_s, profiled_step_s=comm.step_s if comm else None,
    )

