"""Where the recorded steps lie on each device: the device window.

The host queues work ahead of the GPU, so the GPU may still be running step N's kernels while the host is in step
N+2, or after its last step has ended. Counting the kernels that run within the host's steps, or dividing the
kernels of the steps by the host's time, both misstate how busy the device was. The *device window* of the
recorded steps is instead: from the start of the first kernel launched (queued by the host) during the first
recorded step, to the end of the last kernel launched during the last recorded step. Launches are matched to
kernels through their correlation id (runtime/driver call, or the ``ac2g`` flow arrow). Each device has its own
window; a process's steps are those of the pid that launched the kernels (a merged trace may hold several).

Fallbacks, named in ``DeviceWindow.basis``: without any launch link inside the steps, the host's steps themselves
(``host steps``); without steps, the kernels' own span (``kernels``).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from gpuscope.reduce.columns import Kernels
from gpuscope.reduce.trace import StepSpan, TraceIndex, drop_stub


@dataclass(frozen=True, slots=True)
class DeviceWindow:
    """The span of the recorded steps on one device, in trace microseconds, and how it was found."""

    device: int
    start_us: float
    end_us: float
    basis: str
    """``launches``, ``host steps`` or ``kernels`` (see the module's docstring)."""
    step_starts_us: tuple[float, ...] = ()
    """Where each recorded step's first launched kernel started on the device (``launches`` basis only)."""

    @property
    def length_us(self) -> float:
        return self.end_us - self.start_us


def device_window(index: TraceIndex, device: int, steps: Sequence[StepSpan]) -> DeviceWindow | None:
    """The device window of ``device``'s kernels; ``steps`` are the recorded steps used when no launch link
    exists. None when the device ran no kernel."""
    kernels = index.kernels.get(device)
    if not kernels:
        return None
    placed = _place_kernels(index, kernels)
    if placed:
        first_step, last_step = min(placed), max(placed)
        start = placed[first_step][0]
        end = placed[last_step][1]
        starts = tuple(placed[s][0] for s in sorted(placed))
        return DeviceWindow(device, start, max(end, start), "launches", starts)
    if steps:
        return DeviceWindow(device, steps[0].start_us, steps[-1].end_us, "host steps")
    return DeviceWindow(device, kernels.start_us[0], max(kernels.end_us), "kernels")


def _place_kernels(index: TraceIndex, kernels: Kernels) -> dict[tuple[float, int], list[float]]:
    """The recorded steps whose host thread launched some of ``kernels``, keyed by (the step's start, its number)
    so that the keys sort in time order: the first start and the last end of the kernels each launched (as ``min``
    and ``max`` of them in start order would find). Kernels launched outside every step are left out."""
    starts: dict[object, tuple[list[float], list[StepSpan]]] = {}
    for pid, spans in index.steps.items():
        kept = drop_stub(spans, index.ops.get(spans[-1].thread, []))
        starts[pid] = ([s.start_us for s in kept], kept)
    by_pid = [starts.get(pid) for pid in kernels.pids]
    placed: dict[tuple[float, int], list[float]] = {}
    for start, end, ts, pid in zip(kernels.start_us, kernels.end_us, kernels.launch_us, kernels.launch_pid):
        if pid < 0 or (steps := by_pid[pid]) is None:
            continue
        begins, spans = steps
        i = bisect.bisect_right(begins, ts) - 1
        if i >= 0 and ts <= spans[i].end_us:
            key = (spans[i].start_us, spans[i].number)
            bounds = placed.get(key)
            if bounds is None:
                placed[key] = [start, end]
            else:
                if start < bounds[0]:
                    bounds[0] = start
                if end > bounds[1]:
                    bounds[1] = end
    return placed
