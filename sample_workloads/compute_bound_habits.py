"""Compute-bound training loop with four habits that cost time for nothing.

A small convolution net with a wide linear head, on batches of 64 images from an in-memory dataset: most of each
step is convolution and matmul arithmetic. By default it also

- runs with anomaly detection on (``torch.autograd.detect_anomaly()`` around every step), a debugging aid that
  records a stack trace for every op and checks every gradient for NaNs;
- zero-fills the gradients (``zero_grad(set_to_none=False)``) instead of dropping them;
- gives its convolutions a bias, although each feeds a BatchNorm that subtracts the mean and so cancels it;
- wraps the model in ``nn.DataParallel`` (one process driving every GPU, or none: on a CPU it is a pass-through).

Fixes, one flag each (``--fixed`` applies all four): ``--no-anomaly``, ``--set-to-none``, ``--no-bias``,
``--no-data-parallel``.
"""
import argparse
import contextlib
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def conv_block(cin, cout, bias):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=bias), nn.BatchNorm2d(cout), nn.ReLU())


class ConvNet(nn.Module):
    def __init__(self, bias, width=32, classes=10, head=2048):
        super().__init__()
        self.features = nn.Sequential(
            conv_block(3, width, bias), conv_block(width, width, bias), nn.MaxPool2d(2),
            conv_block(width, 2 * width, bias), conv_block(2 * width, 2 * width, bias), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 8 * 8, head), nn.ReLU(), nn.Linear(head, classes))

    def forward(self, x):
        return self.head(self.features(x))


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 32, 32, generator=g)
    labels = (images.mean(dim=(1, 2, 3)) > 0).long()  # something learnable
    return TensorDataset(images, labels)


def main():
    parser = argparse.ArgumentParser(description="Train a conv net with habits that cost time.")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps to run")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--no-anomaly", action="store_true", help="do not run under anomaly detection")
    parser.add_argument("--set-to-none", action="store_true", help="zero_grad(set_to_none=True)")
    parser.add_argument("--no-bias", action="store_true", help="bias=False on convolutions feeding BatchNorm")
    parser.add_argument("--no-data-parallel", action="store_true", help="do not wrap the model in DataParallel")
    parser.add_argument("--fixed", action="store_true", help="apply all four fixes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.fixed:
        args.no_anomaly = args.set_to_none = args.no_bias = args.no_data_parallel = True

    torch.manual_seed(args.seed)
    dataset = make_dataset(2048, args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True, num_workers=0,
                        generator=torch.Generator().manual_seed(args.seed))
    device = torch.device(args.device)
    model = ConvNet(bias=not args.no_bias).to(device)
    if not args.no_data_parallel:
        model = nn.DataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def debugging():
        return contextlib.nullcontext() if args.no_anomaly else torch.autograd.detect_anomaly()

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
        x, y = x.to(device), y.to(device)
        wait_times.append(time.perf_counter() - t0)

        with debugging():
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=args.set_to_none)
        if device.type == "cuda":  # no sync: the host queues steps ahead of the GPU, as training loops do
            ends.append(torch.cuda.Event(enable_timing=True))
            ends[-1].record()  # each step's time is read on the GPU's timeline once the run is over

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


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore", message="Anomaly Detection has been enabled")  # it says so every step
    main()
