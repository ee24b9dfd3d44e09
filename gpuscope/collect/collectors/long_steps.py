"""Windows for long steps: once step 1 has shown that a step takes seconds (``schedule.LONG_STEP_S``), the profiling
windows are placed again (``schedule.long_steps_plan``): cProfile's start-up window ends, and torch.profiler and the
sync count take one step each, one after another, from step ``schedule.DECIDED_AT`` (the FLOP count none: the traced
step's op shapes give its FLOPs, or, where the step calls its closure several times, its second call). A run of
five 17-second steps then gets a trace and a speed of light where the plan in step numbers (cProfile over steps
0-4, the trace at 6-9) left it nothing. So does a loop whose DataLoader's epoch holds fewer steps than that plan
needs (a run of one short epoch: ten batches of 10 ms). A run measured over fewer steps than that plan needs
(``--profile-steps`` N small) has its windows placed so from the start (``collectors.default_collectors``); this
collector then says where, and moves the FLOP count onto the traced step's second closure call where the step before
it called its closure several times.

It runs at the step boundaries before every window's owner (``before_windows``), at each of the first
``DECIDED_AT`` + 1 boundaries only, and tells each owner its new window (``StepFollower.move_window``). Step 1's
length is its wall time less the loop thread's wait for a core in it (the kernel's schedstat, on Linux): a short
step on a busy machine is no long step.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpuscope.collect.children import schedstat
from gpuscope.collect.framework.base import CollectorResult, StepFollower, WindowRequest, register
from gpuscope.collect.framework.schedule import (DECIDED_AT, LONG_STEP_S, PER_CLOSURE_CALLS, Plan, compact_plan,
                                                  long_steps_plan)
from gpuscope.record import CollectorStatus

if TYPE_CHECKING:
    from gpuscope.collect.framework.options import CollectOptions

WINDOW_NAMES = {"cprofile": "cProfile", "torch-trace": "torch.profiler", "syncs": "the sync count",
                "flops": "the FLOP count"}


@register
class LongStepsCollector(StepFollower):
    """Places the profiling windows again where step 1 took seconds."""

    name: ClassVar[str] = "long-steps"
    field: ClassVar[str | None] = None
    before_windows: ClassVar[bool] = True

    def __init__(self, requests: list[tuple[str, WindowRequest | None]], first: int = 0,
                 compact: bool = False) -> None:
        self._requests = requests
        self._first = first
        self._compact = compact  # the windows were placed one step each from the start (--profile-steps N small)
        self.owners: list[Any] = []
        """The window owners to tell (set by ``collectors.default_collectors``)."""
        self._began: dict[int, float] = {}
        self._waited: dict[int, float] = {}  # the loop thread's wait for a CPU so far, as each step began
        self._calls: dict[int, int] = {}  # the optimizer's closure calls so far, as each step began
        self._following = True
        self.plan: Plan | None = compact_plan(requests, first) if compact else None
        self.step_s: float | None = None
        self.epoch_steps: int | None = None  # the steps an epoch holds, where its DataLoader has a length

    @classmethod
    def create(cls, options: CollectOptions, plan: Plan) -> LongStepsCollector:
        from gpuscope.collect.collectors import collector_classes, window_requests

        return cls(window_requests(collector_classes(), options), options.skip_steps, options.compact_windows)

    def unavailable_reason(self) -> str | None:
        if self._first and not self._compact:
            return "the windows follow the skipped steps (--skip-steps)"
        return None

    def start(self, run_dir: Path) -> None:
        pass

    def _on_step(self, index: int) -> int | None:
        if self._compact:
            return self._share_closure_step(index)
        self._began[index] = time.perf_counter()
        times = schedstat("thread-self")
        self._waited[index] = times[1] if times is not None else 0.0
        self._calls[index] = self._events.closure_calls()  # type: ignore[union-attr]
        if index < DECIDED_AT:
            return
        self._leave()
        if index != DECIDED_AT or DECIDED_AT - 1 not in self._began:
            return  # (an epoch of fewer steps began again from 0: its indices say nothing of a step's time)
        # a busy machine's wait for a core is no part of the step's own length
        self.step_s = self._began[index] - self._began[DECIDED_AT - 1] - max(
            0.0, self._waited[index] - self._waited[DECIDED_AT - 1])
        self.epoch_steps = self._events.epoch_steps()  # type: ignore[union-attr]
        self.plan = long_steps_plan(self._requests, self.step_s, self._first, at=index,
                                    closure_calls=self._calls[index] - self._calls[DECIDED_AT - 1],
                                    epoch_steps=self.epoch_steps,
                                    cuda=self._events.cuda_in_use())  # type: ignore[union-attr]
        self._move_owners()

    def _share_closure_step(self, index: int) -> int | None:
        """The windows placed one step each from the start (``--profile-steps`` N small): where the step before the
        trace's called the optimizer's closure several times, the FLOP count moves onto the traced step's second call,
        as ``long_steps_plan`` places it. Returns the steps to the next one it reads (the skipped steps cost it
        nothing)."""
        at = self._first + DECIDED_AT
        if index < at - 1:
            return at - 1 - index
        self._calls[index] = self._events.closure_calls()  # type: ignore[union-attr]
        if index < at:
            return None
        self._leave()
        if index == at and at - 1 in self._calls and self._calls[at] - self._calls[at - 1] >= PER_CLOSURE_CALLS:
            self.plan = compact_plan(self._requests, self._first, share=True)
            self._move_owners()
        return None

    def _move_owners(self) -> None:
        if self.plan is None:
            return
        requested = {name for name, request in self._requests if request is not None and request.steps > 0}
        for owner in self.owners:  # (one requested and not placed reads its figures from the trace: from_trace)
            if owner.name in requested:
                owner.move_window(self.plan.window(owner.name), self.plan.window(owner.name, cuda=True))

    def _leave(self) -> None:
        if self._following:
            self._following = False
            self._unfollow()

    def stop(self) -> CollectorResult:
        self._leave()
        if self.plan is None or (self.step_s is None and not self._compact):
            return CollectorResult(CollectorStatus("ok"))
        placed = sorted(((n, w) for n, w in self.plan.cpu.items() if w.steps), key=lambda item: item[1].start)
        windows = ", ".join(f"{WINDOW_NAMES.get(name, name)} {_steps(w.start, w.stop - 1)}"
                            f"{' (its second closure call)' if w.second_call else ''}" for name, w in placed)
        if any(request is not None and request.steps > 0 and request.from_trace and self.plan.window(name) is None
               for name, request in self._requests):  # (the FLOP count's: the one request that reads a trace)
            windows += ", the FLOPs read from the traced step's op shapes"
        syncs = self.plan.window("syncs", cuda=True)
        flops = self.plan.window("flops", cuda=True)
        after = "" if flops is None or flops.second_call else ", the FLOPs after it"
        cuda = f" (on a CUDA run the sync count {_steps(syncs.start, syncs.stop - 1)}{after})" \
            if syncs is not None else ""
        if self._compact:
            why = "--profile-steps is fewer than the windows take at their full length: they were placed one step each"
        elif self.step_s is not None and self.step_s >= LONG_STEP_S:
            why = (f"step 1 took {self.step_s:.1f} s of its own (long steps: {LONG_STEP_S:g} s or more): the "
                   "profiling windows were placed again, one step each")
        else:
            why = (f"an epoch holds {self.epoch_steps} steps (its DataLoader's length), fewer than the profiling "
                   "windows take at their full length: they were placed again, one step each")
        return CollectorResult(CollectorStatus("ok"), notes=(f"{why}: {windows}{cuda}",))


def _steps(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"
