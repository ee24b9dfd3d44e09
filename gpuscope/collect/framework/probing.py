"""What the post-run probes share: they run the user's code again after the script has ended, so they leave no
trace of it (the global RNG states are restored, whatever it prints is swallowed), turn its failures into one line
for the record, and are bounded whatever that code does: ``run_isolated`` runs a probe in a forked child with a
deadline and a memory ceiling, so a hang or a blow-up costs the probe, never the run's record."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import random
import resource
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from gpuscope.collect import warning_filters
from gpuscope.collect.framework.base import CollectorResult
from gpuscope.record import CollectorStatus


class DatasetError(Exception):
    """The user's dataset (or collate function) raised while a probe loaded it (the message is the reason)."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, at most ``limit`` characters."""
    text = str(exc).strip().splitlines()
    return text[0][:limit] if text else ""


def dataset_error(exc: BaseException, doing: str) -> DatasetError:
    """A DatasetError saying what the dataset raised while the probe was ``doing`` it. From a DataLoader worker,
    torch re-raises it as "Caught KeyError in DataLoader worker process 0" with the worker's traceback below: the
    traceback's last line says what was raised."""
    text = str(exc).strip().splitlines()
    if text and text[0].startswith("Caught ") and "worker" in text[0] and len(text) > 1:
        return DatasetError(f"the dataset raised {text[-1].strip()[:200]} in a DataLoader worker {doing}")
    message = first_line(exc)
    return DatasetError(f"the dataset raised {type(exc).__name__}{': ' + message if message else ''} {doing}")


@contextlib.contextmanager
def rng_kept() -> Iterator[None]:
    """Restore Python's, NumPy's and torch's global RNG states afterwards: the probe changes nothing the user
    would see, however the dataset draws its randomness."""
    numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    python_state = random.getstate()
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        with torch.random.fork_rng(devices=[]) if torch is not None else contextlib.nullcontext():
            yield
    finally:
        random.setstate(python_state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)


@contextlib.contextmanager
def unseen() -> Iterator[None]:
    """RNG states kept, and what the user's code prints or warns while probed swallowed: it is not the run's."""
    with rng_kept(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warning_filters.ignored():
        yield


PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal a process gets when its parent dies."""
GRACE_S = 2.0
"""How far past its budget an isolated probe may run before it is killed (a worker's shutdown, the pipe)."""
MEMORY_HEADROOM_BYTES = 2 * 1024**3
"""Address space an isolated probe may add to what the process had mapped when it forked: the user's dataset
code blowing up (materialising ``len(dataset)`` of anything) gets a MemoryError rather than the machine's OOM
killer, which could pick the profiled run itself."""


def wait_under_the_bar(share: float, bar: float) -> str:
    """"data wait was SHARE of the step, under BAR": SHARE to a tenth of a percent where whole percents would read
    as the bar itself (4.9% is not "5%, under 5%")."""
    shown = f"{share:.0%}" if round(share * 100) < round(bar * 100) else f"{share:.1%}"
    return f"data wait was {shown} of the step, under {bar:.0%}"


def run_isolated(probe: Callable[[], CollectorResult], budget_s: float, what: str) -> CollectorResult:
    """Run ``probe`` in a forked child (its own process group, one torch thread, its output discarded, its address
    space capped) and return its result, or an ``unavailable`` status if it did not finish within ``budget_s`` plus
    ``GRACE_S`` (the child and every process it started are killed) or died. ``what`` names the probe in those
    reasons. Runs in this process where fork is unavailable or CUDA is in use (a forked child cannot use CUDA)."""
    torch = sys.modules.get("torch")
    cuda = torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
    if not hasattr(os, "fork") or cuda:
        return probe()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        _child(probe, write_end)
    os.close(write_end)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # here too, so the group exists whichever of the two runs first
    try:
        data = _read_until(read_end, time.monotonic() + budget_s + GRACE_S)
    finally:
        os.close(read_end)
        for kill in (os.killpg, os.kill):  # the group: the probe's own workers too
            with contextlib.suppress(OSError):
                kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if data is None:
        return CollectorResult(CollectorStatus(
            "unavailable", f"{what} did not finish within its {budget_s:.0f} s budget and was stopped"))
    if not data:
        code = os.waitstatus_to_exitcode(status)
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        return CollectorResult(CollectorStatus("unavailable", f"{what} died ({how}) before it finished"))
    return pickle.loads(data)  # type: ignore[no-any-return]


_user_threads: int | None = None
"""In a probe's child: torch's intra-op thread count in the user's process, before the child set its own to 1."""


def user_torch_threads(torch: Any) -> int:
    """torch's intra-op thread count in the user's process, also from inside a probe's child (which runs on 1)."""
    return _user_threads if _user_threads is not None else int(torch.get_num_threads())


def _child(probe: Callable[[], CollectorResult], write_end: int) -> NoReturn:
    """In the forked child: run the probe, send its pickled result, and leave without running any exit handler."""
    try:
        os.setpgid(0, 0)
        _die_with_parent()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        _cap_address_space()
        torch = sys.modules.get("torch")
        if torch is not None:
            global _user_threads
            _user_threads = torch.get_num_threads()
            torch.set_num_threads(1)  # as in a DataLoader worker: no OpenMP pool inherited across the fork
        try:
            result = probe()
        except BaseException as exc:
            result = CollectorResult(CollectorStatus("failed", f"{type(exc).__name__}: {first_line(exc)}"))
        data = pickle.dumps(result)
        view = memoryview(data)
        while view:
            view = view[os.write(write_end, view):]
    finally:
        os._exit(0)


def _die_with_parent() -> None:
    """Linux: the child is killed if gpuscope is (a SIGKILL gives it no chance to clean up)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _cap_address_space() -> None:
    try:
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = mapped + MEMORY_HEADROOM_BYTES
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (OSError, ValueError):
        pass  # no /proc, or a hard limit already lower: the deadline still bounds the probe


def _read_until(fd: int, deadline: float) -> bytes | None:
    """Everything written to ``fd`` until it closes, or None if the deadline passes first."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def fastest(action: Callable[[], object], repeats: int, budget_s: float, clock: Callable[[], float],
            before_each: Callable[[], object] | None = None, warm_up: bool = True) -> tuple[float, int]:
    """The fastest of up to ``repeats`` timings of ``action`` after a warm-up (unless not ``warm_up``), stopping
    once they have taken ``budget_s``, and how many were timed; ``before_each`` runs untimed before each timing."""
    if warm_up:
        action()
    started, best, timed = clock(), float("inf"), 0
    for _ in range(repeats):
        if before_each is not None:
            before_each()
        before = clock()
        action()
        best = min(best, clock() - before)
        timed += 1
        if clock() - started > budget_s:
            break
    return best, timed
