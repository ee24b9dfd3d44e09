"""What the verdict says of a script that ran several training loops one after another (``reduce/loops.py`` finds
them and keeps the measured one's figures): which loop the figures are, and how to measure another."""

from __future__ import annotations

from gpuscope.record import RunRecord, TrainingLoop


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
