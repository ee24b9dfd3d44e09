"""A small MLP trained on synthetic batches, about 8 ms a step on one thread of the 2-core machine; ``--slower PCT``
does PCT percent more of the same arithmetic a step (more matmuls of the extra work), for the gate benchmark."""

import argparse
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--slower", type=float, default=0.0, help="percent more work a step")
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
WIDTH, ROWS, REPS = 256, 32, 30
BASE_REPS = 33
"""The rest of the step (the model's forward and backward, the optimizer, the batch) in reps of the extra arithmetic,
as timed on the 2-core machine: --slower adds PCT percent of REPS + BASE_REPS."""
model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
extra = torch.randn(WIDTH, WIDTH) / WIDTH ** 0.5
reps = REPS + round((REPS + BASE_REPS) * args.slower / 100)
ends = []
for step in range(args.steps):
    x, y = torch.randn(128, WIDTH), torch.randint(0, 10, (128,))
    with torch.no_grad():  # the step's extra arithmetic: a fixed number of matmuls, scaled by --slower
        h = x[:ROWS]
        for _ in range(reps):
            h = torch.tanh(h @ extra)
    loss = nn.functional.cross_entropy(model(x) + 0 * h.sum(), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    ends.append(time.perf_counter())
gaps = [b - a for a, b in zip(ends[20:], ends[21:])]
print(f"mean_step_s={sum(gaps) / len(gaps):.6f}")
