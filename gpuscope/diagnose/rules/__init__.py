"""The diagnosis rules, one module per theme (each registers its rules as it is imported: every module of this
package is); ``evaluate`` runs them all on a record."""

from __future__ import annotations

import importlib
import pkgutil

from gpuscope.diagnose.rules.base import RULES, AtRunTime, Finding, Refused, Rule, missing_input
from gpuscope.diagnose.thresholds import MIN_RECOMMENDED_GAIN
from gpuscope.record import Recommendation, RuleCheck, RunRecord

for _theme in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_theme}")  # registry order: alphabetical by module, then as written


def evaluate(record: RunRecord) -> tuple[tuple[Recommendation, ...], dict[str, RuleCheck]]:
    """Every rule on ``record``: the recommendations (most valuable first; ties in registry order, unknown gains
    last) and what became of each rule."""
    fired: list[tuple[int, Rule, Finding]] = []
    checks: dict[str, RuleCheck] = {}
    for position, r in enumerate(RULES):
        reason = missing_input(record, r.needs)
        if reason is not None:
            checks[r.id] = RuleCheck("not-checked", reason)
            continue
        finding = r.check(record)
        if finding is None:
            checks[r.id] = RuleCheck("clear")
            continue
        if finding.gain is not None and finding.gain < MIN_RECOMMENDED_GAIN:
            checks[r.id] = RuleCheck("clear", f"its measured gain, {finding.gain:.1%} of the step, is too small to "
                                              f"recommend ({'; '.join(finding.evidence)})")
            continue
        checks[r.id] = RuleCheck("fired")
        fired.append((position, r, finding))
    fired.sort(key=lambda item: (-(item[2].gain if item[2].gain is not None else -1.0), item[0]))
    recommendations = tuple(
        Recommendation(id=r.id, title=r.title, why="; ".join(f.evidence), fix=f.fix or r.fix,
                       expected_gain=round(f.gain, 3) if f.gain is not None else None, evidence=f.evidence)
        for _, r, f in fired
    )
    return recommendations, checks


def finding(record: RunRecord, rule_id: str) -> Finding | None:
    """What the rule ``rule_id`` finds on ``record`` (None: it cannot be checked, or found nothing)."""
    r = by_id(rule_id)
    return None if missing_input(record, r.needs) is not None else r.check(record)


def by_id(rule_id: str) -> Rule:
    """The rule of a recommendation id (KeyError where there is none)."""
    for r in RULES:
        if r.id == rule_id:
            return r
    raise KeyError(rule_id)


__all__ = ["RULES", "AtRunTime", "Finding", "Refused", "Rule", "by_id", "evaluate", "finding"]
