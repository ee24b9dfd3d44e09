"""Every number gpuscope decides with, named, with where its value comes from.

Change a value here and the tests that pin its behaviour tell you what moved.
"""

from __future__ import annotations

# -- steady state ------------------------------------------------------------------------------------------
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

MIN_STEADY_STEPS = 5
"""Fewer steady-state steps than this give an inconclusive verdict: a median of four is not a measurement."""

# -- data loading ------------------------------------------------------------------------------------------
DATA_WAIT_NOTABLE = 0.05
"""TensorFlow's profiler calls a run moderately input-bound from 5% of step time spent waiting for input."""

DATA_WAIT_BOUND = 0.20
"""...and highly input-bound from 20%: from here on the loader, not the model, sets the pace."""

# -- launch-bound vs compute-bound ---------------------------------------------------------------------------
LAUNCH_BOUND_OVERHEAD = 0.5
"""On a CPU run, when the ops issued per step times this machine's fixed cost per op (measured on tiny tensors)
explain at least half of the step, per-op overhead bounds it: fewer, larger ops (fusion, graphs, bigger batches)
pay more than faster arithmetic. Half is where the two costs are equal."""

COMPUTE_BOUND_MAX_OVERHEAD = 0.25
"""...and when they explain at most a quarter, the arithmetic bounds it. Between the two the run is mixed and the
verdict says inconclusive, with both figures."""

GPU_BUSY_COMPUTE = 0.7
"""A GPU running kernels 70% or more of the step is busy: what is left to win is in the kernels themselves.
(The PyTorch TensorBoard plugin and Holistic Trace Analysis both treat low GPU utilisation as the first thing to
fix; NVIDIA's guides aim at keeping the GPU busy above roughly 70-80%.)"""

GPU_BUSY_STARVED = 0.5
"""A GPU idle half the step or more is starved; if the host was late for most of that idle time (host wait), the
host cannot launch work fast enough: CPU-launch-bound."""

HOST_WAIT_DOMINANT = 0.5
"""Host wait must make up at least half of the GPU's idle time to blame the launch rate."""

# -- recommendations -----------------------------------------------------------------------------------------
LAUNCH_NOTABLE = 0.3
"""Per-op overhead (or host-wait idle on a GPU) from which launch-cutting advice is worth giving: below a third of
the step, the arithmetic or the loader matters more."""

ELEMENTWISE_NOTABLE = 0.3
"""Fusion is worth suggesting when at least this share of the op calls are element-wise chains' material."""

PINNED_COPY_SAVING = 0.5
"""Pinned host memory copies at about twice the speed of pageable memory (NVIDIA's bandwidth test figures), so
about half the pageable copy time is saved."""

TENSOR_CORE_ENOUGH = 0.5
"""With half or more of the kernel time already on Tensor Cores, mixed precision is (mostly) in use."""

AMP_TIME_SAVED = 0.45
"""Mixed precision cut measured training time to 45-60% of fp32 (the seeds: T4, VGG16 to EfficientNet): at least
40% of the Tensor-Core-able time is saved; 0.45 is the middle of the conservative end."""

# -- GPU kernel timeline (analysis/kernels.py) ------------------------------------------------------------
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

# -- bounded cost ------------------------------------------------------------------------------------------
STEP_HEAD = 64
"""Steps kept one by one from the start of the run (warm-up is decided among them)."""

STEP_CAPACITY = 4096
"""Further steps kept as an evenly spaced sample of at most this many records (about 1 MB of memory)."""

SAMPLE_IN_RECORD = 2000
"""Steps written to run.json one by one; longer runs are thinned evenly (the figures use every kept step)."""
