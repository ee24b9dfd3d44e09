"""Rules about number formats: mixed precision on Tensor Cores."""

from __future__ import annotations

from gpuscope.analysis import thresholds as th
from gpuscope.analysis.evidence import STEP, Metric, kernel_share
from gpuscope.analysis.rules.base import Finding, rule
from gpuscope.record import RunRecord


@rule(id="mixed-precision",
      title="Train in mixed precision (autocast + GradScaler)",
      fix="with torch.autocast('cuda', dtype=torch.bfloat16): loss = model(x)  # fp16: add torch.amp.GradScaler",
      needs=("cuda", "kernels"),
      resolved_by=(Metric("kernel time on Tensor Cores", "share", kernel_share("tensor_core_share")), STEP))
def mixed_precision(run: RunRecord) -> Finding | None:
    """Signal: the GPU is busy, and little of its kernel time runs on Tensor Cores.
    Why it matters: Tensor Cores do fp16/bf16 matrix math many times faster than fp32 on CUDA cores; measured
    training time falls to 45-60% of fp32 (the seeds: T4, five CNNs), at the same accuracy with fp32 master
    weights and loss scaling.
    Fix: torch.autocast (bf16 where supported), GradScaler for fp16."""
    kernels = run.op_profile.kernels  # type: ignore[union-attr]
    if kernels.busy_fraction < th.GPU_BUSY_COMPUTE or kernels.tensor_core_share >= th.TENSOR_CORE_ENOUGH:  # type: ignore[union-attr]
        return None
    off_tc = 1 - kernels.tensor_core_share  # type: ignore[union-attr]
    evidence = (
        f"the GPU runs kernels {kernels.busy_fraction:.0%} of the step",  # type: ignore[union-attr]
        f"only {kernels.tensor_core_share:.0%} of kernel time is on Tensor Cores",  # type: ignore[union-attr]
    )
    return Finding(kernels.busy_fraction * off_tc * th.AMP_TIME_SAVED, evidence)  # type: ignore[union-attr]
