"""Rules about number formats: mixed precision on Tensor Cores."""

from __future__ import annotations

from gpuscope.analysis import thresholds as th
from gpuscope.analysis.evidence import STEP, Metric, kernel_share
from gpuscope.analysis.rules.base import Finding, rule
from gpuscope.record import KernelTimeline, RunRecord


def compute_busy(kernels: KernelTimeline) -> float:
    """Share of the window with a compute kernel running: communication kernels (NCCL's) left out, since mixed
    precision does not speed them up. Records made before it was measured fall back to all kernels."""
    return kernels.compute_busy_fraction if kernels.compute_busy_fraction is not None else kernels.busy_fraction


@rule(id="mixed-precision",
      title="Train in mixed precision (autocast + GradScaler)",
      fix="with torch.autocast('cuda', dtype=torch.bfloat16): loss = model(x)  # fp16: add torch.amp.GradScaler",
      needs=("cuda", "kernels"),
      resolved_by=(Metric("kernel time on Tensor Cores", "share", kernel_share("tensor_core_share")), STEP))
def mixed_precision(run: RunRecord) -> Finding | None:
    """Signal: the GPU is busy with compute kernels, and little of their time runs on Tensor Cores.
    Why it matters: Tensor Cores do fp16/bf16 matrix math many times faster than fp32 on CUDA cores; measured
    training time falls to 45-60% of fp32 (the seeds: T4, five CNNs), at the same accuracy with fp32 master
    weights and loss scaling. Communication kernels (NCCL) are left out of both the busy time and the Tensor Core
    share: mixed precision does not make an all-reduce faster.
    Fix: torch.autocast (bf16 where supported), GradScaler for fp16."""
    kernels = run.op_profile.kernels  # type: ignore[union-attr]
    assert kernels is not None  # the rule needs "kernels"
    busy = compute_busy(kernels)
    if busy < th.GPU_BUSY_COMPUTE or kernels.tensor_core_share >= th.TENSOR_CORE_ENOUGH:
        return None
    off_tc = 1 - kernels.tensor_core_share
    evidence = (
        f"the GPU runs compute kernels {busy:.0%} of the step"
        + (f" ({kernels.communication_share:.0%} of kernel time is communication, left out)"
           if kernels.communication_share else ""),
        f"only {kernels.tensor_core_share:.0%} of compute-kernel time is on Tensor Cores",
    )
    return Finding(busy * off_tc * th.AMP_TIME_SAVED, evidence)
