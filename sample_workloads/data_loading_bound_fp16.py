"""Data-loading-bound training loop whose preprocessing does its math in float16.

The decoded images are cached in RAM as float16 (half the memory of float32),
and ``Dataset.__getitem__`` crops, denoises, sharpens, adds sensor noise,
jitters colours and normalises them with NumPy, in their own dtype: float16.
Most CPUs have no float16 arithmetic, so NumPy converts every element to
float32 and back around each operation, and the same math runs many times
slower than in float32.  With ``--workers 0`` the main process does it all
between optimizer steps, so most of every step waits for the next batch.

Fix: ``--fp32``: convert each image to float32 first, do the same math, and
cast to float16 only at the very end.  The batches are float16 either way:
the fix is the arithmetic, not the output.
"""
import argparse
import os
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)
GAUSS5 = (1 / 16, 4 / 16, 6 / 16, 4 / 16, 1 / 16)


def blur(img):
    """Separable 5-tap Gaussian blur of a CHW image, in the image's own dtype
    (Python floats do not promote NumPy arrays)."""
    c, h, w = img.shape
    p = np.pad(img, ((0, 0), (2, 2), (2, 2)), mode="edge")
    p = sum(k * p[:, :, i:i + w] for i, k in enumerate(GAUSS5))
    return sum(k * p[:, i:i + h, :] for i, k in enumerate(GAUSS5))


class CachedImages(Dataset):
    """Deterministic stand-in for a dataset decoded once and cached as float16:
    image and label derived from the index."""

    def __init__(self, length, seed, fp32=False, cached=64, raw_size=112, out_size=96, filter_passes=3):
        self.length, self.seed, self.fp32 = length, seed, fp32
        self.raw_size, self.out_size, self.filter_passes = raw_size, out_size, filter_passes
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(10, size=cached)
        yy, xx = np.mgrid[0:raw_size, 0:raw_size].astype(np.float32) / raw_size
        freq = (2.0 + self.labels[:, None, None, None] + rng.random((cached, 3, 1, 1))).astype(np.float32)
        stripes = 0.5 + 0.4 * np.sin(6.283 * freq * (xx + 0.3 * yy))
        self.images = stripes.astype(np.float16)

    def __len__(self):
        return self.length

    def __getitem__(self, idx):
        rng = np.random.default_rng([self.seed, idx])
        label = int(self.labels[idx % len(self.labels)])
        img = self.images[idx % len(self.images)]
        if self.fp32:
            img = img.astype(np.float32)  # the fix: the math below runs in float32
        # random crop + horizontal flip
        y, x = rng.integers(0, self.raw_size - self.out_size + 1, size=2)
        img = img[:, y:y + self.out_size, x:x + self.out_size]
        if rng.random() < 0.5:
            img = img[:, :, ::-1]
        # denoise, then unsharp mask, sensor noise, colour jitter and normalisation
        for _ in range(self.filter_passes):
            smooth = blur(img)
            img = smooth + 0.5 * (img - blur(smooth))
        noise = rng.standard_normal(img.shape, dtype=np.float32).astype(img.dtype)
        img = img + 0.02 * noise
        img = img * rng.uniform(0.8, 1.2, (3, 1, 1)).astype(img.dtype) + rng.uniform(-0.1, 0.1)
        img = (img - MEAN.astype(img.dtype)) / STD.astype(img.dtype)
        # the batches are float16 either way: with --fp32 this is the one cast
        return torch.from_numpy(np.ascontiguousarray(img, dtype=np.float16)), label


class SmallCNN(nn.Module):
    def __init__(self, width=40, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        return self.fc(x.mean(dim=(2, 3)))


def main():
    parser = argparse.ArgumentParser(description="Train a small CNN on images preprocessed with NumPy in float16.")
    parser.add_argument("--steps", type=int, default=24, help="optimizer steps to run")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--fp32", action="store_true", help="do the preprocessing math in float32 (the fix)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if args.workers > 0:
        # a core per loader worker, as in data_loading_bound.py
        torch.set_num_threads(max(1, (os.cpu_count() or 1) - args.workers))

    dataset = CachedImages(length=50_000, seed=args.seed, fp32=args.fp32)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
        num_workers=args.workers, persistent_workers=args.workers > 0,
        generator=torch.Generator().manual_seed(args.seed),
    )
    model = SmallCNN().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    wait_times, step_times, ends = [], [], []
    batches, step = iter(loader), 0
    last = time.perf_counter()
    while step < args.steps:
        t0 = time.perf_counter()
        try:
            images, labels = next(batches)
        except StopIteration:  # end of epoch: start the next one
            batches = iter(loader)
            images, labels = next(batches)
        wait_times.append(time.perf_counter() - t0)
        # float16 batches; the model trains in float32
        images = images.to(device).float()
        labels = labels.to(device)

        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

        if device.type == "cuda":  # no sync: the host queues steps ahead of the GPU, as training loops do
            ends.append(torch.cuda.Event(enable_timing=True))
            ends[-1].record()  # each step's time is read on the GPU's timeline once the run is over
        now = time.perf_counter()
        step_times.append(now - last)
        last, step = now, step + 1

    # the first step (allocator warm-up) is left out of both sums
    waits, durations = (wait_times[1:], step_times[1:]) if step > 1 else (wait_times, step_times)
    wait_share = sum(waits) / sum(durations)  # of the host's steps
    if ends:  # each step's time on the GPU, from the event at the end of the one before to the one at its end
        torch.cuda.synchronize()
        step_times[1:] = [start.elapsed_time(end) / 1e3 for start, end in zip(ends, ends[1:])]
    durations = step_times[len(step_times) - len(durations):]
    print(f"steps={step} median_step_s={statistics.median(durations):.6f} "
          f"data_wait_fraction={wait_share:.4f}")


if __name__ == "__main__":
    main()
