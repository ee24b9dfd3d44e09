"""The HTML report rendered from records: golden files, escaping, secrets, missing parts, size and speed."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import pytest
from report_records import (
    SAMPLE_RECORDS,
    cpu_bare_record,
    gpu_record,
    hostile_record,
    long_record,
    normalise,
    sample_record,
)

from gpuscope import __version__
from gpuscope.record import DataProbe, LineCost, LoaderProbe, LoaderRate, RunRecord
from gpuscope.report import render_report, template_dir, write_report
from gpuscope.report.facts import MASK, fix_lines, mask_command
from gpuscope.report.render import plotly_js

GOLDEN = Path(__file__).resolve().parent / "golden"
SCRIPT_TAGS = 3
"""The page's own <script> elements: plotly.js, the charts' JSON, and the code that draws them."""


@pytest.fixture(scope="module")
def js() -> str:
    return plotly_js()


@pytest.mark.parametrize(("name", "build"), [("gpu_full", gpu_record), ("cpu_bare", cpu_bare_record)])
def test_report_matches_its_golden_file(name, build, js, update_golden) -> None:
    # given a fixed record; when it is rendered and its volatile parts fixed
    html = normalise(render_report(build()), js, __version__)
    # then it is the reviewed page (pytest --update-golden rewrites it)
    path = GOLDEN / f"{name}.html"
    if update_golden:
        path.write_text(html, encoding="utf-8")
    assert path.exists(), f"no golden file {path}: run pytest --update-golden"
    assert html == path.read_text(encoding="utf-8"), f"{path.name} differs: review, then pytest --update-golden"


def test_plotly_is_inlined_once_and_nothing_is_fetched(js) -> None:
    html = render_report(gpu_record())
    assert html.count(js) == 1
    html = html.replace(js, "")  # plotly.js's own strings name URLs (map tiles) that a page without maps never loads
    assert html.count("<script") == SCRIPT_TAGS
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, flags=re.I)
    assert "<link" not in html.lower()


def test_hostile_names_render_inert() -> None:
    # given a script name, arguments, function and op names holding markup and script ends
    html = render_report(hostile_record())
    # then the page still has only its own scripts, and the text is there escaped
    assert html.count("<script") == SCRIPT_TAGS
    assert html.lower().count("</script") == SCRIPT_TAGS
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "alert(1)</script>" not in html
    charts_json = html.split('id="gpuscope-charts">', 1)[1].split("</script>", 1)[0]
    assert "<" not in charts_json and "\\u003c/script\\u003e" in charts_json


def test_secret_arguments_are_masked_in_the_page() -> None:
    html = render_report(gpu_record())
    assert "abc123" not in html and "sk-secret" not in html
    assert f"--token={MASK}" in html and f"--api-key {MASK}" in html
    assert "--lr 0.1" in html


@pytest.mark.parametrize(
    ("command", "masked"),
    [
        (["t.py", "--token=abc", "--lr", "1"], ["t.py", f"--token={MASK}", "--lr", "1"]),
        (["t.py", "--api-key", "abc", "--x"], ["t.py", "--api-key", MASK, "--x"]),
        (["t.py", "--hf_token", "abc"], ["t.py", "--hf_token", MASK]),
        (["t.py", "--DB-PASSWORD=p", "--passwd", "q"], ["t.py", f"--DB-PASSWORD={MASK}", "--passwd", MASK]),
        (["t.py", "--auth-header", "Bearer x", "--client-secret", "s"], ["t.py", "--auth-header", MASK,
                                                                         "--client-secret", MASK]),
        (["t.py", "--credentials-file=c.json"], ["t.py", f"--credentials-file={MASK}"]),
        (["t.py", "wandb.api_key=abc", "epochs=3"], ["t.py", f"wandb.api_key={MASK}", "epochs=3"]),
        (["t.py", "--api-key", "--verbose"], ["t.py", "--api-key", "--verbose"]),
        (["token_key.py", "--epochs", "2"], ["token_key.py", "--epochs", "2"]),
    ],
)
def test_values_of_secret_arguments_are_masked(command, masked) -> None:
    assert mask_command(command) == masked


@pytest.mark.parametrize(
    ("fix", "lines"),
    [
        ("DataLoader(..., num_workers=1)", [("add", "DataLoader(..., num_workers=1)")]),
        ("a.py:9 `opt.zero_grad()`: opt.zero_grad(set_to_none=True)",
         [("loc", "a.py:9"), ("del", "opt.zero_grad()"), ("add", "opt.zero_grad(set_to_none=True)")]),
        ("a.py:3 `with debugging():`: remove anomaly detection from the training loop",
         [("loc", "a.py:3"), ("del", "with debugging():"), ("note", "remove anomaly detection from the training loop")]),
    ],
)
def test_a_fix_is_shown_as_a_short_diff(fix, lines) -> None:
    assert [(line.kind, line.text) for line in fix_lines(fix)] == lines


def test_every_optional_part_may_be_missing() -> None:
    # given a record of nothing but its schema (an old run.json, or one a crash cut short)
    html = render_report(RunRecord.from_json({"schema": "gpuscope.run/1"}))
    # then the page still has its seven sections and says what is missing
    for section in ("verdict", "recommendations", "steps", "device", "hotspots", "memory", "run"):
        assert f'<section id="{section}"' in html
    assert "No training step was found" in html
    assert "not recorded in this run" in html


def test_a_cpu_run_says_why_there_is_no_gpu_data() -> None:
    html = render_report(sample_record("data_loading_bound"))
    assert "This run used the CPU only" in html
    assert "no NVIDIA driver" in html  # the nvml collector's own reason
    assert "failed" not in html.split('id="device"')[1].split("</section>")[0]


def test_the_loader_probes_table_shows_each_hand_over_and_the_file_system_timing() -> None:
    probe = LoaderProbe(dataset="Texts", batch_size=16, rates=(
        LoaderRate(0, False, 118.0, 201, note="not timed again"),
        LoaderRate(1, False, 108.8, 44, 0.041, handover_s=0.00093, receive_s=0.0094)),
        file_system=LoaderRate(1, False, 116.7, 47, 0.226, handover_s=0.00051, receive_s=0.00075))
    html = render_report(dataclasses.replace(sample_record("data_loading_bound"), loader_probe=probe))
    table = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html.split('class="loader-probe"')[1].split("</table>")[0]))
    assert "hand-over of a built batch (wall / CPU)" in table
    assert "1 no 108.80 44 41.0 ms 9.4 ms / 930.0 µs" in table, table
    assert "1 no 116.70 47 226.0 ms 750.0 µs / 510.0 µs again with the file_system sharing strategy" in table, table


def test_a_dataset_probed_a_batch_at_a_time_is_described_by_the_batch() -> None:
    probe = DataProbe(dataset="Table", items=3, item_s=0.0176, batch_items=512, lines=(
        LineCost(file="tabular.py", line=23, function="Table.__getitem__", code="feats = np.stack(...)",
                 own_s=0.0094),))
    html = render_report(dataclasses.replace(sample_record("data_loading_bound"), data_probe=probe))
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html.split('id="steps"')[1].split("</section>")[0]))
    assert "Fetching 3 batches of 512 items of Table again under a line tracer (its loader gave the dataset a list " \
           "of indices a fetch): 17.6 ms a batch" in text, text
    assert "per batch" in text and "per item" not in text


def test_a_loop_fed_through_a_queue_names_the_line_it_waited_at_in_the_data_pipeline() -> None:
    import json
    from pathlib import Path

    from gpuscope.record import RunRecord

    records = Path(__file__).resolve().parents[1] / "fixtures" / "records"
    html = render_report(RunRecord.from_json(json.loads((records / "queue_fed.json").read_text())))
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html.split('id="steps"')[1].split("</section>")[0]))
    assert "No DataLoader was seen: the script fed its batches some other way." in text
    assert "The loop waited for its batches on a queue, handed over by a thread or process of its own; those waits " \
           "are the step's data wait: queue_fed.py:30 item = q.get() (64 of the waits looked at)." in text, text


@pytest.mark.parametrize("name", SAMPLE_RECORDS)
def test_each_sample_workloads_record_renders_its_verdict(name) -> None:
    from gpuscope.diagnose.words import bound_label

    record = sample_record(name)
    html = render_report(record)
    assert f'<h1 id="verdict-label">{bound_label(record)}</h1>' in html
    for rec in record.recommendations:
        assert rec.id in html


def test_a_run_of_100k_steps_renders_fast_and_small(tmp_path) -> None:
    record = long_record(100_000)
    start = time.perf_counter()
    path = write_report(record, tmp_path)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"rendering took {elapsed:.2f} s"
    assert path.stat().st_size < 8 * 2**20


def test_the_templates_are_found_where_the_wheel_puts_them() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    from conftest import ROOT

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    force = config["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert force["reports/templates"] == "gpuscope/_templates"
    names = {p.name for p in (ROOT / "reports" / "templates").glob("*.html")}
    assert {"base.html", "report.html"} <= names
    assert names == {p.name for p in template_dir().glob("*.html")}


def test_write_report_replaces_the_page_atomically(tmp_path) -> None:
    (tmp_path / "report.html").write_text("old")
    path = write_report(dataclasses.replace(gpu_record(), exit_status=3), tmp_path)
    assert path == tmp_path / "report.html"
    assert "exited with status 3" in path.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
