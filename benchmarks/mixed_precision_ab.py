"""``cpu-mixed-precision`` against the truth: the compute-bound sample under plain python in float32 and with its own
``--bf16`` (autocast around its forward and loss), rounds in turn, its median step each time; against the gain a
fresh ``gpuscope run`` of the float32 script promises. On a CPU without bfloat16 instructions the rule stays quiet
and ``--bf16`` runs many times slower: the script says which this machine is. Results: benchmarks/README.md."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SAMPLE = Path(__file__).resolve().parent.parent / "sample_workloads" / "compute_bound.py"
MEDIAN = re.compile(r"median_step_s=([\d.]+)")


def step_s(*flags: str) -> float:
    """The sample's median step under plain python."""
    out = subprocess.run([sys.executable, str(SAMPLE), *flags], capture_output=True, text=True, check=True).stdout
    return float(MEDIAN.search(out).group(1))  # type: ignore[union-attr]


def promised() -> float | None:
    """The gain a ``gpuscope run`` of the float32 sample promises for bfloat16 autocast (None: not advised)."""
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([sys.executable, "-m", "gpuscope", "run", "-q", "-o", folder, str(SAMPLE)],
                       capture_output=True, check=True)
        record = json.loads((Path(folder) / "run.json").read_text())
    reason = record["checks"].get("cpu-mixed-precision", {}).get("reason")
    if reason:
        print(f"cpu-mixed-precision not checked: {reason}")
    return next((r["expected_gain"] for r in record["recommendations"] if r["id"] == "cpu-mixed-precision"), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for round_ in range(args.rounds):
        gain = promised()
        fp32, bf16 = step_s(), step_s("--bf16")
        print(f"round {round_ + 1}: step {fp32 * 1e3:.1f} ms in float32, {bf16 * 1e3:.1f} ms with --bf16: "
              f"{1 - bf16 / fp32:.0%} saved; " + (f"{gain:.0%} promised" if gain is not None else "not advised"))


if __name__ == "__main__":
    main()
