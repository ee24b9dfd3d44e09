"""The README's two commands are the ones CI runs, word for word."""

from __future__ import annotations

import re

import pytest

from conftest import ROOT


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:sh|bash|console)\n(.*?)```", text, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.startswith("pip install")]


SLOW_TIER = "python -m pytest -m slow"
SLOW_TIER_PARTS = ('python -m pytest -m "slow and not timing" -n 3', 'python -m pytest -m "slow and timing"')
"""How CI runs the slow tier: the tests that time nothing three at a time, then those that do, alone."""


def test_ci_runs_the_readmes_install_and_test_commands_verbatim() -> None:
    commands = readme_commands()
    assert any("gpuscope run sample_workloads/" in c for c in commands)
    assert any(c.endswith("&& python -m pytest") for c in commands)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in commands:
        assert command in ci, f"CI does not run the README's command: {command}"


def test_ci_runs_the_whole_slow_tier_after_the_fast_one() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    (fast,) = [i for i, line in enumerate(ci) if line.endswith("&& python -m pytest")]
    # its two parts, "slow and not timing" and "slow and timing", are the whole of "slow"
    parts = [next(i for i, line in enumerate(ci) if part in line and not line.startswith("#"))
             for part in SLOW_TIER_PARTS]
    assert fast < parts[0] < parts[1]
    assert f"`{SLOW_TIER}`" in (ROOT / "README.md").read_text()


def test_the_fast_tier_leaves_the_slow_one_out_and_the_marker_is_registered() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pytest_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "-m 'not slow'" in pytest_config["addopts"]
    assert any(marker.startswith("slow: ") for marker in pytest_config["markers"])
    # the slow tests that compare measured times, which CI runs alone (conftest.py refuses one not marked slow)
    assert any(marker.startswith("timing: ") for marker in pytest_config["markers"])
