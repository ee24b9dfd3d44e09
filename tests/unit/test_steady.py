"""Steady-state figures: warm-up and outliers left out, the breakdown adding up to 1, bounded sampling."""

from __future__ import annotations

import pytest

from gpuscope.collect.captures import StepCapture
from gpuscope.collect.steps.steplog import StepLog, StepRecord
from gpuscope.reduce.steady import summarize, summarize_capture


def records(walls: list[float], data_share: float = 0.0) -> list[StepRecord]:
    return [StepRecord(i, w, {"data_wait": w * data_share, "forward": 0.0, "backward": 0.0, "optimizer": 0.0})
            for i, w in enumerate(walls)]


def summary_of(walls: list[float], data_share: float = 0.0):
    return summarize(records(walls, data_share), total=len(walls), head=64, body_weight=1.0, source="optimizer")


@pytest.mark.parametrize(
    ("walls", "warmup", "outliers", "median"),
    [
        # the first step is always warm-up
        ([1.0] * 10, 1, 0, 1.0),
        # compilation and autotuning make the first few steps slow
        ([30.0, 8.0, 3.0, 1.0, 1.1, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 3, 0, 1.0),
        # a checkpoint save in the middle is an outlier
        ([5.0] + [1.0] * 18 + [20.0] + [1.0] * 20, 1, 1, 1.0),
        # loader stalls on every fourth step are the loop's pattern, not outliers
        ([5.0] + [1.0, 1.0, 1.0, 6.0] * 10, 1, 0, 1.0),
        # with two steps there is nothing to leave out
        ([3.0, 1.0], 0, 0, 2.0),
    ],
)
def test_warmup_and_outliers_are_left_out_of_the_steady_state(walls, warmup, outliers, median) -> None:
    steps = summary_of(walls).steps
    assert (steps.warmup, steps.outliers) == (warmup, outliers)
    assert steps.count == len(walls) - warmup - outliers
    assert steps.median_s == pytest.approx(median)
    assert steps.total == len(walls)


def test_profiled_steps_are_left_out_and_counted() -> None:
    recs = records([5.0] + [1.0] * 4 + [3.0] * 3 + [1.0] * 12)
    for r in recs[5:8]:
        r.profiled = True  # cProfile made them slower
    steps = summarize(recs, total=20, head=64, body_weight=1.0, source="optimizer").steps
    assert (steps.warmup, steps.profiled, steps.outliers, steps.count) == (1, 3, 0, 16)
    assert steps.max_s == 1.0
    assert steps.sample.status[5:8] == ("profiled",) * 3


def test_a_profiler_window_right_after_the_first_step_is_profiled_not_warm_up() -> None:
    # given: cProfile on steps 1-4, each made three times slower (a loader's Python under the profiler), as
    # slow as a warm-up would be
    recs = records([5.0] + [3.0] * 4 + [1.0] * 19)
    for r in recs[1:5]:
        r.profiled = True
    steps = summarize(recs, total=24, head=64, body_weight=1.0, source="optimizer").steps
    # then: the first step is the warm-up, the window's steps are profiled, and the figures are the same either way
    assert (steps.warmup, steps.profiled, steps.count) == (1, 4, 19)
    assert steps.sample.status[:6] == ("warmup",) + ("profiled",) * 4 + ("steady",)
    assert steps.median_s == 1.0


def test_warmup_never_swallows_more_than_a_quarter_of_the_run() -> None:
    walls = [10.0 - i * 0.5 for i in range(16)] + [1.0] * 4  # a run that keeps speeding up
    steps = summary_of(walls).steps
    assert steps.warmup <= 5


def test_the_breakdown_adds_up_to_one() -> None:
    summary = summary_of([1.0] * 10, data_share=0.6)
    shares = summary.breakdown.as_dict()
    assert shares["data_wait"] == pytest.approx(0.6)
    assert shares["other"] == pytest.approx(0.4)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert summary.steps.breakdown_basis == "host"


def test_a_run_with_no_steps_has_an_empty_summary() -> None:
    summary = summarize([], total=0, head=64, body_weight=1.0, source="none")
    assert summary.steps.count == 0
    assert summary.breakdown.as_dict() == dict.fromkeys(summary.breakdown.as_dict(), 0.0)


def test_device_times_give_the_breakdown_when_most_steps_have_them() -> None:
    # given host timers that saw 50% data wait, while the device stayed busy (the wait was hidden)
    recs = records([1.0] * 10, data_share=0.5)
    for r in recs:
        r.device_phases_s = {"data_wait": 0.05, "forward": 0.45, "backward": 0.5}
        r.device_wall_s = 1.0
    summary = summarize(recs, total=10, head=64, body_weight=1.0, source="optimizer")
    # then the breakdown is the device's, and the host's is kept beside it
    assert summary.steps.breakdown_basis == "device"
    assert summary.breakdown.data_wait == pytest.approx(0.05)
    assert summary.host_breakdown is not None and summary.host_breakdown.data_wait == pytest.approx(0.5)
    assert summary.steps.device_median_s == pytest.approx(1.0)


def test_a_long_periodic_run_is_summarised_from_a_fair_sample_with_counts_of_the_whole_run() -> None:
    # given a long run whose steps alternate fast and slow (gradient accumulation over two batches, say)
    log = StepLog(head=16, capacity=256)
    log.add(50.0, {})  # warm-up
    for i in range(1, 100_000):
        log.add(2.0 if i % 2 else 1.0, {"data_wait": 0.5})
    summary = summarize(log.records(), log.count, log.head_size, log.body_weight, "optimizer")
    steps = summary.steps
    assert steps.sampled
    assert steps.total == 100_000
    assert steps.warmup == 1
    assert steps.count == pytest.approx(99_999, rel=0.01)
    assert steps.mean_s == pytest.approx(1.5, rel=0.05)  # both phases of the period are in the sample
    assert len(steps.sample.index) <= 2000


def test_the_forward_passes_per_backward_come_with_the_steps_where_a_backward_was_seen() -> None:
    records = tuple(StepRecord(index=i, wall_s=0.03, phases_s={}) for i in range(8))
    capture = StepCapture(records=records, count=8, head=64, body_weight=1.0, source="optimizer", loaders=(),
                          device="cpu", passes=(420, 7))
    assert summarize_capture(capture).steps.forwards_per_backward == 60
    # a loop with no backward (inference, or a hand-written update): none
    no_backward = StepCapture(records=records, count=8, head=64, body_weight=1.0, source="explicit", loaders=(),
                              device="cpu", passes=(8, 0))
    assert summarize_capture(no_backward).steps.forwards_per_backward is None


def test_an_optimizer_closure_called_many_times_a_step_is_counted_per_step_and_the_steps_stay_the_optimizers() -> None:
    # given 5 LBFGS steps that called their closure 20, 20, 18, 12 and 10 times (its line search ends early)
    records = tuple(StepRecord(index=i, wall_s=17.0, phases_s={"forward": 6.0, "backward": 10.0}) for i in range(5))
    capture = StepCapture(records=records, count=5, head=64, body_weight=1.0, source="optimizer", loaders=(),
                          device="cpu", passes=(80, 80), closure_calls=80)
    # then the run keeps its 5 steps, each with 16 forward and backward passes on average
    steps = summarize_capture(capture).steps
    assert steps.total == 5 and steps.closure_calls_per_step == 16.0 and steps.forwards_per_backward == 1.0
    # and a loop that passes no closure has no such figure
    plain = StepCapture(records=records, count=5, head=64, body_weight=1.0, source="optimizer", loaders=(),
                        device="cpu", passes=(5, 5))
    assert summarize_capture(plain).steps.closure_calls_per_step is None
