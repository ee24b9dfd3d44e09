"""Keeping ``torch._dynamo`` out of a process that never imported it.

Since torch 2.10 much of torch is wrapped by ``torch._disable_dynamo`` (every TorchDispatchMode's
``__torch_dispatch__``; ``Optimizer.add_param_group`` and ``zero_grad``), which at the wrapped function's first call
imports ``torch._dynamo`` (and with it sympy, torch.distributed and torch.onnx: about 800 modules, 2.2 s of CPU on
the project's 2-core machine) only to keep the function out of what torch.compile traces, and caches the result on
the function. A script that never imports torch._dynamo compiles nothing, so where gpuscope uses such a function in
the script's run (the FLOP counter's dispatch mode, in a counted step) it fills the cache with the function itself:
the script's process pays under gpuscope what it pays under python. Where torch._dynamo is imported already, or a
torch wraps differently, nothing is changed. (Every torch.optim optimizer's ``step`` imports it outright.)
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

DYNAMO_CACHE = "__dynamo_disable"
"""The attribute ``torch._disable_dynamo``'s wrapper caches the disabled function in, on the wrapped function."""


def lazily_disabled(wrapper: Any) -> Callable[..., Any] | None:
    """The function ``wrapper`` wraps, where it is ``torch._disable_dynamo``'s wrapper; None otherwise."""
    inner = getattr(wrapper, "__wrapped__", None)
    code = getattr(wrapper, "__code__", None)
    if inner is None or code is None or not code.co_filename.replace("\\", "/").endswith("torch/_compile.py"):
        return None
    return inner


def leave_unimported(wrapper: Any) -> Callable[..., Any] | None:
    """Fill ``wrapper``'s cache with the function it wraps, where torch._dynamo is not imported and the cache is
    empty: the function it filled, else None."""
    inner = lazily_disabled(wrapper)
    if "torch._dynamo" in sys.modules or inner is None or hasattr(inner, DYNAMO_CACHE):
        return None
    setattr(inner, DYNAMO_CACHE, inner)
    return inner


@contextlib.contextmanager
def inductor_left_unimported() -> Iterator[None]:
    """torch.profiler asks ``hasattr(torch, "_inductor")`` as it starts (to read whether inductor's CUDA graphs are
    on), and torch's lazy attributes import a submodule on that question: torch._inductor and torch._dynamo with it,
    1.3 s of a 2-core machine in a script that had imported neither (no torch.optim, no torch.compile). Where
    inductor is not imported, the question reads "no" while the profiler starts or steps: its CUDA graphs cannot be
    on. (For those moments, another of the script's threads reaching torch._inductor through torch's attributes,
    not an import, would be told it is not there.)"""
    import torch

    if "torch._inductor" in sys.modules or not callable(getattr(torch, "__getattr__", None)):
        yield
        return
    lazy = torch.__getattr__

    def without_inductor(name: str) -> Any:
        if name == "_inductor":
            raise AttributeError(name)
        return lazy(name)

    torch.__getattr__ = without_inductor  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if torch.__dict__.get("__getattr__") is without_inductor:
            torch.__getattr__ = lazy  # type: ignore[attr-defined]
