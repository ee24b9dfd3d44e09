"""A small launch-bound training loop with a debugging API left on: anomaly detection switched on for the run
(``--debug set``, as scripts do after a NaN hunt), entered as a context around each step (``--debug context``),
or off. Prints the mean of its own steps after the first 20 (``mean_step_s=``).

``--alternate ROUNDS``: in one process, ROUNDS times, the steps once plain and once inside ``gpuscope.profile()``
(in turn, each round starting with the other), a ``round=`` line of both means each round."""
import argparse
import contextlib
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--debug", choices=("set", "context", "off"), default="set")
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--alternate", type=int, default=0)
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(8)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 64), torch.randn(16, 64)
if args.debug == "set":
    torch.autograd.set_detect_anomaly(True)
debug = torch.autograd.detect_anomaly if args.debug == "context" else contextlib.nullcontext



def train() -> float:
    times = []
    for step in range(args.steps):
        start = time.perf_counter()
        with debug():
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        times.append(time.perf_counter() - start)
    steady = times[20:]
    return sum(steady) / len(steady)


if not args.alternate:
    print(f"mean_step_s={train():.6f}")
else:
    import tempfile

    import gpuscope

    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.alternate):
            means = {}
            for arm in ("python", "gpuscope")[::1 - 2 * (r % 2)]:
                if arm == "python":
                    means[arm] = train()
                else:
                    with gpuscope.profile(f"{tmp}/run{r}", quiet=True):
                        means[arm] = train()
            print(f"round={r} python_s={means['python']:.6f} gpuscope_s={means['gpuscope']:.6f}", flush=True)
