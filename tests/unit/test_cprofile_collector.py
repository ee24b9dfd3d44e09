"""The cProfile collector under Python 3.12+'s rule (cProfile uses sys.monitoring's one profiler slot: enabling a
second profile, or the same one twice, raises), whatever Python runs the tests."""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import types
from pathlib import Path

import pytest

from gpuscope.collect.collectors import cprofile as collector_module
from gpuscope.collect.collectors.cprofile import CProfileCollector, profiler_in_use


class StrictProfile(cProfile.Profile):
    """A cProfile.Profile that, like Python 3.12's, refuses to be enabled while a profile is on."""

    on: StrictProfile | None = None

    def enable(self, *args, **kwargs) -> None:  # type: ignore[override]
        if StrictProfile.on is not None:
            raise ValueError("Another profiling tool is already active")
        StrictProfile.on = self
        super().enable(*args, **kwargs)

    def disable(self) -> None:
        if StrictProfile.on is self:
            StrictProfile.on = None
        super().disable()


def test_with_torch_imported_before_the_run_the_startup_profile_is_enabled_once(monkeypatch: pytest.MonkeyPatch,
                                                                             tmp_path: Path) -> None:
    # given: torch already imported (a notebook, gpuscope.profile()); seen on an H100 with Python 3.12 as
    # "ValueError: Another profiling tool is already active" and no python.prof
    pytest.importorskip("torch")
    assert "torch" in sys.modules
    monkeypatch.setattr(collector_module.cProfile, "Profile", StrictProfile)
    collector = CProfileCollector(steps=2)
    # when
    collector.start(tmp_path)
    try:
        sum(range(1000))
    finally:
        result = collector.stop()
    # then
    assert result.status.status == "ok", result.status.reason
    assert (tmp_path / "python.prof").is_file()
    assert StrictProfile.on is None


def test_another_profiler_in_the_process_is_named() -> None:
    profile = cProfile.Profile()
    profile.enable()
    try:
        reason = profiler_in_use()
    finally:
        profile.disable()
    assert reason is not None and "another profiler" in reason
    assert profiler_in_use() is None


GPUSCOPE_CODE = '''
def find_roots(n):
    return sorted(range(n), reverse=True)  # gpuscope's own call to a built-in
'''


def test_the_top_functions_leave_out_the_time_gpuscope_spent_in_built_ins() -> None:
    # given: gpuscope's code (its root-module search) and the user's both call the built-in sorted()
    namespace: dict[str, object] = {}
    exec(compile(GPUSCOPE_CODE, collector_module._GPUSCOPE_DIR + "roots.py", "exec"), namespace)
    find_roots = namespace["find_roots"]
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(3):
        find_roots(200_000)  # type: ignore[operator]
    users = sorted(range(10))
    profile.disable()
    # when
    top = {stat.function: stat for stat in collector_module.top_functions(pstats.Stats(profile), "own")}
    # then: sorted() is the user's one call, and gpuscope's function is not named at all
    assert users == list(range(10))
    assert top["<built-in method builtins.sorted>"].calls == 1
    assert top["<built-in method builtins.sorted>"].own_s < 0.01
    assert "find_roots" not in top


HEAVY_IMPORT = '''
def heavy_import_body():
    return sum(range(1000))


heavy_import_body()
'''


def test_the_startup_profile_pauses_while_a_paused_import_runs(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    # given: a module the start-up profile pauses for (as torch._dynamo, which a script's first optimizer imports:
    # 1.8 s of a 6-step script's 3 s, and half as long again under cProfile), imported in the start-up
    (tmp_path / "gpuscope_heavy_import.py").write_text(HEAVY_IMPORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(collector_module, "PAUSED_IMPORTS", ("torch", "gpuscope_heavy_import"))
    monkeypatch.setattr(collector_module.cProfile, "Profile", StrictProfile)
    collector = CProfileCollector(steps=2)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # when
    collector.start(run_dir)
    try:
        import gpuscope_heavy_import  # noqa: F401

        sorted(range(10))  # the script's own work, after the import
    finally:
        result = collector.stop()
        sys.modules.pop("gpuscope_heavy_import", None)
    # then: the import's code is not in python.prof, and the profile was on again after it
    assert result.status.status == "ok", result.status.reason
    functions = {name for _, _, name in pstats.Stats(str(run_dir / "python.prof")).stats}  # type: ignore[attr-defined]
    assert "heavy_import_body" not in functions
    assert "<built-in method builtins.sorted>" in functions
    assert StrictProfile.on is None


# -- the script's code between the phases ---------------------------------------------------------------------------
def ema_update(ema: list, params: list) -> None:
    for e, p in zip(ema, params):
        lerp(e, p)


def lerp(e, p) -> None:
    e.mul_(0.9).add_(p.detach(), alpha=0.1)


def doubled(x):
    return x * 2


def train_step(model, opt, x) -> None:
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()


def loop(steps: int, model, opt, ema: list) -> None:
    import torch

    for _ in range(steps):
        train_step(model, opt, torch.randn(4, 8))
        ema_update(ema, list(model.parameters()))


def model_and_ema() -> tuple:
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return doubled(self.fc(x))  # a function of the script's, run inside the forward

    model = Net()
    return model, torch.optim.SGD(model.parameters(), lr=0.1), [p.detach().clone() for p in model.parameters()]


def test_the_scripts_functions_between_the_phases_are_those_that_call_no_phase_and_run_in_none() -> None:
    # given: a loop whose step (train_step: forward, backward, the optimizer) is followed by an EMA of the weights
    pytest.importorskip("torch")
    if profiler_in_use():
        pytest.skip("another profiler holds the slot")
    model, opt, ema = model_and_ema()
    profile = cProfile.Profile()
    profile.enable()
    loop(3, model, opt, ema)
    profile.disable()
    # then: the EMA is named, its lerp() inside it not again; the loop and the step, which run the phases, are not,
    # nor the forward's helper, which runs inside one; after it, the library's parameters() the loop calls itself
    named = collector_module.between_phases(pstats.Stats(profile))
    assert [f.function for f in named] == ["ema_update", "parameters"]
    assert named[0].calls == 3 and named[0].file.endswith("test_cprofile_collector.py")


def test_a_phases_code_is_torchs_own_not_a_package_whose_path_ends_like_it() -> None:
    adam = ("/venv/lib/python3.11/site-packages/torch/optim/adam.py", 214, "step")
    assert collector_module._is_phase_code(adam)
    assert not collector_module._is_phase_code(("/home/me/mytorch/optim/schedule.py", 3, "step"))


def test_a_hook_the_loop_calls_through_a_library_dispatcher_also_used_inside_a_phase_is_between_the_phases() -> None:
    # given: PyTorch Lightning's shape (an EMA callback, 2026-12-01): its loop steps the optimizer, whose closure runs
    # training_step and calls hooks through _call_callback_hooks; the loop calls on_train_batch_end through that same
    # dispatcher, after the step
    lib = "/venv/lib/python3.11/site-packages/"
    advance = (lib + "pytorch_lightning/loops/training_epoch_loop.py", 200, "advance")
    step = (lib + "torch/optim/optimizer.py", 509, "wrapper")
    closure = (lib + "pytorch_lightning/loops/optimization/automatic.py", 140, "closure")
    hooks = (lib + "pytorch_lightning/trainer/call.py", 200, "_call_callback_hooks")
    training_step = ("/home/me/train.py", 30, "training_step")
    ema = ("/home/me/train.py", 16, "on_train_batch_end")
    edge = (4, 4, 0.0, 0.0)
    stats = types.SimpleNamespace(stats={
        advance: (1, 1, 0.001, 0.1, {}),
        step: (4, 4, 0.001, 0.06, {advance: edge}),
        closure: (4, 4, 0.001, 0.05, {step: edge}),
        training_step: (4, 4, 0.001, 0.03, {closure: edge}),
        hooks: (8, 8, 0.001, 0.02, {closure: edge, advance: edge}),
        ema: (4, 4, 0.008, 0.014, {hooks: edge}),
    })
    # then: the hook is named (the dispatcher, called from outside the phases too, does not put it inside them);
    # training_step, under the optimizer's closure only, is not
    assert [f.function for f in collector_module.between_phases(stats)] == ["on_train_batch_end"]


def test_an_update_under_a_decorator_the_optimizer_uses_too_is_between_the_phases() -> None:
    # given: timm's EMA shape, an update decorated with @torch.no_grad(), whose decorate_context also wraps torch's
    # own helpers inside the optimizer's step; the loop's frame ran before the profile began, so the calls it made
    # have no caller in the profile (decorate_context: 9 calls, 5 of them from inside the optimizer)
    lib = "/venv/lib/python3.11/site-packages/"
    step = (lib + "torch/optim/adam.py", 214, "step")
    grouping = (lib + "torch/optim/optimizer.py", 544, "_group_tensors_by_device_and_dtype")
    decorator = (lib + "torch/utils/_contextlib.py", 120, "decorate_context")
    ema = ("/home/me/train.py", 16, "update_ema")
    stats = types.SimpleNamespace(stats={
        step: (5, 5, 0.001, 0.026, {}),
        grouping: (5, 5, 0.001, 0.002, {step: (5, 5, 0.001, 0.002)}),
        decorator: (9, 9, 0.0001, 0.014, {grouping: (5, 5, 0.0, 0.001)}),
        ema: (4, 4, 0.006, 0.013, {decorator: (4, 4, 0.006, 0.013)}),
    })
    # then: the update is named: the decorator, called from the loop too, does not put it inside the optimizer
    assert [f.function for f in collector_module.between_phases(stats)] == ["update_ema"]


def test_a_librarys_update_the_loop_calls_is_between_the_phases_and_what_an_optimizers_frame_calls_is_not() -> None:
    # given: torch's AveragedModel keeping an EMA (update_parameters, in torch/optim/ but no optimizer's step) called
    # by the loop's own frame once a step, 4 steps profiled; and record_function's __exit__, called by the optimizer's
    # step wrapper, whose frame was running as the profile began (the step boundary is its post-hook): once unseen
    lib = os.getcwd() + "/.venv/lib/python3.11/site-packages/"
    wrapper = (lib + "torch/optim/optimizer.py", 509, "wrapper")
    update = (lib + "torch/optim/swa_utils.py", 294, "update_parameters")
    averaged = (lib + "torch/optim/swa_utils.py", 40, "ema_update")
    record_exit = (lib + "torch/autograd/profiler.py", 932, "record_exit")
    setattr_ = (lib + "torch/nn/modules/module.py", 1971, "__setattr__")  # a framework's loop setting attributes
    stats = types.SimpleNamespace(stats={
        wrapper: (3, 3, 0.001, 0.02, {}),
        update: (4, 4, 0.003, 0.019, {}),
        averaged: (264, 264, 0.01, 0.015, {update: (264, 264, 0.01, 0.015)}),
        record_exit: (4, 4, 0.0002, 0.0005, {wrapper: (3, 3, 0.0001, 0.0004)}),
        setattr_: (180, 180, 0.0005, 0.0013, {}),
    })
    # then: the loop's call is named (not its per-tensor helper, inside it); the wrapper's is not, nor a special
    # method, which names no call of the loop's
    named = collector_module.between_phases(stats)
    assert [f.function for f in named] == ["update_parameters"]
    # its file as the user knows it, from site-packages, wherever the environment is (one in the project's folder)
    assert named[0].file == "torch/optim/swa_utils.py"


def test_a_module_the_loop_calls_besides_the_trained_model_runs_between_the_phases() -> None:
    # given: a loop that calls its model, then a torchmetrics collection (a module with no parameters) on the logits
    # each step, 4 steps profiled: torch's module call runs both, the model's forward (and its Linear's) timed as
    # the step's forward, the metrics' forward not (the steps put its time in "other")
    lib = os.getcwd() + "/.venv/lib/python3.11/site-packages/"
    wrapped = (lib + "torch/nn/modules/module.py", 1770, "_wrapped_call_impl")
    call = (lib + "torch/nn/modules/module.py", 1778, "_call_impl")
    model = ("/home/me/train.py", 12, "forward")
    linear = (lib + "torch/nn/modules/linear.py", 124, "forward")
    collection = (lib + "torchmetrics/collections.py", 200, "forward")
    metric = (lib + "torchmetrics/metric.py", 286, "forward")
    stats = types.SimpleNamespace(stats={
        wrapped: (20, 20, 0.001, 0.21, {}),  # (the loop's calls: its frame began before the profile)
        call: (20, 20, 0.001, 0.21, {wrapped: (20, 20, 0.001, 0.21), collection: (12, 12, 0.0, 0.2)}),
        model: (4, 4, 0.001, 0.004, {call: (4, 4, 0.001, 0.004)}),
        linear: (8, 8, 0.001, 0.002, {call: (8, 8, 0.001, 0.002)}),
        collection: (4, 4, 0.0001, 0.2, {call: (4, 4, 0.0001, 0.2)}),
        metric: (12, 12, 0.01, 0.2, {call: (12, 12, 0.01, 0.2)}),
    })
    timed = frozenset({model, linear})
    # then: the metrics' forward is named (the collection's own calls modules through the call the model's goes
    # through too, so it counts as calling a phase; its metrics' forward is what the loop ran)
    assert [f.function + " " + f.file for f in collector_module.between_phases(stats, forwards=timed)] == [
        "forward torchmetrics/metric.py"]
    # and where no timed module is known, a module's call is the forward phase, as before
    assert collector_module.between_phases(stats) == ()


def test_the_timed_modules_forwards_are_found_under_their_decorators() -> None:
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(2, 2)

        @torch.autocast("cpu", enabled=False)
        def forward(self, x):
            return self.fc(x)

    codes = collector_module.forward_codes([Net()])
    # the forward the profile sees run (the function under the decorator's wrapper), and the Linear's
    assert {(name, os.path.basename(file)) for file, _, name in codes} == {
        ("forward", "test_cprofile_collector.py"), ("forward", "linear.py")}
    assert len(codes) == 2 and collector_module.forward_codes([]) is None

    # and a model whose modules cannot be listed leaves the module's call standing for them, in the user's step
    class Broken(torch.nn.Module):
        def modules(self):
            raise RuntimeError("lazy module not materialised")

    assert collector_module.forward_codes([Broken()]) is None
