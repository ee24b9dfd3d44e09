"""Plotly figures of the comparison page, as plain dicts built from the two records and their comparison (no HTML
here): the steady steps' time distributions of both runs, and their median steps split into phases side by side."""

from __future__ import annotations

from gpuscope.diagnose.compare import Comparison, steady_times
from gpuscope.record import RunRecord
from gpuscope.report.charts import PHASE_COLORS, PHASE_NAMES, Figure, _axis, _layout, _r

RUN_NAMES = ("A (before)", "B (after)")
RUN_COLORS = ("#8c959f", "#2f6feb")
ALL_POINTS = 300
"""Runs with at most this many steady steps in their sample show every step as a point beside the box."""


def step_times(a: RunRecord, b: RunRecord) -> Figure | None:
    """Box plots of each run's steady step times (ms), from the step samples; None when neither has one."""
    data = []
    for name, color, record in zip(RUN_NAMES, RUN_COLORS, (a, b)):
        times = steady_times(record)
        if not times:
            continue
        data.append({
            "type": "box", "name": name, "y": [_r(t * 1e3) for t in times], "marker": {"color": color},
            "boxpoints": "all" if len(times) <= ALL_POINTS else "outliers", "jitter": 0.4, "pointpos": 0,
            "boxmean": True, "hoverinfo": "y",
        })
    if not data:
        return None
    layout = _layout(340, showlegend=False, yaxis=_axis("ms per steady step", rangemode="tozero"))
    return {"data": data, "layout": layout}


def breakdown_bars(comparison: Comparison) -> Figure | None:
    """Each run's median step as a stack of its phases (ms per step); None when neither run has a steady step."""
    s = comparison.speedup
    if s.median_a_s is None and s.median_b_s is None:
        return None
    data = []
    for p in comparison.phases:
        shares = (p.share_a, p.share_b)
        data.append({
            "type": "bar", "name": PHASE_NAMES[p.phase], "x": list(RUN_NAMES),
            "y": [_r(p.seconds_a * 1e3), _r(p.seconds_b * 1e3)], "customdata": [_r(x * 100) for x in shares],
            "marker": {"color": PHASE_COLORS[p.phase]},
            "text": [f"{x:.0%}" if x >= 0.04 else "" for x in shares], "textposition": "inside",
            "hovertemplate": f"{PHASE_NAMES[p.phase]}: %{{y:.1f}} ms (%{{customdata:.0f}}% of the step)<extra></extra>",
        })
    layout = _layout(360, barmode="stack", yaxis=_axis("ms per median step", rangemode="tozero"),
                     xaxis={"automargin": True})
    return {"data": data, "layout": layout}


def build_compare_charts(a: RunRecord, b: RunRecord, comparison: Comparison) -> dict[str, Figure]:
    """Every figure the two runs support, keyed by the id of the element that shows it."""
    charts: dict[str, Figure | None] = {"step-times": step_times(a, b), "breakdown": breakdown_bars(comparison)}
    return {key: figure for key, figure in charts.items() if figure is not None}
