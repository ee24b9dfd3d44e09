"""Across the ranks of a data-parallel job: who the others wait for, and why.

In data-parallel training every rank meets the others in each gradient all-reduce, so their step times come out
nearly equal whatever happens: a slow rank shows as *the others waiting*. Where every rank's collectives were
recorded (``diagnose.arrival``), each rank's own work is its phases less its idle time inside collectives and its
wait for a CPU; the rank that does more of it than the others, step after step, is the one they wait for (on a quiet
machine, the one that arrives last), and the phase holding most of its extra work says where it lies: loading data,
forward, backward before a gradient bucket is ready, the optimizer. On a busy machine the scheduler moves arrivals
about by more than a rank's extra work; its own work still tells.

Without the calls (older records), each rank's own work is its step less its wait on collectives, and a rank is
named only when its lateness stands clear of the other ranks' step-to-step spread and its phases hold the extra work.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.arrival import Arrivals, RankArrival, arrivals
from gpuscope.diagnose.memory import mb
from gpuscope.errors import GpuscopeError
from gpuscope.record import PHASES, Communication, Distributed, RankSummary, RunRecord, Straggler, Verdict
from gpuscope.reduce.steady import normalised


# -- the job from its ranks --------------------------------------------------------------------------------
def combine(records: Sequence[RunRecord]) -> RunRecord:
    """One record for a job from its ranks' (as pyinstrument's ``Session.combine``): the figures of the rank the
    others wait for (the straggler; else the lowest rank), every rank's summary, the straggler finding and the
    ranks that left no record. It is diagnosed as a whole afterwards (``diagnose.analyze``): its ranks' waits for a
    late one are not communication, and the straggler leads its verdict."""

    if not records:
        raise GpuscopeError("no rank records (rank-N/run.json) in this run folder")
    world = max(r.distributed.world_size if r.distributed else 1 for r in records)
    ranks = [(r.distributed or Distributed()).rank for r in records]
    comms = {rank: c for rank, r in zip(ranks, records) if (c := _communication(r)) is not None}
    found = arrivals(comms, {rank: (r.distributed or Distributed()).host for rank, r in zip(ranks, records)})
    waits = {a.rank: a.waiting_s for a in found.ranks} if found is not None else {}
    evaluated = {rank: _evaluated_steps(r) for rank, r in zip(ranks, records)}
    summaries = tuple(_without_steps(summarise(r, waits.get(rank)), r,
                                     set().union(*(e for other, e in evaluated.items() if other != rank)))
                      for rank, r in zip(ranks, records))
    slower: list[str] = []
    late = straggler(summaries, found, rank_ops(dict(zip(ranks, records))), slower)
    shown = late.rank if late else summaries[0].rank
    critical = records[ranks.index(shown)]
    comm = _communication(critical)
    if comm is not None and shown in waits:  # of its wait on collectives, what was waiting for a later rank
        least = min(max(0.0, a.exposed_s - a.waiting_s) for a in found.ranks) if found is not None else None
        critical = dataclasses.replace(critical, op_profile=dataclasses.replace(
            critical.op_profile, communication=dataclasses.replace(comm, waiting_s=waits[shown], least_own_s=least)))
    notes = (f"a {world}-rank job: the figures below are rank {shown}'s "
             f"({'the straggler' if late else 'the lowest rank present'}); every rank is in the Ranks section",
             *(() if late or found is None else late_for_a_core(found)), *slower, *_tightest_memory(summaries, shown))
    return dataclasses.replace(
        critical,
        exit_status=max((r.exit_status for r in records), key=abs),
        ranks=summaries,
        missing_ranks=tuple(sorted(set(range(world)) - {s.rank for s in summaries})),
        straggler=late,
        meta=dataclasses.replace(critical.meta, notes=(*notes, *critical.meta.notes)),
    )


def _communication(record: RunRecord) -> Communication | None:
    return record.op_profile.communication if record.op_profile is not None else None


def late_for_a_core(found: Arrivals) -> tuple[str, ...]:
    """A note where, no straggler named, one rank arrived last at the collectives in every profiled step and the
    others' wait for it (``STRAGGLER_EVERY_STEP`` of the step or more) was its wait for a CPU, not its own work: the
    machine's cores held it back (a core shared with another process; more threads than cores)."""
    last = [a for a in found.ranks if a.late_s and min(a.late_s) > 0]
    others = [a for a in found.ranks if a not in last]
    if len(last) != 1 or not others or last[0].cpu_wait_s is None:
        return ()
    rank = last[0]
    waited = statistics.median(a.waiting_s for a in others)
    more_cpu_wait = rank.cpu_wait_s - statistics.median(a.cpu_wait_s or 0.0 for a in others)
    if waited < th.STRAGGLER_EVERY_STEP * rank.step_s or more_cpu_wait < waited / 2:
        return ()
    return (f"rank {rank.rank} arrived last at the collectives in every profiled step ("
            f"{min(rank.late_s) * 1e3:.0f}-{max(rank.late_s) * 1e3:.0f} ms after the others), with no more work of "
            f"its own than theirs: its training thread waited for a CPU {rank.cpu_wait_s * 1e3:.1f} ms a step, "
            f"{more_cpu_wait * 1e3:.1f} ms more than theirs. The others' {waited * 1e3:.1f} ms a step waiting for it "
            "is the machine's (a core shared with another process, or more threads than cores), not its work",)


def _tightest_memory(summaries: Sequence[RankSummary], shown: int) -> tuple[str, ...]:
    """A note where a rank other than the one shown has the least room under its memory limit, a tenth less than
    the shown rank's or more: the job's memory figures are the shown rank's, and the first to run out is that other
    one."""
    known = [s for s in summaries if s.memory_headroom_bytes is not None]
    if len(known) < 2:
        return ()
    tightest = min(known, key=lambda s: s.memory_headroom_bytes)  # type: ignore[arg-type, return-value]
    mine = next((s.memory_headroom_bytes for s in known if s.rank == shown), None)
    if tightest.rank == shown or mine is None or tightest.memory_headroom_bytes > 0.9 * mine:
        return ()  # ranks that differ by less than a tenth of their room: any could be the first to run out
    return (f"rank {tightest.rank} has the least memory to spare, {mb(tightest.memory_headroom_bytes)} under its "
            f"limit against rank {shown}'s {mb(mine)}: its memory section is in rank-{tightest.rank}/",)


def summarise(record: RunRecord, waiting_s: float | None = None) -> RankSummary:
    comm = _communication(record)
    where = record.distributed or Distributed()
    memory = record.memory
    return RankSummary(
        rank=where.rank, host=where.host, exit_status=record.exit_status, steps=record.steps.count,
        median_s=record.steps.median_s, breakdown=record.breakdown,
        comm_s=comm.comm_s if comm else None, comm_exposed_s=comm.exposed_s if comm else None,
        bound=record.verdict.bound,
        spread_s=record.steps.p90_s - record.steps.p10_s if record.steps.count else None,
        waiting_s=waiting_s, profiled_step_s=comm.step_s if comm else None,
        memory_peak_bytes=memory.peak_bytes if memory is not None and memory.peak_bytes else None,
        memory_headroom_bytes=memory.headroom_bytes if memory is not None else None,
    )


def _evaluated_steps(record: RunRecord) -> set[int]:
    """The steps of ``record``'s sample that held an evaluation pass."""
    sample = record.steps.sample
    return {index for index, status in zip(sample.index, sample.status) if status == "eval"}


def _without_steps(summary: RankSummary, record: RunRecord, others: set[int]) -> RankSummary:
    """``summary`` with the steady steps in ``others`` (steps where another rank held an evaluation pass) left out
    of its figures, and the time they took beyond its median step kept as ``waited_for_evaluation_s``: that rank's
    evaluation, which this one waited out at the next collective, is no part of its training steps."""
    sample = record.steps.sample
    steady = [i for i, status in enumerate(sample.status) if status == "steady"]
    kept = [i for i in steady if sample.index[i] not in others]
    if len(kept) == len(steady) or len(kept) < 2:
        return summary
    walls = sorted(sample.wall_s[i] for i in kept)
    median, wall = statistics.median(walls), sum(walls)
    phases = {phase: times for phase, times in sample.phases_s.items() if phase in PHASES and phase != "other"}
    shares = {phase: sum(times[i] for i in kept) / wall for phase, times in phases.items()} if wall > 0 else {}
    breakdown = normalised(shares) if shares else summary.breakdown
    waited = sum(max(0.0, sample.wall_s[i] - median) for i in steady if sample.index[i] in others)
    return dataclasses.replace(  # (the steady rows of a sampled run stand for more steps each: its count scaled)
        summary, steps=round(summary.steps * len(kept) / len(steady)), median_s=median, breakdown=breakdown,
        spread_s=walls[int(0.9 * (len(walls) - 1))] - walls[int(0.1 * (len(walls) - 1))],
        waited_for_evaluation_s=waited)


# -- who the others wait for ------------------------------------------------------------------------------
def straggler(ranks: Sequence[RankSummary], found: Arrivals | None = None, ops: RankOps | None = None,
              notes: list[str] | None = None) -> Straggler | None:
    """The rank the others wait for: from the ranks' arrivals where ``found`` (``by_arrival``, with their traced ops
    side by side where ``ops``; a rank late for want of a faster core is left to a line in ``notes``), else from
    their own work (``by_own_work``)."""
    if found is not None:
        return by_arrival(ranks, found, ops, notes)
    return by_own_work(ranks)


@dataclasses.dataclass(frozen=True, slots=True)
class RankOps:
    """Every rank's traced ops over its profiled steps (``OpProfile.host_ops``): rank -> op -> (calls, self host
    seconds) a step; ``on_device``: the ranks ran kernels (a slower device is a straggler of its own)."""

    per_step: dict[int, dict[str, tuple[float, float]]]
    on_device: bool
    phase_calls: dict[int, dict[str, dict[str, float]]] = dataclasses.field(default_factory=dict)
    """rank -> op -> phase -> calls a step on its training thread (``OpProfile.phase_calls``), where every rank's
    record has them."""


def rank_ops(records: dict[int, RunRecord]) -> RankOps | None:
    """The ranks' ops side by side, or None where a rank's record has none (made before ``host_ops`` was kept)."""
    profiles = {rank: r.op_profile for rank, r in records.items()
                if r.op_profile is not None and r.op_profile.host_ops and r.op_profile.steps}
    if len(profiles) < 2 or len(profiles) != len(records):
        return None
    per_step = {rank: {o.name: (o.calls / p.steps, o.self_host_s / p.steps) for o in p.host_ops}
                for rank, p in profiles.items()}
    phases = {rank: {name: {phase: n / p.steps for phase, n in by_phase.items()}
                     for name, by_phase in p.phase_calls.items()} for rank, p in profiles.items()}
    return RankOps(per_step, on_device=any(p.kernels is not None for p in profiles.values()),
                   phase_calls=phases if all(phases.values()) else {})


ExtraCall = tuple[str, float, float, float]
"""An op a rank calls more often than the others: its name, its calls a step, the others' (their median), and the
seconds a step its extra calls take (``extra_calls``)."""


def extra_calls(rank: int, ops: RankOps) -> tuple[ExtraCall, ...]:
    """The ops ``rank`` calls more often than the other ranks (``STRAGGLER_MORE_CALLS``), heaviest first: work the
    others do not do. Each one's extra time is its self time less the others', taken at its pace where it runs the
    calls both make faster than they do (``_op_pace``: on a faster core the shared calls hide part of the extra ones;
    on a slower one the extra calls are slowed as much, and nothing is taken off them), and no more than the extra
    calls' share of its time."""
    mine = ops.per_step[rank]
    others = [v for r, v in ops.per_step.items() if r != rank]
    theirs = {name: (statistics.median(o.get(name, (0.0, 0.0))[0] for o in others),
                     statistics.median(o.get(name, (0.0, 0.0))[1] for o in others)) for name in mine}
    pace = min(1.0, _op_pace(mine, theirs))
    rows = []
    for name, (calls, self_s) in mine.items():
        their_calls, their_s = theirs[name]
        if calls > their_calls + max(0.5, th.STRAGGLER_MORE_CALLS * their_calls):
            rows.append((name, calls, their_calls,
                         max(0.0, min(self_s - pace * their_s, self_s * (calls - their_calls) / calls))))
    return tuple(sorted(rows, key=lambda r: (-r[3], r[0])))


def _op_pace(mine: dict[str, tuple[float, float]], theirs: dict[str, tuple[float, float]]) -> float:
    """How much longer a rank takes than the others over the ops both call equally often (their self time, the
    rank's over theirs, held to 0.5-2x as ``_beyond_pace``); 1 where there are none."""
    same = [(mine[n][1], t) for n, (c, t) in theirs.items()
            if abs(mine[n][0] - c) <= max(0.5, th.STRAGGLER_MORE_CALLS * c) and t > 0]
    total = sum(t for _, t in same)
    return min(2.0, max(0.5, sum(m for m, _ in same) / total)) if total > 0 else 1.0


def extra_by_phase(rank: int, ops: RankOps, rows: Sequence[ExtraCall]) -> dict[str, float]:
    """Where ``rank``'s extra calls ran: seconds a step by phase, each op's extra time shared among the phases in
    proportion to its calls there over the others' (their median); empty where the phases of calls are unknown."""
    if rank not in ops.phase_calls:
        return {}
    others = [v for r, v in ops.phase_calls.items() if r != rank]
    seconds: dict[str, float] = {}
    for name, _, _, extra_s in rows:
        mine = ops.phase_calls[rank].get(name, {})
        more = {phase: n - statistics.median(o.get(name, {}).get(phase, 0.0) for o in others)
                for phase, n in mine.items()}
        total = sum(m for m in more.values() if m > 0)
        for phase, m in more.items():
            if m > 0:
                seconds[phase] = seconds.get(phase, 0.0) + extra_s * m / total
    return seconds


def _calls_words(rows: Sequence[ExtraCall], shown: int = 3) -> str:
    """The heaviest extra calls in words, those holding a twentieth of their time or more."""
    total = sum(r[3] for r in rows)
    return "; ".join(f"{name} {calls:.0f} call{'s' if round(calls) != 1 else ''} a step against "
                     f"{'none' if their < 0.5 else f'{their:.0f}'} ({extra * 1e3:.1f} ms)"
                     for name, calls, their, extra in rows[:shown] if extra >= total / 20)


def by_arrival(ranks: Sequence[RankSummary], found: Arrivals, ops: RankOps | None = None,
               notes: list[str] | None = None) -> Straggler | None:
    """The rank whose own work a step (``diagnose.arrival``: its step less its waits for later ranks and for a CPU)
    exceeds the other ranks' by ``STRAGGLER_ARRIVAL_SHARE`` of the step (the median over the profiled steps of the
    excess, step by step), in ``STRAGGLER_LAST_STEPS`` of those steps: the rank the others wait for, wherever its
    extra time lies. On a quiet machine it is also the rank that arrives last; on a busy one the scheduler moves the
    arrivals about, and its own work still tells. Failing that, the rank whose work in one phase stands out against
    its own pace in the others (``_concentrated``): a straggler whose core is faster in the rest of its step. Either
    must be borne out beyond the profiled steps (``_borne_out``). Where the ranks' traced ops are known (``ops``):
    on a CPU, one late in backward must run ops the others do not or be late in forward too (``STRAGGLER_EXTRA_OPS``:
    larger inputs lengthen both), else it is slower there, not busier, and ``notes`` gets a line for it; and a rank
    whose extra calls alone take ``STRAGGLER_BY_OPS`` of the step, arriving last or doing more work in
    ``STRAGGLER_LAST_STEPS`` of them, is one by its ops (``_by_extra_calls``)."""
    summaries = {r.rank: r for r in ranks if r.steps}
    timed = [a for a in found.ranks if a.rank in summaries and a.own_steps_s]
    if len(timed) < 2 or len({len(a.own_steps_s) for a in timed}) != 1:
        return None
    count = len(timed[0].own_steps_s)
    baseline = {a.rank: [a.own_steps_s[s] - statistics.median(o.own_steps_s[s] for o in timed if o is not a)
                         for s in range(count)] for a in timed}
    step_s = statistics.median(a.step_s for a in timed)
    if step_s <= 0:
        return None
    candidates: list[tuple[RankArrival, str | None, float, int, bool]] = []
    slow = max(timed, key=lambda a: statistics.median(baseline[a.rank]))
    excess_s = statistics.median(baseline[slow.rank])
    more = sum(x > 0 for x in baseline[slow.rank])
    if excess_s >= th.STRAGGLER_ARRIVAL_SHARE * step_s and more >= th.STRAGGLER_LAST_STEPS * count:
        candidates.append((slow, None, excess_s, more, False))
    hidden = _concentrated(timed, step_s)  # its extra work in one phase, hidden by a faster core in the others
    if hidden is not None:
        candidates.append((*hidden, True))
    for slow, cause, excess_s, more, paced in candidates:
        others = [a for a in timed if a is not slow]
        excess = _phase_excess(slow, others)
        cause = cause or max(excess, key=lambda p: excess[p])
        if not paced and _cause_share(excess, cause) < th.STRAGGLER_CAUSE_SHARE:
            continue
        if paced and _held_back_more_than_busier(slow, others, excess_s):
            continue
        borne = _borne_out(slow, others, cause, excess[cause], summaries, step_s,
                           None if paced else baseline[slow.rank])
        if borne is None:
            continue
        calls = extra_calls(slow.rank, ops) if ops is not None else None
        if (cause == "backward" and calls is not None and not ops.on_device  # type: ignore[union-attr]
                and sum(c[3] for c in calls) < th.STRAGGLER_EXTRA_OPS * step_s
                and excess["forward"] < th.STRAGGLER_EXTRA_OPS * step_s):  # larger inputs lengthen forward too
            if notes is not None:
                notes.append(_slower_not_busier(slow, excess, step_s))
            continue
        return _arrival_finding(slow, others, cause, excess, excess_s, more, count, paced, borne, baseline, step_s,
                                found, summaries, calls)
    return _by_extra_calls(timed, ops, step_s, found, summaries, baseline, notes) if ops is not None else None


def _by_extra_calls(timed: Sequence[RankArrival], ops: RankOps, step_s: float, found: Arrivals,
                    summaries: dict[int, RankSummary], baseline: dict[int, list[float]],
                    notes: list[str] | None = None) -> Straggler | None:
    """The rank whose extra calls (``extra_calls``) take ``STRAGGLER_BY_OPS`` of the profiled step and that, in
    ``STRAGGLER_LAST_STEPS`` of the steps, arrives last at the collectives or does more work than the others (its
    step less its waits): the others wait for work that ran, however those figures read on a busy machine, where
    the scheduler moves arrivals and waits about by as much as the work."""
    count = len(timed[0].own_steps_s)
    extra = {a.rank: extra_calls(a.rank, ops) for a in timed}
    for slow in sorted(timed, key=lambda a: -sum(c[3] for c in extra[a.rank])):
        calls = extra[slow.rank]
        extra_s = sum(c[3] for c in calls)
        last = sum(x > 0 for x in slow.late_s)
        more = sum(x > 0 for x in baseline[slow.rank])
        if extra_s < th.STRAGGLER_BY_OPS * step_s:
            continue
        if max(last, more) < th.STRAGGLER_LAST_STEPS * count:
            if notes is not None:
                notes.append(f"rank {slow.rank} runs {extra_s * 1e3:.1f} ms a step of op calls the other ranks do not "
                             f"make ({extra_s / step_s:.0%} of the {step_s * 1e3:.1f} ms profiled step: "
                             f"{_calls_words(calls)}), yet it arrived last at the collectives in {last} of {count} "
                             f"profiled steps and did more work than they did in {more}: another rank was slower "
                             "still in these steps; its extra calls are the job's next imbalance")
            continue
        others = [a for a in timed if a is not slow]
        excess = _phase_excess(slow, others)
        where = extra_by_phase(slow.rank, ops, calls)  # where the calls ran, else where its step reads longer
        cause = max(where, key=lambda p: where[p]) if where else max(excess, key=lambda p: excess[p])
        return _arrival_finding(slow, others, cause, excess, extra_s, more, count, False, "", baseline, step_s,
                                found, summaries, calls, by_calls=True, calls_in=where.get(cause))
    return None


def _held_back_more_than_busier(slow: RankArrival, others: Sequence[RankArrival], excess_s: float) -> bool:
    """Whether a rank found by its pace in one phase (``_concentrated``) waited for a CPU longer, beyond the other
    ranks' waits, than the extra work its pace predicts, and that longer wait is half theirs for it or more: the
    machine holds it back more than its work does (``late_for_a_core`` says so). A balanced tensor-parallel job
    beside a busy process had its rank 0 found 2.2 ms a step beyond its pace outside the named phases, a pace of 0.5
    (the other rank's optimizer slow in one of three steps), while it waited for a CPU 4.4 ms a step more than
    rank 1, which waited 7.4 ms a step for it."""
    if slow.cpu_wait_s is None:
        return False
    more_cpu_wait = slow.cpu_wait_s - statistics.median(a.cpu_wait_s or 0.0 for a in others)
    waited = statistics.median(a.waiting_s for a in others)
    return more_cpu_wait > excess_s and more_cpu_wait >= waited / 2


def _slower_not_busier(slow: RankArrival, excess: dict[str, float], step_s: float) -> str:
    """The note for a rank late in backward every profiled step, by enough to be named, that runs no more ops than
    the others."""
    return (f"rank {slow.rank} arrived last at the collectives in every profiled step, its own backward "
            f"{excess['backward'] * 1e3:.1f} ms a step longer than the other ranks' ({excess['backward'] / step_s:.0%} "
            f"of the {step_s * 1e3:.1f} ms profiled step), yet it called every op as often as they did, and its "
            f"forward took {abs(excess['forward']) * 1e3:.1f} ms {'more' if excess['forward'] >= 0 else 'less'} than "
            "theirs: not more work or larger inputs (which lengthen forward too) but a core that ran slower in "
            "backward (shared with the gradient all-reduces' threads or another process). No straggler is named "
            "for it")


def _borne_out(slow: RankArrival, others: Sequence[RankArrival], cause: str, excess_s: float,
               summaries: dict[int, RankSummary], step_s: float, each_step_s: Sequence[float] | None) -> str | None:
    """Whether a rank's extra work in ``cause`` over three profiled steps holds beyond them and beyond its pace (words
    that say how), or None. Where the other ranks' steady time in that phase holds none of their wait for it (DDP's
    data loading, forward, optimizer), its steady steps, the whole run's, show it too: ``STRAGGLER_STEADY_SHARE`` of
    the step more in that phase than the others'; and its profiled work in that phase exceeds what its pace in its
    other phases predicts by ``STRAGGLER_BEYOND_PACE`` of the step (a rank on a slower or shared core is slower in
    every phase alike, the whole run long). Where it does, their phase and its come out alike and cannot tell: DDP's
    backward (the steps' hooks time ``loss.backward()``, which returns once the last bucket is reduced), a phase with
    collectives inside (FSDP's forward, whose all-gathers the others wait in; work outside the named phases that
    reduces gradients by hand). Then the profiled steps must bear it out each one: it arrives last at the
    collectives in every one, as extra work before them makes it, and its whole step's excess (``each_step_s``, where
    found by it) is in every one at least ``STRAGGLER_EVERY_STEP`` of the step (a slow core's lateness comes and
    goes)."""
    waits = statistics.median(a.waiting_by_phase.get(cause, 0.0) for a in others)
    if cause == "backward" or waits >= max(excess_s, 0.0) / 2:
        last = sum(x > 0 for x in slow.late_s)
        if last < len(slow.late_s):
            return None
        if each_step_s is not None and min(each_step_s) < th.STRAGGLER_EVERY_STEP * step_s:
            return None
        least = f", and does at least {min(each_step_s) * 1e3:.1f} ms more in each" if each_step_s is not None else ""
        return f"it arrives last at the collectives in every one of the {last} profiled steps{least}"
    theirs_own = {p: statistics.median(a.own_phases_s[p] for a in others) for p in PHASES}
    pace, beyond = _beyond_pace(slow.own_phases_s, theirs_own, cause)
    if beyond < th.STRAGGLER_BEYOND_PACE * step_s:
        return None
    steady = [summaries[a.rank] for a in others]
    mine = _phase_s(summaries[slow.rank], cause)
    theirs = statistics.median(_phase_s(r, cause) for r in steady)
    job_s = statistics.median(r.median_s for r in (summaries[slow.rank], *steady))
    if job_s <= 0 or mine - theirs < th.STRAGGLER_STEADY_SHARE * job_s:
        return None
    return (f"{beyond * 1e3:.1f} ms more than its pace in its other phases ({pace:.2f}x the other ranks') predicts; "
            f"over the run's steady steps too its {_phase_words(cause)} takes {(mine - theirs) * 1e3:.1f} ms more "
            f"than the other ranks' ({mine * 1e3:.1f} ms against {theirs * 1e3:.1f} ms, of a "
            f"{job_s * 1e3:.1f} ms median step)")


def _arrival_finding(slow: RankArrival, others: Sequence[RankArrival], cause: str, excess: dict[str, float],
                     excess_s: float, more: int, count: int, paced: bool, borne: str,
                     baseline: dict[int, list[float]], step_s: float, found: Arrivals,
                     summaries: dict[int, RankSummary], calls: Sequence[ExtraCall] | None = None,
                     by_calls: bool = False, calls_in: float | None = None) -> Straggler:
    """The straggler finding, its evidence in words; ``calls``: its extra calls, where the ranks' ops are known;
    ``by_calls``: found by them (``excess_s`` their time, ``calls_in`` seconds of it in ``cause`` where known), not
    by its step less its waits."""
    cause_share = _cause_share(excess, cause)
    others_wait = statistics.median(a.waiting_s for a in others)
    others_phase = statistics.median(a.own_phases_s[cause] for a in others)
    last = sum(x > 0 for x in slow.late_s)
    late = statistics.median(slow.late_s)
    busy = [a.cpu_wait_s for a in (slow, *others) if a.cpu_wait_s]
    arrived = (f"it arrives last at the collectives in {last} of {len(slow.late_s)} profiled steps, "
               f"{late * 1e3:.1f} ms after the others at the median")
    if busy and max(busy) >= th.STRAGGLER_ARRIVAL_SHARE * step_s:
        arrived += (f" (the machine is busy: the ranks waited up to {max(busy) * 1e3:.1f} ms a step for a CPU, "
                    "which moves the arrivals about and is left out of their own work)")
    more_work = (f"rank {slow.rank} does {excess_s * 1e3:.1f} ms more work a step than the other ranks "
                 f"({excess_s / step_s:.0%} of the {step_s * 1e3:.1f} ms profiled step; more in {more} of {count} "
                 "steps)") if not paced else (
        f"rank {slow.rank} does {excess_s * 1e3:.1f} ms more work a step in its {_phase_words(cause)} than its pace in "
        f"its other phases, set against the other ranks', predicts ({excess_s / step_s:.0%} of the "
        f"{step_s * 1e3:.1f} ms profiled step; more in {more} of {count} steps; its whole step's excess, "
        f"{statistics.median(baseline[slow.rank]) * 1e3:.1f} ms, is hidden by a core faster in the rest)")
    if by_calls:
        whole = statistics.median(baseline[slow.rank])
        ran = f"; {calls_in * 1e3:.1f} ms of them in its {_phase_words(cause)}" if calls_in is not None else ""
        more_work = (f"rank {slow.rank} runs {excess_s * 1e3:.1f} ms a step of op calls the other ranks do not make "
                     f"({excess_s / step_s:.0%} of the {step_s * 1e3:.1f} ms profiled step{ran}): "
                     f"{_calls_words(calls or ())}")
        borne = (f"its step less its waits reads {abs(whole) * 1e3:.1f} ms a step {'over' if whole >= 0 else 'under'} "
                 "theirs: where the machine is busy the waits move about by as much as its work, and its extra calls "
                 "are the measure")
    elif calls is not None and sum(c[3] for c in calls) >= th.STRAGGLER_EXTRA_OPS * step_s:
        borne += f"; the ops it calls more often than the others: {_calls_words(calls)}"
    elif calls is not None:
        borne += ("; it calls every op about as often as the others: its extra time is the same calls taking longer "
                  "(larger inputs, or a slower core)")
    phase = (f"its own {_phase_words(cause)} takes {slow.own_phases_s[cause] * 1e3:.1f} ms a step, the other ranks' "
             f"{others_phase * 1e3:.1f} ms: {excess[cause] * 1e3:.1f} ms more, {cause_share:.0%} of its extra work"
             ) if excess[cause] > 0 else "no phase of its own work reads longer than the other ranks'"
    evidence = (
        f"{more_work}, and they wait for it: {arrived}",
        f"{phase}; {borne}",
        f"meanwhile the other ranks sit waiting for a later rank {others_wait * 1e3:.1f} ms a step; the "
        f"collectives' own time, from the last arrival to their end, is {found.own_s * 1e3:.1f} ms a step",
    )
    spreads = [summaries[a.rank].spread_s for a in others if summaries[a.rank].spread_s is not None]
    return Straggler(rank=slow.rank, late_s=excess_s, late_share=min(1.0, excess_s / step_s), cause=cause,
                     evidence=evidence, cause_share=cause_share,
                     spread_s=statistics.median(spreads) if spreads else None,  # type: ignore[type-var]
                     others_wait_s=others_wait, arrived_last=last, steps_matched=len(slow.late_s), basis="arrivals")


def _phase_excess(slow: RankArrival, others: Sequence[RankArrival]) -> dict[str, float]:
    """A rank's own work in each phase over the other ranks' (their median), seconds a step."""
    return {p: slow.own_phases_s[p] - statistics.median(a.own_phases_s[p] for a in others) for p in PHASES}


def _cause_share(excess: dict[str, float], cause: str) -> float:
    """The share of a rank's extra work (summed over the phases where it does more) that lies in ``cause``."""
    return min(1.0, max(0.0, excess[cause]) / (sum(max(0.0, e) for e in excess.values()) or 1.0))


PACED_PHASES = ("data_wait", "forward", "optimizer", "other")
"""The phases ``_concentrated`` sets against a rank's pace: not backward, which a data-parallel job's gradient
all-reduces overlap, their threads taking the rank's cores unevenly (on the 2-core machine, balanced jobs beside 2 busy
processes: a rank's backward 14.6 ms over its pace in 1 job of 5); a straggler there is one by its whole step."""


def _concentrated(timed: Sequence[RankArrival], step_s: float) -> tuple[RankArrival, str, float, int] | None:
    """The rank with ``STRAGGLER_ARRIVAL_SHARE`` of the step more work in one phase than its pace in the other
    phases predicts, in ``STRAGGLER_LAST_STEPS`` of the steps: its phase, that excess (the median over the steps)
    and the steps it held in. On a busy machine a rank whose threads share a core with another process runs every
    phase slower (on the 2-core machine 20% slower for the whole run), and one that drew the faster core runs them
    faster: a straggler's own extra work in one phase then stands out against its pace in the others, not against
    the other ranks' step: each step, the phase's own work less the other ranks' (their median) scaled by the ratio
    of the rank's work to theirs in its other phases."""
    count = len(timed[0].own_steps_s)
    if any(len(a.own_phase_steps_s) != count for a in timed):
        return None
    best: tuple[RankArrival, str, float, int] | None = None
    for rank in timed:
        others = [a for a in timed if a is not rank]
        theirs_by_step = [{p: statistics.median(a.own_phase_steps_s[s][p] for a in others) for p in PHASES}
                          for s in range(count)]
        for phase in PACED_PHASES:
            residuals = [_beyond_pace(rank.own_phase_steps_s[s], theirs_by_step[s], phase)[1] for s in range(count)]
            excess_s, more = statistics.median(residuals), sum(r > 0 for r in residuals)
            if (excess_s >= th.STRAGGLER_ARRIVAL_SHARE * step_s and more >= th.STRAGGLER_LAST_STEPS * count
                    and (best is None or excess_s > best[2])):
                best = rank, phase, excess_s, more
    return best


def _beyond_pace(mine: dict[str, float], theirs: dict[str, float], phase: str) -> tuple[float, float]:
    """A rank's pace (its work in the phases other than ``phase`` over the other ranks', held to 0.5-2x), and how far
    its work in ``phase`` exceeds theirs at that pace: its own extra work there, a slower core taken out."""
    rest_mine = sum(v for p, v in mine.items() if p != phase)
    rest_theirs = sum(v for p, v in theirs.items() if p != phase)
    pace = min(2.0, max(0.5, rest_mine / rest_theirs)) if rest_theirs > 0 else 1.0
    return pace, mine[phase] - pace * theirs[phase]


def _phase_words(phase: str) -> str:
    return {"data_wait": "data loading", "backward": "backward (up to its gradients' all-reduce)",
            "other": "work outside the named phases"}.get(phase, phase)


def by_own_work(ranks: Sequence[RankSummary]) -> Straggler | None:
    """The rank the others wait for, if it is late by at least ``STRAGGLER_SHARE`` of the job's median step, by more
    than the other ranks' own steps stray from their median (half their 10th-90th percentile range: lateness within
    it is noise, as on a loaded machine), and its steps' phases hold extra work to match (``STRAGGLER_EXPLAINED`` of
    the lateness at least)."""
    timed = [r for r in ranks if r.steps and r.comm_exposed_s is not None]
    if len(timed) < 2:
        return None
    own = {r.rank: max(0.0, r.median_s - (r.comm_exposed_s or 0.0)) for r in timed}
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


def job_verdict(verdict: Verdict, late: Straggler | None) -> Verdict:
    """A job's verdict: the straggler's own (it sets the pace), led by the straggler finding; else the rank's."""
    if late is None:
        return verdict
    return Verdict(verdict.bound, verdict.confidence, (*late.evidence, *verdict.evidence))


def _phase_s(rank: RankSummary, phase: str) -> float:
    return getattr(rank.breakdown, phase) * rank.median_s
