"""The numbers the reduction decides with (which steps are steady, which kernels are of which kind),
named, with where each value comes from. The diagnosis's are in ``diagnose/thresholds.py``."""

from __future__ import annotations

# -- steady steps --------------------------------------------------------------------------------------------
MIN_STEPS_FOR_WARMUP = 3
"""With fewer steps than this, none is left out as warm-up: there would be nothing left to measure."""

WARMUP_FACTOR = 1.5
"""A leading step slower than this multiple of the run's second half's 90th percentile is still warming up (lazy
initialisation, cuDNN autotuning and torch.compile's first compilations take several to hundreds of times a
normal step; 1.5x the slow end leaves ordinary jitter and periodic slow steps in the steady state)."""

MAX_WARMUP_SHARE = 0.25
"""At most this share of the steps is ever called warm-up: a run that keeps getting faster for longer is not
warming up, it is changing, and its figures should say so."""

OUTLIER_FACTOR = 5.0
"""A later step over this multiple of the median is an outlier (a checkpoint save, an evaluation pass or a
recompilation inside the loop). Genuine periodic stalls, such as a loader whose workers fall behind every few
steps, stay well under 5x in the workloads we measured, and are part of the cost, so they are kept."""

MAX_OUTLIER_SHARE = 0.05
"""If more than this share of the steps would be outliers, they are a pattern of the loop, not accidents:
none is left out."""

MAX_EVALUATED_SHARE = 1 / 3
"""Steps in which the trained model ran a forward pass in eval mode or with gradients off (``model.eval()``,
``torch.no_grad``, ``inference_mode``) and that took ``EVALUATION_LONGER`` times the other steps' median are
evaluation passes between training steps (a train/test loop's test pass, a framework's validation) and are left out
of the step figures, however many of them are long, while steps with such a pass are at most this share of the
steps. A train/test loop with 10 batches an epoch has 10% of them. Where more steps have one, forward passes without
gradients are part of the loop's work (a reinforcement learner's rollout before each update) and every step stays
in."""

EVALUATION_LONGER = 1.5
"""A step with such a forward pass is an evaluation pass only if it took this multiple of the other steps' median:
the test pass of a train/test loop made its step 3-20x longer in the loops measured here (PyTorch Lightning's
validation on 5 batches 3x), while a DQN's action chosen under ``no_grad`` on one state leaves its step as long as
the others."""

MIN_PHASED_STEPS = 4
"""Steady steps whose phases were timed on the device that the device breakdown needs (the steps collector marks
the phase changes of some steps only: ``collect.steps.device_timeline.PHASED_EVERY``)."""

SAMPLE_IN_RECORD = 2000
"""Steps written to run.json one by one; longer runs are thinned evenly (the figures use every kept step)."""

# -- kernels ---------------------------------------------------------------------------------------------------
KERNEL_WAIT_MAX_GAP_S = 30e-6
"""A gap between kernels shorter than this, with the next kernel already queued, is the cost of starting the next
kernel (kernel wait), not a stall. Holistic Trace Analysis's default ``consecutive_kernel_delay=30``
(``TraceAnalysis.get_idle_time_breakdown``): its docstring says nanoseconds, but HTA compares it with gaps in the
trace's own unit, Kineto's microseconds (its parser keeps ``ts`` in us), so in effect 30 us. HTA's PR #283 gives
the same order: queued consecutive kernels typically start within 10 us of the previous one ending."""

TENSOR_CORE_KERNEL_PATTERNS: tuple[str, ...] = (
    # PyProf's tc.py list, kept by the PyTorch TensorBoard plugin (kineto tb_plugin ``TC_Allowlist``) and by
    # TensorFlow's profiler (``IsKernelUsingTensorCore``): cuBLAS/cuDNN names carry the MMA shape,
    # e.g. volta_h884gemm, turing_fp16_s1688cudnn, ampere_fp16_s16816gemm, ampere_tf32_s1688gemm.
    "h884", "s884", "i884", "h1688", "s1688", "i1688", "c1688", "i8816", "16816",
    # The MMA instruction families in cuDNN/cuBLAS/CUTLASS names: sm80_xmma_gemm..., sm90_xmma_fprop_implicit_gemm...
    "xmma", "hmma", "imma",
    # CUTLASS calls Tensor Core kernels ``TensorOp`` (CUDA-core ones ``Simt``): cutlass_80_tensorop_s16816gemm...,
    # cutlass3x_sm90_tensorop_gemm...
    "tensorop",
    # Hopper warpgroup MMA (``wgmma`` / ``gmma`` in CUTLASS 3 and cuBLAS names).
    "wgmma", "gmma",
    # cuBLAS 12.x's GEMMs for Hopper and later (nvjet_hsh_..., nvjet_tst_...), warpgroup MMA kernels.
    "nvjet",
    # FlashAttention-2 (torch's scaled_dot_product_attention flash backend): fp16/bf16 only, built on mma.sync.
    "flash_fwd", "flash_bwd",
)
"""Substrings of kernel names that show Tensor Core use, matched case-insensitively. A name heuristic: a kernel
that uses Tensor Cores under an unlisted name counts as not using them. The TensorBoard plugin's cuDNN-only entries
(``conv1x1``, ``direct_group``...) are left out: they name a convolution shape, not the instruction used."""

CONV_KERNEL_PATTERNS: tuple[str, ...] = (
    # cuDNN's classic convolution engines: cudnn::detail::implicit_convolve_sgemm, explicit_convolve_sgemm,
    # precomputed_convolve_sgemm, convolve_common_engine_float_NHWC, cudnn::detail::wgrad_alg0_engine,
    # dgrad_engine, dgrad2d_alg1_1; and the Winograd ones (cudnn::winograd_nonfused::winogradForwardData4x4...).
    "convolve", "wgrad", "dgrad", "winograd",
    # cuDNN 8/9 runtime-fused and precompiled engines and CUTLASS conv kernels: sm80_xmma_fprop_implicit_gemm...,
    # sm90_xmma_dgrad_implicit_gemm..., cutlass_tensorop_s1688fprop_optimized..., cutlass::conv::kernel::
    # ImplicitGemmConvolution<...>.
    "fprop", "implicit_gemm", "implicitgemm", "convolution",
    # cuBLAS-style cuDNN kernels named for their arch and MMA: volta_scudnn_128x64_relu_interior_nn_v1,
    # ampere_scudnn_winograd_128x128..., turing_fp16_s1688cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1.
    # ("cudnn_", not "cudnn": cudnn::bn_fw_tr_1C11..., cudnn::ops::nchwToNhwcKernel... are batch norm and layout.)
    "scudnn", "cudnn_",
    # cuDNN's FFT convolution (fft2d_r2c_32x32, fft2d_c2r_32x32); cuFFT's own kernels are named regular_fft...
    "fft2d_r2c", "fft2d_c2r",
    # PyTorch's native CUDA convolutions (ATen DepthwiseConv2d.cu / DepthwiseConv3d.cu, conv_depthwise2d_forward_
    # kernel...) and Triton templates from torch.compile (triton_tem_fused_convolution...: caught above).
    "conv_depthwise", "conv1d", "conv2d", "conv3d",
)
"""Substrings of convolution kernels' names, matched case-insensitively. Plain "conv" is left out: it also names
conversions (``convert``). A convolution cuDNN runs as a plain GEMM (a 1x1 convolution may become
``ampere_sgemm_...``) counts as a GEMM: a name heuristic, like ``TENSOR_CORE_KERNEL_PATTERNS``."""

CUDA_CORE_KERNEL_PATTERNS: tuple[str, ...] = ("_ffma_", "simt")
"""Names that say the kernel runs on CUDA cores whatever family it belongs to: cuBLAS's float32 GEMMs on an H100
(torch 2.11, CUDA 13) are ``sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_..._ffma_...`` (``xmma`` family, FFMA
instructions), CUTLASS's ``simt`` kernels likewise. They override ``TENSOR_CORE_KERNEL_PATTERNS``."""

FP32_GEMM_KERNEL_PATTERNS: tuple[str, ...] = ("sgemm", "gemm_f32f32_f32f32")
"""Single-precision GEMMs: cuBLAS ``ampere_sgemm_128x64_nn``, ``volta_sgemm_128x64_nn``,
``sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma_...`` (seen on an H100), CUTLASS
``cutlass_80_simt_sgemm_128x128_8x4_nn_align1`` (BLAS's ``s`` prefix: float32). A name that also matches
``TENSOR_CORE_KERNEL_PATTERNS`` (``ampere_tf32_s1688gemm...``) or ``CONV_KERNEL_PATTERNS``
(``implicit_convolve_sgemm``: cuDNN's, governed by ``cudnn.allow_tf32``, not by the matmul flag) does not count."""

LAYOUT_TRANSFORM_KERNEL_PATTERNS: tuple[str, ...] = ("nchwtonhwc", "nhwctonchw")
"""cuDNN's layout conversions around Tensor Core convolutions of NCHW tensors: ``cudnn::ops::nchwToNhwcKernel``,
``cudnn::ops::nhwcToNchwKernel`` (``cudnn::engines_precompiled::`` in cuDNN 9), matched case-insensitively."""

