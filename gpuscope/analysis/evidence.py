"""Figures derived from the record that several parts of the diagnosis rest on (computed in one place)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuscope.record import RunRecord


@dataclass(frozen=True, slots=True)
class Overhead:
    """Per-op fixed cost in a CPU run's step: ``ops_per_step`` x ``op_cost_s`` = ``seconds``, ``share`` of the
    steady-state median step (0..1)."""

    ops_per_step: float
    op_cost_s: float
    seconds: float
    share: float


def compute_time_s(median_s: float, data_wait: float) -> float:
    """The part of a step that is not waiting for data: median step x (1 - data wait share), the time in which
    the next batch must be ready for the step never to wait."""
    return median_s * (1 - data_wait)


def cpu_overhead(record: RunRecord) -> Overhead | None:
    """The share of the step that is per-op fixed cost, from the op profile and the calibration; None if either
    is missing."""
    ops, calibration, median = record.op_profile, record.calibration, record.steps.median_s
    if ops is None or not ops.ops or calibration is None or not calibration.op_overhead_s or not median:
        return None
    seconds = ops.ops_per_step * calibration.op_overhead_s
    return Overhead(ops.ops_per_step, calibration.op_overhead_s, seconds, min(1.0, seconds / median))


def batch_size(record: RunRecord) -> int:
    """The largest batch size among the run's loaders (0 when none is known)."""
    return max((loader.batch_size or 0 for loader in record.loaders), default=0)


ELEMENTWISE = frozenset({
    "abs", "add", "addcdiv", "addcmul", "clamp", "clamp_min", "cos", "div", "erf", "exp", "fill", "gelu",
    "hardtanh", "leaky_relu", "lerp", "log", "log_sigmoid", "maximum", "minimum", "mul", "neg", "pow", "reciprocal",
    "relu", "rsqrt", "rsub", "sigmoid", "sigmoid_backward", "silu", "sin", "sqrt", "sub", "tanh", "tanh_backward",
    "threshold_backward", "gelu_backward", "silu_backward", "where", "zero",
})
"""aten ops that compute each output element from the matching input elements: chains of them are what a fusing
compiler turns into one kernel (in-place forms, ``add_``, count too)."""
MATMUL = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "addbmm"})


def op_kind(name: str) -> str:
    """``elementwise``, ``matmul``, ``conv`` or ``other``, from an op's profiler name (``aten::add_``)."""
    base = name.removeprefix("aten::").rstrip("_")
    if base in ELEMENTWISE:
        return "elementwise"
    if base in MATMUL:
        return "matmul"
    if "conv" in base:
        return "conv"
    return "other"
