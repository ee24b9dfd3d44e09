"""Each fix ``--try`` applies at run time, applied with the values its fix is written from, on the CPU (the CUDA ones too, as far as
a CPU shows them: the settings they make, the autocast they enter, the layout they give), and undone after."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from conftest import collect_garbage
from gpuscope.collect.collectors.cprofile import short_path
from gpuscope.collect.fixes import Applied, StopAfter, TrialStop, apply


class Steps:
    """A stand-in for the steps collector: the listeners told of each step, the roots found after the first."""

    def __init__(self, roots: list[nn.Module] | None = None, frozen: list[nn.Module] | None = None) -> None:
        self.listeners: list[Callable[[int], int | None]] = []
        self.roots, self.frozen = roots or [], frozen or []
        self.seen = 0
        self.at_safe_point: Callable[[], None] | None = None

    def add_step_listener(self, listener: Callable[[int], int | None]) -> None:
        self.listeners.append(listener)

    def steps_seen(self) -> int:
        return self.seen

    def root_modules(self) -> list[nn.Module]:
        return self.roots if self.seen >= 1 else []

    def frozen_modules(self) -> list[nn.Module]:
        return self.frozen if self.seen >= 1 else []

    def stop_at_safe_point(self, action: Callable[[], None]) -> None:
        self.at_safe_point = action

    def begin(self, index: int) -> None:
        self.seen = index
        for listener in self.listeners:
            listener(index)


@pytest.fixture
def applied() -> Iterator[list[Applied]]:
    """The fixes a test applies, removed after it, and the modules they changed collected (a module whose forward a
    fix wraps refers to itself: left for the collector, a later test scanning for models would find it)."""
    made: list[Applied] = []
    yield made
    for fix in made:
        fix.remove()
    made.clear()
    collect_garbage()


def test_tf32_sets_the_float32_matmul_precision(applied: list[Applied]) -> None:
    before = torch.get_float32_matmul_precision()
    try:
        applied.append(apply("tf32", {}, Steps()))
        assert torch.get_float32_matmul_precision() == "high"
        assert applied[0].step == 1
    finally:
        torch.set_float32_matmul_precision(before)


def test_zero_grad_always_sets_the_gradients_to_none(applied: list[Applied]) -> None:
    applied.append(apply("zero-grad-set-to-none", {}, Steps()))
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.zero_grad(set_to_none=False)  # the script's own line, unchanged
    assert model.weight.grad is None
    model(torch.randn(2, 4)).sum().backward()
    model.zero_grad(set_to_none=False)
    assert model.weight.grad is None


def test_the_fused_optimizer_is_built_fused_and_only_the_one_named(applied: list[Applied]) -> None:
    applied.append(apply("fused-optimizer", {"optimizer": "Adam"}, Steps()))
    params = [nn.Parameter(torch.randn(3))]
    assert torch.optim.Adam(params, lr=0.1).defaults["fused"] is True
    assert not torch.optim.AdamW(params, lr=0.1).defaults.get("fused")
    # one built with foreach=True keeps it: fused is left for the user to choose
    assert not torch.optim.Adam(params, lr=0.1, foreach=True).defaults.get("fused")
    applied[0].remove()
    assert not torch.optim.Adam(params, lr=0.1).defaults.get("fused")


def test_the_dataloader_built_at_the_recommended_line_gets_the_workers_and_no_other(applied: list[Applied]) -> None:
    data = TensorDataset(torch.randn(8, 2))
    line = next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text.strip().startswith("recommended = DataLoader("))
    here = f"{short_path(__file__)}:{line}"
    fix = apply("more-dataloader-workers", {"num_workers": 2, "persistent_workers": True, "site": here}, Steps())
    applied.append(fix)
    recommended = DataLoader(data, batch_size=4)
    other = DataLoader(data, 4)
    assert (recommended.num_workers, recommended.persistent_workers) == (2, True)
    assert (other.num_workers, other.persistent_workers) == (0, False)
    assert fix.loaders == [here]


def test_file_system_sharing_starts_the_workers_its_prediction_was_made_for(applied: list[Applied]) -> None:
    import torch.multiprocessing

    before = torch.multiprocessing.get_sharing_strategy()
    try:
        applied.append(apply("file-system-sharing", {"num_workers": 2, "prefetch_factor": 4}, Steps()))
        loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
        assert torch.multiprocessing.get_sharing_strategy() == "file_system"
        assert (loader.num_workers, loader.prefetch_factor) == (2, 4)
        applied[0].remove()
        # without a worker count in its fix, the strategy alone
        applied.append(apply("file-system-sharing", {}, Steps()))
        assert DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4).num_workers == 0
    finally:
        torch.multiprocessing.set_sharing_strategy(before)


def test_pin_memory_is_a_setting_of_the_fix(applied: list[Applied]) -> None:
    applied.append(apply("pin-memory", {"pin_memory": True}, Steps()))
    assert DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4).pin_memory is True


def test_a_loader_fix_with_no_workers_leaves_out_what_workers_need(applied: list[Applied]) -> None:
    # persistent_workers and prefetch_factor raise without workers: the fix applies them only with some
    applied.append(apply("persistent-workers", {"persistent_workers": True}, Steps()))
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    assert loader.num_workers == 0 and not loader.persistent_workers


def test_anomaly_detection_stays_off_whatever_the_script_asks(applied: list[Applied]) -> None:
    applied.append(apply("disable-debug-apis", {}, Steps()))
    torch.autograd.set_detect_anomaly(True)
    assert not torch.is_anomaly_enabled()
    with torch.autograd.detect_anomaly():
        assert not torch.is_anomaly_enabled()
    applied[0].remove()
    assert torch.autograd.set_detect_anomaly is not None and torch.autograd.detect_anomaly.__name__ == "detect_anomaly"


def test_distribution_checks_are_off_by_default(applied: list[Applied]) -> None:
    before = torch.distributions.Distribution._validate_args
    try:
        applied.append(apply("skip-distribution-checks", {}, Steps()))
        assert torch.distributions.Categorical(probs=torch.tensor([0.5, 0.5]))._validate_args is False
    finally:
        torch.distributions.Distribution.set_default_validate_args(before)


def test_cpu_autocast_is_entered_disabled(applied: list[Applied]) -> None:
    applied.append(apply("cpu-fp32-over-low-precision", {}, Steps()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.float32


def root_fix(fix_id: str, module: nn.Module, settings: dict[str, Any] | None = None,
             frozen: list[nn.Module] | None = None) -> Applied:
    """``fix_id`` applied to ``module`` as the steps collector finds it (and ``frozen``, the models the step runs
    without training them), after the first step."""
    steps = Steps([module], frozen)
    fix = apply(fix_id, settings or {}, steps)
    steps.begin(0)
    assert fix.step is None  # the roots are not known yet
    steps.begin(1)
    assert fix.step == 2
    return fix


def output_dtypes(module: nn.Module) -> list[torch.dtype]:
    """The dtypes ``module``'s calls give out, as they run (inside any autocast around them)."""
    seen: list[torch.dtype] = []
    module.register_forward_hook(lambda m, args, out: seen.append(out.dtype))
    return seen


def test_mixed_precision_runs_the_trained_modules_forward_under_bfloat16_autocast(applied: list[Applied]) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    inside = output_dtypes(model[2])
    applied.append(root_fix("mixed-precision", model))
    out = model(torch.randn(2, 4))
    assert inside == [torch.bfloat16]  # its Linear ran in bfloat16
    # given back in its parameters' dtype: the script's code after it sees the dtype it was written for
    assert out.dtype == torch.float32


Features = collections.namedtuple("Features", ["relu1"])


class Vgg(nn.Module):
    """A perceptual loss's frozen network, its features a named tuple (pytorch/examples' fast_neural_style)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> Any:
        return Features(torch.relu(self.conv(x)))


def test_cpu_mixed_precision_runs_the_frozen_models_under_autocast_too_and_the_script_reads_float32(
        applied: list[Applied]) -> None:
    # given: a trained network whose output goes through a frozen one, called again on the batch
    trained, vgg = nn.Conv2d(3, 3, 3, padding=1), Vgg()
    seen = output_dtypes(vgg.conv)
    applied.append(root_fix("cpu-mixed-precision", trained, frozen=[vgg]))
    x = torch.randn(2, 3, 8, 8)
    y = trained(x)
    features_y, features_x = vgg(y), vgg(x)
    # then: both ran their convolutions in bfloat16, and give back float32, the named tuple kept: the loss runs as
    # the script wrote it
    assert seen == [torch.bfloat16, torch.bfloat16]
    assert y.dtype == features_y.relu1.dtype == torch.float32 and isinstance(features_y, Features)
    torch.nn.functional.mse_loss(features_y.relu1, features_x.relu1).backward()
    assert trained.weight.grad is not None and trained.weight.grad.dtype == torch.float32


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd keeps for backward after one forward (checkpointing's own keep only each block's input)."""
    from torch.autograd.graph import saved_tensors_hooks

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        model(x).sum()
    return sum(seen.values())


def test_checkpointing_runs_each_repeated_block_under_torch_utils_checkpoint_same_results(
        applied: list[Applied]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), Block(), nn.Linear(16, 1))
    twin = nn.Sequential(Block(), Block(), Block(), nn.Linear(16, 1))
    twin.load_state_dict(model.state_dict())
    x = torch.randn(32, 16)
    kept_before = saved_bytes(model, x)
    applied.append(root_fix("reduce-memory", model, {"block": "Block"}))
    # then each block keeps its input, not its activations: less is saved for backward
    assert saved_bytes(model, x) < kept_before / 2
    # and the model computes the same loss and gradients as before
    model(x).square().mean().backward()
    twin(x).square().mean().backward()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)  # type: ignore[arg-type]
    with torch.no_grad():  # without gradients it runs as before (no checkpoint to keep)
        assert torch.allclose(model(x), twin(x), atol=1e-6)


def test_checkpointing_a_block_the_model_does_not_have_is_not_in_effect_and_says_why(applied: list[Applied]) -> None:
    steps = Steps([nn.Sequential(nn.Linear(4, 4))])
    fix = apply("reduce-memory", {"block": "GPT2Block"}, steps)
    applied.append(fix)
    steps.begin(0)
    steps.begin(1)
    assert fix.step is None
    assert fix.notes == ["reduce-memory could not be applied: LookupError: no GPT2Block module in the trained model"]


def test_channels_last_gives_the_modules_and_their_four_dimensional_inputs_that_layout(applied: list[Applied]) -> None:
    seen = []

    class Conv(nn.Conv2d):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(x.is_contiguous(memory_format=torch.channels_last))
            return super().forward(x)

    model = Conv(3, 8, 3)
    applied.append(root_fix("channels-last", model))
    model(torch.randn(2, 3, 8, 8))
    assert model.weight.is_contiguous(memory_format=torch.channels_last) and seen == [True]


def test_a_trial_ends_the_script_at_the_first_safe_point_of_its_last_step() -> None:
    steps = Steps()
    stop = StopAfter(steps, 3)
    for index in range(3):
        steps.begin(index)
        assert steps.at_safe_point is None
    steps.begin(3)
    with pytest.raises(TrialStop):
        steps.at_safe_point()  # type: ignore[misc]
    assert stop.stopped
