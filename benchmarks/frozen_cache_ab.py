"""`cache-frozen-outputs` against the truth: the distillation loop of tests/fixtures/records/distill_frozen_teacher.py
(a frozen teacher under no_grad, an EMA of the student, 2 workers) as it is, and with ``--cached``: the teacher's
logits computed once for every item before the loop and loaded with each batch. Prints the median step (batch to
batch, the first 5 left out), the median loop body (the batch's wait left out) and the whole run; run each a few
times in turn, under plain python:

    python benchmarks/frozen_cache_ab.py
    python benchmarks/frozen_cache_ab.py --cached
"""
import argparse, copy, time
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--cached", action="store_true")
args = p.parse_args()
torch.manual_seed(0)

def mlp(width, depth):
    layers = [nn.Flatten(), nn.Linear(3 * 32 * 32, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.BatchNorm1d(width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))

teacher = mlp(1024, 6).eval()
for q in teacher.parameters():
    q.requires_grad_(False)
student = mlp(256, 3)

class ModelEma(nn.Module):
    def __init__(self, model, decay=0.999):
        super().__init__()
        self.module = copy.deepcopy(model).eval()
        self.decay = decay
    @torch.no_grad()
    def update(self, model):
        for e, m in zip(self.module.state_dict().values(), model.state_dict().values()):
            if e.dtype.is_floating_point:
                e.mul_(self.decay).add_(m, alpha=1 - self.decay)
            else:
                e.copy_(m)

ema = ModelEma(student)
data = TensorDataset(torch.randn(4096, 3, 32, 32), torch.randint(0, 10, (4096,)))
if args.cached:
    with torch.no_grad():
        logits = torch.cat([teacher(x) for x, _ in DataLoader(data, batch_size=512)])
    data = TensorDataset(*data.tensors, logits)
loader = DataLoader(data, batch_size=128, shuffle=True, num_workers=args.workers)
opt = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9)
T = 4.0
t0 = time.perf_counter()
ST = []
STEP = []
prev = None
for epoch in range(args.epochs):
    student.train()
    for batch in loader:
        a = time.perf_counter()
        if prev is not None:
            STEP.append(a - prev)
        prev = a
        if args.cached:
            x, y, t_logits = batch
        else:
            x, y = batch
            with torch.no_grad():
                t_logits = teacher(x)
        s_logits = student(x)
        loss = 0.5 * F.cross_entropy(s_logits, y) + 0.5 * T * T * F.kl_div(
            F.log_softmax(s_logits / T, -1), F.softmax(t_logits / T, -1), reduction="batchmean")
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema.update(student)
        ST.append(time.perf_counter() - a)
    print(f"epoch {epoch} loss {loss.item():.4f} {time.perf_counter() - t0:.1f}s")
import statistics
print("median step", statistics.median(STEP[5:]), "median body", statistics.median(ST[5:]),
      "total", time.perf_counter() - t0)
