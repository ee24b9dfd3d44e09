"""What each profiler a user could pick costs the training loop it profiles: plain python, gpuscope,
``python -m cProfile``, pyinstrument, ``scalene run`` and ``scalene run --cpu-only``, on the sample workloads.

Each round runs every tool once on each sample, the tools in a rotating order (round r starts at tool r), so a
slow drift of the machine spreads over all of them. Reported, per sample and tool, as the median over rounds of
the ratio to plain python in the same round:
- the script's own median step (its ``median_step_s=`` line): how much the tool distorts what it measures;
- the whole process's wall time: what the user waits, start-up and the tool's own reporting included.
A run that does not end within ``--timeout`` is reported as such. Needs the ``peers`` extra
(``pip install -c constraints.txt -e ".[peers]"``).

    python benchmarks/peers.py                      # 2 rounds, the default samples
    python benchmarks/peers.py --rounds 3 --timeout 300 cpu_launch_bound
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from overhead import LINE, ROOT, in_turn

SAMPLES = {
    "data_loading_bound": ["--steps", "40"],
    "cpu_launch_bound": ["--steps", "500"],
    "compute_bound": ["--steps", "20"],
}
"""The samples and their arguments: each loop's own kind of cost (Python-heavy loading, per-op overhead, matmuls)."""


def tools(tmp: Path) -> dict[str, list[str]]:
    """Each tool's command line before the script; ``{out}`` is a fresh output path for each run."""
    py = sys.executable
    return {
        "python": [py],
        "gpuscope": [py, "-m", "gpuscope", "run", "-q", "-o", "{out}"],
        "cProfile": [py, "-m", "cProfile", "-o", "{out}.prof"],
        "pyinstrument": [py, "-m", "pyinstrument", "-o", "{out}.txt"],
        "scalene": [py, "-m", "scalene", "run", "-o", "{out}.json"],
        "scalene --cpu-only": [py, "-m", "scalene", "run", "--cpu-only", "-o", "{out}.json"],
    }


def command(tool: list[str], script: str, args: list[str], out: Path) -> list[str]:
    """The full command line: scalene takes the script's own arguments after ``---``."""
    prefix = [part.replace("{out}", str(out)) for part in tool]
    return [*prefix, script, *(["---"] if "scalene" in tool else []), *args]


Outcome = tuple[float, float] | str
"""(the script's own median step, the process's wall time), or what went wrong."""


def run(cmd: list[str], timeout: float) -> Outcome:
    """Run one profiled (or plain) sample."""
    started = time.perf_counter()
    # its own process group: a tool that runs the script in a child (Scalene does) is stopped whole at the timeout,
    # or the leftover would slow every later run
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return f"no end within {timeout:.0f} s"
    wall = time.perf_counter() - started
    match = LINE.search(stdout)
    if process.returncode != 0 or match is None:
        print(f"{' '.join(cmd)} failed ({process.returncode}):\n{stderr[-1500:]}", file=sys.stderr)
        return f"failed (exit status {process.returncode})"
    return float(match.group(1)), wall


def ratio_text(values: list[float | str]) -> str:
    """The median ratio, or the first thing that went wrong."""
    failed = [v for v in values if isinstance(v, str)]
    return failed[0] if failed else f"{statistics.median(values):.2f}x"  # type: ignore[type-var]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds one run may take")
    parser.add_argument("samples", nargs="*", default=list(SAMPLES), metavar="SAMPLE")
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        by_tool = tools(Path(tmp))
        names = list(by_tool)
        for sample in options.samples:
            script = str(ROOT / "sample_workloads" / f"{sample}.py")
            steps: dict[str, list[float | str]] = {name: [] for name in names}
            walls: dict[str, list[float | str]] = {name: [] for name in names}
            for r in range(options.rounds):
                measured: dict[str, Outcome] = {}
                for name in in_turn(names, r):
                    out = Path(tmp) / f"{sample}-{r}-{names.index(name)}"
                    measured[name] = run(command(by_tool[name], script, SAMPLES.get(sample, []), out), options.timeout)
                    print(f"round {r + 1} {sample} {name}: {measured[name]}", file=sys.stderr, flush=True)
                plain = measured["python"]
                if isinstance(plain, str):
                    raise SystemExit(f"{sample} under plain python: {plain}")
                for name, outcome in measured.items():
                    steps[name].append(outcome if isinstance(outcome, str) else outcome[0] / plain[0])
                    walls[name].append(outcome if isinstance(outcome, str) else outcome[1] / plain[1])
            for name in names[1:]:
                rows.append(f"| `{sample}` | {name} | {ratio_text(steps[name])} | {ratio_text(walls[name])} |")
    print(f"Median of {options.rounds} rounds, ratio to plain python in the same round:\n")
    print("| sample | tool | the script's own median step | whole process |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
