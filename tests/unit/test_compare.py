"""Comparing two runs (A = before, B = after) on hand-built records: the speed-up and its bootstrap interval, the
breakdown's shifts, the verdict change, what became of A's recommendations, and the warnings for unlike runs."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from conftest import make_record
from gpuscope.diagnose.compare import MAX_STEPS, compare, steady_times
from gpuscope.report.compare_text import gate_text, speedup_text, summary_lines
from gpuscope.record import (
    Breakdown,
    HostMemory,
    Calibration,
    Loader,
    OpProfile,
    OpStat,
    Practices,
    Recommendation,
    RuleCheck,
    RunMeta,
    StepSample,
    Steps,
    Verdict,
)


def jittered(median_s: float, n: int = 61) -> tuple[float, ...]:
    """``n`` (odd) step times spread evenly over ``median_s`` +-15%, in a shuffled order; their median is ``median_s``."""
    return tuple(median_s * (1 + 0.3 * ((i * 37) % n / (n - 1) - 0.5)) for i in range(n))


def run(median_s: float = 0.1, times: tuple[float, ...] | None = None, status: tuple[str, ...] | None = None,
        **overrides):
    """A record whose step sample holds ``times`` (default: jittered around ``median_s``), all steady."""
    times = jittered(median_s) if times is None else times
    status = ("steady",) * len(times) if status is None else status
    sample = StepSample(index=tuple(range(len(times))), wall_s=times, status=status)
    steps = Steps(count=status.count("steady"), median_s=median_s, total=len(times), source="optimizer",
                  sample=sample)
    return make_record(steps=steps, **overrides)


RECOMMENDATIONS = {
    "more-dataloader-workers": Recommendation(id="more-dataloader-workers", title="Give the DataLoader more workers",
                                              expected_gain=0.5),
    "larger-batch": Recommendation(id="larger-batch", title="Raise the batch size", expected_gain=0.2),
    "pin-memory": Recommendation(id="pin-memory", title="Pin the DataLoader's memory"),
    "zero-grad-set-to-none": Recommendation(id="zero-grad-set-to-none", title="Drop gradients"),
    "mixed-precision": Recommendation(id="mixed-precision", title="Train in mixed precision"),
}


# --- the speed-up and its interval ---------------------------------------------------------------------------------

def test_the_speedup_of_like_runs_has_an_interval_that_holds_one() -> None:
    # given two runs whose step times overlap, B a little faster
    a, b = run(0.100), run(0.098)
    # when they are compared
    s = compare(a, b).speedup
    # then the speed-up is the ratio of the means (the jitter's, its median), inside its interval
    assert s.ratio == pytest.approx(0.100 / 0.098)
    assert s.low is not None and s.high is not None
    assert s.low <= s.ratio <= s.high
    assert s.low < 1 < s.high
    assert s.reading() == "no clear difference"
    assert (s.steps_a, s.steps_b) == (61, 61)


def test_a_clearly_faster_b_has_its_whole_interval_above_one() -> None:
    s = compare(run(0.100), run(0.050)).speedup
    assert s.ratio == pytest.approx(2.0)
    assert 1 < s.low <= 2.0 <= s.high
    assert s.reading() == "B is faster"
    assert speedup_text(s).startswith("speed-up 2.00x (95% interval ")


def test_a_clearly_slower_b_has_its_whole_interval_below_one() -> None:
    s = compare(run(0.100), run(0.130)).speedup
    assert s.high < 1
    assert s.reading() == "B is slower"
    assert s.slower_pct == pytest.approx(30.0)


def test_the_interval_is_the_same_every_time() -> None:
    a, b = run(0.1, times=tuple(0.1 + 0.01 * ((i * 37) % 11) for i in range(50))), run(0.08)
    assert compare(a, b).speedup == compare(a, b).speedup


def test_only_steady_steps_are_resampled() -> None:
    # given warm-up and outlier steps ten times longer than the steady ones
    times = (1.0, 1.0) + jittered(0.1, 21) + (1.0,)
    status = ("warmup", "warmup") + ("steady",) * 21 + ("outlier",)
    a = run(0.1, times=times, status=status)
    # then neither the interval nor the distribution sees them
    assert steady_times(a) == list(jittered(0.1, 21))
    assert compare(a, run(0.05)).speedup.high < 2.5


def test_long_runs_are_resampled_on_an_even_subsample() -> None:
    # given a run whose sample keeps 100k steady steps
    a = run(0.1, times=jittered(0.1, 100_001))
    # then the bootstrap uses an even subsample of them, and still finds a clear speed-up
    assert len(steady_times(a)) == MAX_STEPS
    s = compare(a, run(0.05)).speedup
    assert s.steps_a == MAX_STEPS
    assert s.low > 1


def test_without_a_step_sample_there_is_no_interval_and_the_summary_says_so() -> None:
    # given runs that kept no per-step sample (make_record's steps have none)
    a, b = make_record(), make_record(steps=Steps(count=40, median_s=0.05, total=42))
    # when compared
    comparison = compare(a, b)
    s = comparison.speedup
    # then the point estimate stands alone, and the reason is given
    assert s.ratio == pytest.approx(2.0)
    assert s.low is None and s.high is None
    assert "no interval: too few steady steps in the step sample (A has 0, B has 0" in s.note
    assert s.reading() == "B is faster (point estimate only)"
    assert "no interval" in summary_lines(comparison)[0]


def test_a_run_without_a_steady_step_has_no_speedup_figure() -> None:
    comparison = compare(run(0.1), make_record(steps=Steps(count=0, total=3)))
    s = comparison.speedup
    assert s.ratio is None and s.slower_pct is None
    assert s.note == "no steady-state step in B: no speed-up figure"
    assert summary_lines(comparison)[0] == "gpuscope compare: no steady-state step in B: no speed-up figure"
    with pytest.raises(ValueError, match="no steady-state step in B"):
        gate_text(s, 10)


def batched(*means: float, each: int = 2) -> tuple[float, ...]:
    """Steps in the order they ran, ``each`` of every mean in turn: ten means make the ten batches the interval
    reads, each batch's mean its own value."""
    return tuple(m for m in means for _ in range(each))


STEADY = batched(*[0.098, 0.102] * 5)
"""20 steps, mean 100 ms; batch means 98 and 102 ms: their standard deviation is 2 ms x sqrt(10/9), the mean's
standard error a tenth of the root of that, 0.667 ms: 0.667% of the mean."""
SWINGING = batched(*[0.09, 0.11] * 5)
"""20 steps, mean 100 ms, batch means 90 and 110 ms: a standard error of 3.33%."""


def test_the_speedup_is_the_runs_throughput_their_mean_steps_ratio() -> None:
    # given a run whose steps alternate 5 and 44 ms (a loader's batches arriving in pairs): median 44 ms, mean 24.5
    a = run(0.044, times=(0.005, 0.044) * 20)
    # when set against a run of steady 20 ms steps
    s = compare(a, run(0.020, times=(0.020,) * 40)).speedup
    # then the speed-up is the throughput's, 24.5 / 20, not the medians' 2.2x
    assert s.mean_a_s == pytest.approx(0.0245) and s.ratio == pytest.approx(1.225)
    assert s.slower_pct == pytest.approx((1 / 1.225 - 1) * 100)


def test_the_interval_holds_each_runs_batches_and_the_spread_between_processes() -> None:
    # given A at 100 ms and B at 110 ms a step, each with batch means 2% apart
    a = run(0.100, times=STEADY)
    b = run(0.110, times=tuple(t * 1.1 for t in STEADY))
    # when compared on a machine where one run's mean step strays 1.2% from the next's
    s = compare(a, b, run_spread=0.012).speedup
    # then the ratio's spread combines their standard errors (0.667% each) with one run's from the next (1.2%
    # each): sqrt(2 x 0.00667^2 + 2 x 0.012^2) = 1.941%; t on 18 degrees of freedom, 2.101, reaches 4.08%
    assert s.spread == pytest.approx(0.019414, rel=1e-3)
    assert 1 / s.high == pytest.approx(1.1 * math.exp(-2.101 * 0.019414), rel=1e-4)  # B 5.60% slower at best
    assert 1 / s.low == pytest.approx(1.1 * math.exp(2.101 * 0.019414), rel=1e-4)  # 14.58% slower at worst


@pytest.mark.parametrize(("pct", "decision"), [(5, "failed"), (15, "passed"), (10, "cannot tell"), (12, "cannot tell")])
def test_the_gate_decides_on_the_interval(pct: float, decision: str) -> None:
    # given B 10% slower than A, the interval 5.60% to 14.58% slower (the test above)
    s = compare(run(0.100, times=STEADY), run(0.110, times=tuple(t * 1.1 for t in STEADY)), run_spread=0.012).speedup
    # when gated at pct
    found, line = gate_text(s, pct)
    # then it fails only beyond the interval's slow end, passes only past its fast end, and else cannot tell
    assert found.decision == decision
    assert line.startswith({"failed": "gate FAILED", "passed": "gate passed", "cannot tell": "gate cannot tell"}[decision])
    assert "B's mean step is 10.0% slower than A's (95% interval 5.6% slower to 14.6% slower" in line
    if decision == "cannot tell":  # within one process's spread of the next: more steps would not tell
        assert found.steps_needed is None and "more steps would not tell" in line


def test_where_more_steps_would_tell_the_gate_says_how_many() -> None:
    # given B 10% slower than A, both swinging: standard errors of 3.33%, the spread sqrt(2 x 0.0333^2 + 2 x 0.012^2)
    # = 5.010%, the interval 1.0% faster to 22.2% slower
    s = compare(run(0.100, times=SWINGING), run(0.110, times=tuple(t * 1.1 for t in SWINGING)),
                run_spread=0.012).speedup
    # when gated at 0%
    found, line = gate_text(s, 0)
    # then it cannot tell, and the steps that would: the runs' own spread (0.0025102 - 0.000288 = 0.0022222) must
    # shrink to (ln 1.1 / 2.101)^2 - 0.000288 = 0.0017699: 20 x 0.0022222 / 0.0017699 = 25.1, 26 steps a run
    assert found.decision == "cannot tell"
    assert found.steps_needed == 26
    assert "about 26 steady steps a run would tell (A has 20, B 20)" in line


def test_identical_runs_pass_and_a_run_far_slower_fails() -> None:
    a = run(0.1)
    assert gate_text(compare(a, run(0.1), run_spread=0.012).speedup, 5)[0].decision == "passed"
    assert gate_text(compare(a, run(0.13)).speedup, 10)[0].decision == "failed"
    assert gate_text(compare(a, run(0.05)).speedup, 0)[0].decision == "passed"


def test_by_default_the_interval_holds_the_spread_between_runs_measured_on_a_shared_machine() -> None:
    # given identical runs on a machine where runs stray 4.5% from each other (the default): sqrt(2) x 4.5% = 6.4%
    s = compare(run(0.1), run(0.1)).speedup
    # then a 5% gate cannot tell them apart from a 5% regression, and says that more steps would not help
    assert s.run_spread == 0.045
    found, line = gate_text(s, 5)
    assert found.decision == "cannot tell" and found.steps_needed is None
    assert "(4.5%, --run-spread); repeat both runs" in line


def test_a_busy_machine_is_said_beside_the_speedup() -> None:
    # given B's process waited for a core 5 s of the 15 s it was ready to run (a busy process beside it)
    busy = run(0.1, host_memory=HostMemory(own_cpu_s=10.0, own_runnable_s=5.0))
    # when compared
    comparison = compare(run(0.1), busy)
    # then the comparison says so, right under the speed-up
    assert comparison.busy == ("B's machine was busy: its threads waited for a core 33% of the time they were ready "
                               "to run (5.0 s): its steps hold that wait, and the comparison with it",)
    assert summary_lines(comparison)[1].startswith("  note: B's machine was busy")
    # and a wait of 2% of the time is no note
    assert compare(run(0.1), run(0.1, host_memory=HostMemory(own_cpu_s=49.0, own_runnable_s=1.0))).busy == ()


def test_without_an_interval_the_gate_cannot_tell() -> None:
    found, line = gate_text(compare(make_record(), make_record(steps=Steps(count=40, median_s=0.2, total=42))).speedup,
                            10)
    assert found.decision == "cannot tell" and found.steps_needed == 5
    assert "at least 5 steady steps a run are needed for an interval" in line


# --- breakdown and verdict -----------------------------------------------------------------------------------------

def test_breakdown_shifts_give_each_phases_share_and_ms_per_step() -> None:
    a = run(0.200, breakdown=Breakdown(data_wait=0.6, forward=0.1, backward=0.2, optimizer=0.05, other=0.05))
    b = run(0.100, breakdown=Breakdown(data_wait=0.05, forward=0.3, backward=0.45, optimizer=0.1, other=0.1))
    shifts = {p.phase: p for p in compare(a, b).phases}
    assert list(shifts) == ["data_wait", "forward", "backward", "optimizer", "other"]
    wait = shifts["data_wait"]
    assert (wait.share_a, wait.share_b) == (0.6, 0.05)
    assert wait.seconds_a == pytest.approx(0.120) and wait.seconds_b == pytest.approx(0.005)
    assert shifts["backward"].seconds_a == pytest.approx(0.040) and shifts["backward"].seconds_b == pytest.approx(0.045)
    assert "data wait 120.0 -> 5.0" in "\n".join(summary_lines(compare(a, b)))


def test_the_verdict_change_is_said_as_people_say_it() -> None:
    a = run(verdict=Verdict(bound="data-loading", confidence=0.9), device="cuda")
    b = run(verdict=Verdict(bound="compute", confidence=0.7), device="cuda")
    v = compare(a, b).verdict
    assert (v.label_a, v.confidence_a, v.label_b, v.confidence_b) == ("data-loading-bound", 0.9, "GPU-compute-bound", 0.7)
    assert v.changed
    assert ("  verdict: data-loading-bound (confidence 0.90) -> GPU-compute-bound (confidence 0.70)"
            in summary_lines(compare(a, b)))
    assert not compare(a, a).verdict.changed


# --- per sample --------------------------------------------------------------------------------------------------

def loading(batch_size: int, batches_per_step: int, median_s: float):
    """A run of 150 optimizer steps over batches of ``batch_size``, ``batches_per_step`` of them a step."""
    loader = Loader(dataset="TensorDataset", batch_size=batch_size, batches=150 * batches_per_step, wait_s=1.0)
    return run(median_s, times=jittered(median_s, 151), loaders=(loader,))


def test_a_larger_batch_is_compared_per_sample() -> None:
    lines = summary_lines(compare(loading(32, 1, 0.0062), loading(64, 1, 0.0064)))
    assert "  per sample (batch 32 -> batch 64): A 0.194 ms -> B 0.1 ms: 1.94x the throughput" in lines


def test_a_larger_batch_whose_step_got_longer_and_its_samples_faster_is_resolved() -> None:
    # batch 32 -> 64: each step 1.6x longer, each sample 1.25x faster
    a = loading(32, 1, 0.010)
    a = dataclasses.replace(a, recommendations=(RECOMMENDATIONS["larger-batch"],))
    b = dataclasses.replace(loading(64, 1, 0.016), checks={"larger-batch": RuleCheck("clear")})
    (outcome,) = compare(a, b).outcomes
    assert outcome.status == "resolved"
    # while one whose samples got slower is not: batch 32 -> 64, each step 2.5x longer
    b = dataclasses.replace(loading(64, 1, 0.025), checks={"larger-batch": RuleCheck("clear")})
    (outcome,) = compare(a, b).outcomes
    assert outcome.line().startswith("larger-batch: symptom gone, step slower (B's time per sample 25% longer than "
                                     "A's, 0.80x)")


def test_per_sample_counts_every_batch_a_step_accumulates() -> None:
    # given: 8 batches of 8 accumulated for each optimizer step (8.0 ms), against 8 batches of 16 (10.0 ms)
    lines = summary_lines(compare(loading(8, 8, 0.008), loading(16, 8, 0.010)))
    # then a sample is a 64th of A's step and a 128th of B's
    assert "  per sample (batch 8, 8 a step -> batch 16, 8 a step): A 0.125 ms -> B 0.0781 ms: 1.60x the throughput" \
        in lines


def test_one_batch_of_64_against_8_accumulated_batches_of_8_is_the_same_samples_a_step() -> None:
    # the step's speed-up is the throughput's: no per-sample line (it once read "A 1.0 ms -> B 0.0 ms: 25.73x",
    # each step's time over one batch of 8, where the throughput had risen 3.2x)
    comparison = compare(loading(8, 8, 0.008), loading(64, 1, 0.0025))
    assert comparison.per_sample is None
    assert comparison.speedup.ratio == pytest.approx(3.2, rel=0.05)


# --- A's recommendations in B --------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("rec_id", "check_b", "line"),
    [
        ("more-dataloader-workers", RuleCheck("clear"), "more-dataloader-workers: resolved, data wait 64% -> 3%"),
        ("more-dataloader-workers", RuleCheck("fired"), "more-dataloader-workers: still there, data wait 64% -> 3%"),
        ("pin-memory", RuleCheck("not-checked", "a CPU-only run: this is about GPU work"),
         "pin-memory: not checked in B (a CPU-only run: this is about GPU work), data wait 64% -> 3%"),
        ("zero-grad-set-to-none", None, "zero-grad-set-to-none: unknown, median step 100.0 ms -> 50.0 ms"),
    ],
)
def test_each_recommendation_of_a_says_what_became_of_it_with_a_measured_figure(rec_id, check_b, line) -> None:
    # given A with the recommendation, and B whose rule check is check_b (None: B lacks the check)
    a = run(0.100, breakdown=Breakdown(data_wait=0.64, forward=0.36), recommendations=(RECOMMENDATIONS[rec_id],),
            checks={rec_id: RuleCheck("fired")})
    b = run(0.050, breakdown=Breakdown(data_wait=0.03, forward=0.97),
            checks={} if check_b is None else {rec_id: check_b},
            recommendations=(RECOMMENDATIONS[rec_id],) if check_b == RuleCheck("fired") else ())
    # when compared
    comparison = compare(a, b)
    # then its outcome line carries the status and the figure
    (outcome,) = comparison.outcomes
    assert outcome.line() == line
    assert f"    {line}" in summary_lines(comparison)


def test_a_symptom_gone_with_a_slower_step_is_not_called_resolved() -> None:
    # given A waiting for data 82% of its 100 ms step, and B with the workers it was told to add: its data wait
    # down to 24% (the rule clear) but its step 0.60x as fast (the workers took the cores the step computes on)
    a = run(0.100, breakdown=Breakdown(data_wait=0.82, forward=0.18),
            recommendations=(RECOMMENDATIONS["more-dataloader-workers"],))
    b = run(0.167, breakdown=Breakdown(data_wait=0.24, forward=0.76),
            checks={"more-dataloader-workers": RuleCheck("clear")})
    # when compared
    comparison = compare(a, b)
    # then the outcome says the symptom went and by how much the step got slower
    (outcome,) = comparison.outcomes
    assert outcome.status == "symptom gone, step slower"
    assert outcome.line() == ("more-dataloader-workers: symptom gone, step slower (B's mean step 67% longer than "
                              "A's, 0.60x), data wait 82% -> 24%")


def test_a_symptom_gone_with_a_step_as_fast_within_noise_is_resolved() -> None:
    # B's step 2% longer, its interval holding 1: no evidence of a slower step
    a = run(0.100, recommendations=(RECOMMENDATIONS["more-dataloader-workers"],))
    b = run(0.102, checks={"more-dataloader-workers": RuleCheck("clear")})
    (outcome,) = compare(a, b).outcomes
    assert outcome.status == "resolved"


def test_recommendations_new_in_b_are_listed_after_as() -> None:
    a = run(0.1, recommendations=(RECOMMENDATIONS["more-dataloader-workers"],))
    b = run(0.05, recommendations=(RECOMMENDATIONS["larger-batch"],),
            checks={"more-dataloader-workers": RuleCheck("clear"), "larger-batch": RuleCheck("fired")})
    comparison = compare(a, b)
    assert [(o.id, o.status) for o in comparison.outcomes] == [("more-dataloader-workers", "resolved"),
                                                               ("larger-batch", "new in B")]
    lines = summary_lines(comparison)
    assert lines.index("  new in B:") == lines.index("    larger-batch: new in B, median step 100.0 ms -> 50.0 ms") - 1


def test_a_launch_recommendation_shows_the_per_op_fixed_cost_and_the_step() -> None:
    # given CPU runs whose op profile and calibration give the per-op fixed cost: 1000 ops x 50 us of 100 ms, then
    # 250 ops of 50 ms (a larger batch, fewer steps per sample)
    def launch_run(median_s: float, ops_per_step: float, **overrides):
        return run(median_s, device="cpu", op_profile=OpProfile(steps=3, ops=int(3 * ops_per_step),
                                                                ops_per_step=ops_per_step),
                   calibration=Calibration(op_overhead_s=50e-6), **overrides)

    a = launch_run(0.100, 1000, recommendations=(RECOMMENDATIONS["larger-batch"],))
    b = launch_run(0.050, 250, checks={"larger-batch": RuleCheck("clear")})
    (outcome,) = compare(a, b).outcomes
    assert outcome.line() == "larger-batch: resolved, per-op fixed cost 50% -> 25%, median step 100.0 ms -> 50.0 ms"


def test_a_habit_recommendation_shows_its_own_count_and_the_step() -> None:
    a = run(0.1, recommendations=(RECOMMENDATIONS["zero-grad-set-to-none"],),
            practices=Practices(zero_grad_calls=40, zero_grad_fill_calls=40))
    b = run(0.09, checks={"zero-grad-set-to-none": RuleCheck("clear")},
            practices=Practices(zero_grad_calls=40, zero_grad_fill_calls=0))
    (outcome,) = compare(a, b).outcomes
    assert outcome.line() == ("zero-grad-set-to-none: resolved, zero_grad calls that zero-fill 100% -> 0%, "
                              "median step 100.0 ms -> 90.0 ms")


def test_a_figure_zero_in_both_runs_is_left_out() -> None:
    # given: a bf16 student's convolutions on the reference kernels, fixed; its rule also declares the matmuls' share,
    # which this model (no matmul ops) has at 0% in both runs
    def profiled(slow_s: float) -> OpProfile:
        return OpProfile(steps=3, ops=100, ops_per_step=33, mean_op_s=0.01, top_host=(
            OpStat("aten::_slow_conv2d_forward", 6, slow_s), OpStat("aten::max_pool2d_with_indices", 6, 0.1)))

    fired = Recommendation(id="cpu-fp32-over-low-precision", title="Train in float32 on this CPU")
    a = run(0.18, recommendations=(fired,), op_profile=profiled(0.6))
    b = run(0.11, checks={"cpu-fp32-over-low-precision": RuleCheck("clear")}, op_profile=profiled(0.0))
    (outcome,) = compare(a, b).outcomes
    assert outcome.line() == ("cpu-fp32-over-low-precision: resolved, op time on reference convolution kernels "
                              "60% -> 0%, median step 180.0 ms -> 110.0 ms")


def test_a_figure_missing_from_either_run_falls_back_to_the_step_time() -> None:
    # given a GPU rule whose kernel timeline neither run has
    a = run(0.1, recommendations=(RECOMMENDATIONS["mixed-precision"],))
    (outcome,) = compare(a, run(0.08)).outcomes
    assert outcome.changes[0].text() == "median step 100.0 ms -> 80.0 ms"


def test_every_rule_declares_the_figures_that_show_it_resolved() -> None:
    from gpuscope.diagnose.evidence import Metric
    from gpuscope.diagnose.rules import RULES

    assert RULES
    for r in RULES:
        assert r.resolved_by and all(isinstance(m, Metric) for m in r.resolved_by), r.id


def test_a_recommendation_no_rule_knows_shows_the_step_time() -> None:
    # given a recommendation from another gpuscope version, with an id no rule here has
    retired = Recommendation(id="retired-advice", title="Old advice", why="it was so", fix="do it")
    a = run(0.1, recommendations=(retired,))
    # when compared
    (outcome,) = compare(a, run(0.05)).outcomes
    # then its outcome is unknown and shows the median step
    assert outcome.line() == "retired-advice: unknown, median step 100.0 ms -> 50.0 ms"


def test_a_rule_without_a_resolving_figure_cannot_register() -> None:
    from gpuscope.diagnose.rules.base import Refused, rule

    with pytest.raises(ValueError, match="declares no figure"):
        rule(id="unmeasured", title="t", fix="f", resolved_by=(), trial=Refused("r"))(lambda run: None)


# --- unlike runs ---------------------------------------------------------------------------------------------------

def test_like_runs_raise_no_warning() -> None:
    a = run(command=("/home/me/train.py", "--workers", "0"), meta=RunMeta(torch="2.3.0", cpu_count=8))
    b = run(command=("train.py", "--workers", "4"), meta=RunMeta(torch="2.3.0", cpu_count=8))
    assert compare(a, b).flags == ()


@pytest.mark.parametrize(
    ("b_overrides", "flag"),
    [
        ({"command": ("eval.py",)}, "different scripts (A: train.py, B: eval.py)"),
        ({"command": ("-m", "pkg.train")}, "different scripts (A: train.py, B: -m pkg.train)"),
        ({"device": "cuda"}, "different devices (A: cpu, B: cuda)"),
        ({"meta": RunMeta(torch="2.4.0", cpu_count=8)}, "different torch versions (A: 2.3.0, B: 2.4.0)"),
        ({"meta": RunMeta(torch="2.3.0", cpu_count=2)}, "different CPU counts (A: 8, B: 2)"),
        # a data wait share that fell because the ops got slower on more threads is no fix of the loading
        ({"meta": RunMeta(torch="2.3.0", cpu_count=8, torch_threads=2)},
         "different torch thread counts (A: 1, B: 2): every op's time changes with it"),
    ],
)
def test_unlike_runs_are_compared_with_a_warning(b_overrides, flag) -> None:
    a = run(command=("train.py",), meta=RunMeta(torch="2.3.0", cpu_count=8, torch_threads=1))
    b = run(**{"command": ("train.py",), "meta": RunMeta(torch="2.3.0", cpu_count=8), **b_overrides})
    comparison = compare(a, b)
    (warning,) = comparison.flags
    assert flag in warning
    assert f"  warning: {warning}" in summary_lines(comparison)


def test_the_summary_names_the_page_written() -> None:
    lines = summary_lines(compare(run(0.1), run(0.05)), Path("runs/b/compare.html"))
    assert lines[-1] == "  report: runs/b/compare.html"
    assert lines[1] == "  mean step (the throughput): A 100.0 ms -> B 50.0 ms (-50.0%), on the host's clock"
    assert lines[2] == "  median step: A 100.0 ms -> B 50.0 ms"
