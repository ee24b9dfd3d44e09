"""The user's line behind a call: which files are the user's, answered once per file (a hook looking for the user's
line walks a few frames at every call it sees, and resolving a path is a system call per folder)."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

from gpuscope.collect import callsites


def test_a_files_answer_is_worked_out_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    resolved: list[str] = []
    real = os.path.realpath
    monkeypatch.setattr(os.path, "realpath", lambda path: resolved.append(path) or real(path))
    script = str(tmp_path / "train.py")
    callsites.framework_dirs()  # (torch's and NumPy's folders, as imported now)
    assert [callsites.is_user_file(script) for _ in range(3)] == [True, True, True]
    assert resolved.count(script) == 1
    assert not callsites.is_user_file(callsites.__file__)  # gpuscope's own


def test_a_framework_imported_later_is_not_the_users(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a source checkout of a framework, outside site-packages, judged before and after it is imported
    checkout = tmp_path / "src" / "numpy"
    file = str(checkout / "core.py")
    monkeypatch.delitem(sys.modules, "numpy", raising=False)
    assert callsites.is_user_file(file)
    fake = types.ModuleType("numpy")
    fake.__file__ = str(checkout / "__init__.py")
    monkeypatch.setitem(sys.modules, "numpy", fake)
    assert not callsites.is_user_file(file)
