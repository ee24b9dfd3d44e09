"""Raw, bounded measurements that collectors hand over and ``analysis`` reduces into the record's figures.

A collector whose payload needs reducing (a steady-state split of the steps, the speed of light against a peak)
returns one of these rather than a record type. They sit apart from both packages so that collectors (which
produce them) and analysis (which reduces them) never import each other. Like the record, they hold plain
numbers and strings: no torch object, no live handle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpuscope.record import CallSite, Checkpointing, FrozenModel, Loader, ProbabilityLoss

TIMED_PHASES = ("data_wait", "forward", "backward", "optimizer")
"""Phases timed by hooks; a step's remaining time is "other"."""


@dataclass(slots=True)
class StepRecord:
    """One step as measured: host wall time and host phase times; device times once resolved (CUDA only)."""

    index: int
    wall_s: float
    phases_s: dict[str, float]
    profiled: bool = False  # a profiler (cProfile, torch.profiler) ran during some of it
    device_wall_s: float | None = None
    device_phases_s: dict[str, float] | None = None
    evaluated: bool = False  # the trained model ran forward in eval mode / without gradients in it


@dataclass(frozen=True, slots=True)
class LoopStart:
    """Where a training loop began: the first step an optimizer ended over parameters unlike those of the one
    before it (a script that trains a teacher, then distils a student from it, runs two such loops)."""

    first_step: int
    optimizer: str
    """Its class name (``Adam``)."""
    parameters: int
    """Elements in the parameters it updates."""
    created_at: CallSite | None = None
    """The user's line that built it, where gpuscope saw it built."""


@dataclass(frozen=True, slots=True)
class StepCapture:
    """The steps collector's payload: the kept step records and what the run's loaders and device were.

    ``records`` are the first ``head`` steps one by one, then a uniform sample of later steps, each standing for
    ``body_weight`` steps of the run; ``count`` steps were marked in all, by ``source``."""

    records: tuple[StepRecord, ...]
    count: int
    head: int
    body_weight: float
    source: str
    loaders: tuple[Loader, ...]
    device: str
    skipped: int = 0
    """The first steps, counted and not kept (``--skip-steps``); ``head`` counts from step 0."""
    passes: tuple[int, int] = (0, 0)
    """The timed modules' forward passes, and the ``backward()`` calls once forwards were timed."""
    final_evaluation_s: float = 0.0
    """An evaluation pass after the last step (a test pass once training is done): from that step's end to the
    end of tracking, seconds; 0 without one."""
    loops: tuple[LoopStart, ...] = ()
    """Where each training loop began, where the script ran more than one one after another; empty otherwise."""
    no_grad_modes: tuple[int, ...] = (0, 0)
    """The trained model's forward passes in eval mode, and in train mode with gradients off."""
    device_markers: int = 0
    """Timing markers recorded on the GPU's stream over the run (0 on a CPU run)."""
    closure_calls: int = 0
    """Calls of the closures passed to ``optimizer.step`` (LBFGS calls its own many times a step)."""
    losses: tuple[tuple[int, float], ...] = ()
    """(step index, loss) for the steps whose loss was kept (``steplog.LossLog``), NaN where it was not finite."""
    frozen_models: tuple[tuple[FrozenModel, dict[int, tuple[float, int]], tuple[int, int]], ...] = ()
    """Models no optimizer trains whose forward ran in the steps, each without its figures, which the summary reads
    from its seconds and calls by step index over the steady steps, of those its calls were kept for (from, to; -1:
    to the end)."""
    checkpointing: tuple[Checkpointing, dict[int, tuple[float, int]], int] | None = None
    """Activation checkpointing without its figures, which the summary reads from its seconds recomputing and
    checkpointed calls by step index over the steady steps (before the step from which none were kept; -1: all)."""
    queue_waits: tuple[CallSite, ...] = ()
    """The lines whose waits on a queue between the loop's passes were its data wait (``steps.queue_waits``)."""
    no_grad_s: float = 0.0
    """The trained model's forward passes without gradients (eval mode, ``torch.no_grad()``) in the steps, seconds."""
    no_grad_sites: tuple[CallSite, ...] = ()
    """The lines of the step's own code that ran them (``steps.no_grad_sites``)."""
    no_grad_by: str = ""
    """The library that ran them (``steps.no_grad_by``), or ""."""
    forward_sites: tuple[CallSite, ...] = ()
    """The lines that called the trained model's forward with gradients on (``steps.forward_sites``)."""
    optimizer_by: str = ""
    """The library whose code stepped the first optimizer (``steps.optimizer_by``), or ""."""


@dataclass(frozen=True, slots=True)
class TraceCapture:
    """The torch-trace collector's payload: torch.profiler's window as recorded.

    ``events`` are the whole trace's ``traceEvents`` (as exported, before ``trace.json`` was capped: the figures
    and the op table are computed from all of them, the cap is about the file) over the recorded steps
    (``recorded``); None where ``trace.json`` (``path``) is the whole trace, under its cap: the figures are read
    from the file as a stream, the events never held. ``trace_bytes`` and ``trace_detail`` what the file on disk
    holds. ``unfinished``: the last recorded step where the run ended inside the window: the script's last lines
    after its last step, no step."""

    events: list[dict[str, object]] | None
    recorded: tuple[int, ...]
    cuda: bool
    trace_bytes: int
    trace_detail: str
    unfinished: int | None = None
    cpu_s: dict[int, float] = field(default_factory=dict)
    """Each recorded step's time the loop's thread ran on a CPU (where the kernel says)."""
    cpu_wait_s: dict[int, float] = field(default_factory=dict)
    """Each recorded step's time the loop's thread was runnable but waiting for a CPU (where the kernel says)."""
    path: Path | None = None
    """``trace.json``, where ``events`` are not held."""
    scaled_by: int = 1
    """Where more than 1: the one recorded step was recorded up to the end of its first call of the optimizer's
    closure, of this many; its op table is that call's times this."""
    call_s: float = 0.0
    """Where ``scaled_by`` is more than 1: that call's time, from the step's start (profiler on), seconds."""


LOW_PRECISION = ("bfloat16", "float16")
"""The reduced-precision float dtypes a step's matmuls and convolutions may run in (the FLOP counter times the
CPU's rate in them; the precision rules hold that rate against float32's)."""


@dataclass(frozen=True, slots=True)
class AttentionCall:
    """The first scaled dot-product attention of the counted step on a CPU: its shapes and dtype, whether causal,
    and the user's line that made it."""

    query: tuple[int, ...]
    key: tuple[int, ...]
    value: tuple[int, ...]
    dtype: str
    is_causal: bool = False
    called_at: CallSite | None = None


@dataclass(frozen=True, slots=True)
class HeavyOp:
    """One shape of the counted step's matmuls or 2-d convolutions, among those with the most FLOPs: what the
    cpu-peak probe times again in float32 and under bfloat16 autocast (``collect/autocast_timing.py``)."""

    kind: str
    """``conv`` or ``matmul``."""
    shapes: tuple[tuple[int, ...], ...]
    """A convolution's input and weight; a matmul's two matrices (batched: 3-d)."""
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    groups: int = 1
    transposed: bool = False
    output_padding: tuple[int, ...] = ()
    grads: tuple[bool, ...] = (False, False)
    """Whether each of ``shapes`` needed a gradient in the step (its backward is timed where one did)."""
    flops: int = 0
    """The counted step's forward FLOPs at this shape."""
    kind_flops: int = 0
    """...and at every shape of its kind."""


@dataclass(frozen=True, slots=True)
class FlopCount:
    """The FLOPs of one steady step, as ``FlopCounterMode`` counted them (the flops collector's payload).

    ``flops_by_op`` holds the top ops; ``dtype`` is the one most FLOPs ran in, ``flops_by_dtype`` every dtype's;
    ``device_name`` the GPU's (None on a CPU run); ``tf32`` whether float32 matmuls were allowed TF32 (which sets the
    GPU peak they are held against)."""

    flops_per_step: int
    flops_by_op: dict[str, int]
    step: int
    dtype: str | None
    cuda: bool
    device_name: str | None = None
    tf32: bool = False
    note: str = ""
    flops_by_dtype: dict[str, int] = field(default_factory=dict)
    attention: AttentionCall | None = None
    """The step's first attention on a CPU (``collect/attention.py``), None without one."""
    sparse_flops: int = 0
    """Of ``flops_per_step``, those of matmuls with a sparse operand (``speed_of_light.sparse_flops``)."""
    heavy_ops: tuple[HeavyOp, ...] = ()
    """On a CPU run, the shapes of its matmuls and convolutions with the most FLOPs (``HeavyOps.top``)."""
    probability_loss: ProbabilityLoss | None = None
    """The step's first binary cross-entropy on probabilities (``nn.BCELoss``), None without one."""


@dataclass(frozen=True, slots=True)
class CpuPeak:
    """This machine's measured float matmul rate (the cpu-peak probe's payload): what a CPU step could reach; and,
    where ``dtype`` is not float32, its float32 rate measured beside it; where the step ran convolutions and some
    of its FLOPs in bfloat16 or float16, one convolution's rate in that dtype and in float32; and its attention's
    time in both, where that ran in such a dtype."""

    flops_per_s: float
    dtype: str
    device_name: str
    source: str
    float32_flops_per_s: float | None = None
    conv_flops_per_s: dict[str, float] = field(default_factory=dict)
    attention_s: dict[str, float] = field(default_factory=dict)
    """Where the step's attention ran in bfloat16 or float16: one forward and backward at its shapes, in that dtype
    and in float32, seconds."""
    autocast: tuple[tuple[HeavyOp, float, float, float, float], ...] = ()
    """Where the step ran in float32: its heaviest matmul and convolution shapes, each timed in float32 and under
    bfloat16 autocast, with their pages kept and faulted in afresh, seconds (``autocast_timing.time_autocast``)."""


@dataclass(frozen=True, slots=True)
class PostRunFacts:
    """What the post-run probes are told of the finished run (the stage reduces the steps first).

    ``loader`` is the DataLoader the steps waited on longest, with what the loader probe needs to build it again
    (live objects, kept by the steps collector, never written anywhere); ``dataset`` the map-style dataset the data
    probe fetches from; ``payloads`` what the live collectors returned, by collector name."""

    data_wait: float
    median_s: float | None
    steps: int
    cuda: bool
    data_wait_notable: bool
    """Whether data wait reached ``notable_share`` of the step (``thresholds.DATA_WAIT_NOTABLE``)."""
    notable_share: float
    consume_batches_per_s: float | None
    """The rate the training step consumes batches: 1 / (median step x (1 - data wait))."""
    keeps_up_margin: float
    """How much faster than that a loader must deliver to hide loading (``thresholds.LOADER_KEEPS_UP_MARGIN``)."""
    loader: dict[str, object] | None = None
    dataset: object | None = None
    dataset_fetch: int | None = None
    """Where ``dataset`` fetches whole batches (its loader's sampler yields lists of indices, with
    ``batch_size=None``): the indices a fetch asks for; None where it is given one index at a time."""
    payloads: dict[str, object] = field(default_factory=dict)
    optimizer: object | None = None
    """The first optimizer the loop stepped (live, kept by the steps collector), whose update the optimizer probe
    times again on copies of its parameters."""
    optimizer_peers: tuple[object, ...] = ()
    """The optimizers of its class stepped in its last step, it among them (``ProbeInputs.peers``), timed together."""
    optimizer_update_share: float | None = None
    """``ProbeInputs.update_share``."""
    optimizer_around: str = ""
    """``ProbeInputs.around``."""
    frozen_fed: bool = False
    """Whether a frozen model took a notable share of the step, in eval mode with gradients off, on the DataLoader's
    batches as loaded from a dataset not known to give the same items (the repeat probe reads a few of them again)."""
    optimizer_notable: bool = True
    """Whether the optimizer's update reached ``thresholds.OPTIMIZER_SHARE_NOTABLE`` of the step (True where the
    share is unknown)."""
