"""Which processes are still alive: the suite's check that gpuscope leaves none of its own behind (a probe, a
DataLoader worker, a rank), shared with benchmarks/repeat_runs.py. Only the standard library: the benchmark runs
without the test extra."""

from __future__ import annotations

import os
from pathlib import Path


def processes_mentioning(text: str) -> list[int]:
    """Live processes (other than this one) whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
