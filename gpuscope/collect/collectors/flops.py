"""Speed of light: the FLOPs of one training step, and the device's peak to hold them against.

One steady step, after every other profiling window (cProfile, torch.profiler, the sync count), runs under
``torch.utils.flop_counter.FlopCounterMode`` (at half its cost per op: ``collect/lean_flops.py``), entered as the step
begins and left as the next one begins (at the step boundaries, which are outside any op). The mode is a
TorchDispatchMode, so it sees every aten op of the step, backward included (the autograd engine carries dispatch modes
to its threads), and counts matrix multiplies, convolutions and attention with torch's formulas: 2 x M x N x K for a
matmul (a multiply and an add per term). Element-wise ops and the optimizer's update are not counted, as in every MFU
figure. A matmul of a sparse matrix counts the elements it stores (``stored_share``), where torch's formulas count it as
dense; a CPU's flash attention, which torch's counter has no formula for, is counted with the GPU one's, and so are the
fused ops a TransformerEncoderLayer and a MultiheadAttention run in eval mode without gradients, whose inner matmuls the
mode does not see (``collect/attention.py``). The counted step runs slower (every op goes through Python), so it is
marked profiled and left out of the step figures. Where the optimizer calls its closure several times a step (LBFGS),
one call is counted and multiplied by the step's calls (``PER_CLOSURE_CALLS``); where such steps are also long, that
call is the traced step's second (its first is the trace's: ``schedule.WindowRequest.closure_share``), so a run of three
steps gets a trace and a count both. Where the windows are placed one step each (long steps, a short run) and a step
makes one pass, no step is counted: the traced step's FLOPs are read after the run from the shapes the trace recorded
(``collect/trace_flops.py``), as where a run ends before its counted step.

The peak: on CUDA, the detected GPU model's datasheet figure for the matmuls' dtype (looked up by the analysis,
``reduce/peaks.py``); on a CPU run, this machine measured after the run by the ``cpu-peak`` probe: the best of a few
square matmuls in the step's dtype with the run's own thread count, which is what the step's matmuls could reach at
most; where that dtype is not float32, float32 as well, so that the analysis can tell a CPU whose bfloat16 or float16
matmuls are slower than its float32 ones (no matrix instructions for them: emulated). Where the step ran convolutions
and some of its FLOPs in bfloat16 or float16 (a model under ``torch.autocast``, beside others in float32), one
convolution in that dtype and in float32 too: without instructions for the dtype, torch runs its convolutions on a slow
reference kernel (``aten::_slow_conv2d_forward``), as it runs float64 ones on any CPU (as an unfolding and a float64
matmul: the matmul rates hold for those).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpuscope.collect import lean_flops, warning_filters
from gpuscope.collect.attention import cpu_formulas, fast_path_formulas
from gpuscope.collect.autocast_timing import HeavyOps
from gpuscope.collect.callsites import call_site, user_frame
from gpuscope.collect.captures import AttentionCall, FlopCount, HeavyOp
from gpuscope.collect.collectors.torch_trace import TRACE_FILE
from gpuscope.collect.framework.base import CollectorResult, StepFollower, StepWindow, WindowRequest, register
from gpuscope.collect.framework.schedule import PER_CLOSURE_CALLS
from gpuscope.collect.rnn_flops import rnn_formulas
from gpuscope.collect.trace_flops import trace_flops
from gpuscope.record import CollectorStatus, ProbabilityLoss

if TYPE_CHECKING:
    from gpuscope.collect.framework.options import CollectOptions
    from gpuscope.collect.framework.schedule import Plan, Window

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

    def __init__(self, start: int | None, cuda_start: int | None = None) -> None:
        """Count step ``start`` on a CPU run, ``cuda_start`` (after the CUDA-only sync window) on a CUDA run; neither
        (the windows placed one step each, a step one pass): read the traced step's FLOPs from its shapes."""
        self.start_step = start or 0
        self._window = StepWindow(start, 1, self._open, self._close,
                                  cuda_start=cuda_start if cuda_start is not None else start)
        self._mode: Any = None
        self._dtypes: dict[str, int] = {}
        self._heavy = HeavyOps()  # on a CPU run, the counted step's matmul and convolution FLOPs by shape
        self._flops: dict[str, int] = {}
        self._attention: list[AttentionCall] = []  # the step's first attention on a CPU
        self._probability_loss: list[ProbabilityLoss] = []  # the step's first BCELoss
        self._tf32 = False
        self._recounts = 0  # counted steps that held an evaluation pass, counted again
        self._opened_at = 0.0  # when the count began
        self._kept: tuple[dict[str, int], dict[str, int], int] | None = None  # the last of them: flops, dtypes, step
        self._kept_heavy: tuple[HeavyOp, ...] = ()  # ... and its heaviest shapes
        self._calls_seen = 0  # closure calls counted by the step boundary before
        self._calls_before = 0  # ... in the step before the one beginning
        self._closure_base: int | None = None  # counting one closure call: the calls before the counted step's
        self._second_call = {False: False, True: False}  # the count is its step's second closure call (CPU, CUDA)
        self._enter_after = 0  # closure calls of the counted step before the count begins: 0 or 1
        self._entered = False
        self._exited = False  # the mode was left inside the step, as its counted closure call returned
        self._run_dir: Path | None = None
        self.scaled_by = 0
        """Where the count was one closure call's: the counted step's calls it was multiplied by."""

    @classmethod
    def wants(cls, options: CollectOptions) -> WindowRequest | None:
        """One step, after every other profiling window; where the windows are placed one step each, the traced
        step's second closure call where steps call it several times, else none (``from_trace``)."""
        return WindowRequest(1, after="syncs", closure_share="torch-trace", from_trace="torch-trace")

    @classmethod
    def create(cls, options: CollectOptions, plan: Plan) -> SpeedOfLightCollector:
        return cls(plan.start(cls.name), plan.start(cls.name, cuda=True))

    def unavailable_reason(self) -> str | None:
        return None

    @property
    def _traced_only(self) -> bool:
        """No step is counted on either kind of run: the traced step's FLOPs are read from its shapes."""
        return self._window.start is None and self._window.cuda_start is None

    def start(self, run_dir: Path) -> None:
        self._run_dir = run_dir

    def move_window(self, cpu: Window | None, cuda: Window | None) -> None:
        if self._window.state == "waiting":
            self._second_call = {False: bool(cpu and cpu.second_call), True: bool(cuda and cuda.second_call)}
        self._window.move(cpu, cuda)
        self.start_step = self._window.start if self._window.start is not None else self.start_step

    def _on_step(self, index: int) -> None:
        calls = self._events.closure_calls()  # type: ignore[union-attr]
        self._calls_before, self._calls_seen = calls - self._calls_seen, calls
        self._window.on_step(index, self._events, "the FLOP counter")  # type: ignore[arg-type]
        if self._window.over:
            self._unfollow()

    def _open(self, index: int) -> None:
        from torch.utils import flop_counter

        torch = sys.modules["torch"]
        dtypes = self._dtypes
        heavy = None if self._events.cuda_in_use() else self._heavy  # type: ignore[union-attr]

        def tracking(op: str, formula: Any) -> Any:
            def count(*args: Any, **kwargs: Any) -> int:
                flops = formula(*args, **kwargs)
                if heavy is not None:
                    heavy.add(op, args, flops)
                sparse = False
                for arg in args:
                    if isinstance(arg, torch.Tensor) and arg.layout != torch.strided:
                        flops, sparse = round(flops * stored_share(arg)), True
                tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
                if tensor is not None:
                    name = str(tensor.dtype).removeprefix("torch.")
                    dtypes[name] = dtypes.get(name, 0) + int(flops)
                if sparse:  # (kept with the dtypes, which are multiplied and cleared with the count: popped after)
                    dtypes[SPARSE] = dtypes.get(SPARSE, 0) + int(flops)
                return flops

            count._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode passes the tensors themselves
            return count

        with warning_filters.ignored():
            formulas = {**flop_counter.flop_registry, **cpu_formulas(torch, flop_counter, self._attention),
                        **fast_path_formulas(torch), **rnn_formulas(torch)}
            mapping = {k: tracking(str(k), v) for k, v in formulas.items()}
            mapping.update(probability_loss(torch, self._probability_loss))
            mode = lean_flops.counter(display=False, custom_mapping=mapping)
        if hasattr(mode, "mod_tracker"):
            mode.mod_tracker = _GlobalOnly()  # no global module hooks: see _GlobalOnly
        self._tf32 = bool(getattr(torch.backends.cuda.matmul, "allow_tf32", False))
        self._opened_at = time.perf_counter()
        self._closure_base = None
        self._enter_after = int(self._second_call[self._events.cuda_in_use()])  # type: ignore[union-attr]
        self._entered, self._exited = False, False
        if self._enter_after or self._calls_before >= PER_CLOSURE_CALLS:
            self._closure_base = self._calls_seen
            self._events.on_closure_end(self._closure_ended)  # type: ignore[union-attr]
        self._mode = mode
        if not self._enter_after:
            mode.__enter__()
            self._entered = True

    def _closure_ended(self) -> None:
        """A closure call of the counted step has returned: the count begins after the first where it is the
        second's, and stops after the call it counts (``PER_CLOSURE_CALLS``)."""
        if self._mode is None:
            return
        if not self._entered:
            self._mode.__enter__()
            self._entered = True
            return
        self._events.off_closure_end(self._closure_ended)  # type: ignore[union-attr]
        self._mode.__exit__(None, None, None)
        self._exited = True

    def _close(self) -> None:
        mode, self._mode = self._mode, None
        if mode is None:
            return
        if self._closure_base is not None:
            self._events.off_closure_end(self._closure_ended)  # type: ignore[union-attr]
        if self._entered and not self._exited:
            mode.__exit__(None, None, None)
        step = self._window.counted[-1] if self._window.counted else None
        if self._enter_after and not self._exited:  # the step's second call never returned: the next but one's
            self._second_call = {False: False, True: False}  # ... first call, counted as where steps are short
            self._dtypes.clear()
            self._heavy.clear()
            if step is not None:
                self._window.again(step + 2)
            return
        counts = mode.get_flop_counts().get("Global", {})
        self._flops = {str(op).removeprefix("aten."): int(n) for op, n in counts.items() if n}
        if self._closure_base is not None:
            calls = self._events.closure_calls() - self._closure_base  # type: ignore[union-attr]
            if calls >= 1:  # one call counted, the step's calls run: each the same passes
                self.scaled_by = calls
                self._flops = {op: n * calls for op, n in self._flops.items()}
                self._dtypes.update({d: n * calls for d, n in self._dtypes.items()})
        if step is not None and self._events is not None and self._events.step_evaluated(step) \
                and not self._enter_after \
                and self._recounts < EVALUATED_RETRIES and time.perf_counter() - self._opened_at < RECOUNT_MAX_S:
            self._recounts += 1
            self._kept, self._kept_heavy = (self._flops, dict(self._dtypes), step), self._heavy.top()
            self._heavy.clear()
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
        if self._traced_only and window.state == "waiting":
            return self._from_trace("the windows placed one step each: no step of its own under the FLOP counter")
        if (ended_inside or window.state == "waiting") and self._kept is not None:
            flops, dtypes, counted = self._kept  # no step without an evaluation pass came: the last one with
            self._flops, self._dtypes, heavy = flops, dict(dtypes), self._kept_heavy
        elif ended_inside and not (self._closure_base is not None and self._exited):
            # (a closure call counted whole stands; where the run's last step was the one before the counted one, the
            # step that began as it ended never ran)
            return self._from_trace(
                f"the run ended before step {window.current}, the one whose FLOPs are counted, was over")
        elif window.state == "waiting":
            return self._from_trace(f"the run ended before step {self.start_step}, the one whose FLOPs are counted")
        else:
            counted, heavy = (window.counted[0] if window.counted else window.current), self._heavy.top()
        if not sum(self._flops.values()):
            return CollectorResult(CollectorStatus(
                "unavailable", f"step {counted} ran no matmul, convolution or attention that torch counts"))
        which = "second call of the optimizer's closure counted (its first was traced)" if self._enter_after \
            else "first call of the optimizer's closure counted"
        notes = (f"step {counted}'s FLOPs: its {which}, times its {self.scaled_by} calls",) if self.scaled_by else ()
        return self._counted(self._flops, self._dtypes, counted, self._tf32, notes,
                             self._attention[0] if self._attention else None, heavy,
                             self._probability_loss[0] if self._probability_loss else None)

    def _counted(self, flops: dict[str, int], dtypes: dict[str, int], step: int, tf32: bool, notes: tuple[str, ...],
                 attention: AttentionCall | None = None, heavy: tuple[HeavyOp, ...] = (),
                 probability_loss: ProbabilityLoss | None = None) -> CollectorResult:
        dtypes = dict(dtypes)
        sparse = dtypes.pop(SPARSE, 0)
        dtype = max(dtypes, key=lambda d: dtypes[d]) if dtypes else None
        top = dict(sorted(flops.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_OPS])
        cuda = self._events is not None and self._events.cuda_in_use()
        name, note = _gpu_name() if cuda else (None, "")
        return CollectorResult(CollectorStatus("ok"), notes=notes, payload=FlopCount(
            flops_per_step=sum(flops.values()), flops_by_op=top, step=step, dtype=dtype, cuda=cuda, device_name=name,
            tf32=tf32, note=note, flops_by_dtype=dtypes, attention=None if cuda else attention, sparse_flops=sparse,
            heavy_ops=() if cuda else heavy, probability_loss=probability_loss))

    def _from_trace(self, reason: str) -> CollectorResult:
        """The counted step never ran whole (a run of a few long steps), or none was placed (``from_trace``): the
        traced step's FLOPs, from the shapes its ops were recorded with (``collect/trace_flops.py``) where they were;
        else ``reason``, unavailable."""
        path = self._run_dir / TRACE_FILE if self._run_dir is not None else None
        try:  # trace.json is there now only where its step was recorded whole (the trace stops after this)
            read = trace_flops(path) if path is not None and path.is_file() else None
        except Exception:
            read = None
        if read is None or read.step is None or not read.total:
            if self._traced_only:
                reason += "; no traced step with its op shapes to read them from"
            return CollectorResult(CollectorStatus("unavailable", reason))
        missed = "".join(f"; {name} ({calls} calls) not counted: its arguments could not be read"
                         for name, calls in sorted(read.not_counted.items()))
        if self._events is not None and self._events.step_evaluated(read.step):
            missed += "; the step held an evaluation pass, whose FLOPs are counted with it"
        torch = sys.modules["torch"]
        tf32 = bool(getattr(torch.backends.cuda.matmul, "allow_tf32", False))
        return self._counted(read.flops_by_op, read.flops_by_dtype, read.step, tf32, (
            f"step {read.step}'s FLOPs: read from the shapes of its traced ops, by torch's formulas ({reason}){missed}",))


SPARSE = "sparse"
"""The key the counted FLOPs of matmuls with a sparse operand go under, beside the dtypes', while the step is
counted."""


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


def probability_loss(torch: Any, seen: list[ProbabilityLoss]) -> dict[Any, Any]:
    """A formula of no FLOPs for ``binary_cross_entropy`` (``nn.BCELoss``) that notes its first call in ``seen``: its
    input's dtype and the user's line. (Its backward is another op: the forward alone is the loss's line.)"""
    op = getattr(torch.ops.aten, "binary_cross_entropy", None)
    if op is None:
        return {}

    def noted(probabilities: Any, *args: Any, **kwargs: Any) -> int:
        if not seen:
            seen.append(ProbabilityLoss(str(probabilities.dtype).removeprefix("torch."),
                                        call_site(user_frame(sys._getframe(1)))))
        return 0

    noted._get_raw = True  # type: ignore[attr-defined]  # the tensors themselves, not their shapes
    return {op: noted}
