"""pytorch/examples' word_language_model, its Transformer variant, on synthetic tokens: a handful of long steps, each
one forward and backward pass and an AdamW update (no closure). ``--layers``, ``--batch`` and ``--bptt`` set how
long a step takes."""
import argparse
import math
import time

import torch
import torch.nn as nn


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[: x.size(0)]


class TransformerModel(nn.Module):
    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.2):
        super().__init__()
        self.pos_encoder = PositionalEncoding(ninp)
        layer = nn.TransformerEncoderLayer(ninp, nhead, nhid, dropout)
        self.transformer_encoder = nn.TransformerEncoder(layer, nlayers, enable_nested_tensor=False)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.decoder = nn.Linear(ninp, ntoken)
        self.ninp = ninp

    def forward(self, src, mask):
        src = self.pos_encoder(self.encoder(src) * math.sqrt(self.ninp))
        return self.decoder(self.transformer_encoder(src, mask))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--bptt", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(1111)
    ntokens = 10000
    model = TransformerModel(ntokens, 256, 4, 1024, args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    criterion = nn.NLLLoss()
    mask = nn.Transformer.generate_square_subsequent_mask(args.bptt)
    data = torch.randint(ntokens, (args.bptt + 1, args.batch))
    model.train()
    for step in range(args.steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        output = model(data[:-1], mask)
        loss = criterion(torch.log_softmax(output, dim=-1).view(-1, ntokens), data[1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        print(f"step {step} loss {loss.item():.3f} {time.perf_counter() - start:.2f} s", flush=True)


if __name__ == "__main__":
    main()
