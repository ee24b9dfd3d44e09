"""Data-parallel training with DistributedDataParallel, for torchrun (or ``gpuscope run --nproc-per-node N``).

    torchrun --nproc-per-node 2 sample_workloads/ddp_training.py
    gpuscope run --nproc-per-node 2 sample_workloads/ddp_training.py --straggler-rank 1

gloo on CPU, NCCL on GPUs. Flags that make the classic multi-process problems happen:
- ``--straggler-rank R``: rank R's dataset sleeps ``--straggler-ms`` per item, so the other ranks wait for it in
  every gradient all-reduce. Fix: give that rank's loader workers (or find why its data is slow).
- ``--straggler-in PHASE`` (``forward``, ``backward``, ``optimizer``): rank ``--straggler-rank`` does
  ``--straggler-ms`` more arithmetic a step in that phase instead (in backward, from a gradient hook, as uneven
  sequence lengths or a slower device would make it): the others wait for it inside the all-reduce.
- ``--comm-heavy``: a wide model (about 17M parameters, 67 MB of gradients) at batch size 2: each step's all-reduce
  of the gradients costs more than the arithmetic. Fix: larger batches or gradient accumulation (``no_sync``).
- ``--comm-many``: a deep, narrow model (48 layers 8 wide) at batch size 2, each parameter's gradient a bucket of
  its own: about a hundred small all-reduces a step, each paying the collective's fixed latency, for little
  arithmetic.
  Fix: fewer, larger buckets (``bucket_cap_mb``), larger batches or gradient accumulation.
- ``--die-rank R --die-at-step K``: rank R is killed (SIGKILL, as the OOM killer does) at step K.
"""
import argparse
import os
import signal
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Points(Dataset):
    def __init__(self, n, features, sleep_s, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, features, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True)
        self.sleep_s = sleep_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.sleep_s:
            time.sleep(self.sleep_s)  # decoding, augmentation, a slow disk...
        return self.x[i], self.y[i]


EXTRA_WALLS = []
"""The wall time of each call of ``work``: what the other ranks wait for, printed at the end as the job's truth."""


def work(seconds, device):
    """``seconds`` of this thread's CPU time in arithmetic (on a GPU, its launches): the extra work of a slower rank,
    the same amount however busy the machine is (its wall time grows with the machine's load: ``EXTRA_WALLS``)."""
    start = time.perf_counter()
    a = torch.randn(128, 128, device=device)
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        a = torch.tanh(a @ a)
    EXTRA_WALLS.append(time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description="DistributedDataParallel training under torchrun.")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--comm-heavy", action="store_true", help="a wide model at batch size 2")
    parser.add_argument("--comm-many", action="store_true",
                        help="a deep narrow model at batch size 2, each parameter's gradient a bucket of its own")
    parser.add_argument("--straggler-rank", type=int, default=None)
    parser.add_argument("--straggler-ms", type=float, default=0.3,
                        help="per item (data) or per step (--straggler-in), on the straggler rank")
    parser.add_argument("--straggler-in", choices=("data", "forward", "backward", "optimizer"), default="data")
    parser.add_argument("--die-rank", type=int, default=None)
    parser.add_argument("--die-at-step", type=int, default=10)
    args = parser.parse_args()

    # NCCL needs a GPU of its own per rank: with fewer GPUs than ranks on the node, train on the CPU with gloo
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    torch.manual_seed(0)

    bucket_mb = 25.0  # DDP's default
    if args.comm_heavy:
        width, depth, batch = 2048, 4, 2
    elif args.comm_many:
        width, depth, batch, bucket_mb = 8, 48, 2, 1e-5
    else:
        width, depth, batch = 512, 4, args.batch_size
    model = nn.Sequential(*[layer for _ in range(depth) for layer in (nn.Linear(width, width), nn.ReLU())],
                          nn.Linear(width, 1)).to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None,
                                                bucket_cap_mb=bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    slow = rank == args.straggler_rank
    sleep_s = args.straggler_ms / 1000 if slow and args.straggler_in == "data" else 0.0
    extra = args.straggler_ms / 1000 if slow and args.straggler_in != "data" else 0.0
    if extra and args.straggler_in == "forward":
        model.module[0].register_forward_hook(lambda *_: work(extra, device))
    if extra and args.straggler_in == "backward":
        next(model.module[0].parameters()).register_hook(lambda grad: work(extra, device) or grad)
    if extra and args.straggler_in == "optimizer":
        optimizer.register_step_pre_hook(lambda *_: work(extra, device))
    dataset = Points(batch * world * args.steps, width, sleep_s, seed=0)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=0)

    step_times, last = [], time.perf_counter()
    for step, (x, y) in enumerate(loader):
        if step >= args.steps:
            break
        if rank == args.die_rank and step == args.die_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        step_times.append(now - last)
        last = now

    print(f"rank={rank} world={world} steps={len(step_times)} "
          f"median_step_s={statistics.median(step_times[1:] or step_times):.6f}"
          + (f" median_extra_wall_s={statistics.median(EXTRA_WALLS):.6f}" if EXTRA_WALLS else ""))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
