"""Rules about activation checkpointing (``steps.checkpointing``): memory bought with compute, where the run has the
memory to spare."""

from __future__ import annotations

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import STEP, Metric
from gpuscope.diagnose.rules.base import AtRunTime, Finding, rule
from gpuscope.diagnose.memory import mb
from gpuscope.record import Checkpointing, RunRecord

LIBRARY_FIX = {
    "transformers": "model.gradient_checkpointing_disable()  # or TrainingArguments(..., gradient_checkpointing=False)",
    "lightning": "leave out the activation checkpointing your LightningModule or strategy turns on",
    "pytorch_lightning": "leave out the activation checkpointing your LightningModule or strategy turns on",
    "accelerate": "leave out the activation checkpointing your accelerate config (FSDP's activation_checkpointing) "
                  "turns on",
}
"""The fix where a library checkpoints for the user, by the library that called ``torch.utils.checkpoint``."""


def _recompute_share(run: RunRecord) -> float | None:
    checkpointing = run.steps.checkpointing
    if not run.steps.count:
        return None
    return (checkpointing.step_share or 0.0) if checkpointing is not None else 0.0


def kept_bytes_at_most(run: RunRecord, checkpointing: Checkpointing) -> int | None:
    """The most the checkpointed calls' activations would hold kept through backward: each one's, recomputed, were
    all live at once, so at most the peak less the parameters and the optimizer's state; times the calls a step."""
    memory = run.memory
    if memory is None or not memory.peak_bytes or not checkpointing.calls_per_step:
        return None
    each = max(0, memory.peak_bytes - memory.parameters_bytes - memory.optimizer_state_bytes)
    return round(each * checkpointing.calls_per_step)


@rule(id="skip-activation-checkpointing",
      title="Turn activation checkpointing off: memory has room for the activations it recomputes",
      fix="call the checkpointed function directly: fn(*args) instead of torch.utils.checkpoint.checkpoint(fn, *args)",
      needs=("host_recompute", "memory"),
      resolved_by=(Metric("recomputation's share of the step", "share", _recompute_share), STEP),
      trial=AtRunTime())
def skip_activation_checkpointing(run: RunRecord) -> Finding | None:
    """Signal: checkpointed calls (``torch.utils.checkpoint``; transformers' ``gradient_checkpointing``) run their
    forward again in backward for ``RECOMPUTE_NOTABLE`` of the step or more (timed on the host: a CPU run), and the
    activations they would keep instead fit in ``CHECKPOINT_HEADROOM_SHARE`` of the memory the run left free
    (``kept_bytes_at_most``, an upper bound, against ``memory.headroom_bytes``).
    Why it matters: checkpointing trades compute for memory; where the memory is there, each step pays a forward
    pass more for nothing.
    Fix: the checkpointed calls made directly (the library's switch where one checkpoints: transformers'
    ``gradient_checkpointing_disable()``); where memory is tight, fewer of them checkpointed.
    Gain: the recomputation's share of the step, a lower bound (checkpoint's own bookkeeping goes too): the tiny
    GPT-2 of ``RECOMPUTE_NOTABLE`` promised 33%, measured 36%."""
    checkpointing, memory = run.steps.checkpointing, run.memory
    if checkpointing is None or checkpointing.step_share is None or memory is None \
            or checkpointing.step_share < th.RECOMPUTE_NOTABLE or memory.headroom_bytes is None:
        return None
    kept = kept_bytes_at_most(run, checkpointing)
    if kept is None or kept > th.CHECKPOINT_HEADROOM_SHARE * memory.headroom_bytes:
        return None
    site, library = checkpointing.called_at, checkpointing.called_by
    where = f" under {site.file}:{site.line} `{site.code}`" if site is not None else ""
    by = f"{library} checkpoints" if library else "the script checkpoints"
    evidence = (
        f"{by} {checkpointing.calls_per_step:.3g} calls a step{where} "
        f"(torch.utils.checkpoint{', reentrant' if checkpointing.reentrant else ''}): their forward runs again in "
        f"backward, {(checkpointing.recompute_s or 0.0) * 1e3:.1f} ms a step, {checkpointing.step_share:.0%} of "
        "the steady steps' time",
        f"kept instead, their activations would take at most {mb(kept)} (each call's, recomputed, were all "
        f"live at once within the {mb(memory.peak_bytes)} peak); the run left {mb(memory.headroom_bytes)}"
        f" free of {memory.limit_source or 'its memory'}",
    )
    if library in LIBRARY_FIX:
        fix = LIBRARY_FIX[library]
    elif library:
        fix = f"turn off the activation checkpointing {library} does (it calls torch.utils.checkpoint)"
    elif site is not None:
        fix = (f"{site.file}:{site.line}: call the checkpointed function directly instead of `{site.code}` "
               "(checkpoint(fn, *args) -> fn(*args)), or checkpoint fewer of its calls")
    else:
        fix = None
    return Finding(checkpointing.step_share, evidence, fix=fix)
