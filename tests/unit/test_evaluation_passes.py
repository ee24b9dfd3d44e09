"""``evaluate-less-often``: the trained model's forward passes without gradients inside the steps (an evaluation
after every update), timed on the host and placed at the line of the step's own code that ran them."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

from conftest import make_record
from gpuscope.collect.collectors.steps import StepsCollector
from gpuscope.collect.steps.no_grad_passes import NoGradPasses
from gpuscope.diagnose import analyze
from gpuscope.diagnose.rules import evaluate
from gpuscope.diagnose.rules.evaluation import evaluate_less_often
from gpuscope.record import Breakdown, CallSite, RunRecord
from timed_modules import Slow

RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "records"


def test_passes_in_the_first_step_and_after_the_last_are_no_steps_evaluation() -> None:
    passes = NoGradPasses()
    for step, began, ended in ((0, 0.0, 3.0), (1, 10.0, 10.5), (1, 11.0, 11.25), (2, 20.0, 20.5), (3, 30.0, 39.0)):
        passes.began(step, began, None)
        passes.ended(ended)
    # step 0's 3 s (its imports) and the 9 s after the last of 3 steps ended (a test pass) are left out; a step's
    # passes count from the first one's start to the last one's end (step 1: 10.0 to 11.25)
    assert passes.seconds(ended=3) == 1.25 + 0.5
    assert passes.seconds(ended=4) == 1.25 + 0.5 + 9.0


def evaluate_model(passes: NoGradPasses, step: int) -> None:
    passes.began(step, 0.0, sys._getframe(0))  # (the model's call, as the forward timing sees it)


def training_step(passes: NoGradPasses, step: int) -> None:
    evaluate_model(passes, step)  # the line of the step's code that ran the pass


def test_a_pass_is_placed_at_the_line_of_the_function_that_steps_the_optimizer() -> None:
    passes = NoGradPasses()
    passes.stepper(sys._getframe(0))  # the optimizer stepped from this test's code, which calls training_step
    training_step(passes, 1)
    (site,) = passes.sites.sites()
    assert site.function == "test_a_pass_is_placed_at_the_line_of_the_function_that_steps_the_optimizer"
    assert site.code == "training_step(passes, 1)"
    # and where no function that steps an optimizer ran it, at the user's innermost line
    alone = NoGradPasses()
    evaluate_model(alone, 1)
    (site,) = alone.sites.sites()
    assert site.function == "evaluate_model"


def test_an_evaluation_after_every_update_is_timed_and_a_test_pass_after_the_loop_is_not() -> None:
    # given: a loop evaluating twice after each update (10 ms each) and once more, for 200 ms, when it is done
    collector = StepsCollector()
    model = Slow(0.01)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def test_pass() -> None:
        model.eval()
        with torch.no_grad():
            model(torch.randn(8, 4))

    collector.start(Path("."))
    try:
        for _ in range(10):
            model.train()
            optimizer.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            optimizer.step()
            test_pass()
            test_pass()
        model.seconds = 0.2
        test_pass()
    finally:
        result = collector.stop()
    capture = result.payload
    # then: 20 ms a step in steps 1-9, each holding the passes after the update before it (those after the tenth
    # are in the step still open at the end, with the test pass; step 0 held none)
    assert 9 * 0.02 <= capture.no_grad_s < 9 * 0.02 + 0.1, capture.no_grad_s
    assert {site.code for site in capture.no_grad_sites} == {"test_pass()"}
    assert sum(site.calls for site in capture.no_grad_sites) == 21


def recorded() -> RunRecord:
    return RunRecord.from_json(json.loads((RECORDS / "full_batch_gcn.json").read_text()))


def test_the_gcn_evaluating_after_every_update_is_told_to_evaluate_every_tenth_step_at_its_lines() -> None:
    # given: pytorch/examples' GCN loop (full_batch_gcn.py), which evaluates on its train and validation nodes
    # after every update: 41% of its steps' time in those passes
    record = analyze(recorded())
    (found,) = [r for r in record.recommendations if r.id == "evaluate-less-often"]
    assert found.evidence[0].startswith("the trained model runs forward in eval mode or without gradients in every "
                                        "step, 2 forward passes a step besides training's at full_batch_gcn.py:37 "
                                        "`loss_train, acc_train = test(model, idx_train)`, full_batch_gcn.py:38 ")
    assert "41% of the steps' time" in found.evidence[0]
    # then: evaluating every 10th step gives back nine tenths of it (39-41% measured: benchmarks/README.md)
    assert found.expected_gain == round(0.9 * record.steps.no_grad_share, 3) == 0.372  # type: ignore[operator]
    assert found.fix.startswith("full_batch_gcn.py:37: evaluate every 10 steps, not at every one")


def with_steps(**changes: object) -> RunRecord:
    record = recorded()
    return dataclasses.replace(record, steps=dataclasses.replace(record.steps, **changes))


def test_rollouts_evaluations_left_out_and_small_shares_are_no_finding() -> None:
    assert evaluate_less_often(with_steps()) is not None
    # passes in train mode without gradients are a rollout collecting the next batch: the loop's own work
    assert evaluate_less_often(with_steps(evaluated_in_train_mode=0.8)) is None
    # steps left out for holding an evaluation: the passes are in a few steps, not every one
    assert evaluate_less_often(with_steps(evaluated=12)) is None
    assert evaluate_less_often(with_steps(no_grad_share=0.09)) is None
    assert evaluate_less_often(with_steps(no_grad_share=None)) is None


def test_a_loop_that_only_evaluates_is_not_told_to_evaluate_less_often() -> None:
    # given: pytorch/examples' Hogwild, whose main process only tests the model its child processes trained: every
    # step a no-grad forward (78% of its time), no backward, no optimizer step
    record = recorded()
    evaluating = dataclasses.replace(
        record, steps=dataclasses.replace(record.steps, forwards_per_backward=None, no_grad_share=0.78),
        breakdown=Breakdown(data_wait=0.11, forward=0.87, backward=0.0, optimizer=0.0, other=0.02))
    # then: nothing to evaluate less often against, and the check says why
    _, checks = evaluate(evaluating)
    assert checks["evaluate-less-often"].status == "not-checked"
    assert (checks["evaluate-less-often"].reason or "").startswith("the steps train no model: no backward and no "
                                                                   "optimizer step in them")
    # where its steps did step an optimizer (gradients set by hand, no backward), they train
    stepping = dataclasses.replace(evaluating, breakdown=Breakdown(data_wait=0.11, forward=0.77, backward=0.0,
                                                                   optimizer=0.1, other=0.02))
    assert evaluate(stepping)[1]["evaluate-less-often"].status == "fired"


def test_a_gpu_run_is_not_checked_as_its_passes_are_timed_on_the_host() -> None:
    _, checks = evaluate(dataclasses.replace(make_record(), device="cuda"))
    assert checks["evaluate-less-often"].status == "not-checked"
    assert "timed on the host" in (checks["evaluate-less-often"].reason or "")


def test_a_site_without_a_file_gives_the_generic_fix() -> None:
    found = evaluate_less_often(with_steps(no_grad_sites=(CallSite(),)))
    assert found is not None and found.fix is None


def test_a_trainer_evaluating_at_every_step_is_told_its_setting_not_the_line_that_trains() -> None:
    # given: transformers' Trainer with eval_steps=1 ran the passes (a tiny GPT-2: 62% of its steps' time; eval_steps
    # 10 trained 59% and 63% faster, benchmarks/README.md); the user's line is only trainer.train()
    found = evaluate_less_often(with_steps(no_grad_by="transformers"))
    assert found is not None
    assert found.fix == 'TrainingArguments(..., eval_strategy="steps", eval_steps=10)  # evaluates at every step now'
    lightning = evaluate_less_often(with_steps(no_grad_by="lightning"))
    assert lightning is not None and lightning.fix.startswith("Trainer(..., val_check_interval=10)")
    # another library's evaluation gets the rule's generic fix, not the user's line
    other = evaluate_less_often(with_steps(no_grad_by="ignite"))
    assert other is not None and other.fix is None


def test_the_library_whose_code_ran_the_first_pass_is_kept() -> None:
    import copy

    passes = NoGradPasses()
    passes.stepper(sys._getframe(0))  # this function steps the optimizer: the library is the one below it

    class CalledByALibrary:
        def __deepcopy__(self, memo: object) -> CalledByALibrary:  # copy.deepcopy's code calls it
            passes.began(1, 0.0, sys._getframe(1))
            return self

    copy.deepcopy(CalledByALibrary())
    assert passes.by == "copy"
    # and the script's own code is no library
    mine = NoGradPasses()
    mine.stepper(sys._getframe(0))
    training_step(mine, 1)
    assert mine.by == ""


def test_a_training_pass_between_two_evaluations_of_a_step_is_no_part_of_their_time() -> None:
    passes = NoGradPasses()
    passes.began(1, 10.0, None)  # a pass without gradients (pseudo-labels), then a training pass, then another
    passes.ended(10.5)
    passes.training()
    passes.began(1, 12.0, None)
    passes.ended(12.25)
    passes.began(1, 12.5, None)  # (two passes in a row: one run, the time between them included)
    passes.ended(13.0)
    passes.began(2, 20.0, None)
    passes.ended(20.1)
    assert passes.seconds(ended=3) == pytest.approx(0.5 + 1.0 + 0.1)
