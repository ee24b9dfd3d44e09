"""Rules about the optimizer's update: how it is implemented."""

from __future__ import annotations

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import OPTIMIZER
from gpuscope.diagnose.rules.base import AtRunTime, Finding, rule
from gpuscope.record import OptimizerProbe, RunRecord


@rule(id="fused-optimizer",
      title="Update the parameters with a fused optimizer",
      fix="`torch.optim.Adam(..., fused=True)` (Adam, AdamW, SGD, Adagrad; CUDA, and CPU since "
          "torch 2.4)",
      needs=("optimizer_probe",),
      resolved_by=(OPTIMIZER,),
      trial=AtRunTime())
def fused_optimizer(run: RunRecord) -> Finding | None:
    """Signal: the optimizer phase is a notable share of the step, and the loop's optimizer, timed again after the
    run on copies of its parameters (the optimizer probe), updates them markedly faster with ``fused=True`` than as
    the run ran it (one tensor at a time, the default on a CPU, or ``foreach``, the default on CUDA).
    Why it matters: an unfused update is several small ops per parameter tensor (Adam: about ten), each a pass over
    memory and, on a GPU, a launch; a fused one is one pass over all of them (Adam's update of a 650k-parameter VAE
    on a 2-core CPU: 1.7 ms one tensor at a time, 0.4 ms fused).
    Fix: ``fused=True`` where the optimizer is built. Expected gain: optimizer share x (1 - fused / as run), the
    two update times the probe measured."""
    probe: OptimizerProbe = run.optimizer_probe  # type: ignore[assignment]
    share = run.breakdown.optimizer
    if probe.implementation == "fused" or not probe.step_s or not probe.fused_step_s:
        return None
    faster = probe.step_s / probe.fused_step_s
    if share < th.OPTIMIZER_SHARE_NOTABLE or faster < th.FUSED_SPEEDUP_NOTABLE:
        return None
    timed = "" if probe.timed_tensors >= probe.tensors else f" (its first {probe.timed_tensors} tensors)"
    evidence = (
        f"the optimizer's update is {share:.0%} of the step ({share * run.steps.median_s * 1e3:.2f} ms of the "
        f"{run.steps.median_s * 1e3:.1f} ms median step)",
        f"{probe.optimizer} updates {probe.tensors} tensors ({probe.parameters / 1e6:.2f} M parameters) on the "
        f"{probe.device} {_as_run(probe.implementation)}",
        f"timed again after the run on copies{timed}: {probe.step_s * 1e3:.2f} ms an update as the run ran it, "
        f"{probe.fused_step_s * 1e3:.2f} ms with fused=True ({faster:.1f}x faster)",
    )
    return Finding(share * (1 - probe.fused_step_s / probe.step_s), evidence, fix=_fix(run, probe.optimizer),
                   settings={"optimizer": probe.optimizer})


def _fix(run: RunRecord, optimizer: str) -> str:
    """``torch.optim.Adam(..., fused=True)`` and, where the user's lines that built one are known (their code names
    the class: not a library's, such as a Trainer's), those lines: ``  # train.py:41`` (a GAN's two optimizers, whose
    updates both count in the optimizer's share of the step: ``  # dcgan.py:8, dcgan.py:9``)."""
    sites = run.practices.optimizer_sites if run.practices is not None else ()
    lines = [f"{s.file}:{s.line}" for s in sites if f"{optimizer}(" in s.code]
    return f"torch.optim.{optimizer}(..., fused=True)" + (f"  # {', '.join(lines)}" if lines else "")


def _as_run(implementation: str) -> str:
    return {"for-loop": "one tensor at a time (the for-loop update, torch's default on a CPU)",
            "foreach": "as a few ops over lists of tensors (foreach, torch's default on CUDA)"}.get(
        implementation, implementation)
