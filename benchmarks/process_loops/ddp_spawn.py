"""The PyTorch DDP tutorial's ``demo_basic`` started by ``mp.spawn`` (2 ranks, gloo on the CPU), with a model big
enough for torch's threads to matter (a 256-1024-10 MLP, batches of 128, 200 steps). Argument: the threads each rank
sets with ``torch.set_num_threads`` (0, the default: none set, as the tutorial). Prints rank 0's mean step."""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 0


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(256, 1024)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(1024, 10)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size):
    if THREADS:
        torch.set_num_threads(THREADS)
    setup(rank, world_size)
    ddp_model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    start = time.perf_counter()
    for _ in range(200):
        optimizer.zero_grad()
        loss_fn(ddp_model(torch.randn(128, 256)), torch.randn(128, 10)).backward()
        optimizer.step()
    if rank == 0:
        print(f"rank 0: {(time.perf_counter() - start) / 200 * 1e3:.2f} ms a step", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(demo_basic, args=(2,), nprocs=2, join=True)
