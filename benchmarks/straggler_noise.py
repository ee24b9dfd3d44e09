"""Does gpuscope name a straggler only when there is one, with the right phase, and never mistake one for the
network? 2-rank DDP jobs (gloo, this CPU) of the DDP sample, run several times on a loaded machine: with no rank
slowed (it must name none), and with rank 1 about 12 ms late a step in data (its dataset sleeping per item), in
forward (a forward hook), in backward (a gradient hook: the lateness sits inside backward, before the last bucket's
all-reduce) and in the optimizer (a step pre-hook): it must name rank 1 and that phase, and advise no
``reduce-communication``. Then a job that is communication-bound for real (``--comm-heavy``: a wide model at batch
size 2) and one of many small all-reduces (``--comm-many``: 48 narrow layers, 10 kB buckets), which must still
be called so, with that advice.

The load is busy processes beside the job, one per core by default: every rank's steps then vary, as on a shared
machine, and whichever rank drew the worst luck has the most own work.

    python benchmarks/straggler_noise.py                       # 5 jobs of each kind, 2 busy processes
    python benchmarks/straggler_noise.py --jobs 3 --load 0 --kinds balanced,backward
    python benchmarks/straggler_noise.py --load 0 --parallel 3 --threads 1 --kinds balanced   # as CI's slow tier
    python benchmarks/straggler_noise.py --merge-again KEPT --out OUT.json    # kept jobs, judged by this gpuscope

Figures: benchmarks/README.md ("Stragglers and noise"); raw: benchmarks/results/straggler-noise-2cpu.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DDP_SAMPLE = ROOT / "sample_workloads" / "ddp_training.py"
KINDS = {
    "balanced": ((), None),
    "data": (("--straggler-rank", "1", "--straggler-ms", "0.2", "--batch-size", "64"), "data_wait"),
    "forward": (("--straggler-rank", "1", "--straggler-in", "forward", "--straggler-ms", "12"), "forward"),
    "backward": (("--straggler-rank", "1", "--straggler-in", "backward", "--straggler-ms", "12"), "backward"),
    "optimizer": (("--straggler-rank", "1", "--straggler-in", "optimizer", "--straggler-ms", "12"), "optimizer"),
    "comm-heavy": (("--comm-heavy",), None),
    "comm-many": (("--comm-many",), None),
}
"""Each kind of job: the sample's arguments, and the phase rank 1 must be named late in (None: no straggler). Data:
0.2 ms of sleep an item, 64 items a batch, about 13 ms a step (more, as a sleep overshoots); the others 12 ms of
arithmetic a step."""


def _burn() -> None:
    while True:
        pass


def job(out: Path, *args: str, threads: int | None = None) -> dict:
    """One 2-rank job under gpuscope; what its merged record says of stragglers, communication and each rank."""
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    subprocess.run([sys.executable, "-m", "gpuscope", "run", "--nproc-per-node", "2", "-o", str(out), "-q",
                    "--no-probes", str(DDP_SAMPLE), "--steps", "24", *args], check=True, capture_output=True,
                   env=env)
    return found_in(out)


def found_in(out: Path) -> dict:
    """What a job's merged record (``out/run.json``) says of stragglers, communication and each rank."""
    record = json.loads((out / "run.json").read_text())
    found = record.get("straggler")
    comm = (record.get("op_profile") or {}).get("communication") or {}
    return {"straggler": found["rank"] if found else None, "cause": found["cause"] if found else None,
            "late_ms": round(found["late_s"] * 1e3, 1) if found else None,
            "cause_share": found.get("cause_share") if found else None,
            "bound": record["verdict"]["bound"], "advice": [r["id"] for r in record["recommendations"]],
            "comm_own_ms": round((comm.get("exposed_s", 0) - (comm.get("waiting_s") or 0)) * 1e3, 1),
            "comm_waiting_ms": round((comm.get("waiting_s") or 0) * 1e3, 1),
            "ranks": [{"rank": r["rank"], "median_ms": round(r["median_s"] * 1e3, 1),
                       "spread_ms": round((r.get("spread_s") or 0) * 1e3, 1),
                       "exposed_ms": round((r.get("comm_exposed_s") or 0) * 1e3, 1),
                       "waiting_ms": round((r.get("waiting_s") or 0) * 1e3, 1)} for r in record["ranks"]]}


def right(kind: str, found: dict) -> bool:
    """Whether a job's record says what it must: the right straggler and phase (or none), and communication-bound
    with its advice only where the collectives themselves take the time."""
    phase = KINDS[kind][1]
    named = found["straggler"] is None if phase is None else (found["straggler"] == 1 and found["cause"] == phase)
    if kind in ("comm-heavy", "comm-many"):
        return named and found["bound"] == "communication" and "reduce-communication" in found["advice"]
    return named and "reduce-communication" not in found["advice"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5, help="jobs of each kind")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 2, help="busy processes beside the jobs")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"which kinds of job, of {', '.join(KINDS)}")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "straggler-noise-2cpu.json"))
    parser.add_argument("--parallel", type=int, default=1,
                        help="jobs run at a time (CI's slow tier runs three tests at a time)")
    parser.add_argument("--threads", type=int, help="each rank's intra-op threads (OMP_NUM_THREADS; CI's: 1)")
    parser.add_argument("--keep", type=Path, help="keep the jobs' folders here (to merge again: gpuscope report)")
    parser.add_argument("--merge-again", type=Path, metavar="DIR",
                        help="run no job: merge the jobs kept in DIR (--keep) again with this gpuscope and judge them")
    args = parser.parse_args()
    if args.merge_again:
        merge_again(args.merge_again, args.out)
        return
    kinds = args.kinds.split(",")
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.load)]
    for b in burners:
        b.start()
    results: dict[str, list[dict]] = {kind: [] for kind in kinds}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = args.keep or Path(tmp)
            runs = [(n, kind) for n in range(args.jobs) for kind in kinds]
            with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
                done = pool.map(lambda run: job(folder / f"{run[1]}-{run[0]}", *KINDS[run[1]][0],
                                                threads=args.threads), runs)
                for (n, kind), found in zip(runs, done):
                    found["right"] = right(kind, found)
                    results[kind].append(found)
                    print(f"{kind:10s} job {n + 1}: {'right' if found['right'] else 'WRONG'}: straggler "
                          f"{found['straggler']} ({found['cause']}, late {found['late_ms']} ms, cause "
                          f"{found['cause_share']}); {found['bound']}, advice {found['advice']}; collectives' own "
                          f"{found['comm_own_ms']} ms, waiting {found['comm_waiting_ms']} ms; ranks {found['ranks']}",
                          flush=True)
    finally:
        for b in burners:
            b.terminate()
    for kind in kinds:
        print(f"{kind}: right in {sum(r['right'] for r in results[kind])} of {args.jobs} "
              f"(load: {args.load} busy processes, {args.parallel} jobs at a time)")
    Path(args.out).write_text(json.dumps({"load_processes": args.load, "parallel": args.parallel,
                                          "threads": args.threads, **results}, indent=1) + "\n")


def merge_again(folder: Path, out: str) -> None:
    """Each kept job (``KIND-N``) merged again from its ranks' records (``gpuscope report``) and judged, as a change
    to the analysis is checked on the same jobs. A rank record made before ``op_profile.host_ops`` and
    ``phase_calls`` were kept gets them from the rank's trace.json first (the record is rewritten in place)."""
    results: dict[str, list[dict]] = {}
    for path in sorted(p for p in folder.iterdir() if (p / "rank-0").is_dir()):
        kind = path.name.rsplit("-", 1)[0]
        for rank in path.glob("rank-*"):
            _ops_from_trace(rank)
        subprocess.run([sys.executable, "-m", "gpuscope", "report", str(path)], check=True, capture_output=True)
        found = found_in(path)
        found["right"] = right(kind, found)
        results.setdefault(kind, []).append(found)
    for kind, found in results.items():
        print(f"{kind}: right in {sum(r['right'] for r in found)} of {len(found)} (merged again from {folder})")
    Path(out).write_text(json.dumps({"merged_again": str(folder), **results}, indent=1) + "\n")


def _ops_from_trace(rank: Path) -> None:
    """Fill a rank record's ``op_profile.host_ops`` and ``phase_calls`` from its trace.json where the record has
    none (made before they were kept), as ``reduce.fields`` makes them for a trace under its cap."""
    import math

    from gpuscope.reduce.fields import HOST_OPS
    from gpuscope.reduce.figures import trace_figures
    from gpuscope.reduce.optable import indexed_table
    from gpuscope.reduce.trace import index_file

    record = json.loads((rank / "run.json").read_text())
    profile = record.get("op_profile")
    if not profile or (profile.get("host_ops") and profile.get("phase_calls")) or not (rank / "trace.json").is_file():
        return
    index, _ = index_file(rank / "trace.json")
    table = indexed_table(index.host, index.device, index.names, -math.inf, math.inf, every_device_event=True)
    ops = sorted(table.ops, key=lambda o: (-o.self_host_s, o.name))
    profile["host_ops"] = [{"name": o.name, "calls": o.calls, "self_host_s": o.self_host_s, "device_s": o.device_s}
                           for o in ops[:HOST_OPS]]
    profile["phase_calls"] = trace_figures((), index).phase_calls
    (rank / "run.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
