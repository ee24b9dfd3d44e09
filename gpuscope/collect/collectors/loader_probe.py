"""How fast the slowest loader could deliver batches with more workers: measured, before the user changes a line.

After the script has ended and every other collector has stopped (no hook, profiler or step window sees it), the
dataset and collate function of the DataLoader the steps waited on longest are loaded again through
``torch.utils.data.DataLoader`` itself, with 0, 1, 2, 4, ... worker processes up to the machine's cores (and, on a
CUDA run, with and without ``pin_memory``), each configuration in isolation for its share of a fixed time budget.
When the run timed its batches in the main process (no workers), the probe does not time that again, and it
loads smaller batches of the same items (about ``PROBE_BATCH_S`` each), rates scaled back to the run's batch size:
the user waits for the probe, and more rounds of small batches say more than one round of large ones. Per
configuration: the batches delivered per second once the workers are up. Workers build batches in lockstep
(batch i goes to worker i mod N), so batches arrive in rounds of N; rates are taken over whole rounds after the
first (which includes the workers' start-up), else the first round's burst would count as speed.

Bounded: the budget is split between the configurations and never exceeded by more than one worker shutdown (and
the start of torch's shared-memory manager, where the file_system strategy is timed: ``SHM_MANAGER_MAX_S``);
waits on workers use the DataLoader's own ``timeout``, and workers are killed, not drained, when a configuration
ends. The probe stops early once a worker count keeps up with the rate the training step consumes batches.

The probe leaves no trace: the global RNG states (Python's, NumPy's, torch's CPU generator) are restored, its own
samplers and worker seeds use their own generators, and whatever the dataset prints is swallowed. A dataset that
cannot be pickled for spawn/forkserver workers, an iterable dataset, or a dataset that raises is a note, never a
failure of the run.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import pickle
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpuscope.collect.framework.base import CollectorResult, PostRunProbe, register
from gpuscope.collect.framework.probing import DatasetError, first_line, unseen, user_torch_threads, wait_under_the_bar
from gpuscope.collect.loader_timing import time_config, time_sampler
from gpuscope.record import CollectorStatus, LoaderProbe, LoaderRate

if TYPE_CHECKING:
    from gpuscope.collect.captures import PostRunFacts
    from gpuscope.collect.framework.options import CollectOptions
    from gpuscope.collect.framework.schedule import Plan

BUDGET_S = 2.0
"""The whole probe's time: the run is over and the user is waiting. Each configuration gets an equal share."""
PROBE_BATCH_S = 0.2
"""A probe batch's time, where the run measured its own batches in the main process: fewer items than the run's
batch (never more), so that a configuration's rounds fit in its share of the budget; not much fewer, as each batch
carries its own costs (collation, the hand-over through shared memory, the main process's receipt, on the cores the
workers use), which the scaling to the run's batch size multiplies: batches of one or two items made workers look a
fifth to a third slower than the run then found them (docs/measurements.md)."""
MIN_ROUNDS = 2
"""...but not before this many rounds when time allows: one round is one lockstep burst, a noisy measurement."""
MAX_WORKERS = 32
"""Worker counts tried stop here even on a larger machine."""
PROBE_BATCHES = 1 << 20
"""Batches' worth of items each configuration may draw (drawn lazily): more than any loads within its slot (a
million batches in a fraction of a second would be a microsecond each), however small or large the dataset is."""
ON_CPU_PIN = "not applicable: a CPU-only run (pin_memory only speeds up copies to a GPU)"


@register
class LoaderProbeCollector(PostRunProbe):
    """Times the slowest loader's batches with several worker counts after the run.

    Runs when ``forced`` (``--probe-loader``), or when the steps waited for data a notable share of their time
    (``facts.data_wait_notable``, decided by the stage from the reduced steps).
    """

    name: ClassVar[str] = "loader-probe"
    field: ClassVar[str | None] = "loader_probe"
    budget_s: ClassVar[float] = BUDGET_S
    doing: ClassVar[str] = "timing the DataLoader with more worker processes"
    runs_user_code: ClassVar[bool] = True

    def __init__(self, forced: bool = False, budget_s: float = BUDGET_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._forced = forced
        self._budget_s = budget_s
        self._clock = clock

    @classmethod
    def create(cls, options: CollectOptions, plan: Plan) -> LoaderProbeCollector:
        probe = cls(forced=options.probe_loader)
        probe.enabled = options.probes
        return probe

    def run(self, run_dir: Path, facts: PostRunFacts) -> CollectorResult:
        loader = facts.loader
        torch = sys.modules.get("torch")
        if loader is None or torch is None:
            return CollectorResult(CollectorStatus("unavailable", "no DataLoader was iterated"))
        if not self._forced and not facts.data_wait_notable:
            under = wait_under_the_bar(facts.data_wait, facts.notable_share)
            return CollectorResult(CollectorStatus("unavailable", f"{under}: not probed (--probe-loader forces it)"))
        info: dict[str, Any] = loader["info"]  # type: ignore[assignment]
        if info.get("iterable"):
            return CollectorResult(CollectorStatus("unavailable", (
                f"the {info['dataset']} loader iterates an IterableDataset: with N workers each one iterates the "
                "whole stream unless the dataset splits it itself (torch.utils.data.get_worker_info()), so worker "
                "counts were not timed")))
        batches, wait_s = loader["batches"], loader["wait_s"]
        estimate = wait_s / batches if info.get("num_workers") == 0 and batches else None  # type: ignore[operator]
        try:
            with unseen():
                began = self._clock()
                sampler = time_sampler(loader.get("index_sampler"), self._clock)
                budget_s = max(0.1 * self._budget_s, self._budget_s - (self._clock() - began))
                probe = probe_loader(
                    torch, loader["dataset"], batch_size=info.get("batch_size"), collate_fn=loader.get("collate_fn"),
                    drop_last=bool(loader.get("drop_last", False)), worker_init_fn=loader.get("worker_init_fn"),
                    fetches_batches=bool(loader.get("fetch")),
                    start_method=info.get("start_method"), cores=_cores(),
                    consume_batches_per_s=facts.consume_batches_per_s,
                    keeps_up_margin=facts.keeps_up_margin, budget_s=budget_s, cuda=facts.cuda,
                    main_batch_s=estimate, main_batch_batches=batches, clock=self._clock)
        except DatasetError as exc:
            return CollectorResult(CollectorStatus("unavailable", str(exc)))
        if sampler is not None:
            probe = dataclasses.replace(probe, sampler_s=sampler[0], sampler=sampler[1])
        return CollectorResult(CollectorStatus("ok"), probe)


def worker_counts(cores: int, limit: int = MAX_WORKERS) -> list[int]:
    """0, 1, 2, 4, ... up to ``cores`` (``cores`` itself included), at most ``limit``."""
    top = max(1, min(cores, limit))
    counts, n = [0, 1], 2
    while n < top:
        counts.append(n)
        n *= 2
    if top not in counts:
        counts.append(top)
    return counts


def probe_loader(torch: Any, dataset: Any, *, batch_size: int | None, collate_fn: Any = None, drop_last: bool = False,
                 worker_init_fn: Any = None, fetches_batches: bool = False, start_method: str | None = None,
                 cores: int = 1, consume_batches_per_s: float | None = None, keeps_up_margin: float = 0.1,
                 budget_s: float = BUDGET_S, cuda: bool = False, main_batch_s: float | None = None,
                 main_batch_batches: int = 0, clock: Callable[[], float] = time.perf_counter) -> LoaderProbe:
    """Time batches delivered per second by ``DataLoader(dataset, ...)`` for each worker count, within
    ``budget_s`` in all, stopping at the first count delivering ``keeps_up_margin`` more than
    ``consume_batches_per_s``. ``main_batch_s``: a batch's time in the main process as measured in the run over
    ``main_batch_batches`` batches, if known: then it is the 0-worker rate, and the probe's batches are smaller
    (``probe_batch_size``). ``fetches_batches``: the dataset fetches whole batches, a list of indices each (the
    run's loader had a sampler of lists and ``batch_size=None``), and is given them so.

    Raises DatasetError when the dataset raises in the main process.
    """
    started = clock()
    deadline = started + budget_s
    notes: list[str] = []
    method = start_method or multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_start_method()
    counts = _worker_counts_for(method, cores, (dataset, collate_fn, worker_init_fn), notes)
    pins = (False, True) if cuda else (False,)
    items = probe_batch_size(batch_size, main_batch_s)
    scale = items / batch_size if items and batch_size else 1.0  # a probe batch's share of one of the run's
    if scale < 1:
        notes.append(f"timed with batches of {items} of the run's {batch_size} items ({main_batch_s:.2f} s a batch "
                     "in the run); rates are per batch of the run's size")
    configs = affordable_configs(counts, pins, budget_s, main_batch_s, consume_batches_per_s, keeps_up_margin,
                                 notes, probe_batch_s=main_batch_s * scale if main_batch_s else None)
    share_s = budget_s / len(configs)
    source = _Source(dataset, items, collate_fn, drop_last, worker_init_fn, start_method, fetches_batches)
    rates: list[LoaderRate] = []
    threads = user_torch_threads(torch)  # the step's threads, not the probe child's one
    for workers, pin in configs:
        remaining = deadline - clock()
        if remaining <= 0.05 * share_s:
            rates.append(LoaderRate(workers, pin, note="not timed: the probe's time budget was spent"))
            continue
        # time a configuration leaves goes to the next; once a hand-over waited, the file_system timing has a slot
        left = len(configs) - len(rates) + any(_hand_over_waits(r) for r in rates)
        slot = remaining / left
        untimed = _untimed_main_process(pin, main_batch_s, main_batch_batches) if not workers else None
        if untimed is not None:
            rates.append(untimed)
            continue
        rate = _scaled(time_config(source.loader(torch, workers, pin, slot), workers, pin, slot, clock), scale)
        rates.append(rate)
        if (workers and rate.batches_per_s is not None and consume_batches_per_s is not None
                and rate.batches_per_s >= consume_batches_per_s * (1 + keeps_up_margin)):
            break  # this count hides loading: larger ones are not needed to name the smallest
    if len(rates) < len(configs):
        notes.append(f"stopped after {rates[-1].num_workers} workers: they already deliver batches faster than "
                     "the training step consumes them")
    file_system = _file_system_rate(torch, source, rates, deadline, clock, scale)
    return LoaderProbe(
        dataset=type(dataset).__name__, batch_size=batch_size, start_method=method, rates=tuple(rates),
        consume_batches_per_s=consume_batches_per_s, main_threads=threads, budget_s=budget_s,
        probe_batch_size=items, elapsed_s=clock() - started, pin_memory_note="" if cuda else ON_CPU_PIN,
        note="; ".join(notes), file_system=file_system)


RECEIVE_WAITS_S = 0.001
"""A hand-over of built batches (``receive_s``) this long, and over twice the main process's CPU for it, waits on the
workers' Python: the last count is then timed again with the file_system sharing strategy, in a slot of its own from
the first such count on (the budget left is split with it), since a rate timed over its first round only would be
no comparison (a bucketed text loader's 2 workers, measured at 60 batches/s, were set against 109 estimated for the
same with file_system, which its 0.38 s start-up left no time to time)."""
FILE_SYSTEM_MIN_S = 0.2
"""...where this much of the budget is left."""
SHM_MANAGER_MAX_S = 0.5
"""The file_system strategy's first use in a process starts torch's shared-memory manager (``torch_shm_manager``, a
process of its own): 0.25-0.4 s on the project's 2-core machine, which a first DataLoader under it paid before its
first batch, leaving the slot no time for a second round. It is started first, and the slot is extended by its
start-up, up to this much: the one overrun of the budget besides a worker shutdown."""


def _file_system_rate(torch: Any, source: _Source, rates: list[LoaderRate], deadline: float,
                      clock: Callable[[], float], scale: float) -> LoaderRate | None:
    """The last timed worker count again with the ``file_system`` sharing strategy (restored after), where handing
    built batches over waited on the workers (as the last count whose hand-over was timed found: a count's slot may
    end before that timing); None where it did not or the budget has no room for it."""
    timed = [r for r in rates if r.num_workers and r.batches_per_s and not r.pin_memory]
    heard = [r for r in timed if r.receive_s is not None]
    if not heard or not _hand_over_waits(heard[-1]) or deadline - clock() < FILE_SYSTEM_MIN_S:
        return None
    last = timed[-1]
    sharing = torch.multiprocessing
    before = sharing.get_sharing_strategy()
    try:
        sharing.set_sharing_strategy("file_system")
        started = clock()
        start_shm_manager(torch)
        slot = deadline - clock() + min(clock() - started, SHM_MANAGER_MAX_S)
        if slot <= 0:  # the manager's start took the rest of the budget: nothing left to time
            return None
        rate = time_config(source.loader(torch, last.num_workers, False, slot), last.num_workers, False, slot, clock)
    finally:
        sharing.set_sharing_strategy(before)
    return _scaled(rate, scale)


def start_shm_manager(torch: Any) -> None:
    """Start torch's shared-memory manager (under the file_system strategy: once a process) by sharing one number."""
    torch.zeros(1).share_memory_()


def _hand_over_waits(rate: LoaderRate) -> bool:
    """Whether receiving a batch ``rate``'s workers had built waited on them (``RECEIVE_WAITS_S``)."""
    return rate.receive_s is not None and rate.receive_s >= max(RECEIVE_WAITS_S, 2 * (rate.handover_s or 0.0))


@dataclass(frozen=True, slots=True)
class _Source:
    """What every configuration loads: the user's dataset, collate function and worker set-up, in batches of
    ``items``."""

    dataset: Any
    items: int | None
    collate_fn: Any
    drop_last: bool
    worker_init_fn: Any
    start_method: str | None
    fetches_batches: bool = False
    """The dataset is given a list of ``items`` indices a fetch (``batch_size=None``), as the run's loader did."""

    def loader(self, torch: Any, workers: int, pin: bool, timeout_s: float) -> Any:
        """A ``DataLoader`` of this source with ``workers`` workers; a wait on them ends after ``timeout_s``."""
        from torch.utils.data import DataLoader, SequentialSampler

        try:
            length = len(self.dataset)
        except TypeError:
            length = None
        sampler = ProbeSampler(length, self.items) if length else SequentialSampler(self.dataset)
        kwargs: dict[str, Any] = {"batch_size": self.items, "sampler": sampler, "drop_last": self.drop_last,
                                  "num_workers": workers, "pin_memory": pin, "generator": torch.Generator()}
        if self.fetches_batches and length and self.items:
            kwargs.update(batch_size=None, sampler=ProbeBatches(length, self.items), drop_last=False)
        if self.collate_fn is not None:
            kwargs["collate_fn"] = self.collate_fn
        if workers:
            kwargs.update(worker_init_fn=self.worker_init_fn, multiprocessing_context=self.start_method,
                          timeout=max(timeout_s, 0.01))
        return DataLoader(self.dataset, **kwargs)


SLOW_BATCH_CONFIG = 3.5
"""A worker configuration's time, in batches of the run's own batch time: the workers' start-up and first round,
and ``MIN_ROUNDS`` rounds after it."""


def affordable_configs(counts: list[int], pins: tuple[bool, ...], budget_s: float, main_batch_s: float | None,
                       consume_batches_per_s: float | None, margin: float, notes: list[str],
                       probe_batch_s: float | None = None) -> list[tuple[int, bool]]:
    """The (workers, pin_memory) configurations to time: all of them, unless the probe's batches (``probe_batch_s``
    each, by default the run's ``main_batch_s``) are so slow that the budget cannot give each worker count its
    rounds (many cores, batches of one slow item). Then the count that would keep up (``consume`` x ``margin`` x
    the run's batch time, batches built in parallel) or the largest is timed first, then fewer, as many as the
    budget holds; pin_memory (CUDA) on that count only."""
    configs = [(n, pin) for n in counts for pin in pins]
    workers = [n for n in counts if n > 0]
    config_batch_s = probe_batch_s or main_batch_s
    affordable = max(1, int(budget_s // (SLOW_BATCH_CONFIG * config_batch_s))) if config_batch_s else len(configs)
    if not workers or len([c for c in configs if c[0] > 0]) <= affordable:
        return configs
    needed = workers[-1]
    if consume_batches_per_s and main_batch_s:
        needed = math.ceil(consume_batches_per_s * (1 + margin) * main_batch_s)
    target = next((n for n in workers if n >= needed), workers[-1])
    chosen = [(target, pin) for pin in pins] + [(n, False) for n in reversed(workers) if n < target]
    chosen = chosen[:affordable]
    notes.append(f"timed {', '.join(str(n) for n in sorted({n for n, _ in chosen}))} workers only: a batch took "
                 f"{main_batch_s:.2f} s in the run ({config_batch_s:.2f} s a batch of the probe's), and the "
                 f"{budget_s:.0f} s budget holds about {affordable} configurations; {target} workers would keep "
                 "up or are the most the cores allow")
    return sorted([c for c in configs if c[0] == 0] + chosen)


def probe_batch_size(batch_size: int | None, main_batch_s: float | None) -> int | None:
    """Items per batch the probe loads: the run's batch size, or fewer where the run measured a batch (in the main
    process) taking longer than ``PROBE_BATCH_S``: about that long, at least one item."""
    if not batch_size or not main_batch_s or main_batch_s <= PROBE_BATCH_S:
        return batch_size
    return max(1, min(batch_size, round(batch_size * PROBE_BATCH_S / main_batch_s)))


def _scaled(rate: LoaderRate, scale: float) -> LoaderRate:
    """A rate timed in probe batches, per batch of the run's size (``scale``: a probe batch's share of one); the
    hand-over too, as if it grew with the batch (an upper bound: part of it is per batch, whatever its size)."""
    if scale == 1 or rate.batches_per_s is None:
        return rate
    handover = rate.handover_s / scale if rate.handover_s is not None else None
    return dataclasses.replace(rate, batches_per_s=rate.batches_per_s * scale, handover_s=handover)


def _untimed_main_process(pin: bool, batch_s: float | None, batches: int) -> LoaderRate | None:
    """The 0-worker configuration, not timed again where the run measured its batches in the main process: the rate
    over all of them (timing it again would say the same, less surely). None: it is timed."""
    if batch_s is None or not batches:
        return None
    return LoaderRate(0, pin, 1 / batch_s if batch_s > 0 else None, batches, note=(
        f"not timed again: {batch_s * 1e3:.0f} ms a batch in the main process during the run, over {batches} "
        "batches"))


class ProbeSampler:
    """The items the probe loads: ``batches`` batches' worth, drawn at random (with replacement) from
    ``range(length)`` one at a time. Nothing of ``length`` is ever materialised (a streaming or synthetic dataset
    may say its length is 10^9), and a dataset of a batch or two does not run out before it is timed."""

    def __init__(self, length: int, batch_size: int | None, batches: int = PROBE_BATCHES) -> None:
        self.length = length
        self.count = max(1, batch_size or 1) * batches

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[int]:
        rng = random.Random(0)  # its own generator: the global state is not touched
        return (rng.randrange(self.length) for _ in range(self.count))


class ProbeBatches(ProbeSampler):
    """``ProbeSampler``'s items as lists of ``batch_size`` indices, for a dataset that fetches whole batches."""

    def __init__(self, length: int, batch_size: int, batches: int = PROBE_BATCHES) -> None:
        super().__init__(length, batch_size, batches)
        self.batch_size = batch_size

    def __len__(self) -> int:
        return self.count // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:  # type: ignore[override]
        items = super().__iter__()
        return ([next(items) for _ in range(self.batch_size)] for _ in range(len(self)))


def _worker_counts_for(method: str, cores: int, pickled: tuple[Any, ...], notes: list[str]) -> list[int]:
    """The worker counts to time: only 0 when spawn or forkserver workers could not be sent what they need."""
    if method in ("spawn", "forkserver"):
        try:
            pickle.dumps(pickled)
        except Exception as exc:
            notes.append(f"the dataset cannot be pickled, as {method} workers need it to be "
                         f"({type(exc).__name__}: {first_line(exc)}): only the main process (0 workers) was timed")
            return [0]
    return worker_counts(cores)


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
