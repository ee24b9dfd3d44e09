"""The comparison page rendered from two records: both charts from recorded runs, plotly.js inlined once and
nothing fetched, everything from the runs escaped, and the page written where asked."""

from __future__ import annotations

import dataclasses
import json
import re
from html import escape

import pytest
from report_records import HOSTILE, fixed_data_loading_record, gpu_record, hostile_record, sample_record

from conftest import make_record
from gpuscope.diagnose.compare import compare
from gpuscope.record import Recommendation, RuleCheck
from gpuscope.report.render import plotly_js, render_compare, write_compare

SCRIPT_TAGS = 3
"""The page's own <script> elements: plotly.js, the charts' JSON, and the code that draws them."""


def charts_of(html: str) -> dict:
    return json.loads(html.split('id="gpuscope-charts">', 1)[1].split("</script>", 1)[0])


def test_two_recorded_runs_render_with_both_charts() -> None:
    # given the recorded data-loading-bound run and the same run with its data wait fixed
    before, after = sample_record("data_loading_bound"), fixed_data_loading_record()
    # when the comparison page is rendered
    html = render_compare(before, after, inline_plotly=False)
    # then it draws the step-time distributions and the breakdowns of both runs
    charts = charts_of(html)
    assert set(charts) == {"step-times", "breakdown"}
    assert [trace["name"] for trace in charts["step-times"]["data"]] == ["A (before)", "B (after)"]
    assert all(trace["type"] == "box" and len(trace["y"]) == 7 for trace in charts["step-times"]["data"])
    wait = next(trace for trace in charts["breakdown"]["data"] if trace["name"] == "data wait")
    assert wait["y"][0] == 226.8 and wait["y"][1] < 25  # ms per step in A and B
    assert 'data-chart="step-times"' in html and 'data-chart="breakdown"' in html
    # and says what changed
    assert re.search(r'<h1 id="speedup-label">1\.43x</h1>', html)
    assert "B is faster" in html
    assert "data-loading-bound" in html and "CPU-compute-bound" in html
    assert "resolved" in html and "data wait 34% -&gt; 5%" in html
    assert "differ in more than one change" not in html


def test_runs_whose_steps_take_different_samples_are_compared_per_sample_too() -> None:
    # given: the data-loading sample at batch 32, then at batch 64
    before = sample_record("data_loading_bound")
    after = dataclasses.replace(fixed_data_loading_record(), loaders=tuple(
        dataclasses.replace(loader, batch_size=2 * (loader.batch_size or 1)) for loader in before.loaders))
    html = render_compare(before, after, inline_plotly=False)
    # then the page says what a sample costs in each, as the terminal does
    line = compare(before, after).per_sample
    assert line is not None
    assert (f'<p id="per-sample">The steps take different numbers of samples: {escape(line.line())}.</p>') in html
    assert 'id="per-sample"' not in render_compare(before, fixed_data_loading_record(), inline_plotly=False)


def test_plotly_is_inlined_once_and_nothing_is_fetched() -> None:
    js = plotly_js()
    html = render_compare(sample_record("data_loading_bound"), fixed_data_loading_record())
    assert html.count(js) == 1
    html = html.replace(js, "")
    assert html.count("<script") == SCRIPT_TAGS
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, flags=re.I)
    assert "<link" not in html.lower()


def test_hostile_script_names_and_titles_render_inert() -> None:
    # given runs whose script name, arguments and recommendation titles hold markup and script ends
    a = hostile_record()
    b = dataclasses.replace(gpu_record(), command=("train.py", HOSTILE), recommendations=(
        Recommendation(id="larger-batch", title=f"</script><script>window.__pwned=1</script>{HOSTILE}"),))
    # when compared
    html = render_compare(a, b, inline_plotly=False)
    # then the page has only its own scripts, and the text is there, escaped
    assert html.count("<script") == SCRIPT_TAGS
    assert html.lower().count("</script") == SCRIPT_TAGS
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "alert(1)</script>" not in html
    assert "&lt;/script&gt;&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html
    charts_json = html.split('id="gpuscope-charts">', 1)[1].split("</script>", 1)[0]
    assert "<" not in charts_json
    # and the warning about unlike scripts names them escaped too (the script's file name follows its last slash)
    assert "different scripts (A: script&gt;.py, B: train.py)" in html


def test_secret_arguments_are_masked_in_the_page() -> None:
    html = render_compare(gpu_record(), gpu_record(), inline_plotly=False)
    assert "abc123" not in html and "sk-secret" not in html


def test_runs_without_steps_render_without_charts() -> None:
    # given two runs that found no step (no sample, no median)
    bare = make_record(steps=dataclasses.replace(make_record().steps, count=0, median_s=0.0))
    html = render_compare(bare, bare, inline_plotly=False)
    assert charts_of(html) == {}
    assert "no steady-state step in A and B" in html
    assert "no distribution to show" in html


@pytest.mark.parametrize(("check", "status"), [(RuleCheck("fired"), "still there"),
                                               (RuleCheck("not-checked", "no <kernel> timeline"), "not checked in B")])
def test_each_recommendation_shows_its_status_and_reason(check, status) -> None:
    rec = Recommendation(id="mixed-precision", title="Train in mixed precision")
    a = make_record(recommendations=(rec,))
    b = make_record(checks={"mixed-precision": check})
    html = render_compare(a, b, inline_plotly=False)
    assert f">{status}</span>" in html
    if check.reason:
        assert "no &lt;kernel&gt; timeline" in html


def test_the_page_is_written_where_asked_with_its_folder_made(tmp_path) -> None:
    a, b = sample_record("data_loading_bound"), fixed_data_loading_record()
    path = write_compare(a, b, tmp_path / "out" / "cmp.html", compare(a, b))
    assert path == tmp_path / "out" / "cmp.html"
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in path.parent.iterdir()] == ["cmp.html"]
