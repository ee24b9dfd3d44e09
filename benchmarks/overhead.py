"""How much does gpuscope slow a training loop down?

Runs a sample workload alternately under plain ``python`` and under ``gpuscope run`` (default mode), PAIRS times,
and reports the median ratio of:
- the loop's own median step time, as the script measures it (the distortion of what is being measured);
- the whole process's wall time (gpuscope's start-up and the writing of the run's files included).
It also reports what each profiling window costs while it is open: from each run's run.json, the median time of
the steps inside the cProfile window and inside the torch.profiler window, against the steady-state median.

Alternating cancels slow drifts of the machine (thermal, other load); the median resists a stray slow run.

    python benchmarks/overhead.py                      # compute_bound, 5 pairs
    python benchmarks/overhead.py --pairs 7 cpu_launch_bound compute_bound
    python benchmarks/overhead.py --args "--device cpu" cpu_launch_bound   # more of the script's own options
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"median_step_s=([0-9.]+)")
RUN_ARGS = {"compute_bound": ["--steps", "60"], "data_loading_bound": ["--steps", "120"]}
"""Longer than the samples' defaults: the profiling windows cost a fixed dozen steps, and real runs are long."""
T = TypeVar("T")


def in_turn(items: Sequence[T], round_: int) -> list[T]:
    """``items`` in the order of round ``round_``: each round starts one further along (two alternate which goes
    first), so none always runs on a warmer machine."""
    start = round_ % len(items)
    return [*items[start:], *items[:start]]


def run_once(command: list[str]) -> tuple[float, float]:
    """Run ``command``; return (the script's own median step time, the process's wall time)."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    match = LINE.search(done.stdout)
    if match is None:
        raise SystemExit(f"no median_step_s= line in the output of {command}:\n{done.stdout}")
    return float(match.group(1)), wall


def window_costs(run_dir: Path) -> dict[str, float]:
    """Median step time inside each profiling window over the steady-state median (1.0 = no cost)."""
    record = json.loads((run_dir / "run.json").read_text())
    sample = record["steps"]["sample"]
    walls = dict(zip(sample["index"], sample["wall_s"]))
    steady = [w for w, status in zip(sample["wall_s"], sample["status"]) if status == "steady"]
    costs = {}
    for name, key in (("cprofile", "python_profile"), ("torch.profiler", "op_profile")):
        window = (record.get(key) or {}).get("window") or {}
        first = max(1, window.get("first_step") or 0)  # step 0 is warm-up, whoever profiles it
        last = window.get("last_step")
        inside = [walls[i] for i in range(first, (last or -1) + 1) if i in walls]
        if inside and steady:
            costs[name] = statistics.median(inside) / statistics.median(steady)
    return costs


def measure(workload: str, pairs: int, extra: list[str]) -> dict[str, object]:
    script = str(ROOT / "sample_workloads" / f"{workload}.py")
    plain_cmd = [sys.executable, script, *extra]
    step_ratios, wall_ratios, rows = [], [], []
    windows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            profiled_cmd = [sys.executable, "-m", "gpuscope", "run", "-q", "-o", f"{tmp}/run{i}", script, *extra]
            runs = in_turn([("plain", plain_cmd), ("gpuscope", profiled_cmd)], i)
            result = {name: run_once(cmd) for name, cmd in runs}
            (p_step, p_wall), (g_step, g_wall) = result["plain"], result["gpuscope"]
            for name, cost in window_costs(Path(f"{tmp}/run{i}")).items():
                windows.setdefault(name, []).append(cost)
            step_ratios.append(g_step / p_step)
            wall_ratios.append(g_wall / p_wall)
            rows.append({"plain_step_s": p_step, "gpuscope_step_s": g_step, "plain_wall_s": p_wall,
                         "gpuscope_wall_s": g_wall})
            print(f"  {workload} pair {i + 1}: step {p_step * 1e3:8.2f} ms -> {g_step * 1e3:8.2f} ms   "
                  f"wall {p_wall:6.2f} s -> {g_wall:6.2f} s", flush=True)
    return {
        "workload": workload,
        "args": extra,
        "pairs": pairs,
        "step_time_overhead": statistics.median(step_ratios) - 1.0,
        "wall_time_overhead": statistics.median(wall_ratios) - 1.0,
        "window_step_cost": {name: statistics.median(v) - 1.0 for name, v in windows.items()},
        "runs": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="*", default=["compute_bound"])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--args", default="", help="options for every workload, after its defaults")
    args = parser.parse_args()
    results = [measure(w, args.pairs, [*RUN_ARGS.get(w, []), *shlex.split(args.args)]) for w in args.workloads]
    print()
    for r in results:
        print(f"{r['workload']:>20}: step time {r['step_time_overhead']:+.1%}, "
              f"process wall time {r['wall_time_overhead']:+.1%}  (median of {r['pairs']} alternating pairs)")
        for name, cost in r["window_step_cost"].items():  # type: ignore[union-attr]
            print(f"{'':>20}  a step inside the {name} window: {cost:+.0%} (left out of the step figures)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
