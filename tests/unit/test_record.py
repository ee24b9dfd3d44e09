"""run.json: the record round-trips, tolerates older and newer files, and rejects what it cannot read."""

from __future__ import annotations

import json

import pytest

from conftest import make_record
from gpuscope.errors import GpuscopeError
from gpuscope.record import SCHEMA, CollectorStatus, Loader, RunRecord, load_record, write_record


def test_a_record_round_trips_through_run_json(tmp_path) -> None:
    record = make_record(
        collectors={"steps": CollectorStatus("ok"), "nvml": CollectorStatus("unavailable", "no NVIDIA driver")},
        loaders=(Loader(dataset="Images", num_workers=0, batch_size=32, batches=10, wait_s=1.5),),
    )
    write_record(record, tmp_path)
    assert load_record(tmp_path) == record


def test_run_json_has_every_field_the_contract_fixes(tmp_path) -> None:
    write_record(make_record(), tmp_path)
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["schema"] == SCHEMA
    for key in ("gpuscope_version", "command", "exit_status", "device", "steps", "breakdown", "verdict",
                "recommendations", "collectors"):
        assert key in data
    assert set(data["steps"]) >= {"count", "median_s"}
    assert set(data["verdict"]) >= {"bound", "confidence", "evidence"}
    assert sum(data["breakdown"].values()) == pytest.approx(1.0)


def test_an_older_record_with_fields_missing_still_loads() -> None:
    record = RunRecord.from_json({"schema": SCHEMA, "command": ["old.py"], "steps": {"count": 3}})
    assert record.command == ("old.py",)
    assert record.steps.count == 3
    assert record.verdict.bound == "inconclusive"


def test_unknown_fields_from_a_newer_version_are_ignored() -> None:
    record = RunRecord.from_json({"schema": SCHEMA, "future_field": {"x": 1}, "verdict": {"bound": "communication"}})
    assert record.verdict.bound == "communication"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"schema": "gpuscope.run/0"}, "schema"),
        ([1, 2], "JSON object"),
        ({"schema": SCHEMA, "steps": {"count": "many"}}, "count"),
        ({"schema": SCHEMA, "command": "train.py"}, "command"),
    ],
)
def test_a_record_of_another_shape_is_rejected_with_one_line(data, message) -> None:
    with pytest.raises(GpuscopeError) as err:
        RunRecord.from_json(data)
    assert message in err.value.message
    assert "\n" not in err.value.message


def test_a_corrupt_or_missing_run_json_is_a_gpuscope_error(tmp_path) -> None:
    with pytest.raises(GpuscopeError, match="no run.json"):
        load_record(tmp_path)
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(GpuscopeError, match="not valid JSON"):
        load_record(tmp_path)


def test_reading_records_resolves_the_classes_type_hints_once_not_per_file(tmp_path, monkeypatch) -> None:
    # a 1024-rank job reads a record per rank: resolving every class's type hints per file was 80% of the time
    import typing

    record = make_record()
    write_record(record, tmp_path)
    load_record(tmp_path)
    calls = []
    resolve = typing.get_type_hints
    monkeypatch.setattr(typing, "get_type_hints", lambda *a, **k: calls.append(a) or resolve(*a, **k))
    for _ in range(3):
        assert load_record(tmp_path) == record
    assert calls == []
