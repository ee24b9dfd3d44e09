"""A step's FLOPs read from its trace: torch's own formulas (``torch.utils.flop_counter``, the FLOP counter's) applied
to the shapes torch.profiler recorded for each op (``record_shapes``: "Input Dims", "Input type", "Concrete Inputs").

For a run of a few long steps that ends before the FLOP counter's step: the traced step is the one left, and a
FlopCounterMode over it would have distorted the trace's op times (every op through Python). As the counter counts
the outermost op it sees, an op is counted here only outside another counted one on its thread
(``aten::convolution`` over ``aten::_convolution``); composite ops (``aten::linear``) are not in the formulas, and
count through the ops they call (``aten::addmm``). The trace holds no output shapes: a convolution's is worked out
from its input, weight, stride, padding and dilation. An op with a formula whose arguments cannot be read is listed
as not counted, never guessed.
"""

from __future__ import annotations

import ast
import inspect
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuscope.collect.attention import CPU_FLASH
from gpuscope.collect.rnn_flops import shape_formulas

CPU_FLASH_OP = "aten::" + CPU_FLASH
"""The CPU's flash attention, which torch's formulas lack: counted as the GPU's is (``collect/attention.py``)."""
NOT_TENSORS = frozenset({"", "Scalar", "ScalarList", "TensorList", "GenericList"})
"""``Input type`` values of arguments that are no tensor (a tensor's is its dtype's name)."""
DTYPES = {"float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
          "c10::Float8_e4m3fn": "float8_e4m3fn", "c10::Float8_e5m2": "float8_e5m2"}
"""The trace's dtype names as torch names them."""
CONVOLUTIONS = ("aten::convolution", "aten::_convolution", "aten::cudnn_convolution",
                "aten::convolution_overrideable", "aten::_slow_conv2d_forward")


@dataclass(frozen=True, slots=True)
class TraceFlops:
    """The FLOPs of the trace's recorded ops: by op (``aten::`` left off, as the counter's), by the dtype of each op's
    first tensor, and the ops with a formula that could not be applied (their calls)."""

    step: int | None
    flops_by_op: dict[str, int] = field(default_factory=dict)
    flops_by_dtype: dict[str, int] = field(default_factory=dict)
    not_counted: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.flops_by_op.values())


def formulas() -> dict[str, Callable[..., int]]:
    """Each op the counter counts, by its name in a trace, with its formula taking shapes (``out_val``: the output's
    shape, where the formula reads it)."""
    from torch.utils import flop_counter

    found: dict[str, Callable[..., int]] = {}
    for op, formula in flop_counter.flop_registry.items():
        name = str(op)
        if name.startswith("aten."):
            found["aten::" + name.removeprefix("aten.")] = _positional(formula)
    found[CPU_FLASH_OP] = lambda q, k, v, *args, **kwargs: int(flop_counter.sdpa_flop_count(q, k, v))
    found[CPU_FLASH_OP + "_backward"] = \
        lambda g, q, k, v, *args, **kwargs: int(flop_counter.sdpa_backward_flop_count(g, q, k, v))
    found.update(shape_formulas())
    return found


def _positional(formula: Callable[..., int]) -> Callable[..., int]:
    """``formula`` taking the op's arguments as the trace lists them, all by position: those its schema makes
    keyword-only (``addmm``'s ``beta`` and ``alpha``) are left off where the formula takes no more."""
    try:
        parameters = inspect.signature(formula, follow_wrapped=True).parameters.values()
    except (TypeError, ValueError):
        return formula
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return formula
    takes = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "out_shape" for p in parameters)
    return lambda *args, out_val=None: formula(*args[:takes], out_val=out_val)


def trace_flops(path: Path) -> TraceFlops | None:
    """The FLOPs of the trace at ``path`` (as torch.profiler exports it), or None where it recorded no shapes. (Read
    whole, as the trace collector reads a trace over its cap: only a run's one traced step of long steps is read.)"""
    names = formulas()
    ops: list[dict[str, Any]] = []
    steps: list[int] = []
    shapes = False
    for event in json.loads(path.read_text(errors="replace")).get("traceEvents", []):
        name = event.get("name")
        if event.get("ph") != "X" or not isinstance(name, str):
            continue
        if name.startswith("ProfilerStep#"):
            steps.append(int(name.removeprefix("ProfilerStep#")))
        elif event.get("cat") == "cpu_op":
            shapes = shapes or "Input Dims" in (event.get("args") or {})
            if name in names:
                ops.append(event)
    if not shapes:
        return None
    return count_flops(ops, names, step=min(steps) if steps else None)


def count_flops(events: Iterable[Mapping[str, Any]], names: Mapping[str, Callable[..., int]],
                step: int | None = None) -> TraceFlops:
    """The FLOPs of ``events`` (CPU ops with their shapes) whose names have a formula in ``names``; an op inside another
    counted one, on the same thread, is not counted again."""
    by_thread: dict[tuple[Any, Any], list[Mapping[str, Any]]] = {}
    for event in events:
        if event.get("name") in names:
            by_thread.setdefault((event.get("pid"), event.get("tid")), []).append(event)
    by_op: dict[str, int] = {}
    by_dtype: dict[str, int] = {}
    missed: dict[str, int] = {}
    for thread in by_thread.values():
        thread.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        counted_until = -math.inf
        for event in thread:
            if event["ts"] < counted_until:
                continue  # called by a counted op: its FLOPs are that op's
            counted_until = event["ts"] + event.get("dur", 0)
            name = event["name"]
            flops, dtype = _flops(name, event.get("args") or {}, names[name])
            if flops is None:
                missed[name] = missed.get(name, 0) + 1
                continue
            short = name.removeprefix("aten::")
            by_op[short] = by_op.get(short, 0) + flops
            if dtype is not None:
                by_dtype[dtype] = by_dtype.get(dtype, 0) + flops
    return TraceFlops(step, {k: v for k, v in by_op.items() if v}, {k: v for k, v in by_dtype.items() if v}, missed)


def _flops(name: str, args: Mapping[str, Any], formula: Callable[..., int]) -> tuple[int | None, str | None]:
    """The op's FLOPs by its formula, and the dtype of its first tensor; None where its arguments cannot be read."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    concrete = args.get("Concrete Inputs") or []
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        return None, None
    values: list[Any] = []
    dtype = None
    for i, (shape, kind) in enumerate(zip(dims, types)):
        if kind in NOT_TENSORS:
            values.append(_literal(concrete[i]) if i < len(concrete) else None)
        else:
            values.append(list(shape))
            dtype = dtype or DTYPES.get(kind, kind)
    try:
        out = _output(name, values)
        return int(formula(*values, out_val=out)), dtype
    except Exception:
        return None, None


def _literal(text: Any) -> Any:
    """A recorded scalar argument ("[1, 1]", "False", "0.1"); None where none was recorded."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _output(name: str, values: list[Any]) -> Any:
    """The output shape a formula reads: a convolution's (worked out), a convolution backward's gradients' (its input's
    and weight's); None for the others."""
    if name in CONVOLUTIONS:
        x, w, _bias, stride, padding, dilation, transposed, *rest = values
        output_padding = rest[0] if rest and isinstance(rest[0], list) else [0]
        groups = rest[1] if len(rest) > 1 and isinstance(rest[1], int) else 1
        return conv_output(x, w, stride, padding, dilation, bool(transposed), output_padding, groups)
    if name == "aten::convolution_backward":
        return [values[1], values[2], [values[2][0]]]
    return None


def conv_output(x: list[int], w: list[int], stride: list[int], padding: list[int], dilation: list[int],
                transposed: bool, output_padding: list[int], groups: int) -> list[int]:
    """The output shape of a convolution of input ``x`` by weight ``w``, as torch works it out."""
    spatial = len(x) - 2

    def each(values: list[int] | int) -> list[int]:
        values = [values] if isinstance(values, int) else list(values)
        return values * spatial if len(values) == 1 else values

    stride, padding, dilation, output_padding = each(stride), each(padding), each(dilation), each(output_padding)
    size = []
    for i in range(spatial):
        kernel = dilation[i] * (w[2 + i] - 1) + 1
        if transposed:
            size.append((x[2 + i] - 1) * stride[i] - 2 * padding[i] + kernel + output_padding[i])
        else:
            size.append((x[2 + i] + 2 * padding[i] - kernel) // stride[i] + 1)
    channels = w[1] * groups if transposed else w[0]
    return [x[0], channels, *size]


__all__ = ["TraceFlops", "conv_output", "count_flops", "formulas", "trace_flops"]
