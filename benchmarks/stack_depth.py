"""What each frame under the user's script costs a training step that walks the whole stack.

Anomaly detection (``torch.autograd.set_detect_anomaly(True)``, a debugging habit the ``disable-debug-apis`` rule
looks for) formats the Python stack for every autograd node the forward pass creates, so every frame a profiler
puts under the script's ``<module>`` is paid again for each node. This times a small launch-bound step under
anomaly detection with 0, 3 and 6 extra frames below it (``gpuscope run`` put 6 there before it ran the script
from ``cli.main`` and ``runner.run_target`` directly; it puts 3 now), alternating, and prints the median step
of each depth and its cost against none.

    python benchmarks/stack_depth.py [--rounds 5] [--steps 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch


def nested(depth: int, call: Callable[[], float]) -> float:
    """``call()`` with ``depth`` more frames under it."""
    return call() if depth == 0 else nested(depth - 1, call)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()) for _ in range(12)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(2, 32)

    def median_step() -> float:
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    depths = (0, 3, 6)
    steps: dict[int, list[float]] = {d: [] for d in depths}
    with torch.autograd.detect_anomaly(check_nan=False):
        median_step()  # warm-up
        for _ in range(args.rounds):
            for depth in depths:
                steps[depth].append(nested(depth, median_step))
    base = statistics.median(steps[0])
    for depth in depths:
        step = statistics.median(steps[depth])
        print(f"{depth} frames more: {step * 1e3:.3f} ms a step, {100 * (step / base - 1):+.1f}%")


if __name__ == "__main__":
    main()
