"""Speed of light: one training step's FLOPs counted by the flops collector, the GPU peak table, MFU and the
verdict's what-if estimate."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from conftest import make_record
from gpuscope.diagnose import analyze
from gpuscope.reduce.peaks import find_gpu, gpu_peak_flops
from gpuscope.diagnose.speed import complete_speed_of_light, headroom_text, what_if
from gpuscope.reduce.fields import speed_of_light
from gpuscope.collect.captures import FlopCount
from gpuscope.collect.collectors import cpu_peak, flops
from gpuscope.collect.collectors.cpu_peak import CpuPeakProbe, MatmulTiming, fitting_size, time_conv, time_matmuls
from gpuscope.collect.collectors.flops import SpeedOfLightCollector
from gpuscope.collect.framework.schedule import Window
from gpuscope.record import Breakdown, CollectorStatus, RunMeta, RunRecord, SpeedOfLight, StepSample, Steps, Verdict
from gpuscope.report.render import render_report
from gpuscope.session import post_run_facts
from gpuscope.diagnose.words import flop_text

RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "records"

torch = pytest.importorskip("torch")


class FakeSteps:
    """The part of the steps collector the flops collector uses."""

    def __init__(self, evaluated: set[int] | None = None) -> None:
        self.windows: list[str] = []
        self.evaluated = evaluated or set()  # steps in which the model ran forward without gradients

    def add_step_listener(self, listener: Any) -> None:
        self.listener = listener

    def remove_step_listener(self, listener: Any) -> None:
        self.unfollowed = True

    def cuda_in_use(self) -> bool:
        return False

    def window_opened(self) -> None:
        self.windows.append("open")

    def window_closed(self) -> None:
        self.windows.append("closed")

    def step_evaluated(self, index: int) -> bool:
        return index in self.evaluated

    def closure_calls(self) -> int:
        return 0  # (as a loop passing no closure to its optimizer)

    def on_closure_end(self, listener: Any) -> None:
        pass

    def off_closure_end(self, listener: Any) -> None:
        pass

    def timed(self, closure: Any) -> Any:
        return closure


def test_flops_of_an_mlp_training_step_match_a_hand_count() -> None:
    # given: a two-layer MLP, batch 5, trained with SGD, its steps followed by the flops collector at step 3
    batch, d_in, d_hidden, d_out = 5, 8, 16, 4
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(d_in, d_hidden), torch.nn.ReLU(), torch.nn.Linear(d_hidden, d_out))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(batch, d_in), torch.randn(batch, d_out)
    steps = FakeSteps()
    collector = SpeedOfLightCollector(start=3)
    collector.follow(steps)

    # when: steps 2, 3 and 4 begin around training steps
    for index in (2, 3, 4):
        steps.listener(index)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    result = collector.stop()
    peak = CpuPeakProbe().run(Path("."), post_run_facts(payloads={"flops": result.payload}))
    sol = speed_of_light(result.payload, peak.payload)

    # then: torch's convention, 2 FLOPs (a multiply and an add) per term of a matmul: forward 2*B*in*out per
    # Linear (addmm; the bias add is not counted); backward the weight gradient 2*B*in*out per Linear and the input
    # gradient 2*B*in*out only where the input needs a gradient (not the first layer's input, the data)
    forward = 2 * batch * d_in * d_hidden + 2 * batch * d_hidden * d_out
    backward = 2 * batch * d_in * d_hidden + 2 * (2 * batch * d_hidden * d_out)
    assert result.status.status == "ok" and peak.status.status == "ok"
    assert sol.flops_per_step == forward + backward
    assert sol.flops_by_op == {"addmm": forward, "mm": backward}
    assert sol.step == 3 and sol.dtype == "float32"
    assert steps.windows == ["open", "closed"]  # the counted step is left out of the figures
    assert sol.peak_measured and sol.peak_flops_per_s > 0


def test_a_warning_the_script_shows_once_per_line_shows_once_over_the_counted_step(shown: list[str]) -> None:
    # given steps that each warn from the same line, as a deprecated call does, the FLOPs counted on step 2
    model, x = torch.nn.Linear(4, 2), torch.randn(3, 4)
    steps, collector = FakeSteps(), SpeedOfLightCollector(start=2)
    collector.follow(steps)
    # when steps 1-3 run
    for index in (1, 2, 3):
        steps.listener(index)
        model(x).sum().backward()
        warnings.warn("the script's own deprecation", UserWarning)
    assert collector.stop().status.status == "ok"
    # then the user saw it once, as under python: the counter's opening forgot no warning already shown
    assert shown == ["the script's own deprecation"]


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_sparse_matmul_counts_the_elements_its_matrix_stores_not_every_element(layout: str) -> None:
    # given: a graph convolution's step (pytorch/examples' GCN): X W, then the sparse adjacency times that, 500 nodes
    # and 2,000 stored entries, trained with SGD; the collector counting step 1
    nodes, d_in, d_out, stored = 500, 32, 8, 2000
    torch.manual_seed(0)
    index = torch.stack([torch.randperm(nodes * nodes)[:stored] // nodes, torch.randint(0, nodes, (stored,))])
    adjacency = torch.sparse_coo_tensor(index, torch.rand(stored), (nodes, nodes), check_invariants=True)
    adjacency = adjacency.coalesce()
    if layout == "csr":
        adjacency = adjacency.to_sparse_csr()
    stored = adjacency._nnz()  # fewer where two random entries fell on one place
    features = torch.randn(nodes, d_in)
    weight = torch.nn.Parameter(torch.randn(d_in, d_out))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    steps = FakeSteps()
    collector = SpeedOfLightCollector(start=1)
    collector.follow(steps)
    for step in (0, 1, 2):
        steps.listener(step)
        torch.mm(adjacency, features @ weight).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    result = collector.stop()

    # then: the dense matmuls 2 x M x N x K (X W forward, the weight's gradient), the sparse ones 2 x stored x N
    # (forward A (XW); backward A^T times the output's gradient), where torch's formulas count 2 x 500 x 500 x 8
    dense = 2 * (2 * nodes * d_in * d_out)
    sparse = 2 * (2 * stored * d_out)
    assert result.status.status == "ok", result.status
    assert result.payload.flops_per_step == dense + sparse
    # and the sparse ones are told apart: no dense matmul peak describes them
    assert result.payload.sparse_flops == sparse and result.payload.flops_by_dtype == {"float32": dense + sparse}


def test_a_step_of_sparse_matmuls_gets_no_what_if_at_the_dense_peak() -> None:
    # given: the full-batch GCN fixture, compute-bound, 72% of its counted FLOPs in sparse matmuls whose op-table rows
    # (aten::addmm, aten::mm) are the dense ones': at the dense peak they read "3.05x faster"
    from gpuscope.report.summary import summary_lines

    record = RunRecord.from_json(json.loads((RECORDS / "full_batch_gcn.json").read_text()))
    sol = record.speed_of_light
    assert sol is not None and sol.sparse_flops > 0.7 * sol.flops_per_step
    analyzed = analyze(record)
    # then: none is given, and the speed of light says why
    assert analyzed.verdict.bound == "compute" and analyzed.what_if is None
    summary = "\n".join(summary_lines(analyzed, Path("run")))
    assert "72% of them in matmuls with a sparse operand (counted by the elements it stores), whose gathers no dense " \
           "matmul peak describes: no what-if at the peak" in summary
    page = render_report(analyzed, inline_plotly=False)
    assert "Of those FLOPs, 72% of them in matmuls with a sparse operand" in page
    # and with the same FLOPs dense, the what-if at the peak is back
    dense = dataclasses.replace(record, speed_of_light=dataclasses.replace(sol, sparse_flops=0))
    assert analyze(dense).what_if is not None


def count_flops(indices: range, test_pass_at: set[int]) -> tuple[FakeSteps, Any]:
    """The flops collector (counting step 3) over training steps of a 2-layer MLP (batch 5, 8 -> 16 -> 4), as the
    steps collector tells them; the steps in ``test_pass_at`` end with a test pass under no_grad (batch 50)."""
    steps = FakeSteps(evaluated=set(test_pass_at))
    collector = SpeedOfLightCollector(start=3)
    collector.follow(steps)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for index in indices:
        steps.listener(index)
        torch.nn.functional.mse_loss(model(torch.randn(5, 8)), torch.randn(5, 4)).backward()
        optimizer.step()
        optimizer.zero_grad()
        if index in test_pass_at:
            with torch.no_grad():
                model(torch.randn(50, 8))
    steps.listener(indices[-1] + 1)
    return steps, collector.stop()


TRAINING_STEP_FLOPS = 2 * 5 * 8 * 16 + 2 * 5 * 16 * 4 + 2 * 5 * 8 * 16 + 2 * (2 * 5 * 16 * 4)
"""The MLP's training step, as in the hand count above."""
TEST_PASS_FLOPS = 2 * 50 * 8 * 16 + 2 * 50 * 16 * 4
"""Its forward on 50 samples."""


def test_a_counted_step_that_held_a_test_pass_is_counted_again_on_a_training_step() -> None:
    # given: the counted step, 3, ends an epoch: a test pass follows its training step
    steps, result = count_flops(range(2, 8), test_pass_at={3})
    # then: step 5 (step 4 was under way) is counted instead, the training step alone, and both stay out of the figures
    assert result.status.status == "ok"
    assert (result.payload.step, result.payload.flops_per_step) == (5, TRAINING_STEP_FLOPS)
    assert steps.windows == ["open", "closed", "open", "closed"]


def test_a_loop_whose_every_step_runs_the_model_without_gradients_keeps_its_last_count() -> None:
    _, result = count_flops(range(2, 16), test_pass_at=set(range(2, 16)))
    # counted on step 3, then again on 5, 7 and 9 (three more tries), and kept, test pass and all
    assert result.status.status == "ok" and result.payload.step == 9
    assert result.payload.flops_per_step == TRAINING_STEP_FLOPS + TEST_PASS_FLOPS


def test_a_count_that_took_long_is_not_made_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # given: counts that take longer than RECOUNT_MAX_S (an LBFGS step of 670k ops took 6-10 s to count)
    monkeypatch.setattr(flops, "RECOUNT_MAX_S", 0.0)
    _, result = count_flops(range(2, 16), test_pass_at=set(range(2, 16)))
    # then: step 3's count is kept, test pass and all, at the cost of one count
    assert result.status.status == "ok" and result.payload.step == 3
    assert result.payload.flops_per_step == TRAINING_STEP_FLOPS + TEST_PASS_FLOPS


def test_a_run_that_ends_before_a_step_without_a_test_pass_keeps_the_one_counted() -> None:
    _, result = count_flops(range(2, 4), test_pass_at={3})
    assert result.status.status == "ok" and result.payload.step == 3
    assert result.payload.flops_per_step == TRAINING_STEP_FLOPS + TEST_PASS_FLOPS


def test_a_run_that_ends_before_the_counted_step_says_so() -> None:
    steps = FakeSteps()
    collector = SpeedOfLightCollector(start=10)
    collector.follow(steps)
    steps.listener(0)
    result = collector.stop()
    assert result.status.status == "unavailable" and "step 10" in result.status.reason


def test_the_cpu_peak_benchmark_measures_a_positive_rate() -> None:
    assert time_matmuls(torch, torch.float32, size=128, repeats=3).flops_per_s > 0


def test_the_cpu_peak_benchmark_shrinks_a_matmul_that_would_overrun_its_budget() -> None:
    # given: one 256x256 matmul takes 33.5 ms (1 GFLOP/s: bfloat16 on a CPU without bfloat16 instructions), so a
    # 1024x1024 one would take 2.1 s and a 512x512 one 0.27 s: over a quarter of the 1 s budget
    ticks = iter([0.0, 0.0335])
    assert fitting_size(torch, torch.float32, 1024, 1.0, lambda: next(ticks)) == 256
    # at 84 GFLOP/s (float32 on one core) the 1024x1024 matmul takes 26 ms: kept
    ticks = iter([0.0, 0.0004])
    assert fitting_size(torch, torch.float32, 1024, 1.0, lambda: next(ticks)) == 1024


def test_on_a_bf16_run_the_cpu_peak_probe_times_float32_matmuls_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a CPU run whose counted matmuls were bfloat16, and matmul timings of 1 GFLOP/s in bfloat16 (512x512)
    # and 80 GFLOP/s in float32
    timed: list[tuple[Any, float]] = []

    def fake_timing(torch_: Any, dtype: Any, size: int = 1024, repeats: int = 5, budget_s: float = 1.0,
                    clock: Any = None) -> MatmulTiming:
        timed.append((dtype, budget_s))
        return MatmulTiming(1e9, 512, 3) if dtype is torch.bfloat16 else MatmulTiming(80e9, 1024, 5)

    monkeypatch.setattr(cpu_peak, "time_matmuls", fake_timing)
    count = FlopCount(flops_per_step=10**9, flops_by_op={"mm": 10**9}, step=3, dtype="bfloat16", cuda=False)
    # when
    peak = CpuPeakProbe().run(Path("."), post_run_facts(payloads={"flops": count})).payload
    # then: both rates, each within its own budget (the step's dtype at the probe's start and end), within the probe's
    assert [dtype for dtype, _ in timed] == [torch.bfloat16, torch.float32, torch.bfloat16]
    assert sum(budget for _, budget in timed) <= CpuPeakProbe.budget_s
    assert peak.flops_per_s == 1e9 and peak.float32_flops_per_s == 80e9
    assert "the fastest of 3 512x512 bfloat16 matmuls" in peak.source
    assert "float32 for comparison: 80.0 GFLOP/s, the fastest of 5 1024x1024 float32 matmuls" in peak.source
    assert speed_of_light(count, peak).float32_flops_per_s == 80e9
    # a float32 run is timed once, in float32
    timed.clear()
    peak = CpuPeakProbe().run(Path("."), post_run_facts(payloads={"flops": dataclasses.replace(
        count, dtype="float32")})).payload
    assert [dtype for dtype, _ in timed] == [torch.float32] * 2 and peak.float32_flops_per_s is None


def test_a_matmul_benchmark_slower_than_the_run_itself_is_timed_again_and_the_fastest_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a float32 step of 14.1 GFLOP in a 100 ms median step (141 GFLOP/s), and a benchmark whose first five
    # matmuls came out at 132 GFLOP/s (a slow spell of the machine), the next ones at 190, the last at 170
    timed: list[tuple[int, float]] = []
    rates = iter([132e9, 190e9, 170e9])

    def fake_timing(torch_: Any, dtype: Any, size: int = 1024, repeats: int = 5, budget_s: float = 1.0,
                    clock: Any = None) -> MatmulTiming:
        timed.append((repeats, budget_s))
        return MatmulTiming(next(rates), 1024, repeats)

    monkeypatch.setattr(cpu_peak, "time_matmuls", fake_timing)
    count = FlopCount(flops_per_step=141 * 10**8, flops_by_op={"mm": 141 * 10**8}, step=3, dtype="float32",
                      cuda=False)
    # when
    peak = CpuPeakProbe().run(Path("."), post_run_facts(median_s=0.1, payloads={"flops": count})).payload
    # then: timed again at once, longer, and once more at the probe's end, within its budget; the fastest kept, each
    # timing said
    first, retry = (cpu_peak.BENCH_REPEATS, cpu_peak.BENCH_BUDGET_S), (cpu_peak.RETRY_REPEATS, cpu_peak.RETRY_BUDGET_S)
    assert timed == [first, retry, first]
    assert sum(budget for _, budget in timed) <= CpuPeakProbe.budget_s
    assert peak.flops_per_s == 190e9
    assert peak.source.startswith(
        "measured here after the run: the fastest of 50 1024x1024 float32 matmuls on ")
    assert ("(132.0 GFLOP/s at the probe's start; under the run's own 141.0 GFLOP/s, so 50 more: 190.0 GFLOP/s; "
            "170.0 GFLOP/s at its end)") in peak.source
    # a benchmark at or above the run's rate is not timed again at once; nor is a run with no steady step to compare
    for median_s in (0.2, None):
        timed.clear()
        rates = iter([132e9, 170e9])
        peak = CpuPeakProbe().run(Path("."), post_run_facts(median_s=median_s, payloads={"flops": count})).payload
        assert timed == [first, first] and peak.flops_per_s == 170e9


def test_the_counted_step_keeps_its_flops_by_dtype() -> None:
    # given: a float32 teacher convolution without gradients, and a student's trained under bf16 autocast
    torch.manual_seed(0)
    teacher, student = torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(3, 4, 3)
    x = torch.randn(2, 3, 8, 8)
    steps, collector = FakeSteps(), SpeedOfLightCollector(start=1)
    collector.follow(steps)
    # when: step 1 is counted
    for index in (0, 1, 2):
        steps.listener(index)
        with torch.no_grad():
            teacher(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = student(x)
        out.float().sum().backward()
    count = collector.stop().payload
    # then: each dtype's FLOPs (the teacher's forward 2x3x8x9x36x2, the student's forward 2x3x4x9x36x2 and its
    # weight gradient as much), adding up to the step's
    assert count.flops_by_dtype == {"float32": 31104, "bfloat16": 31104}
    assert sum(count.flops_by_dtype.values()) == count.flops_per_step


def test_the_cpu_peak_probe_times_a_convolution_in_bf16_and_float32_where_the_step_ran_both(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a step of float32 and bfloat16 FLOPs with convolutions (the matmul benchmark faked: not under test)
    monkeypatch.setattr(cpu_peak, "time_matmuls", lambda *args, **kwargs: MatmulTiming(80e9, 1024, 5))
    count = FlopCount(flops_per_step=10**9, flops_by_op={"convolution": 10**9}, step=3, dtype="float32", cuda=False,
                      flops_by_dtype={"float32": 9 * 10**8, "bfloat16": 10**8})
    # when
    peak = CpuPeakProbe().run(Path("."), post_run_facts(payloads={"flops": count})).payload
    # then: both rates measured, and said where they come from
    assert set(peak.conv_flops_per_s) == {"bfloat16", "float32"}
    assert all(rate > 0 for rate in peak.conv_flops_per_s.values())
    assert "a 3x3 convolution of 16 channels on 4 images of 16x16: bfloat16 " in peak.source
    assert speed_of_light(count, peak).conv_flops_per_s == peak.conv_flops_per_s
    # and not where the step ran no convolution, or no FLOP in bfloat16 / float16
    for other in (dataclasses.replace(count, flops_by_op={"mm": 10**9}),
                  dataclasses.replace(count, flops_by_dtype={"float32": 10**9})):
        assert CpuPeakProbe().run(Path("."), post_run_facts(payloads={"flops": other})).payload.conv_flops_per_s == {}


def test_the_convolution_benchmark_stops_at_its_budget() -> None:
    # a clock that moves 0.1 s at each reading: each convolution is timed at 0.1 s, and after the second of the 5
    # asked for, 0.6 s have passed since the first began, past the 0.35 s budget
    ticks = iter(i * 0.1 for i in range(100))
    rate = time_conv(torch, torch.float32, repeats=5, budget_s=0.35, clock=lambda: next(ticks))
    assert rate == pytest.approx(2 * 4 * 16 * 16 * 9 * 16 * 16 / 0.1)
    assert next(ticks) == pytest.approx(0.7)  # two timings read the clock 6 times after the start


@pytest.mark.parametrize(("name", "dtype", "model", "tflops"), [
    ("NVIDIA H100 80GB HBM3", "bfloat16", "H100 SXM", 989.5),
    ("NVIDIA H100 PCIe", "float16", "H100 PCIe", 756),
    ("NVIDIA H100 NVL", "tfloat32", "H100 NVL", 417.5),
    ("NVIDIA H200", "bfloat16", "H200", 989.5),
    ("NVIDIA A100-SXM4-80GB", "tfloat32", "A100 SXM", 156),
    ("NVIDIA A100 80GB PCIe", "float32", "A100 PCIe", 19.5),
    ("NVIDIA L40S", "bfloat16", "L40S", 362.05),
    ("NVIDIA L4", "float16", "L4", 121),
    ("NVIDIA A10", "float32", "A10", 31.2),
    ("Tesla T4", "float16", "T4", 65),
    ("Tesla V100-SXM2-16GB", "float16", "V100 SXM2", 125),
    ("NVIDIA GeForce RTX 4090", "bfloat16", "RTX 4090", 165.2),
    ("NVIDIA GeForce RTX 3090", "float32", "RTX 3090", 35.6),
    ("NVIDIA H100 80GB HBM3", "float64", "H100 SXM", 67),  # FP64 Tensor Cores
    ("NVIDIA A100-SXM4-40GB", "float64", "A100 SXM", 19.5),
    ("Tesla V100-PCIE-32GB", "float64", "V100 PCIe", 7),  # no FP64 Tensor Cores: the FP64 rate
])
def test_gpu_peaks_are_looked_up_by_model_and_dtype(name: str, dtype: str, model: str, tflops: float) -> None:
    peak, source = gpu_peak_flops(name, dtype)
    assert find_gpu(name).name == model  # type: ignore[union-attr]
    assert peak == pytest.approx(tflops * 1e12)
    assert "datasheet" in source or "whitepaper" in source


def test_an_unknown_gpu_or_dtype_has_no_peak_and_says_why() -> None:
    assert gpu_peak_flops("AMD Instinct MI300X", "bfloat16") == (None, "unknown GPU model 'AMD Instinct MI300X': "
                                                                        "no peak in gpuscope's table")
    peak, why = gpu_peak_flops("Tesla T4", "bfloat16")
    assert peak is None and "no bfloat16 peak for the T4" in why
    assert gpu_peak_flops("Tesla T4", "float64")[0] is None  # its datasheet gives no FP64 figure
    assert find_gpu("NVIDIA A10G") is None  # not the A10


def compute_bound_record(**overrides: Any) -> Any:
    sol = SpeedOfLight(flops_per_step=6_000_000_000, peak_flops_per_s=100e9, peak_measured=True, dtype="float32",
                       peak_source="measured")
    return make_record(steps=Steps(count=20, median_s=0.2, total=25, source="optimizer"), speed_of_light=sol,
                       verdict=Verdict("compute", 0.9, ("x 1",)), **overrides)


def test_mfu_is_achieved_flops_over_the_peak_and_leads_the_compute_headline() -> None:
    record = compute_bound_record()
    sol = complete_speed_of_light(record)
    assert sol.achieved_flops_per_s == pytest.approx(30e9)  # 6 GFLOP / 0.2 s
    assert sol.mfu == pytest.approx(0.3)
    record = dataclasses.replace(record, speed_of_light=sol)
    assert headroom_text(record) == "at 30% of this machine's measured float32 matmul peak"
    gpu = dataclasses.replace(record, device="cuda", speed_of_light=dataclasses.replace(
        sol, peak_measured=False, device_name="NVIDIA H100 80GB HBM3", dtype="bfloat16"))
    assert headroom_text(gpu) == "at 30% of the H100 SXM's bfloat16 peak"


def test_flops_of_a_run_with_no_unprofiled_step_give_no_achieved_rate_and_say_why() -> None:
    # given a run of three long steps, every one past the warm-up profiled, its FLOPs counted
    record = dataclasses.replace(compute_bound_record(), steps=Steps(count=0, total=3, warmup=1, profiled=2))
    # then the count stands, with no rate, and the note says what it would need
    sol = complete_speed_of_light(record)
    assert sol is not None and sol.flops_per_step == 6e9 and sol.achieved_flops_per_s is None and sol.mfu is None
    assert sol.note == "no step ran unprofiled (a run of a few long steps): the achieved rate and MFU need one"


def test_flops_of_three_long_lbfgs_steps_are_held_against_the_traced_step_as_the_verdict_reads_it() -> None:
    # given three LBFGS steps, every one past the warm-up profiled: step 2 traced up to the end of its first closure
    # call (1.2 s, of 4 calls), its wall 9.3 s with the trace's export and the FLOP count of its second call
    from gpuscope.record import OpProfile, Window

    sample = StepSample(index=(0, 1, 2), wall_s=(4.1, 5.0, 9.3), status=("warmup", "profiled", "profiled"),
                        phases_s={"forward": (1.0, 1.2, 1.3), "backward": (2.5, 3.0, 3.2)})
    steps = Steps(count=0, total=3, warmup=1, profiled=2, source="optimizer", sample=sample)
    ops = OpProfile(window=Window(2, 2), steps=1, closure_calls=4, closure_call_s=1.2)
    record = dataclasses.replace(compute_bound_record(), steps=steps, op_profile=ops)
    # then its 6 GFLOP are over the 4 x 1.2 s the verdict takes the step as: 1.25 GFLOP/s, at least
    sol = complete_speed_of_light(record)
    assert sol.achieved_flops_per_s == pytest.approx(6e9 / 4.8) and sol.mfu == pytest.approx(1.25e9 / 100e9)
    assert sol.note.startswith("no step ran unprofiled (a run of a few long steps): the achieved rate and MFU are "
                               "over the profiled step 2 (its time taken as its first call of the optimizer's closure")
    assert sol.note.endswith("slowed by the profiler: at least these")
    # and a compute-bound verdict's what-if is the step at the peak against that step
    estimate = what_if(dataclasses.replace(record, speed_of_light=sol), record.verdict)
    assert estimate is not None and estimate.step_s == pytest.approx(0.06) and estimate.speedup == pytest.approx(80)


def test_flops_counted_on_a_step_unlike_the_steady_ones_give_no_achieved_rate_and_say_why() -> None:
    # given: a first phase of 200 ms steps (an encoder) and a steady phase of 5 ms ones; the FLOPs of step 12 counted
    base = compute_bound_record()
    index = tuple(range(40))
    sample = StepSample(index=index, wall_s=tuple(0.2 if i < 20 else 0.005 for i in index))
    steps = dataclasses.replace(base.steps, median_s=0.005, warmup=20, sample=sample)
    record = dataclasses.replace(base, steps=steps,
                                 speed_of_light=dataclasses.replace(base.speed_of_light, step=12))
    # when
    sol = complete_speed_of_light(record)
    # then: 6 GFLOP over 5 ms would be 1.2 TFLOP/s, twelve times the machine's peak: nothing is worked out of it
    assert sol is not None and sol.achieved_flops_per_s is None and sol.mfu is None
    assert ("the steady steps around step 12, whose FLOPs were counted (median 200.0 ms), are 40x longer than the "
            "steady-state steps (median 5.0 ms)") in sol.note
    assert "--skip-steps 20" in sol.note
    # a counted step like the steady ones is used as before
    like = dataclasses.replace(record, speed_of_light=dataclasses.replace(record.speed_of_light, step=30))
    assert complete_speed_of_light(like).achieved_flops_per_s == pytest.approx(6e9 / 0.005)  # type: ignore[union-attr]


def test_flops_counted_among_steps_half_the_median_give_no_achieved_rate() -> None:
    # given: a reinforcement-learning loop whose episodes (its steps) lengthen from 5 ms by 1 ms each, 60 of them
    # (median 34.5 ms); step 10's FLOPs counted, the counter slowing it to 30 ms, the steady steps after it 16-18 ms
    base = compute_bound_record()
    index = tuple(range(60))
    wall = tuple(0.030 if i == 10 else 0.005 + 0.001 * i for i in index)
    status = tuple("profiled" if i in (7, 8, 9, 10) else "steady" for i in index)
    steps = dataclasses.replace(base.steps, median_s=0.0345, sample=StepSample(index=index, wall_s=wall, status=status))
    record = dataclasses.replace(base, steps=steps, speed_of_light=dataclasses.replace(base.speed_of_light, step=10))
    # then a short episode's FLOPs are not put over the median episode's time (the counted step's own time, within 4x
    # of the median, gave a rate 2-3x low)
    sol = complete_speed_of_light(record)
    assert sol is not None and sol.achieved_flops_per_s is None and sol.mfu is None
    assert "the steady steps around step 10, whose FLOPs were counted (median 17.0 ms), are 2x shorter" in sol.note


def test_a_counted_step_slowed_by_the_counter_alone_among_steady_steps_gives_the_achieved_rate() -> None:
    # given: an LBFGS loop of 1.56 s steps of many small ops, whose counted step (14) took 10.5 s: every op through
    # the FLOP counter's Python; the steps before it are steady at the median's pace (12 was profiled too)
    base = compute_bound_record()
    index = tuple(range(15))
    wall = tuple(10.5 if i == 14 else 3.0 if i in (10, 12) else 1.56 for i in index)
    status = tuple("profiled" if i in (10, 12, 14) else "steady" for i in index)
    steps = dataclasses.replace(base.steps, median_s=1.56, sample=StepSample(index=index, wall_s=wall, status=status))
    record = dataclasses.replace(base, steps=steps, speed_of_light=dataclasses.replace(base.speed_of_light, step=14))
    # then the count is a steady step's: 6 GFLOP over the 1.56 s median step
    sol = complete_speed_of_light(record)
    assert sol is not None and sol.note == ""
    assert sol.achieved_flops_per_s == pytest.approx(6e9 / 1.56)


def test_a_measured_peak_below_what_the_run_itself_did_is_raised_to_the_runs_rate() -> None:
    # given: the run's steps did 30 GFLOP/s, and the matmul benchmark after it measured only 25 (seen in CI: the
    # shared machine's load slowed the benchmark, and the run beat its own "peak")
    record = compute_bound_record()
    record = dataclasses.replace(record, speed_of_light=dataclasses.replace(record.speed_of_light,
                                                                             peak_flops_per_s=25e9))
    sol = complete_speed_of_light(record)
    # then: the peak is at least the run's own rate, MFU is 1, and the record says why
    assert sol.peak_flops_per_s == pytest.approx(30e9) and sol.mfu == pytest.approx(1.0)
    assert "above the 25.0 GFLOP/s the benchmark measured" in sol.peak_source
    # a datasheet peak (a GPU's) is never raised, and a rate above it gives no MFU: the figures are wrong somewhere
    gpu = dataclasses.replace(record.speed_of_light, peak_measured=False)
    above = complete_speed_of_light(dataclasses.replace(record, speed_of_light=gpu))
    assert above.peak_flops_per_s == pytest.approx(25e9) and above.mfu is None
    assert "would be 120% of the" in above.note


def test_a_measured_peak_below_the_runs_own_matmuls_rate_is_raised_to_it() -> None:
    # given: a CPU bfloat16-autocast MLP (tests/fixtures/records/amp_cpu.py) whose 2.16 GFLOP step took 9.14 ms,
    # its matmuls 5.86 ms of it in the trace (aten::mm 3.54, aten::addmm 2.31 ms a step), and the benchmark after the
    # run measuring 217.7 GFLOP/s: this 2-vCPU VM ran it at half its rate (1024x1024 bfloat16 matmuls measure 410-440
    # GFLOP/s here, and 213-222 in some processes)
    import json

    from gpuscope.record import RunRecord

    record = RunRecord.from_json(json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "records" /
                                             "amp_cpu.json").read_text()))
    benchmark = dataclasses.replace(record.speed_of_light, peak_flops_per_s=217.7e9, achieved_flops_per_s=None,
                                    mfu=None, peak_source="measured here after the run: the fastest of 5 1024x1024 "
                                    "bfloat16 matmuls on 2 threads")
    sol = complete_speed_of_light(dataclasses.replace(record, speed_of_light=benchmark))
    # then the peak is the run's own matmuls' rate, 2.16 GFLOP over 5.86 ms, not the step's 236.6 GFLOP/s: MFU 64%,
    # where raising it to the step's own rate said 100%
    assert sol.peak_flops_per_s == pytest.approx(369.3e9, rel=1e-3)
    assert sol.mfu == pytest.approx(0.64, abs=0.005)
    assert sol.peak_source.endswith("; raised to the run's own matmuls' 369.3 GFLOP/s (their counted FLOPs over "
                                    "their time in trace.json), above the 217.7 GFLOP/s the benchmark measured")
    # and a run whose matmuls ran slower than the benchmark keeps the benchmark's peak
    slow = dataclasses.replace(benchmark, peak_flops_per_s=400e9)
    assert complete_speed_of_light(dataclasses.replace(record, speed_of_light=slow)).peak_flops_per_s == 400e9


@pytest.mark.parametrize("factor", [1.2, 1.45])
def test_a_measured_peak_below_the_runs_rate_within_the_noise_factor_is_raised(factor: float) -> None:
    # given: the benchmark after the run measured the run's 30 GFLOP/s over ``factor``: within the 1.5x a loaded
    # machine can slow it by (thresholds.MEASURED_PEAK_NOISE)
    record = compute_bound_record()
    record = dataclasses.replace(record, speed_of_light=dataclasses.replace(record.speed_of_light,
                                                                             peak_flops_per_s=30e9 / factor))
    sol = complete_speed_of_light(record)
    assert sol.peak_flops_per_s == pytest.approx(30e9) and sol.mfu == pytest.approx(1.0)


@pytest.mark.parametrize("factor", [1.6, 4.2])
def test_a_measured_peak_far_below_the_runs_own_rate_is_not_its_peak_and_gives_no_mfu(factor: float) -> None:
    # given: like a TransformerEncoder under CPU bf16 autocast: its steps did 4.0 GFLOP/s where the bfloat16
    # matmul benchmark after the run measured 4.0 / 4.2 = 0.95 GFLOP/s (its matmuls are not the benchmark's)
    peak = 1_692_401_664 / 0.42 / factor
    sol = SpeedOfLight(flops_per_step=1_692_401_664, peak_flops_per_s=peak, peak_measured=True, dtype="bfloat16",
                       peak_source="measured here after the run: the fastest of 1 1024x1024 bfloat16 matmuls")
    record = make_record(steps=Steps(count=50, median_s=0.42, total=60, source="optimizer"), speed_of_light=sol,
                         verdict=Verdict("compute", 0.95, ("aten::mm takes 72% of op time",)))
    # when
    completed = complete_speed_of_light(record)
    # then: the achieved rate is given, the benchmark's figure is kept, no MFU, and the record says why
    assert completed.achieved_flops_per_s == pytest.approx(4.03e9, rel=1e-3)
    assert completed.peak_flops_per_s == pytest.approx(peak) and completed.mfu is None
    assert f"not this run's peak: the run did 4.0 GFLOP/s, {factor:.1f}x the" in completed.peak_source
    # and nothing says "at 100% of peak": not the headline, the what-if, the summary or the report
    record = dataclasses.replace(record, speed_of_light=completed)
    assert headroom_text(record) is None
    assert what_if(record, record.verdict) is None
    from gpuscope.report.render import render_report
    from gpuscope.report.summary import summary_lines

    summary = "\n".join(summary_lines(record, Path("run")))
    assert summary.startswith("gpuscope: CPU-compute-bound (confidence 0.95)")
    assert "achieved 4.03 GFLOP/s; this machine's bfloat16 matmul benchmark measured" in summary
    assert "not this run's peak: no MFU" in summary and "peak" not in summary.splitlines()[0]
    html = render_report(record, inline_plotly=False)
    assert "no model FLOPs utilisation is given" in html and "model FLOPs utilisation," not in html


def test_what_if_of_a_compute_bound_run_is_the_step_at_the_peak() -> None:
    record = compute_bound_record()
    estimate = what_if(record, record.verdict)
    assert estimate.step_s == pytest.approx(0.06) and estimate.speedup == pytest.approx(0.2 / 0.06)
    assert "speed of light" in estimate.explanation


def matmul_part_record(flops_by_op: dict[str, int], device: str = "cpu") -> Any:
    """A compute-bound CPU run of 0.2 s steps whose 6 GFLOP a step (at a 100 GFLOP/s peak: 0.06 s) are counted in
    ``flops_by_op``, its op table over 2 profiled steps: aten::mm 0.16 s and aten::addmm 0.04 s (0.1 s a step), the
    step's other ops 0.12 s."""
    from gpuscope.record import OpProfile, OpStat, Window

    rows = (OpStat("aten::mm", 40, 0.16), OpStat("aten::addmm", 20, 0.04), OpStat("aten::add", 400, 0.12))
    record = compute_bound_record(op_profile=OpProfile(window=Window(7, 8), steps=2, host_ops=rows, top_host=rows),
                                  device=device)
    return dataclasses.replace(record, speed_of_light=dataclasses.replace(record.speed_of_light,
                                                                          flops_by_op=flops_by_op))


def test_what_if_of_a_compute_bound_cpu_step_puts_its_matmuls_at_the_peak_and_keeps_the_rest() -> None:
    # given a 0.2 s step whose counted FLOPs are all matmuls', in 0.1 s of it
    record = matmul_part_record({"mm": 5_000_000_000, "addmm": 1_000_000_000})
    # when
    estimate = what_if(record, record.verdict)
    # then the matmuls' 0.1 s become 6 GFLOP at 100 GFLOP/s, 0.06 s; the other 0.1 s stays
    assert estimate.step_s == pytest.approx(0.16) and estimate.speedup == pytest.approx(0.2 / 0.16)
    assert estimate.explanation == (
        "with its matmuls at the measured float32 matmul peak of 100.0 GFLOP/s: their 6.00 GFLOP a step in 60.0 ms, "
        "against 100.0 ms in the profiled steps (60% of the peak); the step's other 100.0 ms, its other ops and "
        "Python, as they are")


def test_what_if_of_a_compute_bound_cpu_step_puts_its_attention_at_the_peak_and_its_rare_convolution_in_the_rest(
        ) -> None:
    # given a ViT-like step: 5.94 GFLOP in mm and the CPU's flash attention's backward (0.1 s a step, rows of their
    # own; the matmuls at 80% of the peak), a patch convolution's 0.06 GFLOP, whose time is spread over the ops it
    # calls
    from gpuscope.record import OpProfile, OpStat, Window

    rows = (OpStat("aten::mm", 40, 0.1), OpStat("aten::_scaled_dot_product_flash_attention_for_cpu_backward", 4, 0.1),
            OpStat("aten::convolution", 2, 0.001), OpStat("aten::add", 400, 0.12))
    record = compute_bound_record(op_profile=OpProfile(window=Window(7, 8), steps=2, host_ops=rows))
    record = dataclasses.replace(record, speed_of_light=dataclasses.replace(record.speed_of_light, flops_by_op={
        "mm": 4_000_000_000, "_scaled_dot_product_flash_attention_for_cpu_backward": 1_940_000_000,
        "convolution": 60_000_000}))
    # when
    estimate = what_if(record, record.verdict)
    # then the matmuls' and attention's 0.1 s become 5.94 GFLOP at 100 GFLOP/s; the convolution's time stays
    assert estimate.step_s == pytest.approx(0.1 + 0.0594)
    assert estimate.explanation.startswith("with its matmuls and attention at the measured float32 matmul peak of "
                                           "100.0 GFLOP/s: their 5.94 GFLOP a step in 59.4 ms, against 100.0 ms")


def test_a_recorded_embedding_models_what_if_keeps_the_time_its_matmuls_do_not_take() -> None:
    # given a recorded skip-gram model (tests/fixtures/records/README.md): sparse embeddings, SparseAdam, its only
    # counted FLOPs a bmm's 3.9 MFLOP
    import json

    from gpuscope.record import RunRecord

    path = Path(__file__).resolve().parents[1] / "fixtures" / "records" / "sparse_skipgram.json"
    record = analyze(RunRecord.from_json(json.loads(path.read_text())))
    # then it is compute-bound at a fifth of a percent of the peak, said as such, not "at 0%"
    assert record.verdict.bound == "compute" and record.speed_of_light.mfu == pytest.approx(0.0018, abs=5e-4)
    assert headroom_text(record) == "at 0.2% of this machine's measured float32 matmul peak"
    # and its what-if is the step without its bmm's time beyond the peak's, not the 3.9 MFLOP alone at the peak
    assert 1.08 < record.what_if.speedup < 1.12, record.what_if
    assert "the step's other 11.7 ms, its other ops and Python, as they are" in record.what_if.explanation


@pytest.mark.parametrize("flops_by_op, device", [
    ({"mm": 5_000_000_000, "convolution": 1_000_000_000}, "cpu"),  # a convolution's time is no one row's
    ({"mm": 5_000_000_000, "bmm": 1_000_000_000}, "cpu"),  # bmm has no row in the op table
    ({"mm": 6_000_000_000}, "cuda"),  # host time is no kernel's
], ids=["convolution-counted", "matmul-without-a-row", "cuda"])
def test_what_if_of_a_compute_bound_step_is_the_whole_step_at_the_peak_where_its_matmuls_time_is_unknown(
        flops_by_op: dict[str, int], device: str) -> None:
    record = matmul_part_record(flops_by_op, device)
    estimate = what_if(record, record.verdict)
    assert estimate.step_s == pytest.approx(0.06) and estimate.explanation.startswith("at the speed of light: 6.00")


def test_what_if_of_a_data_bound_run_without_a_probe_hides_the_wait_behind_compute() -> None:
    record = make_record(breakdown=Breakdown(data_wait=0.6, forward=0.2, backward=0.2), meta=RunMeta(cpu_count=4))
    estimate = what_if(record, Verdict("data-loading", 0.9, ("x 1",)))
    assert estimate.step_s == pytest.approx(0.06)  # max(data 60 ms, compute 40 ms)
    assert what_if(record, Verdict("inconclusive", 0.0, ("x 1",))) is None


def test_analysis_fills_in_mfu_and_the_what_if() -> None:
    record = analyze(compute_bound_record())
    assert record.speed_of_light.mfu == pytest.approx(0.3)  # type: ignore[union-attr]
    assert record.what_if is None or record.what_if.step_s > 0


def test_a_what_if_slower_than_the_run_reads_slower_in_the_summary_and_the_report() -> None:
    # given: a data-bound CPU run whose best remedy measured would take longer than its step (workers take the cores
    # the step computes on): 85 ms for the run's 65 ms
    from gpuscope.record import WhatIf
    from gpuscope.report.render import render_report
    from gpuscope.diagnose.words import speedup_text
    from gpuscope.report.summary import summary_lines

    record = dataclasses.replace(
        make_record(breakdown=Breakdown(data_wait=0.35, forward=0.25, backward=0.4), meta=RunMeta(cpu_count=2)),
        verdict=Verdict("data-loading", 0.77, ("35% of each step waits",)),
        what_if=WhatIf(step_s=0.085, speedup=0.065 / 0.085, explanation="with 1 DataLoader workers"))
    # then: the estimate says how much slower, not "0.76x faster"
    assert speedup_text(0.065 / 0.085) == "1.31x slower" and speedup_text(1.64) == "1.64x faster"
    # and one that rounds to 1.00x either way is no faster, not "1.00x slower"
    assert speedup_text(0.9999999999999999) == speedup_text(1.004) == speedup_text(0.996) == "no faster"
    summary = "\n".join(summary_lines(record, Path("run")))
    assert "1.31x slower" in summary and "x faster" not in summary
    html = render_report(record, inline_plotly=False)
    assert "(1.31x slower)" in html and "0.76x faster" not in html


def test_a_step_of_few_flops_is_counted_in_a_prefix_that_shows_them() -> None:
    # a policy network stepped one observation at a time: 0.52 MFLOP a step would read "0.00 GFLOP"
    assert [flop_text(n) for n in (5.2e5, 2.82e9, 1.5e13, 12)] == ["520.00 kFLOP", "2.82 GFLOP", "15.00 TFLOP",
                                                                   "12 FLOP"]


class ClosureSteps(FakeSteps):
    """The steps collector as it sees an optimizer's closure: counted, and its listener told as each call returns
    (``FakeSteps`` sees none)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.listener_at_end: Any = None

    def closure_calls(self) -> int:
        return self.calls

    def on_closure_end(self, listener: Any) -> None:
        self.listener_at_end = listener

    def off_closure_end(self, listener: Any) -> None:
        if self.listener_at_end == listener:
            self.listener_at_end = None

    def timed(self, closure: Any) -> Any:
        def timed_closure() -> Any:
            self.calls += 1
            try:
                return closure()
            finally:
                if self.listener_at_end is not None:
                    self.listener_at_end()

        return timed_closure


def lbfgs_flops(steps: FakeSteps, second_call: bool = False) -> tuple[Any, SpeedOfLightCollector]:
    """Steps 0-3 of an MLP (batch 5, 8 -> 16 -> 4) trained with LBFGS (4 closure calls a step at most), the flops
    collector counting step 2 (``second_call``: as the long-steps plan places it, on the traced step's second
    closure call); ``steps`` wraps the closure, as the steps collector does."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    x, y = torch.randn(5, 8, dtype=torch.double), torch.randn(5, 4, dtype=torch.double)
    collector = SpeedOfLightCollector(start=2)
    if second_call:
        collector.move_window(Window(2, 1, second_call=True), Window(2, 1, second_call=True))
    collector.follow(steps)

    def closure() -> Any:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    for index in range(4):
        steps.listener(index)
        optimizer.step(steps.timed(closure))
    return collector.stop(), collector


def test_an_lbfgs_step_counts_one_closure_call_times_the_steps_calls_the_same_flops_as_counting_every_call() -> None:
    # given the same LBFGS loop, counted whole (no closure calls known) and one call at a time
    whole, _ = lbfgs_flops(FakeSteps())
    steps = ClosureSteps()
    one_call, collector = lbfgs_flops(steps)
    # then the count of one call, times the step's calls, is the whole step's count, and the notes say how it was made
    calls = collector.scaled_by
    assert 2 <= calls <= 5 and one_call.status.status == whole.status.status == "ok"
    assert one_call.payload.flops_per_step == whole.payload.flops_per_step
    assert one_call.payload.flops_by_dtype == whole.payload.flops_by_dtype == {"float64": whole.payload.flops_per_step}
    assert one_call.notes == (f"step 2's FLOPs: its first call of the optimizer's closure counted, times its {calls} "
                              "calls",)
    assert steps.listener_at_end is None  # the collector no longer listens to the closure


def test_a_long_lbfgs_steps_count_is_the_traced_steps_second_closure_call_times_its_calls() -> None:
    # given the LBFGS loop counted whole, and counted as the long-steps plan places the count: on the traced step
    whole, _ = lbfgs_flops(FakeSteps())
    steps = ClosureSteps()
    second, collector = lbfgs_flops(steps, second_call=True)
    # then its second call, times the step's calls, is the whole step's count (its first call is the trace's)
    calls = collector.scaled_by
    assert 2 <= calls <= 5 and second.status.status == "ok" and second.payload.step == 2
    assert second.payload.flops_per_step == whole.payload.flops_per_step
    assert second.notes == (f"step 2's FLOPs: its second call of the optimizer's closure counted (its first was "
                            f"traced), times its {calls} calls",)
    assert steps.listener_at_end is None


def closure_loop_flops(calls_per_step: list[int]) -> tuple[Any, SpeedOfLightCollector]:
    """A loop whose step ``i`` calls its closure (one 4 x 8 x 16 matmul) ``calls_per_step[i]`` times, the flops
    collector placed on step 2's second call."""
    steps = ClosureSteps()
    collector = SpeedOfLightCollector(start=2)
    collector.move_window(Window(2, 1, second_call=True), Window(2, 1, second_call=True))
    collector.follow(steps)
    a, b = torch.randn(4, 8), torch.randn(8, 16)
    for index, calls in enumerate(calls_per_step):
        steps.listener(index)
        for _ in range(calls):
            steps.timed(lambda: a @ b)()
    return collector.stop(), collector


def test_a_traced_step_with_one_closure_call_leaves_the_count_to_the_next_but_ones_first_call() -> None:
    # given: step 2 calls its closure once (the optimizer converged), so it has no second call to count
    result, collector = closure_loop_flops([3, 3, 1, 3, 3])
    # then the count is step 4's first call, times its 3 calls, as where steps are short
    assert result.status.status == "ok" and result.payload.step == 4
    assert result.payload.flops_per_step == 3 * 2 * 4 * 8 * 16 and collector.scaled_by == 3
    assert "its first call" in result.notes[0]


def test_a_run_of_three_long_closure_steps_gets_its_count_from_its_last_step() -> None:
    # given: a run of three steps, the last of them traced and counted (no step boundary follows it)
    result, collector = closure_loop_flops([3, 3, 3])
    # then its second call, returned whole, is counted, times the step's 3 calls
    assert result.status.status == "ok" and result.payload.step == 2 and collector.scaled_by == 3
    assert result.payload.flops_per_step == 3 * 2 * 4 * 8 * 16


def test_a_run_that_ends_before_the_traced_steps_second_call_returns_has_no_count() -> None:
    result, _ = closure_loop_flops([3, 3, 1])
    assert result.status == CollectorStatus(
        "unavailable", "the run ended before step 2, the one whose FLOPs are counted, was over")


def test_the_lean_flop_counter_counts_what_torchs_counts_op_by_op() -> None:
    from torch.utils import flop_counter

    from gpuscope.collect import lean_flops

    # given convolutions, attention, an LSTM and linears, with gradients, without, and in inference mode (where a
    # composite op reaches the counter whole and is decomposed)
    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(8 * 14 * 14, 10))
    attention, lstm = torch.nn.MultiheadAttention(16, 2, batch_first=True), torch.nn.LSTM(8, 16, batch_first=True)
    x, q, s = torch.randn(4, 3, 16, 16), torch.randn(2, 5, 16), torch.randn(2, 7, 8)

    def work() -> None:
        conv(x).sum().backward()
        attention(q, q, q)[0].sum().backward()
        lstm(s)[0].sum().backward()
        with torch.inference_mode():
            conv(x)
            torch.nn.functional.linear(q, torch.randn(3, 16))
        with torch.no_grad():
            lstm(s)

    counts = []
    for counter in (flop_counter.FlopCounterMode(display=False), lean_flops.counter(display=False)):
        with counter:
            work()
        counts.append(counter.get_flop_counts()["Global"])
    # then the lean counter (torch's, asking whether an op decomposes once per op) counts the same, op by op
    assert counts[0] == counts[1] and sum(counts[0].values()) > 0
    assert type(lean_flops.counter()).__name__ == "LeanCounter"
