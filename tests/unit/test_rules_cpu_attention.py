"""``cpu-float32-attention``: a CPU run whose scaled dot-product attention ran under bfloat16 autocast, where one
forward and backward of it at the run's shapes, timed after the run, took several times longer in bfloat16 than in
float32 (torch's CPU flash attention backward, on a machine whose bfloat16 matmuls are 4x faster than float32's:
AMX) is told to run the attention in float32 inside the autocast, naming the line; where the two take alike, or the
attention ran in float32, or there was none, it is clear; without the timing it is not checked, and says why. The CPU flash attention's FLOPs, which torch's counter
has no formula for, are counted, and its first call noted for the cpu-peak probe to time."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils import flop_counter

from conftest import make_record
from gpuscope.collect import attention
from gpuscope.collect.captures import AttentionCall, FlopCount
from gpuscope.collect.collectors import cpu_peak
from gpuscope.collect.collectors.cpu_peak import CpuPeakProbe, MatmulTiming
from gpuscope.diagnose.rules import evaluate
from gpuscope.record import (AttentionTiming, Breakdown, CallSite, CollectorStatus, OpProfile, OpStat, RunRecord,
                             SpeedOfLight, Steps)
from gpuscope.session import post_run_facts

RULE = "cpu-float32-attention"
BLOCK = CallSite(file="vit.py", line=35, function="forward", calls=1,
                 code="a = F.scaled_dot_product_attention(q, k, v)")


def vit_run(bf16_s: float = 0.037, fp32_s: float = 0.011, dtype: str = "bfloat16", seconds: bool = True):
    """Like the small ViT under CPU bf16 autocast that showed it (vit.py in the note of 2026-11-26): a 360 ms step
    whose profiled ops spent half their time in the CPU flash attention's backward; bfloat16 matmuls measured at 3.9x
    float32's rate; its attention (64 x 3 heads x 65 tokens x 64) timed after the run at ``bf16_s`` and ``fp32_s``."""
    timing = AttentionTiming(query=(64, 3, 65, 64), key=(64, 3, 65, 64), value=(64, 3, 65, 64), dtype=dtype,
                             called_at=BLOCK, seconds={dtype: bf16_s, "float32": fp32_s} if seconds else {})
    return make_record(
        device="cpu",
        steps=Steps(count=40, median_s=0.36, total=50, warmup=1, profiled=9, source="optimizer"),
        breakdown=Breakdown(data_wait=0.0, forward=0.18, backward=0.79, optimizer=0.02, other=0.01),
        op_profile=OpProfile(steps=3, ops=18_000, ops_per_step=6000, mean_op_s=5e-5, top_host=(
            OpStat("aten::_scaled_dot_product_flash_attention_for_cpu_backward", 18, 0.40),
            OpStat("aten::_scaled_dot_product_flash_attention_for_cpu", 18, 0.05),
            OpStat("aten::mm", 150, 0.2), OpStat("aten::gelu_backward", 18, 0.05))),
        speed_of_light=SpeedOfLight(
            flops_per_step=66_000_000_000, flops_by_op={"mm": 60_000_000_000}, step=10, dtype=dtype,
            device_name="x86_64", peak_flops_per_s=1.17e12, peak_measured=True, peak_source="measured here",
            float32_flops_per_s=3.0e11, attention=timing),
        collectors={"cpu-peak": CollectorStatus("ok")},
    )


def outcome(record):
    recommendations, checks = evaluate(record)
    return checks[RULE], {r.id: r for r in recommendations}.get(RULE)


def test_attention_several_times_slower_in_bfloat16_is_told_to_run_in_float32_inside_the_autocast() -> None:
    check, rec = outcome(vit_run())
    # then: half the op time (0.45 of its 0.9 s over three steps) is attention: 180 ms of the 360 ms step
    assert check.status == "fired"
    assert rec.evidence == (
        "the step's attention ran in bfloat16: 50% of the step's op time, about 180.0 ms of the 360.0 ms step",
        "one forward and backward of it (query 64 x 3 x 65 x 64), timed after the run: bfloat16 37.0 ms, float32 "
        "11.0 ms (3.4x slower)")
    # the gain: that time less the same at the measured ratio
    assert rec.expected_gain == pytest.approx(0.18 * (1 - 11 / 37) / 0.36, abs=1e-3)
    # the fix names the line and keeps the matmuls in bfloat16, which measured faster here
    assert rec.fix.startswith("vit.py:35 `a = F.scaled_dot_product_attention(q, k, v)`: run the attention in float32 "
                              "(keep the rest in bfloat16: its matmuls measured 3.9x float32's rate here): "
                              "with torch.autocast('cpu', enabled=False):")


def test_attention_as_fast_in_bfloat16_is_clear() -> None:
    check, rec = outcome(vit_run(bf16_s=0.012))
    assert (check.status, rec) == ("clear", None)


@pytest.mark.parametrize("record", [
    vit_run(dtype="float32"),
    dataclasses.replace(vit_run(), speed_of_light=SpeedOfLight(flops_per_step=1, dtype="bfloat16")),
], ids=["float32", "no-attention"])
def test_a_step_whose_attention_ran_in_float32_or_that_ran_none_is_clear(record) -> None:
    # (nanoGPT's float32 training on the CPU was listed "not checked: the step's attention ran in float32")
    check, rec = outcome(record)
    assert (check.status, rec) == ("clear", None)


@pytest.mark.parametrize(("record", "why"), [
    (vit_run(seconds=False), "the step's attention was not timed after the run (or its query was too large)"),
    (dataclasses.replace(vit_run(), speed_of_light=None), "no step's FLOPs were counted"),
], ids=["not-timed", "not-counted"])
def test_without_a_low_precision_attention_timed_the_rule_is_not_checked_and_says_why(record, why: str) -> None:
    check, _ = outcome(record)
    assert (check.status, check.reason) == ("not-checked", why)


def test_the_cpu_flash_attention_is_counted_and_its_first_call_noted() -> None:
    # given: torch's counter, with the CPU formulas beside its own
    seen: list[AttentionCall] = []
    formulas = {**flop_counter.flop_registry, **attention.cpu_formulas(torch, flop_counter, seen)}
    q, k, v = (torch.randn(2, 3, 16, 8, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    mode = flop_counter.FlopCounterMode(display=False, custom_mapping=formulas)
    # when: a causal attention, forward and backward, on the CPU
    with mode:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True); line = sys._getframe().f_lineno  # noqa: E702
        out.sum().backward()
    # then: its FLOPs as torch counts a GPU flash attention's (forward, and backward 2.5x it)
    forward = flop_counter.sdpa_flop_count(q.shape, k.shape, v.shape)
    backward = flop_counter.sdpa_backward_flop_count(q.shape, q.shape, k.shape, v.shape)
    assert mode.get_total_flops() == forward + backward
    noted = [(c.query, c.dtype, c.is_causal, c.called_at.line) for c in seen]  # type: ignore[union-attr]
    assert noted == [((2, 3, 16, 8), "bfloat16", True, line)]


def test_the_cpu_peak_probe_times_a_low_precision_attention_in_its_dtype_and_in_float32(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_peak, "time_matmuls", lambda *args, **kwargs: MatmulTiming(80e9, 1024, 5))  # not tested here
    call = AttentionCall((2, 3, 16, 8), (2, 3, 16, 8), (2, 3, 16, 8), "bfloat16")
    count = FlopCount(flops_per_step=10**6, flops_by_op={"mm": 10**6}, step=3, dtype="float32", cuda=False,
                      attention=call)
    peak = CpuPeakProbe().run(Path("."), post_run_facts(payloads={"flops": count})).payload
    assert set(peak.attention_s) == {"bfloat16", "float32"} and all(t > 0 for t in peak.attention_s.values())
    assert "the step's attention, forward and backward: bfloat16" in peak.source
    # a float32 attention is not timed: there is nothing to hold it against
    float32 = dataclasses.replace(count, attention=dataclasses.replace(call, dtype="float32"))
    assert CpuPeakProbe().run(Path("."), post_run_facts(payloads={"flops": float32})).payload.attention_s == {}


def test_a_query_too_large_is_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "MAX_ATTENTION_ELEMENTS", 100)
    assert attention.time_attention(torch, AttentionCall((2, 3, 16, 8), (2, 3, 16, 8), (2, 3, 16, 8), "bfloat16"),
                                    "bfloat16") is None


def test_the_recorded_vit_under_bf16_autocast_is_told_to_run_its_attention_in_float32() -> None:
    # given: the run recorded on the project's machine (tests/fixtures/records/README.md)
    path = Path(__file__).resolve().parents[1] / "fixtures" / "records" / "vit_bf16.json"
    record = RunRecord.from_json(json.loads(path.read_text()))
    # when
    check, rec = outcome(record)
    # then: the attention's share and the two measured times; its line, in the fix
    assert check.status == "fired" and rec.expected_gain > 0.3
    assert rec.evidence[1] == ("one forward and backward of it (query 64 x 3 x 65 x 64), timed after the run: "
                               "bfloat16 48.3 ms, float32 9.5 ms (5.1x slower)")
    assert rec.fix.startswith("vit.py:36 `a = F.scaled_dot_product_attention(q, k, v)`: run the attention in float32")


def test_an_attention_that_cannot_run_is_not_timed_and_costs_the_probe_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no such kernel for this dtype")

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", refuse)
    assert attention.time_attention(torch, AttentionCall((2, 3, 16, 8), (2, 3, 16, 8), (2, 3, 16, 8), "float16"),
                                    "float16") is None
