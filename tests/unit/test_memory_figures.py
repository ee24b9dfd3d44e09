"""Memory's figures, worked by hand: the peak's categories and what a step leaves behind (from the memory window's
allocations), growth and leaks, each fix's saving at the peak, the largest batch that fits, the rules, and the
census of a run that died of memory."""

from __future__ import annotations

import dataclasses
import sysconfig

import pytest
import torch

from gpuscope.collect import oom
from gpuscope.collect.collectors.memory_window import Allocation, Holder, ProfileEvents, summarise
from gpuscope.diagnose import analyze
from gpuscope.diagnose.classify import classify
from gpuscope.diagnose.memory import complete_memory, fixes, growth, largest_batch, peak_under, scaled, theil_sen
from gpuscope.record import (
    HostMemory,
    KeptTensors,
    Loader,
    Memory,
    MemoryTimeline,
    OutOfMemory,
    RunRecord,
    Steps,
)

MB = 1_000_000


def allocation(nbytes: int, category: str, made: int | None, freed: int | None, **kw: object) -> Allocation:
    return Allocation(key=id(kw) ^ nbytes ^ (made or 0), nbytes=nbytes, category=category, device="cpu",
                      created_ns=made, destroyed_ns=freed, **kw)  # type: ignore[arg-type]


def two_steps() -> ProfileEvents:
    """Step 10 (0-100 ns): forward 0-40, backward 40-70, optimizer 70-100; step 11 (100-200) likewise."""
    events = ProfileEvents(steps=[(10, 0, 100), (11, 100, 200)], backward=[(40, 70), (140, 170)],
                           optimizer=[(70, 100), (170, 200)])
    events.allocations = [
        allocation(4 * MB, "parameters", None, None),
        allocation(8 * MB, "optimizer_state", None, None),
        allocation(3 * MB, "activations", 10, 60, module_chain=("Net_0", "Linear_0"), lines=("t.py:9 in forward",)),
        allocation(2 * MB, "activations", 20, None, module_chain=("Net_0",), lines=("t.py:9 in forward",
                                                                                   "t.py:17 in <module>")),
        allocation(4 * MB, "gradients", 45, 101),  # set to None as step 11 begins
        allocation(5 * MB, "activations", 75, 80, in_optimizer=True),  # an optimizer's quotient, not an activation
        allocation(1 * MB, "parameters", 76, 79, in_optimizer=True),  # a square root the timeline took for a parameter
        allocation(3 * MB, "activations", 110, 160, module_chain=("Net_0", "Linear_0"), lines=("t.py:9 in forward",)),
        allocation(2 * MB, "activations", 120, None, module_chain=("Net_0",), lines=("t.py:9 in forward",)),
        allocation(4 * MB, "gradients", 145, None),
    ]
    return events


def test_the_peak_is_split_into_categories_that_add_up_to_it_and_the_optimizers_temporaries_are_named_so() -> None:
    memory = summarise(two_steps(), "cpu")
    # at 76-79: params 4 + state 8 + kept activation 2 + gradients 4 + quotient 5 + square root 1 = 24 MB
    assert memory.peak_bytes == 24 * MB
    assert (memory.parameters_bytes, memory.optimizer_state_bytes, memory.gradients_bytes) == (4 * MB, 8 * MB, 4 * MB)
    assert memory.activations_bytes == 2 * MB
    assert memory.temporaries_bytes == 6 * MB
    assert memory.peak_phase == "optimizer"
    assert memory.steps == (10, 11)
    assert memory.gradients_max_bytes == 4 * MB


def test_what_a_step_made_is_no_parameter_whatever_the_timeline_took_it_for() -> None:
    # given: per-sample gradients from torch.func (vmap over grad), 13 MB made in the step and alive as it ends, which
    # torch's timeline took for parameters (DP-SGD on a 55k-parameter CNN, its real parameters 0.2 MB)
    events = two_steps()
    events.allocations.append(allocation(13 * MB, "parameters", 150, None))
    memory = summarise(events, "cpu")
    # then: the parameters are those made before the steps; the per-sample gradients are not placed
    assert memory.parameters_bytes == 4 * MB
    assert memory.unknown_bytes == 13 * MB


def test_activations_at_their_highest_name_the_module_and_line_holding_them() -> None:
    memory = summarise(two_steps(), "cpu")
    # at 120-145: step 10's kept 2 MB, step 11's 3 MB and 2 MB
    assert memory.activations_max_bytes == 7 * MB
    assert memory.holders[0].module == "Net_0" and memory.holders[0].bytes == 4 * MB
    assert memory.holders[0].line == "t.py:9 in forward"


def test_what_the_first_step_made_and_the_second_did_not_free_is_kept_gradients_and_state_are_not() -> None:
    memory = summarise(two_steps(), "cpu")
    assert memory.kept == (KeptTensors(line="t.py:9 in forward", callers=("t.py:17 in <module>",), bytes=2 * MB,
                                       tensors=1, category="activations"),)
    assert memory.kept_bytes_per_step == 2 * MB


def test_the_timeline_keeps_each_points_phase_and_adds_up_to_the_peak() -> None:
    timeline = summarise(two_steps(), "cpu").timeline
    assert timeline is not None
    totals = [sum(getattr(timeline, c)[i] for c in ("parameters", "gradients", "optimizer_state", "activations",
                                                     "inputs", "temporaries", "unknown"))
              for i in range(len(timeline.t_ms))]
    assert max(totals) == 24 * MB
    assert timeline.phases[totals.index(24 * MB)] == "optimizer"
    assert set(timeline.phases) <= {"forward", "backward", "optimizer", "other"}


# -- growth --------------------------------------------------------------------------------------------------------
def host_record(steps: list[int], rss: list[int], memory: Memory | None = None) -> RunRecord:
    return RunRecord(steps=Steps(warmup=1), host_memory=HostMemory(steps_seen=tuple(steps), process_bytes=tuple(rss)),
                     memory=memory or Memory(steps=(11, 12)))


def test_theil_sen_is_the_median_slope_and_one_jump_does_not_move_it() -> None:
    points = [(s, 100 * MB + 2 * MB * s) for s in range(20)]
    assert theil_sen(points) == pytest.approx(2 * MB)
    points[10] = (10, points[10][1] + 500 * MB)
    assert theil_sen(points) == pytest.approx(2 * MB)


def test_memory_that_grows_in_both_halves_of_the_steps_after_the_windows_is_a_leak() -> None:
    steps = list(range(0, 100, 2))
    record = host_record(steps, [150 * MB + int(2.5 * MB) * s for s in steps],
                         Memory(steps=(11, 12), kept_bytes_per_step=MB))
    found = growth(record, record.memory)  # type: ignore[arg-type]
    assert found is not None and found.leak
    assert found.per_step_bytes == pytest.approx(2.5 * MB)
    assert found.from_step == 14  # after the memory window's steps 11-12 (readings of even steps)
    assert found.to_step == 96  # the last count's readings are left out: they may be the run's end, not a step


def test_a_leaks_rate_is_what_a_step_keeps_where_that_agrees_with_the_growth() -> None:
    steps = list(range(0, 100, 2))
    rss = [150 * MB + int(3.5 * MB) * s for s in steps]  # 2 MB of tensors kept a step, and the allocator's slack
    kept = growth(host_record(steps, rss, Memory(steps=(11, 12), kept_bytes_per_step=2 * MB)),
                  Memory(steps=(11, 12), kept_bytes_per_step=2 * MB))
    assert kept is not None and kept.leak
    assert kept.per_step_bytes == pytest.approx(3.5 * MB) and kept.kept_per_step_bytes == 2 * MB
    small = Memory(steps=(11, 12), kept_bytes_per_step=MB // 4)  # one tensor beside a leak of something else
    found = growth(host_record(steps, rss, small), small)
    assert found is not None and found.leak and found.kept_per_step_bytes == 0
    flat = Memory(steps=(11, 12), kept_bytes_per_step=2 * MB)  # kept a step, freed later: no growth, no leak
    found = growth(host_record(steps, [150 * MB] * len(steps), flat), flat)
    assert found is not None and not found.leak and found.kept_per_step_bytes == 0


def test_resident_memory_growing_while_the_window_saw_no_tensor_kept_is_no_leak() -> None:
    # a dcgan-style loop with two DataLoader workers: the C allocator's heap grows 0.7 MB a step over its first two
    # epochs (and then stays), while the memory window saw nothing outlive its step
    steps = list(range(13, 120))
    rss = [310 * MB + int(0.7 * MB) * (s - 13) for s in steps]
    found = growth(host_record(steps, rss, Memory(steps=(11, 12))), Memory(steps=(11, 12)))
    assert found is not None and not found.leak and found.per_step_bytes == pytest.approx(0.7 * MB)
    unread = Memory()  # no window read: the growth alone tells
    found = growth(host_record(steps, rss, unread), unread)
    assert found is not None and found.leak


def test_readings_after_the_loop_do_not_make_a_leak() -> None:
    steps = list(range(0, 100, 2))
    rss = [400 * MB] * len(steps) + [900 * MB] * 40  # the end of the run (an analysis, the report) at step 98
    found = growth(host_record(steps + [98] * 40, rss), Memory(steps=(11, 12)))
    assert found is not None and not found.leak and found.per_step_bytes == 0


def test_memory_that_rises_then_stays_flat_is_no_leak() -> None:
    steps = list(range(14, 200, 2))
    rss = [150 * MB + min(s - 14, 30) * 3 * MB for s in steps]  # the allocator's arenas filling, then flat
    found = growth(host_record(steps, rss), Memory(steps=(11, 12)))
    assert found is not None and not found.leak


def test_small_growth_is_no_leak_and_too_few_steps_tell_nothing() -> None:
    steps = list(range(14, 100))
    found = growth(host_record(steps, [400 * MB + 1000 * s for s in steps]), Memory(steps=(11, 12)))
    assert found is not None and not found.leak  # 86 kB over the run
    assert growth(host_record([14, 15, 16, 17], [1, 2, 3, 4]), Memory(steps=(11, 12))) is None


# -- what each fix frees -------------------------------------------------------------------------------------------
def timeline(points: list[tuple[str, dict[str, int]]]) -> MemoryTimeline:
    cats = ("parameters", "gradients", "optimizer_state", "activations", "inputs", "temporaries", "unknown")
    return MemoryTimeline(t_ms=tuple(float(i) for i in range(len(points))),
                          phases=tuple(p for p, _ in points),
                          **{c: tuple(v.get(c, 0) for _, v in points) for c in cats})


def test_a_fix_is_credited_with_what_it_frees_at_the_peak_not_with_its_whole_size() -> None:
    # forward's end: 10 + 40 = 50 MB; the optimizer: 10 + 10 + 20 + 15 temporaries = 55 MB (the peak)
    t = timeline([("forward", {"parameters": 10 * MB, "activations": 40 * MB}),
                  ("optimizer", {"parameters": 10 * MB, "gradients": 10 * MB, "optimizer_state": 20 * MB,
                                 "temporaries": 15 * MB})])
    half_activations = peak_under(t, scaled(lambda c, p: 0.5 if c == "activations" else 1.0))
    assert half_activations == 55 * MB  # activations are not there at the peak: nothing freed
    memory = Memory(peak_bytes=55 * MB, activations_max_bytes=40 * MB, optimizer_state_bytes=20 * MB, timeline=t)
    found = {f.id: f for f in fixes(RunRecord(), memory)}
    assert "mixed-precision-activations" not in found
    # the optimizer's point falls to 45 MB: forward's end, 50 MB, is the peak then
    assert found["smaller-optimizer-state"].saving_bytes == 5 * MB
    assert found["smaller-optimizer-state"].share_of_peak == pytest.approx(5 / 55, abs=1e-3)


def test_checkpointing_keeps_the_blocks_inputs_and_one_blocks_activations() -> None:
    t = timeline([("forward", {"parameters": 10 * MB, "activations": 90 * MB}),
                  ("optimizer", {"parameters": 10 * MB, "gradients": 10 * MB, "optimizer_state": 20 * MB})])
    memory = Memory(peak_bytes=100 * MB, activations_max_bytes=90 * MB, timeline=t, repeated_blocks="Block",
                    repeated_block_count=4, repeated_block_bytes=80 * MB, repeated_block_max_bytes=20 * MB,
                    repeated_block_inputs_bytes=8 * MB)
    found = {f.id: f for f in fixes(RunRecord(), memory)}
    # the blocks' 80 MB of the 90 become their inputs and one block's: 28 MB; forward's end falls to 10 + 10 + 28 =
    # 48 MB, the optimizer's 40 MB stays: 52 MB freed
    assert found["activation-checkpointing"].saving_bytes == 52 * MB
    # late in backward, with 30 MB of activations left, 30 * 8/9 = 26.7 MB of them the blocks', under the 28 MB
    # checkpointing keeps: nothing is freed there, where a fixed share would have freed 58%
    late = dataclasses.replace(memory, timeline=timeline(
        [("forward", {"parameters": 10 * MB, "activations": 90 * MB}),
         ("backward", {"parameters": 10 * MB, "gradients": 80 * MB, "activations": 30 * MB})]))
    # the backward point (120 MB) is the peak, and stays it
    assert {f.id: f for f in fixes(RunRecord(), late)}.get("activation-checkpointing") is None
    assert "4 Block blocks" in found["activation-checkpointing"].title


def test_the_largest_batch_grows_what_grows_with_the_batch_until_the_limit() -> None:
    t = timeline([("forward", {"parameters": 10 * MB, "activations": 30 * MB, "inputs": 10 * MB}),
                  ("optimizer", {"parameters": 10 * MB, "gradients": 10 * MB, "optimizer_state": 20 * MB})])
    memory = Memory(peak_bytes=50 * MB, timeline=t, batch_size=32, limit_bytes=250 * MB, process_bytes=100 * MB)
    # beside the tensors: 100 - 50 = 50 MB; room 200 MB; forward: 10 + k * 40 <= 200 -> k = 4.75
    assert largest_batch(RunRecord(), memory) == 152


def test_a_run_that_died_at_its_first_step_is_told_what_share_of_its_batch_fits() -> None:
    died = OutOfMemory(error="RuntimeError: can't allocate memory", requested_bytes=400 * MB, parameters_bytes=50 * MB,
                       activations_bytes=100 * MB, other_bytes=300 * MB)
    memory = Memory(out_of_memory=died, limit_bytes=1000 * MB, limit_source="RLIMIT_AS",
                    address_space_peak_bytes=750 * MB)
    (fix,) = fixes(RunRecord(), memory)
    # beside the tensors 750 - 450 = 300 MB; grows: 100 + 300 + 400 = 800 MB; fits (1000 - 300 - 50) / 800
    assert fix.id == "smaller-micro-batch"
    assert "under 81% the size" in fix.title


# -- the rules and the verdict ---------------------------------------------------------------------------------
def test_a_leak_is_recommended_against_with_the_line_that_made_what_stays() -> None:
    steps = list(range(0, 100, 2))
    kept = (KeptTensors(line="train.py:9 in forward", callers=("train.py:17 in <module>",), bytes=2 * MB, tensors=1,
                        category="activations"),)
    record = dataclasses.replace(host_record(steps, [150 * MB + int(2.5 * MB) * s for s in steps],
                                             Memory(steps=(11, 12), kept=kept, kept_bytes_per_step=2 * MB)),
                                 steps=Steps(warmup=1, count=80, total=100, median_s=0.01))
    analysed = analyze(record)
    leak = next(r for r in analysed.recommendations if r.id == "fix-memory-leak")
    assert leak.fix.startswith("train.py:9 in forward: ")
    assert "grows 2.5 MB a step" in leak.why and "train.py:17" in leak.why
    assert analysed.checks["reduce-memory"].status == "clear"  # 24 GB of room is not short


@pytest.mark.parametrize(("holder", "fix"), [
    (Holder("list", "feats", 13), "train.py:9 in forward: the list `feats` (13 items) gains a tensor made here each "
                                  "step, with its autograd graph: append `.detach()`"),
    (Holder("graph", "total"), "train.py:9 in forward: `total` keeps every step's autograd graph, with the "
                               "tensors it saved (a loss summed without `.item()`"),
    (Holder("variable", "last"), "train.py:9 in forward: `last` still holds a tensor made here a step later"),
])
def test_the_leaks_fix_names_what_keeps_it(holder: Holder, fix: str) -> None:
    steps = list(range(0, 100, 2))
    kept = (KeptTensors(line="train.py:9 in forward", bytes=2 * MB, tensors=1, category="activations",
                        held_by=holder.words, holder_kind=holder.kind, holder_name=holder.name,
                        holder_items=holder.items),)
    held_by = holder.words
    record = dataclasses.replace(host_record(steps, [150 * MB + int(2.5 * MB) * s for s in steps],
                                             Memory(steps=(11, 12), kept=kept, kept_bytes_per_step=2 * MB)),
                                 steps=Steps(warmup=1, count=80, total=100, median_s=0.01))
    leak = next(r for r in analyze(record).recommendations if r.id == "fix-memory-leak")
    assert leak.fix.startswith(fix)
    assert f"kept by {held_by}" in leak.why


def test_what_keeps_a_tensor_is_found_among_the_scripts_variables() -> None:
    from gpuscope.collect.collectors.memory_window import references

    x = torch.randn(4, 3, requires_grad=True)
    features = [x * 2 for _ in range(3)]
    hidden = torch.relu(x @ torch.randn(3, 5))  # relu saves its output for backward
    total = (hidden * hidden).sum()  # saves `hidden` in its graph
    alone = torch.ones(7)
    held = references()
    assert held[features[1].untyped_storage().data_ptr()] == Holder("list", "features", 3)
    assert held[features[1].untyped_storage().data_ptr()].words == "the list `features` (3 items)"
    assert held[hidden.untyped_storage().data_ptr()].words == "the autograd graph of `total`"
    assert held[alone.untyped_storage().data_ptr()].words == "`alone`"
    del total


def test_a_run_short_of_memory_gets_the_fixes_and_one_with_room_gets_none() -> None:
    t = timeline([("forward", {"parameters": 10 * MB, "activations": 80 * MB})])
    tight = Memory(steps=(11, 12), peak_bytes=90 * MB, activations_max_bytes=80 * MB, timeline=t,
                   limit_bytes=1000 * MB, limit_source="the host's memory", process_bytes=950 * MB)
    analysed = analyze(RunRecord(memory=tight))
    (fit,) = [r for r in analysed.recommendations if r.id == "reduce-memory"]
    assert "50.0 MB of the host's memory (1.00 GB) left free" in fit.why
    assert "mixed precision" not in fit.fix and "torch.autocast" in fit.fix
    roomy = dataclasses.replace(tight, process_bytes=200 * MB)
    assert analyze(RunRecord(memory=roomy)).checks["reduce-memory"].status == "clear"


def test_the_verdict_of_a_run_that_died_of_memory_says_so_first_with_what_was_live() -> None:
    died = OutOfMemory(error="OutOfMemoryError: CUDA out of memory.", device="cuda", requested_bytes=20 * MB, step=3,
                       parameters_bytes=100 * MB, activations_bytes=900 * MB)
    verdict = classify(RunRecord(memory=Memory(out_of_memory=died)))
    assert verdict.evidence[0] == ("the script ran out of memory at step 3: OutOfMemoryError: CUDA out of memory. "
                                   "(asked for 20.0 MB); live CUDA tensors then: parameters 100.0 MB, activations "
                                   "saved for backward 900.0 MB")


def test_the_training_loaders_batch_size_is_the_one_used() -> None:
    record = RunRecord(memory=Memory(), loaders=(Loader(batch_size=8, batches=3), Loader(batch_size=64, batches=90)))
    assert complete_memory(record).batch_size == 64  # type: ignore[union-attr]


# -- the census of a run that died -------------------------------------------------------------------------------
@pytest.mark.parametrize(("error", "is_memory"), [
    (MemoryError(), True),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                  "tried to allocate 4294967296 bytes. Error code 12 (Cannot allocate memory)"), True),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB."), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
    (ValueError("out of memory"), False),
])
def test_memory_errors_are_told_from_others(error: BaseException, is_memory: bool) -> None:
    assert oom.is_memory_error(error) is is_memory


def test_the_failed_allocations_size_is_read_from_cpu_and_cuda_messages() -> None:
    assert oom.requested_bytes("you tried to allocate 4294967296 bytes. Error code 12") == 4294967296
    assert oom.requested_bytes("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0") == 20 << 20
    assert oom.requested_bytes("out of memory") is None


def test_the_census_counts_each_live_tensor_once_by_what_holds_it() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(16, 64)).sum().backward()
    for p in model.parameters():  # Adam's state as its first step leaves it (a first step imports for seconds)
        opt.state[p] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    x = torch.randn(32, 64)
    out = model(x)  # a graph alive: the relu's output (32 x 128) and x are saved for backward
    size = sum(p.numel() * 4 for p in model.parameters())
    counts = oom.live_tensors("cpu")
    assert counts["parameters_bytes"] >= size  # other tests' parameters may be alive too
    assert counts["gradients_bytes"] >= size
    assert counts["optimizer_state_bytes"] >= 2 * size
    assert counts["activations_bytes"] >= 32 * 128 * 4 + 32 * 64 * 4
    del out


def test_a_memory_error_raised_to_the_user_keeps_its_frames_for_their_debugger() -> None:
    def failing() -> None:
        held = torch.ones(3)  # noqa: F841  (a local the debugger would show)
        raise MemoryError

    try:
        failing()
    except MemoryError as exc:
        oom.note(exc, release=False)
        assert "held" in exc.__traceback__.tb_next.tb_frame.f_locals  # type: ignore[union-attr]
        oom.note(exc)  # the script has ended: its frames let go
        assert "held" not in exc.__traceback__.tb_next.tb_frame.f_locals  # type: ignore[union-attr]
    oom.census()


def test_a_memory_error_is_noted_once_and_others_not_at_all() -> None:
    oom.note(ValueError("out of memory"), steps=1)
    assert oom.census() is None
    oom.note(MemoryError(), steps=4)
    died = oom.census()
    assert died is not None and died.error == "MemoryError" and died.step == 4 and died.device == "cpu"
    assert oom.census() is None


class CpuStepEvents:
    """Step events as the memory window reads them: a CPU run, counting its steps."""

    def __init__(self) -> None:
        self.seen = 0

    def cuda_in_use(self) -> bool:
        return False

    def steps_seen(self) -> int:
        return self.seen

    def window_opened(self) -> None:
        pass

    def window_closed(self) -> None:
        pass

    def remove_step_listener(self, listener: object) -> None:
        pass


def test_the_window_stays_shut_while_another_profiler_holds_setprofile_and_leaves_it_in_place() -> None:
    import sys

    from gpuscope.collect.collectors.memory_window import MemoryWindowCollector

    calls: list[str] = []

    def users_profiler(frame: object, event: str, arg: object) -> None:
        calls.append(event)

    collector = MemoryWindowCollector(1)
    collector._events = CpuStepEvents()  # type: ignore[assignment]
    sys.setprofile(users_profiler)
    try:
        for index in range(4):
            collector._on_step(index)
        assert sys.getprofile() is users_profiler
    finally:
        sys.setprofile(None)
    result = collector.stop()
    assert result.status.status == "unavailable"
    assert "another profiler" in (result.status.reason or "")


def test_a_parameter_that_is_a_view_gives_the_user_no_warning_from_the_windows_profiler_and_theirs_stand() -> None:
    # given a module whose weight is a view, not a leaf (as FSDP's use_orig_params makes them): torch's profiler with
    # stacks reads each called module's parameters' gradients, which warns under the window and never under python
    import warnings

    from gpuscope.collect.collectors.memory_window import NON_LEAF_GRAD, MemoryWindowCollector

    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 4)
    model._parameters["weight"] = torch.randn(4, 4, requires_grad=True) * 1
    collector = MemoryWindowCollector(1)
    collector._events = CpuStepEvents()  # type: ignore[assignment]
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        filters = list(warnings.filters)
        for index in range(4):  # the window: steps 1 and 2
            collector._on_step(index)
            model(torch.randn(2, 4)).sum().backward(retain_graph=True)
        assert collector.stop().status.status == "ok"
        # then nothing was shown, the filters are as they were, and the script's own access still warns
        assert [str(w.message) for w in shown] == [] and warnings.filters == filters
        model.weight.grad  # noqa: B018
    assert [NON_LEAF_GRAD in str(w.message) for w in shown] == [True]


def test_a_cuda_run_counts_the_gpus_tensors_and_watches_the_allocator_for_growth() -> None:
    from gpuscope.record import CudaMemory

    events = two_steps()
    for a in events.allocations:
        a.device = "cuda:0"
    events.allocations.append(allocation(50 * MB, "inputs", None, None))  # on the host: not the GPU's
    memory = summarise(events, "cuda")
    assert memory.device == "cuda" and memory.peak_bytes == 24 * MB
    steps = list(range(0, 120, 8))
    record = RunRecord(steps=Steps(warmup=1), cuda_memory=CudaMemory(
        step=tuple(steps), allocated_bytes=tuple(500 * MB + 4 * MB * s for s in steps)))
    found = growth(record, dataclasses.replace(memory, steps=(14, 15)))
    assert found is not None and found.source == "cuda" and found.leak
    assert found.per_step_bytes == pytest.approx(4 * MB)


# -- a run killed outright ---------------------------------------------------------------------------------------
def test_a_run_killed_near_its_limit_is_recorded_as_out_of_memory_from_its_last_reading() -> None:
    from gpuscope.sentinel import killed_record

    last = {"t": 0.0, "steps": 31, "rss": 900 * MB, "vm": 1800 * MB}
    record = killed_record(("train.py",), last, killed_by_oom=False, address_limit=2000 * MB,
                           host_limit=(24000 * MB, "the host's memory"))
    assert record.exit_status == 137
    died = record.memory.out_of_memory  # type: ignore[union-attr]
    assert died is not None and died.step == 31
    assert record.verdict.evidence[0].startswith(
        "the script was killed outright (SIGKILL, as the kernel's OOM killer sends), its memory near its limit: "
        "1800.0 MB of the process's address-space limit (RLIMIT_AS) (2000.0 MB) at the last reading")
    assert record.memory.headroom_bytes == 200 * MB  # type: ignore[union-attr]


def test_a_run_killed_with_room_left_is_not_said_to_have_run_out_of_memory_unless_the_oom_killer_counted_it() -> None:
    from gpuscope.sentinel import killed_record

    last = {"t": 0.0, "steps": 12, "rss": 400 * MB, "vm": 2000 * MB}
    room = killed_record(("train.py",), last, False, 0, (24000 * MB, "the host's memory"))
    assert room.memory.out_of_memory is None  # type: ignore[union-attr]
    assert room.verdict.evidence[0].startswith("the script ended without writing its record (killed outright?): "
                                               "400.0 MB of the host's memory (24000.0 MB)")
    counted = killed_record(("train.py",), last, True, 0, (24000 * MB, "the host's memory"))
    assert counted.memory.out_of_memory is not None  # type: ignore[union-attr]
    assert "the container's oom_kill count rose" in counted.verdict.evidence[0]


STDLIB = sysconfig.get_paths()["stdlib"]
FAULTS = f"""Fatal Python error: Segmentation fault

Thread 0x00007f6c6d2ff6c0 (most recent call first):
  File "{STDLIB}/threading.py", line 331 in wait
  File "{STDLIB}/threading.py", line 1002 in _bootstrap

Current thread 0x00007f6c7a5e8b80 (most recent call first):
  File "{STDLIB}/ctypes/__init__.py", line 519 in string_at
  File "/home/me/project/train.py", line 7 in native_crash
  File "/home/me/project/train.py", line 14 in <module>

Extension modules: numpy.core._multiarray_umath, torch._C (total: 2)
"""


def test_a_run_that_crashed_on_a_fatal_signal_records_the_signals_status_and_where_it_struck() -> None:
    from gpuscope.sentinel import crash, killed_record

    last = {"steps": 20, "rss": 300 * MB, "vm": 2000 * MB}
    record = killed_record(("train.py",), last, False, 0, (24000 * MB, "the host's memory"), FAULTS)
    assert record.exit_status == 139
    assert record.verdict.evidence[0].startswith(
        "the script crashed: Segmentation fault (SIGSEGV) in string_at (__init__.py:519), called from the script's "
        "native_crash (train.py:7); every thread's Python stack is in faults.txt; exit status 139 (128 + SIGSEGV)")
    assert record.memory.out_of_memory is None  # type: ignore[union-attr]
    assert crash(FAULTS.replace("Segmentation fault", "Aborted", 1))[0].name == "SIGABRT"  # type: ignore[index]
    assert crash("") is None and crash("Fatal Python error: Cannot recover from stack overflow.\n") is None
