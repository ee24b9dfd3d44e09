"""A recorded step's phases from its trace's ranges: where ranges of two phases overlap, which one holds the time."""

from __future__ import annotations

from typing import Any

from gpuscope.reduce.phases import phase_spans, step_phases
from gpuscope.reduce.trace import index_trace, recorded_steps


def span(name: str, ts: float, dur: float, cat: str = "user_annotation") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def test_a_closures_forward_and_backward_inside_the_optimizers_range_are_theirs() -> None:
    # given a step of 1000 us as Lightning's automatic optimization runs it: data 0-100 us, then optimizer.step(closure)
    # from 100 to 950 us, the closure's forward (DDP's range) 150-400 us and its backward (autograd's ops) 400-800 us
    # inside it, then the parameter update
    t = 5_000.0
    events = [
        span("ProfilerStep#7", t, 1000.0),
        span("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 100.0),
        span("Optimizer.step#AdamW.step", t + 100, 850.0),
        span("DistributedDataParallel.forward", t + 150, 250.0),
        span("aten::addmm", t + 200, 50.0, cat="cpu_op"),
        span("autograd::engine::evaluate_function: AddmmBackward0", t + 400, 200.0, cat="cpu_op"),
        span("autograd::engine::evaluate_function: AccumulateGrad", t + 700, 100.0, cat="cpu_op"),
        span("aten::_foreach_add_", t + 850, 50.0, cat="cpu_op"),
    ]
    index = index_trace(events)
    (step,) = recorded_steps(index)
    # then forward and backward hold their time, the optimizer only the rest of its range
    seconds = step_phases(index, step)
    assert {p: round(v * 1e6) for p, v in seconds.items()} == {
        "data_wait": 100, "forward": 250, "backward": 400, "optimizer": 200, "other": 50}
    spans = phase_spans(index, step)
    assert spans["optimizer"] == [(t + 100, t + 150), (t + 800, t + 950)]
    assert spans["backward"] == [(t + 400, t + 800)]
