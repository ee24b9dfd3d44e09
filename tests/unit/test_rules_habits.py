"""Rules about habits (debug APIs, zero-filled gradients, biases before BatchNorm, DataParallel) on hand-built
records: each fires on its signal with the numbers and lines it rests on, stays clear without it, and is not
checked without the facts it needs."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import make_record
from gpuscope.diagnose.rules import evaluate
from gpuscope.record import Calibration, CallSite, CollectorStatus, OpProfile, OpStat, Practices, Steps, StepSample

LINE = CallSite(file="train.py", line=42, function="main", code="optimizer.zero_grad(set_to_none=False)", calls=50)
ANOMALY = CallSite(file="train.py", line=30, function="main", code="with torch.autograd.detect_anomaly():", calls=50)


def run_with(practices: Practices | None = None, **overrides):
    return make_record(
        steps=Steps(count=40, median_s=0.1, total=50, warmup=2, profiled=8, source="optimizer"),
        practices=practices if practices is not None else Practices(
            torch_version="2.13.0", steps_checked=50, zero_grad_calls=50, modules_inspected=True),
        op_profile=OpProfile(steps=3, ops=3000, ops_per_step=1000, top_host=(
            OpStat("aten::mm", 30, 0.15), OpStat("aten::ne", 300, 0.03), OpStat("aten::any", 300, 0.015),
            OpStat("aten::fill_", 150, 0.006))),
        calibration=Calibration(op_overhead_s=0.5e-6, ops_per_step=379, step_s=2e-4, anomaly_op_overhead_s=4e-6),
        **overrides,
    )


def outcome(record, rule_id):
    recommendations, checks = evaluate(record)
    found = {r.id: r for r in recommendations}
    return checks[rule_id], found.get(rule_id)


def habits(**changes) -> Practices:
    return dataclasses.replace(run_with().practices, **changes)


def test_anomaly_detection_left_on_is_costed_from_its_nan_checks_and_stack_capture() -> None:
    check, rec = outcome(run_with(habits(anomaly_steps=50, anomaly_sites=(ANOMALY,))), "disable-debug-apis")
    assert check.status == "fired"
    assert rec.evidence[0] == ("anomaly detection was on in 50 of 50 steps checked, switched on at train.py:30 "
                               "`with torch.autograd.detect_anomaly():` (50x)")
    # NaN checks: (0.03 + 0.015) s / 3 steps = 15 ms; stacks: 4 us x 1000 ops = 4 ms; of a 100 ms step
    assert "it cost about 19.0 ms of the 100.0 ms step (19%)" in rec.evidence[1]
    assert "aten::ne x300, aten::any x300 in 3 steps" in rec.evidence[1]
    assert rec.expected_gain == pytest.approx(0.19)
    assert rec.fix.startswith("train.py:30 `with torch.autograd.detect_anomaly():`")


def test_anomaly_detection_on_in_some_steps_scales_the_gain() -> None:
    _, rec = outcome(run_with(habits(anomaly_steps=25, anomaly_sites=(ANOMALY,))), "disable-debug-apis")
    assert rec.expected_gain == pytest.approx(0.095)


@pytest.mark.parametrize(("changes", "fact"), [
    ({"profiler_steps": 12}, "torch's autograd profiler (or emit_nvtx) was on in 12 of 50 steps checked, outside "
                               "gpuscope's own profiling window"),
    ({"gradcheck_sites": (dataclasses.replace(LINE, code="torch.autograd.gradcheck(f, x)", calls=2),)},
     "gradcheck ran during training: train.py:42 `torch.autograd.gradcheck(f, x)` (2x)"),
])
def test_the_profiler_and_gradcheck_fire_without_an_estimate(changes, fact) -> None:
    check, rec = outcome(run_with(habits(**changes)), "disable-debug-apis")
    assert check.status == "fired" and rec.evidence == (fact,) and rec.expected_gain is None


def test_no_debug_api_is_clear() -> None:
    assert outcome(run_with(), "disable-debug-apis")[0].status == "clear"


def test_zero_filled_gradients_fire_with_the_line_and_the_fill_time() -> None:
    check, rec = outcome(run_with(habits(zero_grad_fill_calls=50, zero_grad_fill_sites=(LINE,))),
                         "zero-grad-set-to-none")
    assert check.status == "fired"
    assert rec.evidence[0] == ("50 of 50 zero_grad calls zero-filled the gradients: train.py:42 "
                               "`optimizer.zero_grad(set_to_none=False)` (50x)")
    assert rec.evidence[1] == "torch 2.13.0 drops gradients by default (set_to_none=True); these calls pass False"
    assert rec.evidence[2].startswith("zero-filling took 2.00 ms per profiled step (2% of the step)")
    assert rec.expected_gain == pytest.approx(0.02)
    assert rec.fix == "train.py:42 `optimizer.zero_grad(set_to_none=False)`: zero_grad(set_to_none=True)"


def test_before_torch_2_the_default_itself_zero_fills() -> None:
    _, rec = outcome(run_with(habits(torch_version="1.13.1", zero_grad_fill_calls=50, zero_grad_fill_sites=(LINE,))),
                     "zero-grad-set-to-none")
    assert rec.evidence[1] == "torch 1.13.1 zero-fills by default: pass set_to_none=True"


def test_gradients_set_to_none_are_clear() -> None:
    assert outcome(run_with(), "zero-grad-set-to-none")[0].status == "clear"


def test_biases_feeding_batchnorm_are_named() -> None:
    pairs = tuple(f"features.{i} (Conv2d) -> features.{i + 1} (BatchNorm2d)" for i in range(0, 12, 2))
    check, rec = outcome(run_with(habits(bias_before_norm=pairs, wasted_bias_params=384)), "bias-before-batchnorm")
    assert check.status == "fired" and rec.expected_gain is None
    assert rec.evidence[0].startswith("6 layers with a bias feed a BatchNorm, which cancels it: "
                                      "features.0 (Conv2d) -> features.1 (BatchNorm2d); ")
    assert rec.evidence[0].endswith("; and 2 more")
    assert rec.evidence[1] == "384 bias parameters are computed, reduced in backward and updated for nothing"
    assert rec.fix == "nn.Conv2d(..., bias=False)  # directly before nn.BatchNorm2d"


def test_the_bias_fix_names_the_kinds_of_layer_found() -> None:
    # an MLP's Linear layers before BatchNorm1d are told so, not to change a convolution
    mlp = ("3 (Linear) -> 4 (BatchNorm1d)", "6 (Linear) -> 7 (BatchNorm1d)")
    rec = outcome(run_with(habits(bias_before_norm=mlp, wasted_bias_params=512)), "bias-before-batchnorm")[1]
    assert rec.fix == "nn.Linear(..., bias=False)  # directly before nn.BatchNorm1d"
    both = ("stem.0 (Conv2d) -> stem.1 (BatchNorm2d)", "head.0 (Linear) -> head.1 (BatchNorm1d)")
    rec = outcome(run_with(habits(bias_before_norm=both, wasted_bias_params=512)), "bias-before-batchnorm")[1]
    assert rec.fix == "nn.Conv2d(..., bias=False), nn.Linear(..., bias=False)  # each directly before its BatchNorm"


def test_data_parallel_is_named() -> None:
    check, rec = outcome(run_with(habits(data_parallel=("DataParallel(ResNet) on 4 devices",))),
                         "distributed-data-parallel")
    assert check.status == "fired"
    assert rec.evidence[0] == "the model is wrapped in DataParallel(ResNet) on 4 devices"


@pytest.mark.parametrize("rule_id", ["bias-before-batchnorm", "distributed-data-parallel"])
def test_a_model_without_those_patterns_is_clear(rule_id) -> None:
    assert outcome(run_with(), rule_id)[0].status == "clear"


@pytest.mark.parametrize("rule_id", ["bias-before-batchnorm", "distributed-data-parallel"])
def test_an_uninspected_model_is_not_checked(rule_id) -> None:
    check, _ = outcome(run_with(habits(modules_inspected=False)), rule_id)
    assert check.status == "not-checked" and "not inspected" in check.reason


@pytest.mark.parametrize("rule_id", ["disable-debug-apis", "zero-grad-set-to-none", "bias-before-batchnorm",
                                     "distributed-data-parallel"])
def test_without_the_practices_collector_nothing_is_checked(rule_id) -> None:
    record = dataclasses.replace(run_with(), practices=None,
                                 collectors={"practices": CollectorStatus("failed", "boom", field="practices")})
    check, _ = outcome(record, rule_id)
    assert check == dataclasses.replace(check, status="not-checked")
    assert "practices: boom" in check.reason


POLICY = CallSite(file="rl.py", line=45, function="main", code="m = Categorical(probs); action = m.sample()",
                  calls=256)


def policy_run(check_s: tuple[float, ...], device: str = "cpu"):
    """A run of a 100 ms step whose practices timed torch.distributions' checks in steps 1-10 (47 a step): step 0
    warm-up, 1-2 profiled (cProfile slows the checks' Python), 3-10 steady."""
    record = run_with(habits(distribution_check_steps=tuple(range(1, 11)), distribution_check_s=check_s,
                             distribution_check_counts=(47,) * 10, distribution_sites=(POLICY,)), device=device)
    sample = StepSample(index=tuple(range(11)), wall_s=(0.1,) * 11,
                        status=("warmup", "profiled", "profiled") + ("steady",) * 8)
    return dataclasses.replace(record, steps=dataclasses.replace(record.steps, sample=sample))


def test_distribution_checks_are_costed_from_the_steady_steps_and_named_with_their_line() -> None:
    check, rec = outcome(policy_run((0.05, 0.05) + (0.012,) * 4 + (0.014,) * 4), "skip-distribution-checks")
    assert check.status == "fired"
    assert rec.evidence == (
        "torch.distributions checked its arguments or a sample 47 times a step (validate_args, on by default), "
        "taking 13.00 ms of the 100.0 ms median step (13%), timed around the checks in each step",
        "the distributions were built at rl.py:45 `m = Categorical(probs); action = m.sample()`")
    assert rec.expected_gain == pytest.approx(0.13)  # the profiled steps' 50 ms left out
    assert rec.fix == ("rl.py:45 `m = Categorical(probs); action = m.sample()`: pass validate_args=False to the "
                       "distribution built there, or call "
                       "torch.distributions.Distribution.set_default_validate_args(False) once before training")


def test_checks_in_the_rollouts_left_out_of_the_steps_are_said_with_their_share_of_the_run() -> None:
    # given: a PPO loop (CleanRL's) whose steps 1-10 are updates of 100 ms checking 4 ms each, and whose 4 rollouts (steps 11-14, a policy sampling an action per environment step) check 256 times,
    # 15 ms of each rollout's 130 ms: 20 updates and the 4 rollouts in all
    record = run_with(habits(distribution_check_steps=tuple(range(1, 15)),
                             distribution_check_s=(0.004,) * 10 + (0.015,) * 4,
                             distribution_check_counts=(2,) * 10 + (256,) * 4, distribution_sites=(POLICY,)))
    sample = StepSample(index=tuple(range(15)), wall_s=(0.1,) * 11 + (0.13,) * 4,
                        status=("warmup",) + ("steady",) * 10 + ("eval",) * 4)
    steps = dataclasses.replace(record.steps, sample=sample, count=20, evaluated=4, evaluated_s=0.52,
                                evaluated_in_train_mode=1.0)
    check, rec = outcome(dataclasses.replace(record, steps=steps), "skip-distribution-checks")
    # then: the evidence gives the run's share too, (20 x 4 + 4 x 15 ms) / (20 x 100 + 520 ms) = 5.6%; the gain
    # stays the update step's (the contract's: a share of step time)
    assert check.status == "fired"
    assert rec.evidence[1] == (
        "the 4 steps holding a rollout checked 256 times each, taking 15.00 ms of each one's 130.0 ms: with them "
        "the checks are 6% of the run's training time (0.5 s of rollouts and 2.0 s of updates), which the step's "
        "share leaves out")
    assert rec.expected_gain == pytest.approx(0.04)


def test_on_a_gpu_the_checks_waits_for_the_device_are_said() -> None:
    _, rec = outcome(policy_run((0.02,) * 10, device="cuda"), "skip-distribution-checks")
    assert rec.evidence[-1] == "on the GPU each check also waits for the device to hand back its verdict"


def test_distribution_checks_under_two_percent_of_the_step_are_clear() -> None:
    check, rec = outcome(policy_run((0.0019,) * 10), "skip-distribution-checks")
    assert (check.status, rec) == ("clear", None)


def test_a_run_whose_distributions_checked_nothing_is_clear() -> None:
    check, rec = outcome(run_with(), "skip-distribution-checks")
    assert (check.status, rec) == ("clear", None)
