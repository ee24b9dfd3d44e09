"""``float32-over-float64`` on hand-built records: a CPU run whose matmuls ran in float64, on a machine whose float32
matmuls measured well faster, is told to train in float32, naming the line that made the model float64, with a gain
worked out from the measured rates and the op profile; float32 and half-precision runs, and a CPU whose two rates
are close, are clear; a run without both rates is not checked, and says why. The cpu-peak probe measures a float64
step's rate in float64 (it measured float32's, and the MFU of such a run was held against the wrong peak)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from conftest import make_record

from gpuscope.analysis.rules import evaluate
from gpuscope.captures import FlopCount
from gpuscope.collectors import flops
from gpuscope.collectors.flops import CpuPeakProbe, MatmulTiming
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

RULE = "float32-over-float64"
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


def outcome(record):
    recommendations, checks = evaluate(record)
    return checks[RULE], {r.id: r for r in recommendations}.get(RULE)


def test_a_model_made_float64_on_a_cpu_with_faster_float32_matmuls_is_told_to_train_in_float32() -> None:
    # when
    check, rec = outcome(float64_run())
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
    _, rec = outcome(float64_run(sites=()))
    assert rec.evidence[0] == "the step's matmuls ran in float64"
    assert "model.double()" in rec.fix and "torch.from_numpy(a).float()" in rec.fix


@pytest.mark.parametrize(("record", "why"), [
    (float64_run(float32_rate=100e9), "float32 under 1.5x float64's rate: load could make that difference"),
    (float64_run(dtype="float32", float64_rate=168.8e9), "a float32 run"),
    (float64_run(dtype="bfloat16", float64_rate=1e9), "half precision is cpu-fp32-over-low-precision's"),
])
def test_runs_float32_would_not_speed_up_are_clear(record, why: str) -> None:
    assert outcome(record)[0].status == "clear", why


def test_without_the_float32_rate_the_rule_is_not_checked_and_says_why() -> None:
    check, _ = outcome(float64_run(float32_rate=None))
    assert (check.status, check.reason) == (
        "not-checked", "this machine's float32 matmul rate was not measured beside its float64 one")


def test_a_gpu_run_is_not_checked() -> None:
    assert outcome(float64_run(device="cuda"))[0].status == "not-checked"


def test_the_cpu_peak_of_a_float64_step_is_measured_in_float64_with_float32_beside_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    timed: list[Any] = []

    def fake_timing(torch_: Any, dtype: Any, size: int = 1024, repeats: int = 5, budget_s: float = 1.0,
                    clock: Any = None) -> MatmulTiming:
        timed.append(dtype)
        return MatmulTiming(35e9 if dtype is torch.float64 else 80e9, 1024, 5)

    monkeypatch.setattr(flops, "time_matmuls", fake_timing)
    count = FlopCount(flops_per_step=10**9, flops_by_op={"mm": 10**9}, step=3, dtype="float64", cuda=False)
    peak = CpuPeakProbe().run(Path("."), post_run_facts(payloads={"flops": count})).payload
    assert timed == [torch.float64, torch.float32]
    assert (peak.dtype, peak.flops_per_s, peak.float32_flops_per_s) == ("float64", 35e9, 80e9)
    assert "1024x1024 float64 matmuls" in peak.source
    # a dtype it has no benchmark for is held against float32's
    timed.clear()
    CpuPeakProbe().run(Path("."), post_run_facts(payloads={"flops": dataclasses.replace(count, dtype="int8")}))
    assert timed == [torch.float32]
