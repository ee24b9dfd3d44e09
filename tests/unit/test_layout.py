"""The package's shape: its folders are the pipeline's stages, and each stage imports only those before it (and
the record, shared by all); the front ends that drive them sit beside. Nothing the repository ships points outside
it. (Module and function sizes are a prompt for review, not a rule a test enforces.)"""

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


STAGES = ("collect", "reduce", "diagnose", "report")
"""The pipeline's stages, in order: a run flows collect -> reduce -> diagnose -> report."""
FRONT_ENDS = ("gpuscope.cli", "gpuscope.api", "gpuscope.notebook", "gpuscope.analyze", "gpuscope.finish",
              "gpuscope.session", "gpuscope.markers", "gpuscope.options", "gpuscope.distributed", "gpuscope.rundirs",
              "gpuscope.trials", "gpuscope.sentinel")
"""The modules that drive the stages (the command line, the Python API): they may import any stage, none of the
stages imports them."""


@pytest.mark.parametrize(
    "source",
    [
        "import gpuscope.diagnose.classify",
        "import gpuscope.diagnose as d",
        "from gpuscope.diagnose.evidence import STEP",
        "from gpuscope import diagnose",
        "from .. import diagnose",
        "from ..diagnose.classify import classify",
        "def f():\n    from gpuscope.diagnose import speed\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpuscope.diagnose.speed import LoaderPlan\n",
        "import importlib\nspeed = importlib.import_module('gpuscope.diagnose.speed')\n",
    ],
)
def test_the_import_check_sees_every_form_of_import(source: str) -> None:
    names = [name for _, name in imported_names(source, "gpuscope.reduce.steady")]
    assert any(n == "gpuscope.diagnose" or n.startswith("gpuscope.diagnose.") for n in names), names


@pytest.mark.parametrize("source", ["from gpuscope.diagnosex import y", "from gpuscope import record",
                                    "from . import diagnose", "import collections"])
def test_the_import_check_leaves_other_imports_alone(source: str) -> None:
    names = [name for _, name in imported_names(source, "gpuscope.reduce.steady")]
    assert not any(n == "gpuscope.diagnose" or n.startswith("gpuscope.diagnose.") for n in names), names


@pytest.mark.parametrize("stage", STAGES)
def test_no_stage_imports_a_later_stage_or_a_front_end(stage: str) -> None:
    # given every module of one stage
    files = modules(PACKAGE / stage)
    assert files
    # then none of its imports, wherever it sits, reaches a later stage or the modules that drive the stages
    later = [f"gpuscope.{name}" for name in STAGES[STAGES.index(stage) + 1:]]
    found = [hit for path in files for target in (*later, *FRONT_ENDS) for hit in imports_of(path, target)]
    assert found == [], "\n".join(found)


def test_the_front_ends_are_what_the_package_holds_beside_the_stages() -> None:
    # a new module at the package's top is a front end (listed above) or shared by every stage (the record, errors)
    shared = {"gpuscope", "gpuscope.__main__", "gpuscope.record", "gpuscope.errors", "gpuscope.versions"}
    top = {module_name(path) for path in PACKAGE.glob("*.py")}
    assert top == shared | set(FRONT_ENDS)


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
