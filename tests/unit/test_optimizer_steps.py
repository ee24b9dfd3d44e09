"""The steps an optimizer defines, as the collectors that follow the steps hear of them: an optimizer that calls its
closure many times a step (LBFGS evaluates the model up to 25 times in one ``optimizer.step(closure)``) makes one
step of them, and a loop accumulating gradients over many batches before its first ``optimizer.step()`` is not
told of those batches as steps (each profiling window would be spent on single batches of the warm-up step)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from gpuscope.collect.collectors.steps import StepsCollector
from gpuscope.collect.steps.optimizer_watch import HOLD_STEPS


def following(tmp_path: Path) -> tuple[StepsCollector, list[int]]:
    """A started steps collector, and the indices a collector following its steps hears, in order."""
    collector = StepsCollector()
    collector.start(tmp_path)
    heard: list[int] = []
    collector.add_step_listener(heard.append)
    return collector, heard


def test_each_lbfgs_step_is_one_step_whatever_its_closure_calls(tmp_path: Path) -> None:
    # given: LBFGS, four passes of its closure (forward and backward) in each of six steps
    collector, heard = following(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=4, tolerance_grad=0, tolerance_change=0)
    inputs, targets = torch.randn(16, 4), torch.randn(16, 1)
    passes = 0

    def closure() -> torch.Tensor:
        nonlocal passes
        passes += 1
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        return loss

    # when
    for _ in range(6):
        optimizer.step(closure)
    capture = collector.stop().payload
    # then: six steps, counted by the optimizer from the first, each with its passes' backward inside it
    assert passes >= 4 * 6
    assert (capture.source, capture.count) == ("optimizer", 6)
    assert capture.closure_calls == passes  # every pass counted, for the closure calls a step
    assert collector.tracker.dropped == 0
    assert heard == [1, 2, 3, 4, 5, 6]
    assert all(record.phases_s["backward"] > 0 for record in capture.records)


def test_a_closure_that_runs_no_backward_is_no_pass(tmp_path: Path) -> None:
    # given: Lightning's manual optimisation of a GAN: each optimizer's backward runs before its step, which gets a
    # closure that does nothing (the FLOP count took the first such call for a pass, and counted 79% of the step)
    collector, _ = following(tmp_path)
    torch.manual_seed(0)
    generator, discriminator = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    optimizers = [torch.optim.Adam(generator.parameters()), torch.optim.Adam(discriminator.parameters())]
    for _ in range(4):
        for optimizer in optimizers:
            optimizer.zero_grad()
            discriminator(generator(torch.randn(8, 4))).mean().backward()
            optimizer.step(lambda: None)
    capture = collector.stop().payload
    # then: four steps, and no closure call counted as a pass
    assert (capture.source, capture.count, capture.closure_calls) == ("optimizer", 4, 0)


def accumulate(tmp_path: Path, batches: int, updates: int, build_optimizer: bool = True,
               step: bool = True) -> tuple[StepsCollector, list[int]]:
    """``updates`` rounds of ``batches`` forward and backward passes, each round ending in an optimizer step (none
    with ``step=False``; no optimizer built with ``build_optimizer=False``)."""
    collector, heard = following(tmp_path)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01) if build_optimizer else None
    for _ in range(updates):
        for _ in range(batches):
            model(torch.randn(8, 4)).sum().backward()
        if optimizer is not None and step:
            optimizer.step()
            optimizer.zero_grad()
    collector.stop()
    return collector, heard


def test_batches_accumulated_before_the_first_optimizer_step_are_no_steps_to_the_followers(tmp_path: Path) -> None:
    # given: 16 batches a step, 5 steps
    collector, heard = accumulate(tmp_path, batches=16, updates=5)
    # then: the followers heard of the optimizer's steps only; backward() had counted 16 before it first stepped
    assert heard == [1, 2, 3, 4, 5]
    assert collector.tracker.dropped == 16 and collector.tracker.source == "optimizer"


def test_without_an_optimizer_each_backward_is_a_step_from_the_second_on(tmp_path: Path) -> None:
    _, heard = accumulate(tmp_path, batches=1, updates=6, build_optimizer=False)
    assert heard == [2, 3, 4, 5, 6]  # the first backward's end is known to be a boundary at the second's


def test_an_optimizer_built_and_never_stepped_holds_the_steps_back_only_so_long(tmp_path: Path) -> None:
    # given: an optimizer built, kept for later, and HOLD_STEPS + 10 batches trained by backward() alone
    collector, heard = accumulate(tmp_path, batches=HOLD_STEPS + 10, updates=1, step=False)
    # then: the steps counted while it held them are dropped, and the followers hear of the rest from step 0
    assert collector.tracker.source == "backward"
    assert collector.tracker.dropped == HOLD_STEPS + 1
    assert heard == list(range(10))  # the rest of the 74 backward() calls' steps, from step 0


def train_with_an_optimizer_a_parameter(hook_steps: Callable[[torch.optim.Optimizer], None]) -> None:
    """PyTorch's optimizer-in-backward tutorial, 5 iterations: an Adam a parameter, which ``hook_steps`` steps from
    the parameter's post-accumulate-grad hook, and no optimizer.step() in the loop."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizers = {p: torch.optim.Adam([p]) for p in model.parameters()}
    for parameter in model.parameters():
        parameter.register_post_accumulate_grad_hook(lambda p: hook_steps(optimizers[p]))
    for _ in range(5):
        model(torch.randn(16, 4)).pow(2).mean().backward()


def step_and_free(optimizer: torch.optim.Optimizer) -> None:
    optimizer.step()
    optimizer.zero_grad()


def test_optimizers_stepped_inside_backward_end_the_step_where_backward_ends(tmp_path: Path) -> None:
    # given: the optimizer-in-backward tutorial, each optimizer stepped (and its gradient freed) by the hook. A
    # boundary inside backward had torch.profiler stop and export there, and the run died of SIGSEGV in kineto's save
    collector = StepsCollector()
    collector.start(tmp_path)
    heard_in_backward: list[bool] = []
    collector.add_step_listener(lambda index: heard_in_backward.append(bool(collector._in_backward)))
    # when
    train_with_an_optimizer_a_parameter(step_and_free)
    capture = collector.stop().payload
    # then: a step an iteration, the optimizers' time inside backward its optimizer phase, and every listener told
    # of a step outside backward
    assert (capture.source, capture.count) == ("optimizer", 5)
    assert heard_in_backward == [False] * 5
    assert all(record.phases_s["optimizer"] > 0 for record in capture.records)
    # and the post-run optimizer probe is given all four of them, not the first alone
    assert len(collector.probe_inputs().peers) == 4


def test_optimizers_stepped_by_hooks_on_autograds_device_thread_end_the_step_at_backwards_end(tmp_path: Path) -> None:
    # given: the same loop as CUDA runs it: backward's hooks on autograd's device thread, the loop's thread waiting
    # in backward() (here a thread the hook starts and joins)
    collector = StepsCollector()
    collector.start(tmp_path)

    def step_on_another_thread(optimizer: torch.optim.Optimizer) -> None:
        device_thread = threading.Thread(target=optimizer.step)
        device_thread.start()
        device_thread.join()

    # when
    train_with_an_optimizer_a_parameter(step_on_another_thread)
    capture = collector.stop().payload
    # then: the steps are the optimizers', one an iteration (not held back waiting for one, then backward's)
    assert (capture.source, capture.count) == ("optimizer", 5)
    assert len(collector.probe_inputs().peers) == 4


def test_an_earlier_loops_optimizer_of_the_same_class_is_no_peer_of_the_probed_one(tmp_path: Path) -> None:
    collector = StepsCollector()
    collector.start(tmp_path)
    pretrain, finetune = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    first, second = torch.optim.Adam(pretrain.parameters()), torch.optim.Adam(finetune.parameters())
    for model, optimizer in ((pretrain, first), (finetune, second)):
        for _ in range(4):
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
    collector.stop()
    inputs = collector.probe_inputs()
    assert inputs.optimizer is first and inputs.peers == (first,)  # (the windows, had any opened, would pick theirs)


def test_a_wrapper_optimizers_own_work_around_the_inner_ones_step_is_measured_apart(tmp_path: Path) -> None:
    # given: an optimizer whose step runs an inner Adam's and then work of its own, as ZeroRedundancyOptimizer's
    # broadcasts the updated shards
    class Sharded(torch.optim.Optimizer):
        def __init__(self, params) -> None:  # noqa: ANN001
            params = list(params)
            super().__init__(params, {})
            self.inner = torch.optim.Adam(params)

        def step(self, closure=None) -> None:  # noqa: ANN001
            self.inner.step()
            time.sleep(0.02)  # the broadcast (long beside Adam's 0.2 ms: under -n 2 on two cores, with 6 ms here,
            # the inner steps stretched to about 3 ms each and their share measured 0.50-0.57)

    collector = StepsCollector()
    collector.start(tmp_path)
    inside: list[int] = []
    collector.add_step_listener(lambda index: inside.append(len(collector._open_steps)))
    model = torch.nn.Linear(64, 64)
    optimizer = Sharded(model.parameters())
    for _ in range(8):
        model(torch.randn(8, 64)).sum().backward()
        optimizer.step()
    collector.stop()
    # then: a step an iteration, each ending where the wrapper's step does (the inner one's had ended a step too,
    # inside the wrapper's, where torch.profiler warned of the open range)
    assert inside == [0] * 8
    # and the probe gets the inner Adam, whose steps were a small share of the wrapper's
    inputs = collector.probe_inputs()
    assert inputs.optimizer is optimizer.inner and inputs.peers == (optimizer.inner,)
    assert inputs.update_share < 0.5 and inputs.around == "Sharded"  # type: ignore[operator]


def test_an_optimizer_step_that_raised_leaves_no_step_open_for_the_next(tmp_path: Path) -> None:
    class Flaky(torch.optim.SGD):
        def step(self, closure=None):  # noqa: ANN001
            if self.raise_next:
                self.raise_next = False
                raise FloatingPointError("a non-finite gradient")
            return super().step(closure)

    collector = StepsCollector()
    collector.start(tmp_path)
    model = torch.nn.Linear(4, 4)
    optimizer = Flaky(model.parameters(), lr=0.1)
    optimizer.raise_next = False
    for i in range(8):
        optimizer.raise_next = i == 3
        for p in model.parameters():  # gradients set by hand (DP-SGD's noised ones): no backward() to clear it
            p.grad = torch.ones_like(p)
        try:
            optimizer.step()
        except FloatingPointError:
            pass
    assert collector.stop().payload.count == 7  # the step that raised ended none
