"""``gpuscope compare`` in a terminal or a CI log: a few plain lines read from the ``Comparison``
(``gpuscope.diagnose.compare``), and the ``--fail-if-slower`` gate's line."""

from __future__ import annotations

from pathlib import Path

from gpuscope.diagnose.compare import LEVEL, Comparison, SpeedUp
from gpuscope.diagnose.evidence import show


def speedup_text(s: SpeedUp) -> str:
    """The speed-up in words: "speed-up 1.52x (95% interval 1.41x to 1.63x): B is faster"."""
    if s.ratio is None:
        return s.note or "no speed-up figure"
    interval = (f"{LEVEL:.0%} interval {s.low:.2f}x to {s.high:.2f}x" if s.low is not None and s.high is not None
                else s.note or "no interval")
    return f"speed-up {s.ratio:.2f}x ({interval}): {s.reading()}"


def gate_text(s: SpeedUp, max_slower_pct: float) -> tuple[bool, str]:
    """Whether B fails ``--fail-if-slower PCT`` (its median step slower than A's by more than PCT percent, point
    estimate), and a line saying so. Raises ValueError when a median is missing."""
    slower = s.slower_pct
    if slower is None:
        raise ValueError(s.note or "no speed-up figure")
    failed = slower > max_slower_pct
    change = f"{slower:.1f}% slower" if slower > 0 else f"{-slower:.1f}% faster"
    verdict = "FAILED" if failed else "passed"
    return failed, f"gate {verdict}: B's median step is {change} than A's (--fail-if-slower {max_slower_pct:g}%)"


def summary_lines(comparison: Comparison, html_path: Path | None = None) -> list[str]:
    """The comparison as a few plain lines for a terminal or a CI log."""
    s, v = comparison.speedup, comparison.verdict
    lines = [f"gpuscope compare: {speedup_text(s)}"]
    if s.median_a_s is not None or s.median_b_s is not None:
        change = f" ({s.slower_pct:+.1f}%)" if s.slower_pct is not None else ""
        lines.append(f"  median step: A {_median(s.median_a_s)} -> B {_median(s.median_b_s)}{change}, on {s.clock}")
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


def _median(value: float | None) -> str:
    return "n/a" if value is None else show(value, "seconds")


__all__ = ["gate_text", "speedup_text", "summary_lines"]
