"""Seconds and calls by step index, kept for a bounded number of steps: what a frozen model's calls and activation
checkpointing's recomputation are read from over the steady steps (``reduce.steady``)."""

from __future__ import annotations

MAX_STEPS = 1 << 15
"""Steps kept, at most: the summary reads the steady steps up to the first one not kept (a few MB a tally)."""


class StepTally:
    """Seconds and calls by step index, from the first MAX_STEPS steps that had any; ``kept_to``: the first step
    not kept (-1: every one was)."""

    __slots__ = ("by_step", "kept_to")

    def __init__(self) -> None:
        self.by_step: dict[int, list[float]] = {}  # step index -> [seconds, calls]
        self.kept_to = -1

    def add(self, step: int, seconds: float, calls: int) -> None:
        if (kept := self.by_step.get(step)) is not None:
            kept[0] += seconds
            kept[1] += calls
        elif len(self.by_step) < MAX_STEPS:
            self.by_step[step] = [seconds, calls]
        elif self.kept_to < 0:
            self.kept_to = step  # kept no more: the figures are read from the steps before

    def figures(self) -> dict[int, tuple[float, int]]:
        """The seconds and calls by step index, for the record."""
        return {step: (seconds, int(calls)) for step, (seconds, calls) in self.by_step.items()}
