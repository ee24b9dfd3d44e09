"""Rules about dropout: its random masks, one random number an element of every activation it drops from, a
notable share of a step on a CPU (``practices.dropout_layers``, the op table's dropout ops)."""

from __future__ import annotations

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import STEP, Metric
from gpuscope.diagnose.rules.base import Finding, Refused, rule
from gpuscope.record import RunRecord

DROPOUT_CALLS = ("aten::dropout", "aten::feature_dropout", "aten::alpha_dropout", "aten::feature_alpha_dropout")
"""The ops a dropout layer (or ``F.dropout``, or attention's dropout on a CPU) calls, one a call."""
DROPOUT_OPS = (*DROPOUT_CALLS, "aten::native_dropout", "aten::native_dropout_backward")
"""The ops whose own time is dropout's: the calls, and the fused kernel and its backward a GPU runs."""
MASKS = "aten::bernoulli_"
"""The op that draws a CPU dropout's masks, one random number an element: most of its time there."""
SCALE, APPLY = "aten::div_", "aten::mul"
"""On a CPU, each dropout call scales its mask in place (``aten::div_``) and multiplies its input by it
(``aten::mul``), and its backward multiplies the gradient by it (``aten::mul`` again)."""
MATH_ATTENTION = "aten::_scaled_dot_product_attention_math"
"""The attention a CPU runs where attention drops out in training: its flash attention takes no dropout."""

TORCH_LAYERS = {"TransformerEncoderLayer", "TransformerDecoderLayer", "Transformer", "MultiheadAttention",
                "TransformerEncoder", "TransformerDecoder", "LSTM", "GRU", "RNN"}
"""torch.nn's layers that take a ``dropout`` argument and drop out inside (their own dropout layers, or a recurrent
layer's between its layers)."""


def dropout_time(run: RunRecord) -> tuple[float, int] | None:
    """Seconds a profiled step spends in dropout's ops (host self time on a CPU, their kernels' on a GPU), and their
    calls a step; None without an op table or any dropout op in it. Ops dropout shares with the rest of the step
    count in the proportion of their calls dropout's account for: its masks (``aten::bernoulli_``: a Bernoulli sample
    of the script's own draws them too), and on a CPU their scaling (one ``aten::div_`` a call) and the two
    multiplies by them, in forward and in backward (``aten::mul``, taken as long as the step's other products:
    dropout's are over whole activations, most often longer)."""
    ops = run.op_profile
    if ops is None or not ops.steps:
        return None
    rows = {o.name: o for o in ops.host_ops or ops.top_host}
    device = run.device == "cuda"
    calls = sum(rows[name].calls for name in DROPOUT_CALLS if name in rows)
    if not calls and not any(name in rows for name in DROPOUT_OPS):
        return None
    seconds = sum(rows[name].device_s if device else rows[name].self_host_s for name in DROPOUT_OPS if name in rows)
    shared = ((MASKS, 1),) if device else ((MASKS, 1), (SCALE, 1), (APPLY, 2))
    for name, each in shared:
        row = rows.get(name)
        if row is not None and row.calls and calls:
            seconds += (row.device_s if device else row.self_host_s) * min(1.0, each * calls / row.calls)
    return seconds / ops.steps, round(calls / ops.steps)


def _dropout_share(run: RunRecord, found: tuple[float, int] | None = None) -> float | None:
    """Dropout's share of the median step (``found``: ``dropout_time(run)``, where already read)."""
    if not run.steps.count or not run.steps.median_s:
        return None
    found = found or dropout_time(run)
    return min(1.0, found[0] / run.steps.median_s) if found is not None else None


def _fix(owners: tuple[str, ...]) -> str | None:
    """The change where the dropout layers are: the config of a transformers model, the ``dropout`` argument of
    torch's transformer layers, or the dropout layers of the script's own classes."""
    if not owners:
        return None
    module, _, name = owners[0].rpartition(".")
    if module.startswith("transformers."):
        return ("build the model from a config with its dropout probabilities at 0.0 (GPT-2: resid_pdrop, "
                "embd_pdrop, attn_pdrop; BERT: hidden_dropout_prob, attention_probs_dropout_prob), or pass them "
                "to from_pretrained(..., hidden_dropout_prob=0.0, ...)")
    if module.startswith("torch.nn.") and name in TORCH_LAYERS:
        return f"nn.{name}(..., dropout=0.0)  # where the model is built"
    return f"nn.Dropout(p=0.0), or no dropout layer, in {name} ({module})  # where its layers are made"


@rule(id="skip-dropout",
      title="Train without dropout where the model does not need its regularisation",
      fix="nn.Dropout(p=0.0)  # in the model's layers, where they are made",
      needs=("op_profile",),
      resolved_by=(Metric("dropout's share of the step", "share", _dropout_share), STEP),
      trial=Refused("it changes the optimisation (dropout regularises the model), not only the speed"))
def skip_dropout(run: RunRecord) -> Finding | None:
    """Signal: dropout's ops (``dropout_time``) take ``DROPOUT_NOTABLE`` of the step or more: on a CPU its masks,
    one random number an element of every activation it drops from, cost more than the matmuls around them (a
    TransformerEncoder classifier: 34-38% of its step; a tiny GPT-2: 24%).
    Why it matters: dropout regularises; a model trained on plenty of data for few epochs (pretraining, most large
    models since) overfits little without it, and each step pays for its masks.
    Fix: dropout at 0 where the model does not overfit without it (its validation loss says so); kept where it does
    (a small dataset, fine-tuning).
    Gain: dropout's ops' share of the step (``dropout_time``), a lower bound where attention drops out on a CPU (its
    math path's cost over flash attention's is not counted): the classifier promised 34%, measured 32-49% with
    dropout at 0; a tiny GPT-2 24%, measured 32-43%."""
    found = dropout_time(run)
    share = _dropout_share(run, found)
    if found is None or share is None or share < th.DROPOUT_NOTABLE:
        return None
    seconds, calls = found
    p = run.practices
    evidence = [f"dropout's ops took {seconds * 1e3:.1f} ms of each profiled step, {share:.0%} of the "
                f"{run.steps.median_s * 1e3:.1f} ms step ({calls} calls a step"
                + (", its random masks the most of it)" if run.device != "cuda" else ")")]
    if p is not None and p.dropout_layers:
        rates = ", ".join(f"{rate:g}" for rate in p.dropout_rates)
        owners = ", ".join(owner.rpartition(".")[2] for owner in p.dropout_owners)
        evidence.append(f"the trained model has {p.dropout_layers} dropout layer{'s' * (p.dropout_layers != 1)} "
                        f"(p = {rates}) in {owners}")
    ops = run.op_profile
    math = next((o for o in ops.host_ops or ops.top_host if o.name == MATH_ATTENTION), None) if ops else None
    if math is not None and run.device != "cuda":
        evidence.append(f"attention ran torch's math path ({MATH_ATTENTION}, {math.calls / ops.steps:.0f} calls a "
                        "step), which a CPU takes where attention drops out in training: without dropout its flash "
                        "attention can run, a gain not counted here")
    evidence.append("dropout regularises: turn it off where the model does not overfit without it (plenty of data, "
                    "few epochs), keep it where it does")
    return Finding(share, tuple(evidence), fix=_fix(p.dropout_owners) if p is not None else None)
