"""``--skip-steps K --profile-steps N``: every window after the skipped steps and inside the profiled ones, the
skipped steps counted as warm-up and never kept, and the record handed over as the step after the profiled ones
begins, with every collector stopped; the script's end then only adds its exit status."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from gpuscope import profile
from gpuscope.collect.collectors import CollectOptions, default_collectors, plan_windows
from gpuscope.collect.collectors.steps import StepsCollector
from gpuscope.collect.collectors.torch_trace import PACE_STEPS
from gpuscope.collect.framework.base import CollectorResult, StepFollower, WindowRequest
from gpuscope.collect.framework.schedule import Window, schedule
from gpuscope.collect.steps.steplog import StepLog, StepRecord
from gpuscope.errors import GpuscopeError
from gpuscope.options import RunOptions
from gpuscope.record import CollectorStatus, load_record
from gpuscope.reduce.steady import summarize
from gpuscope.session import Session


# -- where the windows go ------------------------------------------------------------------------------------
def test_skipped_steps_move_every_window_past_them_the_start_up_one_too() -> None:
    plan = schedule([("cprofile", WindowRequest(5, startup=True)), ("trace", WindowRequest(4, after="cprofile", gap=1)),
                     ("syncs", WindowRequest(3, after="trace", cuda_only=True))], first=100)
    assert plan.cpu == {"cprofile": Window(100, 5), "trace": Window(106, 4)}
    assert plan.cuda["syncs"] == Window(110, 3)
    assert (plan.end(), plan.end(cuda=True)) == (110, 113)


@pytest.mark.parametrize("options", [CollectOptions(skip_steps=100), CollectOptions(skip_steps=100, cprofile_steps=None),
                                     CollectOptions(skip_steps=7, trace_steps=0)])
def test_with_skipped_steps_no_window_of_gpuscopes_begins_before_them(options: CollectOptions) -> None:
    plan = plan_windows(options)
    for placed in (plan.cpu, plan.cuda):
        assert placed and all(w.start >= options.skip_steps for w in placed.values())
    assert plan.overlaps() == []


# -- the steps it keeps --------------------------------------------------------------------------------------
def test_skipped_steps_are_counted_and_not_kept() -> None:
    log = StepLog(head=4, capacity=8, skip=3)
    for i in range(10):
        log.add(0.1 * i, {})
    assert log.count == 10
    assert [r.index for r in log.records()] == list(range(3, 10))
    assert log.find(2) is None and log.find(3).wall_s == pytest.approx(0.3)  # type: ignore[union-attr]


def test_skipped_steps_count_as_warm_up_and_the_first_step_after_them_is_measured() -> None:
    walls = [1.0] * 30
    kept = [StepRecord(i, w, {"data_wait": 0.0}) for i, w in enumerate(walls) if i >= 10]
    steps = summarize(kept, total=30, head=10 + 64, body_weight=1.0, source="optimizer", skipped=10).steps
    assert (steps.warmup, steps.skipped, steps.count) == (10, 10, 20)
    assert steps.count == steps.total - steps.warmup - steps.profiled - steps.outliers


def test_slow_steps_right_after_the_skipped_ones_are_warm_up_too() -> None:
    walls = [9.0, 5.0] + [1.0] * 20
    kept = [StepRecord(10 + i, w, {"data_wait": 0.0}) for i, w in enumerate(walls)]
    steps = summarize(kept, total=32, head=74, body_weight=1.0, source="optimizer", skipped=10).steps
    assert (steps.warmup, steps.skipped, steps.count) == (12, 10, 20)


# -- the options ---------------------------------------------------------------------------------------------
def test_too_few_profiled_steps_for_the_windows_is_a_one_line_error() -> None:
    fewest = RunOptions().fewest_profile_steps(compact=True)
    with pytest.raises(GpuscopeError, match=f"--profile-steps {fewest - 1} is too few.*take {fewest}"):
        RunOptions(profile_steps=fewest - 1)
    assert RunOptions(profile_steps=fewest).collect_options().profile_steps == fewest
    # fewer profiler steps, fewer steps needed
    assert RunOptions(trace_steps=0, cprofile_steps=0).fewest_profile_steps() < RunOptions().fewest_profile_steps()


def test_the_notebook_api_takes_steps_for_profile_steps() -> None:
    assert profile(steps=50, skip_steps=10).options.collect_options() == CollectOptions(skip_steps=10, profile_steps=50)
    with pytest.raises(TypeError, match="steps or profile_steps"):
        profile(steps=50, profile_steps=60)


# -- the hand-over -------------------------------------------------------------------------------------------
class Sampler(StepFollower):
    """A live collector that counts the steps it saw, and whether it was stopped."""

    name: ClassVar[str] = "sampler"
    field: ClassVar[str | None] = None

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.stopped = False

    def unavailable_reason(self) -> str | None:
        return None

    def start(self, run_dir: Path) -> None:
        pass

    def _on_step(self, index: int) -> None:
        self.seen.append(index)

    def stop(self) -> CollectorResult:
        self.stopped = True
        return CollectorResult(CollectorStatus("ok"))


def test_the_record_is_handed_over_as_the_step_after_the_profiled_ones_begins(tmp_path: Path) -> None:
    # given a session measuring 6 steps after 2 skipped ones, with explicit step marks
    sampler = Sampler()
    session = Session(tmp_path, ["train.py"], [StepsCollector(skip=2), sampler], skip_steps=2, profile_steps=6)
    handed: list[int] = []
    session.on_hand_over = lambda s: handed.append(len(sampler.seen)) or s.hand_over()
    session.start()
    try:
        # when the loop marks 12 steps
        for _ in range(12):
            session.mark_step()
        # then the record was written when step 8 began, every collector stopped, and later marks changed nothing
        assert handed == [8] and sampler.stopped and sampler.seen == list(range(1, 9))
        during = load_record(tmp_path)
        assert during.profiling_window.script_ended is False  # type: ignore[union-attr]
        assert during.profiling_window.handed_over_s is not None  # type: ignore[union-attr]
        assert (during.steps.total, during.steps.skipped) == (8, 2)
    finally:
        # when the script ends with status 3: the record gets it, and nothing else changes
        final = session.stop(3)
    assert final.exit_status == 3 and final.profiling_window.script_ended  # type: ignore[union-attr]
    assert load_record(tmp_path) == final
    assert final.steps == during.steps and final.verdict == during.verdict


def test_a_hand_over_that_fails_is_one_line_and_the_loop_goes_on(tmp_path: Path, capsys) -> None:
    session = Session(tmp_path, ["train.py"], [StepsCollector()], profile_steps=20)

    def broken(s: Session) -> None:
        raise OSError("disk full")

    session.on_hand_over = broken
    session.start()
    for _ in range(25):
        session.mark_step()
    session.stop(0)
    assert capsys.readouterr().err == "gpuscope: error: could not hand the record over: OSError: disk full\n"


# -- after the windows -----------------------------------------------------------------------------------------
def test_collectors_done_with_their_windows_leave_the_step_boundary(tmp_path: Path) -> None:
    # given a session of every live collector with its default windows (a CPU run)
    session = Session(tmp_path, ["train.py"], default_collectors(CollectOptions(probes=False)))
    session.start()
    try:
        tracker = session._steps.tracker
        followers = {getattr(listener, "__self__", None).__class__.__name__ for listener in tracker.listeners}
        assert {"CProfileCollector", "TorchTraceCollector", "SpeedOfLightCollector", "SyncCollector"} <= followers
        # when the loop runs past the last window (the FLOP counter's step 10)
        for _ in range(14):
            session.mark_step()
        # then the profilers whose windows closed (or, for the sync count, never open on a CPU run) are called at no
        # later step, nor, on a torch built without CUDA, the collectors waiting for CUDA: what is left is what
        # every step needs, and the trace's look at the steps' pace (to take it again where the pace moves)
        left = {listener.__self__.__class__.__name__ for listener in tracker.listeners}
        waiting_for_cuda = {"NvtxCollector", "CudaMemoryCollector"} if session._steps.cuda_possible() else set()
        assert left == {"StepsCollector", "PracticesCollector", "TorchTraceCollector", *waiting_for_cuda}
        # which is called every 13 steps or more
        trace = next(c for c in session.collectors if c.name == "torch-trace")
        looked = len(trace._paces)  # type: ignore[attr-defined]
        for _ in range(40):
            session.mark_step()
        assert 1 <= len(trace._paces) - looked <= 40 // min(PACE_STEPS)  # type: ignore[attr-defined]
    finally:
        record = session.stop(0)
    assert record.collectors["cprofile"].status == "ok" and record.python_profile is not None
