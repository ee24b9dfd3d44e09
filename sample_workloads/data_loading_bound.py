"""Data-loading-bound training loop.

Each sample is "decoded" and augmented in NumPy inside ``Dataset.__getitem__``
(random resized crop, flip, blur/sharpen filter passes, colour jitter,
normalisation) while the CNN is small.  With the default ``--workers 0`` the
main process does all of that between optimizer steps, so most of every step
is spent waiting for the next batch.

Fix: ``--workers 2``: DataLoader worker processes prepare the next batches
while the model trains (the main process then keeps cpu_count - workers
intra-op threads, see main()).  ``--pin-memory`` additionally helps on a GPU.
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
GAUSS7 = np.array([1, 6, 15, 20, 15, 6, 1], dtype=np.float32) / 64


def blur(img):
    """Separable 7-tap Gaussian blur of a CHW float32 image."""
    c, h, w = img.shape
    p = np.pad(img, ((0, 0), (3, 3), (3, 3)), mode="reflect")
    p = sum(k * p[:, :, i:i + w] for i, k in enumerate(GAUSS7))
    return sum(k * p[:, i:i + h, :] for i, k in enumerate(GAUSS7))


def resize(img, size):
    """Bilinear resize of a CHW float32 image to size x size."""
    c, h, w = img.shape
    ys = np.linspace(0, h - 1, size, dtype=np.float32)
    xs = np.linspace(0, w - 1, size, dtype=np.float32)
    y0, x0 = ys.astype(int), xs.astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    wy, wx = (ys - y0.astype(np.float32))[:, None], xs - x0.astype(np.float32)
    rows = img[:, y0] * (1 - wy) + img[:, y1] * wy
    return rows[:, :, x0] * (1 - wx) + rows[:, :, x1] * wx


class SyntheticImages(Dataset):
    """Deterministic stand-in for a folder of JPEGs: image and label derived from the index."""

    def __init__(self, length, seed, raw_size=160, out_size=96, filter_passes=8):
        self.length, self.seed = length, seed
        self.raw_size, self.out_size, self.filter_passes = raw_size, out_size, filter_passes

    def __len__(self):
        return self.length

    def __getitem__(self, idx):
        rng = np.random.default_rng([self.seed, idx])
        label = int(rng.integers(10))
        # "decode": a label-dependent stripe pattern plus sensor noise, uint8 -> float32
        n = self.raw_size
        yy, xx = np.mgrid[0:n, 0:n].astype(np.float32) / n
        freq = (2.0 + label + rng.random((3, 1, 1))).astype(np.float32)
        noise = rng.standard_normal((3, n, n), dtype=np.float32)
        raw = 127.5 + 100 * np.sin(6.283 * freq * (xx + rng.random() * yy)) + 25 * noise
        img = np.clip(raw, 0, 255).astype(np.uint8).astype(np.float32) / 255
        # random resized crop + horizontal flip
        size = int(rng.integers(n // 2, n + 1))
        y, x = rng.integers(0, n - size + 1, size=2)
        img = resize(img[:, y:y + size, x:x + size], self.out_size)
        if rng.random() < 0.5:
            img = img[:, :, ::-1]
        # denoise, then unsharp mask, colour jitter and normalisation
        for _ in range(self.filter_passes):
            smooth = blur(img)
            img = smooth + 0.5 * (img - blur(smooth))
        img = img * rng.uniform(0.8, 1.2, (3, 1, 1)).astype(np.float32) + float(rng.uniform(-0.1, 0.1))
        img = (img - MEAN) / STD
        return torch.from_numpy(np.ascontiguousarray(img)), label


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
    parser = argparse.ArgumentParser(description="Train a small CNN on CPU-heavy NumPy-augmented images.")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps to run")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--pin-memory", action="store_true")
    parser.add_argument("--start-method", choices=["fork", "spawn", "forkserver"], default=None,
                        help="multiprocessing start method for the workers (default: platform default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-step-times", action="store_true",
                        help="also print each step's time (the tests compare them with gpuscope's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if args.workers > 0:
        # Leave a core per loader worker: with more busy threads than cores, the
        # model's OpenMP threads stall on each other (on 2 cores, 2 intra-op
        # threads + 2 workers made steps no faster than with --workers 0).
        torch.set_num_threads(max(1, (os.cpu_count() or 1) - args.workers))

    dataset = SyntheticImages(length=50_000, seed=args.seed)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
        num_workers=args.workers, pin_memory=args.pin_memory,
        persistent_workers=args.workers > 0,
        multiprocessing_context=args.start_method if args.workers > 0 else None,
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
        images = images.to(device, non_blocking=args.pin_memory)
        labels = labels.to(device, non_blocking=args.pin_memory)

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

    # the first step (worker start-up, allocator warm-up) is left out of both sums
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
