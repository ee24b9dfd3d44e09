"""Telling torch's lazily dynamo-disabled functions (``torch._disable_dynamo``) from others, and filling their cache
only where torch._dynamo is not imported."""

from __future__ import annotations

import functools
import sys

import pytest
import torch._compile

from gpuscope.collect.lazy_dynamo import DYNAMO_CACHE, lazily_disabled, leave_unimported


def update(x: int) -> int:
    return x + 1


def test_torchs_lazy_wrapper_is_told_by_its_code_and_gives_the_function_it_wraps() -> None:
    assert lazily_disabled(torch._compile._disable_dynamo(update)) is update
    assert lazily_disabled(functools.wraps(update)(lambda x: x)) is None  # another wrapper
    assert lazily_disabled(update) is None and lazily_disabled(None) is None


def test_the_cache_is_filled_with_the_function_itself_only_without_dynamo(monkeypatch: pytest.MonkeyPatch) -> None:
    def step(x: int) -> int:
        return x * 2

    wrapper = torch._compile._disable_dynamo(step)
    monkeypatch.setitem(sys.modules, "torch._dynamo", object())  # imported: nothing changes
    assert leave_unimported(wrapper) is None and not hasattr(step, DYNAMO_CACHE)
    monkeypatch.delitem(sys.modules, "torch._dynamo")
    assert leave_unimported(wrapper) is step and getattr(step, DYNAMO_CACHE) is step
    assert wrapper(3) == 6  # called straight through, importing nothing
    assert leave_unimported(wrapper) is None  # filled already
