"""A loop that dies of memory: it caps its own address space (``RLIMIT_AS``, as a container or a scheduler would)
at what it uses now plus LIMIT_GB, trains three steps at batch 64, then one at a batch too large: the first Linear's
output (262144 x 4096 float32, 4 GiB) cannot be allocated, and the script dies of the allocator's RuntimeError.

    python oom.py [--limit-gb 2] [--last-batch 262144]
"""

import argparse
import resource

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--limit-gb", type=float, default=2.0)
parser.add_argument("--last-batch", type=int, default=262144, help="the fourth step's batch")
args = parser.parse_args()


def address_space() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


limit = address_space() + int(args.limit_gb * (1 << 30))
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 4096), nn.ReLU(), nn.Linear(4096, 256))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(4):
    batch = 64 if step < 3 else args.last_batch  # the last batch is far too large
    x = torch.randn(batch, 256)
    loss = model(x).square().mean()  # OOM: 4 GiB for the first Linear's output
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.4f}", flush=True)
