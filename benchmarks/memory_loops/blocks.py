"""A small transformer-style model of repeated blocks (LayerNorm, Linear, GELU, attention through
``F.scaled_dot_product_attention``), trained with Adam on one synthetic batch (float32). At the default size
(6 blocks of width 64, 16 sequences of 64 tokens) the activations saved for backward, about 26 MB, dominate the
step's peak; the parameters are 0.3M (1.2 MB).

    python blocks.py [--steps 16] [--batch 16] [--checkpoint]   # train (run it under gpuscope)
    python blocks.py --truth                                     # ground truth sizes, plain python
    python blocks.py --peak [--checkpoint]                       # ground truth peak of one steady step
"""

import argparse

import torch
import torch.nn.functional as F
from _truth import run
from torch import nn
from torch.utils.checkpoint import checkpoint

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=16)
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--tokens", type=int, default=64)
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--blocks", type=int, default=6)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--classes", type=int, default=16)
parser.add_argument("--checkpoint", action="store_true", help="torch.utils.checkpoint around each block")
parser.add_argument("--truth", action="store_true", help="print the ground truth sizes instead of training")
parser.add_argument("--peak", action="store_true", help="print one steady step's peak instead of training")
args = parser.parse_args()


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(args.width, args.heads) for _ in range(args.blocks))
        self.ln_f = nn.LayerNorm(args.width)
        self.head = nn.Linear(args.width, args.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if args.checkpoint else block(x)
        return self.head(self.ln_f(x))


torch.manual_seed(0)
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(args.batch, args.tokens, args.width)
y = torch.randint(0, args.classes, (args.batch, args.tokens))


def forward():
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten()), (x, y)


def step():
    loss, _ = forward()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


run(args, model, opt, forward, step, (x, y))
