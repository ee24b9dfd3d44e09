"""Each report opened in a real headless browser (Debian's chromium, driven by Playwright): no console error,
every chart drawn, the verdict shown, no network request; a screenshot of each (its first screen: the verdict and
the advice) lands in ci-artifacts/.

Skipped where chromium or Playwright is missing, except under CI (env CI set), where that is a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from report_records import (
    JOB_STRAGGLER,
    SAMPLE_RECORDS,
    fixed_data_loading_record,
    gpu_record,
    hostile_record,
    job_record,
    sample_record,
)

from conftest import ROOT, SCRIPTS, Runs, run_gpuscope
from gpuscope.record import load_record
from gpuscope.report import write_report
from gpuscope.report.render import write_compare
from gpuscope.diagnose.words import bound_label

pytestmark = pytest.mark.slow
CHROMIUM = os.environ.get("GPUSCOPE_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = ROOT / "ci-artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
LOCAL = ("file:", "data:", "about:", "blob:")


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must install it (.ci/run)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        _unavailable(f"no chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[test]')")
    executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def open_report(browser: Any, path: Path, name: str) -> tuple[Any, dict[str, list[str]]]:
    """Open a report from its file; return the page and what went wrong (console errors, requests, dialogs)."""
    seen: dict[str, list[str]] = {"errors": [], "requests": [], "dialogs": []}
    context = browser.new_context(viewport={"width": 1280, "height": 900})

    def route(route: Any) -> None:
        url = route.request.url
        if url.startswith(LOCAL):
            route.continue_()
        else:
            seen["requests"].append(url)
            route.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda message: message.type == "error" and seen["errors"].append(message.text))
    page.on("pageerror", lambda error: seen["errors"].append(str(error)))
    page.on("dialog", lambda dialog: (seen["dialogs"].append(dialog.message), dialog.dismiss()))
    page.goto(path.resolve().as_uri(), wait_until="load")
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-chart]')].every(el => el.querySelector('svg.main-svg'))",
        timeout=15_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"report-{name}.png"))
    return page, seen


def assert_report_works(browser: Any, path: Path, name: str, label: str) -> Any:
    page, seen = open_report(browser, path, name)
    assert seen["errors"] == []
    assert seen["requests"] == [], "the page must make no network request"
    assert seen["dialogs"] == []
    charts = page.locator("[data-chart]")
    assert charts.count() >= 2  # at least the median step and the step bars
    assert page.locator("[data-chart] svg.main-svg").count() >= charts.count()
    for i in range(charts.count()):
        assert charts.nth(i).locator("svg.main-svg").count() >= 1, charts.nth(i).get_attribute("id")
    # the label, and after it the distance to the peak where the record has one (a compute-bound run with an MFU)
    shown = page.inner_text("#verdict-label").strip()
    assert shown == label or shown.startswith(f"{label} at "), shown
    return page


@pytest.mark.parametrize("name", SAMPLE_RECORDS)
def test_each_sample_workloads_report_works_in_a_browser(browser, tmp_path, name) -> None:
    record = sample_record(name)
    path = write_report(record, tmp_path)
    page = assert_report_works(browser, path, name, bound_label(record))
    if record.device == "cpu":
        assert "This run used the CPU only" in page.inner_text("#device")
    page.context.close()


def test_a_full_gpu_report_draws_every_device_chart(browser, tmp_path) -> None:
    path = write_report(gpu_record(), tmp_path)
    page = assert_report_works(browser, path, "gpu-full", "GPU-compute-bound")
    for chart in ("gpu-util", "gpu-memory", "gpu-power", "gpu-clock", "kernels", "ops", "host-memory", "cuda-memory"):
        assert page.locator(f"#chart-{chart} svg.main-svg").count() >= 1, chart
    page.context.close()


def test_hostile_names_stay_text_in_a_browser(browser, tmp_path) -> None:
    path = write_report(hostile_record(), tmp_path)
    page = assert_report_works(browser, path, "hostile", "GPU-compute-bound")
    assert page.evaluate("() => window.__pwned") is None
    assert "<script>alert(1)</script>" in page.inner_text("header")
    page.context.close()


def test_the_compare_page_works_in_a_browser(browser, tmp_path) -> None:
    # given the recorded data-loading-bound run and the same run with its data wait fixed
    path = write_compare(sample_record("data_loading_bound"), fixed_data_loading_record(), tmp_path / "compare.html")
    # when the comparison page is opened
    page, seen = open_report(browser, path, "compare")
    # then it works offline and draws both charts
    assert seen == {"errors": [], "requests": [], "dialogs": []}
    charts = page.locator("[data-chart]")
    assert charts.count() == 2
    for i in range(charts.count()):
        assert charts.nth(i).locator("svg.main-svg").count() >= 1, charts.nth(i).get_attribute("id")
    assert page.inner_text("#speedup-label").strip() == "1.43x"
    assert "resolved" in page.inner_text("#recommendations")
    page.context.close()


def test_the_report_of_a_fresh_run_works_in_a_browser(browser, runs: Runs) -> None:
    # given a real run of a sample workload (its report written by gpuscope run itself; the session's shared run)
    run = runs.sample("data_loading_bound")
    assert run.result.returncode == 0, run.result.stderr
    run_dir = run.run_dir
    # then its page works
    page = assert_report_works(browser, run_dir / "report.html", "fresh-run", bound_label(load_record(run_dir)))
    page.context.close()


def test_a_report_handed_over_while_the_script_ran_works_in_a_browser(browser, runs: Runs) -> None:
    # given the report a long job found in its run folder mid-run (--profile-steps; the run is shared with
    # tests/integration/test_profile_window.py)
    run = runs.get(SCRIPTS / "long_job.py", "run", "--steps", "300", "--check-at", "150", "--exit-status", "3",
                   options=("--profile-steps", "30"))
    during = run.run_dir / "report-during.html"
    assert during.is_file(), run.result.stderr
    # then that page works, and says the script was still running (the page of the record written at the hand-over,
    # or of the one written again once the probes ran: which of them the script copied depends on when its probes end)
    page = assert_report_works(browser, during, "handed-over", bound_label(load_record(run.run_dir)))
    assert "not known yet" in page.locator("#run").inner_text()
    page.context.close()


def test_the_page_of_a_thousand_rank_job_reads_like_a_single_rank_report(browser, tmp_path) -> None:
    # given a 1024-rank job merged from a recorded run (one rank late), and that run's own report
    job = write_report(job_record(1024), tmp_path / "job")
    single = write_report(sample_record("compute_bound"), tmp_path / "single")
    # when both are opened
    page, seen = open_report(browser, job, "job-1024")
    alone, _ = open_report(browser, single, "job-1024-single-rank")
    # then the job's page works offline, and is not much taller than the one rank's
    assert seen == {"errors": [], "requests": [], "dialogs": []}
    height = "() => document.documentElement.scrollHeight"
    assert page.evaluate(height) <= 2 * alone.evaluate(height)
    top = "() => document.getElementById('steps').getBoundingClientRect().top + window.scrollY"
    assert page.evaluate(top) - alone.evaluate(top) < page.viewport_size["height"], \
        "the ranks must not push the step time down by a screenful"
    # the menu leads to the ranks, whose chart draws a point a rank and figure, and the straggler over them
    assert page.locator('nav.toc a[href="#ranks"]').count() == 1
    assert page.locator("#chart-ranks svg.main-svg").count() >= 1
    assert page.locator("#chart-ranks path.point").count() >= 3 * 1000
    # the straggler is listed with its cause and margin, above the table
    listed = page.inner_text("ul.stragglers")
    assert f"rank {JOB_STRAGGLER}" in listed and "straggler" in listed and "data wait" in listed
    assert "late by 287.5 ms" in listed
    # the table is collapsed until asked for; opened, the straggler's row stands out, and says so in words
    assert page.eval_on_selector("details.ranks", "d => d.open") is False
    page.click("details.ranks > summary")
    late = page.locator("table.ranks tr.straggler")
    assert late.count() == 1 and late.is_visible()
    assert "straggler" in late.inner_text()
    style = "td => [getComputedStyle(td).backgroundColor, getComputedStyle(td).fontWeight]"
    normal = page.locator("table.ranks tbody tr:not(.straggler) td.rank").first.evaluate(style)
    marked = late.locator("td.rank").evaluate(style)
    assert marked[0] != normal[0] and int(marked[1]) > int(normal[1])
    page.context.close()
    alone.context.close()


GPU_TRACES = sorted((ROOT / "tests" / "fixtures" / "gpu").glob("*.json.gz")) + [ROOT / "tests" / "fixtures" / "gpu" /
                                                                                 "sampled-ranks"]


@pytest.mark.slow
@pytest.mark.parametrize("trace", GPU_TRACES, ids=lambda p: p.name)
def test_the_report_of_an_analyzed_trace_works_in_a_browser(browser, tmp_path, trace) -> None:
    # given a real GPU trace (or the folder of two rank traces) analysed by gpuscope analyze
    result = run_gpuscope(["analyze", "-q", str(trace), "-o", str(tmp_path / "out")], tmp_path)
    assert result.returncode == 0, result.stderr
    record = load_record(tmp_path / "out")
    # then its page works offline, draws its charts and shows the verdict
    name = "analyze-" + trace.name.removesuffix(".json.gz")
    page = assert_report_works(browser, tmp_path / "out" / "report.html", name, bound_label(record))
    if record.device == "cuda":
        assert page.locator("#chart-kernels svg.main-svg").count() >= 1
    page.context.close()
