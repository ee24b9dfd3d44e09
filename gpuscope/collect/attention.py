"""Scaled dot-product attention on a CPU: its FLOPs, and its time in a low-precision dtype against float32.

A CPU runs ``F.scaled_dot_product_attention`` as ``aten::_scaled_dot_product_flash_attention_for_cpu`` (and its
``_backward``), which torch's FLOP counter has no formula for: a CPU step's attention was not counted at all. The
flops collector counts them with torch's formulas for the GPU's flash attention (the same arithmetic), and notes
the first call's shapes, dtype and the user's line that made it. After the run, where that dtype is bfloat16 or
float16, the cpu-peak probe times one forward and backward at those shapes in that dtype and in float32: on the
project's 2-core machine (AMX, torch 2.13) the bfloat16 backward took 37 ms against 9 ms in float32 for a small
ViT's attention (64 x 3 heads x 65 tokens x 64), while its bfloat16 matmuls ran 4x faster than float32's: the
whole-model advice to drop the autocast would lose the matmuls' gain.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

from gpuscope.collect.callsites import call_site, user_frame
from gpuscope.collect.captures import AttentionCall
from gpuscope.collect.framework.probing import fastest

CPU_FLASH = "_scaled_dot_product_flash_attention_for_cpu"
ATTENTION_REPEATS = 5
ATTENTION_BUDGET_S = 0.5
"""Each dtype's timing keeps the fastest of at most ATTENTION_REPEATS forward and backward passes, stopping once
it has taken this long."""
MAX_ATTENTION_ELEMENTS = 2**24
"""A query larger than this (64 MiB in float32; its key, value and their gradients as large) is not timed."""


def cpu_formulas(torch: Any, flop_counter: Any, seen: list[AttentionCall]) -> dict[Any, Callable[..., int]]:
    """FLOP formulas for the CPU's flash attention, forward and backward (torch's for the GPU's); the forward one
    notes its first call in ``seen``. Empty where this torch has no such op."""
    aten = torch.ops.aten
    forward_op, backward_op = getattr(aten, CPU_FLASH, None), getattr(aten, CPU_FLASH + "_backward", None)
    if forward_op is None or backward_op is None:
        return {}

    def forward(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
        if not seen:
            causal = args[1] if len(args) > 1 else kwargs.get("is_causal", False)
            seen.append(AttentionCall(tuple(query.shape), tuple(key.shape), tuple(value.shape),
                                      str(query.dtype).removeprefix("torch."), bool(causal),
                                      call_site(user_frame(sys._getframe(1)))))
        return int(flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape))

    def backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
        return int(flop_counter.sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape))

    forward._get_raw = True  # type: ignore[attr-defined]  # the tensors themselves, not their shapes
    backward._get_raw = True  # type: ignore[attr-defined]
    return {forward_op: forward, backward_op: backward}


def fast_path_formulas(torch: Any) -> dict[Any, Callable[..., int]]:
    """FLOP formulas for the fused ops that ``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention`` run in eval
    mode without gradients (their "fast path": a frozen encoder, an evaluation), which torch's counter has none for
    and whose inner matmuls it does not see: a frozen TransformerEncoder counted 0 FLOPs. The same terms as its
    formulas give the layers in train mode: 2 x M x N x K for each projection and the feed-forward's two matmuls, and
    the attention's two products per sequence (a nested tensor's sequences each at their own length). Empty where
    this torch has neither op."""
    aten = torch.ops.aten
    found: dict[Any, Callable[..., int]] = {}

    def lengths(x: Any) -> list[int]:
        """The sequence lengths of a batch-first ``(batch, length, embedding)`` tensor, or of a nested one's."""
        if getattr(x, "is_nested", False):
            return [int(t.shape[-2]) for t in x.unbind()]
        return [int(x.shape[-2])] * int(math.prod(x.shape[:-2]))

    if (encoder := getattr(aten, "_transformer_encoder_layer_fwd", None)) is not None:
        def encoder_layer(src: Any, embed_dim: int, num_heads: int, qkv_weight: Any, *args: Any, **kwargs: Any) -> int:
            ffn = kwargs.get("ffn_weight_1", args[10] if len(args) > 10 else None)
            width = int(ffn.shape[0]) if ffn is not None else 0
            e = int(embed_dim)
            return sum(2 * n * (4 * e * e + 2 * e * width) + 4 * n * n * e for n in lengths(src))

        encoder_layer._get_raw = True  # type: ignore[attr-defined]
        found[encoder] = encoder_layer
    if (attention := getattr(aten, "_native_multi_head_attention", None)) is not None:
        def multi_head(query: Any, key: Any, value: Any, embed_dim: int, *args: Any, **kwargs: Any) -> int:
            e = int(embed_dim)
            return sum(2 * e * e * (q + 2 * k) + 4 * q * k * e + 2 * q * e * e
                       for q, k in zip(lengths(query), lengths(key)))

        multi_head._get_raw = True  # type: ignore[attr-defined]
        found[attention] = multi_head
    return found


def time_attention(torch: Any, call: AttentionCall, dtype: str, budget_s: float = ATTENTION_BUDGET_S,
                   clock: Callable[[], float] = time.perf_counter) -> float | None:
    """Seconds of the fastest forward and backward of ``call``'s attention in ``dtype`` (one warm-up first), within
    about ``budget_s``; None where its query is over MAX_ATTENTION_ELEMENTS, or where it could not be run (a dtype
    this torch has no CPU attention for: the matmul peak measured beside it is kept). Its own generator: the global
    RNG is not touched."""
    if math.prod(call.query) > MAX_ATTENTION_ELEMENTS:
        return None
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=generator).to(getattr(torch, dtype)).requires_grad_()
               for shape in (call.query, call.key, call.value))

    def once() -> None:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=call.is_causal)
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    try:
        best, _ = fastest(once, ATTENTION_REPEATS, budget_s, clock)
    except Exception:
        return None
    return best

