"""pytorch/examples' time_sequence_prediction (two LSTMCells over sine waves, trained with LBFGS and a closure),
with its data made here instead of loaded from traindata.pt: a handful of long steps, each optimizer step many
forward/backward passes. ``--hidden`` and ``--length`` set how long a step takes."""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim


class Sequence(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, input, future=0):
        outputs = []
        h_t = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        c_t = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), self.hidden, dtype=torch.double)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5, help="steps to train")
    parser.add_argument("--hidden", type=int, default=51)
    parser.add_argument("--length", type=int, default=1000)
    parser.add_argument("--max-iter", type=int, default=20, help="LBFGS's passes a step at most")
    opt = parser.parse_args()
    np.random.seed(0)
    torch.manual_seed(0)
    x = np.empty((100, opt.length), "int64")
    x[:] = np.array(range(opt.length)) + np.random.randint(-80, 80, 100).reshape(100, 1)
    data = np.sin(x / 1.0 / 20).astype("float64")
    input = torch.from_numpy(data[3:, :-1])
    target = torch.from_numpy(data[3:, 1:])
    seq = Sequence(opt.hidden).double()
    criterion = nn.MSELoss()
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8, max_iter=opt.max_iter)
    for i in range(opt.steps):
        print("STEP: ", i)

        def closure():
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            print("loss:", loss.item())
            loss.backward()
            return loss

        optimizer.step(closure)
