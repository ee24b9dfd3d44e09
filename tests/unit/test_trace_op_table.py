"""The op table read from trace.json (``op_table``) means what torch's ``key_averages()`` gave inside the run:
compared on a real CPU profile built both ways, on the H100 recordings (run.json's table from ``key_averages()``,
trace.json from the same run), and on hand-made events; of its rows only torch ops count as ops, and ``gpuscope
analyze`` counts a trace's steps as ``gpuscope run`` does; and the end of the trace window neither builds torch's
table nor keeps the profiler's events alive."""

from __future__ import annotations

import gc
import gzip
import json
import weakref
from pathlib import Path
from typing import Any

import pytest

from gpuscope.reduce.optable import op_kind
from gpuscope.reduce.figures import trace_figures
from gpuscope.reduce.phases import calls_by_phase
from gpuscope.reduce.trace import index_trace, recorded_steps
from gpuscope.reduce.optable import OpTable, op_table
from gpuscope.reduce.fields import op_profile, trace_op_profile
from gpuscope.collect.collectors import torch_trace
from gpuscope.collect.collectors.torch_trace import TRACE_FILE, TorchTraceCollector
from gpuscope.collect.captures import TraceCapture
from gpuscope.collect.children import schedstat
from gpuscope.record import OpStat, Window
from gpuscope.reduce.tracefile import record_from_trace

H100 = Path(__file__).resolve().parent.parent / "fixtures" / "gpu" / "h100"


def key_averages_table(averages: Any) -> list[OpStat]:
    """The op table as the collector built it before, from ``key_averages()``: the reference."""
    return [OpStat(a.key, int(a.count), a.self_cpu_time_total / 1e6, (a.self_device_time_total or 0.0) / 1e6)
            for a in averages if not a.is_user_annotation and not a.key.startswith("ProfilerStep")]


def by_name(stats: list[OpStat]) -> dict[str, OpStat]:
    return {s.name: s for s in stats}


def test_on_a_real_profile_the_trace_gives_key_averages_own_figures(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    # given a small training loop profiled as the collector profiles it: a warm-up step, then three recorded ones,
    # with user ranges, ops that call an op of their own name (aten::mean), backward and an optimizer step
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trace = tmp_path / "trace.json"
    reference: list[list[OpStat]] = []

    def ready(prof: Any) -> None:
        prof.export_chrome_trace(str(trace))
        reference.append(key_averages_table(prof.key_averages()))

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3, repeat=1),
                 on_trace_ready=ready) as prof:
        for _ in range(5):
            with record_function("## forward ##"):
                loss = model(torch.randn(8, 16)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
    # when the table is read from the exported trace
    table = op_table(json.loads(trace.read_text())["traceEvents"])
    ours = by_name(list(table.rows))
    theirs = by_name(reference[0])
    # then every row is torch's: the same ops, calls and self time (to the nanosecond)
    assert ours.keys() == theirs.keys()
    assert theirs["aten::mean"].calls == 3  # torch counts aten::mean calling aten::mean as one call
    for name, op in theirs.items():
        assert ours[name].calls == op.calls, name
        assert ours[name].self_host_s == pytest.approx(op.self_host_s, abs=1e-9 * op.calls), name
        assert ours[name].device_s == 0.0


def recorded_table(name: str) -> tuple[dict[str, Any], OpTable, list[dict[str, Any]]]:
    run = json.loads(gzip.decompress((H100 / f"{name}.run.json.gz").read_bytes()))
    events = json.loads(gzip.decompress((H100 / f"{name}.trace.json.gz").read_bytes()))["traceEvents"]
    return run["op_profile"], op_table(events), events


@pytest.mark.parametrize("name", ["compute", "data", "launch"])
def test_the_h100_runs_op_figures_come_back_from_their_traces(name: str) -> None:
    # given a run recorded on an H100 (its op table from key_averages()) and the trace.json it wrote, uncapped
    recorded, table, events = recorded_table(name)
    assert recorded["trace_detail"] == "full"
    profile = op_profile(table, Window(7, 9), 3, trace_figures(events), cuda=True, trace_bytes=1)
    # then the rows are torch's, and the op counts are its counts less the rows that are no ops: runtime calls and
    # device events, which the run recorded as ops of kind "other" (cudaLaunchKernel beside each op it serves)
    others = (*table.calls, *table.device)
    assert profile.ops == recorded["ops"] - sum(o.calls for o in others) < recorded["ops"]
    kinds = dict(recorded["calls_by_kind"])
    for row in others:  # a kernel's name may read as a kind (a cuDNN convolution kernel as "conv")
        kinds[op_kind(row.name)] -= row.calls
    assert profile.calls_by_kind == kinds
    assert "cudaLaunchKernel" in {o.name for o in table.calls}
    # and a row's device time is a share of the device events' time, each counted once
    assert profile.device_s > 0 and profile.device_s == pytest.approx(sum(o.device_s for o in table.device))
    assert profile.device_s >= sum(o.device_s for o in table.ops) - 1e-12  # some device events have no launching op
    # and so are the top ops by host time, and by device time (kernels, copies, the ops that launched them)
    runtime = {str(e["name"]) for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    assert [(o.name, o.calls) for o in profile.top_host] == [(o["name"], o["calls"]) for o in recorded["top_host"]]
    for ours, theirs in zip(profile.top_host, recorded["top_host"]):
        assert ours.self_host_s == pytest.approx(theirs["self_host_s"], abs=1e-8)
        # torch gave a few runtime calls the device time of an op whose id equals their CUDA correlation id
        assert ours.device_s == pytest.approx(0.0 if ours.name in runtime else theirs["device_s"], abs=1e-8)
    # and every op is kept by host time for setting ranks side by side, the runtime calls and device rows left out
    assert {o.name for o in profile.host_ops} == {o.name for o in table.ops}
    assert {o.name for o in profile.host_ops}.isdisjoint(o.name for o in others)
    by_time = [o.self_host_s for o in profile.host_ops]
    assert by_time == sorted(by_time, reverse=True)
    assert sum(o.calls for o in profile.host_ops) == profile.ops
    kept = [o for o in recorded["top_device"] if o["name"] not in runtime]
    assert len(kept) >= len(recorded["top_device"]) - 1
    for ours, theirs in zip(profile.top_device, kept):
        assert (ours.name, ours.calls) == (theirs["name"], theirs["calls"])
        assert ours.device_s == pytest.approx(theirs["device_s"], abs=1e-8)


def op(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1, ext: int | None = None) -> dict[str, Any]:
    # as a trace holds them: three decimals, parsed to the nearest double
    event: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": round(ts, 3), "dur": dur}
    if ext is not None:
        event["args"] = {"External id": ext}
    return event


def test_self_time_nesting_and_device_time_as_torch_reckons_them() -> None:
    # given one step of hand-made events, at timestamps of a real trace (10^12 us, three decimals)
    t = 4526788405514.43
    events = [
        op("ProfilerStep#7", t, 1000.0, cat="user_annotation"),
        op("aten::linear", t + 10, 300.0, ext=1),
        op("aten::addmm", t + 20, 200.001, ext=2),  # ends with its launch, to the nanosecond
        op("cudaLaunchKernel", t + 150, 70.001, cat="cuda_runtime", ext=2),
        op("aten::is_leaf", t + 240, 5.0),  # torch drops it: its time stays its parent's
        op("aten::mean", t + 400, 100.0, ext=3),
        op("aten::mean", t + 401.5, 90.0, ext=4),  # an op calling its namesake counts once
        op("aten::sum", t + 402, 50.0, ext=5),
        op("## forward ##", t + 600, 100.0, cat="user_annotation", ext=6),
        op("aten::relu", t + 610, 40.0, ext=7),
        op("aten::relu", t + 700, 10.0, tid=2, ext=8),  # another thread: never a child of the range
        op("gemm_kernel", t + 500, 80.0, cat="kernel", ext=2),
        op("gemm_kernel", t + 600, 40.0, cat="kernel", ext=2),
        op("mean_kernel", t + 700, 5.0, cat="kernel", ext=4),
        op("Memcpy HtoD (Pageable -> Device)", t + 710, 3.0, cat="gpu_memcpy"),
        op("## forward ##", t + 600, 100.0, cat="gpu_user_annotation", ext=6),
        {"ph": "s", "cat": "ac2g", "id": 2, "pid": 1, "tid": 1, "ts": t + 150, "name": "ac2g"},
    ]
    # when the table is read
    table = op_table(events)
    rows = {s.name: (s.calls, round(s.self_host_s * 1e9), round(s.device_s * 1e9)) for s in table.rows}
    # then each op's self time is its own less its direct children's, on its thread
    assert rows["aten::linear"] == (1, 99_999, 0)
    assert rows["aten::addmm"] == (1, 130_000, 120_000)  # its launch is a child; its kernels are its device time
    assert rows["cudaLaunchKernel"] == (1, 70_001, 0)
    assert rows["aten::mean"] == (1, 50_000, 5_000)  # 100 us less aten::sum's 50; the inner mean's kernel
    assert rows["aten::sum"] == (1, 50_000, 0)
    assert rows["aten::relu"] == (2, 50_000, 0)
    # device events are rows of their own; ranges and dropped names are not rows
    assert rows["gemm_kernel"] == (2, 0, 120_000)
    assert rows["Memcpy HtoD (Pageable -> Device)"] == (1, 0, 3_000)
    assert not {"ProfilerStep#7", "## forward ##", "aten::is_leaf"} & rows.keys()
    # and the ops are the torch ops: runtime calls and device events are rows, not ops
    assert table.op_calls == 6
    assert [o.name for o in table.calls] == ["cudaLaunchKernel"]
    assert {o.name for o in table.device} == {"gemm_kernel", "mean_kernel", "Memcpy HtoD (Pageable -> Device)"}
    assert table.device_s == pytest.approx(128e-6)


def test_ops_building_a_batch_inside_the_dataloaders_next_are_counted_apart() -> None:
    # given a step whose DataLoader (no workers) converts two items and collates them inside its __next__ range, and
    # then runs a matmul; and a second thread's op at the same time (never inside the range)
    t = 1000.0
    events = [
        op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 100.0, cat="user_annotation"),
        op("aten::to", t + 10, 20.0),
        op("aten::_to_copy", t + 12, 15.0),  # inside aten::to, inside the range
        op("aten::to", t + 40, 20.0),
        op("aten::stack", t + 70, 20.0),
        op("aten::relu", t + 50, 5.0, tid=2),
        op("aten::mm", t + 150, 50.0),
    ]
    table = op_table(events)
    # then the four ops inside the range are the data wait's, with their own self time; the others are not
    assert table.op_calls == 6 and table.data_calls == 4
    assert round(table.data_self_s * 1e9) == 5_000 + 15_000 + 20_000 + 20_000
    # and the index of a streamed trace counts them alike
    from gpuscope.reduce.optable import indexed_table
    index = index_trace(events)
    assert indexed_table(index.host, index.device, index.names, -float("inf"), float("inf")) == table


@pytest.mark.parametrize("name", ["compute", "data", "launch"])
def test_analyze_counts_a_recordings_ops_as_the_run_did(name: str) -> None:
    # given a run recorded on an H100 and the trace.json it wrote
    run = json.loads(gzip.decompress((H100 / f"{name}.run.json.gz").read_bytes()))
    trace = json.loads(gzip.decompress((H100 / f"{name}.trace.json.gz").read_bytes()))
    # when gpuscope analyze reads the trace alone, and the run's table is read from the same events
    analyzed = record_from_trace(trace, f"{name}.trace.json", 1).op_profile
    ran = op_profile(op_table(trace["traceEvents"]), Window(7, 9), 3, trace_figures(trace["traceEvents"]),
                     cuda=True, trace_bytes=1)
    # then both find the run's three profiled steps and count the same ops, kind by kind, at the same mean self time
    # (runtime calls may differ: the run's trace holds a few outside the steps, a synchronisation at its end)
    assert analyzed is not None and analyzed.steps == run["op_profile"]["steps"] == 3
    assert (analyzed.ops, analyzed.calls_by_kind) == (ran.ops, ran.calls_by_kind)
    assert analyzed.mean_op_s == pytest.approx(ran.mean_op_s, rel=1e-9)


class StepEvents:
    """The steps collector as the trace collector sees it: a loop that calls no optimizer closure."""

    def window_opened(self) -> None:
        pass

    def closure_calls(self) -> int:
        return 0

    def remove_step_listener(self, listener: object) -> None:
        pass

    def window_closed(self) -> None:
        pass

    def cuda_in_use(self) -> bool:
        return False

    def in_window(self) -> bool:
        return False

    loops = 1

    def loops_begun(self) -> int:
        return self.loops

    def add_phase_listener(self, listener: Any) -> None:
        self.__dict__.setdefault("phase_listeners", []).append(listener)

    def remove_phase_listener(self, listener: Any) -> None:
        self.__dict__.setdefault("phase_listeners", []).remove(listener)

    def phase(self, phase: str) -> None:
        """The loop's phase changes (the steps collector tells its phase listeners)."""
        for listener in self.__dict__.get("phase_listeners", []):
            listener(phase)


def test_the_window_ends_without_key_averages_and_lets_the_recorded_events_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import profile

    # given: torch's own table is out of reach (on a loop of 55k ops a step it took 12 s and kept 1.8M objects)
    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the window's end built torch's event tree")

    monkeypatch.setattr(profile, "key_averages", refused)
    monkeypatch.setattr(profile, "events", refused)
    collector = TorchTraceCollector(start=1, active=2)
    collector._events = StepEvents()  # type: ignore[assignment]
    collector.start(tmp_path)
    held: list[weakref.ref[Any]] = []
    # when a few steps run through the window, with the cyclic collector off
    gc.disable()
    try:
        for index in range(6):
            collector._on_step(index)
            if collector._prof is not None and collector._prof.profiler is not None and not held:
                held.append(weakref.ref(collector._prof.profiler))
            x = torch.randn(16, 16)
            (x @ x).relu().sum()
        # then the profiler that holds the recorded events is gone once the window is over, with no collection
        assert held and held[0]() is None
    finally:
        gc.enable()
    assert collector._error is None
    result = collector.stop()
    # and the op table comes from trace.json at the end of the run
    assert result.status.status == "ok", result.status
    assert isinstance(result.payload, TraceCapture)
    assert (tmp_path / TRACE_FILE).exists()
    stats = by_name(list(trace_op_profile(result.payload).top_host))
    assert stats["aten::mm"].calls == 2 and stats["aten::relu"].calls == 2


def test_the_forward_passes_gpuscope_times_are_ranges_of_the_trace_and_its_steps_phases(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from gpuscope.reduce.phases import step_phases

    # given a loop whose forward passes gpuscope times (the steps collector tells its phase listeners), no range of
    # the script's own saying where they are
    collector = started(tmp_path, active=2)
    events = collector._events
    x = torch.randn(64, 64)
    for index in range(6):
        collector._on_step(index)
        events.phase("forward")
        (x @ x @ x).relu()
        events.phase("other")
        (x + 1).sum()
    result = collector.stop()
    assert result.status.status == "ok", result.status
    # then each recorded step holds one ``## forward ##`` range around its forward's ops, which the step's phases read
    trace = json.loads((tmp_path / TRACE_FILE).read_text())["traceEvents"]
    ranges = [e for e in trace if e.get("name") == "## forward ##"]
    assert len(ranges) == 2 and all(e["cat"] == "user_annotation" for e in ranges)
    mms = [e for e in trace if e.get("name") == "aten::mm"]
    assert len(mms) == 4 and all(any(r["ts"] <= m["ts"] <= m["ts"] + m["dur"] <= r["ts"] + r["dur"] for r in ranges)
                                 for m in mms)
    index = index_trace(trace)
    for step in recorded_steps(index):
        assert step_phases(index, step)["forward"] > 0
    # and once the window is over the loop's phase changes reach the collector no more
    assert events.phase_listeners == []


def started(run_dir: Path, active: int) -> TorchTraceCollector:
    """A collector whose window begins at step 1 (its warm-up), started on ``run_dir``, its step events inert."""
    collector = TorchTraceCollector(start=1, active=active)
    collector._events = StepEvents()  # type: ignore[assignment]
    collector.start(run_dir)
    return collector


def first_traced(path: Path) -> int:
    """The first ProfilerStep# of the trace at ``path``."""
    return min(int(e["name"].removeprefix("ProfilerStep#")) for e in json.loads(path.read_text())["traceEvents"]
               if e.get("name", "").startswith("ProfilerStep#"))


def run_paced(collector: TorchTraceCollector, steps: int, step_ms: Any) -> None:
    """``steps`` steps of one small matmul each, ``step_ms(index)`` ms apart on the collector's clock; the collector
    called at the steps it asks for, as the steps collector calls it."""
    torch = pytest.importorskip("torch")
    now, x, due = [0.0], torch.randn(16, 16), 0
    collector._clock = lambda: now[0]
    for index in range(steps):
        if index >= due:
            due = index + (collector._on_step(index) or 1)
        (x @ x).relu().sum()
        now[0] += step_ms(index) / 1e3


@pytest.mark.parametrize(("step_ms", "traced_again"), [
    (lambda i: 1.0 if i < 100 else 3.0, True),  # (episodes lengthening as a policy learns)
    (lambda i: 1.0 if i < 100 else 0.3, True),
    (lambda i: 1.0 + 0.8 * (i % 7 == 0), False),  # a slow step every 7: the same pace throughout
    (lambda i: 1.0 if i < 100 else 1.8, False),
], ids=["three times slower", "three times faster", "a slow step every seventh", "1.8x slower"])
def test_steps_whose_pace_moves_after_the_window_are_traced_again(tmp_path: Path, step_ms: Any,
                                                                   traced_again: bool) -> None:
    # given: a window of steps 2-4 (1 its warm-up), no other window after step 5, and steps whose pace changes
    # from step 100, or not
    collector = started(tmp_path, active=3)
    collector._quiet_from = {False: 5, True: 5}
    # when 400 steps run
    run_paced(collector, 400, step_ms)
    result = collector.stop()
    capture = result.payload
    assert isinstance(capture, TraceCapture)
    # then: where the pace moved twice or more, trace.json holds 3 steps at the new pace, and says so; else steps 2-4
    if not traced_again:
        assert capture.recorded == (2, 3, 4) and not result.notes
        return
    first = capture.recorded[0]
    assert 100 < first < 250 and capture.recorded == (first, first + 1, first + 2)
    assert first_traced(tmp_path / TRACE_FILE) == first
    assert result.notes[-1].startswith(f"trace.json holds steps {first}-{first + 2}, taken again there: the steps "
                                       f"had become 3.")
    longer = "longer" if step_ms(300) > 1 else "shorter"
    assert result.notes[-1].endswith(f"x {longer} than just after the trace before")
    assert not (tmp_path / (TRACE_FILE + ".part")).exists()


def test_steps_three_times_slower_in_a_second_training_loop_are_not_traced_again(tmp_path: Path) -> None:
    # given: a head trained alone for 100 steps, then the whole network by a new optimizer, 3x slower a step (the
    # run's figures describe the loop its windows fell in, the first)
    collector = started(tmp_path, active=3)
    collector._quiet_from = {False: 5, True: 5}
    events = collector._events
    torch = pytest.importorskip("torch")
    now, x, due = [0.0], torch.randn(16, 16), 0
    collector._clock = lambda: now[0]
    # when 400 steps run, the second loop from step 100
    for index in range(400):
        events.loops = 1 if index < 100 else 2  # type: ignore[union-attr]
        if index >= due:
            due = index + (collector._on_step(index) or 1)
        (x @ x).relu().sum()
        now[0] += (1.0 if index < 100 else 3.0) / 1e3
    result = collector.stop()
    # then: trace.json keeps the first loop's steps 2-4, with no note
    assert isinstance(result.payload, TraceCapture)
    assert result.payload.recorded == (2, 3, 4) and not result.notes
    assert first_traced(tmp_path / TRACE_FILE) == 2


def test_a_run_ending_before_the_trace_taken_again_is_whole_keeps_the_first(tmp_path: Path) -> None:
    # given: the pace triples from step 100, and the run ends as the trace is taken again (its warm-up step begun)
    collector = started(tmp_path, active=3)
    collector._quiet_from = {False: 5, True: 5}
    run_paced(collector, 400, lambda i: 1.0 if i < 100 else 3.0)
    again = collector.start_step
    (tmp_path / "second").mkdir()
    collector = started(tmp_path / "second", active=3)
    collector._quiet_from = {False: 5, True: 5}
    run_paced(collector, again + 2, lambda i: 1.0 if i < 100 else 3.0)
    # then: the first trace stands, whole, with no note
    result = collector.stop()
    assert isinstance(result.payload, TraceCapture) and result.status.status == "ok"
    assert result.payload.recorded == (2, 3, 4) and not result.notes
    assert first_traced(tmp_path / "second" / TRACE_FILE) == 2


def test_a_rank_of_a_job_is_traced_once_whatever_its_pace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (the ranks' traces must hold the same steps, side by side)
    monkeypatch.setattr(torch_trace, "_several_ranks", lambda: True)
    collector = started(tmp_path, active=3)
    collector._quiet_from = {False: 5, True: 5}
    run_paced(collector, 400, lambda i: 1.0 if i < 100 else 3.0)
    assert collector.stop().payload.recorded == (2, 3, 4)  # type: ignore[union-attr]


def test_steps_counted_anew_start_the_window_again(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    # given: a window of steps 2-3 (1 its warm-up) in a loop accumulating 4 batches a step: its batches are counted
    # as steps (0, 1, 2...) until the optimizer first steps, and from then on its optimizer steps, from 0 again
    collector = started(tmp_path, active=2)
    x = torch.randn(16, 16)
    for index, batches in [(i, 1) for i in range(4)] + [(i, 4) for i in range(6)]:  # batches 0-3, then steps 0-5
        collector._on_step(index)
        for _ in range(batches):
            (x @ x).relu().sum()
    capture = collector.stop().payload
    assert isinstance(capture, TraceCapture)
    # then: the window holds steps 2 and 3 of the optimizer's count, each of its 4 batches, and no batch-step
    assert capture.recorded == (2, 3)
    profile = trace_op_profile(capture)
    assert profile.steps == 2 and by_name(list(profile.top_host))["aten::mm"].calls == 8


@pytest.mark.parametrize(("long_step_s", "recorded"), [(0.0, (2,)), (60.0, (2, 3, 4))],
                         ids=["a long warm-up step", "a short one"])
def test_after_a_long_warm_up_step_one_step_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        long_step_s: float, recorded: tuple[int, ...]) -> None:
    torch = pytest.importorskip("torch")
    # given: a window of three steps, 2-4 (1 its warm-up), and steps as long as LONG_STEP_S or shorter
    monkeypatch.setattr(torch_trace, "LONG_STEP_S", long_step_s)
    collector = started(tmp_path, active=3)
    x = torch.randn(16, 16)
    for index in range(7):
        collector._on_step(index)
        (x @ x).relu().sum()
    capture = collector.stop().payload
    # then: after a long one, its first step only (each further one costs the run its events' processing)
    assert isinstance(capture, TraceCapture) and capture.recorded == recorded
    assert trace_op_profile(capture).steps == len(recorded)


def test_a_run_that_ends_inside_the_window_counts_its_last_lines_as_no_step(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    # given: a window of steps 2-4 (step 1 its warm-up) in a run whose last step is step 2: after it the script
    # runs a prediction pass (many small ops) and ends, with no step boundary to close that span
    collector = started(tmp_path, active=3)
    x = torch.randn(16, 16)
    for index in range(3):
        collector._on_step(index)
        (x @ x).relu().sum()
    collector._on_step(3)
    for _ in range(20):
        x.tanh()
    capture = collector.stop().payload
    assert isinstance(capture, TraceCapture)
    assert (capture.recorded, capture.unfinished) == ((2, 3), 3)
    # then the op profile is the one whole step's: its ops per step are step 2's, not halved by the tail, and the
    # tail's ops are in no figure (trace.json keeps them)
    profile = trace_op_profile(capture)
    assert (profile.window, profile.steps) == (Window(2, 2), 1)
    names = {s.name for s in profile.top_host}
    assert {"aten::mm", "aten::relu"} <= names and "aten::tanh" not in names
    assert profile.ops_per_step == profile.ops
    assert "aten::tanh" in (tmp_path / TRACE_FILE).read_text()


GPU = Path(__file__).resolve().parent.parent / "fixtures" / "gpu"


@pytest.mark.parametrize("name", ["a100-resnet-ddp-nccl.json.gz", "mi250-rocm-toy.json.gz",
                                  "cpu-only-collectives.json.gz", "h200/resnet-b96.trace.json.gz",
                                  "h200/overhead-loop.trace.json.gz"])
def test_a_trace_under_its_cap_is_read_from_its_file_to_the_same_figures_as_from_its_events(name: str) -> None:
    # given a recorded trace, as the window leaves it: its events held (a trace over the cap, trace.json cut) or
    # only its file (under the cap: read after the run as a stream, its events never all in memory at once)
    path = GPU / name
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    recorded = tuple(s.number for s in trace_figures(events).steps)
    held, streamed = (TraceCapture(events=kept, path=path, recorded=recorded, cuda="cpu-only" not in name,
                                   trace_bytes=path.stat().st_size, trace_detail="full") for kept in (events, None))
    # then the op table, the kernels, the communication and the steps are the same, to the last digit
    assert trace_op_profile(streamed) == trace_op_profile(held)


def test_a_ranks_ops_are_counted_by_the_phase_they_began_in_on_its_training_thread() -> None:
    # given two steps of a rank's trace: forward 100-300 us, backward 300-700 us (autograd's ops), the optimizer
    # after; a gradient hook's tanh in backward, an mm in each phase, and a relu on gloo's thread
    t = 1_000_000.0
    events = []
    for n, start in ((7, t), (8, t + 1000)):
        events += [
            op(f"ProfilerStep#{n}", start, 1000.0, cat="user_annotation"),
            op("## forward ##", start + 100, 200.0, cat="user_annotation"),
            op("aten::mm", start + 150, 20.0),
            op("autograd::engine::evaluate_function: MmBackward0", start + 300, 100.0),
            op("aten::mm", start + 310, 50.0),
            op("aten::tanh", start + 500, 10.0),
            op("aten::tanh", start + 520, 10.0),
            op("autograd::engine::evaluate_function: AccumulateGrad", start + 600, 100.0),
            op("Optimizer.step#SGD.step", start + 800, 100.0, cat="user_annotation"),
            op("aten::mm", start + 810, 10.0),
            op("aten::relu", start + 500, 10.0, tid=2),
            op("cudaLaunchKernel", start + 160, 5.0, cat="cuda_runtime"),
        ]
    index = index_trace(events)
    # when its calls are counted by phase over the recorded steps
    counts = calls_by_phase(index, recorded_steps(index))
    # then each op's calls are where they began, summed over the two steps; other threads and runtime calls not
    assert counts["aten::mm"] == {"forward": 2, "backward": 2, "optimizer": 2}
    assert counts["aten::tanh"] == {"backward": 4}
    assert "aten::relu" not in counts and "cudaLaunchKernel" not in counts
    # and with no step there is nothing to count
    assert calls_by_phase(index, []) == {}


class ClosureEvents(StepEvents):
    """...and one whose optimizer calls a closure several times a step (LBFGS), as the steps collector wraps it."""

    def __init__(self) -> None:
        self.calls = 0
        self.listeners: list[Any] = []

    def closure_calls(self) -> int:
        return self.calls

    def on_closure_end(self, listener: Any) -> None:
        self.listeners.append(listener)

    def off_closure_end(self, listener: Any) -> None:
        if listener in self.listeners:
            self.listeners.remove(listener)

    def closure(self, work: Any) -> None:
        self.calls += 1
        work()
        for listener in tuple(self.listeners):
            listener()


def long_steps_collector(tmp_path: Path) -> tuple[TorchTraceCollector, ClosureEvents]:
    """The trace collector as long steps place it (step 2 recorded, no warm-up step), following ``ClosureEvents``."""
    collector = TorchTraceCollector(start=2, active=1)
    collector.warmup = 0
    events = ClosureEvents()
    collector._events = events  # type: ignore[assignment]
    collector.start(tmp_path)
    return collector, events


def test_a_long_step_of_several_closure_calls_is_recorded_to_its_first_calls_end(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    # given long steps (one recorded, no warm-up step) whose optimizer calls its closure 4 times a step, each call an
    # mm and a relu
    collector, events = long_steps_collector(tmp_path)
    x = torch.randn(16, 16)
    for index in range(4):
        collector._on_step(index)
        for _ in range(4):
            events.closure(lambda: (x @ x).relu())
    result = collector.stop()
    assert result.status.status == "ok", result.status
    capture = result.payload
    assert isinstance(capture, TraceCapture)
    # then trace.json holds step 2 to the end of its first call: one mm, one relu
    trace = json.loads((tmp_path / TRACE_FILE).read_text())
    assert sum(e.get("name") == "aten::mm" for e in trace["traceEvents"]) == 1
    # and the op figures are that call's times the step's 4 calls: the step's own
    assert capture.scaled_by == 4 and capture.recorded == (2,)
    # and the recorded part's wait for a CPU, where the kernel says
    assert set(capture.cpu_wait_s) == ({2} if schedstat("thread-self") is not None else set())
    profile = trace_op_profile(capture)
    stats = by_name(list(profile.top_host))
    assert stats["aten::mm"].calls == 4 and stats["aten::relu"].calls == 4
    # and the record keeps the step's calls and the recorded call's time, what the step's time is taken as where no
    # step ran unprofiled (its wall also holds the trace's export)
    assert profile.closure_calls == 4 and 0 < profile.closure_call_s == capture.call_s < 5
    assert result.notes == ("trace.json holds step 2 up to the end of its first call of the optimizer's closure, "
                            "of 4: the op figures are that call's, times 4",)
    assert events.listeners == []


def test_a_step_of_one_closure_call_is_recorded_whole(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    # given the same loop calling its closure once a step (SGD with a closure)
    collector, events = long_steps_collector(tmp_path)
    x = torch.randn(16, 16)
    for index in range(4):
        collector._on_step(index)
        events.closure(lambda: (x @ x).relu())
        (x @ x).sum()  # the optimizer's own work after its closure
    capture = collector.stop().payload
    # then the whole step is recorded and nothing is scaled
    assert isinstance(capture, TraceCapture) and capture.scaled_by == 1 and capture.call_s == 0
    assert trace_op_profile(capture).closure_calls == 0
    assert by_name(list(trace_op_profile(capture).top_host))["aten::mm"].calls == 2
