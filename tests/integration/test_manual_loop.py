"""A word_language_model-style loop (manual SGD, batches sliced from a tensor, no optimizer, no DataLoader): each
``backward()`` ends a step, so the steps equal the iterations, and the verdict agrees with an ablation that needs
no profiler at all: a launch-bound step hardly grows with 8x the batch, a compute-bound one grows several-fold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import SAMPLES, load_run, run_gpuscope, run_python

pytestmark = [pytest.mark.slow, pytest.mark.timing]

SAMPLE = SAMPLES / "manual_sgd_language_model.py"
OWN = re.compile(r"steps=(\d+) median_step_s=([0-9.]+)")


@pytest.fixture(autouse=True)
def _one_intra_op_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run here (the ablations under python and the runs under gpuscope) on one intra-op thread, as in the
    framework matrix: the sample does not set it, and on two cores a second thread stalls each of the tiny model's
    ops whenever anything else holds the other core (its 8x-batch growth then read 1.2x to 2.4x between runs on the
    idle machine, and 2.5x once in CI; with one thread 1.3x to 1.6x)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def own_median_s(tmp_path: Path, *args: str) -> float:
    """The loop's own median step under plain python."""
    result = run_python([str(SAMPLE), *args], tmp_path, timeout=300, preloaded=True)
    assert result.returncode == 0, result.stderr
    match = OWN.search(result.stdout)
    assert match, result.stdout
    return float(match.group(2))


def growth_with_batch(tmp_path: Path, *args: str, batch_size: str, rounds: int = 2) -> float:
    """How many times longer the loop's own median step is with ``--batch-size BATCH_SIZE``, under plain python:
    each side's fastest of ``rounds`` runs, taken in turn. Steps of a few milliseconds are slowed whole runs at a
    time when a neighbour takes this shared machine's other core (one such run read a 2.3x growth that was 1.3x to
    1.6x before and after), and the load only ever adds time."""
    base, larger = [], []
    for _ in range(rounds):
        base.append(own_median_s(tmp_path, *args))
        larger.append(own_median_s(tmp_path, *args, "--batch-size", batch_size))
    return min(larger) / min(base)


def test_a_manual_sgd_loop_has_one_step_per_iteration_and_a_tiny_model_is_launch_bound(tmp_path: Path) -> None:
    # given: the tiny model, whose step time hardly grows with 8x the batch (measured without gpuscope)
    growth = growth_with_batch(tmp_path, "--steps", "300", batch_size="32")
    if growth >= 2.0:  # a neighbour's load slows whole runs (CI run bs read 2.06x under plain python): once more
        growth = min(growth, growth_with_batch(tmp_path, "--steps", "300", batch_size="32"))
    assert growth < 2.0
    # when: 500 iterations run under gpuscope
    run_dir = tmp_path / "run"
    result = run_gpuscope(["run", "-q", "-o", str(run_dir), str(SAMPLE), "--steps", "500"], tmp_path,
                          timeout=300, preloaded=True)
    # then: one step per iteration, marked by backward(), and a launch-bound verdict
    assert result.returncode == 0, result.stderr
    record = load_run(run_dir)
    assert (record["steps"]["total"], record["steps"]["source"]) == (500, "backward")
    assert record["breakdown"]["forward"] > 0 and record["breakdown"]["backward"] > 0
    assert record["verdict"]["bound"] == "cpu-launch", record["verdict"]["evidence"]


def test_a_manual_sgd_loop_with_a_large_model_is_compute_bound(tmp_path: Path) -> None:
    # given: the large model, whose step time grows several-fold with 8x the batch
    # one round: steps of 60 ms grow about 6x (0.36 s a step at batch 256), far from both the bar and the load
    growth = growth_with_batch(tmp_path, "--steps", "6", "--large", batch_size="256", rounds=1)
    assert growth > 2.5
    # when
    run_dir = tmp_path / "run"
    result = run_gpuscope(["run", "-q", "-o", str(run_dir), str(SAMPLE), "--steps", "40", "--large"], tmp_path,
                          timeout=300, preloaded=True)
    # then
    assert result.returncode == 0, result.stderr
    record = load_run(run_dir)
    assert (record["steps"]["total"], record["steps"]["source"]) == (40, "backward")
    assert record["verdict"]["bound"] == "compute", record["verdict"]["evidence"]
