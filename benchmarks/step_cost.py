"""What gpuscope costs each step of a long loop, measured inside one process rather than between two.

``overhead.py`` compares whole runs under ``python`` and under ``gpuscope run``: on the project's shared 2-core
machine one run's median step differs from the next one's by up to 10% whoever runs it (the manual-SGD sample: 1.10
to 1.34 ms a step under plain python in one hour), so a median of 6 pairs still moves by several percent, more than
the 3% to be shown. Here each run holds both conditions. ``gpuscope run --profile-steps N`` measures the first N
steps with every collector of the default mode (its hooks, its samplers, its profiling windows) and then takes all
of them out; the script's own step times (``--print-step-times``) then give, in one process, the median step with
gpuscope and without it, a second apart. Plain python runs the same script as the control: its ratio of the two
halves is what the loop's own warming (or the machine's drift) does to them. The cost is

    median over runs of (first half / second half under gpuscope) / median over runs of (the same under python) - 1

The first half's median includes the steps of the profiling windows, as a user's median does (a dozen of 1000).
Every sample of 200 steps or more, alternating the two, ROUNDS times:

    python benchmarks/step_cost.py --rounds 6 [--json benchmarks/results/step-cost-....json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from overhead import ROOT, in_turn

WORKLOADS = {"cpu_launch_bound": 2000, "manual_sgd_language_model": 2000}
"""The samples of 200 steps or more, and their steps."""
SKIP = 5
"""Steps left out at the start of each half (the first steps' warm-up, and the hand-over's)."""


def step_times(command: list[str]) -> list[float]:
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    line = next((line for line in done.stdout.splitlines() if line.startswith("step_times_s=")), None)
    if line is None:
        raise SystemExit(f"no step_times_s= line in the output of {' '.join(command)}:\n{done.stdout[-2000:]}")
    return [float(t) for t in line.split("=", 1)[1].split(",")]


def halves(times: list[float]) -> float:
    """The first half's median step over the second half's."""
    half = len(times) // 2
    return statistics.median(times[SKIP:half]) / statistics.median(times[half + SKIP:])


def measure(workload: str, rounds: int) -> dict[str, object]:
    steps = WORKLOADS[workload]
    script = [str(ROOT / "sample_workloads" / f"{workload}.py"), "--steps", str(steps), "--print-step-times"]
    plain, profiled = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            gpuscope = [sys.executable, "-m", "gpuscope", "run", "-q", "--no-probes", "--profile-steps",
                        str(steps // 2), "-o", f"{tmp}/run{i}"]
            for name, prefix in in_turn([("python", [sys.executable]), ("gpuscope", gpuscope)], i):
                ratio = halves(step_times([*prefix, *script]))
                (plain if name == "python" else profiled).append(ratio)
            print(f"  {workload} round {i + 1}: first half / second half: python {plain[-1]:.3f}, "
                  f"gpuscope {profiled[-1]:.3f}", flush=True)
    return {
        "workload": workload,
        "steps": steps,
        "rounds": rounds,
        "step_cost": statistics.median(profiled) / statistics.median(plain) - 1.0,
        "python_halves": plain,
        "gpuscope_halves": profiled,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="*", help=f"of {', '.join(WORKLOADS)} (default: both)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"not a sample of 200 steps or more: {', '.join(sorted(unknown))}")
    results = [measure(w, args.rounds) for w in args.workloads or WORKLOADS]
    print()
    for r in results:
        print(f"{r['workload']:>26}: {r['step_cost']:+.1%} a step under gpuscope (median of {r['rounds']} rounds)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
