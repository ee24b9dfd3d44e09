"""``cpu-mixed-precision``: a float32 CPU run whose convolutions and matmuls take the step, on a machine where its
heaviest shapes of them measured faster under bfloat16 autocast, is told to train in mixed precision, with a gain
worked out from those timings and the op profile. The FLOP counter keeps the shapes; the cpu-peak probe times them
in both, only where this machine's bfloat16 matmuls are faster at all."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import make_record
from gpuscope.collect.autocast_timing import describe, time_one
from gpuscope.collect.captures import FlopCount, HeavyOp
from gpuscope.collect.collectors import cpu_peak
from gpuscope.collect.collectors.cpu_peak import CpuPeakProbe
from gpuscope.collect.collectors.flops import SpeedOfLightCollector
from gpuscope.diagnose import analyze
from gpuscope.diagnose.rules import evaluate
from gpuscope.record import (AttentionTiming, AutocastTiming, Breakdown, CallSite, CollectorStatus, OpProfile,
                             OpStat, Practices, ProbabilityLoss, RunRecord, SpeedOfLight, Steps)
from gpuscope.session import post_run_facts
from test_speed_of_light import FakeSteps

torch = pytest.importorskip("torch")

RULE = "cpu-mixed-precision"
RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "records"


def conv_net_run(conv_ratio: float = 0.5, matmul_ratio: float = 0.6, **overrides: object) -> RunRecord:
    """A float32 CPU step of 300 ms, 10% of it data wait: of the profiled ops' 1.0 s, 0.8 s in convolutions and 0.05 s
    in matmuls; their heaviest shapes timed after the run, under autocast at ``conv_ratio`` and ``matmul_ratio`` of
    their float32 time."""
    record = make_record(
        device="cpu",
        steps=Steps(count=40, median_s=0.3, total=52, warmup=1, profiled=11, source="optimizer"),
        breakdown=Breakdown(data_wait=0.1, forward=0.3, backward=0.55, optimizer=0.03, other=0.02),
        op_profile=OpProfile(steps=3, ops=10_000, ops_per_step=3333, mean_op_s=1e-4, top_host=(
            OpStat("aten::convolution_backward", 60, 0.5), OpStat("aten::mkldnn_convolution", 90, 0.3),
            OpStat("aten::addmm", 9, 0.05), OpStat("aten::native_batch_norm", 90, 0.1),
            OpStat("aten::add_", 2000, 0.05))),
        speed_of_light=SpeedOfLight(
            flops_per_step=10**11, flops_by_op={"convolution": 3 * 10**10, "convolution_backward": 6 * 10**10},
            step=10, dtype="float32", flops_by_dtype={"float32": 10**11}, peak_flops_per_s=2e11, peak_measured=True,
            peak_source="measured here after the run", autocast=(
                AutocastTiming("conv", "a 3x3 convolution, 64 to 64 channels, 8 images of 32x32", 0.3, 0.02,
                               0.02 * conv_ratio),
                AutocastTiming("conv", "a 3x3 convolution, 128 to 128 channels, 8 images of 16x16", 0.1, 0.01,
                               0.01 * conv_ratio),
                AutocastTiming("matmul", "a 64x512 by 512x10 matmul", 1.0, 1e-4, 1e-4 * matmul_ratio))),
        practices=Practices(torch_version="2.13.0", steps_checked=52),
        collectors={"cpu-peak": CollectorStatus("ok")},
    )
    return dataclasses.replace(record, **overrides)  # type: ignore[arg-type]


def test_a_float32_conv_net_on_a_cpu_whose_bfloat16_measured_faster_is_told_to_train_in_mixed_precision() -> None:
    # (timed with their pages kept only, as records made before the fresh timings were kept)
    found = {r.id: r for r in evaluate(conv_net_run())[0]}
    rec = found[RULE]
    # the step computes 270 ms (300 less its 10% data wait): convolutions 80% of it, 216 ms, at half their time under
    # autocast (their shapes' ratio, weighted by their FLOPs); matmuls 5%, 13.5 ms, at 0.6: 108 + 5.4 ms saved
    assert rec.expected_gain == pytest.approx((0.216 * 0.5 + 0.0135 * 0.4) / 0.3)
    assert rec.evidence[0].startswith("convolution ops take 80% of the step's op time, about 216.0 ms of the 300.0 ms "
                                      "step; their heaviest shapes, forward and backward as the step ran them, timed "
                                      "after the run: a 3x3 convolution, 64 to 64 channels, 8 images of 32x32 (30% of "
                                      "their FLOPs): float32 20.00 ms, bfloat16 autocast 10.00 ms")
    assert rec.evidence[0].endswith(": 2.0x faster in bfloat16, about 108.0 ms")
    assert rec.evidence[1].startswith("matmul ops take 5% of the step's op time, about 13.5 ms")
    assert "torch.autocast('cpu', dtype=torch.bfloat16)" in rec.fix



NANOGPT_FORWARD = CallSite(file="train.py", line=298, function="<module>", code="logits, loss = model(X, Y)", calls=64)
"""Where nanoGPT's train.py calls its model (inside ``with ctx:``, a nullcontext on a CPU)."""


def test_the_autocast_goes_around_the_line_that_calls_the_model_where_the_scripts_own_code_does() -> None:
    # given the run's training forward called from nanoGPT's line
    run = conv_net_run()
    at_line = dataclasses.replace(run, steps=dataclasses.replace(run.steps, forward_sites=(NANOGPT_FORWARD,)))
    fix = {r.id: r for r in evaluate(at_line)[0]}[RULE].fix
    # then the fix names that line
    assert fix.splitlines()[0] == (
        "train.py:298 `logits, loss = model(X, Y)`: run it, and the loss computed from its output, under "
        "torch.autocast('cpu', dtype=torch.bfloat16); backward and the optimizer's step outside it; bfloat16 needs "
        "no GradScaler")
    # but where a library steps the optimizer, its setting is the fix, whatever line called into it
    trainer = dataclasses.replace(at_line, steps=dataclasses.replace(at_line.steps, optimizer_by="transformers"))
    assert {r.id: r for r in evaluate(trainer)[0]}[RULE].fix.startswith("TrainingArguments(..., bf16=True)")


def test_the_steps_collector_keeps_the_lines_that_call_the_trained_model_with_gradients_on() -> None:
    from gpuscope.collect.collectors.steps import StepsCollector

    # given a loop that trains its model at one line and evaluates it at another
    collector = StepsCollector()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    collector.start(Path("."))
    try:
        for _ in range(8):
            optimizer.zero_grad()
            out = model(torch.randn(8, 4))
            out.sum().backward()
            optimizer.step()
            with torch.no_grad():
                model(torch.randn(8, 4))
    finally:
        result = collector.stop()
    # then the training line is kept, the evaluation's is not
    sites = result.payload.forward_sites
    assert [site.code for site in sites] == ["out = model(torch.randn(8, 4))"]
    assert sites[0].calls >= 5 and sites[0].file.endswith("test_cpu_mixed_precision.py")


def test_where_the_gain_needs_the_pages_kept_glibcs_thresholds_are_part_of_the_fix() -> None:
    # given: shapes 2x faster under autocast with their pages kept, 1.05x faulted in afresh at each run (an MLP at
    # batch 64 under accelerate's bf16, on a fresh process: 27 ms a step against float32's 20; 14 ms with glibc's
    # thresholds raised)
    run = conv_net_run()
    sol = run.speed_of_light
    fresh = tuple(dataclasses.replace(t, float32_fresh_s=t.float32_s, bfloat16_fresh_s=t.float32_s / 1.05)
                  for t in sol.autocast)
    found = {r.id: r for r in evaluate(dataclasses.replace(
        run, speed_of_light=dataclasses.replace(sol, autocast=fresh)))[0]}[RULE]
    # then: the gain with the pages kept, and what keeps them
    assert found.expected_gain == pytest.approx((0.216 * 0.5 + 0.0135 * 0.4) / 0.3)
    assert found.evidence[-1] == (
        "with the pages they allocate faulted in afresh at each run, as where glibc hands freed blocks back to the "
        "kernel at once (autocast's bfloat16 copies of the weights are made every step), the same shapes measured "
        "conv 1.05x; matmul 1.05x float32's speed: 4% of the step saved, not 38%: the gain needs glibc to keep what "
        "it frees (256 MiB, MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_)")
    autocast, keep = found.fix.split("\n")
    assert autocast.startswith("with torch.autocast('cpu', dtype=torch.bfloat16)")
    assert keep.startswith("MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=268435456 python train.py")
    # where faulting them in costs under half the gain, the fix is the autocast alone
    half = tuple(dataclasses.replace(t, float32_fresh_s=t.float32_s, bfloat16_fresh_s=t.bfloat16_s * 1.2)
                 for t in sol.autocast)
    alone = {r.id: r for r in evaluate(dataclasses.replace(
        run, speed_of_light=dataclasses.replace(sol, autocast=half)))[0]}[RULE]
    assert "\n" not in alone.fix and len(alone.evidence) == 2


def with_attention(run: RunRecord, share: float, bfloat16_s: float) -> RunRecord:
    """``run`` with its attention ``share`` of the profiled op time (taken from its normalisation ops), timed after
    the run at 10 ms in float32 and ``bfloat16_s`` in bfloat16."""
    ops = run.op_profile
    rows = tuple(o for o in ops.top_host if o.name != "aten::native_batch_norm") + (
        OpStat("aten::_scaled_dot_product_flash_attention_for_cpu", 12, share),
        OpStat("aten::native_batch_norm", 90, 0.1 - share))
    timing = AttentionTiming((4, 6, 512, 64), (4, 6, 512, 64), (4, 6, 512, 64), "float32", True,
                             CallSite(file="model.py", line=80, function="forward", calls=12,
                                      code="y = F.scaled_dot_product_attention(q, k, v, is_causal=True)"),
                             {"float32": 0.01, "bfloat16": bfloat16_s})
    return dataclasses.replace(run, op_profile=dataclasses.replace(ops, top_host=rows),
                               speed_of_light=dataclasses.replace(run.speed_of_light, attention=timing))


def test_attention_clearly_slower_in_bfloat16_is_kept_in_float32_inside_the_autocast() -> None:
    # given: the conv net's 38% (113.4 ms saved of its 300 ms step), its attention 5% of the op time, 13.5 ms, one
    # forward and backward of it 3x slower in bfloat16
    slower = {r.id: r for r in evaluate(with_attention(conv_net_run(), 0.05, 0.03))[0]}[RULE]
    # then: the fix keeps it in float32 inside the autocast, naming its line, and the gain is the matmuls' and
    # convolutions'
    assert slower.expected_gain == pytest.approx(0.1134 / 0.3, abs=1e-3)  # (a rounded figure)
    assert slower.evidence[-1] == ("the step's attention (query 4 x 6 x 512 x 64) takes about 13.5 ms of the 300.0 ms "
                                   "step; one forward and backward of it, timed after the run: float32 10.0 ms, "
                                   "bfloat16 30.0 ms (3.0x slower)")
    assert slower.fix.split("\n")[1].startswith("model.py:80 `y = F.scaled_dot_product_attention(q, k, v, "
                                                 "is_causal=True)`: keep the attention in float32 inside it")
    # under 1.5x slower (this VM's timings of one attention spread that far), or faster, it is left as it is
    for bfloat16_s in (0.013, 0.005):
        left = {r.id: r for r in evaluate(with_attention(conv_net_run(), 0.05, bfloat16_s))[0]}[RULE]
        assert left.expected_gain == pytest.approx(0.1134 / 0.3, abs=1e-3) and "\n" not in left.fix


def test_a_loss_on_probabilities_is_named_at_its_line_and_the_fix_computes_it_on_the_logits() -> None:
    # given: the conv net's step, its loss a BCELoss on a sigmoid's output at train.py:42
    site = CallSite("train.py", 42, "train", "loss = criterion(torch.sigmoid(model(x)), y)", 1)
    plain = conv_net_run()
    run = dataclasses.replace(plain, speed_of_light=dataclasses.replace(
        plain.speed_of_light, probability_loss=ProbabilityLoss("float32", site)))  # type: ignore[type-var]
    # when
    rec = {r.id: r for r in evaluate(run)[0]}[RULE]
    # then: autocast's gain as without it; the evidence says what bfloat16 does to that loss, the fix moves it onto
    # the logits at its line
    assert rec.expected_gain == {r.id: r for r in evaluate(plain)[0]}[RULE].expected_gain
    assert rec.evidence[-1] == ("the step computes BCELoss on probabilities at train.py:42 `loss = criterion("
                                "torch.sigmoid(model(x)), y)`: under bfloat16 autocast the sigmoid before it rounds "
                                "probabilities near 1 to 1 (the closest below is 0.996), and the loss over outputs that "
                                "near comes out wrong")
    first, last = rec.fix.splitlines()[0], rec.fix.splitlines()[-1]
    assert first.startswith("with torch.autocast('cpu', dtype=torch.bfloat16)")
    assert last == ("train.py:42 `loss = criterion(torch.sigmoid(model(x)), y)`: compute the loss on the logits before "
                    "autocasting: nn.BCEWithLogitsLoss() (F.binary_cross_entropy_with_logits) in place of the sigmoid "
                    "and nn.BCELoss")


def test_a_run_in_bfloat16_already_or_under_an_autocast_is_left_to_the_low_precision_rules() -> None:
    autocast = CallSite(file="train.py", line=40, function="main", calls=50,
                        code="with torch.autocast('cpu', dtype=torch.bfloat16):")
    under = conv_net_run(practices=Practices(torch_version="2.13.0", steps_checked=52, cpu_autocast_sites=(autocast,)))
    assert RULE not in {r.id for r in evaluate(under)[0]}
    run = conv_net_run()
    in_bf16 = dataclasses.replace(run, speed_of_light=dataclasses.replace(run.speed_of_light, dtype="bfloat16"))
    assert analyze(in_bf16).checks[RULE].reason == "the step's matmuls ran in bfloat16, not float32"


def test_where_bfloat16_measured_no_faster_the_rule_is_not_checked_and_says_why() -> None:
    run = conv_net_run()
    slow = dataclasses.replace(run, speed_of_light=dataclasses.replace(
        run.speed_of_light, autocast=(), peak_source="measured here after the run; bfloat16 matmuls no faster than "
                                                    "float32 ones here: the step's shapes not timed in it"))
    assert analyze(slow).checks[RULE].reason == (
        "this machine's bfloat16 matmuls measured no faster than its float32 ones")


@pytest.mark.parametrize(("conv_ratio", "matmul_ratio"), [(0.95, 0.95), (1.3, 0.6)])
def test_shapes_no_faster_or_a_gain_under_a_tenth_are_not_advised(conv_ratio: float, matmul_ratio: float) -> None:
    # 5% off the convolutions saves 3.6% of the step; convolutions slower under autocast save nothing, the matmuls'
    # 5.4 ms are 1.8% of it
    assert RULE not in {r.id for r in evaluate(conv_net_run(conv_ratio, matmul_ratio))[0]}


def test_pytorch_examples_dcgan_on_this_cpu_is_promised_what_autocast_measured() -> None:
    # given: pytorch/examples' DCGAN on a CPU with AVX512-BF16 (tests/fixtures/records/README.md), its convolutions
    # 1.6-2.0x faster under autocast at its own shapes
    record = RunRecord.from_json(json.loads((RECORDS / "dcgan_cpu.json").read_text()))
    rec = {r.id: r for r in analyze(record).recommendations}[RULE]
    # then: a third off the step, where the same script under autocast ran 41% faster a step (983 -> 579 ms)
    assert rec.expected_gain == pytest.approx(0.35, abs=0.01)
    assert rec.evidence[0].startswith("convolution ops take 89% of the step's op time, about 844.4 ms of the 959.8 ms "
                                      "step")
    assert rec.evidence[0].endswith(": 1.7x faster in bfloat16, about 509.1 ms")


def test_the_flop_counter_keeps_the_steps_heaviest_convolution_and_matmul_shapes() -> None:
    # given: a small conv net (a convolution, a transposed one, a linear head) trained in float32, counted at step 2
    conv, up, head = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ConvTranspose2d(8, 4, 4, 2, 1), torch.nn.Linear(4, 2)
    x = torch.randn(2, 3, 8, 8)
    steps, collector = FakeSteps(), SpeedOfLightCollector(start=2)
    collector.follow(steps)
    for index in (1, 2, 3):
        steps.listener(index)
        head(up(torch.relu(conv(x))).mean((2, 3))).sum().backward()
    count = collector.stop().payload
    # then: both convolutions' forward shapes, which of their operands needed a gradient (not the batch), the
    # transposed one's settings; and the head's forward matmul alone (the backward's are timed with it)
    assert isinstance(count, FlopCount)
    convs = [op for op in count.heavy_ops if op.kind == "conv"]
    assert {(op.shapes, op.transposed, op.grads) for op in convs} == {
        (((2, 3, 8, 8), (8, 3, 3, 3)), False, (False, True)), (((2, 8, 8, 8), (8, 4, 4, 4)), True, (True, True))}
    transposed = next(op for op in convs if op.transposed)
    assert (transposed.stride, transposed.padding, transposed.output_padding) == ((2, 2), (1, 1), (0, 0))
    assert sum(op.flops for op in convs) == convs[0].kind_flops
    assert describe(transposed) == "a 4x4 transposed convolution, 8 to 4 channels, 2 images of 8x8"
    matmuls = [(op.shapes, op.grads) for op in count.heavy_ops if op.kind == "matmul"]
    assert matmuls == [(((2, 4), (4, 2)), (True, True))]


@pytest.mark.parametrize("on_logits", [False, True], ids=["on-probabilities", "on-logits"])
def test_the_flop_counter_notes_a_loss_on_probabilities_and_its_line(on_logits: bool) -> None:
    # given: a linear model's steps, the loss BCELoss on its sigmoid's output or BCEWithLogitsLoss on its logits
    model, x, y = torch.nn.Linear(4, 1), torch.randn(8, 4), torch.rand(8, 1).round()
    functional = torch.nn.functional
    steps, collector = FakeSteps(), SpeedOfLightCollector(start=2)
    collector.follow(steps)
    for index in (1, 2, 3):
        steps.listener(index)
        out = model(x)
        loss = functional.binary_cross_entropy_with_logits(out, y) if on_logits else \
            functional.binary_cross_entropy(torch.sigmoid(out), y)
        loss.backward()
    count = collector.stop().payload
    # then: the one on probabilities is noted with its dtype and this file's line; it counts no FLOPs
    assert isinstance(count, FlopCount)
    assert "binary_cross_entropy" not in count.flops_by_op
    if on_logits:
        assert count.probability_loss is None
        return
    loss_site = count.probability_loss.called_at  # type: ignore[union-attr]
    assert count.probability_loss.dtype == "float32"  # type: ignore[union-attr]
    assert loss_site is not None and loss_site.file.endswith("test_cpu_mixed_precision.py")
    assert loss_site.code == "functional.binary_cross_entropy(torch.sigmoid(out), y)"


def test_the_cpu_peak_probe_times_the_heavy_shapes_in_both_only_where_bfloat16_is_faster(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shapes = (HeavyOp("conv", ((2, 4, 8, 8), (8, 4, 3, 3)), (1, 1), (1, 1), (1, 1), 1, grads=(False, True), flops=3,
                      kind_flops=4),
              HeavyOp("conv", ((2, 8, 8, 8), (8, 4, 4, 4)), (2, 2), (1, 1), (1, 1), 1, True, (0, 0), (True, True), 1,
                      4),
              HeavyOp("matmul", ((3, 4, 5), (3, 5, 6)), flops=1, kind_flops=1))
    count = FlopCount(flops_per_step=10**6, flops_by_op={"convolution": 10**6}, step=10, dtype="float32", cuda=False,
                      flops_by_dtype={"float32": 10**6}, heavy_ops=shapes)
    monkeypatch.setattr(cpu_peak, "time_matmuls", lambda *a, **k: cpu_peak.MatmulTiming(1e11, 1024, 5))
    monkeypatch.setattr(cpu_peak, "bfloat16_faster", lambda torch, clock: True)
    peak = CpuPeakProbe().run(Path("."), post_run_facts(payloads={"flops": count})).payload
    # each in float32 and under autocast, its pages kept, then faulted in afresh
    assert [op for op, *_ in peak.autocast] == list(shapes)
    assert all(len(seconds) == 4 and min(seconds) > 0 for _, *seconds in peak.autocast)
    assert "the step's heaviest shapes, float32 against bfloat16 autocast: a 3x3 convolution" in peak.source
    # on a CPU whose bfloat16 is slower, nothing is timed in it (there, many times slower: too long to time)
    monkeypatch.setattr(cpu_peak, "bfloat16_faster", lambda torch, clock: False)
    slow = CpuPeakProbe().run(Path("."), post_run_facts(payloads={"flops": count})).payload
    assert slow.autocast == () and "bfloat16 matmuls no faster than float32 ones here" in slow.source


def test_a_timed_shape_runs_as_the_step_ran_it() -> None:
    # a convolution whose weight needed a gradient, forward and backward; a batched matmul of tensors that needed
    # none, forward only; each from float32 tensors, in float32 or under autocast
    conv = HeavyOp("conv", ((2, 4, 8, 8), (8, 4, 3, 3)), (1, 1), (1, 1), (1, 1), 1, grads=(False, True))
    bmm = HeavyOp("matmul", ((3, 4, 5), (3, 5, 6)))
    for op in (conv, bmm):
        for autocast in (False, True):
            assert time_one(torch, op, autocast, repeats=1, budget_s=0.01) > 0
