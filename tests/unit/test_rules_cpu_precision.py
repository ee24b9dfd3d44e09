"""``cpu-fp32-over-low-precision`` on hand-built records: a CPU run under bfloat16 autocast on a machine whose
bfloat16 matmuls measured far slower than its float32 ones is told to train in float32, naming the autocast line,
with a gain worked out from the measured rates and the op profile; a float32 run is clear; a run without both
rates is not checked, and says why; and no rule advises mixed precision on such a CPU.

``float32-over-float64`` likewise: a CPU run whose matmuls ran in float64, on a machine whose float32 matmuls
measured well faster, is told to train in float32, naming the line that made the model float64; float32 and
half-precision runs, and a CPU whose two rates are close, are clear. The cpu-peak probe measures a float64 step's
rate in float64 (it measured float32's, and such a run's MFU was held against the wrong peak)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from conftest import make_record
from gpuscope.diagnose.rules import evaluate
from gpuscope.collect.captures import FlopCount
from gpuscope.collect.collectors import cpu_peak
from gpuscope.collect.collectors.cpu_peak import CpuPeakProbe, MatmulTiming
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
from gpuscope.session import post_run_facts

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


def outcome(record, rule: str = RULE):
    recommendations, checks = evaluate(record)
    return checks[rule], {r.id: r for r in recommendations}.get(rule)


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


def test_an_autocast_a_framework_entered_is_turned_off_by_that_frameworks_setting() -> None:
    # given: Lightning's Trainer(precision="bf16-mixed") entered the autocast; the user's line is trainer.fit(...)
    fit = CallSite(file="pl_bf16.py", line=24, function="<module>", calls=70, code="trainer.fit(model, loader)")
    lightning = dataclasses.replace(bf16_run(sites=(fit,)), practices=Practices(
        torch_version="2.13.0", steps_checked=60, cpu_autocast_sites=(fit,), cpu_autocast_by="pytorch_lightning"))
    # when
    _, rec = outcome(lightning)
    # then: the fix is Lightning's setting, not "drop the autocast" on the fit() line
    assert rec.evidence[0].endswith("`trainer.fit(model, loader)` (70x), entered by pytorch_lightning")
    assert rec.fix.startswith('Trainer(..., precision="32-true")  # pytorch_lightning, called from pl_bf16.py:24, '
                              "enters torch.autocast in bfloat16")
    for library, setting in [("accelerate", 'Accelerator(mixed_precision="no")'),
                             ("transformers", "TrainingArguments(..., bf16=False, fp16=False)"),
                             ("mytrainer", "mytrainer's mixed precision off")]:
        record = dataclasses.replace(lightning, practices=dataclasses.replace(lightning.practices,
                                                                              cpu_autocast_by=library))
        assert outcome(record)[1].fix.startswith(f"{setting}  # {library}, called from pl_bf16.py:24"), library


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
    # the line that cast it, where the practices collector saw it
    half = CallSite(file="train.py", line=30, function="main", calls=1, code="model = Net().half()")
    cast = bf16_run(sites=(), dtype="float16")
    cast = dataclasses.replace(cast, practices=dataclasses.replace(cast.practices, half_precision_sites=(half,)))
    _, rec = outcome(cast)
    assert rec.evidence[0] == ("the step's matmuls ran in float16, the model's or torch's dtype made so at train.py:30 "
                               "`model = Net().half()` (1x)")
    assert rec.fix.startswith("train.py:30 `model = Net().half()`: keep the model (and its inputs) in float32")


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
    for check, _ in (outcome(bf16_run(device="cuda")), outcome(float64_run(device="cuda"), FLOAT64)):
        assert check.status == "not-checked" and check.reason == "a GPU run: this is about a CPU's own arithmetic"


def test_no_rule_advises_mixed_precision_on_a_cpu_whose_bf16_matmuls_are_slower() -> None:
    recommendations, checks = evaluate(bf16_run())
    assert checks["mixed-precision"].status == "not-checked"
    assert not any("autocast" in r.fix and r.id != RULE for r in recommendations)
    assert recommendations[0].id == RULE


# -- float32-over-float64 ------------------------------------------------------------------------------------
FLOAT64 = "float32-over-float64"
DOUBLE = CallSite(file="fit_double.py", line=16, function="<module>", calls=1, code="model = model.double()")


def float64_run(*, float64_rate: float = 70.4e9, float32_rate: float | None = 168.8e9, sites=(DOUBLE,),
                dtype: str = "float64", device: str = "cpu"):
    """Like the regression fit on NumPy data that showed it (a 3-layer MLP made `.double()`, SGD, batches of 512):
    a 64.8 ms step whose profiled ops spent 87% of their time in matmuls, 3.76 GFLOP of them a step; the cpu-peak
    probe measured float64 at 70.4 and float32 at 168.8 GFLOP/s. Plain python: 60.2 ms a step in float64, 27.7 ms
    with the model and data in float32."""
    return make_record(
        device=device,
        steps=Steps(count=50, median_s=0.0648, total=60, warmup=1, profiled=9, source="optimizer"),
        breakdown=Breakdown(data_wait=0.05, forward=0.30, backward=0.61, optimizer=0.03, other=0.01),
        op_profile=OpProfile(steps=3, ops=6705, ops_per_step=2235, mean_op_s=29.1e-6, top_host=(
            OpStat("aten::mm", 15, 0.1170), OpStat("aten::addmm", 9, 0.0528), OpStat("aten::index", 3072, 0.0100),
            OpStat("aten::threshold_backward", 6, 0.0050))),
        speed_of_light=SpeedOfLight(
            flops_per_step=3_760_000_000, flops_by_op={"mm": 2_500_000_000, "addmm": 1_260_000_000}, step=10,
            dtype=dtype, device_name="x86_64", peak_flops_per_s=float64_rate, peak_measured=True,
            peak_source="measured here after the run", float32_flops_per_s=float32_rate),
        practices=Practices(torch_version="2.13.0", steps_checked=60, float64_sites=sites),
        collectors={"cpu-peak": CollectorStatus("ok")},
    )


def test_a_model_made_float64_on_a_cpu_with_faster_float32_matmuls_is_told_to_train_in_float32() -> None:
    # when
    check, rec = outcome(float64_run(), FLOAT64)
    # then: the matmuls are 87% of the op time, 0.87 x 61.6 ms of compute (the step less its data wait); in float32
    # at the measured rates they take 70.4 / 168.8 of that: the gain is their difference over the step
    assert check.status == "fired"
    matmul_s = (0.1170 + 0.0528) / (29.1e-6 * 6705) * 0.0648 * 0.95
    assert rec.expected_gain == pytest.approx((matmul_s - matmul_s * 70.4 / 168.8) / 0.0648, abs=2e-3)
    assert 0.4 < rec.expected_gain < 0.6  # measured under plain python: 48-54% in four pairs
    assert rec.evidence[0] == ("the step's matmuls ran in float64, the model's or torch's dtype made so at "
                               "fit_double.py:16 `model = model.double()` (1x)")
    assert "float32 168.8 GFLOP/s, float64 70.4 GFLOP/s (2.4x slower)" in rec.evidence[1]
    assert rec.fix.startswith("fit_double.py:16 `model = model.double()`: keep the model (and its inputs) in float32")
    assert "unless it needs float64's precision" in rec.fix


def test_without_the_line_the_fix_says_where_float64_comes_from() -> None:
    _, rec = outcome(float64_run(sites=()), FLOAT64)
    assert rec.evidence[0] == "the step's matmuls ran in float64"
    assert "model.double()" in rec.fix and "torch.from_numpy(a).float()" in rec.fix


@pytest.mark.parametrize(("record", "why"), [
    (float64_run(float32_rate=100e9), "float32 under 1.5x float64's rate: load could make that difference"),
    (float64_run(dtype="float32", float64_rate=168.8e9), "a float32 run"),
    (float64_run(dtype="bfloat16", float64_rate=1e9), "half precision is cpu-fp32-over-low-precision's"),
])
def test_runs_float32_would_not_speed_up_are_clear(record, why: str) -> None:
    assert outcome(record, FLOAT64)[0].status == "clear", why


def test_without_the_float32_rate_beside_the_float64_one_the_rule_is_not_checked_and_says_why() -> None:
    check, _ = outcome(float64_run(float32_rate=None), FLOAT64)
    assert (check.status, check.reason) == (
        "not-checked", "this machine's float32 matmul rate was not measured beside its float64 one")


def test_the_cpu_peak_of_a_float64_step_is_measured_in_float64_with_float32_beside_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    timed: list[Any] = []

    def fake_timing(torch_: Any, dtype: Any, size: int = 1024, repeats: int = 5, budget_s: float = 1.0,
                    clock: Any = None) -> MatmulTiming:
        timed.append(dtype)
        return MatmulTiming(35e9 if dtype is torch.float64 else 80e9, 1024, 5)

    monkeypatch.setattr(cpu_peak, "time_matmuls", fake_timing)
    count = FlopCount(flops_per_step=10**9, flops_by_op={"mm": 10**9}, step=3, dtype="float64", cuda=False)
    peak = CpuPeakProbe().run(Path("."), post_run_facts(payloads={"flops": count})).payload
    assert timed == [torch.float64, torch.float32, torch.float64]  # the step's dtype at the probe's start and end
    assert (peak.dtype, peak.flops_per_s, peak.float32_flops_per_s) == ("float64", 35e9, 80e9)
    assert "1024x1024 float64 matmuls" in peak.source
    # a dtype it has no benchmark for is held against float32's
    timed.clear()
    CpuPeakProbe().run(Path("."), post_run_facts(payloads={"flops": dataclasses.replace(count, dtype="int8")}))
    assert timed == [torch.float32, torch.float32]
