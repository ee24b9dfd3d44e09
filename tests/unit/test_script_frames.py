"""gpuscope puts as few frames as it can under the user's script: whatever walks the whole stack pays for each of
them again and again (anomaly detection formats the stack for every autograd node the forward pass creates:
about 4% of such a step a frame, benchmarks/stack_depth.py). Under python the script's ``<module>`` is the
bottom of the stack; under the ``gpuscope`` command only ``cli.main`` and ``runner.run_target`` lie beneath it,
with the console script's own ``<module>``."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import gpuscope.cli as cli
import gpuscope.collect.runner as runner
from gpuscope.collect.runner import Target, run_target

STACK_SCRIPT = """\
import json, sys, traceback
with open(sys.argv[1], "w") as f:
    json.dump([[frame.filename, frame.name] for frame in traceback.extract_stack()], f)
sys.exit(5)
"""


def _script(tmp_path: Path) -> tuple[Path, Path]:
    script = tmp_path / "stack.py"
    script.write_text(STACK_SCRIPT)
    return script, tmp_path / "frames.json"


def _frames_under(out: Path, caller_depth: int) -> list[tuple[str, str]]:
    """The frames the script saw below its caller's, and its own."""
    return [(Path(f).name, name) for f, name in json.loads(out.read_text())[caller_depth:]]


def test_run_target_executes_a_script_in_its_own_frame(tmp_path) -> None:
    script, out = _script(tmp_path)
    depth = len(traceback.extract_stack())  # this test's frames, itself included
    assert run_target(Target(str(script), None, (str(out),))) == 5
    assert _frames_under(out, depth) == [(Path(runner.__file__).name, "run_target"), ("stack.py", "<module>")]


def test_the_command_line_runs_the_script_itself_then_ends_the_run_with_its_status(tmp_path, monkeypatch) -> None:
    # given `gpuscope run` prepared (its collectors would be started here), with an end that records the status
    script, out = _script(tmp_path)
    ended: list[int] = []
    prepared = cli.ScriptRun(Target(str(script), None, (str(out),)), ended.append)
    monkeypatch.setattr(cli.RunCommand, "run", lambda self, args: prepared)
    # when the command line is run
    depth = len(traceback.extract_stack())
    status = cli.main(["run", str(script), str(out)])
    # then main and run_target alone lie under the script, and the run ends with the script's exit status
    assert _frames_under(out, depth) == [
        ("cli.py", "main"), (Path(runner.__file__).name, "run_target"), ("stack.py", "<module>")]
    assert status == 5 and ended == [5]
