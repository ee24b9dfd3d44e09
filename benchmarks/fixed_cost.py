"""What does gpuscope cost a run besides its steps: its start-up, and everything after the script ends?

The fixed cost is the time a user waits that plain ``python`` would not make them wait:
- start-up: from launching the command to the script's first line, under ``gpuscope run`` less under ``python``,
  timed on a script that imports torch and prints one line (gpuscope's start does not depend on the script);
- the end: from the sample workload's last line of output (its summary, printed as it ends) to the process's exit,
  under ``gpuscope run`` (stopping the collectors, the post-run probes, the analysis, run.json, the report and the
  summary) less under ``python`` (the interpreter's own teardown).

Each sample workload runs alternately under both, PAIRS times; the figures are medians over pairs. The run's own
record says what each post-run probe took (``collectors.*.elapsed_s``), shown beside the total.

    python benchmarks/fixed_cost.py                    # every single-process sample, 3 pairs
    python benchmarks/fixed_cost.py --pairs 5 data_loading_bound --json benchmarks/results/fixed-cost-2cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from overhead import in_turn

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("data_loading_bound", "data_loading_bound_fp16", "data_loading_shared_cores", "cpu_launch_bound",
             "compute_bound", "compute_bound_habits", "manual_sgd_language_model")
STARTUP_SCRIPT = "import torch\nprint('first line', flush=True)\n"
PROBES = ("calibration", "cpu-peak", "data-probe", "loader-probe", "optimizer-probe")


def timed_lines(command: list[str]) -> tuple[float | None, float | None, float]:
    """Run ``command``; return the times (from launch) of its first and last line of stdout, and of its exit."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    times: list[float] = []

    def read() -> None:
        assert proc.stdout is not None
        for _ in proc.stdout:
            times.append(time.perf_counter() - start)

    reader = threading.Thread(target=read)
    reader.start()
    status = proc.wait()
    exited = time.perf_counter() - start
    reader.join()
    if status != 0:
        raise SystemExit(f"{command} exited with status {status}")
    return (times[0] if times else None), (times[-1] if times else None), exited


def probe_times(run_dir: Path) -> dict[str, float]:
    """What each post-run probe took in this run, from its record."""
    collectors = json.loads((run_dir / "run.json").read_text()).get("collectors", {})
    return {name: collectors[name]["elapsed_s"] for name in PROBES
            if name in collectors and collectors[name].get("elapsed_s") is not None}


def gpuscope_command(run_dir: Path, script: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpuscope", "run", "-o", str(run_dir), script, *args]


def measure_startup(pairs: int, tmp: Path) -> list[float]:
    """Per pair: launch to first line under gpuscope less under python, for a script that imports torch."""
    script = tmp / "first_line.py"
    script.write_text(STARTUP_SCRIPT)
    costs = []
    for i in range(pairs):
        runs = {}
        for name in in_turn(["python", "gpuscope"], i):
            command = ([sys.executable, str(script)] if name == "python"
                       else gpuscope_command(tmp / f"startup{i}", str(script)))
            runs[name], _, _ = timed_lines(command)
        costs.append(runs["gpuscope"] - runs["python"])
    return costs


def measure_end(workload: str, pairs: int, tmp: Path) -> dict[str, object]:
    """Per pair: last line to exit under gpuscope less under python, and the probes' own times."""
    script = str(ROOT / "sample_workloads" / f"{workload}.py")
    costs, probes = [], []
    for i in range(pairs):
        run_dir = tmp / f"{workload}{i}"
        tails = {}
        for name in in_turn(["python", "gpuscope"], i):
            command = [sys.executable, script] if name == "python" else gpuscope_command(run_dir, script)
            _, last, exited = timed_lines(command)
            if last is None:
                raise SystemExit(f"{workload} printed nothing under {name}")
            tails[name] = exited - last
        costs.append(tails["gpuscope"] - tails["python"])
        probes.append(probe_times(run_dir))
    names = sorted({name for row in probes for name in row})
    return {"workload": workload, "end_s": costs, "median_end_s": statistics.median(costs),
            "probes_median_s": {n: statistics.median(row.get(n, 0.0) for row in probes) for n in names}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        startup = measure_startup(args.pairs, tmp)
        startup_s = statistics.median(startup)
        print(f"start-up: {startup_s:.2f} s (pairs: {', '.join(f'{s:.2f}' for s in startup)})")
        rows = []
        for workload in args.workloads:
            row = measure_end(workload, args.pairs, tmp)
            row["fixed_cost_s"] = startup_s + row["median_end_s"]
            rows.append(row)
            probes = ", ".join(f"{n} {s:.2f}" for n, s in row["probes_median_s"].items() if s >= 0.005)
            print(f"{workload}: fixed cost {row['fixed_cost_s']:.2f} s = start-up {startup_s:.2f} + end "
                  f"{row['median_end_s']:.2f} (pairs: {', '.join(f'{s:.2f}' for s in row['end_s'])}); "
                  f"probes: {probes or 'none'}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"pairs": args.pairs, "startup_s": startup, "median_startup_s": startup_s,
                                         "workloads": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
