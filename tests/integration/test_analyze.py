"""``gpuscope analyze`` as a user runs it, on real GPU traces (tests/fixtures/gpu/): a verdict with its evidence,
run.json and report.html from a trace alone; one job record from a folder of rank traces; bad input in one line."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from conftest import load_run, run_gpuscope

pytestmark = pytest.mark.slow

GPU = Path(__file__).resolve().parent.parent / "fixtures" / "gpu"
TRACES = sorted(GPU.glob("*.json.gz")) + sorted((GPU / "sampled-ranks").glob("*.json.gz"))


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_a_trace_alone_gives_a_verdict_a_record_and_a_report(tmp_path: Path, trace: Path) -> None:
    # when
    result = run_gpuscope(["analyze", str(trace), "-o", str(tmp_path / "out")], tmp_path)
    # then
    assert result.returncode == 0, result.stderr
    run = load_run(tmp_path / "out")
    assert run["schema"] == "gpuscope.run/1"
    assert run["source"]["files"] == [trace.name] and run["source"]["kind"] == "torch.profiler trace"
    assert run["verdict"]["bound"] and run["verdict"]["evidence"]
    assert run["steps"]["count"] >= 1 and run["steps"]["source"] == "profiler"
    assert abs(sum(run["breakdown"].values()) - 1) < 1e-6
    assert (tmp_path / "out" / "report.html").stat().st_size > 100_000
    assert result.stdout.startswith("gpuscope: ")
    if run["device"] == "cuda":
        kernels = run["op_profile"]["kernels"]
        assert 0 < kernels["busy_fraction"] < 1 and run["op_profile"]["devices"]
    # rules a trace cannot feed say so rather than "clear"
    assert run["checks"]["disable-debug-apis"]["status"] == "not-checked"


def test_a_folder_of_rank_traces_gives_one_job_record(tmp_path: Path) -> None:
    # when
    result = run_gpuscope(["analyze", str(GPU / "sampled-ranks"), "-q", "-o", str(tmp_path / "job")], tmp_path)
    # then one record for the job, each rank's beside it, and the other 126 ranks of the 128 named missing
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    job = load_run(tmp_path / "job")
    assert [r["rank"] for r in job["ranks"]] == [0, 1]
    assert all(r["steps"] == 2 and r["comm_exposed_s"] is not None for r in job["ranks"])
    assert len(job["missing_ranks"]) == 126
    assert sorted(job["source"]["files"]) == ["sampled-rank0.json.gz", "sampled-rank1.json.gz"]
    assert load_run(tmp_path / "job" / "rank-1")["distributed"]["rank"] == 1
    assert (tmp_path / "job" / "report.html").is_file()


def test_the_default_output_folder_is_a_new_run_folder(tmp_path: Path) -> None:
    result = run_gpuscope(["analyze", "-q", str(GPU / "mi250-rocm-toy.json.gz")], tmp_path)
    assert result.returncode == 0, result.stderr
    (made,) = (tmp_path / "gpuscope-runs").iterdir()
    assert made.name.startswith("mi250-rocm-toy-") and (made / "run.json").is_file()


@pytest.mark.parametrize("case", ["missing", "text", "truncated"])
def test_bad_input_is_one_line_and_exit_status_2(tmp_path: Path, case: str) -> None:
    # given
    path = tmp_path / {"missing": "nothing.json", "text": "notes.txt", "truncated": "cut.json.gz"}[case]
    if case == "text":
        path.write_text("not a trace\n")
    elif case == "truncated":
        path.write_bytes((GPU / "a100-resnet-ddp-nccl.json.gz").read_bytes()[:50_000])
        with pytest.raises(EOFError):
            gzip.decompress(path.read_bytes())
    # when
    result = run_gpuscope(["analyze", str(path)], tmp_path)
    # then
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("gpuscope: error: ")
    assert not (tmp_path / "gpuscope-runs").exists()
