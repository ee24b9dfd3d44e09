"""Launch/overhead-bound training loop.

A deep, narrow residual MLP (many tiny Linear, LayerNorm and hand-written
activation ops) trained at batch size 2: every op does almost no arithmetic,
so a step costs the fixed per-op dispatch/launch overhead (Python, autograd,
kernel launch) rather than compute, and the hardware sits mostly idle.

Fix: ``--batch-size 64`` -- 32x more samples per step for nearly the same step
time, because the number of ops per step does not grow with the batch.
``--fused-optimizer``: AdamW updates its 64 small tensors in one pass
(``fused=True``) instead of about ten ops each.
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x):
        h = self.fc1(self.norm(x))
        h = h * torch.sigmoid(1.702 * h)  # hand-written GELU approximation
        return x + 0.5 * self.fc2(h)


class DeepNarrowMLP(nn.Module):
    def __init__(self, in_features=32, width=48, depth=10, num_classes=8):
        super().__init__()
        self.inp = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_dataset(n, in_features, num_classes, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_features, generator=g)
    w = torch.randn(in_features, num_classes, generator=g)
    return TensorDataset(x, (x @ w).argmax(dim=1))


def main():
    parser = argparse.ArgumentParser(description="Train a deep narrow MLP with tiny batches.")
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps to run")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-step-times", action="store_true",
                        help="also print each step's time (the tests compare them with gpuscope's)")
    parser.add_argument("--fused-optimizer", action="store_true", help="AdamW(..., fused=True)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--time-from", type=int, default=1, metavar="STEP",
                        help="the printed figures cover steps from STEP on (default 1: all but the warm-up step)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    dataset = make_dataset(8192, 32, 8, args.seed)
    # index the in-memory tensors once per batch instead of once per sample
    sampler = BatchSampler(RandomSampler(dataset, generator=torch.Generator().manual_seed(args.seed)),
                           batch_size=args.batch_size, drop_last=True)
    loader = DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=0)
    model = DeepNarrowMLP().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True if args.fused_optimizer else None)

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

        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

        if device.type == "cuda":  # no sync: the host queues steps ahead of the GPU, as training loops do
            ends.append(torch.cuda.Event(enable_timing=True))
            ends[-1].record()  # each step's time is read on the GPU's timeline once the run is over
        now = time.perf_counter()
        step_times.append(now - last)
        last, step = now, step + 1

    # the steps before --time-from (by default the warm-up step) are left out of both sums
    first = args.time_from if step > args.time_from else 0
    waits, durations = wait_times[first:], step_times[first:]
    wait_share = sum(waits) / sum(durations)  # of the host's steps
    if ends:  # each step's time on the GPU, from the event at the end of the one before to the one at its end
        torch.cuda.synchronize()
        step_times[1:] = [start.elapsed_time(end) / 1e3 for start, end in zip(ends, ends[1:])]
    durations = step_times[len(step_times) - len(durations):]
    median = statistics.median(durations)
    print(f"steps={step} median_step_s={median:.6f} "
          f"data_wait_fraction={wait_share:.4f} "
          f"samples_per_s={args.batch_size / median:.1f}")
    if args.print_step_times:
        print("step_times_s=" + ",".join(f"{t:.6f}" for t in step_times))


if __name__ == "__main__":
    main()
