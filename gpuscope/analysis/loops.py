"""Training loops run one after another (``collectors/loops.py`` finds where each began): which one the figures
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

from gpuscope.captures import LoopStart, StepRecord
from gpuscope.record import RunRecord, TrainingLoop


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


def other_loop(record: RunRecord, first: int, last: int, what: str) -> str | None:
    """Why steps ``first``..``last`` (a profiler's window: ``what``) do not describe the figures: some ran in another
    training loop than the measured one; None if none did."""
    for n, loop in enumerate(record.steps.loops):
        if not loop.measured and first < loop.first_step + loop.steps and loop.first_step <= last:
            steps = f"{first}-{last}" if first != last else f"{first}"
            return f"{what} ({steps}) ran in {_ordinal(n)} training loop, not the one the figures describe"
    return None


def loops_line(record: RunRecord) -> str | None:
    """The verdict's line on a run of several training loops: which one the figures are, the others' figures, and
    the ``--skip-steps`` that measures the longest of them. None for one loop."""
    loops = record.steps.loops
    if len(loops) < 2:
        return None
    (this,) = [loop for loop in loops if loop.measured]
    others = [loop for loop in loops if not loop.measured]
    line = (f"the script ran {len(loops)} training loops one after another, each with its own optimizer and "
            f"parameters: the figures are {_ordinal(loops.index(this))} loop's ({_describe(this)}); left out: "
            + "; ".join(_describe(loop) for loop in others))
    longest = max(others, key=lambda loop: loop.total_s)
    if longest.total_s > 0 and longest.steps > 2:
        line += (f". To measure {_ordinal(loops.index(longest))} loop instead ({_seconds(longest.total_s)}): "
                 f"--skip-steps {longest.first_step + 1}")
    return line


def _describe(loop: TrainingLoop) -> str:
    site = loop.created_at
    built = f" built at {site.file}:{site.line}" if site is not None and site.file else ""
    median = f", median step {loop.median_s * 1e3:.3g} ms" if loop.median_s else ""
    took = f", {_seconds(loop.total_s)}" if loop.total_s else ", skipped (not timed)"
    return (f"steps {loop.first_step}-{loop.first_step + loop.steps - 1}: {loop.optimizer} over "
            f"{_count(loop.parameters)} parameters{built}{median}{took}")


def _ordinal(n: int) -> str:
    return ("the first", "the second", "the third", "the fourth", "the fifth")[n] if n < 5 else f"loop {n + 1}"


def _count(n: int) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}k" if n >= 1e3 \
        else str(n)


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s >= 1 else f"{s * 1e3:.0f} ms"
