"""Models the optimizers do not train, whose forward runs in every step (a distillation's teacher, a frozen
encoder): the steps collector finds them with the trained model, times each call on the loop's thread, and names the
line that calls them; the verdict names the one that takes the step's time."""

from __future__ import annotations

import copy
import dataclasses
import json
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset, default_collate

from gpuscope.collect.collectors.steps import StepsCollector
from gpuscope.collect.framework.base import CollectorResult
from gpuscope.collect.steps.frozen_models import FrozenModels, _fed
from gpuscope.collect.steps.loaders import fixed_items
from gpuscope.diagnose.rules import evaluate
from gpuscope.diagnose.classify import classify
from gpuscope.record import FrozenModel, RunRecord, StepSample
from gpuscope.reduce.steady import _frozen_figures, summarize_capture
from gpuscope.report.render import render_report
from gpuscope.report.summary import summary_lines

HERE = Path(__file__).name
RECORDS = Path(__file__).resolve().parent.parent / "fixtures" / "records"


class SlowTeacher(nn.Module):
    """A frozen model whose forward takes 4 ms of the step."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.004)
        return self.layer(x)


def collected(batches: Iterable[Any], loss_of: Callable[[Any], torch.Tensor], optimizer: torch.optim.Optimizer,
              after: Callable[[], None] = lambda: None) -> CollectorResult:
    """What the steps collector records of a loop taking an optimizer step on ``loss_of(batch)`` for each of
    ``batches`` (then ``after()``)."""
    collector = StepsCollector()
    collector.start(Path("."))
    try:
        for batch in batches:
            loss = loss_of(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            after()
    finally:
        result = collector.stop()
    return result


def distil(steps: int, teacher_under_no_grad: bool = True) -> CollectorResult:
    """A student trained against a frozen teacher (and an EMA copy of the student that no step calls)."""
    torch.manual_seed(0)
    teacher, student = SlowTeacher().eval(), nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    for p in teacher.parameters():
        p.requires_grad_(False)
    ema = copy.deepcopy(student)
    x = torch.randn(4, 8)

    def loss_of(_: int) -> torch.Tensor:
        if teacher_under_no_grad:
            with torch.no_grad():
                target = teacher(x)
        else:
            target = teacher(x).detach()
        return nn.functional.mse_loss(student(x), target)

    @torch.no_grad()
    def update_ema() -> None:
        for e, s in zip(ema.parameters(), student.parameters()):
            e.lerp_(s, 0.01)

    return collected(range(steps), loss_of, torch.optim.SGD(student.parameters(), lr=0.1), update_ema)


def test_a_frozen_teacher_is_timed_apart_with_the_line_that_calls_it() -> None:
    capture = distil(steps=12).payload
    # the teacher alone: the EMA copy, frozen too, never ran in a step; the student is the trained model
    ((teacher, by_step, kept),) = capture.frozen_models
    assert teacher.module == "SlowTeacher" and teacher.parameters == 36
    assert teacher.calls == capture.count - 1  # found at the first step's end
    assert sorted(by_step) == list(range(1, capture.count)) and all(calls == 1 for _, calls in by_step.values())
    assert kept == (1, -1)  # from the step it was found in, to the end
    assert all(seconds >= 0.004 for seconds, _ in by_step.values())
    assert teacher.without_gradients and teacher.eval_mode
    assert teacher.called_at is not None and teacher.called_at.file.endswith(HERE)
    assert teacher.called_at.code == "target = teacher(x)"
    # and its figures are those of the steady steps, as the breakdown's are
    steps = summarize_capture(capture).steps
    (shared,) = steps.frozen_models
    steady = [(i, w) for i, w, s in zip(steps.sample.index, steps.sample.wall_s, steps.sample.status)
              if s == "steady"]
    assert shared.calls_per_step == 1.0
    assert shared.call_s == sum(by_step[i][0] for i, _ in steady) / len(steady)
    assert shared.step_share == sum(by_step[i][0] for i, _ in steady) / sum(w for _, w in steady)
    assert 0.3 < shared.step_share <= 1.0  # type: ignore[operator]


def test_calls_outside_the_steady_steps_are_not_counted_in_its_figures() -> None:
    # given: the teacher also ran three times in the warm-up step (say, an evaluation)
    capture = distil(steps=12).payload
    ((teacher, by_step, kept),) = capture.frozen_models
    by_step = {**by_step, 0: (0.5, 3)}
    steps = summarize_capture(dataclasses.replace(capture, frozen_models=((teacher, by_step, kept),))).steps
    assert steps.sample.index[0] == 0 and steps.sample.status[0] != "steady"
    # then: one call a steady step, its time theirs
    assert steps.frozen_models[0].calls_per_step == 1.0 and steps.frozen_models[0].call_s < 0.05


def test_steps_past_those_its_calls_were_kept_for_are_not_read_as_steps_without_a_call() -> None:
    # given: ten steady steps of 10 ms, the teacher's 4 ms calls kept for steps 1-5 only (a long run's cap)
    sample = StepSample(index=tuple(range(11)), wall_s=(0.05,) + (0.01,) * 10,
                        status=("warmup",) + ("steady",) * 10)
    by_step = {i: (0.004, 1) for i in range(1, 6)}
    teacher = _frozen_figures(FrozenModel(module="Teacher", calls=10), by_step, (1, 6), sample, "cpu")
    # then: one call a step, 40% of it, over the steps 1-5
    assert teacher.calls_per_step == 1.0 and teacher.step_share == pytest.approx(0.4)
    # and on a GPU the host's time is no share of the device's step
    assert _frozen_figures(FrozenModel(module="Teacher"), by_step, (1, 6), sample, "cuda").step_share is None


def test_a_teacher_called_with_gradients_on_says_so() -> None:
    ((teacher, _, _),) = distil(steps=6, teacher_under_no_grad=False).payload.frozen_models
    assert not teacher.without_gradients and teacher.eval_mode


class LitDistiller(nn.Module):
    """A LightningModule's shape: its forward never runs; its training step calls the frozen teacher it holds and
    the student it trains, and its optimizer was handed all its parameters, the teacher's among them."""

    def __init__(self) -> None:
        super().__init__()
        self.teacher = SlowTeacher().eval().requires_grad_(False)
        self.student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def training_step(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = self.teacher(x)
        return nn.functional.mse_loss(self.student(x), target)


def test_a_frozen_teacher_inside_a_module_whose_forward_never_runs_is_found_as_the_roots_go_down() -> None:
    torch.manual_seed(0)
    module = LitDistiller()
    x = torch.randn(4, 8)
    capture = collected(range(12), lambda _: module.training_step(x),
                        torch.optim.SGD(module.parameters(), lr=0.1)).payload
    # the student is timed as the forward, the teacher apart, from the step after the roots went down a level
    ((teacher, by_step, kept),) = capture.frozen_models
    assert teacher.called_at is not None and teacher.called_at.code == "target = self.teacher(x)"
    assert teacher.module == "SlowTeacher"
    assert kept[0] >= 2 and sorted(by_step) == list(range(kept[0], capture.count))
    steps = summarize_capture(capture).steps
    assert steps.frozen_models[0].calls_per_step == 1.0


def test_a_model_an_optimizer_is_later_seen_training_is_no_longer_timed_as_frozen() -> None:
    generator, critic = nn.Linear(4, 4), nn.Linear(4, 1)
    frozen = FrozenModels(time.perf_counter, lambda: 0)
    found = frozen.candidates([generator, critic], [critic], lambda m: m is critic)
    assert found == [generator]
    frozen.add(found, since=1)
    frozen.forget(lambda m: m is generator)  # its optimizer stepped for the first time
    assert frozen.timed == {}


def test_frozen_parts_of_the_trained_model_run_in_its_forward_and_are_not_timed_apart() -> None:
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2))
    model[0].weight.requires_grad_(False)
    trained = {id(p) for p in model[1].parameters()}
    assert FrozenModels.candidates(list(model.modules()), [model],
                                   lambda m: any(id(p) in trained for p in m.parameters())) == []


def test_the_verdict_names_the_frozen_model_that_takes_the_step() -> None:
    # given: a student distilled from a frozen teacher (tests/fixtures/records/README.md), its teacher 63% of the step
    record = RunRecord.from_json(json.loads((RECORDS / "distill_frozen_teacher.json").read_text()))
    verdict = classify(record)
    assert verdict.bound == "compute"
    assert ("computing outside the trained model's forward and backward in a model it does not train: Sequential "
            "(9.5M parameters, none trained), called at distill_frozen_teacher.py:49 `t_logits = teacher(x)` with "
            "gradients off, in eval mode: 22.2 ms a call, 1 a step, 63% of the step") in verdict.evidence[0], \
        verdict.evidence
    # a teacher under a tenth of the step is left to the general words
    small = dataclasses.replace(record.steps, frozen_models=tuple(
        dataclasses.replace(f, step_share=0.05) for f in record.steps.frozen_models))
    verdict = classify(dataclasses.replace(record, steps=small))
    assert "(a model run without gradients, a loss)" in verdict.evidence[0], verdict.evidence



def with_frozen_share(record: RunRecord, other: float, share: float) -> RunRecord:
    """``record`` with its "other" phase at ``other`` of the step and its frozen model's forward at ``share``."""
    frozen = tuple(dataclasses.replace(f, step_share=share) for f in record.steps.frozen_models)
    breakdown = dataclasses.replace(record.breakdown, backward=record.breakdown.backward + record.breakdown.other
                                    - other, other=other)
    steps = dataclasses.replace(record.steps, frozen_models=frozen)
    return dataclasses.replace(record, breakdown=breakdown, steps=steps)


def test_the_step_figures_say_which_model_the_other_phase_holds_though_it_is_not_most_of_the_step(
        tmp_path: Path) -> None:
    # given: a perceptual loss's frozen network, 34% of the step, its forward between the trained model's forward and
    # backward: the "other" phase, 36% (pytorch/examples' fast_neural_style: its VGG16 called twice a step)
    record = with_frozen_share(RunRecord.from_json(json.loads((RECORDS / "distill_frozen_teacher.json").read_text())),
                               other=0.36, share=0.34)
    # then: the terminal's step figures and the report's say so under the "other" share
    named = ("other 36%: Sequential (9.5M parameters, none trained), called at distill_frozen_teacher.py:49 "
             "`t_logits = teacher(x)` with gradients off, in eval mode: 22.2 ms a call, 1 a step, 34% of the step")
    lines = summary_lines(record, tmp_path)
    assert f"    {named}" in lines, lines
    report = render_report(record)
    assert "Other, 36% of the step: Sequential (9.5M parameters, none trained)" in report
    # a model whose share the "other" phase cannot hold ran elsewhere, and one under a tenth of the step is not named
    for other, share in ((0.36, 0.5), (0.36, 0.05)):
        assert not any(line.lstrip().startswith("other ") for line in summary_lines(
            with_frozen_share(record, other, share), tmp_path))

def test_a_frozen_models_input_is_the_batch_only_where_every_tensor_it_is_given_is_the_batchs() -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    refs = (weakref.ref(x), weakref.ref(y))
    assert _fed(refs, (x,)) and _fed(refs, (x, 0.5, "mean"))
    assert not _fed(refs, (x.clone(),))  # a copy, an augmented batch
    assert not _fed(refs, (x * 2, y))  # a perceptual loss: the reconstruction beside the target
    assert not _fed(refs, ())


def test_only_a_tensor_dataset_or_a_subset_of_one_gives_fixed_items() -> None:
    data = TensorDataset(torch.randn(8, 2))
    assert fixed_items(data) and fixed_items(Subset(Subset(data, [1, 2, 3]), [0]))

    class Augmented(Dataset):  # any dataset of one's own may draw at random
        def __len__(self) -> int:
            return 8

        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.randn(2)

    assert not fixed_items(Augmented())


def test_a_teacher_on_fixed_items_is_told_to_compute_its_outputs_once() -> None:
    # given: the distillation loop's frozen teacher, 63% of the step, on the TensorDataset's batches as loaded
    record = RunRecord.from_json(json.loads((RECORDS / "distill_frozen_teacher.json").read_text()))
    found, checks = evaluate(record)
    # then: its share is the gain, and the fix names the line that calls it
    (advice,) = [r for r in found if r.id == "cache-frozen-outputs"]
    teacher = record.steps.frozen_models[0]
    assert advice.expected_gain == round(teacher.step_share, 3)  # type: ignore[arg-type]
    assert advice.fix.startswith("distill_frozen_teacher.py:49: compute Sequential's outputs for every item once, "
                                 "before the training loop (under torch.no_grad())")
    assert "its input is the DataLoader's batch as loaded, from a TensorDataset" in advice.why


@pytest.mark.parametrize("change", [
    {"fixed_items": False},  # a dataset of its own, or an augmented batch
    {"eval_mode": False},  # dropout in train mode: outputs drawn at random
    {"without_gradients": False},  # gradients flow through it
    {"step_share": None},  # a CUDA run: the host's time is not the step's
])
def test_outputs_that_may_differ_each_epoch_are_not_told_to_be_computed_once(change: dict[str, object]) -> None:
    record = RunRecord.from_json(json.loads((RECORDS / "distill_frozen_teacher.json").read_text()))
    steps = dataclasses.replace(record.steps, frozen_models=tuple(
        dataclasses.replace(f, **change) for f in record.steps.frozen_models))
    found, checks = evaluate(dataclasses.replace(record, steps=steps))
    assert checks["cache-frozen-outputs"].status == "clear"


def distil_from_loader(collate_fn: object = None, augment: bool = False) -> FrozenModel:
    """The teacher of a distillation loop over a DataLoader of a TensorDataset, as the steps collector records it."""
    torch.manual_seed(0)
    teacher, student = SlowTeacher().eval().requires_grad_(False), nn.Linear(8, 4)
    loader = DataLoader(TensorDataset(torch.randn(32, 8)), batch_size=4,
                        **({"collate_fn": collate_fn} if collate_fn is not None else {}))

    def loss_of(batch: list[torch.Tensor]) -> torch.Tensor:
        (x,) = batch
        with torch.no_grad():
            target = teacher(x + 0.1 * torch.randn_like(x) if augment else x)
        return nn.functional.mse_loss(student(x), target)

    capture = collected(loader, loss_of, torch.optim.SGD(student.parameters(), lr=0.1)).payload
    return capture.frozen_models[0][0]


def test_a_teacher_given_the_loaders_batch_of_fixed_items_is_recorded_so() -> None:
    teacher = distil_from_loader()
    assert teacher.fed_batch and teacher.fixed_items


def test_an_augmented_batch_or_a_collate_function_of_ones_own_is_no_batch_of_fixed_items() -> None:
    augmented = distil_from_loader(augment=True)
    assert not augmented.fed_batch and not augmented.fixed_items
    mixed = distil_from_loader(collate_fn=lambda items: default_collate(items))  # (mixup would go here)
    assert not mixed.fed_batch and not mixed.fixed_items


def frozen_layer_beside(layers: int) -> tuple:
    """The frozen models recorded where a standalone frozen nn.Linear runs beside a model of ``layers`` Linears."""
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(layers)])
    projection = nn.Linear(8, 8).requires_grad_(False)
    x = torch.randn(4, 8)

    def loss_of(_: int) -> torch.Tensor:
        with torch.no_grad():
            target = projection(x)
        return nn.functional.mse_loss(model(x), target)

    return collected(range(6), loss_of, torch.optim.SGD(model.parameters(), lr=0.01)).payload.frozen_models


def test_a_frozen_model_whose_class_fills_the_trained_model_is_not_timed() -> None:
    # timing it would put each of the model's ten Linears through the wrapper (half a microsecond a call)
    assert frozen_layer_beside(10) == ()
    # a few of them cost a few microseconds a step: timed
    ((projection, _, _),) = frozen_layer_beside(3)
    assert projection.module == "Linear" and projection.calls == 5
