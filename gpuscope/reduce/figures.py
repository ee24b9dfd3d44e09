"""Every figure a torch.profiler trace gives about the device and communication, in one pure function of its
events: ``trace_figures``. The collector calls it on the whole trace before capping the file (capping is about the
file on disk, never about the figures), and ``gpuscope analyze`` calls it on a user's trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuscope.reduce.comms import trace_communication
from gpuscope.reduce.kernels import device_timeline
from gpuscope.reduce.phases import calls_by_phase
from gpuscope.reduce.trace import StepSpan, TraceIndex, index_trace, recorded_steps
from gpuscope.reduce.windows import DeviceWindow, device_window
from gpuscope.record import Communication, KernelTimeline


@dataclass(frozen=True, slots=True)
class TraceFigures:
    """What ``trace_figures`` finds: the recorded steps, the kernel timeline of the main device and of each one,
    communication, and plain-language notes on how they were measured."""

    steps: tuple[StepSpan, ...]
    kernels: KernelTimeline | None
    """The device the run mainly used: the most kernel time in its window."""
    devices: tuple[KernelTimeline, ...]
    communication: Communication | None
    windows: tuple[DeviceWindow, ...] = ()
    notes: tuple[str, ...] = ()
    phase_calls: dict[str, dict[str, int]] = field(default_factory=dict)
    """In a trace with collectives (a rank's): each op's calls on the training thread by phase (``calls_by_phase``),
    to set the ranks side by side."""


def trace_figures(events: Sequence[Mapping[str, Any]], index: TraceIndex | None = None) -> TraceFigures:
    """The figures of a trace's ``traceEvents`` over its recorded steps (``index``: the events already indexed)."""
    index = index if index is not None else index_trace(events)
    steps = tuple(recorded_steps(index))
    count = max(1, len(steps))
    windows = [w for w in (device_window(index, d, steps) for d in sorted(index.kernels)) if w is not None]
    timelines = [t for t in (device_timeline(index, index.kernels[w.device], count, (w.start_us, w.end_us),
                                             w.length_us, device=w.device, basis=w.basis) for w in windows)
                 if t is not None]
    main = max(timelines, key=lambda t: (t.busy_fraction * t.window_s, -(t.device or 0))) if timelines else None
    comm = trace_communication(index, steps, count, {w.device: w for w in windows},
                               main.device if main is not None else None)
    return TraceFigures(steps, main, tuple(timelines), comm, tuple(windows), _notes(main, timelines, windows),
                        calls_by_phase(index, steps) if comm is not None else {})


def _notes(main: KernelTimeline | None, timelines: Sequence[KernelTimeline],
           windows: Sequence[DeviceWindow]) -> tuple[str, ...]:
    notes = []
    if main is not None and len(timelines) > 1:
        others = ", ".join(f"device {t.device} {t.busy_fraction:.0%}" for t in timelines if t is not main)
        notes.append(f"this process ran kernels on {len(timelines)} devices: the kernel figures are device "
                     f"{main.device}'s (the most kernel time; busy {main.busy_fraction:.0%}); {others} busy")
    basis = {w.basis for w in windows}
    if "host steps" in basis:
        notes.append("the trace does not link kernels to the host calls that launched them: the device window is "
                     "the host's steps")
    if "kernels" in basis:
        notes.append("the trace has no ProfilerStep ranges: the device window is the kernels' own span")
    return tuple(notes)
