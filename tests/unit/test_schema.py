"""docs/run.schema.json: a valid draft 2020-12 schema that holds the contract's required fields, that every
run.json gpuscope writes passes, that a run.json missing a required field fails, and that docs/run-json.md
describes field by field."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import jsonschema
import pytest

from conftest import ROOT, RUN_SCHEMA, load_run, make_record, schema_errors
from gpuscope.record import RunRecord, load_record, write_record

RECORDS = sorted((ROOT / "tests" / "report" / "records").glob("*.json"))
CONTRACT_REQUIRED = {
    (): {"schema", "gpuscope_version", "command", "exit_status", "device", "steps", "breakdown", "verdict",
         "recommendations", "collectors"},
    ("steps",): {"count", "median_s"},
    ("breakdown",): {"data_wait"},
    ("verdict",): {"bound", "confidence", "evidence"},
    ("recommendations", "items"): {"id", "title", "why", "fix", "expected_gain"},
    ("collectors", "additionalProperties"): {"status", "reason"},
}
"""The fields run.json must have, as the interface contract fixed them (docs/run-json.md, "Required")."""


def schema() -> dict[str, Any]:
    return json.loads(RUN_SCHEMA.read_text())


def resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its ``$ref`` (to ``#/$defs/...``) followed."""
    while "$ref" in node:
        node = root["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def filled(tp: Any) -> Any:
    """A value of type ``tp`` with every optional part present: a record the size of the whole schema."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return filled(next(a for a in typing.get_args(tp) if a is not type(None)))
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: filled(hints[f.name]) for f in dataclasses.fields(tp) if f.name != "schema"})
    if origin is tuple and Ellipsis not in typing.get_args(tp):  # fixed length: each place filled
        return tuple(filled(a) for a in typing.get_args(tp))
    if origin is tuple:
        return (filled(typing.get_args(tp)[0]),)
    if origin is dict:
        return {"name": filled(typing.get_args(tp)[1])}
    if origin is Literal:
        return typing.get_args(tp)[0]
    return {float: 0.5, int: 3, bool: True, str: "text"}[tp]


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    data = schema()
    assert data["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(data)


@pytest.mark.parametrize("path", sorted(CONTRACT_REQUIRED), ids=lambda p: ".".join(p) or "top")
def test_the_schema_requires_what_the_contract_fixes(path: tuple[str, ...]) -> None:
    root = schema()
    node = root
    for key in path:
        node = resolve(node, root)
        node = node[key] if key in ("items", "additionalProperties") else node["properties"][key]
    assert set(resolve(node, root)["required"]) == CONTRACT_REQUIRED[path]


def test_objects_accept_fields_they_do_not_know_so_the_schema_can_grow() -> None:
    assert "additionalProperties: false" not in json.dumps(schema()).replace('"', "")
    assert schema_errors({**make_record().to_json(), "a_field_of_a_later_version": {"x": 1}}) == []


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_each_recorded_run_json_matches_the_schema(path: Path) -> None:
    assert schema_errors(json.loads(path.read_text())) == []


def test_a_record_written_and_read_back_matches_the_schema(tmp_path: Path) -> None:
    # given a record, written as run.json
    record = make_record()
    write_record(record, tmp_path)
    # then the file matches the schema (load_run validates) and reads back as the same record
    assert load_run(tmp_path)["schema"] == "gpuscope.run/1"
    assert load_record(tmp_path) == record


def test_a_record_with_every_optional_part_filled_in_matches_the_schema() -> None:
    record = filled(RunRecord)
    assert record.op_profile.kernels is not None and record.straggler is not None
    assert schema_errors(record.to_json()) == []


def inner_dataclass(hint: Any) -> Any:
    """The dataclass a field holds (itself, optional, in a tuple or as a dict's values), or None."""
    if dataclasses.is_dataclass(hint):
        return hint
    return next((d for d in map(inner_dataclass, typing.get_args(hint)) if d is not None), None)


def object_node(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """The object schema ``node`` describes: through ``$ref``, ``anyOf`` (its non-null branch), array items and
    dict values."""
    node = resolve(node, root)
    for key in ("anyOf",):
        if key in node:
            node = resolve(next(n for n in node[key] if n.get("type") != "null"), root)
    if "items" in node:
        return object_node(node["items"], root)
    if "properties" not in node and isinstance(node.get("additionalProperties"), dict):
        return object_node(node["additionalProperties"], root)
    return node


def test_the_schema_describes_every_field_the_record_writes() -> None:
    # a field added to record.py and not to docs/run.schema.json (and so not to docs/run-json.md) fails here
    root = schema()
    todo, seen = [(RunRecord, root)], set()
    while todo:
        tp, node = todo.pop()
        if tp.__name__ in seen:
            continue
        seen.add(tp.__name__)
        described = set(node.get("properties", {}))
        written = {f.name for f in dataclasses.fields(tp)}
        assert written <= described, (tp.__name__, written - described)
        for name, hint in typing.get_type_hints(tp).items():
            inner = inner_dataclass(hint)
            if inner is not None:
                todo.append((inner, object_node(node["properties"][name], root)))
    assert {"LoaderProbe", "LoaderRate", "OpProfile", "TraceSource"} <= seen


@pytest.mark.parametrize("field", sorted(CONTRACT_REQUIRED[()] - {"schema"}))
def test_a_run_json_missing_a_required_field_fails(field: str) -> None:
    data = make_record().to_json()
    del data[field]
    assert schema_errors(data) == [f"(top): '{field}' is a required property"]


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda d: d["steps"].pop("median_s"), "steps"),
        (lambda d: d["verdict"].update(bound="slow"), "verdict.bound"),
        (lambda d: d["verdict"].update(confidence=1.5), "verdict.confidence"),
        (lambda d: d.update(schema="gpuscope.run/0"), "schema"),
        (lambda d: d.update(command="train.py"), "command"),
        (lambda d: d["steps"].update(count="many"), "steps.count"),
        (lambda d: d.update(collectors={"nvml": {"status": "broken", "reason": None}}), "collectors.nvml.status"),
        (lambda d: d.update(recommendations=[{"id": "pin-memory", "title": "t", "why": "w", "fix": "f"}]),
         "recommendations.0"),
    ],
    ids=["no-median", "unknown-bound", "confidence-over-1", "other-schema", "command-not-a-list", "count-not-int",
         "unknown-collector-status", "recommendation-without-gain"],
)
def test_a_run_json_of_the_wrong_shape_fails(change, where: str) -> None:
    data = make_record().to_json()
    change(data)
    errors = schema_errors(data)
    assert errors and all(e.startswith(f"{where}: ") for e in errors), errors


def test_load_run_rejects_a_run_json_the_schema_does_not_allow(tmp_path: Path) -> None:
    data = make_record().to_json()
    del data["verdict"]
    (tmp_path / "run.json").write_text(json.dumps(data))
    with pytest.raises(AssertionError, match="'verdict' is a required property"):
        load_run(tmp_path)


def test_the_readable_page_describes_every_field_of_the_schema() -> None:
    page = (ROOT / "docs" / "run-json.md").read_text()
    root = schema()
    sections = {"The record (top level)": root, **root["$defs"]}
    for title, node in sections.items():
        section = page.split(f"\n### {title}\n", 1)[1].split("\n### ", 1)[0]
        rows = set(re.findall(r"^\| `([a-z0-9_]+)`", section, flags=re.M))
        assert rows == set(node["properties"]), title


def generator() -> Any:
    """tools/record_docs.py, loaded from the repository."""
    spec = importlib.util.spec_from_file_location("record_docs", ROOT / "tools" / "record_docs.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_committed_schema_and_field_tables_are_what_the_record_generates() -> None:
    # a field added to record.py without running tools/record_docs.py (or a hand edit of a generated part) fails here
    tool = generator()
    assert tool.undocumented() == [], "fields without a docstring in gpuscope/record.py"
    for path, text in tool.generated().items():
        assert path.read_text() == text, f"{path.name} is stale: run python tools/record_docs.py"


def test_the_generator_reads_the_docstring_under_each_field() -> None:
    # given a record class whose first field has no docstring and whose second has one
    source = 'class Window:\n    """Steps."""\n    first_step: int = 0\n    last_step: int = 0\n    """Last."""\n'
    # then only the second is described
    assert generator().docstrings(source) == {"Window": ("Steps.", {"last_step": "Last."})}
