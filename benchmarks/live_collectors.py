"""What gpuscope's live collectors cost a step, in one process: blocks of steps with and without a session.

The launch-bound sample's model and loader (``sample_workloads/cpu_launch_bound.py``: 2-sample batches, thousands
of tiny ops a step, so any per-step cost shows) train in one process; each repetition times a block of steps
without gpuscope, then a block inside a ``Session`` of the chosen live collectors (their profiling windows off, so
only what they cost on every step is measured, after the steps that find the root modules), and reports the ratio
of the blocks' median steps. One process and alternating blocks take the start-up, imports and most of a shared
machine's slow drifts out of the comparison; the median over repetitions resists a disturbed block.

    python benchmarks/live_collectors.py                     # every live collector, 8 repetitions
    python benchmarks/live_collectors.py --only memory       # the steps collector and the memory sampler
    python benchmarks/live_collectors.py --each --device cuda   # also: none, the steps collector alone, and it
                                                                # with each other live collector
    python benchmarks/live_collectors.py --workload manual_sgd_language_model --each   # the manual-SGD loop
    python benchmarks/live_collectors.py --workload data_loading_bound --each --block 40 --warmup 20 --reps 4
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

from gpuscope.collect.collectors import CollectOptions, default_collectors
from gpuscope.session import Session

ROOT = Path(__file__).resolve().parent.parent
SETTLE_STEPS = 60
"""Steps inside the session before its block is timed: the root modules are found and hooked in the first few."""


def load_sample(name: str = "cpu_launch_bound") -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "sample_workloads" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class Loop:
    """The sample's training loop, a given number of steps at a time."""

    def __init__(self, sample: Any, device: str) -> None:
        torch.manual_seed(0)
        self.device = torch.device(device)
        dataset = sample.make_dataset(8192, 32, 8, 0)
        sampler = BatchSampler(RandomSampler(dataset), batch_size=2, drop_last=True)
        self.loader = DataLoader(dataset, sampler=sampler, batch_size=None)
        self.model = sample.DeepNarrowMLP().to(self.device)
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
            x, y = x.to(self.device), y.to(self.device)
            F.cross_entropy(self.model(x), y).backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            if self.device.type == "cuda":
                torch.cuda.synchronize()  # as the sample does: the step's time includes its GPU work
            now = time.perf_counter()
            times.append(now - last)
            last = now
        return statistics.median(times)


class LanguageModelLoop:
    """The manual-SGD language model sample's loop (``sample_workloads/manual_sgd_language_model.py``, its tiny
    model): no optimizer and no DataLoader, each ``backward()`` a step, about 1.7 ms a step on the 2-core machine."""

    def __init__(self, sample: Any, device: str) -> None:
        torch.manual_seed(0)
        self.model = sample.RNNModel(200, 16, 16, nlayers=2)
        self.data = sample.batchify(torch.randint(200, (200_000,)), 4)
        self.sample, self.criterion, self.i = sample, torch.nn.NLLLoss(), 0
        self.hidden = self.model.init_hidden(4)

    def median_step_s(self, steps: int) -> float:
        times, last = [], time.perf_counter()
        for _ in range(steps):
            if self.i >= self.data.size(0) - 2:
                self.i, self.hidden = 0, self.model.init_hidden(4)
            data, targets = self.sample.get_batch(self.data, self.i, 8)
            self.hidden = self.hidden.detach()
            self.model.zero_grad()
            output, self.hidden = self.model(data, self.hidden)
            self.criterion(torch.log_softmax(output, dim=-1), targets).backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.25)
            for p in self.model.parameters():
                p.data.add_(p.grad, alpha=-20.0)
            self.i += 8
            now = time.perf_counter()
            times.append(now - last)
            last = now
        return statistics.median(times)


class DataLoop(Loop):
    """The data-bound sample's loop (``sample_workloads/data_loading_bound.py``): batches of 32 NumPy-augmented
    images made in the main process, a small CNN, about 190 ms a step on the 2-core machine, most of it waiting for
    the batch. Its steps are ``Loop``'s."""

    def __init__(self, sample: Any, device: str) -> None:
        torch.manual_seed(0)
        self.device = torch.device(device)
        self.loader = DataLoader(sample.SyntheticImages(length=50_000, seed=0), batch_size=32, shuffle=True,
                                 drop_last=True, generator=torch.Generator().manual_seed(0))
        self.model = sample.SmallCNN().to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.batches = iter(self.loader)


LOOPS = {"cpu_launch_bound": Loop, "manual_sgd_language_model": LanguageModelLoop, "data_loading_bound": DataLoop}
"""The sample workloads whose loops this benchmark can run, by name (``--workload``)."""


def live_collectors(only: set[str]) -> list[Any]:
    """Fresh live collectors (the steps collector always), profiling windows and probes off."""
    options = CollectOptions(cprofile_steps=0, trace_steps=0, probes=False)
    return [c for c in default_collectors(options) if getattr(c, "stage", "live") == "live"
            and (not only or c.name in only or c.name == "steps")]


def block_pair(loop: Loop, only: set[str] | None, block: int) -> tuple[float, float]:
    """A block's median step without gpuscope, then inside a session of the chosen collectors (None: a second
    block without, for the noise between two blocks of the same loop)."""
    plain = loop.median_step_s(block)
    if only is None:
        loop.median_step_s(SETTLE_STEPS)
        return plain, loop.median_step_s(block)
    with tempfile.TemporaryDirectory() as run_dir:
        session = Session(Path(run_dir), ["live_collectors"], collectors=live_collectors(only))
        session.start()
        loop.median_step_s(SETTLE_STEPS)
        profiled = loop.median_step_s(block)
        session.stop(0)
    return plain, profiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated collector names (default: every live one)")
    parser.add_argument("--each", action="store_true",
                        help="also the steps collector alone, with each other live collector, and no collector")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workload", choices=list(LOOPS), default="cpu_launch_bound")
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--block", type=int, default=300, help="steps a block")
    parser.add_argument("--warmup", type=int, default=200, help="steps run before the first block")
    args = parser.parse_args()
    loop = LOOPS[args.workload](load_sample(args.workload), args.device)
    loop.median_step_s(args.warmup)
    configs: dict[str, set[str] | None] = {"all live collectors": set(filter(None, args.only.split(",")))}
    if args.each:
        others = [c.name for c in live_collectors(set()) if c.name != "steps"]
        configs = {"none (two plain blocks)": None, "steps": {"steps"},
                   **{f"steps + {name}": {name} for name in others}, **configs}
    ratios: dict[str, list[float]] = {name: [] for name in configs}
    for rep in range(args.reps):  # each repetition measures every configuration: slow drifts hit them all
        for name, only in configs.items():
            plain, profiled = block_pair(loop, only, args.block)
            ratios[name].append(profiled / plain)
            print(f"rep {rep} {name}: {plain * 1e3:.3f} ms -> {profiled * 1e3:.3f} ms, "
                  f"{100 * (profiled / plain - 1):+.1f}%", flush=True)
    print(f"\nper-step cost on {args.device} (median of {args.reps} block pairs of {args.block} steps):")
    for name, values in ratios.items():
        print(f"  {name:<28} {100 * (statistics.median(values) - 1):+6.1f}%")


if __name__ == "__main__":
    main()
