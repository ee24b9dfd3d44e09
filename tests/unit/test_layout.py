"""The package's shape: its folders are the pipeline's stages, and each stage imports only those before it (and
the record, shared by all); the front ends that drive them sit beside. Nothing the repository ships points outside
it. (Module and function sizes are a prompt for review, not a rule a test enforces.)"""

from __future__ import annotations

import ast
import functools
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


@functools.cache
def imports_in(path: Path) -> tuple[tuple[int, str], ...]:
    """``imported_names`` of the file at ``path``, read and parsed once."""
    return tuple(imported_names(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py"))


def imports_of(path: Path, target: str) -> list[str]:
    """``FILE:LINE imports NAME`` for each import in ``path`` of ``target`` or anything under it."""
    lines: dict[int, str] = {}
    for line, name in imports_in(path):
        if (name == target or name.startswith(target + ".")) and len(name) < len(lines.get(line, name + ".")):
            lines[line] = name
    return [f"{rel(path)}:{line} imports {name}" for line, name in sorted(lines.items())]


STAGES = ("collect", "reduce", "diagnose", "report")
"""The pipeline's stages, in order: a run flows collect -> reduce -> diagnose -> report."""
FRONT_ENDS = ("gpuscope.cli", "gpuscope.api", "gpuscope.notebook", "gpuscope.commands", "gpuscope.finish",
              "gpuscope.pipeline", "gpuscope.session", "gpuscope.markers", "gpuscope.options", "gpuscope.distributed",
              "gpuscope.rundirs", "gpuscope.trials", "gpuscope.sentinel")
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
    assert top == shared | set(FRONT_ENDS) - {"gpuscope.commands"}
    # and its folders are the stages and the commands, one module a command
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").is_file()}
    assert folders == {*STAGES, "commands"}
    assert {path.stem for path in (PACKAGE / "commands").glob("*.py")} == {
        "__init__", "run", "report", "compare", "analyze", "view"}


def top_level_imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports as it is imported: at module level, in ``if``/``try`` blocks and
    ``if TYPE_CHECKING:`` ones too (a type checker follows those), not inside functions (an import there is how a
    module reaches one that imports it). ``from a import b`` names ``a.b`` where that is a module, else ``a``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.If, ast.Try)):
                for block in (node.body, node.orelse, *(h.body for h in getattr(node, "handlers", [])),
                              getattr(node, "finalbody", [])):
                    visit(block)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                origin = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1])
                    origin = f"{base}.{node.module}" if node.module else base
                submodules = {f"{origin}.{alias.name}" for alias in node.names} & modules
                found.update(submodules)
                if len(submodules) < len(node.names):
                    found.add(origin)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return (found & modules) - {name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module in ``graph`` (module -> what it imports): each holds an
    import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                other = stack.pop()
                group.append(other)
                if other == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_circle_check_finds_a_circle_and_only_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_import_circle_in_the_package() -> None:
    paths = {module_name(path): path for path in modules(PACKAGE)}
    graph = {name: top_level_imports(path, set(paths)) for name, path in paths.items()}
    assert circles(graph) == []


def registers_a_collector(path: Path) -> bool:
    return any(isinstance(node, ast.ClassDef) and any(ast.unparse(d) == "register" for d in node.decorator_list)
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def test_the_collectors_folder_holds_the_registered_collectors_and_nothing_else() -> None:
    # the framework (what a collector is, the windows' schedule, the probes' child process) and the steps
    # collector's machinery live in folders of their own beside it
    folder = PACKAGE / "collect" / "collectors"
    others = [rel(path) for path in sorted(folder.glob("*.py")) if path.name != "__init__.py"
              and not registers_a_collector(path)]
    assert others == []
    assert not list(folder.glob("*/*.py"))
    for beside in ("framework", "steps"):
        assert (PACKAGE / "collect" / beside / "__init__.py").is_file()
        assert not any(registers_a_collector(path) for path in (PACKAGE / "collect" / beside).glob("*.py"))


def test_run_json_is_written_at_the_pipelines_end_only() -> None:
    # a run, its hand-over, a rank, a trace, a job's merge, trials, the watcher: all end in pipeline.conclude
    callers = [rel(path) for path in modules(PACKAGE) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "write_record"]
    assert callers == ["gpuscope/pipeline.py"]


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
