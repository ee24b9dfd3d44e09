"""Across ranks, collective by collective: who arrived last, who waited for whom, and what is the collectives' own
time. Every expected figure is worked out by hand in the test from the calls it builds."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import make_record
from gpuscope.diagnose import analyze
from gpuscope.diagnose.arrival import Arrivals, RankArrival, arrivals
from gpuscope.diagnose.classify import classify
from gpuscope.diagnose.ranks import (RankOps, combine, extra_by_phase, extra_calls, late_for_a_core, rank_ops,
                                      straggler)
from gpuscope.diagnose.rules.communication import balance_ranks, reduce_communication
from gpuscope.record import (Breakdown, CollectiveCall, Communication, Distributed, OpProfile, OpStat,
                             ProfiledStep, RankSummary, RunRecord, Steps, Straggler)

STEP_US = 60_000.0


def ddp_rank(late_backward_us: float, offset_us: float = 0.0, steps: int = 3) -> Communication:
    """A DDP rank's profiled steps, each 60 ms: data 2 ms, forward 10 ms, backward from 12 ms for 20 ms plus
    ``late_backward_us``; two buckets: the first ready 8 ms into backward (its all-reduce overlaps the rest of
    backward: the thread stays busy), the second when backward ends; both end when the later rank's arrives and
    the collective's own work is done: 5.5 ms after the latest first-bucket arrival, 2 ms after the latest second.
    On the clock of its own host, ``offset_us`` apart from the other rank's."""
    calls, spans = [], []
    for n in range(steps):
        t0 = n * STEP_US + offset_us
        backward_end = t0 + 32_000 + late_backward_us
        first = t0 + 20_000 + late_backward_us / 24  # the hook's work mostly lands in the second bucket
        calls.append(CollectiveCall(10 + n, "all_reduce", first, t0 + 20_500 + 5_500, ()))
        second_end = t0 + 44_000 + 2_000  # the late rank (12 ms) arrives at 44 ms
        calls.append(CollectiveCall(10 + n, "all_reduce", backward_end, second_end,
                                    ((backward_end, second_end, "other"),)))
        other_ms = (STEP_US - 2_000 - 10_000 - (20_000 + late_backward_us) - 3_000) / 1e6
        spans.append(ProfiledStep(10 + n, t0, t0 + STEP_US, {
            "data_wait": 0.002, "forward": 0.010, "backward": (20_000 + late_backward_us) / 1e6, "optimizer": 0.003,
            "other": other_ms}))
    exposed = sum(c.end_us - c.arrival_us for c in calls[1::2]) / 1e6 / steps
    return Communication(calls_per_step=2, comm_s=0.012, exposed_s=exposed, backend="gloo", measured_on="host",
                         step_s=STEP_US / 1e6, calls=tuple(calls), profiled_steps=tuple(spans))


def test_the_last_to_arrive_sets_the_others_waits_and_the_collectives_own_time() -> None:
    # given: rank 1's backward takes 12 ms longer (a gradient hook), so it arrives at the second bucket at 44 ms,
    # rank 0 at 32 ms; at the first bucket rank 1 is 0.5 ms later, while rank 0 still runs backward
    found = arrivals({0: ddp_rank(0), 1: ddp_rank(12_000)})
    assert found is not None and found.steps == 3 and found.collectives == 6
    fast, slow = found.of(0), found.of(1)
    # then: rank 0 sat idle waiting for rank 1 from 32 to 44 ms (the first bucket's 0.5 ms wait was overlapped)
    assert fast.waiting_s == pytest.approx(0.012)
    assert fast.waiting_by_phase["other"] == pytest.approx(0.012) and fast.waiting_by_phase["backward"] == 0
    assert slow.waiting_s == 0
    # rank 1 arrived 12 ms after rank 0 at the step's latest collective, every step; rank 0 at most 0.5 ms before
    assert slow.late_s == pytest.approx((0.012,) * 3)
    assert fast.late_s == pytest.approx((-0.0005,) * 3)
    # the collectives' own time, from the last arrival to the end: 5.5 ms (first bucket) + 2 ms (second)
    assert found.own_s == pytest.approx(0.0075)
    # each rank's own work: its phases less its idle time inside collectives (rank 0: 14 ms of its "other")
    assert fast.own_phases_s["other"] == pytest.approx(0.025 - 0.014)
    assert slow.own_phases_s["other"] == pytest.approx(0.013 - 0.002)
    assert slow.own_phases_s["backward"] - fast.own_phases_s["backward"] == pytest.approx(0.012)
    assert found.clock == "shared"


def test_the_rank_that_does_more_work_step_after_step_is_the_straggler_with_its_phase() -> None:
    found = arrivals({0: ddp_rank(0), 1: ddp_rank(12_000)})
    ranks = [RankSummary(rank=r, steps=20, median_s=0.06, spread_s=0.03) for r in (0, 1)]
    late = straggler(ranks, found)
    assert late is not None and late.rank == 1 and late.cause == "backward" and late.basis == "arrivals"
    # 58 ms of own work against 46 ms: 12 ms, 20% of the 60 ms profiled step, all of it in backward
    assert late.late_s == pytest.approx(0.012) and late.late_share == pytest.approx(0.2)
    assert late.cause_share == pytest.approx(1.0)
    assert late.others_wait_s == pytest.approx(0.012) and late.arrived_last == 3 and late.steps_matched == 3
    assert "rank 1 does 12.0 ms more work a step" in late.evidence[0]
    assert "arrives last at the collectives in 3 of 3 profiled steps" in late.evidence[0]
    assert "its own backward" in late.evidence[1]


def test_ranks_on_different_hosts_are_set_on_one_clock_by_the_collectives_ends() -> None:
    # given: rank 1's host clock reads 5 s ahead of rank 0's
    found = arrivals({0: ddp_rank(0), 1: ddp_rank(12_000, offset_us=5e6)}, {0: "node-a", 1: "node-b"})
    assert found is not None and found.clock == "aligned"
    assert found.of(0).waiting_s == pytest.approx(0.012) and found.of(1).late_s == pytest.approx((0.012,) * 3)


def test_balanced_ranks_name_no_straggler() -> None:
    found = arrivals({0: ddp_rank(0), 1: ddp_rank(500)})  # 0.5 ms apart: noise
    ranks = [RankSummary(rank=r, steps=20, median_s=0.06) for r in (0, 1)]
    assert straggler(ranks, found) is None


def test_a_rank_late_in_one_step_of_three_is_not_a_straggler() -> None:
    slow = ddp_rank(12_000)
    even = ddp_rank(0)
    # rank 1 does the extra work in the first step only
    calls = (*slow.calls[:2], *even.calls[2:])
    spans = (slow.profiled_steps[0], *even.profiled_steps[1:])
    found = arrivals({0: ddp_rank(0), 1: dataclasses.replace(even, calls=calls, profiled_steps=spans)})
    assert straggler([RankSummary(rank=r, steps=20, median_s=0.06) for r in (0, 1)], found) is None


def test_collectives_that_do_not_match_across_ranks_are_not_set_side_by_side() -> None:
    one = ddp_rank(0)
    other = dataclasses.replace(ddp_rank(0), calls=ddp_rank(0).calls[::2])  # a call a step fewer
    assert arrivals({0: one, 1: other}) is None
    assert arrivals({0: one}) is None


def job_rank(rank: int, comm: Communication) -> object:
    steps = Steps(count=20, median_s=0.06, mean_s=0.06, p10_s=0.055, p90_s=0.065, min_s=0.05, max_s=0.07, total=30)
    return dataclasses.replace(make_record(steps=steps), distributed=Distributed(rank=rank, world_size=2),
                               op_profile=OpProfile(ops=100, ops_per_step=50, steps=3, communication=comm))


def test_a_job_held_back_by_one_rank_is_advised_to_balance_it_not_to_send_less() -> None:
    # given: rank 0 waits 14 ms a step inside collectives, 12 of them for rank 1
    job = merge_ranks([job_rank(0, ddp_rank(0)), job_rank(1, ddp_rank(12_000))])
    assert job.straggler is not None and job.straggler.rank == 1
    ids = [r.id for r in job.recommendations]
    assert "balance-ranks" in ids and "reduce-communication" not in ids
    advice = next(r for r in job.recommendations if r.id == "balance-ranks")
    assert advice.expected_gain == pytest.approx(0.2)  # the others' 12 ms wait of the 60 ms step
    assert "backward" in advice.fix
    (waiting,) = [r for r in job.ranks if r.rank == 0]
    assert waiting.waiting_s == pytest.approx(0.012) and waiting.profiled_step_s == pytest.approx(0.06)


def test_a_rank_idle_after_the_collectives_end_waits_to_run_again_it_does_not_communicate() -> None:
    # given rank 1, 12 ms late, whose thread runs again 10 ms after the last bucket's all-reduce ended (its core busy
    # with another process): idle 44 -> 56 ms, where rank 0, which waited for it from 32 ms, ran again at 46 ms
    late = ddp_rank(12_000)
    calls = tuple(dataclasses.replace(c, end_us=c.end_us + 10_000, idle=((c.idle[0][0], c.idle[0][1] + 10_000,
                                                                          "other"),)) if c.idle else c
                  for c in late.calls)
    late = dataclasses.replace(late, calls=calls, exposed_s=late.exposed_s + 0.010)
    job = merge_ranks([job_rank(0, ddp_rank(0)), job_rank(1, late)])
    comm = job.op_profile.communication
    # then the job's collectives took 2 ms of their own a step, as rank 0 saw them (its 14 ms idle less its 12 ms
    # wait), not rank 1's 12: no advice to send less
    assert comm.least_own_s == pytest.approx(0.002) and comm.own_exposed_s == pytest.approx(0.002)
    assert "reduce-communication" not in [r.id for r in job.recommendations]


def test_a_rank_kept_late_by_its_core_is_said_to_be_the_machines_not_a_straggler() -> None:
    # given rank 1 arriving 12 ms after rank 0 at the last bucket every step, its thread having waited 13 ms a step
    # for a CPU (rank 0: 1 ms): its own work is rank 0's, as on a core shared with another process
    def waiting_for_cpu(comm: Communication, cpu_wait_s: float) -> Communication:
        steps = tuple(dataclasses.replace(s, cpu_wait_s=cpu_wait_s) for s in comm.profiled_steps)
        return dataclasses.replace(comm, profiled_steps=steps)

    job = merge_ranks([job_rank(0, waiting_for_cpu(ddp_rank(0), 0.001)),
                       job_rank(1, waiting_for_cpu(ddp_rank(12_000), 0.013))])
    # then no straggler, and the others' 12 ms wait is put down to the machine, with the figures it rests on
    assert job.straggler is None
    assert ("rank 1 arrived last at the collectives in every profiled step (12-12 ms after the others), with no more "
            "work of its own than theirs: its training thread waited for a CPU 13.0 ms a step, 12.0 ms more than "
            "theirs. The others' 12.0 ms a step waiting for it is the machine's") in " ".join(job.meta.notes)
    # where its CPU wait is the others' (its lateness is its own work: a straggler), or unmeasured, no such note
    for cpu_wait_s in (0.001, None):
        found = arrivals({0: waiting_for_cpu(ddp_rank(0), 0.001), 1: waiting_for_cpu(ddp_rank(12_000), cpu_wait_s)})
        assert found is not None and late_for_a_core(found) == ()


def test_a_wait_for_a_late_rank_is_not_communication() -> None:
    # given: 36 ms a step idle inside collectives of a 60 ms step, 30 of them waiting for a later rank
    comm = Communication(calls_per_step=2, comm_s=0.04, exposed_s=0.036, backend="gloo", step_s=0.06,
                         waiting_s=0.030)
    record = job_rank(0, comm)
    assert classify(record).bound != "communication"
    assert reduce_communication(record) is None  # 6 ms of its own: 10%, under the 20% worth cutting
    # while the same wait with no later rank to wait for is communication, of the profiled step
    alone = job_rank(0, dataclasses.replace(comm, waiting_s=None))
    assert classify(alone).bound == "communication"
    assert "60% of each step: 36.0 ms of the 60.0 ms profiled step" in classify(alone).evidence[0]


def test_no_share_of_a_step_exceeds_the_whole_step() -> None:
    # the profiled window's waits over the steady median would be 150%; of the profiled steps they are 90%
    comm = Communication(calls_per_step=1, comm_s=0.09, exposed_s=0.09, backend="gloo", step_s=0.1)
    record = dataclasses.replace(job_rank(0, comm), steps=dataclasses.replace(job_rank(0, comm).steps, median_s=0.06))
    assert "90% of each step" in classify(record).evidence[0]
    over = dataclasses.replace(comm, exposed_s=0.2)
    assert "100% of each step" in classify(job_rank(0, over)).evidence[0]


def test_balance_ranks_reads_only_a_jobs_straggler() -> None:
    record = job_rank(0, ddp_rank(0))
    assert balance_ranks(record) is None
    late = Straggler(rank=1, late_s=0.012, late_share=0.2, cause="data_wait", evidence=("rank 1 is 12 ms late",),
                     others_wait_s=0.009)
    finding = balance_ranks(dataclasses.replace(record, straggler=late))
    assert finding is not None and finding.gain == pytest.approx(0.009 / 0.06)
    assert "num_workers" in (finding.fix or "")


def paced(rank: int, pace: float, forward_extra_s: float = 0.0, steps: int = 3) -> RankArrival:
    """A rank's own work on a core ``pace`` times as slow as the others', each profiled step 80 ms: data 2 ms,
    forward 20 ms (plus ``forward_extra_s`` of its own extra work), backward 30 ms, optimizer 10 ms, all x pace."""
    phases = {"data_wait": 0.002, "forward": 0.020 + forward_extra_s, "backward": 0.030, "optimizer": 0.010,
              "other": 0.0}
    own = {p: v * pace for p, v in phases.items()}
    return RankArrival(rank=rank, late_s=(0.0,) * steps, own_steps_s=(sum(own.values()),) * steps, waiting_s=0.0,
                       waiting_by_phase=dict.fromkeys(own, 0.0), own_phases_s=own, cpu_wait_s=None, exposed_s=0.0,
                       step_s=0.080, own_phase_steps_s=(own,) * steps)


def test_a_stragglers_extra_work_in_one_phase_shows_against_its_pace_on_a_faster_core() -> None:
    # given rank 1 with 12 ms more forward a step, on a core 15% faster than rank 0's: its phases are 0.85 x (2, 32,
    # 30, 10) ms = 1.7, 27.2, 25.5, 8.5 ms, 62.9 ms in all against rank 0's 62: its whole step is 0.9 ms over
    found = Arrivals((paced(0, 1.0), paced(1, 0.85, forward_extra_s=0.012)), steps=3, collectives=6, own_s=0.002,
                     clock="shared")
    late = straggler([steady(0, forward_s=0.020), steady(1, forward_s=0.0272)], found)
    # then its forward is 27.2 ms where its pace in the other phases, 35.7 / 42 = 0.85, predicts 0.85 x 20 = 17 ms:
    # 10.2 ms more, over 12% of the 80 ms step (9.6 ms), in 3 of 3 steps
    assert late is not None and (late.rank, late.cause) == (1, "forward")
    assert late.late_s == pytest.approx(0.0102)
    assert "than its pace in its other phases, set against the other ranks', predicts" in late.evidence[0]
    assert "its whole step's excess, 0.9 ms, is hidden by a core faster in the rest" in late.evidence[0]
    # and the run's steady steps bear it out: its forward 7.2 ms over rank 0's there, 9% of the 80 ms step
    assert "over the run's steady steps too its forward takes 7.2 ms more" in late.evidence[1]


def test_a_rank_held_back_by_its_core_more_than_its_pace_predicts_work_is_the_machines() -> None:
    # given the faster-core straggler above (10.2 ms beyond its pace in forward), arriving last 14 ms after rank 0
    # every step, which waits 14 ms a step for it; but its training thread waited for a CPU 13 ms a step, rank 0's 1
    def held(arrival: RankArrival, cpu_wait_s: float, late_s: float, waiting_s: float) -> RankArrival:
        return dataclasses.replace(arrival, cpu_wait_s=cpu_wait_s, late_s=(late_s,) * 3, waiting_s=waiting_s)

    def job(slow_cpu_wait_s: float) -> Arrivals:
        return Arrivals((held(paced(0, 1.0), 0.001, -0.014, 0.014),
                         held(paced(1, 0.85, forward_extra_s=0.012), slow_cpu_wait_s, 0.014, 0.0)),
                        steps=3, collectives=6, own_s=0.002, clock="shared")

    ranks = [steady(0, forward_s=0.020), steady(1, forward_s=0.0272)]
    # then its wait for a core, 12 ms over rank 0's, exceeds the 10.2 ms of work its pace predicts and is over half
    # rank 0's wait for it: the machine holds it back more than its work, no straggler; the note says whose it is
    assert straggler(ranks, job(0.013)) is None
    assert late_for_a_core(job(0.013))
    # with its wait for a core 9 ms over rank 0's, under its 10.2 ms of extra work, it is named as before
    late = straggler(ranks, job(0.010))
    assert late is not None and (late.rank, late.cause) == (1, "forward")


def steady(rank: int, forward_s: float, median_s: float = 0.08) -> RankSummary:
    """A rank's steady steps (the whole run's, outside the profiled ones): ``forward_s`` of a ``median_s`` step, the
    rest spread over the other phases."""
    rest = (median_s - forward_s) / 4
    return RankSummary(rank=rank, steps=20, median_s=median_s,
                       breakdown=Breakdown(data_wait=rest / median_s, forward=forward_s / median_s,
                                           backward=rest / median_s, optimizer=rest / median_s, other=rest / median_s))


def test_extra_work_in_the_profiled_steps_that_the_steady_steps_do_not_show_is_no_straggler() -> None:
    # given rank 1 with 12 ms more forward in the three profiled steps (a burst of load beside it, say), and its
    # forward in the run's steady steps 2 ms over rank 0's: 2.5% of the step, under the 6% that would bear it out
    found = Arrivals((paced(0, 1.0), paced(1, 1.0, forward_extra_s=0.012)), steps=3, collectives=6, own_s=0.002,
                     clock="shared")
    assert straggler([steady(0, forward_s=0.020), steady(1, forward_s=0.022)], found) is None
    # the same with the steady steps showing it (its forward 10 ms over, 12.5%) names it
    late = straggler([steady(0, forward_s=0.020), steady(1, forward_s=0.030)], found)
    assert late is not None and (late.rank, late.cause) == (1, "forward")


def test_a_rank_slower_in_every_phase_the_whole_run_is_no_straggler_by_its_largest_phase() -> None:
    # given rank 1 on a core 1.3x slower, the whole run long: its own work in each profiled step is 1.3 x (2, 40, 20,
    # 10) ms, 93.6 ms against 72 ms (27% of the 80 ms step, its forward 12 ms over), and its steady forward longer too
    def rank(r: int, pace: float) -> RankArrival:
        own = {"data_wait": 0.002 * pace, "forward": 0.040 * pace, "backward": 0.020 * pace,
               "optimizer": 0.010 * pace, "other": 0.0}
        return RankArrival(rank=r, late_s=(0.02,) * 3 if pace > 1 else (-0.02,) * 3,
                           own_steps_s=(sum(own.values()),) * 3, waiting_s=0.0, waiting_by_phase=dict.fromkeys(own, 0.0),
                           own_phases_s=own, cpu_wait_s=None, exposed_s=0.0, step_s=0.080, own_phase_steps_s=(own,) * 3)

    found = Arrivals((rank(0, 1.0), rank(1, 1.3)), steps=3, collectives=6, own_s=0.002, clock="shared")
    # then its forward is what its pace in its other phases (1.3x) predicts, 52 ms: no work of its own beyond it
    assert straggler([steady(0, forward_s=0.040), steady(1, forward_s=0.052)], found) is None


def test_a_rank_late_in_backward_must_be_late_by_enough_in_every_profiled_step() -> None:
    # given rank 1 arriving last in every profiled step of 50 ms, its own work 1.4, 7.2 and 11.9 ms over rank 0's
    # (a core that slowed as the window went on, as a balanced job run alone in CI showed), all of it in backward
    def rank(r: int, extra: tuple[float, ...]) -> RankArrival:
        steps = tuple({"data_wait": 0.002, "forward": 0.010, "backward": 0.020 + x, "optimizer": 0.003, "other": 0.0}
                      for x in extra)
        mean = {p: sum(s[p] for s in steps) / len(steps) for p in steps[0]}
        return RankArrival(rank=r, late_s=tuple(0.005 if r else -0.005 for _ in extra),
                           own_steps_s=tuple(sum(s.values()) for s in steps), waiting_s=0.0,
                           waiting_by_phase=dict.fromkeys(mean, 0.0), own_phases_s=mean, cpu_wait_s=None,
                           exposed_s=0.0, step_s=0.050, own_phase_steps_s=steps)

    ranks = [RankSummary(rank=r, steps=20, median_s=0.05) for r in (0, 1)]
    uneven = Arrivals((rank(0, (0, 0, 0)), rank(1, (0.0014, 0.0072, 0.0119))), steps=3, collectives=6, own_s=0.002,
                      clock="shared")
    # then its median, 7.2 ms, is over 12% of the step, but its least step, 1.4 ms, is under 8% (4 ms): not named
    assert straggler(ranks, uneven) is None
    # while 7 ms more in each step is
    even = Arrivals((rank(0, (0, 0, 0)), rank(1, (0.007, 0.007, 0.007))), steps=3, collectives=6, own_s=0.002,
                    clock="shared")
    late = straggler(ranks, even)
    assert late is not None and late.cause == "backward"
    assert "arrives last at the collectives in every one of the 3 profiled steps, and does at least 7.0 ms more in " \
           "each" in late.evidence[1]


def test_a_rank_whose_extra_work_lies_mostly_outside_the_phase_named_is_no_straggler() -> None:
    # given rank 1 arriving last in every profiled step of 50 ms with 6.5 ms more work in each (13% of the step):
    # 2.8 ms of it in backward, 2.2 ms in forward, 1.5 ms in the optimizer, as a balanced job's rank run alone in CI
    def rank(r: int, backward: float, forward: float, optimizer: float) -> RankArrival:
        own = {"data_wait": 0.002, "forward": 0.010 + forward, "backward": 0.020 + backward,
               "optimizer": 0.003 + optimizer, "other": 0.0}
        return RankArrival(rank=r, late_s=(0.005 if r else -0.005,) * 3, own_steps_s=(sum(own.values()),) * 3,
                           waiting_s=0.0, waiting_by_phase=dict.fromkeys(own, 0.0), own_phases_s=own,
                           cpu_wait_s=None, exposed_s=0.0, step_s=0.050, own_phase_steps_s=(own,) * 3)

    ranks = [RankSummary(rank=r, steps=20, median_s=0.05) for r in (0, 1)]
    spread = Arrivals((rank(0, 0, 0, 0), rank(1, 0.0028, 0.0022, 0.0015)), steps=3, collectives=6, own_s=0.002,
                      clock="shared")
    # then backward, the largest, holds 43% of the extra work, under the half a straggler's one place holds: none
    assert straggler(ranks, spread) is None
    # while the same 6.5 ms with 3.5 of it (54%) in backward is one
    late = straggler(ranks, Arrivals((rank(0, 0, 0, 0), rank(1, 0.0035, 0.0015, 0.0015)), steps=3, collectives=6,
                                     own_s=0.002, clock="shared"))
    assert late is not None and late.cause == "backward" and late.cause_share == pytest.approx(3.5 / 6.5)


def test_a_rank_late_in_backward_must_arrive_last_in_every_profiled_step() -> None:
    # given rank 1 with 12 ms more backward in each profiled step, but arriving after rank 0 in two steps of three:
    # the others' steady backward holds their wait for it (loss.backward() returns once the last bucket is reduced)
    # and cannot bear it out, so its arrivals must, every step
    found = arrivals({0: ddp_rank(0), 1: ddp_rank(12_000)})
    assert found is not None
    ranks = [RankSummary(rank=r, steps=20, median_s=0.06, spread_s=0.03) for r in (0, 1)]
    assert straggler(ranks, found) is not None
    late_twice = dataclasses.replace(found.of(1), late_s=(0.012, -0.001, 0.012))
    shuffled = dataclasses.replace(found, ranks=(found.of(0), late_twice))
    assert straggler(ranks, shuffled) is None


def test_a_rank_slower_in_every_phase_alike_is_no_straggler_by_its_phases() -> None:
    # given rank 1 10% slower in every phase (a shared core): 6.2 ms more a step, under 12% of the step
    found = Arrivals((paced(0, 1.0), paced(1, 1.1)), steps=3, collectives=6, own_s=0.002, clock="shared")
    # then no phase stands out against its pace: no straggler, though its steady forward is 2 ms longer too
    assert straggler([steady(0, forward_s=0.020), steady(1, forward_s=0.022)], found) is None


def merge_ranks(records: list) -> object:
    """The job's record from its ranks', diagnosed, as ``gpuscope run --nproc-per-node`` writes it."""
    return analyze(combine(records))


# -- the ranks' traced ops side by side ------------------------------------------------------------------------
def side_by_side(extra: dict[str, tuple[float, float]] | None = None, on_device: bool = False) -> RankOps:
    """Two ranks' ops a step as a 2-layer model's DDP step calls them (calls, self seconds), rank 1 with ``extra``
    ops on top (a gradient hook's arithmetic)."""
    model = {"aten::addmm": (5.0, 0.010), "aten::mm": (9.0, 0.020), "aten::relu": (4.0, 0.001)}
    mine = dict(model)
    for name, (calls, self_s) in (extra or {}).items():
        had = mine.get(name, (0.0, 0.0))
        mine[name] = (had[0] + calls, had[1] + self_s)
    return RankOps({0: model, 1: mine}, on_device=on_device)


def test_the_ops_a_rank_calls_more_often_are_its_extra_work() -> None:
    # given rank 1 calling 69 tanh and 69 more small matmuls a step (5 and 15 ms) besides the model's ops
    ops = side_by_side({"aten::tanh": (69.0, 0.005), "aten::mm": (69.0, 0.015)})
    # then those are its extra calls: tanh all of its 5 ms, mm its 35 ms less rank 0's 20 ms
    rows = extra_calls(1, ops)
    assert [r[:3] for r in rows] == [("aten::mm", 78.0, 9.0), ("aten::tanh", 69.0, 0.0)]
    assert [r[3] for r in rows] == pytest.approx([0.015, 0.005])
    # and rank 0 has none; the same ops as often, each slower, are none either
    assert extra_calls(0, ops) == ()
    slower = RankOps({0: ops.per_step[0], 1: {n: (c, t * 1.3) for n, (c, t) in ops.per_step[0].items()}}, False)
    assert extra_calls(1, slower) == ()


def test_extra_calls_count_no_more_than_their_share_of_the_ops_time() -> None:
    # given rank 1 calling mm 18 times a step in 30 ms against rank 0's 9 in 20 ms
    ops = RankOps({0: {"aten::mm": (9.0, 0.020)}, 1: {"aten::mm": (18.0, 0.030)}}, on_device=False)
    # then its extra calls take its time over rank 0's, 10 ms (their share of its time, half, would be 15 ms)
    assert extra_calls(1, ops)[0][3] == pytest.approx(0.010)
    # and where its shared calls are much slower too (18 calls in 50 ms), no more than the extra calls' half, 25 ms
    slow_shared = RankOps({0: {"aten::mm": (9.0, 0.020)}, 1: {"aten::mm": (18.0, 0.050)}}, on_device=False)
    assert extra_calls(1, slow_shared)[0][3] == pytest.approx(0.025)
    # on a core 20% faster (its addmm, called as often as rank 0's, 8 ms against 10) the shared 9 mm calls take
    # 16 ms of its 24, leaving 8 ms to the 9 extra ones, not the 4 ms over rank 0's
    faster = RankOps({0: {"aten::addmm": (5.0, 0.010), "aten::mm": (9.0, 0.020)},
                      1: {"aten::addmm": (5.0, 0.008), "aten::mm": (18.0, 0.024)}}, on_device=False)
    assert extra_calls(1, faster)[0][3] == pytest.approx(0.008)
    # on a slower one (addmm 15 ms) its extra calls are slowed as much: nothing more is taken off them than 20 ms
    slower = RankOps({0: faster.per_step[0], 1: {"aten::addmm": (5.0, 0.015), "aten::mm": (18.0, 0.024)}}, False)
    assert extra_calls(1, slower)[0][3] == pytest.approx(0.004)
    # half a call a step more is no extra call (a sampler's one call in two steps)
    assert extra_calls(1, RankOps({0: {"aten::normal_": (1.0, 0.001)}, 1: {"aten::normal_": (1.4, 0.0015)}},
                                  False)) == ()


def test_a_rank_late_in_backward_alone_that_calls_no_op_more_often_on_a_cpu_is_slower_not_a_straggler() -> None:
    # given rank 1 arriving 12 ms late in backward every step (20% of the 60 ms step), named by its step alone
    found = arrivals({0: ddp_rank(0), 1: ddp_rank(12_000)})
    assert found is not None
    ranks = [RankSummary(rank=r, steps=20, median_s=0.06, spread_s=0.03) for r in (0, 1)]
    assert straggler(ranks, found) is not None
    # when its traced ops are the others', as often (each slower), on a CPU: no straggler, and a note says why
    notes: list[str] = []
    assert straggler(ranks, found, side_by_side(), notes) is None
    assert len(notes) == 1 and notes[0].startswith(
        "rank 1 arrived last at the collectives in every profiled step, its own backward 12.0 ms a step longer than "
        "the other ranks' (20% of the 60.0 ms profiled step), yet it called every op as often as they did")
    assert "and its forward took 0.0 ms more than theirs: not more work or larger inputs" in notes[0]
    # a rank whose forward is 5 ms longer too (8% of the step), as larger inputs make it, is named all the same
    slow = found.of(1)
    forward = {**slow.own_phases_s, "forward": slow.own_phases_s["forward"] + 0.005}
    longer = dataclasses.replace(slow, own_phases_s=forward, own_steps_s=tuple(x + 0.005 for x in slow.own_steps_s))
    late = straggler(ranks, dataclasses.replace(found, ranks=(found.of(0), longer)), side_by_side())
    assert late is not None and (late.rank, late.cause) == (1, "backward")
    assert late.evidence[1].endswith("it calls every op about as often as the others: its extra time is the same "
                                     "calls taking longer (larger inputs, or a slower core)")
    # on a GPU a slower device is a straggler of its own
    assert straggler(ranks, found, side_by_side(on_device=True)) is not None
    # and with 12 ms of calls rank 0 does not make it is one, its ops named
    late = straggler(ranks, found, side_by_side({"aten::tanh": (69.0, 0.004), "aten::mm": (69.0, 0.008)}))
    assert late is not None and (late.rank, late.cause) == (1, "backward")
    assert late.evidence[1].endswith("the ops it calls more often than the others: aten::mm 78 calls a step against "
                                     "9 (8.0 ms); aten::tanh 69 calls a step against none (4.0 ms)")


def test_a_rank_whose_extra_calls_take_8_percent_of_the_step_is_a_straggler_by_them() -> None:
    # given rank 1 arriving 3 ms late in backward every step: 5% of the 60 ms step, too little by its step alone
    found = arrivals({0: ddp_rank(0), 1: ddp_rank(3_000)})
    assert found is not None
    ranks = [RankSummary(rank=r, steps=20, median_s=0.06, spread_s=0.03) for r in (0, 1)]
    assert straggler(ranks, found) is None
    # when its traced ops hold 10 ms a step of calls rank 0 does not make (17% of the step): named by them
    late = straggler(ranks, found, side_by_side({"aten::tanh": (60.0, 0.004), "aten::mm": (60.0, 0.006)}))
    assert late is not None and (late.rank, late.cause) == (1, "backward")
    assert late.late_s == pytest.approx(0.010) and late.others_wait_s == pytest.approx(0.003)
    assert late.evidence[0].startswith(
        "rank 1 runs 10.0 ms a step of op calls the other ranks do not make (17% of the 60.0 ms profiled step): "
        "aten::mm 69 calls a step against 9 (6.0 ms); aten::tanh 60 calls a step against none (4.0 ms), and they "
        "wait for it: it arrives last at the collectives in 3 of 3 profiled steps")
    assert "its step less its waits reads 3.0 ms a step over theirs" in late.evidence[1]
    # 4.5 ms of them (7.5%) is too little, 5 ms (8.3%) enough
    assert straggler(ranks, found, side_by_side({"aten::tanh": (60.0, 0.0015), "aten::mm": (60.0, 0.003)})) is None
    assert straggler(ranks, found, side_by_side({"aten::tanh": (60.0, 0.002), "aten::mm": (60.0, 0.003)})) is not None
    # a rank arriving last in 1 of 3 steps (a busy machine's scheduler moves arrivals about) that does more work
    # than the others in every step (its step less its waits) is one
    calls = side_by_side({"aten::tanh": (60.0, 0.004), "aten::mm": (60.0, 0.006)})
    once = dataclasses.replace(found.of(1), late_s=(0.003, -0.001, -0.001))
    assert straggler(ranks, dataclasses.replace(found, ranks=(found.of(0), once)), calls) is not None
    # one that neither arrives last nor does more work in 2 of 3 steps is none, whatever it calls: a note says so
    even = found.of(0).own_steps_s
    idle = dataclasses.replace(once, own_steps_s=(even[0] + 0.003, *even[1:]))
    notes: list[str] = []
    assert straggler(ranks, dataclasses.replace(found, ranks=(found.of(0), idle)), calls, notes) is None
    assert notes == ["rank 1 runs 10.0 ms a step of op calls the other ranks do not make (17% of the 60.0 ms profiled "
                     "step: aten::mm 69 calls a step against 9 (6.0 ms); aten::tanh 60 calls a step against none "
                     "(4.0 ms)), yet it arrived last at the collectives in 1 of 3 profiled steps and did more work "
                     "than they did in 1: another rank was slower still in these steps; its extra calls are the "
                     "job's next imbalance"]


def test_a_straggler_by_its_calls_whose_phases_read_no_longer_says_so_without_negative_time() -> None:
    # given rank 1 on a core 5% faster (its own work 58.9 ms a step against 62 ms), arriving 10 ms last every step
    # of 80 ms, with 12 ms of calls rank 0 does not make (15% of the step)
    fast = dataclasses.replace(paced(1, 0.95), late_s=(0.010,) * 3)
    found = Arrivals((paced(0, 1.0), fast), steps=3, collectives=6, own_s=0.002, clock="shared")
    ranks = [steady(0, forward_s=0.020), steady(1, forward_s=0.020)]
    late = straggler(ranks, found, side_by_side({"aten::tanh": (60.0, 0.012)}))
    # then it is named by its calls, and no phase or step is said to take a negative time more
    assert late is not None and late.rank == 1 and late.late_s == pytest.approx(0.012)
    assert late.evidence[1].startswith("no phase of its own work reads longer than the other ranks'; its step less "
                                       "its waits reads 3.1 ms a step under theirs")


def test_a_jobs_ranks_are_set_side_by_side_by_their_records_ops() -> None:
    # given two ranks' records whose op tables hold 3 profiled steps, rank 1 calling tanh 180 times (30 ms) in them
    def with_ops(rank: int, extra: tuple[OpStat, ...]) -> RunRecord:
        record = job_rank(rank, ddp_rank(3_000 if rank else 0))
        ops = (OpStat("aten::addmm", 15, 0.030), OpStat("aten::mm", 27, 0.060), *extra)
        phases = {o.name: {"backward": o.calls} for o in ops}
        return dataclasses.replace(record, op_profile=dataclasses.replace(record.op_profile, host_ops=ops,
                                                                          phase_calls=phases))

    records = {0: with_ops(0, ()), 1: with_ops(1, (OpStat("aten::tanh", 180, 0.030),))}
    ops = rank_ops(records)
    # then each rank's ops are per step, and rank 1's tanh is 10 ms a step of extra calls: a straggler by them
    assert ops is not None and not ops.on_device
    assert ops.per_step[1]["aten::tanh"] == pytest.approx((60.0, 0.010))
    assert ops.phase_calls[1]["aten::tanh"] == {"backward": 60.0}
    merged = combine(list(records.values()))
    assert merged.straggler is not None and merged.straggler.rank == 1
    assert "aten::tanh 60 calls a step against none (10.0 ms)" in merged.straggler.evidence[0]
    # a record made before the ops were kept leaves them unknown, and the job judged as before
    older = {0: job_rank(0, ddp_rank(0)), 1: records[1]}
    assert rank_ops(older) is None
    assert combine(list(older.values())).straggler is None


def test_a_straggler_by_its_calls_is_late_in_the_phase_its_calls_ran_in() -> None:
    # given rank 1 arriving 3 ms late every step, its step's figures reading the excess in backward, and 10 ms of extra
    # calls a step: tanh 60 calls (4 ms), all in forward; mm 60 more (6 ms), 40 of them in forward, 20 in optimizer
    found = arrivals({0: ddp_rank(0), 1: ddp_rank(3_000)})
    assert found is not None
    ranks = [RankSummary(rank=r, steps=20, median_s=0.06, spread_s=0.03) for r in (0, 1)]
    ops = dataclasses.replace(side_by_side({"aten::tanh": (60.0, 0.004), "aten::mm": (60.0, 0.006)}), phase_calls={
        0: {"aten::mm": {"backward": 9.0}, "aten::addmm": {"forward": 5.0}},
        1: {"aten::mm": {"backward": 9.0, "forward": 40.0, "optimizer": 20.0}, "aten::addmm": {"forward": 5.0},
            "aten::tanh": {"forward": 60.0}}})
    # then its calls ran 4 + 6 x 40/60 = 8 ms in forward, 2 ms in the optimizer
    assert extra_by_phase(1, ops, extra_calls(1, ops)) == pytest.approx({"forward": 0.008, "optimizer": 0.002})
    # and it is late in forward, where they ran, not where its step reads longer
    late = straggler(ranks, found, ops)
    assert late is not None and late.cause == "forward"
    assert "(17% of the 60.0 ms profiled step; 8.0 ms of them in its forward)" in late.evidence[0]
    # without the phases of calls, where its step reads longer
    unplaced = straggler(ranks, found, dataclasses.replace(ops, phase_calls={}))
    assert unplaced is not None and unplaced.cause == "backward"


def test_extra_work_outside_the_named_phases_must_show_in_the_steady_steps_where_no_one_waits_there() -> None:
    # given rank 1 arriving last in every profiled step with 12 ms more of its own work outside the named phases (a
    # frozen teacher's forward, say) on a core 15% faster, while the other ranks wait for it in backward (DDP), not
    # there
    def rank(r: int, pace: float, other_s: float) -> RankArrival:
        own = {p: v * pace for p, v in {"data_wait": 0.002, "forward": 0.020, "backward": 0.030, "optimizer": 0.010,
                                        "other": 0.010 + other_s}.items()}
        return RankArrival(rank=r, late_s=(0.004 if r else -0.004,) * 3, own_steps_s=(sum(own.values()),) * 3,
                           waiting_s=0.0, waiting_by_phase=dict.fromkeys(own, 0.0), own_phases_s=own,
                           cpu_wait_s=None, exposed_s=0.0, step_s=0.080, own_phase_steps_s=(own,) * 3)

    def summary(r: int, other_s: float) -> RankSummary:
        rest = (0.08 - other_s) / 4
        return RankSummary(rank=r, steps=20, median_s=0.08, breakdown=Breakdown(
            data_wait=rest / 0.08, forward=rest / 0.08, backward=rest / 0.08, optimizer=rest / 0.08,
            other=other_s / 0.08))

    found = Arrivals((rank(0, 1.0, 0.0), rank(1, 0.85, 0.012)), steps=3, collectives=6, own_s=0.002, clock="shared")
    # then where the run's steady steps give both ranks the same time there (a balanced job: three profiled steps
    # of a busy machine's luck, arriving last in all three half the time on two ranks), no straggler is named
    assert straggler([summary(0, 0.010), summary(1, 0.010)], found) is None
    # and where they bear it out (10 ms more there, 12.5% of the step) it is, by that phase
    late = straggler([summary(0, 0.010), summary(1, 0.020)], found)
    assert late is not None and (late.rank, late.cause) == (1, "other")
