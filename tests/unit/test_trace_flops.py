"""A step's FLOPs read from the op shapes of its trace (issue 55: a run of three long steps ends before the FLOP
counter's step; its traced step is the one left): held against the FLOP counter's count of the same step, op by op."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuscope.collect.attention import cpu_formulas
from gpuscope.collect.rnn_flops import rnn_formulas
from gpuscope.collect.collectors.flops import SpeedOfLightCollector
from gpuscope.record import CollectorStatus
from gpuscope.collect.trace_flops import conv_output, count_flops, formulas, trace_flops

torch = pytest.importorskip("torch")
nn = torch.nn


class Attention(nn.Module):
    """Causal self-attention by ``scaled_dot_product_attention`` (the CPU's flash kernel where no dropout)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)

    def forward(self, x: Any) -> Any:
        q, k, v = self.qkv(x).view(2, 10, 3, 4, 8).permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def models() -> dict[str, tuple[Any, Any]]:
    torch.manual_seed(0)
    return {
        "transformer layers (addmm, mm, bmm)": (
            nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2,
                                  enable_nested_tensor=False), torch.randn(4, 16, 64)),
        "convolutions: strided, grouped, dilated, transposed": (
            nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=2, dilation=2),
                          nn.BatchNorm2d(8), nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1),
                          nn.Flatten(), nn.Linear(4 * 26 * 24, 5)), torch.randn(2, 3, 33, 31)),
        "conv1d and conv3d": (
            nn.Sequential(nn.Conv3d(2, 3, (2, 3, 3), stride=(1, 2, 2)), nn.Flatten(2), nn.Conv1d(3, 6, 5, padding=2)),
            torch.randn(1, 2, 6, 9, 9)),
        "an LSTM cell": (nn.LSTMCell(16, 32), torch.randn(5, 16)),
        "a 2-layer LSTM (oneDNN's fused layer)": (nn.LSTM(16, 32, num_layers=2), torch.randn(7, 3, 16)),
        "the CPU's flash attention": (Attention(), torch.randn(2, 10, 32)),
        "bfloat16 matmuls": (nn.Linear(32, 32).to(torch.bfloat16), torch.randn(8, 32, dtype=torch.bfloat16)),
    }


def one_step(model: Any, x: Any) -> None:
    out = model(x)
    (out[0] if isinstance(out, tuple) else out).float().sum().backward()


def counted(model: Any, x: Any) -> dict[str, int]:
    """The step's FLOPs by op as the flops collector counts them (torch's formulas and gpuscope's CPU attention's)."""
    from torch.utils import flop_counter

    mapping = {**cpu_formulas(torch, flop_counter, []), **rnn_formulas(torch)}
    with flop_counter.FlopCounterMode(display=False, custom_mapping=mapping) as mode:
        one_step(model, x)
    return {str(op).removeprefix("aten."): n for op, n in mode.get_flop_counts().get("Global", {}).items() if n}


def traced(model: Any, x: Any, path: Path, step: int = 2, shapes: bool = True) -> Path:
    """``path``: a trace of one step of ``model``, marked as gpuscope's trace marks its step."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as prof:
        with record_function(f"ProfilerStep#{step}"):
            one_step(model, x)
    prof.export_chrome_trace(str(path))
    return path


@pytest.mark.parametrize("name", list(models()))
def test_the_flops_read_from_a_traces_shapes_are_the_flop_counters_op_by_op(name: str, tmp_path: Path) -> None:
    model, x = models()[name]
    one_step(model, x)  # (lazy initialisation out of the way)
    expected = counted(model, x)
    read = trace_flops(traced(model, x, tmp_path / "trace.json"))
    assert read is not None and read.step == 2 and not read.not_counted
    assert read.flops_by_op == expected and read.total > 0


def test_an_lstm_on_a_cpu_counts_its_gates_matmuls_at_every_timestep_forward_and_backward() -> None:
    # given a 2-layer LSTM of 32 over 7 timesteps of 3 sequences of 16 features, which a CPU runs as oneDNN's fused
    # layers (torch's counter has no formula for them: it counted 0)
    model, x = models()["a 2-layer LSTM (oneDNN's fused layer)"]
    # then each layer's gates (4 x 32) take two matmuls a timestep: 2 x 21 rows x 128 x (16 + 32) and x (32 + 32);
    # the backward twice that
    forward = 2 * 21 * 128 * (16 + 32) + 2 * 21 * 128 * (32 + 32)
    assert counted(model, x) == {"mkldnn_rnn_layer": forward, "mkldnn_rnn_layer_backward": 2 * forward}
    # and so does the speed of light's counter on the step it counts
    from test_speed_of_light import FakeSteps

    steps, collector = FakeSteps(), SpeedOfLightCollector(start=2)
    collector.follow(steps)
    for index in (1, 2, 3):
        steps.listener(index)
        one_step(model, x)
    assert collector.stop().payload.flops_per_step == 3 * forward


def test_the_flops_are_held_by_the_dtype_of_each_ops_first_tensor(tmp_path: Path) -> None:
    model, x = models()["bfloat16 matmuls"]
    expected = sum(counted(model, x).values())
    assert trace_flops(traced(model, x, tmp_path / "trace.json")).flops_by_dtype == {"bfloat16": expected}


def test_a_trace_without_shapes_has_no_count(tmp_path: Path) -> None:
    model, x = models()["an LSTM cell"]
    assert trace_flops(traced(model, x, tmp_path / "trace.json", shapes=False)) is None


def test_an_op_inside_a_counted_one_is_not_counted_again_and_one_not_readable_is_listed() -> None:
    # given aten::convolution calling aten::_convolution on one thread, and an mm recorded without its shapes' types
    conv = {"Input Dims": [[1, 2, 8, 8], [4, 2, 3, 3], [4], [], [], [], [], [], []],
            "Input type": ["float", "float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar",
                           "ScalarList", "Scalar"],
            "Concrete Inputs": ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"]}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::convolution", "ts": 0, "dur": 10, "pid": 1, "tid": 1, "args": conv},
        {"ph": "X", "cat": "cpu_op", "name": "aten::_convolution", "ts": 1, "dur": 8, "pid": 1, "tid": 1,
         "args": {**conv, "Input Dims": conv["Input Dims"] + [[]] * 4, "Input type": conv["Input type"] + [""] * 4}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 20, "dur": 5, "pid": 1, "tid": 1,
         "args": {"Input Dims": [[2, 3]]}},
    ]
    read = count_flops(events, formulas())
    # then the convolution counts once: 2 x its 6 x 6 outputs x 4 channels x 2 x 3 x 3 weights, for its one sample
    assert read.flops_by_op == {"convolution": 2 * 6 * 6 * 4 * 2 * 3 * 3} and read.not_counted == {"aten::mm": 1}


@pytest.mark.parametrize("layer, shape", [
    (nn.Conv2d(3, 8, 3, stride=2, padding=1), (2, 3, 33, 31)),
    (nn.Conv2d(4, 8, (3, 5), dilation=(2, 1), groups=2), (1, 4, 20, 21)),
    (nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1), (2, 8, 13, 12)),
    (nn.ConvTranspose1d(6, 6, 4, stride=3, groups=3), (1, 6, 10)),
    (nn.Conv3d(2, 3, (2, 3, 3), stride=(1, 2, 2)), (1, 2, 6, 9, 9)),
])
def test_a_convolutions_output_shape_is_worked_out_as_torch_does(layer: Any, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape)
    transposed = isinstance(layer, nn.modules.conv._ConvTransposeNd)
    padding = list(layer.padding) if not isinstance(layer.padding, str) else [0]
    assert conv_output(list(shape), list(layer.weight.shape), list(layer.stride), padding, list(layer.dilation),
                       transposed, list(getattr(layer, "output_padding", [0])), layer.groups) == list(layer(x).shape)


class EndedSteps:
    """The steps collector's part the flops collector uses, on a CPU loop with no closure."""

    def add_step_listener(self, listener: Any) -> None:
        self.listener = listener

    def remove_step_listener(self, listener: Any) -> None:
        pass

    def cuda_in_use(self) -> bool:
        return False

    def closure_calls(self) -> int:
        return 0

    def step_evaluated(self, index: int) -> bool:
        return False


def run_steps(collector: SpeedOfLightCollector, run_dir: Path, steps: int) -> Any:
    """``collector``'s result for a run of steps 0 to ``steps`` - 1, its trace.json (if any) in ``run_dir``."""
    collector.start(run_dir)
    events = EndedSteps()
    collector.follow(events)
    for index in range(steps):
        events.listener(index)
    return collector.stop()


def three_steps_counted_at_the_fourth(run_dir: Path) -> Any:
    """The flops collector's result for a run of steps 0-2 whose FLOP count was placed on step 3."""
    return run_steps(SpeedOfLightCollector(start=3), run_dir, 3)


def test_a_run_ending_before_its_counted_step_has_the_traced_steps_flops_from_its_shapes(tmp_path: Path) -> None:
    # given a run of three long steps: step 2 traced with its shapes, the FLOP count placed on step 3, never run
    model, x = models()["transformer layers (addmm, mm, bmm)"]
    one_step(model, x)
    traced(model, x, tmp_path / "trace.json")
    result = three_steps_counted_at_the_fourth(tmp_path)
    # then the count is step 2's, read from its trace, and says so
    assert result.status.status == "ok" and result.payload.step == 2
    assert result.payload.flops_per_step == sum(counted(model, x).values())
    assert result.payload.flops_by_dtype == {"float32": result.payload.flops_per_step}
    assert result.notes == ("step 2's FLOPs: read from the shapes of its traced ops, by torch's formulas (the run "
                            "ended before step 3, the one whose FLOPs are counted)",)


def test_windows_placed_one_step_each_read_the_traced_steps_flops_from_its_shapes_and_count_no_step(
        tmp_path: Path) -> None:
    # given long steps of one pass each: the plan gives the FLOP count no step (schedule.WindowRequest.from_trace)
    model, x = models()["transformer layers (addmm, mm, bmm)"]
    one_step(model, x)
    traced(model, x, tmp_path / "trace.json")
    collector = SpeedOfLightCollector(start=10)
    collector.move_window(None, None)
    result = run_steps(collector, tmp_path, 12)  # (past the step it would have counted)
    # then no step ran under the FLOP counter, and the count is the traced step's, read from its shapes
    assert collector._window.counted == [] and collector._mode is None
    assert result.status.status == "ok" and result.payload.step == 2
    assert result.payload.flops_per_step == sum(counted(model, x).values())
    assert result.notes == ("step 2's FLOPs: read from the shapes of its traced ops, by torch's formulas (the windows "
                            "placed one step each: no step of its own under the FLOP counter)",)


def test_windows_placed_one_step_each_with_no_trace_have_no_count_and_say_why(tmp_path: Path) -> None:
    collector = SpeedOfLightCollector(start=None, cuda_start=None)  # (--profile-steps N small: no step of its own)
    assert run_steps(collector, tmp_path, 4).status == CollectorStatus(
        "unavailable", "the windows placed one step each: no step of its own under the FLOP counter; no traced step "
                       "with its op shapes to read them from")


def test_without_a_trace_of_shapes_a_run_ending_before_its_counted_step_has_no_count(tmp_path: Path) -> None:
    model, x = models()["an LSTM cell"]
    traced(model, x, tmp_path / "trace.json", shapes=False)
    assert three_steps_counted_at_the_fourth(tmp_path).status == CollectorStatus(
        "unavailable", "the run ended before step 3, the one whose FLOPs are counted")


def test_a_trace_recorded_on_an_mi250_has_its_flops_read_from_its_shapes(tmp_path: Path) -> None:
    # given a toy loop's trace recorded with shapes on an AMD MI250 (ROCm 6.2), elsewhere: a Linear(128, 128) on a
    # batch of 5, its forward's addmm and its weight gradient's mm
    import gzip

    trace = gzip.decompress((Path(__file__).parent.parent / "fixtures" / "gpu" / "mi250-rocm-toy.json.gz").read_bytes())
    (tmp_path / "trace.json").write_bytes(trace)
    read = trace_flops(tmp_path / "trace.json")
    # then each is 2 x 5 x 128 x 128, in float32
    assert read is not None and read.step == 1
    assert read.flops_by_op == {"addmm": 2 * 5 * 128 * 128, "mm": 2 * 128 * 5 * 128}
    assert read.flops_by_dtype == {"float32": 4 * 5 * 128 * 128} and not read.not_counted
