"""cProfile in DataLoader worker processes started by fork: each worker's first ``WORKER_BATCHES`` batches, from
the fetch of its samples to the collated batch (its ``__getitem__`` time is the data pipeline's cost).

The DataLoader's fetchers are wrapped in the main process; a forked worker inherits the wrapper and profiles its
own fetches, then writes ``workers/<pid>.prof`` at once (a worker may be terminated at shutdown, so nothing waits
for its exit). Workers started by spawn or forkserver import torch afresh, without the wrapper, and are not
profiled. Only a few batches per worker, so the loader's speed is barely touched.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

WORKER_BATCHES = 4
"""Batches profiled in each worker: enough to see where a batch's time goes, few enough to cost nothing."""
WORKERS_DIR = "workers"
WORKERS_PROF = "workers.prof"


class WorkerProfiler:
    """Wraps the DataLoader fetchers so that forked workers profile their first batches."""

    def __init__(self, run_dir: Path, batches: int = WORKER_BATCHES) -> None:
        self.folder = run_dir / WORKERS_DIR
        self.batches = batches
        self._parent = os.getpid()
        self._profile: cProfile.Profile | None = None  # in a worker: its own (fork gives it a copy of self)
        self._done = 0

    def install(self) -> Callable[[], None]:
        """Wrap the fetchers (torch must be imported); returns the undo."""
        from torch.utils.data._utils import fetch

        undo = []
        for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
            original = cls.__dict__["fetch"]
            cls.fetch = self._wrap(original)
            undo.append((cls, original))

        def restore() -> None:
            for cls, original in undo:
                cls.fetch = original

        return restore

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        profiler = self

        def fetch(fetcher: Any, index: Any) -> Any:
            if os.getpid() == profiler._parent or profiler._done >= profiler.batches:
                return original(fetcher, index)
            profile = profiler._profile = profiler._profile or cProfile.Profile()
            profile.enable()
            try:
                return original(fetcher, index)
            except BaseException as exc:
                # the worker formats the dataset's error into the user's "Original Traceback": without this frame
                if exc.__traceback__ is not None:
                    exc.__traceback__ = exc.__traceback__.tb_next
                raise
            finally:
                profile.disable()
                profiler._done += 1
                if profiler._done == profiler.batches:
                    profiler._save()

        return fetch

    def _save(self) -> None:
        try:
            self.folder.mkdir(exist_ok=True)
            self._profile.dump_stats(str(self.folder / f"{os.getpid()}.prof"))  # type: ignore[union-attr]
        except OSError:
            pass  # a worker must never fail for gpuscope's sake


def merge_worker_profiles(run_dir: Path) -> tuple[pstats.Stats | None, int]:
    """Merge ``workers/*.prof`` into ``workers.prof`` (and remove the folder); return the stats and how many
    workers there were."""
    folder = run_dir / WORKERS_DIR
    files = sorted(folder.glob("*.prof")) if folder.is_dir() else []
    stats = None
    for file in files:
        try:
            if stats is None:
                stats = pstats.Stats(str(file))
            else:
                stats.add(str(file))
        except (OSError, EOFError, TypeError, ValueError):
            continue  # a worker killed while writing
    if stats is not None:
        stats.dump_stats(str(run_dir / WORKERS_PROF))
    shutil.rmtree(folder, ignore_errors=True)
    return stats, len(files)
