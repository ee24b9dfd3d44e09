"""The package's shape: analysis and collectors never import each other, and nothing the repository ships points
outside it. (Module and function sizes are a prompt for review, not a rule a test enforces.)"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "gpuscope"
OUTSIDE = re.compile(r"\.\./" + "shared" + r"|(?<![\w.~-])/" + "work" + "/")
"""A reference to the project's shared folder or to this machine's work tree (built in pieces so that this file does
not name them itself)."""


def modules(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(source: str, module: str, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """Every module an import in ``source`` may bind, with its line: ``import a.b`` and ``from a import b`` (``a``
    and ``a.b``), relative imports resolved against ``module``, inside functions, classes and ``if TYPE_CHECKING:``
    blocks alike, and ``importlib.import_module("a.b")`` / ``__import__("a.b")`` with a literal name."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                origin = f"{base}.{node.module}" if node.module else base
            else:
                origin = node.module or ""
            yield node.lineno, origin
            for alias in node.names:
                yield node.lineno, f"{origin}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value


def imports_of(path: Path, target: str) -> list[str]:
    """``FILE:LINE imports NAME`` for each import in ``path`` of ``target`` or anything under it."""
    lines: dict[int, str] = {}
    for line, name in imported_names(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py"):
        if (name == target or name.startswith(target + ".")) and len(name) < len(lines.get(line, name + ".")):
            lines[line] = name
    return [f"{rel(path)}:{line} imports {name}" for line, name in sorted(lines.items())]


@pytest.mark.parametrize(
    "source",
    [
        "import gpuscope.collectors.steps",
        "import gpuscope.collectors as c",
        "from gpuscope.collectors.steplog import StepLog",
        "from gpuscope import collectors",
        "from .. import collectors",
        "from ..collectors.steps import StepsCollector",
        "def f():\n    from gpuscope.collectors import base\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpuscope.collectors.base import Collector\n",
        "import importlib\nsteps = importlib.import_module('gpuscope.collectors.steps')\n",
    ],
)
def test_the_import_check_sees_every_form_of_import(source: str) -> None:
    names = [name for _, name in imported_names(source, "gpuscope.analysis.steady")]
    assert any(n == "gpuscope.collectors" or n.startswith("gpuscope.collectors.") for n in names), names


@pytest.mark.parametrize("source", ["from gpuscope.collectorsx import y", "from gpuscope import record",
                                    "from . import collectors", "import collections"])
def test_the_import_check_leaves_other_imports_alone(source: str) -> None:
    names = [name for _, name in imported_names(source, "gpuscope.analysis.steady")]
    assert not any(n == "gpuscope.collectors" or n.startswith("gpuscope.collectors.") for n in names), names


@pytest.mark.parametrize(("folder", "forbidden"), [("analysis", "gpuscope.collectors"),
                                                   ("collectors", "gpuscope.analysis")])
def test_analysis_and_collectors_do_not_import_each_other(folder: str, forbidden: str) -> None:
    # given every module of one side
    files = modules(PACKAGE / folder)
    assert files
    # then none of its imports, wherever it sits, reaches into the other side
    found = [hit for path in files for hit in imports_of(path, forbidden)]
    assert found == [], "\n".join(found)


def shipped_text_files() -> Iterator[Path]:
    yield ROOT / "README.md"
    for folder in ("tests", ".ci", "docs"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                yield path


def test_nothing_points_outside_the_repository() -> None:
    found = []
    for path in shipped_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not text
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE.search(line):
                found.append(f"{rel(path)}:{number}: {line.strip()[:120]}")
    assert found == [], "\n".join(found)


def test_the_outside_check_catches_both_kinds_of_path() -> None:
    assert OUTSIDE.search("see " + "../" + "shared/CONTRACT.md")
    assert OUTSIDE.search("cd " + "/work" + "/main && make")
    assert not OUTSIDE.search("docs/run-json.md and ~/work/x and https://example.org/network/")
