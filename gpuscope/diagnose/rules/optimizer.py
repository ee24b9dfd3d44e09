"""Rules about the optimizer's update: how it is implemented."""

from __future__ import annotations

import re

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import OPTIMIZER
from gpuscope.diagnose.rules.base import AtRunTime, Finding, rule
from gpuscope.record import CallSite, OptimizerProbe, RunRecord

TORCH_OPTIMIZERS = ("ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "LBFGS", "Muon", "NAdam",
                    "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam")
"""torch.optim's optimizer classes (torch 2.13): a line that names one built that optimizer."""


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
    the run ran it (one tensor at a time, the default on a CPU, or ``foreach``, the default on CUDA); where the loop
    steps several optimizers of its class each step (a GAN's two, one per parameter), all of theirs.
    Why it matters: an unfused update is several small ops per parameter tensor (Adam: about ten), each a pass over
    memory and, on a GPU, a launch; a fused one is one pass over all of them (Adam's update of a 650k-parameter VAE
    on a 2-core CPU: 1.7 ms one tensor at a time, 0.4 ms fused).
    Fix: ``fused=True`` where the optimizer is built. Expected gain: optimizer share x (1 - fused / as run), the
    two update times the probe measured; where the steps of this class were only part of the optimizer's time (a
    wrapper around them: ZeroRedundancyOptimizer, whose step also broadcasts the updated shards), that share of it;
    where the script also built optimizers of other classes, whose updates share the phase (a sparse embedding's
    SparseAdam beside a dense Adam), at most the probe's own saving for each optimizer of this class."""
    probe: OptimizerProbe = run.optimizer_probe  # type: ignore[assignment]
    share = run.breakdown.optimizer
    if probe.implementation == "fused" or not probe.step_s or not probe.fused_step_s:
        return None
    faster = probe.step_s / probe.fused_step_s
    if share < th.OPTIMIZER_SHARE_NOTABLE or faster < th.FUSED_SPEEDUP_NOTABLE:
        return None
    median = run.steps.median_s
    timed = "" if probe.timed_tensors >= probe.tensors else f" (its first {probe.timed_tensors} tensors)"
    evidence = [
        f"the optimizer's update is {share:.0%} of the step ({share * median * 1e3:.2f} ms of the "
        f"{median * 1e3:.1f} ms median step)",
        f"{_who(probe)} {probe.tensors} tensors ({probe.parameters / 1e6:.2f} M parameters) on the "
        f"{probe.device} {_as_run(probe.implementation)}",
        f"timed again after the run on copies{timed}: {probe.step_s * 1e3:.2f} ms an update as the run ran it, "
        f"{probe.fused_step_s * 1e3:.2f} ms with fused=True ({faster:.1f}x faster)",
    ]
    gain = share * (1 - probe.fused_step_s / probe.step_s)
    if probe.update_share is not None and probe.update_share < th.OPTIMIZER_UPDATE_WHOLE:
        gain *= probe.update_share
        rest = f"{probe.around}'s own work around them" if probe.around else "other optimizers' work"
        evidence.append(f"{probe.optimizer}'s own steps were {probe.update_share:.0%} of the optimizer's time in the "
                        f"run; the rest was {rest}, which fused=True on {probe.optimizer} does not speed up: the gain "
                        "counts that share")
    sites = _sites(run)
    mine = [s for s in sites if _builds(s, probe.optimizer)]
    others = sorted({name for s in sites for name in TORCH_OPTIMIZERS if _builds(s, name)} - {probe.optimizer})
    if others and median > 0:  # (a probe of one optimizer, where the script built more of its class: each alike)
        saved = (1 if probe.optimizers > 1 else max(1, len(mine))) * (probe.step_s - probe.fused_step_s) / median
        if saved < gain:
            gain = saved
            evidence.append(f"the script also builds {' and '.join(others)}, whose updates share the optimizer's "
                            f"time and are not sped up by fused=True on {probe.optimizer}: the gain counts "
                            f"{probe.optimizer}'s own saving, {(probe.step_s - probe.fused_step_s) * 1e3:.2f} ms an "
                            f"update")
    return Finding(gain, tuple(evidence), fix=_fix(probe.optimizer, mine), settings={"optimizer": probe.optimizer})


def _who(probe: OptimizerProbe) -> str:
    """``Adam updates``, or ``64 Adam optimizers, stepped together each step, update`` where the probe timed
    several."""
    if probe.optimizers > 1:
        return f"{probe.optimizers} {probe.optimizer} optimizers, stepped together each step, update"
    return f"{probe.optimizer} updates"


def _sites(run: RunRecord) -> tuple[CallSite, ...]:
    """The user's lines that built an optimizer."""
    return run.practices.optimizer_sites if run.practices is not None else ()


def _builds(site: CallSite, optimizer: str) -> bool:
    """Whether the line names the optimizer class ``optimizer`` in a call (``Adam(`` is not ``SparseAdam(``)."""
    return re.search(rf"(?<![\w]){optimizer}\(", site.code) is not None


def _fix(optimizer: str, sites: list[CallSite]) -> str:
    """``torch.optim.Adam(..., fused=True)`` and, where the user's lines that built one are known (their code names
    the class: not a library's, such as a Trainer's), those lines: ``  # train.py:41`` (a GAN's two optimizers, whose
    updates both count in the optimizer's share of the step: ``  # dcgan.py:8, dcgan.py:9``)."""
    lines = [f"{s.file}:{s.line}" for s in sites]
    return f"torch.optim.{optimizer}(..., fused=True)" + (f"  # {', '.join(lines)}" if lines else "")


def _as_run(implementation: str) -> str:
    return {"for-loop": "one tensor at a time (the for-loop update, torch's default on a CPU)",
            "foreach": "as a few ops over lists of tensors (foreach, torch's default on CUDA)"}.get(
        implementation, implementation)
