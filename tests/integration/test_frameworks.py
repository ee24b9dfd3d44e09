"""The frameworks people train with, on the real packages (the ``frameworks`` extra, pinned in constraints.txt):
Transformers' ``Trainer``, ``accelerate`` with gradient accumulation, Lightning's ``Trainer``, a ``torch.compile``d
model and a hand-written manual-SGD loop. Tiny models built from configs, synthetic data, nothing downloaded.

Each framework's script runs with slow data loading (``--slow-data``) under plain python and under gpuscope, at
once (with one intra-op thread each, and mostly waiting for data): the same output, the right steps, a
share for every phase, and a data-loading-bound verdict. The manual-SGD loop slices its batches from a tensor in
memory and has no loading to slow down. Lightning's script also runs at full speed under gpuscope, against its own
measurement of its forward pass and update. A framework that is not installed skips.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import SAMPLES, SCRIPTS, child_env, load_run, run_gpuscope

pytestmark = pytest.mark.slow

FRAMEWORKS = SCRIPTS / "frameworks"
TIMEOUT_S = 240
ALL_PHASES = ("data_wait", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class Framework:
    """A framework's script, how it is run, and what gpuscope should find in it."""

    script: Path
    needs: str  # the module that must import, else the tests skip
    args: tuple[str, ...]
    steps: int  # the optimizer steps (or iterations) that ``args`` make
    source: str  # the marker that should define the steps
    phases: tuple[str, ...]  # the phases the loop has
    loads_data: bool = True  # whether ``args`` make it wait for its data (``--slow-data``)
    full_speed_args: tuple[str, ...] | None = None  # a run at full speed too, where the script times itself
    stepped_by: str = ""  # the library whose code steps the optimizer ("": the script's own)


MATRIX = {
    "transformers-trainer": Framework(
        FRAMEWORKS / "hf_trainer.py", "transformers", ("--steps", "20", "--slow-data"), 20, "optimizer", ALL_PHASES,
        stepped_by="transformers"),
    # 4 batches to an optimizer step: the steps are the optimizer's
    "accelerate-accumulation": Framework(
        FRAMEWORKS / "accelerate_accumulation.py", "accelerate", ("--steps", "16", "--slow-data"), 16, "optimizer",
        ALL_PHASES, stepped_by="accelerate"),
    "lightning-trainer": Framework(
        FRAMEWORKS / "lightning_trainer.py", "pytorch_lightning", ("--steps", "20", "--slow-data"), 20, "optimizer",
        ALL_PHASES, full_speed_args=("--steps", "40"), stepped_by="pytorch_lightning"),
    "torch-compile": Framework(
        FRAMEWORKS / "compiled_model.py", "torch", ("--steps", "20", "--slow-data"), 20, "optimizer", ALL_PHASES),
    # parameters updated by hand, batches sliced from a tensor: each backward() is a step
    "manual-sgd": Framework(
        SAMPLES / "manual_sgd_language_model.py", "torch", ("--steps", "300"), 300, "backward",
        ("forward", "backward"), loads_data=False),
}
LOADING = [name for name, f in MATRIX.items() if f.loads_data]


@dataclass(frozen=True)
class Runs:
    """One framework's runs: under python and under gpuscope, and at full speed under gpuscope where it has one."""

    framework: Framework
    python: subprocess.CompletedProcess[str]
    gpuscope: subprocess.CompletedProcess[str]
    record: dict[str, Any]
    full_speed: dict[str, Any] | None
    timings: Path  # the script's own timings of the full-speed run


def run_all(commands: list[list[str]], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """Run ``python ARGS`` for each command at once, with one intra-op thread each (the manual-SGD sample does
    not set it: on two cores shared with other work, a second thread stalls each op whenever another process holds
    the other core, and its steps take 100 ms instead of 2); their results, in order."""
    env = {**child_env(), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, *c], cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c in commands]
    results = []
    try:
        for command, proc in zip(commands, procs):
            out, err = proc.communicate(timeout=TIMEOUT_S)
            results.append(subprocess.CompletedProcess(command, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def gpuscope_run(run_dir: Path, script: Path, args: tuple[str, ...]) -> list[str]:
    """The arguments of ``python -m gpuscope run`` for ``script ARGS``, without the post-run probes (the verdicts
    these tests check need none)."""
    return ["-m", "gpuscope", "run", "-q", "--no-probes", "-o", str(run_dir), str(script), *args]


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The framework's runs, made once for all its tests."""
    framework = MATRIX[request.param]
    pytest.importorskip(framework.needs)
    tmp = tmp_path_factory.mktemp(request.param)
    commands = [[str(framework.script), *framework.args], gpuscope_run(tmp / "run", framework.script, framework.args)]
    if framework.full_speed_args is not None:
        commands.append(gpuscope_run(tmp / "full-speed", framework.script,
                                     (*framework.full_speed_args, "--timings", str(tmp / "timings.json"))))
    results = run_all(commands, tmp)
    for result in results:
        assert result.returncode == 0, result.stderr
    python, gpuscope, *full_speed = results
    return Runs(framework, python, gpuscope, load_run(tmp / "run"),
                load_run(tmp / "full-speed") if full_speed else None, tmp / "timings.json")


def own_lines(stdout: str) -> list[str]:
    """The script's output with every number masked (step times and throughputs vary from run to run)."""
    return [re.sub(r"\d+(\.\d+)?", "#", line) for line in stdout.splitlines()]


@pytest.mark.parametrize("runs", list(MATRIX), indirect=True)
def test_a_framework_script_runs_as_under_python(runs: Runs) -> None:
    # then: the same exit status and output, and the same training (the losses are deterministic)
    assert runs.gpuscope.returncode == runs.python.returncode == 0
    assert own_lines(runs.gpuscope.stdout) == own_lines(runs.python.stdout)
    results = [line for line in runs.python.stdout.splitlines() if line.startswith("result:")]
    assert results == [line for line in runs.gpuscope.stdout.splitlines() if line.startswith("result:")]


@pytest.mark.parametrize("runs", list(MATRIX), indirect=True)
def test_steps_are_the_optimizer_steps_or_the_iterations(runs: Runs) -> None:
    steps = runs.record["steps"]
    assert (steps["total"], steps["source"]) == (runs.framework.steps, runs.framework.source)


@pytest.mark.parametrize("runs", list(MATRIX), indirect=True)
def test_the_library_that_steps_the_optimizer_is_named(runs: Runs) -> None:
    # (where a fix is that library's setting: its bfloat16 mixed precision, for one)
    assert runs.record["steps"]["optimizer_by"] == runs.framework.stepped_by


@pytest.mark.parametrize("runs", list(MATRIX), indirect=True)
def test_every_phase_the_loop_has_takes_a_share_of_the_step(runs: Runs) -> None:
    shares = runs.record["breakdown"]
    assert {p: shares[p] > 0 for p in ALL_PHASES} == {p: p in runs.framework.phases for p in ALL_PHASES}, shares


@pytest.mark.parametrize("runs", LOADING, indirect=True)
def test_slow_data_is_called_data_loading_bound(runs: Runs) -> None:
    verdict = runs.record["verdict"]
    assert verdict["bound"] == "data-loading", (runs.record["breakdown"], verdict["evidence"])


@pytest.mark.parametrize("runs", LOADING, indirect=True)
def test_the_workers_fix_names_the_line_that_built_the_loader(runs: Runs) -> None:
    # given: the loader built in the script (Lightning and accelerate build it again over the same dataset), or by
    # the Trainer inside transformers
    loader = runs.record["loaders"][0]
    site, script = loader["created_at"], runs.framework.script
    by_trainer = runs.framework.needs == "transformers"
    # then: the record names the script's line (the call into the Trainer where transformers built it)
    assert site is not None and site["file"].endswith(script.name), loader
    assert script.read_text().splitlines()[site["line"] - 1].strip() == site["code"]
    assert loader["created_by"] == ("transformers" if by_trainer else "")
    assert ("trainer.train()" if by_trainer else "DataLoader(") in site["code"]
    # and the fix is the change to make there
    fix = next(r["fix"] for r in runs.record["recommendations"] if r["id"] == "more-dataloader-workers")
    assert fix.startswith("TrainingArguments(..., dataloader_num_workers=" if by_trainer else
                          "DataLoader(..., num_workers=")
    assert fix.endswith(f"{site['file']}:{site['line']}"), fix


@pytest.mark.parametrize("runs", ["lightning-trainer"], indirect=True)
def test_lightnings_forward_and_update_match_the_scripts_own_measurement(runs: Runs) -> None:
    # given: the script's own timing of each step, of its forward (self.model(x) in training_step) and of its
    # update (optimizer.step less the closure), over the steps gpuscope counts as steady
    record = runs.full_speed
    assert record is not None
    own = json.loads(runs.timings.read_text())
    status = record["steps"]["sample"]["status"]
    steady = [i for i, s in enumerate(status) if s == "steady" and i < len(own["step_s"])]
    assert record["steps"]["total"] == 40 and len(steady) >= 10
    wall = sum(own["step_s"][i] for i in steady)
    forward = sum(own["forward_s"][i] for i in steady) / wall
    update = sum(own["update_s"][i] for i in steady) / wall
    # then: forward is timed although the LightningModule's forward never runs, and the optimizer phase, in
    # which the closure runs the whole training step, holds the update only
    shares = record["breakdown"]
    assert shares["forward"] == pytest.approx(forward, abs=0.1)
    assert shares["optimizer"] == pytest.approx(update, abs=0.05)
    assert any("outermost modules whose forward runs: Sequential" in n for n in record["meta"]["notes"])


@pytest.mark.timing  # its shares are of known sleeps, which a core's wait beside two other runs moved (forward 29%)
def test_an_optimizer_closure_leaves_only_the_update_in_the_optimizer_phase(tmp_path: Path) -> None:
    # given: optimizer.step(closure) whose closure spends 20 ms of its own, then runs a 15 ms forward (through
    # a module a wrapper holds, the wrapper's forward never running) and a 5 ms backward
    run_dir = tmp_path / "run"
    # when
    result = run_gpuscope(["run", "-q", "--no-probes", "-o", str(run_dir), str(FRAMEWORKS / "closure_loop.py")],
                          tmp_path, preloaded=True)
    # then: each phase has its share of the ~40 ms step, and the update's is small
    assert result.returncode == 0, result.stderr
    record = load_run(run_dir)
    shares = record["breakdown"]
    assert record["steps"]["total"] == 20
    assert record["steps"]["median_s"] == pytest.approx(0.040, rel=0.25)
    assert shares["forward"] == pytest.approx(15 / 40, abs=0.08)
    assert shares["backward"] == pytest.approx(5 / 40, abs=0.06)
    assert shares["other"] == pytest.approx(20 / 40, abs=0.08)
    assert shares["optimizer"] < 0.05
