"""What gpuscope costs a CUDA loop of 2-3 ms steps that never synchronises inside its steps (a GPU machine).

Runs ``overhead_loop.py`` (an MLP of seven 1024-wide layers at batch 512, Adam: 66 kernels a step, launch-bound on
an H100 or H200) alternately under plain ``python`` and under ``gpuscope run`` with default options, ROUNDS times.
The script times its own mean step over steps 300-1500, after every profiling window of gpuscope's, with one
``torch.cuda.synchronize()`` at each edge of that span and none inside: the cost every later step of a long run
pays. Reported: each pair's two means, their ratio's median, and gpuscope's own median step beside the script's.

    python benchmarks/gpu_overhead.py                     # 4 rounds on CUDA
    python benchmarks/gpu_overhead.py --rounds 6 --json benchmarks/results/gpu-overhead-h200.json
    python benchmarks/gpu_overhead.py --device cpu --steps 400 --warmup 100 --rounds 1   # a dry run anywhere
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from overhead import in_turn

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "fixtures" / "gpu" / "h200" / "scripts" / "overhead_loop.py"
MEAN = re.compile(r"mean step ([0-9.]+) s")


def mean_step_s(command: list[str]) -> float:
    """Run ``command``; the script's own mean step (its ``done: ... mean step X s`` line)."""
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    match = MEAN.search(done.stdout)
    if match is None:
        raise SystemExit(f"no 'mean step' line in the output of {command}:\n{done.stdout}\n{done.stderr}")
    return float(match.group(1))


def measure(rounds: int, script_args: list[str]) -> dict[str, object]:
    """``rounds`` alternating pairs of plain python and gpuscope run."""
    plain = [sys.executable, str(SCRIPT), *script_args]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            run_dir = Path(tmp) / f"run{i}"
            profiled = [sys.executable, "-m", "gpuscope", "run", "-q", "-o", str(run_dir), str(SCRIPT), *script_args]
            result = {name: mean_step_s(command) for name, command in in_turn([("plain", plain),
                                                                              ("gpuscope", profiled)], i)}
            record = json.loads((run_dir / "run.json").read_text())
            steps = record["steps"]
            rows.append({"plain_mean_s": result["plain"], "gpuscope_mean_s": result["gpuscope"],
                         "gpuscope_median_s": steps["median_s"], "clock": steps.get("clock", "host"),
                         "host_median_s": steps.get("host_median_s"), "verdict": record["verdict"]["bound"]})
            print(f"  round {i + 1}: script's mean step {result['plain'] * 1e3:.3f} ms -> "
                  f"{result['gpuscope'] * 1e3:.3f} ms ({result['gpuscope'] / result['plain'] - 1:+.1%}); gpuscope's "
                  f"median {steps['median_s'] * 1e3:.3f} ms on the {steps.get('clock', 'host')} clock, verdict "
                  f"{record['verdict']['bound']}", flush=True)
    ratios = [r["gpuscope_mean_s"] / r["plain_mean_s"] for r in rows]  # type: ignore[operator]
    return {"script": SCRIPT.name, "args": script_args, "rounds": rounds, "overhead": statistics.median(ratios) - 1,
            "runs": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--warmup", type=int, default=300, help="steps before the timed span (after every window)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    result = measure(args.rounds, ["--steps", str(args.steps), "--warmup", str(args.warmup), "--device", args.device])
    print(f"gpuscope's cost on every step after its windows: {result['overhead']:+.1%} "
          f"(median of {args.rounds} alternating pairs)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
