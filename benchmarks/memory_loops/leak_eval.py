"""An evaluation loop that leaks: no ``torch.no_grad()``, and the loss summed as a tensor (``total = total + loss``,
no ``.item()``), so every batch's graph, with the activations it saved (256 x 2048 float32, 2 MB, and the batch),
stays alive with ``total``. No optimizer: each DataLoader batch is a step (docs/usage.md).

    python leak_eval.py [--batches 80]
    MEMORY_LOOP_RSS=rss.json python leak_eval.py   # also write its memory after each batch (_rss.py)
"""

import argparse

import _rss
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batches", type=int, default=80)
args = parser.parse_args()
recorder = _rss.recorder()  # ground truth under plain python (memory_accuracy.py)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 2048)
        self.fc2 = nn.Linear(2048, 10)

    def forward(self, x):
        h = torch.relu(self.fc1(x))  # MADE: the activations kept
        return self.fc2(h)


torch.manual_seed(0)
model = Net()
data = TensorDataset(torch.randn(256 * args.batches, 64), torch.randint(0, 10, (256 * args.batches,)))
loader = DataLoader(data, batch_size=256)
model.eval()
total = 0.0
for step, (x, y) in enumerate(loader, 1):
    out = model(x)  # CALLER
    loss = F.cross_entropy(out, y)
    total = total + loss  # KEEPS: the leak (no .item(), no torch.no_grad())
    if recorder:
        recorder.after(step)
if recorder:
    recorder.save()
print(f"mean loss {total.item() / args.batches:.4f}")
