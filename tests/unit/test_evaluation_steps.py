"""Evaluation passes between training steps (a train/test loop's test pass, a framework's validation): the step in
which the trained model ran forward in eval mode or with gradients off, and that took 1.5x the others, is left out
of the step figures while such steps are a minority, and the verdict says what they took where it is notable. A loop
that runs forward without gradients in most steps (a rollout before each update) keeps every step."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

import pytest
import torch

from conftest import make_record
from gpuscope.collect.captures import StepCapture, TraceCapture
from gpuscope.collect.collectors.steps import StepsCollector
from gpuscope.collect.framework.base import CollectorResult, Watcher
from gpuscope.collect.steps.steplog import StepLog, StepTracker
from gpuscope.diagnose.classify import classify
from gpuscope.diagnose.words import evaluation_line
from gpuscope.diagnose.words import left_out
from gpuscope.record import CallSite, CollectorStatus, Loader, Steps, Window
from gpuscope.reduce.fields import record_fields
from gpuscope.reduce.steady import summarize

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
    line = evaluation_line(record)
    assert line is not None
    assert "10 steps held an evaluation pass" in line
    assert "22.0 s in all, 2.2x the 10.0 s of the 100 steady steps" in line
    assert line in classify(record).evidence
    assert left_out(record) == "left out: 1 warm-up, 9 profiled, 0 outliers, 10 with an evaluation pass"


def test_the_loader_notable_evaluation_passes_waited_on_is_named() -> None:
    # given (as recorded on a Trainer evaluating every 20 steps on a slow eval set): 2 passes of 1.7 s, and the
    # eval loader's 12 batches waited 2.4 s (the last pass, after the last step, in no step)
    steps = Steps(count=48, median_s=0.0133, mean_s=0.0125, total=60, warmup=1, profiled=9, evaluated=2,
                  evaluated_s=1.7)
    site = CallSite(file="hf_eval.py", line=27, code="trainer.train()")
    loaders = (Loader(dataset="Tokens", batches=60, wait_s=0.03, eval_batches=2, eval_wait_s=0.001),
               Loader(dataset="SlowTokens", batches=12, wait_s=2.44, eval_batches=12, eval_wait_s=2.44,
                      created_at=site, created_by="transformers"))
    line = evaluation_line(make_record(steps=steps, loaders=loaders))
    assert line is not None and line.endswith(
        "; the evaluation waited 2.4 s in all for the SlowTokens loader's 12 batches (0 worker processes, built at "
        "hf_eval.py:27 by transformers)")
    # a quick loader is not named
    quick = (dataclasses.replace(loaders[1], wait_s=0.1, eval_wait_s=0.1),)
    assert "waited" not in evaluation_line(make_record(steps=steps, loaders=quick))  # type: ignore[operator]


def test_brief_evaluation_passes_get_no_line() -> None:
    steps = Steps(count=100, median_s=0.1, mean_s=0.1, total=103, warmup=1, evaluated=2, evaluated_s=0.5)
    assert evaluation_line(make_record(steps=steps)) is None


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


def test_the_steps_collector_counts_the_passes_without_gradients_by_the_models_mode() -> None:
    # given: the train/test loop's test passes (eval mode, no_grad), and a PPO-style rollout: the policy in train
    # mode under no_grad, 6 times before each 4 updates
    tested = run_train_and_test(epochs=3, batches=5)
    collector = StepsCollector()
    collector.start(Path("."))
    policy = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.Adam(policy.parameters())
    for _ in range(3):
        with torch.no_grad():
            for _ in range(6):
                policy(torch.randn(4, 4))
        for _ in range(4):
            policy(torch.randn(16, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    rolled = collector.stop().payload
    # then: eval mode for the first, train mode for the rollouts (those before the model's modules were hooked, at
    # the first step's end, are not seen)
    assert tested.no_grad_modes == (9, 0)
    assert rolled.no_grad_modes == (0, 12)


def test_passes_without_gradients_in_train_mode_are_named_as_the_rollout_they_most_likely_are() -> None:
    # given: CleanRL's PPO as recorded (ppo.py in the note of 2026-11-26): 11 steps held the policy's no_grad
    # forwards in train mode, 1.0 s against 0.5 s of updates
    steps = Steps(count=171, median_s=0.0026, mean_s=0.0029, total=192, warmup=1, profiled=9, evaluated=11,
                  evaluated_s=1.0, evaluated_in_train_mode=1.0)
    line = evaluation_line(make_record(steps=steps))
    assert line is not None and line.startswith(
        "11 steps held forward passes of the trained model without gradients, in train mode (a rollout collecting "
        "the next batch, as a reinforcement-learning loop runs, or an evaluation pass without model.eval()): 1.0 s "
        "in all, 2.0x the 0.5 s of the 171 steady steps; the step figures leave them out and describe the updates "
        "only")
    assert left_out(make_record(steps=steps)) == "left out: 1 warm-up, 9 profiled, 0 outliers, 11 with a rollout"
    # a test pass after model.eval() is still an evaluation pass
    tested = evaluation_line(make_record(steps=dataclasses.replace(steps, evaluated_in_train_mode=0.0)))
    assert tested is not None and "11 steps held an evaluation pass" in tested


def profiled_trace(ops_by_step: dict[int, int]) -> TraceCapture:
    """torch.profiler's window as captured: each recorded step's ``ProfilerStep#N`` range holding that many
    ``aten::mm`` calls of 10 us."""
    events: list[dict[str, object]] = []
    for step, (number, ops) in enumerate(ops_by_step.items()):
        start = 1e6 + step * 10_000.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": 1, "tid": 1,
                       "ts": start, "dur": 9_000.0, "args": {}})
        events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": start + 20.0 * i + 1,
                    "dur": 10.0, "args": {"External id": number * 1000 + i}} for i in range(ops)]
    return TraceCapture(events=events, recorded=tuple(ops_by_step), cuda=False, trace_bytes=1, trace_detail="full")


def window_capture(records: list) -> StepCapture:
    """The step records of a run whose torch.profiler window was steps 7-9."""
    records = [dataclasses.replace(r, profiled=r.index in (7, 8, 9)) for r in records]
    return StepCapture(tuple(records), len(records), len(records), 1.0, "optimizer", (), "cpu")


def test_a_test_pass_in_the_profilers_window_is_left_out_of_the_op_table() -> None:
    # given: 8 batches an epoch, so step 8 of the window 7-9 holds the first test pass; it ran 50 ops, a training
    # step 3
    trace = profiled_trace({7: 3, 8: 50, 9: 3})
    steps = window_capture(train_test_loop(epochs=4, batches=8))
    ops = record_fields("op_profile", trace, {"steps": steps, "torch-trace": trace})["op_profile"]
    # then the op table describes the two training steps, and says which step it left out
    assert (ops.steps, ops.ops, ops.ops_per_step, ops.evaluated_steps) == (2, 6, 3.0, (8,))
    assert ops.window == Window(7, 9)


def test_the_op_table_keeps_every_step_where_no_forward_without_gradients_is_an_evaluation_pass() -> None:
    trace = profiled_trace({7: 3, 8: 50, 9: 3})
    # a loop that runs a no-grad forward in every step: none of its steps is an evaluation pass
    every = window_capture(train_test_loop(epochs=4, batches=8, evaluated_every_step=True))
    ops = record_fields("op_profile", trace, {"steps": every})["op_profile"]
    assert (ops.steps, ops.ops, ops.evaluated_steps) == (3, 56, ())
    # no steps collector: nothing to tell them apart by
    assert record_fields("op_profile", trace, {})["op_profile"].ops == 56


def test_every_span_tells_how_it_ended_even_the_uncounted_ones_so_a_last_test_pass_counts_as_evaluation() -> None:
    # given: two optimizer steps, the second with a test pass in it; then a last test pass after the last step
    # (pytorch/examples' train() then test(), a Lightning fit's final validation): an open span, never a step
    ended: list[bool] = []
    tracker = StepTracker(0.0, StepLog())
    tracker.on_span_end = ended.append
    tracker.optimizer_stepped(1, 1.0)
    tracker.evaluation_forward()
    tracker.optimizer_stepped(1, 2.0)
    tracker.evaluation_forward()
    tracker.finish()
    # then: the two steps and the open span, the second and the last evaluated
    assert ended == [False, True, True]
    assert tracker.log.count == 2


def test_a_test_pass_after_the_last_step_is_timed_and_the_verdict_counts_it() -> None:
    # given: one epoch of training (steps end at 1.0 and 2.0 s), then its test pass, ended at 5.5 s
    tracker = StepTracker(0.0, StepLog())
    tracker.optimizer_stepped(1, 1.0)
    tracker.optimizer_stepped(1, 2.0)
    tracker.evaluation_forward()
    tracker.finish(5.5)
    # then: the pass took 3.5 s, in no step
    assert (tracker.final_evaluation_s, tracker.log.count) == (3.5, 2)
    # a script's last lines without an evaluation pass are not one
    quiet = StepTracker(0.0, StepLog())
    quiet.optimizer_stepped(1, 1.0)
    quiet.finish(9.0)
    assert quiet.final_evaluation_s == 0.0
    # and the verdict says what it took, though no step held one (a profiling run of one epoch: its only pass)
    steps = Steps(count=100, median_s=0.1, mean_s=0.1, total=110, warmup=1, profiled=9, final_evaluation_s=3.5)
    line = evaluation_line(make_record(steps=steps))
    assert line is not None and line.startswith(
        "the run's end, after the last step, held an evaluation pass (the trained model ran forward in eval mode or "
        "without gradients): 3.5 s in all, 35% of the 10.0 s of the 100 steady steps")
    both = dataclasses.replace(steps, evaluated=2, evaluated_s=2.0)
    assert evaluation_line(make_record(steps=both)).startswith(  # type: ignore[union-attr]
        "2 steps and the run's end, after the last step, held an evaluation pass")
    assert "5.5 s in all" in evaluation_line(make_record(steps=both))  # type: ignore[operator]


class SlowToStop(Watcher):
    """A live collector whose stop takes 0.2 s, as the torch profiler's does writing out a trace of many ops."""

    name = "slow-to-stop"
    field = None

    def unavailable_reason(self) -> None:
        return None

    def start(self, run_dir: Path) -> None:
        pass

    def stop(self) -> CollectorResult:
        time.sleep(0.2)
        return CollectorResult(CollectorStatus("ok"))


def test_the_time_other_collectors_take_to_stop_is_no_part_of_a_final_test_pass(tmp_path: Path) -> None:
    # given: six training steps, then a test pass, under a session whose other collector takes 0.2 s to stop
    from gpuscope.session import Session

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    session = Session(tmp_path, ["in-process"], [StepsCollector(), SlowToStop()])
    session.start()
    try:
        for _ in range(6):
            model(torch.randn(8, 4)).sum().backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            model(torch.randn(8, 4))
    finally:
        record = session.stop(0)
    # then: the test pass took what it took, microseconds, not the other collector's stop
    assert record.steps.total == 6
    assert 0 < record.steps.final_evaluation_s < 0.1


def test_the_steps_left_out_are_counted_in_words_that_agree_with_their_number() -> None:
    one = Steps(count=100, median_s=0.1, mean_s=0.1, total=111, warmup=1, profiled=9, outliers=1)
    assert left_out(make_record(steps=one)) == "left out: 1 warm-up, 9 profiled, 1 outlier"
    two = dataclasses.replace(one, total=112, outliers=2)
    assert left_out(make_record(steps=two)) == "left out: 1 warm-up, 9 profiled, 2 outliers"
