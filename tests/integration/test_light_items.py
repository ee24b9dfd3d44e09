"""A tutorial-style loop whose batches are 512 light items fetched one call each (tests/fixtures/scripts/small_items.py),
run through gpuscope as a user would: loading bounds it, workers deliver no faster, and ``cheaper-batches`` names the
loader's line with the slicing that replaces it; the gain it promises holds against the loop timed without gpuscope,
before and after the fix."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from conftest import SCRIPTS, Runs, run_python

pytestmark = pytest.mark.slow
SCRIPT = SCRIPTS / "small_items.py"
OWN_STEP = re.compile(r"median_step_s=([0-9.]+)")
PAIRS = 2
"""Alternating pairs (as it is, then fixed, in turn first) the ground truth is the median of."""


def script_line(code: str) -> int:
    """The number of the script's line that holds ``code``."""
    return next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if code in line)


def advice(record: dict[str, Any]) -> dict[str, Any]:
    """The run's ``cheaper-batches`` recommendation (failing with the rule's check where there is none)."""
    found = {r["id"]: r for r in record["recommendations"]}
    assert "cheaper-batches" in found, (record["checks"]["cheaper-batches"], record["recommendations"])
    return found["cheaper-batches"]


# (timing: the verdict and the advice are read from the run's measured times, which another test's runs beside it
# change: CI's untimed part, three tests at a time on 2 cores, once left cheaper-batches clear; two busy processes
# beside it here turned the verdict to compute-bound or inconclusive, with fewer-torch-threads first, rightly)
@pytest.mark.timing
@pytest.mark.parametrize(("dataset", "sliced_from"), [
    ("tensors", "the dataset's tensors"),
    ("list", "tensors"),
])
def test_light_items_fetched_one_by_one_are_advised_sliced_from_the_loaders_line(runs: Runs, dataset: str,
                                                                                 sliced_from: str) -> None:
    # when
    record = runs.get(SCRIPT, "--epochs", "15", "--dataset", dataset).record
    # then: loading bounds the run, workers are no help, and the advice is measured
    assert record["verdict"]["bound"] == "data-loading", record["verdict"]
    found = {r["id"]: r for r in record["recommendations"]}
    if "more-dataloader-workers" in found and "cheaper-batches" not in found:
        # the scenario needs workers no help; on a 2-core machine the loader probe sometimes times them fast enough
        # to shorten the step (1 of 2 runs at 6f652a4 as at main, 2026-11-28; CI at 52f3c91): then cheaper-batches
        # rightly keeps clear (its rule: workers predicted to do as well), and there is nothing here to check
        pytest.skip("the loader probe predicted workers would shorten the step here: "
                    f"{found['more-dataloader-workers']['evidence']}")
    assert record["data_probe"]["batch_built_s"] is not None, record["data_probe"]  # the items timed light
    per_item_s = record["data_probe"]["batch_built_s"] / 512
    if dataset == "list" and per_item_s > 10e-6:
        # a dataset of the user's own has light items only as timed (CHEAPER_ONE_CALL_ITEM_S, 10 us; a TensorDataset's
        # are by construction): CI at 31ce129, beside two other test runs, built the TensorDataset's at over 10 us
        pytest.skip(f"this machine built the list's items at {per_item_s * 1e6:.1f} us each: not light as timed here")
    found = advice(record)
    loader_line = script_line("loader = DataLoader(dataset, batch_size=512, shuffle=True)")
    assert found["fix"].startswith(f"small_items.py:{loader_line}: slice each batch from {sliced_from} instead of "
                                   "fetching its items one by one through the DataLoader"), found["fix"]
    probe = record["data_probe"]
    assert probe["batch_built_s"] > 2 * probe["batch_sliced_s"], probe
    if dataset == "list":  # the dataset's own line that reads an item is named
        line = script_line("return self.items[index]")
        assert f"small_items.py:{line} `return self.items[index]`" in found["fix"], found["fix"]
    # and the report shows the builds the advice rests on
    report = (Path(record["_run_dir"]) / "report.html").read_text()
    assert "One batch of the loader's size built again, untraced" in report


def own_step_s(tmp_path: Path, *args: str) -> float:
    """The script's median step, as it timed itself under plain python."""
    result = run_python([str(SCRIPT), "--epochs", "60", *args], tmp_path, preloaded=True)
    assert result.returncode == 0, result.stderr
    return float(OWN_STEP.search(result.stdout).group(1))  # type: ignore[union-attr]


@pytest.mark.timing
def test_the_promised_gain_of_slicing_holds_without_gpuscope(tmp_path: Path) -> None:
    # given the advice on the TensorDataset loop, as a run on this machine recorded it (the fast tier checks that the
    # rule gives it; the untimed test here, that a run does)
    record = json.loads((SCRIPTS.parent / "records" / "small_items.json").read_text())
    promised = advice(record)["expected_gain"]
    # when the loop is timed without gpuscope, as it is and sliced, in alternating pairs
    gains = []
    for k in range(PAIRS):
        order = [(), ("--sliced",)] if k % 2 == 0 else [("--sliced",), ()]
        steps = {args: own_step_s(tmp_path, *args) for args in order}
        gains.append(1 - steps[("--sliced",)] / steps[()])
    measured = statistics.median(gains)
    # then the promise is off by less than half of itself
    assert abs(measured - promised) < promised / 2, (promised, gains)
