"""A training loop that leaks: it keeps each step's hidden features in a list without ``.detach()``, so each
step's graph stays alive with them (512 x 1024 float32, 2 MB a step).

    python leak_feats.py [--steps 60]
    MEMORY_LOOP_RSS=rss.json python leak_feats.py   # also write its memory after each step (_rss.py)
"""

import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
args = parser.parse_args()
RSS_OUT = os.environ.get("MEMORY_LOOP_RSS")  # ground truth under plain python (memory_accuracy.py)
if RSS_OUT:
    from _rss import Recorder

    recorder = Recorder(RSS_OUT)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 1024)
        self.fc2 = nn.Linear(1024, 10)

    def forward(self, x):
        h = torch.relu(self.fc1(x))  # MADE: the features kept
        return self.fc2(h), h


torch.manual_seed(0)
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(512, 64)
y = torch.randint(0, 10, (512,))
feats = []
for step in range(1, args.steps + 1):
    opt.zero_grad(set_to_none=True)
    out, h = model(x)  # CALLER
    feats.append(h)  # KEEPS: the leak (no .detach())
    loss = F.cross_entropy(out, y)
    loss.backward()
    opt.step()
    if RSS_OUT:
        recorder.after(step)
if RSS_OUT:
    recorder.save()
print(f"kept {len(feats)} feature tensors")
