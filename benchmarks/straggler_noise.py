"""Does gpuscope name a straggler only when there is one? 2-rank DDP jobs (gloo, this CPU) of the DDP sample, run
several times on a loaded machine: with no rank slowed (it must name none), and with rank 1's dataset sleeping a
known time per item (it must name rank 1, and data wait, every time).

The load is busy processes beside the job, one per core by default: every rank's steps then vary, as on a shared
machine, and whichever rank drew the worst luck has the most own work.

    python benchmarks/straggler_noise.py                       # 5 jobs of each kind, 2 busy processes
    python benchmarks/straggler_noise.py --jobs 3 --load 0

Figures: benchmarks/README.md ("Stragglers and noise"); raw: benchmarks/results/straggler-noise-2cpu.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DDP_SAMPLE = ROOT / "sample_workloads" / "ddp_training.py"
SLOW_ARGS = ("--straggler-rank", "1", "--straggler-ms", "1", "--batch-size", "64")
"""1 ms an item on rank 1, 64 items a batch: about 64 ms of extra loading a step."""


def _burn() -> None:
    while True:
        pass


def job(out: Path, *args: str) -> dict:
    """One 2-rank job under gpuscope; what its merged record says of stragglers and of each rank's steps."""
    subprocess.run([sys.executable, "-m", "gpuscope", "run", "--nproc-per-node", "2", "-o", str(out), "-q",
                    "--no-probes", str(DDP_SAMPLE), "--steps", "24", *args], check=True, capture_output=True)
    record = json.loads((out / "run.json").read_text())
    found = record.get("straggler")
    return {"straggler": found["rank"] if found else None, "cause": found["cause"] if found else None,
            "late_ms": round(found["late_s"] * 1e3, 1) if found else None,
            "cause_share": found.get("cause_share") if found else None,
            "ranks": [{"rank": r["rank"], "median_ms": round(r["median_s"] * 1e3, 1),
                       "spread_ms": round((r.get("spread_s") or 0) * 1e3, 1),
                       "waiting_ms": round((r.get("comm_exposed_s") or 0) * 1e3, 1)} for r in record["ranks"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5, help="jobs of each kind")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 2, help="busy processes beside the jobs")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "straggler-noise-2cpu.json"))
    args = parser.parse_args()
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.load)]
    for b in burners:
        b.start()
    results: dict[str, list[dict]] = {"balanced": [], "rank 1 slowed": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in range(args.jobs):
                for kind, extra in (("balanced", ()), ("rank 1 slowed", SLOW_ARGS)):
                    found = job(Path(tmp) / f"{kind.replace(' ', '-')}-{n}", *extra)
                    results[kind].append(found)
                    print(f"{kind:14s} job {n + 1}: straggler {found['straggler']} ({found['cause']}, late "
                          f"{found['late_ms']} ms, cause {found['cause_share']}); ranks {found['ranks']}", flush=True)
    finally:
        for b in burners:
            b.terminate()
    balanced_named = sum(r["straggler"] is not None for r in results["balanced"])
    slow_named = sum(r["straggler"] == 1 and r["cause"] == "data_wait" for r in results["rank 1 slowed"])
    print(f"balanced jobs naming a straggler: {balanced_named} of {args.jobs}; slowed jobs naming rank 1 and data "
          f"wait: {slow_named} of {args.jobs} (load: {args.load} busy processes)")
    Path(args.out).write_text(json.dumps({"load_processes": args.load, **results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
