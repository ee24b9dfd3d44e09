"""A hand-written training loop in the style of pytorch/examples' word_language_model.

A small LSTM language model on a synthetic token stream. The loop has no optimizer and no DataLoader: the corpus
is one long tensor, batchified into columns and sliced into BPTT windows (``get_batch``), and the parameters are
updated by hand (``p.data.add_(p.grad, alpha=-lr)``), with gradient clipping. gpuscope marks each step at the end of
``loss.backward()``, the one marker such a loop has.

With the default tiny model (embedding 16, hidden 16, batch 4) every op does almost no arithmetic: the step is
per-op overhead, launch-bound. ``--large`` (embedding and hidden 512, batch 32) makes the matmuls dominate:
compute-bound.

Fix for the tiny model: ``--batch-size 64``: 16x more sequences per step for nearly the same step time, because the
number of ops per step does not grow with the batch.
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn


class RNNModel(nn.Module):
    """Embedding -> LSTM -> Linear decoder, as in word_language_model's model.py (LSTM variant)."""

    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity="tanh", dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(output)).view(-1, self.decoder.out_features), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


def batchify(data, bsz):
    """Cut the token stream into ``bsz`` columns (word_language_model's batchify)."""
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def get_batch(source, i, bptt):
    """Rows i..i+bptt of the batchified stream, and the next token of each as the target."""
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def repackage_hidden(h):
    """Detach the hidden state from the previous window's graph (truncated BPTT)."""
    return h.detach()


def main():
    parser = argparse.ArgumentParser(description="Train a word-level LSTM language model with manual SGD.")
    parser.add_argument("--steps", type=int, default=2000, help="training iterations")
    parser.add_argument("--batch-size", type=int, default=None, help="default 4 (32 with --large)")
    parser.add_argument("--bptt", type=int, default=8)
    parser.add_argument("--large", action="store_true", help="embedding and hidden size 512: compute-bound")
    parser.add_argument("--lr", type=float, default=20.0)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-step-times", action="store_true",
                        help="also print each step's time (benchmarks/step_cost.py compares them)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    size, ntokens = (512, 2000) if args.large else (16, 200)
    bsz = args.batch_size or (32 if args.large else 4)
    corpus = torch.randint(ntokens, (200_000,), generator=torch.Generator().manual_seed(args.seed))
    train_data = batchify(corpus, bsz)
    model = RNNModel(ntokens, size, size, nlayers=2)
    criterion = nn.NLLLoss()

    model.train()
    hidden = model.init_hidden(bsz)
    step_times, step, i = [], 0, 0
    last = time.perf_counter()
    while step < args.steps:
        if i >= train_data.size(0) - 2:
            i, hidden = 0, model.init_hidden(bsz)  # the next epoch
        data, targets = get_batch(train_data, i, args.bptt)
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(torch.log_softmax(output, dim=-1), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-args.lr)
        i += args.bptt
        now = time.perf_counter()
        step_times.append(now - last)
        last, step = now, step + 1

    durations = step_times[1:] if step > 1 else step_times  # the first iteration (warm-up) is left out
    median = statistics.median(durations)
    print(f"steps={step} median_step_s={median:.6f} data_wait_fraction=0.0000 "
          f"samples_per_s={bsz / median:.1f}")
    if args.print_step_times:
        print("step_times_s=" + ",".join(f"{t:.6f}" for t in step_times))


if __name__ == "__main__":
    main()
