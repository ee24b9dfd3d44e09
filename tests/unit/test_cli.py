"""gpuscope's own bad input: one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import pytest

from gpuscope.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "a command is needed"),
        (["bogus"], "invalid choice: 'bogus'"),
        (["run"], "no script given"),
        (["run", "missing.py"], "no such script: missing.py"),
        (["run", "--no-such-flag", "x.py"], "unrecognized arguments: --no-such-flag"),
        (["run", "-o"], "expected one argument"),
        (["run", "-m"], "-m needs a module name"),
        (["run", "-m", "no_such_module_anywhere"], "no module named 'no_such_module_anywhere'"),
    ],
)
def test_bad_input_prints_one_line_and_exits_2(argv, message, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("gpuscope: error: ")
    assert message in err


@pytest.mark.parametrize(
    ("tokens", "own", "target"),
    [
        (["-q", "train.py", "-q", "--output", "x"], ["-q"], ["train.py", "-q", "--output", "x"]),
        (["-o", "d", "-m", "pkg.train", "-m", "x"], ["-o", "d"], ["-m", "pkg.train", "-m", "x"]),
        (["-mpkg.train", "--lr", "1"], [], ["-m", "pkg.train", "--lr", "1"]),
        (["--output=d", "--", "-weird-name.py", "a"], ["--output=d"], ["-weird-name.py", "a"]),
        (["-q"], ["-q"], []),
    ],
)
def test_everything_after_the_script_or_module_belongs_to_the_script(tokens, own, target) -> None:
    from gpuscope.cli import COMMANDS, _subparser, build_parser

    run = next(c for c in COMMANDS if c.name == "run")
    assert run.split_target(_subparser(build_parser(), "run"), tokens) == (own, target)


def test_a_run_folder_that_cannot_be_created_is_an_error(capsys, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    script = tmp_path / "s.py"
    script.write_text("")
    assert main(["run", "-o", str(blocker / "sub"), str(script)]) == 2
    assert "cannot create the run folder" in capsys.readouterr().err


def test_help_exits_0(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--help"])
    assert exit_.value.code == 0
    usage = capsys.readouterr().out.splitlines()[0]
    assert "(SCRIPT | -m MODULE) [ARGS...]" in usage


# -- gpuscope report, and the report at the end of gpuscope run --------------------------------------------------

def _write_run_json(run_dir, text: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(text)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no run.json in"),
        ("{not json", "is not valid JSON"),
        ('{"schema": "other/9"}', "expected 'gpuscope.run/1'"),
        ('{"schema": "gpuscope.run/1", "steps": {"count": "many"}}', "run.json is malformed"),
    ],
    ids=["missing", "corrupt", "wrong-schema", "wrong-type"],
)
def test_report_of_an_unreadable_run_prints_one_line_and_exits_2(content, message, tmp_path, capsys) -> None:
    # given a run folder whose run.json is missing or broken
    run_dir = tmp_path / "run"
    if content is not None:
        _write_run_json(run_dir, content)
    # when it is re-rendered
    status = main(["report", str(run_dir)])
    # then one line says why, and nothing is written
    out, err = capsys.readouterr()
    assert status == 2
    assert out == "" and err.count("\n") == 1 and err.startswith("gpuscope: error: ")
    assert message in err
    assert not (run_dir / "report.html").exists()


def test_report_of_an_older_run_renders_what_is_there(tmp_path, capsys) -> None:
    # given a run.json from an older gpuscope, with most fields missing and one unknown
    run_dir = tmp_path / "old"
    _write_run_json(run_dir, '{"schema": "gpuscope.run/1", "command": ["train.py"], "exit_status": 0, '
                             '"verdict": {"bound": "data-loading", "confidence": 0.5}, "retired_field": 1}')
    # when it is re-rendered
    assert main(["report", str(run_dir)]) == 0
    # then the page holds what the record had
    html = (run_dir / "report.html").read_text()
    assert "data-loading-bound" in html and "train.py" in html
    assert str(run_dir / "report.html") in capsys.readouterr().out


def test_report_open_opens_the_page_in_a_browser(tmp_path, monkeypatch) -> None:
    from conftest import make_record
    from gpuscope.record import write_record

    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    write_record(make_record(), tmp_path)
    assert main(["report", str(tmp_path)]) == 0
    assert opened == []
    assert main(["report", "--open", str(tmp_path)]) == 0
    assert opened == [(tmp_path / "report.html").resolve().as_uri()]


class _StoppedSession:
    """A session whose run has ended: ``stop`` returns a fixed record."""

    def __init__(self, run_dir) -> None:
        from conftest import make_record

        self.run_dir = run_dir
        self.record = make_record()

    def stop(self, status: int, say=None):
        return self.record


def test_a_finished_run_writes_its_report_and_names_it_in_the_summary(tmp_path, capsys, monkeypatch) -> None:
    from gpuscope.finish import finish_session

    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    finish_session(_StoppedSession(tmp_path), 0, quiet=False)
    err = capsys.readouterr().err
    assert (tmp_path / "report.html").is_file()
    assert f"  report: {tmp_path / 'report.html'}" in err.splitlines()
    assert opened == []  # never opened unless asked


def test_quiet_silences_the_summary_and_open_opens_the_report(tmp_path, capsys, monkeypatch) -> None:
    from gpuscope.finish import finish_session

    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    finish_session(_StoppedSession(tmp_path), 0, quiet=True, open_report=True)
    assert capsys.readouterr().err == ""
    assert opened == [(tmp_path / "report.html").resolve().as_uri()]


def test_a_report_that_cannot_be_rendered_costs_one_line_not_the_run(tmp_path, capsys, monkeypatch) -> None:
    from gpuscope.finish import finish_session

    def broken(record, run_dir):
        raise RuntimeError("template exploded")

    monkeypatch.setattr("gpuscope.report.write_report", broken)
    finish_session(_StoppedSession(tmp_path), 3, quiet=True)  # raises nothing: the script's status stands
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "could not write the report" in err and "template exploded" in err


def test_run_accepts_open_before_the_script() -> None:
    from gpuscope.cli import COMMANDS, _subparser, build_parser

    run = next(c for c in COMMANDS if c.name == "run")
    assert run.split_target(_subparser(build_parser(), "run"), ["--open", "t.py", "--open"]) == (
        ["--open"], ["t.py", "--open"])


def test_the_launcher_forwards_the_collector_options_to_each_rank_and_keeps_its_own() -> None:
    from gpuscope.commands.run import _forwarded

    own = ["--nproc-per-node", "2", "-o", "job", "--trace-steps", "2", "--open", "--cprofile-steps=3", "-q",
           "--output=x", "--probe-loader"]
    assert _forwarded(own) == ["--trace-steps", "2", "--cprofile-steps=3", "--probe-loader"]


def test_nproc_per_node_must_be_a_positive_whole_number(tmp_path, capsys) -> None:
    from gpuscope.cli import main

    assert main(["run", "--nproc-per-node", "0", str(tmp_path / "train.py")]) == 2
    assert "must be 1 or more" in capsys.readouterr().err


def test_a_run_whose_record_cannot_be_written_costs_one_line_not_the_run(tmp_path, capsys) -> None:
    from gpuscope.finish import finish_session

    # given a session that cannot write its record
    class BrokenSession(_StoppedSession):
        def stop(self, status: int, say=None):
            raise OSError("disk full")

    # when the run ends
    finished = finish_session(BrokenSession(tmp_path), 3, open_report=True)  # raises nothing
    # then one line says why, and there is neither record nor report
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "could not write the run's files" in err and "disk full" in err
    assert finished.record is None and finished.report_path is None
