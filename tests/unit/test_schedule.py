"""The collection stage's scheduler: every profiler's window of steps, placed so that no two ever share a step."""

from __future__ import annotations

import pytest

from gpuscope.collect.collectors import CollectOptions, collector_classes, default_collectors, plan_windows, window_requests
from gpuscope.collect.collectors.base import WindowRequest
from gpuscope.collect.collectors.schedule import Window, schedule


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


def test_the_default_windows_are_cprofile_then_torch_profiler_then_syncs_then_flops() -> None:
    plan = plan_windows(CollectOptions())
    assert plan.cpu == {"cprofile": Window(0, 5), "torch-trace": Window(6, 4), "flops": Window(10, 1)}
    assert plan.cuda == {"cprofile": Window(0, 5), "torch-trace": Window(6, 4), "syncs": Window(10, 3),
                         "flops": Window(13, 1)}


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
        "calibration", "cpu-peak", "data-probe", "loader-probe", "optimizer-probe"}
