"""``evaluate-less-often`` against the truth: the full-batch GCN fixture (tests/fixtures/records/full_batch_gcn.py,
evaluating on its train and validation nodes after every update) under plain python, evaluating at every epoch and
at every 10th, rounds in turn; the step time saved, against the gain gpuscope promises for it (its recorded run's
``expected_gain``, or a fresh run's with ``--gpuscope``). Results: benchmarks/README.md."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "records" / "full_batch_gcn.py"
TIMED = re.compile(r"(\d+) epochs in ([\d.]+) s")


def epoch_s(every: int, epochs: int) -> float:
    """The mean epoch after the first, evaluating every ``every`` epochs, under plain python."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--epochs", str(epochs), "--eval-every", str(every)],
                         capture_output=True, text=True, check=True).stdout
    count, seconds = TIMED.search(out).groups()  # type: ignore[union-attr]
    return float(seconds) / int(count)


def fresh_record(epochs: int) -> dict[str, Any]:
    """The record of a ``gpuscope run`` of the script evaluating every epoch."""
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([sys.executable, "-m", "gpuscope", "run", "-o", folder, str(SCRIPT), "--epochs", str(epochs)],
                       capture_output=True, check=True)
        return json.loads((Path(folder) / "run.json").read_text())


def promised(record: dict[str, Any]) -> float:
    """The gain ``record`` promises for evaluating less often."""
    return next(r["expected_gain"] for r in record["recommendations"] if r["id"] == "evaluate-less-often")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--gpuscope", action="store_true", help="a fresh run's promise (else the recorded one's)")
    args = parser.parse_args()
    gain = promised(fresh_record(args.epochs) if args.gpuscope else json.loads(SCRIPT.with_suffix(".json").read_text()))
    for round_ in range(args.rounds):
        every_1, every_10 = epoch_s(1, args.epochs), epoch_s(10, args.epochs)
        print(f"round {round_ + 1}: epoch {every_1 * 1e3:.2f} ms evaluating every epoch, {every_10 * 1e3:.2f} ms "
              f"every 10th: {1 - every_10 / every_1:.0%} saved, {gain:.0%} promised")


if __name__ == "__main__":
    main()
