"""What the terminal says after the script has ended: a post-run probe that may take a second or more says what it
is doing while the user waits; short ones and quiet runs say nothing."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from gpuscope.captures import PostRunFacts
from gpuscope.collectors.base import CollectorResult, PostRunProbe
from gpuscope.record import CollectorStatus
from gpuscope.session import Session


class Probe(PostRunProbe):
    name: ClassVar[str] = "slow-probe"
    field: ClassVar[str | None] = None
    doing: ClassVar[str] = "timing something slow"

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s  # type: ignore[misc]

    def run(self, run_dir: Path, facts: PostRunFacts) -> CollectorResult:
        return CollectorResult(CollectorStatus("ok"))


def said(tmp_path: Path, budget_s: float, quiet: bool = False) -> list[str]:
    lines: list[str] = []
    session = Session(tmp_path, ["train.py"], collectors=[Probe(budget_s)])
    session.start()
    session.stop(0, None if quiet else lines.append)
    return lines


def test_a_probe_of_a_second_or_more_says_what_it_does_and_how_to_skip_it(tmp_path: Path) -> None:
    assert said(tmp_path, budget_s=5.0) == ["gpuscope: timing something slow (up to 5 s; --no-probes skips this)"]


def test_a_short_probe_and_a_quiet_run_say_nothing(tmp_path: Path) -> None:
    assert said(tmp_path / "short", budget_s=0.5) == []
    assert said(tmp_path / "quiet", budget_s=5.0, quiet=True) == []
