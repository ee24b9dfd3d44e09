"""A known-size MLP trained with Adam on one synthetic batch (float32): 512 -> 1024 -> 1024 -> 1024 -> 10, GELU.
Parameters 2.63M (10.5 MB); activations saved for backward 3.4 MB at batch 128, under the parameters, so the
step's peak falls in the optimizer's step, where every gradient is live.

    python mlp.py [--steps 20] [--batch 128]      # train (run it under gpuscope)
    python mlp.py --truth                          # ground truth sizes, plain python (memory_accuracy.py)
"""

import argparse

import torch
import torch.nn.functional as F
from _truth import run
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch", type=int, default=128)
parser.add_argument("--truth", action="store_true", help="print the ground truth sizes instead of training")
args = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(),
                      nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(args.batch, 512)
y = torch.randint(0, 10, (args.batch,))


def forward():
    return F.cross_entropy(model(x), y), (x, y)


def step():
    loss, _ = forward()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


run(args, model, opt, forward, step, (x, y))
