"""The collection stage's scheduler: every profiler's window of steps, placed so that no two ever share a step."""

from __future__ import annotations

import pytest

from gpuscope.collect.collectors import CollectOptions, collector_classes, default_collectors, plan_windows, window_requests
from gpuscope.collect.collectors.long_steps import LongStepsCollector
from gpuscope.collect.collectors.torch_trace import TorchTraceCollector, trace_window
from gpuscope.collect.framework.base import StepWindow, WindowRequest
from gpuscope.collect.framework.schedule import Window, compact_plan, long_steps_plan, schedule


def test_windows_that_would_overlap_are_placed_one_after_another() -> None:
    # given: two profilers that both want steps 0-2 and a third that wants 4 steps from the start too
    requests = [("a", WindowRequest(3, startup=True)), ("b", WindowRequest(3, startup=True)),
                ("c", WindowRequest(4))]
    # when
    plan = schedule(requests)
    # then: each begins where the one before it ends
    assert plan.cpu == {"a": Window(0, 3), "b": Window(3, 3), "c": Window(6, 4)}
    assert plan.overlaps() == []


def test_a_gap_leaves_clean_steps_between_two_windows() -> None:
    plan = schedule([("a", WindowRequest(5, startup=True)), ("b", WindowRequest(4, after="a", gap=1))])
    assert plan.start("b") == 6


def test_a_cuda_only_window_moves_the_later_windows_on_cuda_runs_only() -> None:
    plan = schedule([("trace", WindowRequest(4)), ("syncs", WindowRequest(3, cuda_only=True)),
                     ("flops", WindowRequest(1))])
    assert plan.window("syncs") is None and plan.start("syncs", cuda=True) == 5
    assert plan.start("flops") == 5 and plan.start("flops", cuda=True) == 8
    assert plan.overlaps() == []


def test_no_window_but_a_start_up_one_lands_on_the_warm_up_step() -> None:
    plan = schedule([("a", WindowRequest(2))])
    assert plan.start("a") == 1


def test_a_window_of_no_steps_is_not_placed_and_reserves_nothing() -> None:
    plan = schedule([("off", WindowRequest(0, gap=3)), ("b", WindowRequest(2))])
    assert plan.window("off") is None and plan.start("b") == 1


def test_windows_are_ordered_by_what_they_follow_not_by_their_names() -> None:
    class Declared:
        def __init__(self, name: str, request: WindowRequest | None) -> None:
            self.name, self._request = name, request

        def wants(self, options: CollectOptions) -> WindowRequest | None:
            return self._request

    classes = [Declared("alpha", WindowRequest(1, after="zulu")), Declared("mike", WindowRequest(2, after="alpha")),
               Declared("quiet", None), Declared("zulu", WindowRequest(3, startup=True))]
    assert [name for name, _ in window_requests(classes, CollectOptions())] == ["zulu", "alpha", "mike"]


def test_windows_that_follow_each_other_in_a_circle_are_an_error() -> None:
    class Declared:
        def __init__(self, name: str, after: str) -> None:
            self.name, self.after = name, after

        def wants(self, options: CollectOptions) -> WindowRequest:
            return WindowRequest(1, after=self.after)

    with pytest.raises(ValueError, match="circle"):
        window_requests([Declared("a", "b"), Declared("b", "a")], CollectOptions())


@pytest.mark.parametrize("options", [
    CollectOptions(), CollectOptions(cprofile_steps=None), CollectOptions(trace_steps=0),
    CollectOptions(cprofile_steps=0, trace_steps=10), CollectOptions(cprofile_steps=20, trace_steps=1),
])
def test_gpuscopes_own_profilers_never_share_a_step(options: CollectOptions) -> None:
    assert plan_windows(options).overlaps() == []


def test_the_default_windows_are_cprofile_then_torch_profiler_then_syncs_then_flops_then_memory() -> None:
    plan = plan_windows(CollectOptions())
    assert plan.cpu == {"cprofile": Window(0, 5), "torch-trace": Window(6, 4), "flops": Window(10, 1),
                        "memory-window": Window(11, 2)}
    assert plan.cuda == {"cprofile": Window(0, 5), "torch-trace": Window(6, 4), "syncs": Window(10, 3),
                         "flops": Window(13, 1), "memory-window": Window(14, 2)}


def test_without_torch_profiler_there_is_no_memory_window() -> None:
    assert "memory-window" not in plan_windows(CollectOptions(trace_steps=0)).cpu


def test_every_collector_declares_its_name_stage_and_record_field() -> None:
    names = [cls.name for cls in collector_classes()]
    assert len(names) == len(set(names))
    for cls in collector_classes():
        assert cls.stage in ("live", "post-run")
        assert hasattr(cls, "field")


def test_the_steps_collector_starts_first_and_probes_run_after_every_live_collector() -> None:
    collectors = default_collectors()
    stages = [getattr(c, "stage", "live") for c in collectors]
    assert collectors[0].name == "steps"
    assert stages == sorted(stages, key=lambda s: s == "post-run")
    assert {c.name for c in collectors if c.stage == "post-run"} == {
        "calibration", "cpu-peak", "data-probe", "loader-probe", "optimizer-probe", "repeat-probe"}


# -- long steps: the windows placed again once step 1 has shown how long a step is -------------------------------

def _default_requests(**options: object) -> list:
    return window_requests(collector_classes(), CollectOptions(**options))  # type: ignore[arg-type]


@pytest.mark.parametrize("step_s", [0.001, 0.1, 1.9])
def test_steps_shorter_than_two_seconds_keep_the_plan_made_at_the_start(step_s: float) -> None:
    assert long_steps_plan(_default_requests(), step_s) is None


@pytest.mark.parametrize("step_s", [2.0, 20.0])
def test_long_steps_get_one_step_a_window_one_after_another_from_step_2(step_s: float) -> None:
    plan = long_steps_plan(_default_requests(), step_s)
    assert plan is not None
    # cProfile's start-up window ends where the plan is made again: it covered the start-up, steps 0 and 1
    # the memory window has none: one long step under its profiler (stacks, every allocation) costs as much again;
    # nor has the FLOP count: the traced step's FLOPs are read from its ops' shapes
    assert plan.cpu == {"cprofile": Window(0, 2), "torch-trace": Window(2, 1), "memory-window": Window(3, 0)}
    assert plan.cuda == {"cprofile": Window(0, 2), "torch-trace": Window(2, 1), "syncs": Window(3, 1),
                         "memory-window": Window(4, 0)}
    assert plan.overlaps() == []


def test_long_steps_calling_their_closure_several_times_count_flops_on_the_traced_steps_second_call() -> None:
    # given: step 1 took 20 s and called LBFGS's closure 4 times
    plan = long_steps_plan(_default_requests(), 20.0, closure_calls=4)
    # then the trace records step 2's first call and the FLOP count its second: three steps hold both
    assert plan is not None
    assert plan.cpu == {"cprofile": Window(0, 2), "torch-trace": Window(2, 1),
                        "flops": Window(2, 1, second_call=True), "memory-window": Window(3, 0)}
    assert plan.cuda == {"cprofile": Window(0, 2), "torch-trace": Window(2, 1), "syncs": Window(3, 1),
                         "flops": Window(2, 1, second_call=True), "memory-window": Window(4, 0)}
    assert plan.overlaps() == []
    # one call a step: each window its own step, as without a closure
    assert long_steps_plan(_default_requests(), 20.0, closure_calls=1) == long_steps_plan(_default_requests(), 20.0)


@pytest.mark.parametrize("step_s", [0.001, 0.1, 2.0, 20.0])
@pytest.mark.parametrize("epoch_steps", [None, 8, 1000])
def test_windows_are_placed_again_for_long_steps_and_for_epochs_too_short_for_them(step_s: float,
                                                                                   epoch_steps: int | None) -> None:
    # given steps of 1 ms to 20 s, in a loop whose epoch length is unknown (an IterableDataset, no DataLoader), 8
    # steps (fewer than the windows at full length take: 13 on a CPU run) or 1000
    full = schedule(_default_requests())
    assert 8 < full.end() < 1000
    plan = long_steps_plan(_default_requests(), step_s, epoch_steps=epoch_steps)
    # then long steps, or an epoch too short, get the windows one step each from step 2; short steps in a long or
    # unknown epoch keep the plan made at the start
    if step_s >= 2.0 or epoch_steps == 8:
        assert plan is not None and plan.cpu["torch-trace"] == Window(2, 1) and "flops" not in plan.cpu
        assert plan.end() <= 8 and plan.overlaps() == []
    else:
        assert plan is None


def test_long_steps_leave_windows_the_user_placed_after_skipped_steps_alone() -> None:
    assert long_steps_plan(_default_requests(skip_steps=3), 20.0, first=3) is None


def test_a_start_up_window_already_shorter_than_the_steps_before_the_plan_keeps_its_length() -> None:
    plan = long_steps_plan(_default_requests(cprofile_steps=1), 20.0)
    assert plan is not None and plan.cpu["cprofile"] == Window(0, 1) and plan.cpu["torch-trace"] == Window(2, 1)


class _Owner:
    def __init__(self, name: str) -> None:
        self.name = name
        self.moved: list[tuple[object, object]] = []

    def move_window(self, cpu: object, cuda: object) -> None:
        self.moved.append((cpu, cuda))


class _Closures:
    """What the long-steps collector reads of the steps collector: its count of the optimizer's closure calls, the
    steps an epoch holds (None: its DataLoader has no length), and that the run is a CPU one."""

    def __init__(self, calls: list[int], epoch_steps: int | None = None) -> None:
        self.calls = iter(calls)
        self._epoch_steps = epoch_steps

    def closure_calls(self) -> int:
        return next(self.calls)

    def epoch_steps(self) -> int | None:
        return self._epoch_steps

    def cuda_in_use(self) -> bool:
        return False

    def remove_step_listener(self, listener: object) -> None:
        pass


def _run_long_steps(step_s: float, monkeypatch: pytest.MonkeyPatch,
                    waited: tuple[float, float, float] = (0.0, 0.0, 0.0), closure_calls: int = 0,
                    epoch_steps: int | None = None) -> tuple[LongStepsCollector, dict[str, _Owner]]:
    """The long-steps collector told of steps 0, 1 and 2, step 1 taking ``step_s`` and calling the optimizer's closure
    ``closure_calls`` times, the loop's thread having waited for a core ``waited`` seconds by each, an epoch holding
    ``epoch_steps``; the owners it was given."""
    from gpuscope.collect.collectors import long_steps

    collector = LongStepsCollector(_default_requests())
    collector._events = _Closures([0, closure_calls, 2 * closure_calls], epoch_steps)  # type: ignore[assignment]
    owners = {name: _Owner(name) for name in ("cprofile", "torch-trace", "syncs", "flops")}
    collector.owners = list(owners.values())
    clock = iter([0.0, 5.0, 5.0 + step_s])
    monkeypatch.setattr(long_steps.time, "perf_counter", lambda: next(clock))
    waits = iter([(0.0, w) for w in waited])
    monkeypatch.setattr(long_steps, "schedstat", lambda tid: next(waits))
    for index in range(3):
        collector._on_step(index)
    return collector, owners


def test_a_step_1_of_twenty_seconds_moves_every_windows_owner_and_says_where(monkeypatch) -> None:
    collector, owners = _run_long_steps(20.0, monkeypatch)
    assert owners["torch-trace"].moved == [(Window(2, 1), Window(2, 1))]
    assert owners["syncs"].moved == [(None, Window(3, 1))]
    assert owners["flops"].moved == [(None, None)]  # it has no step: the traced step's FLOPs, from its shapes
    (note,) = collector.stop().notes
    assert note.startswith("step 1 took 20.0 s of its own")
    assert note.endswith("torch.profiler step 2, the FLOPs read from the traced step's op shapes (on a CUDA run the "
                         "sync count step 3)")


def test_a_step_1_calling_its_closure_four_times_moves_the_flop_count_onto_the_traced_step(monkeypatch) -> None:
    collector, owners = _run_long_steps(20.0, monkeypatch, closure_calls=4)
    assert owners["flops"].moved == [(Window(2, 1, second_call=True), Window(2, 1, second_call=True))]
    (note,) = collector.stop().notes
    assert "torch.profiler step 2, the FLOP count step 2 (its second closure call)" in note
    assert note.endswith("(on a CUDA run the sync count step 3)")


def test_a_loop_of_short_steps_whose_epoch_is_too_short_for_the_windows_gets_them_one_step_each(monkeypatch) -> None:
    # given a step 1 of 10 ms, in a loop whose DataLoader holds 8 steps an epoch
    collector, owners = _run_long_steps(0.01, monkeypatch, epoch_steps=8)
    # then every window moves, and the note says why
    assert owners["torch-trace"].moved == [(Window(2, 1), Window(2, 1))]
    assert owners["flops"].moved == [(None, None)]
    (note,) = collector.stop().notes
    assert note.startswith("an epoch holds 8 steps (its DataLoader's length), fewer than the profiling windows take "
                           "at their full length: they were placed again, one step each: cProfile steps 0-1, "
                           "torch.profiler step 2, the FLOPs read from the traced step's op shapes"), note


def test_a_short_step_that_waited_seconds_for_a_core_is_no_long_step(monkeypatch) -> None:
    # given a step 1 of 2.5 s wall, 1.5 s of which its thread waited for a core (a busy machine)
    collector, owners = _run_long_steps(2.5, monkeypatch, waited=(0.1, 0.2, 1.7))
    # then its own 1.0 s is short: the windows stay where they were placed
    assert all(owner.moved == [] for owner in owners.values()) and collector.step_s == pytest.approx(1.0)


def test_a_step_1_of_a_tenth_of_a_second_moves_nothing(monkeypatch) -> None:
    collector, owners = _run_long_steps(0.1, monkeypatch)
    assert all(owner.moved == [] for owner in owners.values()) and collector.stop().notes == ()


def test_a_window_moves_while_it_waits_and_never_once_open() -> None:
    window = StepWindow(10, 1, lambda index: None, lambda: None, cuda_start=13)
    window.move(Window(3, 1), Window(4, 1))
    assert (window.start, window.cuda_start, window.steps) == (3, 4, 1)
    window.state = "open"
    window.move(Window(7, 1), Window(8, 1))
    assert (window.start, window.cuda_start) == (3, 4)


def test_a_trace_moved_for_long_steps_records_its_first_step_with_no_warm_up() -> None:
    trace = TorchTraceCollector(start=6, active=3)
    trace.move_window(Window(2, 1), Window(2, 1))
    assert [trace_window(i, trace.start_step, trace.active, trace.warmup) for i in (1, 2, 3)] == [
        "before", "active", "after"]


# -- few steps measured: --profile-steps N too few for the windows at their full length -------------------------

def test_profile_steps_too_few_for_the_windows_at_full_length_get_them_one_step_each_from_the_start() -> None:
    from gpuscope.options import RunOptions

    plan = plan_windows(RunOptions(profile_steps=6).collect_options())
    # as long steps get them (cProfile's start-up window over steps 0-1, then one step each), without waiting to
    # see step 1: the number of steps is known from the start
    assert plan.cpu == {"cprofile": Window(0, 2), "torch-trace": Window(2, 1)}
    assert plan.cuda == {"cprofile": Window(0, 2), "torch-trace": Window(2, 1), "syncs": Window(3, 1)}
    # after skipped steps, from the first measured step
    skipped = plan_windows(RunOptions(skip_steps=10, profile_steps=6).collect_options())
    assert skipped.cuda == {"cprofile": Window(10, 2), "torch-trace": Window(12, 1), "syncs": Window(13, 1)}
    # enough steps for the full plan keep it
    assert plan_windows(RunOptions(profile_steps=19).collect_options()).cpu["torch-trace"] == Window(6, 4)


def test_the_collectors_of_a_run_of_few_measured_steps_own_one_step_each_and_say_so() -> None:
    from gpuscope.options import RunOptions

    collectors = {c.name: c for c in default_collectors(RunOptions(profile_steps=5).collect_options())}
    trace = collectors["torch-trace"]
    assert (trace.start_step, trace.warmup, trace.active) == (2, 0, 1)  # recorded at once, as for long steps
    assert collectors["cprofile"].steps == 2
    assert collectors["flops"]._traced_only  # no step of its own: the traced step's FLOPs, from its shapes
    (note,) = collectors["long-steps"].stop().notes
    assert note == ("--profile-steps is fewer than the windows take at their full length: they were placed one step "
                    "each: cProfile steps 0-1, torch.profiler step 2, the FLOPs read from the traced step's op shapes "
                    "(on a CUDA run the sync count step 3)")


def _run_compact(calls: list[int], first: int = 0) -> tuple[LongStepsCollector, dict[str, _Owner], list]:
    """The long-steps collector of ``--profile-steps`` N small (after ``first`` skipped steps) told of each step
    beginning it asks for up to the traced one, the closure calls so far at those it reads being ``calls``: the owners
    it moved, and what it returned."""
    collector = LongStepsCollector(_default_requests(), first, compact=True)
    collector._events = _Closures(calls)  # type: ignore[assignment]
    owners = {name: _Owner(name) for name in ("cprofile", "torch-trace", "syncs", "flops")}
    collector.owners = list(owners.values())
    index, returned = 0, []
    while index <= first + 2:
        returned.append(collector._on_step(index))
        index += returned[-1] or 1
    return collector, owners, returned


def test_profile_steps_of_a_loop_calling_its_closure_count_flops_on_the_traced_steps_second_call() -> None:
    # the compact plan, as long steps get it: the FLOP count shares the traced step where its closure is called
    assert compact_plan(_default_requests(), share=True).cpu["flops"] == Window(2, 1, second_call=True)
    # given --profile-steps N small, step 1 calling LBFGS's closure 4 times: the count moves as step 2 begins
    collector, owners, _ = _run_compact([0, 4])
    assert owners["flops"].moved == [(Window(2, 1, second_call=True), Window(2, 1, second_call=True))]
    assert "the FLOP count step 2 (its second closure call)" in collector.stop().notes[0]
    # one call a step (a plain optimizer): nothing moves (the FLOPs are the traced step's, from its shapes)
    assert _run_compact([0, 1])[1]["flops"].moved == []


def test_after_skipped_steps_the_compact_plans_collector_reads_only_the_steps_it_decides_on() -> None:
    # given 10 skipped steps: the closure calls are read at steps 11 and 12 only, the steps before cost it nothing
    collector, owners, returned = _run_compact([0, 4], first=10)
    assert returned[0] == 11 and owners["flops"].moved == [(Window(12, 1, second_call=True),
                                                            Window(12, 1, second_call=True))]


def test_profile_steps_too_few_even_for_one_step_windows_are_refused_in_one_line() -> None:
    from gpuscope.errors import GpuscopeError
    from gpuscope.options import RunOptions

    # cProfile 2, the trace 1 and the sync count 1 (a CUDA run's); with no trace, the FLOP count takes its step
    with pytest.raises(GpuscopeError, match=r"--profile-steps 3 is too few: the profilers' windows take 4 at one "
                                            r"step each; 19 hold them at full length"):
        RunOptions(profile_steps=3)
    assert RunOptions(profile_steps=4).collect_options().compact_windows
    assert RunOptions(profile_steps=4, trace_steps=0).collect_options().compact_windows


def test_profile_steps_too_few_for_the_memory_window_leave_it_out_rather_than_refuse_the_run() -> None:
    from gpuscope.options import RunOptions

    # every other window and five steady steps take 19 steps; the memory window two more
    assert RunOptions(profile_steps=19).fewest_profile_steps() == 19
    assert RunOptions(profile_steps=20).collect_options().memory_window is False
    assert RunOptions(profile_steps=21).collect_options().memory_window is True
    assert RunOptions().collect_options().memory_window is True
