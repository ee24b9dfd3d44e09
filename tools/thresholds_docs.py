"""``docs/thresholds.md``, generated from ``gpuscope/reduce/thresholds.py`` and ``gpuscope/diagnose/thresholds.py``.

Each threshold's name, value and docstring (what it decides and where its value comes from) become a row of a table,
under the module's ``# -- section --`` comments. The modules stay the one place a number and its reasons are kept;
the page lets a reader find them without reading the code. Run it after changing a threshold:

    python tools/thresholds_docs.py           # writes the page
    python tools/thresholds_docs.py --check   # exits 1 where the committed page differs from what it would write

``tests/unit/test_thresholds_docs.py`` runs the check.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE_PATH = ROOT / "docs" / "thresholds.md"
MODULES = (("The reduction: which steps are steady, which kernels are which", "gpuscope/reduce/thresholds.py"),
           ("The diagnosis: the verdict and the recommendations", "gpuscope/diagnose/thresholds.py"))
"""The modules, in the pipeline's order, each with the heading its part of the page gets."""
SECTION = re.compile(r"^# -- (.+?) -*$")
HEAD = """# Thresholds

Every number gpuscope decides with, with what it decides and where its value comes from. This page is generated
from the two modules that hold them (`python tools/thresholds_docs.py`); change a value there and the tests that
pin its behaviour say what moved. Shares are fractions of the step (0.2 is 20%), times are seconds.
"""


@dataclass
class Threshold:
    names: list[str]
    value: str
    words: str
    section: str


def thresholds(source: str) -> list[Threshold]:
    """The module-level constants of ``source`` in order, each with the docstring under it (or "") and the section
    comment above it."""
    lines = source.splitlines()
    sections = {i + 1: m.group(1) for i, line in enumerate(lines) if (m := SECTION.match(line))}
    tree = ast.parse(source)
    found: list[Threshold] = []
    for statement, following in zip(tree.body, [*tree.body[1:], None]):
        target = statement.targets[0] if isinstance(statement, ast.Assign) else \
            statement.target if isinstance(statement, ast.AnnAssign) else None
        if target is None or statement.value is None:
            continue
        names = [e.id for e in target.elts] if isinstance(target, ast.Tuple) else [target.id]  # type: ignore[attr-defined]
        if not all(name.isupper() for name in names):
            continue
        section = next((sections[n] for n in sorted(sections, reverse=True) if n < statement.lineno), "")
        doc = following.value.value if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) \
            and isinstance(following.value.value, str) else ""
        value = ast.get_source_segment(source, statement.value) or ""
        found.append(Threshold(names, value if "\n" not in value else ast.unparse(statement.value), doc, section))
    return found


def cell(text: str) -> str:
    """Text for one table cell: a docstring's lines joined, reST's double backticks single, pipes escaped."""
    text = inspect.cleandoc(text).replace("``", "`").replace("|", "\\|")
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def page() -> str:
    out = [HEAD]
    for heading, path in MODULES:
        out += [f"## {heading}", "", f"`{path}`", ""]
        section = None
        for t in thresholds((ROOT / path).read_text()):
            if t.section != section:
                section = t.section
                out += ["", f"### {section[0].upper() + section[1:]}", "", "| Name | Value | What it decides, and why |",
                        "|---|---|---|"]
            out.append(f"| {', '.join(f'`{n}`' for n in t.names)} | `{cell(t.value)}` | {cell(t.words)} |")
        out.append("")
    return "\n".join(out).replace("\n\n\n", "\n\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where the committed page differs")
    args = parser.parse_args()
    text = page()
    if args.check:
        if not PAGE_PATH.exists() or PAGE_PATH.read_text() != text:
            print("docs/thresholds.md differs from what tools/thresholds_docs.py writes: run it", file=sys.stderr)
            return 1
        return 0
    PAGE_PATH.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
