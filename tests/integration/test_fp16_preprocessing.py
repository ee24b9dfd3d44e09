"""The float16 preprocessing sample, run through gpuscope as a user would: the data probe finds the float16 math
and ``fp32-preprocessing`` names its lines; with the fix applied (``--fp32``) the steps are faster and the rule
stays clear."""

from __future__ import annotations

import re

import pytest

from conftest import SAMPLES, Runs, compare_runs
from gpuscope.diagnose import thresholds as th

pytestmark = [pytest.mark.slow, pytest.mark.timing]
SAMPLE = SAMPLES / "data_loading_bound_fp16.py"
LINE = re.compile(r"steps=(\d+) median_step_s=([0-9.]+) data_wait_fraction=([0-9.]+)")
NAMED = re.compile(r"data_loading_bound_fp16\.py:(\d+) `([^`]*)`")
MATH = ("p = sum(k * p[:, :, i:i + w]", "return sum(k * p[:, i:i + h, :]", "img = smooth + 0.5 * (img - blur(smooth))")
"""The sample's heaviest float16 lines: the blur's two passes and the unsharp mask."""


def profile(runs: Runs, *args: str) -> dict:
    """The sample's run under gpuscope (shared: the 24-step one is also the loader probe's test's, in
    test_probe_and_speed_of_light.py)."""
    run = runs.sample(SAMPLE.stem, *args)
    assert LINE.search(run.result.stdout), run.result.stdout
    return run.record


def sample_line(number: int) -> str:
    return SAMPLE.read_text().splitlines()[number - 1].strip()


def test_float16_preprocessing_is_named_and_float32_fixes_it(runs: Runs) -> None:
    # given the sample as it is, and with its preprocessing math moved to float32
    slow = profile(runs, "--steps", "24")
    fixed = profile(runs, "--steps", "16", "--fp32")

    # then the float16 run is data-loading bound, and the rule names the sample's float16 math
    assert slow["verdict"]["bound"] == "data-loading", slow["verdict"]["evidence"]
    found = {r["id"]: r for r in slow["recommendations"]}
    assert "fp32-preprocessing" in found, slow["checks"]["fp32-preprocessing"]
    evidence = " | ".join(found["fp32-preprocessing"]["evidence"])
    named = NAMED.findall(evidence)
    assert named, evidence
    # each named line is the sample's own line, quoted as written; the heaviest is float16 arithmetic
    assert all(sample_line(int(number)) == code for number, code in named)
    assert named[0][1].startswith(MATH), evidence
    assert found["fp32-preprocessing"]["fix"].startswith(f"data_loading_bound_fp16.py:{named[0][0]}")
    assert re.search(r"NumPy float16 arithmetic ran [0-9.]+x slower than float32", evidence)
    probe = slow["data_probe"]
    assert probe["dataset"] == "CachedImages" and probe["float16_s"] / probe["item_s"] > 0.5

    # and in float32 the batches are still float16, the steps are faster, and the rule stays clear
    assert fixed["loaders"][0]["batch_tensors"][0].startswith("float16[")
    assert fixed["steps"]["median_s"] < slow["steps"]["median_s"]
    assert fixed["checks"]["fp32-preprocessing"]["status"] == "clear"
    assert fixed["data_probe"]["float16_s"] / fixed["data_probe"]["item_s"] < th.FLOAT16_SHARE_NOTABLE

    # and compare shows the speed-up and the rule resolved
    result = compare_runs(slow, fixed)
    assert result.returncode == 0, result.stderr
    assert re.search(r"speed-up \d+\.\d+x .*B is faster", result.stdout), result.stdout
    assert "fp32-preprocessing: resolved" in result.stdout, result.stdout
