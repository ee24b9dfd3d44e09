"""Compute-bound training loop.

A wide MLP (1024 -> 4096 -> 4096 -> 1024) on batches of 256 (4096 on a GPU)
from an in-memory dataset kept on the training device, each batch drawn with one
indexing op: nearly all of each step is spent inside large matmuls, so the loop
is limited by arithmetic throughput, not by data loading or per-op overhead.
(Collated one item at a time, 4096-item batches kept an H100 waiting for data
74% of each step.)

Fix: ``--bf16`` runs forward and loss under ``torch.autocast`` in bfloat16,
which uses the faster low-precision matmul units where the hardware has them
(tensor cores on GPUs, AVX512-BF16/AMX on recent CPUs).
"""
import argparse
import contextlib
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Sampler, TensorDataset


class WideMLP(nn.Module):
    def __init__(self, dim=1024, hidden=4096):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden), nn.GELU(),
            nn.Linear(hidden, hidden), nn.GELU(),
            nn.Linear(hidden, dim),
        )

    def forward(self, x):
        return self.net(x)


class ShuffledBatches(Sampler):
    """Each epoch, a random permutation cut into whole batches of indices, each one tensor: the dataset returns a
    batch with one indexing op (a Python list of 4096 indices costs milliseconds to build and convert)."""

    def __init__(self, n, batch_size, seed):
        self.n, self.batch_size = n, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self):
        return self.n // self.batch_size

    def __iter__(self):
        order = torch.randperm(self.n, generator=self.generator)
        return iter(order[: len(self) * self.batch_size].split(self.batch_size))


def make_dataset(n, dim, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    return TensorDataset(x, torch.tanh(x.roll(1, dims=1)))  # learn a shifted, squashed copy


def main():
    parser = argparse.ArgumentParser(description="Train a wide MLP with large matmuls.")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps to run")
    parser.add_argument("--batch-size", type=int, default=None, help="default 256 on a CPU, 4096 on a GPU")
    parser.add_argument("--bf16", action="store_true", help="autocast forward+loss to bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-step-times", action="store_true",
                        help="also print each step's time (the tests compare them with gpuscope's)")
    parser.add_argument("--sync-each-step", action="store_true",
                        help="wait for the GPU at every step's end, as a loop that logs loss.item() each step does: "
                             "the host can no longer queue the next step while the GPU works")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    batch_size = args.batch_size or (4096 if device.type == "cuda" else 256)
    x_all, y_all = make_dataset(max(4096, 4 * batch_size), 1024, args.seed).tensors
    dataset = TensorDataset(x_all.to(device), y_all.to(device))
    loader = DataLoader(dataset, batch_size=None, sampler=ShuffledBatches(len(dataset), batch_size, args.seed))
    model = WideMLP().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def autocast():
        if not args.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    wait_times, step_times, ends = [], [], []
    batches, step = iter(loader), 0
    last = time.perf_counter()
    while step < args.steps:
        t0 = time.perf_counter()
        try:
            x, y = next(batches)
        except StopIteration:  # end of epoch: start the next one
            batches = iter(loader)
            x, y = next(batches)
        wait_times.append(time.perf_counter() - t0)
        x, y = x.to(device), y.to(device)

        with autocast():
            loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

        if device.type == "cuda":  # no sync: the host queues steps ahead of the GPU, as training loops do
            ends.append(torch.cuda.Event(enable_timing=True))
            ends[-1].record()  # each step's time is read on the GPU's timeline once the run is over
            if args.sync_each_step:
                torch.cuda.synchronize()
        now = time.perf_counter()
        step_times.append(now - last)
        last, step = now, step + 1

    # the first step (warm-up) is left out of both sums
    waits, durations = (wait_times[1:], step_times[1:]) if step > 1 else (wait_times, step_times)
    wait_share = sum(waits) / sum(durations)  # of the host's steps
    if ends:  # each step's time on the GPU, from the event at the end of the one before to the one at its end
        torch.cuda.synchronize()
        step_times[1:] = [start.elapsed_time(end) / 1e3 for start, end in zip(ends, ends[1:])]
    durations = step_times[len(step_times) - len(durations):]
    print(f"steps={step} median_step_s={statistics.median(durations):.6f} "
          f"data_wait_fraction={wait_share:.4f}")
    if args.print_step_times:
        print("step_times_s=" + ",".join(f"{t:.6f}" for t in step_times))


if __name__ == "__main__":
    main()
