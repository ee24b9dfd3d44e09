"""The steps collector on real torch modules in this process: which modules it times the forward of (the
outermost module holding the parameters, whichever marker defines the steps), and whose events it counts."""

from __future__ import annotations

import copy
import gc
import inspect
import os
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from gpuscope.collect.collectors.steps import StepsCollector
from gpuscope.collect.framework.base import CollectorResult
from gpuscope.collect.steps.forward_modules import FETCH_AHEAD
from timed_modules import Slow


class Net(nn.Module):
    """A model whose own forward does work besides its children's (as word_language_model's does)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(20, 8)
        self.decoder = nn.Linear(8, 20)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.decoder(torch.tanh(self.encoder(tokens))), dim=-1)


def run_hand_written_loop(steps: int) -> CollectorResult:
    """A loop updating its parameters by hand, its batch sliced from a tensor: backward() is its only marker."""
    collector = StepsCollector()
    torch.manual_seed(0)
    model = Net()
    tokens = torch.randint(20, (16,))
    collector.start(Path("."))
    try:
        for _ in range(steps):
            model.zero_grad()
            loss = nn.functional.nll_loss(model(tokens), tokens)
            loss.backward()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.1)
    finally:
        result = collector.stop()
    return result


def test_a_loop_with_no_optimizer_times_the_forward_on_the_model_itself() -> None:
    result = run_hand_written_loop(steps=8)
    capture = result.payload
    assert capture.source == "backward" and capture.count == 8
    assert any(note.startswith("forward timed on root modules: Net ") for note in result.notes), result.notes
    # no step was lost to a search for the forward: the hooked module's forward ran in every step
    assert not any(r.profiled for r in capture.records)
    assert all(r.phases_s["forward"] > 0 for r in capture.records[2:])



def test_the_note_names_the_timed_model_though_the_function_that_trained_it_has_returned() -> None:
    # given: a script whose train() builds its model and trains it, as pytorch/examples' fast_neural_style does
    collector = StepsCollector()

    def train() -> None:
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        tokens = torch.randint(20, (16,))
        for _ in range(6):
            optimizer.zero_grad()
            nn.functional.nll_loss(model(tokens), tokens).backward()
            optimizer.step()

    collector.start(Path("."))
    try:
        train()
        gc.collect()  # the model is gone when the run ends
    finally:
        result = collector.stop()
    # then: the note still says which model's forward was timed (it read "root modules: " and no name)
    assert any(note.startswith("forward timed on root modules: Net ") for note in result.notes), result.notes

def test_a_gan_loop_times_the_forward_of_both_models_though_its_second_optimizer_steps_later() -> None:
    # given: a DCGAN-style loop: the discriminator's optimizer steps first, then the generator's, each step; the
    # generator's forward takes 20 ms, the discriminator's 5 ms (three calls)
    collector = StepsCollector()
    generator, discriminator = Slow(0.02), Slow(0.005)
    opt_d = torch.optim.SGD(discriminator.parameters(), lr=0.01)
    opt_g = torch.optim.SGD(generator.parameters(), lr=0.01)
    real = torch.randn(8, 4)
    collector.start(Path("."))
    try:
        for _ in range(8):
            discriminator.zero_grad()
            fake = generator(torch.randn(8, 4))
            (discriminator(real).mean() - discriminator(fake.detach()).mean()).backward()
            opt_d.step()
            generator.zero_grad()
            discriminator(fake).mean().backward()
            opt_g.step()
    finally:
        result = collector.stop()
    capture = result.payload
    # then: both models are roots, though the generator's optimizer first stepped after they were looked for;
    # from then on the generator's 20 ms are forward, not "other"
    assert any(note.startswith("forward timed on root modules: Slow, Slow ") for note in result.notes), result.notes
    timed = [r for r in capture.records if not r.profiled and r.index >= 3]
    assert timed and all(r.phases_s["forward"] >= 0.035 for r in timed), [r.phases_s for r in timed]
    assert all(r.wall_s - sum(r.phases_s.values()) < 0.01 for r in timed), [r.phases_s for r in timed]  # "other"


class Pair(nn.Module):
    """A LightningModule's GAN: the generator and the discriminator held by one module whose own forward never runs
    (Lightning calls its ``training_step``)."""

    def __init__(self) -> None:
        super().__init__()
        self.generator, self.discriminator = Slow(0.02), Slow(0.005)


def test_a_discriminator_whose_optimizer_steps_second_in_a_module_holding_both_is_trained_not_frozen() -> None:
    # given: Lightning's GAN tutorial order: the generator's optimizer steps first, then the discriminator's, each
    # step, both models in one module whose forward is never called
    collector = StepsCollector()
    pair = Pair()
    opt_g = torch.optim.SGD(pair.generator.parameters(), lr=0.01)
    opt_d = torch.optim.SGD(pair.discriminator.parameters(), lr=0.01)
    real = torch.randn(8, 4)
    collector.start(Path("."))
    try:
        for _ in range(8):
            fake = pair.generator(torch.randn(8, 4))
            opt_g.zero_grad()
            pair.discriminator(fake).mean().backward()
            opt_g.step()
            opt_d.zero_grad()
            (pair.discriminator(real).mean() - pair.discriminator(fake.detach()).mean()).backward()
            opt_d.step()
    finally:
        result = collector.stop()
    capture = result.payload
    # then: the discriminator is not taken for a frozen model (it read "Slow (20 parameters, none trained)", its
    # three calls "other"), and its forward is the step's forward with the generator's
    assert capture.frozen_models == (), capture.frozen_models
    timed = [r for r in capture.records if not r.profiled and r.index >= 4]
    assert timed and all(r.phases_s["forward"] >= 0.03 for r in timed), [r.phases_s for r in timed]


class SelfTrainedLayer(nn.Linear):
    """A layer that trains itself, calling its own ``forward`` (pytorch/examples' forward-forward ``Layer``): its
    forward takes a known time (a sleep)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.01)
        return torch.relu(x @ self.weight.T + self.bias)


def test_a_forward_called_directly_is_timed_as_the_forward_and_its_method_restored_after() -> None:
    # given: forward-forward's loop: two forward() calls a step, called directly, not as module calls
    collector = StepsCollector()
    layer = SelfTrainedLayer(4, 4)
    own = SelfTrainedLayer.forward
    optimizer = torch.optim.Adam(layer.parameters())
    x = torch.randn(8, 4)
    collector.start(Path("."))
    try:
        for _ in range(8):
            loss = layer.forward(x).pow(2).mean() - layer.forward(-x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        # (the wrapper keeps the method's name and signature: transformers reads forward's parameters)
        assert SelfTrainedLayer.forward.__name__ == "forward"
        assert list(inspect.signature(layer.forward).parameters) == ["x"]
    finally:
        result = collector.stop()
    capture = result.payload
    # then: once its module call is found never to run, its forward is timed where it is called: its 20 ms a step
    # are forward, not "other"
    assert any("SelfTrainedLayer (forward called directly, not as a module call)" in note
               for note in result.notes), result.notes
    timed = [r for r in capture.records if not r.profiled and r.index >= 4]
    assert timed and all(r.phases_s["forward"] >= 0.02 for r in timed), [r.phases_s for r in timed]
    # and the class's own forward is back once the collector stops
    assert SelfTrainedLayer.forward is own and not getattr(nn.Linear.forward, "_gpuscope_timed", False)


def test_a_module_called_as_usual_keeps_its_forward_method_unwrapped() -> None:
    collector = StepsCollector()
    layer = SelfTrainedLayer(4, 4)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.01)
    collector.start(Path("."))
    try:
        for _ in range(4):
            optimizer.zero_grad()
            layer(torch.randn(8, 4)).sum().backward()
            optimizer.step()
        assert not getattr(SelfTrainedLayer.forward, "_gpuscope_timed", False)  # torch.jit.script would see it
    finally:
        result = collector.stop()
    assert all(r.phases_s["forward"] >= 0.01 for r in result.payload.records[2:] if not r.profiled)


class Wrapper(nn.Module):
    """A data-parallel wrapper as DistributedDataParallel is one: the model as its one child ``module``, no parameters
    of its own."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.module(*args)


def test_an_evaluation_that_calls_the_wrapped_model_past_its_wrapper_is_seen_and_the_forward_counted_once() -> None:
    # given: a DDP-style script that trains through the wrapper and, every 4th step, evaluates with model.module
    # under no_grad (on rank 0 alone, in a real job): 50 ms of evaluation
    collector = StepsCollector()
    torch.manual_seed(0)
    model = Wrapper(Slow(0.002))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    collector.start(Path("."))
    try:
        for step in range(12):
            model(torch.randn(8, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % 4 == 3:
                with torch.no_grad():
                    for _ in range(5):
                        model.module(torch.randn(8, 4))
    finally:
        result = collector.stop()
    capture = result.payload
    # then: the steps that held the evaluation are marked so (they were "other" time, and the run inconclusive),
    # the training forward through the wrapper is one forward a step, and the note names the wrapper as the root
    assert [r.index for r in capture.records if r.evaluated] == [4, 8]
    assert any(note.startswith("forward timed on root modules: Wrapper ") for note in result.notes), result.notes
    forwards, backwards = capture.passes
    assert capture.no_grad_modes == (0, 15) and forwards - 15 == backwards  # 3 evaluations of 5; one a step besides


def test_batches_fetched_ahead_for_gradient_accumulation_do_not_hide_the_models_forward() -> None:
    # given: the transformers Trainer's way with 8 accumulated batches: all of a step's batches fetched first, then a
    # forward and backward on each, then the optimizer step (the fetches define the first steps: no optimizer yet)
    collector = StepsCollector()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randint(20, (512,)), batch_size=4)
    collector.start(Path("."))
    try:
        batches = iter(loader)
        for _ in range(6):
            fetched = [next(batches) for _ in range(8)]
            for tokens in fetched:
                (nn.functional.nll_loss(model(tokens), tokens) / 8).backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        result = collector.stop()
    capture = result.payload
    # then: the model itself is timed (the fetches alone once took it for a module whose forward never runs, and
    # its children, and theirs: no forward timed at all)
    assert capture.source == "optimizer"
    assert any(note.startswith("forward timed on root modules: Net ") for note in result.notes), result.notes
    assert all(r.phases_s["forward"] > 0 for r in capture.records[1:])


def test_an_inference_loop_whose_outer_module_never_runs_times_its_inner_model_after_the_fetch_ahead() -> None:
    # given: inference over a DataLoader (no backward, no optimizer) calling the inner model of a wrapper whose own
    # forward never runs (as a LightningModule's predict_step calls self.model)
    collector = StepsCollector()
    wrapper = nn.Module()
    wrapper.model = Slow(0.002)
    loader = torch.utils.data.DataLoader(torch.randn(160, 4), batch_size=4)
    collector.start(Path("."))
    try:
        with torch.no_grad():
            for batch in loader:
                wrapper.model(batch)
    finally:
        result = collector.stop()
    capture = result.payload
    # then: the wrapper's silence counts only from FETCH_AHEAD batches on (before, a loop may be fetching a step's
    # accumulated batches); from then on the inner model is timed
    assert any(note.startswith("forward timed on the outermost modules whose forward runs: Slow")
               for note in result.notes), result.notes
    timed = [r for r in capture.records if r.index > FETCH_AHEAD + 1]
    assert len(timed) >= 10 and all(r.phases_s["forward"] > 0.001 for r in timed), [r.phases_s for r in timed]


def test_events_from_a_forked_child_or_another_thread_are_not_the_loops() -> None:
    collector = StepsCollector()
    collector.start(Path("."))
    try:
        seen_in_thread: list[bool] = []
        thread = threading.Thread(target=lambda: seen_in_thread.append(collector._loop.mine()))
        thread.start()
        thread.join()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a DataLoader worker forked from the loop's thread has the loop's thread id
            os.write(write, b"1" if collector._loop.mine() else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        seen_in_child = os.read(read, 1)
        os.close(read)
        os.close(write)
        assert collector._loop.mine() and seen_in_thread == [False] and seen_in_child == b"0"
    finally:
        collector.stop()


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_a_model_copied_saved_or_scripted_mid_run_is_as_without_gpuscope(tmp_path: Path) -> None:
    # given: a loop that keeps the best model so far (copy.deepcopy), saves the whole model (torch.save) and scripts
    # it for deployment (torch.jit.script), while its forward is timed
    collector = StepsCollector()
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randint(20, (16,))
    collector.start(Path("."))
    try:
        for _ in range(6):
            optimizer.zero_grad()
            nn.functional.nll_loss(model(tokens), tokens).backward()
            optimizer.step()
        snapshot = model(tokens).detach()
        best = copy.deepcopy(model)
        torch.save(model, tmp_path / "model.pt")
        scripted = torch.jit.script(model)
        for _ in range(3):  # and trains on
            optimizer.zero_grad()
            nn.functional.nll_loss(model(tokens), tokens).backward()
            optimizer.step()
            best(tokens)  # the copy's forward is no part of the step
    finally:
        result = collector.stop()
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    # then: the copies hold no hook of any kind and compute what the model did when they were made (the scripted
    # one shares its parameters)
    for twin, expected in ((best, snapshot), (loaded, snapshot), (scripted, model(tokens))):
        assert not twin._forward_pre_hooks and not twin._forward_hooks
        assert torch.equal(twin(tokens), expected)
    assert any(note.startswith("forward timed on root modules: Net ") for note in result.notes)
    # the forward was timed in the steps before the copies and in those after them
    steps = result.payload.records
    assert len(steps) == 9 and all(r.phases_s["forward"] > 0 for r in steps[1:]), steps
    assert type(model).__call__ is nn.Module.__call__, "after the run, calling a module is torch's own again"
