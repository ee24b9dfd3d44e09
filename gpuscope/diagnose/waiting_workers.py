"""More DataLoader workers than cores, for workers that are mostly blocked (on files, the network): whether the
run's measured worker time says so, and the step they would give."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import batches_per_step, median_compute_s, slowest_loader, training_batches
from gpuscope.record import RunRecord


@dataclass(frozen=True, slots=True)
class WaitingWorkers:
    """A loader with as many workers as cores whose workers were mostly blocked (files, the network): more workers
    than cores, and the step they would give (``waiting_workers``). ``needed`` keep up; ``fill`` the cores make room
    for, at the CPU share measured (``on_cpu``; ``busy`` adds their time waiting for a core): on a CPU run as many as
    bring the step down to ``spread_s``, else as many as fill the ``free`` cores the step leaves."""

    workers: int
    needed: int
    fill: int
    free: int
    busy: float
    on_cpu: float
    batch_s: float
    compute_s: float
    spread_s: float | None
    """On a CPU run, a step's CPU work (the workers' CPU share of ``batch_s``, the compute on torch's threads)
    over the cores, which bounds the step (else None)."""
    step_s: float
    batches_per_step: float


def waiting_workers(record: RunRecord) -> WaitingWorkers | None:
    """Where the slowest loader has as many workers as the cores and the steps still wait, and its workers (the run's
    only child processes but multiprocessing's helpers, watched long enough) were on a CPU or waiting for one under
    ``WORKERS_MOSTLY_WAITING`` of their time: N = ceil(T_b / compute) keep up, T_b = median step x workers (each
    builds one of the batches the steps take in turn), at most ``fill``: on a CPU run ceil(T_b / spread_s), past which
    more workers cannot shorten the step (a step's CPU work, theirs and the compute's, over the cores); with no such
    bound (a GPU run) (cores - 1) / their CPU share. The step is max(compute, T_b / N, ``spread_s``): an estimate, at
    best. (A cap of (cores - 1) / CPU share on a CPU run too advised 3 spawn workers for a Lightning script whose
    workers were on a CPU 27% of their time: 3 gave a mean step of 11.8 ms, 5 gave 7.1 ms, 6 gave 5.9.) None
    otherwise, and where the loader probe timed as many workers or fewer delivering batches faster than the step
    consumes them (``LOADER_KEEPS_UP_MARGIN``): workers that far ahead idle with their batches built, which the
    kernel counts as blocked too, and the wait is not their building (an in-memory TensorDataset with 2 workers on 2
    cores, 5% of its step waiting: one worker timed at 533 batches/s for the 20.6 a step consumed, and 3 workers
    were advised for 4%)."""
    median, cores, memory = record.steps.median_s, record.meta.cpu_count or 1, record.host_memory
    loader = slowest_loader(record)
    if (loader is None or not median or not record.steps.count or loader.num_workers < cores or memory is None
            or record.breakdown.data_wait < th.DATA_WAIT_NOTABLE or memory.workers_watched_s < th.WORKERS_WATCHED_MIN_S
            or memory.max_workers - memory.max_helpers != loader.num_workers):
        return None
    on_cpu = memory.workers_cpu_s / memory.workers_watched_s
    busy = on_cpu + memory.workers_runnable_s / memory.workers_watched_s
    if busy >= th.WORKERS_MOSTLY_WAITING or _ahead(record, loader.num_workers):
        return None
    compute_s, batch_s = median_compute_s(record), median * loader.num_workers
    needed = max(loader.num_workers + 1, math.ceil(batch_s / compute_s))
    free = max(1, cores - 1)
    threads = min(record.meta.torch_threads or 1, cores)
    spread = (on_cpu * batch_s + compute_s * threads) / cores if record.device == "cpu" else None
    # as many as the cores make room for: on a CPU run, as many as bring the step down to its CPU work over the
    # cores (``spread``); else as many, that busy, as fill the cores the step leaves
    fill = math.ceil(batch_s / max(compute_s, spread)) if spread else math.floor(free / max(on_cpu, 0.01))
    workers = max(loader.num_workers + 1, min(needed, fill))
    step_s = max(compute_s, batch_s / workers, spread or 0.0)
    return WaitingWorkers(workers, needed, fill, free, busy, on_cpu, batch_s, compute_s, spread, step_s,
                          batches_per_step(training_batches(loader), record.steps.total))


def _ahead(record: RunRecord, workers: int) -> bool:
    """Whether the loader probe timed ``workers`` or fewer (one at least) delivering batches faster than the step
    consumes them."""
    probe = record.loader_probe
    if probe is None or not probe.consume_batches_per_s:
        return False
    needed = probe.consume_batches_per_s * (1 + th.LOADER_KEEPS_UP_MARGIN)
    return any(0 < r.num_workers <= workers and (r.batches_per_s or 0.0) >= needed for r in probe.rates)
