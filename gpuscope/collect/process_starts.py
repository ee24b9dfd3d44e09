"""Processes the script starts with multiprocessing, and what they run: gpuscope profiles the process it runs the
script in, so training done in processes of the script's own (pytorch/examples' Hogwild: ``mp.Process(target=train)``
on a shared model; ``torch.multiprocessing.spawn``) is not in its figures. The memory sampler, which watches every
child process's CPU time, tells how much work went there (a Hogwild run's two trainers used 27 s of CPU while the
run's own process evaluated for 0.1 s, and the verdict described the evaluation alone).

``multiprocessing.process.BaseProcess.start`` is wrapped for the run: every ``Process``, ``torch.multiprocessing``'s
and a ``Pool``'s included, under each start method. DataLoader workers are left out: the DataLoader figures cover
them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

from gpuscope.collect.callsites import call_site, is_user_file, user_frame
from gpuscope.collect.framework.base import patch
from gpuscope.record import StartedProcess

MAX_STARTED = 64
"""The most processes recorded (a Pool restarted every epoch starts many)."""
DATALOADER_WORKER = "torch.utils.data._utils.worker"
POOL_WORKERS = ("multiprocessing.pool", "concurrent.futures.process")
"""A process pool's workers: ``multiprocessing.Pool``'s, ``ProcessPoolExecutor``'s."""
SPAWN_WRAP = "torch.multiprocessing.spawn"
"""``torch.multiprocessing.spawn`` starts each process on its own ``_wrap(fn, i, args, error_queue)``."""


def describe(process: Any) -> tuple[str, str]:
    """(the function ``process`` runs, ``module.qualname``; its kind: ``dataloader-worker``, ``pool-worker`` (a
    process pool's), ``script`` (a function of the user's code) or ``library`` (a library's: Lightning's
    ``ddp_spawn``, say))."""
    target = getattr(process, "_target", None)
    args = getattr(process, "_args", ())
    if target is None:  # a Process subclass with its own run()
        target = type(process).run
    module = getattr(target, "__module__", None) or ""
    if module == SPAWN_WRAP and args and callable(args[0]):
        target, module = args[0], getattr(args[0], "__module__", None) or ""
    name = f"{module}.{getattr(target, '__qualname__', type(target).__qualname__)}"
    if module == DATALOADER_WORKER:
        return name, "dataloader-worker"
    if module in POOL_WORKERS:
        return name, "pool-worker"
    code = getattr(inspect.unwrap(target), "__code__", None)
    return name, "script" if code is None or is_user_file(code.co_filename) else "library"


class ProcessStarts:
    """The processes started while installed (DataLoader workers left out), with the user's line behind each."""

    def __init__(self) -> None:
        self.started: list[tuple[int, str, str, Any, str]] = []  # (pid, target, kind, call site, start method)
        self.more = 0  # started past MAX_STARTED

    def install(self) -> Callable[[], None]:
        """Wrap ``BaseProcess.start``; returns the undo."""
        import multiprocessing.process

        return patch(multiprocessing.process.BaseProcess, "start", self._wrap)

    def _wrap(self, original: Callable[[Any], None]) -> Callable[[Any], None]:
        starts = self

        @functools.wraps(original)
        def start(process: Any) -> None:
            described = ("", "")
            with contextlib.suppress(Exception):  # never into the script's start
                described = describe(process)  # before start() drops the target (bpo-30775)
            original(process)
            with contextlib.suppress(Exception):
                starts.note(process, *described, sys._getframe(1))

        return start

    def note(self, process: Any, target: str, kind: str, frame: Any) -> None:
        if kind in ("dataloader-worker", ""):
            return
        if len(self.started) >= MAX_STARTED:
            self.more += 1
            return
        method = getattr(getattr(process, "_popen", None), "method", "") or ""
        self.started.append((process.pid, target, kind, call_site(user_frame(frame)), method))

    def pids(self) -> set[int]:  # of the processes recorded
        return {started[0] for started in self.started}

    def record(self, cpu_by_pid: dict[int, tuple[float, float]],
               threads_by_pid: dict[int, tuple[float, float, int]]) -> tuple[StartedProcess, ...]:
        """The record's entries, each with the CPU time and the time waiting for a core the sampler last read of it:
        summed over its threads, with those that did work (``threads_by_pid``), else its first thread's
        (``cpu_by_pid``)."""
        def entry(pid: int, target: str, kind: str, site: Any, method: str) -> StartedProcess:
            cpu, runnable, threads = threads_by_pid.get(pid) or (*cpu_by_pid.get(pid, (None, None)), None)
            return StartedProcess(pid=pid, target=target, kind=kind, started_at=site, start_method=method,
                                  cpu_s=None if cpu is None else round(cpu, 3),
                                  runnable_s=None if runnable is None else round(runnable, 3), threads=threads)

        return tuple(entry(*started) for started in self.started)
