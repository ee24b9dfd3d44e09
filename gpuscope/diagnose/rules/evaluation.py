"""Rules about forward passes without gradients inside the training steps (``steps.no_grad_share``): an evaluation
after every update, paid at every step."""

from __future__ import annotations

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import STEP, Metric
from gpuscope.diagnose.rules.base import Finding, Refused, rule
from gpuscope.record import RunRecord


LIBRARY_FIX = {
    "transformers": "TrainingArguments(..., eval_strategy=\"steps\", eval_steps={every})  # evaluates at every step "
                    "now",
    "lightning": "Trainer(..., val_check_interval={every})  # validates at every step now",
    "pytorch_lightning": "Trainer(..., val_check_interval={every})  # validates at every step now",
}
"""The fix where a library evaluates for the user, by the library whose code ran the passes."""


def _no_grad_share(run: RunRecord) -> float | None:
    return run.steps.no_grad_share


@rule(id="evaluate-less-often",
      title="Evaluate every few steps, not at every one",
      fix=f"run the evaluation every {th.EVALUATE_EVERY} steps: `if step % {th.EVALUATE_EVERY} == 0:` around it",
      needs=("host_passes", "training"),
      resolved_by=(Metric("passes without gradients' share of the steps", "share", _no_grad_share), STEP),
      trial=Refused("it changes what the run reports at each step (its evaluation figures), not only the speed"))
def evaluate_less_often(run: RunRecord) -> Finding | None:
    """Signal: the trained model runs forward in eval mode (or with gradients off, not as a rollout's train-mode
    passes) in the steps, none of them left out for it (they are in most steps: ``reduce.steady``), taking
    ``NO_GRAD_NOTABLE`` of the steps' time or more (``steps.no_grad_share``, a CPU run's host clock).
    Why it matters: an evaluation after every update (pytorch/examples' GCN: on its train and validation nodes,
    printed every 20 epochs) costs a forward pass or more a step, as much as training's own.
    Fix: evaluate every ``EVALUATE_EVERY`` steps, at the lines that run it, or at the library's setting
    (``LIBRARY_FIX``: transformers' ``eval_steps``, Lightning's ``val_check_interval``).
    Gain: the passes' share less a tenth of it."""
    steps = run.steps
    share = steps.no_grad_share
    if share is None or share < th.NO_GRAD_NOTABLE or steps.evaluated or steps.rollouts:
        return None
    passes = (steps.forwards_per_backward or 1.0) - 1.0
    lines = [s for s in steps.no_grad_sites if s.file]
    where = (" at " + ", ".join(f"{s.file}:{s.line} `{s.code}`" for s in lines)) if lines else ""
    counted = f", {passes:.0f} forward pass{'es' * (round(passes) != 1)} a step besides training's" \
        if passes >= 0.5 else ""
    evidence = (f"the trained model runs forward in eval mode or without gradients in every step{counted}{where}: "
                f"{share:.0%} of the steps' time (an evaluation after each update)",)
    every = th.EVALUATE_EVERY
    if steps.no_grad_by in LIBRARY_FIX:
        fix: str | None = LIBRARY_FIX[steps.no_grad_by].format(every=every)
    elif lines and not steps.no_grad_by:
        fix = (f"{lines[0].file}:{lines[0].line}: evaluate every {every} steps, not at every one: "
               f"`if step % {every} == 0:` around " + ("these lines" if len(lines) > 1 else "it"))
    else:
        fix = None  # (another library's evaluation: the generic fix)
    return Finding(share * (1 - 1 / every), evidence, fix=fix)
