"""After the run, on a CPU run whose step FLOPs were counted (``flops.py``): this machine's matmul rate in the
step's dtype, and in float32 beside it; a convolution and the step's attention in low precision and in float32 where
the step ran them so; and, on a float32 step where this machine's bfloat16 matmuls are faster, the step's heaviest
matmul and convolution shapes and its attention in float32 and in bfloat16 (``autocast_timing``). The speed-of-light
reduction holds the count against it."""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpuscope.collect.attention import ATTENTION_BUDGET_S, time_attention
from gpuscope.collect.autocast_timing import (AUTOCAST_BUDGET_S, NO_FASTER, SHAPES_KEPT, Timed, bfloat16_faster,
                                              describe, time_autocast)
from gpuscope.collect.captures import LOW_PRECISION, CpuPeak, FlopCount
from gpuscope.collect.framework.base import CollectorResult, PostRunProbe, register
from gpuscope.collect.framework.probing import fastest
from gpuscope.record import CollectorStatus

if TYPE_CHECKING:
    from gpuscope.collect.captures import PostRunFacts

BENCH_SIZE = 1024
"""Square matmul of the CPU peak benchmark: 2.1 GFLOP, tens of milliseconds on a few cores, large enough that the
BLAS kernel runs at full rate (on the project's 2-core machine 1024 reaches the rate of 1536 and 2048)."""
BENCH_REPEATS = 5
BENCH_BUDGET_S = 1.0
"""The benchmark keeps the fastest of at most BENCH_REPEATS timings, stopping once it has taken this long: noise on
a shared machine only ever adds time, so the fastest is the least disturbed (``timeit``'s reasoning)."""
RETRY_REPEATS = 50
RETRY_BUDGET_S = 2.0
"""Where the benchmark came out below the run's own rate (its FLOPs over its median step), it was slowed: timed
again, up to this many times within this long, and the faster kept. It is timed once more at the probe's end too.
This VM's matmul rate drifts by a quarter over seconds (1024x1024 float32, 5 timings half a second apart: 149-201
GFLOP/s); a ResNet-18's run at 141 GFLOP/s was held against a benchmark's 132 and read as at its peak."""
FLOAT32_BUDGET_S = 0.5
"""The float32 benchmark's own budget, run beside one in the step's bfloat16 / float16: room for a warm-up and 5
timings of a 1024x1024 matmul on one thread of a small CPU."""
PREDICT_SIZE = 256
"""One matmul of this size, first, predicts how long a BENCH_SIZE one takes in the dtype (see ``fitting_size``)."""
MIN_BENCH_SIZE = 128
MEASURED_DTYPES = ("float32", "bfloat16", "float16", "float64")
"""The step dtypes the CPU peak is measured in (float32 beside any other); a step in another is held against
float32's."""
CONV_SHAPE = (4, 16, 16)
"""The convolution timed in a low-precision dtype and in float32: 3x3, 16 channels to 16, on 4 images of 16x16
pixels (4.7 MFLOP). A small one: torch's reference kernel runs bfloat16 at one rate whatever the shape, while float32
runs small convolutions slower than large ones, so the float32 rate held against the step's convolutions is one a
small CPU-trained model reaches and the fix's gain is not over-promised (figures in docs/measurements.md)."""
CONV_REPEATS = 3
CONV_BUDGET_S = 0.3
"""Each dtype's convolution timings stop once they have taken this long (after a warm-up)."""

@register
class CpuPeakProbe(PostRunProbe):
    """After the run, on a CPU run whose step FLOPs were counted: this machine's matmul rate in the step's dtype,
    the best of a few square matmuls with the run's own thread count (what the step's matmuls could reach), and in
    float32 too where the step's dtype is another; a convolution in bfloat16 or float16 and in float32 where the
    step ran convolutions and FLOPs in that dtype; and the step's attention in both, where it ran in such a dtype
    (``collect/attention.py``)."""

    name: ClassVar[str] = "cpu-peak"
    reads: ClassVar[tuple[str, ...]] = ("flops",)  # the counted step: its dtype, convolutions and attention
    field: ClassVar[str | None] = None  # read by the speed-of-light reduction, with the flops collector's count
    budget_s: ClassVar[float] = (2 * BENCH_BUDGET_S + RETRY_BUDGET_S + FLOAT32_BUDGET_S + 2 * CONV_BUDGET_S
                                 + 2 * ATTENTION_BUDGET_S + 2 * SHAPES_KEPT * 4 * AUTOCAST_BUDGET_S)
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
        timings = [f"{peak.flops_per_s / 1e9:.1f} GFLOP/s at the probe's start"]
        achieved = count.flops_per_step / facts.median_s if facts.median_s else 0.0
        if peak.flops_per_s < achieved:  # slowed: time it again, longer
            again = time_matmuls(torch, getattr(torch, dtype), repeats=RETRY_REPEATS, budget_s=RETRY_BUDGET_S,
                                 clock=self._clock)
            timings.append(f"under the run's own {achieved / 1e9:.1f} GFLOP/s, so {again.timed} more: "
                           f"{again.flops_per_s / 1e9:.1f} GFLOP/s")
            peak = max(peak, again, key=lambda timing: timing.flops_per_s)
        source = ""
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
        # (a float32 step whose shapes are timed under bfloat16 autocast: its attention too, which autocast would run
        # in bfloat16, where torch's CPU flash attention can run slower)
        faster = dtype == "float32" and bool(count.heavy_ops) and bfloat16_faster(torch, self._clock)
        attention = {}
        attention_dtype = count.attention.dtype if count.attention is not None else ""
        if count.attention is not None and (attention_dtype in LOW_PRECISION or faster):
            timed_s = {d: time_attention(torch, count.attention, d, clock=self._clock)
                       for d in (attention_dtype if attention_dtype in LOW_PRECISION else "bfloat16", "float32")}
            attention = {d: t for d, t in timed_s.items() if t is not None}
            if len(attention) == 2:
                source += ("; the step's attention, forward and backward: "
                           + ", ".join(f"{d} {t * 1e3:.1f} ms" for d, t in attention.items()))
        autocast: tuple[Timed, ...] = ()
        if dtype == "float32" and count.heavy_ops:
            if faster:
                autocast = time_autocast(torch, count.heavy_ops, clock=self._clock)
                source += "; the step's heaviest shapes, float32 against bfloat16 autocast: " + ", ".join(
                    f"{describe(op)} {f32 * 1e3:.1f} against {low * 1e3:.1f} ms" for op, f32, low, _, _ in autocast)
            else:
                source += f"; {NO_FASTER}: the step's shapes not timed in it"
        # timed once more at the end: a slow spell of a shared machine seldom lasts the whole probe
        later = time_matmuls(torch, getattr(torch, dtype), clock=self._clock)
        timings.append(f"{later.flops_per_s / 1e9:.1f} GFLOP/s at its end")
        peak = max(peak, later, key=lambda timing: timing.flops_per_s)
        plural = "s" if threads != 1 else ""
        source = (f"measured here after the run: {peak.describe(dtype)} on {threads} thread{plural} ("
                  f"{'; '.join(timings)}){source}")
        return CollectorResult(CollectorStatus("ok"), CpuPeak(
            flops_per_s=peak.flops_per_s, dtype=dtype, device_name=platform.processor() or platform.machine() or "CPU",
            source=source, float32_flops_per_s=float32, conv_flops_per_s=conv, attention_s=attention,
            autocast=autocast))


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
