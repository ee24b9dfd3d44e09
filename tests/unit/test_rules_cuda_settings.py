"""The CUDA-settings rules on hand-built CUDA records: host syncs in the loop, TF32, cuDNN autotuning and
channels_last each fire on their signal with the measured facts and a sound gain (or none), stay clear without it,
and are not checked on a CPU run or without the inputs they read. The gains are worked out here from the records'
figures: the kernels a fix speeds up, at the ratio of the GPU's datasheet rates, out of the step."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from conftest import make_record
from gpuscope.diagnose.rules import evaluate
from gpuscope.record import (
    CallSite,
    CollectorStatus,
    GpuDevice,
    GpuSamples,
    KernelTimeline,
    OpProfile,
    Practices,
    Recommendation,
    RunMeta,
    RunRecord,
    Steps,
    SyncProfile,
    Window,
)

RULE_IDS = ("avoid-host-sync", "tf32", "cudnn-benchmark", "channels-last")
A100 = "NVIDIA A100-SXM4-80GB"
A100_TF32_SPEEDUP = 156 / 19.5
"""The A100's datasheet: TF32 Tensor Cores at 156 TFLOP/s dense, float32 on CUDA cores at 19.5."""
H100_TF32_SPEEDUP = 494.5 / 67

LOGGED_LOSS = CallSite(file="train.py", line=57, function="train", code="running += loss.item()", calls=9)
PRINTED = CallSite(file="train.py", line=63, function="train", code="print(acc)", calls=3)


def practices(**overrides: Any) -> Practices:
    """torch 2.4 on an A100, defaults left as they are: TF32 off for matmuls, cudnn.benchmark off; no convolutions."""
    base = Practices(torch_version="2.4.1+cu121", steps_checked=40, modules_inspected=True, cudnn_benchmark=False,
                     matmul_allow_tf32=False, cudnn_allow_tf32=True, float32_matmul_precision="highest",
                     cuda_capability="8.0")
    return dataclasses.replace(base, **overrides)


def syncs(per_step: float = 4.0, sites: tuple[CallSite, ...] = (LOGGED_LOSS, PRINTED)) -> SyncProfile:
    """Three counted steps (10-12)."""
    return SyncProfile(window=Window(10, 12), steps=3, syncs=int(per_step * 3), per_step=per_step, sites=sites)


def cuda_run(busy: float = 0.9, tensor_core: float = 0.0, conv: float = 0.0, fp32_gemm: float = 0.0,
             layout: float = 0.0, sync_calls: int = 0, sync_wait_s: float = 0.0, kernels: bool = True,
             settings: Practices | None = None, counted: SyncProfile | None = None, gpu: str = A100) -> RunRecord:
    """A CUDA run on ``gpu`` with a 10 ms median step and three profiled steps (its kernels 9 ms of it at the
    default 90% busy, the rest idle for other reasons than the host)."""
    timeline = KernelTimeline(
        busy_fraction=busy, idle_other_fraction=1 - busy, kernels=900, kernels_per_step=300, mean_kernel_s=30e-6,
        tensor_core_share=tensor_core, conv_share=conv, fp32_gemm_share=fp32_gemm, layout_transform_share=layout,
        sync_calls=sync_calls, sync_wait_s=sync_wait_s)
    return make_record(
        device="cuda",
        steps=Steps(count=40, median_s=0.01, total=50, warmup=1, profiled=9, breakdown_basis="device"),
        op_profile=OpProfile(steps=3, ops=900, ops_per_step=300, mean_op_s=5e-6,
                             kernels=timeline if kernels else None),
        practices=settings,
        syncs=counted,
        meta=RunMeta(cpu_count=8),
        gpus=GpuSamples(devices=(GpuDevice(name=gpu),)),
    )


def convnet(convs: int = 20, channels_last: int = 0, **overrides: Any) -> Practices:
    return practices(conv_layers=convs, channels_last_convs=channels_last, **overrides)


def recommendation(record: RunRecord, rule_id: str) -> Recommendation:
    recommendations, checks = evaluate(record)
    assert checks[rule_id].status == "fired", checks[rule_id]
    return next(r for r in recommendations if r.id == rule_id)


# -- each rule: fires on its signal, with a sound gain ------------------------------------------------------------

FIRES = [
    # 2 ms of sync wait per 10 ms step (20%) while the GPU idles 40%: the wait bounds the gain
    ("avoid-host-sync", cuda_run(busy=0.6, sync_calls=12, sync_wait_s=0.006, counted=syncs()), 0.2),
    # ...and when the GPU idles only 10%, its idle time does
    ("avoid-host-sync", cuda_run(busy=0.9, sync_calls=12, sync_wait_s=0.006, counted=syncs()), 0.1),
    # no kernel timeline: the syncs are counted, the cost is not measured
    ("avoid-host-sync", cuda_run(kernels=False, counted=syncs()), None),
    # exactly one sync per step (the logged loss) is enough
    ("avoid-host-sync", cuda_run(counted=syncs(per_step=1.0, sites=(LOGGED_LOSS,))), None),
    # 40% of 9 ms of kernels in float32 GEMMs, at the A100's TF32 speed-up, out of the 10 ms step
    ("tf32", cuda_run(fp32_gemm=0.4, settings=practices()), 0.4 * 0.009 * (1 - 1 / A100_TF32_SPEEDUP) / 0.01),
    ("tf32", cuda_run(fp32_gemm=0.4, settings=practices(cuda_capability="9.0"), gpu="NVIDIA H100 80GB HBM3"),
     0.4 * 0.009 * (1 - 1 / H100_TF32_SPEEDUP) / 0.01),
    # a GPU the datasheet table does not know: the advice, with no gain
    ("tf32", cuda_run(fp32_gemm=0.4, settings=practices(), gpu="NVIDIA A800"), None),
    # what autotuning saves is not known before it is tried
    ("cudnn-benchmark", cuda_run(conv=0.6, settings=convnet()), None),
    # 10% of 9 ms of kernels in layout conversions, which go
    ("channels-last", cuda_run(tensor_core=0.6, conv=0.5, layout=0.1, settings=convnet()), 0.09),
    # convolutions on Tensor Cores without conversions in the trace: advice, no measured gain
    ("channels-last", cuda_run(tensor_core=0.6, conv=0.5, settings=convnet(channels_last=2)), None),
]


@pytest.mark.parametrize(("rule_id", "record", "gain"), FIRES, ids=[f"{c[0]}-{i}" for i, c in enumerate(FIRES)])
def test_each_rule_fires_on_its_signal_with_numbered_evidence_and_a_sound_gain(rule_id: str, record: RunRecord,
                                                                              gain: float | None) -> None:
    # when
    fired = recommendation(record, rule_id)
    # then every fact carries its number, or the setting (name=value) it reads
    assert fired.evidence and all(re.search(r"\d|\w=\w", fact) for fact in fired.evidence)
    assert fired.fix
    assert fired.expected_gain == (pytest.approx(gain, abs=1e-3) if gain is not None else None)


CLEAR = [
    ("avoid-host-sync", cuda_run(counted=syncs(per_step=0.5, sites=(dataclasses.replace(LOGGED_LOSS, calls=1),)))),
    ("avoid-host-sync", cuda_run(counted=syncs(per_step=0.0, sites=()))),
    # TF32 already allowed
    ("tf32", cuda_run(fp32_gemm=0.4, settings=practices(matmul_allow_tf32=True, float32_matmul_precision="high"))),
    # a V100 has no TF32
    ("tf32", cuda_run(fp32_gemm=0.4, settings=practices(cuda_capability="7.0"))),
    # a GPU the datasheet table does not know, and idle most of the step: no estimate, and little to gain
    ("tf32", cuda_run(busy=0.3, fp32_gemm=0.4, settings=practices(), gpu="NVIDIA A800")),
    # a GeForce RTX 3090's TF32 is no faster than its float32
    ("tf32", cuda_run(fp32_gemm=0.4, settings=practices(cuda_capability="8.6"), gpu="NVIDIA GeForce RTX 3090")),
    ("tf32", cuda_run(fp32_gemm=0.4, settings=practices(cuda_capability=None))),
    # float32 GEMMs are too small a share to matter
    ("tf32", cuda_run(fp32_gemm=0.05, settings=practices())),
    ("cudnn-benchmark", cuda_run(conv=0.6, settings=convnet(cudnn_benchmark=True))),
    ("cudnn-benchmark", cuda_run(conv=0.6, settings=convnet(cudnn_benchmark=None))),
    ("cudnn-benchmark", cuda_run(conv=0.1, settings=convnet())),
    # a GPU idle 95% of the step (the loop waits for data): its convolutions' algorithms hardly matter
    ("cudnn-benchmark", cuda_run(busy=0.05, conv=0.6, settings=convnet())),
    # the inspected model has no convolution layers
    ("cudnn-benchmark", cuda_run(conv=0.6, settings=practices())),
    # already channels_last
    ("channels-last", cuda_run(tensor_core=0.6, conv=0.5, layout=0.1, settings=convnet(channels_last=20))),
    # float32 convolutions, not on Tensor Cores
    ("channels-last", cuda_run(tensor_core=0.05, conv=0.5, layout=0.1, settings=convnet())),
    # no convolution layers
    ("channels-last", cuda_run(tensor_core=0.6, conv=0.5, layout=0.1, settings=practices())),
    # few conversions and few convolutions
    ("channels-last", cuda_run(tensor_core=0.6, conv=0.1, layout=0.01, settings=convnet())),
]


@pytest.mark.parametrize(("rule_id", "record"), CLEAR, ids=[f"{c[0]}-{i}" for i, c in enumerate(CLEAR)])
def test_each_rule_stays_clear_without_its_signal(rule_id: str, record: RunRecord) -> None:
    recommendations, checks = evaluate(record)
    assert checks[rule_id].status == "clear"
    assert rule_id not in {r.id for r in recommendations}


# -- what each rule says --------------------------------------------------------------------------------------------

def test_host_syncs_name_the_lines_and_the_fix_names_the_first_one() -> None:
    # given four syncs per step: the logged loss three times, a printed tensor once; 2 ms waited per step
    record = cuda_run(busy=0.6, sync_calls=12, sync_wait_s=0.006, counted=syncs())
    # when
    fired = recommendation(record, "avoid-host-sync")
    # then
    assert fired.evidence == (
        "4 syncs per step over 3 steps",
        "train.py:57 `running += loss.item()` (3 per step)",
        "train.py:63 `print(acc)` (1 per step)",
        "in the profiled steps the host waited 2.00 ms per step in 4 sync calls (20% of the median step); "
        "the GPU idles 40% of the step",
    )
    assert fired.fix == "train.py:57: keep the value on the GPU (accumulate `loss.detach()`), read it every N steps"


@pytest.mark.parametrize(
    ("code", "advice"),
    [
        ("print(acc)", "print every N steps"),
        ("preds = logits.argmax(1).cpu()", "copy to the host every N steps"),
        ("idx = (mask > 0).nonzero()", "fixed-size form"),
        ("if torch.isnan(loss):", "keep the value on the GPU"),
    ],
)
def test_the_host_sync_fix_suits_the_line(code: str, advice: str) -> None:
    site = CallSite(file="train.py", line=80, function="train", code=code, calls=6)
    fired = recommendation(cuda_run(counted=syncs(per_step=2.0, sites=(site,))), "avoid-host-sync")
    assert fired.fix is not None and fired.fix.startswith("train.py:80: ") and advice in fired.fix


def test_tf32_says_the_setting_the_gpu_and_that_torch_turned_tf32_off_by_default() -> None:
    fired = recommendation(cuda_run(fp32_gemm=0.4, settings=practices()), "tf32")
    assert fired.evidence == (
        "40% of kernel time is float32 matrix multiplies on CUDA cores (sgemm kernels); the GPU ran kernels 90% "
        "of the profiled steps",
        "torch.backends.cuda.matmul.allow_tf32=False, float32_matmul_precision=highest on a GPU of compute "
        "capability 8.0, which has TF32 Tensor Cores",
        "torch 2.4.1+cu121 keeps TF32 off for float32 matmuls by default (since torch 1.12)",
        "float32 GEMMs on CUDA cores take 3.6 ms a step; on TF32 Tensor Cores about 0.4 ms (the A100 SXM's "
        "datasheet: tfloat32 156 against float32 19.5 TFLOP/s dense (8.0x)); the step would take about 6.9 ms of "
        "its 10.0 ms",
    )
    assert fired.fix == 'torch.set_float32_matmul_precision("high")  # or torch.backends.cuda.matmul.allow_tf32 = True'


def test_tf32_off_before_torch_1_12_was_the_scripts_own_choice() -> None:
    # given torch 1.11, which had TF32 on by default and no float32 matmul precision setting
    settings = practices(torch_version="1.11.0+cu113", float32_matmul_precision=None)
    # when
    fired = recommendation(cuda_run(fp32_gemm=0.4, settings=settings), "tf32")
    # then the evidence says the script turned it off, and the fix is the one flag that torch has
    assert fired.evidence[1] == ("torch.backends.cuda.matmul.allow_tf32=False on a GPU of compute capability 8.0, "
                                 "which has TF32 Tensor Cores")
    assert fired.evidence[2] == ("torch 1.11.0+cu113 uses TF32 for float32 matmuls by default (until torch 1.12): "
                                 "this script turned it off")
    assert fired.fix == "torch.backends.cuda.matmul.allow_tf32 = True  # drop the line that turns it off"


def test_cudnn_benchmark_says_the_convolution_share_and_warns_about_changing_shapes() -> None:
    fired = recommendation(cuda_run(conv=0.6, settings=convnet()), "cudnn-benchmark")
    assert fired.evidence[:3] == (
        "torch.backends.cudnn.benchmark=False (the default)",
        "convolution kernels take 60% of kernel time; the GPU ran kernels 90% of the profiled steps",
        "the model has 20 convolution layers",
    )
    assert "not known until it is tried" in fired.evidence[3]
    assert "fixed input shapes" in fired.fix


def test_cudnn_benchmark_relies_on_the_kernels_when_the_model_was_not_inspected() -> None:
    settings = practices(modules_inspected=False)
    fired = recommendation(cuda_run(conv=0.6, settings=settings), "cudnn-benchmark")
    assert not any("convolution layers" in fact for fact in fired.evidence)


def test_channels_last_counts_the_layers_and_the_conversions() -> None:
    fired = recommendation(cuda_run(tensor_core=0.6, conv=0.5, layout=0.1, settings=convnet(channels_last=2)),
                           "channels-last")
    assert fired.evidence == (
        "2 of 20 convolution layers have channels_last weights",
        "60% of kernel time runs on Tensor Cores; convolutions take 50%",
        "cuDNN spends 10% of kernel time converting between NCHW and NHWC, 0.9 ms a step; the GPU ran kernels 90% "
        "of the profiled steps; without the conversions the step would take about 9.1 ms of its 10.0 ms",
    )
    assert "memory_format=torch.channels_last" in fired.fix


# -- not checked ---------------------------------------------------------------------------------------------------

def test_on_a_cpu_run_none_of_them_is_checked() -> None:
    record = make_record(device="cpu", practices=practices(cuda_capability=None), syncs=None)
    _, checks = evaluate(record)
    for rule_id in RULE_IDS:
        assert (checks[rule_id].status, checks[rule_id].reason) == (
            "not-checked", "a CPU-only run: this is about GPU work")


def test_without_the_frameworks_settings_the_settings_rules_are_not_checked() -> None:
    # given a CUDA run whose practices collector failed
    record = dataclasses.replace(
        cuda_run(fp32_gemm=0.4, conv=0.6, tensor_core=0.6, layout=0.1, settings=None),
        collectors={"practices": CollectorStatus("failed", "RuntimeError: boom", field="practices")})
    _, checks = evaluate(record)
    for rule_id in ("tf32", "cudnn-benchmark", "channels-last"):
        assert (checks[rule_id].status, checks[rule_id].reason) == (
            "not-checked", "the framework's settings were not read (practices: RuntimeError: boom)")


def test_without_counted_syncs_host_sync_advice_is_not_checked_and_says_why() -> None:
    record = dataclasses.replace(
        cuda_run(sync_calls=12, sync_wait_s=0.006),
        collectors={"syncs": CollectorStatus("unavailable", "the run ended before the steps where syncs are "
                                                           "counted (10-12) were complete", field="syncs")})
    _, checks = evaluate(record)
    assert checks["avoid-host-sync"].status == "not-checked"
    assert checks["avoid-host-sync"].reason == (
        "host-device syncs were not counted (syncs: the run ended before the steps where syncs are counted "
        "(10-12) were complete)")


def test_without_a_kernel_timeline_the_kernel_rules_are_not_checked() -> None:
    _, checks = evaluate(cuda_run(kernels=False, settings=convnet()))
    for rule_id in ("tf32", "cudnn-benchmark", "channels-last"):
        assert checks[rule_id].status == "not-checked"
        assert checks[rule_id].reason is not None and checks[rule_id].reason.startswith("no CUDA kernel timeline")
