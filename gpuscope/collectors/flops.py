"""Speed of light: the FLOPs of one training step, and the device's peak to hold them against.

One steady step, after every other profiling window (cProfile, torch.profiler, the sync count), runs under
``torch.utils.flop_counter.FlopCounterMode``, entered as the step begins and left as the next one begins (at the
step boundaries, which are outside any op). The mode is a TorchDispatchMode, so it sees every aten op of the step,
backward included (the autograd engine carries dispatch modes to its threads), and counts matrix multiplies,
convolutions and attention with torch's formulas: 2 x M x N x K for a matmul (a multiply and an add per term).
Element-wise ops and the optimizer's update are not counted, as in every MFU figure. The counted step runs slower
(every op goes through Python), so it is marked profiled and left out of the step figures.

The peak: on CUDA, the detected GPU model's datasheet figure for the matmuls' dtype (``analysis/peaks.py``); on a
CPU run, this machine measured at the end of the run: the best of a few square matmuls in the step's dtype with the
run's own thread count, which is what the step's matmuls could reach at most.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

from gpuscope.analysis.peaks import gpu_peak_flops
from gpuscope.collectors.base import CollectorResult, StepFollower
from gpuscope.record import CollectorStatus, SpeedOfLight

BENCH_SIZE = 1024
"""Square matmul of the CPU peak benchmark: 2.1 GFLOP, tens of milliseconds on a few cores, large enough that the
BLAS kernel runs at full rate (on the project's 2-core machine 1024 reaches the rate of 1536 and 2048)."""
BENCH_REPEATS = 10
BENCH_BUDGET_S = 1.0
"""The benchmark keeps the fastest of at most BENCH_REPEATS timings, stopping once it has taken this long: noise on
a shared machine only ever adds time, so the fastest is the least disturbed (``timeit``'s reasoning)."""
TOP_OPS = 8

State = Literal["waiting", "counting", "done", "failed"]


class SpeedOfLightCollector(StepFollower):
    """Counts one step's FLOPs under FlopCounterMode; at stop, finds the device's peak."""

    name: ClassVar[str] = "flops"

    def __init__(self, start: int, cuda_start: int | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        """Count step ``start`` on a CPU run, ``cuda_start`` (after the CUDA-only sync window) on a CUDA run."""
        self.start_step = start
        self.cuda_start = cuda_start if cuda_start is not None else start
        self._clock = clock
        self._state: State = "waiting"
        self._reason = ""
        self._mode: Any = None
        self._dtypes: dict[str, int] = {}
        self._counted: int | None = None
        self._flops: dict[str, int] = {}
        self._tf32 = False

    def unavailable_reason(self) -> str | None:
        return None

    def start(self, run_dir: Path) -> None:
        pass

    def _on_step(self, index: int) -> None:
        try:
            if self._state == "waiting" and index >= self.start_step:
                cuda = self._steps_collector.cuda_in_use()
                if index >= (self.cuda_start if cuda else self.start_step):
                    self._open(index)
            elif self._state == "counting":
                self._close()
        except Exception as exc:  # the user's step goes on; this collector reports failed
            self._fail(f"the FLOP counter failed: {type(exc).__name__}: {exc}")

    def _open(self, index: int) -> None:
        from torch.utils.flop_counter import FlopCounterMode, flop_registry

        torch = sys.modules["torch"]
        dtypes = self._dtypes

        def tracking(formula: Any) -> Any:
            def count(*args: Any, **kwargs: Any) -> int:
                flops = formula(*args, **kwargs)
                tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
                if tensor is not None:
                    name = str(tensor.dtype).removeprefix("torch.")
                    dtypes[name] = dtypes.get(name, 0) + int(flops)
                return flops

            count._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode passes the tensors themselves
            return count

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mode = FlopCounterMode(display=False, custom_mapping={k: tracking(v) for k, v in flop_registry.items()})
        self._tf32 = bool(getattr(torch.backends.cuda.matmul, "allow_tf32", False))
        mode.__enter__()
        self._mode = mode
        self._state = "counting"
        self._counted = index
        self._steps_collector.window_opened()

    def _close(self) -> None:
        mode, self._mode = self._mode, None
        self._state = "done"
        try:
            mode.__exit__(None, None, None)
            counts = mode.get_flop_counts().get("Global", {})
            self._flops = {str(op).removeprefix("aten."): int(n) for op, n in counts.items() if n}
        finally:
            self._steps_collector.window_closed()

    def _fail(self, reason: str) -> None:
        if self._state == "counting":
            try:
                self._close()
            except Exception as exc:
                reason = f"{reason}; leaving the FLOP counter failed: {exc}"
        self._state, self._reason = "failed", reason

    def stop(self) -> CollectorResult:
        if self._state == "counting":  # the run ended inside the counted step: it is not a whole step
            try:
                self._close()
            except Exception as exc:
                self._fail(f"leaving the FLOP counter failed: {exc}")
            if self._state != "failed":
                self._state, self._reason = "failed", "the run ended inside the counted step"
                return CollectorResult(CollectorStatus("unavailable", self._reason))
        if self._state == "failed":
            return CollectorResult(CollectorStatus("failed", self._reason))
        if self._state == "waiting":
            return CollectorResult(CollectorStatus(
                "unavailable", f"the run ended before step {self.start_step}, the one whose FLOPs are counted"))
        total = sum(self._flops.values())
        if not total:
            return CollectorResult(CollectorStatus(
                "unavailable", f"step {self._counted} ran no matmul, convolution or attention that torch counts"))
        torch = sys.modules["torch"]
        dtype = max(self._dtypes, key=lambda d: self._dtypes[d]) if self._dtypes else None
        top = dict(sorted(self._flops.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_OPS])
        result = SpeedOfLight(flops_per_step=total, flops_by_op=top, step=self._counted, dtype=dtype)
        if self._steps_collector.cuda_in_use():
            result = self._gpu_peak(torch, result)
        else:
            result = self._cpu_peak(torch, result)
        return CollectorResult(CollectorStatus("ok"), result)

    def _gpu_peak(self, torch: Any, result: SpeedOfLight) -> SpeedOfLight:
        import dataclasses

        try:
            name = torch.cuda.get_device_name(torch.cuda.current_device())
        except Exception as exc:
            return dataclasses.replace(result, note=f"the GPU's name could not be read: {exc}")
        dtype = result.dtype or "float32"
        table_dtype = "tfloat32" if dtype == "float32" and self._tf32 else dtype
        peak, source = gpu_peak_flops(name, table_dtype)
        return dataclasses.replace(result, device_name=name, peak_flops_per_s=peak, peak_source=source,
                                   dtype=table_dtype if peak is not None else dtype,
                                   note="" if peak is not None else source)

    def _cpu_peak(self, torch: Any, result: SpeedOfLight) -> SpeedOfLight:
        import dataclasses
        import platform

        dtype = result.dtype if result.dtype in ("float32", "bfloat16", "float16") else "float32"
        threads = torch.get_num_threads()
        peak = measure_cpu_peak(torch, getattr(torch, dtype), clock=self._clock)
        return dataclasses.replace(
            result, device_name=platform.processor() or platform.machine() or "CPU", peak_flops_per_s=peak,
            peak_measured=True, peak_source=(f"measured here after the run: the fastest of {BENCH_REPEATS} "
                                             f"{BENCH_SIZE}x{BENCH_SIZE} {dtype} matmuls on {threads} threads"))


def measure_cpu_peak(torch: Any, dtype: Any, size: int = BENCH_SIZE, repeats: int = BENCH_REPEATS,
                     budget_s: float = BENCH_BUDGET_S, clock: Callable[[], float] = time.perf_counter) -> float:
    """FLOP/s of the fastest of up to ``repeats`` square ``size`` matmuls in ``dtype`` (one warm-up first), within
    about ``budget_s``. Its own generator: the global RNG is not touched."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        a = torch.randn(size, size, generator=generator).to(dtype)
        b = torch.randn(size, size, generator=generator).to(dtype)
        torch.mm(a, b)
        started = clock()
        best = float("inf")
        for _ in range(repeats):
            before = clock()
            torch.mm(a, b)
            best = min(best, clock() - before)
            if clock() - started > budget_s:
                break
    return 2 * size**3 / best if best > 0 else 0.0
