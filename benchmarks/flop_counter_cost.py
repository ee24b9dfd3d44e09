"""What counting a step's FLOPs costs: one closure call of ``long_loops/lbfgs_lstm.py`` (two LSTMCells over
sequences of ``--length``, 93k ops at 700), timed plain, under torch's ``FlopCounterMode`` and under gpuscope's lean
one (``gpuscope/collect/lean_flops.py``), in turn, in one process, ``--rounds`` times; with the FLOPs each counted.

    python benchmarks/flop_counter_cost.py [--length 700] [--rounds 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.utils import flop_counter

sys.path.insert(0, str(Path(__file__).resolve().parent / "long_loops"))
from lbfgs_lstm import Sequence  # noqa: E402

from gpuscope.collect import lean_flops  # noqa: E402
from gpuscope.collect.collectors.flops import _GlobalOnly  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=700)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Sequence(51).double()
    inputs = torch.randn(97, args.length, dtype=torch.double)
    target = torch.randn(97, args.length, dtype=torch.double)

    def call() -> None:
        model.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), target).backward()

    def torchs() -> object:
        return flop_counter.FlopCounterMode(display=False)

    def lean() -> object:
        return lean_flops.counter(display=False)

    call()  # the first call's lazy initialisation is no counter's
    for round_ in range(args.rounds):
        start = time.perf_counter()
        call()
        timings = [f"plain {time.perf_counter() - start:.2f} s"]
        for name, make in (("torch's FlopCounterMode", torchs), ("lean", lean)):
            counter = make()
            counter.mod_tracker = _GlobalOnly()  # as the flops collector: no global module hooks
            start = time.perf_counter()
            with counter:
                call()
            timings.append(f"{name} {time.perf_counter() - start:.2f} s ({counter.get_total_flops() / 1e9:.2f} GFLOP)")
        print(f"round {round_ + 1}: " + ", ".join(timings), flush=True)


if __name__ == "__main__":
    main()
