"""Run the same ``gpuscope run`` many times in a row and check that every one finishes and leaves no process behind.

A run that does not finish within its deadline, or leaves a process of its own (a probe, a DataLoader worker),
fails the loop. Used for the reliability of the no-optimizer loops (issue 14): 10 in a row must pass.

    python benchmarks/repeat_runs.py --times 10 tests/fixtures/scripts/no_optimizer.py
    python benchmarks/repeat_runs.py --times 10 tests/fixtures/scripts/no_optimizer.py -- --mark
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from processes import processes_mentioning  # noqa: E402  (the suite's check, tests/processes.py)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--times", type=int, default=10)
    parser.add_argument("--deadline", type=float, default=120.0, help="seconds one run may take")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(options.times):
            run_dir = Path(tmp) / f"run-{i}"
            started = time.monotonic()
            try:
                result = subprocess.run([sys.executable, "-m", "gpuscope", "run", "-q", "-o", str(run_dir),
                                         options.script, *args], capture_output=True, text=True,
                                        timeout=options.deadline)
                status = f"exit {result.returncode}"
                ok = result.returncode == 0 and (run_dir / "run.json").is_file()
            except subprocess.TimeoutExpired:
                status, ok = f"did not finish within {options.deadline:.0f} s", False
            time.sleep(0.2)
            left = processes_mentioning(str(run_dir))
            ok = ok and not left
            failures += not ok
            print(f"run {i + 1}: {status}, {time.monotonic() - started:.1f} s"
                  f"{', processes left: ' + str(left) if left else ''}{'' if ok else '  FAILED'}", flush=True)
    print(f"{options.times - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
