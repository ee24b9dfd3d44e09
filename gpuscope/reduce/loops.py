"""Training loops run one after another (``collect/steps/loops.py`` finds where each began): which one the figures
describe, each loop's own figures, and what the verdict says of the others.

A script that trains a teacher for 700 ms a step, a student for 36 ms and then distils the student at 340 ms a step
has no one step time: its median over all three describes none, and a FLOP count made on a teacher step divided by
it put the run "at 100% of the peak". So the figures keep to one loop, the *measured* one, the loop the profilers'
windows fell in (their trace, Python profile and FLOP count describe its steps); the others are listed with their
steps, median and time, and how to measure one of them instead (``--skip-steps``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from gpuscope.collect.captures import LoopStart, StepRecord
from gpuscope.record import TrainingLoop


def bounds(loops: Sequence[LoopStart], total: int) -> list[tuple[int, int]]:
    """Each loop's steps, as ``(first, end)`` (end exclusive); one loop of every step where none were found."""
    firsts = [loop.first_step for loop in loops] or [0]
    return list(zip(firsts, [*firsts[1:], max(total, firsts[-1])]))


def measured(records: Sequence[StepRecord], weights: Sequence[float], loops: Sequence[LoopStart],
             total: int) -> int:
    """The loop the figures describe: the one holding the most profiled steps (the earliest at a tie), or where
    no step was profiled, the one that took the most time."""
    spans = bounds(loops, total)
    profiled = [sum(1 for r in records if r.profiled and a <= r.index < b) for a, b in spans]
    if any(profiled):
        return profiled.index(max(profiled))
    time = [sum(r.wall_s * k for r, k in zip(records, weights) if a <= r.index < b) for a, b in spans]
    return time.index(max(time))


def training_loops(records: Sequence[StepRecord], weights: Sequence[float], loops: Sequence[LoopStart], total: int,
                   chosen: int, median_s: float) -> tuple[TrainingLoop, ...]:
    """The record's entry for each loop; the measured one (``chosen``) gets the run's steady median."""
    out = []
    for n, (loop, (first, end)) in enumerate(zip(loops, bounds(loops, total))):
        mine = [(r, k) for r, k in zip(records, weights) if first <= r.index < end]
        later = [r.wall_s for r, _ in mine if r.index > first]  # past the hand-over from the loop before
        median = median_s if n == chosen else statistics.median(later) if later else None
        out.append(TrainingLoop(first_step=first, steps=end - first, optimizer=loop.optimizer,
                                parameters=loop.parameters, created_at=loop.created_at, median_s=median,
                                total_s=sum(r.wall_s * k for r, k in mine), measured=n == chosen))
    return tuple(out)
