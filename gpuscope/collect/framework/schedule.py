"""Which steps each profiler owns: one pure function, ``schedule``, places the windows the collectors ask for one
after another, so no two profilers ever run in the same step (each would distort what the other measures), like
``torch.profiler.schedule`` but for all of gpuscope's profilers at once.

Windows are placed in the order of the requests, each after the previous one (and its ``gap`` of clean steps), none
on step 0 but one that covers the start-up (cProfile's). ``first`` (``--skip-steps``) moves them all past the steps
before it, the start-up one too.
A CUDA-only window (the sync count) is placed on CUDA runs only: the plan holds one placement per kind of run, and
a collector reads its own when it knows which kind of run it is in.

The windows are counted in steps, which suits thousands of short steps and leaves a run of five 17-second steps
with nothing (cProfile's start-up window alone would cover them). So the plan is made again once the first step has
shown how long a step is (``long_steps_plan``, at step ``DECIDED_AT``): where step 1 took ``LONG_STEP_S`` or
more, cProfile's start-up window ends there, and each other window shrinks to its ``long_steps`` (one step) and
follows the one before with no clean step between. A run measured over fewer steps than the plan in step numbers
needs (``--profile-steps`` N small) gets that placement from the start (``compact_plan``). Where step 1 also called
the optimizer's closure several times (LBFGS), the trace records the traced step's first call and the FLOP count its
second (``WindowRequest.closure_share``): every call runs the same passes, and a run of three such steps gets both.
Where a step makes one pass, the FLOP count takes no step: the traced step's FLOPs are read from its ops' shapes
(``WindowRequest.from_trace``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


FIRST_STEADY_STEP = 1
"""Step 0 pays for lazy initialisation and is always left out: no window but a start-up one is placed on it."""
DECIDED_AT = 2
"""The step at whose start the plan is made again, from the step before it: step 0's time says nothing (the
samples' first steps took 1.7-6.1 s, their loaders' workers starting and lazy initialisation, where their later
steps took 0.002-1.4 s)."""
LONG_STEP_S = 2.0
"""A step 1 this long or longer makes the windows one step each (``long_steps_plan``): the samples' step 1 took at
most 1.4 s on 2 cores (cProfile on); steps of seconds hold ops and calls enough for a profile in one, and each
profiled one costs the run seconds."""
PER_CLOSURE_CALLS = 2
"""A step whose optimizer called its closure this many times or more (LBFGS: up to ``max_iter``, each a forward and
backward pass) is profiled one call at a time: every call runs the same passes, and the step's figures are one call's
times its calls (what the loop does outside the closure, an evaluation pass, is left out). Counting the FLOPs of a
whole 3.2 s LBFGS step of 4 calls took it to 16.4 s; its trace cost the run 13 s after its end."""


@dataclass(frozen=True, slots=True)
class WindowRequest:
    """Steps a profiler wants to itself: ``steps`` in a row (its own warm-up included), placed after the window
    of the collector named ``after`` and ``gap`` clean steps; ``cuda_only`` windows are placed on CUDA runs only
    (later windows then start earlier on a CPU run). A window of 0 steps is not placed."""

    steps: int
    after: str | None = None
    """The collector whose window this one follows (None: placed first)."""
    gap: int = 0
    cuda_only: bool = False
    startup: bool = False
    """The window covers the start-up too, so it may begin at step 0; others begin at step 1 at the earliest (step 0
    pays for lazy initialisation, and every run leaves it out)."""
    long_steps: int = 1
    """Its steps where steps are long (``schedule.LONG_STEP_S``): one such step holds ops and calls enough, and each
    costs the run seconds."""
    closure_share: str | None = None
    """Where steps are long and call the optimizer's closure ``PER_CLOSURE_CALLS`` times or more: placed on the step
    of the window this names, on that step's second call (the first is that window's), rather than on a step of its
    own."""
    from_trace: str | None = None
    """Where the windows are placed one step each and a step makes one pass (no closure calls): not placed, its
    figures read after the run from the ops' shapes in the one step the window this names records."""


@dataclass(frozen=True, slots=True)
class Window:
    """Steps ``start`` to ``start + steps - 1``, owned by one collector."""

    start: int
    steps: int
    second_call: bool = False
    """The window is its step's second call of the optimizer's closure, the first being another window's
    (``WindowRequest.closure_share``)."""

    @property
    def stop(self) -> int:
        """The first step after the window."""
        return self.start + self.steps


@dataclass(frozen=True, slots=True)
class Plan:
    """The windows of a run, by collector name, on a CPU run and on a CUDA run."""

    cpu: dict[str, Window] = field(default_factory=dict)
    cuda: dict[str, Window] = field(default_factory=dict)

    def window(self, name: str, cuda: bool = False) -> Window | None:
        """``name``'s window on that kind of run (None: it has none there)."""
        return (self.cuda if cuda else self.cpu).get(name)

    def start(self, name: str, cuda: bool = False) -> int | None:
        """The first step of ``name``'s window on that kind of run (None: it has none there)."""
        window = self.window(name, cuda)
        return window.start if window is not None else None

    def end(self, cuda: bool = False) -> int:
        """The first step after every window on that kind of run (0: no window)."""
        return max((w.stop for w in (self.cuda if cuda else self.cpu).values()), default=0)

    def overlaps(self) -> list[tuple[str, str]]:
        """Pairs of windows that share a step (none, by construction: the tests hold it to that)."""
        found = []
        for placed in (self.cpu, self.cuda):
            items = sorted(placed.items(), key=lambda kv: kv[1].start)
            for (a, wa), (b, wb) in zip(items, items[1:]):
                if wb.start < wa.stop and wa.steps and wb.steps and not (wa.second_call or wb.second_call):
                    found.append((a, b))
        return found


def schedule(requests: Sequence[tuple[str, WindowRequest | None]], first: int = 0) -> Plan:
    """Place each ``(name, request)`` after the ones before it, none before step ``first``. A None request, or one
    of zero steps, is not placed and reserves no step."""
    plan = Plan()
    for cuda, placed in ((False, plan.cpu), (True, plan.cuda)):
        cursor = first
        for name, request in _placed_on(requests, cuda):
            floor = first if first > 0 else 0 if request.startup else FIRST_STEADY_STEP
            start = max(cursor + request.gap, floor)
            placed[name] = Window(start, request.steps)
            cursor = start + request.steps
    return plan


def long_steps_plan(requests: Sequence[tuple[str, WindowRequest | None]], step_s: float, first: int = 0,
                    at: int = DECIDED_AT, closure_calls: int = 0, epoch_steps: int | None = None,
                    cuda: bool = False) -> Plan | None:
    """The plan again, as step ``at`` begins, for a run whose step before it took ``step_s`` seconds and called the
    optimizer's closure ``closure_calls`` times, and whose epoch holds ``epoch_steps`` steps (None: not known): None
    where steps are not long and the windows at their full length fit in an epoch (the plan made at the start
    stands), or where the user placed the windows after skipped steps (``first``). The start-up window ends here;
    the others follow it one after another, each of its ``long_steps``, with no clean step between, but those that
    share another's step where the step called its closure several times (``WindowRequest.closure_share``). (An
    epoch too short for the windows may be one of many: they would fit across them; placed one step each they fit
    a run of one epoch, and miss nothing in the others but steps a profiler would have had.)"""
    if first > 0:
        return None
    short_epoch = epoch_steps is not None and epoch_steps < schedule(requests, first).end(cuda)
    if step_s < LONG_STEP_S and not short_epoch:
        return None
    return _one_step_each(requests, at, share=closure_calls >= PER_CLOSURE_CALLS)


def compact_plan(requests: Sequence[tuple[str, WindowRequest | None]], first: int = 0, share: bool = False) -> Plan:
    """The windows as ``long_steps_plan`` places them, from the start, for a run measured over fewer steps than the
    plan in step numbers needs (``--profile-steps`` N small): the start-up window covers ``DECIDED_AT`` steps from
    ``first``, each other window its ``long_steps`` after it, with no clean step between; with ``share`` (the step
    before the trace's called its closure several times), those that share another's step on it."""
    return _one_step_each(requests, first + DECIDED_AT, first, share=share)


def _one_step_each(requests: Sequence[tuple[str, WindowRequest | None]], at: int, first: int = 0,
                   share: bool = False) -> Plan:
    """The start-up window from ``first`` up to step ``at``; the others one after another from ``at``, each of its
    ``long_steps``; with ``share``, one that names a placed window's step to share (``closure_share``) on it;
    without, none that reads its figures from a placed window's one step (``from_trace``)."""
    plan = Plan()
    for cuda, placed in ((False, plan.cpu), (True, plan.cuda)):
        cursor = at
        for name, request in _placed_on(requests, cuda):
            if request.startup:
                placed[name] = Window(first, min(request.steps, at - first))
                continue
            shared = placed.get(request.closure_share) if share and request.closure_share else None
            if shared is not None and shared.steps == 1 and not shared.second_call:
                placed[name] = Window(shared.start, 1, second_call=True)
                continue
            traced = placed.get(request.from_trace) if not share and request.from_trace else None
            if traced is not None and traced.steps == 1:
                continue  # (read from that step's trace)
            placed[name] = Window(cursor, min(request.steps, request.long_steps))
            cursor += placed[name].steps
    return plan


def _placed_on(requests: Sequence[tuple[str, WindowRequest | None]], cuda: bool) -> list[tuple[str, WindowRequest]]:
    """The requests placed on a CUDA run (``cuda``) or a CPU run: not None, not of zero steps, and CUDA-only ones on
    CUDA runs only."""
    return [(name, request) for name, request in requests
            if request is not None and request.steps > 0 and (cuda or not request.cuda_only)]
