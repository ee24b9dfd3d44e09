"""``cpu-fp32-over-low-precision`` for convolutions: a CPU without bfloat16 instructions runs bfloat16 convolutions
on torch's reference kernel (``aten::_slow_conv2d_forward``), about 2 GFLOP/s whatever their shape. Found on a
knowledge-distillation script: a float32 teacher under ``no_grad`` beside a small student trained under
``torch.autocast("cpu", dtype=torch.bfloat16)``. Most of the step's FLOPs were the teacher's float32 ones, so the
step's dtype was float32 and the rule, which looked at matmuls in the step's dtype only, stayed clear, while the
student's convolutions took 59% of the step; without the autocast the script ran 1.94x faster.

The flops collector now counts the step's FLOPs by dtype, the cpu-peak probe times a convolution in the
low-precision dtype and in float32 where the step ran both convolutions and such FLOPs (both tested in
test_speed_of_light.py), and the rule holds the reference kernels' time against those rates. ``float32-over-float64``
likewise holds a float64 step's convolutions, which the reference kernel runs as float64 matmuls, against the matmul
rates: a small CNN made ``.double()`` was promised 1% by its matmuls alone, and ran 41% faster in float32."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from conftest import make_record
from gpuscope.diagnose.rules import evaluate
from gpuscope.record import Breakdown, CallSite, CollectorStatus, OpProfile, OpStat, Practices, SpeedOfLight, Steps

RULE = "cpu-fp32-over-low-precision"
AUTOCAST = CallSite(file="distill.py", line=61, function="main", calls=64,
                    code='with torch.autocast("cpu", dtype=torch.bfloat16):')


def distillation(*, bf16_conv_rate: float = 1.28e9, float32_conv_rate: float = 25.7e9,
                 slow: tuple[OpStat, ...] = (OpStat("aten::_slow_conv2d_forward", 6, 0.26),
                                             OpStat("aten::_slow_conv2d_backward", 6, 0.06))) -> Any:
    """As the distillation run measured: a 164 ms step of float32 and bfloat16 FLOPs (3.74 and 0.51 GFLOP), whose
    profiled ops (3 steps, 0.5 s in all) spent 0.32 s on the reference kernels; one 3x3 convolution measured after
    the run at ``bf16_conv_rate`` in bfloat16 and ``float32_conv_rate`` in float32."""
    return make_record(
        device="cpu",
        steps=Steps(count=54, median_s=0.164, total=64, warmup=1, profiled=9, source="optimizer"),
        breakdown=Breakdown(data_wait=0.02, forward=0.49, backward=0.12, optimizer=0.01, other=0.36),
        op_profile=OpProfile(steps=3, ops=2500, ops_per_step=833, mean_op_s=2e-4, top_host=(
            *slow, OpStat("aten::mkldnn_convolution", 12, 0.12), OpStat("aten::max_pool2d_with_indices", 9, 0.03))),
        speed_of_light=SpeedOfLight(
            flops_per_step=4_250_000_000,
            flops_by_op={"convolution": 3_920_000_000, "convolution_backward": 330_000_000},
            step=10, dtype="float32", device_name="x86_64", peak_flops_per_s=132e9, peak_measured=True,
            peak_source="measured here after the run",
            flops_by_dtype={"float32": 3_740_000_000, "bfloat16": 510_000_000},
            conv_flops_per_s={"bfloat16": bf16_conv_rate, "float32": float32_conv_rate}),
        practices=Practices(torch_version="2.13.0", steps_checked=64, cpu_autocast_sites=(AUTOCAST,)),
        collectors={"cpu-peak": CollectorStatus("ok")},
    )


def outcome(record: Any) -> tuple[Any, Any]:
    recommendations, checks = evaluate(record)
    return checks[RULE], {r.id: r for r in recommendations}.get(RULE)


def test_a_student_under_bf16_autocast_beside_a_float32_teacher_is_told_to_train_in_float32() -> None:
    # when
    check, rec = outcome(distillation())
    # then: the reference kernels' 0.32 s of the 0.5 s of op time (64%) of the median step's 161 ms of compute
    # (its 2% data wait left out) is about 103 ms; in float32 the 0.51 GFLOP of bfloat16 take 19.8 ms at 25.7 GFLOP/s
    # (longer than 103 ms / 20)
    assert check.status == "fired"
    assert rec.evidence[0] == (
        "the step's convolutions ran on torch's reference kernels (aten::_slow_conv2d_forward, "
        "aten::_slow_conv2d_backward), as it runs bfloat16 ones on this CPU, under torch.autocast at distill.py:61 "
        '`with torch.autocast("cpu", dtype=torch.bfloat16):` (64x): 64% of the step\'s op time, about 102.9 ms of '
        "the 164.0 ms step; in float32 they would take about 19.8 ms (0.51 GFLOP in bfloat16 at the float32 rate)")
    assert rec.evidence[1] == ("this machine's rate for a 3x3 convolution, measured after the run: float32 25.7 "
                               "GFLOP/s, bfloat16 1.28 GFLOP/s (20x slower)")
    assert rec.expected_gain == pytest.approx((0.64 * 0.164 * 0.98 - 0.51 / 25.7) / 0.164, abs=0.002)
    assert rec.fix.startswith('distill.py:61 `with torch.autocast("cpu", dtype=torch.bfloat16):`: drop the autocast')
    assert rec.fix.endswith("whose bfloat16 convolutions are 20x slower than its float32 ones")


def test_a_cpu_whose_bf16_convolutions_are_about_as_fast_as_float32_ones_is_clear() -> None:
    # within the measurement's noise, and faster (a CPU with bfloat16 instructions)
    assert outcome(distillation(float32_conv_rate=1.8e9))[0].status == "clear"
    assert outcome(distillation(bf16_conv_rate=60e9))[0].status == "clear"


def test_without_the_reference_kernels_in_the_op_profile_the_rule_is_clear() -> None:
    # the step's convolutions ran in oneDNN's kernels: nothing in the slow path to save
    assert outcome(distillation(slow=()))[0].status == "clear"


def test_without_convolution_rates_a_float32_step_is_clear() -> None:
    record = distillation()
    record = dataclasses.replace(record, speed_of_light=dataclasses.replace(record.speed_of_light,
                                                                            conv_flops_per_s={}))
    assert outcome(record)[0].status == "clear"


DOUBLE = CallSite(file="cnn64.py", line=11, function="<module>", calls=1,
                  code="nn.Flatten(), nn.Linear(32 * 7 * 7, 10)).double()")


def float64_cnn(*, linear_s: float = 0.005) -> Any:
    """As the small CNN made ``.double()`` measured: a 14.5 ms step, its profiled ops (3 steps, 60 ms in all) 69% on
    the reference kernels and ``linear_s`` in a matmul; float64 matmuls at 52.8 GFLOP/s, float32 at 118.7."""
    return make_record(
        device="cpu",
        steps=Steps(count=54, median_s=0.0145, total=64, warmup=1, profiled=9, source="optimizer"),
        breakdown=Breakdown(data_wait=0.0, forward=0.43, backward=0.5, optimizer=0.02, other=0.05),
        op_profile=OpProfile(steps=3, ops=600, ops_per_step=200, mean_op_s=1e-4, top_host=(
            OpStat("aten::_slow_conv2d_backward", 6, 0.026), OpStat("aten::_slow_conv2d_forward", 6, 0.0154),
            OpStat("aten::addmm", 3, linear_s), OpStat("aten::max_pool2d_with_indices", 6, 0.006))),
        speed_of_light=SpeedOfLight(
            flops_per_step=190_000_000, flops_by_op={"convolution": 120_000_000, "convolution_backward": 69_000_000,
                                                     "addmm": 1_000_000},
            step=10, dtype="float64", device_name="x86_64", peak_flops_per_s=52.8e9, peak_measured=True,
            peak_source="measured here after the run", float32_flops_per_s=118.7e9,
            flops_by_dtype={"float64": 190_000_000}),
        practices=Practices(torch_version="2.13.0", steps_checked=64, float64_sites=(DOUBLE,)),
        collectors={"cpu-peak": CollectorStatus("ok")},
    )


def test_float64_convolutions_on_the_reference_kernels_are_held_against_the_float32_matmul_rate() -> None:
    # given: the matmuls are 1% of the op time; the convolutions 69%, 10.0 ms of the 14.5 ms step
    recommendations, checks = evaluate(float64_cnn(linear_s=0.0006))
    found = {r.id: r for r in recommendations}["float32-over-float64"]
    # then: the convolutions' time less the same at the float32 rate (the reference kernel runs float64 ones as a
    # float64 matmul): 10.0 ms x (1 - 52.8 / 118.7) = 5.6 ms of the step, the matmul rates given once
    assert found.evidence[-1] == (
        "the step's convolutions ran on torch's reference kernels (aten::_slow_conv2d_backward, "
        "aten::_slow_conv2d_forward), as it runs float64 ones on this CPU: 69% of the step's op time, about 10.0 ms "
        "of the 14.5 ms step; in float32 they would take about 4.5 ms (0.19 GFLOP in float64 at the float32 rate)")
    assert sum("matmul rates, measured after the run" in line for line in found.evidence) == 1
    assert found.expected_gain == pytest.approx(0.69 * (1 - 52.8 / 118.7), abs=0.01)
    # the fix names the .double() line; with no matmul at all it speaks of the convolutions, with the rates
    assert found.fix.startswith("cnn64.py:11 `nn.Flatten(), nn.Linear(32 * 7 * 7, 10)).double()`: keep the model")
    alone = {r.id: r for r in evaluate(float64_cnn(linear_s=0.0))[0]}["float32-over-float64"]
    assert "whose float64 convolutions are 2.2x slower than its float32 ones" in alone.fix
    assert alone.evidence[-1] == ("this machine's rate for a square matmul, measured after the run: float32 118.7 "
                                  "GFLOP/s, float64 52.8 GFLOP/s (2.2x slower)")
