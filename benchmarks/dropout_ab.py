"""`skip-dropout` against the truth: the text classifier of tests/fixtures/records/text_transformer.py (a
TransformerEncoder, dropout 0.1) as it is, and with ``--dropout 0``. Prints the median step (batch to batch, the first
10 left out); run each a few times in turn under plain python, and once under ``gpuscope run`` for its promise:

    python benchmarks/dropout_ab.py
    python benchmarks/dropout_ab.py --dropout 0
    gpuscope run benchmarks/dropout_ab.py
"""
import argparse, statistics, time
import torch, torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--dropout", type=float, default=0.1)
args = p.parse_args()
torch.manual_seed(0)
V, D, L, C = 8000, 128, 96, 5

class Clf(nn.Module):
    def __init__(s):
        super().__init__(); s.emb = nn.Embedding(V, D, padding_idx=0); s.pos = nn.Parameter(torch.zeros(1, L, D))
        s.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, 4, 256, args.dropout, batch_first=True), 2)
        s.head = nn.Linear(D, C)
    def forward(s, x):
        pad = x == 0; h = s.enc(s.emb(x) + s.pos[:, :x.shape[1]], src_key_padding_mask=pad)
        h = h.masked_fill(pad[..., None], 0).sum(1) / (~pad).sum(1, keepdim=True); return s.head(h)

class Texts(torch.utils.data.Dataset):
    def __init__(s, n): s.lens = torch.randint(10, L, (n,)); s.n = n
    def __len__(s): return s.n
    def __getitem__(s, i):
        g = torch.Generator().manual_seed(i); n = int(s.lens[i])
        return torch.randint(1, V, (n,), generator=g), i % C

def collate(b):
    xs, ys = zip(*b); return nn.utils.rnn.pad_sequence(xs, batch_first=True), torch.tensor(ys)

loader = torch.utils.data.DataLoader(Texts(4000), batch_size=32, shuffle=True, collate_fn=collate)
m = Clf(); opt = torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.01)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=len(loader))
crit = nn.CrossEntropyLoss(label_smoothing=0.1)
began = []
for x, y in loader:
    began.append(time.perf_counter())
    loss = crit(m(x), y); opt.zero_grad(); loss.backward()
    nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); sched.step()
steps = [b - a for a, b in zip(began, began[1:])][10:]
print(f"dropout {args.dropout}: median step {statistics.median(steps) * 1e3:.1f} ms over {len(steps)} steps")
