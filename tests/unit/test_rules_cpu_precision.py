"""``cpu-fp32-over-low-precision`` on hand-built records: a CPU run under bfloat16 autocast on a machine whose
bfloat16 matmuls measured far slower than its float32 ones is told to train in float32, naming the autocast line,
with a gain worked out from the measured rates and the op profile; a float32 run is clear; a run without both
rates is not checked, and says why; and no rule advises mixed precision on such a CPU."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import make_record
from gpuscope.analysis.rules import evaluate
from gpuscope.record import (
    Breakdown,
    CallSite,
    CollectorStatus,
    OpProfile,
    OpStat,
    Practices,
    SpeedOfLight,
    Steps,
)

RULE = "cpu-fp32-over-low-precision"
AUTOCAST = CallSite(file="amp_bf16.py", line=91, function="main", calls=50,
                    code="with torch.autocast('cpu', dtype=torch.bfloat16):")


def bf16_run(*, float32_rate: float | None = 80e9, bf16_rate: float = 1e9, sites=(AUTOCAST,), dtype="bfloat16",
             device="cpu"):
    """Like the TransformerEncoder under CPU bf16 autocast that showed the bug: a 400 ms step whose profiled ops
    spent 0.9 of their 1.0 s in matmuls, 1.6 GFLOP of matmuls a step; the cpu-peak probe measured bfloat16 at
    ``bf16_rate`` and float32 at ``float32_rate``."""
    return make_record(
        device=device,
        steps=Steps(count=50, median_s=0.4, total=60, warmup=1, profiled=9, source="optimizer"),
        breakdown=Breakdown(data_wait=0.0, forward=0.25, backward=0.73, optimizer=0.01, other=0.01),
        op_profile=OpProfile(steps=3, ops=10_000, ops_per_step=3333, mean_op_s=1e-4, top_host=(
            OpStat("aten::mm", 54, 0.7), OpStat("aten::addmm", 27, 0.19), OpStat("aten::bmm", 36, 0.01),
            OpStat("aten::bernoulli_", 27, 0.02), OpStat("aten::copy_", 771, 0.01))),
        speed_of_light=SpeedOfLight(
            flops_per_step=1_600_000_000, flops_by_op={"mm": 1_000_000_000, "addmm": 500_000_000, "bmm": 100_000_000},
            step=10, dtype=dtype, device_name="x86_64", peak_flops_per_s=bf16_rate, peak_measured=True,
            peak_source="measured here after the run", float32_flops_per_s=float32_rate),
        practices=Practices(torch_version="2.13.0", steps_checked=60, cpu_autocast_sites=sites),
        collectors={"cpu-peak": CollectorStatus("ok")},
    )


def outcome(record):
    recommendations, checks = evaluate(record)
    return checks[RULE], {r.id: r for r in recommendations}.get(RULE)


def test_a_bf16_autocast_run_on_a_cpu_with_slow_bf16_matmuls_is_told_to_train_in_float32() -> None:
    # when
    check, rec = outcome(bf16_run())
    # then: the evidence is the run's dtype and where autocast was entered, the two measured rates, and the
    # matmuls' time: 0.9 of the op time = 360 ms of the 400 ms step
    assert check.status == "fired"
    assert rec.evidence[0] == ("the step's matmuls ran in bfloat16, under torch.autocast at amp_bf16.py:91 "
                               "`with torch.autocast('cpu', dtype=torch.bfloat16):` (50x)")
    assert rec.evidence[1] == ("this machine's matmul rates, measured after the run: float32 80.0 GFLOP/s, "
                               "bfloat16 1.00 GFLOP/s (80x slower)")
    # in float32 the matmuls' 1.6 GFLOP at 80 GFLOP/s take 20 ms (longer than their 360 ms / 80 = 4.5 ms)
    assert rec.evidence[2] == ("matmul ops take 90% of the step's op time, about 360.0 ms of the 400.0 ms step; in "
                               "float32 they would take about 20.0 ms (1.60 GFLOP at the float32 rate)")
    # the gain: (360 - 20) ms of the 400 ms step
    assert rec.expected_gain == pytest.approx(0.85)
    # the fix names the user's autocast line
    assert rec.fix.startswith("amp_bf16.py:91 `with torch.autocast('cpu', dtype=torch.bfloat16):`: drop the autocast")
    assert "bfloat16 matmuls are 80x slower than its float32 ones" in rec.fix


def test_where_the_runs_matmuls_beat_the_benchmark_the_float32_time_is_their_flops_at_the_float32_rate() -> None:
    # given: the 1.6 GFLOP of matmuls ran in 360 ms (4.4 GFLOP/s), faster than the 1 GFLOP/s benchmark; at the
    # float32 rate of 8 GFLOP/s they take 200 ms, not 360 ms x 1/8 = 45 ms
    _, rec = outcome(bf16_run(float32_rate=8e9))
    assert rec.expected_gain == pytest.approx((0.36 - 0.2) / 0.4)


def test_without_an_autocast_line_the_fix_keeps_the_model_in_float32() -> None:
    # a model cast to half precision: its matmuls run in float16 without any autocast
    _, rec = outcome(bf16_run(sites=(), dtype="float16"))
    assert rec.evidence[0] == "the step's matmuls ran in float16"
    assert rec.fix.startswith("keep the model and its inputs in float32 (no .to(torch.float16) / .half())")


def test_a_float32_run_is_clear() -> None:
    check, rec = outcome(bf16_run(float32_rate=None, bf16_rate=80e9, sites=(), dtype="float32"))
    assert check.status == "clear" and rec is None


def test_a_cpu_whose_bf16_matmuls_are_as_fast_as_float32_ones_is_clear() -> None:
    # within the measurement's noise (1.2x), and faster (a CPU with bfloat16 matrix instructions)
    assert outcome(bf16_run(float32_rate=1.2e9))[0].status == "clear"
    assert outcome(bf16_run(float32_rate=80e9, bf16_rate=300e9))[0].status == "clear"


def test_without_the_float32_rate_the_rule_is_not_checked_and_says_why() -> None:
    check, _ = outcome(bf16_run(float32_rate=None))
    assert check.status == "not-checked"
    assert check.reason == "this machine's float32 matmul rate was not measured beside its bfloat16 one"
    # no rate at all: the cpu-peak probe's reason is given
    unmeasured = bf16_run(float32_rate=None)
    unmeasured = dataclasses.replace(
        unmeasured, speed_of_light=dataclasses.replace(unmeasured.speed_of_light, peak_flops_per_s=None,
                                                       peak_measured=False),
        collectors={"cpu-peak": CollectorStatus("unavailable", "turned off (--no-probes)")})
    check, _ = outcome(unmeasured)
    assert check.status == "not-checked"
    assert check.reason == "this machine's matmul rate was not measured (cpu-peak: turned off (--no-probes))"
    # no FLOP count: the dtype of the step's matmuls is not known
    check, _ = outcome(dataclasses.replace(bf16_run(), speed_of_light=None))
    assert check.status == "not-checked" and "dtype of the step's matmuls is unknown" in check.reason


def test_a_gpu_run_is_not_checked() -> None:
    check, _ = outcome(bf16_run(device="cuda"))
    assert check.status == "not-checked" and check.reason == "a GPU run: this is about a CPU's own arithmetic"


def test_no_rule_advises_mixed_precision_on_a_cpu_whose_bf16_matmuls_are_slower() -> None:
    recommendations, checks = evaluate(bf16_run())
    assert checks["mixed-precision"].status == "not-checked"
    assert not any("autocast" in r.fix and r.id != RULE for r in recommendations)
    assert recommendations[0].id == RULE
