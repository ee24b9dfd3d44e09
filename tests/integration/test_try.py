"""``gpuscope run --try``, for real: the script run again once per fix, each fix applied by gpuscope at run time, its
steps measured against the untouched run's, its loss watched, and nothing of the user's left half-written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import SCRIPTS, load_run, run_gpuscope

pytestmark = pytest.mark.slow



def test_each_fix_tried_is_measured_against_the_untouched_run_and_the_checkpoint_stays_whole(tmp_path: Path) -> None:
    # given a loop that saves a checkpoint after every step, run with two fixes to try
    result = run_gpuscope(["run", "-o", str(tmp_path / "run"), "--try", "fused-optimizer,zero-grad-set-to-none",
                           "--try-steps", "100", str(SCRIPTS / "try_checkpoint.py"), "--steps", "150"], tmp_path,
                          timeout=300)
    assert result.returncode == 0, result.stderr
    record = load_run(tmp_path / "run")
    # then both were run and measured, over the steps after their fix took effect, with the loss unchanged
    trials = {t["id"]: t for t in record["trials"]}
    assert set(trials) == {"fused-optimizer", "zero-grad-set-to-none"}
    for trial in trials.values():
        assert trial["status"] == "measured", trial
        assert trial["compared_steps"] >= 40 and trial["speedup_low"] <= trial["speedup"] <= trial["speedup_high"]
        assert trial["loss"]["status"] == "within"
        assert trial["effect"] in ("faster", "slower", "no measurable change")
        assert trial["credited"] == (trial["effect"] == "faster")  # a gain is credited only where it is measured
        folder = tmp_path / "run" / trial["run_dir"]
        assert (folder / "compare.html").is_file() and (folder / "report.html").is_file()
        applied = json.loads((folder / "trial.json").read_text())
        assert applied["stopped"] and applied["step"] is not None
    assert trials["fused-optimizer"]["change"].startswith("torch.optim.Adam(..., fused=True)")
    # each fix ran twice, the second time after the script ran untouched once more
    assert all(t["runs"] == 2 for t in trials.values())
    assert {p.name for p in (tmp_path / "run").glob("try-*")} == {
        "try-fused-optimizer", "try-zero-grad-set-to-none", "try-untouched-2", "try-fused-optimizer-2",
        "try-zero-grad-set-to-none-2"}
    # and the terminal lists them, the report leads with them
    assert "gpuscope: trying 2 fixes, 2 runs of 100 steps each" in result.stderr
    assert "  fused-optimizer: " in result.stderr
    assert 'id="tried"' in (tmp_path / "run" / "report.html").read_text()
    # the trial stopped at a step boundary: the checkpoint it saved last is whole, and is its last step's
    checkpoint = torch.load(tmp_path / "checkpoint.pt")
    assert checkpoint["step"] == trials["zero-grad-set-to-none"]["steps"] - 1
    # the trials' output went to their folders: the terminal has the untouched run's only
    assert result.stdout.count("trained 150 steps") == 1


def test_a_fix_that_cannot_be_applied_at_run_time_is_refused_before_anything_runs(tmp_path: Path) -> None:
    result = run_gpuscope(["run", "--try", "larger-batch", str(SCRIPTS / "try_checkpoint.py")], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == ("gpuscope: error: --try larger-batch: not tried at run time: it changes the "
                                     "optimisation (the samples each update averages over, and the learning rate "
                                     "that suits them), not only the speed")
    assert not (tmp_path / "checkpoint.pt").exists()
