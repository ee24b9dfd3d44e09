"""The device side of step timing: markers (CUDA events) recorded on the current stream at each phase change,
resolved once the device has passed them, never waiting for it, and the device's timeline split by the host phase
that queued each interval. Pure Python over a marker protocol, so it is tested without a GPU."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol



class DeviceEvent(Protocol):
    """What ``DeviceTimeline`` needs of a device marker (``torch.Event`` and ``torch.cuda.Event`` have this shape)."""

    def record(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end: DeviceEvent) -> float: ...  # milliseconds
    def synchronize(self) -> None: ...


@dataclass(slots=True)
class _Mark:
    event: DeviceEvent
    step: int | None  # the step the interval starting here belongs to (None: between steps)
    phase: str  # the host phase that queues the work of the interval starting here


PHASED_HEAD = 32
"""Steps from the first whose every phase change is marked on the device (the profiled windows and the first steady
steps lie among them)..."""
PHASED_EVERY = 8
"""...and after them every 8th step's: the others get one marker, at their end. Each marker is four CUDA calls on
the host, and a step has eight or nine phase changes: marked on every step they cost a short step percents
(docs/gpu.md). The device breakdown is the phased steps'; every step's device time is still measured."""


def phased(step: int) -> bool:
    """Whether step ``step``'s phase changes are marked on the device (``PHASED_HEAD``, ``PHASED_EVERY``)."""
    return step < PHASED_HEAD or step % PHASED_EVERY == 0


class DeviceTimeline:
    """Device-side time per step and phase, from markers queued on the device's stream.

    The interval between two consecutive markers is charged to the step and phase current when the first was
    queued. If the device runs behind the host, a phase whose host time was hidden (the host waited for data
    while the device still worked) gets little device time: that is the truth the breakdown should show. Phase
    changes are marked on some steps only (``phased``): the others' device time is whole, without phases.
    Markers are only ever *queried*; nothing here waits for the device, except ``drain`` at the end.
    """

    MAX_PENDING = 4096
    """Markers waiting for the device beyond this mean the device is not progressing; timing then stops."""

    def __init__(self, make_event: Callable[[], DeviceEvent], can_mark: Callable[[], bool] = lambda: True) -> None:
        self._make_event = make_event
        self._can_mark = can_mark  # e.g. not while a CUDA graph is being captured
        self._pending: deque[_Mark] = deque()
        self._last: _Mark | None = None  # newest resolved marker: the start of the next interval
        self._free: list[DeviceEvent] = []
        self._open: dict[int, dict[str, float]] = {}  # step -> device seconds per phase so far
        self.gave_up = False
        self.marked = 0  # markers recorded on the device (each a record, a capture check, a query, an elapsed time)

    def mark_phase(self, step: int | None, phase: str) -> None:
        """A phase change within ``step``: marked where the step's phases are timed (``phased``)."""
        if step is not None and (step < PHASED_HEAD or not step % PHASED_EVERY):
            self.mark(step, phase)

    def mark(self, step: int | None, phase: str) -> None:
        """Queue a marker: from here on the device's work belongs to ``step`` and ``phase``."""
        if self.gave_up:
            return
        if len(self._pending) >= self.MAX_PENDING:
            self._give_up()
            return
        try:
            if not self._can_mark():
                return
            event = self._free.pop() if self._free else self._make_event()
            event.record()
        except Exception:  # device timing is a bonus: it must never break the user's step
            self._give_up()
            return
        self.marked += 1
        self._pending.append(_Mark(event, step, phase))

    def poll(self) -> list[tuple[int, dict[str, float]]]:
        """Resolve the markers the device has passed; return the steps whose device time is now complete, each with
        its device seconds by phase (one phase, the one current at its start, where its phases were not marked)."""
        done: list[tuple[int, dict[str, float]]] = []
        pending = self._pending
        try:
            while pending and pending[0].event.query():
                self._advance(pending.popleft(), done)
        except Exception:
            self._give_up()
        return done

    def _give_up(self) -> None:
        self.gave_up = True
        self._pending.clear()
        self._open.clear()
        self._last = None

    def drain(self) -> list[tuple[int, dict[str, float]]]:
        """Wait for every queued marker (end of run only) and return the steps completed."""
        if self._pending:
            self._pending[-1].event.synchronize()
        done = self.poll()
        if self._last is not None and self._last.step is not None:
            # The last open step never reached its end marker: it is incomplete, not finished.
            self._open.pop(self._last.step, None)
        return done

    def reset(self) -> None:
        """Forget all markers and partial steps (the step numbering restarted)."""
        self._pending.clear()
        self._open.clear()
        self._last = None

    def _advance(self, mark: _Mark, done: list[tuple[int, dict[str, float]]]) -> None:
        last = self._last
        if last is not None:
            if last.step is not None:
                seconds = last.event.elapsed_time(mark.event) / 1000.0
                phases = self._open.setdefault(last.step, {})
                phases[last.phase] = phases.get(last.phase, 0.0) + seconds
                if mark.step != last.step:
                    done.append((last.step, self._open.pop(last.step)))
            self._free.append(last.event)
        self._last = mark


def timing_event(torch: Any) -> Callable[[], Any]:
    """A maker of CUDA timing events. ``torch.Event`` (torch 2.4+) records on the current stream in C++;
    ``torch.cuda.Event.record()`` builds a Python ``Stream`` for it each time, switching devices, at a few times
    the cost (benchmarks/cuda_calls.py)."""
    if hasattr(torch, "Event"):
        return lambda: torch.Event(device="cuda", enable_timing=True)
    return lambda: torch.cuda.Event(enable_timing=True)
