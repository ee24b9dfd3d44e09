"""Shared test helpers: building records by hand, running gpuscope and python as a user would, checking every
run.json against docs/run.schema.json, and the slow tier's real runs, each made once per session and shared."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpuscope.record import Breakdown, RunRecord, Steps

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_workloads"
SCRIPTS = Path(__file__).resolve().parent / "fixtures" / "scripts"
RUN_SCHEMA = ROOT / "docs" / "run.schema.json"


def make_record(**overrides: Any) -> RunRecord:
    """A plausible record of a finished run; keyword arguments replace its fields."""
    base = RunRecord(
        gpuscope_version="0.0.test",
        command=("train.py", "--epochs", "1"),
        steps=Steps(count=40, median_s=0.1, mean_s=0.1, total=42, warmup=2, source="optimizer"),
        breakdown=Breakdown(data_wait=0.1, forward=0.3, backward=0.4, optimizer=0.1, other=0.1),
    )
    return dataclasses.replace(base, **overrides)


def child_env() -> dict[str, str]:
    """The environment for child processes: unbuffered, with no inherited coverage or debugging hooks."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONSTARTUP", None)
    return env


def run_python(args: list[str], cwd: Path, timeout: float = 120, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in ``cwd``."""
    return subprocess.run([sys.executable, *args], cwd=cwd, env=child_env(), capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def run_gpuscope(args: list[str], cwd: Path, timeout: float = 120, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``python -m gpuscope ARGS`` in ``cwd``."""
    return run_python(["-m", "gpuscope", *args], cwd, timeout, **kwargs)


@functools.cache
def run_schema() -> jsonschema.Draft202012Validator:
    """A validator of docs/run.schema.json (checked to be a valid draft 2020-12 schema first)."""
    schema = json.loads(RUN_SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def schema_errors(data: Any) -> list[str]:
    """Where ``data`` breaks docs/run.schema.json, one line each (empty: it is a valid run.json)."""
    errors = sorted(run_schema().iter_errors(data), key=lambda e: list(e.absolute_path))
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]


def validate_run(data: Any, where: object = "run.json") -> None:
    """Fail the test if ``data`` is not a run.json as docs/run.schema.json describes it."""
    errors = schema_errors(data)
    assert not errors, f"{where} does not match docs/run.schema.json:\n" + "\n".join(errors[:20])


def load_run(run_dir: Path) -> dict[str, Any]:
    """The parsed run.json of a run folder, validated against docs/run.schema.json."""
    path = run_dir / "run.json"
    data = json.loads(path.read_text())
    validate_run(data, path)
    return data


@pytest.fixture
def scripts() -> Path:
    """The folder of small test scripts."""
    return SCRIPTS


def pytest_addoption(parser: pytest.Parser) -> None:
    """``pytest --update-golden`` rewrites the report's golden files instead of comparing with them."""
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/report/golden/*.html from the current templates")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """Whether this run rewrites golden files (``--update-golden``)."""
    return bool(request.config.getoption("--update-golden"))
