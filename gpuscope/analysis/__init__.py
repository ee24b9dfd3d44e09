"""From measurements to conclusions: pure functions of the record."""

from __future__ import annotations

import dataclasses

from gpuscope.analysis.classify import classify
from gpuscope.record import RunRecord


def analyze(record: RunRecord) -> RunRecord:
    """``record`` with its verdict, recommendations (most valuable first) and rule checks filled in."""
    from gpuscope.analysis.rules import evaluate

    recommendations, checks = evaluate(record)
    return dataclasses.replace(record, verdict=classify(record), recommendations=recommendations, checks=checks)
