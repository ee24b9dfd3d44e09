"""What gpuscope's live collectors cost a step, in one process: blocks of steps with and without a session.

The launch-bound sample's model and loader (``sample_workloads/cpu_launch_bound.py``: 2-sample batches, thousands
of tiny ops a step, so any per-step cost shows) train in one process; each repetition times a block of steps
without gpuscope, then a block inside a ``Session`` of the chosen live collectors (their profiling windows off, so
only what they cost on every step is measured, after the steps that find the root modules), and reports the ratio
of the blocks' median steps. One process and alternating blocks take the start-up, imports and most of a shared
machine's slow drifts out of the comparison; the median over repetitions resists a disturbed block.

    python benchmarks/live_collectors.py                     # every live collector, 8 repetitions
    python benchmarks/live_collectors.py --only memory       # the steps collector and the memory sampler
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from gpuscope.collectors import CollectOptions, default_collectors
from gpuscope.session import Session

ROOT = Path(__file__).resolve().parent.parent
SETTLE_STEPS = 60
"""Steps inside the session before its block is timed: the root modules are found and hooked in the first few."""


def load_sample() -> Any:
    spec = importlib.util.spec_from_file_location("cpu_launch_bound", ROOT / "sample_workloads" / "cpu_launch_bound.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class Loop:
    """The sample's training loop, a given number of steps at a time."""

    def __init__(self, sample: Any) -> None:
        torch.manual_seed(0)
        dataset = sample.make_dataset(8192, 32, 8, 0)
        sampler = BatchSampler(RandomSampler(dataset), batch_size=2, drop_last=True)
        self.loader = DataLoader(dataset, sampler=sampler, batch_size=None)
        self.model = sample.DeepNarrowMLP()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.batches = iter(self.loader)

    def median_step_s(self, steps: int) -> float:
        times, last = [], time.perf_counter()
        for _ in range(steps):
            try:
                x, y = next(self.batches)
            except StopIteration:
                self.batches = iter(self.loader)
                x, y = next(self.batches)
            F.cross_entropy(self.model(x), y).backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            now = time.perf_counter()
            times.append(now - last)
            last = now
        return statistics.median(times)


def live_collectors(only: set[str]) -> list[Any]:
    """Fresh live collectors (the steps collector always), profiling windows and probes off."""
    options = CollectOptions(cprofile_steps=0, trace_steps=0, probes=False)
    return [c for c in default_collectors(options) if getattr(c, "stage", "live") == "live"
            and (not only or c.name in only or c.name == "steps")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated collector names (default: every live one)")
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--block", type=int, default=300, help="steps a block")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    loop = Loop(load_sample())
    loop.median_step_s(200)  # warm-up
    ratios, names = [], []
    for rep in range(args.reps):
        plain = loop.median_step_s(args.block)
        collectors = live_collectors(only)
        names = [c.name for c in collectors]
        with tempfile.TemporaryDirectory() as run_dir:
            session = Session(Path(run_dir), ["live_collectors"], collectors=collectors)
            session.start()
            loop.median_step_s(SETTLE_STEPS)
            profiled = loop.median_step_s(args.block)
            session.stop(0)
        ratios.append(profiled / plain)
        print(f"rep {rep}: {plain * 1e3:.3f} ms -> {profiled * 1e3:.3f} ms, {100 * (profiled / plain - 1):+.1f}%",
              flush=True)
    print(f"collectors: {', '.join(names)}")
    print(f"median step: {100 * (statistics.median(ratios) - 1):+.1f}% (median of {args.reps} block pairs)")


if __name__ == "__main__":
    main()
