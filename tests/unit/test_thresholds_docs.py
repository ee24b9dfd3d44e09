"""docs/thresholds.md is generated from the two thresholds modules, and kept so."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def generator() -> Any:
    """tools/thresholds_docs.py, loaded from the repository."""
    spec = importlib.util.spec_from_file_location("thresholds_docs", ROOT / "tools" / "thresholds_docs.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["thresholds_docs"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_committed_page_is_what_the_thresholds_modules_generate() -> None:
    # a threshold changed without running tools/thresholds_docs.py (or a hand edit of the page) fails here
    assert (ROOT / "docs" / "thresholds.md").read_text() == generator().page(), \
        "docs/thresholds.md is stale: run python tools/thresholds_docs.py"


def test_every_threshold_says_what_it_decides() -> None:
    tool = generator()
    for _, path in tool.MODULES:
        undocumented = [t.names for t in tool.thresholds((ROOT / path).read_text()) if not t.words.strip()]
        assert undocumented == [], f"{path}: thresholds without a docstring"


def test_the_generator_reads_each_constant_with_its_section_value_and_docstring() -> None:
    # given a module with a section comment, a documented pair of constants and a lower-case helper name
    source = ('"""Module."""\n\n# -- data loading ----\nA, B = 0.2, 20e-6\n"""Why."""\nhelper = 1\n'
              'C: tuple[str, ...] = (\n    # a comment\n    "x",\n)\n')
    found = generator().thresholds(source)
    # then the constants are read as written, under their section, and the helper is not a threshold
    assert [(t.names, t.value, t.words, t.section) for t in found] == [
        (["A", "B"], "0.2, 20e-6", "Why.", "data loading"), (["C"], "('x',)", "", "data loading")]
