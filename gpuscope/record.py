"""The run's record: one tree of frozen dataclasses that *is* ``run.json`` (schema ``gpuscope.run/1``).

Every stage after the run (analysis, ``gpuscope report``, ``gpuscope compare``, the notebook) reads only this.
Units are in the field names (``median_s``); fractions are 0..1. No live object (tensor, handle, file) ever
appears here: collectors turn what they saw into numbers first.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from gpuscope.errors import GpuscopeError

SCHEMA = "gpuscope.run/1"
RUN_JSON = "run.json"

Bound = Literal["data-loading", "cpu-launch", "compute", "communication", "inconclusive"]
CollectorState = Literal["ok", "unavailable", "failed"]
StepSource = Literal["explicit", "optimizer", "dataloader", "backward", "profiler", "none"]
"""What marked the steps: ``gpuscope.step()``, ``optimizer.step()``, each DataLoader batch, each top-level
``backward()`` (loops with none of those), or (a record built from a trace by ``gpuscope analyze``) torch.profiler's
``ProfilerStep#N`` ranges."""
TimeBasis = Literal["host", "device"]

PHASES = ("data_wait", "forward", "backward", "optimizer", "other")
"""The parts of a step, in display order; ``other`` is the step's time outside the four timed phases."""


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Shares of steady-state step time per phase, each 0..1; together they add up to 1.

    All zero when no steady-state step was seen.
    """

    data_wait: float = 0.0
    """Waiting for the next batch (inside a DataLoader iterator's __next__; or, on the loop's thread between its
    passes, in a queue's get: a thread or process handing batches over, ``steps.queue_waits``)."""
    forward: float = 0.0
    """Forward of the root modules."""
    backward: float = 0.0
    """torch.autograd.backward / grad."""
    optimizer: float = 0.0
    """optimizer.step()."""
    other: float = 0.0
    """The rest of the step."""

    def as_dict(self) -> dict[str, float]:
        """The shares keyed by phase name, in ``PHASES`` order."""
        return {name: getattr(self, name) for name in PHASES}


@dataclass(frozen=True, slots=True)
class StepSample:
    """A bounded sample of individual steps, columnar; ``index`` says which steps of the run they are.

    ``phases_s`` maps each phase of ``PHASES`` to per-step seconds; ``status`` says for each sampled step
    whether it counts in the steady-state figures (``steady``) or was left out (``warmup``, ``outlier``,
    ``profiled``, ``eval``: an evaluation pass ran in it; ``other-loop``: a step of another training loop than the
    measured one, ``Steps.loops``).
    ``device_wall_s`` holds per-step device time on CUDA runs (None where it was not resolved).
    """

    index: tuple[int, ...] = ()
    """Which steps of the run (0-based) the columns describe."""
    wall_s: tuple[float, ...] = ()
    """Each step's wall time, seconds."""
    phases_s: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """Per phase (data_wait, forward, backward, optimizer, other), each step's seconds in it."""
    status: tuple[str, ...] = ()
    """Per step: steady, warmup, outlier, profiled, eval or other-loop."""
    device_wall_s: tuple[float | None, ...] = ()
    """Per step, its time on the GPU, seconds (null where not resolved; empty on CPU runs)."""


@dataclass(frozen=True, slots=True)
class Steps:
    """Training steps found in the run. ``count`` and the ``*_s`` figures cover steady-state steps only."""

    count: int = 0
    """Steady-state steps: the steps the figures below cover."""
    median_s: float = 0.0
    """Median wall time of a steady-state step, seconds."""
    mean_s: float = 0.0
    """Mean steady-state step, seconds."""
    p10_s: float = 0.0
    """10th percentile of steady-state steps, seconds."""
    p90_s: float = 0.0
    """90th percentile of steady-state steps, seconds."""
    min_s: float = 0.0
    """Shortest steady-state step, seconds."""
    max_s: float = 0.0
    """Longest steady-state step, seconds."""
    total: int = 0
    """Every step seen, steady or not."""
    warmup: int = 0
    """Steps left out at the start (first steps, compilation, autotuning), the skipped ones included; of several
    training loops, at the measured loop's start."""
    skipped: int = 0
    """Of the warm-up steps, those the user asked to skip (``--skip-steps``): no profiler measured them (of several
    training loops, those in the measured loop)."""
    outliers: int = 0
    """Steps left out later for taking far longer than the median (checkpoints, evaluation, recompiles)."""
    profiled: int = 0
    """Steps left out because a profiler (cProfile, torch.profiler) was running during them."""
    evaluated: int = 0
    """Steps left out because the trained model ran a forward pass in eval mode or with gradients off in them and
    they took over 1.5x the other steps' median (an evaluation pass between training steps), where steps with such a
    pass are a minority (at most a third)."""
    evaluated_s: float = 0.0
    """Those steps' wall time in all, seconds."""
    final_evaluation_s: float = 0.0
    """An evaluation pass after the last step (a test pass once training is done, no step): from that step's end to
    the script's, seconds; 0 without one."""
    source: StepSource = "none"
    """What marked the steps: gpuscope.step() (explicit), optimizer.step(), each DataLoader batch, or nothing."""
    breakdown_basis: TimeBasis = "host"
    """``device``: the breakdown splits the GPU's timeline by the host phase that queued the work."""
    device_median_s: float | None = None
    """On CUDA runs, the median step's time on the GPU's timeline, seconds; else null."""
    clock: TimeBasis = "host"
    """The clock the step figures (``median_s`` to ``max_s``, the steady-state split) are read on: ``device``, the
    GPU's timeline between markers queued at each step's end (a CUDA run whose steps were timed there: the host may
    queue work many steps ahead and wait only when the launch queue fills, so its own step times say how fast it
    launches, not how long a step takes); ``host``, the host's clock."""
    host_median_s: float | None = None
    """Where ``clock`` is ``device``, the same steps' median on the host's clock, seconds; else null."""
    device_markers: int = 0
    """Timing markers gpuscope recorded on the GPU's stream over the run, all steps (one at each step's end, and at
    each phase change of some steps); 0 on a CPU run."""
    forwards_per_backward: float | None = None
    """The trained model's forward passes (its root modules', from the second step on) per ``backward()`` call: about
    1 in most training loops (a GAN's two models, 1.3); many where the model runs on one sample or token at a time
    before one backward (a policy's rollout, a decoder called token by token). None without a backward."""
    closure_calls_per_step: float | None = None
    """Where the optimizer steps with a closure (LBFGS calls its closure, a forward and backward pass, up to
    ``max_iter`` times a step; Lightning runs its whole training step in one): its calls that ran a backward per step
    over the run, every step counted; None without one (a closure that runs no backward, as Lightning's manual
    optimisation hands the optimizer, is no pass)."""
    sampled: bool = False
    """True when the run had more steps than are kept one by one; figures then rest on an even sample."""
    sample: StepSample = field(default_factory=StepSample)
    """Individual steps (all of the first 64, then a seeded random sample), columnar."""
    loops: tuple[TrainingLoop, ...] = ()
    """Where the script ran several training loops one after another (a teacher trained, then a student distilled
    from it), each loop, in order: the figures are the ``measured`` one's. Empty for one loop."""
    other_loops: int = 0
    """Steps left out for belonging to the other loops: counted in ``total`` only."""
    evaluated_in_train_mode: float | None = None
    """Of the trained model's forward passes in eval mode or with gradients off (what marks a step as holding an
    evaluation pass), the share run in train mode with gradients off: a rollout collecting the next batch runs so
    in most reinforcement-learning loops (CleanRL's), a test pass after ``model.eval()`` does not. None without any."""

    frozen_models: tuple[FrozenModel, ...] = ()
    """Models the optimizers do not train (a distillation's teacher, a frozen encoder) whose forward ran in the steps,
    outside the trained model's: the largest first, at most 4. Their time is in the step's ``other`` share (or in
    ``forward`` where the trained model calls one)."""
    checkpointing: Checkpointing | None = None
    """Activation checkpointing in the steps, or null where no call was checkpointed."""
    queue_waits: tuple[CallSite, ...] = ()
    """The lines where the loop's thread waited on a queue (``queue.Queue``, ``multiprocessing.Queue``) between its
    passes, for batches a thread or process of the script's own hands over: those waits are the data wait (of the
    first 64, the most frequent first, at most 3). Empty where the batches came from a DataLoader's ``__next__``."""
    no_grad_share: float | None = None
    """Of the time of every step the run made but the first (profiled and left-out steps too), the share the trained
    model's forward passes in eval mode or with gradients off took, each step's from its first such pass's start to
    its last one's end (an evaluation inside the step with its batches and metrics between the passes, a rollout;
    not one after the last step); None without any."""
    no_grad_sites: tuple[CallSite, ...] = ()
    """The lines that ran those passes: in the function that steps the optimizer where it called them (through a
    function of the user's own, as pytorch/examples' GCN calls ``test()``), else the user's innermost line (of the
    first 64, the most frequent first, at most 3)."""
    no_grad_by: str = ""
    """The library whose code ran the first of them, the outermost between the pass and the function that steps the
    optimizer (``transformers``, its Trainer evaluating; ``pytorch_lightning``, its validation loop calling the
    script's ``validation_step``), or "" where the script's own code did."""
    forward_sites: tuple[CallSite, ...] = ()
    """The user's lines that called the trained model's forward in train mode with gradients on (the root modules
    gpuscope times; where a library called it, the user's innermost line above: its ``training_step``), of the first
    64, the most frequent first, at most 3: where an autocast goes. Empty in older records."""
    optimizer_by: str = ""
    """The library whose code stepped the first optimizer, the one the script's line called into (``transformers``
    for its Trainer, ``pytorch_lightning`` or ``lightning`` for ``Trainer.fit``, ``accelerate`` for an optimizer it
    prepared), or "" where the script's own code called ``optimizer.step()``: where a fix is a setting of that
    library's. "" in records made before it was kept."""

    @property
    def rollouts(self) -> bool:
        """Whether the passes that mark steps as holding an evaluation pass ran mostly in train mode: a rollout
        collecting the next batch, most likely (how the verdict and the summary name them)."""
        return (self.evaluated_in_train_mode or 0.0) >= 0.5


@dataclass(frozen=True, slots=True)
class Checkpointing:
    """Activation checkpointing (``torch.utils.checkpoint``) in the steps: the checkpointed calls, whose forward runs
    again in backward, and what running it again cost."""

    calls: int = 0
    """Checkpointed calls over the run."""
    recomputed: int = 0
    """Their forwards run again in backward, over the run."""
    calls_per_step: float = 0.0
    """Checkpointed calls per steady step (0 where no steady step was kept)."""
    recompute_s: float | None = None
    """Seconds a steady step spent running checkpointed forwards again, on the host's clock (a CPU run's backward
    runs on the loop's thread); None on a CUDA run, whose backward runs them on autograd's device threads."""
    step_share: float | None = None
    """``recompute_s`` over the steady steps' wall time, as ``breakdown`` is read; None where it is."""
    reentrant: bool = False
    """Some call used the reentrant implementation (``use_reentrant=True``)."""
    called_at: CallSite | None = None
    """The user's line under which checkpoint was called most (where a library called it, the line that called
    into the library)."""
    called_by: str = ""
    """The library that called checkpoint (``transformers``), or "" where the user's code did."""


@dataclass(frozen=True, slots=True)
class FrozenModel:
    """A model with parameters, none of them trained by the optimizers, whose forward ran during the steps."""

    module: str = ""
    """Its class name."""
    parameters: int = 0
    """Elements in its parameters."""
    calls: int = 0
    """Its forward calls on the training loop's thread, over the run."""
    calls_per_step: float = 0.0
    """Its calls per steady step (0 where no steady step was kept)."""
    call_s: float | None = None
    """Its mean call in the steady steps on the host's clock, seconds (on a GPU, the time to queue its work); None
    where it ran in none of them."""
    step_share: float | None = None
    """Its time in the steady steps over their wall time, as ``breakdown`` is read: its share of a step; None on a
    CUDA run (the host's time to queue it is not the device's) or where it ran in no steady step."""
    without_gradients: bool = False
    """Every call ran with gradients off (``torch.no_grad``, ``torch.inference_mode``)."""
    eval_mode: bool = False
    """Every call ran in eval mode (``model.eval()``)."""
    fed_batch: bool = False
    """Every call was given tensors of the DataLoader's last batch only, as the loader delivered it (not a copy, not
    an augmented one), collated by torch's own function (not one of the script's, which may draw at random)."""
    fixed_items: bool = False
    """``fed_batch``, and every such batch came from a dataset that gives the same items each time they are read by
    what it is (torch's ``TensorDataset``, or a ``Subset`` of one): its outputs for an item are the same each epoch.
    Other datasets are read again after the run (``item_repeat``)."""
    called_at: CallSite | None = None
    """The user's line that called it most."""

    @property
    def reads_batches(self) -> bool:
        """Whether its outputs depend on the loader's items alone: run on its batches as loaded, in eval mode with
        gradients off (the same every epoch where the items are)."""
        return self.fed_batch and self.without_gradients and self.eval_mode


@dataclass(frozen=True, slots=True)
class TrainingLoop:
    """One of several training loops a script ran one after another: the steps, from ``first_step`` to the next
    loop's first, that one optimizer ended, over parameters unlike those of the loop before."""

    first_step: int = 0
    """Its first step (0-based): the step its optimizer first ended, which also holds the hand-over from the loop
    before."""
    steps: int = 0
    """Its steps, to the next loop's first."""
    optimizer: str = ""
    """The optimizer's class name (``Adam``)."""
    parameters: int = 0
    """Elements in the parameters it updates."""
    created_at: CallSite | None = None
    """The user's line that built the optimizer, where gpuscope saw it built."""
    median_s: float | None = None
    """Its kept steps' median wall time, its first step (the hand-over from the loop before) left out."""
    total_s: float = 0.0
    """Its steps' wall time in all (estimated from the sample where steps were sampled), seconds."""
    measured: bool = False
    """The loop the run's figures describe: the one the profilers' windows fell in."""


@dataclass(frozen=True, slots=True)
class Loader:
    """One DataLoader configuration the run iterated over, with the time the steps waited on it."""

    dataset: str = ""
    """The dataset's class name."""
    num_workers: int = 0
    """Worker processes."""
    batch_size: int | None = None
    """Batch size, or null (a batch sampler, or batch_size=null)."""
    pin_memory: bool = False
    """pin_memory=True."""
    persistent_workers: bool = False
    """persistent_workers=True."""
    prefetch_factor: int | None = None
    """Batches prefetched per worker, or null."""
    start_method: str | None = None
    """The workers' multiprocessing start method (fork, spawn, forkserver), or null."""
    iterable: bool = False
    """The dataset is an IterableDataset."""
    shards_by_worker: bool | None = None
    """An IterableDataset: whether N workers would each take their own part of its stream (its class's code, or the
    loader's ``worker_init_fn``, calls ``torch.utils.data.get_worker_info()``); false where its class is the
    script's own and calls it nowhere (each worker would yield the whole stream); null where that cannot be told,
    and for a map-style dataset."""
    repeated_first_batches: int = 0
    """An IterableDataset's loader with N workers: of the first N batches it gave (one from each worker), those with
    the same tensors as an earlier one; N - 1 where each worker yields the whole stream."""
    batches: int = 0
    """Batches the steps took from it."""
    wait_s: float = 0.0
    """Total seconds the training loop waited on it."""
    batch_tensors: tuple[str, ...] = ()
    """The tensors of its first batch, as ``dtype[shape] device`` (``float16[64, 3, 96, 96] cpu``), at most eight."""
    created_at: CallSite | None = None
    """The line of the user's code that built the first DataLoader over its dataset (the line a fix changes), or
    the user's call into the library that built it (``created_by``); null when not seen. Its ``calls``: the
    DataLoaders that line built over the dataset (more than 1: a new one each epoch)."""
    created_by: str = ""
    """The library whose code constructed the DataLoader (``transformers`` for the Trainer's), or "" for the user's
    own code."""
    restarts: int = 0
    """Iterators after the first that started its worker processes again (each epoch without
    ``persistent_workers``)."""
    restart_wait_s: float = 0.0
    """The loop's wait for the first batch of each of them: the workers' start-up, paid again each time."""
    back_to_back: int = 0
    """Batches asked for within a millisecond of the previous batch's arrival: taken back to back, as a loop that takes
    several batches at once does (the transformers Trainer takes a step's accumulated batches first). Their hand-over
    finds the workers building the next ones (``loader_probe.rates[].receive_s``)."""
    batch_sampler: str = ""
    """The class of the batch sampler passed as ``DataLoader(..., batch_sampler=...)`` on the line ``created_at``
    (whose batch size ``batch_size`` is), or empty where that DataLoader made its batches from its own
    ``batch_size``."""
    eval_batches: int = 0
    """Of ``batches``, those taken in steps that held an evaluation pass (the trained model's forward in eval mode
    or without gradients: a test set read between epochs)."""
    eval_wait_s: float = 0.0
    """Of ``wait_s``, the wait for them. The loaders are ordered, and the data rules pick theirs, by the rest: the
    training steps' wait."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What bounds the run, how sure we are (0..1), and the measured facts behind it."""

    bound: Bound = "inconclusive"
    """data-loading, cpu-launch, compute (GPU- or CPU-compute-bound by the device), communication (a data-parallel job
    waiting on collectives) or inconclusive."""
    confidence: float = 0.0
    """0..1."""
    evidence: tuple[str, ...] = ()
    """Human-readable facts with numbers."""


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A change worth making; ``expected_gain`` is the estimated fraction of step time saved, or None."""

    id: str = ""
    """One of docs/recommendation-ids.md."""
    title: str = ""
    """A short imperative title."""
    why: str = ""
    """The signal, with its numbers."""
    fix: str = ""
    """The code change; `FILE:LINE `code`: change` where gpuscope saw the line."""
    expected_gain: float | None = None
    """Estimated fraction of step time saved by the fix (0..1), or null where no estimate is sound."""
    evidence: tuple[str, ...] = ()
    """The measured facts the rule fired on, each with its number."""


@dataclass(frozen=True, slots=True)
class RuleCheck:
    """What became of one rule: ``fired`` (see recommendations), ``clear`` (checked, nothing found) or
    ``not-checked`` (an input it needs was not collected; ``reason`` says which and why)."""

    status: Literal["fired", "clear", "not-checked"] = "clear"
    """fired (see recommendations), clear (checked, nothing found) or not-checked."""
    reason: str | None = None
    """Why it was not checked (which input was missing), or null."""


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    """Whether a collector produced data here, and if not, why."""

    status: CollectorState = "ok"
    """ok, unavailable (not applicable here, or turned off) or failed (it raised; the run went on)."""
    reason: str | None = None
    """Why not ok, or null."""
    field: str | None = None
    """The record field the collector fills (None: none of its own), so a missing figure can name its collector."""
    elapsed_s: float | None = None
    """Post-run probes: how long it ran after the script (its budget is in its declaration)."""


@dataclass(frozen=True, slots=True)
class Window:
    """The steps a profiling window covered, ``first_step`` to ``last_step`` inclusive (None: no step), and
    whether it also covered the run's start-up (before the first step)."""

    first_step: int | None = None
    """First step covered (0-based), or null."""
    last_step: int | None = None
    """Last step covered, inclusive, or null."""
    startup: bool = False
    """The window also covered the run's start-up, before the first step."""


@dataclass(frozen=True, slots=True)
class FunctionStat:
    """One Python function in the cProfile statistics."""

    function: str = ""
    """Function name."""
    file: str = ""
    """Its file."""
    line: int = 0
    """Its first line."""
    calls: int = 0
    """Calls in the window."""
    own_s: float = 0.0
    """Seconds in the function itself."""
    cumulative_s: float = 0.0
    """Seconds in it and what it called."""


@dataclass(frozen=True, slots=True)
class PythonProfile:
    """cProfile over a window of the run (``python.prof``), and the top functions of its steps (the start-up,
    imports included, is in ``startup_s`` and in python.prof, not in the top lists)."""

    window: Window = field(default_factory=Window)
    """The steps cProfile covered."""
    whole_run: bool = False
    """cProfile covered the whole run (--cprofile-all)."""
    total_s: float = 0.0
    """Profiled seconds."""
    startup_s: float = 0.0
    """Profiled time up to the end of the first step."""
    top_own: tuple[FunctionStat, ...] = ()
    """Heaviest functions of the steps by own time."""
    top_cumulative: tuple[FunctionStat, ...] = ()
    """Heaviest functions of the steps by cumulative time."""
    workers_profiled: bool = False
    """Forked DataLoader workers' first batches were profiled (workers.prof)."""
    workers_note: str = ""
    """How the workers were (or why they were not) profiled."""
    workers_top_own: tuple[FunctionStat, ...] = ()
    """DataLoader workers' heaviest functions (``workers.prof``), where they were profiled."""
    between_phases: tuple[FunctionStat, ...] = ()
    """The functions that ran between the step's phases, the script's own and a library's that the loop called itself
    (``AveragedModel.update_parameters``; from 2026-12-02, the script's own only before): none of them called a
    module, backward, an optimizer or a DataLoader, nor was called from inside one only, by cumulative time over the steps, at most 3
    (an EMA of the weights, per-sample gradient clipping, metrics): what the breakdown's ``other`` holds. Empty in
    records made before it was kept."""


@dataclass(frozen=True, slots=True)
class OpStat:
    """One torch op (or CUDA kernel) over the profiled steps: calls and time, totals over the window."""

    name: str = ""
    """Op (aten::mm) or kernel name."""
    calls: int = 0
    """Calls in the window."""
    self_host_s: float = 0.0
    """Host seconds in the op itself, over the window."""
    device_s: float = 0.0
    """Device seconds, over the window."""


@dataclass(frozen=True, slots=True)
class KernelTimeline:
    """The GPU's kernel timeline over the profiled steps (fractions are of the steps' wall time, 0..1).

    Idle time is split as Holistic Trace Analysis does: ``host_wait`` (the next kernel was launched only after
    the previous one ended: the host was late), ``kernel_wait`` (short gaps between kernels already queued),
    ``other`` (the rest: syncs, copies, waits on other streams).
    """

    busy_fraction: float = 0.0
    """Share of the steps' wall time a kernel ran."""
    idle_host_wait_fraction: float = 0.0
    """Idle share while the host was late to launch."""
    idle_kernel_wait_fraction: float = 0.0
    """Idle share in short gaps between queued kernels."""
    idle_other_fraction: float = 0.0
    """The rest of the idle share."""
    kernels: int = 0
    """Kernels in the window."""
    kernels_per_step: float = 0.0
    """Kernels per step."""
    mean_kernel_s: float = 0.0
    """Mean kernel duration, seconds."""
    tensor_core_share: float = 0.0
    """Share of kernel time in kernels that use Tensor Cores (recognised by name)."""
    h2d_copies: int = 0
    """Host-to-device copies."""
    h2d_pageable_copies: int = 0
    """Of which from pageable (unpinned) memory."""
    h2d_copy_s: float = 0.0
    """Seconds of host-to-device copies."""
    conv_share: float = 0.0
    """Share of kernel time in convolution kernels (cuDNN's and CUTLASS's, recognised by name)."""
    fp32_gemm_share: float = 0.0
    """Share of kernel time in float32 matrix multiplies on CUDA cores (``sgemm`` without Tensor Cores)."""
    layout_transform_share: float = 0.0
    """Share of kernel time converting between NCHW and NHWC layouts (``nchwToNhwc``, ``nhwcToNchw``)."""
    sync_calls: int = 0
    """Host calls that wait for the GPU (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ...)."""
    sync_wait_s: float = 0.0
    """The host's time blocked in those calls."""
    device: int | None = None
    """The device these figures are of (None: every device's kernels together, as records before per-device
    figures had them)."""
    window_s: float = 0.0
    """Length of the device window the fractions are of (see ``window_basis``)."""
    window_basis: str = ""
    """``launches``: from the start of the first kernel launched in the first recorded step to the end of the last
    kernel launched in the last one; ``host steps``: the host's steps (no launch link in the trace); ``kernels``:
    the kernels' own span (no step in the trace)."""
    compute_busy_fraction: float | None = None
    """Share of the window with a compute kernel running (communication kernels, NCCL's, left out); None in
    records made before it was measured."""
    communication_share: float = 0.0
    """Share of kernel time in communication kernels (NCCL/RCCL). The kind shares above are of the other kernels'
    (compute) time."""
    gemm_share: float = 0.0
    """Share of compute-kernel time in matrix multiplies (cuBLAS, CUTLASS, ROCm Tensile ``Cijk_``...)."""


@dataclass(frozen=True, slots=True)
class CollectiveCall:
    """One collective a rank issued in a profiled step: when this rank arrived at it and when it ended here, on the
    trace's clock (microseconds). Across the ranks of a job the k-th collective of a step is the same one (every
    rank must issue a group's collectives in one order), so arrivals can be set side by side (``diagnose.arrival``)."""

    step: int = 0
    """The step it was issued in (``ProfilerStep#N``)."""
    kind: str = ""
    """``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ``all_to_all``, ``send_recv`` or the name."""
    arrival_us: float = 0.0
    """When this rank arrived: on the host (gloo), the start of its ``c10d::`` call on the thread that issued it (a
    DDP bucket's: when the bucket was ready), else of gloo's range; on a device (NCCL), its kernel's start."""
    end_us: float = 0.0
    """When it ended on this rank: gloo's range's end, or the NCCL kernel's."""
    idle: tuple[tuple[float, float, str], ...] = ()
    """The spans of [arrival, end] in which the training thread ran no op (on a device: no compute kernel), each
    with the step phase it fell in (``""`` on a device): start, end, phase. Spans under 20 us (the gaps between
    one op and the next) are left out."""
    issued_in: str = ""
    """The step phase its rank issued it in, where known (gloo): ``backward`` for DDP's gradient buckets,
    ``forward`` for tensor parallelism's activations; ``""`` on a device and in older records."""


@dataclass(frozen=True, slots=True)
class ProfiledStep:
    """One step of the profiled window, as the trace shows it: the window's collectives' figures are per these."""

    number: int = 0
    """``ProfilerStep#N``'s N."""
    start_us: float = 0.0
    """Its start on the trace's clock (microseconds)."""
    end_us: float = 0.0
    """Its end."""
    phases_s: dict[str, float] = field(default_factory=dict)
    """Seconds in each phase (``PHASES``), from the trace's ranges (``reduce.phases.step_phases``)."""
    cpu_s: float | None = None
    """Seconds the training thread ran on a CPU in this step (the kernel's schedstat). Null where not measured."""
    cpu_wait_s: float | None = None
    """Seconds the training thread was runnable but waited for a CPU in this step (the kernel's schedstat): the
    machine's load, not the rank's work. Null where not measured (a trace alone)."""


@dataclass(frozen=True, slots=True)
class Communication:
    """Collectives (gloo's, NCCL's) over the profiled steps, per step: ``comm_s`` while any collective was in
    flight, ``exposed_s`` of it while the training thread ran no op (waiting, not overlapped with compute)."""

    calls_per_step: float = 0.0
    """Collective calls per step."""
    comm_s: float = 0.0
    """Seconds per step with a collective in flight."""
    exposed_s: float = 0.0
    """Of which seconds the training thread ran no op (waiting)."""
    overlap: float = 0.0
    """Share of the collectives' time hidden behind the training thread's ops (0..1)."""
    backend: str = ""
    """``gloo`` or ``nccl``, from the events' names."""
    measured_on: str = ""
    """``device``: NCCL kernels against the compute kernels of ``device`` (exposed: no compute kernel running),
    clipped to its window; ``host``: gloo's ranges against the ops of the thread that ran the steps, clipped to
    the steps; empty in older records (the thread with the most ops)."""
    device: int | None = None
    """The device, when measured on one."""
    exposure_measured: bool = True
    """False when the trace holds no op of the training thread inside the steps (a sampled or stripped trace):
    what it did meanwhile is unknown, so no wait is claimed (``exposed_s`` 0)."""
    step_s: float | None = None
    """The mean length of the profiled steps these figures are per (the host's steps; on a device, its window per
    step): every share of a step the collectives take is of this, from the same steps. Null in older records."""
    waiting_s: float | None = None
    """In a job's merged record: of ``exposed_s``, the seconds a step this rank waited for a later rank to arrive
    (imbalance, not communication); the rest is the collectives' own time. Null in a rank's own record (one rank
    cannot tell) and in older records."""
    calls: tuple[CollectiveCall, ...] = ()
    """Each collective of the profiled steps, in the order it was issued (at most ``MAX_CALLS``)."""
    profiled_steps: tuple[ProfiledStep, ...] = ()
    """The profiled steps, with their phases."""
    least_own_s: float | None = None
    """In a job's merged record: the least any rank sat idle a step on the collectives' own work (its ``exposed_s``
    less its wait for later ranks). The collectives end together on every rank; a rank idle longer after the last
    arrival was waiting to run again (its core busy with another process), which is no part of the communication.
    Null in a rank's own record and in older records."""

    @property
    def own_exposed_s(self) -> float:
        """Seconds a step the step waited on the collectives' own work: ``exposed_s`` less the wait for late ranks,
        no more than any rank of the job waited on it (``least_own_s``)."""
        own = max(0.0, self.exposed_s - (self.waiting_s or 0.0))
        return min(own, self.least_own_s) if self.least_own_s is not None else own

    @property
    def share(self) -> float:
        """``own_exposed_s`` as a share of the profiled step (of the same steps), 0..1; 0 where unknown."""
        return min(1.0, self.own_exposed_s / self.step_s) if self.step_s else 0.0


@dataclass(frozen=True, slots=True)
class OpProfile:
    """torch.profiler over a few steady-state steps (``trace.json``)."""

    window: Window = field(default_factory=Window)
    """The steps torch.profiler recorded."""
    steps: int = 0
    """Steps recorded."""
    trace_bytes: int = 0
    """Size of trace.json, bytes."""
    trace_detail: str = "full"
    """``full``, or what was dropped to keep trace.json under its cap."""
    ops: int = 0
    """torch ops in the window (calls of ``cpu_op`` events; runtime calls such as ``cudaLaunchKernel`` and device
    events are rows of the tables, not ops)."""
    ops_per_step: float = 0.0
    """ops / steps."""
    mean_op_s: float = 0.0
    """Mean host time per op, seconds."""
    calls_by_kind: dict[str, int] = field(default_factory=dict)
    """Op calls by kind: ``elementwise``, ``matmul``, ``conv``, ``other``."""
    top_host: tuple[OpStat, ...] = ()
    """Heaviest ops by host (self) time."""
    top_device: tuple[OpStat, ...] = ()
    """Heaviest ops by device time (CUDA)."""
    device_s: float = 0.0
    """The device events' time in all (kernels, copies, memsets), each once: what a row's device time is a share of
    (an op's row and its kernels' rows both hold the kernels' time). 0 in records made before it was kept."""
    kernels: KernelTimeline | None = None
    """The kernel timeline of the device the run mainly used (the most kernel time), ``kernels.device``."""
    communication: Communication | None = None
    """Collectives per step (data-parallel jobs), or null."""
    devices: tuple[KernelTimeline, ...] = ()
    """The kernel timeline of every device that ran kernels, by device (one process may drive several GPUs)."""
    evaluated_steps: tuple[int, ...] = ()
    """Recorded steps left out of the op table (``ops``, the top lists, ``calls_by_kind``; ``steps`` does not count
    them): they held an evaluation pass, as the step figures' ``steps.evaluated`` tells them. The kernel timeline
    and communication cover every recorded step."""
    host_ops: tuple[OpStat, ...] = ()
    """Every torch op of the op table by host (self) time, up to the 256 heaviest: calls and self host time (no
    runtime calls, no device rows). A job's ranks are set side by side by it: the ops one rank calls more often than
    the others are its extra work (``diagnose.ranks``). Empty in records made before it was kept."""
    phase_calls: dict[str, dict[str, int]] = field(default_factory=dict)
    """In a data-parallel rank's record: each torch op's calls on the training thread over the recorded steps, by the
    step phase they began in (``data_wait``, ``forward``, ``backward``, ``optimizer``, ``other``): where a rank's
    extra calls ran. Empty elsewhere, and in records made before it was kept."""
    closure_calls: int = 0
    """Where the one recorded step was recorded up to the end of its first call of the optimizer's closure (a long
    LBFGS step: each call a forward and backward pass): the step's calls; the op figures are that call's times this.
    0 elsewhere, and in records made before it was kept."""
    closure_call_s: float = 0.0
    """That recorded call's time on the host from the step's start (the profiler on), seconds: times
    ``closure_calls``, the step's time as the trace stands for it (the step's own wall also holds the trace's
    export and the FLOP count of its second call). 0 elsewhere."""
    data_ops: int = 0
    """Of ``ops``, those inside a DataLoader iterator's ``__next__`` (a loader without workers building the batch item
    by item in the loop's process): the data wait's work, not the step's compute, which the CPU verdict's op figures
    leave out (``compute_ops_per_step``). 0 in records made before it was kept."""
    data_ops_self_s: float = 0.0
    """Their self host time in the window, seconds."""
    comm_ops: int = 0
    """Of ``ops``, the calls of torch.distributed's collectives (``c10d::allreduce_``...) and the functional
    collectives' ops (``_c10d_functional::wait_tensor``...): on a CPU (gloo) their self time is the collective's own
    work and its wait for the other ranks, communication, which the verdict weighs apart (``communication``) and the
    CPU verdict's op figures leave out. 0 in records made before it was kept."""
    comm_ops_self_s: float = 0.0
    """Their self host time in the window, seconds."""

    @property
    def compute_ops_per_step(self) -> float:
        """Torch ops per step outside the DataLoader's ``__next__`` (``data_ops``) and the collectives
        (``comm_ops``)."""
        return (self.ops - self.data_ops - self.comm_ops) / self.ops * self.ops_per_step if self.ops else 0.0

    @property
    def compute_self_s(self) -> float:
        """Their self host time in the window, seconds."""
        return max(0.0, self.mean_op_s * self.ops - self.data_ops_self_s - self.comm_ops_self_s)

    @property
    def compute_mean_op_s(self) -> float:
        """Their mean host (self) time, seconds."""
        compute = self.ops - self.data_ops - self.comm_ops
        return self.compute_self_s / compute if compute > 0 else 0.0


@dataclass(frozen=True, slots=True)
class HostMemory:
    """Resident memory of the process and of its child processes (DataLoader workers), sampled over time."""

    interval_s: float = 0.0
    """Seconds between samples (doubles as the series is thinned)."""
    peak_bytes: int = 0
    """Highest sum of the process's and its children's RSS at one sample."""
    peak_process_bytes: int = 0
    """Highest RSS of the process alone, bytes."""
    peak_workers_bytes: int = 0
    """Highest RSS of its children together, bytes."""
    max_workers: int = 0
    """Most child processes seen at once."""
    t_s: tuple[float, ...] = ()
    """Sample times, seconds since the start."""
    process_bytes: tuple[int, ...] = ()
    """The process's RSS at each sample, bytes."""
    workers_bytes: tuple[int, ...] = ()
    """Its children's RSS at each sample, bytes."""
    workers_cpu_s: float = 0.0
    """CPU time its children used while they were watched (the kernel's schedstat), summed over them, seconds; a
    child busy at first (a worker started by spawn or forkserver importing torch) is watched from its first interval
    between scans busy less than half the time."""
    workers_runnable_s: float = 0.0
    """Time its children were runnable but waiting for a core while watched, summed, seconds."""
    workers_watched_s: float = 0.0
    """How long each child was watched, from the first scan that found it (or the end of its start-up, see
    ``workers_cpu_s``) to the last, summed, seconds (0 where the kernel keeps no schedstat): the rest of it, after
    ``workers_cpu_s`` and ``workers_runnable_s``, the children were blocked (on files, the network, a sleep)."""
    max_helpers: int = 0
    """Of its children, multiprocessing's resource tracker and forkserver, most at once: counted in ``max_workers``
    and the memory series, left out of the three times above."""
    user_s: tuple[float, ...] = ()
    """This process's CPU time in user mode so far at each sample (all its threads, not its children), seconds."""
    sys_s: tuple[float, ...] = ()
    """Its CPU time in the kernel so far at each sample, seconds: system calls, and page faults (each fresh page of
    memory the process touches is mapped in and zeroed by the kernel)."""
    minor_faults: tuple[int, ...] = ()
    """Its page faults served without reading a disk, so far at each sample (getrusage's ``ru_minflt``)."""
    steps_seen: tuple[int, ...] = ()
    """Training steps counted by each sample."""
    thread_user_s: tuple[float, ...] = ()
    """The training thread's own CPU time in user mode so far at each sample (the thread that started the
    profilers, which runs the steps; ``/proc/self/task/TID/stat``, in 10 ms ticks), seconds; empty where it could
    not be read."""
    thread_sys_s: tuple[float, ...] = ()
    """...and in the kernel: the time the step itself stood still while the kernel served it (page faults, system
    calls), where the other threads' kernel time may have overlapped the step's own work."""
    thread_runnable_s: tuple[float, ...] = ()
    """...and its time runnable but waiting for a core so far (``/proc/self/task/TID/schedstat``), seconds: where
    other threads or processes held the cores, each second of its CPU time took longer than a second of the step."""
    page_bytes: int = 0
    """The size of a page of memory, bytes."""
    allocator: str = ""
    """The C allocator serving ``malloc``: ``glibc``, or ``jemalloc``, ``tcmalloc``, ``mimalloc`` where one was
    loaded; empty where it could not be told."""
    malloc_settings: tuple[str, ...] = ()
    """Names of glibc's malloc settings set in the environment (``MALLOC_MMAP_THRESHOLD_``, ``GLIBC_TUNABLES``...),
    never their values."""
    processes: tuple[StartedProcess, ...] = ()
    """Processes the script started with multiprocessing, DataLoader workers left out: the first 64."""
    processes_not_listed: int = 0
    """Processes started past those 64."""
    own_cpu_s: float | None = None
    """This process's threads' time on a CPU while sampled (``/proc/PID/task/TID/schedstat``, read every 0.5 s),
    summed, seconds; null where the kernel keeps no such statistics."""
    own_runnable_s: float | None = None
    """...and their time runnable but waiting for a core: other threads and processes holding the cores."""


@dataclass(frozen=True, slots=True)
class StartedProcess:
    """A process the script started with multiprocessing (``Process.start()``: its own, ``torch.multiprocessing``'s
    spawn, a ``Pool``'s), what it ran, and the CPU time it used. gpuscope does not profile it."""

    pid: int = 0
    """Its process id."""
    target: str = ""
    """The function it ran, ``module.qualname`` (under ``torch.multiprocessing.spawn``, the function spawned)."""
    kind: str = "script"
    """``pool-worker`` (a process pool's: ``multiprocessing.Pool``, ``ProcessPoolExecutor``), ``script`` (a function
    of the user's code) or ``library`` (a library's: Lightning's ``ddp_spawn`` starts its own)."""
    started_at: CallSite | None = None
    """The user's line that started it."""
    start_method: str = ""
    """fork, spawn or forkserver."""
    cpu_s: float | None = None
    """CPU time it had used when last read while the run was watched (``/proc/PID/schedstat``, every 0.5 s), from
    its start; null where it was never read."""
    runnable_s: float | None = None
    """Time it had spent runnable but waiting for a core, read with ``cpu_s``: processes and their threads
    outnumbering the cores."""
    threads: int | None = None
    """Its threads that did work (a tenth of its busiest thread's CPU time or more): torch's intra-op threads, by
    default as many as the cores, among them; null where its threads were not read. ``cpu_s`` and ``runnable_s`` are
    then summed over all its threads (before: its first thread's alone)."""


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU as NVML saw it, sampled over time; series are columnar, aligned with ``t_s``."""

    index: int = 0
    """NVML index."""
    name: str = ""
    """Model name."""
    memory_total_bytes: int = 0
    """Memory, bytes."""
    t_s: tuple[float, ...] = ()
    """Sample times, seconds since the start."""
    sm_util: tuple[float, ...] = ()
    """Fraction of time a kernel was running, 0..1 (NVML's utilization.gpu)."""
    memory_util: tuple[float, ...] = ()
    """Fraction of time memory was read or written, 0..1."""
    memory_used_bytes: tuple[int, ...] = ()
    """Memory used, bytes."""
    power_w: tuple[float | None, ...] = ()
    """Power draw, watts (null where not read)."""
    sm_clock_mhz: tuple[int | None, ...] = ()
    """SM clock, MHz."""
    temperature_c: tuple[int | None, ...] = ()
    """Temperature, degrees Celsius."""
    pcie_tx_bytes_s: tuple[float | None, ...] = ()
    """PCIe transmit throughput, bytes per second."""
    pcie_rx_bytes_s: tuple[float | None, ...] = ()
    """PCIe receive throughput, bytes per second."""
    throttle_reasons: tuple[str, ...] = ()
    """Every throttle reason seen active in any sample (idle excluded)."""


@dataclass(frozen=True, slots=True)
class GpuSamples:
    """NVML sampling of every visible GPU."""

    interval_s: float = 0.0
    """Seconds between samples."""
    driver: str | None = None
    """NVIDIA driver version, or null."""
    devices: tuple[GpuDevice, ...] = ()
    """One entry per visible GPU."""


@dataclass(frozen=True, slots=True)
class CudaMemory:
    """CUDA caching-allocator memory at the end of sampled steps (bytes)."""

    peak_allocated_bytes: int = 0
    """Peak allocated by tensors, bytes."""
    peak_reserved_bytes: int = 0
    """Peak reserved by the caching allocator, bytes."""
    step: tuple[int, ...] = ()
    """The sampled steps."""
    allocated_bytes: tuple[int, ...] = ()
    """Allocated at the end of each sampled step, bytes."""
    reserved_bytes: tuple[int, ...] = ()
    """Reserved at the end of each sampled step, bytes."""
    peak_bytes: tuple[int, ...] = ()
    """Peak allocated up to each sampled step, bytes."""


@dataclass(frozen=True, slots=True)
class MemoryHolder:
    """Activations saved for backward, made under one module of the model (its innermost one)."""

    module: str = ""
    """The module as torch.profiler names it: its class and its instance's number (``Linear_3``)."""
    line: str = ""
    """The script's innermost line under which they were made (``FILE:LINE in FUNCTION``), or empty."""
    bytes: int = 0
    """Their size, bytes."""
    tensors: int = 0
    """How many."""


@dataclass(frozen=True, slots=True)
class KeptTensors:
    """Tensors made in one measured step and still alive at the end of the next: what a leak keeps."""

    line: str = ""
    """The script's innermost line that made them (``FILE:LINE in FUNCTION``), or empty where none of its frames was
    under the allocation."""
    callers: tuple[str, ...] = ()
    """The script's lines that called it, innermost first (at most three)."""
    bytes: int = 0
    """Their size, bytes."""
    tensors: int = 0
    """How many."""
    category: str = ""
    """What the memory timeline took them for: ``activations`` (saved for backward: kept with a graph, or kept by a
    reference to an output), ``inputs``, ``temporaries``, ``unknown``."""
    held_by: str = ""
    """The script's variable that keeps them alive as the memory window ends: a container they sit in (``the list
    `feats` (13 items)``), the autograd graph of a tensor they are saved in (``the autograd graph of `total```), or
    the variable itself; empty where none of the script's variables was found to."""
    holder_kind: str = ""
    """What ``held_by`` is, as a field: ``list``, ``tuple``, ``dict`` or ``set`` (a container they sit in),
    ``graph`` (the autograd graph of a tensor they are saved in), ``variable`` (the variable itself), or empty."""
    holder_name: str = ""
    """The name of that container, tensor or variable in the script."""
    holder_items: int | None = None
    """The container's length as the memory window ends; null for the others."""


MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "inputs", "temporaries", "unknown")
"""What memory is made of, as ``MemoryTimeline`` names its series and ``Memory`` its ``*_bytes`` at the peak."""


@dataclass(frozen=True, slots=True)
class MemoryTimeline:
    """The measured steps' memory over time by category (bytes), at most a few hundred points."""

    t_ms: tuple[float, ...] = ()
    """Milliseconds since the first measured step began."""
    parameters: tuple[int, ...] = ()
    """Parameters at each point, bytes."""
    gradients: tuple[int, ...] = ()
    """Gradients at each point, bytes."""
    optimizer_state: tuple[int, ...] = ()
    """The optimizer's state at each point, bytes."""
    activations: tuple[int, ...] = ()
    """Activations saved for backward at each point, bytes."""
    inputs: tuple[int, ...] = ()
    """The batch's tensors at each point, bytes."""
    temporaries: tuple[int, ...] = ()
    """Temporaries at each point, bytes."""
    unknown: tuple[int, ...] = ()
    """Tensors the timeline could not place, at each point, bytes."""
    phases: tuple[str, ...] = ()
    """Where in the step each point falls: ``forward``, ``backward``, ``optimizer`` or ``other``."""


@dataclass(frozen=True, slots=True)
class MemoryGrowth:
    """Memory that grows step over step after the warm-up."""

    source: Literal["host", "cuda"] = "host"
    """What grew: the process's resident memory (``host_memory``) or the CUDA allocator's allocated bytes
    (``cuda_memory``)."""
    per_step_bytes: float = 0.0
    """Its growth a step, bytes: the median of the slopes between every pair of readings (Theil-Sen), which one jump
    (a profiler's buffers) does not move."""
    from_step: int = 0
    """The first step of the readings it comes from."""
    to_step: int = 0
    """Their last step."""
    grew_bytes: int = 0
    """The growth over those steps at that rate, bytes."""
    leak: bool = False
    """Whether it is a leak: growth over the steps read of at least ``diagnose/thresholds.py``'s LEAK_MIN_SHARE of the
    memory at their start (and LEAK_MIN_BYTES), in both halves of them; resident memory's growth only where the
    memory window, if it read its steps, saw tensors outlive their step."""
    kept_per_step_bytes: int = 0
    """The leak's own rate, bytes a step: what the memory window saw a step leave alive (``Memory.kept_bytes_per_step``)
    where the growth is a leak at about that pace (``diagnose/thresholds.py``'s LEAK_KEPT_AGREES); 0 elsewhere. The
    allocator's slack, which moves resident memory's rate run by run under plain python too, does not move it."""


@dataclass(frozen=True, slots=True)
class OutOfMemory:
    """The script died of an allocation that failed."""

    error: str = ""
    """The exception's type and the first line of its message."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the allocation failed."""
    requested_bytes: int | None = None
    """The allocation that failed, where the message says it."""
    step: int = 0
    """Steps counted before it failed."""
    parameters_bytes: int = 0
    """Live tensors at the failure, by what holds them (Python's references; activations saved inside autograd's
    graph are counted from the graph of each tensor that has one): parameters."""
    gradients_bytes: int = 0
    """Gradients of those parameters."""
    optimizer_state_bytes: int = 0
    """Tensors in the optimizers' state."""
    activations_bytes: int = 0
    """Saved for backward in the graphs of live tensors."""
    other_bytes: int = 0
    """Every other live tensor (inputs, outputs, the script's own)."""


@dataclass(frozen=True, slots=True)
class MemoryFix:
    """A change that frees memory, with its predicted saving at the peak."""

    id: str = ""
    """``activation-checkpointing``, ``mixed-precision-activations``, ``smaller-micro-batch``,
    ``zero-grad-set-to-none``, ``smaller-optimizer-state``."""
    title: str = ""
    """The change, in a few words."""
    saving_bytes: int = 0
    """Predicted memory freed at the peak, bytes."""
    share_of_peak: float = 0.0
    """``saving_bytes`` over the peak, 0..1."""
    how: str = ""
    """How the saving was worked out, with its figures."""


@dataclass(frozen=True, slots=True)
class Memory:
    """What fills memory: the measured steps' peak by category, what a leak keeps, what a fix would free, and, where
    the run died of it, what was live then. Categories from torch.profiler's memory timeline (``profile_memory``,
    ``record_shapes``, ``with_stack``) over the memory window's steps, on the run's device; docs/memory.md."""

    device: Literal["cpu", "cuda"] = "cpu"
    """The device whose tensors are counted."""
    steps: tuple[int, ...] = ()
    """The measured steps (empty: none measured, as where the run died before them)."""
    peak_bytes: int = 0
    """Torch's tensors on the device at the measured steps' peak, bytes: the categories below add up to it."""
    parameters_bytes: int = 0
    """The model's parameters at the peak, bytes."""
    gradients_bytes: int = 0
    """Gradients at the peak, bytes."""
    optimizer_state_bytes: int = 0
    """The optimizer's state at the peak, bytes."""
    activations_bytes: int = 0
    """Saved for backward, at the peak."""
    inputs_bytes: int = 0
    """The batch's tensors (the model's inputs)."""
    temporaries_bytes: int = 0
    """Made and freed within an op or a phase (an optimizer's intermediate results among them), and autograd's own."""
    unknown_bytes: int = 0
    """Tensors the timeline could not place."""
    peak_phase: str = ""
    """Where in the step the peak fell: ``forward``, ``backward``, ``optimizer`` or ``other``."""
    activations_max_bytes: int = 0
    """Activations at their own highest (the end of forward), bytes."""
    gradients_max_bytes: int = 0
    """Gradients at their own highest, bytes: all of them, where the peak falls early in backward with few made."""
    holders: tuple[MemoryHolder, ...] = ()
    """The modules whose activations are largest at that point, largest first (at most eight)."""
    repeated_blocks: str = ""
    """The model's repeated block (the module class holding the most activations in three or more instances), or
    empty: what activation checkpointing would wrap."""
    repeated_block_count: int = 0
    """Its instances holding activations."""
    repeated_block_bytes: int = 0
    """Their activations together, bytes."""
    repeated_block_max_bytes: int = 0
    """The largest one's activations, bytes: checkpointed, each is made again in backward, one at a time."""
    repeated_block_inputs_bytes: int = 0
    """Their inputs together (the first tensor of each one's first op), bytes: checkpointing keeps them."""
    batch_size: int = 0
    """Samples a step (the loop's DataLoader's batch size; 0 where unknown)."""
    reserved_bytes: int = 0
    """CUDA: the caching allocator's reserved bytes at the end of the measured steps (its cache and fragmentation
    beside the tensors); 0 on a CPU run."""
    process_bytes: int = 0
    """The process's resident memory at the end of the measured steps (CPU), bytes: the tensors plus Python, the
    libraries and the allocator's free lists."""
    address_space_peak_bytes: int = 0
    """The process's peak virtual size (``VmPeak``), bytes: what an address-space limit (``RLIMIT_AS``) holds it to."""
    limit_bytes: int = 0
    """The most the run can have: the device's memory (CUDA), or the host's, its cgroup's limit or the process's
    address-space limit, whichever is least (CPU); 0 where unknown."""
    limit_source: str = ""
    """Which limit that is."""
    timeline: MemoryTimeline | None = None
    """Memory over the measured steps by category."""
    kept: tuple[KeptTensors, ...] = ()
    """Tensors made in the first measured step still alive at the end of the second, by line, largest first."""
    kept_bytes_per_step: int = 0
    """Their size together: what one step leaves behind."""
    growth: MemoryGrowth | None = None
    """Memory growth over the steps after the warm-up (filled by the analysis)."""
    out_of_memory: OutOfMemory | None = None
    """The allocation failure the script died of, or null."""
    fixes: tuple[MemoryFix, ...] = ()
    """Each memory fix with its predicted saving, largest first (filled by the analysis)."""
    headroom_bytes: int | None = None
    """``limit_bytes`` less the peak (the process's on a CPU run, the allocator's reserved on CUDA), or null."""
    largest_batch: int | None = None
    """The largest batch that fits under the limit from the per-sample activation cost, or null."""
    notes: tuple[str, ...] = ()
    """How memory was measured here, and what could not be."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """This machine's fixed cost per torch op, measured after the run on a model of tiny tensors, where the
    arithmetic is nil and a step's time is all per-op overhead (Python, dispatch, autograd)."""

    op_overhead_s: float = 0.0
    """Seconds per op, ops counted as torch.profiler counts them (the same count as ``OpProfile.ops``)."""
    ops_per_step: float = 0.0
    """Ops per step of the calibration model."""
    step_s: float = 0.0
    """Its step time, seconds."""
    anomaly_op_overhead_s: float | None = None
    """Extra seconds per op with anomaly detection on (measured only when the run used it); ops counted as
    torch.profiler counts them under anomaly detection, which adds ops of its own (NaN checks)."""


@dataclass(frozen=True, slots=True)
class CallSite:
    """A line of the user's code that made a call gpuscope watches for, and how many times it did."""

    file: str = ""
    """The user's file."""
    line: int = 0
    """Line number."""
    function: str = ""
    """Enclosing function."""
    code: str = ""
    """The line as written."""
    calls: int = 0
    """Times it made the call."""


@dataclass(frozen=True, slots=True)
class Practices:
    """Framework settings and habits seen while the script trained: debug APIs left on, how gradients are
    cleared, the model's layer patterns, and the backend flags that decide which kernels run."""

    torch_version: str = ""
    """torch.__version__."""
    steps_checked: int = 0
    """Step boundaries at which the debug-API state was read: each of the first 64, then every 8th (each again once
    torch.distributions has checked anything)."""
    anomaly_steps: int = 0
    """Of those, steps during which anomaly detection was on (at the boundary, or switched on within the step)."""
    anomaly_sites: tuple[CallSite, ...] = ()
    """The lines that switched anomaly detection on."""
    profiler_steps: int = 0
    """Of those, steps at whose boundary torch's autograd profiler (or emit_nvtx) was on, outside gpuscope's own
    window."""
    gradcheck_sites: tuple[CallSite, ...] = ()
    """The lines that called gradcheck during training."""
    zero_grad_calls: int = 0
    """zero_grad calls seen."""
    zero_grad_fill_calls: int = 0
    """``zero_grad`` calls that zero-filled gradients (``set_to_none=False``) instead of dropping them."""
    zero_grad_fill_sites: tuple[CallSite, ...] = ()
    """The lines of the zero-filling calls."""
    modules_inspected: bool = False
    """The model's layers were read."""
    bias_before_norm: tuple[str, ...] = ()
    """Layers with a bias whose output goes straight into BatchNorm: ``features.0 (Conv2d) -> features.1 (BatchNorm2d)``."""
    wasted_bias_params: int = 0
    """Parameters in those biases."""
    data_parallel: tuple[str, ...] = ()
    """``DataParallel`` wrappers in use, as ``DataParallel(Net) on N devices``."""
    conv_layers: int = 0
    """Convolution layers in the model."""
    channels_last_convs: int = 0
    """Convolution layers whose weights are in channels_last memory format."""
    dropout_layers: int = 0
    """Dropout layers of the trained models that drop (``nn.Dropout`` and its kin with p > 0,
    ``nn.MultiheadAttention``'s dropout of its attention weights, and a recurrent layer's between its layers), in
    train mode as the model was read."""
    dropout_rates: tuple[float, ...] = ()
    """Their distinct probabilities, highest first."""
    dropout_owners: tuple[str, ...] = ()
    """The classes that hold them, qualified (``torch.nn.modules.transformer.TransformerEncoderLayer``,
    ``transformers.models.gpt2.modeling_gpt2.GPT2Attention``, ``__main__.Block``), those holding most first, at most
    4."""
    cudnn_benchmark: bool | None = None
    """torch.backends.cudnn.benchmark (null: not read)."""
    matmul_allow_tf32: bool | None = None
    """torch.backends.cuda.matmul.allow_tf32."""
    cudnn_allow_tf32: bool | None = None
    """torch.backends.cudnn.allow_tf32."""
    float32_matmul_precision: str | None = None
    """torch.get_float32_matmul_precision(): highest, high or medium."""
    cuda_capability: str | None = None
    """The GPU's compute capability (``8.0``), on CUDA runs."""
    cpu_autocast_sites: tuple[CallSite, ...] = ()
    """Lines of the user's code that entered ``torch.autocast`` on the CPU, enabled, in bfloat16 or float16."""
    cpu_autocast_by: str = ""
    """The libraries whose code entered that autocast for those lines (``pytorch_lightning`` for
    ``Trainer(precision="bf16-mixed")``), comma-separated; empty where the user's code entered it itself."""
    optimizer_sites: tuple[CallSite, ...] = ()
    """Lines of the user's code that built an optimizer (``torch.optim.Optimizer``'s constructor ran under them)."""
    float64_sites: tuple[CallSite, ...] = ()
    """Lines of the user's code that made float64 the model's or torch's default dtype: ``Module.double()``,
    ``Module.to(torch.float64)``, ``torch.set_default_dtype(torch.float64)``."""
    half_precision_sites: tuple[CallSite, ...] = ()
    """Lines of the user's code that made bfloat16 or float16 the model's or torch's default dtype:
    ``Module.half()``, ``Module.bfloat16()``, ``Module.to(torch.float16)`` (or bfloat16),
    ``torch.set_default_dtype``."""
    distribution_check_steps: tuple[int, ...] = ()
    """Steps in which ``torch.distributions`` ran its argument and sample checks (``validate_args``), or every step
    from the first such check on (up to 512): the indices of ``distribution_check_s``."""
    distribution_check_s: tuple[float, ...] = ()
    """Seconds each of those steps spent in the checks: timed around ``Distribution.__init__`` where it checked its
    arguments, and around ``Distribution._validate_sample`` (``log_prob`` checking its value)."""
    distribution_check_counts: tuple[int, ...] = ()
    """The checks made in each of those steps (a distribution built, a sample checked)."""
    distribution_sites: tuple[CallSite, ...] = ()
    """Lines of the user's code that built distributions which checked their arguments (the first 256 built)."""
    checkpoint_save_steps: tuple[int, ...] = ()
    """The step under way at each call saving a checkpoint (``torch.save``, ``safetensors.torch.save_file``), the
    first 4096 calls: the steps completed before it (0: before the first step ended)."""
    checkpoint_save_s: tuple[float, ...] = ()
    """Each of those calls' seconds, in the same order."""
    checkpoint_save_sites: tuple[CallSite, ...] = ()
    """Lines of the user's code under those calls (a library's, such as Lightning's ``save_checkpoint``, is named by
    the user's line that called into it)."""
    checkpoint_save_by: str = ""
    """The libraries whose code made those calls for the user's (``transformers`` for a Trainer saving every
    ``save_steps``), comma-separated; "" where the user's code called them itself."""


@dataclass(frozen=True, slots=True)
class LineCost:
    """One line of the dataset's code, timed while the data probe fetched items."""

    file: str = ""
    """File."""
    line: int = 0
    """Line number."""
    function: str = ""
    """Enclosing function."""
    code: str = ""
    """The line as written."""
    own_s: float = 0.0
    """Seconds per item on this line itself, not in the user functions it called."""
    float16: bool = False
    """The line produced float16 arrays or tensors."""


@dataclass(frozen=True, slots=True)
class DataProbe:
    """A few items of the slowest loader's dataset fetched again after the run, under a line tracer: where
    building an item spends its time, and how much of it on float16 data."""

    dataset: str = ""
    """The dataset's class name."""
    items: int = 0
    """Items fetched again."""
    item_s: float = 0.0
    """Mean time to fetch one item, under the tracer."""
    float16_s: float = 0.0
    """Of which on lines that produced float16 arrays or tensors."""
    lines: tuple[LineCost, ...] = ()
    """The dataset's lines, heaviest first."""
    numpy_float16_slowdown: float | None = None
    """How many times slower the same element-wise NumPy arithmetic runs in float16 than in float32 here (None: not
    timed, as no line made float16 data, or NumPy was not imported)."""
    note: str = ""
    """How it was measured, or why it stopped."""
    item_cpu_share: float | None = None
    """The share of fetching an item spent on the main thread's CPU, timed untraced on other items than the traced
    ones (whose reads the page cache holds): well under 1 where fetching mostly waits (reads a disk, sleeps), so
    that workers building items take little of a core. None where not timed (the budget spent, an older record)."""
    item_untraced_s: float | None = None
    """Fetching one item (or batch, ``batch_items``) untraced, timed beside ``item_cpu_share`` on other items: the
    dataset's own time without the line tracer's, which inflates a trivial line (an item's indexing) many times.
    None where not timed."""
    lines_s: float = 0.0
    """Of ``item_s``, the time on the dataset's own lines, every one of them (not only those in ``lines``), the line
    tracer's own work left out: what fetching an item takes untraced, about (the tracer makes a line of a Python
    loop several times slower; NumPy's and torch's calls count as the line's). 0 in records made before it was."""
    batch_items: int | None = None
    """Where the dataset fetches whole batches (its loader's sampler yields lists of indices, with
    ``batch_size=None``): the indices each fetch asked for, as the loader's did; ``items`` and ``item_s`` then count
    such fetches. None: one index a fetch."""
    collate_s: float | None = None
    """Where the loader's collate function is the user's own: one batch's items collated again with it, untraced
    (None where it is torch's, or was not timed)."""
    collate_lines: tuple[LineCost, ...] = ()
    """That function's lines (and the user functions it calls), as the line tracer timed one batch, heaviest first."""
    collate_lines_s: float = 0.0
    """Every traced line's own time in that batch, the tracer's own work left out."""
    batch_built_s: float | None = None
    """Where the loader had no workers and collated its items with torch's default_collate: one batch of its size
    built again as it built them, untraced: ``dataset[i]`` for each item, then collated (the fastest of three). None
    where not timed (the dataset fetches whole batches, its items take over 50 us each: their own work, not the
    calls', the builds would not fit the probe's budget)."""
    batch_fetched_s: float | None = None
    """The same batch fetched in one call, ``dataset[indices]`` with a list of its indices, and converted as a loader
    with ``batch_size=None`` does (what a ``BatchSampler`` passed as its ``sampler`` makes of it), untraced (the
    fastest of three). None where that call does not give the batch the loader built, or where not timed."""
    batch_sliced_s: float | None = None
    """The same batch sliced without a loader: the collated batch's tensors indexed by a tensor of its indices, with
    a batch's share of drawing an epoch's permutation (``torch.randperm``), untraced (the fastest of three). None
    where the batch holds more than tensors, the loader's sampler is not torch's random or sequential one, or not
    timed."""


@dataclass(frozen=True, slots=True)
class SyncProfile:
    """Host-device synchronisations counted over a few steady-state steps with torch's CUDA sync debug mode."""

    window: Window = field(default_factory=Window)
    """The steps counted."""
    steps: int = 0
    """Steps counted."""
    syncs: int = 0
    """Synchronising calls in those steps."""
    per_step: float = 0.0
    """syncs / steps."""
    sites: tuple[CallSite, ...] = ()
    """The user's lines that synchronised, most frequent first."""


@dataclass(frozen=True, slots=True)
class LoaderRate:
    """One DataLoader configuration timed by the loader probe: batches delivered per second, in isolation."""

    num_workers: int = 0
    """Worker processes."""
    pin_memory: bool = False
    """pin_memory=True."""
    batches_per_s: float | None = None
    """None when no rate could be measured within its share of the time budget (``note`` says why)."""
    batches: int = 0
    """Batches timed (after the first round, which includes the workers' start-up)."""
    startup_s: float = 0.0
    """From creating the iterator to the first batch (worker start-up included)."""
    note: str = ""
    """Why no rate, if none."""
    handover_s: float | None = None
    """With workers: the main process's CPU time per batch taken from them (receiving it from the worker): a step
    pays it even where the workers keep up. None with 0 workers or where not timed."""
    receive_s: float | None = None
    """With workers: the wall time ``next()`` took to hand over a batch the workers had already built, while they
    built the next ones (median of a few, after letting their prefetched batches fill). Each tensor passed as a file
    descriptor waits for the worker's own Python to answer, so a worker busy in Python code makes it milliseconds
    where ``handover_s`` is a fraction of one: a step pays it for each batch even where the workers keep up. None
    with 0 workers or where not timed."""


@dataclass(frozen=True, slots=True)
class LoaderProbe:
    """The slowest loader's dataset and collate function timed after the run with several worker counts, each
    in isolation and for a bounded time: how fast each configuration delivers batches."""

    dataset: str = ""
    """The dataset's class name."""
    batch_size: int | None = None
    """The loader's batch size, or null."""
    start_method: str | None = None
    """Workers' start method, or null (the platform's default)."""
    rates: tuple[LoaderRate, ...] = ()
    """One entry per configuration timed (0, 1, 2, 4... workers)."""
    consume_batches_per_s: float | None = None
    """The rate the training step consumes batches: 1 / (median step x (1 - data wait share))."""
    main_threads: int | None = None
    """torch's intra-op threads in the main process at the end of the run."""
    budget_s: float = 0.0
    """Time allowed for the whole probe, seconds."""
    elapsed_s: float = 0.0
    """Time it took, seconds."""
    pin_memory_note: str = ""
    """Why pin_memory was not varied (e.g. a CPU-only machine: it only matters for copies to a GPU)."""
    note: str = ""
    """Why some configuration was not timed, if one was not."""
    probe_batch_size: int | None = None
    """Items per batch the probe loaded: ``batch_size``, or fewer where a batch of the run took long (the rates are
    per batch of ``batch_size`` all the same)."""
    file_system: LoaderRate | None = None
    """The last worker count in ``rates`` timed again with ``torch.multiprocessing``'s ``file_system`` sharing
    strategy (tensors handed over as named shared-memory files, not as file descriptors the worker's Python must
    pass), where handing batches over waited on the workers (the ``receive_s`` of the last count it was timed for);
    None where not timed. Its slot of the probe's budget is kept from the first count whose hand-over waited, and
    the start of torch's shared-memory manager is not taken from it."""
    sampler_s: float | None = None
    """Where the loader's sampler is a class of the user's own: the time it takes to draw one batch's indices. The
    main process runs it whatever the number of workers, so no worker count hides it. None otherwise."""
    sampler: str = ""
    """That sampler: its class and where its ``__iter__`` is (``BalancedSampler (data.py:33)``); empty otherwise."""


@dataclass(frozen=True, slots=True)
class ItemRepeat:
    """Whether the training dataset gave the same item each time it was read after the run (``repeat-probe``)."""

    dataset: str = ""
    """The dataset's class name."""
    indices: tuple[int, ...] = ()
    """The items read (up to 8 spread over the dataset, as far as the budget allowed)."""
    reads: int = 0
    """Reads of each (of the last, where one differed)."""
    same: bool = False
    """Every one of them read the same each time (tensors and arrays element by element): the dataset draws nothing
    at random, or seeds its draws by the item."""


@dataclass(frozen=True, slots=True)
class OptimizerProbe:
    """The loop's optimizer's update timed again after the run, on copies of its parameters and gradients, as the
    run ran it and with ``fused=True``: what a fused update would save."""

    optimizer: str = ""
    """Its class name (``Adam``)."""
    implementation: str = ""
    """How the run updated: ``for-loop`` (one parameter at a time), ``foreach`` (a few ops over lists of tensors)
    or ``fused`` (one kernel for all)."""
    device: str = ""
    """The device type its parameters are on (``cpu``, ``cuda``)."""
    tensors: int = 0
    """Parameter tensors the optimizer updates."""
    parameters: int = 0
    """Elements in them."""
    timed_tensors: int = 0
    """Of which the probe updated (the first ones, up to its size cap of 32 MiB)."""
    step_s: float | None = None
    """One update of the timed tensors as the run ran it (best of a few bursts)."""
    fused_step_s: float | None = None
    """One update of the timed tensors with ``fused=True`` (best of a few bursts); None where it could not be built
    (``note`` says why)."""
    note: str = ""
    """What was timed, where not everything, and why fused=True was not, if it was not."""
    optimizers: int = 1
    """Optimizers of this class the loop stepped in a step (a GAN's two, one per parameter): ``tensors``,
    ``parameters`` and the update times are all of theirs."""
    update_share: float | None = None
    """The share of the run's optimizer steps (host time) spent inside this class's own steps: under 1 where a
    wrapper's step around them does more (ZeroRedundancyOptimizer's broadcast of the updated shards); null where not
    measured."""
    around: str = ""
    """The class of the other optimizer whose steps took the most of the rest (``ZeroRedundancyOptimizer``), or ""."""


@dataclass(frozen=True, slots=True)
class AutocastTiming:
    """One of a float32 CPU step's heaviest matmul or convolution shapes, timed again after the run in float32 and
    under ``torch.autocast('cpu', dtype=torch.bfloat16)``: what bfloat16 mixed precision would gain on this machine
    (``cpu-mixed-precision``)."""

    kind: str = ""
    """``conv`` or ``matmul``: its forward timed, and its backward where an operand needed a gradient in the step."""
    shape: str = ""
    """What was timed, in words (``a 3x3 convolution, 64 to 128 channels, 8 images of 32x32``)."""
    flops_share: float = 0.0
    """Its share of the counted step's FLOPs of its kind, 0..1."""
    float32_s: float = 0.0
    """Its time in float32, seconds (the fastest of a few)."""
    bfloat16_s: float = 0.0
    """...and under bfloat16 autocast from float32 tensors, its casts included (made once a forward), seconds."""
    float32_fresh_s: float = 0.0
    """Its time in float32 with the pages it allocates faulted in afresh at each run (the C heap's free memory
    handed back to the system before it), seconds; 0 where not measured."""
    bfloat16_fresh_s: float = 0.0
    """...and under bfloat16 autocast so, seconds: where glibc hands freed blocks back at once, autocast's
    bfloat16 copies of the weights are faulted in afresh each step."""


@dataclass(frozen=True, slots=True)
class AttentionTiming:
    """The first scaled dot-product attention of a CPU run's counted step, and one forward and backward of it at its
    shapes timed after the run, in its dtype and in float32, where that dtype is bfloat16 or float16."""

    query: tuple[int, ...] = ()
    """The query's shape."""
    key: tuple[int, ...] = ()
    """The key's shape."""
    value: tuple[int, ...] = ()
    """The value's shape."""
    dtype: str = ""
    """Its dtype (bfloat16, float16, float32...)."""
    is_causal: bool = False
    """Whether it was causal."""
    called_at: CallSite | None = None
    """The user's line that made it (that called the module running it, where torch's code did)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """One forward and backward at those shapes, by dtype (its own and float32; a float32 step's in bfloat16 and
    float32, where ``cpu-mixed-precision`` timed its shapes), seconds; empty where not timed."""


@dataclass(frozen=True, slots=True)
class ProbabilityLoss:
    """The counted step's first binary cross-entropy on probabilities (``nn.BCELoss``, ``F.binary_cross_entropy``,
    most often after a sigmoid), which autocast cannot run safely: CUDA's autocast refuses it ("unsafe to
    autocast"), and on a CPU the sigmoid before it, in bfloat16, rounds probabilities near 1 to 1."""

    dtype: str = ""
    """Its input's dtype."""
    called_at: CallSite | None = None
    """The user's line that computed it (that called the module or function that did, where torch's code did)."""


@dataclass(frozen=True, slots=True)
class SpeedOfLight:
    """FLOPs of one training step (torch's FLOP counter, on one step outside the figures) against the device's
    peak. ``achieved_flops_per_s`` and ``mfu`` (0..1) are filled in by the analysis from the median step."""

    flops_per_step: int = 0
    """FLOPs of one training step (2 per multiply-add, backward included)."""
    flops_by_op: dict[str, int] = field(default_factory=dict)
    """The same by op (aten::mm, aten::convolution, ...)."""
    step: int | None = None
    """The step that was counted."""
    dtype: str | None = None
    """dtype of the step's matrix multiplies (``float32``, ``bfloat16``...), when they all had one."""
    device_name: str | None = None
    """The GPU model, or null on a CPU run."""
    peak_flops_per_s: float | None = None
    """The device's peak, FLOP/s, or null when unknown."""
    peak_source: str = ""
    """Where the peak comes from: a datasheet figure, or this machine's measured matmul benchmark."""
    peak_measured: bool = False
    """The peak was measured on this machine (CPU runs) rather than taken from a datasheet."""
    achieved_flops_per_s: float | None = None
    """flops_per_step / median step, FLOP/s."""
    mfu: float | None = None
    """Model FLOPs utilisation: achieved / peak, 0..1; null where the measured peak is too far below the run's own
    rate to describe its matmuls (``peak_source`` says so)."""
    note: str = ""
    """Why something is missing, if it is."""
    float32_flops_per_s: float | None = None
    """On a CPU run whose matmuls were not float32: this machine's float32 matmul rate, measured beside the peak in
    their dtype (null otherwise)."""
    flops_by_dtype: dict[str, int] = field(default_factory=dict)
    """The counted step's FLOPs by the dtype they ran in (`float32`, `bfloat16`...): a step may mix them (a student
    under `torch.autocast` beside a float32 teacher)."""
    attention: AttentionTiming | None = None
    """On a CPU run, the step's first scaled dot-product attention and its time in its dtype and in float32 (a
    float32 step's, where its shapes were timed under autocast: in bfloat16 and float32)."""
    conv_flops_per_s: dict[str, float] = field(default_factory=dict)
    """On a CPU run whose counted step ran convolutions and FLOPs in bfloat16 or float16: this machine's rate for one
    3x3 convolution in that dtype and in float32, by dtype, measured after the run (empty otherwise)."""
    sparse_flops: int = 0
    """Of ``flops_per_step``, those of matmuls with a sparse operand (a graph network's adjacency), counted by the
    elements it stores: such a matmul gathers and scatters, and no dense matmul peak describes its speed."""
    autocast: tuple[AutocastTiming, ...] = ()
    """On a CPU run in float32, where this machine's bfloat16 matmuls measured faster than its float32 ones: the
    counted step's heaviest matmul and convolution shapes (two of each kind at most), each timed after the run in
    float32 and under bfloat16 autocast. Empty otherwise, and in records made before it was kept."""
    probability_loss: ProbabilityLoss | None = None
    """The counted step's binary cross-entropy on probabilities, where it computed one: what the mixed-precision
    advice has to change first. None without one, and in records made before it was kept."""


@dataclass(frozen=True, slots=True)
class WhatIf:
    """An estimate: the step time if the verdict's bottleneck were removed, and how it was worked out."""

    step_s: float = 0.0
    """Estimated step time without the bottleneck, seconds."""
    speedup: float = 1.0
    """Current median step / step_s."""
    explanation: str = ""
    """How the estimate was worked out."""


@dataclass(frozen=True, slots=True)
class RunMeta:
    """Facts about the run itself: when, how long, on what software."""

    started_at: str = ""
    """ISO 8601 local time with offset."""
    duration_s: float = 0.0
    """Wall time of the run, seconds."""
    python: str = ""
    """Python version."""
    torch: str | None = None
    """torch version, or null when the script never imported torch."""
    cpu_count: int = 0
    """Logical CPUs this process may use (worker-count advice is capped by it)."""
    torch_threads: int | None = None
    """torch's intra-op threads in the main process when the script ended (null when it did not import torch)."""
    platform: str = ""
    """platform.platform() in short."""
    notes: tuple[str, ...] = ()
    """Plain statements about how the run was measured (e.g. which modules had forward timed)."""


@dataclass(frozen=True, slots=True)
class Distributed:
    """Where this process stood in a ``torch.distributed`` job, from torchrun's environment."""

    rank: int = 0
    """Global rank."""
    world_size: int = 1
    """Ranks in the job."""
    local_rank: int = 0
    """Rank on this host."""
    host: str = ""
    """Host name."""
    backend: str | None = None
    """The process group's backend (``gloo``, ``nccl``) if the script had one when it ended."""
    profiled_alone: bool = False
    """Not launched as a rank by torchrun: the script (or its framework: PyTorch Lightning's ``ddp`` strategy, which
    starts the other ranks as copies of the script) joined a process group of ``world_size`` ranks, of which gpuscope
    profiled this one alone; read from the group as the script ended."""


@dataclass(frozen=True, slots=True)
class RankSummary:
    """One rank's figures in a job's merged record (its own record is ``rank-N/run.json``)."""

    rank: int = 0
    """Global rank."""
    host: str = ""
    """Host name."""
    exit_status: int = 0
    """The rank's exit status."""
    steps: int = 0
    """Its steady-state steps."""
    median_s: float = 0.0
    """Its median step, seconds."""
    breakdown: Breakdown = field(default_factory=Breakdown)
    """Its breakdown."""
    comm_s: float | None = None
    """Per step: collectives in flight, and the part the training thread spent waiting (no op running)."""
    comm_exposed_s: float | None = None
    """Per step, seconds its training thread waited on collectives, or null."""
    bound: Bound = "inconclusive"
    """Its own verdict."""
    spread_s: float | None = None
    """How much its steady steps vary from one to the next: the 90th percentile step less the 10th, seconds (null in
    records merged before the field)."""
    waiting_s: float | None = None
    """Of ``comm_exposed_s``, the seconds a step it waited for a later rank to arrive at a collective (its
    collectives matched to the other ranks', ``diagnose.arrival``); null where they could not be matched."""
    profiled_step_s: float | None = None
    """Its mean profiled step: what ``comm_s``, ``comm_exposed_s`` and ``waiting_s`` are per, from the same steps."""
    memory_peak_bytes: int | None = None
    """Its tensors at its memory window's peak (its ``memory.peak_bytes``), bytes; null where not measured."""
    memory_headroom_bytes: int | None = None
    """Its room under its memory limit (its ``memory.headroom_bytes``), bytes; null where unknown. Ranks can differ
    (rank 0 logging or evaluating, uneven batches): the one with the least is the first to run out."""
    waited_for_evaluation_s: float = 0.0
    """Seconds its steps took beyond its median step in the steps where another rank held an evaluation pass and it
    held none (rank 0 evaluating alone, the others waiting for it at the next collective); those steps are left out
    of its ``steps``, ``median_s``, ``breakdown`` and ``spread_s`` here, as that rank's are of its own. 0 where none."""


@dataclass(frozen=True, slots=True)
class Straggler:
    """The rank the others wait for: its own work per step (step less exposed communication) against the others'
    median, and the phase that makes the difference."""

    rank: int = 0
    """The late rank."""
    late_s: float = 0.0
    """Seconds per step it is late by."""
    late_share: float = 0.0
    """``late_s`` as a share of the job's median step."""
    cause: str = ""
    """The step phase (``data_wait``, ``forward``, ``backward``, ``optimizer``, ``other``) most over the others'."""
    evidence: tuple[str, ...] = ()
    """Facts with numbers."""
    cause_share: float | None = None
    """The part of ``late_s`` its cause accounts for (its time in that phase over the others' median), 0..1."""
    spread_s: float | None = None
    """The other ranks' step-to-step spread (median of their ``spread_s``): the lateness stood clear of half of it,
    how far their own steps stray from their median."""
    others_wait_s: float | None = None
    """What it costs the job: the seconds a step the other ranks sat waiting for it (their median), from the
    collectives matched across ranks; null where found without them."""
    arrived_last: int | None = None
    """The profiled steps in which it arrived last at a collective, of ``steps_matched``."""
    steps_matched: int | None = None
    """The profiled steps whose collectives were matched across every rank."""
    basis: str = "phases"
    """``arrivals``: found from when each rank arrived at each collective; ``phases``: from the ranks' steps less
    their waits (records without collective calls)."""


@dataclass(frozen=True, slots=True)
class TraceDevice:
    """A device as a trace's ``deviceProperties`` describe it."""

    index: int = 0
    """The device's index in the trace (``id``)."""
    name: str = ""
    """Its model, as the trace names it (``NVIDIA A100-SXM4-80GB``)."""
    memory_total_bytes: int = 0
    """Its memory."""
    compute_capability: str | None = None
    """``8.0`` for an A100, null where the trace does not say (a ROCm device)."""
    multiprocessors: int = 0
    """Its streaming multiprocessors (compute units on ROCm)."""


@dataclass(frozen=True, slots=True)
class TraceSource:
    """Where a record made by ``gpuscope analyze`` came from: torch.profiler trace files alone, not a run."""

    kind: str = "torch.profiler trace"
    """What the record was built from."""
    files: tuple[str, ...] = ()
    """The trace files' names (one per rank for a job)."""
    trace_bytes: int = 0
    """Their size on disk, all of them."""
    devices: tuple[TraceDevice, ...] = ()
    """Devices the trace's ``deviceProperties`` list (every visible one, used or not)."""


@dataclass(frozen=True, slots=True)
class ProfilingWindow:
    """What ``--skip-steps`` and ``--profile-steps`` asked for, and when gpuscope handed the record over."""

    skip_steps: int = 0
    """Steps run before any measurement (counted in ``steps.warmup``, as ``steps.skipped``)."""
    profile_steps: int | None = None
    """Steps measured after the skipped ones (None: to the end of the run)."""
    handed_over_s: float | None = None
    """Seconds into the run when the profiled steps were over: the record and report were written, every
    collector came out, and the rest of the run went unprofiled (None: the script ended first)."""
    script_ended: bool = True
    """False while the script runs on after the hand-over: ``exit_status`` is not known yet (it reads 0 until
    the script ends; a job killed later keeps this record)."""


@dataclass(frozen=True, slots=True)
class Losses:
    """The loss of each step: the one-element tensor its outermost ``backward()`` was called on (the mean, where a
    step called it several times), kept on its device during the run and read after it: no sync added to a step.
    Every step's up to 2,048, then every 2nd step's, every 4th..., spread evenly over the run."""

    index: tuple[int, ...] = ()
    """Which steps of the run (0-based, as ``StepSample.index``)."""
    value: tuple[float | None, ...] = ()
    """Each of those steps' loss; null where it was not finite (NaN or infinite)."""


@dataclass(frozen=True, slots=True)
class LossCheck:
    """A trial's loss against the untouched run's, over the steps both kept after the fix took effect."""

    status: Literal["within", "drifted", "not finite", "not compared"] = "not compared"
    """within: the trial's mean loss over the compared steps is within ``tolerance`` of the untouched run's (relative);
    drifted: it is not; not finite: a loss of the trial was NaN or infinite; not compared: no loss to compare."""
    first_step: int | None = None
    """The first step compared."""
    last_step: int | None = None
    """The last step compared."""
    drift: float | None = None
    """|trial's mean - untouched's mean| / |untouched's mean| over the compared steps."""
    tolerance: float = 0.0
    """The largest drift counted as within: the untouched run's own step-to-step spread over those steps (so that
    an unseeded script, whose runs differ anyway, is not flagged), with a floor."""
    note: str = ""
    """What the check rests on, in words."""
    cause: str = ""
    """Where the loss left the untouched run's, what of the run may have moved it (an autocast trial over a loss on
    probabilities: ``speed_of_light.probability_loss``); empty otherwise."""


Effect = Literal["faster", "slower", "no measurable change"]


@dataclass(frozen=True, slots=True)
class Trial:
    """A fix tried by ``gpuscope run --try``: the script run again with the fix applied by gpuscope at run time
    (no line of it edited), over the same steps, against the untouched run."""

    id: str = ""
    """The recommendation id tried."""
    status: Literal["measured", "failed", "refused", "not run"] = "not run"
    """measured; failed (the trial run ended in error or measured no step: ``reason``); refused (the fix cannot be
    applied at run time: ``reason``); not run (the time budget was spent: ``reason``)."""
    reason: str | None = None
    """Why it was not measured."""
    change: str = ""
    """The change applied, as the recommendation's fix writes it."""
    run_dir: str | None = None
    """The trial's own run folder, relative to the untouched run's (``try-ID``): its run.json, report and
    compare.html."""
    steps: int = 0
    """Steps the trial ran, as did the stretch of the untouched run it is held against."""
    runs: int = 0
    """Runs of the script with the fix (each beside an untouched one: ``diagnose.thresholds.TRIAL_ROUNDS``)."""
    compared_steps: int = 0
    """Steady steps the speed-up is measured on, over all its runs: those after the fix took effect."""
    step_before_s: float | None = None
    """The untouched runs' step over the compared steps: their mean, the runs' pace (a median would misread a loop
    whose steps alternate fast and slow: two workers delivering in rounds). Before 2026-11-28, the mean less the
    tenth longest and tenth shortest steps."""
    step_after_s: float | None = None
    """The trial's step over the compared steps, taken the same way."""
    speedup: float | None = None
    """step_before_s / step_after_s (above 1: the fix made the step faster)."""
    speedup_low: float | None = None
    """The 95% bootstrap interval of the speed-up, low end."""
    speedup_high: float | None = None
    """...and high end."""
    estimated_gain: float | None = None
    """The recommendation's expected gain before the trial (fraction of step time), or null."""
    measured_gain: float | None = None
    """1 - 1/speedup; null where the speed is not credited."""
    credited: bool = False
    """Whether the speed counts: measured faster (its interval above 1), and the loss within its tolerance (or not
    comparable). Before 2026-11-28, whatever the interval said."""
    effect: Effect | None = None
    """What the interval says: ``faster`` (above 1), ``slower`` (below 1), ``no measurable change`` (it holds 1).
    Null where not measured, and in older records."""
    loss: LossCheck | None = None
    """The loss check."""
    losses: Losses | None = None
    """The trial's loss step by step (its own run.json's ``loss``), drawn beside the untouched run's."""
    peak_memory_before_bytes: int | None = None
    """The untouched runs' peak memory, the highest of the rounds: torch's tensors at the memory window's peak
    where every run of both arms measured it (``memory.peak_bytes``, what the memory fixes' savings are predicted
    on), else the CUDA allocator's peak allocated bytes on a CUDA run, the process's peak resident memory on a CPU
    one; null where not sampled."""
    peak_memory_after_bytes: int | None = None
    """...and the runs' with the fix, taken the same way."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    """The whole record of one run; ``to_json()`` is ``run.json``."""

    schema: str = SCHEMA
    """Always "gpuscope.run/1"."""
    gpuscope_version: str = ""
    """The gpuscope that wrote the file."""
    command: tuple[str, ...] = ()
    """The script (or `-m MODULE`) and its arguments, as run."""
    exit_status: int = 0
    """The script's exit status: 0, its sys.exit code, 1 after an uncaught exception, 130 after Ctrl-C, 143 after
    SIGTERM, 128 + N after a fatal signal N (139 a segfault; 137 recorded for a run killed outright)."""
    device: Literal["cuda", "cpu"] = "cpu"
    """Where the model's tensors ran."""
    steps: Steps = field(default_factory=Steps)
    """Steady-state training steps found, and every step's fate."""
    breakdown: Breakdown = field(default_factory=Breakdown)
    """Fractions of the median step's wall time per phase (0..1, adding up to 1)."""
    host_breakdown: Breakdown | None = None
    """The host-timer breakdown, kept beside a device-based ``breakdown`` on CUDA runs."""
    verdict: Verdict = field(default_factory=Verdict)
    """What bounds the run."""
    recommendations: tuple[Recommendation, ...] = ()
    """Changes worth making, most valuable first."""
    checks: dict[str, RuleCheck] = field(default_factory=dict)
    """Every diagnosis rule by id, and whether it fired, found nothing, or could not be checked."""
    collectors: dict[str, CollectorStatus] = field(default_factory=dict)
    """Every collector by name (steps, cprofile, torch-trace, memory, nvml, ...): whether it produced data, and if not,
    why."""
    loaders: tuple[Loader, ...] = ()
    """Every DataLoader configuration the run iterated over."""
    python_profile: PythonProfile | None = None
    """cProfile's window (python.prof); null when it was not collected."""
    op_profile: OpProfile | None = None
    """torch.profiler's window (trace.json); null when it was not collected."""
    host_memory: HostMemory | None = None
    """Resident memory over time; null when it was not collected."""
    gpus: GpuSamples | None = None
    """NVML samples of every visible GPU; null without an NVIDIA driver."""
    cuda_memory: CudaMemory | None = None
    """CUDA caching-allocator memory; null on a CPU run."""
    memory: Memory | None = None
    """What fills memory at the peak, what a leak keeps, what a fix would free; null where not measured."""
    calibration: Calibration | None = None
    """This machine's per-op cost (post-run probe); null when not measured (--no-probes)."""
    practices: Practices | None = None
    """Debug APIs, gradient clearing, layer patterns and backend flags seen in training."""
    data_probe: DataProbe | None = None
    """The slowest loader's dataset under a line tracer (post-run probe); null when not run."""
    syncs: SyncProfile | None = None
    """Host-device synchronisations counted on CUDA runs; null on a CPU run."""
    loader_probe: LoaderProbe | None = None
    """The slowest loader timed with several worker counts (post-run probe); null when not run."""
    optimizer_probe: OptimizerProbe | None = None
    """The loop's optimizer's update timed again on copies of its parameters, as run and with fused=True (post-run
    probe); null when not run."""
    item_repeat: ItemRepeat | None = None
    """A few of the training dataset's items read again and again after the run and compared (post-run probe, only
    where a frozen model runs on the DataLoader's batches as loaded); null when not run."""
    speed_of_light: SpeedOfLight | None = None
    """FLOPs of one step against the device's peak; null when not counted."""
    what_if: WhatIf | None = None
    """An estimate of the step without the verdict's bottleneck (filled in by the analysis)."""
    meta: RunMeta = field(default_factory=RunMeta)
    """When, how long, and on what software and machine."""
    distributed: Distributed | None = None
    """This rank's place in a torch.distributed job (None: not one)."""
    ranks: tuple[RankSummary, ...] = ()
    """A job's merged record: every rank found in the run folder."""
    missing_ranks: tuple[int, ...] = ()
    """Ranks of the job's world that left no record (killed, or still running)."""
    straggler: Straggler | None = None
    """In a job's merged record: the rank the others wait for, or null."""
    source: TraceSource | None = None
    """Set when the record was built from a trace alone (``gpuscope analyze``); None for a profiled run."""
    profiling_window: ProfilingWindow | None = None
    """The steps the user asked to measure (``--skip-steps``, ``--profile-steps``); None: the whole run."""
    loss: Losses | None = None
    """The training loss step by step; null where no step called ``backward()`` on a one-element tensor."""
    trials: tuple[Trial, ...] = ()
    """Fixes tried by ``gpuscope run --try``, in the order tried; empty without it."""

    def to_json(self) -> dict[str, Any]:
        """The plain-JSON form of the record (``run.json``)."""
        return _to_plain(self)

    @classmethod
    def from_json(cls, data: Any) -> RunRecord:
        """Build a record from parsed ``run.json``; missing optional fields take defaults, unknown ones are ignored.

        Raises GpuscopeError for another schema or values of the wrong type.
        """
        if not isinstance(data, dict):
            raise GpuscopeError("run.json does not hold a JSON object")
        schema = data.get("schema")
        if schema != SCHEMA:
            raise GpuscopeError(f"run.json has schema {schema!r}, expected {SCHEMA!r}")
        try:
            return _from_plain(cls, data)
        except (TypeError, ValueError) as exc:
            raise GpuscopeError(f"run.json is malformed: {exc}") from None


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _to_plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_to_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _from_plain(cls: type, data: Any) -> Any:
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} must be an object, not {type(data).__name__}")
    return cls(**{name: convert(data[name], name) for name, convert in _readers(cls) if name in data})


Converter = Callable[[Any, str], Any]
"""Checks and converts one JSON value to a field's type; ``where`` names the field in errors."""


@functools.cache
def _readers(cls: type) -> tuple[tuple[str, Converter], ...]:
    """Each field of a record class with its converter, worked out once per class: type hints are slow to resolve,
    and a 1024-rank job reads each class a thousand times."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, _converter(hints[f.name])) for f in dataclasses.fields(cls))


@functools.cache
def _converter(tp: Any) -> Converter:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = _converter([a for a in typing.get_args(tp) if a is not type(None)][0])
        return lambda value, where: None if value is None else inner(value, where)
    if dataclasses.is_dataclass(tp):
        return lambda value, where: _from_plain(tp, value)
    if origin is tuple and Ellipsis not in typing.get_args(tp):  # a fixed-length tuple: an item's type a place
        places = tuple(_converter(a) for a in typing.get_args(tp))

        def to_fixed(value: Any, where: str) -> tuple[Any, ...]:
            if not isinstance(value, list) or len(value) != len(places):
                raise TypeError(f"{where} must be a list of {len(places)}")
            return tuple(convert(v, where) for convert, v in zip(places, value))
        return to_fixed
    if origin is tuple:
        item = _converter(typing.get_args(tp)[0])

        def to_tuple(value: Any, where: str) -> tuple[Any, ...]:
            if not isinstance(value, list):
                raise TypeError(f"{where} must be a list")
            return tuple(item(v, where) for v in value)
        return to_tuple
    if origin is dict:
        entry = _converter(typing.get_args(tp)[1])

        def to_dict(value: Any, where: str) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise TypeError(f"{where} must be an object")
            return {str(k): entry(v, f"{where}.{k}") for k, v in value.items()}
        return to_dict
    if origin is Literal:  # values from a newer gpuscope (a new bound, say) are kept as they are
        return _checked(str, "a string")
    if tp is float:
        def to_float(value: Any, where: str) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{where} must be a number")
            return float(value)
        return to_float
    if tp is int:
        def to_int(value: Any, where: str) -> int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{where} must be an integer")
            return value
        return to_int
    if tp is bool:
        return _checked(bool, "true or false")
    if tp is str:
        return _checked(str, "a string")
    return lambda value, where: value


def _checked(kind: type, words: str) -> Converter:
    def check(value: Any, where: str) -> Any:
        if not isinstance(value, kind):
            raise TypeError(f"{where} must be {words}")
        return value
    return check


def write_record(record: RunRecord, run_dir: Path) -> Path:
    """Write ``run.json`` into ``run_dir`` atomically (sorted keys, so runs diff cleanly)."""
    path = run_dir / RUN_JSON
    tmp = path.with_name(f".{RUN_JSON}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record.to_json(), indent=1, sort_keys=True, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def load_record(run_dir: Path) -> RunRecord:
    """Read ``RUN_DIR/run.json``; any problem becomes a one-line GpuscopeError."""
    path = Path(run_dir) / RUN_JSON
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise GpuscopeError(f"no run.json in {run_dir}") from None
    except OSError as exc:
        raise GpuscopeError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise GpuscopeError(f"{path} is not valid JSON: {exc}") from None
    return RunRecord.from_json(data)
