"""Rules about the models a loop runs but does not train: a distillation's teacher, a frozen encoder under a trained
head (``steps.frozen_models``)."""

from __future__ import annotations

from gpuscope.diagnose.evidence import STEP, Metric
from gpuscope.diagnose.rules.base import Finding, Refused, rule
from gpuscope.diagnose.words import frozen_model_text
from gpuscope.record import FrozenModel, RunRecord


def _frozen_share(run: RunRecord) -> float | None:
    """The largest share of the step a frozen model takes (0 where none runs in the steps)."""
    if not run.steps.count:
        return None
    return max((f.step_share or 0.0 for f in run.steps.frozen_models), default=0.0)


def cacheable(model: FrozenModel, run: RunRecord) -> bool:
    """Whether ``model``'s outputs for an item are the same every epoch: run in eval mode with gradients off, on the
    DataLoader's batch as loaded, from a dataset that gives the same items each time (a TensorDataset, or one whose
    items read the same each time after the run)."""
    return model.step_share is not None and model.reads_batches and (model.fixed_items or _items_repeat(run))


def _items_repeat(run: RunRecord) -> bool:
    return run.item_repeat is not None and run.item_repeat.same


@rule(id="cache-frozen-outputs",
      title="Compute the frozen model's outputs once, not every epoch",
      fix="compute the frozen model's outputs for every item once, before the training loop (under torch.no_grad()), "
          "and load them with each batch instead of calling it every step",
      resolved_by=(Metric("frozen model's share of the step", "share", _frozen_share), STEP),
      trial=Refused("it changes the script's data: the outputs, computed once, are loaded with each batch"))
def cache_frozen_outputs(run: RunRecord) -> Finding | None:
    """Signal: a model no optimizer trains runs in every step in eval mode with gradients off, on the DataLoader's
    batch as loaded (no augmentation in between), from a dataset whose items are the same each time they are read
    (a TensorDataset, or one whose items the repeat probe read the same each time after the run): its outputs for an
    item are the same every epoch (a distillation's teacher logits, a frozen encoder's features under a linear
    probe).
    Why it matters: every epoch after the first recomputes what the first already computed; feature caching and
    precomputed teacher logits are how linear probes and offline distillation avoid it.
    Fix: one pass over the dataset computing the outputs, kept beside the inputs (a TensorDataset of inputs, labels
    and outputs), at the line that calls the model.
    Gain: its share of the steady steps' time, which the steps no longer spend; the pass costs about one epoch of
    its calls, once."""
    found = [f for f in run.steps.frozen_models if cacheable(f, run)]
    if not found:
        return None
    model = max(found, key=lambda f: f.step_share or 0.0)
    site = model.called_at
    repeat = run.item_repeat
    source = "from a TensorDataset" if model.fixed_items or repeat is None else (
        f"from a dataset ({repeat.dataset}) whose items {', '.join(map(str, repeat.indices))} read the same "
        f"{repeat.reads} times each after the run")
    evidence = (
        frozen_model_text(model),
        f"its input is the DataLoader's batch as loaded, {source}, and it runs in eval mode with gradients off: its "
        "outputs for an item are the same every epoch",
        "computed once (one pass over the dataset, about an epoch of its calls), no step after that would run it",
    )
    fix = None
    if site is not None:
        fix = (f"{site.file}:{site.line}: compute {model.module}'s outputs for every item once, before the training "
               f"loop (under torch.no_grad()), and load them with each batch instead of `{site.code}`")
    return Finding(model.step_share, evidence, fix=fix)
