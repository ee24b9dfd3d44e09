"""Does training go at full speed once ``--profile-steps`` has handed the report over?

Runs a sample workload alternately under plain ``python`` and under ``gpuscope run --profile-steps N``, PAIRS
times, and reports the median ratio of the script's own median step time over the steps after the window (from
``--time-from``, well past the hand-over): 1.00 means every hook, sampler and thread came out. It also reports when
the report was ready (``profiling_window.handed_over_s``) and the whole process's wall time against plain python.

    python benchmarks/after_window.py                          # cpu_launch_bound, 2000 steps, 5 pairs
    python benchmarks/after_window.py --pairs 7 --profile-steps 50 --time-from 300
    python benchmarks/after_window.py -- --device cpu        # the sample's own options after --
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from overhead import ROOT, run_once


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--profile-steps", type=int, default=50)
    parser.add_argument("--time-from", type=int, default=200, help="the first step the script's figures cover")
    parser.add_argument("--sample", default="cpu_launch_bound", help="a sample with --steps and --time-from")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's intra-op threads in both runs (OMP_NUM_THREADS; default 1: steadier timings "
                             "on a small machine)")
    parser.add_argument("sample_args", nargs="*", metavar="ARG", help="more arguments for the sample (after --)")
    options = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(options.threads)
    script = str(ROOT / "sample_workloads" / f"{options.sample}.py")
    args = ["--steps", str(options.steps), "--time-from", str(options.time_from), *options.sample_args]
    ratios, walls, handed = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(options.pairs):
            plain_step, plain_wall = run_once([sys.executable, script, *args])
            run_dir = Path(tmp) / f"run-{i}"
            step, wall = run_once([sys.executable, "-m", "gpuscope", "run", "-q", "-o", str(run_dir),
                                   "--profile-steps", str(options.profile_steps), script, *args])
            window = json.loads((run_dir / "run.json").read_text())["profiling_window"]
            ratios.append(step / plain_step)
            walls.append(wall / plain_wall)
            handed.append(window["handed_over_s"])
            print(f"pair {i + 1}: steps from {options.time_from}: plain {plain_step * 1e3:.3f} ms, after the window "
                  f"{step * 1e3:.3f} ms ({ratios[-1]:.3f}x); report ready at {handed[-1]:.1f} s; "
                  f"process {wall:.1f} s vs {plain_wall:.1f} s", flush=True)
    print(f"{options.sample}, {options.steps} steps, --profile-steps {options.profile_steps}: steps after the window "
          f"{statistics.median(ratios):.3f}x plain python (median of {options.pairs} pairs, range "
          f"{min(ratios):.3f}-{max(ratios):.3f}); report ready {statistics.median(handed):.1f} s into the run; "
          f"whole process {statistics.median(walls):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
