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
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path

from gpuscope.collect.process_group import default_group
from gpuscope.errors import GpuscopeError
from gpuscope.pipeline import conclude
from gpuscope.record import RUN_JSON, Distributed, RunRecord, load_record
from gpuscope.rundirs import RUNS_FOLDER, new_run_dir

RANK_DIR = "rank-{rank}"
LAUNCHED = "--launched-by-gpuscope"
"""The option ``launch`` gives each rank's ``gpuscope run``: the launcher merges once all ranks have ended, so the
ranks themselves do not."""
LOCK_FILE = ".merge.lock"
SAID_FILE = ".summary-said"
"""Which ranks' records the job's summary was printed for: under torchrun every rank that finds the others'
records written when it merges the job would print it."""


def rank_env() -> Distributed | None:
    """This process's place in a torchrun job (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), or None outside one."""
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return Distributed(rank=rank, world_size=world, local_rank=int(os.environ.get("LOCAL_RANK", "0") or 0),
                       host=socket.gethostname())


def group_now() -> Distributed | None:
    """This process's place in the script's default process group where it has one of several ranks (its backend
    too), or None."""
    try:
        group = default_group()
    except Exception:
        return None
    if group is None or group[1] <= 1:
        return None
    return Distributed(rank=group[0], world_size=group[1], host=socket.gethostname(), backend=group[2],
                       profiled_alone=True)


def alone_note(where: Distributed, command: str) -> str:
    """What a record of one rank of a job whose other ranks ran without gpuscope cannot tell, and how to profile
    them all."""
    return (f"this process was rank {where.rank} of a {where.world_size}-rank job whose other ranks the script (or "
            "its framework: PyTorch Lightning's ddp strategy starts them) ran without gpuscope: only this rank was "
            "profiled, and the time it spent in collectives may hold waits for a slower rank, which its record alone "
            f"cannot tell from communication; `gpuscope run --nproc-per-node {where.world_size} {command}` profiles "
            "every rank and says who waits for whom")


def backend_now() -> str | None:
    """The backend of the script's default process group, if it still has one."""
    try:
        group = default_group()
    except Exception:
        return None
    return group[2] if group is not None else None


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
    from gpuscope.diagnose.ranks import combine

    with _locked(job_dir):
        record = conclude(combine(rank_records(job_dir)), job_dir)
    return record


def claim_summary(job_dir: Path) -> bool:
    """Whether this rank prints the job's summary: the first to ask since the ranks' records were last written
    (named by each file's size and time: a job run again into the folder prints its own)."""
    said = job_dir / SAID_FILE
    with _locked(job_dir):
        records = sorted(job_dir.glob(f"{RANK_DIR.format(rank='*')}/{RUN_JSON}"))
        written = " ".join(f"{path.parent.name}:{stat.st_size}:{stat.st_mtime_ns}"
                           for path, stat in ((path, path.stat()) for path in records))
        if said.is_file() and said.read_text() == written:
            return False
        said.write_text(written)
    return True


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
