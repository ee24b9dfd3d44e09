"""torch's FLOP counter at half its cost per op: ``FlopCounterMode`` whose dispatch mode asks once per op, not at
every call, whether the op has a ``CompositeImplicitAutograd`` kernel to decompose into the ops it counts.

torch's own ``_FlopCounterMode.__torch_dispatch__`` enters itself again and calls ``func.decompose`` for every op not
keyed in the FLOP registry, which is every op (the registry is keyed by overload packet, the dispatch by overload):
on an LSTM's closure call of 93k ops, 0.74 s plain, the count took 3.1 s, this one 1.8 s, to the same FLOP
(benchmarks/README.md, "Few, long steps"). Everything else is torch's: the ops it skips, higher-order ops, the
decomposition where there is one, the formulas (``_count_flops``). Where torch's counter is not built that way (other
versions), ``counter`` gives torch's own.
"""

from __future__ import annotations

import sys
from typing import Any

from gpuscope.collect.lazy_dynamo import leave_unimported

SKIPPED = ("sym_is_contiguous.default", "is_contiguous.default", "is_contiguous.memory_format",
           "is_strides_like_format.default", "is_non_overlapping_and_dense.default", "size.default",
           "sym_size.default", "stride.default", "sym_stride.default", "storage_offset.default",
           "sym_storage_offset.default", "numel.default", "sym_numel.default", "dim.default")
"""The aten ops torch's counter leaves to the tensor's own policy (``NotImplemented``), with ``prim.layout``."""

_lean: Any = None


def counter(**kwargs: Any) -> Any:
    """A ``FlopCounterMode(**kwargs)``: the lean one where torch's counter has the parts it relies on. Its dispatch
    mode imports nothing the script would not (``lazy_dynamo``)."""
    from torch.utils import flop_counter

    lean = _lean_class(flop_counter)
    dispatch = lean.dispatch if lean is not None else getattr(flop_counter, "_FlopCounterMode",
                                                              flop_counter.FlopCounterMode)
    leave_unimported(vars(dispatch).get("__torch_dispatch__"))
    return (lean or flop_counter.FlopCounterMode)(**kwargs)


def _lean_class(flop_counter: Any) -> Any:
    """The lean counter class, made once; None where torch's counter lacks the parts it relies on."""
    global _lean
    if _lean is not None:
        return _lean or None
    base = getattr(flop_counter, "_FlopCounterMode", None)
    if base is None or not hasattr(base, "_handle_higher_order_ops") \
            or not hasattr(flop_counter.FlopCounterMode, "_count_flops"):
        _lean = False
        return None
    torch = sys.modules["torch"]
    skipped = {torch.ops.prim.layout.default}
    for packet, overload in (name.split(".") for name in SKIPPED):
        try:
            skipped.add(getattr(getattr(torch.ops.aten, packet), overload))
        except (AttributeError, RuntimeError):  # an op this torch does not have (sym_is_contiguous before 2.9)
            continue
    device = torch.ops.prim.device.default
    higher_order = torch._ops.HigherOrderOperator
    composite = torch._C.DispatchKey.CompositeImplicitAutograd
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    decomposable: dict[Any, bool] = {}

    class LeanDispatch(base):  # type: ignore[misc, valid-type]
        """torch's dispatch mode, asking whether an op decomposes once per op."""

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs if kwargs else {}
            if func in skipped:
                return NotImplemented
            if isinstance(func, higher_order):
                return self._handle_higher_order_ops(func, types, args, kwargs)
            splits = decomposable.get(func)
            if splits is None:
                splits = decomposable[func] = func is not device and (
                    composite in func.py_kernels or has_kernel(func.name(), composite))
            if splits:
                with self:
                    out = func.decompose(*args, **kwargs)
                    if out is not NotImplemented:
                        return out
            out = func(*args, **kwargs)
            return self.counter._count_flops(func._overloadpacket, out, args, kwargs)

    class LeanCounter(flop_counter.FlopCounterMode):  # type: ignore[misc, valid-type]
        """``FlopCounterMode`` entering ``LeanDispatch``."""

        dispatch = LeanDispatch

        def __enter__(self) -> Any:
            self.flop_counts.clear()
            self.mod_tracker.__enter__()
            self.mode = LeanDispatch(self)
            self.mode.__enter__()
            return self

    _lean = LeanCounter
    return LeanCounter
