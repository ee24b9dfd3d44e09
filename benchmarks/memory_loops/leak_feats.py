"""A training loop that leaks: it keeps each step's hidden features in a list without ``.detach()``, so each
step's graph stays alive with them (512 x 1024 float32, 2 MB a step). With ``--no-leak`` it keeps a number a step
(``.item()``) instead: the same loop without the leak, the control.

    python leak_feats.py [--steps 60] [--no-leak]
    MEMORY_LOOP_RSS=rss.json python leak_feats.py   # also write its memory after each step (_rss.py)
"""

import argparse

import _rss
import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--no-leak", action="store_true", help="keep a number a step, not the features")
args = parser.parse_args()
recorder = _rss.recorder()  # ground truth under plain python (memory_accuracy.py)


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
    feats.append(h.detach().norm().item() if args.no_leak else h)  # KEEPS: the leak (no .detach())
    loss = F.cross_entropy(out, y)
    loss.backward()
    opt.step()
    if recorder:
        recorder.after(step)
if recorder:
    recorder.save()
print(f"kept {len(feats)} {'numbers' if args.no_leak else 'feature tensors'}")
