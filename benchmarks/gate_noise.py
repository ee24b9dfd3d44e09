"""Does ``gpuscope compare --fail-if-slower 5`` hold on a busy machine? Runs of one loop of 7-8 ms steps
(``gate_loops/mlp_steps.py``), identical and 5%, 10% and 20% slower (more of the same arithmetic a step), RUNS of
each, interleaved; then every ordered pair through the gate: identical pairs (each run as A and as B: 12 of 4 runs)
must not fail, slower pairs (an identical run as A, a slower one as B: 16) should. With ``--load N``, N busy
processes spin beside the runs (one is a shared CI runner's neighbour).

Ground truth: each kind's loop under plain python (its own mean step, two runs), so a "10% slower" loop is held
against what it really is.

    python benchmarks/gate_noise.py                          # quiet, then beside one busy process
    python benchmarks/gate_noise.py --loads 1 --runs 4 --keep /tmp/gate-runs
    python benchmarks/gate_noise.py --keep /tmp/gate-runs --only-gate   # the kept runs through the gate again

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


def gate(a: Path, b: Path, page: Path, spread: str | None) -> tuple[int, str]:
    """``gpuscope compare A B --fail-if-slower 5 [--run-spread S]``, in this process: its exit status and its gate
    line."""
    from gpuscope.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["compare", str(a), str(b), "--fail-if-slower", GATE, "-o", str(page),
                       *(("--run-spread", spread) if spread else ())])
    line = next((x.strip() for x in out.getvalue().splitlines() if x.strip().startswith("gate ")), "")
    return status, line


def condition(folder: Path, load: int, runs: int, steps: int) -> dict[int, float]:
    """Every kind's runs beside ``load`` busy processes, into ``folder``; the plain-python truth, percent slower by
    kind."""
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(load)]
    for p in burners:
        p.start()
    try:
        truth = {k: [plain_step(steps, k) for _ in range(2)] for k in SLOWER}
        for i in range(runs):  # interleaved: the machine's drift falls on every kind alike
            for k in SLOWER:
                gpuscope_run(folder / f"load{load}-slower{k}-{i}", steps, k)
    finally:
        for p in burners:
            p.terminate()
    return {k: round((statistics.fmean(truth[k]) / statistics.fmean(truth[0]) - 1) * 100, 1) for k in SLOWER}


def evaluate(folder: Path, load: int, spread: str | None) -> dict:
    """Every ordered pair of ``folder``'s runs beside ``load`` busy processes through the gate."""
    dirs = {k: sorted(folder.glob(f"load{load}-slower{k}-*")) for k in SLOWER}
    found: dict[str, dict] = {}
    for k in SLOWER:
        pairs = [(a, b) for a in dirs[0] for b in dirs[k] if a != b]
        results = [gate(a, b, folder / "compare.html", spread) for a, b in pairs]
        statuses = [s for s, _ in results]
        found[f"{k}% slower" if k else "identical"] = {
            "pairs": len(pairs), "failed": statuses.count(1), "passed": statuses.count(0),
            "cannot_tell": statuses.count(3), "lines": [line for _, line in results]}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default="0,1", help="busy processes beside the runs, per condition")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--keep", type=Path, help="keep the runs' folders here")
    parser.add_argument("--only-gate", action="store_true", help="gate the runs kept in --keep again, running none")
    parser.add_argument("--spreads", default=",1.2", help="--run-spread values to gate with (empty: the default)")
    parser.add_argument("--json", type=Path, help="write the results here")
    options = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = options.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for load in (int(x) for x in options.loads.split(",")):
            truth = None if options.only_gate else condition(folder, load, options.runs, options.steps)
            for spread in options.spreads.split(","):
                found = evaluate(folder, load, spread or None)
                results.append({"load_processes": load, "run_spread": spread or "default", "truth_pct": truth,
                                "means_ms": _means(folder, load), "kinds": found})
                for kind, r in found.items():
                    print(f"load {load}, --run-spread {spread or 'default'}: {kind}: "
                          f"failed {r['failed']}/{r['pairs']}, "
                          f"passed {r['passed']}, cannot tell {r['cannot_tell']}", flush=True)
    if options.json:
        options.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


def _means(folder: Path, load: int) -> dict[str, list[float]]:
    """Each kind's runs' mean steady step (ms), as their records hold it."""
    return {f"{k}%": [round(json.loads((d / "run.json").read_text())["steps"]["mean_s"] * 1e3, 2)
                      for d in sorted(folder.glob(f"load{load}-slower{k}-*"))] for k in SLOWER}


if __name__ == "__main__":
    sys.exit(main())
