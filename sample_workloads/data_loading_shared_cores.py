"""Data-loading-bound, on a machine whose cores the loader and the model must share.

Each item is preprocessed in NumPy inside ``Dataset.__getitem__`` (normalisation, a few blur passes, a colour
jitter), and the conv net is large enough that its step keeps every core busy too. With ``--workers 0`` the main
process builds each batch between steps, so most of a step waits for data. Workers build the next batches
meanwhile, but on a small machine they take the very cores the model's forward and backward run on. Most training
scripts leave torch's thread count alone (one intra-op thread per core): then the workers and those threads are
more busy threads than cores, the threads stall each other at every parallel op, and adding workers helps far
less than the data wait suggests (on 2 cores, 2 workers: median step 27 ms for 36 ms without workers, but mean
36 ms). gpuscope's loader probe predicts the step with N workers from the measured loader rates and the cores the
two share, and its fix keeps the threads the workers leave.

Fix: ``--workers 2 --threads 1`` (on 2 cores; the loader probe measures it on a larger machine).
"""
import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

KERNEL = np.array([1, 4, 6, 4, 1], dtype=np.float32) / 16


class Images(Dataset):
    """Synthetic 3x32x32 images, preprocessed in NumPy as a decode-and-augment pipeline would."""

    def __init__(self, n, passes, seed):
        self.n, self.passes, self.seed = n, passes, seed

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        rng = np.random.default_rng(self.seed + index)
        img = rng.random((3, 32, 32), dtype=np.float32)
        img = (img - 0.5) / 0.25
        for _ in range(self.passes):  # separable blur, row then column
            img = np.apply_along_axis(lambda r: np.convolve(r, KERNEL, mode="same"), 2, img)
            img = np.apply_along_axis(lambda c: np.convolve(c, KERNEL, mode="same"), 1, img)
        img = img * rng.uniform(0.8, 1.2, size=(3, 1, 1)).astype(np.float32)  # colour jitter
        return torch.from_numpy(np.ascontiguousarray(img)), index % 10


class ConvNet(nn.Module):
    def __init__(self, width=12):
        super().__init__()
        self.c1 = nn.Conv2d(3, width, 3, padding=1)
        self.c2 = nn.Conv2d(width, width, 3, padding=1)
        self.c3 = nn.Conv2d(width, 2 * width, 3, padding=1, stride=2)
        self.head = nn.Linear(2 * width, 10)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.relu(self.c2(x))
        x = F.relu(self.c3(x))
        return self.head(x.mean(dim=(2, 3)))


def main():
    parser = argparse.ArgumentParser(description="Train a conv net on CPU-heavy preprocessing.")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps to run")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads in the main process (0: torch's default)")
    parser.add_argument("--passes", type=int, default=3, help="blur passes per item")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    loader = DataLoader(Images(100_000, args.passes, args.seed), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, persistent_workers=args.workers > 0,
                        generator=torch.Generator().manual_seed(args.seed))
    model = ConvNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    waits, durations = [], []
    batches, step, last = iter(loader), 0, time.perf_counter()
    while step < args.steps:
        t0 = time.perf_counter()
        x, y = next(batches)
        waits.append(time.perf_counter() - t0)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        now = time.perf_counter()
        durations.append(now - last)
        last, step = now, step + 1

    waits, durations = waits[1:], durations[1:]  # the first step (warm-up, workers starting) is left out
    print(f"steps={step} median_step_s={statistics.median(durations):.6f} "
          f"data_wait_fraction={sum(waits) / sum(durations):.4f}")


if __name__ == "__main__":
    main()
