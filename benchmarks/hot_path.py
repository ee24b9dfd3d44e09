"""What gpuscope's own Python costs a step, with no training work around it: the steps collector's hooks called
directly, as one step of a loop calls them (the model's forward pre- and post-hook, then ``backward()`` through
gpuscope's wrapper around a no-op, which ends the step and runs every step listener).

A machine's load swings a training step by tens of percent from one run to the next (``overhead.py``), far more
than this cost; timed alone, the best of several blocks of a few thousand calls is steady to a microsecond or so.
What it leaves out: torch's slower module-call path while a module has hooks (about 5 to 10 us a step on the
project's 2-core machine) and the wrapper's one extra Python call around ``torch.autograd.backward``.

    python benchmarks/hot_path.py                       # the steps collector alone, then every live collector
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from live_collectors import live_collectors

from gpuscope.session import Session


def per_step_us(only: set[str], calls: int, blocks: int) -> float:
    """The best block's time per step, in microseconds, with a session of the chosen collectors running."""
    with tempfile.TemporaryDirectory() as run_dir:
        session = Session(Path(run_dir), ["hot_path"], collectors=live_collectors(only))
        session.start()
        try:
            steps = session._steps
            module = torch.nn.Linear(1, 1)
            backward = steps._wrap_phase("backward")(lambda *args, **kwargs: None)

            def step() -> None:
                steps._forward_pre(module, ())
                steps._forward_post(module, (), None)
                backward()

            for _ in range(200):  # the marker kind settles on backward
                step()
            return best_us(step, blocks, calls)
        finally:
            session.stop(0)


def best_us(action: Callable[[], object], blocks: int, calls: int) -> float:
    """The fastest of ``blocks`` blocks of ``calls`` calls of ``action``, per call, in microseconds."""
    best = float("inf")
    for _ in range(blocks):
        started = time.perf_counter()
        for _ in range(calls):
            action()
        best = min(best, (time.perf_counter() - started) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="steps a block")
    parser.add_argument("--blocks", type=int, default=15)
    args = parser.parse_args()
    for name, only in (("the steps collector", {"steps"}), ("every live collector", set())):
        print(f"{name:>22}: {per_step_us(only, args.calls, args.blocks):6.2f} us a step (best of {args.blocks} "
              f"blocks of {args.calls})")


if __name__ == "__main__":
    main()
