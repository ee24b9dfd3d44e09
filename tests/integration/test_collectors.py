"""The collectors on real runs: python.prof, trace.json, the records they feed, and faults that stay contained."""

from __future__ import annotations

import json
import pstats
from pathlib import Path

import pytest

from conftest import SAMPLES, SCRIPTS, Run, Runs, load_run, run_gpuscope, run_python
from gpuscope.collect.collectors.steps import StepsCollector
from gpuscope.collect.framework.base import CollectorResult, Watcher
from gpuscope.record import CollectorStatus
from gpuscope.session import Session


NO_PROBES = ("--no-probes",)
"""For runs whose test checks neither the post-run probes nor a CPU verdict: a faster exit."""


TRACE_CAP = (SAMPLES / "cpu_launch_bound.py", ("--steps", "60"), ("--trace-max-mb", "0.05", *NO_PROBES))
TOO_SHORT = (SCRIPTS / "exit_with.py", ("ok",), NO_PROBES)  # 6 steps
WHOLE_RUN = (SCRIPTS / "loader_workers.py", ("--workers", "0"), ("--cprofile-all", *NO_PROBES))
FORKED_WORKERS = (SCRIPTS / "profiled_workers.py", (), NO_PROBES)
LENGTHENING = (SCRIPTS / "lengthening_steps.py", (), NO_PROBES)  # steps 8x the passes from step 80


@pytest.fixture(scope="module")
def own_runs(runs: Runs) -> Runs:
    """The module's own runs, made two at a time (they check no timing, so sharing the cores costs nothing)."""
    runs.prefetch(TRACE_CAP, TOO_SHORT, WHOLE_RUN, FORKED_WORKERS, LENGTHENING)
    return runs


def run_of(runs: Runs, spec: tuple[Path, tuple[str, ...], tuple[str, ...]]) -> Run:
    script, args, options = spec
    return runs.get(script, *args, options=options)


def profile(runs: Runs, spec: tuple[Path, tuple[str, ...], tuple[str, ...]]) -> tuple[Path, dict]:
    run = run_of(runs, spec)
    return run.run_dir, run.record


@pytest.fixture
def data_bound_run(runs: Runs) -> tuple[Path, dict]:
    run = runs.sample("data_loading_bound")  # the session's shared run of the sample
    return run.run_dir, run.record


@pytest.mark.slow
def test_python_prof_loads_with_pstats_and_names_the_workloads_hot_function(data_bound_run) -> None:
    run_dir, record = data_bound_run
    stats = pstats.Stats(str(run_dir / "python.prof"))
    functions = {name for (_, _, name) in stats.stats}  # type: ignore[attr-defined]
    assert {"blur", "__getitem__"} <= functions
    top = [f["function"] for f in record["python_profile"]["top_cumulative"]]
    assert "__getitem__" in top
    assert record["python_profile"]["window"] == {"first_step": 0, "last_step": 4, "startup": True}


@pytest.mark.slow
def test_trace_json_holds_the_profiled_steps_ops(data_bound_run) -> None:
    run_dir, record = data_bound_run
    trace = json.loads((run_dir / "trace.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert {"ProfilerStep#7", "ProfilerStep#8", "ProfilerStep#9"} <= names
    assert any(n.startswith("aten::conv") for n in names)
    ops = record["op_profile"]
    assert ops["window"] == {"first_step": 7, "last_step": 9, "startup": False}
    assert ops["trace_bytes"] == (run_dir / "trace.json").stat().st_size
    assert ops["ops_per_step"] > 10
    assert any(o["name"].startswith("aten::") for o in ops["top_host"])
    # a CPU run has no kernel timeline; on a GPU machine the sample trains on CUDA and has one
    assert (ops["kernels"] is None) == (record["device"] == "cpu")


@pytest.mark.slow
def test_profiled_steps_are_left_out_of_the_step_figures(data_bound_run) -> None:
    _, record = data_bound_run
    steps = record["steps"]
    # cProfile's steps 1-4, torch.profiler's 6-9, then on CUDA the sync count's 10-12, then the FLOP counter's one
    # step (10 on a CPU, 13 on CUDA), then the memory window's two. Step 0 is warm-up, and so is step 1 when it is
    # still slow (warm-up is detected, not fixed): then warm-up and profiled steps share 0-4.
    flops_step = 10 if record["device"] == "cpu" else 13
    status = dict(zip(steps["sample"]["index"], steps["sample"]["status"]))
    assert all(status[i] in ("warmup", "profiled") for i in range(5))
    assert status[0] == "warmup" and status[4] == "profiled"
    assert steps["warmup"] + steps["profiled"] == flops_step + 2
    assert steps["count"] == steps["total"] - steps["warmup"] - steps["profiled"] - steps["outliers"]
    assert [status[i] for i in (5, 6, 9, flops_step, flops_step + 2, flops_step + 3)] == [
        "steady", "profiled", "profiled", "profiled", "profiled", "steady"]


@pytest.mark.slow
def test_trace_json_stays_under_its_cap(own_runs: Runs) -> None:
    run_dir, record = profile(own_runs, TRACE_CAP)
    size = (run_dir / "trace.json").stat().st_size
    assert size <= 0.05 * 1024 * 1024
    assert record["op_profile"]["trace_detail"] != "full"
    json.loads((run_dir / "trace.json").read_text())


@pytest.mark.slow
def test_steps_that_lengthen_after_the_trace_are_traced_again_and_read_from_it(own_runs: Runs) -> None:
    # given: a loop whose steps run 8x the passes from step 80 on, as a reinforcement-learning loop's episodes lengthen
    run_dir, record = profile(own_runs, LENGTHENING)
    # then: trace.json holds three of the longer steps, taken again there, and says so
    (note,) = [n for n in record["meta"]["notes"] if "taken again" in n]
    first = int(note.split("holds steps ")[1].split("-")[0])
    # (taken again a second time where the pace moved once more: made beside four other runs, this one's steps just
    # after the first retake ran 2.9x slower than later ones once in CI, and the second retake holds those)
    assert first > 80 and "taken again there: the steps had become" in note
    steps = sorted({int(e["name"].removeprefix("ProfilerStep#")) for e in json.loads(
        (run_dir / "trace.json").read_text())["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")})
    assert steps[:3] == [first, first + 1, first + 2]
    # the op figures are theirs (32 passes a step: eight times the first steps' ops), and both windows' steps are
    # left out of the step figures (whether those steps' times are like the median's is the machine's: this run is
    # made beside four others, and a step of 3 ms took 0.4 s once in CI)
    assert record["op_profile"]["ops_per_step"] > 1500
    sample = record["steps"]["sample"]
    profiled = {i for i, status in zip(sample["index"], sample["status"]) if status == "profiled"}
    assert {7, 8, 9, first, first + 1, first + 2} <= profiled


@pytest.mark.slow
def test_a_run_too_short_for_the_trace_window_says_so(own_runs: Runs) -> None:
    _, record = profile(own_runs, TOO_SHORT)
    status = record["collectors"]["torch-trace"]
    assert status["status"] == "unavailable"
    assert "run more steps" in status["reason"]


@pytest.mark.slow
def test_the_whole_run_can_be_profiled_by_cprofile(own_runs: Runs) -> None:
    _, record = profile(own_runs, WHOLE_RUN)
    assert record["python_profile"]["whole_run"]
    assert record["steps"]["profiled"] == record["steps"]["total"] - record["steps"]["warmup"]


class Broken(Watcher):
    """A collector that fails wherever it is asked to."""

    name = "broken"
    field = None

    def __init__(self, where: str) -> None:
        self.where = where

    def unavailable_reason(self) -> str | None:
        return None

    def start(self, run_dir: Path) -> None:
        if self.where == "start":
            raise RuntimeError("injected fault at start")

    def stop(self) -> CollectorResult:
        raise RuntimeError("injected fault at stop")


@pytest.mark.parametrize("where", ["start", "stop"])
def test_a_failing_collector_is_reported_and_the_others_keep_their_data(tmp_path: Path, where: str) -> None:
    torch = pytest.importorskip("torch")
    session = Session(tmp_path, ["in-process"], [StepsCollector(), Broken(where)])
    session.start()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(8):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    record = session.stop(3)
    assert record.collectors["broken"] == CollectorStatus("failed", f"RuntimeError: injected fault at {where}")
    assert record.collectors["steps"].status == "ok"
    assert record.steps.total == 8
    assert record.exit_status == 3
    assert load_run(tmp_path)["collectors"]["broken"]["status"] == "failed"


@pytest.mark.slow
def test_forked_workers_profile_only_their_first_batches(own_runs: Runs) -> None:
    # given two workers forked while the main thread is under cProfile, each fetching 10 batches of 8 samples
    run = run_of(own_runs, FORKED_WORKERS)
    result, run_dir = run.result, run.run_dir
    assert result.returncode == 0, result.stderr
    # then each worker's first 4 batches ran under a profiler, and nothing else did (2 workers x 4 x 8 samples):
    # a worker does not keep the profiler the main thread had running when it was forked
    assert "profiled_samples=64" in result.stdout
    python = load_run(run_dir)["python_profile"]
    assert python["workers_profiled"]
    stats = pstats.Stats(str(run_dir / "workers.prof"))
    assert "__getitem__" in {name for (_, _, name) in stats.stats}  # type: ignore[attr-defined]
    assert not (run_dir / "workers").exists()


@pytest.mark.slow
def test_counting_a_steps_flops_imports_nothing_into_the_script_that_python_would_not(tmp_path: Path) -> None:
    # given: a loop that updates its weights by hand, whose process never imports torch._dynamo under python (a
    # torch.optim optimizer would); torch wraps every dispatch mode, the FLOP counter's too, to import it at first use
    script = str(SCRIPTS / "manual_update.py")
    # when: it runs under python and under gpuscope, each in a real process
    plain = run_python([script], tmp_path)
    under = run_gpuscope(["run", "-q", *NO_PROBES, "-o", str(tmp_path / "run"), script], tmp_path)
    # then: a step's FLOPs are counted, and the script's process imported what it does under python (not torch's
    # compiler with sympy: 2.2 s of CPU inside its run on the 2-core machine, and 120,000 objects that each of its
    # later garbage collections walked)
    assert load_run(tmp_path / "run")["speed_of_light"]["flops_per_step"] > 0
    assert under.stdout == plain.stdout == "imported: []\n", under.stderr


CALIBRATE = """
import sys, torch
from gpuscope.collect.collectors.calibration import measure_op_overhead
calibration = measure_op_overhead(torch)
print(sorted(m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules), calibration.ops_per_step)
"""


@pytest.mark.slow
def test_the_calibration_probe_imports_no_compiler_into_a_process_without_one(tmp_path: Path) -> None:
    # given: a process that never imported torch._dynamo (a loop with no torch.optim optimizer); the probe's SGD
    # would import it (1.2 s of the 2-core machine, after every such script), and so would torch.profiler's start
    done = run_python(["-c", CALIBRATE], tmp_path)
    # then: the same model and the same 379 ops a step, SGD's update made by hand, and no compiler imported
    assert done.stdout.splitlines()[-1] == "[] 379.0", done.stderr
