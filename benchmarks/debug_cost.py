"""What gpuscope costs each step of a loop with a debugging API left on (issue 52).

Anomaly detection keeps a formatted Python stack for every autograd node the forward pass creates, so whatever a
profiler puts on the stack under the user's code is paid again for each node. This runs
``cost_loops/anomaly_mlp.py`` (a small launch-bound MLP, 1.6 ms a step without the debug API on 2 cores, about 7 ms
with it) under plain python and under ``gpuscope run``, in turn, ROUNDS times, for each way of leaving it on, and
prints the median over rounds of the script's own mean step (after its first 20) under gpuscope over python's.

On a 2-core VM one process's mean step differs from the next one's by up to 40% under anomaly detection (5.1 to
8.8 ms, plain python, one hour), more than the cost to be shown; ``--in-process`` holds both arms in one process
instead: the loop's steps plain and inside ``gpuscope.profile()``, in turn, ROUNDS times (the collectors' cost:
the frames of ``gpuscope run``'s launch are not there, and anomaly detection's stacks leave them out).

    python benchmarks/debug_cost.py [--rounds 6] [--steps 300] [--in-process] [--json benchmarks/results/....json]
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

LOOP = ROOT / "benchmarks" / "cost_loops" / "anomaly_mlp.py"
MODES = ("set", "context", "off")


def mean_step(command: list[str]) -> float:
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    line = next((line for line in done.stdout.splitlines() if line.startswith("mean_step_s=")), None)
    if line is None:
        raise SystemExit(f"no mean_step_s= line in the output of {' '.join(command)}:\n{done.stdout[-2000:]}")
    return float(line.split("=", 1)[1])


def measure(mode: str, rounds: int, steps: int) -> dict[str, object]:
    script = [str(LOOP), "--debug", mode, "--steps", str(steps)]
    ratios, plain, profiled = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            gpuscope = [sys.executable, "-m", "gpuscope", "run", "-q", "-o", f"{tmp}/run{i}"]
            for name, prefix in in_turn([("python", [sys.executable, "-W", "ignore"]), ("gpuscope", gpuscope)], i):
                (plain if name == "python" else profiled).append(mean_step([*prefix, *script]))
            ratios.append(profiled[-1] / plain[-1])
            print(f"  {mode} round {i + 1}: python {plain[-1] * 1e3:.2f} ms, gpuscope {profiled[-1] * 1e3:.2f} ms "
                  f"({ratios[-1]:.3f}x)", flush=True)
    return {"debug": mode, "steps": steps, "rounds": rounds, "step_cost": statistics.median(ratios) - 1.0,
            "python_mean_step_s": plain, "gpuscope_mean_step_s": profiled}


def measure_in_process(mode: str, rounds: int, steps: int) -> dict[str, object]:
    command = [sys.executable, "-W", "ignore", str(LOOP), "--debug", mode, "--steps", str(steps),
               "--alternate", str(rounds)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    arms = [dict(item.split("=") for item in line.split()) for line in done.stdout.splitlines()
            if line.startswith("round=")]
    plain = [float(arm["python_s"]) for arm in arms]
    profiled = [float(arm["gpuscope_s"]) for arm in arms]
    ratios = [b / a for a, b in zip(plain, profiled)]
    for i, ratio in enumerate(ratios):
        print(f"  {mode} in one process, round {i + 1}: plain {plain[i] * 1e3:.2f} ms, in gpuscope.profile() "
              f"{profiled[i] * 1e3:.2f} ms ({ratio:.3f}x)", flush=True)
    return {"debug": mode, "steps": steps, "rounds": rounds, "in_process": True,
            "step_cost": statistics.median(ratios) - 1.0, "python_mean_step_s": plain,
            "gpuscope_mean_step_s": profiled}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modes", nargs="*", help=f"of {', '.join(MODES)} (default: all)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--in-process", action="store_true", help="both arms in one process (gpuscope.profile())")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if set(args.modes) - set(MODES):
        parser.error(f"modes are {', '.join(MODES)}")
    how = measure_in_process if args.in_process else measure
    results = [how(mode, args.rounds, args.steps) for mode in args.modes or MODES]
    print()
    for r in results:
        print(f"{'debug ' + r['debug']:>14}: {r['step_cost']:+.1%} a step under gpuscope (median of {r['rounds']} "
              f"rounds{', in one process' if args.in_process else ''})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
