"""The verdict from the breakdown: data-loading-bound runs are named, too few steps is inconclusive."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import make_record
from gpuscope.diagnose.classify import classify
from gpuscope.diagnose.rules import evaluate
from gpuscope.record import (
    Breakdown,
    Calibration,
    CollectorStatus,
    Communication,
    FunctionStat,
    HostMemory,
    KernelTimeline,
    Loader,
    OpProfile,
    OpStat,
    PythonProfile,
    RunRecord,
    StepSample,
    Steps,
    Window,
)


@pytest.mark.parametrize(
    ("data_wait", "bound"),
    [(0.62, "data-loading"), (0.20, "data-loading"), (0.19, "inconclusive"), (0.02, "inconclusive")],
)
def test_data_wait_share_decides_data_loading(data_wait, bound) -> None:
    record = make_record(breakdown=Breakdown(data_wait=data_wait, forward=1 - data_wait))  # no op profile
    assert classify(record).bound == bound


def test_data_loading_evidence_carries_its_numbers() -> None:
    record = make_record(
        breakdown=Breakdown(data_wait=0.62, forward=0.38),
        loaders=(Loader(dataset="Images", num_workers=0, batches=40, wait_s=3.0),),
    )
    verdict = classify(record)
    assert verdict.confidence > 0.6
    assert any("62%" in e for e in verdict.evidence)
    assert any("0 worker" in e for e in verdict.evidence)


def test_fewer_steady_steps_than_a_median_needs_give_the_verdict_at_a_confidence_cut_in_proportion() -> None:
    # given a run of 4 long steps, 3 of them steady, each waiting 90% of its time for data
    thin = make_record(steps=Steps(count=3, median_s=17.0, total=4, warmup=1),
                       breakdown=Breakdown(data_wait=0.9, forward=0.1))
    full = make_record(steps=Steps(count=5, median_s=17.0, total=6, warmup=1),
                       breakdown=Breakdown(data_wait=0.9, forward=0.1))
    # when classified
    verdict, measured = classify(thin), classify(full)
    # then the verdict is the one 5 such steps give, at 3/5 of its confidence, and the evidence says why first
    assert verdict.bound == measured.bound == "data-loading"
    assert verdict.confidence == round(measured.confidence * 3 / 5, 2) < measured.confidence
    assert verdict.evidence[0].startswith("thin evidence: only 3 steady-state steps were measured (4 in all; "
                                          "left out: 1 warm-up") and "cut to 3 in 5" in verdict.evidence[0]
    assert verdict.evidence[1] == measured.evidence[0].replace("5 steady-state steps", "3 steady-state steps")


def test_an_inconclusive_verdict_from_few_steps_says_how_few_too() -> None:
    # given 2 steady steps of a CPU run whose launch-bound or compute-bound cannot be told (no calibration)
    record = make_record(steps=Steps(count=2, median_s=0.0055, total=6, warmup=1, profiled=3),
                         breakdown=Breakdown(forward=0.4, backward=0.6))
    # when classified
    verdict = classify(record)
    # then the verdict stays inconclusive, and its first line says it rests on 2 steps of the 5 a median needs
    assert verdict.bound == "inconclusive"
    assert verdict.evidence[0].startswith("thin evidence: only 2 steady-state steps were measured (6 in all; ")
    assert "launch-bound or compute-bound cannot be told" in verdict.evidence[1]


def _three_long_steps(op_profile: OpProfile | None) -> object:
    """A run of 3 steps of 17 s: step 0 the warm-up, step 1 under cProfile, step 2 under torch.profiler; the
    profiled steps wait 90% (step 1) and 80% (step 2) of their time for data."""
    sample = StepSample(index=(0, 1, 2), wall_s=(30.0, 20.0, 17.0), status=("warmup", "profiled", "profiled"),
                        phases_s={"data_wait": (1.0, 18.0, 13.6), "forward": (29.0, 2.0, 3.4)})
    return make_record(steps=Steps(count=0, total=3, warmup=1, profiled=2, sample=sample), breakdown=Breakdown(),
                       op_profile=op_profile)


def test_where_no_step_ran_unprofiled_the_traced_steps_give_the_verdict_at_a_tenth_of_their_confidence() -> None:
    # given a run whose only steps past the warm-up were profiled, step 2 the one torch.profiler recorded
    record = _three_long_steps(OpProfile(window=Window(first_step=2, last_step=2), steps=1))
    # when classified
    verdict = classify(record)
    # then step 2 alone gives it: 80% of its time waiting for data is data-loading-bound, at 1 in 10 of the
    # confidence it would have, and the evidence names the step and why it is thin
    measured = classify(make_record(steps=Steps(count=5, median_s=17.0, total=6, warmup=1),
                                    breakdown=Breakdown(data_wait=0.8, forward=0.2)))
    assert verdict.bound == measured.bound == "data-loading"
    assert verdict.confidence == round(measured.confidence / 10, 2) > 0
    assert verdict.evidence[0].startswith("thin evidence: no step ran unprofiled (3 in all; left out: 1 warm-up, "
                                          "2 profiled") and "that of the profiled step 2, slowed" in verdict.evidence[0]
    assert verdict.evidence[1].startswith("80% of each step waits for the next batch (median step 17000.0 ms")


def test_a_traced_step_recorded_one_closure_call_of_is_timed_as_that_call_times_its_calls() -> None:
    # given the three long steps, step 2 recorded up to the end of its first of 4 closure calls, which took 3 s (its
    # wall of 17 s also held the trace's export and the FLOP count of its second call)
    record = _three_long_steps(OpProfile(window=Window(first_step=2, last_step=2), steps=1, closure_calls=4,
                                         closure_call_s=3.0))
    # when classified
    verdict = classify(record)
    # then the step the verdict reads is 4 x 3 s, as its op table is, and the evidence says so
    assert verdict.bound == "data-loading"
    assert "its time taken as its first call of the optimizer's closure, traced, 3.00 s, times its 4 calls: its " \
           "wall, 17.00 s, also holds" in verdict.evidence[0]
    assert verdict.evidence[1].startswith("80% of each step waits for the next batch (median step 12000.0 ms")


def test_where_the_profiled_steps_cannot_tell_the_verdict_says_why_not_that_no_step_was_steady() -> None:
    # given the three long steps of a CPU run without the op figures its verdict needs, waiting for no data
    record = _three_long_steps(OpProfile(window=Window(first_step=2, last_step=2), steps=1, ops_per_step=1000))
    sample = dataclasses.replace(record.steps.sample, phases_s={"data_wait": (1.0, 0.0, 0.0),
                                                               "forward": (29.0, 20.0, 17.0)})
    record = dataclasses.replace(record, device="cpu", steps=dataclasses.replace(record.steps, sample=sample))
    verdict = classify(record)
    # then it is inconclusive for the reason its profiled step gives, named after the thin-evidence line
    assert verdict.bound == "inconclusive" and verdict.evidence[0].startswith("thin evidence: no step ran unprofiled")
    assert "cannot be told" in verdict.evidence[1] and not any("0 steady-state steps" in e for e in verdict.evidence)


def test_where_no_step_was_traced_every_profiled_step_gives_the_verdict() -> None:
    verdict = classify(_three_long_steps(None))
    assert verdict.bound == "data-loading" and "the profiled steps 1-2" in verdict.evidence[0]
    assert verdict.evidence[1].startswith("85% of each step waits for the next batch (median step 18500.0 ms")


def test_no_steady_step_is_inconclusive_and_says_so() -> None:
    record = make_record(steps=Steps(count=0, median_s=0.0, total=4, warmup=1, profiled=3),
                         breakdown=Breakdown(data_wait=0.9, forward=0.1))
    verdict = classify(record)
    assert verdict.bound == "inconclusive" and verdict.confidence == 0.0
    assert verdict.evidence[0].startswith("only 0 steady-state steps were measured (4 steps in all; left out: 1 "
                                          "warm-up, 3 profiled") and "at least one is needed" in verdict.evidence[0]


def cpu_record(ops_per_step: float, op_overhead_s: float, median_s: float, data_wait: float = 0.02,
               mean_op_s: float = 20e-6):
    return make_record(
        device="cpu",
        steps=Steps(count=40, median_s=median_s, total=50, warmup=1, profiled=9),
        breakdown=Breakdown(data_wait=data_wait, forward=1 - data_wait),
        op_profile=OpProfile(ops=int(ops_per_step * 3), ops_per_step=ops_per_step, mean_op_s=mean_op_s,
                             top_host=(OpStat("aten::addmm", 30, 0.5, 0.0),)),
        calibration=Calibration(op_overhead_s=op_overhead_s, ops_per_step=379, step_s=379 * op_overhead_s),
    )


def cuda_record(busy: float, host_wait: float, kernel_wait: float = 0.0, data_wait: float = 0.02):
    other = 1 - busy - host_wait - kernel_wait
    return make_record(
        device="cuda",
        steps=Steps(count=40, median_s=0.01, total=50, warmup=1, profiled=9, breakdown_basis="device"),
        breakdown=Breakdown(data_wait=data_wait, forward=1 - data_wait),
        op_profile=OpProfile(ops=300, ops_per_step=100, top_device=(OpStat("ampere_sgemm_128x64", 30, 0.0, 0.02),),
                             kernels=KernelTimeline(busy_fraction=busy, idle_host_wait_fraction=host_wait,
                                                    idle_kernel_wait_fraction=kernel_wait, idle_other_fraction=other,
                                                    kernels=300, kernels_per_step=100, mean_kernel_s=5e-6)),
    )


@pytest.mark.parametrize(
    ("record", "bound"),
    [
        # CPU: 3600 ops x 0.6 us = 2.2 ms of a 3 ms step: per-op overhead bounds it
        (cpu_record(3600, 0.6e-6, 0.003), "cpu-launch"),
        # CPU: 150 ops x 0.6 us = 0.09 ms of a 250 ms step, and the ops' 1.5 ms each fill it: the arithmetic does
        (cpu_record(150, 0.6e-6, 0.250, mean_op_s=1.5e-3), "compute"),
        # CPU: as little overhead, but the ops' 20 us each fill 1% of the step: not the arithmetic either
        (cpu_record(150, 0.6e-6, 0.250), "inconclusive"),
        # CPU: a third of the step is overhead: mixed, and said so
        (cpu_record(1000, 1e-6, 0.003), "inconclusive"),
        # CPU: 40% of the step is fixed cost and the mean op is only 2x that cost: tiny ops, launch-bound
        (cpu_record(3600, 0.55e-6, 0.005, mean_op_s=1.1e-6), "cpu-launch"),
        # CPU: tiny ops, but fixed cost explains too little of the step to call it
        (cpu_record(300, 0.55e-6, 0.005, mean_op_s=1.1e-6), "inconclusive"),
        # CPU: loading still comes first
        (cpu_record(3600, 0.6e-6, 0.003, data_wait=0.4), "data-loading"),
        # CUDA: a starved GPU with tiny kernels, the host late for most idle time
        (cuda_record(busy=0.25, host_wait=0.6), "cpu-launch"),
        # CUDA: a busy GPU with large GEMMs
        (cuda_record(busy=0.92, host_wait=0.02), "compute"),
        # CUDA: a GPU idle while the loader works
        (cuda_record(busy=0.3, host_wait=0.1, data_wait=0.6), "data-loading"),
        # CUDA: idle, but not waiting on the host (syncs, copies): not launch-bound
        (cuda_record(busy=0.3, host_wait=0.1), "inconclusive"),
    ],
    ids=["cpu-overhead", "cpu-arithmetic", "cpu-outside-ops", "cpu-mixed", "cpu-tiny-ops", "cpu-tiny-ops-little-overhead",
         "cpu-data", "cuda-starved", "cuda-busy", "cuda-data",
         "cuda-idle-other"],
)
def test_the_verdict_follows_the_evidence(record, bound) -> None:
    verdict = classify(record)
    assert verdict.bound == bound
    assert verdict.evidence
    assert all(any(ch.isdigit() for ch in fact) for fact in verdict.evidence)  # every fact carries its number


def test_tiny_ops_whose_fixed_cost_explains_little_of_the_step_say_how_much_of_it_they_fill() -> None:
    # the LBFGS loop's figures, before its op profile left out the prediction pass after its last step: 197130 ops
    # of 3.9 us (2.8x the 1.38 us fixed cost) fill 56% of the 1368 ms step, their fixed cost 20%
    verdict = classify(cpu_record(197130, 1.38e-6, 1.368, mean_op_s=3.9e-6))
    assert verdict.bound == "inconclusive"
    tiny = next(fact for fact in verdict.evidence if fact.startswith("the ops are tiny"))
    assert tiny == "the ops are tiny yet their fixed cost explains only 20% of the step, their own time 56% of it"
    # where they fill less than half of it, most of the step is spent outside them, and that is said
    verdict = classify(cpu_record(197130, 1.38e-6, 2.0, mean_op_s=3.9e-6))
    assert any(fact.endswith("38% of it: most of the step is spent outside torch ops") for fact in verdict.evidence)


def test_a_cpu_step_spent_outside_torch_ops_is_not_called_compute_bound_and_says_where_it_went() -> None:
    # recorded from a loop that sleeps 500 ms a step: 138 ops of 28 us each, 4 ms of a 505 ms step
    sleeping = dataclasses.replace(
        cpu_record(138, 1.37e-6, 0.505, mean_op_s=28.5e-6),
        python_profile=PythonProfile(
            window=Window(first_step=0, last_step=4), total_s=4.0, startup_s=1.98,
            top_own=(FunctionStat("<built-in method time.sleep>", "~", 0, 4, 2.0, 2.0),
                     FunctionStat("<method 'run_backward' of 'torch._C._EngineBase' objects>", "~", 0, 4, 0.01, 0.01)),
            top_cumulative=(FunctionStat("<built-in method time.sleep>", "~", 0, 4, 2.0, 2.0),
                            FunctionStat("train", "train.py", 12, 1, 0.0, 2.02),
                            FunctionStat("backward", "torch/_tensor.py", 566, 4, 0.0, 0.011))))
    verdict = classify(sleeping)
    assert verdict.bound == "inconclusive"
    assert verdict.evidence[0].startswith("torch ops ran 3.93 ms of the 505.00 ms step (1%)")
    assert verdict.evidence[1] == ("the Python profile (steps 0-4) spends 2.00 s of its 2.02 s (99%) in "
                                   "<built-in method time.sleep>, under train (train.py:12)")


def test_the_time_outside_torch_ops_is_not_said_to_be_in_torchs_own_calls_into_them() -> None:
    # recorded from a REINFORCE loop (a policy stepped one observation at a time through torch.distributions, a
    # cart-pole simulated in Python): 5063 ops of 1.2 us fill 17% of a 37.48 ms step; the Python profile's function
    # with the most time of its own is autograd's call into the backward ops, and its wrappers the largest callers
    run_backward = FunctionStat("<method 'run_backward' of 'torch._C._EngineBase' objects>", "~", 0, 4, 0.0074,
                                0.0074)
    check = FunctionStat("check", "torch/distributions/constraints.py", 532, 65, 0.0020, 0.0029)
    multinomial = FunctionStat("<built-in method torch.multinomial>", "~", 0, 65, 0.0018, 0.0018)
    rl = dataclasses.replace(
        cpu_record(5063, 1.69e-6, 0.03748, mean_op_s=1.2e-6),
        python_profile=PythonProfile(
            window=Window(first_step=0, last_step=4), total_s=0.367, startup_s=0.332,
            top_own=(run_backward, check, multinomial),
            top_cumulative=(FunctionStat("backward", "torch/_tensor.py", 566, 4, 0.00002, 0.0080), run_backward,
                            FunctionStat("__init__", "torch/distributions/categorical.py", 56, 65, 0.0006, 0.0061),
                            check)))
    verdict = classify(rl)
    assert verdict.bound == "inconclusive"
    # then the time outside the ops is said to be in Python outside them: the distributions' argument check, under
    # the distribution's construction, not in autograd's call into the ops nor under backward, which wraps it
    assert verdict.evidence[1] == ("the Python profile (steps 0-4) spends 2.0 ms of its 35.0 ms (6%) in check "
                                   "(torch/distributions/constraints.py:532), under __init__ "
                                   "(torch/distributions/categorical.py:56)")


def test_an_other_phase_of_a_fifth_of_the_step_is_put_down_to_the_scripts_functions_that_ran_there() -> None:
    # given: a loop keeping an EMA of its weights (timm's ModelEmaV2, a 12-block MLP): "other" 21% of the step, and
    # the Python profile's steps 1-4 (20 ms) spent 3.4 ms in the script's update(), which ran no phase's code
    ema = FunctionStat("update", "train.py", 15, 4, 0.0021, 0.0034)
    record = dataclasses.replace(
        cpu_record(5000, 1.5e-6, 0.017, mean_op_s=3.8e-6),
        breakdown=Breakdown(data_wait=0.0, forward=0.18, backward=0.26, optimizer=0.35, other=0.21),
        python_profile=PythonProfile(window=Window(first_step=0, last_step=4), total_s=0.5, startup_s=0.48,
                                     between_phases=(ema, FunctionStat("log", "train.py", 30, 4, 0.0002, 0.0002))))
    # then: the verdict's evidence names it, with its share of the profiled steps (the 1% of log() is not said)
    assert ("other is 21% of each step: the code the loop runs between the phases, which the Python profile (steps "
            "0-4) finds in update (train.py:15) 17% of its time") in classify(record).evidence
    # and where "other" is under 15% of the step, nothing is said of it
    record = dataclasses.replace(record, breakdown=Breakdown(forward=0.3, backward=0.3, optimizer=0.3, other=0.1))
    assert not any(fact.startswith("other is") for fact in classify(record).evidence)


def test_a_cpu_step_mostly_outside_the_model_and_optimizer_is_not_called_compute_bound() -> None:
    # recorded from a loop fed by a generator that crops and normalises each batch with numpy (no DataLoader): 122
    # ops of 14.6 us a 5.46 ms step cover 33% of it, but forward, backward and the optimizer take 30% of the step
    record = cpu_record(122, 1.35e-6, 5.46e-3, data_wait=0.0, mean_op_s=14.6e-6)
    generator = FunctionStat("batches", "gen_data.py", 5, 4, 0.0082, 0.018)
    fed = dataclasses.replace(
        record, breakdown=Breakdown(data_wait=0.0, forward=0.14, backward=0.15, optimizer=0.01, other=0.70),
        python_profile=PythonProfile(window=Window(first_step=0, last_step=4), total_s=1.989, startup_s=1.962,
                                     top_own=(generator,), top_cumulative=(generator,)))
    verdict = classify(fed)
    assert (verdict.bound, verdict.confidence) == ("inconclusive", 0.3)
    assert verdict.evidence[0].startswith("70% of each step is spent outside the model's forward and backward, the "
                                          "optimizer and DataLoader waits")
    # where the Python profile saw the time: the generator's own line, not named again as its own caller
    assert verdict.evidence[1] == "the Python profile (steps 0-4) spends 8.2 ms of its 27.0 ms (30%) in batches " \
                                  "(gen_data.py:5)"
    # the same ops in a step the model fills are compute-bound
    assert classify(dataclasses.replace(fed, breakdown=Breakdown(forward=0.5, backward=0.45, other=0.05))).bound \
        == "compute"


def test_a_cpu_step_mostly_outside_the_model_yet_filled_by_torch_ops_is_compute_bound() -> None:
    # recorded from a distillation loop: a frozen teacher's forward under no_grad (no trained parameters: not a timed
    # root) and a small student; "other" is 79% of the 110.84 ms step, yet its 707 ops of 126.3 us cover 81% of it
    record = cpu_record(707, 2.71e-6, 0.11084, data_wait=0.03, mean_op_s=126.3e-6)
    distilled = dataclasses.replace(
        record, breakdown=Breakdown(data_wait=0.03, forward=0.08, backward=0.09, optimizer=0.01, other=0.79))
    verdict = classify(distilled)
    assert verdict.bound == "compute" and verdict.confidence > 0.9
    assert verdict.evidence[0] == (
        "79% of each step is spent outside the model's forward and backward, the optimizer and DataLoader waits, yet "
        "torch ops ran 89.29 ms of the 110.84 ms step (81%): computing outside the trained model's forward and "
        "backward (a model run without gradients, a loss)")


def two_phase_record(window_step_s: float) -> object:
    """A script that trains an encoder for 64 steps of ~40 ms, then a head for 256 of 2.5 ms: the steady state is
    the head's, and torch.profiler's window (steps 7-9) took ``window_step_s`` a step."""
    record = cpu_record(3337, 1.4e-6, 0.0025, mean_op_s=11e-6)
    index = tuple(range(320))
    wall = tuple(window_step_s if 7 <= i <= 9 else 0.04 if i < 64 else 0.0025 for i in index)
    sample = StepSample(index=index, wall_s=wall)
    steps = dataclasses.replace(record.steps, sample=sample, warmup=66, count=253, total=319)
    op_profile = dataclasses.replace(record.op_profile, window=Window(first_step=7, last_step=9))
    return dataclasses.replace(record, steps=steps, op_profile=op_profile)


def test_an_op_profile_of_steps_unlike_the_steady_ones_decides_nothing_and_says_how_to_profile_them() -> None:
    record = two_phase_record(window_step_s=0.043)
    verdict = classify(record)
    assert verdict.bound == "inconclusive"
    assert "the op profile's steps (7-9, median 43.0 ms) are 17x longer than the steady-state steps (median 2.5 ms)" \
        in verdict.evidence[0]
    assert "`gpuscope run --skip-steps 66 ...`" in verdict.evidence[0]
    # and no rule reads the op profile's figures as the steady state's
    _, checks = evaluate(record)
    launch = checks["larger-batch"]
    assert launch.status == "not-checked" and "17x longer" in (launch.reason or "")


def test_a_communication_share_of_the_profiled_steps_own_time_gives_its_verdict_and_its_advice_alike() -> None:
    # given a job whose profiled steps (7-9) took 43 ms, 17x its steady ones, 30 ms of each waiting on its collectives
    record = two_phase_record(window_step_s=0.043)
    comm = Communication(calls_per_step=97, comm_s=0.035, exposed_s=0.030, backend="gloo", step_s=0.043)
    record = dataclasses.replace(record, op_profile=dataclasses.replace(record.op_profile, communication=comm))
    # then the verdict and the advice read the same share, of those steps' own time (70%), and the advice says
    # which steps it comes from
    verdict = classify(record)
    assert verdict.bound == "communication"
    recommendations, _ = evaluate(record)
    (advice,) = [r for r in recommendations if r.id == "reduce-communication"]
    assert advice.expected_gain == pytest.approx(0.030 / 0.043 * 0.75, abs=0.001)
    assert any("17x longer than the steady-state steps" in line for line in advice.evidence)
    # but a share under the verdict's bar, from such steps, advises nothing (a balanced job's window slowed beside busy
    # processes read 20-30%): the rule says why it was not checked
    comm = dataclasses.replace(comm, exposed_s=0.012)
    record = dataclasses.replace(record, op_profile=dataclasses.replace(record.op_profile, communication=comm))
    recommendations, checks = evaluate(record)
    assert "reduce-communication" not in [r.id for r in recommendations]
    assert checks["reduce-communication"].status == "not-checked"
    assert "17x longer" in (checks["reduce-communication"].reason or "")


def test_the_gain_of_sending_less_is_of_the_steady_step_where_the_profiler_alone_slowed_the_profiled_ones() -> None:
    # given a data-parallel job (a Lightning DDP classifier on 2 CPU ranks) whose profiled steps took 17.5 ms, the
    # profiler slowing its own work, against 8.9 ms steady ones, 4.3 ms of each waiting on the all-reduce's own work
    record = cpu_record(444, 1.4e-6, 0.0089, mean_op_s=9.8e-6)
    comm = Communication(calls_per_step=3, comm_s=0.0058, exposed_s=0.0043, backend="gloo", step_s=0.0175)
    record = dataclasses.replace(record, op_profile=dataclasses.replace(record.op_profile, communication=comm))
    # then the wait reads 25% of the profiled step, and the gain is of the steady step's 48% (4 batches
    # accumulated: three all-reduces in four saved); measured without gpuscope, 35-44% of the job's fit saved
    recommendations, _ = evaluate(record)
    (advice,) = [r for r in recommendations if r.id == "reduce-communication"]
    assert "25% of each step: 4.3 ms of the 17.5 ms profiled step" in advice.evidence[0]
    assert advice.expected_gain == pytest.approx(0.0043 / 0.0089 * 0.75, abs=0.001)
    assert any("against the 8.9 ms steady-state step that wait is 48%" in line
               for line in advice.evidence), advice.evidence


def test_in_a_run_whose_steps_lengthen_as_it_goes_the_advice_skips_to_steps_like_the_median_one() -> None:
    # given: a reinforcement-learning loop whose episodes (its steps) lengthen from 10 ms by 1 ms each, its median
    # 85 ms, so that torch.profiler's window (steps 7-9, 17-19 ms) is 5x shorter; past the one warm-up step the steps
    # are steady, bar the profiled ones
    record = cpu_record(3400, 1.4e-6, 0.085, mean_op_s=1.8e-6)
    index = tuple(range(150))
    status = tuple("warmup" if i == 0 else "profiled" if 6 <= i <= 9 else "steady" for i in index)
    sample = StepSample(index=index, wall_s=tuple(0.010 + 0.001 * i for i in index), status=status)
    steps = dataclasses.replace(record.steps, sample=sample, warmup=1)
    record = dataclasses.replace(record, steps=steps, op_profile=dataclasses.replace(
        record.op_profile, window=Window(first_step=7, last_step=9)))
    verdict = classify(record)
    assert verdict.bound == "inconclusive"
    # then skipping the warm-up alone would profile steps 8-10, as short: the advice skips 25 steps, which puts the
    # window on steps 32-34, the first whose median (43 ms) is within 2x of the median step
    assert "5x shorter than the steady-state steps (median 85.0 ms)" in verdict.evidence[0]
    assert "`gpuscope run --skip-steps 25 ...`" in verdict.evidence[0]


def test_an_op_profile_a_little_slower_than_the_steady_steps_still_decides() -> None:
    # the profiler's own cost lengthens an op-heavy step by up to 1.5x
    assert classify(two_phase_record(window_step_s=0.004)).bound == "cpu-launch"


def steady_sample(walls: list[float]) -> StepSample:
    return StepSample(index=tuple(range(10, 10 + len(walls))), wall_s=tuple(walls), status=("steady",) * len(walls))


def test_steps_at_two_speeds_are_named_with_each_speed_and_which_steps_are_slow() -> None:
    # recorded: an IterableDataset with two spawn workers: 8 ms and 95 ms steps in turn, median 27 ms
    alternating = [0.008 + 0.0005 * (i % 3) if i % 2 else 0.095 - 0.001 * (i % 4) for i in range(60)]
    record = dataclasses.replace(cpu_record(150, 0.6e-6, 0.027, mean_op_s=1.5e-4),
                                 steps=Steps(count=60, median_s=0.027, total=70, warmup=10, sample=steady_sample(
                                     alternating)))
    mix = classify(record).evidence[-1]
    assert mix == ("the steps run at two speeds: 30 of 60 steady steps take a median 8.5 ms, 30 take "
                          "94.0 ms (11x); the 27.0 ms median step stands for the mix: every 2nd step")
    # a phase of slow steps in a row (a Transformers loop's steps 65-101)
    phase = [0.0775 + 0.001 * (i % 5) if not 55 <= i <= 91 else 1.844 for i in range(190)]
    record = dataclasses.replace(record, steps=dataclasses.replace(record.steps, sample=steady_sample(phase)))
    assert classify(record).evidence[-1].endswith("stands for the mix: steps 65-101 in a row (a phase of the run)")


@pytest.mark.parametrize("walls", [
    [0.010 * (1 + 0.05 * (i % 7)) for i in range(50)],  # one speed, the usual noise
    [0.010 * 1.06 ** i for i in range(50)],  # steps slowing down gradually: no gap to split them at
    [0.010] * 45 + [0.2] * 5,  # a tail of slow steps (a tenth), not a group
], ids=["noise", "drift", "tail"])
def test_steps_at_one_speed_are_not_said_to_run_at_two(walls: list[float]) -> None:
    record = dataclasses.replace(cpu_record(150, 0.6e-6, 0.010, mean_op_s=5e-5),
                                 steps=Steps(count=50, median_s=0.010, total=60, warmup=10,
                                             sample=steady_sample(walls)))
    assert not any("two speeds" in fact for fact in classify(record).evidence)


def test_launch_bound_evidence_names_the_op_count_and_the_measured_cost() -> None:
    verdict = classify(cpu_record(3600, 0.6e-6, 0.003))
    assert "3600 torch ops per step at 0.60 us" in verdict.evidence[0]
    assert "72% of the 3.00 ms step" in verdict.evidence[0]


def test_without_an_op_profile_a_cpu_run_is_inconclusive_and_says_why() -> None:
    record = make_record(collectors={"torch-trace": CollectorStatus("unavailable", "turned off (--trace-steps 0)", field="op_profile")})
    verdict = classify(record)
    assert verdict.bound == "inconclusive"
    assert "turned off (--trace-steps 0)" in verdict.evidence[0]


def test_a_run_with_no_step_at_all_says_how_to_mark_steps() -> None:
    record = make_record(steps=Steps(count=0, total=0, source="none"))
    verdict = classify(record)
    assert verdict.bound == "inconclusive"
    assert any("gpuscope.step()" in fact for fact in verdict.evidence)


def test_a_script_that_trained_in_processes_it_spawned_is_told_to_profile_them_from_inside() -> None:
    # given: no step in the script's own process, two child processes of 300 MiB each beside it and no DataLoader
    # (torch.multiprocessing.spawn(worker, nprocs=2), as pytorch/examples' data-parallel scripts start their ranks)
    children = HostMemory(interval_s=0.1, peak_bytes=800 * 2**20, peak_process_bytes=200 * 2**20,
                          peak_workers_bytes=600 * 2**20, max_workers=2)
    record = make_record(steps=Steps(count=0, total=0, source="none"), host_memory=children)
    # then: it says what was measured and how to profile a rank, not to mark steps the script has none of
    (why,) = classify(record).evidence[1:]
    assert "2 child processes ran beside it (600 MiB at their peak)" in why
    assert "`with gpuscope.profile():`" in why and "gpuscope.step()" not in why
    # a DataLoader's workers are children too: the loop that iterated it is the script's own, and marks its steps
    fed = dataclasses.replace(record, loaders=(Loader(dataset="Items", batches=3, wait_s=0.1, num_workers=2),))
    assert any("gpuscope.step()" in fact for fact in classify(fed).evidence)


@pytest.mark.parametrize(("exit_status", "loaders", "said"), [
    (1, (Loader(dataset="Items", batches=1, wait_s=0.1),), "exit status 1, after 1 batch from its DataLoader"),
    (2, (), "exit status 2, before its first training step ended"),  # an argparse error: no batch at all
])
def test_a_script_that_failed_before_its_first_step_is_told_so_not_to_mark_steps(exit_status, loaders, said) -> None:
    record = make_record(exit_status=exit_status, loaders=loaders, steps=Steps(count=0, total=0, source="none"))
    verdict = classify(record)
    assert verdict.bound == "inconclusive"
    assert any(said in fact for fact in verdict.evidence), verdict.evidence
    assert not any("gpuscope.step()" in fact for fact in verdict.evidence)


def gpu_loop(kernels_ms: float, waited_ms: float, host_ms: float, profiled_busy: float = 0.5) -> RunRecord:
    """A CUDA loop of 10 ms steps on the GPU's clock whose profiled steps (7-9) ran ``kernels_ms`` of kernels a
    step (their busy share ``profiled_busy``: the profiler slowed the launches), the GPU waiting ``waited_ms`` a step
    for the host and the rest between queued kernels; the host queued its steps 14-23 ahead of the GPU in
    ``host_ms`` each, then kept pace."""
    window_step = kernels_ms / profiled_busy
    gaps = (10.0 - kernels_ms - waited_ms) / window_step
    timeline = KernelTimeline(busy_fraction=profiled_busy, idle_kernel_wait_fraction=gaps,
                              idle_host_wait_fraction=1 - profiled_busy - gaps, kernels=300, kernels_per_step=100,
                              mean_kernel_s=kernels_ms / 100e3, window_s=3 * window_step / 1e3,
                              window_basis="launches")
    index = tuple(range(14, 54))
    sample = StepSample(index=index, wall_s=tuple((host_ms if i < 24 else 10.0) / 1e3 for i in index),
                        status=("steady",) * 40, device_wall_s=(0.01,) * 40)
    return make_record(
        device="cuda",
        steps=Steps(count=40, median_s=0.01, total=54, warmup=1, profiled=13, breakdown_basis="device",
                    clock="device", host_median_s=0.01, sample=sample, device_median_s=0.01),
        breakdown=Breakdown(forward=0.4, backward=0.5, optimizer=0.1),
        op_profile=OpProfile(window=Window(7, 9), steps=3, ops=300, ops_per_step=100, kernels=timeline),
    )


def test_a_gpu_busy_in_the_steady_step_is_compute_bound_though_its_profiled_steps_were_idle() -> None:
    # given 9.5 ms of kernels in a 10 ms step, though the profiler's slower launches left its steps half idle
    verdict = classify(gpu_loop(kernels_ms=9.5, waited_ms=0.0, host_ms=6.0))
    assert verdict.bound == "compute" and verdict.confidence > 0.9
    assert any("95% of the steady step" in fact for fact in verdict.evidence)
    assert any("in the profiled steps themselves the GPU was busy 50%" in fact for fact in verdict.evidence)


def test_a_gpu_partly_busy_and_partly_waiting_for_launches_gets_the_larger_side_and_names_the_other() -> None:
    # given kernels 6 ms of a 10 ms step, the GPU waiting 3.5 ms for the host, which queues a step in 3 ms when it
    # runs ahead: free kernels would leave the step at the host's 3 ms, 30% shorter; free launches, 35%
    launch = classify(gpu_loop(kernels_ms=6.0, waited_ms=3.5, host_ms=3.0))
    assert (launch.bound, launch.confidence) == ("cpu-launch", 0.5)
    assert any(fact.startswith("partly compute-bound: kernels run 60% of the step") for fact in launch.evidence)
    # and with kernels of 6.5 ms and a wait of 2.5, the kernels hold more of the step
    compute = classify(gpu_loop(kernels_ms=6.5, waited_ms=2.5, host_ms=3.0))
    assert (compute.bound, compute.confidence) == ("compute", 0.5)
    assert any(fact.startswith("partly launch-bound: the GPU waits 25% of the step") for fact in compute.evidence)
    # and static graphs are advised for the launch side of either
    recommendations, _ = evaluate(gpu_loop(kernels_ms=6.5, waited_ms=2.5, host_ms=3.0))
    assert "static-graph" in {r.id for r in recommendations}


def test_a_gpu_waiting_for_a_host_that_cannot_go_faster_is_launch_bound_whatever_its_kernels_take() -> None:
    # given kernels 6 ms of the step, and a host that takes 9 ms to queue a step even running ahead
    verdict = classify(gpu_loop(kernels_ms=6.0, waited_ms=3.5, host_ms=9.0))
    assert verdict.bound == "cpu-launch"
    assert any("yet were they free it would be no shorter" in fact for fact in verdict.evidence)
