"""SIGTERM under ``gpuscope run``: while the script runs it ends the script with status 143 (the run's files still
written); once the script has ended, a SIGTERM waits until they are. torchrun terminates every other rank the
moment one fails, often while the failing rank is still printing its own traceback, and a scheduler sends SIGTERM
before its kill: in both cases the record is what the user came for.

These run ``run_target`` in this process: if the hold-off failed, the SIGTERM would raise out of it (the script's
handler is installed while the script runs), so the test fails rather than the test process ending."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gpuscope.collect.runner import EXIT_SIGTERM, Target, run_target

TERMINATED_WHILE_REPORTING = """\
import os, signal


class PeerGone(RuntimeError):
    def __str__(self):
        # printed in the traceback: the launcher's SIGTERM lands while the failure is being reported
        os.kill(os.getpid(), signal.SIGTERM)
        return "connection reset by peer"


raise PeerGone()
"""


@pytest.fixture(autouse=True)
def _default_sigterm():
    """Each test starts with SIGTERM's default action, as a new process has, and must leave it so, with the signal
    module's own functions (the script is shown others while it runs)."""
    real = signal.signal, signal.getsignal
    saved = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    assert (signal.signal, signal.getsignal) == real, "run_target left its view of the handlers behind"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "run_target left its SIGTERM handling behind"
    signal.signal(signal.SIGTERM, saved)


def _script(tmp_path: Path, text: str) -> Target:
    script = tmp_path / "train.py"
    script.write_text(text)
    return Target(str(script), None, ())


def test_a_sigterm_while_the_script_runs_ends_it_with_143_and_the_run_is_still_ended(tmp_path: Path) -> None:
    ended: list[int] = []
    target = _script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\nraise SystemExit(0)\n")
    assert run_target(target, ended.append) == EXIT_SIGTERM
    assert ended == [EXIT_SIGTERM]


def test_a_sigterm_while_the_scripts_failure_is_printed_waits_for_the_run_to_be_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # given a script whose failure brings a SIGTERM as its traceback is printed (a rank whose peer died)
    ended: list[int] = []
    # when it runs
    status = run_target(_script(tmp_path, TERMINATED_WHILE_REPORTING), ended.append)
    # then its traceback is printed whole, its status is its own, and the run's files are written
    assert "PeerGone: connection reset by peer" in capsys.readouterr().err
    assert status == 1 and ended == [1]


def test_a_sigterm_while_the_runs_files_are_written_does_not_stop_them(tmp_path: Path) -> None:
    # given a script that ends well, and a SIGTERM that comes while the run's files are being written
    written: list[str] = []

    def end(status: int) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        written.extend(["run.json", "report.html"])

    # when it runs, then the files are all written and the status is the script's
    assert run_target(_script(tmp_path, "print('trained')\n"), end) == 0
    assert written == ["run.json", "report.html"]


def test_a_sigterm_while_os_exit_writes_the_runs_files_does_not_stop_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a script that ends with os._exit, which writes the run's files before the process ends, and a SIGTERM
    # that comes meanwhile; the real os._exit would end this test process: a stand-in raises SystemExit instead
    def exit_stand_in(status: int) -> None:
        raise SystemExit(status)

    monkeypatch.setattr(os, "_exit", exit_stand_in)
    written: list[int] = []

    def end(status: int) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        written.append(status)

    # when it runs, then the files were written from inside os._exit, with its status
    assert run_target(_script(tmp_path, "import os\nos._exit(4)\n"), end) == 4
    assert written[0] == 4


def test_the_script_sees_sigterms_default_action_as_under_python(tmp_path: Path) -> None:
    # given a script that asks for SIGTERM's handler, and sets its own as a library would (PyTorch Lightning calls
    # a handler it finds after its own: gpuscope's would turn its graceful stop into exit status 143)
    out = tmp_path / "seen.txt"
    target = _script(tmp_path, (
        "import signal, sys\n"
        "seen = [signal.getsignal(signal.SIGTERM)]\n"
        "seen.append(signal.signal(signal.SIGTERM, lambda signum, frame: None))\n"
        "seen.append(signal.signal(signal.SIGTERM, signal.SIG_DFL))\n"
        f"open({str(out)!r}, 'w').write(repr(seen))\n"))
    # when it runs, then it saw what python shows it: the default action, and the handler it set itself
    assert run_target(target) == 0
    seen = out.read_text()
    assert seen.startswith("[<Handlers.SIG_DFL: 0>, <Handlers.SIG_DFL: 0>, <function <lambda>"), seen
