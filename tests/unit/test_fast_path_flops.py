"""The FLOPs of the fused ops that nn.TransformerEncoderLayer and nn.MultiheadAttention run in eval mode without
gradients (a frozen encoder, an evaluation): torch's counter has no formula for them and does not see their inner
matmuls, so a frozen TransformerEncoder counted 0 FLOPs."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn

from gpuscope.collect import lean_flops
from gpuscope.collect.attention import fast_path_formulas


def counted(run: Callable[[], object], with_fast_path: bool = True) -> tuple[int, set[str]]:
    """The FLOPs the counter finds in ``run()``, and the ops it counted."""
    mapping = fast_path_formulas(torch) if with_fast_path else {}
    with lean_flops.counter(display=False, custom_mapping=mapping) as mode:
        run()
    return mode.get_total_flops(), {str(op) for op in mode.get_flop_counts().get("Global", {})}


def layer_flops(length: int, embed: int = 96, width: int = 256) -> int:
    """One encoder layer on one sequence, worked by hand: the q, k, v and output projections (4 x 2 x n x E x E),
    the feed-forward's two matmuls (2 x 2 x n x E x F), and the attention's two products (2 x 2 x n x n x E)."""
    return 2 * length * (4 * embed * embed + 2 * embed * width) + 4 * length * length * embed


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_frozen_encoder_counts_what_the_same_layers_count_in_training(norm_first: bool) -> None:
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(96, 4, 256, batch_first=True, norm_first=norm_first),
                                    3, enable_nested_tensor=False)
    x = torch.randn(8, 20, 96)
    training, _ = counted(lambda: encoder(x), with_fast_path=False)  # dropout: attention by matmuls, counted
    encoder.eval()
    with torch.no_grad():
        assert counted(lambda: encoder(x), with_fast_path=False)[0] == 0  # torch's counter alone
        frozen, ops = counted(lambda: encoder(x))
    assert ops == {"aten._transformer_encoder_layer_fwd"}
    assert frozen == training == 3 * 8 * layer_flops(20)


def test_a_padded_batch_counts_each_sequence_at_its_own_length() -> None:
    # a padding mask makes the fast path pack the batch into a nested tensor of sequences of 10 and 6 tokens
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(96, 4, 256, batch_first=True), 2).eval()
    x, mask = torch.randn(2, 10, 96), torch.zeros(2, 10, dtype=torch.bool)
    mask[1, 6:] = True
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype
        assert counted(lambda: encoder(x, src_key_padding_mask=mask))[0] == 2 * (layer_flops(10) + layer_flops(6))


def test_self_attention_in_eval_mode_counts_its_projections_and_both_products() -> None:
    attention = nn.MultiheadAttention(96, 4, batch_first=True).eval()
    x = torch.randn(8, 20, 96)
    with torch.no_grad():
        flops, ops = counted(lambda: attention(x, x, x))
    assert ops == {"aten._native_multi_head_attention"}
    tokens = 8 * 20
    assert flops == 2 * tokens * 96 * 3 * 96 + 4 * 8 * 20 * 20 * 96 + 2 * tokens * 96 * 96
