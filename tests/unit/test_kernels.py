"""The GPU's kernel timeline from a Kineto trace: busy time, idle time split as HTA does, the shares of kernel time
by kind (Tensor Cores, convolutions, float32 GEMMs, layout conversions), copies, and the host's waits on the GPU.

Small traces are built by hand in Kineto's event layout; the expected figures are worked out in the comments.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuscope.reduce.kernels import (
    KERNEL_WAIT_MAX_GAP_S,
    classify_gap,
    is_convolution,
    is_fp32_cuda_core_gemm,
    is_layout_transform,
    kernel_timeline,
    uses_tensor_cores,
)
from gpuscope.record import KernelTimeline

TRACES = Path(__file__).resolve().parent.parent / "fixtures" / "traces"
BASE_US = 2_000_000.0  # Kineto's timestamps are microseconds since the program's start, with ns decimals
HOST_PID = HOST_TID = 4242
DEVICE = 0
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, " \
              "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
TC_GEMM = "ampere_fp16_s16816gemm_fp16_128x64_ldg8_f2f_stages_64x4_tn"
FP32_GEMM = "ampere_sgemm_128x64_nn"
CONV_FP32 = "void cudnn::detail::implicit_convolve_sgemm<float, float, 1024, 5, 5, 3, 3, 3, 1, false, false, true>" \
            "(int, int, int, float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, " \
            "float, float, int, float const*, float const*, bool, int, int)"
CONV_TC = "sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_stage4_warpsize2x2x1_g1" \
          "_tensor16x8x16_kernel"
TO_NHWC = "void cudnn::ops::nchwToNhwcKernel<__half, __half, float, false, true, (cudnnKernelDataType_t)0>" \
          "(cudnn::ops::nchw2nhwc_params_t<float>, __half const*, __half*)"
TO_NCHW = "void cudnn::ops::nhwcToNchwKernel<__half, __half, float, true, false, (cudnnKernelDataType_t)0>" \
          "(cudnn::ops::nhwc2nchw_params_t<float>, __half const*, __half*)"


class Trace:
    """``traceEvents`` in Kineto's layout: host calls on the python thread, device work on pid = device,
    tid = stream; times are given in microseconds from the trace's start."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._correlation = 5000

    def kernel(self, launch: float, start: float, dur: float, name: str = ELEMENTWISE, stream: int = 7,
               runtime: bool = True, flow: bool = True) -> Trace:
        """A ``cudaLaunchKernel`` at ``launch`` and the kernel it queued, running ``start`` to ``start + dur``."""
        corr = self._next()
        if runtime:
            self._host("cuda_runtime", "cudaLaunchKernel", launch, 5.0, {"External id": corr, "cbid": 211,
                                                                         "correlation": corr})
        if flow:
            self.events.append({"ph": "s", "id": corr, "pid": HOST_PID, "tid": HOST_TID, "ts": BASE_US + launch,
                                "cat": "ac2g", "name": "ac2g"})
            self.events.append({"ph": "f", "id": corr, "pid": DEVICE, "tid": stream, "ts": BASE_US + start,
                                "cat": "ac2g", "name": "ac2g", "bp": "e"})
        self._device("kernel", name, start, dur, stream, {
            "External id": corr, "queued": 0, "device": DEVICE, "context": 1, "stream": stream, "correlation": corr,
            "registers per thread": 32, "shared memory": 0, "blocks per SM": 0.5, "warps per SM": 2.0,
            "grid": [54, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %": 3})
        return self

    def copy(self, name: str, start: float, dur: float, stream: int = 7, category: str = "gpu_memcpy") -> Trace:
        """A ``cudaMemcpyAsync`` (or ``cudaMemsetAsync``) just before ``start`` and the copy it queued."""
        corr = self._next()
        call = "cudaMemsetAsync" if category == "gpu_memset" else "cudaMemcpyAsync"
        self._host("cuda_runtime", call, start - 5.0, 4.0, {"External id": corr, "cbid": 41, "correlation": corr})
        self._device(category, name, start, dur, stream, {
            "External id": corr, "device": DEVICE, "context": 1, "stream": stream, "correlation": corr,
            "bytes": 4096, "memory bandwidth (GB/s)": 4096 / (dur * 1e3)})
        return self

    def host_call(self, name: str, ts: float, dur: float, category: str = "cuda_runtime") -> Trace:
        """A runtime (or driver) call with no device work of its own, such as ``cudaStreamSynchronize``."""
        corr = self._next()
        self._host(category, name, ts, dur, {"External id": corr, "cbid": 131, "correlation": corr})
        return self

    def sync_record(self, kind: str, ts: float, dur: float, correlation: int | None = None) -> Trace:
        """CUPTI's record of a synchronisation (``cat: "cuda_sync"``), for the host call ``correlation`` (default:
        the call just added)."""
        corr = self._correlation if correlation is None else correlation
        self._device("cuda_sync", kind, ts, dur, 7, {"cuda_sync_kind": kind, "stream": 7, "correlation": corr,
                                                     "device": DEVICE, "context": 1})
        return self

    def cpu_op(self, name: str, ts: float, dur: float, category: str = "cpu_op") -> Trace:
        self._host(category, name, ts, dur, {"External id": self._next(), "Record function id": 0, "Ev Idx": 0})
        return self

    def _next(self) -> int:
        self._correlation += 1
        return self._correlation

    def _host(self, cat: str, name: str, ts: float, dur: float, args: dict[str, Any]) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": HOST_PID, "tid": HOST_TID,
                            "ts": BASE_US + ts, "dur": dur, "args": args})

    def _device(self, cat: str, name: str, ts: float, dur: float, stream: int, args: dict[str, Any]) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": DEVICE, "tid": stream,
                            "ts": BASE_US + ts, "dur": dur, "args": args})


def shares(timeline: KernelTimeline | None) -> tuple[float, float, float, float]:
    """busy, host wait, kernel wait, other."""
    assert timeline is not None
    return (timeline.busy_fraction, timeline.idle_host_wait_fraction, timeline.idle_kernel_wait_fraction,
            timeline.idle_other_fraction)


def us(x: float) -> float:
    return x / 1e6


# -- scenarios -------------------------------------------------------------------------------------------------

def busy_gpu() -> Trace:
    # four 100 us kernels back to back, all queued long before they run
    t = Trace()
    for i in range(4):
        t.kernel(launch=-400 + 10 * i, start=100 * i, dur=100)
    return t


def starved_gpu() -> Trace:
    # each launch comes 40 us after the previous kernel ended; each kernel starts 10 us after its launch
    return Trace().kernel(0, 10, 50).kernel(100, 110, 50).kernel(200, 210, 50)


def queued_small_kernels() -> Trace:
    # all launched up front; 5 us and 7 us between them
    return Trace().kernel(-50, 10, 100).kernel(-45, 115, 100).kernel(-40, 222, 100)


def kernels_past_the_window() -> Trace:
    # 300 us kernel, host late by 100 us, then 200 us: 600 us of device time for a 550 us window
    return Trace().kernel(-10, 0, 300).kernel(350, 400, 200)


# -- busy time ---------------------------------------------------------------------------------------------------

def test_back_to_back_kernels_keep_the_gpu_busy() -> None:
    # given four 100 us kernels filling a 400 us window of two steps
    # when
    timeline = kernel_timeline(busy_gpu().events, window_wall_s=us(400), steps=2)
    # then the GPU never idles
    assert shares(timeline) == pytest.approx((1.0, 0.0, 0.0, 0.0))
    assert timeline is not None
    assert (timeline.kernels, timeline.kernels_per_step) == (4, 2.0)
    assert timeline.mean_kernel_s == pytest.approx(100e-6)


def test_overlapping_kernels_on_two_streams_count_once_in_busy_time() -> None:
    # given kernels on stream 7 (0-100, 150-200) and stream 13 (50-150): the union is 0-200
    trace = Trace().kernel(-30, 0, 100).kernel(-20, 50, 100, stream=13).kernel(-10, 150, 50)
    # when the window is 250 us
    timeline = kernel_timeline(trace.events, window_wall_s=us(250), steps=1)
    # then busy is 200/250 and the 50 us after the last kernel is other
    assert shares(timeline) == pytest.approx((0.8, 0.0, 0.0, 0.2))
    assert timeline is not None
    assert timeline.kernels == 3
    assert timeline.mean_kernel_s == pytest.approx(us(250 / 3))  # (100 + 100 + 50) / 3, per kernel, not merged


def test_copies_memsets_and_step_annotations_are_not_kernels() -> None:
    # given a kernel, a 100 us copy, a memset and the step's device-side annotation, then a queued kernel
    trace = (Trace().kernel(-10, 0, 100).copy("Memcpy HtoD (Pinned -> Device)", 100, 90)
             .copy("Memset (Device)", 190, 10, category="gpu_memset").kernel(50, 200, 100))
    trace.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#3", "pid": DEVICE,
                         "tid": 7, "ts": BASE_US, "dur": 300.0, "args": {"External id": 1}})
    # when
    timeline = kernel_timeline(trace.events, window_wall_s=us(300), steps=1)
    # then the GPU counts as idle under the copies: a long wait for a queued kernel, so other
    assert shares(timeline) == pytest.approx((200 / 300, 0.0, 0.0, 100 / 300))
    assert timeline is not None and timeline.kernels == 2


# -- idle time ---------------------------------------------------------------------------------------------------

def test_a_starved_gpu_shows_host_wait_gaps() -> None:
    # given three 50 us kernels, each launched after the previous one ended (gaps 60-110 and 160-210)
    # when the window is 300 us
    timeline = kernel_timeline(starved_gpu().events, window_wall_s=us(300), steps=3)
    # then busy 150/300, host wait 100/300, and the 10 us before + 40 us after the kernels are other
    assert shares(timeline) == pytest.approx((0.5, 100 / 300, 0.0, 50 / 300))


def test_short_gaps_between_queued_kernels_are_kernel_wait() -> None:
    # given 100 us kernels at 10, 115 and 222, all launched before the first one ran
    # when the window is 400 us
    timeline = kernel_timeline(queued_small_kernels().events, window_wall_s=us(400), steps=1)
    # then the 5 + 7 us gaps are kernel wait; 10 us before and 78 us after are other
    assert shares(timeline) == pytest.approx((0.75, 0.0, 12 / 400, 88 / 400))


def test_a_long_wait_for_an_already_queued_kernel_is_other() -> None:
    # given a kernel queued at 10 us that starts only at 200, 100 us after the previous one ended
    trace = Trace().kernel(-50, 0, 100).kernel(10, 200, 100)
    # when
    timeline = kernel_timeline(trace.events, window_wall_s=us(300), steps=1)
    # then the gap is neither the host's fault nor launch overhead
    assert shares(timeline) == pytest.approx((200 / 300, 0.0, 0.0, 100 / 300))


@pytest.mark.parametrize(("gap_us", "category"), [(29.0, "kernel_wait"), (30.0, "other"), (29.999, "kernel_wait")])
def test_kernel_wait_covers_gaps_under_hta_s_threshold(gap_us: float, category: str) -> None:
    # HTA counts idle_interval < consecutive_kernel_delay (30 us) as kernel wait
    assert KERNEL_WAIT_MAX_GAP_S == 30e-6
    assert classify_gap(prev_end_us=100.0, next_start_us=100.0 + gap_us, next_launch_us=50.0) == category


def test_a_kernel_launched_after_the_gpu_went_idle_is_host_wait_however_short_the_gap() -> None:
    assert classify_gap(prev_end_us=100.0, next_start_us=105.0, next_launch_us=101.0) == "host_wait"


def test_a_kernel_without_its_launch_in_the_trace_is_not_blamed_on_the_host() -> None:
    # given the second kernel's runtime call and flow arrow are missing
    trace = Trace().kernel(0, 10, 50).kernel(100, 110, 50, runtime=False, flow=False)
    # when
    timeline = kernel_timeline(trace.events, window_wall_s=us(200), steps=1)
    # then its 50 us gap is other, not host wait
    assert shares(timeline) == pytest.approx((0.5, 0.0, 0.0, 0.5))


def test_the_launch_time_comes_from_the_flow_arrow_when_runtime_events_were_dropped() -> None:
    # given only the ac2g flow arrows say when the kernels were queued
    trace = Trace().kernel(0, 10, 50, runtime=False).kernel(100, 110, 50, runtime=False)
    # when
    timeline = kernel_timeline(trace.events, window_wall_s=us(200), steps=1)
    # then the late launch is still seen: 50 us of host wait
    assert shares(timeline) == pytest.approx((0.5, 0.25, 0.0, 0.25))


def test_a_stretch_opened_by_two_kernels_at_once_takes_the_earlier_launch() -> None:
    # given after a gap two kernels start together: one launched late (90), one queued long before (20)
    trace = Trace().kernel(0, 0, 50).kernel(90, 100, 50).kernel(20, 100, 50, stream=13)
    # when
    timeline = kernel_timeline(trace.events, window_wall_s=us(150), steps=1)
    # then the GPU had work queued through the 50 us gap: other, not host wait
    assert shares(timeline) == pytest.approx((100 / 150, 0.0, 0.0, 50 / 150))


def test_kernels_running_past_the_window_keep_the_shares_within_one() -> None:
    # given 500 us of kernels and a 100 us host wait, over a 550 us window (the GPU ran on after the host)
    # when
    timeline = kernel_timeline(kernels_past_the_window().events, window_wall_s=us(550), steps=1)
    # then busy is 500/550 and the host wait is scaled down to the 50/550 that is left
    assert shares(timeline) == pytest.approx((500 / 550, 50 / 550, 0.0, 0.0))


def test_without_a_wall_time_the_kernels_own_span_is_the_window() -> None:
    # given the starved trace, whose kernels span 10..260 us, and no wall time
    timeline = kernel_timeline(starved_gpu().events, window_wall_s=0.0, steps=3)
    # then the shares are of those 250 us, as HTA's temporal breakdown takes them
    assert shares(timeline) == pytest.approx((150 / 250, 100 / 250, 0.0, 0.0))


@pytest.mark.parametrize(
    ("scenario", "window_us"),
    [(busy_gpu, 400), (busy_gpu, 1000), (starved_gpu, 300), (queued_small_kernels, 400),
     (kernels_past_the_window, 550), (kernels_past_the_window, 100), (starved_gpu, 0)],
)
def test_fractions_add_up_to_one(scenario, window_us: float) -> None:
    timeline = kernel_timeline(scenario().events, window_wall_s=us(window_us), steps=1)
    parts = shares(timeline)
    assert sum(parts) == pytest.approx(1.0, abs=1e-12)
    assert all(0.0 <= p <= 1.0 for p in parts)


# -- copies and Tensor Cores -------------------------------------------------------------------------------------

def test_pageable_and_pinned_host_to_device_copies_are_told_apart() -> None:
    # given a pageable and two pinned host-to-device copies, plus copies the other way and on the device
    trace = (Trace().kernel(-10, 0, 10)
             .copy("Memcpy HtoD (Pageable -> Device)", 20, 20)
             .copy("Memcpy HtoD (Pinned -> Device)", 50, 10)
             .copy("Memcpy HtoD (Pinned -> Device)", 70, 10)
             .copy("Memcpy DtoH (Device -> Pageable)", 90, 5)
             .copy("Memcpy DtoD (Device -> Device)", 100, 3))
    # when
    timeline = kernel_timeline(trace.events, window_wall_s=us(200), steps=1)
    # then three host-to-device copies, one of them pageable, 40 us in all
    assert timeline is not None
    assert (timeline.h2d_copies, timeline.h2d_pageable_copies) == (3, 1)
    assert timeline.h2d_copy_s == pytest.approx(40e-6)


@pytest.mark.parametrize(
    "name",
    [
        "volta_h884gemm_64x64_ldg8_nn",
        "turing_fp16_s1688cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1",
        "ampere_fp16_s16816gemm_fp16_128x64_ldg8_f2f_stages_64x4_tn",
        "ampere_bf16_s16816gemm_bf16_64x64_ldg8_f2f_stages_64x5_tn",
        "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel",
        "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1_g1"
        "_execute_segment_k_off_kernel__5x_cudnn",
        "void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"
        "(cutlass_80_tensorop_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)",
        "void cutlass::device_kernel<cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x128x64_1x1x1_0_tnn"
        "_align8_warpspecialized_cooperative_epi_tma>",
        "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
        "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, false>"
        "(pytorch_flash::Flash_fwd_params)",
        "VOLTA_H884GEMM_64X64_LDG8_NN",
    ],
)
def test_tensor_core_kernels_are_recognised_by_name(name: str) -> None:
    assert uses_tensor_cores(name)


@pytest.mark.parametrize(
    "name",
    [
        "ampere_sgemm_128x64_tn",
        "volta_sgemm_128x64_nn",
        ELEMENTWISE,
        "void cutlass::Kernel<cutlass_80_simt_sgemm_128x128_8x4_nn_align1>(cutlass_80_simt_sgemm_128x128_8x4_nn_align1"
        "::Params)",
        "triton_poi_fused_add_relu_0",
        # float32 GEMMs cuBLAS ran on an H100 (torch 2.11, CUDA 13): the xmma family, on FFMA instructions
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize256x64x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_"
        "kernel_trt",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
        "float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
        "float>, unsigned int, float, 4>)",
    ],
)
def test_cuda_core_kernels_are_not_taken_for_tensor_core_ones(name: str) -> None:
    assert not uses_tensor_cores(name)


def test_tensor_core_share_is_of_kernel_time() -> None:
    # given a 300 us Tensor Core GEMM and 100 us of elementwise work
    trace = Trace().kernel(-10, 0, 300, name=TC_GEMM).kernel(-5, 300, 60).kernel(-4, 360, 40)
    # when
    timeline = kernel_timeline(trace.events, window_wall_s=us(400), steps=1)
    # then three quarters of kernel time is on Tensor Cores
    assert timeline is not None and timeline.tensor_core_share == pytest.approx(0.75)


# -- kernel kinds the backend flags decide -------------------------------------------------------------------------

@pytest.mark.parametrize(
    "name",
    [
        CONV_FP32,
        CONV_TC,
        "sm80_xmma_dgrad_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize64x64x64_stage4_warpsize2x2x1"
        "_g1_tensor16x8x16_kernel",
        "sm80_xmma_wgrad_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_stage4_warpsize2x2x1_g1"
        "_tensor16x8x16_kernel",
        "void cudnn::detail::wgrad_alg0_engine<float, 128, 5, 5, 3, 3, 3, false, 512>(int, int, int, float const*, "
        "int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int)",
        "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::"
        "WinogradDataParams<float, float>)",
        "volta_scudnn_128x64_relu_interior_nn_v1",
        "turing_fp16_s1688cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1",
        "void cutlass::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_align4>"
        "(cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_align4::Params)",
        "void fft2d_r2c_32x32<float, false, 1u, false>(float2*, float const*, int, int, int, int, int, int, int, "
        "int, int, cudnn::reduced_divisor, bool, int2, int, int)",
        "void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel<1, float, int>("
        "at::GenericPackedTensorAccessor<float const, 4ul, at::DefaultPtrTraits, int>, ...)",
        "triton_tem_fused_convolution_0",
    ],
)
def test_convolution_kernels_are_recognised_by_name(name: str) -> None:
    assert is_convolution(name)


@pytest.mark.parametrize(
    "name",
    [
        FP32_GEMM,
        TC_GEMM,
        ELEMENTWISE,
        TO_NHWC,
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<__half, float, 512, true, 1>(cudnnTensorStruct, __half const*, "
        "cudnnTensorStruct, __half*, float const*, float const*, float, float, float*, float*, float*, float*, "
        "float, float)",
        "void cudnn::detail::pooling_fw_4d_kernel<float, float, cudnn::detail::maxpooling_func<float, "
        "(cudnnNanPropagation_t)0>, 0, false>(cudnnTensorStruct, float const*, cudnnTensorStruct, float*, "
        "cudnnPoolingStruct, float, float, int, cudnn::reduced_divisor, cudnn::reduced_divisor)",
    ],
)
def test_matmuls_norms_pooling_and_layout_kernels_are_not_convolutions(name: str) -> None:
    assert not is_convolution(name)


@pytest.mark.parametrize(
    ("name", "fp32_gemm"),
    [
        (FP32_GEMM, True),
        ("volta_sgemm_128x64_tn", True),
        ("void cutlass::Kernel<cutlass_80_simt_sgemm_128x128_8x4_nn_align1>(cutlass_80_simt_sgemm_128x128_8x4_nn"
         "_align1::Params)", True),
        # cuBLAS on an H100 (torch 2.11, CUDA 13): an xmma-family GEMM on FFMA instructions
        ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize256x128x8_stage3_warpsize4x2x1_ffma_aligna4_alignc4_execute"
         "_kernel_trt", True),
        # TF32 and fp16 GEMMs already run on Tensor Cores
        ("ampere_tf32_s1688gemm_tf32_128x128_ldg8_f2f_stages_32x3_nn", False),
        (TC_GEMM, False),
        # cuDNN's float32 convolution: cudnn.allow_tf32 (on by default) governs it, not the matmul flag
        (CONV_FP32, False),
        (ELEMENTWISE, False),
    ],
)
def test_float32_gemms_on_cuda_cores_are_told_from_tensor_core_gemms_and_convolutions(name: str,
                                                                                     fp32_gemm: bool) -> None:
    assert is_fp32_cuda_core_gemm(name) is fp32_gemm


@pytest.mark.parametrize(("name", "transform"), [(TO_NHWC, True), (TO_NCHW, True), (CONV_TC, False),
                                                 (ELEMENTWISE, False)])
def test_cudnn_layout_conversions_are_recognised_by_name(name: str, transform: bool) -> None:
    assert is_layout_transform(name) is transform


def test_kernel_kinds_are_shares_of_kernel_time() -> None:
    # given, in 1000 us of kernels: a 200 us fp32 convolution (its name says sgemm) and a 300 us Tensor Core one,
    # 100 us of fp32 GEMM, NCHW -> NHWC and back (60 + 40 us), and 300 us of element-wise work
    trace = (Trace().kernel(-90, 0, 200, name=CONV_FP32).kernel(-80, 200, 60, name=TO_NHWC)
             .kernel(-70, 260, 300, name=CONV_TC).kernel(-60, 560, 40, name=TO_NCHW)
             .kernel(-50, 600, 100, name=FP32_GEMM).kernel(-40, 700, 300))
    # when
    timeline = kernel_timeline(trace.events, window_wall_s=us(1000), steps=1)
    # then convolutions 500/1000, float32 GEMMs on CUDA cores 100/1000 (not the convolution), conversions 100/1000
    assert timeline is not None
    assert timeline.conv_share == pytest.approx(0.5)
    assert timeline.fp32_gemm_share == pytest.approx(0.1)
    assert timeline.layout_transform_share == pytest.approx(0.1)
    assert timeline.tensor_core_share == pytest.approx(0.3)


# -- the host waiting on the GPU ---------------------------------------------------------------------------------

def test_host_syncs_are_counted_with_the_time_the_host_blocked() -> None:
    # given a kernel, then every way the host waits on the GPU in one step, and calls that do not wait
    trace = (Trace().kernel(-10, 0, 500)
             .host_call("cudaMemcpyAsync", 10, 5)                    # queues a copy: no wait
             .host_call("cudaStreamSynchronize", 20, 200)            # loss.item(): waits 200 us
             .sync_record("Stream Sync", 20, 200)                    # CUPTI's record of that same wait: once only
             .host_call("cudaDeviceSynchronize", 230, 50)
             .host_call("cudaMemcpy", 290, 30)                       # a blocking copy
             .host_call("cudaEventSynchronize", 330, 20)
             .host_call("cuStreamSynchronize", 360, 10, category="cuda_driver")
             .host_call("cudaStreamWaitEvent", 380, 3)               # the device waits, not the host
             .sync_record("Stream Wait Event", 380, 3)
             .sync_record("Event Sync", 400, 15, correlation=99))    # a wait whose host call the trace lacks
    # when
    timeline = kernel_timeline(trace.events, window_wall_s=us(500), steps=1)
    # then six waits: 200 + 50 + 30 + 20 + 10 + 15 = 325 us
    assert timeline is not None
    assert timeline.sync_calls == 6
    assert timeline.sync_wait_s == pytest.approx(325e-6)


def test_a_trace_without_waits_has_no_host_syncs() -> None:
    timeline = kernel_timeline(busy_gpu().events, window_wall_s=us(400), steps=2)
    assert timeline is not None
    assert (timeline.sync_calls, timeline.sync_wait_s) == (0, 0.0)


# -- no GPU --------------------------------------------------------------------------------------------------------

def test_a_trace_with_cpu_ops_only_has_no_kernel_timeline() -> None:
    # given a CPU-only run's trace: a step annotation and its ops, no device events
    trace = (Trace().cpu_op("ProfilerStep#2", 0, 900, category="user_annotation")
             .cpu_op("aten::linear", 10, 300).cpu_op("aten::addmm", 20, 280).cpu_op("aten::relu", 320, 40))
    # then there is no kernel timeline to speak of
    assert kernel_timeline(trace.events, window_wall_s=us(900), steps=1) is None
    assert kernel_timeline([], window_wall_s=1.0, steps=1) is None


# -- a whole trace -------------------------------------------------------------------------------------------------

def test_a_small_cuda_training_trace_gives_the_hand_computed_figures() -> None:
    """cuda_small.json: three 1000 us steps (ProfilerStep#10..12 at T = 2 000 000, +1000, +2000 us), one stream.

    Each step, relative to its start T (launch -> kernel start..end):
      Memcpy HtoD (Pageable)     call T+10             copy T+25..T+45   (20 us, not a kernel)
      fp16 GEMM  s16816 (TC)     launch T+70   kernel T+80..T+280  (200 us)
      relu                       launch T+95   kernel T+290..T+340 (50 us)  gap 10, queued     -> kernel wait
      fp16 GEMM  s16816 (TC)     launch T+115  kernel T+345..T+545 (200 us) gap 5, queued      -> kernel wait
      mse_loss reduce            launch T+600  kernel T+615..T+655 (40 us)  gap 70, 600 > 545  -> host wait
      SGD _foreach_add_          launch T+700  kernel T+712..T+812 (100 us) gap 57, 700 > 655  -> host wait
      Memcpy DtoH (loss.item())                   copy T+860..T+863 (not a kernel, not host-to-device)
    Between steps: last kernel ends T+812, next GEMM launched T+1070 > T+812, starts T+1080 -> host wait 268 us.

    busy        = 3 x (200+50+200+40+100)      = 1770 us -> 1770/3000 = 0.59
    host wait   = 3 x (70+57) + 2 x 268        =  917 us ->  917/3000
    kernel wait = 3 x (10+5)                   =   45 us ->   45/3000 = 0.015
    other       = 80 before the first kernel + (3000-2812) after the last = 268 us -> 268/3000
                  (1770 + 917 + 45 + 268 = 3000)
    kernels 15, 5 per step, mean 1770/15 = 118 us; Tensor Core share 6 x 200 / 1770 = 1200/1770 = 40/59
    host-to-device copies 3, all pageable, 3 x 20 = 60 us
    """
    # given the trace, and the wall time the caller measures: the three ProfilerStep annotations
    events = json.loads((TRACES / "cuda_small.json").read_text())["traceEvents"]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    window_wall_s = sum(e["dur"] for e in steps) / 1e6
    assert (len(steps), window_wall_s) == (3, pytest.approx(0.003))
    # when
    timeline = kernel_timeline(events, window_wall_s=window_wall_s, steps=len(steps))
    # then
    assert shares(timeline) == pytest.approx((1770 / 3000, 917 / 3000, 45 / 3000, 268 / 3000))
    assert timeline is not None
    assert (timeline.kernels, timeline.kernels_per_step) == (15, 5.0)
    assert timeline.mean_kernel_s == pytest.approx(118e-6)
    assert timeline.tensor_core_share == pytest.approx(40 / 59)
    assert (timeline.h2d_copies, timeline.h2d_pageable_copies) == (3, 3)
    assert timeline.h2d_copy_s == pytest.approx(60e-6)
    # an MLP: no convolutions, its GEMMs in fp16 on Tensor Cores, no layout conversions; loss.item() shows only
    # as its cudaMemcpyAsync here, which queues the copy and does not itself wait
    assert (timeline.conv_share, timeline.fp32_gemm_share, timeline.layout_transform_share) == (0.0, 0.0, 0.0)
    assert (timeline.sync_calls, timeline.sync_wait_s) == (0, 0.0)
