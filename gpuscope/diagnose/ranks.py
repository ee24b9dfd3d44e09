"""Across the ranks of a data-parallel job: who the others wait for, and why.

In data-parallel training every rank meets the others in each gradient all-reduce, so their step times come out
nearly equal whatever happens: a slow rank shows as *waiting on the others*. Each rank's own work per step is its
step less the time its training thread sat waiting on collectives (``comm_exposed_s``); the rank with the most own
work is the one the others wait for, and the step phase where it spends most over the others is the cause.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from gpuscope.diagnose import thresholds as th
from gpuscope.record import PHASES, RankSummary, RunRecord, Straggler, Verdict


def straggler(ranks: Sequence[RankSummary]) -> Straggler | None:
    """The rank the others wait for, if it is late by at least ``STRAGGLER_SHARE`` of the job's median step."""
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
    excess = {phase: _phase_s(slow, phase) - statistics.median(_phase_s(r, phase) for r in others)
              for phase in PHASES}
    cause = max(excess, key=lambda p: excess[p])
    others_wait = statistics.median((r.comm_exposed_s or 0.0) for r in others)
    evidence = (
        f"rank {slow.rank} is late by {late_s * 1e3:.1f} ms a step ({late_s / job_s:.0%} of the "
        f"{job_s * 1e3:.1f} ms step): its own work takes {own[slow.rank] * 1e3:.1f} ms, the others' "
        f"{others_own * 1e3:.1f} ms",
        f"its {cause.replace('_', ' ')} takes {_phase_s(slow, cause) * 1e3:.1f} ms a step, "
        f"{excess[cause] * 1e3:.1f} ms more than on the other ranks",
        f"meanwhile the other ranks wait {others_wait * 1e3:.1f} ms a step in gradient all-reduce",
    )
    return Straggler(rank=slow.rank, late_s=late_s, late_share=late_s / job_s, cause=cause, evidence=evidence)


def job_verdict(critical: RunRecord, late: Straggler | None) -> Verdict:
    """The job's verdict: the straggler's own (it sets the pace), led by the straggler finding; else the rank's."""
    if late is None:
        return critical.verdict
    return Verdict(critical.verdict.bound, critical.verdict.confidence, (*late.evidence, *critical.verdict.evidence))


def _phase_s(rank: RankSummary, phase: str) -> float:
    return getattr(rank.breakdown, phase) * rank.median_s
