"""Gradient accumulation over small batches: a step of k forward and backward passes, each mostly fixed cost, is
CPU-launch-bound, and ``larger-batch`` advises one pass over the step's samples (tests/fixtures/records/
acc_accum.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpuscope.diagnose.classify import classify
from gpuscope.diagnose.rules import evaluate
from gpuscope.diagnose.speed import what_if
from gpuscope.record import RunRecord

RECORDS = Path(__file__).resolve().parent.parent / "fixtures" / "records"


def accumulating_run() -> RunRecord:
    """The recorded text classifier under accelerate: 8 batches of 8 accumulated for each AdamW step, 17.9 ms a step,
    its 1.67 MFLOP at 0.1% of the 133 GFLOP/s matmul peak measured after the run."""
    return RunRecord.from_json(json.loads((RECORDS / "accumulate.json").read_text()))


def larger_batch(run: RunRecord):
    return next((r for r in evaluate(run)[0] if r.id == "larger-batch"), None)


def test_a_step_of_eight_fixed_cost_passes_is_cpu_launch_bound_and_says_why() -> None:
    verdict = classify(accumulating_run())
    assert verdict.bound == "cpu-launch"
    assert verdict.evidence[3] == ("each step runs 8 forward and backward passes, one a batch (gradients accumulated), "
                                   "its arithmetic at 0.1% of the peak: the passes' fixed cost (Python, the ops' "
                                   "launches, autograd) bounds it")


def test_the_what_if_is_the_step_with_the_passes_fixed_cost_paid_once() -> None:
    run = accumulating_run()
    estimate = what_if(run, classify(run))
    found = larger_batch(run)
    assert estimate is not None and found is not None
    assert estimate.step_s == pytest.approx(run.steps.median_s * (1 - found.expected_gain), rel=0.002)  # gain rounded
    assert estimate.explanation == ("with one forward and backward over a step's 8 accumulated batches at once: their "
                                    "fixed cost paid once (larger-batch)")


def test_one_pass_over_the_steps_samples_is_advised_with_the_gain_of_seven_passes_fixed_cost() -> None:
    run = accumulating_run()
    found = larger_batch(run)
    assert found is not None
    assert found.evidence[0] == ("each optimizer step takes 8 batches of 8 from the DataLoader (gradients accumulated "
                                 "over them): 8 forward and backward passes a step, 55% of it")
    assert found.evidence[1].startswith("the step's arithmetic, 1.67 MFLOP, ran at 0.1% of the peak (measured here")
    assert found.fix == ("DataLoader(..., batch_size=64)  # acc_accum.py:22, then accumulate no more: an optimizer "
                         "step every batch, not every 8 (accelerate: Accelerator(gradient_accumulation_steps=1); "
                         "Lightning: Trainer(accumulate_grad_batches=1); a loop of your own: no division of the loss "
                         "by 8), the same 64 samples an update in one forward and backward, while memory allows")
    # the forward and backward's share, less their arithmetic at the peak, paid once instead of 8 times; measured with
    # one batch of 64 and gradient_accumulation_steps=1: 17.9 -> 4.4 ms a step (75%; accelerate's own work and the
    # loader's per batch, left out of the estimate, fell too)
    model = run.breakdown.forward + run.breakdown.backward
    arithmetic = 1671168 / run.speed_of_light.peak_flops_per_s / run.steps.median_s  # type: ignore[union-attr]
    assert found.expected_gain == pytest.approx(7 / 8 * (model - arithmetic), abs=0.001)
    assert 0.45 < found.expected_gain < 0.75


def test_the_trainer_is_told_its_own_arguments() -> None:
    run = accumulating_run()
    loader = dataclasses.replace(run.loaders[0], created_by="transformers")
    found = larger_batch(dataclasses.replace(run, loaders=(loader,)))
    assert found is not None
    assert found.fix == ("TrainingArguments(..., per_device_train_batch_size=64, gradient_accumulation_steps=1)  "
                         "# transformers, called from acc_accum.py:22, while memory allows")


def test_one_batch_a_step_or_arithmetic_that_counts_is_no_accumulation_finding() -> None:
    run = accumulating_run()
    # one batch a step: the same figures are mixed, and no pass is paid twice
    single = dataclasses.replace(run, loaders=(dataclasses.replace(run.loaders[0], batches=150),))
    assert classify(single).bound == "inconclusive"
    found = larger_batch(single)
    assert found is None or not found.evidence[0].startswith("each optimizer step takes")
    # the step's arithmetic at 5% of the peak: the passes are not all fixed cost
    busy = dataclasses.replace(run, speed_of_light=dataclasses.replace(run.speed_of_light, mfu=0.05))
    assert classify(busy).bound == "inconclusive"
    found = larger_batch(busy)
    assert found is None or not found.evidence[0].startswith("each optimizer step takes")
