"""Host time charged to the step's phases. Pure Python (no torch), tested without a GPU."""

from __future__ import annotations

from gpuscope.collect.captures import TIMED_PHASES

OTHER = "other"


class PhaseClock:
    """Exclusive host time per phase: time is charged to the innermost open phase only. An open ``OTHER`` frame
    charges no phase (its time is the step's "other", what the timed phases leave of the wall time).

    The open phases are frames (phase, depth); re-entering the innermost phase only deepens it. The innermost frame
    is kept in two slots and the ones below it in a list: a step opens one phase at a time (a forward, then a
    backward), and each enter and exit is then a few assignments. These run at every phase change of every step,
    once the step's own work has evicted them from the CPU's caches, where each operation costs (see
    ``benchmarks/hot_path.py --cold``)."""

    __slots__ = ("_top", "_depth", "_below", "_last", "totals")

    def __init__(self, now: float) -> None:
        self._top: str | None = None  # the innermost open phase (None: none open)
        self._depth = 0  # how many times it was entered and not yet closed
        self._below: list[tuple[str, int]] = []  # the frames under it, outermost first
        self._last = now
        self.totals = dict.fromkeys(TIMED_PHASES, 0.0)

    @property
    def current(self) -> str:
        """The phase time is being charged to now."""
        return self._top if self._top is not None else OTHER

    def enter(self, phase: str, now: float) -> bool:
        """Open ``phase``; True when the phase being charged changed."""
        top = self._top
        if top is None:  # none open: every step's case
            self._top, self._depth, self._last = phase, 1, now
            return True
        if top == phase:
            self._depth += 1
            return False
        if top != OTHER:
            self.totals[top] += now - self._last
        self._below.append((top, self._depth))
        self._top, self._depth, self._last = phase, 1, now
        return True

    def exit(self, phase: str, now: float) -> bool:
        """Close ``phase``; True when the phase being charged changed. A close whose inner phases never closed (an
        exception skipped their hooks) unwinds them too."""
        if phase == self._top and self._depth == 1 and not self._below:  # the only open phase closes: every step's
            if phase != OTHER:
                self.totals[phase] += now - self._last
            self._top, self._last = None, now
            return True
        return self._exit_nested(phase, now)

    def _exit_nested(self, phase: str, now: float) -> bool:
        if self._top is None:
            return False
        frames = [*self._below, (self._top, self._depth)]
        for pos in range(len(frames) - 1, -1, -1):
            if frames[pos][0] == phase:
                break
        else:
            return False
        changed = pos < len(frames) - 1
        if changed:  # the inner phases left open end here: the innermost is charged up to now
            self._charge(frames[-1][0], now)
        depth = frames[pos][1] - 1
        if depth:
            del frames[pos + 1:]
            frames[pos] = (phase, depth)
        else:
            if not changed:
                self._charge(phase, now)
            del frames[pos:]
            changed = True
        self._top, self._depth = frames.pop() if frames else (None, 0)
        self._below = frames
        return changed

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
        totals, self.totals = self.totals, dict.fromkeys(TIMED_PHASES, 0.0)
        top = self._top
        if top is not None and top != OTHER:
            totals[top] += now - self._last
        self._last = now
        return totals
