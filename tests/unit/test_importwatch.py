"""Watching an import: callbacks around it, and nothing of gpuscope left on the module."""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from pathlib import Path

from gpuscope.collect.importwatch import ImportWatch


def test_watchers_are_called_around_the_import_and_leave_the_real_loader(tmp_path: Path, monkeypatch) -> None:
    # given a module not yet imported, watched twice (as the steps and cprofile collectors both watch torch)
    (tmp_path / "watched_mod.py").write_text("import sys\nLOADED = 'watched_mod' in sys.modules\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls: list[str] = []
    first = ImportWatch("watched_mod", lambda: calls.append("first after"), before=lambda: calls.append("first before"))
    second = ImportWatch("watched_mod", lambda: calls.append("second after"))
    first.install()
    second.install()
    try:
        # when it is imported
        module = importlib.import_module("watched_mod")
    finally:
        first.remove()
        second.remove()
        sys.modules.pop("watched_mod", None)
    # then each watcher was called once, after the module ran, and the module keeps its own loader
    assert module.LOADED
    assert sorted(calls) == ["first after", "first before", "second after"]
    assert calls.index("first before") < calls.index("first after")
    assert type(module.__loader__) is importlib.machinery.SourceFileLoader
    assert module.__spec__.loader is module.__loader__


def test_watching_a_module_already_imported_calls_back_at_once() -> None:
    calls = []
    ImportWatch("json", lambda: calls.append(1)).install()
    assert calls == [1]
