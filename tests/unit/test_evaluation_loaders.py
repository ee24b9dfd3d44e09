"""The data rules are about the loader the *training* steps waited on, and count the cores its workers would take
by how much of a batch's build is on a CPU. Recorded: an MNIST-style loop (tests/fixtures/records/README.md) whose
test set, read between epochs, waited longer in all than its training set, and whose training items mostly wait."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpuscope.diagnose.evidence import slowest_loader
from gpuscope.diagnose.rules import evaluate
from gpuscope.diagnose.speed import loader_plan, what_if
from gpuscope.record import RunRecord

RECORDS = Path(__file__).parent.parent / "fixtures" / "records"


def mnist_run() -> RunRecord:
    return RunRecord.from_json(json.loads((RECORDS / "mnist_slow_test_set.json").read_text()))


def test_the_loader_the_training_waited_on_is_the_one_the_advice_is_about() -> None:
    run = mnist_run()
    test_set = next(loader for loader in run.loaders if loader.dataset == "SlowTest")
    # given: the test loader waited longer in all, in steps that held an evaluation pass
    assert test_set.wait_s > max(loader.wait_s for loader in run.loaders if loader is not test_set)
    # then: the training loader is the slowest, and the probes measured it
    assert slowest_loader(run).dataset == "SlowTrain"  # type: ignore[union-attr]
    assert run.loader_probe.dataset == "SlowTrain"  # type: ignore[union-attr]
    assert run.data_probe.dataset == "SlowTrain"  # type: ignore[union-attr]
    recommendations, _ = evaluate(run)
    assert recommendations[0].id == "more-dataloader-workers"
    assert recommendations[0].fix == ("DataLoader(..., num_workers=1, persistent_workers=True)  "
                                      "# mnist_slow_test_set.py:72")


def test_workers_whose_items_mostly_wait_leave_the_step_its_cores() -> None:
    # given: fetching a training item is on a CPU 15% of its time (a sleep standing in for a disk read)
    run = mnist_run()
    assert run.data_probe.item_cpu_share == pytest.approx(0.15, abs=0.01)  # type: ignore[union-attr]
    # then: one worker keeps the step's two threads: 29.5 ms predicted for the 44.4 ms step (plain python measured
    # an epoch of 1.54 s go to 1.07 s with it, 1.44x)
    plan = loader_plan(run)
    assert plan is not None and plan.workers == 1 and plan.threads is None
    assert plan.step_s == pytest.approx(0.0295, abs=0.0005)
    estimate = what_if(run, run.verdict)  # type: ignore[arg-type]
    assert estimate is not None and "on a CPU 15% of a batch's build, by the data probe: they mostly wait" in \
        estimate.explanation
    # where the share was not measured, a worker is taken to take a core: the step's compute on one thread, slower
    unmeasured = dataclasses.replace(run, data_probe=dataclasses.replace(run.data_probe, item_cpu_share=None))
    slower = loader_plan(unmeasured)
    assert slower is not None and slower.step_s > run.steps.median_s  # type: ignore[operator]
    assert "more-dataloader-workers" not in [r.id for r in evaluate(unmeasured)[0]]
