"""How fast does ``gpuscope analyze`` read a large trace, and how much memory does it take?

Builds a trace of about ``--mb`` MB (default 50) by repeating the V100 fixture trace's five steps end to end (each
copy shifted in time, its correlation and step numbers renumbered, so windows and launch links stay right), then
runs ``python -m gpuscope analyze TRACE -q -o OUT`` in a subprocess ``--runs`` times and reports the wall time
(whole process: start-up, reading, figures, verdict, run.json and report.html), its CPU time (user + system: what
the wall time would be on an idle machine, less waiting on I/O), and the peak resident memory of the
child (``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``, the largest child so far).

    python benchmarks/analyze_speed.py                # ~50 MB, 3 runs
    python benchmarks/analyze_speed.py --mb 100 --runs 1 --json benchmarks/results/analyze-speed.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "fixtures" / "gpu" / "v100-resnet-ns.json.gz"


def build_trace(target_bytes: int, path: Path) -> tuple[int, int]:
    """Write a trace of about ``target_bytes`` to ``path``: copies of the source trace's events, one after the other.
    Returns (bytes written, ProfilerStep ranges in it)."""
    trace = json.loads(gzip.decompress(SOURCE.read_bytes()))
    events: list[dict[str, Any]] = [e for e in trace["traceEvents"] if e.get("ph") != "M"]
    meta = [e for e in trace["traceEvents"] if e.get("ph") == "M"]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + (e.get("dur") or 0) for e in timed) - min(e["ts"] for e in timed)
    copies = target_bytes / len(json.dumps(trace, separators=(",", ":")))
    out = list(meta)
    start = min(e["ts"] for e in timed)
    for k in range(math.ceil(copies)):
        part = min(1.0, copies - k)  # the last copy: only its first part, to come out near the size asked
        out.extend(_shifted(e, k, span) for e in events
                   if part >= 1.0 or not isinstance(e.get("ts"), (int, float)) or e["ts"] - start <= part * span)
    trace["traceEvents"] = out
    path.write_text(json.dumps(trace, separators=(",", ":")))
    steps = sum(1 for e in out if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation")
    return path.stat().st_size, steps


def _shifted(event: dict[str, Any], k: int, span: float) -> dict[str, Any]:
    if k == 0:
        return event
    e = dict(event)
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = e["ts"] + k * (span + 1000.0)
    args = e.get("args")
    if isinstance(args, dict):
        e["args"] = args = dict(args)
        for key in ("correlation", "External id"):
            if isinstance(args.get(key), int):
                args[key] += k * 10_000_000
    if e.get("cat") == "ac2g" and isinstance(e.get("id"), int):
        e["id"] += k * 10_000_000
    name = str(e.get("name", ""))
    if name.startswith("ProfilerStep#"):
        e["name"] = f"ProfilerStep#{int(name.split('#')[1]) + k * 1000}"
    return e


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=50.0, help="size of the trace to build (default 50)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "big.json"
        size, steps = build_trace(int(args.mb * 2**20), trace)
        print(f"trace: {size / 2**20:.1f} MB, {steps} ProfilerSteps", flush=True)
        walls = []
        for i in range(args.runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "gpuscope", "analyze", str(trace), "-q", "-o", f"{tmp}/out{i}"],
                           check=True)
            walls.append(time.perf_counter() - start)
            print(f"  run {i + 1}: {walls[-1]:.2f} s", flush=True)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak_mb = usage.ru_maxrss / 1024  # Linux: kilobytes
        cpu_s = (usage.ru_utime + usage.ru_stime) / args.runs
        record = json.loads((Path(tmp) / "out0" / "run.json").read_text())
    result = {"trace_mb": size / 2**20, "steps": steps, "runs": walls, "median_wall_s": statistics.median(walls),
              "mean_cpu_s": cpu_s, "peak_rss_mb": peak_mb, "load_average": os.getloadavg()[0], "verdict": record["verdict"]["bound"], "cpu_count": _cpus()}
    print(f"gpuscope analyze on a {size / 2**20:.0f} MB trace: median {result['median_wall_s']:.2f} s wall "
          f"(of {args.runs}; {cpu_s:.2f} s of CPU each, load average {result['load_average']:.1f} on "
          f"{result['cpu_count']} CPUs), peak RSS {peak_mb:.0f} MB, verdict {result['verdict']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if __name__ == "__main__":
    main()
