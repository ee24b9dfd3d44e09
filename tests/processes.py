"""Which processes are still alive: the suite's check that gpuscope leaves none of its own behind (a probe, a
DataLoader worker, a rank), shared with benchmarks/repeat_runs.py. Only the standard library: the benchmark runs
without the test extra."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


def processes_mentioning(text: str) -> list[int]:
    """Live processes (other than this one) whose command line holds ``text``."""
    return [pid for pid, entry in _others()
            if text in _read(entry / "cmdline").replace("\0", " ")]


def processes_in_session(session: int) -> list[int]:
    """Live processes (other than this one) in the session ``session`` (a process started with its own session
    has its id as the session's id, and everything it starts stays in it unless it leaves)."""
    found = []
    for pid, _ in _others():
        fields = stat_fields(pid)
        if fields and int(fields[3]) == session and fields[0] != "Z":
            found.append(pid)
    return found


def stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (which may hold spaces): the state (``Z`` for a
    zombie), the parent, the group, the session...; empty if the process has gone."""
    stat = _read(Path("/proc") / str(pid) / "stat")
    return stat[stat.rindex(")") + 2:].split() if stat else []


def _others() -> Iterator[tuple[int, Path]]:
    """Each process but this one: its id and its folder in /proc."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            yield int(entry.name), entry


def _read(path: Path) -> str:
    """A /proc file's text; empty if its process has gone."""
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return ""
