"""Who the ranks of a job wait for, from when each rank arrived at each collective.

In data-parallel training every rank meets the others in each collective, so their steps come out equally long
whatever happens: the rank with more work does not show a longer step, the others show a longer wait. One rank's
trace cannot tell that wait from the collective's own time; the ranks' calls side by side can. The k-th collective
of a step is the same one on every rank (a group's collectives are issued in one order), so for each:

- the ranks' arrivals are set on one clock (ranks on one host share it; across hosts each rank's clock is moved by
  the median difference of the collectives' ends, which every rank reaches together);
- the last to arrive sets when it can start: each other rank waits from its own arrival until then, and that wait,
  where its training thread (its device) sat idle, is the time the late rank cost it;
- from the last arrival to the end is the collective's own work (bytes over bandwidth, latency): only that is
  communication.

A rank's own work in each phase (its time less the waits for later ranks that fell in it, and less its wait for a
CPU where the machine is busy: ranks that share cores with other processes are held back by the scheduler, which
is no work of theirs) set against the other ranks' says which rank holds the others back and where its extra time
lies (``ranks.straggler`` decides whether that is a straggler beyond noise).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuscope.reduce.intervals import Span, intersect, length, union
from gpuscope.record import PHASES, CollectiveCall, Communication

Key = tuple[int, int]
"""A collective across ranks: (its step, its place among that step's collectives)."""


@dataclass(frozen=True, slots=True)
class RankArrival:
    """One rank's side of the job's collectives, over the profiled steps matched on every rank."""

    rank: int
    late_s: tuple[float, ...]
    """Per matched step: how much later than the other ranks (their median) it arrived at the collective of the
    step where it was latest: positive where it kept them waiting, negative where it waited."""
    own_steps_s: tuple[float, ...]
    """Per matched step: its own work, the step less its idle time inside collectives and its wait for a CPU."""
    waiting_s: float
    """Seconds a step its training thread (device) sat idle waiting for a later rank to arrive (mean)."""
    waiting_by_phase: dict[str, float]
    """``waiting_s`` by the phase it fell in (on a device, all in ``other``)."""
    own_phases_s: dict[str, float]
    """Seconds a step in each phase less its idle time inside collectives and (in proportion) its wait for a CPU:
    the rank's own work (mean)."""
    cpu_wait_s: float | None
    """Seconds a step its training thread waited for a CPU (mean), where measured."""
    exposed_s: float
    """Seconds a step its training thread (device) sat idle inside collectives, waiting or not (mean)."""
    step_s: float
    """Its mean profiled step."""
    own_phase_steps_s: tuple[dict[str, float], ...] = ()
    """``own_phases_s`` step by step (the matched steps of ``own_steps_s``)."""


@dataclass(frozen=True, slots=True)
class Arrivals:
    """The job's collectives matched across ranks."""

    ranks: tuple[RankArrival, ...]
    steps: int
    """Profiled steps matched on every rank."""
    collectives: int
    """Collectives matched (over those steps)."""
    own_s: float
    """Seconds a step from the last rank's arrival to the collectives' end (median over ranks, summed over a step's
    collectives): the collectives' own time."""
    clock: str
    """``shared``: the ranks' clocks are one host's; ``aligned``: moved onto rank ``ranks[0]``'s by the collectives'
    ends."""

    def of(self, rank: int) -> RankArrival:
        return next(r for r in self.ranks if r.rank == rank)


def arrivals(comms: Mapping[int, Communication], hosts: Mapping[int, str] | None = None) -> Arrivals | None:
    """The job's collectives matched across the ranks of ``comms`` (rank -> its record's communication; ``hosts``:
    rank -> its host, where known: ranks of one host share a clock), or None where fewer than two ranks have calls
    or no step holds the same collectives on every rank."""
    ranks = sorted(r for r, c in comms.items() if c.calls and c.profiled_steps)
    if len(ranks) < 2:
        return None
    keyed = {r: _keyed(comms[r].calls) for r in ranks}
    counts = {r: _per_step(keyed[r]) for r in ranks}
    steps = sorted(s for s in set.intersection(*(set(counts[r]) for r in ranks))
                   if len({counts[r][s] for r in ranks}) == 1)
    keys = [k for k in keyed[ranks[0]] if k[0] in steps]
    if not keys:
        return None
    shared = len({(hosts or {}).get(r, "") for r in ranks}) == 1
    offset = {r: 0.0 if shared else statistics.median(keyed[r][k].end_us - keyed[ranks[0]][k].end_us for k in keys)
              for r in ranks}
    gap: dict[int, dict[Key, float]] = {r: {} for r in ranks}
    late: dict[int, dict[int, float]] = {r: {} for r in ranks}
    own_us = 0.0
    for k in keys:
        at = {r: keyed[r][k].arrival_us - offset[r] for r in ranks}
        last = max(at.values())
        ends = statistics.median(keyed[r][k].end_us - offset[r] for r in ranks)
        own_us += max(0.0, ends - last)
        for r in ranks:
            gap[r][k] = last - at[r]
            behind = at[r] - statistics.median(at[o] for o in ranks if o != r)
            late[r][k[0]] = max(late[r].get(k[0], -float("inf")), behind)
    summaries = tuple(_rank(r, comms[r], keyed[r], gap[r], late[r], steps) for r in ranks)
    return Arrivals(summaries, len(steps), len(keys), own_us / 1e6 / len(steps), "shared" if shared else "aligned")


def _keyed(calls: Sequence[CollectiveCall]) -> dict[Key, CollectiveCall]:
    """Calls by (step, place in the step), in issue order."""
    seen: dict[int, int] = {}
    keyed = {}
    for call in calls:
        place = seen.get(call.step, 0)
        seen[call.step] = place + 1
        keyed[(call.step, place)] = call
    return keyed


def _per_step(keyed: Mapping[Key, CollectiveCall]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for step, _ in keyed:
        counts[step] = counts.get(step, 0) + 1
    return counts


def _rank(rank: int, comm: Communication, calls: Mapping[Key, CollectiveCall], gap: Mapping[Key, float],
          late: Mapping[int, float], steps: Sequence[int]) -> RankArrival:
    """One rank's waits, own work and lateness over the matched ``steps``. Its own work is each phase's time less
    the time its thread sat idle inside collectives (waiting for later ranks, or for the collectives' own work, the
    same for every rank), and less the step's wait for a CPU (where measured), in proportion."""
    by_number = {s.number: s for s in comm.profiled_steps}
    waiting = dict.fromkeys(PHASES, 0.0)
    own = dict.fromkeys(PHASES, 0.0)
    own_steps, cpu_waits, phase_steps = [], [], []
    exposed = step_us = 0.0
    for step in steps:
        span = by_number.get(step)
        if span is None:  # every figure is over the steps with a span
            continue
        mine = [(k, c) for k, c in calls.items() if k[0] == step]
        waits = union((c.arrival_us, c.arrival_us + gap[k]) for k, c in mine if gap[k] > 0)
        idle: dict[str, list[Span]] = {}
        for _, c in mine:
            for start, end, phase in c.idle:
                idle.setdefault(phase if phase in PHASES else "other", []).append((start, end))
        waited = dict.fromkeys(PHASES, 0.0)
        blocked = dict.fromkeys(PHASES, 0.0)  # idle inside collectives at all: waiting, or their own time
        for phase, spans in idle.items():
            spans = union(spans)
            exposed += length(spans)
            blocked[phase] = length(spans)
            waited[phase] = length(intersect(spans, waits))
        length_us = span.end_us - span.start_us
        step_us += length_us
        phases = {p: span.phases_s.get(p, 0.0) * 1e6 for p in PHASES}
        if not any(phases.values()):  # no phases known (a device's steps): the step is all "other"
            phases["other"] = length_us
        working = {p: max(0.0, phases[p] - blocked[p]) for p in PHASES}
        total = sum(working.values())
        cpu_wait = min(total, (span.cpu_wait_s or 0.0) * 1e6)
        if span.cpu_wait_s is not None:
            cpu_waits.append(cpu_wait / 1e6)
        keep = 1 - cpu_wait / total if total > 0 else 0.0
        for p in PHASES:
            waiting[p] += waited[p]
            own[p] += working[p] * keep
        own_steps.append(total * keep / 1e6)
        phase_steps.append({p: working[p] * keep / 1e6 for p in PHASES})
    n = max(1, len(own_steps))
    return RankArrival(
        rank=rank, late_s=tuple(late[s] / 1e6 for s in steps), own_steps_s=tuple(own_steps),
        waiting_s=sum(waiting.values()) / 1e6 / n, waiting_by_phase={p: waiting[p] / 1e6 / n for p in PHASES},
        own_phases_s={p: own[p] / 1e6 / n for p in PHASES},
        cpu_wait_s=sum(cpu_waits) / len(cpu_waits) if cpu_waits else None, exposed_s=exposed / 1e6 / n,
        step_s=step_us / 1e6 / n, own_phase_steps_s=tuple(phase_steps))
