"""The diagnosis replayed on runs recorded on an NVIDIA H100 (tests/fixtures/gpu/h100/, benchmarks/gpu_session.py):
the sample workloads under ``gpuscope run`` on a real GPU, their run.json analysed again by today's rules.

On a GPU the host waiting for the next batch launches nothing, so the kernel timeline counts a data wait as host
wait too: the launch-side advice (CUDA graphs, a larger batch) may claim only the host wait that is not data wait.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import statistics
from pathlib import Path

import pytest

from gpuscope.diagnose import analyze
from gpuscope.record import CallSite, RunRecord

H100 = Path(__file__).resolve().parent.parent / "fixtures" / "gpu" / "h100"
LAUNCH_ADVICE = {"static-graph", "larger-batch", "jit-fusion"}


def recorded(name: str) -> tuple[dict, RunRecord]:
    """The raw run.json of an H100 run, and its record analysed again."""
    raw = json.loads(gzip.decompress((H100 / f"{name}.run.json.gz").read_bytes()))
    return raw, analyze(RunRecord.from_json(raw))


def gains(record: RunRecord) -> dict[str, float]:
    return {r.id: r.expected_gain for r in record.recommendations}


@pytest.mark.parametrize("name", ["data", "fp16"])
def test_a_data_bound_gpu_run_is_told_to_feed_the_gpu_not_to_launch_faster(name: str) -> None:
    # given: a loop whose GPU idles almost all the step while the host waits for the DataLoader
    raw, record = recorded(name)
    kernels = raw["op_profile"]["kernels"]
    data_wait = raw["breakdown"]["data_wait"]
    assert data_wait > 0.5 and kernels["idle_host_wait_fraction"] > data_wait
    # then: it is data-loading-bound, and the first advice is about loading
    assert record.verdict.bound == "data-loading"
    assert record.recommendations[0].id in {"more-dataloader-workers", "fp32-preprocessing", "pin-memory"}
    # and launch advice claims at most the host wait left once the data wait is taken out
    launching = kernels["idle_host_wait_fraction"] - data_wait
    for rule in LAUNCH_ADVICE & gains(record).keys():
        assert gains(record)[rule] <= launching + 1e-9, rule


def steady_launch_wait(raw: dict) -> float:
    """The share of a steady step (its median on the GPU's clock) the GPU waits for the host's launches: what the
    profiled steps' kernels, the gaps between queued kernels and other idle leave of it, a step each, less the data
    wait."""
    kernels, steps = raw["op_profile"]["kernels"], raw["steps"]
    step = statistics.median(d for d, kind in zip(steps["sample"]["device_wall_s"], steps["sample"]["status"])
                             if kind == "steady")
    window = raw["op_profile"]["window"]
    per_step = kernels["window_s"] / (window["last_step"] - window["first_step"] + 1)
    busy = (kernels["busy_fraction"] + kernels["idle_kernel_wait_fraction"] + kernels["idle_other_fraction"])
    return (step - busy * per_step) / step - raw["breakdown"]["data_wait"]


def test_a_launch_bound_gpu_run_gets_cuda_graphs_first_with_its_measured_gain() -> None:
    # given: 2000 tiny steps, 253 kernels each; the GPU busy 3% of the step
    raw, record = recorded("launch")
    # then: CPU-launch-bound, and replaying the step as a graph is worth the GPU's wait for the launches in a steady
    # step (the profiler slowed the host's launches in the profiled ones)
    assert record.verdict.bound == "cpu-launch"
    assert record.recommendations[0].id == "static-graph"
    launching = steady_launch_wait(raw)
    assert record.recommendations[0].expected_gain == pytest.approx(launching, abs=0.001)  # gains keep 3 places
    assert launching < raw["op_profile"]["kernels"]["idle_host_wait_fraction"] - raw["breakdown"]["data_wait"]
    assert any("waiting for data" in fact for fact in record.verdict.evidence)


@pytest.mark.parametrize("name", ["data-fixed", "compute-4096"])
def test_launch_advice_is_never_sized_by_a_data_wait(name: str) -> None:
    # given: the data-bound loop with 6 workers and pinned memory, still waiting for batches on an H100; the
    # "compute-bound" sample whose 4096-item batches the main process collates one item at a time
    raw, record = recorded(name)
    # then: no launch advice is sized by the data wait it cannot remove
    launching = max(0.0, raw["op_profile"]["kernels"]["idle_host_wait_fraction"] - raw["breakdown"]["data_wait"])
    assert all(gains(record)[rule] <= launching + 1e-9 for rule in LAUNCH_ADVICE & gains(record).keys())


def test_a_compute_bound_gpu_run_is_told_to_use_tensor_cores_and_bf16_delivers_at_least_the_gain_promised() -> None:
    # given: the wide MLP at batch 4096 in float32 (cuBLAS ran FFMA kernels: no Tensor Core), and the same loop
    # under bf16 autocast, both recorded on the same H100
    raw, record = recorded("compute")
    _, bf16 = recorded("compute-bf16")
    # then: GPU-compute-bound, no kernel time on Tensor Cores, and the first advice is to use them
    assert record.verdict.bound == "compute"
    assert raw["op_profile"]["kernels"]["busy_fraction"] > 0.9
    assert record.op_profile.kernels.tensor_core_share == 0.0
    assert [r.id for r in record.recommendations[:2]] == ["tf32", "mixed-precision"]
    # and bf16, applied, saved at least the share of the step the advice promised
    promised = gains(record)["mixed-precision"]
    realised = 1 - bf16.steps.median_s / record.steps.median_s
    assert realised >= promised
    # at 2 ms a step the bf16 loop is bounded by launches: the next advice follows the measurement
    assert bf16.verdict.bound == "cpu-launch" and bf16.recommendations[0].id == "static-graph"
    # and where the record knows the line that called the model (records made since it was kept), the autocast goes
    # around that line
    called = CallSite(file="compute_bound.py", line=80, function="main", code="loss = loss_fn(model(x), y)", calls=64)
    raw["steps"]["forward_sites"] = [dataclasses.asdict(called)]
    again = {r.id: r for r in analyze(RunRecord.from_json(raw)).recommendations}["mixed-precision"]
    assert again.fix.startswith("compute_bound.py:80 `loss = loss_fn(model(x), y)`: run it, and the loss computed "
                                "from its output, under torch.autocast('cuda', dtype=torch.bfloat16)")


def test_a_launch_bound_gpu_run_profiled_for_50_steps_is_diagnosed_from_them_and_says_when() -> None:
    # given: the launch-bound sample's 2000 steps with --profile-steps 50 on the H100 (the report was handed over
    # 12.5 s into the run, and the script's end added its exit status)
    raw, record = recorded("launch-window")
    window = raw["profiling_window"]
    assert window == {"skip_steps": 0, "profile_steps": 50, "handed_over_s": window["handed_over_s"],
                      "script_ended": True}
    assert raw["steps"]["total"] == 50 and raw["exit_status"] == 0
    # then: the 50 steps hold every window and enough steady steps for the same diagnosis as the whole run's
    assert raw["collectors"]["syncs"]["status"] == "ok" and raw["collectors"]["torch-trace"]["status"] == "ok"
    assert record.verdict.bound == "cpu-launch"
    assert record.recommendations[0].id == "static-graph"


def test_on_16_cores_with_half_second_batches_the_loader_probe_times_the_count_that_would_keep_up() -> None:
    # given: the float16 sample on the H100 machine (16 cores): 0.53 s a batch in the main process, a 3.8 ms step
    # on the GPU. Timing 0-16 workers with and without pin_memory gave each configuration under half a second: no
    # rate at all, and a prediction of 1.01x where 16 workers made the run 22x faster
    raw, record = recorded("fp16-probe")
    rates = {(r["num_workers"], r["pin_memory"]): r for r in raw["loader_probe"]["rates"]}
    # then: the budget went to 16 workers, which delivered batches at a measured rate
    assert set(rates) == {(0, False), (0, True), (16, False), (16, True)}
    assert rates[(16, False)]["batches_per_s"] > 15 and "timed 16 workers only" in raw["loader_probe"]["note"]
    # and the prediction is a large speed-up (22.9x was measured over 40 steps, some of them from the prefetched
    # batches; 16 workers at 0.53 s a batch make at most 30 batches/s, about 16x)
    assert record.verdict.bound == "data-loading"
    assert 8 < record.what_if.speedup < 25  # type: ignore[union-attr]


def test_device_time_and_allocator_memory_are_read_on_every_step_of_a_launch_bound_loop() -> None:
    # given: the launch-bound sample, 600 steps of 7.6 ms on the H100, its device time from torch.Event markers
    # (3 us each, against 11-13 us for torch.cuda.Event) and its allocator counters from one nested-dict read a
    # step (27 us, against 500 us for memory_allocated, memory_reserved and max_memory_allocated)
    raw, record = recorded("launch-events")
    steps, memory = raw["steps"], raw["cuda_memory"]
    device = steps["sample"]["device_wall_s"]
    # then: every step the device has passed is timed (the last is still open at the end), and the loop, which
    # synchronizes at each step's end, takes on the device the time it takes on the host
    assert sum(d is not None for d in device) == len(device) - 1 == 599
    assert steps["device_median_s"] == pytest.approx(steps["median_s"], rel=0.03)
    # and the allocator was read at every step: allocated never above the peak so far, nor the peak above the run's
    assert memory["step"] == list(range(600))
    peak = memory["peak_allocated_bytes"]
    assert all(a <= p <= peak for a, p in zip(memory["allocated_bytes"], memory["peak_bytes"]))
    assert all(r >= a for r, a in zip(memory["reserved_bytes"], memory["allocated_bytes"]))
    assert record.verdict.bound == "cpu-launch"
