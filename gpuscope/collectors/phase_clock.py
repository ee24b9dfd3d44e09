"""Host time charged to the step's phases. Pure Python (no torch), tested without a GPU."""

from __future__ import annotations

from gpuscope.captures import TIMED_PHASES

OTHER = "other"


class PhaseClock:
    """Exclusive host time per phase: time is charged to the innermost open phase only. An open ``OTHER`` frame
    charges no phase (its time is the step's "other", what the timed phases leave of the wall time)."""

    __slots__ = ("_stack", "_last", "totals")

    def __init__(self, now: float) -> None:
        self._stack: list[list] = []  # [phase, depth] frames; re-entering the top phase only deepens it
        self._last = now
        self.totals = dict.fromkeys(TIMED_PHASES, 0.0)

    @property
    def current(self) -> str:
        """The phase time is being charged to now."""
        return self._stack[-1][0] if self._stack else OTHER

    def enter(self, phase: str, now: float) -> bool:
        """Open ``phase``; True when the phase being charged changed."""
        stack = self._stack
        if stack:
            top = stack[-1]
            if top[0] == phase:
                top[1] += 1
                return False
            if top[0] != OTHER:  # (_charge, written out: this runs at every phase change of every step)
                self.totals[top[0]] += now - self._last
        self._last = now
        stack.append([phase, 1])
        return True

    def exit(self, phase: str, now: float) -> bool:
        """Close ``phase``; True when the phase being charged changed. A close whose inner phases never closed (an
        exception skipped their hooks) unwinds them too."""
        stack = self._stack
        if stack and stack[-1][0] == phase and stack[-1][1] == 1:  # the innermost phase closes: every step's case
            if phase != OTHER:
                self.totals[phase] += now - self._last
            self._last = now
            stack.pop()
            return True
        for pos in range(len(stack) - 1, -1, -1):
            if stack[pos][0] == phase:
                break
        else:
            return False
        changed = False
        while len(stack) > pos + 1:
            self._charge(stack.pop()[0], now)
            changed = True
        top = stack[pos]
        top[1] -= 1
        if top[1] > 0:
            return changed
        self._charge(phase, now)
        stack.pop()
        return True

    def _charge(self, phase: str, now: float) -> None:
        """Charge the time since the last change to ``phase`` (nothing for ``OTHER``)."""
        if phase != OTHER:
            self.totals[phase] += now - self._last
        self._last = now

    def skip(self, seconds: float) -> None:
        """Leave the last ``seconds`` out of every phase (time gpuscope spent on itself)."""
        self._last += seconds

    def split(self, now: float) -> dict[str, float]:
        """Return the phase totals since the last split (charging the open phase up to ``now``) and restart them."""
        if self._stack:
            self._charge(self._stack[-1][0], now)
        self._last = now
        totals, self.totals = self.totals, dict.fromkeys(TIMED_PHASES, 0.0)
        return totals
