"""A text classifier in the style of the PyTorch text tutorials: each item tokenised and numericalised in the
dataset's __getitem__ (Python per character), an EmbeddingBag model, SGD; the DataLoader with no workers."""
import argparse
import random

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

WORDS = [f"w{i}" for i in range(5000)]


class Reviews(Dataset):
    def __init__(self, n):
        rng = random.Random(0)
        self.texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(80, 160))) for _ in range(n)]
        self.labels = [rng.randint(0, 3) for _ in range(n)]
        self.vocab = {w: i for i, w in enumerate(WORDS)}

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        tokens = [t.strip(".,!?").lower() for t in self.texts[i].split()]
        ids = [self.vocab.get(t, 0) for t in tokens for _ in range(4)]  # a sub-word split, as a real tokenizer does
        return torch.tensor(ids[:512]), self.labels[i]


def collate(batch):
    texts, labels = zip(*batch)
    offsets = torch.tensor([0] + [len(t) for t in texts[:-1]]).cumsum(0)
    return torch.cat(texts), offsets, torch.tensor(labels)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.EmbeddingBag(len(WORDS), 64)
        self.fc = nn.Linear(64, 4)

    def forward(self, text, offsets):
        return self.fc(self.embedding(text, offsets))


torch.manual_seed(0)
train_set = Reviews(4096)
train_loader = DataLoader(train_set, batch_size=32, shuffle=True, collate_fn=collate)
model = Classifier()
optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
criterion = nn.CrossEntropyLoss()
for epoch in range(args.epochs):
    for text, offsets, label in train_loader:
        optimizer.zero_grad()
        loss = criterion(model(text, offsets), label)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
