"""The preloaded python (tests/preloaded.py), on which most of the slow tier's runs start, gives a script what a
real ``python`` gives it: the runs made on it test gpuscope, not the harness."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import conftest
from conftest import SCRIPTS, run_gpuscope, run_python
from processes import stat_fields

pytestmark = pytest.mark.slow

ENDINGS = {
    "status": "import sys\nsys.exit(3)\n",
    "message": "import sys\nsys.exit('bye')\n",
    "raise": "raise ValueError('boom')\n",
    "os_exit": "import os\nos._exit(4)\n",
    "signal": "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n",
}


def both(args: list[str], cwd: Path, **kwargs: object) -> tuple[subprocess.CompletedProcess[str], ...]:
    """``python ARGS`` in a real process, then in a preloaded one."""
    return run_python(args, cwd, **kwargs), run_python(args, cwd, preloaded=True, **kwargs)


@pytest.mark.parametrize("target", [["sub/show_context.py"], ["-m", "sub.show_context"]], ids=["script", "module"])
def test_a_script_sees_what_a_real_python_gives_it(tmp_path: Path, target: list[str]) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "show_context.py").write_text((SCRIPTS / "show_context.py").read_text())
    real, preloaded = both([*target, "--output", "x", "--", "last"], tmp_path)
    assert real.returncode == preloaded.returncode == 0, preloaded.stderr
    assert json.loads(preloaded.stdout) == json.loads(real.stdout)


def test_a_script_is_compiled_with_its_own_future_imports_not_the_harnesss(tmp_path: Path) -> None:
    # given: a script without ``from __future__ import annotations`` (which tests/preloaded.py has)
    (tmp_path / "annotated.py").write_text("def f(a: int) -> None: ...\nprint(f.__annotations__)\n")
    real, preloaded = both(["annotated.py"], tmp_path)
    # then: its annotations are evaluated, as under a real python, not kept as strings
    assert preloaded.stdout == real.stdout == "{'a': <class 'int'>, 'return': None}\n", preloaded.stderr


def test_standard_streams_and_warnings_pass_through(tmp_path: Path) -> None:
    real, preloaded = both([str(SCRIPTS / "stdin_and_warnings.py")], tmp_path, input="hello\n")
    assert (preloaded.stdout, preloaded.stderr) == (real.stdout, real.stderr)
    assert preloaded.stdout == "read: hello\n"


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_script_ends_with_the_status_a_real_python_gives(tmp_path: Path, ending: str) -> None:
    (tmp_path / "end.py").write_text(ENDINGS[ending])
    real, preloaded = both(["end.py"], tmp_path)
    assert preloaded.returncode == real.returncode
    assert preloaded.stderr.splitlines()[-1:] == real.stderr.splitlines()[-1:]
    if ending == "raise":  # the whole traceback, from the script's frame: none of the harness's
        assert preloaded.stderr == real.stderr
    if ending == "signal":
        assert real.returncode == -signal.SIGTERM


def test_a_timed_out_run_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    (tmp_path / "hang.py").write_text(SLEEPER + "time.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        run_python(["hang.py"], tmp_path, timeout=5, preloaded=True)
    sleeper = int(str(timed_out.value.output).split()[-1])
    assert not alive(sleeper)


def test_gpuscope_on_the_preloaded_python_sees_a_process_its_run_left(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "leave.py").write_text(SLEEPER)
    monkeypatch.setattr(conftest, "LEFTOVER_GRACE_S", 0.5)
    with pytest.raises(AssertionError, match="left processes behind") as failed:
        run_gpuscope(["run", "-q", "-o", str(tmp_path / "run"), "--no-probes", "leave.py"], tmp_path,
                     preloaded=True)
    left = json.loads(str(failed.value).split("behind: ")[1].splitlines()[0])
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert len(left) == 1  # the sleeper, in the session of the run, though its command line does not name it


SLEEPER = ("import subprocess, sys, time\n"
           "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
           "print('started', child.pid, flush=True)\n")
"""A script that starts a process which outlives it, and prints its id."""


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not), after a second's grace for a kill to land."""
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        if stat_fields(pid)[:1] in ([], ["Z"]):  # gone, or a zombie
            return False
        time.sleep(0.05)
    return True
