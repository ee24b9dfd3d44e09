"""A recorded step's phases from a trace's ranges on the training thread: data wait in DataLoader ``__next__``
ranges, forward / backward / optimizer where annotated (``DistributedDataParallel.forward``, ``## forward ##``,
``Optimizer.step#...``; backward, where no range says, from autograd's first op in the step to its last), the rest
``other``; where ranges overlap, the first of data wait, backward, forward, optimizer takes the time: an optimizer's
range holds the forward and backward of a closure it calls (LBFGS; PyTorch Lightning's automatic optimization
calls ``training_step`` and backward inside ``optimizer.step``), which are theirs, not the optimizer's."""

from __future__ import annotations

import bisect

from collections.abc import Sequence

from gpuscope.reduce.columns import FLAG_BITS, KIND_BITS, KINDS
from gpuscope.reduce.intervals import Span, clip, difference, intersect, length, union
from gpuscope.reduce.trace import StepSpan, TraceIndex
from gpuscope.record import PHASES

PHASE_PRIORITY = ("data_wait", "backward", "forward", "optimizer")


def phase_spans(index: TraceIndex, step: StepSpan) -> dict[str, list[Span]]:
    """Each phase's time in ``step`` as disjoint spans, no span in two phases (``other``: what none claims)."""
    spans: dict[str, list[Span]] = {}
    claimed: list[Span] = []
    for phase, mine in _claims(index, step):
        spans[phase] = difference(mine, claimed)
        claimed = union([*claimed, *mine])
    spans["other"] = difference([(step.start_us, step.end_us)], claimed)
    return spans


def step_phases(index: TraceIndex, step: StepSpan) -> dict[str, float]:
    """Seconds of ``step`` in each phase (``PHASES``)."""
    window = (step.start_us, step.end_us)
    seconds = dict.fromkeys(PHASES, 0.0)
    claimed: list[Span] = []
    for phase, mine in _claims(index, step):
        seconds[phase] = (length(mine) - length(intersect(mine, claimed))) / 1e6
        claimed = union([*claimed, *mine])
    seconds["other"] = max(0.0, (window[1] - window[0]) / 1e6 - sum(seconds[p] for p in PHASE_PRIORITY))
    return seconds


def calls_by_phase(index: TraceIndex, steps: Sequence[StepSpan]) -> dict[str, dict[str, int]]:
    """Each torch op's calls on the steps' training thread, by the phase (``phase_spans``) they began in: op ->
    phase -> calls over ``steps``. Calls on other threads (gloo's, the DataLoader's pin-memory thread) are not
    counted."""
    if not steps:
        return {}
    events = index.host.get(steps[0].thread)
    if events is None:
        return {}
    bounds = sorted((start, end, phase) for step in steps for phase, spans in phase_spans(index, step).items()
                    for start, end in spans)
    starts = [b[0] for b in bounds]
    op_kind = KINDS.index("op")
    counts: dict[str, dict[str, int]] = {}
    for ts, code in zip(events.ts, events.code):
        if code >> FLAG_BITS & (1 << KIND_BITS) - 1 != op_kind:
            continue
        at = bisect.bisect_right(starts, ts) - 1
        if at < 0 or ts >= bounds[at][1]:
            continue  # outside the steps
        by_phase = counts.setdefault(index.names[code >> (KIND_BITS + FLAG_BITS)], {})
        by_phase[bounds[at][2]] = by_phase.get(bounds[at][2], 0) + 1
    return counts


def _claims(index: TraceIndex, step: StepSpan) -> list[tuple[str, list[Span]]]:
    """Each phase's ranges in ``step``, merged and clipped to it, in ``PHASE_PRIORITY`` order."""
    window = (step.start_us, step.end_us)
    by_phase: dict[str, list[Span]] = {p: [] for p in PHASE_PRIORITY}
    for start, end, name in index.annotations.get(step.thread, []):
        phase = annotation_phase(name)
        if phase is not None and end > window[0] and start < window[1]:
            by_phase[phase].append((start, end))
    if not by_phase["backward"] and (ran := autograd_span(index, step)) is not None:
        by_phase["backward"].append(ran)
    return [(phase, clip(union(by_phase[phase]), window)) for phase in PHASE_PRIORITY]


def autograd_span(index: TraceIndex, step: StepSpan) -> Span | None:
    """From the first to the last of autograd's ``evaluate_function`` ops in ``step`` (in its process, any thread):
    backward, in a trace that has no range for it."""
    columns = index.autograd.get(step.thread[0])
    if columns is None:
        return None
    starts, ends = columns
    lo = bisect.bisect_left(starts, step.start_us)
    hi = bisect.bisect_left(starts, step.end_us)
    return (starts[lo], max(ends[lo:hi])) if hi > lo else None


def annotation_phase(name: str) -> str | None:
    """The step phase a range's name says it is, or None."""
    if "DataLoader" in name and "__next__" in name:
        return "data_wait"
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
        return "optimizer"
    core = name.strip("# ").lower()
    if core in ("optimizer", "optimizer step", "optimizer.step"):
        return "optimizer"
    if core in ("backward", "loss.backward", "backward pass"):
        return "backward"
    if core in ("forward", "forward pass") or name.endswith("DataParallel.forward"):
        return "forward"
    return None
