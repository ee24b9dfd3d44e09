"""A loader of CPU-heavy items on a machine of few cores: each item a 3x64x64 image smoothed and normalised in the
dataset's __getitem__ (torch ops, about a millisecond), a small CNN trained on torch's threads; no workers. Workers
would take the cores the step computes on."""
import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()


class Images(Dataset):
    def __init__(self, n):
        self.images = torch.randn(n, 3, 64, 64)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        x = self.images[i].unsqueeze(0)
        for _ in range(4):
            x = F.avg_pool2d(x, 3, stride=1, padding=1)
        x = x.squeeze(0)
        return (x - x.mean()) / (x.std() + 1e-6), i % 10


model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(512, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
torch.manual_seed(0)
data = Images(3200)
loader = DataLoader(data, batch_size=32, shuffle=True)
for epoch in range(args.epochs):
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
