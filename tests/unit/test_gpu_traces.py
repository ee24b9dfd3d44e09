"""The GPU figures on real torch.profiler traces recorded on A100, V100 and MI250 machines (tests/fixtures/gpu/).

Every expected figure is computed here, independently, by a few lines over the raw events (``trace_math``): the
union of one device's kernel intervals, clipped to that device's window, over the window's length.
"""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path

import pytest

from gpuscope.diagnose import analyze
from gpuscope.reduce.figures import TraceFigures, trace_figures
from gpuscope.reduce.kernels import is_gemm, uses_tensor_cores
from gpuscope.diagnose.rules.precision import mixed_precision
from gpuscope.reduce.trace import parse_trace
from gpuscope.errors import GpuscopeError
from gpuscope.record import GpuDevice, GpuSamples, KernelTimeline, OpProfile
from gpuscope.reduce.tracefile import record_from_trace

from conftest import make_record
from trace_math import Events, busy, clipped, kernels, load, union, window

GPU = Path(__file__).resolve().parent.parent / "fixtures" / "gpu"
RANKS = GPU / "sampled-ranks"
H100 = GPU / "h100"


@pytest.fixture(scope="module")
def traces() -> dict[str, Events]:
    """Every fixture trace's events, read once for the module; "merged" is the two rank traces in one list."""
    found = {p.name.removesuffix(".json.gz"): load(p) for p in (*GPU.glob("*.json.gz"), *RANKS.glob("*.json.gz"))}
    found.update({f"h100-{p.name.removesuffix('.trace.json.gz')}": load(p) for p in H100.glob("*.trace.json.gz")})
    found["merged"] = found["sampled-rank0"] + found["sampled-rank1"]
    return found


@pytest.fixture(scope="module")
def figures(traces: dict[str, Events]) -> dict[str, TraceFigures]:
    return {name: trace_figures(events) for name, events in traces.items()}


def device_figures(figures: TraceFigures, device: int) -> KernelTimeline:
    return next(t for t in figures.devices if t.device == device)


# -- busy fraction, per device, within the device window ----------------------------------------------------------

@pytest.mark.parametrize(("trace", "device"), [
    ("a100-resnet-ddp-nccl", 0), ("v100-resnet-ns", 0), ("sampled-rank0", 0), ("sampled-rank1", 1),
    ("mi250-rocm-toy", 2), ("h100-launch", 0), ("h100-data", 0), ("h100-compute-4096", 0)])
def test_busy_fraction_is_the_union_of_kernels_within_the_device_window(traces, figures, trace, device) -> None:
    timeline = device_figures(figures[trace], device)
    assert timeline.busy_fraction == pytest.approx(busy(traces[trace], device), abs=0.01)
    assert timeline.window_basis == "launches"


def test_a_gpu_running_behind_the_host_is_not_read_as_always_busy(traces, figures) -> None:
    # given the V100 trace, whose kernels end ~89 ms after the host's last step
    timeline = figures["v100-resnet-ns"].kernels
    assert timeline is not None
    # then busy is measured within one window, and the idle split is what busy leaves
    assert timeline.busy_fraction < 0.99
    idle = timeline.idle_host_wait_fraction + timeline.idle_kernel_wait_fraction + timeline.idle_other_fraction
    assert idle == pytest.approx(1 - timeline.busy_fraction, abs=1e-9)
    assert timeline.idle_other_fraction > 0


def test_two_devices_driven_by_one_process_get_figures_each(traces, figures) -> None:
    # given the two rank traces merged into one event list: one process driving devices 0 and 1
    merged = figures["merged"]
    # then each device has its own timeline, each as its own rank's trace gives it (not one union of both)
    assert [t.device for t in merged.devices] == [0, 1]
    for rank, device in (("sampled-rank0", 0), ("sampled-rank1", 1)):
        expected = busy(traces[rank], device)
        assert device_figures(merged, device).busy_fraction == pytest.approx(expected, abs=0.01)
    assert 0.43 < device_figures(merged, 0).busy_fraction < 0.46
    assert 0.45 < device_figures(merged, 1).busy_fraction < 0.48
    # the headline is the device with the most kernel time, and the notes say so
    assert merged.kernels is not None and merged.kernels.device == 1
    assert any("device 1" in note for note in merged.notes)


# -- communication --------------------------------------------------------------------------------------------------

def test_nccl_communication_is_measured_on_the_device(traces, figures) -> None:
    # independent overlap: NCCL kernel intervals of device 0 and the other kernels' intervals, each unioned and
    # clipped to the device window; overlap = |NCCL and compute at once| / |NCCL|
    events = traces["a100-resnet-ddp-nccl"]
    lo, hi = window(events, 0)
    nccl = union([(k["ts"], k["ts"] + k["dur"]) for k in kernels(events, 0) if "nccl" in k["name"].lower()])
    compute = union([(k["ts"], k["ts"] + k["dur"]) for k in kernels(events, 0) if "nccl" not in k["name"].lower()])
    both = union([(max(a, c), min(b, d)) for a, b in nccl for c, d in compute if min(b, d) > max(a, c)])
    expected = clipped(both, lo, hi) / clipped(nccl, lo, hi)
    comm = figures["a100-resnet-ddp-nccl"].communication
    assert comm is not None and (comm.measured_on, comm.device, comm.backend) == ("device", 0, "nccl")
    assert comm.overlap == pytest.approx(expected, abs=0.05)
    assert comm.comm_s == pytest.approx(clipped(nccl, lo, hi) / 1e6 / 3, rel=0.01)


def test_collectives_outside_the_steps_do_not_make_a_run_communication_bound(traces) -> None:
    # given a gloo trace whose all-reduces mostly lie outside its one step, with no op of its training thread
    events = traces["cpu-only-collectives"]
    record = analyze(record_from_trace({"traceEvents": events}, "cpu-only-collectives.json.gz", 1))
    comm = record.op_profile.communication
    # then no share of the step exceeds the step, and no wait is claimed that the trace does not show
    assert comm is not None and comm.measured_on == "host" and not comm.exposure_measured
    assert comm.comm_s <= record.steps.median_s and comm.exposed_s <= record.steps.median_s
    assert all(0 <= share <= 1 for share in record.breakdown.as_dict().values())
    assert record.verdict.bound != "communication"
    assert not any(r.id == "reduce-communication" for r in record.recommendations)


# -- kinds of kernels: compute only ---------------------------------------------------------------------------------

def test_kind_shares_are_of_compute_kernels_only(traces, figures) -> None:
    # independent: Tensor Core kernels' time over the non-NCCL kernels' time, clipped to the window
    events = traces["a100-resnet-ddp-nccl"]
    lo, hi = window(events, 0)
    compute = [k for k in kernels(events, 0) if "nccl" not in k["name"].lower()]
    total = sum(max(0.0, min(k["ts"] + k["dur"], hi) - max(k["ts"], lo)) for k in compute)
    tc = sum(max(0.0, min(k["ts"] + k["dur"], hi) - max(k["ts"], lo)) for k in compute if uses_tensor_cores(k["name"]))
    timeline = figures["a100-resnet-ddp-nccl"].kernels
    assert timeline is not None
    assert timeline.tensor_core_share == pytest.approx(tc / total, abs=1e-6)
    assert timeline.communication_share > 0.2  # NCCL: a large part of kernel time, left out of the shares
    not_nccl = lambda name: "nccl" not in name.lower()  # noqa: E731
    assert timeline.compute_busy_fraction == pytest.approx(busy(events, 0, not_nccl), abs=0.01)


def test_the_mixed_precision_gain_leaves_communication_out() -> None:
    # given: an H100 step of 10 ms with kernels 95% of it, 40% of their time NCCL's; of the compute kernels, 60%
    # float32 GEMMs on CUDA cores and the rest element-wise
    kernels = KernelTimeline(busy_fraction=0.95, idle_other_fraction=0.05, compute_busy_fraction=0.6,
                             communication_share=0.4, fp32_gemm_share=0.6, gemm_share=0.6)
    record = make_record(device="cuda", op_profile=OpProfile(kernels=kernels),
                         gpus=GpuSamples(devices=(GpuDevice(name="NVIDIA H100 80GB HBM3"),)))
    # when
    finding = mixed_precision(dataclasses.replace(record, steps=dataclasses.replace(record.steps, median_s=0.01)))
    # then: the GEMMs move to bf16 Tensor Cores (989.5 against 67 TFLOP/s) and the element-wise kernels stream half
    # the bytes; the all-reduces' 3.8 ms stay as they are
    compute = 0.0095 * 0.6
    saved = 0.6 * compute * (1 - 67 / 989.5) + 0.4 * compute * 0.5
    assert finding is not None and finding.gain == pytest.approx(saved / 0.01)
    assert "40% of kernel time is communication, left out" in finding.evidence[0]


@pytest.mark.parametrize(("busy", "advised"), [(0.9, True), (0.3, False)])
def test_without_a_datasheet_rate_mixed_precision_is_advised_only_on_a_busy_gpu(busy: float, advised: bool) -> None:
    # given a GPU the datasheet table does not know (an AMD MI250), its kernels off Tensor Cores
    kernels = KernelTimeline(busy_fraction=busy, idle_other_fraction=1 - busy, fp32_gemm_share=0.6, gemm_share=0.6)
    record = make_record(device="cuda", op_profile=OpProfile(kernels=kernels),
                         gpus=GpuSamples(devices=(GpuDevice(name="AMD Instinct MI250X / MI250"),)))
    # then: advised with no gain where the GPU is busy, and the evidence says why; not where it idles
    finding = mixed_precision(record)
    assert (finding is not None) == advised
    if finding is not None:
        assert finding.gain is None and "no datasheet 16-bit Tensor Core rate" in finding.evidence[-1]


def test_rocm_matrix_core_gemms_are_recognised(traces, figures) -> None:
    events = traces["mi250-rocm-toy"]
    cijk = [k for k in kernels(events, 2) if k["name"].startswith("Cijk_")]
    assert cijk and all(uses_tensor_cores(k["name"]) and is_gemm(k["name"]) for k in cijk)
    lo, hi = window(events, 2)
    in_window = [k for k in kernels(events, 2) if k["ts"] < hi and k["ts"] + k["dur"] > lo]
    share = sum(k["dur"] for k in in_window if k["name"].startswith("Cijk_")) / sum(k["dur"] for k in in_window)
    timeline = figures["mi250-rocm-toy"].kernels
    assert timeline is not None
    assert timeline.tensor_core_share == pytest.approx(share, abs=1e-4) and share > 0.2
    assert timeline.gemm_share == pytest.approx(share, abs=1e-4)


# -- reading traces ---------------------------------------------------------------------------------------------------

def test_traces_are_read_gzipped_or_not_and_with_invalid_utf8() -> None:
    text = b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k\xff\xfe", "ts": 1, "dur": 2, "pid": 0}]}'
    for raw in (text, gzip.compress(text)):
        assert parse_trace(raw, "t")["traceEvents"][0]["name"].startswith("k")


# mtime=0: the gzip header's time would otherwise put the clock in the test's id, which pytest-xdist's workers must
# collect alike
@pytest.mark.parametrize("raw", [b"hello\n", gzip.compress(b'{"traceEvents": []}', mtime=0)[:20], b'{"other": 1}'],
                         ids=["text", "cut-gzip", "no-events"])
def test_what_is_not_a_whole_trace_is_a_one_line_error(raw: bytes) -> None:
    with pytest.raises(GpuscopeError) as caught:
        parse_trace(raw, "t")
    assert "\n" not in caught.value.message


def test_h100_float32_gemms_on_ffma_are_cuda_core_work_that_tf32_would_move(traces, figures) -> None:
    # given: the wide MLP in float32 on an H100: cuBLAS ran sm80_xmma_gemm_f32f32..._ffma_ kernels
    events = traces["h100-compute"]
    gemms = [k for k in kernels(events, 0) if "gemm" in k["name"].lower()]
    assert gemms and all("_ffma_" in k["name"] or "simt" in k["name"] for k in gemms)
    timeline = device_figures(figures["h100-compute"], 0)
    # then: none of it is Tensor Core time, and the GEMMs' share of compute is what TF32 would move
    lo, hi = window(events, 0)
    gemm_s = clipped(union([(k["ts"], k["ts"] + k["dur"]) for k in gemms]), lo, hi)
    compute_s = clipped(union([(k["ts"], k["ts"] + k["dur"]) for k in kernels(events, 0)]), lo, hi)
    assert timeline.tensor_core_share == 0.0
    assert timeline.fp32_gemm_share == pytest.approx(gemm_s / compute_s, abs=0.02)
