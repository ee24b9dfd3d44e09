"""Host-device synchronisations over a few steady-state steps of a CUDA run, and the user's lines that made them.

torch's CUDA sync debug mode (``torch.cuda.set_sync_debug_mode("warn")``, torch 1.10+) makes every synchronising
op (``.item()``, ``.cpu()``, ``print(tensor)``, ``nonzero``, a blocking copy...) issue a warning, "called a
synchronizing CUDA operation", attributed to the Python line that called it. For a window of ``steps`` steps,
starting after torch.profiler's window, this collector switches the mode on, catches those warnings before they
reach the user's stderr, and counts them per step and per user line (``callsites.user_frame``: the innermost frame
outside the stdlib, site-packages and gpuscope). Every other warning is passed on untouched.

Each warning costs a Python call, so the window's steps are marked profiled (left out of the steady-state figures).
The mode is restored at the window's end, or at stop if the run ended inside it. A script that set a sync debug
mode itself is left alone.

Only syncs issued on the thread that opened the window (the training loop's) are counted; the same warnings from
other threads are caught as well, since it was gpuscope that made them warn.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, ClassVar

from gpuscope.collect import warning_filters
from gpuscope.collect.callsites import SiteCounter, user_frame
from gpuscope.collect.collectors import torch_trace
from gpuscope.collect.framework.base import (
    CollectorResult,
    StepFollower,
    StepWindow,
    WindowRequest,
    register,
)
from gpuscope.record import CollectorStatus, SyncProfile, Window

if TYPE_CHECKING:
    from gpuscope.collect.framework.options import CollectOptions
    from gpuscope.collect.framework.schedule import Plan, Window

DEFAULT_START = torch_trace.DEFAULT_START + torch_trace.WARMUP_STEPS + torch_trace.DEFAULT_ACTIVE
"""First step of the window: the step at whose start torch.profiler's default window closes (its warm-up step 6,
recorded steps 7-9), so the two never overlap."""
DEFAULT_STEPS = 3
"""Steps counted: a few are enough to see the loop's per-step syncs."""
TOP_SITES = 5
SYNC_WARNING = "called a synchronizing CUDA operation"
"""The text of c10's ``warn_or_error_on_sync()`` (c10/cuda/CUDAFunctions.cpp); torch appends "(Triggered internally
at ...)"."""
WARN_MODE = 1
"""``set_sync_debug_mode`` levels: 0 default (silent), 1 warn, 2 error."""



class _LeftAlone(Exception):
    """The window did not open, and rightly: the mode is not gpuscope's to change here (the reason)."""


class SyncWarnings:
    """Routes torch's sync warnings to ``on_sync(frame)`` (the frame that issued the warning's ``showwarning`` call)
    and every other warning to the ``showwarning`` in place before; ``remove`` undoes exactly what ``install`` did.

    An "always" filter for the sync message goes to the front of ``warnings.filters``: without it, the default
    filters show a warning once per line, and a ``-W error`` or "ignore" filter would raise or drop it. It goes in
    and out without bumping the filters' version (``collect/warning_filters.py``): the sync message had no registry
    entry before (the mode was off) and leaves none under "always".
    """

    def __init__(self, on_sync: Callable[[FrameType | None], None]) -> None:
        self._on_sync = on_sync
        self._original: Callable[..., Any] = warnings.showwarning
        self._filter: tuple[Any, ...] | None = None
        self._active = False

        def showwarning(message: Any, category: type[Warning], filename: str, lineno: int,
                        file: Any = None, line: str | None = None) -> None:
            if self._active and SYNC_WARNING in str(message):
                self._on_sync(sys._getframe(1))
                return
            self._original(message, category, filename, lineno, file, line)

        self._hook = showwarning

    def install(self) -> None:
        """Catch the sync warnings from now on."""
        self._original = warnings.showwarning
        self._filter = warning_filters.put_in_front("always", SYNC_WARNING)
        warnings.showwarning = self._hook
        self._active = True

    def remove(self) -> None:
        """Stop catching: take out this filter only, and put the previous ``showwarning`` back unless something
        replaced this one since (then a later call through this hook passes straight on)."""
        self._active = False
        if warnings.showwarning is self._hook:
            warnings.showwarning = self._original
        warning_filters.take_out(self._filter)
        self._filter = None


@register
class SyncCollector(StepFollower):
    """Counts host-device syncs per step and per user line over a window of steps, on CUDA runs."""

    name: ClassVar[str] = "syncs"
    gpu_only: ClassVar[bool] = True  # on a CPU run its reason explains the report's Device section
    field: ClassVar[str | None] = "syncs"

    def __init__(self, start: int = DEFAULT_START, steps: int = DEFAULT_STEPS, cuda: Any = None) -> None:
        self.start_step = start
        self.steps = steps
        self._cuda = cuda  # torch.cuda (tests pass a fake)
        self._window = StepWindow(None, steps, self._open, self._close, cuda_start=start)
        self._left_alone = ""
        self._mode_set = False
        self._previous_mode = 0
        self._capture: SyncWarnings | None = None
        self._thread = 0
        self._current = 0
        self._sites: dict[int, SiteCounter] = {}

    @classmethod
    def wants(cls, options: CollectOptions) -> WindowRequest | None:
        """A few steps right after torch.profiler's window, on CUDA runs only."""
        return WindowRequest(DEFAULT_STEPS, after="torch-trace", cuda_only=True)

    @classmethod
    def create(cls, options: CollectOptions, plan: Plan) -> SyncCollector:
        start = plan.start(cls.name, cuda=True)
        return cls(start if start is not None else DEFAULT_START, DEFAULT_STEPS)

    def move_window(self, cpu: Window | None, cuda: Window | None) -> None:
        self._window.move(None, cuda)

    def unavailable_reason(self) -> str | None:
        if self.steps <= 0:
            return "turned off (0 steps to count)"
        return None

    def start(self, run_dir: Path) -> None:
        pass

    # -- at each step boundary -----------------------------------------------------------------------------
    def _on_step(self, index: int) -> None:
        self._current = index
        self._window.on_step(index, self._events, "the CUDA sync debug mode")  # type: ignore[arg-type]
        if self._window.over:
            self._unfollow()

    def _open(self, index: int) -> None:
        cuda = self._cuda
        if cuda is None:
            import torch.cuda

            cuda = self._cuda = torch.cuda
        if not hasattr(cuda, "set_sync_debug_mode"):
            self._left_alone = "this torch has no CUDA sync debug mode (torch 1.10 added it)"
            raise _LeftAlone(self._left_alone)
        previous = int(cuda.get_sync_debug_mode())
        if previous != 0:
            self._left_alone = f"the script set torch.cuda.set_sync_debug_mode({previous}) itself: left as it was"
            raise _LeftAlone(self._left_alone)
        self._previous_mode = previous
        with warning_filters.ignored("Synchronization debug mode is a prototype"):  # torch's note, not the user's
            cuda.set_sync_debug_mode(WARN_MODE)
        self._mode_set = True  # from here on, closing the window restores the mode
        self._thread = threading.get_ident()
        self._capture = SyncWarnings(self._on_sync)
        self._capture.install()

    def _on_sync(self, frame: FrameType | None) -> None:
        if threading.get_ident() != self._thread:
            return
        self._sites.setdefault(self._current, SiteCounter()).count(user_frame(frame))

    def _close(self) -> None:
        """End the window: restore the warnings machinery and the previous mode, whatever fails."""
        capture, self._capture = self._capture, None
        try:
            if self._mode_set:
                self._mode_set = False
                self._cuda.set_sync_debug_mode(self._previous_mode)
        finally:
            if capture is not None:
                capture.remove()

    # -- end of the run ------------------------------------------------------------------------------------
    def stop(self) -> CollectorResult:
        window = self._window
        if window.state == "open":  # the run ended inside the window: the open step is not a step
            try:
                window.finish()
            except Exception as exc:
                window.fail(f"the CUDA sync debug mode could not be restored: {exc}")
        if self._left_alone:
            return CollectorResult(CollectorStatus("unavailable", self._left_alone))
        if window.state == "failed":
            return CollectorResult(CollectorStatus("failed", window.reason))
        if self._events is None:
            return CollectorResult(CollectorStatus("unavailable", "no steps were followed (no steps collector)"))
        span = f"{self.start_step}-{self.start_step + self.steps - 1}"
        cuda = self._events.cuda_in_use()
        if window.state in ("waiting", "skipped") and not cuda:
            return CollectorResult(CollectorStatus("unavailable", "a CPU-only run: no host-device syncs to count"))
        if window.state == "skipped":
            return CollectorResult(CollectorStatus(
                "unavailable", f"the script began using CUDA after the steps where syncs are counted ({span})"))
        if window.state == "waiting" or not window.counted:
            return CollectorResult(CollectorStatus(
                "unavailable", f"the run ended before the steps where syncs are counted ({span}) were complete"))
        return CollectorResult(CollectorStatus("ok"), self._profile())

    def _profile(self) -> SyncProfile:
        merged = SiteCounter()
        for step in self._window.counted:
            if step in self._sites:
                merged.counts.update(self._sites[step].counts)
        syncs = merged.total()
        return SyncProfile(
            window=Window(self._window.counted[0], self._window.counted[-1]),
            steps=len(self._window.counted),
            syncs=syncs,
            per_step=syncs / len(self._window.counted),
            sites=merged.sites(TOP_SITES),
        )
