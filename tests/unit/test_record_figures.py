"""Every record kept in the repository, the recorded GPU runs' included, holds no share of a step above the whole
step and no negative time (``figures_check``; the slow tier checks each record it writes the same way)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from figures_check import figure_errors

FIXTURES = Path(__file__).resolve().parent.parent
RECORDS = sorted([*FIXTURES.glob("fixtures/records/*.json"), *FIXTURES.glob("report/records/*.json"),
                  *FIXTURES.glob("fixtures/gpu/**/*.run.json.gz")])


def read(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


@pytest.mark.parametrize("path", RECORDS, ids=[p.name for p in RECORDS])
def test_no_share_above_the_whole_and_no_negative_time(path: Path) -> None:
    assert figure_errors(read(path)) == []


def test_the_check_finds_a_share_above_the_whole_and_a_negative_time() -> None:
    record = {"breakdown": {"data_wait": 1.2}, "ranks": [{"comm_exposed_s": -0.001, "late_share": 0.5}],
              "op_profile": {"kernels": {"busy_fraction": 1.4}}}
    assert figure_errors(record) == [
        "run.breakdown.data_wait: 1.2 (a share outside 0..1)",
        "run.ranks[0].comm_exposed_s: -0.001 (negative time)",
        "run.op_profile.kernels.busy_fraction: 1.4 (a share outside 0..1)",
    ]
