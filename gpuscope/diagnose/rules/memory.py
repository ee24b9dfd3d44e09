"""Rules about memory: a leak (memory that grows step over step, and the line that makes what stays), and a run
short of memory (the memory fixes, each with what it frees at the peak)."""

from __future__ import annotations

from gpuscope.diagnose.evidence import Metric
from gpuscope.diagnose.memory import mb, short_of_memory
from gpuscope.diagnose.rules.base import AtRunTime, Finding, Refused, rule
from gpuscope.record import Memory, RunRecord

GROWTH = Metric("memory growth a step, MB", "number",
                lambda r: r.memory.growth.per_step_bytes / 1e6
                if r.memory is not None and r.memory.growth is not None else None)
"""MB a step."""
PEAK = Metric("memory peak, MB", "number", lambda r: r.memory.peak_bytes / 1e6 if r.memory is not None and
              r.memory.steps else None)
"""MB of tensors at the measured steps' peak."""


CHECKPOINT_CHANGE = ("checkpoint each {block} block: torch.utils.checkpoint.checkpoint(block, x, "
                     "use_reentrant=False)")
"""What ``--try reduce-memory`` changes: the one memory fix applied at run time."""


def repeated_block(record: RunRecord) -> dict[str, object]:
    """The class of the model's repeated block, which ``--try reduce-memory`` checkpoints (none where none was found)."""
    memory = record.memory
    return {"block": memory.repeated_blocks} if memory is not None and memory.repeated_blocks else {}


@rule("fix-memory-leak", "Stop keeping each step's tensors",
      "keep what you store across steps off autograd's graph and small: `.detach()` (or `.item()` for a loss) "
      "what you append or accumulate; run evaluation under `torch.no_grad()`",
      needs=("memory",), resolved_by=(GROWTH,),
      trial=Refused("it is a change to what your loop keeps from step to step"))
def memory_leak(record: RunRecord) -> Finding | None:
    """Signal: memory grows step over step after the windows (``diagnose.memory.growth``), by 5% of what was held and
    16 MB at least, in both halves of those steps.
    Why it matters: a run that keeps each step's tensors runs out of memory however large the machine, and its
    allocator slows as it grows.
    Fix: the line that made the most of what the memory window's first step left alive at the end of its second,
    with the usual cause: a tensor kept with its graph (a loss summed without ``.item()``) or by a reference."""
    memory = record.memory
    if memory is None or memory.growth is None or not memory.growth.leak:
        return None
    g = memory.growth
    what = "the CUDA allocator's allocated memory" if g.source == "cuda" else "the process's resident memory"
    evidence = [f"{what} grows {mb(g.per_step_bytes)} a step over steps {g.from_step}-{g.to_step} "
                f"({mb(g.grew_bytes)} in all)" + (f", {mb(g.kept_per_step_bytes)} of it the tensors a step keeps"
                                                  if g.kept_per_step_bytes else "")]
    fix = None
    if memory.kept:
        top = memory.kept[0]
        step = memory.steps[0] if memory.steps else 0
        where = top.line or "a line outside the script"
        called = f", called from {', '.join(top.callers)}" if top.callers else ""
        by = f", kept by {top.held_by}" if top.held_by else ""
        evidence.append(f"step {step} made {mb(memory.kept_bytes_per_step)} still alive at the end of step "
                        f"{step + 1}; the most, {mb(top.bytes)} ({top.category}), at {where}{called}{by}")
        fix = f"{where}: {_cause(memory)}"
    return Finding(None, tuple(evidence), fix=fix)


def _cause(memory: Memory) -> str:
    """What keeps the most of what a step left alive, and its fix: the script's variable where it was found (a
    container, a tensor whose graph saved it, the tensor itself), else the usual causes for its category."""
    top = memory.kept[0]
    name = f"`{top.holder_name}`"
    if top.holder_kind == "graph":
        return (f"{name} keeps every step's autograd graph, with the tensors it saved (a loss summed without "
                f"`.item()`, an output kept without `.detach()`): accumulate `loss.item()` (or `.detach()`) into "
                f"{name}, and run evaluation under `torch.no_grad()`")
    if top.holder_kind in ("list", "tuple", "dict", "set"):
        return (f"{top.held_by} gains a tensor made here each step, with its autograd graph: append `.detach()` (or "
                f"`.item()`, `.detach().cpu()`) copies, or keep it bounded")
    if top.holder_kind == "variable":
        return f"{name} still holds a tensor made here a step later: drop it, or keep `.detach()` (`.item()`) of it"
    if top.category == "activations":
        return ("a tensor made here outlives its step: kept by a list, a dict or an attribute, or by the graph of "
                "a tensor kept with it (a loss summed without `.item()`, an output stored without `.detach()`): "
                "store `t.detach()` (`.item()` for a number), and run evaluation under `torch.no_grad()`")
    return ("a tensor made here outlives its step: keep no reference to it past the step (a list that grows, a "
            "cache without a bound), or store `.detach().cpu()` copies where you need them")


@rule("reduce-memory", "Make the run fit in memory",
      "the memory fixes below, largest saving first: activation checkpointing of the repeated blocks "
      "(`torch.utils.checkpoint`), mixed precision, a smaller micro-batch with gradient accumulation",
      needs=("memory",), resolved_by=(PEAK,),
      trial=AtRunTime(settings_of=repeated_block, requires={
          "block": "no repeated block was found to checkpoint (the one memory fix applied at run time)"},
          change=CHECKPOINT_CHANGE))
def reduce_memory(record: RunRecord) -> Finding | None:
    """Signal: the run died of a failed allocation, or its peak left under ``thresholds.SHORT_OF_MEMORY`` of its limit
    free.
    Why it matters: a run at its limit dies at the first longer batch, and cannot grow its batch or model.
    Fix: the memory fixes that apply, each with what it frees at the peak (``diagnose.memory.fixes``)."""
    memory = record.memory
    if memory is None or not short_of_memory(memory):
        return None
    evidence = []
    if memory.out_of_memory is not None:
        evidence.append(f"the script died of a failed allocation at step {memory.out_of_memory.step}: "
                        f"{memory.out_of_memory.error}")
    if memory.limit_bytes and memory.headroom_bytes is not None:
        evidence.append(f"{mb(memory.headroom_bytes)} of {memory.limit_source} ({mb(memory.limit_bytes)}) left "
                        f"free at the peak")
    if memory.peak_bytes:
        evidence.append(f"tensors at the peak: {mb(memory.peak_bytes)}")
    if not any(ch.isdigit() for line in evidence for ch in line):
        return None
    fix = None
    if memory.fixes:
        fix = "; ".join(f"{f.title}: frees {mb(f.saving_bytes)} ({f.share_of_peak:.0%} of the peak)"
                        for f in memory.fixes[:4])
    return Finding(None, tuple(evidence), fix=fix)
