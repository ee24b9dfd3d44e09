"""``fewer-threads-per-process`` against the truth: pytorch/examples' Hogwild (benchmarks/process_loops/
hogwild_mnist.py, N trainer processes on one shared model) under plain python as published (torch's default threads
in each trainer: as many as the cores) and with the thread count gpuscope's fix names, rounds in turn: the training's
wall time saved, against the trainers' wait for a core that a ``gpuscope run`` of the published script measures (the
floor its evidence gives). Results: benchmarks/README.md."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parent / "process_loops" / "hogwild_mnist.py"
TRAINED = re.compile(r"trained in ([\d.]+) s")
WAITED = re.compile(r"waited for a core (\d+)% of the time")


def trained_s(*args: str) -> float:
    """The training's wall time under plain python."""
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True).stdout
    return float(TRAINED.search(out).group(1))  # type: ignore[union-attr]


def fresh_record(*args: str) -> dict[str, Any]:
    """The record of a ``gpuscope run`` of the script (its post-run probes skipped: they time nothing used here)."""
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([sys.executable, "-m", "gpuscope", "run", "--no-probes", "-o", folder, str(SCRIPT), *args],
                       capture_output=True, check=True)
        return json.loads((Path(folder) / "run.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batches", type=int, default=300)
    args = parser.parse_args()
    common = ("--processes", str(args.processes), "--batches", str(args.batches))
    record = fresh_record(*common)
    found = next((r for r in record["recommendations"] if r["id"] == "fewer-threads-per-process"), None)
    if found is None:
        print("gpuscope advised no fewer threads:", [r["id"] for r in record["recommendations"]])
        return
    threads = re.search(r"torch\.set_num_threads\((\d+)\)", found["fix"]).group(1)  # type: ignore[union-attr]
    floor = int(WAITED.search(found["why"]).group(1)) / 100  # type: ignore[union-attr]
    print(f"gpuscope: {found['fix']}; the trainers waited {floor:.0%} of their time")
    for round_ in range(args.rounds):
        before, after = trained_s(*common), trained_s(*common, "--threads", threads)
        print(f"round {round_ + 1}: {before:.2f} s as published, {after:.2f} s with {threads} thread(s) each: "
              f"{1 - after / before:.0%} saved, at least {floor:.0%} promised")


if __name__ == "__main__":
    main()
