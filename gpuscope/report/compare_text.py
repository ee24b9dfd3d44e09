"""``gpuscope compare`` in a terminal or a CI log: a few plain lines read from the ``Comparison``
(``gpuscope.diagnose.compare``), and the ``--fail-if-slower`` gate's line."""

from __future__ import annotations

from pathlib import Path

from gpuscope.diagnose.compare import LEVEL, Comparison, Gate, SpeedUp, gate
from gpuscope.diagnose.evidence import show


def speedup_text(s: SpeedUp) -> str:
    """The speed-up in words: "speed-up 1.52x (95% interval 1.41x to 1.63x): B is faster"."""
    if s.ratio is None:
        return s.note or "no speed-up figure"
    interval = (f"{LEVEL:.0%} interval {s.low:.2f}x to {s.high:.2f}x" if s.low is not None and s.high is not None
                else s.note or "no interval")
    return f"speed-up {s.ratio:.2f}x ({interval}): {s.reading()}"


GATE_STATUS = {"passed": 0, "failed": 1, "cannot tell": 3}
"""``gpuscope compare --fail-if-slower``'s exit status by decision (2 is gpuscope's own errors)."""


def gate_text(s: SpeedUp, max_slower_pct: float) -> tuple[Gate, str]:
    """``--fail-if-slower PCT`` decided on the interval (``diagnose.compare.gate``), and a line saying so. Raises
    ValueError without a ratio."""
    g = gate(s, max_slower_pct)
    change = _pct(g.slower_pct)
    within = (f"95% interval {_pct(g.slower_low_pct)} to {_pct(g.slower_high_pct)}" if s.low is not None else
              s.note or "no interval")
    line = f"B's mean step is {change} than A's ({within}; --fail-if-slower {max_slower_pct:g}%)"
    if g.decision == "failed":
        return g, f"gate FAILED: {line}: slower by more than {max_slower_pct:g}%, with 95% confidence"
    if g.decision == "passed":
        return g, f"gate passed: {line}: not slower by more than {max_slower_pct:g}%, with 95% confidence"
    more = (f"at least {g.steps_needed} steady steps a run are needed for an interval" if s.low is None else
            f"about {g.steps_needed} steady steps a run would tell (A has {s.steps_a}, B {s.steps_b})"
            if g.steps_needed is not None else
            "more steps would not tell: the runs differ by about the limit itself, or by less than one run differs "
            f"from the next ({s.run_spread:.1%}, --run-spread); repeat both runs, or set the limit further from it")
    return g, f"gate cannot tell: {line}: the interval holds {max_slower_pct:g}%; {more}"


def _pct(slower_pct: float) -> str:
    return f"{slower_pct:.1f}% slower" if slower_pct > 0 else f"{-slower_pct:.1f}% faster"


def summary_lines(comparison: Comparison, html_path: Path | None = None) -> list[str]:
    """The comparison as a few plain lines for a terminal or a CI log."""
    s, v = comparison.speedup, comparison.verdict
    lines = [f"gpuscope compare: {speedup_text(s)}"]
    lines += [f"  note: {line}" for line in comparison.busy]
    if s.mean_a_s is not None and s.mean_b_s is not None:
        change = f" ({s.slower_pct:+.1f}%)" if s.slower_pct is not None else ""
        lines.append(f"  mean step (the throughput): A {_seconds(s.mean_a_s)} -> B {_seconds(s.mean_b_s)}{change}, on "
                     f"{s.clock}")
    if s.median_a_s is not None or s.median_b_s is not None:
        lines.append(f"  median step: A {_seconds(s.median_a_s)} -> B {_seconds(s.median_b_s)}")
    if comparison.per_sample is not None:
        lines.append(f"  {comparison.per_sample.line()}")
    if comparison.children is not None:
        lines.append(f"  {comparison.children.line()}")
    lines.append(f"  verdict: {v.label_a} (confidence {v.confidence_a:.2f}) -> {v.label_b} "
                 f"(confidence {v.confidence_b:.2f})")
    lines.append("  ms per step, A -> B: " + ", ".join(
        f"{p.phase.replace('_', ' ')} {p.seconds_a * 1e3:.1f} -> {p.seconds_b * 1e3:.1f}" for p in comparison.phases))
    ours = [o for o in comparison.outcomes if o.status != "new in B"]
    new = [o for o in comparison.outcomes if o.status == "new in B"]
    lines.append("  A's recommendations:" if ours else "  A's recommendations: none")
    lines += [f"    {o.line()}" for o in ours]
    if new:
        lines.append("  new in B:")
        lines += [f"    {o.line()}" for o in new]
    lines += [f"  warning: {flag}" for flag in comparison.flags]
    if html_path is not None:
        lines.append(f"  report: {html_path}")
    return lines


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else show(value, "seconds")


__all__ = ["GATE_STATUS", "gate_text", "speedup_text", "summary_lines"]
