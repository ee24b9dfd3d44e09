"""Post-run probes run the user's dataset again, so they are bounded whatever it does: a dataset that says it has
10^9 items costs no memory, a dataset that hangs costs the probe its budget and no more, and the run's record is
written before any probe starts, so even a SIGKILL during one leaves it."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import SCRIPTS, child_env, load_run, processes_mentioning, run_gpuscope, run_python

pytestmark = pytest.mark.slow

SCRIPT = SCRIPTS / "huge_dataset.py"
PROBES = {"data-probe": 2.0, "loader-probe": 5.0}
"""The probes that run the dataset again, and their budgets (collectors' ``budget_s``)."""


@pytest.mark.parametrize("workers", [0, 4])
def test_a_dataset_claiming_a_billion_items_is_probed_in_bounded_time_and_memory(tmp_path: Path, workers: int) -> None:
    # given: the script's own peak memory under plain python
    plain = run_python([str(SCRIPT), "--workers", str(workers)], tmp_path)
    assert plain.returncode == 0, plain.stderr
    plain_peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # when
    run_dir = tmp_path / "run"
    result = run_gpuscope(["run", "-q", "-o", str(run_dir), str(SCRIPT), "--workers", str(workers)], tmp_path)
    # then: the run completes with its record and report, each probe within its budget plus 2 s
    assert result.returncode == 0, result.stderr
    assert (run_dir / "report.html").is_file()
    collectors = load_run(run_dir)["collectors"]
    for name, budget in PROBES.items():
        assert collectors[name]["status"] == "ok", collectors[name]
        assert collectors[name]["elapsed_s"] <= budget + 2
    # every child so far (plain python, gpuscope and its probes) peaked under twice the script's own peak
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 2 * plain_peak_kb
    assert processes_mentioning(str(run_dir)) == []


def test_a_dataset_that_hangs_when_probed_costs_the_probe_its_budget_and_no_more(tmp_path: Path) -> None:
    run_dir, marker = tmp_path / "run", tmp_path / "probed"
    started = time.monotonic()
    result = run_gpuscope(["run", "-q", "-o", str(run_dir), str(SCRIPT), "--hang-after-loop", str(marker)],
                          tmp_path)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert marker.exists()  # a probe did fetch from the dataset after the loop
    record = load_run(run_dir)
    collectors = record["collectors"]
    for name, budget in PROBES.items():
        assert collectors[name]["elapsed_s"] <= budget + 2.5
    # the data probe fetches in its own process: stopped at its budget
    assert collectors["data-probe"]["status"] == "unavailable"
    assert "did not finish within its" in collectors["data-probe"]["reason"]
    # the loader probe waits on workers with a deadline (the 0-worker rate is the run's own): each hung worker
    # count is a note, or the whole probe is stopped at its budget
    if collectors["loader-probe"]["status"] == "ok":
        rates = record["loader_probe"]["rates"]
        assert all(r["batches_per_s"] is None and "no further batch" in r["note"] for r in rates if r["num_workers"])
    else:
        assert "did not finish within its" in collectors["loader-probe"]["reason"]
    assert elapsed < 60
    assert processes_mentioning(str(run_dir)) == []


def test_a_sigkill_during_a_probe_leaves_the_record_written_before_it(tmp_path: Path) -> None:
    # given: gpuscope running a script whose dataset blocks once a probe fetches from it after the loop
    run_dir, marker = tmp_path / "run", tmp_path / "probed"
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuscope", "run", "-q", "-o", str(run_dir), str(SCRIPT), "--hang-after-loop",
         str(marker)], cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), process.communicate()[1]
    # when: it is killed while the probe runs
    os.kill(process.pid, signal.SIGKILL)
    process.communicate()
    # then: the record written before the probes is there and renders
    record = load_run(run_dir)
    assert record["steps"]["total"] == 29  # 30 batches, each a step; the last one's end unseen: the loop breaks
    assert record["collectors"]["data-probe"]["reason"] == "not run: gpuscope stopped before it"
    report = run_gpuscope(["report", str(run_dir)], tmp_path)
    assert report.returncode == 0, report.stderr
    assert (run_dir / "report.html").is_file()
    time.sleep(0.5)  # the probe's child gets its parent-death signal
    assert processes_mentioning(str(run_dir)) == []
