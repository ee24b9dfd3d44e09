"""How long ``gpuscope report JOB`` takes on data-parallel jobs of 8 to 1024 ranks, and the size of its page.

Each job is synthetic: copies of a real rank's record (rank 0 of the DDP sample run once by ``gpuscope run
--nproc-per-node 2``: about 100 KB, its op tables and profile included), each rank's step varied a little, one rank
made a straggler by a loading delay of half a step that the others wait for in the all-reduce. ``gpuscope report`` runs in a fresh process, as a user runs it: the time is the whole
command (start-up, reading every ``rank-K/run.json``, the merge, the page).

    python benchmarks/job_report_speed.py                  # 8, 64, 256, 1024 ranks, 3 runs each
    python benchmarks/job_report_speed.py --ranks 1024 --runs 5

Figures: benchmarks/README.md ("A 1024-rank job"); raw: benchmarks/results/job-report-2cpu.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuscope.record import Breakdown, Distributed, RunRecord, load_record, write_record  # noqa: E402

DDP_SAMPLE = ROOT / "sample_workloads" / "ddp_training.py"
STRAGGLER_DELAY = 0.5
"""The straggler's extra loading time a step, as a share of the base step."""


def real_rank(work: Path) -> RunRecord:
    """Rank 0's record of a real 2-rank job of the DDP sample."""
    out = work / "ddp"
    subprocess.run([sys.executable, "-m", "gpuscope", "run", "--nproc-per-node", "2", "-o", str(out), "-q",
                    "--no-probes", str(DDP_SAMPLE), "--steps", "24"], check=True, cwd=work, capture_output=True)
    return load_record(out / "rank-0")


def write_job(base: RunRecord, ranks: int, job: Path, seed: int = 0) -> int:
    """``ranks`` rank records under ``job``; returns the straggler's rank."""
    rng = random.Random(seed)
    late = ranks // 3
    step = base.steps.median_s
    b, comm = base.breakdown, base.op_profile.communication if base.op_profile is not None else None
    delay_s = STRAGGLER_DELAY * step
    for rank in range(ranks):
        jitter = 1 + rng.uniform(-0.03, 0.03)
        own = step * jitter
        median = own + delay_s  # the straggler loads for longer; the others wait for it in the all-reduce
        seconds = {p: getattr(b, p) * own for p in ("data_wait", "forward", "backward", "optimizer", "other")}
        seconds["data_wait" if rank == late else "backward"] += delay_s
        breakdown = Breakdown(**{p: s / median for p, s in seconds.items()})
        steps = dataclasses.replace(base.steps, median_s=median, p10_s=median * 0.98, p90_s=median * 1.02)
        op_profile = base.op_profile
        if comm is not None:
            exposed = comm.exposed_s + (0.0 if rank == late else delay_s)
            op_profile = dataclasses.replace(base.op_profile, communication=dataclasses.replace(comm, exposed_s=exposed))
        record = dataclasses.replace(base, steps=steps, breakdown=breakdown, op_profile=op_profile,
                                     distributed=Distributed(rank=rank, world_size=ranks, host=f"node{rank // 8}"))
        folder = job / f"rank-{rank}"
        folder.mkdir(parents=True)
        write_record(record, folder)
    return late


def time_report(job: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpuscope", "report", str(job)], check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="8,64,256,1024", help="job sizes, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs of gpuscope report per job")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "job-report-2cpu.json"))
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = real_rank(work)
        for ranks in (int(r) for r in args.ranks.split(",")):
            job = work / f"job-{ranks}"
            late = write_job(base, ranks, job)
            times = [time_report(job) for _ in range(args.runs)]
            merged = json.loads((job / "run.json").read_text())
            found = merged.get("straggler")
            row = {"ranks": ranks, "report_s": times, "median_s": statistics.median(times),
                   "page_bytes": (job / "report.html").stat().st_size,
                   "rank_files_bytes": sum(p.stat().st_size for p in job.glob("rank-*/run.json")),
                   "straggler_injected": late, "straggler_found": found["rank"] if found else None,
                   "cause": found["cause"] if found else None}
            results.append(row)
            print(f"{ranks:5d} ranks: gpuscope report {row['median_s']:.2f} s (runs {', '.join(f'{t:.2f}' for t in times)})"
                  f", page {row['page_bytes'] / 1e6:.2f} MB, straggler {row['straggler_found']} "
                  f"({row['cause']}; injected {late})")
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
