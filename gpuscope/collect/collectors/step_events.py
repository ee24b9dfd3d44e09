"""The step events other collectors follow (``base.StepEvents``), as the steps collector's tracker gives them: step
and phase listeners, profiling windows, the steps counted so far."""

from __future__ import annotations

from collections.abc import Callable

from gpuscope.collect.collectors.steplog import StepTracker


class TrackerEvents:
    """Part of ``base.StepEvents``, read from ``tracker`` (the steps collector adds what needs more than it)."""

    tracker: StepTracker | None

    def add_step_listener(self, listener: Callable[[int], int | None]) -> None:
        """``listener(index)`` as each step begins, in the loop's thread; its time is kept out of the step's. It
        may return how many steps on it next wants to be told (``step_listeners``)."""
        self.tracker.schedule.add(listener)  # type: ignore[union-attr]

    def remove_step_listener(self, listener: Callable[[int], int | None]) -> None:
        self.tracker.schedule.remove(listener)  # type: ignore[union-attr]

    def wake_step_listener(self, listener: Callable[[int], int | None]) -> None:
        self.tracker.schedule.wake(listener)  # type: ignore[union-attr]

    def add_phase_listener(self, listener: Callable[[str], None]) -> None:
        """``listener(phase)`` on each phase change ("other" between phases), on the hot path: microseconds."""
        self.tracker.phase_listeners.append(listener)  # type: ignore[union-attr]

    def window_closed(self) -> None:  # a profiler stopped
        self.tracker.window_closed()  # type: ignore[union-attr]

    def in_window(self) -> bool:  # whether one of gpuscope's profilers is running now
        return self.tracker.in_window  # type: ignore[union-attr]

    def steps_seen(self) -> int:  # steps counted so far
        return self.tracker.log.count  # type: ignore[union-attr]

    def step_evaluated(self, index: int) -> bool:
        """Whether the trained model ran forward in eval mode or without gradients in step ``index`` (ended)."""
        return getattr(self.tracker.log.find(index), "evaluated", False)  # type: ignore[union-attr]
