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

from gpuscope.reduce.trace import Kernel, StepSpan, TraceIndex, drop_stub


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
    kernels = index.kernels.get(device, [])
    if not kernels:
        return None
    placed = _place_kernels(index, kernels)
    if placed:
        first_step, last_step = min(placed), max(placed)
        first = placed[first_step]
        start = min(k.start_us for k in first)
        end = max(k.end_us for k in placed[last_step])
        starts = tuple(min(k.start_us for k in placed[s]) for s in sorted(placed))
        return DeviceWindow(device, start, max(end, start), "launches", starts)
    if steps:
        return DeviceWindow(device, steps[0].start_us, steps[-1].end_us, "host steps")
    return DeviceWindow(device, kernels[0].start_us, max(k.end_us for k in kernels), "kernels")


def _place_kernels(index: TraceIndex, kernels: Sequence[Kernel]) -> dict[tuple[float, int], list[Kernel]]:
    """Kernels grouped by the recorded step whose host thread launched them, keyed by (the step's start, its
    number) so that the keys sort in time order. Kernels launched outside every step are left out."""
    starts: dict[object, tuple[list[float], list[StepSpan]]] = {}
    for pid, spans in index.steps.items():
        kept = drop_stub(spans, index.ops.get(spans[-1].thread, []))
        starts[pid] = ([s.start_us for s in kept], kept)
    placed: dict[tuple[float, int], list[Kernel]] = {}
    for k in kernels:
        launch = index.launch_of(k)
        if launch is None or launch[1] not in starts:
            continue
        ts, pid = launch
        begins, spans = starts[pid]
        i = bisect.bisect_right(begins, ts) - 1
        if i >= 0 and ts <= spans[i].end_us:
            placed.setdefault((spans[i].start_us, spans[i].number), []).append(k)
    return placed
