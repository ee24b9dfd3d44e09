"""gpuscope puts as few frames as it can under the user's script: whatever walks the whole stack pays for each of
them again and again (anomaly detection formats the stack for every autograd node the forward pass creates:
about 4% of such a step a frame, benchmarks/stack_depth.py). Under python the script's ``<module>`` is the
bottom of the stack; under the ``gpuscope`` command only ``cli.main`` and ``runner.run_target`` lie beneath it,
with the console script's own ``<module>``. The stack anomaly detection keeps holds none of them, nor any other
frame of gpuscope's: it is the stack python would keep, formatted at python's cost."""

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


ANOMALY_SCRIPT = """\
import sys, warnings
import torch
from gpuscope.collect.framework.base import patch

def forward(x):
    return torch.sqrt(x) * 0  # sqrt(-1) is NaN: its backward fails under anomaly detection

x = torch.tensor([-1.0], requires_grad=True)
with warnings.catch_warnings(record=True) as caught, torch.autograd.detect_anomaly():
    holder = type("Holder", (), {"attr": None})
    try:  # from a gpuscope frame, as the forward timing's __call__ is: patch() calls the wrap it is given
        patch(holder, "attr", lambda original: forward(x).sum().backward())
    finally:
        open(sys.argv[1], "w").write("\\n".join(str(w.message) for w in caught))
"""


def test_anomaly_detection_keeps_the_stack_python_would_keep(tmp_path, capfd) -> None:
    # given a script whose forward pass, called from a gpuscope frame, fails in backward under anomaly detection
    script = tmp_path / "nan.py"
    script.write_text(ANOMALY_SCRIPT)
    # when it runs as `gpuscope run` runs it, under the collector that watches for debug APIs
    import torch.fx.traceback

    from gpuscope.collect.collectors.practices import PracticesCollector

    original = torch.fx.traceback.format_stack
    collector = PracticesCollector()
    collector.start(tmp_path)
    try:
        status = run_target(Target(str(script), None, (str(tmp_path / "warnings.txt"),)))
    finally:
        collector.stop()
    assert torch.fx.traceback.format_stack is original
    # then it fails as it would, and the forward traceback anomaly detection kept names the script's lines alone
    assert status == 1 and "returned nan values" in capfd.readouterr().err
    warned = (tmp_path / "warnings.txt").read_text()
    kept = warned.split("Traceback of forward call that caused the error:", 1)[1].split("(Triggered internally")[0]
    assert [line.split(",")[1:3] for line in kept.splitlines() if line.strip().startswith("File ")] == [
        [" line 12", " in <module>"], [" line 12", " in <lambda>"], [" line 6", " in forward"]]
    assert str(script) in kept and "gpuscope" not in kept


def test_the_stack_formatter_keeps_node_metadata_where_fx_preserves_it() -> None:
    import types

    from gpuscope.collect.callsites import script_format_stack

    fx = types.SimpleNamespace(should_preserve_node_meta=True, format_stack=lambda: ["the node's own stack"])
    assert script_format_stack(fx)() == ["the node's own stack"]
    fx.should_preserve_node_meta = False
    assert script_format_stack(fx)() == traceback.format_list(traceback.extract_stack())
