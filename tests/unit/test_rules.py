"""Diagnosis rules on hand-built records: each fires on its signal with its evidence, stays clear without it,
and says "not checked" when an input it needs was not collected."""

from __future__ import annotations

import dataclasses
import re

import pytest

from conftest import ROOT, make_record
from gpuscope.diagnose.rules import RULES, Finding, evaluate
from gpuscope.diagnose.speed import what_if
from gpuscope.record import (
    Breakdown,
    CallSite,
    Calibration,
    CollectorStatus,
    KernelTimeline,
    Loader,
    OpProfile,
    ProbabilityLoss,
    RunMeta,
    SpeedOfLight,
    Steps,
    Verdict,
)


def contract_ids() -> set[str]:
    """The recommendation ids of the interface (docs/recommendation-ids.md): the contract's and gpuscope's additions."""
    section = (ROOT / "docs" / "recommendation-ids.md").read_text().split("## Recommendation ids", 1)[1]
    return set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.M))


def cpu_run(data_wait: float = 0.02, workers: int = 0, ops_per_step: float = 3600, elementwise: float = 0.1,
            median_s: float = 0.003, batch: int = 2):
    ops = int(ops_per_step * 3)
    return make_record(
        device="cpu",
        steps=Steps(count=40, median_s=median_s, total=50, warmup=1, profiled=9),
        breakdown=Breakdown(data_wait=data_wait, forward=1 - data_wait),
        loaders=(Loader(dataset="Images", num_workers=workers, batch_size=batch, batches=50, wait_s=1.0),),
        op_profile=OpProfile(steps=3, ops=ops, ops_per_step=ops_per_step, mean_op_s=1e-6,
                             calls_by_kind={"elementwise": int(ops * elementwise), "other": ops - int(ops * elementwise)}),
        calibration=Calibration(op_overhead_s=0.6e-6, ops_per_step=379, step_s=2.3e-4),
        meta=RunMeta(cpu_count=8),
    )


def cuda_run(busy: float, host_wait: float, tensor_core: float = 0.0, pageable: int = 0, pinned: bool = False):
    return make_record(
        device="cuda",
        steps=Steps(count=40, median_s=0.01, total=50, warmup=1, profiled=9, breakdown_basis="device"),
        loaders=(Loader(dataset="Images", num_workers=4, batch_size=64, pin_memory=pinned, batches=50, wait_s=0.1),),
        op_profile=OpProfile(steps=3, ops=900, ops_per_step=300, mean_op_s=5e-6, kernels=KernelTimeline(
            busy_fraction=busy, idle_host_wait_fraction=host_wait, idle_other_fraction=1 - busy - host_wait,
            kernels=300, kernels_per_step=100, mean_kernel_s=5e-6, tensor_core_share=tensor_core,
            h2d_copies=3, h2d_pageable_copies=pageable, h2d_copy_s=0.003)),
        meta=RunMeta(cpu_count=8),
    )


def fired(record) -> dict[str, object]:
    recommendations, _ = evaluate(record)
    return {r.id: r for r in recommendations}


# one positive and one negative record per rule
CASES = [
    ("more-dataloader-workers", cpu_run(data_wait=0.6, median_s=0.2, ops_per_step=100), cpu_run(data_wait=0.02)),
    ("more-dataloader-workers", cpu_run(data_wait=0.6, median_s=0.2, ops_per_step=100),
     cpu_run(data_wait=0.6, median_s=0.2, workers=8)),
    ("larger-batch", cpu_run(), cpu_run(ops_per_step=100, median_s=0.25)),
    ("jit-fusion", cpu_run(elementwise=0.5), cpu_run(elementwise=0.1)),
    ("static-graph", cuda_run(busy=0.2, host_wait=0.7), cuda_run(busy=0.9, host_wait=0.05)),
    ("mixed-precision", cuda_run(busy=0.9, host_wait=0.05, tensor_core=0.1),
     cuda_run(busy=0.9, host_wait=0.05, tensor_core=0.8)),
    ("pin-memory", cuda_run(busy=0.5, host_wait=0.1, pageable=3), cuda_run(busy=0.5, host_wait=0.1, pinned=True)),
]


@pytest.mark.parametrize(("rule_id", "positive", "negative"), CASES, ids=[c[0] for c in CASES])
def test_each_rule_fires_on_its_signal_and_only_then(rule_id, positive, negative) -> None:
    recommendation = fired(positive).get(rule_id)
    assert recommendation is not None
    # every fact carries the number it rests on, or the setting (name=value) it reads
    assert recommendation.evidence and all(re.search(r"\d|\w=\w", fact) for fact in recommendation.evidence)
    assert recommendation.fix
    assert recommendation.expected_gain is None or 0 < recommendation.expected_gain <= 1
    assert rule_id not in fired(negative)
    assert evaluate(negative)[1][rule_id].status == "clear"


def test_mixed_precision_on_a_loss_on_probabilities_says_autocast_refuses_it_and_moves_it_onto_the_logits() -> None:
    # given: a busy GPU off its Tensor Cores whose step computes F.binary_cross_entropy at train.py:7
    site = CallSite("train.py", 7, "main", "loss = F.binary_cross_entropy(model(x), y)", 1)
    plain = cuda_run(busy=0.9, host_wait=0.05, tensor_core=0.1)
    run = dataclasses.replace(plain, speed_of_light=SpeedOfLight(
        flops_per_step=10**9, probability_loss=ProbabilityLoss("float32", site)))
    # when
    recommendation = fired(run)["mixed-precision"]
    # then: the autocast the fix adds would raise on that line: the fix says to compute the loss on the logits there
    assert recommendation.evidence[-1] == ("the step computes BCELoss on probabilities at train.py:7 `loss = "
                                           "F.binary_cross_entropy(model(x), y)`: torch.autocast('cuda') refuses it "
                                           "(RuntimeError: unsafe to autocast)")
    assert recommendation.fix.splitlines() == [
        fired(plain)["mixed-precision"].fix,
        "train.py:7 `loss = F.binary_cross_entropy(model(x), y)`: compute the loss on the logits before autocasting: "
        "nn.BCEWithLogitsLoss() (F.binary_cross_entropy_with_logits) in place of the sigmoid and nn.BCELoss"]
    assert recommendation.expected_gain == fired(plain)["mixed-precision"].expected_gain


def test_the_worker_count_suggested_is_measured_and_capped_by_the_cores() -> None:
    # a batch takes 0.6 x 200 = 120 ms to prepare; the model uses one every 80 ms: 2 workers keep up
    recommendation = fired(cpu_run(data_wait=0.6, median_s=0.2, ops_per_step=100))["more-dataloader-workers"]
    assert recommendation.fix == "DataLoader(..., num_workers=2, persistent_workers=True)"
    assert recommendation.expected_gain == pytest.approx(0.6)


def test_without_the_probe_on_a_cpu_run_the_worker_count_counts_the_cores_the_workers_take() -> None:
    # given: 2 cores and torch's 2 intra-op threads; a batch takes 0.75 x 40 = 30 ms to build in the main process,
    # and the step computes for 10 ms on both threads (20 ms of CPU)
    record = cpu_run(data_wait=0.75, median_s=0.04, ops_per_step=100)
    record = dataclasses.replace(record, meta=RunMeta(cpu_count=2, torch_threads=2))
    # when
    recommendation = fired(record)["more-dataloader-workers"]
    # then: 2 workers take both cores; the step's 50 ms of CPU work over 2 cores is 25 ms, its compute on the one
    # thread the fix keeps 20 ms: a 25 ms step, 0.375 of the 40 ms saved (the cores alone would promise 0.6)
    assert recommendation.fix == ("DataLoader(..., num_workers=2, persistent_workers=True)  and  "
                                  "torch.set_num_threads(1)")
    assert recommendation.expected_gain == pytest.approx(1 - 0.025 / 0.04)
    assert any("predicted step 25.0 ms, 1.60x faster" in fact for fact in recommendation.evidence)
    # the verdict's what-if says the same
    estimate = what_if(record, Verdict("data-loading", 0.9, ("75% 1",)))
    assert estimate is not None and estimate.step_s == pytest.approx(0.025)
    assert "torch.set_num_threads(1)" in estimate.explanation
    # where the compute is the larger part, workers only slow the step: nothing is recommended, and the what-if
    # is the step without its wait (cheaper batches), saying how much slower workers would make it (a 25 ms build,
    # 30 ms of compute on 2 threads: one worker leaves one thread, 60 ms)
    heavy = dataclasses.replace(cpu_run(data_wait=0.45, median_s=0.055, ops_per_step=100),
                                meta=RunMeta(cpu_count=2, torch_threads=2))
    assert "more-dataloader-workers" not in fired(heavy)
    cheaper = what_if(heavy, Verdict("data-loading", 0.9, ("45% 1",)))
    assert cheaper is not None and cheaper.step_s == pytest.approx(0.055 * 0.55)
    assert cheaper.explanation.startswith("with batches cheap enough never to be waited for, the step's compute: "
                                          "workers do not hide the loading on this machine (with 1 DataLoader")
    assert cheaper.explanation.endswith(": 60.5 ms)")


def test_the_larger_batch_fix_goes_on_the_loaders_line_or_where_a_loop_without_one_builds_its_batches() -> None:
    site = CallSite(file="train.py", line=41, code="loader = DataLoader(data, batch_size=2)")
    with_line = dataclasses.replace(cpu_run(), loaders=(dataclasses.replace(cpu_run().loaders[0], created_at=site),))
    assert fired(with_line)["larger-batch"].fix == \
        "DataLoader(..., batch_size=4)  # train.py:41, then retune the learning rate and warm-up"
    trainer = dataclasses.replace(with_line, loaders=(dataclasses.replace(with_line.loaders[0],
                                                                          created_by="transformers"),))
    assert fired(trainer)["larger-batch"].fix.startswith(
        "TrainingArguments(..., per_device_train_batch_size=4)  # transformers, called from train.py:41")
    # a loop slicing its batches out of a tensor: no DataLoader to name
    assert fired(dataclasses.replace(cpu_run(), loaders=()))["larger-batch"].fix == (
        "build each step's batch from twice the samples where the script makes it (no DataLoader was seen)  "
        "# then retune the learning rate and warm-up")
    # a batch sampler the script passed: the sampler's batch size (DataLoader's batch_size= would raise beside it)
    sampled = dataclasses.replace(with_line, loaders=(dataclasses.replace(with_line.loaders[0],
                                                                          batch_sampler="BucketSampler"),))
    assert fired(sampled)["larger-batch"].fix == ("DataLoader(..., batch_sampler=BucketSampler(..., batch_size=4))  "
                                                  "# train.py:41, then retune the learning rate and warm-up")
    # batches the dataset makes (batch_size None): that loader's line, not "no DataLoader was seen"
    unbatched = dataclasses.replace(with_line, loaders=(dataclasses.replace(with_line.loaders[0], batch_size=None),))
    assert fired(unbatched)["larger-batch"].fix == (
        "DataLoader(...)  # twice the samples in each batch its dataset makes (batch_size=None); train.py:41, "
        "then retune the learning rate and warm-up")


def test_a_model_run_sample_by_sample_before_each_backward_is_told_to_stack_its_samples_not_to_batch_more() -> None:
    # given: a REINFORCE loop (pytorch/examples' style), its policy called once for each environment step, 60 times
    # for each backward(): more samples an update would be more forwards, as many ops a sample (measured: two
    # episodes an update took as long per environment step as one)
    rollout = dataclasses.replace(cpu_run(), loaders=(), steps=dataclasses.replace(
        cpu_run().steps, forwards_per_backward=60.4))
    launch = fired(rollout)["larger-batch"]
    assert launch.evidence[-1] == ("the model runs forward 60 times for each backward(): sample by sample, its op "
                                   "count grows with the samples")
    assert launch.fix.startswith("run 2 environments (or sequences) side by side and call the model once on their "
                                 "stacked inputs, instead of once for each (60 forwards for each backward() here)")
    assert launch.expected_gain == fired(cpu_run())["larger-batch"].expected_gain
    # a loop of one forward a backward (a GAN's two models: about 1.3, under the bar) keeps the batch advice, and
    # so does a loader's batch stepped through time (a recurrent cell called once a token on a batch of sequences)
    for passes in (1.3, 35):
        batched = dataclasses.replace(cpu_run(), steps=dataclasses.replace(cpu_run().steps,
                                                                           forwards_per_backward=passes))
        assert fired(batched)["larger-batch"].fix.startswith("DataLoader(..., batch_size=4)")


def restarting_run(persistent: bool = False, restart_wait_s: float = 9.0):
    """Recorded: an IterableDataset with two spawn workers over 3 epochs of 126 steps, 19 ms a steady step; each new
    epoch's iterator started the workers again, and the loop waited 4.5 s for its first batch."""
    loader = Loader(dataset="SignalStream", num_workers=2, batch_size=32, batches=378, wait_s=16.0,
                    start_method="spawn", persistent_workers=persistent, restarts=2, restart_wait_s=restart_wait_s,
                    created_at=CallSite(file="iterable.py", line=71, code="loader = DataLoader(ds, ...)"))
    return make_record(device="cpu", steps=Steps(count=360, median_s=0.019, mean_s=0.02, total=378, warmup=1,
                                                 profiled=9, outliers=8),
                       breakdown=Breakdown(data_wait=0.86, forward=0.14), loaders=(loader,), meta=RunMeta(cpu_count=2))


def test_workers_started_again_each_epoch_are_told_to_persist_with_the_time_it_costs() -> None:
    finding = fired(restarting_run())["persistent-workers"]
    # 9 s of restarts against 376 steps of 20 ms and those 9 s: 54% of the run's step time
    assert finding.expected_gain == pytest.approx(9.0 / (0.02 * 376 + 9.0), abs=0.01)
    assert finding.evidence[0] == ("the SignalStream loader started its 2 spawn workers again 2 times after the first "
                                   "(a new iterator each epoch), and the loop waited 9.00 s in all for the first batch "
                                   "after each restart")
    assert finding.fix == "DataLoader(..., persistent_workers=True)  # iterable.py:71"
    # persistent workers, or restarts that cost nothing worth a line, are not told
    assert "persistent-workers" not in fired(restarting_run(persistent=True))
    assert "persistent-workers" not in fired(restarting_run(restart_wait_s=0.001))


def test_a_loader_the_script_builds_again_each_epoch_is_told_to_be_built_once_as_well() -> None:
    # given: the same workers' restarts, from a DataLoader the script's line builds anew each of 3 epochs (a
    # semi-supervised loop zipping two loaders built inside its `for` statement): persistent_workers alone keeps
    # nothing, the loader being new each time
    run = restarting_run()
    rebuilt = dataclasses.replace(run.loaders[0], created_at=dataclasses.replace(run.loaders[0].created_at, calls=3))
    finding = fired(dataclasses.replace(run, loaders=(rebuilt,)))["persistent-workers"]
    assert finding.fix == "DataLoader(..., persistent_workers=True), built once before the loop over epochs  # iterable.py:71"
    assert finding.evidence[-1] == ("that line built 3 DataLoaders over it, a new one each epoch: each starts its "
                                    "workers afresh, persistent_workers or not")


def test_every_loader_that_started_its_workers_again_is_named_where_the_gain_counts_them_all() -> None:
    # given: a training loader and a validation loader (train.py:23, :24), each starting its 2 workers again for
    # each epoch's iterator; the gain is both loaders' restart waits
    run = restarting_run()
    training = dataclasses.replace(run.loaders[0], restart_wait_s=3.0,
                                   created_at=CallSite(file="train.py", line=23, code="train_loader = DataLoader(...)"))
    validation = dataclasses.replace(run.loaders[0], dataset="Held", restart_wait_s=6.0,
                                     created_at=CallSite(file="train.py", line=24, code="val_loader = DataLoader(...)"))
    finding = fired(dataclasses.replace(run, loaders=(training, validation)))["persistent-workers"]
    # then: the fix goes on both lines, the larger wait's first, and the evidence says the other restarted too
    assert finding.fix == "DataLoader(..., persistent_workers=True)  # train.py:24, train.py:23"
    assert finding.evidence[-1] == ("the SignalStream loader built at train.py:23 started its workers again 2 times "
                                    "too (3.00 s)")


def test_an_evaluation_loader_built_again_for_each_pass_is_told_so() -> None:
    # given: the Transformers Trainer's evaluation loader, its 2 workers started again for each pass, every
    # batch of it an evaluation pass's
    run = restarting_run()
    evaluation = dataclasses.replace(run.loaders[0], eval_batches=run.loaders[0].batches)
    finding = fired(dataclasses.replace(run, loaders=(evaluation,)))["persistent-workers"]
    assert "(a new iterator each evaluation pass)" in finding.evidence[0]
    # and a loader iterated for both says both
    both = dataclasses.replace(run.loaders[0], eval_batches=40)
    assert "(a new iterator each epoch or evaluation pass)" in \
        fired(dataclasses.replace(run, loaders=(both,)))["persistent-workers"].evidence[0]


def test_recommendations_come_most_valuable_first() -> None:
    recommendations, _ = evaluate(cpu_run(elementwise=0.5))
    gains = [r.expected_gain for r in recommendations]
    assert [r.id for r in recommendations] == ["larger-batch", "jit-fusion"]
    assert gains == sorted(gains, reverse=True)


def test_a_rule_whose_measured_gain_rounds_to_nothing_is_not_recommended_and_says_why() -> None:
    # given: pageable copies from a loader without pin_memory, but 0.03 ms of them over three 10 ms steps
    record = cuda_run(busy=0.9, host_wait=0.05, pageable=3)
    tiny = dataclasses.replace(record.op_profile.kernels, h2d_copy_s=3e-5)
    record = dataclasses.replace(record, op_profile=dataclasses.replace(record.op_profile, kernels=tiny))
    # when
    recommendations, checks = evaluate(record)
    # then
    assert "pin-memory" not in [r.id for r in recommendations]
    assert checks["pin-memory"].status == "clear"
    assert checks["pin-memory"].reason.startswith("its measured gain, 0.1% of the step, is too small to recommend")


def test_a_rule_whose_input_was_not_collected_is_not_checked_and_says_why() -> None:
    record = make_record(collectors={"torch-trace": CollectorStatus("unavailable", "turned off (--trace-steps 0)", field="op_profile")})
    _, checks = evaluate(record)
    assert checks["larger-batch"].status == "not-checked"
    assert checks["larger-batch"].reason == "no op-level profile (torch-trace: turned off (--trace-steps 0))"
    assert checks["static-graph"].reason == "a CPU-only run: this is about GPU work"


def test_every_contract_id_has_exactly_one_rule() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    # the contract's 15, reduce-communication, cpu-fp32-over-low-precision, persistent-workers,
    # file-system-sharing, fused-optimizer, float32-over-float64, cheaper-batches, split-iterable-stream,
    # skip-distribution-checks, tune-host-allocator, cpu-float32-attention, balance-ranks, fix-memory-leak,
    # reduce-memory, cache-frozen-outputs, skip-activation-checkpointing, skip-dropout,
    # save-checkpoints-less-often, evaluate-less-often, cpu-mixed-precision, fewer-threads-per-process and
    # fewer-torch-threads (docs/contract-additions.md)
    assert len(contract_ids()) == 37
    assert {"reduce-communication", "cpu-fp32-over-low-precision", "persistent-workers", "file-system-sharing",
            "fused-optimizer", "float32-over-float64", "cheaper-batches", "split-iterable-stream",
            "skip-distribution-checks", "tune-host-allocator", "cpu-float32-attention",
            "balance-ranks", "fix-memory-leak", "reduce-memory", "cache-frozen-outputs",
            "skip-activation-checkpointing", "skip-dropout", "save-checkpoints-less-often",
            "evaluate-less-often", "cpu-mixed-precision", "fewer-threads-per-process",
            "fewer-torch-threads"} <= contract_ids()
    assert set(ids) == contract_ids()


def test_every_rule_says_why_and_how_to_fix() -> None:
    for r in RULES:
        assert r.title and r.fix, r.id
        assert r.check.__doc__ and "Signal:" in r.check.__doc__ and "Fix:" in r.check.__doc__, r.id


@pytest.mark.parametrize("evidence", [(), ("the loader is slow",)])
def test_a_finding_without_measured_evidence_cannot_be_made(evidence) -> None:
    with pytest.raises(ValueError, match="evidence"):
        Finding(0.1, evidence)
