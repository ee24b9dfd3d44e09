"""The CUDA calls gpuscope's live collectors add to each step, counted anywhere and priced with a GPU machine's
per-call times.

A loop in the style of pytorch/examples (a DataLoader's batches, an MLP, Adam) runs on the CPU under a stand-in for
CUDA (``tests/cuda_stub.py``: every ``torch.cuda`` function, the timing events and NVTX's ranges counted), once
alone and once under every live collector; the difference, a step, is what gpuscope asks of CUDA. Each call is
priced with its time on a GPU machine from ``benchmarks/cuda_calls.py``'s output (by default the H100's, in
``benchmarks/results/cuda-calls-h100.txt``): an estimate of the host time a step pays, which on a launch-bound
loop is the step's. ``tests/unit/test_cuda_hot_path.py`` keeps the counts.

    python benchmarks/cuda_hot_path.py
    python benchmarks/cuda_hot_path.py --steps 5000 --prices benchmarks/results/cuda-calls-h100.txt
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from test_cuda_hot_path import gpuscopes_calls  # noqa: E402  (the test's loop and stand-in, run at a longer length)

PRICED = {
    "Event.record": "torch.Event.record()",
    "Event.query": "torch.cuda.Event.query() (passed)",
    "torch.cuda.is_current_stream_capturing": "is_current_stream_capturing()",
    "torch.cuda.memory_stats_as_nested_dict": "memory_stats_as_nested_dict()",
    "nvtx.start_range": "nvtx.start_range() + end_range()",
}
"""Each counted call and the line of ``cuda_calls.py``'s output that prices it (an NVTX range's start and end are
priced together, at its start). The elapsed time between two passed events is not priced there: it is counted."""


def prices(path: Path) -> dict[str, float]:
    """Microseconds a call, by ``cuda_calls.py``'s names, from its output."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"(\S.*?)\s{2,}([0-9.]+) us$", line.strip())
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--prices", type=Path, default=ROOT / "benchmarks" / "results" / "cuda-calls-h100.txt")
    args = parser.parse_args()
    calls, _ = gpuscopes_calls(args.steps)
    cost = prices(args.prices)
    total = 0.0
    print(f"CUDA calls gpuscope adds a step ({args.steps} steps), priced with {args.prices.name}:")
    for name, count in sorted(calls.items(), key=lambda item: -item[1]):
        per_step = count / args.steps
        price = cost.get(PRICED.get(name, ""))
        spent = per_step * price if price is not None else None
        total += spent or 0.0
        print(f"  {name:<42} {per_step:6.2f} a step" + (f"  x {price:6.2f} us = {spent:6.2f} us" if spent else ""))
    print(f"  priced in all: {total:.1f} us a step")


if __name__ == "__main__":
    main()
