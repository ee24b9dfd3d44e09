"""Activation checkpointing: its checkpointed calls counted and their recomputation in backward timed by step
(``collect.steps.recompute``), read over the steady steps, and ``skip-activation-checkpointing`` where the run has
the memory to keep what it recomputes (tests/fixtures/records/hf_gc.py: a tiny GPT-2 under HF's
Trainer with ``gradient_checkpointing=True``)."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
import torch
import torch.utils.checkpoint
from torch import nn
from torch.utils.checkpoint import checkpoint  # bound before gpuscope starts, as transformers binds it

from conftest import make_record
from gpuscope.collect.captures import StepCapture
from gpuscope.collect.collectors.steps import StepsCollector
from gpuscope.collect.fixes import INSTALLERS, Applied
from gpuscope.diagnose import analyze
from gpuscope.diagnose.rules.checkpointing import skip_activation_checkpointing
from gpuscope.record import Checkpointing, Memory, RunRecord, Steps
from gpuscope.reduce.steady import summarize_capture

RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "records"
STEPS = 6


class Clock:
    """The collector's clock: it moves only while a block works, a second a call (the figures exact under any load)."""

    now = 0.0

    def __call__(self) -> float:
        return self.now


CLOCK = Clock()


class SlowBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        CLOCK.now += 1.0  # the block's work: a second, once in forward and once more when backward recomputes it
        return torch.tanh(self.linear(x))


class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(SlowBlock() for _ in range(2))
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return x


def train(reentrant: bool) -> StepCapture:
    torch.manual_seed(0)
    model = Checkpointed(reentrant)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, requires_grad=reentrant)  # (the reentrant one recomputes only for inputs needing grads)
    collector = StepsCollector(clock=CLOCK)
    collector.start(Path("."))
    try:
        for _ in range(STEPS):
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        capture = collector.stop().payload
    return capture


@pytest.mark.parametrize("reentrant", [False, True])
def test_each_checkpointed_call_and_its_recomputation_in_backward_are_counted_and_timed_by_step(
        reentrant: bool) -> None:
    capture = train(reentrant)
    assert capture.checkpointing is not None
    found, by_step, kept_to = capture.checkpointing
    assert (found.calls, found.recomputed, found.reentrant, kept_to) == (2 * STEPS, 2 * STEPS, reentrant, -1)
    assert found.called_at is not None
    assert found.called_at.code == "x = checkpoint(block, x, use_reentrant=self.reentrant)"
    assert found.called_by == ""
    # each step checkpointed 2 calls and ran both again in backward: 2 seconds of the blocks' work, not the forward's
    assert sorted(by_step) == list(range(STEPS))
    assert set(by_step.values()) == {(2.0, 2)}


def test_the_summary_reads_the_recomputation_over_the_steady_steps() -> None:
    steps = summarize_capture(train(reentrant=False)).steps
    checkpointing = steps.checkpointing
    assert checkpointing is not None and checkpointing.calls_per_step == 2 and checkpointing.recompute_s == 2.0
    # each step: 2 blocks forward and 2 again in backward, 4 seconds: the recomputation is half of it
    assert checkpointing.step_share == 0.5


def test_torch_checkpoint_is_its_own_again_after_the_session() -> None:
    generator = torch.utils.checkpoint._checkpoint_without_reentrant_generator
    function = torch.utils.checkpoint.CheckpointFunction
    train(reentrant=False)
    assert torch.utils.checkpoint._checkpoint_without_reentrant_generator is generator
    assert torch.utils.checkpoint.CheckpointFunction is function


@pytest.fixture(scope="module")
def record() -> RunRecord:
    return RunRecord.from_json(json.loads((RECORDS / "hf_gradient_checkpointing.json").read_text()))


def test_a_trainer_checkpointing_with_memory_to_spare_is_told_to_turn_it_off(record: RunRecord) -> None:
    # given: 4 GPT-2 blocks checkpointed a step, 47.7 ms of a 144 ms step recomputing them, a 41.2 MB peak of 24 GB
    (advice,) = [r for r in analyze(record).recommendations if r.id == "skip-activation-checkpointing"]
    # then: their share of the step, off by transformers' own switch (HF's Trainer measured 1.47x without it)
    assert advice.expected_gain == pytest.approx(0.326)
    assert advice.fix.startswith("model.gradient_checkpointing_disable()")
    assert advice.evidence[0] == ("transformers checkpoints 4 calls a step under hf_gc.py:21 "
                                  "`out = trainer.train()` (torch.utils.checkpoint): their forward runs again in "
                                  "backward, 47.7 ms a step, 33% of the steady steps' time")
    # 4 x (41.2 MB - 3.75 MB of parameters - 7.5 MB of Adam's state): the activations kept, at most
    assert advice.evidence[1].startswith("kept instead, their activations would take at most 119.8 MB")


def with_checkpointing(record: RunRecord, **changes: object) -> RunRecord:
    assert record.steps.checkpointing is not None
    steps = dataclasses.replace(record.steps, checkpointing=dataclasses.replace(record.steps.checkpointing, **changes))
    return dataclasses.replace(record, steps=steps)


def test_the_script_checkpointing_itself_is_told_at_its_line(record: RunRecord) -> None:
    site = dataclasses.replace(record.steps.checkpointing.called_at, file="train.py", line=33,  # type: ignore
                               code="x = checkpoint(block, x, use_reentrant=False)")
    finding = skip_activation_checkpointing(with_checkpointing(record, called_by="", called_at=site))
    assert finding is not None and finding.fix == (
        "train.py:33: call the checkpointed function directly instead of `x = checkpoint(block, x, "
        "use_reentrant=False)` (checkpoint(fn, *args) -> fn(*args)), or checkpoint fewer of its calls")


def test_no_advice_where_the_memory_would_not_hold_what_is_recomputed(record: RunRecord) -> None:
    memory = record.memory
    assert memory is not None
    # 119.8 MB kept at most, against 200 MB free: over half of it
    tight = dataclasses.replace(record, memory=dataclasses.replace(memory, headroom_bytes=200_000_000))
    assert skip_activation_checkpointing(tight) is None
    assert skip_activation_checkpointing(dataclasses.replace(record, memory=None)) is None


def test_no_advice_where_the_recomputation_is_small_or_untimed(record: RunRecord) -> None:
    assert skip_activation_checkpointing(with_checkpointing(record, step_share=0.08, recompute_s=0.0115)) is None
    # a CUDA run: autograd's device threads recompute, and the host's time would not be the device's
    assert skip_activation_checkpointing(with_checkpointing(record, step_share=None, recompute_s=None)) is None


def test_a_gpu_run_is_not_checked_and_says_why(record: RunRecord) -> None:
    from gpuscope.diagnose.rules import evaluate

    _, checks = evaluate(dataclasses.replace(record, device="cuda"))
    assert checks["skip-activation-checkpointing"].status == "not-checked"
    assert checks["skip-activation-checkpointing"].reason.startswith("a GPU run: activation checkpointing's "
                                                                     "recomputation runs on autograd's device threads")
    _, checks = evaluate(dataclasses.replace(record, memory=None))
    assert checks["skip-activation-checkpointing"].reason.startswith("memory was not measured")
    # a GPU run that checkpointed nothing is clear of it
    steps = dataclasses.replace(record.steps, checkpointing=None)
    _, checks = evaluate(dataclasses.replace(record, device="cuda", steps=steps))
    assert checks["skip-activation-checkpointing"].status == "clear"


def test_a_run_without_checkpointing_is_clear() -> None:
    record = make_record(steps=Steps(count=50, median_s=0.1, total=60, source="optimizer"),
                         memory=Memory(peak_bytes=10**8, headroom_bytes=10**10))
    assert skip_activation_checkpointing(record) is None
    assert Checkpointing().calls == 0


def test_the_trial_calls_the_checkpointed_function_directly_however_it_is_bound() -> None:
    applied = Applied("skip-activation-checkpointing")
    assert INSTALLERS["skip-activation-checkpointing"](torch, {}, applied, None)  # type: ignore[arg-type]
    try:
        # transformers binds it when its model turns checkpointing on: functools.partial(checkpoint, **kwargs)
        bound = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
        calls: list[torch.Tensor] = []
        block = SlowBlock()
        x = torch.randn(4, 8)
        out = bound(lambda t: calls.append(t) or block(t), x)
        out.sum().backward()
        assert len(calls) == 1  # run once, in forward: nothing recomputed in backward
        assert out.grad_fn is not None and out.grad_fn.name() == "TanhBackward0"
    finally:
        applied.remove()
    assert torch.utils.checkpoint.checkpoint is not bound.func
