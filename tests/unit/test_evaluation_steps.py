"""Evaluation passes between training steps (a train/test loop's test pass, a framework's validation): the step in
which the trained model ran forward in eval mode or with gradients off, and that took 1.5x the others, is left out
of the step figures while such steps are a minority, and the verdict says what they took where it is notable. A loop
that runs forward without gradients in most steps (a rollout before each update) keeps every step."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from conftest import make_record
from gpuscope.analysis.classify import classify
from gpuscope.analysis.evidence import evaluation_passes
from gpuscope.analysis.steady import summarize
from gpuscope.captures import StepCapture
from gpuscope.collectors.steplog import StepLog, StepTracker
from gpuscope.collectors.steps import StepsCollector
from gpuscope.record import Steps
from gpuscope.summary import left_out

TRAIN = {"data_wait": 0.01, "forward": 0.03, "backward": 0.05, "optimizer": 0.01}
"""A training step of 0.1 s."""
EVAL = {"data_wait": 0.5, "forward": 1.5, "backward": 0.05, "optimizer": 0.01}
"""The step after an epoch: the test pass (2 s, most of it forward), then the next epoch's first training step."""


def train_test_loop(epochs: int, batches: int, evaluated_every_step: bool = False) -> list:
    """Step records of ``epochs`` epochs of ``batches`` training steps, each epoch's test pass falling in the first
    step of the next."""
    tracker = StepTracker(0.0, StepLog())
    now = 0.0
    for index in range(epochs * batches):
        after_test = index and index % batches == 0
        for phase, seconds in (EVAL if after_test else TRAIN).items():
            tracker.enter(phase, now)
            if phase == "forward" and (after_test or evaluated_every_step):
                tracker.evaluation_forward()
            now += seconds
            tracker.exit(phase, now)
        now += 0.001
        tracker.optimizer_stepped(1, now)
    return tracker.log.records()


def test_only_the_step_in_which_the_model_ran_without_gradients_is_marked() -> None:
    marked = [r.index for r in train_test_loop(epochs=3, batches=10) if r.evaluated]
    assert marked == [10, 20]


def test_a_minority_of_evaluation_steps_is_left_out_of_the_figures_however_many_there_are() -> None:
    # 11 of 119 later steps (9%): more than the 5% of outliers that would be taken for accidents
    records = train_test_loop(epochs=12, batches=10)
    steps = summarize(records, total=len(records), head=64, body_weight=1.0, source="optimizer").steps
    assert (steps.evaluated, steps.outliers, steps.warmup, steps.count) == (11, 0, 1, 108)
    assert steps.evaluated_s == pytest.approx(11 * 2.061)
    assert steps.median_s == pytest.approx(0.101)
    assert steps.sample.status[10] == "eval" and steps.sample.status[11] == "steady"


def test_the_breakdown_describes_the_training_steps() -> None:
    summary = summarize(train_test_loop(epochs=12, batches=10), total=120, head=64, body_weight=1.0,
                        source="optimizer")
    assert summary.breakdown.forward == pytest.approx(0.03 / 0.101)
    assert summary.breakdown.backward == pytest.approx(0.05 / 0.101)


def test_forward_without_gradients_in_most_steps_is_the_loops_work_and_every_step_stays() -> None:
    records = train_test_loop(epochs=12, batches=10, evaluated_every_step=True)
    steps = summarize(records, total=120, head=64, body_weight=1.0, source="optimizer").steps
    assert steps.evaluated == 0
    assert steps.count == 119  # the 11 long steps, 9% of them, are too many to be outliers either


def test_a_no_grad_forward_that_leaves_its_step_as_long_as_the_others_is_no_evaluation_pass() -> None:
    # a DQN choosing its action under no_grad on one state, in a fifth of its steps
    records = train_test_loop(epochs=1, batches=100)
    for record in records[::5]:
        record.evaluated = True
    steps = summarize(records, total=100, head=64, body_weight=1.0, source="optimizer").steps
    assert (steps.evaluated, steps.count) == (0, 99)


def test_the_verdict_says_what_notable_evaluation_passes_took() -> None:
    steps = Steps(count=100, median_s=0.1, mean_s=0.1, total=120, warmup=1, profiled=9, evaluated=10,
                  evaluated_s=22.0)
    record = make_record(steps=steps)
    line = evaluation_passes(record)
    assert line is not None
    assert "10 steps held an evaluation pass" in line
    assert "22.0 s in all, 2.2x the 10.0 s of the 100 steady steps" in line
    assert line in classify(record).evidence
    assert left_out(record) == "left out: 1 warm-up, 9 profiled, 0 outliers, 10 with an evaluation pass"


def test_brief_evaluation_passes_get_no_line() -> None:
    steps = Steps(count=100, median_s=0.1, mean_s=0.1, total=103, warmup=1, evaluated=2, evaluated_s=0.5)
    assert evaluation_passes(make_record(steps=steps)) is None


def run_train_and_test(epochs: int, batches: int, no_grad: bool = True) -> StepCapture:
    """A real train/test loop in this process, under the steps collector (its test pass under ``torch.no_grad``, or
    in eval mode only, as a script that forgot ``no_grad`` has it)."""
    collector = StepsCollector()
    collector.start(Path("."))
    try:
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(4, 8)
        for _ in range(epochs):
            model.train()
            for _ in range(batches):
                model(x).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
            model.eval()
            with torch.no_grad() if no_grad else contextlib.nullcontext():
                for _ in range(3):
                    model(x)
    finally:
        capture = collector.stop().payload
    return capture


@pytest.mark.parametrize("no_grad", [True, False])
def test_the_steps_collector_marks_the_steps_holding_an_evaluation_pass_of_the_trained_model(no_grad: bool) -> None:
    capture = run_train_and_test(epochs=4, batches=5, no_grad=no_grad)
    # the model's modules are hooked from the first step on; each test pass falls in the next epoch's first step
    assert [r.index for r in capture.records if r.evaluated] == [5, 10, 15]
