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
