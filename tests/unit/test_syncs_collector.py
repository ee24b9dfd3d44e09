"""The sync counter, over a fake torch.cuda whose synchronising ops warn as c10 does in the "warn" debug mode: it
counts syncs per step over its window only on CUDA runs, names the user's lines, hides its own warnings from the
user while passing every other warning on, and leaves the debug mode and the warnings machinery as it found them."""

from __future__ import annotations

import os
import sysconfig
import threading
import warnings
from pathlib import Path
from typing import Any

from gpuscope.collect.collectors import CollectOptions, default_collectors, plan_windows
from gpuscope.collect.collectors.syncs import DEFAULT_START, SyncCollector
from gpuscope.record import SyncProfile, Window

SYNC_MESSAGE = ("called a synchronizing CUDA operation (Triggered internally at "
                "/pytorch/c10/cuda/CUDAFunctions.cpp:150.)")

# A tensor whose item() synchronises, as Python code of the torch package (like Tensor.__format__ behind
# print(tensor)): compiled under a file name in site-packages, so its frames are library code, not the user's.
# In "warn" mode it warns as c10's warn_or_error_on_sync() does.
_TORCH_FILE = os.path.join(sysconfig.get_paths()["purelib"], "torch", "_fake_tensor.py")
_TORCH_SOURCE = f'''
class FakeTensor:
    def __init__(self, cuda, value=0.5):
        self._cuda, self._value = cuda, value

    def item(self):
        if self._cuda.mode == 1:
            warnings.warn({SYNC_MESSAGE!r})
        return self._value
'''
_torch: dict[str, Any] = {"warnings": warnings, "__name__": "torch._fake_tensor"}
exec(compile(_TORCH_SOURCE, _TORCH_FILE, "exec"), _torch)
FakeTensor = _torch["FakeTensor"]


class FakeCuda:
    """``torch.cuda``'s sync debug mode; ``fail`` makes setting it raise."""

    def __init__(self, mode: int = 0) -> None:
        self.mode = mode
        self.fail = False
        self.set_calls: list[int | str] = []

    def get_sync_debug_mode(self) -> int:
        return self.mode

    def set_sync_debug_mode(self, mode: int | str) -> None:
        self.set_calls.append(mode)
        if self.fail:
            raise RuntimeError("CUDA error: unspecified launch failure")
        self.mode = {"default": 0, "warn": 1, "error": 2}.get(mode, mode)  # type: ignore[call-overload]


class FakeSteps:
    """The part of the steps collector that the sync counter uses."""

    def __init__(self, cuda: bool = True) -> None:
        self.cuda = cuda
        self.listeners: list[Any] = []
        self.opened = self.closed = 0

    def add_step_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def remove_step_listener(self, listener: Any) -> None:
        self.listeners = [other for other in self.listeners if other != listener]

    def cuda_in_use(self) -> bool:
        return self.cuda

    def window_opened(self) -> None:
        self.opened += 1

    def window_closed(self) -> None:
        self.closed += 1

    def begin(self, index: int) -> None:
        for listener in self.listeners:
            listener(index)


# -- the user's training step ------------------------------------------------------------------------------------

def train_step(cuda: FakeCuda) -> float:
    loss = FakeTensor(cuda)
    total = 0.0
    for _ in range(2):
        total += loss.item()  # the logged loss
    report(loss)
    return total


def report(loss: Any) -> None:
    print(f"loss {loss.item():.3f}")  # the progress line


def line_of(marker: str) -> tuple[int, str]:
    """The line number and code of this file's line ending with ``marker``."""
    lines = Path(__file__).read_text().splitlines()
    number = next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(marker))
    return number, lines[number - 1].strip()


def run(steps: FakeSteps, cuda: FakeCuda, indices: range, work: Any = train_step) -> None:
    """Each step begins (the listeners see its index), then the user's step runs."""
    for index in indices:
        steps.begin(index)
        work(cuda)


def collector_for(steps: FakeSteps, cuda: FakeCuda, start: int = 2, count: int = 3) -> SyncCollector:
    collector = SyncCollector(start, count, cuda=cuda)
    assert collector.unavailable_reason() is None
    collector.follow(steps)
    collector.start(Path("."))
    return collector


# -- counting ------------------------------------------------------------------------------------------------------

def test_syncs_are_counted_per_step_over_the_window_and_named_by_the_users_line(shown: list[str]) -> None:
    # given a CUDA run whose step reads the loss twice and prints it once: three syncs per step
    steps, cuda = FakeSteps(cuda=True), FakeCuda()
    collector = collector_for(steps, cuda, start=2, count=3)
    # when seven steps run
    run(steps, cuda, range(7))
    result = collector.stop()
    # then steps 2-4 were counted, three syncs in each
    assert result.status.status == "ok"
    profile = result.payload
    assert isinstance(profile, SyncProfile)
    assert (profile.window, profile.steps, profile.syncs, profile.per_step) == (Window(2, 4), 3, 9, 3.0)
    # and the sites are the user's lines (not torch's code that warned), most frequent first, with their code
    logged, progress = profile.sites
    assert (logged.line, logged.code) == line_of("# the logged loss")
    assert (logged.function, logged.calls) == ("train_step", 6)
    assert logged.file.endswith("test_syncs_collector.py")
    assert (progress.line, progress.code, progress.function, progress.calls) == (
        *line_of("# the progress line"), "report", 3)
    # and the window's steps were marked profiled: opened once, closed once
    assert (steps.opened, steps.closed) == (1, 1)


def test_the_counted_syncs_are_hidden_from_the_user_and_every_other_warning_still_shows(
        shown: list[str]) -> None:
    # given a step that also issues a warning of its own
    steps, cuda = FakeSteps(cuda=True), FakeCuda()
    collector = collector_for(steps, cuda, start=0, count=2)

    def step_with_a_warning(cuda: FakeCuda) -> None:
        train_step(cuda)
        warnings.warn("lr scheduler stepped before the optimizer", UserWarning)

    # when it runs inside the window
    run(steps, cuda, range(3), work=step_with_a_warning)
    collector.stop()
    # then only the user's own warning reached their showwarning (once per line, as the default filter says)
    assert shown == ["lr scheduler stepped before the optimizer"]


def test_the_debug_mode_filters_and_showwarning_are_restored_when_the_window_ends(shown: list[str]) -> None:
    # given the warnings machinery as the script had it
    steps, cuda = FakeSteps(cuda=True), FakeCuda()
    filters_before, showwarning_before = list(warnings.filters), warnings.showwarning
    collector = collector_for(steps, cuda, start=1, count=2)
    # when steps 1-2 are counted and step 3 begins
    run(steps, cuda, range(4))
    # then by step 3 the mode is back to silent, the sync filter is gone and showwarning is the script's again
    assert cuda.set_calls == [1, 0]
    assert cuda.mode == 0
    assert warnings.filters == filters_before
    assert warnings.showwarning is showwarning_before
    assert collector.stop().status.status == "ok"
    assert cuda.set_calls == [1, 0]  # nothing left to restore at stop


def test_a_run_ending_inside_the_window_counts_its_complete_steps_and_restores_everything(
        shown: list[str]) -> None:
    # given a window of steps 2-4
    steps, cuda = FakeSteps(cuda=True), FakeCuda()
    filters_before, showwarning_before = list(warnings.filters), warnings.showwarning
    collector = collector_for(steps, cuda, start=2, count=3)
    # when the run ends during step 3 (its boundary seen, its work done, no boundary after it)
    run(steps, cuda, range(4))
    result = collector.stop()
    # then step 2 alone is counted (step 3 never ended) and the machinery is restored at stop
    profile = result.payload
    assert isinstance(profile, SyncProfile)
    assert (profile.window, profile.steps, profile.syncs, profile.per_step) == (Window(2, 2), 1, 3, 3.0)
    assert cuda.mode == 0
    assert (warnings.filters, warnings.showwarning) == (filters_before, showwarning_before)
    assert (steps.opened, steps.closed) == (1, 1)


def test_syncs_from_other_threads_are_hidden_but_not_counted(shown: list[str]) -> None:
    # given a step that also reads a tensor on a helper thread
    steps, cuda = FakeSteps(cuda=True), FakeCuda()
    collector = collector_for(steps, cuda, start=0, count=2)

    def step_with_a_helper_thread(cuda: FakeCuda) -> None:
        train_step(cuda)
        helper = threading.Thread(target=lambda: FakeTensor(cuda).item())
        helper.start()
        helper.join()

    # when
    run(steps, cuda, range(3), work=step_with_a_helper_thread)
    profile = collector.stop().payload
    # then the loop's three syncs per step are counted, and nothing was shown
    assert isinstance(profile, SyncProfile)
    assert (profile.syncs, profile.per_step) == (6, 3.0)
    assert shown == []


# -- when nothing is counted --------------------------------------------------------------------------------------

def test_a_cpu_only_run_has_no_syncs_to_count(shown: list[str]) -> None:
    # given a run that never initialised CUDA
    steps, cuda = FakeSteps(cuda=False), FakeCuda()
    collector = collector_for(steps, cuda)
    # when
    run(steps, cuda, range(8))
    result = collector.stop()
    # then the collector says why there is nothing, and never touched the mode
    assert (result.status.status, result.status.reason) == (
        "unavailable", "a CPU-only run: no host-device syncs to count")
    assert result.payload is None
    assert (cuda.set_calls, steps.opened) == ([], 0)


def test_a_failing_debug_mode_is_reported_and_the_run_goes_on(shown: list[str]) -> None:
    # given a CUDA whose debug mode cannot be set
    steps, cuda = FakeSteps(cuda=True), FakeCuda()
    cuda.fail = True
    filters_before, showwarning_before = list(warnings.filters), warnings.showwarning
    collector = collector_for(steps, cuda)
    # when the steps run, no exception reaches the loop
    run(steps, cuda, range(8))
    result = collector.stop()
    # then the collector failed, saying why, with no window opened and the warnings machinery untouched
    assert result.status.status == "failed"
    assert "unspecified launch failure" in (result.status.reason or "")
    assert steps.opened == 0
    assert (warnings.filters, warnings.showwarning) == (filters_before, showwarning_before)


def test_a_script_that_set_its_own_sync_debug_mode_is_left_alone(shown: list[str]) -> None:
    # given the script asked for errors on syncs itself
    steps, cuda = FakeSteps(cuda=True), FakeCuda(mode=2)
    collector = collector_for(steps, cuda)
    # when
    run(steps, cuda, range(8), work=lambda cuda: None)
    result = collector.stop()
    # then its mode stays, and the collector says so
    assert cuda.set_calls == []
    assert result.status.status == "unavailable"
    assert "set_sync_debug_mode(2)" in (result.status.reason or "")


def test_a_run_ending_before_the_window_says_which_steps_it_needed(shown: list[str]) -> None:
    steps, cuda = FakeSteps(cuda=True), FakeCuda()
    collector = collector_for(steps, cuda, start=10, count=3)
    run(steps, cuda, range(5))
    result = collector.stop()
    assert (result.status.status, result.status.reason) == (
        "unavailable", "the run ended before the steps where syncs are counted (10-12) were complete")


# -- where the window lies -----------------------------------------------------------------------------------------

def test_syncs_are_counted_right_after_torch_profilers_window() -> None:
    # torch.profiler's default window: warm-up step 6, recorded steps 7-9; it closes as step 10 begins
    assert plan_windows(CollectOptions()).start("syncs", cuda=True) == DEFAULT_START == 10
    assert plan_windows(CollectOptions(trace_steps=5)).start("syncs", cuda=True) == 12
    # with neither cProfile's nor torch.profiler's window, the first step after the warm-up step 0
    assert plan_windows(CollectOptions(cprofile_steps=None, trace_steps=0)).start("syncs", cuda=True) == 1
    names = [c.name for c in default_collectors()]
    assert names[names.index("torch-trace") + 1] == "syncs"
