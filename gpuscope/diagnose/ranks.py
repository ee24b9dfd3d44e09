"""Across the ranks of a data-parallel job: who the others wait for, and why.

In data-parallel training every rank meets the others in each gradient all-reduce, so their step times come out
nearly equal whatever happens: a slow rank shows as *waiting on the others*. Each rank's own work per step is its
step less the time its training thread sat waiting on collectives (``comm_exposed_s``); the rank with the most own
work is the one the others wait for, and the step phase where it spends most over the others is the cause, with
the part of the lateness it accounts for. A rank is named only when its lateness is a notable share of the step and
stands clear of the other ranks' own step-to-step spread, and when its phases show the extra work: on a loaded
machine every rank's steps vary, and the rank with the most own work is then whichever drew the worst luck.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from gpuscope.diagnose import thresholds as th
from gpuscope.record import PHASES, RankSummary, RunRecord, Straggler, Verdict


def straggler(ranks: Sequence[RankSummary]) -> Straggler | None:
    """The rank the others wait for, if it is late by at least ``STRAGGLER_SHARE`` of the job's median step, by more
    than the other ranks' own steps stray from their median (half their 10th-90th percentile range: lateness within
    it is noise, as on a loaded machine), and its steps' phases hold extra work to match (``STRAGGLER_EXPLAINED`` of
    the lateness at least)."""
    timed = [r for r in ranks if r.steps and r.comm_exposed_s is not None]
    if len(timed) < 2:
        return None
    own = {r.rank: r.median_s - (r.comm_exposed_s or 0.0) for r in timed}
    slow = max(timed, key=lambda r: own[r.rank])
    others = [r for r in timed if r is not slow]
    others_own = statistics.median(own[r.rank] for r in others)
    late_s = own[slow.rank] - others_own
    job_s = statistics.median(r.median_s for r in timed)
    if job_s <= 0 or late_s / job_s < th.STRAGGLER_SHARE:
        return None
    spreads = [r.spread_s for r in others if r.spread_s is not None]
    spread_s = statistics.median(spreads) if spreads else None
    if spread_s is not None and late_s <= spread_s / 2:
        return None  # within how far the others' own steps stray from their median
    excess = {phase: _phase_s(slow, phase) - statistics.median(_phase_s(r, phase) for r in others)
              for phase in PHASES}
    if sum(max(0.0, e) for e in excess.values()) < th.STRAGGLER_EXPLAINED * late_s:
        return None  # its steps hold no extra work to match: the ranks' waits differ, not their work
    cause = max(excess, key=lambda p: excess[p])
    cause_share = min(1.0, max(0.0, excess[cause] / late_s))
    others_wait = statistics.median((r.comm_exposed_s or 0.0) for r in others)
    beyond = (f", beyond the {spread_s / 2 * 1e3:.1f} ms their own steps stray from their median (half their "
              f"10th-90th percentile range)" if spread_s is not None else "")
    evidence = (
        f"rank {slow.rank} is late by {late_s * 1e3:.1f} ms a step ({late_s / job_s:.0%} of the "
        f"{job_s * 1e3:.1f} ms step): its own work takes {own[slow.rank] * 1e3:.1f} ms, the others' "
        f"{others_own * 1e3:.1f} ms{beyond}",
        f"its {cause.replace('_', ' ')} takes {_phase_s(slow, cause) * 1e3:.1f} ms a step, "
        f"{excess[cause] * 1e3:.1f} ms more than on the other ranks: {cause_share:.0%} of the lateness",
        f"meanwhile the other ranks wait {others_wait * 1e3:.1f} ms a step in gradient all-reduce",
    )
    return Straggler(rank=slow.rank, late_s=late_s, late_share=late_s / job_s, cause=cause, evidence=evidence,
                     cause_share=cause_share, spread_s=spread_s)


def job_verdict(critical: RunRecord, late: Straggler | None) -> Verdict:
    """The job's verdict: the straggler's own (it sets the pace), led by the straggler finding; else the rank's."""
    if late is None:
        return critical.verdict
    return Verdict(critical.verdict.bound, critical.verdict.confidence, (*late.evidence, *critical.verdict.evidence))


def _phase_s(rank: RankSummary, phase: str) -> float:
    return getattr(rank.breakdown, phase) * rank.median_s
