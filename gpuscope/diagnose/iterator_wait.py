"""A loop waiting on an iterator of its own: the Python profile has the steps waiting on a lock (a queue's ``get``)
under an iterator's ``__next__`` outside torch and the stdlib, a thread or process of the script's own handing the
batches over (prefetch_generator's ``BackgroundGenerator``). No DataLoader wait times it; the verdict
(``classify``) and its what-if (``speed``) read it here."""

from __future__ import annotations

from typing import NamedTuple

from gpuscope.diagnose import thresholds as th
from gpuscope.record import FunctionStat, RunRecord

LOCK_WAITS = ("<method 'acquire' of '_thread.lock' objects>", "<method 'acquire' of '_thread.RLock' objects>")
"""How cProfile names a wait on a lock (``queue.Queue.get``, ``threading.Event.wait``)."""


class IteratorWait(NamedTuple):
    share: float
    """Of the Python profile's steps, the time spent waiting on the lock."""
    feeder: FunctionStat
    """The iterator's ``__next__``."""
    steps: str
    """Which steps the profile held: "steps 12-16", or "the whole run"."""


def iterator_wait(record: RunRecord) -> IteratorWait | None:
    """The loop's wait on an iterator of its own, where it is the profile's heaviest function and 20% of its steps
    (``DATA_WAIT_BOUND``) or more; None otherwise."""
    profile = record.python_profile
    profiled_s = profile.total_s - profile.startup_s if profile is not None else 0.0
    if profile is None or not profile.top_own or profiled_s <= 0 or profile.top_own[0].function not in LOCK_WAITS:
        return None
    share = profile.top_own[0].own_s / profiled_s
    feeder = next((f for f in profile.top_cumulative if f.function in ("__next__", "next")
                   and not f.file.startswith(("~", "<", "torch/")) and f.cumulative_s >= th.OPS_COVER_CALLER
                   * profile.top_own[0].own_s), None)
    if feeder is None or share < th.DATA_WAIT_BOUND:
        return None
    window = profile.window
    steps = "the whole run" if profile.whole_run else f"steps {window.first_step}-{window.last_step}"
    return IteratorWait(share, feeder, steps)
