"""What gpuscope's own Python costs a step, with no training work around it: the steps collector's hooks called
directly, as one step of a loop calls them (the model's forward pre- and post-hook, then ``backward()`` through
gpuscope's wrapper around a no-op, which ends the step and runs every step listener).

A machine's load swings a training step by tens of percent from one run to the next (``overhead.py``), far more
than this cost; timed alone, the best of several blocks of a few thousand calls is steady to a microsecond or so.
What it leaves out: the wrapper around the timed module's class ``__call__`` (its lookup and compile check, about
5 us a step with the caches cold on the project's 2-core machine) and the wrapper's one extra Python call around
``torch.autograd.backward``.

    python benchmarks/hot_path.py                       # the steps collector alone, then every live collector
    python benchmarks/hot_path.py --cold                # ... with the CPU's caches refilled between steps
    python benchmarks/hot_path.py --cold --optimizer    # ... a step taking a DataLoader batch, stepping an optimizer

A tight loop keeps gpuscope's code and data in the CPU's caches; a real step's own work evicts them. ``--cold``
touches 4 MB of tensor and 7,000 dicts between steps, as a step might, and reports the median over single steps
of (step + that work) less (that work alone), nearer what whole runs pay. On the 2-core machine (2026-11-28, three
interleaved pairs of runs) the steps collector took 25.3 us a step, where the code of the session before took 29.6:
every operation counts there, a few hundred nanoseconds each, where the tight loop says 7 us for all of them.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from live_collectors import live_collectors

from gpuscope.session import Session


class Batches:
    """A DataLoader iterator as the steps collector's ``__next__`` wrapper sees it (its batch: a no-op)."""

    _dataset, _num_workers = [0], 0


def per_step_us(only: set[str], calls: int, blocks: int, cold: bool = False, optimizer: bool = False) -> float:
    """The best block's time per step, in microseconds, with a session of the chosen collectors running (``cold``:
    the median single step with the caches refilled before it, ``cold_us``). ``optimizer``: each step also takes a
    DataLoader batch first and steps an optimizer last, as most loops do (the steps are then the optimizer's)."""
    with tempfile.TemporaryDirectory() as run_dir:
        session = Session(Path(run_dir), ["hot_path"], collectors=live_collectors(only))
        session.start()
        try:
            steps = session._steps
            module = torch.nn.Linear(1, 1)
            backward = steps._wrap_phase("backward")(lambda *args, **kwargs: None)
            batch, batches = steps._wrap_next(lambda iterator: None), Batches()
            sgd = torch.optim.SGD(module.parameters(), lr=0.0)

            def step() -> None:
                if optimizer:
                    batch(batches)
                steps._forward_pre(module)
                steps._forward_post()
                backward()
                if optimizer:
                    steps._optimizer_pre(sgd, (sgd,), {})
                    steps._optimizer_post(sgd, (sgd,), {})

            for _ in range(200):  # the marker kind settles
                step()
            return cold_us(step, blocks * calls // 5) if cold else best_us(step, blocks, calls)
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


def cold_us(action: Callable[[], object], steps: int) -> float:
    """The median over ``steps`` single calls of ``action`` after other work has refilled the caches, less that
    work's own time measured the same way, in microseconds."""
    tensor = torch.randn(1 << 20)  # 4 MB
    records = [{"a": i, "b": str(i)} for i in range(50_000)]

    def other_work() -> int:
        tensor.mul_(1.0001)
        return sum(r["a"] for r in records[::7])

    clock, spent = time.perf_counter, []
    for _ in range(steps):
        other_work()
        started = clock()
        action()
        took = clock() - started
        other_work()
        started = clock()
        spent.append(took - (clock() - started))
    return statistics.median(spent) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="steps a block")
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--cold", action="store_true", help="refill the CPU's caches between steps (see above)")
    parser.add_argument("--optimizer", action="store_true",
                        help="a step of a loop with a DataLoader and an optimizer (default: a backward-defined one)")
    args = parser.parse_args()
    how = (f"median of {args.blocks * args.calls // 5} single steps, caches refilled" if args.cold else
           f"best of {args.blocks} blocks of {args.calls}")
    for name, only in (("the steps collector", {"steps"}), ("every live collector", set())):
        cost = per_step_us(only, args.calls, args.blocks, args.cold, args.optimizer)
        print(f"{name:>22}: {cost:6.2f} us a step ({how})")


if __name__ == "__main__":
    main()
