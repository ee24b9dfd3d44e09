"""Each sample workload, run through gpuscope as a user would: the steps it ran are found, and the data wait
gpuscope measures matches the script's own measurement."""

from __future__ import annotations

import json
import pstats
import re
import subprocess
from pathlib import Path

import pytest

from conftest import SAMPLES, load_run, run_gpuscope

LINE = re.compile(r"steps=(\d+) median_step_s=([0-9.]+) data_wait_fraction=([0-9.]+)")


HOT_FUNCTION = {"data_loading_bound": "blur", "cpu_launch_bound": "forward", "compute_bound": "forward"}
"""A function of each sample's own file that must show in its python.prof."""


def profile(tmp_path: Path, workload: str, *args: str) -> tuple[dict, dict[str, float]]:
    """Run a sample under gpuscope; return its run.json and what the script measured of itself."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    run_dir = tmp_path / "run"
    result = run_gpuscope(["run", "-q", "-o", str(run_dir), str(SAMPLES / f"{workload}.py"), *args], tmp_path,
                          timeout=180)
    assert result.returncode == 0, result.stderr
    match = LINE.search(result.stdout)
    assert match, result.stdout
    own = {"steps": int(match.group(1)), "median_step_s": float(match.group(2)),
           "data_wait_fraction": float(match.group(3))}
    record = load_run(run_dir)
    record["_run_dir"] = run_dir
    return record, own


@pytest.mark.parametrize(
    ("workload", "args", "data_wait_above", "data_wait_below"),
    [
        ("data_loading_bound", ["--steps", "24"], 0.5, 1.0),
        ("cpu_launch_bound", ["--steps", "150"], 0.0, 0.15),
        ("compute_bound", ["--steps", "18"], 0.0, 0.15),
    ],
    ids=["data-loading-bound", "cpu-launch-bound", "compute-bound"],
)
def test_each_sample_has_its_steps_found_and_its_data_wait_measured(
    tmp_path: Path, workload: str, args: list[str], data_wait_above: float, data_wait_below: float
) -> None:
    record, own = profile(tmp_path, workload, *args)
    steps = record["steps"]
    assert steps["total"] == own["steps"]
    assert steps["source"] == "optimizer"
    # every step is accounted for: steady, or left out as warm-up, profiled or outlier
    assert steps["count"] == steps["total"] - steps["warmup"] - steps["profiled"] - steps["outliers"]
    assert steps["count"] >= 5
    data_wait = record["breakdown"]["data_wait"]
    assert data_wait_above < data_wait < data_wait_below
    assert data_wait == pytest.approx(own["data_wait_fraction"], abs=0.08)
    assert steps["median_s"] == pytest.approx(own["median_step_s"], rel=0.25)


@pytest.mark.parametrize(
    ("workload", "args", "bound"),
    [("data_loading_bound", ["--steps", "16"], "data-loading"),
     ("cpu_launch_bound", ["--steps", "400"], "cpu-launch"),
     ("compute_bound", ["--steps", "18"], "compute")],
)
def test_each_sample_gets_its_verdict_and_every_cpu_collectors_output(
    tmp_path: Path, workload: str, args: list[str], bound: str
) -> None:
    record, _ = profile(tmp_path, workload, *args)
    run_dir = record["_run_dir"]
    # the verdict its name promises, and the first recommendation that goes with it
    assert record["verdict"]["bound"] == bound, record["verdict"]["evidence"]
    first = {"data-loading": "more-dataloader-workers", "cpu-launch": "larger-batch"}.get(bound)
    if first is not None:
        assert record["recommendations"][0]["id"] == first
    # python.prof loads and names the workload's own hot function
    stats = pstats.Stats(str(run_dir / "python.prof"))
    own = {name for (file, _, name) in stats.stats if file.endswith(f"{workload}.py")}  # type: ignore[attr-defined]
    assert HOT_FUNCTION[workload] in own
    # trace.json parses and holds the profiled steps' ops; run.json has the top ops
    events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "cpu_op" and e.get("name", "").startswith("aten::") for e in events)
    assert record["op_profile"]["top_host"]
    # host memory: a peak and a timeline
    memory = record["host_memory"]
    assert memory["peak_bytes"] > 100 * 2**20
    assert len(memory["t_s"]) == len(memory["process_bytes"]) >= 2
    # no GPU here: NVML says why
    nvml = record["collectors"]["nvml"]
    assert nvml["status"] == "unavailable" and nvml["reason"]


def compare(slow: dict, fixed: dict, *options: str) -> subprocess.CompletedProcess[str]:
    """``gpuscope compare`` of two sample runs (``profile``'s records)."""
    return run_gpuscope(["compare", str(slow["_run_dir"]), str(fixed["_run_dir"]), *options], slow["_run_dir"])


def test_the_data_bound_sample_is_named_data_loading_bound(tmp_path: Path) -> None:
    record, _ = profile(tmp_path, "data_loading_bound", "--steps", "24")
    assert record["verdict"]["bound"] == "data-loading"
    assert record["loaders"][0]["num_workers"] == 0


def test_workers_fix_the_data_bound_sample(tmp_path: Path) -> None:
    slow, _ = profile(tmp_path / "slow", "data_loading_bound", "--steps", "24")
    fixed, _ = profile(tmp_path / "fixed", "data_loading_bound", "--steps", "24", "--workers", "2")
    assert fixed["loaders"][0]["num_workers"] == 2
    assert fixed["breakdown"]["data_wait"] < slow["breakdown"]["data_wait"] / 2
    assert fixed["steps"]["median_s"] < slow["steps"]["median_s"]
    assert fixed["verdict"]["bound"] != "data-loading"
    # the recommendation that was applied no longer fires
    assert "more-dataloader-workers" in [r["id"] for r in slow["recommendations"]]
    assert fixed["checks"]["more-dataloader-workers"]["status"] == "clear"
    # compare shows the speed-up, marks the fix resolved, and passes a CI gate
    result = compare(slow, fixed, "--fail-if-slower", "5")
    assert result.returncode == 0, result.stderr
    assert float(re.search(r"speed-up (\d+\.\d+)x", result.stdout)[1]) > 1.1, result.stdout
    assert re.search(r"more-dataloader-workers: resolved, data wait \d+% -> \d+%", result.stdout), result.stdout
    assert (fixed["_run_dir"] / "compare.html").is_file()
    # the other way round, the gate fails: B is the slow run
    assert compare(fixed, slow, "--fail-if-slower", "5").returncode == 1


def test_a_larger_batch_fixes_the_launch_bound_sample(tmp_path: Path) -> None:
    small, own_small = profile(tmp_path / "small", "cpu_launch_bound", "--steps", "400")
    large, own_large = profile(tmp_path / "large", "cpu_launch_bound", "--steps", "150", "--batch-size", "2048")
    assert small["checks"]["larger-batch"]["status"] == "fired"
    assert large["checks"]["larger-batch"]["status"] == "clear"
    assert large["verdict"]["bound"] != "cpu-launch"
    # the step takes longer but carries 1024x the samples: time per sample falls far
    per_sample_small = own_small["median_step_s"] / 2
    per_sample_large = own_large["median_step_s"] / 2048
    assert per_sample_large < per_sample_small / 10
    # compare says so too: the step is slower, the sample far faster, and larger-batch is resolved
    result = compare(small, large)
    assert result.returncode == 0, result.stderr
    ratio = float(re.search(r"per sample \(batch 2 -> 2048\): .*: (\d+\.\d+)x the throughput", result.stdout)[1])
    assert ratio > 10
    assert "larger-batch: resolved" in result.stdout
