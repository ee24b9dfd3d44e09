"""FLOP formulas for the CPU's fused LSTM layer, oneDNN's ``mkldnn_rnn_layer``, which ``nn.LSTM`` runs on a CPU and
torch's counter has none for: pytorch/examples' word-language model (a 2-layer LSTM of 200) counted its decoder
alone. Each timestep computes its gates with two matmuls, of the input and of the hidden state: 2 x rows x gates x
(input + hidden) FLOPs over a layer's timesteps and batch (``rows``); its backward twice that, the gradients of the
inputs and of the weights, as torch counts a matmul's. (``nn.GRU`` and ``nn.RNN`` run as matmuls on a CPU, which
torch counts.)"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

LAYER = "mkldnn_rnn_layer"
"""The op's name in ``torch.ops.aten`` (``aten::mkldnn_rnn_layer`` in a trace), and ``_backward`` its gradient's."""


def layer_flops(inputs: Sequence[int], weight_ih: Sequence[int], weight_hh: Sequence[int]) -> int:
    """One layer's forward over its ``inputs`` (timesteps x batch x features, either order): the input's and the
    hidden state's matmuls at every timestep, their weights ``gates x input`` and ``gates x hidden``."""
    rows = math.prod(inputs[:-1])
    return 2 * rows * int(weight_ih[0]) * (int(weight_ih[1]) + int(weight_hh[1]))


def rnn_formulas(torch: Any) -> dict[Any, Callable[..., int]]:
    """The counter's formulas (given the tensors), by op; empty where this torch has no such op."""
    aten = torch.ops.aten
    forward_op, backward_op = getattr(aten, LAYER, None), getattr(aten, LAYER + "_backward", None)
    if forward_op is None or backward_op is None:
        return {}

    def forward(inputs: Any, weight_ih: Any, weight_hh: Any, *args: Any, **kwargs: Any) -> int:
        return layer_flops(inputs.shape, weight_ih.shape, weight_hh.shape)

    def backward(inputs: Any, weight_ih: Any, weight_hh: Any, *args: Any, **kwargs: Any) -> int:
        return 2 * layer_flops(inputs.shape, weight_ih.shape, weight_hh.shape)

    forward._get_raw = True  # type: ignore[attr-defined]  # the tensors themselves, not their shapes
    backward._get_raw = True  # type: ignore[attr-defined]
    return {forward_op: forward, backward_op: backward}


def shape_formulas() -> dict[str, Callable[..., int]]:
    """The same by the ops' names in a trace, given their recorded shapes (``collect/trace_flops.py``)."""
    return {"aten::" + LAYER: lambda inputs, weight_ih, weight_hh, *args, **kwargs:
            layer_flops(inputs, weight_ih, weight_hh),
            "aten::" + LAYER + "_backward": lambda inputs, weight_ih, weight_hh, *args, **kwargs:
            2 * layer_flops(inputs, weight_ih, weight_hh)}
