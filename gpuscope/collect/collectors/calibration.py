"""This machine's fixed cost per torch op, so the diagnosis can say how much of a step is per-op overhead.

After the script has ended and every other collector has stopped (nothing of the user's is timed or disturbed,
no hook sees these steps), a few training steps of a model made of
tiny tensors: their arithmetic is nil, so their time is all fixed cost per op. Ops are counted by torch.profiler,
exactly as the user's ops are counted in the trace window, so ``ops per step x cost per op`` compares with the
user's step time. The global RNG state is restored afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpuscope.collect import warning_filters
from gpuscope.collect.framework.base import CollectorResult, PostRunProbe, register
from gpuscope.record import Calibration, CollectorStatus, Practices

if TYPE_CHECKING:
    from gpuscope.collect.captures import PostRunFacts

LAYERS = 8
"""Linear layers of width 2 in the calibration model: a forward, a backward and an SGD step of a few hundred ops."""
TIMED_STEPS = 20
REPEATS = 5
"""The cost per step is the fastest of REPEATS timings of TIMED_STEPS steps: on a shared machine noise only ever
adds time (another process takes the core for a while), so the least disturbed burst is the fastest one, the same
reason ``timeit`` reports its best repeat. Short bursts (about 20 ms) are likelier to go undisturbed, and the user
waits for them: the whole probe takes about a tenth of a second. The diagnosis compares it with the run's fast
steps (``p10_s``)."""
WARM_STEPS = 10
COUNTED_STEPS = 2
ANOMALY_SCALE = 4
"""Under anomaly detection a step takes about ten times as long (a stack trace is kept per op): its steps and
repeats are this many times fewer."""


@register
class CalibrationCollector(PostRunProbe):
    """Measures the fixed cost per op at the end of the run (CPU only: on CUDA the kernel timeline says more);
    also what anomaly detection adds per op, when the practices collector saw the run use it."""

    name: ClassVar[str] = "calibration"
    reads: ClassVar[tuple[str, ...]] = ("practices",)  # anomaly detection on: its per-op cost is timed too
    field: ClassVar[str | None] = "calibration"
    budget_s: ClassVar[float] = 3.0
    doing: ClassVar[str] = "timing the fixed cost of a torch op on this machine"

    def run(self, run_dir: Path, facts: PostRunFacts) -> CollectorResult:
        torch = sys.modules.get("torch")
        if torch is None:
            return CollectorResult(CollectorStatus("unavailable", "the script did not use torch"))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return CollectorResult(CollectorStatus("unavailable", "a CUDA run: the kernel timeline is the evidence"))
        # (torch.profiler's and anomaly mode's warnings are not the user's business)
        with torch.random.fork_rng(devices=[]), torch.enable_grad(), warning_filters.ignored():
            calibration = measure_op_overhead(torch)
            practices = facts.payloads.get("practices")
            if isinstance(practices, Practices) and practices.anomaly_steps > 0:
                anomalous = measure_op_overhead(torch, anomaly=True)
                extra = anomalous.step_s - calibration.step_s
                calibration = dataclasses.replace(
                    calibration, anomaly_op_overhead_s=max(0.0, extra) / anomalous.ops_per_step
                    if anomalous.ops_per_step else None)
            return CollectorResult(CollectorStatus("ok"), calibration)


def measure_op_overhead(torch: Any, anomaly: bool = False) -> Calibration:
    """Time and count the ops of a tiny model's training steps (under anomaly detection if ``anomaly``, fewer)."""
    from torch.profiler import ProfilerActivity, profile

    from gpuscope.collect.lazy_dynamo import inductor_left_unimported
    from gpuscope.collect.collectors.torch_trace import kineto_quiet

    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(LAYERS)])
    params = list(model.parameters())
    # torch.optim's SGD where the script's process has imported torch._dynamo (every torch.optim optimizer imports it:
    # a script that stepped one); else the same update by hand, as a loop without torch.optim makes it (SGD would
    # import it here: 1.2 s of this probe, and an optimizer's Python the script's steps do not run)
    if "torch._dynamo" in sys.modules:
        optimizer = torch.optim.SGD(params, lr=0.01)
        zero_grad, update = optimizer.zero_grad, optimizer.step
    else:
        zero_grad, update = functools.partial(_zero_grad, params), functools.partial(_sgd_update, torch, params)
    x = torch.ones(1, 2)
    mode = torch.autograd.detect_anomaly if anomaly else contextlib.nullcontext

    def step() -> None:
        with mode():
            loss = model(x).sum()
            zero_grad()
            loss.backward()
        update()

    scale = ANOMALY_SCALE if anomaly else 1
    steps, repeats = TIMED_STEPS // scale, max(2, REPEATS // scale)
    for _ in range(WARM_STEPS // scale):
        step()
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(steps):
            step()
        timings.append((time.perf_counter() - started) / steps)
    step_s = min(timings)
    with kineto_quiet(), inductor_left_unimported():
        prof = profile(activities=[ProfilerActivity.CPU])
        prof.start()
        for _ in range(COUNTED_STEPS):
            step()
        prof.stop()
    ops = sum(a.count for a in prof.key_averages() if not getattr(a, "is_user_annotation", False)) / COUNTED_STEPS
    return Calibration(op_overhead_s=step_s / ops if ops else 0.0, ops_per_step=ops, step_s=step_s)


def _zero_grad(params: list[Any]) -> None:
    """SGD's ``zero_grad()``: the gradients set to None."""
    for p in params:
        p.grad = None


def _sgd_update(torch: Any, params: list[Any]) -> None:
    """SGD's update on a CPU (lr 0.01, no momentum, one tensor at a time), by hand."""
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-0.01)
