"""``docs/run.schema.json`` and the field tables of ``docs/run-json.md``, generated from ``gpuscope/record.py``.

The record's dataclasses give each object's fields and types; their docstrings (the class's, and the one under each
field) give the words; the contract gives the required fields (``REQUIRED``). Run it after changing the record:

    python tools/record_docs.py           # writes both files
    python tools/record_docs.py --check   # exits 1 where a committed file differs from what it would write

``tests/unit/test_schema.py`` runs the check.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuscope import record  # noqa: E402  (the repository's own, whatever is installed)

SCHEMA_PATH = ROOT / "docs" / "run.schema.json"
PAGE_PATH = ROOT / "docs" / "run-json.md"
FIELDS_HEADING = "## Fields"
"""The page's generated part begins at this heading; what comes before it is written by hand."""
REQUIRED = {
    "RunRecord": ("schema", "gpuscope_version", "command", "exit_status", "device", "steps", "breakdown", "verdict",
                  "recommendations", "collectors"),
    "Steps": ("count", "median_s"),
    "Breakdown": ("data_wait",),
    "Verdict": ("bound", "confidence", "evidence"),
    "Recommendation": ("id", "title", "why", "fix", "expected_gain"),
    "CollectorStatus": ("status", "reason"),
}
"""The fields the interface contract requires in every run.json."""
SCHEMA_COMMENT = ("Readable page: docs/run-json.md. Generated from gpuscope/record.py by tools/record_docs.py. Within "
                  "gpuscope.run/1 the schema only grows: fields may be added (objects accept unknown fields), none is "
                  "removed or changes meaning. Fractions are 0..1, times are seconds, sizes are bytes; the unit is in "
                  "the field's name.")
SHARES = frozenset({"data_wait", "forward", "backward", "optimizer", "other", "confidence", "expected_gain", "mfu",
                    "overlap", "sm_util", "memory_util", "evaluated_in_train_mode"})
"""Fields whose values are shares (0..1) though their names do not end in ``_share`` or ``_fraction``."""
BOUNDED = frozenset({("Verdict", "confidence")})
"""Fields the schema holds to 0..1 (other shares may pass 1 by a rounding, or by their meaning: a rank late by more
than a step)."""
UNIT_SUFFIXES = (("flops_per_s", "FLOP/s"), ("batches_per_s", "batches/s"), ("_bytes_s", "bytes/s"), ("_s", "s"),
                 ("_bytes", "bytes"), ("_mhz", "MHz"), ("_w", "W"), ("_c", "°C"), ("_share", "0..1"),
                 ("_fraction", "0..1"), ("flops_per_step", "FLOP"), ("flops_by_dtype", "FLOP"),
                 ("flops_by_op", "FLOP"), ("kernels_per_step", "kernels"), ("ops_per_step", "ops"),
                 ("calls_per_step", "calls"), ("speedup", "x"), ("_slowdown", "x"))


# -- reading the record -----------------------------------------------------------------------------------------

def docstrings(source: str | None = None) -> dict[str, tuple[str, dict[str, str]]]:
    """Each class of ``source`` (by default ``record.py``'s) by name: its docstring, and the docstring under each of
    its fields."""
    tree = ast.parse(source if source is not None else Path(record.__file__).read_text())
    found: dict[str, tuple[str, dict[str, str]]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields: dict[str, str] = {}
        for statement, following in zip(node.body, [*node.body[1:], None]):
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) \
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) \
                    and isinstance(following.value.value, str):
                fields[statement.target.id] = following.value.value
        found[node.name] = (ast.get_docstring(node) or "", fields)
    return found


def words(text: str) -> str:
    """A docstring as one paragraph of Markdown about JSON: reST's double backticks single, Python's None, True and
    False as JSON's null, true and false, lines joined."""
    text = inspect.cleandoc(text).replace("``", "`")
    text = re.sub(r"\b(None|True|False)\b(?! of)", lambda m: JSON_WORDS[m.group(1)], text)
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


JSON_WORDS = {"None": "null", "True": "true", "False": "false"}


def classes() -> list[type]:
    """The record's dataclasses reachable from ``RunRecord``, in their order in ``record.py``."""
    reached: set[type] = set()
    todo = [record.RunRecord]
    while todo:
        cls = todo.pop()
        if cls in reached:
            continue
        reached.add(cls)
        hints = typing.get_type_hints(cls)
        todo += [tp for f in dataclasses.fields(cls) for tp in _inner(hints[f.name]) if dataclasses.is_dataclass(tp)]
    order = list(docstrings())
    return sorted(reached, key=lambda cls: order.index(cls.__name__) if cls is not record.RunRecord else -1)


def _inner(tp: Any) -> list[Any]:
    """``tp`` and the types inside it (tuple items, dict values, union members)."""
    args = typing.get_args(tp)
    return [tp, *(inner for arg in args for inner in _inner(arg))]


def _optional(tp: Any) -> tuple[Any, bool]:
    """``(T, True)`` for ``T | None``, ``(tp, False)`` otherwise."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(options) == 1 and len(options) < len(typing.get_args(tp)):
            return options[0], True
    return tp, False


# -- the schema -------------------------------------------------------------------------------------------------

PLAIN = {str: "string", int: "integer", float: "number", bool: "boolean"}


def schema_type(tp: Any) -> dict[str, Any]:
    """The JSON Schema of a field of type ``tp``."""
    inner, nullable = _optional(tp)
    origin = typing.get_origin(inner)
    if dataclasses.is_dataclass(inner):
        ref = {"$ref": f"#/$defs/{inner.__name__}"}
        return {"anyOf": [ref, {"type": "null"}]} if nullable else ref
    if origin is Literal:
        values = list(typing.get_args(inner))
        return {"enum": [*values, None]} if nullable else {"enum": values}
    if origin is tuple and Ellipsis not in typing.get_args(inner):  # fixed length: an item's type a place
        places = [schema_type(a) for a in typing.get_args(inner)]
        return _nullable({"type": "array", "prefixItems": places, "items": False, "minItems": len(places)},
                         nullable)
    if origin is tuple:
        return _nullable({"type": "array", "items": schema_type(typing.get_args(inner)[0])}, nullable)
    if origin is dict:
        return _nullable({"type": "object", "additionalProperties": schema_type(typing.get_args(inner)[1])}, nullable)
    if inner in PLAIN:
        return {"type": [PLAIN[inner], "null"]} if nullable else {"type": PLAIN[inner]}
    raise TypeError(f"no JSON Schema for {tp!r}")


def _nullable(node: dict[str, Any], nullable: bool) -> dict[str, Any]:
    return {**node, "type": [node["type"], "null"]} if nullable else node


def object_schema(cls: type, docs: dict[str, tuple[str, dict[str, str]]]) -> dict[str, Any]:
    """A dataclass as a JSON Schema object: its words, required fields and every field's type and words."""
    doc, field_docs = docs[cls.__name__]
    hints = typing.get_type_hints(cls)
    properties = {}
    for f in dataclasses.fields(cls):
        node = schema_type(hints[f.name])
        if f.name == "schema" and cls is record.RunRecord:
            node = {"type": "string", "const": record.SCHEMA}
        if (cls.__name__, f.name) in BOUNDED:
            node = {**node, "minimum": 0, "maximum": 1}
        properties[f.name] = {"description": words(field_docs.get(f.name, "")), **node}
    node: dict[str, Any] = {"description": words(doc), "type": "object"}
    if cls.__name__ in REQUIRED:
        node["required"] = list(REQUIRED[cls.__name__])
    node["properties"] = properties
    return node


def run_schema() -> dict[str, Any]:
    """docs/run.schema.json."""
    docs = docstrings()
    top = object_schema(record.RunRecord, docs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"gpuscope run.json, schema {record.SCHEMA}",
        "$comment": SCHEMA_COMMENT,
        **top,
        "$defs": {cls.__name__: object_schema(cls, docs) for cls in classes() if cls is not record.RunRecord},
    }


# -- the page ---------------------------------------------------------------------------------------------------

def page_type(tp: Any) -> str:
    """A field's type as the page writes it: ``integer``, ``"host" \\| "device"``, ``array of [Loader](#loader)``."""
    inner, nullable = _optional(tp)
    origin = typing.get_origin(inner)
    if dataclasses.is_dataclass(inner):
        text = f"[{inner.__name__}](#{inner.__name__.lower()})"
    elif origin is Literal:
        text = " \\| ".join(f'"{value}"' for value in typing.get_args(inner))
    elif origin is tuple and Ellipsis not in typing.get_args(inner):
        text = "[" + ", ".join(page_type(a) for a in typing.get_args(inner)) + "]"
    elif origin is tuple:
        text = f"array of {page_type(typing.get_args(inner)[0])}"
    elif origin is dict:
        text = f"object: name -> {page_type(typing.get_args(inner)[1])}"
    else:
        text = PLAIN[inner]
    return f"{text} or null" if nullable else text


def unit(name: str) -> str:
    """The unit of a field, from its name (``median_s``: s)."""
    if name in SHARES:
        return "0..1"
    return next((text for suffix, text in UNIT_SUFFIXES if name.endswith(suffix)), "")


def fields_section() -> str:
    """The page's generated part: a section a dataclass, its words and a table of its fields."""
    docs = docstrings()
    parts = [FIELDS_HEADING, "",
             "Each object of the record, in the order of `gpuscope/record.py` (this part of the page is generated "
             "from it by `tools/record_docs.py`). Links lead to the nested objects.", ""]
    for cls in classes():
        doc, field_docs = docs[cls.__name__]
        hints = typing.get_type_hints(cls)
        required = REQUIRED.get(cls.__name__, ())
        title = "The record (top level)" if cls is record.RunRecord else cls.__name__
        parts += [f"### {title}", "", words(doc), "", "| field | type | unit | meaning |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            kind = f'"{record.SCHEMA}"' if f.name == "schema" and cls is record.RunRecord else page_type(hints[f.name])
            mark = " (required)" if f.name in required else ""
            parts.append(f"| `{f.name}`{mark} | {kind} | {unit(f.name)} | {words(field_docs.get(f.name, ''))} |")
        parts.append("")
    return "\n".join(parts)


def page(current: str) -> str:
    """docs/run-json.md: its hand-written part as it is, then the generated fields."""
    head = current.split(FIELDS_HEADING, 1)[0]
    return head + fields_section()


# -- writing and checking ---------------------------------------------------------------------------------------

def generated() -> dict[Path, str]:
    """Each generated file and what it should hold."""
    return {SCHEMA_PATH: json.dumps(run_schema(), indent=2, ensure_ascii=False) + "\n",
            PAGE_PATH: page(PAGE_PATH.read_text())}


def undocumented() -> list[str]:
    """``Class.field`` for every field of the record without a docstring (the schema would describe it as "")."""
    docs = docstrings()
    return [f"{cls.__name__}.{f.name}" for cls in classes() for f in dataclasses.fields(cls)
            if f.name not in docs[cls.__name__][1] and not (cls is record.RunRecord and f.name == "schema")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where a committed file differs")
    args = parser.parse_args()
    if missing := undocumented():
        print("fields without a docstring in gpuscope/record.py: " + ", ".join(missing), file=sys.stderr)
        return 1
    stale = [path for path, text in generated().items() if path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} differs from what tools/record_docs.py writes: run it", file=sys.stderr)
        return 1 if stale else 0
    for path, text in generated().items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
