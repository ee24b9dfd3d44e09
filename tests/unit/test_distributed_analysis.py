"""Across ranks: collectives' time and overlap from a trace, the straggler and its cause, the merged record with its
missing ranks."""

from __future__ import annotations

import dataclasses
import gzip
import json
import sys
from pathlib import Path

import pytest

from conftest import make_record
from gpuscope.diagnose import analyze
from gpuscope.diagnose.classify import classify
from gpuscope.diagnose.rules import evaluate
from gpuscope.diagnose.ranks import straggler
from gpuscope.diagnose.ranks import combine
from gpuscope.distributed import claim_summary
from gpuscope.record import (Breakdown, CollectiveCall, Communication, Distributed, Memory, OpProfile, RankSummary,
                             RunRecord, StepSample, Steps, Verdict, Window)
from gpuscope.reduce.comms import communication
from gpuscope.reduce.fields import op_profile
from gpuscope.reduce.figures import trace_figures
from gpuscope.reduce.optable import op_table

RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "records"


def op(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat}



def test_the_collectives_calls_are_counted_apart_from_the_steps_arithmetic() -> None:
    # given: a gloo job's step: 40 us of arithmetic and a 300 us all-reduce call on the training thread, waiting
    events = [op("aten::mm", 0, 30), op("aten::add_", 30, 10), op("c10d::allreduce_", 50, 300),
              op("gloo:all_reduce", 60, 280, tid=7, cat="user_annotation")]
    profile = op_profile(op_table(events), Window(7, 7), 1, trace_figures(events), cuda=False, trace_bytes=1)
    # then: the call is one of the step's ops, its self time the collective's, not the arithmetic's
    assert (profile.ops, profile.comm_ops) == (3, 1)
    assert profile.comm_ops_self_s == pytest.approx(300e-6)
    assert profile.compute_ops_per_step == 2
    assert profile.compute_mean_op_s == pytest.approx(20e-6)


def test_a_rank_waiting_in_its_all_reduce_calls_is_not_called_compute_bound_for_it() -> None:
    # given: rank 0 of pytorch/examples' DDP tutorial on two CPU ranks (tests/fixtures/records/README.md): a
    # Linear(20, 1), one all-reduce of 21 floats a step, whose c10d::allreduce_ calls held 2.96 of the 3.58 ms of op
    # self time in the profiled steps
    record = RunRecord.from_json(json.loads((RECORDS / "ddp_tutorial_rank0.json").read_text()))
    ops = record.op_profile
    assert ops is not None and (ops.comm_ops, round(ops.comm_ops_self_s * 1e3, 2)) == (3, 2.96)
    verdict = analyze(record).verdict
    # then: the step's own ops are tiny, and the collective is no op of its arithmetic
    assert verdict.bound != "compute", verdict.evidence
    assert "mean op self time 1.8 us, 2.1x the fixed cost of an op" in verdict.evidence
    assert not any("c10d::" in fact for fact in verdict.evidence), verdict.evidence
    # where the calls counted as the step's arithmetic, it read compute-bound at 0.86: "mean op self time 11.9 us"
    before = dataclasses.replace(record, op_profile=dataclasses.replace(ops, comm_ops=0, comm_ops_self_s=0.0))
    assert analyze(before).verdict.bound == "compute"

def test_collective_time_is_split_into_overlapped_and_exposed() -> None:
    events = [
        # the training thread: backward ops from 0 to 600 us, the optimizer from 1000 to 1100
        *(op("aten::mm", t, 100) for t in range(0, 600, 100)),
        op("aten::add_", 1000, 100),
        # two buckets' all-reduces on gloo's threads: 400-700 (half under backward) and 650-1000 (all waited for)
        op("gloo:all_reduce", 400, 300, tid=7, cat="user_annotation"),
        op("gloo:all_reduce", 650, 350, tid=8, cat="user_annotation"),
        op("c10d::allreduce_", 390, 5),  # the enqueue on the training thread is not the collective
    ]
    comm = communication(events, steps=1)
    assert comm is not None and comm.backend == "gloo" and comm.calls_per_step == 2
    assert comm.comm_s == pytest.approx(600e-6)  # 400 to 1000, the union
    assert comm.exposed_s == pytest.approx(400e-6)  # 600 to 1000: no op on the training thread
    assert comm.overlap == pytest.approx(200 / 600)


def test_a_collective_queued_behind_gloos_worker_is_waited_on_from_when_the_step_issued_it() -> None:
    # given: DDP's two buckets issued from backward at 390 and 590 us; gloo's worker runs the first 400-700 and picks
    # the second up only at 900 (busy, or waiting for a core), while the training thread, its backward done at 600,
    # sits idle until both have ended at 1000 (a compiled DDP step on a busy 2-core machine, 2026-12-01)
    events = [
        op("ProfilerStep#7", 0, 1100, cat="user_annotation"),
        *(op("aten::mm", t, 100) for t in range(0, 600, 100)),
        op("c10d::allreduce_", 390, 5), op("c10d::allreduce_", 590, 5),
        op("gloo:all_reduce", 400, 300, tid=7, cat="user_annotation"),
        op("gloo:all_reduce", 900, 100, tid=7, cat="user_annotation"),
        op("aten::add_", 1000, 100),
    ]
    comm = communication(events, steps=1)
    assert comm is not None and comm.calls_per_step == 2
    # then: each collective is in flight from its issue, and the thread's whole wait, 600-1000, is exposed (the
    # gloo ranges alone made it 200 us: 700-900, waiting on the queued bucket, was counted nowhere)
    assert comm.comm_s == pytest.approx(610e-6)  # 390 to 1000
    assert comm.exposed_s == pytest.approx(400e-6)
    # and it is the time the calls say the thread sat idle inside them, which a job's wait for a later rank is of
    idle = [(start, end) for call in comm.calls for start, end, _ in call.idle]
    assert [call.arrival_us for call in comm.calls] == [390, 590]
    assert max(end for _, end in idle) - min(start for start, _ in idle) == pytest.approx(400)


def tensor_parallel_step(wait_us: float) -> list[dict]:
    """One step of a tensor-parallel MLP on gloo as torch.profiler records DTensor's functional collectives
    (pytorch/examples' tensor-parallel example on two CPU ranks): forward issues the all-reduce of the row-parallel
    layer's output (``_c10d_functional::all_reduce``, which calls ``c10d::allreduce_``) and returns at once; the
    output's first use (``aten::sum``, through the async tensor's dispatch) waits for it in ``wait_tensor``."""
    return [
        op("ProfilerStep#7", 0, 1000 + wait_us, cat="user_annotation"),
        op("## forward ##", 0, 372, cat="user_annotation"),
        op("aten::addmm", 0, 300),
        op("_c10d_functional::all_reduce", 310, 60), op("c10d::allreduce_", 330, 30),
        op("aten::sum", 370, wait_us + 20), op("_c10d_functional::wait_tensor", 380, wait_us),
        op("gloo:all_reduce", 340, 40 + wait_us, tid=7, cat="user_annotation"),
        op("aten::mm", 400 + wait_us, 300),  # backward's arithmetic
    ]


def test_a_functional_collectives_wait_is_the_training_threads_wait_not_its_arithmetic() -> None:
    # given a step whose training thread waits 10 ms in wait_tensor, while gloo runs the all-reduce (340-10380 us)
    events = tensor_parallel_step(wait_us=10_000)
    # then the wait counts as time idle inside the collective, none of it overlapped with compute
    comm = communication(events, steps=1)
    assert comm is not None and comm.calls_per_step == 1
    assert comm.comm_s == pytest.approx(10_050e-6)  # from its issue (330) to gloo's end
    assert comm.exposed_s == pytest.approx(10_000e-6)  # 380 to 10380: inside wait_tensor, the thread ran nothing
    assert comm.overlap == pytest.approx(50 / 10_050)
    # the call arrived as forward issued it (c10d::allreduce_ at 330 us), and was waited for outside forward
    (call,) = comm.calls
    assert (call.arrival_us, call.issued_in) == (330, "forward")
    assert call.idle == ((380, 10_380, "other"),)
    # and the functional collectives' ops are communication, not the step's arithmetic
    profile = op_profile(op_table(events), Window(7, 7), 1, trace_figures(events), cuda=False, trace_bytes=1)
    assert (profile.ops, profile.comm_ops) == (6, 3)
    assert profile.comm_ops_self_s == pytest.approx((60 - 30 + 30 + 10_000) * 1e-6)
    assert profile.compute_mean_op_s == pytest.approx((300 + 20 + 300) / 3 * 1e-6)


def test_a_tensor_parallel_rank_waiting_for_a_late_rank_waits_in_wait_tensor_as_its_trace_shows() -> None:
    # given rank 0 of a tensor-parallel job whose rank 1 is 10 ms late a step (tests/fixtures/traces/README.md)
    path = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "tensor_parallel" / "straggler-rank0.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    waits = [e for e in events if e.get("name") == "_c10d_functional::wait_tensor"]
    assert len(steps) == len(waits) == 3
    # then the time it sat idle inside the collectives is its time in wait_tensor (besides a few short gaps)
    comm = communication(events, steps=3)
    assert comm is not None and comm.calls_per_step == 1
    waited = sum(e["dur"] for e in waits) / 3 * 1e-6
    assert waited > 0.008
    assert comm.exposed_s == pytest.approx(waited, rel=0.05)
    assert comm.overlap < 0.2
    # each all-reduce was issued in forward (the row-parallel layer's output), and waited for after it
    assert [c.issued_in for c in comm.calls] == ["forward"] * 3
    idle = {}
    for call in comm.calls:
        for start, end, phase in call.idle:
            idle[phase] = idle.get(phase, 0.0) + end - start
    assert idle["other"] > 0.95 * sum(idle.values())
    # and the wait is no arithmetic of the step's
    profile = op_profile(op_table(events), Window(7, 9), 3, trace_figures(events), cuda=False, trace_bytes=1)
    assert profile.comm_ops_self_s >= sum(e["dur"] for e in waits) * 1e-6


class TwoRankGroup:
    """torch.distributed as a script sees it on rank 0 of 2 ranks it (or its framework) started itself."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def get_world_size() -> int:
        return 2

    @staticmethod
    def get_rank() -> int:
        return 0

    @staticmethod
    def get_backend() -> str:
        return "gloo"


def test_a_rank_whose_script_started_the_other_ranks_without_gpuscope_says_it_was_profiled_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuscope.distributed import alone_note, group_now
    from gpuscope.report.summary import summary_lines

    # given a script that joined a group of 2 ranks it started itself (PyTorch Lightning's ddp strategy does)
    monkeypatch.setitem(sys.modules, "torch.distributed", TwoRankGroup)
    where = group_now()
    assert where is not None and (where.rank, where.world_size, where.backend, where.profiled_alone) == (
        0, 2, "gloo", True)
    # then its record says what it cannot tell and how to profile every rank, in the terminal too
    assert alone_note(where, "train.py").endswith(
        "`gpuscope run --nproc-per-node 2 train.py` profiles every rank and says who waits for whom")
    record = dataclasses.replace(rank_record(0, 2, exposed=0.030), command=("train.py",), distributed=where)
    assert ("  rank 0 of 2 profiled alone: the script started the other ranks without gpuscope; `gpuscope run "
            "--nproc-per-node 2 train.py` profiles them all") in summary_lines(record, Path("run"))
    # and the advice to send less says its wait may be a slower rank's
    comm = Communication(calls_per_step=2, comm_s=0.035, exposed_s=0.030, backend="gloo", step_s=0.043)
    record = dataclasses.replace(record, op_profile=dataclasses.replace(record.op_profile, communication=comm))
    (advice,) = [r for r in evaluate(record)[0] if r.id == "reduce-communication"]
    assert any(line.startswith("only this rank of 2 was profiled") for line in advice.evidence)
    # while a group of one rank, or none, is no job
    monkeypatch.setattr(TwoRankGroup, "get_world_size", staticmethod(lambda: 1))
    assert group_now() is None


def test_a_group_that_cannot_be_read_is_no_job_to_record_but_is_never_traced_as_one_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuscope.collect.collectors.torch_trace import _several_ranks
    from gpuscope.distributed import backend_now, group_now

    def torn_down() -> int:
        raise RuntimeError("Default process group has not been initialized")

    # given a group torn down halfway: initialised, its size unreadable
    monkeypatch.setitem(sys.modules, "torch.distributed", TwoRankGroup)
    assert _several_ranks() and backend_now() == "gloo"
    monkeypatch.setattr(TwoRankGroup, "get_world_size", staticmethod(torn_down))
    # then the record names no group, while the trace collector takes it for several ranks (whose traces must
    # never fall at different steps)
    assert group_now() is None and backend_now() is None
    assert _several_ranks()


def test_sending_gradients_less_often_leaves_out_the_wait_in_collectives_issued_in_forward() -> None:
    # given a job waiting on its collectives' own work 30 ms of a 43 ms profiled step
    record = rank_record(0, 2, exposed=0.030)
    calls = (CollectiveCall(7, "all_reduce", 0, 100, ((10, 30, "other"),), "forward"),
             CollectiveCall(7, "all_reduce", 200, 300, ((220, 280, "backward"),), "backward"))
    comm = Communication(calls_per_step=2, comm_s=0.035, exposed_s=0.030, backend="gloo", step_s=0.043)
    gain = {}
    for name, made in (("unknown", ()), ("a quarter in forward", calls)):
        job = dataclasses.replace(record, op_profile=dataclasses.replace(
            record.op_profile, communication=dataclasses.replace(comm, calls=made)))
        (advice,) = [r for r in evaluate(job)[0] if r.id == "reduce-communication"]
        gain[name] = advice.expected_gain
    # then the gain counts the backward's all-reduce alone: 60 of the 80 us idle inside the calls
    assert gain["unknown"] == pytest.approx(0.030 / 0.043 * 0.75, abs=0.001)
    assert gain["a quarter in forward"] == pytest.approx(0.030 / 0.043 * 0.75 * 60 / 80, abs=0.001)
    # and where every call is issued in forward (tensor parallelism alone) it advises nothing
    only_forward = dataclasses.replace(comm, calls=calls[:1])
    job = dataclasses.replace(record, op_profile=dataclasses.replace(record.op_profile, communication=only_forward))
    assert "reduce-communication" not in [r.id for r in evaluate(job)[0]]


def test_nccl_kernels_count_as_collectives_and_no_collective_is_none() -> None:
    events = [op("aten::mm", 0, 100), op("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 50, 100, tid=9, cat="kernel")]
    assert communication(events, steps=1).backend == "nccl"
    assert communication([op("aten::mm", 0, 100)], steps=1) is None


def rank(r: int, median_s: float, data_wait: float, backward: float, exposed: float,
         spread_s: float | None = 0.004) -> RankSummary:
    other = 1 - data_wait - backward - 0.2
    return RankSummary(rank=r, steps=30, median_s=median_s, comm_s=exposed + 0.002, comm_exposed_s=exposed,
                       breakdown=Breakdown(data_wait=data_wait, forward=0.2, backward=backward, other=other),
                       spread_s=spread_s)


def test_the_rank_the_others_wait_for_is_the_straggler_and_its_data_wait_the_cause() -> None:
    ranks = [rank(0, 0.140, 0.01, 0.78, 0.120), rank(1, 0.140, 0.72, 0.07, 0.010), rank(2, 0.139, 0.01, 0.78, 0.118)]
    found = straggler(ranks)
    assert found is not None and found.rank == 1 and found.cause == "data_wait"
    assert found.late_s == pytest.approx(0.130 - 0.020, abs=0.002)
    assert "rank 1 is late by" in found.evidence[0] and "data wait" in found.evidence[1]
    # its data wait is 0.72 * 140 = 100.8 ms against the others' 1.4 ms: all of the 110 ms it is late by, near enough
    assert found.cause_share == pytest.approx(99.4 / 110, abs=0.02)
    assert f"{found.cause_share:.0%} of the lateness" in found.evidence[1]
    assert found.spread_s == pytest.approx(0.004)
    assert "beyond the 2.0 ms their own steps stray from their median" in found.evidence[0]


def test_lateness_within_the_ranks_own_step_to_step_spread_names_no_straggler() -> None:
    # rank 1's own work 15 ms over rank 0's (38% of a 40 ms step), all of it in its data wait; rank 0's steps ranged
    # over 40 ms (10th to 90th percentile), 20 ms either side of their median: the 15 ms is within its noise
    noisy = [rank(0, 0.040, 0.05, 0.60, 0.016, spread_s=0.040), rank(1, 0.040, 0.425, 0.225, 0.001, spread_s=0.038)]
    assert straggler(noisy) is None
    # the same lateness on quiet steps (2 ms spread) stands clear of it
    quiet = [rank(0, 0.040, 0.05, 0.60, 0.016, spread_s=0.002), rank(1, 0.040, 0.425, 0.225, 0.001, spread_s=0.002)]
    found = straggler(quiet)
    assert found is not None and found.rank == 1 and found.cause == "data_wait"
    assert found.cause_share == 1.0 and "100% of the lateness" in found.evidence[1]


def test_lateness_that_no_phase_of_its_steps_holds_names_no_straggler() -> None:
    # the loaded 2-rank job: rank 1 "late by 15.1 ms (38%)" because rank 0 waited 15 ms longer in the
    # all-reduce, while rank 1's backward held 1.3 ms of it and no other phase any: a difference of waits, not work
    ranks = [rank(0, 0.040, 0.05, 0.55, 0.0161, spread_s=0.002), rank(1, 0.040, 0.05, 0.5825, 0.001, spread_s=0.002)]
    assert straggler(ranks) is None


def test_a_rank_slower_in_every_phase_is_a_straggler_caused_by_the_largest() -> None:
    # a slower machine: rank 1's forward and backward each take longer, together all of its 20 ms lateness
    slow = RankSummary(rank=1, steps=30, median_s=0.050, comm_s=0.003, comm_exposed_s=0.001,
                       breakdown=Breakdown(forward=0.36, backward=0.54, other=0.10), spread_s=0.002)
    fast = RankSummary(rank=0, steps=30, median_s=0.050, comm_s=0.022, comm_exposed_s=0.021,
                       breakdown=Breakdown(forward=0.2, backward=0.3, other=0.5), spread_s=0.002)
    found = straggler([fast, slow])
    assert found is not None and found.rank == 1 and found.cause == "backward"
    assert found.cause_share == pytest.approx(0.6)


def test_ranks_merged_before_the_spread_was_recorded_are_judged_on_the_share_alone() -> None:
    ranks = [rank(0, 0.140, 0.01, 0.78, 0.120, spread_s=None), rank(1, 0.140, 0.72, 0.07, 0.010, spread_s=None)]
    found = straggler(ranks)
    assert found is not None and found.rank == 1 and found.spread_s is None
    assert "vary by" not in found.evidence[0]


def test_balanced_ranks_have_no_straggler() -> None:
    assert straggler([rank(0, 0.032, 0.04, 0.6, 0.003), rank(1, 0.032, 0.05, 0.6, 0.007)]) is None
    assert straggler([rank(0, 0.032, 0.04, 0.6, 0.003)]) is None  # one rank: nobody to wait for


def rank_record(r: int, world: int, exposed: float, median_s: float = 0.1):
    return make_record(
        steps=Steps(count=30, median_s=median_s, total=40, warmup=1, profiled=9),
        breakdown=Breakdown(data_wait=0.02, forward=0.2, backward=0.7, other=0.08),
        op_profile=OpProfile(ops=300, ops_per_step=100, mean_op_s=1e-4,
                             communication=Communication(2, exposed + 0.01, exposed, 0.1, "gloo")),
        distributed=Distributed(rank=r, world_size=world, host="node1"),
        verdict=Verdict("compute", 0.8, ("the arithmetic, 1 op",)),
    )


def test_a_job_that_lost_a_rank_names_it_and_reports_the_others() -> None:
    merged = merge_ranks([rank_record(0, 4, 0.01), rank_record(2, 4, 0.01), rank_record(3, 4, 0.012)])
    assert merged.missing_ranks == (1,)
    assert [r.rank for r in merged.ranks] == [0, 2, 3]


def test_of_the_ranks_that_find_the_job_complete_one_prints_its_summary(tmp_path: Path) -> None:
    # given: a job folder whose two ranks have written their records (under torchrun each then merges the job)
    for rank in (0, 1):
        (tmp_path / f"rank-{rank}").mkdir()
        (tmp_path / f"rank-{rank}" / "run.json").write_text(f'{{"rank": {rank}}}')
    # then: the first rank to ask prints the summary, the second does not
    assert claim_summary(tmp_path) is True
    assert claim_summary(tmp_path) is False
    # and a job run again into the folder (its ranks' records written anew) prints its own
    (tmp_path / "rank-1" / "run.json").write_text('{"rank": 1, "again": true}')
    assert claim_summary(tmp_path) is True
    assert claim_summary(tmp_path) is False


def test_each_ranks_memory_is_in_the_job_and_the_rank_with_least_to_spare_is_named() -> None:
    # given rank 1 holding 300 MB more at its peak (rank 0 is shown: there is no straggler), 0.2 GB under its limit
    ranks = [dataclasses.replace(rank_record(r, 2, 0.01), memory=Memory(peak_bytes=peak, headroom_bytes=room))
             for r, peak, room in ((0, 500_000_000, 500_000_000), (1, 800_000_000, 200_000_000))]
    merged = merge_ranks(ranks)
    assert [(r.memory_peak_bytes, r.memory_headroom_bytes) for r in merged.ranks] == [
        (500_000_000, 500_000_000), (800_000_000, 200_000_000)]
    assert ("rank 1 has the least memory to spare, 200.0 MB under its limit against rank 0's 500.0 MB: its memory "
            "section is in rank-1/") in merged.meta.notes
    # ranks alike in room, or only one measured: no such note
    even = merge_ranks([ranks[0], dataclasses.replace(ranks[1], memory=ranks[0].memory)])
    assert not any("least memory" in note for note in even.meta.notes)
    assert not any("least memory" in note for note in merge_ranks([ranks[0], rank_record(1, 2, 0.01)]).meta.notes)
    # nor where their room differs by less than a tenth (2% here: any of them could be the first to run out)
    close = dataclasses.replace(ranks[1], memory=Memory(peak_bytes=510_000_000, headroom_bytes=490_000_000))
    assert not any("least memory" in note for note in merge_ranks([ranks[0], close]).meta.notes)


def test_each_ranks_spread_is_its_90th_percentile_step_less_its_10th() -> None:
    record = rank_record(0, 2, 0.01)
    record = dataclasses.replace(record, steps=dataclasses.replace(record.steps, p10_s=0.095, p90_s=0.112))
    (summary,) = merge_ranks([record]).ranks
    assert summary.spread_s == pytest.approx(0.017)


def test_waiting_on_collectives_half_the_step_is_communication_bound() -> None:
    verdict = classify(rank_record(0, 2, exposed=0.06))
    assert verdict.bound == "communication"
    assert "60% of each step" in verdict.evidence[0]
    assert classify(rank_record(0, 2, exposed=0.02)).bound != "communication"


def test_a_job_waiting_on_collectives_under_the_bar_says_how_much_beside_its_data_wait() -> None:
    # given a rank idle 20 ms of its 100 ms step on the collectives' own work, 2 a step in flight for 30 ms
    verdict = classify(rank_record(0, 2, exposed=0.02))
    # then its verdict is another's, and its last line says how long the collectives took, as the data wait's does
    assert verdict.bound != "communication"
    assert verdict.evidence[-2].startswith("data wait is 2% of each step")
    assert verdict.evidence[-1] == ("the training thread waits on the collectives' own work 20% of each step (2 "
                                    "collectives a step, in flight 30.0 ms, 10% of it overlapped with compute), under the 50% at which "
                                    "communication bounds the job")


def test_one_collective_a_step_is_said_in_the_singular() -> None:
    # (pytorch/examples' DDP tutorial, a Linear(20, 1): "1 collectives a step")
    record = rank_record(0, 2, exposed=0.02)
    one = dataclasses.replace(record.op_profile.communication, calls_per_step=1.0)
    verdict = classify(dataclasses.replace(record, op_profile=dataclasses.replace(record.op_profile,
                                                                                   communication=one)))
    assert "(1 collective a step, in flight 30.0 ms" in verdict.evidence[-1]


def with_sample(record, walls: list[float], statuses: list[str], backward: list[float]):
    """``record`` with a step sample: each step's wall time, status and backward time (the rest forward)."""
    sample = StepSample(index=tuple(range(len(walls))), wall_s=tuple(walls), status=tuple(statuses),
                        phases_s={"data_wait": (0.0,) * len(walls), "forward": tuple(w - b for w, b in zip(walls, backward)),
                                  "backward": tuple(backward), "optimizer": (0.0,) * len(walls)})
    return dataclasses.replace(record, steps=dataclasses.replace(record.steps, sample=sample,
                                                                 count=statuses.count("steady")))


def test_steps_where_another_rank_evaluated_alone_are_left_out_of_a_ranks_figures_and_its_wait_kept() -> None:
    # given: pytorch-style DDP where rank 0 alone evaluates after steps 4 and 8 (its steps 5 and 9 hold the pass,
    # 210 ms each against 7 ms steps), and rank 1 waits for it inside backward at the next all-reduce
    walls0 = [0.007] * 12
    walls0[5] = walls0[9] = 0.210
    status0 = ["steady"] * 12
    status0[5] = status0[9] = "eval"
    walls1 = list(walls0)
    backward1 = [0.004] * 12
    backward1[5] = backward1[9] = 0.207  # the wait, inside backward
    rank0 = with_sample(rank_record(0, 2, 0.001, median_s=0.007), walls0, status0, [0.004] * 12)
    rank0 = dataclasses.replace(rank0, steps=dataclasses.replace(rank0.steps, mean_s=0.007, evaluated=2,
                                                                 evaluated_s=0.42))
    rank1 = with_sample(rank_record(1, 2, 0.001, median_s=0.007), walls1, ["steady"] * 12, backward1)
    merged = merge_ranks([rank0, rank1])
    # then: rank 1's figures are its 10 training steps (backward 4 of their 7 ms, not 70% of its time), and the
    # 2 x 203 ms it waited beyond its median step is its own figure, and the verdict's evaluation line names it
    one = merged.ranks[1]
    assert one.steps == 10 and one.median_s == pytest.approx(0.007)
    assert one.breakdown.backward == pytest.approx(4 / 7)
    assert one.waited_for_evaluation_s == pytest.approx(2 * 0.203)
    assert merged.ranks[0].waited_for_evaluation_s == 0.0
    line = next(e for e in merged.verdict.evidence if "held an evaluation pass" in e)
    assert line.endswith("; the other ranks held none and waited for it at the next collective, beyond their median "
                         "step: rank 1 0.41 s (left out of their figures too)")
    # a rank that evaluated in the same steps waited for nobody's
    both = merge_ranks([rank0, with_sample(rank_record(1, 2, 0.001), walls0, status0, [0.004] * 12)])
    assert both.ranks[1].waited_for_evaluation_s == 0.0


def merge_ranks(records: list) -> object:
    """The job's record from its ranks', diagnosed, as ``gpuscope run --nproc-per-node`` writes it."""
    return analyze(combine(records))
