"""Timing one DataLoader configuration for the loader probe: batches delivered per second once its workers are up,
over whole rounds after the first, the main process's CPU time per batch taken from the workers, and the wall time
it takes to receive a batch already built while the workers build the next ones (the hand-over: a training step pays
it even where the workers keep up). And the user's own sampler, drawing a batch's indices: the main process runs it,
whatever the number of workers."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from gpuscope.collect.callsites import is_user_file
from gpuscope.collect.collectors.cprofile import short_path
from gpuscope.collect.framework.probing import dataset_error
from gpuscope.record import LoaderRate

SAMPLER_BATCHES = 4
"""Batches of indices the user's sampler is timed drawing, at most (within ``SAMPLER_BUDGET_S``)."""
SAMPLER_BUDGET_S = 0.2


def time_sampler(index_sampler: Any, clock: Callable[[], float] = time.perf_counter,
                 budget_s: float = SAMPLER_BUDGET_S) -> tuple[float, str] | None:
    """The time the loader's index sampler takes to draw one batch's indices (the mean over up to SAMPLER_BATCHES
    batches after the first, which may set the sampler up), and the user's class as ``Name (file.py:line)`` of its
    ``__iter__``, where that sampler, or the sampler a torch BatchSampler draws from, is a class of the user's own;
    None otherwise (torch's samplers are cheap per batch, and setting one up can be costly: a RandomSampler permutes
    the whole dataset), or where it ran out.

    Raises DatasetError if the sampler raises."""
    inner = getattr(index_sampler, "sampler", None) if type(index_sampler).__module__.startswith("torch.") else None
    user = index_sampler if inner is None else inner
    code = getattr(getattr(type(user), "__iter__", None), "__code__", None)
    if code is None or not is_user_file(code.co_filename):
        return None
    started = clock()
    drawn, timed_from = 0, started
    try:
        batches = iter(index_sampler)
        next(batches)
        timed_from = clock()
        while drawn < SAMPLER_BATCHES and clock() - started < budget_s:
            next(batches)
            drawn += 1
    except StopIteration:
        pass
    except Exception as exc:
        raise dataset_error(exc, "when its sampler drew indices again after the run") from None
    if not drawn:
        return None
    where = f"{short_path(code.co_filename)}:{code.co_firstlineno}"
    return (clock() - timed_from) / drawn, f"{type(user).__name__} ({where})"


ROUNDS = 3
"""A configuration stops after this many whole rounds past the first (3 x N batches) and ``MIN_TIMED_S``, or at its
share of the budget, whichever comes first."""
MIN_TIMED_S = 0.4
"""...and not before its rounds after the first span this long, when its share allows: three rounds of small batches
can take a tenth of a second, and one hiccup of a shared machine (a neighbour's burst, a page-cache flush) would
then be the rate."""
RECEIVED = 3
"""Batches whose hand-over is timed once the workers' prefetched batches are built (all but the first, which the
workers, idle until then, hand over at once): at most this many."""


def time_config(loader: Any, workers: int, pin: bool, slot_s: float, clock: Callable[[], float]) -> LoaderRate:
    """Iterate ``loader`` for at most ``slot_s``: whole rounds of ``max(1, workers)`` batches after the first."""
    started = clock()
    deadline = started + slot_s
    per_round = max(1, workers)
    arrivals: list[float] = []
    cpu: list[float] = []  # the main thread's CPU time in each next()
    note = ""
    iterator = None
    try:
        iterator = iter(loader)
        while True:
            if workers:
                iterator._timeout = max(deadline - clock(), 0.01)  # each wait for a worker ends by the deadline
            cpu_before = time.thread_time()
            try:
                next(iterator)
            except StopIteration:
                note = "the dataset ran out of batches"
                break
            now = clock()
            arrivals.append(now)
            cpu.append(time.thread_time() - cpu_before)
            done = len(arrivals) - per_round
            if done < 0 or done % per_round:
                continue  # rounds are timed whole
            rounds = done // per_round
            last_round_s = arrivals[-1] - (arrivals[-1 - per_round] if done else started)
            timed_s = now - arrivals[per_round - 1]
            if (rounds >= ROUNDS and timed_s >= MIN_TIMED_S) or now + last_round_s > deadline:
                break
    except RuntimeError as exc:
        if "timed out" not in str(exc):
            raise dataset_error(exc, "when the loader probe loaded it after the run") from None
        note = f"no further batch within this configuration's {slot_s:.2f} s"
    except Exception as exc:
        raise dataset_error(exc, "when the loader probe loaded it after the run") from None
    else:
        rate = _rate(workers, pin, started, slot_s, arrivals, cpu, note)
        if workers and rate.batches_per_s and not note:
            rate = dataclasses.replace(rate, receive_s=_receive_s(iterator, loader, workers, rate.batches_per_s,
                                                                  deadline, clock))
        return rate
    finally:
        close_workers(iterator)
    return _rate(workers, pin, started, slot_s, arrivals, cpu, note)


def _receive_s(iterator: Any, loader: Any, workers: int, rate: float, deadline: float,
               clock: Callable[[], float]) -> float | None:
    """The median wall time of ``next()`` on batches the workers had built, each taken while they build the next
    ones: the workers are left to fill their prefetched batches (``prefetch_factor`` each, at ``rate``) first; None
    where that does not fit before ``deadline`` or fewer than two are prefetched."""
    ready = workers * (getattr(loader, "prefetch_factor", None) or 2)
    fill_s = 1.5 * ready / rate + 0.01
    if ready < 2 or clock() + fill_s + (RECEIVED + 1) / rate > deadline:
        return None
    time.sleep(fill_s)
    waits = []
    iterator._timeout = max(deadline - clock(), 0.01)
    try:
        for taken in range(min(ready, RECEIVED + 1)):
            before = clock()
            next(iterator)
            if taken:  # the first: the workers were idle and answer at once
                waits.append(clock() - before)
    except (StopIteration, RuntimeError):  # out of batches, or past the deadline: what was timed
        pass
    return statistics.median(waits) if waits else None


def _rate(workers: int, pin: bool, started: float, slot_s: float, arrivals: list[float], cpu: list[float],
          note: str) -> LoaderRate:
    """The configuration's rate from its batches' arrival times (``cpu``: the main thread's CPU time in each)."""
    per_round = max(1, workers)
    startup = arrivals[0] - started if arrivals else max(0.0, slot_s)
    rounds = (len(arrivals) - per_round) // per_round if len(arrivals) >= per_round else 0
    if rounds >= 1:
        end = per_round - 1 + rounds * per_round
        span = arrivals[end] - arrivals[per_round - 1]
        timed = rounds * per_round
        handover = sum(cpu[per_round:end + 1]) / timed if workers else None
        return LoaderRate(workers, pin, timed / span if span > 0 else None, timed, startup, note, handover)
    if workers == 0 and arrivals:
        return LoaderRate(workers, pin, 1 / startup if startup > 0 else None, 1, startup, note)
    if len(arrivals) >= per_round and arrivals[per_round - 1] > started:
        # only the first round: a lower bound, the workers' start-up included
        lower = per_round / (arrivals[per_round - 1] - started)
        return LoaderRate(workers, pin, lower, per_round, startup,
                          note or "from the first round only, start-up included (a lower bound)")
    return LoaderRate(workers, pin, None, 0, startup,
                      note or f"fewer than {per_round} batches within this configuration's {slot_s:.2f} s")


def close_workers(iterator: Any) -> None:
    """Stop the iterator's workers now: killed rather than drained (a worker in the middle of a slow batch would
    hold the shutdown up), after taking them off torch's SIGCHLD watch so their end raises nowhere.

    A worker killed inside ``Event.is_set()`` (its loop asks it between batches) leaves that event's lock held for
    good, and torch's shutdown then sets the event: it would wait forever (torch's guard, the SIGCHLD watch raising
    in the main process, is the one taken off). So torch's shutdown gets a new event, which no dead worker holds.

    Under the ``file_system`` sharing strategy each batch a worker has queued is a named file in shared memory,
    removed when the batch is received: those of the killed workers are removed here (``remove_shared_files``)."""
    if iterator is None:
        return
    workers = getattr(iterator, "_workers", None)
    pids = [worker.pid for worker in workers or () if worker.pid is not None]
    if workers:
        try:
            if getattr(iterator, "_worker_pids_set", False):
                from torch.utils.data._utils import signal_handling

                signal_handling._remove_worker_pids(id(iterator))
                iterator._worker_pids_set = False
            for worker in workers:
                if worker.is_alive():
                    worker.terminate()
            for worker in workers:
                worker.join(timeout=1.0)
                if worker.is_alive():  # SIGTERM caught or blocked: SIGKILL
                    worker.kill()
                    worker.join(timeout=1.0)
            if hasattr(iterator, "_workers_done_event"):
                iterator._workers_done_event = multiprocessing.Event()
        except Exception:  # torch's own shutdown below still ends them, only more slowly
            pass
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    remove_shared_files(pids)


SHARED_MEMORY = "/dev/shm"


def remove_shared_files(pids: list[int], folder: str = SHARED_MEMORY, maps: str = "/proc/self/maps") -> int:
    """Remove the shared-memory files that processes ``pids``, now gone, made for tensors (torch names them
    ``torch_PID_...``) and that this process does not map; how many. Nothing would read those batches again, and
    each file would hold its memory until the machine restarts (a probe of image batches: tens of MB a run). A file
    this process maps (a batch received and still held) is left to torch, which removes it when its last holder
    lets go: removed under it, torch's release would fail and abort the process."""
    if not pids:
        return 0
    prefixes = tuple(f"torch_{pid}_" for pid in pids)
    try:
        with os.scandir(folder) as entries:
            made = [e.path for e in entries if e.name.startswith(prefixes)]
        if not made:  # the usual case (file_descriptor sharing names no file): the mappings need not be read
            return 0
        with open(maps) as lines:
            mapped = {line.rsplit(None, 1)[-1] for line in lines if folder in line}
    except OSError:  # not Linux: no such folder, nothing named was made; or the mappings unreadable: leave all
        return 0
    orphans = [path for path in made if path not in mapped]
    removed = 0
    for path in orphans:
        with contextlib.suppress(OSError):  # removed since, or not ours to remove
            os.unlink(path)
            removed += 1
    return removed
