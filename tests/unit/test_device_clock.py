"""On CUDA the step figures are read on the GPU's clock: the host queues work many steps ahead and blocks only when
the launch queue fills, so its own step times (short, then long once the queue is full) say how fast it launches,
not how long a step takes. A record summarised on the host's clock (older ones, traces) is moved onto the device's."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import make_record
from gpuscope.diagnose import analyze
from gpuscope.diagnose.clock import host_pace, on_device_clock
from gpuscope.diagnose.compare import compare
from gpuscope.diagnose.words import host_pace_text
from gpuscope.reduce.steady import summarize
from gpuscope.collect.captures import StepRecord
from gpuscope.record import KernelTimeline, OpProfile, SpeedOfLight, Window
from gpuscope.report.compare_text import gate_text

DEVICE_STEP_S = 0.0357
H200_FP32_PEAK = 67e12
FLOPS_PER_STEP = 0.75 * H200_FP32_PEAK * DEVICE_STEP_S
"""An MLP step whose GEMMs run at 75% of the H200's float32 peak on the device."""


def launch_queue_steps(device: bool = True, device_step_s: float = DEVICE_STEP_S) -> list[StepRecord]:
    """A float32 MLP on CUDA with no sync in its step: a first step of 10 s, steps 1-13 under gpuscope's profilers,
    then 27 steady steps the host queued in 1.7 ms each until the launch queue filled, and in 35.5 ms once it had;
    on the GPU every step after the first takes 35.7 ms."""
    records = [StepRecord(0, 10.0, {})]
    for i in range(1, 41):
        host = 0.004 if i < 14 else 0.0017 if i < 34 else 0.0355
        records.append(StepRecord(i, host, {"forward": host / 3}, profiled=i < 14,
                                  device_wall_s=device_step_s if device else None,
                                  device_phases_s={"forward": 0.012, "backward": 0.022, "optimizer": 0.0017}
                                  if device else None))
    return records


def launch_queue_record(clock_in_record: bool = True, device_step_s: float = DEVICE_STEP_S):
    """The loop's record as gpuscope writes it (``clock_in_record``) or as it was written before the step figures
    were read on the device's clock: the same sample, the figures from the host's times."""
    summary = summarize(launch_queue_steps(device_step_s=device_step_s), total=41, head=64, body_weight=1.0,
                        source="optimizer")
    steps = summary.steps
    if not clock_in_record:
        host = summarize(launch_queue_steps(device=False), total=41, head=64, body_weight=1.0, source="optimizer")
        steps = dataclasses.replace(host.steps, device_median_s=steps.device_median_s,
                                    sample=dataclasses.replace(host.steps.sample,
                                                               device_wall_s=steps.sample.device_wall_s))
    kernels = KernelTimeline(busy_fraction=0.99, idle_kernel_wait_fraction=0.01, kernels=93, kernels_per_step=31,
                             mean_kernel_s=0.00114, fp32_gemm_share=0.95, gemm_share=0.95, window_s=0.107,
                             window_basis="launches", compute_busy_fraction=0.99)
    return make_record(
        device="cuda", steps=steps, breakdown=summary.breakdown, host_breakdown=summary.host_breakdown,
        op_profile=OpProfile(window=Window(7, 9), steps=3, kernels=kernels),
        speed_of_light=SpeedOfLight(flops_per_step=round(FLOPS_PER_STEP), step=13, dtype="float32",
                                    device_name="NVIDIA H200", peak_flops_per_s=H200_FP32_PEAK,
                                    peak_source="NVIDIA H200 datasheet"))


def test_steps_the_host_queued_ahead_are_summarised_on_the_gpus_clock() -> None:
    # when: the launch-queue loop's steps are summarised
    steps = summarize(launch_queue_steps(), total=41, head=64, body_weight=1.0, source="optimizer").steps
    # then: the figures are the GPU's 35.7 ms a step, and the host's own median is kept beside them
    assert steps.clock == "device"
    assert (steps.median_s, steps.p10_s, steps.p90_s) == pytest.approx((DEVICE_STEP_S,) * 3)
    assert steps.host_median_s == pytest.approx(0.0017)
    # and no steady step is an outlier for having waited on a full launch queue
    assert (steps.count, steps.outliers, steps.profiled, steps.warmup) == (27, 0, 13, 1)


def test_a_cpu_run_stays_on_the_hosts_clock() -> None:
    steps = summarize(launch_queue_steps(device=False), total=41, head=64, body_weight=1.0, source="optimizer").steps
    assert steps.clock == "host" and steps.host_median_s is None
    assert steps.median_s == pytest.approx(0.0017)


@pytest.mark.parametrize("clock_in_record", [True, False], ids=["new-record", "record-on-the-host-clock"])
def test_the_headline_mfu_and_what_if_follow_the_gpus_clock(clock_in_record: bool) -> None:
    # given: the launch-queue loop's record, as written now or before the step figures were read on the device
    record = launch_queue_record(clock_in_record)
    # when: it is analysed
    analysed = analyze(record)
    # then: the median step is the GPU's, on the device's clock
    steps = analysed.steps
    assert steps.clock == "device" and steps.median_s == pytest.approx(DEVICE_STEP_S)
    # and the MFU is the FLOPs over the device's step, under 100%
    sol = analysed.speed_of_light
    assert sol is not None and sol.mfu == pytest.approx(0.75, rel=1e-3)
    # and the what-if at the speed of light is a shorter step, not a slower one
    assert analysed.what_if is not None
    assert analysed.what_if.step_s == pytest.approx(FLOPS_PER_STEP / H200_FP32_PEAK)
    assert analysed.what_if.speedup == pytest.approx(1 / 0.75, rel=1e-3)
    # and a queue filling up is neither two speeds nor a change of pace
    text = " ".join(analysed.verdict.evidence)
    assert "two speeds" not in text and "changed pace" not in text
    assert analysed.verdict.bound == "compute"


def test_the_host_queues_a_step_as_fast_as_the_steps_it_ran_ahead_in_say() -> None:
    record = on_device_clock(launch_queue_record(clock_in_record=False))
    pace = host_pace(record)
    assert pace is not None and pace.how == "ran ahead"
    assert pace.seconds == pytest.approx(0.0017) and pace.steps == 20


def test_a_record_without_device_times_keeps_its_clock() -> None:
    record = make_record(device="cuda")
    assert on_device_clock(record) is record
    assert host_pace(record) is None


def test_no_mfu_above_the_peak_is_ever_given() -> None:
    # given: the launch-queue loop's record as a CUDA run whose steps were timed on the host's clock only (no device
    # time in its sample): its 1.7 ms median puts 1.79 TFLOP a step at 1580% of the float32 peak
    record = launch_queue_record(clock_in_record=False)
    steps = dataclasses.replace(record.steps, sample=dataclasses.replace(record.steps.sample, device_wall_s=()))
    # when
    analysed = analyze(dataclasses.replace(record, steps=steps))
    # then: no MFU, and the note says why
    sol = analysed.speed_of_light
    assert analysed.steps.clock == "host"
    assert sol is not None and sol.mfu is None
    assert "no step runs above its GPU's peak" in sol.note


def test_a_float32_step_on_tensor_cores_is_held_against_the_tf32_peak() -> None:
    # given: a float32 conv net whose convolutions ran on TF32 Tensor Cores (cuDNN's default), its FLOPs over its
    # step 1.5x the H200's float32 peak
    record = launch_queue_record()
    kernels = dataclasses.replace(record.op_profile.kernels, tensor_core_share=0.6)  # type: ignore[union-attr]
    sol = dataclasses.replace(record.speed_of_light, flops_per_step=round(1.5 * H200_FP32_PEAK * DEVICE_STEP_S))
    record = dataclasses.replace(record, speed_of_light=sol, op_profile=dataclasses.replace(record.op_profile,
                                                                                             kernels=kernels))
    # then: the MFU is of the TF32 peak, 494.5 TFLOP/s dense
    analysed = analyze(record).speed_of_light
    assert analysed is not None and analysed.dtype == "tfloat32"
    assert analysed.mfu == pytest.approx(1.5 * 67 / 494.5, rel=1e-3)


def test_compare_reads_two_cuda_runs_on_the_gpus_clock() -> None:
    # given: the launch-queue loop before (35.7 ms a step on the GPU) and after a fix (7.1 ms), both recorded before
    # the step figures were read on the device's clock: the host queued both at 1.7 ms a step
    before = launch_queue_record(clock_in_record=False)
    after = launch_queue_record(clock_in_record=False, device_step_s=DEVICE_STEP_S / 5)
    assert before.steps.median_s == pytest.approx(after.steps.median_s)
    # when
    comparison = compare(before, after)
    # then: the speed-up is the GPU's, 5x, and says which clock it read
    speedup = comparison.speedup
    assert speedup.ratio == pytest.approx(5.0) and speedup.low is not None and speedup.low > 1
    assert speedup.clock == "the GPU's timeline"
    # and the CI gate reads the same clock: B is 80% faster, not "as fast"
    decided, line = gate_text(speedup, 5.0)
    assert decided.decision == "passed" and "80.0% faster" in line


def test_with_few_steps_queued_ahead_the_fastest_says_how_fast_the_host_goes() -> None:
    # given: the host ran ahead in two steady steps only (2.5 and 1.7 ms), and waited in syncs 4 ms a step
    record = on_device_clock(launch_queue_record(clock_in_record=False))
    sample = record.steps.sample
    walls = tuple(0.0025 if i == 14 else 0.0017 if i == 15 else DEVICE_STEP_S if i > 15 else w
                  for i, w in zip(sample.index, sample.wall_s))
    kernels = dataclasses.replace(record.op_profile.kernels, sync_calls=3, sync_wait_s=0.012)  # type: ignore[union-attr]
    record = dataclasses.replace(record, steps=dataclasses.replace(record.steps, host_median_s=DEVICE_STEP_S,
                                                                   sample=dataclasses.replace(sample, wall_s=walls)),
                                 op_profile=dataclasses.replace(record.op_profile, kernels=kernels))
    # then: the fastest of them, not its median step less its syncs (31.7 ms)
    pace = host_pace(record)
    assert pace is not None and (pace.how, pace.steps) == ("ran ahead", 2)
    assert pace.seconds == pytest.approx(0.0017)
    assert "the fastest of the 2 steady steps" in host_pace_text(pace)
