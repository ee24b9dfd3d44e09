"""Mixed precision on a CPU, measured: the counted step's heaviest matmul and convolution shapes (``HeavyOps``, fed
by the FLOP counter), timed again after the run in float32 and under ``torch.autocast('cpu', dtype=torch.bfloat16)``
(``time_autocast``), where the step ran in float32. A CPU with bfloat16 matrix instructions (AVX512-BF16, AMX) runs
them about twice as fast; one without, many times slower: only a timing on this machine tells which, and at the
step's own shapes (a small 3x3 convolution gained 1.2x here where a DCGAN's discriminator step gained 1.8x)."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

from gpuscope.collect.allocator import return_freed_heap
from gpuscope.collect.captures import HeavyOp
from gpuscope.collect.framework.probing import fastest

CONV_OPS = frozenset({"aten.convolution", "aten._convolution"})
"""The counted ops whose arguments are a convolution's forward: its backward is timed with it."""
MATMUL_OPS = {"aten.mm": 0, "aten.bmm": 0, "aten.addmm": 1, "aten.baddbmm": 1}
"""The counted matmul ops, and the position of their first matrix among their arguments (after ``addmm``'s bias)."""
SHAPES_KEPT = 2
"""Shapes timed of each kind, those with the most FLOPs in the counted step."""
AUTOCAST_REPEATS = 3
AUTOCAST_BUDGET_S = 0.15
"""Each shape's timings in each dtype stop once they have taken this long (after a warm-up): the compute-bound
sample's largest shape takes 0.18 s in float32, timed once after its warm-up."""
NO_FASTER = "bfloat16 matmuls no faster than float32 ones here"
"""What the probe's source says where ``bfloat16_faster`` found none (``autocast_timing``'s reason not to check)."""
CHECK_SIZE = 256
"""The square matmul timed in both dtypes first: a CPU without bfloat16 instructions runs the step's shapes many
times slower in it (about 70x on one of the project's VMs), too long to time them."""


class HeavyOps:
    """The counted step's matmul and convolution FLOPs by shape (from the FLOP counter's formulas' arguments)."""

    def __init__(self) -> None:
        self._flops: dict[HeavyOp, int] = {}

    def add(self, op: str, args: tuple[Any, ...], flops: int) -> None:
        """``op``'s call with ``args`` (its tensors themselves), of ``flops``: kept where the forward pass made it
        (its backward is timed with it; autocast's casts of its operands are made once, there)."""
        if sys.modules["torch"]._C._current_graph_task_id() >= 0:  # inside backward
            return
        heavy = _conv(args) if op in CONV_OPS else _matmul(args, MATMUL_OPS[op]) if op in MATMUL_OPS else None
        if heavy is not None:
            self._flops[heavy] = self._flops.get(heavy, 0) + int(flops)

    def clear(self) -> None:
        self._flops.clear()

    def top(self) -> tuple[HeavyOp, ...]:
        """Of each kind, the ``SHAPES_KEPT`` shapes with the most FLOPs, each with its FLOPs and its kind's."""
        kept = []
        for kind in ("conv", "matmul"):
            ranked = sorted(((op, n) for op, n in self._flops.items() if op.kind == kind), key=lambda x: -x[1])
            total = sum(n for _, n in ranked)
            kept += [_with(op, n, total) for op, n in ranked[:SHAPES_KEPT]]
        return tuple(kept)


def _with(op: HeavyOp, flops: int, kind_flops: int) -> HeavyOp:
    return dataclasses.replace(op, flops=flops, kind_flops=kind_flops)


def _grads(*tensors: Any) -> tuple[bool, ...]:
    return tuple(bool(getattr(t, "requires_grad", False)) for t in tensors)


def _shape(tensor: Any) -> tuple[int, ...] | None:
    shape = getattr(tensor, "shape", None)
    return tuple(int(n) for n in shape) if shape is not None else None


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)


def _conv(args: tuple[Any, ...]) -> HeavyOp | None:
    """``convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)``: 2-d
    ones (what ``time_one`` rebuilds), transposed or not."""
    if len(args) < 9:
        return None
    x, w = _shape(args[0]), _shape(args[1])
    if x is None or w is None or len(x) != 4 or len(w) != 4:
        return None
    return HeavyOp("conv", (x, w), _ints(args[3]), _ints(args[4]), _ints(args[5]), int(args[8]), bool(args[6]),
                   _ints(args[7]), grads=_grads(args[0], args[1]))


def _matmul(args: tuple[Any, ...], first: int) -> HeavyOp | None:
    if len(args) < first + 2:
        return None
    a, b = _shape(args[first]), _shape(args[first + 1])
    if a is None or b is None or len(a) not in (2, 3) or len(a) != len(b):
        return None
    return HeavyOp("matmul", (a, b), grads=_grads(args[first], args[first + 1]))


def time_one(torch: Any, op: HeavyOp, autocast: bool, fresh: bool = False, repeats: int = AUTOCAST_REPEATS,
             budget_s: float = AUTOCAST_BUDGET_S, clock: Callable[[], float] = time.perf_counter) -> float:
    """The fastest of up to ``repeats`` runs of ``op`` at its shapes from float32 tensors, as the step ran it or
    under bfloat16 autocast (``autocast``; its casts included, as autocast makes them once a forward, and its
    output's back to float32, as the float32 ops after it read it: a GPT-2's 1024x128 by 128x50257 logits matmul,
    forward and backward, 370 ms in float32, 174 ms in bfloat16, 293 ms with that cast, whose 205 MB copy is
    faulted in afresh; its whole step 14% faster under autocast, where the matmul alone promised 34%): the forward
    and, where an operand needed a gradient in the step, the backward that makes it. ``fresh``: before each run
    the C heap's free memory goes back to the system (``return_freed_heap``), so that what the run allocates
    (autocast's bfloat16 copy of the weight, the gradients) is faulted in afresh, as glibc has it where it hands
    freed blocks back at once: an MLP's 2048x2048 layer at batch 64 ran 1.8x faster under autocast with its
    pages kept, 1.05x faulted in afresh, and its training step, in bfloat16 from the process's start, ran slower
    than in float32 (27 against 20 ms; 13 ms with glibc's thresholds raised). Its own generator: the global RNG is
    not touched."""
    generator = torch.Generator().manual_seed(0)
    first, second = (torch.randn(*s, generator=generator).requires_grad_(grad) for s, grad in zip(op.shapes, op.grads))
    functional = torch.nn.functional
    out_grad: list[Any] = []

    def forward() -> Any:
        if op.kind == "matmul":
            return (torch.bmm if len(op.shapes[0]) == 3 else torch.mm)(first, second)
        if op.transposed:
            return functional.conv_transpose2d(first, second, None, op.stride, op.padding, op.output_padding,
                                               op.groups, op.dilation)
        return functional.conv2d(first, second, None, op.stride, op.padding, op.dilation, op.groups)

    def run() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = forward()
        if autocast:  # the step's float32 ops (the loss, layer norms) read it so: the cast back, and its gradient's
            out = out.float()
        if out.requires_grad:
            if not out_grad:
                out_grad.append(torch.ones_like(out))
            out.backward(out_grad[0])

    # (fresh: timed after the pages-kept timings, whose warm-up made oneDNN's kernels for the shape)
    best, _ = fastest(run, repeats, budget_s, clock, before_each=return_freed_heap if fresh else None,
                      warm_up=not fresh)
    return best


def bfloat16_faster(torch: Any, clock: Callable[[], float] = time.perf_counter) -> bool:
    """Whether a ``CHECK_SIZE`` matmul runs faster in bfloat16 than in float32 on this machine (a few ms)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(CHECK_SIZE, CHECK_SIZE, generator=generator)
    low = a.to(torch.bfloat16)
    with torch.no_grad():
        float32, _ = fastest(lambda: torch.mm(a, a), AUTOCAST_REPEATS, AUTOCAST_BUDGET_S / 4, clock)
        bfloat16, _ = fastest(lambda: torch.mm(low, low), AUTOCAST_REPEATS, AUTOCAST_BUDGET_S / 4, clock)
    return bfloat16 < float32


def describe(op: HeavyOp) -> str:
    """``a 3x3 convolution, 64 to 128 channels, 8 images of 32x32`` / ``a 512x256 by 256x1024 matmul``."""
    first, second = op.shapes
    if op.kind == "conv":
        images, channels, height, width = first
        out = second[1] * op.groups if op.transposed else second[0]
        kind = "transposed convolution" if op.transposed else "convolution"
        return (f"a {second[2]}x{second[3]} {kind}, {channels} to {out} channels, {images} images of "
                f"{height}x{width}")
    batch = f"{first[0]} x " if len(first) == 3 else ""
    return f"a {batch}{'x'.join(map(str, first[-2:]))} by {'x'.join(map(str, second[-2:]))} matmul"


Timed = tuple[HeavyOp, float, float, float, float]
"""A shape and its seconds in float32 and under bfloat16 autocast, its memory's pages kept, then faulted in afresh."""


def time_autocast(torch: Any, ops: tuple[HeavyOp, ...], clock: Callable[[], float] = time.perf_counter
                  ) -> tuple[Timed, ...]:
    """Each of ``ops`` timed in float32 and under bfloat16 autocast, with the pages it allocates kept from run to
    run and faulted in afresh (``time_one``)."""
    return tuple((op, *(time_one(torch, op, autocast, fresh, clock=clock) for fresh in (False, True)
                        for autocast in (False, True))) for op in ops)  # type: ignore[misc]
