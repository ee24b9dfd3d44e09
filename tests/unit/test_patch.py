"""``framework.base.patch``: what gpuscope wraps in the user's libraries behaves as under python, down to pickling
the wrapped function by reference, and is left as it was once undone."""

from __future__ import annotations

import pickle
import sys
import types

from gpuscope.collect.framework.base import patch


def test_a_function_wrapped_where_it_is_re_exported_still_pickles_by_reference_and_is_restored() -> None:
    # given a function defined in one module and re-exported by another, as torch.save from torch.serialization
    home = types.ModuleType("gpuscope_test_home")
    exec("def save(obj, path):\n    return ('saved', obj, path)\n", home.__dict__)
    front = types.ModuleType("gpuscope_test_front")
    front.save = home.save
    sys.modules[home.__name__], sys.modules[front.__name__] = home, front
    original = home.save
    calls = []

    def wrap(function):
        def save(*args):
            calls.append(args)
            return function(*args)
        return save

    try:
        undo = patch(front, "save", wrap)
        # then the wrapper runs through either name, and pickles as the function it stands for
        assert front.save(1, "a.pt") == ("saved", 1, "a.pt") and home.save is front.save and len(calls) == 1
        assert pickle.loads(pickle.dumps(front.save)) is front.save
        undo()
        # and once undone, both names are the original again, which pickles to itself
        assert front.save is original and home.save is original
        assert pickle.loads(pickle.dumps(front.save)) is original
    finally:
        del sys.modules[home.__name__], sys.modules[front.__name__]


def test_torch_save_pickles_under_the_practices_collectors_wrapper() -> None:
    torch = __import__("pytest").importorskip("torch")
    from gpuscope.collect.collectors.practices import PracticesCollector

    collector = PracticesCollector()
    original = torch.save
    undo = patch(torch, "save", collector._wrap_save)
    try:
        assert torch.serialization.save is torch.save is not original
        assert pickle.loads(pickle.dumps(torch.save)) is torch.save
    finally:
        undo()
    assert torch.save is original and torch.serialization.save is original
