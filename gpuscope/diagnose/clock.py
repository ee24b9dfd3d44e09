"""Which clock a step is read on, and how fast the host itself goes.

On CUDA the host queues kernels ahead of the GPU and blocks only when the launch queue fills or something
synchronises: its step times say how fast it launches, the device's timeline how long a step takes. Records are
summarised on the device's clock where the steps were timed there (``Steps.clock``, ``steady.step_clock``); records
written before that (and traces read by ``gpuscope analyze``) are moved onto it here, from their step sample.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from gpuscope.diagnose import thresholds as th
from gpuscope.reduce.steady import outliers, step_figures
from gpuscope.record import RunRecord, Steps

COUNTED = ("steady", "outlier")
"""Sampled steps whose status the clock may change: the ones past warm-up, profiling and evaluation passes."""


def step_times(steps: Steps) -> list[float]:
    """Each sampled step's time on the steps' clock: its device time where resolved, else its host time."""
    sample = steps.sample
    if steps.clock != "device":
        return list(sample.wall_s)
    device = sample.device_wall_s
    return [device[k] if k < len(device) and device[k] is not None else t for k, t in enumerate(sample.wall_s)]


def steady_times(steps: Steps) -> dict[int, float]:
    """The sampled steady steps' times on the steps' clock, by step index (every sampled step where the sample has
    no status)."""
    sample = steps.sample
    status = sample.status or ("steady",) * len(sample.index)
    return {i: t for i, t, kind in zip(sample.index, step_times(steps), status) if t > 0 and kind == "steady"}


def on_device_clock(record: RunRecord) -> RunRecord:
    """``record`` with its step figures read on the device's clock, where it is a CUDA run summarised on the host's
    whose step sample has device times for at least half the steps past warm-up (``steady.step_clock``'s rule): the
    sampled steady and outlier steps split again into steady and outlier by their device times, and the figures
    taken from the steady ones. Any other record is returned as it is."""
    steps = record.steps
    sample = steps.sample
    if record.device != "cuda" or steps.clock == "device" or not steps.count or not sample.device_wall_s:
        return record
    status = sample.status or ("steady",) * len(sample.index)
    counted = [k for k, kind in enumerate(status) if kind in COUNTED]
    timed = sum(k < len(sample.device_wall_s) and sample.device_wall_s[k] is not None for k in counted)
    if not timed or 2 * timed < len(counted):
        return record
    times = step_times(dataclasses.replace(steps, clock="device"))
    weights = [1.0] * len(times)
    late = outliers(times, weights, counted)
    steady = [k for k in counted if k not in late]
    was_steady = sum(kind == "steady" for kind in status)
    count = round(steps.count * len(steady) / was_steady) if was_steady else len(steady)
    new_status = tuple("outlier" if k in late else "steady" if k in counted else kind for k, kind in enumerate(status))
    figures = step_figures([times[k] for k in steady], [1.0] * len(steady))
    moved = dataclasses.replace(
        steps, **figures, count=count, outliers=max(0, steps.outliers + steps.count - count), clock="device",
        host_median_s=steps.median_s, sample=dataclasses.replace(sample, status=new_status))
    return dataclasses.replace(record, steps=moved)


@dataclass(frozen=True, slots=True)
class HostPace:
    """How long the host takes to queue a step's work when nothing holds it back, seconds, and how that is known."""

    seconds: float
    how: str
    """``ran ahead``: the steady steps the host finished well before the GPU did (their median, or with fewer
    than ``HOST_AHEAD_MIN_STEPS`` of them the fastest); ``less its syncs``: the host's median step less the time it
    waited in syncs in the profiled steps; ``kept pace``: the host's median step, where it never ran ahead (it
    bounds the step, or it waits every step: both are no faster than it)."""
    steps: int = 0
    """The steps it rests on (``ran ahead``)."""


def host_pace(record: RunRecord) -> HostPace | None:
    """How fast the host queues a step of a CUDA run whose steps are on the device's clock: the steady steps it
    finished ``HOST_AHEAD`` of their device time or sooner (right after a sync it runs ahead until the launch queue
    fills) say it outright, ``HOST_AHEAD_MIN_STEPS`` of them or more by their median; with fewer, the fastest of
    those, of its median step less the time it waited in syncs where the profiled steps had any, and of its median
    step. None for a CPU run or one without device times."""
    steps = record.steps
    if record.device != "cuda" or steps.clock != "device" or not steps.count:
        return None
    sample = steps.sample
    status = sample.status or ("steady",) * len(sample.index)
    ahead = [host for host, device, kind in zip(sample.wall_s, sample.device_wall_s, status)
             if kind == "steady" and device is not None and 0 < host <= th.HOST_AHEAD * device]
    if len(ahead) >= th.HOST_AHEAD_MIN_STEPS:
        return HostPace(statistics.median(ahead), "ran ahead", len(ahead))
    host = steps.host_median_s
    if not host:
        return None
    found = [HostPace(host, "kept pace")]
    if ahead:
        found.append(HostPace(min(ahead), "ran ahead", len(ahead)))
    kernels = record.op_profile.kernels if record.op_profile is not None else None
    profiled = record.op_profile.steps if record.op_profile is not None else 0
    if kernels is not None and kernels.sync_calls and profiled and 0 < kernels.sync_wait_s / profiled < host:
        found.append(HostPace(host - kernels.sync_wait_s / profiled, "less its syncs"))
    return min(found, key=lambda pace: pace.seconds)
