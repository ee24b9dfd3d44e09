"""The host memory sampler's last reading, kept on disk in the run's folder while the run goes on: what the watcher
of a run killed outright (``gpuscope/sentinel.py``) writes the run's record from."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

LAST = ".gpuscope-last-reading.json"
"""In the run's folder while it runs; taken out at its end."""
WRITE_EVERY_S = 2.0


def write_last(run_dir: Path, steps: int, rss: int, peak_rss: int) -> None:
    """The reading (atomically: a kill mid-write leaves the one before)."""
    reading = {"t": time.time(), "steps": steps, "rss": rss, "peak_rss": peak_rss, "vm": vm_size(os.getpid())}
    tmp = run_dir / f"{LAST}.tmp"
    tmp.write_text(json.dumps(reading))
    os.replace(tmp, run_dir / LAST)


def vm_size(pid: int) -> int:
    """A process's address space (virtual size), bytes; 0 where it cannot be read."""
    return statm_bytes(pid)[0]


def statm_bytes(pid: int) -> tuple[int, int]:
    """A process's address space and resident memory (``/proc/PID/statm``), bytes; zeros where unreadable."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            fields = statm.read().split()
        page = os.sysconf("SC_PAGE_SIZE")
        return int(fields[0]) * page, int(fields[1]) * page
    except (OSError, ValueError, IndexError):
        return 0, 0
