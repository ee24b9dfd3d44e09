"""What the terminal says after the script has ended: a post-run probe still running after a second says what it is
doing while the user waits; quicker ones and quiet runs say nothing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import ClassVar

import pytest

from gpuscope import session as stage
from gpuscope.collect.captures import PostRunFacts
from gpuscope.collect.framework.base import CollectorResult, PostRunProbe
from gpuscope.record import CollectorStatus
from gpuscope.session import Session


class Probe(PostRunProbe):
    name: ClassVar[str] = "slow-probe"
    field: ClassVar[str | None] = None
    doing: ClassVar[str] = "timing something slow"

    def __init__(self, takes_s: float) -> None:
        self.takes_s = takes_s

    def run(self, run_dir: Path, facts: PostRunFacts) -> CollectorResult:
        time.sleep(self.takes_s)
        return CollectorResult(CollectorStatus("ok"))


@pytest.fixture(autouse=True)
def _a_second_is_a_twentieth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stage, "PROGRESS_AFTER_S", 0.05)


def said(tmp_path: Path, takes_s: float, quiet: bool = False) -> list[str]:
    lines: list[str] = []
    session = Session(tmp_path, ["train.py"], collectors=[Probe(takes_s)])
    session.start()
    session.stop(0, None if quiet else lines.append)
    return lines


def test_a_probe_still_running_after_a_second_says_what_it_does_and_how_to_skip_it(tmp_path: Path) -> None:
    budget = Probe.budget_s
    assert said(tmp_path, takes_s=0.3) == [
        f"gpuscope: timing something slow (up to {budget:.0f} s; --no-probes skips this)"]


def test_a_quick_probe_and_a_quiet_run_say_nothing(tmp_path: Path) -> None:
    assert said(tmp_path / "short", takes_s=0.0) == []
    assert said(tmp_path / "quiet", takes_s=0.3, quiet=True) == []
