"""Steps are found with no change to the script: optimizer steps, DataLoader batches, explicit marks."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import SCRIPTS, Run, Runs, load_run, run_gpuscope

pytestmark = pytest.mark.slow
NO_PROBES = "--no-probes"
"""These tests check the steps, the loaders and memory, not the post-run probes: a faster exit."""
LOADER = SCRIPTS / "loader_workers.py"
START_METHODS = ("fork", "spawn", "forkserver")


def loader_run(runs: Runs, start_method: str) -> Run:
    """A loader of two workers started afresh each of two epochs, as a DataLoader's are by default, with real work
    per sample (about 1.6 s an epoch: a forked epoch of 0.6 s was seen by one of the memory sampler's child-process
    scans, every 0.5 s, and its workers' time was watched between none); in a real process, as a user's script gets
    its start method."""
    return runs.get(LOADER, "--workers", "2", "--start-method", start_method, "--epochs", "2", "--sample-ms", "50",
                    options=(NO_PROBES,), preloaded=False)


@pytest.mark.parametrize("start_method", START_METHODS)
def test_a_dataloader_with_two_workers_runs_under_each_start_method(runs: Runs, start_method: str) -> None:
    run = loader_run(runs, start_method)
    result = run.result
    assert result.returncode == 0, result.stderr
    assert "steps=16" in result.stdout
    record = run.record
    assert record["steps"]["total"] == 16
    assert record["steps"]["source"] == "optimizer"
    (loader,) = record["loaders"]
    assert (loader["num_workers"], loader["start_method"], loader["batches"]) == (2, start_method, 16)
    # cProfile follows forked workers; those started by spawn or forkserver are not profiled, and the record says so
    python = record["python_profile"]
    assert python["workers_profiled"] == (start_method == "fork"), python["workers_note"]
    if start_method != "fork":
        assert "spawn or forkserver" in python["workers_note"]


@pytest.mark.parametrize("start_method", START_METHODS)
def test_the_workers_of_each_start_method_have_their_memory_counted(runs: Runs, start_method: str) -> None:
    run = loader_run(runs, start_method)
    assert run.result.returncode == 0, run.result.stderr
    memory = run.record["host_memory"]
    assert memory["max_workers"] >= 2
    assert memory["peak_workers_bytes"] > 2 * 20 * 2**20  # each worker holds a Python with torch
    assert memory["peak_bytes"] >= memory["peak_process_bytes"]
    # multiprocessing's helpers are told from the workers (spawn: its resource tracker; forkserver: that and the
    # forkserver, whose forked workers share its command line), and the workers' time was watched
    assert memory["max_helpers"] == {"fork": 0, "spawn": 1, "forkserver": 2}[start_method]
    assert memory["max_workers"] - memory["max_helpers"] == 2
    assert memory["workers_watched_s"] > 0


@pytest.mark.timing
def test_phases_are_timed_by_hooks(tmp_path: Path) -> None:
    # given a loop whose data takes 20 ms, forward 30 ms and backward 10 ms of host time per step
    run_dir = tmp_path / "run"
    result = run_gpuscope(["run", "-q", "-o", str(run_dir), NO_PROBES, str(SCRIPTS / "phases.py")], tmp_path,
                          preloaded=True)
    assert result.returncode == 0, result.stderr
    record = load_run(run_dir)
    steps, shares = record["steps"], record["breakdown"]
    assert steps["total"] == 15
    # then each phase has its share of the ~62 ms step (sleeps overshoot a little, so shares are loose)
    assert steps["median_s"] == pytest.approx(0.062, rel=0.25)
    assert shares["data_wait"] == pytest.approx(20 / 62, abs=0.08)
    assert shares["forward"] == pytest.approx(30 / 62, abs=0.08)
    assert shares["backward"] == pytest.approx(10 / 62, abs=0.06)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert any("forward timed on root modules: SlowForward" in n for n in record["meta"]["notes"])


@pytest.mark.timing
def test_without_an_optimizer_each_batch_is_a_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_gpuscope(["run", "-q", "-o", str(run_dir), NO_PROBES, str(SCRIPTS / "no_optimizer.py")], tmp_path,
                          preloaded=True)
    assert result.returncode == 0, result.stderr
    steps = load_run(run_dir)["steps"]
    assert (steps["source"], steps["total"]) == ("dataloader", 20)
    # the pause between epochs belongs to no step
    assert steps["max_s"] < 0.04


def test_explicit_marks_define_the_steps(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_gpuscope(["run", "-q", "-o", str(run_dir), NO_PROBES, str(SCRIPTS / "no_optimizer.py"), "--mark"],
                          tmp_path, preloaded=True)
    assert result.returncode == 0, result.stderr
    steps = load_run(run_dir)["steps"]
    assert (steps["source"], steps["total"]) == ("explicit", 20)
