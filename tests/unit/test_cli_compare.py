"""``gpuscope compare RUN_DIR_A RUN_DIR_B``: writes the page (RUN_DIR_B/compare.html or -o), prints the summary,
gates CI with --fail-if-slower (0 passed, 1 failed, 3 cannot tell), and turns bad input into one line on stderr and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import make_record, run_gpuscope
from gpuscope.cli import main
from gpuscope.record import StepSample, Steps, write_record


def run_dir(path: Path, median_s: float) -> Path:
    """A run folder whose run.json has ``median_s`` as its median step (no step sample: no interval)."""
    path.mkdir(parents=True)
    write_record(make_record(steps=Steps(count=40, median_s=median_s, total=42)), path)
    return path


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    """Run A, and run B 30% slower than A."""
    return run_dir(tmp_path / "a", 0.100), run_dir(tmp_path / "b", 0.130)


def test_the_page_goes_to_run_b_by_default_and_the_summary_to_stdout(runs, capsys) -> None:
    a, b = runs
    assert main(["compare", str(a), str(b)]) == 0
    out, err = capsys.readouterr()
    page = b / "compare.html"
    assert page.is_file() and "<html" in page.read_text()
    assert err == ""
    assert out.startswith("gpuscope compare: speed-up 0.77x (no interval: ")
    assert "  mean step (the throughput): A 100.0 ms -> B 130.0 ms (+30.0%), on the host's clock\n" in out
    assert out.endswith(f"  report: {page}\n")


def test_the_page_goes_where_o_says(runs, tmp_path, capsys) -> None:
    a, b = runs
    out_path = tmp_path / "reports" / "before-after.html"
    assert main(["compare", str(a), str(b), "-o", str(out_path)]) == 0
    assert out_path.is_file()
    assert not (b / "compare.html").exists()
    assert f"  report: {out_path}\n" in capsys.readouterr().out


def sampled_dir(path: Path, steps: tuple[float, ...]) -> Path:
    """A run folder whose run.json keeps ``steps`` as its steady steps."""
    path.mkdir(parents=True)
    sample = StepSample(index=tuple(range(len(steps))), wall_s=steps, status=("steady",) * len(steps))
    write_record(make_record(steps=Steps(count=len(steps), median_s=sorted(steps)[len(steps) // 2], total=len(steps),
                                         sample=sample)), path)
    return path


STEADY = tuple(m for m in [0.098, 0.102] * 5 for _ in range(2))
"""20 steps of 100 ms on the whole (tests/unit/test_compare.py: B 10% slower is 5.6% to 14.6% slower, 95%)."""


@pytest.mark.parametrize(("pct", "status", "gate"), [
    ("5", 1, "  gate FAILED: B's mean step is 10.0% slower than A's (95% interval 5.6% slower to 14.6% slower; "
             "--fail-if-slower 5%): slower by more than 5%, with 95% confidence"),
    ("15", 0, "  gate passed: B's mean step is 10.0% slower than A's"),
    ("10", 3, "  gate cannot tell: B's mean step is 10.0% slower than A's"),
])
def test_fail_if_slower_gates_on_the_interval_of_the_mean_step(tmp_path, capsys, pct, status, gate) -> None:
    a = sampled_dir(tmp_path / "a", STEADY)
    b = sampled_dir(tmp_path / "b", tuple(t * 1.1 for t in STEADY))
    assert main(["compare", str(a), str(b), "--fail-if-slower", pct, "--run-spread", "1.2"]) == status
    out = capsys.readouterr().out
    assert gate in out
    assert (b / "compare.html").is_file()  # the page is written whatever the gate says


def test_runs_too_short_for_an_interval_cannot_tell(runs, capsys) -> None:
    a, b = runs
    assert main(["compare", str(a), str(b), "--fail-if-slower", "10"]) == 3
    assert "gate cannot tell: B's mean step is 30.0% slower than A's (no interval" in capsys.readouterr().out


def one_line_error(capsys, message: str) -> None:
    out, err = capsys.readouterr()
    assert err.startswith("gpuscope: error: ")
    assert err.count("\n") == 1
    assert message in err
    assert "Traceback" not in out + err


@pytest.mark.parametrize(("pct", "message"), [
    ("-5", "argument --fail-if-slower: must be a percentage of 0 or more: -5"),
    ("ten", "argument --fail-if-slower: not a number: 'ten'"),
    ("nan", "must be a percentage of 0 or more"),
])
def test_a_bad_percentage_is_one_line_and_exit_2(runs, capsys, pct, message) -> None:
    a, b = runs
    assert main(["compare", str(a), str(b), "--fail-if-slower", pct]) == 2
    one_line_error(capsys, message)
    assert not (b / "compare.html").exists()


def test_a_missing_run_folder_is_one_line_and_exit_2(runs, tmp_path, capsys) -> None:
    a, _ = runs
    assert main(["compare", str(a), str(tmp_path / "nowhere")]) == 2
    one_line_error(capsys, "no run.json in")


def test_a_gate_that_cannot_be_checked_is_one_line_and_exit_2(runs, tmp_path, capsys) -> None:
    # given a run B without a steady-state step
    a, _ = runs
    b = tmp_path / "crashed"
    b.mkdir()
    write_record(make_record(steps=Steps(count=0, total=1)), b)
    assert main(["compare", str(a), str(b), "--fail-if-slower", "10"]) == 2
    _, err = capsys.readouterr()
    assert err == "gpuscope: error: --fail-if-slower cannot be checked: no steady-state step in B: no speed-up figure\n"


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "is not valid JSON"),
    (json.dumps({"schema": "other/9"}), "run.json has schema 'other/9'"),
    (json.dumps({"schema": "gpuscope.run/1", "steps": {"count": "many"}}), "run.json is malformed"),
])
def test_a_corrupt_run_json_is_one_line_and_exit_2(runs, capsys, content, message) -> None:
    a, b = runs
    (a / "run.json").write_text(content)
    assert main(["compare", str(a), str(b)]) == 2
    one_line_error(capsys, message)


@pytest.mark.slow  # a real gpuscope process
def test_a_corrupt_run_json_prints_no_traceback_from_the_command_line(runs) -> None:
    a, b = runs
    (b / "run.json").write_text("[1, 2")
    result = run_gpuscope(["compare", str(a), str(b)], a.parent, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("gpuscope: error: ") and result.stderr.count("\n") == 1


def test_help_says_how_the_gate_decides_and_its_exit_statuses(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "RUN_DIR_A RUN_DIR_B" in text
    assert "decided on its 95% interval" in text and "3 when the runs cannot tell" in text
    assert "RUN_DIR_B/compare.html" in text
