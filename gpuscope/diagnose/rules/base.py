"""The rule registry: one rule per recommendation id, each declaring the record inputs it needs, so that a rule
whose inputs were not collected reports "not checked" (and why) rather than a silent nothing, and the figures that
show its fix took in a later run (``gpuscope compare``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuscope.collect.autocast_timing import NO_FASTER
from gpuscope.diagnose.evidence import Metric, comm_share
from gpuscope.diagnose.thresholds import COMM_BOUND
from gpuscope.diagnose.words import unlike_window
from gpuscope.record import RunRecord

Needs = tuple[str, ...]
"""Record fields a rule reads: "op_profile", "calibration", "loaders", "kernels" (the CUDA kernel timeline),
"cuda" (a CUDA run), "cpu" (a CPU-only run), "practices", "data_probe", "syncs", "model" (the model's layers,
inspected), "optimizer_probe" (the optimizer's update timed again, as run and fused), "matmul_rates" (this
machine's measured matmul rate in the step's dtype, and in float32 where that is another), "attention_timing" (a
CPU step's attention in bfloat16 / float16, timed again after the run in that dtype and in float32),
"autocast_timing" (a float32 CPU step's heaviest matmul and convolution shapes, timed again after the run in float32
and under bfloat16 autocast), "batch_build"
(the data probe, or the loader probe's timing of a sampler of the user's own: some part of building a batch timed),
"host_memory" (the host memory samples), "memory" (the memory window's breakdown, or the census of a run that died
of memory), "glibc_malloc" (glibc's malloc served the process), "job" (a data-parallel
job's merged record, its ranks set side by side), "host_recompute" (where the steps checkpointed, a CPU run:
checkpointing's recomputation timed on the loop's thread), "host_passes" (a CPU run: the trained model's forward
passes timed on the host's clock are their time), "training" (the steps train: a backward or an optimizer step in
them, not an evaluation or inference loop alone)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """A rule fired: its estimated gain (fraction of step time, or None where no estimate is sound) and the
    measured facts it rests on, each with its number."""

    gain: float | None
    evidence: tuple[str, ...]
    fix: str | None = None
    """A fix adapted to this run (e.g. with the worker count filled in); the rule's generic fix otherwise."""
    settings: Mapping[str, object] = field(default_factory=dict)
    """The values this run's fix names, which ``fix`` is written from and a trial applies (``AtRunTime``)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """...and the environment it names (the allocator's thresholds)."""

    def __post_init__(self) -> None:
        # no rule fires without evidence, and evidence carries the numbers it rests on
        if not self.evidence or not any(ch.isdigit() for fact in self.evidence for ch in fact):
            raise ValueError(f"a finding needs evidence with its numbers, got {self.evidence!r}")


@dataclass(frozen=True, slots=True)
class AtRunTime:
    """A fix ``gpuscope run --try`` applies to the unchanged script as it runs (``collect.fixes.INSTALLERS``), with
    the values of the run's finding over these (the rule's generic fix's)."""

    settings: Mapping[str, object] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    settings_of: Callable[[RunRecord], Mapping[str, object]] | None = None
    """Values read off the run where the rule did not fire (the model's repeated block)."""
    requires: Mapping[str, str] = field(default_factory=dict)
    """A setting the fix is not tried without, and why it is missing where it is."""
    change: str = ""
    """The trial's change, written from its settings (``str.format``), where it is not the fix's own text."""
    cuda_only: str = ""
    """Why it is not tried on a CPU run, where it is not."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A fix ``gpuscope run --try`` does not apply, and why: it needs the user's code edited, or it changes more than
    the speed."""

    reason: str


@dataclass(frozen=True, slots=True)
class Rule:
    """A diagnosis rule; ``check`` returns a Finding when the rule fires, None when it checked and found nothing."""

    id: str
    title: str
    fix: str
    needs: Needs
    check: Callable[[RunRecord], Finding | None]
    resolved_by: tuple[Metric, ...]
    """The figures, most telling first, whose change from one run to the next shows the fix took."""
    trial: AtRunTime | Refused
    """Whether ``--try`` applies the fix at run time, with what; or why not."""


RULES: list[Rule] = []
"""Registered rules, in registry order (which breaks ties in expected gain)."""


def rule(id: str, title: str, fix: str, needs: Needs = (), *, resolved_by: Sequence[Metric],
         trial: AtRunTime | Refused) -> Callable[[Callable[[RunRecord], Finding | None]], Any]:
    """Register a check function as the rule ``id``; ``resolved_by``: the figures that show its fix took (at
    least one; ``evidence.STEP``, the median step, where nothing more telling is measured); ``trial``: how
    ``--try`` applies its fix, or why it does not."""

    def register(check: Callable[[RunRecord], Finding | None]) -> Callable[[RunRecord], Finding | None]:
        if any(r.id == id for r in RULES):
            raise ValueError(f"rule {id} registered twice")
        if not resolved_by:
            raise ValueError(f"rule {id} declares no figure that shows it resolved")
        if not isinstance(trial, (AtRunTime, Refused)):
            raise ValueError(f"rule {id} declares neither how its fix is tried nor why it is not")
        RULES.append(Rule(id, title, fix, needs, check, tuple(resolved_by), trial))
        return check

    return register


def _trains(record: RunRecord) -> bool:
    """Whether the steps train: a backward or an optimizer step in them (Hogwild's main process only tests the model
    its child processes train)."""
    b = record.breakdown
    return record.steps.forwards_per_backward is not None or b is None or b.backward > 0 or b.optimizer > 0


def missing_input(record: RunRecord, needs: Needs) -> str | None:
    """Why the rule cannot be checked on this record, or None if everything it needs was collected."""
    for need in needs:
        if need == "cuda" and record.device != "cuda":
            return "a CPU-only run: this is about GPU work"
        if need == "cpu" and record.device != "cpu":
            return "a GPU run: this is about a CPU's own arithmetic"
        if need == "host_recompute" and record.device != "cpu" and record.steps.checkpointing is not None:
            return ("a GPU run: activation checkpointing's recomputation runs on autograd's device threads, and its "
                    "device time is not told apart from the rest of backward's")
        if need == "host_passes" and record.device != "cpu":
            return ("a GPU run: its forward passes are timed on the host, which queues the GPU's work ahead of it, "
                    "not on the GPU")
        if need == "matmul_rates" and (why := _rates_missing(record)) is not None:
            return why
        if need == "attention_timing" and (why := _attention_missing(record)) is not None:
            return why
        if need == "autocast_timing" and (why := _autocast_missing(record)) is not None:
            return why
        if need == "kernels" and (record.op_profile is None or record.op_profile.kernels is None):
            return "no CUDA kernel timeline" + _collector_reason(record, "op_profile")
        if need == "collectives" and (why := _collectives_missing(record)) is not None:
            return why
        if need == "op_profile" and (record.op_profile is None or not record.op_profile.ops):
            return "no op-level profile" + _collector_reason(record, "op_profile")
        if need in ("op_profile", "kernels") and (unlike := unlike_window(record)) is not None:
            return unlike
        if need == "training" and not _trains(record):
            return ("the steps train no model: no backward and no optimizer step in them (an evaluation or "
                    "inference loop; a script whose training runs in processes it started)")
        if need == "job" and not record.ranks:
            return "not a data-parallel job's merged record (one process: no rank to wait for)"
        if need == "loaders" and not record.loaders:
            return "no DataLoader was iterated"
        if need == "batch_build" and record.data_probe is None and not (
                record.loader_probe is not None and record.loader_probe.sampler_s):
            return _ABSENT["data_probe"] + _collector_reason(record, "data_probe")
        if need in _ABSENT and getattr(record, need) is None:
            return _ABSENT[need] + _collector_reason(record, need)
        if need == "glibc_malloc" and record.host_memory is not None and record.host_memory.allocator != "glibc":
            return (f"malloc was {record.host_memory.allocator}'s, not glibc's" if record.host_memory.allocator
                    else "the C allocator serving malloc could not be told (not Linux?)")
        if need == "model" and (record.practices is None or not record.practices.modules_inspected):
            return "the model's layers were not inspected (fewer than three steps, or no trained module found)"
    return None


_ABSENT = {
    "calibration": "no per-op cost calibration",
    "practices": "the framework's settings were not read",
    "host_memory": "host memory was not sampled",
    "data_probe": "the dataset was not probed",
    "syncs": "host-device syncs were not counted",
    "loader_probe": "the DataLoader was not probed",
    "optimizer_probe": "the optimizer's update was not timed again",
    "memory": "memory was not measured",
}
"""Record fields filled by one collector each, and what their absence means."""


def _collectives_missing(record: RunRecord) -> str | None:
    """Why the collectives' share of the step cannot be read: none were profiled; or the profiled steps ran at
    another pace than the steady ones and the share stays under the bar at which the verdict calls the job
    communication-bound (beside busy processes a balanced job's slowed window reached 20%; at the bar the verdict
    stands on that share, and its advice with it)."""
    comm = record.op_profile.communication if record.op_profile is not None else None
    if comm is None:
        return "no collectives were profiled" + _collector_reason(record, "op_profile")
    unlike = unlike_window(record)
    if unlike is not None and comm_share(comm, record.steps.median_s) < COMM_BOUND:
        return unlike
    return None


def _rates_missing(record: RunRecord) -> str | None:
    """Why this machine's matmul rates are not known for the run: in the step's dtype (measured after the run by the
    cpu-peak probe) and, where that is not float32, in float32 beside it; None where they are, or where the step's
    matmuls were float32 already."""
    sol = record.speed_of_light
    if sol is None or not sol.dtype:
        return "the dtype of the step's matmuls is unknown (no step's FLOPs were counted)" + _collector_reason(
            record, "speed_of_light")
    if sol.dtype == "float32":
        return None  # a float32 step: nothing to hold against it
    probe = record.collectors.get("cpu-peak")
    why = f" (cpu-peak: {probe.reason})" if probe is not None and probe.reason else (
        "" if probe is not None else " (the cpu-peak probe did not run)")
    if not sol.peak_measured or not sol.peak_flops_per_s:
        return "this machine's matmul rate was not measured" + why
    if not sol.float32_flops_per_s:
        return f"this machine's float32 matmul rate was not measured beside its {sol.dtype} one" + why
    return None


def _attention_missing(record: RunRecord) -> str | None:
    """Why the step's attention was not timed in its dtype and in float32 after the run; None where it was, or where
    the counted step ran none in bfloat16 or float16 (nothing to hold against it, as a float32 step's matmuls)."""
    sol = record.speed_of_light
    if sol is None:
        return "no step's FLOPs were counted" + _collector_reason(record, "speed_of_light")
    call = sol.attention
    if call is None or call.dtype not in ("bfloat16", "float16"):
        return None
    if len(call.seconds) < 2:
        probe = record.collectors.get("cpu-peak")
        return "the step's attention was not timed after the run" + (
            f" (cpu-peak: {probe.reason})" if probe is not None and probe.reason else " (or its query was too large)")
    return None


def _autocast_missing(record: RunRecord) -> str | None:
    """Why the step's heaviest shapes were not timed under bfloat16 autocast after the run: the step did not run in
    float32, or this machine's bfloat16 is no faster (the probe's own words); None where they were."""
    sol = record.speed_of_light
    if sol is None or not sol.dtype:
        return "no step's FLOPs were counted" + _collector_reason(record, "speed_of_light")
    if sol.dtype != "float32":
        return f"the step's matmuls ran in {sol.dtype}, not float32"
    if sol.autocast:
        return None
    probe = record.collectors.get("cpu-peak")
    if probe is not None and NO_FASTER in sol.peak_source:
        return "this machine's bfloat16 matmuls measured no faster than its float32 ones"
    return "the step's heaviest matmuls and convolutions were not timed in bfloat16" + (
        f" (cpu-peak: {probe.reason})" if probe is not None and probe.reason else "")


def _collector_reason(record: RunRecord, field: str) -> str:
    """" (NAME: why)" for the collector that fills ``field`` in ``record``, when it said why it did not."""
    for name, status in record.collectors.items():
        if status.field == field and status.reason:
            return f" ({name}: {status.reason})"
    return ""
