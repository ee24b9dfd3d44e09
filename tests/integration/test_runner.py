"""Under ``gpuscope run`` a script behaves exactly as under ``python``, and its run's files are always written."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import SCRIPTS, load_run, run_gpuscope, run_python, side_by_side

pytestmark = pytest.mark.slow
NO_PROBES = "--no-probes"
"""These tests check the runner, not the post-run probes: a faster exit."""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project: scripts in a subfolder (also importable as a package), run from the project root."""
    return make_project(tmp_path)


def make_project(where: Path) -> Path:
    sub = where / "proj" / "tools"
    sub.mkdir(parents=True)
    (sub / "__init__.py").write_text("")
    for name in ("show_context.py", "exit_with.py", "stdin_and_warnings.py", "warns_each_step.py"):
        shutil.copy(SCRIPTS / name, sub / name)
    return where / "proj"


EXITS = [
    (["ok"], 0, None),
    (["code", "3"], 3, None),
    (["message"], 1, "bye from the script"),
    (["raise"], 1, "ValueError: boom from the script"),
    (["os_exit"], 4, None),
]
"""How tools/exit_with.py ends, the status it ends with, and what its stderr says."""
Exit = tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str], Path]


@pytest.fixture(scope="module")
def exit_with(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], Exit]:
    """``tools/exit_with.py ARGS`` under python and under gpuscope run, for each way of ending, each command once
    per module (two tests read the uncaught exception's) and two at a time (none checks timing): by ARGS, both
    processes and the run's folder. Python's own run starts from the preloaded python, whose endings are a real
    python's (tests/integration/test_preloaded.py); gpuscope's is a real process, whose ending is under test."""
    project = make_project(tmp_path_factory.mktemp("exit_with"))

    def plain(args: list[str]) -> subprocess.CompletedProcess[str]:
        return run_python(["tools/exit_with.py", *args], project, preloaded=True)

    def profiled(args: list[str]) -> subprocess.CompletedProcess[str]:
        run_dir = project / ("run-" + "-".join(args))
        return run_gpuscope(["run", "-q", "-o", str(run_dir), NO_PROBES, "tools/exit_with.py", *args], project)

    calls = [functools.partial(run, args) for args, _, _ in EXITS for run in (plain, profiled)]
    done = side_by_side(*calls)
    return {tuple(args): (done[2 * i], done[2 * i + 1], project / ("run-" + "-".join(args)))
            for i, (args, _, _) in enumerate(EXITS)}


@pytest.mark.parametrize(
    "target",
    [
        ["tools/show_context.py"],
        ["-m", "tools.show_context"],
    ],
    ids=["script", "module"],
)
def test_the_script_sees_what_python_gives_it(project: Path, target: list[str]) -> None:
    # given arguments that look like gpuscope's own options
    args = ["--output", "theirs", "-m", "x", "-q", "--", "last"]
    # when the same command runs under python and under gpuscope
    plain, profiled = side_by_side(
        lambda: run_python([*target, *args], project),
        lambda: run_gpuscope(["run", "-q", "-o", str(project / "run"), NO_PROBES, *target, *args], project))
    # then the script saw the same __name__, argv, sys.path[0], cwd and __file__
    assert plain.returncode == profiled.returncode == 0, profiled.stderr
    seen_plain, seen_profiled = json.loads(plain.stdout), json.loads(profiled.stdout)
    assert seen_profiled == seen_plain
    assert seen_profiled["name"] == "__main__"
    assert seen_profiled["argv"][1:] == args
    assert seen_profiled["main_is_me"]


def test_stdin_stdout_stderr_and_warnings_pass_through(project: Path) -> None:
    script = ["tools/stdin_and_warnings.py"]
    plain, profiled = side_by_side(
        lambda: run_python(script, project, input="hello\n"),
        lambda: run_gpuscope(["run", "-q", "-o", str(project / "run"), NO_PROBES, *script], project, input="hello\n"))
    assert profiled.stdout == plain.stdout == "read: hello\n"
    assert "DeprecationWarning: an old API" in plain.stderr
    assert profiled.stderr == plain.stderr



def test_a_warning_from_every_step_shows_once_as_under_python(project: Path) -> None:
    # given a loop that warns from one line each step, through every profiler's window
    script = ["tools/warns_each_step.py"]
    plain, profiled = side_by_side(
        lambda: run_python(script, project),
        lambda: run_gpuscope(["run", "-q", "-o", str(project / "run-warns"), NO_PROBES, *script], project))
    # then its stderr is python's: the warning once (the trace window's profiler calls showed it again each step)
    assert plain.returncode == profiled.returncode == 0, profiled.stderr
    assert plain.stderr.count("UserWarning: a 2-D input to dropout2d is deprecated") == 1
    assert profiled.stderr == plain.stderr

@pytest.mark.parametrize(
    ("args", "status", "stderr_has"),
    EXITS,
    ids=["normal", "sys.exit(3)", "sys.exit(message)", "uncaught-exception", "os._exit"],
)
def test_exit_status_is_the_scripts_and_the_run_is_written(exit_with, args, status, stderr_has) -> None:
    plain, profiled, run_dir = exit_with[tuple(args)]
    assert plain.returncode == status
    assert profiled.returncode == status, profiled.stderr
    if stderr_has:
        assert stderr_has in profiled.stderr
    record = load_run(run_dir)
    assert record["exit_status"] == status
    assert record["steps"]["total"] >= 6


def test_an_uncaught_exception_shows_the_scripts_own_traceback(exit_with) -> None:
    plain, profiled, _ = exit_with[("raise",)]  # the runs of test_exit_status_is_the_scripts...[uncaught-exception]
    assert profiled.stderr.startswith("Traceback (most recent call last):")
    assert profiled.stderr == plain.stderr  # no gpuscope or runpy frames in it


def test_ctrl_c_exits_130_with_the_run_written(project: Path) -> None:
    run_dir = project / "run"
    profiled = run_gpuscope(["run", "-q", "-o", str(run_dir), NO_PROBES, "tools/exit_with.py", "sigint"], project)
    assert profiled.returncode == 130
    assert "KeyboardInterrupt" in profiled.stderr
    assert load_run(run_dir)["exit_status"] == 130


def test_sigterm_exits_143_with_the_run_written(project: Path) -> None:
    run_dir = project / "run"
    profiled = run_gpuscope(["run", "-q", "-o", str(run_dir), NO_PROBES, "tools/exit_with.py", "sigterm"], project)
    assert profiled.returncode == 143
    assert "finished" not in profiled.stdout
    assert load_run(run_dir)["exit_status"] == 143


def test_the_default_run_folder_is_named_for_the_script(project: Path) -> None:
    profiled = run_gpuscope(["run", NO_PROBES, "tools/exit_with.py", "ok"], project)
    assert profiled.returncode == 0
    (run_dir,) = (project / "gpuscope-runs").iterdir()
    assert run_dir.name.startswith("exit_with-")
    assert (run_dir / "run.json").exists()
    assert str(run_dir.name) in profiled.stderr  # the summary says where the run is
