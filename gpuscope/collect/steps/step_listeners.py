"""Who is told of each step's beginning, and when. Pure Python, tested without torch.

A step listener (a profiler waiting for its window, the steps collector finding the root modules, the practices
collector reading the debug APIs' state) is called with the index of each step as it begins, on the loop's hot path.
Most have nothing to do at most steps, and a call made only to return costs a few microseconds once the step's own
work has evicted gpuscope's code from the CPU's caches (``benchmarks/hot_path.py --cold``). So a listener may return
how many steps on it next wants to be told (None: the next one), or ``QUIET``: not until something ``wake``s it; a
step no listener is due at costs the loop one comparison.
"""

from __future__ import annotations

from collections.abc import Callable

Listener = Callable[[int], "int | None"]
QUIET = 1 << 62
"""What a step listener returns to be told of no step until it is woken (``ListenerSchedule.wake``)."""


class ListenerSchedule:
    """The step listeners, in the order they are told, and the step beginning each is next due at. Beginnings are
    counted here (``boundaries``), never reset: the steps' own count restarts when another kind of marker takes over,
    and a listener's schedule does not."""

    __slots__ = ("listeners", "_leaving", "_due_at", "boundaries", "next_due")

    def __init__(self) -> None:
        self.listeners: list[Listener] = []
        self._leaving: list[Listener] = []  # to drop once the current telling is over
        self._due_at: dict[Listener, int] = {}  # a listener resting: the beginning it is due at
        self.boundaries = 0
        """Step beginnings so far: ``tell`` counts those it tells, the caller those it tells no one of (none is
        due, or the step is provisional)."""
        self.next_due = 0
        """The first beginning any listener is due at (a listener added or woken is due at the next)."""

    def tell(self, index: int) -> None:
        """Call each listener due, with ``index``, and note when each is next due."""
        now, due_at, next_due = self.boundaries, self._due_at, QUIET
        self.next_due = QUIET  # (a listener woken while the others are told lowers it)
        for listener in self.listeners:
            due = due_at.get(listener, now)
            if due <= now:
                due = now + (listener(index) or 1)
                if due > now + 1:
                    due_at[listener] = due
                else:
                    due_at.pop(listener, None)
            next_due = min(next_due, due)
        self.boundaries, self.next_due = now + 1, min(next_due, self.next_due)
        if self._leaving:
            self.listeners = [listener for listener in self.listeners if listener not in self._leaving]
            for listener in self._leaving:
                due_at.pop(listener, None)
            self._leaving.clear()

    def add(self, listener: Listener, first: bool = False) -> None:
        """Tell ``listener`` of every step from the next on (``first``: before the others)."""
        if first:
            self.listeners.insert(0, listener)
        else:
            self.listeners.append(listener)
        self.wake(listener)

    def remove(self, listener: Listener) -> None:
        """Tell ``listener`` of no further step (it may be the one being told now)."""
        self._leaving.append(listener)

    def wake(self, listener: Listener) -> None:
        """Tell ``listener`` of the next step again, however many steps on it asked to be told next."""
        self._due_at.pop(listener, None)
        self.next_due = min(self.next_due, self.boundaries)
