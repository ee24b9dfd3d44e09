"""Training loops run one after another: a script that trains a teacher, then a student alone, then distils a new
student from the teacher (the PyTorch tutorial) steps three optimizers in turn, at 0.5 s, 35 ms and 0.3 s a step.
The figures are the loop's the profilers measured, the other loops' steps are left out and listed; an optimizer
built again over the same parameters continues its loop, and a GAN's two optimizers stepping in turn make one."""

from __future__ import annotations

import copy
import dataclasses
import json
import statistics
from pathlib import Path

import pytest
import torch

from gpuscope.diagnose.classify import classify
from gpuscope.diagnose.speed import complete_speed_of_light
from gpuscope.reduce.steady import summarize
from gpuscope.collect.captures import LoopStart, StepRecord
from gpuscope.collect.collectors.steps import StepsCollector
from gpuscope.record import CallSite, RunRecord, SpeedOfLight, TrainingLoop

RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "records"


@pytest.fixture(scope="module")
def record() -> RunRecord:
    """The distillation tutorial's run (tests/fixtures/records/README.md)."""
    return RunRecord.from_json(json.loads((RECORDS / "distill.json").read_text()))


def kept_steps(record: RunRecord) -> list[StepRecord]:
    """The run's steps as the steps collector kept them (all 78 are in the record's sample)."""
    sample = record.steps.sample
    phases = ("data_wait", "forward", "backward", "optimizer")
    return [StepRecord(index, wall, {p: sample.phases_s[p][n] for p in phases}, profiled=status == "profiled")
            for n, (index, wall, status) in enumerate(zip(sample.index, sample.wall_s, sample.status))]


def starts(record: RunRecord) -> list[LoopStart]:
    return [LoopStart(loop.first_step, loop.optimizer, loop.parameters, loop.created_at) for loop in record.steps.loops]


def test_the_figures_are_the_measured_loops_and_the_others_steps_are_left_out(record: RunRecord) -> None:
    # given: the three loops' steps; every profiler window fell in the teacher's (steps 0-15)
    steps = kept_steps(record)
    assert steps[1].profiled and not any(s.profiled for s in steps[16:])
    # when
    summary = summarize(steps, total=78, head=64, body_weight=1.0, source="optimizer", loops=starts(record)).steps
    # then: the median is a teacher step's; the students' 62 steps are counted apart, each step counted once
    teacher = [s.wall_s for s in steps[:16]]
    assert min(teacher) <= summary.median_s <= max(teacher)
    assert summary.median_s > 10 * statistics.median(s.wall_s for s in steps[17:47])  # not the mix: ~35 ms a step
    assert summary.other_loops == 62
    assert summary.warmup + summary.profiled + summary.outliers + summary.evaluated + summary.count == 16
    assert set(summary.sample.status[16:]) == {"other-loop"} and "other-loop" not in summary.sample.status[:16]
    assert [(loop.first_step, loop.steps, loop.measured) for loop in summary.loops] == [
        (0, 16, True), (16, 31, False), (47, 31, False)]
    student, distilled = summary.loops[1:]
    assert 0.02 < student.median_s < 0.05 and 0.2 < distilled.median_s < 0.4  # type: ignore[operator]


def test_the_verdict_names_the_loops_and_how_to_measure_the_longest_other(record: RunRecord) -> None:
    line = next(line for line in classify(record).evidence if "training loops" in line)
    assert line.startswith("the script ran 3 training loops one after another, each with its own optimizer and "
                           "parameters: the figures are the first loop's (steps 0-15: Adam over 1.19M parameters "
                           "built at kd.py:53, median step ")
    assert "steps 16-46: Adam over 268k parameters built at kd.py:53" in line
    assert "steps 47-77: Adam over 268k parameters built at kd.py:86" in line
    assert line.endswith(": --skip-steps 48")  # the distillation, the longest of the others


def test_flops_counted_in_another_loop_give_no_rate_against_the_measured_ones_time(record: RunRecord) -> None:
    # given: the FLOP count made on a distillation step while the figures are the teacher's
    sol = dataclasses.replace(record.speed_of_light, step=60, achieved_flops_per_s=None, mfu=None)
    assert isinstance(sol, SpeedOfLight)
    completed = complete_speed_of_light(dataclasses.replace(record, speed_of_light=sol))
    # then: no achieved rate, no MFU, and the note says why
    assert completed is not None and completed.achieved_flops_per_s is None and completed.mfu is None
    assert completed.note.endswith("the step whose FLOPs were counted (60) ran in the third training loop, not the one "
                                   "the figures describe")


def test_windows_moved_into_a_later_loop_measure_it_and_its_hand_over_step_is_warm_up() -> None:
    # given: --skip-steps 21 past a first loop of 20 steps of 100 ms; the second loop's first step (20) holds the
    # hand-over, then 40 steps of 10 ms, steps 22-25 profiled
    walls = [0.1] * 20 + [0.5] + [0.01] * 40
    steps = [StepRecord(i, walls[i], {"forward": walls[i] / 2}, profiled=22 <= i <= 25) for i in range(21, 61)]
    loops = [LoopStart(0, "SGD", 1000), LoopStart(20, "Adam", 200, CallSite("train.py", 40, "main", "opt = ...", 1))]
    # when
    summary = summarize(steps, total=61, head=64, body_weight=1.0, source="optimizer", skipped=21, loops=loops).steps
    # then: the second loop's figures; its first step left out (skipped, as asked), the first loop counted apart
    assert summary.median_s == pytest.approx(0.01)
    assert (summary.other_loops, summary.warmup, summary.skipped, summary.profiled, summary.count) == (20, 1, 1, 4, 36)
    first, second = summary.loops
    assert second.measured and (first.total_s, first.median_s) == (0.0, None)
    record = RunRecord(steps=summary)
    line = next(line for line in classify(record).evidence if "training loops" in line)
    assert "the figures are the second loop's (steps 20-60: Adam over 200 parameters built at train.py:40" in line
    assert "left out: steps 0-19: SGD over 1k parameters, skipped (not timed)" in line
    assert "--skip-steps" not in line  # no other loop was timed


def test_one_loop_has_no_loops_listed_and_nothing_left_out() -> None:
    steps = [StepRecord(i, 0.01, {"forward": 0.005}) for i in range(30)]
    summary = summarize(steps, total=30, head=64, body_weight=1.0, source="optimizer").steps
    assert (summary.loops, summary.other_loops, summary.count) == ((), 0, 29)
    assert not any("training loops" in line for line in classify(RunRecord(steps=summary)).evidence)


def train(optimizer: torch.optim.Optimizer, model: torch.nn.Module, steps: int) -> None:
    for _ in range(steps):
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_the_steps_collector_finds_where_an_optimizer_over_other_parameters_takes_over(tmp_path: Path) -> None:
    # given: a teacher trained 20 steps, then a student 5 steps, then the student's optimizer built again (a new
    # one each epoch, say) for 14 more
    collector = StepsCollector()
    collector.start(tmp_path)
    teacher, student = torch.nn.Linear(4, 8), torch.nn.Linear(4, 2)
    train(torch.optim.Adam(teacher.parameters()), teacher, 20)
    train(torch.optim.SGD(student.parameters(), lr=0.1), student, 5)
    train(torch.optim.SGD(student.parameters(), lr=0.01), student, 14)
    capture = collector.stop().payload
    # then: two loops, the second from step 20, which holds the student's first two updates (one optimizer ends
    # the steps until another steps twice: steps 0-19 each ended with a teacher update, step 20 with the student's
    # second); the optimizer built again continues the student's loop
    assert capture.count == 38
    here = "tests/unit/" + Path(__file__).name
    assert [(loop.first_step, loop.optimizer, loop.parameters, loop.created_at.file) for loop in capture.loops] == [
        (0, "Adam", 40, here), (20, "SGD", 10, here)]
    assert all(loop.created_at.function == "test_the_steps_collector_finds_where_an_optimizer_over_other_parameters"
               "_takes_over" for loop in capture.loops)


@pytest.mark.parametrize("kept", [False, True], ids=["old-one-freed", "old-one-kept"])
def test_an_optimizer_built_again_each_epoch_loses_no_step(tmp_path: Path, kept: bool) -> None:
    # given: the optimizer built again for each of 4 epochs of 6 steps, while the one before is alive (so the ids
    # differ); the script then frees the one before, or keeps it (in a list, say)
    collector = StepsCollector()
    collector.start(tmp_path)
    model = torch.nn.Linear(4, 2)
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.1)]
    for _ in range(4):
        train(optimizers[-1], model, 6)
        optimizers.append(torch.optim.SGD(model.parameters(), lr=0.1))
        if not kept:
            del optimizers[0]
    capture = collector.stop().payload
    # then: every update ends a step (the new optimizer's first one too), and the epochs are one loop
    assert capture.count == 24 and capture.loops == ()


def test_a_meta_learning_loops_inner_optimizer_per_task_makes_no_loop_of_each_task(tmp_path: Path) -> None:
    # given: first-order MAML: for each of 12 tasks, an inner SGD over a copy of the model stepped 5 times, the
    # copy's gradients handed to the model, and the meta-optimizer stepped every 4 tasks
    collector = StepsCollector()
    collector.start(tmp_path)
    model = torch.nn.Linear(4, 1)
    meta = torch.optim.Adam(model.parameters())
    for task in range(12):
        learner = copy.deepcopy(model)
        train(torch.optim.SGD(learner.parameters(), lr=0.01), learner, 5)
        learner(torch.randn(8, 4)).sum().backward()
        for p, q in zip(model.parameters(), learner.parameters()):
            p.grad = q.grad if p.grad is None else p.grad + q.grad
        if task % 4 == 3:
            meta.step()
            meta.zero_grad()
    capture = collector.stop().payload
    # then: the steps are the inner updates, all of one loop
    assert capture.count >= 40 and capture.loops == ()


def test_a_gans_two_optimizers_stepping_in_turn_make_one_loop(tmp_path: Path) -> None:
    collector = StepsCollector()
    collector.start(tmp_path)
    generator, discriminator = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    g_opt, d_opt = torch.optim.Adam(generator.parameters()), torch.optim.Adam(discriminator.parameters())
    for _ in range(6):
        discriminator(generator(torch.randn(8, 4)).detach()).mean().backward()
        d_opt.step()
        d_opt.zero_grad()
        discriminator(generator(torch.randn(8, 4))).mean().backward()
        g_opt.step()
        g_opt.zero_grad()
    capture = collector.stop().payload
    assert capture.count == 6 and capture.loops == ()


def test_a_gans_steps_end_at_its_generators_update_the_last_before_each_batch(tmp_path: Path) -> None:
    # given: pytorch/examples' dcgan loop: a batch, the discriminator's update, then the generator's
    collector = StepsCollector()
    collector.start(tmp_path)
    generator, discriminator = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    g_opt, d_opt = torch.optim.Adam(generator.parameters()), torch.optim.Adam(discriminator.parameters())
    for i, real in enumerate(torch.utils.data.DataLoader(torch.randn(48, 4), batch_size=8)):
        if i == 4:
            collector.window_opened()  # a profiler's window on the last two
        fake = generator(torch.randn(8, 4))
        (discriminator(real).mean() - discriminator(fake.detach()).mean()).backward()
        d_opt.step()
        d_opt.zero_grad()
        discriminator(fake).mean().backward()
        g_opt.step()
        g_opt.zero_grad()
    collector.window_closed()
    capture = collector.stop().payload
    # then: one loop of 6 steps, ended by the generator's updates (its optimizer is the one the post-run probe times)
    assert capture.count == 6 and capture.loops == ()
    assert collector.probed_optimizer is g_opt


def test_the_record_keeps_the_loops(record: RunRecord) -> None:
    loops = RunRecord.from_json(record.to_json()).steps.loops
    assert loops == record.steps.loops and all(isinstance(loop, TrainingLoop) for loop in loops)


def test_the_optimizer_probed_after_the_run_is_the_one_ending_the_steps_the_windows_measured(tmp_path: Path) -> None:
    # given: a teacher's loop, then a student's, a profiler window opened in the student's
    collector = StepsCollector()
    collector.start(tmp_path)
    teacher, student = torch.nn.Linear(4, 8), torch.nn.Linear(4, 2)
    teacher_opt, student_opt = torch.optim.Adam(teacher.parameters()), torch.optim.SGD(student.parameters(), lr=0.1)
    train(teacher_opt, teacher, 4)
    train(student_opt, student, 3)
    collector.window_opened()
    train(student_opt, student, 2)
    collector.window_closed()
    collector.stop()
    # then: the student's optimizer is the one the post-run probe times (it was the teacher's: the first)
    assert collector.probed_optimizer is student_opt
