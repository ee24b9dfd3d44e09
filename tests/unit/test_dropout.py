"""``skip-dropout``: dropout's ops timed in the profiled steps (on a CPU its random masks cost more than the matmuls
around them), the dropout layers found in the trained model, and the fix where they are made."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import make_record
from gpuscope.diagnose import analyze
from gpuscope.diagnose.rules.dropout import dropout_time, skip_dropout
from gpuscope.record import OpProfile, OpStat, Practices, RunRecord, Steps, Window

torch = pytest.importorskip("torch")

RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "records"


def cpu_step(*rows: OpStat, median_s: float = 0.1, **practices: object) -> RunRecord:
    """A CPU run of ``median_s`` steps whose op table over 2 profiled steps holds ``rows``."""
    return make_record(steps=Steps(count=40, median_s=median_s, total=52, source="optimizer"),
                       op_profile=OpProfile(window=Window(7, 8), steps=2, host_ops=rows, top_host=rows),
                       practices=Practices(modules_inspected=True, **practices))  # type: ignore[arg-type]


def test_a_recorded_transformer_classifiers_dropout_is_told_with_its_share_and_the_layer_to_change() -> None:
    # given a TransformerEncoder text classifier (tests/fixtures/records/README.md), dropout 0.1 in its two layers
    record = analyze(RunRecord.from_json(json.loads((RECORDS / "text_transformer.json").read_text())))
    found = {r.id: r for r in record.recommendations}["skip-dropout"]
    # then its ops over the 3 profiled steps: dropout's own 0.39 ms, the masks' 105.98 ms, their scaling's 1.87 ms
    # and 48 of the 87 multiplies' 13.56 ms: 38.57 ms a step, 38% of the 101.9 ms step
    assert found.expected_gain == pytest.approx(0.378, abs=0.001)
    assert found.evidence[0] == ("dropout's ops took 38.6 ms of each profiled step, 38% of the 101.9 ms step (8 calls "
                                 "a step, its random masks the most of it)")
    assert found.evidence[1] == "the trained model has 8 dropout layers (p = 0.1) in TransformerEncoderLayer"
    assert found.evidence[2].startswith("attention ran torch's math path (aten::_scaled_dot_product_attention_math, "
                                        "2 calls a step), which a CPU takes where attention drops out in training")
    assert found.fix == "nn.TransformerEncoderLayer(..., dropout=0.0)  # where the model is built"
    # and it is never tried at run time: it changes the optimisation
    from gpuscope.diagnose.rules.base import RULES, Refused

    assert isinstance(next(r for r in RULES if r.id == "skip-dropout").trial, Refused)


def test_masks_drawn_for_the_scripts_own_sampling_are_not_counted_as_dropouts() -> None:
    # given 10 dropout calls a profiled step and 40 Bernoulli draws (30 of the script's own sampling)
    record = cpu_step(OpStat("aten::dropout", 20, 0.001), OpStat("aten::bernoulli_", 80, 0.08),
                      OpStat("aten::div_", 20, 0.002), OpStat("aten::mul", 40, 0.01))
    seconds, calls = dropout_time(record)
    # then a quarter of the draws' time is dropout's, as are the scaling and 40 of the 40 multiplies:
    # (0.001 + 0.02 + 0.002 + 0.01) / 2 steps
    assert calls == 10 and seconds == pytest.approx(0.0165)
    assert skip_dropout(record).gain == pytest.approx(0.165)


def test_dropout_under_a_tenth_of_the_step_is_not_advised() -> None:
    record = cpu_step(OpStat("aten::dropout", 20, 0.001), OpStat("aten::bernoulli_", 20, 0.017))
    assert skip_dropout(record) is None  # 9 ms of a 100 ms step
    assert skip_dropout(cpu_step(OpStat("aten::mm", 20, 0.1))) is None  # no dropout at all


def test_on_a_gpu_the_fused_kernels_time_is_dropouts() -> None:
    rows = (OpStat("aten::dropout", 20, 0.0004), OpStat("aten::native_dropout", 20, 0.0002, 0.024),
            OpStat("aten::native_dropout_backward", 20, 0.0001, 0.008))
    record = dataclasses.replace(cpu_step(*rows), device="cuda")
    seconds, _ = dropout_time(record)
    assert seconds == pytest.approx(0.016)  # the kernels' 32 ms over 2 steps, not the host's
    finding = skip_dropout(record)
    assert finding.gain == pytest.approx(0.16) and "masks" not in finding.evidence[0]


@pytest.mark.parametrize("owner, fix", [
    ("transformers.models.gpt2.modeling_gpt2.GPT2Attention", "build the model from a config with its dropout "
     "probabilities at 0.0 (GPT-2: resid_pdrop"),
    ("torch.nn.modules.transformer.TransformerDecoderLayer", "nn.TransformerDecoderLayer(..., dropout=0.0)"),
    ("torch.nn.modules.rnn.LSTM", "nn.LSTM(..., dropout=0.0)"),
    ("__main__.Block", "nn.Dropout(p=0.0), or no dropout layer, in Block (__main__)"),
])
def test_the_fix_goes_where_the_dropout_layers_are_made(owner: str, fix: str) -> None:
    record = cpu_step(OpStat("aten::dropout", 20, 0.001), OpStat("aten::bernoulli_", 20, 0.05), dropout_layers=6,
                      dropout_rates=(0.1,), dropout_owners=(owner,))
    assert skip_dropout(record).fix.startswith(fix)


def test_the_model_is_read_for_the_dropout_layers_that_drop_in_train_mode() -> None:
    from gpuscope.collect.collectors.practices import inspect_modules

    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, p: float) -> None:
            super().__init__()
            self.linear, self.drop = nn.Linear(4, 4), nn.Dropout(p)

    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, 0.1, batch_first=True), 2,
                                    enable_nested_tensor=False)
    read = inspect_modules(torch, [encoder])
    # each layer's three nn.Dropout and its attention's dropout
    assert (read["dropout_layers"], read["dropout_rates"]) == (8, (0.1,))
    assert read["dropout_owners"] == ("torch.nn.modules.transformer.TransformerEncoderLayer",)
    # a recurrent layer of several layers drops out between them: it holds that dropout itself
    read = inspect_modules(torch, [nn.Sequential(nn.Embedding(10, 4), nn.LSTM(4, 8, num_layers=2, dropout=0.3),
                                                 nn.GRU(8, 8, dropout=0.0))])
    assert (read["dropout_layers"], read["dropout_owners"]) == (1, ("torch.nn.modules.rnn.LSTM",))
    # a layer that drops nothing, or one in eval mode, is not counted
    model = nn.Sequential(Block(0.3), Block(0.0), Block(0.5).eval(), nn.Dropout(0.2))
    read = inspect_modules(torch, [model])
    assert (read["dropout_layers"], read["dropout_rates"]) == (2, (0.3, 0.2))
    assert set(read["dropout_owners"]) == {f"{__name__}.{Block.__qualname__}",
                                           "torch.nn.modules.container.Sequential"}
