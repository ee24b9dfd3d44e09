"""Does ``gpuscope compare --fail-if-slower 5`` hold on a busy machine? Runs of one loop of 7-8 ms steps
(``gate_loops/mlp_steps.py``), identical and 5%, 10% and 20% slower (more of the same arithmetic a step), RUNS of
each, interleaved; then every ordered pair through the gate: identical pairs (each run as A and as B: 12 of 4 runs)
must not fail, slower pairs (an identical run as A, a slower one as B: 16) should. With ``--load N``, N busy
processes spin beside the runs (one is a shared CI runner's neighbour).

Ground truth: each kind's loop under plain python (its own mean step, two runs), so a "10% slower" loop is held
against what it really is.

    python benchmarks/gate_noise.py                          # quiet, then beside one busy process
    python benchmarks/gate_noise.py --loads 1 --runs 4 --keep /tmp/gate-runs

Figures: benchmarks/README.md ("The gate under noise"); raw: benchmarks/results/gate-noise-2cpu.json.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOP = ROOT / "benchmarks" / "gate_loops" / "mlp_steps.py"
SLOWER = (0, 5, 10, 20)
"""Each kind of run: percent more work a step."""
GATE = "5"


def _burn() -> None:
    while True:
        pass


def gpuscope_run(out: Path, steps: int, slower: int) -> None:
    subprocess.run([sys.executable, "-m", "gpuscope", "run", "-q", "--no-probes", "-o", str(out), str(LOOP),
                    "--steps", str(steps), "--slower", str(slower)], check=True, capture_output=True)


def plain_step(steps: int, slower: int) -> float:
    result = subprocess.run([sys.executable, str(LOOP), "--steps", str(steps), "--slower", str(slower)], check=True,
                            capture_output=True, text=True)
    return float(re.search(r"mean_step_s=([0-9.]+)", result.stdout).group(1))  # type: ignore[union-attr]


def gate(a: Path, b: Path, page: Path) -> tuple[int, str]:
    """``gpuscope compare A B --fail-if-slower 5``, in this process: its exit status and its gate line."""
    from gpuscope.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["compare", str(a), str(b), "--fail-if-slower", GATE, "-o", str(page)])
    line = next((x.strip() for x in out.getvalue().splitlines() if x.strip().startswith("gate ")), "")
    return status, line


def condition(folder: Path, load: int, runs: int, steps: int) -> dict:
    """Every kind's runs beside ``load`` busy processes, then every ordered pair through the gate."""
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(load)]
    for p in burners:
        p.start()
    try:
        truth = {k: [plain_step(steps, k) for _ in range(2)] for k in SLOWER}
        dirs: dict[int, list[Path]] = {k: [] for k in SLOWER}
        for i in range(runs):  # interleaved: the machine's drift falls on every kind alike
            for k in SLOWER:
                out = folder / f"load{load}-slower{k}-{i}"
                gpuscope_run(out, steps, k)
                dirs[k].append(out)
    finally:
        for p in burners:
            p.terminate()
    page = folder / "compare.html"
    found: dict[str, dict] = {}
    for k in SLOWER:
        pairs = [(a, b) for a in dirs[0] for b in dirs[k] if a != b]
        results = [gate(a, b, page) for a, b in pairs]
        statuses = [s for s, _ in results]
        found[f"{k}% slower" if k else "identical"] = {
            "pairs": len(pairs), "failed": statuses.count(1), "passed": statuses.count(0),
            "cannot_tell": statuses.count(3), "lines": [line for _, line in results],
            "plain_python_slower_pct": round((statistics.fmean(truth[k]) / statistics.fmean(truth[0]) - 1) * 100, 1),
        }
    return {"load_processes": load, "runs_per_kind": runs, "steps": steps, "kinds": found}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default="0,1", help="busy processes beside the runs, per condition")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--keep", type=Path, help="keep the runs' folders here")
    parser.add_argument("--json", type=Path, help="write the results here")
    options = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = options.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for load in (int(x) for x in options.loads.split(",")):
            found = condition(folder, load, options.runs, options.steps)
            results.append(found)
            for kind, r in found["kinds"].items():
                print(f"load {load}: {kind} (plain python {r['plain_python_slower_pct']:+.1f}%): failed "
                      f"{r['failed']}/{r['pairs']}, passed {r['passed']}, cannot tell {r['cannot_tell']}", flush=True)
    if options.json:
        options.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
