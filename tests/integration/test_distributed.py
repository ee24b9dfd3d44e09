"""Data-parallel jobs (DDP, gloo, 2 ranks on this CPU): every rank profiled, one merged record and report, through
``gpuscope run --nproc-per-node`` and through ``torchrun -m gpuscope run``; a straggler named with its cause; the
communication measured; a killed rank named as missing while the others are still reported."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import SAMPLES, load_run, run_gpuscope, run_job

pytestmark = pytest.mark.slow
pytest.importorskip("torch.distributed")
DDP = str(SAMPLES / "ddp_training.py")


def ddp_job(tmp_path: Path, *args: str, torchrun: bool = False, options: tuple[str, ...] = ()) -> tuple[dict, int]:
    """A 2-rank job of the DDP sample (``conftest.run_job``): its merged record and exit status."""
    record, result = run_job(tmp_path, DDP, *args, torchrun=torchrun, options=options)
    return record, result.returncode


@pytest.mark.parametrize("torchrun", [False, True], ids=["gpuscope-launches", "torchrun-launches"])
def test_every_rank_is_profiled_and_merged_into_one_report(tmp_path: Path, torchrun: bool) -> None:
    record, result = run_job(tmp_path, DDP, "--steps", "24", torchrun=torchrun)
    assert result.returncode == 0
    # the job's summary is printed once, by one rank under torchrun (both end together, in step)
    assert result.stderr.count("  report: ") == 1, result.stderr
    assert [r["rank"] for r in record["ranks"]] == [0, 1]
    assert record["missing_ranks"] == []
    for rank in record["ranks"]:
        assert rank["steps"] >= 10 and rank["median_s"] > 0
        assert sum(rank["breakdown"].values()) == pytest.approx(1.0, abs=0.01)
        assert rank["comm_s"] > 0  # gloo's all-reduce ranges were found in each rank's trace
        own = load_run(record["_dir"] / f"rank-{rank['rank']}")
        assert own["distributed"]["rank"] == rank["rank"] and own["distributed"]["world_size"] == 2
    page = (record["_dir"] / "report.html").read_text()
    assert 'id="ranks"' in page and "A data-parallel job of 2 ranks" in page


@pytest.mark.timing
def test_a_rank_slow_to_load_its_data_is_named_the_straggler(tmp_path: Path) -> None:
    # 1 ms an item makes rank 1 about 64 ms late a step (batches of 64), several times the others' step (72 ms late
    # of an 85 ms step, the others' own work 10 ms)
    record, _ = ddp_job(tmp_path, "--steps", "24", "--straggler-rank", "1", "--straggler-ms", "1", "--batch-size", "64")
    straggler = record["straggler"]
    assert straggler is not None and straggler["rank"] == 1 and straggler["cause"] == "data_wait"
    assert straggler["late_share"] > 0.25
    assert straggler["basis"] == "arrivals" and straggler["cause_share"] > 0.5
    assert record["verdict"]["evidence"][0].startswith("rank 1 does")
    # the ranks it holds back are the ones waiting on the all-reduce: for rank 1, not for the collective's own work
    (waiting,) = [r for r in record["ranks"] if r["rank"] == 0]
    assert waiting["waiting_s"] > straggler["late_s"] / 2
    assert "reduce-communication" not in [r["id"] for r in record["recommendations"]]
    assert "balance-ranks" in [r["id"] for r in record["recommendations"]]


@pytest.mark.timing
def test_a_rank_late_inside_backward_is_named_and_not_mistaken_for_communication(tmp_path: Path) -> None:
    # rank 1's gradient hook does 20 ms more arithmetic a step: it is late for the last bucket's all-reduce, and
    # rank 0 waits for it inside backward, where the two ranks' steps and phases come out alike
    record, result = run_job(tmp_path, DDP, "--steps", "24", "--straggler-rank", "1", "--straggler-in", "backward",
                             "--straggler-ms", "20")
    straggler = record["straggler"]
    assert straggler is not None and straggler["rank"] == 1 and straggler["cause"] == "backward"
    # late by the hook's wall time, as the job measured it: 20 ms of its thread's CPU time, more where the other
    # rank's threads share its cores (late 32 ms once, on this 2-core machine in a slow hour)
    (extra_wall_s,) = map(float, re.findall(r"median_extra_wall_s=([0-9.]+)", result.stdout))
    assert straggler["late_s"] == pytest.approx(extra_wall_s, rel=0.5)
    ids = [r["id"] for r in record["recommendations"]]
    assert "balance-ranks" in ids and "reduce-communication" not in ids
    assert record["verdict"]["bound"] != "communication"


@pytest.mark.timing
def test_a_job_of_many_small_all_reduces_is_communication_bound_and_told_to_send_less(tmp_path: Path) -> None:
    # 48 layers 8 wide at batch 2, each parameter's gradient all-reduced on its own: 97 all-reduces a step, each
    # paying gloo's fixed latency, for little arithmetic. Six traced steps, not three: in steps of 50-200 ms the
    # share over three ranged 0.59-0.80 (quiet and beside 2 busy processes), over six 0.75-0.77 (quiet, batch 1). 48
    # all-reduces of 64-wide layers, before, were 0.48-0.66 over six and once 0.29 over three (a rank starved of a
    # core, which the others waited for)
    record, _ = ddp_job(tmp_path, "--steps", "24", "--comm-many", options=("--trace-steps", "6"))
    comm = record["op_profile"]["communication"]
    assert comm["calls_per_step"] >= 90
    assert record["verdict"]["bound"] == "communication", record["verdict"]
    assert "reduce-communication" in [r["id"] for r in record["recommendations"]], record["checks"]
    assert record["straggler"] is None


@pytest.mark.timing
def test_a_communication_heavy_job_shows_its_measured_share(tmp_path: Path) -> None:
    record, _ = ddp_job(tmp_path, "--steps", "20", "--comm-heavy")
    comm = record["op_profile"]["communication"]
    assert comm["backend"] == "gloo" and comm["calls_per_step"] >= 1
    assert comm["exposed_s"] / comm["step_s"] > 0.1  # of the profiled steps the waits were measured in
    # of the wait, what was for a later rank is imbalance; the rest, the collectives' own work, is communication
    assert 0 <= comm["waiting_s"] <= comm["exposed_s"]
    # (no more than any rank of the job sat on it, `least_own_s`: what the rule reads, `Communication.own_exposed_s`;
    # CI once had this rank's 20.9% against the job's under 20%, and no advice)
    own_s = comm["exposed_s"] - comm["waiting_s"]
    if comm.get("least_own_s") is not None:
        own_s = min(own_s, comm["least_own_s"])
    own = own_s / comm["step_s"]
    advised = "reduce-communication" in [r["id"] for r in record["recommendations"]]
    assert advised == (own >= 0.2) or record["straggler"] is not None
    assert record["checks"]["reduce-communication"]["status"] in ("fired", "clear")


def test_a_killed_rank_is_named_missing_and_the_others_are_reported(tmp_path: Path) -> None:
    record, status = ddp_job(tmp_path, "--steps", "40", "--die-rank", "1", "--die-at-step", "12")
    assert status != 0
    assert record["missing_ranks"] == [1]
    assert [r["rank"] for r in record["ranks"]] == [0]
    page = (record["_dir"] / "report.html").read_text()
    assert "left no record" in page
    # and gpuscope report re-merges the folder the same way
    result = run_gpuscope(["report", str(record["_dir"])], tmp_path)
    assert result.returncode == 0, result.stderr
    assert load_run(record["_dir"])["missing_ranks"] == [1]
