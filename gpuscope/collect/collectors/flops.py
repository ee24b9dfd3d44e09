"""Speed of light: the FLOPs of one training step, and the device's peak to hold them against.

One steady step, after every other profiling window (cProfile, torch.profiler, the sync count), runs under
``torch.utils.flop_counter.FlopCounterMode``, entered as the step begins and left as the next one begins (at the
step boundaries, which are outside any op). The mode is a TorchDispatchMode, so it sees every aten op of the step,
backward included (the autograd engine carries dispatch modes to its threads), and counts matrix multiplies,
convolutions and attention with torch's formulas: 2 x M x N x K for a matmul (a multiply and an add per term).
Element-wise ops and the optimizer's update are not counted, as in every MFU figure. A matmul of a sparse matrix
counts the elements it stores (``stored_share``), where torch's formulas count it as dense; a CPU's flash attention,
which torch's counter has no formula for, is counted with the GPU one's (``collect/collectors/attention.py``). The counted
step runs slower (every op goes through Python), so it is marked profiled and left out of the step figures.

The peak: on CUDA, the detected GPU model's datasheet figure for the matmuls' dtype (looked up by the analysis,
``reduce/peaks.py``); on a CPU run, this machine measured after the run by the ``cpu-peak`` probe: the best of a
few square matmuls in the step's dtype with the run's own thread count, which is what the step's matmuls could
reach at most; where that dtype is not float32, float32 as well, so that the analysis can tell a CPU whose bfloat16
or float16 matmuls are slower than its float32 ones (no matrix instructions for them: emulated). Where the step ran
convolutions and some of its FLOPs in bfloat16 or float16 (a model under ``torch.autocast``, beside others in
float32), one convolution in that dtype and in float32 too: without instructions for the dtype, torch runs its
convolutions on a slow reference kernel (``aten::_slow_conv2d_forward``), as it runs float64 ones on any CPU (as
an unfolding and a float64 matmul: the matmul rates hold for those).
"""

from __future__ import annotations

import platform
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpuscope.collect.captures import LOW_PRECISION, AttentionCall, CpuPeak, FlopCount
from gpuscope.collect.collectors.attention import ATTENTION_BUDGET_S, cpu_formulas, time_attention
from gpuscope.collect.collectors.base import (
    CollectorResult,
    PostRunProbe,
    StepFollower,
    StepWindow,
    WindowRequest,
    register,
)
from gpuscope.collect.collectors.lazy_dynamo import leave_unimported
from gpuscope.collect.collectors.probing import fastest
from gpuscope.record import CollectorStatus

if TYPE_CHECKING:
    from gpuscope.collect.captures import PostRunFacts
    from gpuscope.collect.collectors import CollectOptions
    from gpuscope.collect.collectors.schedule import Plan

BENCH_SIZE = 1024
"""Square matmul of the CPU peak benchmark: 2.1 GFLOP, tens of milliseconds on a few cores, large enough that the
BLAS kernel runs at full rate (on the project's 2-core machine 1024 reaches the rate of 1536 and 2048)."""
BENCH_REPEATS = 5
BENCH_BUDGET_S = 1.0
"""The benchmark keeps the fastest of at most BENCH_REPEATS timings, stopping once it has taken this long: noise on
a shared machine only ever adds time, so the fastest is the least disturbed (``timeit``'s reasoning)."""
FLOAT32_BUDGET_S = 0.5
"""The float32 benchmark's own budget, run beside one in the step's bfloat16 / float16: a 1024x1024 float32 matmul
takes 25 ms on one thread of the project's 2-core machine, so a warm-up and 5 timings take 0.15 s."""
PREDICT_SIZE = 256
"""One matmul of this size, first, predicts how long a BENCH_SIZE one takes in the dtype (see ``fitting_size``)."""
MIN_BENCH_SIZE = 128
MEASURED_DTYPES = ("float32", "bfloat16", "float16", "float64")
"""The step dtypes the CPU peak is measured in (float32 beside any other); a step in another is held against
float32's."""
CONV_SHAPE = (4, 16, 16)
"""The convolution timed in a low-precision dtype and in float32: 3x3, 16 channels to 16, on 4 images of 16x16
pixels (4.7 MFLOP). A small one: torch's reference kernel runs bfloat16 at about 2 GFLOP/s on the project's 2-core
machine whatever the shape, while float32 runs small convolutions slower than large ones (10-22 GFLOP/s for 3 or 16
channels, 75-120 for 32-64), so that the rate held against the step's convolutions is one a small CPU-trained
model reaches: the fix's gain is not over-promised (a distilled student's 16-channel convolutions: 49% predicted
from this shape, 49% measured; 59% from a 32-channel one)."""
CONV_REPEATS = 3
CONV_BUDGET_S = 0.3
"""Each dtype's convolution timings stop once they have taken this long (after a warm-up)."""
TOP_OPS = 8
EVALUATED_RETRIES = 3
"""A counted step that held an evaluation pass (the trained model's forward in eval mode or without gradients: a
test pass between epochs) is counted again on a later step, up to this many times: a loop whose every step has one
(an action chosen under ``no_grad``) keeps the last count."""
RECOUNT_MAX_S = 2.0
"""A count that took longer is not made again, whatever its step held: each further one would cost as much (an LBFGS
loop's steps of 670k ops took 6-10 s each to count, and every one held a test pass)."""

@register
class SpeedOfLightCollector(StepFollower):
    """Counts one step's FLOPs under FlopCounterMode (the peak is the cpu-peak probe's, or the GPU's datasheet)."""

    name: ClassVar[str] = "flops"
    field: ClassVar[str | None] = "speed_of_light"

    def __init__(self, start: int, cuda_start: int | None = None) -> None:
        """Count step ``start`` on a CPU run, ``cuda_start`` (after the CUDA-only sync window) on a CUDA run."""
        self.start_step = start
        self._window = StepWindow(start, 1, self._open, self._close,
                                  cuda_start=cuda_start if cuda_start is not None else start)
        self._mode: Any = None
        self._dtypes: dict[str, int] = {}
        self._flops: dict[str, int] = {}
        self._attention: list[AttentionCall] = []  # the step's first attention on a CPU
        self._tf32 = False
        self._recounts = 0  # counted steps that held an evaluation pass, counted again
        self._opened_at = 0.0  # when the count began
        self._kept: tuple[dict[str, int], dict[str, int], int] | None = None  # the last of them: flops, dtypes, step

    @classmethod
    def wants(cls, options: CollectOptions) -> WindowRequest | None:
        """One step, after every other profiling window."""
        return WindowRequest(1, after="syncs")

    @classmethod
    def create(cls, options: CollectOptions, plan: Plan) -> SpeedOfLightCollector:
        return cls(plan.start(cls.name) or 0, plan.start(cls.name, cuda=True))

    def unavailable_reason(self) -> str | None:
        return None

    def start(self, run_dir: Path) -> None:
        pass

    def _on_step(self, index: int) -> None:
        self._window.on_step(index, self._events, "the FLOP counter")  # type: ignore[arg-type]
        if self._window.over:
            self._unfollow()

    def _open(self, index: int) -> None:
        from torch.utils import flop_counter

        torch = sys.modules["torch"]
        dtypes = self._dtypes

        def tracking(formula: Any) -> Any:
            def count(*args: Any, **kwargs: Any) -> int:
                flops = formula(*args, **kwargs)
                for arg in args:
                    if isinstance(arg, torch.Tensor) and arg.layout != torch.strided:
                        flops = round(flops * stored_share(arg))
                tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
                if tensor is not None:
                    name = str(tensor.dtype).removeprefix("torch.")
                    dtypes[name] = dtypes.get(name, 0) + int(flops)
                return flops

            count._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode passes the tensors themselves
            return count

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            formulas = {**flop_counter.flop_registry, **cpu_formulas(torch, flop_counter, self._attention)}
            mode = flop_counter.FlopCounterMode(display=False,
                                                custom_mapping={k: tracking(v) for k, v in formulas.items()})
        if hasattr(mode, "mod_tracker"):
            mode.mod_tracker = _GlobalOnly()  # no global module hooks: see _GlobalOnly
        # the dispatch mode imports nothing the script would not (lazy_dynamo)
        leave_unimported(vars(getattr(flop_counter, "_FlopCounterMode", flop_counter.FlopCounterMode)).get(
            "__torch_dispatch__"))
        self._tf32 = bool(getattr(torch.backends.cuda.matmul, "allow_tf32", False))
        self._opened_at = time.perf_counter()
        mode.__enter__()
        self._mode = mode

    def _close(self) -> None:
        mode, self._mode = self._mode, None
        if mode is None:
            return
        mode.__exit__(None, None, None)
        counts = mode.get_flop_counts().get("Global", {})
        self._flops = {str(op).removeprefix("aten."): int(n) for op, n in counts.items() if n}
        step = self._window.counted[-1] if self._window.counted else None
        if step is not None and self._events is not None and self._events.step_evaluated(step) \
                and self._recounts < EVALUATED_RETRIES and time.perf_counter() - self._opened_at < RECOUNT_MAX_S:
            self._recounts += 1
            self._kept = (self._flops, dict(self._dtypes), step)
            self._flops = {}
            self._dtypes.clear()
            self._window.again(step + 2)  # the step beginning now is under way: the one after it

    def stop(self) -> CollectorResult:
        window = self._window
        ended_inside = window.state == "open"  # the run ended inside the counted step: it is not a whole step
        if ended_inside:
            try:
                window.finish()
            except Exception as exc:
                window.fail(f"leaving the FLOP counter failed: {exc}")
        if window.state == "failed":
            return CollectorResult(CollectorStatus("failed", window.reason))
        if (ended_inside or window.state == "waiting") and self._kept is not None:
            flops, dtypes, counted = self._kept  # no step without an evaluation pass came: the last one with
            self._flops, self._dtypes = flops, dict(dtypes)
        elif ended_inside:
            return CollectorResult(CollectorStatus("unavailable", "the run ended inside the counted step"))
        elif window.state == "waiting":
            return CollectorResult(CollectorStatus(
                "unavailable", f"the run ended before step {self.start_step}, the one whose FLOPs are counted"))
        else:
            counted = window.counted[0]
        total = sum(self._flops.values())
        if not total:
            return CollectorResult(CollectorStatus(
                "unavailable", f"step {counted} ran no matmul, convolution or attention that torch counts"))
        dtype = max(self._dtypes, key=lambda d: self._dtypes[d]) if self._dtypes else None
        top = dict(sorted(self._flops.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_OPS])
        cuda = self._events is not None and self._events.cuda_in_use()
        name, note = _gpu_name() if cuda else (None, "")
        return CollectorResult(CollectorStatus("ok"), FlopCount(
            flops_per_step=total, flops_by_op=top, step=counted, dtype=dtype, cuda=cuda, device_name=name,
            tf32=self._tf32, note=note, flops_by_dtype=dict(self._dtypes),
            attention=self._attention[0] if self._attention and not cuda else None))


def stored_share(tensor: Any) -> float:
    """The share of a sparse tensor's elements it stores: torch's formulas count a matmul of a sparse matrix as of a
    dense one, every element a multiply and an add (a graph network's normalised adjacency, 2708 x 2708 with 26,000
    edges: 270x its work)."""
    import torch

    stored = tensor._values() if tensor.layout == torch.sparse_coo else tensor.values()
    return stored.numel() / max(1, tensor.numel())


class _GlobalOnly:
    """Stands in for ``FlopCounterMode``'s ``ModuleTracker``, which registers *global* module hooks to split the
    counts by module: those put every module call of the counted step on torch's slow path, and make every
    ``torch.compile``d module warn on the user's stderr (a warning the script never shows under python). gpuscope
    reads only the ``Global`` counts."""

    parents = ("Global",)

    def __enter__(self) -> _GlobalOnly:
        return self

    def __exit__(self, *args: object) -> None:
        return None


def _gpu_name() -> tuple[str | None, str]:
    """The current GPU's model name, or None and why not."""
    torch = sys.modules["torch"]
    try:
        return torch.cuda.get_device_name(torch.cuda.current_device()), ""
    except Exception as exc:
        return None, f"the GPU's name could not be read: {exc}"


@register
class CpuPeakProbe(PostRunProbe):
    """After the run, on a CPU run whose step FLOPs were counted: this machine's matmul rate in the step's dtype,
    the best of a few square matmuls with the run's own thread count (what the step's matmuls could reach), and in
    float32 too where the step's dtype is another; a convolution in bfloat16 or float16 and in float32 where the
    step ran convolutions and FLOPs in that dtype; and the step's attention in both, where it ran in such a dtype
    (``collect/collectors/attention.py``)."""

    name: ClassVar[str] = "cpu-peak"
    field: ClassVar[str | None] = None  # read by the speed-of-light reduction, with the flops collector's count
    budget_s: ClassVar[float] = BENCH_BUDGET_S + FLOAT32_BUDGET_S + 2 * CONV_BUDGET_S + 2 * ATTENTION_BUDGET_S
    doing: ClassVar[str] = "timing this machine's matmul peak"

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock

    def run(self, run_dir: Path, facts: PostRunFacts) -> CollectorResult:
        count = facts.payloads.get("flops")
        torch = sys.modules.get("torch")
        if not isinstance(count, FlopCount) or torch is None:
            return CollectorResult(CollectorStatus("unavailable", "no step's FLOPs were counted"))
        if count.cuda:
            return CollectorResult(CollectorStatus("unavailable", "a CUDA run: the GPU's datasheet peak is used"))
        dtype = count.dtype if count.dtype in MEASURED_DTYPES else "float32"
        threads = torch.get_num_threads()
        peak = time_matmuls(torch, getattr(torch, dtype), clock=self._clock)
        source = f"measured here after the run: {peak.describe(dtype)} on {threads} thread{'s' if threads != 1 else ''}"
        float32 = None
        if dtype != "float32":
            timed = time_matmuls(torch, torch.float32, budget_s=FLOAT32_BUDGET_S, clock=self._clock)
            float32 = timed.flops_per_s
            source += f"; float32 for comparison: {float32 / 1e9:.1f} GFLOP/s, {timed.describe('float32')}"
        low = next((d for d in LOW_PRECISION if count.flops_by_dtype.get(d)), None)
        conv = {}
        if low is not None and any("convolution" in op for op in count.flops_by_op):
            conv = {d: time_conv(torch, getattr(torch, d), clock=self._clock) for d in (low, "float32")}
            batch, channels, size = CONV_SHAPE
            source += (f"; a 3x3 convolution of {channels} channels on {batch} images of {size}x{size}: "
                       + ", ".join(f"{d} {rate / 1e9:.2f} GFLOP/s" for d, rate in conv.items()))
        attention = {}
        if count.attention is not None and count.attention.dtype in LOW_PRECISION:
            timed_s = {d: time_attention(torch, count.attention, d, clock=self._clock)
                       for d in (count.attention.dtype, "float32")}
            attention = {d: t for d, t in timed_s.items() if t is not None}
            if len(attention) == 2:
                source += ("; the step's attention, forward and backward: "
                           + ", ".join(f"{d} {t * 1e3:.1f} ms" for d, t in attention.items()))
        return CollectorResult(CollectorStatus("ok"), CpuPeak(
            flops_per_s=peak.flops_per_s, dtype=dtype, device_name=platform.processor() or platform.machine() or "CPU",
            source=source, float32_flops_per_s=float32, conv_flops_per_s=conv, attention_s=attention))


@dataclass(frozen=True, slots=True)
class MatmulTiming:
    """The fastest of ``timed`` square ``size`` matmuls, as FLOP/s."""

    flops_per_s: float
    size: int
    timed: int

    def describe(self, dtype: str) -> str:
        return f"the fastest of {self.timed} {self.size}x{self.size} {dtype} matmuls"


def time_matmuls(torch: Any, dtype: Any, size: int = BENCH_SIZE, repeats: int = BENCH_REPEATS,
                 budget_s: float = BENCH_BUDGET_S, clock: Callable[[], float] = time.perf_counter) -> MatmulTiming:
    """The fastest of up to ``repeats`` square matmuls in ``dtype`` (one warm-up first), within about ``budget_s``:
    ``size``, or smaller where one would take over a quarter of the budget (``fitting_size``). Its own generator:
    the global RNG is not touched."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        size = fitting_size(torch, dtype, size, budget_s, clock)
        a = torch.randn(size, size, generator=generator).to(dtype)
        b = torch.randn(size, size, generator=generator).to(dtype)
        best, timed = fastest(lambda: torch.mm(a, b), repeats, budget_s, clock)
    return MatmulTiming(2 * size**3 / best if best > 0 else 0.0, size, timed)


def fitting_size(torch: Any, dtype: Any, size: int, budget_s: float, clock: Callable[[], float]) -> int:
    """``size``, halved (to MIN_BENCH_SIZE at least) while one matmul would take over a quarter of ``budget_s``, as
    predicted from one PREDICT_SIZE matmul: a dtype this CPU has no matrix instructions for still gets a warm-up and
    a few timings within the budget (bfloat16 on the project's 2-core machine: about 1 GFLOP/s, 2 s for one
    1024x1024 matmul, 0.2 s at 512)."""
    n = min(PREDICT_SIZE, size)
    a = torch.ones(n, n, dtype=dtype)
    before = clock()
    torch.mm(a, a)
    took = clock() - before
    if took <= 0:
        return size
    rate = 2 * n**3 / took
    while size > max(n, MIN_BENCH_SIZE) and 2 * size**3 / rate > budget_s / 4:
        size //= 2
    return size


def time_conv(torch: Any, dtype: Any, repeats: int = CONV_REPEATS, budget_s: float = CONV_BUDGET_S,
              clock: Callable[[], float] = time.perf_counter) -> float:
    """FLOP/s of the fastest of up to ``repeats`` CONV_SHAPE convolutions in ``dtype`` (one warm-up first), within
    about ``budget_s``. Its own generator: the global RNG is not touched."""
    batch, channels, size = CONV_SHAPE
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, channels, size, size, generator=generator).to(dtype)
    weight = torch.randn(channels, channels, 3, 3, generator=generator).to(dtype)
    with torch.no_grad():
        best, _ = fastest(lambda: torch.nn.functional.conv2d(images, weight, padding=1), repeats, budget_s, clock)
    return 2 * batch * channels * channels * 9 * size * size / best if best > 0 else 0.0
