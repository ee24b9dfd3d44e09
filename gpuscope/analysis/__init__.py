"""From measurements to conclusions: pure functions of the record."""

from __future__ import annotations

from gpuscope.analysis.classify import classify
from gpuscope.record import Recommendation, RunRecord, Verdict


def analyze(record: RunRecord) -> tuple[Verdict, tuple[Recommendation, ...]]:
    """The verdict and the recommendations (most valuable first) for a record of measurements."""
    return classify(record), ()
