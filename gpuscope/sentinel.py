"""A run killed outright writes nothing itself: the kernel's OOM killer (a container's memory limit, a host out of
memory) ends it with SIGKILL, which no handler sees. A small process started beside it, outside its process tree
(the host memory sampler counts the run's children as DataLoader workers), waits for it to end; where it ended
without its run.json, it writes one, and the report, from what the run left on disk: the host memory sampler's
last reading (``collect/last_reading.py``: the steps counted, the resident memory and address space), the
limit the run had, and whether the container's OOM killer struck (cgroup v2's ``memory.events``, ``oom_kill``).
A run that crashed on a fatal signal (a segfault in native code) left Python's stacks in ``FAULTS``.

``start`` is called by ``gpuscope run`` before the script; ``Sentinel.stop`` once the run's own files are written.
The watcher (``BOOTSTRAP``, then ``run``) imports neither torch nor the collectors, and sleeps ``POLL_S`` between
looks.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuscope.collect.last_reading import LAST

POLL_S = 0.5
NEAR_LIMIT = 0.8
"""A run killed outright with its memory at this share of its limit or more at the last reading ran out of memory
(a kill by hand, with room left, is not said to)."""
KILLED_STATUS = 128 + signal.SIGKILL
"""The exit status recorded: what a shell reports for a process ended by SIGKILL (the watcher, not its parent,
cannot read the real one)."""
EVENTS = "/sys/fs/cgroup/memory.events"
FAULTS = "faults.txt"
"""Every thread's Python stack at a fatal signal (``faulthandler``, enabled by gpuscope unless the user enabled it):
the watcher reads the signal and where it struck from it."""
FATAL = {"Segmentation fault": signal.SIGSEGV, "Floating point exception": signal.SIGFPE,
         "Aborted": signal.SIGABRT, "Bus error": signal.SIGBUS, "Illegal instruction": signal.SIGILL}
"""faulthandler's words for the signals it reports."""
_FRAME = re.compile(r'\s+File "(.*)", line (\d+) in (.*)')


@dataclass(frozen=True, slots=True)
class Sentinel:
    """The watcher process started for a run."""

    pid: int
    faults: Path | None = None
    """``FAULTS``, where gpuscope enabled faulthandler."""

    def stop(self) -> None:
        """The run wrote its files: the watcher has nothing to do, and an empty ``FAULTS`` is taken out."""
        try:
            os.kill(self.pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            if self.faults is not None and not self.faults.stat().st_size:
                self.faults.unlink()
        except OSError:
            pass


def start(run_dir: Path, command: tuple[str, ...]) -> Sentinel | None:
    """Start the watcher for this process and ``run_dir`` (None where it could not be: the run goes on without)."""
    try:
        launcher = subprocess.Popen(
            [sys.executable, "-c", BOOTSTRAP, str(os.getpid()), str(run_dir), json.dumps(command)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        line = launcher.stdout.readline() if launcher.stdout is not None else b""
        launcher.wait(timeout=30)
        if not line.strip().isdigit():
            return None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return Sentinel(int(line), _enable_faulthandler(run_dir / FAULTS))


def _enable_faulthandler(path: Path) -> Path | None:
    """A fatal signal's stacks to ``path``, unless the user enabled faulthandler (``-X faulthandler``, their own
    ``enable``): theirs is left as it is."""
    if faulthandler.is_enabled():
        return None
    try:
        faulthandler.enable(open(path, "w"), all_threads=True)  # (faulthandler keeps the file open)
    except OSError:
        return None
    return path


def crash(text: str) -> tuple[signal.Signals, str, tuple[tuple[str, int, str], ...]] | None:
    """The fatal signal faulthandler's ``text`` reports, its words for it, and the crashing thread's frames
    (file, line, function), innermost first; None where it reports none."""
    first, _, rest = text.partition("\n")
    words = first.removeprefix("Fatal Python error: ").strip()
    if words not in FATAL:
        return None
    frames = []
    _, found, stack = rest.partition("Current thread ")
    if not found:
        _, found, stack = rest.partition("Stack (most recent call first):")
    for line in stack.splitlines()[1:]:
        if not (match := _FRAME.match(line)):
            break
        frames.append((match[1], int(match[2]), match[3]))
    return FATAL[words], words, tuple(frames)


def _started(pid: int) -> str | None:
    """The process's start time (``/proc/PID/stat``), which tells it from a later process given its number."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _oom_kills() -> int | None:
    try:
        with open(EVENTS) as events:
            for line in events:
                name, _, count = line.partition(" ")
                if name == "oom_kill":
                    return int(count)
    except (OSError, ValueError):
        pass
    return None


def _address_limit(pid: int) -> int:
    """The watched process's address-space limit (``RLIMIT_AS``), from ``/proc/PID/limits``; 0 where unlimited."""
    try:
        with open(f"/proc/{pid}/limits") as limits:
            for line in limits:
                if line.startswith("Max address space"):
                    soft = line.split()[3]
                    return int(soft) if soft.isdigit() else 0
    except (OSError, IndexError, ValueError):
        pass
    return 0


def watch(pid: int, run_dir: Path, command: tuple[str, ...]) -> None:
    """Wait for ``pid`` to end; write its record where it left none."""
    born = _started(pid)
    kills = _oom_kills()
    address_limit = _address_limit(pid)
    while born is not None and _started(pid) == born:
        time.sleep(POLL_S)
        address_limit = _address_limit(pid) or address_limit  # the script may set it as it runs
    if (run_dir / "run.json").exists() or not run_dir.is_dir():
        return
    killed_by_oom = kills is not None and (_oom_kills() or 0) > kills
    try:
        faults = (run_dir / FAULTS).read_text(errors="replace")
        if not faults:
            (run_dir / FAULTS).unlink()
    except OSError:
        faults = ""
    write_killed_record(run_dir, command, _read_last(run_dir), killed_by_oom, address_limit, faults)


def _read_last(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / LAST).read_text())
    except (OSError, ValueError):
        return {}


def killed_record(command: tuple[str, ...], last: dict[str, Any], killed_by_oom: bool, address_limit: int,
                  host_limit: tuple[int, str], faults: str = "") -> Any:
    """The record of a run that ended without writing one: what the last reading says, whether it ran out of
    memory (the container's OOM killer struck, or its memory was ``NEAR_LIMIT`` of its limit), and the fatal
    signal and its place, where ``faults`` (``FAULTS``'s text) reports one."""
    from gpuscope.record import CollectorStatus, Memory, OutOfMemory, RunRecord, Verdict

    steps = int(last.get("steps", 0))
    rss, vm = int(last.get("rss", 0)), int(last.get("vm", 0))
    limit, source = host_limit
    used = rss
    if address_limit and (not limit or address_limit < limit):
        limit, source, used = address_limit, "the process's address-space limit (RLIMIT_AS)", vm
    near = bool(limit) and used >= NEAR_LIMIT * limit
    ago = f" ({time.time() - last['t']:.1f} s before it ended)" if "t" in last else ""
    reading = (f"{used / 1e6:.1f} MB of {source} ({limit / 1e6:.1f} MB) at the last reading{ago}, step {steps}"
               if limit and last else "no reading of its memory was left")
    crashed = crash(faults) if not killed_by_oom else None
    status = 128 + crashed[0] if crashed is not None else KILLED_STATUS
    cause = ("was killed by the kernel's OOM killer (the container's oom_kill count rose)" if killed_by_oom else
             _crashed(*crashed) if crashed is not None else
             "was killed outright (SIGKILL, as the kernel's OOM killer sends), its memory near its limit" if near else
             "ended without writing its record (killed outright?)")
    line = (f"the script {cause}; exit status {status} (128 + {crashed[0].name}), as a shell reports it; {reading}"
            if crashed is not None else
            f"the script {cause}: {reading}; its exit status could not be read, {status} is recorded")
    died = (OutOfMemory(error=f"the script {cause}", device="cpu", step=steps)
            if killed_by_oom or (near and crashed is None) else None)
    memory = Memory(device="cpu", process_bytes=rss, limit_bytes=limit, limit_source=source,
                    address_space_peak_bytes=vm, out_of_memory=died,
                    headroom_bytes=limit - used if limit else None,
                    notes=("written by gpuscope's watcher after the run ended without its record: only the last "
                           "reading is known",))
    return RunRecord(command=command, exit_status=status, memory=memory,
                     verdict=Verdict("inconclusive", 0.0, (line,)),
                     collectors={"memory-window": CollectorStatus("unavailable", "the run ended before it wrote "
                                                                                 "its record", field="memory")})


def _crashed(signum: signal.Signals, words: str, frames: tuple[tuple[str, int, str], ...]) -> str:
    """The crash in words: the signal, the innermost Python frame, the script's own innermost one."""
    from gpuscope.collect.callsites import is_user_file

    def place(frame: tuple[str, int, str]) -> str:
        return f"{frame[2]} ({os.path.basename(frame[0])}:{frame[1]})"

    where = f" in {place(frames[0])}" if frames else ""
    script = next((frame for frame in frames if is_user_file(frame[0])), None)
    if script is not None and script is not frames[0]:
        where += f", called from the script's {place(script)}"
    return f"crashed: {words} ({signum.name}){where}; every thread's Python stack is in {FAULTS}"


def write_killed_record(run_dir: Path, command: tuple[str, ...], last: dict[str, Any], killed_by_oom: bool,
                        address_limit: int, faults: str = "") -> None:
    from gpuscope.collect.oom import memory_limit
    from gpuscope.pipeline import conclude, render

    record = killed_record(command, last, killed_by_oom, address_limit, memory_limit("cpu", address_space=False),
                           faults)
    try:  # diagnosed already: its verdict is the watcher's, nothing more was measured
        render(conclude(record, run_dir, diagnosed=True), run_dir)
    finally:
        (run_dir / LAST).unlink(missing_ok=True)


BOOTSTRAP = """
import os, sys
child = os.fork()
if child:
    print(child, flush=True)
    os._exit(0)
from gpuscope.sentinel import run
run(sys.argv[1:])
"""
"""The launcher: it forks before importing anything (the run waits only for the watcher's pid, not for gpuscope's
imports), and leaves the watcher, its child, to be adopted: the run's process tree never holds it."""


def run(argv: list[str]) -> None:
    """The watcher: ``PID RUN_DIR COMMAND``, its output to nowhere; it never returns."""
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        watch(int(argv[0]), Path(argv[1]), tuple(json.loads(argv[2])))
    finally:
        os._exit(0)
