"""``gpuscope run --try`` watches the loss: a fix that breaks training is flagged, and its speed not credited (a file
of its own: its runs go to another xdist worker than test_try.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import SCRIPTS, load_run, run_gpuscope

pytestmark = pytest.mark.slow


def test_a_trial_whose_loss_goes_to_nan_is_flagged_and_not_credited(tmp_path: Path) -> None:
    # given a data-bound loop whose dataset yields NaN targets in DataLoader workers only
    result = run_gpuscope(["run", "-o", str(tmp_path / "run"), "--try", "auto", str(SCRIPTS / "try_nan_in_workers.py")],
                          tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    record = load_run(tmp_path / "run")
    (trial,) = [t for t in record["trials"] if t["id"] == "more-dataloader-workers"]
    # then its loss is not finite, and its speed is not credited
    assert trial["status"] == "measured" and trial["loss"]["status"] == "not finite"
    assert not trial["credited"] and trial["measured_gain"] is None
    assert "loss NOT FINITE" in result.stderr and "apply: DataLoader" not in result.stderr
    # and it was run once: a second run could not credit it
    assert trial["runs"] == 1 and "run once: its loss was not finite" in trial["reason"]
    assert not (tmp_path / "run" / "try-more-dataloader-workers-2").exists()
