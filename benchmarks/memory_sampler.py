"""What the host memory sampler takes from the training thread: the Python time of one sample and of one scan for
child processes, both holding the GIL the training loop needs.

A process with a DataLoader of ``--workers`` workers (started, so they are children) times, best of ``--reps``
blocks: one sample of the sampler (this process's RSS through memory_profiler, the known children's through
psutil), a children scan through the kernel's lists (``memory.descendants``, what the sampler uses on Linux) and
through psutil (its fallback, which reads every process on the host), and prints what they cost a second at the
sampler's rates (a sample every ``DEFAULT_INTERVAL_S``, a scan every ``CHILDREN_SCAN_S``).

    python benchmarks/memory_sampler.py --workers 2
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import psutil
import torch
from hot_path import best_us
from torch.utils.data import DataLoader, TensorDataset

from gpuscope.collect.collectors.memory import CHILDREN_SCAN_S, DEFAULT_INTERVAL_S, HostMemoryCollector, descendants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    loader = DataLoader(TensorDataset(torch.zeros(10_000, 4)), batch_size=4, num_workers=args.workers)
    batches = iter(loader)
    next(batches)  # the workers are up
    collector = HostMemoryCollector(interval_s=3600.0)  # its thread sleeps: only the calls below sample
    with tempfile.TemporaryDirectory() as folder:
        collector.start(Path(folder))
        me = psutil.Process()
        found = descendants(os.getpid())
        sample = best_us(lambda: collector._sample(rescan=False), args.reps, 50)
        kernel = best_us(lambda: descendants(os.getpid()), args.reps, 50) if found is not None else None
        scanned = best_us(lambda: me.children(recursive=True), args.reps, 10)
        collector.stop()
    processes = len(psutil.pids())
    print(f"{args.workers} workers, {len(found or [])} child processes, {processes} processes on the host")
    print(f"  one sample:                      {sample:7.0f} us  ({sample / DEFAULT_INTERVAL_S / 1e4:.2f}% of a "
          f"thread at one every {DEFAULT_INTERVAL_S} s)")
    for name, cost in (("children scan, kernel lists", kernel), ("children scan, psutil", scanned)):
        if cost is None:
            print(f"  {name}:    not available on this system")
            continue
        print(f"  {name + ':':<32} {cost:7.0f} us  ({cost / CHILDREN_SCAN_S / 1e4:.2f}% of a thread at one every "
              f"{CHILDREN_SCAN_S} s)")


if __name__ == "__main__":
    main()
