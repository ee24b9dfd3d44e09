"""The Ranks section of a data-parallel job's page: the straggler listed above a chart of how the ranks spread,
every rank's row in a table folded away at scale, a menu link, run data escaped."""

from __future__ import annotations

import dataclasses
import json

from report_records import HOSTILE, JOB_STRAGGLER, job_record, sample_record

from gpuscope.report import render_report
from gpuscope.report.charts import BOX_MIN_RANKS, MAX_POINTS, rank_spread
from gpuscope.report.render import rank_ranges

SCRIPT_TAGS = 3
"""The page's own <script> elements: plotly.js, the charts' JSON, and the code that draws them."""


def charts_of(html: str) -> dict:
    return json.loads(html.split('id="gpuscope-charts">', 1)[1].split("</script>", 1)[0])


def ranks_section(html: str) -> str:
    return html.split('<section id="ranks">', 1)[1].split("</section>", 1)[0]


def test_a_many_rank_job_folds_its_table_and_charts_the_ranks() -> None:
    # given a job of 1024 ranks; when its page is rendered
    html = render_report(job_record(1024), inline_plotly=False)
    section = ranks_section(html)
    # then the menu leads to the ranks, the table is folded away, and the chart is there
    assert '<a href="#ranks">Ranks</a>' in html
    assert '<details class="ranks">' in section
    assert "<summary>every rank (1024): the table</summary>" in section
    assert section.count("<tr") == 1 + 1024
    assert 'data-chart="ranks"' in section
    # and the straggler is listed before the chart and the table, with its margin and cause
    stragglers = section.index('<ul class="stragglers">')
    assert stragglers < section.index('data-chart="ranks"') < section.index('<details class="ranks"')
    assert f"<strong>rank {JOB_STRAGGLER}</strong>" in section and "cause: <strong>data wait</strong>" in section
    assert section.count('<tr class="straggler">') == 1
    row = section.split('<tr class="straggler">', 1)[1].split("</tr>", 1)[0]
    assert '<span class="badge straggler">straggler</span>' in row


def test_a_small_job_shows_its_table_open() -> None:
    html = render_report(job_record(4), inline_plotly=False)
    assert '<details class="ranks" open>' in ranks_section(html)
    assert "<summary>every rank (4): the table</summary>" in html


def test_a_single_runs_page_has_no_ranks() -> None:
    html = render_report(sample_record("compute_bound"), inline_plotly=False)
    assert 'href="#ranks"' not in html and 'id="ranks"' not in html
    assert "ranks" not in charts_of(html)


def test_hostile_host_names_render_inert_in_the_ranks() -> None:
    # given ranks on a host whose name is markup, the straggler among them
    job = job_record(64)
    ranks = tuple(dataclasses.replace(r, host=HOSTILE) for r in job.ranks)
    html = render_report(dataclasses.replace(job, ranks=ranks), inline_plotly=False)
    # then the name is text, in every row and the straggler's line, and the page has only its own scripts
    section = ranks_section(html)
    assert section.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 64 + 1
    assert "alert(1)</script>" not in html
    assert html.count("<script") == SCRIPT_TAGS


def test_the_stragglers_share_and_spread_are_shown_where_the_record_has_them() -> None:
    # given a straggler and ranks with the record's newer fields (its cause's share, the spread held against)
    job = job_record(32)
    straggler = dataclasses.replace(job.straggler, cause_share=0.8, spread_s=0.0012)
    ranks = tuple(dataclasses.replace(r, spread_s=None if r.rank == 1 else 0.004) for r in job.ranks)
    # when rendered
    section = ranks_section(render_report(dataclasses.replace(job, straggler=straggler, ranks=ranks),
                                          inline_plotly=False))
    # then the straggler's line says them, and the table has a spread column
    assert "(80% of the lateness)" in section
    assert "beyond the 600.0 µs the other ranks' own steps stray from their median" in section
    assert ">step spread</th>" in section and section.count(">4.0 ms</td>") == 31
    # and without them (a record merged before them), neither is shown
    section = ranks_section(render_report(job, inline_plotly=False))
    assert "of the lateness" not in section and "spread" not in section.split('<details class="ranks"', 1)[1]


def test_missing_ranks_are_named_in_runs() -> None:
    # given a job whose ranks 3 to 7 and 20 left no record
    job = job_record(24)
    gone = (3, 4, 5, 6, 7, 20)
    job = dataclasses.replace(job, ranks=tuple(r for r in job.ranks if r.rank not in gone), missing_ranks=gone)
    # then the page names them in a line, and each has a row
    section = ranks_section(render_report(job, inline_plotly=False))
    assert "ranks 3-7, 20 left no record" in section
    assert section.count('<tr class="missing">') == len(gone)
    assert rank_ranges([9, 1, 2, 3, 5]) == "1-3, 5, 9"
    assert rank_ranges([]) == ""


def test_the_ranks_chart_has_a_row_a_figure_and_the_straggler_over_them() -> None:
    # given 1024 ranks, every 100th without its wait on collectives
    figure = rank_spread(job_record(1024))
    # then each figure's row has a point a rank that has it, and the straggler is drawn over them
    boxes = [t for t in figure["data"] if t["type"] == "box"]
    assert [t["name"] for t in boxes] == ["median step", "data wait", "waiting on collectives"]
    assert [len(t["x"]) for t in boxes] == [1024, 1024, 1024 - 10]
    (late,) = [t for t in figure["data"] if t["type"] == "scatter"]
    assert late["name"] == f"rank {JOB_STRAGGLER}: the straggler" and late["y"] == [t["name"] for t in boxes]
    assert late["x"][2] == 0  # it waits for no one


def test_the_ranks_chart_samples_a_huge_world_but_keeps_the_straggler() -> None:
    figure = rank_spread(job_record(2 * MAX_POINTS + 1))
    assert all(len(t["x"]) <= MAX_POINTS for t in figure["data"])
    assert figure["data"][-1]["name"] == f"rank {JOB_STRAGGLER}: the straggler"


def test_no_ranks_chart_under_two_ranks() -> None:
    assert rank_spread(job_record(1)) is None
    assert rank_spread(sample_record("compute_bound")) is None


def test_a_handful_of_ranks_is_drawn_as_points_without_boxes() -> None:
    few = rank_spread(job_record(BOX_MIN_RANKS - 1))
    many = rank_spread(job_record(BOX_MIN_RANKS))
    assert {t["line"]["width"] for t in few["data"] if t["type"] == "box"} == {0}
    assert all(t["line"]["width"] > 0 for t in many["data"] if t["type"] == "box")


def test_each_ranks_memory_peak_and_room_are_columns_where_measured() -> None:
    job = job_record(4)
    assert "memory peak" not in ranks_section(render_report(job, inline_plotly=False))
    ranks = tuple(dataclasses.replace(r, memory_peak_bytes=(r.rank + 1) * 100_000_000,
                                      memory_headroom_bytes=1_000_000_000) for r in job.ranks)
    section = ranks_section(render_report(dataclasses.replace(job, ranks=ranks), inline_plotly=False))
    assert '<th class="n" title="its tensors at its memory window\'s peak">memory peak</th>' in section
    row = section.split('<td class="rank">0</td>', 1)[1].split("</tr>", 1)[0]
    assert '<td class="n">95 MiB</td><td class="n">954 MiB</td>' in row
