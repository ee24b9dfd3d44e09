"""Does a run's profiling leave a cost on the steps after its windows? One process, in turn: a block of plain steps,
a block inside ``gpuscope.profile()`` (every collector, its windows at its start: cProfile, the trace, the FLOP
count, the memory window; probes off), then a block of plain steps again. Each block's median step is compared:
the profiled block's steps after its windows against the mean of the plain blocks on either side of it.

Between processes, one script's median step differs by 10-20% on the 2-core VM (memory layout, the machine's
drift), which a 3-5% cost cannot be told from; blocks in one process differ by less, and the plain blocks on both
sides of the profiled one bound the machine's drift during it.

    python benchmarks/lasting_cost.py                                  # the data-bound sample, 3 repetitions
    python benchmarks/lasting_cost.py --workload cpu_launch_bound --reps 5 --block 200 --profiled 400
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import gpuscope
from live_collectors import LOOPS, load_sample

WINDOWS_END = 14
"""Steps of the profiled block the windows take (13 on a CPU run, and the step after the last), left out of it."""


def timed_steps(loop: object, steps: int) -> list[float]:
    """Each of ``steps`` steps' wall time, s."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loop.median_step_s(1)  # type: ignore[attr-defined]
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(LOOPS), default="data_loading_bound")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--block", type=int, default=40, help="plain steps a block")
    parser.add_argument("--profiled", type=int, default=110, help="steps of the profiled block, its windows included")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    loop = LOOPS[args.workload](load_sample(args.workload), args.device)
    timed_steps(loop, 10)  # lazy initialisation, the allocator's first growth
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            before = statistics.median(timed_steps(loop, args.block))
            with gpuscope.profile(Path(tmp) / f"rep{rep}", quiet=True, probes=False):
                profiled = timed_steps(loop, args.profiled)
            after = statistics.median(timed_steps(loop, args.block))
            steady = statistics.median(profiled[WINDOWS_END:])
            ratios.append(steady / ((before + after) / 2))
            print(f"rep {rep}: plain {before * 1e3:.1f} ms, profiled after its windows {steady * 1e3:.1f} ms, plain "
                  f"{after * 1e3:.1f} ms: {ratios[-1] - 1:+.1%}", flush=True)
    print(f"median over {args.reps} repetitions: {statistics.median(ratios) - 1:+.1%} "
          f"(each: {', '.join(f'{r - 1:+.1%}' for r in ratios)})")


if __name__ == "__main__":
    main()
