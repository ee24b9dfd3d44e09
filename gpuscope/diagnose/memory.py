"""Memory's figures: growth step over step (a leak), the room left under the run's limit, the largest batch that
fits, and what each memory fix would free at the peak (docs/memory.md).

Each fix is worked out on the measured steps' timeline (``Memory.timeline``): the categories it shrinks are changed
at every point, and the saving is the peak less the new timeline's highest point, so a fix that shrinks what is not
there at the peak (activations, where the peak falls in the optimizer's step) is credited with what it frees there,
not with its whole size.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence

from gpuscope.diagnose import thresholds as th
from gpuscope.record import MEMORY_CATEGORIES as CATEGORIES
from gpuscope.record import Memory, MemoryFix, MemoryGrowth, MemoryTimeline, RunRecord

MAX_READINGS = 200
"""Readings the growth's slope is taken over (evenly chosen): the pairs' slopes number their square."""
Change = Callable[[str, str, float], float]
"""A fix, as what it leaves of a category's bytes at a point of the given phase: ``(category, phase, bytes)``."""


def scaled(factor: Callable[[str, str], float]) -> Change:
    """A fix that scales each category by a factor (by category and phase)."""
    return lambda category, phase, value: value * factor(category, phase)


def complete_memory(record: RunRecord) -> Memory | None:
    """``record.memory`` with the analysis's figures filled in: growth, batch size, headroom, largest batch, fixes."""
    memory = record.memory
    if memory is None:
        return None
    batch = training_batch_size(record)
    memory = dataclasses.replace(memory, growth=growth(record, memory), batch_size=batch or memory.batch_size)
    headroom = headroom_bytes(record, memory)
    return dataclasses.replace(memory, headroom_bytes=headroom, largest_batch=largest_batch(record, memory),
                               fixes=fixes(record, memory))


def training_batch_size(record: RunRecord) -> int:
    """The batch size of the loader that gave the most batches (the training one); 0 where unknown."""
    loaders = [loader for loader in record.loaders if loader.batch_size]
    if not loaders:
        return 0
    return int(max(loaders, key=lambda loader: loader.batches).batch_size or 0)


# -- growth ------------------------------------------------------------------------------------------------------
def readings(record: RunRecord, memory: Memory) -> tuple[str, list[tuple[int, int]]]:
    """What to watch for growth and its readings, ``(step, bytes)``, after the warm-up and the profiling windows:
    the CUDA allocator's allocated bytes on a CUDA run, the process's resident memory on a CPU one."""
    first = max([record.steps.warmup, *(s + 1 for s in memory.steps), *_profiled(record)], default=0)
    if memory.device == "cuda" and record.cuda_memory is not None:
        cuda = record.cuda_memory
        return "cuda", [(s, b) for s, b in zip(cuda.step, cuda.allocated_bytes) if s >= first]
    host = record.host_memory
    if host is None:
        return "host", []
    last = max(host.steps_seen, default=0)  # readings at the last count may be after the loop: the end's own work
    return "host", [(s, b) for s, b in zip(host.steps_seen, host.process_bytes) if first <= s < last]


def _profiled(record: RunRecord) -> list[int]:
    sample = record.steps.sample
    return [index + 1 for index, status in zip(sample.index, sample.status) if status == "profiled"]


def theil_sen(points: Sequence[tuple[int, int]]) -> float:
    """The median of the slopes between every pair of points (bytes a step)."""
    if len(points) > MAX_READINGS:
        every = len(points) / MAX_READINGS
        points = [points[int(i * every)] for i in range(MAX_READINGS)]
    slopes = [(b[1] - a[1]) / (b[0] - a[0]) for i, a in enumerate(points) for b in points[i + 1:] if b[0] > a[0]]
    return statistics.median(slopes) if slopes else 0.0


def growth(record: RunRecord, memory: Memory) -> MemoryGrowth | None:
    """Growth a step over the readings after the windows; a leak where it is large against what was held at
    their start and seen in both halves of them (``thresholds.LEAK_*``), at the pace of the tensors the memory window
    saw a step keep where the two agree. None where they span too few steps."""
    source, points = readings(record, memory)
    if len(points) < 4 or points[-1][0] - points[0][0] < th.LEAK_MIN_STEPS:
        return None
    rate = theil_sen(points)
    steps = points[-1][0] - points[0][0]
    grew = rate * steps
    middle = (points[0][0] + points[-1][0]) / 2
    halves = [p for p in points if p[0] <= middle], [p for p in points if p[0] >= middle]
    each = [theil_sen(half) if len(half) >= 2 else 0.0 for half in halves]
    held = statistics.median(b for _, b in points[:3])
    # resident memory also grows as the C allocator's heap fills out (over a DataLoader's first epochs with
    # workers): where the memory window read its steps and saw no tensor outlive its step, that is no leak
    unkept = source == "host" and bool(memory.steps) and not memory.kept_bytes_per_step
    leak = (grew >= th.LEAK_MIN_BYTES and grew >= th.LEAK_MIN_SHARE * held and not unkept
            and all(r >= th.LEAK_HALF_SHARE * rate for r in each))
    low, high = th.LEAK_KEPT_AGREES
    kept = memory.kept_bytes_per_step if leak and low * rate <= memory.kept_bytes_per_step <= high * rate else 0
    return MemoryGrowth(source=source, per_step_bytes=round(rate, 1), from_step=points[0][0],  # type: ignore[arg-type]
                        to_step=points[-1][0], grew_bytes=round(grew), leak=leak, kept_per_step_bytes=kept)


# -- room ----------------------------------------------------------------------------------------------------------
def used_bytes(record: RunRecord, memory: Memory) -> int:
    """What the limit is held against: the allocator's reserved peak (CUDA), the process's peak virtual size under an
    address-space limit, else its peak resident memory."""
    if memory.device == "cuda":
        cuda = record.cuda_memory
        return cuda.peak_reserved_bytes if cuda is not None else memory.reserved_bytes or memory.peak_bytes
    if "RLIMIT_AS" in memory.limit_source:
        return memory.address_space_peak_bytes
    host = record.host_memory
    return max(host.peak_process_bytes if host is not None else 0, memory.process_bytes)


def headroom_bytes(record: RunRecord, memory: Memory) -> int | None:
    """The limit less what the run used at its highest; None where the limit is unknown."""
    if not memory.limit_bytes:
        return None
    return memory.limit_bytes - used_bytes(record, memory)


def short_of_memory(memory: Memory) -> bool:
    """Whether the run died of memory or its peak left under ``thresholds.SHORT_OF_MEMORY`` of its limit free."""
    if memory.out_of_memory is not None:
        return True
    return memory.headroom_bytes is not None and memory.limit_bytes > 0 and \
        memory.headroom_bytes < th.SHORT_OF_MEMORY * memory.limit_bytes


def largest_batch(record: RunRecord, memory: Memory) -> int | None:
    """The largest batch whose peak fits under the limit: activations, inputs and the forward and backward
    temporaries grow with the batch, the rest does not; what the process holds beside its tensors stays. None
    where the batch size, the limit or the timeline is unknown."""
    timeline = memory.timeline
    used = used_bytes(record, memory)
    if not memory.batch_size or not memory.limit_bytes or timeline is None or not timeline.t_ms or not used:
        return None
    beside = max(0, used - memory.peak_bytes)  # Python, libraries, the allocator's cache
    room = memory.limit_bytes - beside
    factor = float("inf")
    for i in range(len(timeline.t_ms)):
        scaling = _batch_bytes(timeline, i)
        fixed = _total(timeline, i) - scaling
        if scaling > 0:
            factor = min(factor, (room - fixed) / scaling)
    if factor == float("inf") or factor <= 0:
        return None
    return max(1, int(memory.batch_size * factor))


def _batch_bytes(timeline: MemoryTimeline, i: int) -> int:
    phase = timeline.phases[i] if i < len(timeline.phases) else "other"
    temporaries = timeline.temporaries[i] if phase in ("forward", "backward") else 0
    return timeline.activations[i] + timeline.inputs[i] + temporaries


def _total(timeline: MemoryTimeline, i: int) -> int:
    return sum(getattr(timeline, c)[i] for c in CATEGORIES)


# -- what each fix would free ---------------------------------------------------------------------------------------
def peak_under(timeline: MemoryTimeline, change: Change) -> float:
    """The timeline's highest point with every category changed by ``change(category, phase, bytes)``."""
    best = 0.0
    for i in range(len(timeline.t_ms)):
        phase = timeline.phases[i] if i < len(timeline.phases) else "other"
        best = max(best, sum(change(c, phase, getattr(timeline, c)[i]) for c in CATEGORIES))
    return best


def fixes(record: RunRecord, memory: Memory) -> tuple[MemoryFix, ...]:
    """Each memory fix that applies, with its saving at the peak, largest first."""
    timeline = memory.timeline
    if timeline is None or not timeline.t_ms or not memory.peak_bytes:
        return _fit_after_failure(memory)
    peak = max(_total(timeline, i) for i in range(len(timeline.t_ms)))
    found: list[MemoryFix] = []

    def add(fix_id: str, title: str, change: Change, how: str) -> None:
        saving = round(peak - peak_under(timeline, change))
        if saving > 0:
            found.append(MemoryFix(fix_id, title, saving, round(saving / peak, 3), how))

    acts = memory.activations_max_bytes
    if memory.repeated_blocks and acts:
        freed = max(0, memory.repeated_block_bytes - memory.repeated_block_inputs_bytes
                    - memory.repeated_block_max_bytes)
        share = min(1.0, memory.repeated_block_bytes / acts)  # of the activations, the blocks'
        held = memory.repeated_block_inputs_bytes + memory.repeated_block_max_bytes

        def checkpointed(category: str, phase: str, value: float) -> float:
            # the blocks' part of what is saved becomes their inputs and one block's, made again in backward: never
            # more than it was (late in backward, little is left to free)
            return value * (1 - share) + min(value * share, held) if category == "activations" else value

        add("activation-checkpointing",
            f"checkpoint each of the {memory.repeated_block_count} {memory.repeated_blocks} blocks "
            f"(torch.utils.checkpoint)",
            checkpointed,
            f"their activations ({mb(memory.repeated_block_bytes)}) are no longer kept, but their inputs "
            f"({mb(memory.repeated_block_inputs_bytes)}) are, and one block's ({mb(memory.repeated_block_max_bytes)})"
            f" is made again in backward: {mb(freed)} of the {mb(acts)} of activations freed")
    if acts:
        add("mixed-precision-activations", "train under torch.autocast (bfloat16 or float16 activations)",
            scaled(lambda c, p: th.HALF_PRECISION if c == "activations" else 1.0),
            "the activations saved for backward in 16 bits: half their float32 bytes")
    if memory.batch_size >= 2 and acts:
        add("smaller-micro-batch",
            f"half the batch ({memory.batch_size // 2}) with 2 steps of gradient accumulation",
            scaled(lambda c, p: 0.5 if c in ("activations", "inputs") or (c == "temporaries" and p in (
                "forward", "backward")) else 1.0),
            "activations, inputs and the forward and backward temporaries grow with the batch: halved")
    practices = record.practices
    if practices is not None and practices.zero_grad_fill_calls and memory.gradients_bytes:
        add("zero-grad-set-to-none", "optimizer.zero_grad(set_to_none=True)",
            scaled(lambda c, p: 0.0 if c == "gradients" and p == "forward" else 1.0),
            "the gradients are not kept through forward: they are made again in backward")
    if memory.optimizer_state_bytes:
        add("smaller-optimizer-state", "an optimizer whose state is half as large (SGD with momentum, Adafactor)",
            scaled(lambda c, p: th.SMALLER_STATE if c == "optimizer_state" else 1.0),
            f"the optimizer's state ({mb(memory.optimizer_state_bytes)}) halved")
    return tuple(sorted(found, key=lambda f: -f.saving_bytes))


def mb(n: float) -> str:
    """Bytes as MB (GB from a thousand MB)."""
    return f"{n / 1e6:.1f} MB" if abs(n) < 1e9 else f"{n / 1e9:.2f} GB"


def _fit_after_failure(memory: Memory) -> tuple[MemoryFix, ...]:
    """For a run that died of memory with no measured step: the share of the batch that would have fit. What grows
    with the batch is every live tensor but the parameters, gradients and optimizer state, plus the allocation that
    failed; what the process held beside its tensors stays."""
    died = memory.out_of_memory
    if died is None or not died.requested_bytes or not memory.limit_bytes:
        return ()
    fixed = died.parameters_bytes + died.gradients_bytes + died.optimizer_state_bytes
    growing = died.activations_bytes + died.other_bytes + died.requested_bytes
    live = fixed + died.activations_bytes + died.other_bytes
    used = memory.address_space_peak_bytes if "RLIMIT_AS" in memory.limit_source else memory.process_bytes
    beside = max(0, used - live) if used else 0
    share = (memory.limit_bytes - beside - fixed) / growing if growing else 0.0
    if not 0 < share < 1:
        return ()
    need = fixed + growing + beside
    return (MemoryFix(
        "smaller-micro-batch", f"a batch under {share:.0%} the size (with gradient accumulation to keep the step's)",
        int(need - memory.limit_bytes), round(1 - memory.limit_bytes / need, 3),
        f"the failed step needed {mb(need)} at least: {mb(growing)} that grows with the batch (the live tensors "
        f"but parameters, gradients and optimizer state, and the {mb(died.requested_bytes)} asked for), "
        f"{mb(fixed)} that does not, {mb(beside)} the process held beside its tensors; the limit is "
        f"{mb(memory.limit_bytes)}"),)
