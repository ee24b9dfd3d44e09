"""The trained model's forward passes without gradients (in eval mode, or under ``torch.no_grad()``) inside the
steps: their time, and the line of the step's own code that ran them. A full-batch graph network evaluating on its
train and validation nodes after every update (pytorch/examples' GCN) runs three forward passes a step, two of them
evaluation; no step is left out for them, since every step holds them (``reduce.steady``)."""

from __future__ import annotations

from types import CodeType, FrameType

from gpuscope.collect.callsites import SITE_CALLS, SiteCounter, is_user_file, user_frame

OWN_PACKAGES = ("gpuscope", "torch", "numpy")
"""Packages whose frames between a pass and the step's code say nothing of who evaluates (the timing's wrapper,
``Module.__call__``)."""


class NoGradPasses:
    """``began`` and ``ended`` around each such pass (the outermost timed forward only); ``stepper`` where an
    optimizer first steps, whose code is then the step's own."""

    def __init__(self) -> None:
        self.sites = SiteCounter()
        """The lines of the step's own code (the function that steps the optimizer) that ran the passes, or the
        user's innermost line where no such function called them (the first ``SITE_CALLS`` passes)."""
        self.by = ""
        """The library whose code ran the first pass (``transformers``' Trainer evaluating, Lightning's validation
        loop calling the script's ``validation_step``): the outermost between the pass and the function that steps
        the optimizer; "" where none is (the script's own code ran it) or that function is not on the stack."""
        self._step_codes: set[CodeType] = set()
        self._began: float | None = None
        self._step = -1  # the step the last pass began in
        self._first = 0.0  # when that step's current run of passes began (no training pass between them)
        self._open_s = 0.0  # that step's time so far: its earlier runs of passes, and the current one to its end
        self._done_s = 0.0  # its earlier runs of passes (closed by a training pass)
        self._closed_s = 0.0  # the earlier steps' time
        self._run_open = False  # a run of passes is open in the step (no training pass since its last pass)

    @property
    def open(self) -> bool:
        return self._began is not None

    def stepper(self, frame: FrameType | None) -> None:
        """An optimizer stepped for the first time, called from ``frame`` (or a frame outside it)."""
        found = user_frame(frame) if frame is not None else None
        if found is not None:
            self._step_codes.add(found.f_code)

    def began(self, step: int, now: float, frame: FrameType | None) -> None:
        """A pass begins in the open step ``step``, called from ``frame`` (the caller of the timed call: the
        library's or the user's, never gpuscope's)."""
        if step != self._step:
            self._closed_s += self._open_s if self._step >= 1 else 0.0
            self._step, self._open_s, self._done_s = step, 0.0, 0.0
            self._run_open = False
        if not self._run_open:
            self._first, self._run_open = now, True
        self._began = now
        if self.sites.total() < SITE_CALLS:
            if not self.sites.total():
                self.by = self._library(frame)
            self.sites.count(self._site(frame))

    def ended(self, now: float) -> None:
        if self._began is not None:
            self._open_s = self._done_s + now - self._first
            self._began = None

    def training(self) -> None:
        """A training pass began (a forward with gradients on in train mode, or a backward): the passes before it
        and after it in the step are two runs, the training pass between them no part of either."""
        if self._run_open and self._began is None:
            self._done_s, self._run_open = self._open_s, False

    def seconds(self, ended: int) -> float:
        """The passes' time in steps 1 to ``ended - 1``, each step's from its first pass's start to its last one's
        end (what the evaluation does between its passes, its next batch and its metrics, with them), less any
        training pass between them (from its start to the next pass's): step 0's are left out, as its time is (the
        first step pays imports and allocations: 3 s against 12 ms for a GCN), and those after the last step ended
        (a test pass once the loop is done) are no step's."""
        return self._closed_s + (self._open_s if 1 <= self._step < ended else 0.0)

    def _library(self, frame: FrameType | None) -> str:
        library = ""
        while frame is not None:
            if frame.f_code in self._step_codes:
                return library
            name = str(frame.f_globals.get("__name__", "")).split(".", 1)[0]
            if name not in OWN_PACKAGES and not is_user_file(frame.f_code.co_filename):
                library = name
            frame = frame.f_back
        return ""

    def _site(self, frame: FrameType | None) -> FrameType | None:
        inner = found = user_frame(frame) if frame is not None else None
        while found is not None:
            if found.f_code in self._step_codes:
                return found
            found = user_frame(found.f_back) if found.f_back is not None else None
        return inner
