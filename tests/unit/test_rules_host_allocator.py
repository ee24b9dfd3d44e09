"""The host allocator rule (``tune-host-allocator``) on hand-built host memory series: it fires where the kernel's
CPU time, spent faulting in fresh memory, takes a fifth of the step or more, with the figures it rests on and a
fix sized from the run's peak memory; it stays clear where the kernel's time is small or not the allocator's, and
is not checked where another allocator than glibc's served malloc."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import make_record
from gpuscope.diagnose.rules import evaluate
from gpuscope.diagnose.rules.host_allocator import kernel_share, kernel_time, keep_bytes
from gpuscope.record import HostMemory, Steps, StepSample

MIB = 1 << 20
PAGE = 4096


def memory(sys_per_step: float, user_per_step: float, pages_per_step: int, allocator: str = "glibc",
           settings: tuple[str, ...] = (), peak: int = 398 * MIB, step_s: float = 0.1 / 3,
           thread_sys_per_step: float | None = None, pause_s: float = 0.0,
           thread_wait_per_step: float = 0.0) -> HostMemory:
    """Samples every 0.1 s of a run: 2 s of start-up (no step; the kernel busy mapping libraries in), then 30
    steps of ``step_s`` each (an evaluation of ``pause_s`` after the 15th: no step, the kernel busy), their CPU
    times and faults spread evenly over them, then 1 s after the loop (no step). The training thread's kernel time
    is sampled where ``thread_sys_per_step`` is given, its user time the rest of the step less its wait for a
    core."""
    loop_start, steps = 2.0, 30
    pause_at = loop_start + 15 * step_s
    loop_end = loop_start + steps * step_s + pause_s

    def stepping(t: float) -> float:
        """Seconds of stepping by time ``t``."""
        inside = min(max(t - loop_start, 0.0), loop_end - loop_start)
        return inside - min(max(t - pause_at, 0.0), pause_s)

    def idle(t: float) -> float:
        return t - stepping(t)  # the start-up, the pause and after the loop: half the CPU in the kernel

    times = [round(i / 10, 10) for i in range(int(round((loop_end + 1.0) * 10)) + 1)]
    per_s = 1 / step_s
    user = tuple(stepping(t) * user_per_step * per_s + idle(t) * 0.5 for t in times)
    sys_ = tuple(stepping(t) * sys_per_step * per_s + idle(t) * 0.5 for t in times)
    faults = tuple(int(round(stepping(t) * pages_per_step * per_s + idle(t) * 250_000)) for t in times)
    seen = tuple(int(stepping(t) / step_s + 1e-9) for t in times)
    thread = {} if thread_sys_per_step is None else {
        "thread_user_s": tuple(stepping(t) * (step_s - thread_sys_per_step - thread_wait_per_step) * per_s
                               for t in times),
        "thread_sys_s": tuple(stepping(t) * thread_sys_per_step * per_s + idle(t) * 0.25 for t in times),
        "thread_runnable_s": tuple(stepping(t) * thread_wait_per_step * per_s for t in times)}
    return HostMemory(interval_s=0.1, peak_process_bytes=peak, t_s=tuple(times), user_s=user, sys_s=sys_,
                      minor_faults=faults, steps_seen=seen, page_bytes=PAGE, allocator=allocator,
                      malloc_settings=settings, **thread)


def run(host_memory: HostMemory | None, median_s: float = 0.1 / 3):
    return make_record(steps=Steps(count=28, median_s=median_s, total=30, warmup=1, source="optimizer"),
                       host_memory=host_memory, command=("dpsgd.py", "--steps", "30"))


def outcome(record):
    recommendations, checks = evaluate(record)
    return checks["tune-host-allocator"], {r.id: r for r in recommendations}.get("tune-host-allocator")


# a DP-SGD loop as measured: 35 ms of kernel and 29 ms of user CPU a step on two threads, a step every 33 ms, 64
# MiB of fresh pages faulted in each step
DPSGD = memory(sys_per_step=0.035, user_per_step=0.029, pages_per_step=16_400)


def test_only_the_samples_between_which_steady_steps_ran_are_counted() -> None:
    # the start-up and the time after the loop, half in the kernel, are left out; so is the first interval, in
    # which the warm-up step ran: 9 intervals of 3 steps each
    k = kernel_time(run(DPSGD))
    assert (k.steps, k.seconds, k.faults) == (27, pytest.approx(0.9), 27 * 16_400)
    assert k.sys_s == pytest.approx(27 * 0.035) and k.user_s == pytest.approx(27 * 0.029)
    assert k.thread_sys_s is None


def test_steps_longer_than_the_sampling_interval_are_counted_whole() -> None:
    # given: steps of 250 ms, sampled every 100 ms: of every five intervals, three see no step end (within one)
    slow = run(memory(sys_per_step=0.1, user_per_step=0.3, pages_per_step=40_000, step_s=0.25), median_s=0.25)
    k = kernel_time(slow)
    # then: the intervals inside a step count with those in which it ends (before, a step's figures came from
    # the intervals holding its end alone, two fifths of its time: 16,000 pages a step where it faulted 40,000)
    assert k.seconds == pytest.approx(k.steps * 0.25, abs=0.25)
    assert k.per_step(k.faults, 0.25) == pytest.approx(40_000, rel=0.01)
    assert k.per_step(k.sys_s, 0.25) == pytest.approx(0.1, rel=0.01)


def test_a_pause_in_the_loop_longer_than_two_steps_is_left_out() -> None:
    # given: an evaluation of 1 s after step 15, the kernel half its time and 250,000 pages a second
    paused = run(memory(sys_per_step=0.035, user_per_step=0.029, pages_per_step=16_400, pause_s=1.0))
    k = kernel_time(paused)
    # then: its ten intervals, in which no step ended, are left out, and the steps' own figures are what is left
    assert (k.steps, k.seconds) == (27, pytest.approx(0.9))
    assert k.per_step(k.faults, 0.1 / 3) == pytest.approx(16_400)


def test_intervals_holding_a_step_a_profiler_ran_in_are_left_out() -> None:
    # given: steps 10-12 ran under torch.profiler (steps 9 to 12 ended between the samples counting 9 and 12)
    statuses = ["warmup"] + ["steady"] * 9 + ["profiled"] * 3 + ["steady"] * 17
    record = run(DPSGD)
    record = dataclasses.replace(record, steps=dataclasses.replace(record.steps, sample=StepSample(
        index=tuple(range(30)), wall_s=(0.031,) * 30, status=tuple(statuses))))
    # then: the intervals from 9 to 12 and from 12 to 15 steps counted are left out (a step either side of an
    # interval's may have run in it)
    assert kernel_time(record).steps == 27 - 6


def test_the_kernels_share_is_of_the_step_or_of_the_cpu_time_where_threads_computed_side_by_side() -> None:
    # two threads: 64 ms of CPU a 33 ms step, so the kernel's share is that of the CPU time
    assert kernel_share(run(DPSGD)) == pytest.approx(35 / 64)
    # one thread waiting for data half the step: 10 ms of kernel time a 100 ms step is 10% of it
    waiting = memory(sys_per_step=0.010, user_per_step=0.040, pages_per_step=6000, step_s=0.1)
    assert kernel_share(run(waiting, median_s=0.1)) == pytest.approx(0.10)


def test_where_the_training_threads_kernel_time_was_read_it_is_the_share() -> None:
    # a word-language model as measured: 49 ms of the training thread's 176 ms step in the kernel (the other
    # thread's 38 ms of faults overlapping the step's own work); with the fix, 176 -> 122 ms a step (31%)
    lm = run(memory(sys_per_step=0.087, user_per_step=0.262, pages_per_step=41_500, step_s=0.176,
                    thread_sys_per_step=0.049), median_s=0.176)
    assert kernel_share(lm) == pytest.approx(49 / 176, rel=0.01)
    check, found = outcome(lm)
    assert found.expected_gain == pytest.approx(49 / 176 - 0.02, abs=0.005)
    assert "49.0 ms a step on the training thread (87.0 ms a step on all the process's threads, 25% of its CPU" \
        in found.evidence[0]


def test_on_a_busy_machine_the_threads_kernel_time_counts_as_long_as_it_took_on_the_cores_it_had() -> None:
    # given: a DP-SGD loop beside a busy process: the training thread 14 ms in the kernel and 19 ms in user mode
    # a 50 ms step, waiting for a core the other 17 ms (a third of the time it was ready to run)
    busy = run(memory(sys_per_step=0.0245, user_per_step=0.0368, pages_per_step=16_400, step_s=0.05,
                      thread_sys_per_step=0.014, thread_wait_per_step=0.05 / 3), median_s=0.05)
    # then: its 14 ms of kernel time took 21 ms of the step (before: 29%, promised 27%, where the fix measured
    # 55-60% under python beside the same busy process)
    assert kernel_time(busy).stretch() == pytest.approx(1.5)
    assert kernel_share(busy) == pytest.approx(0.014 * 1.5 / 0.05)
    _, found = outcome(busy)
    assert "14.0 ms a step on the training thread, 21.0 ms of the step as it waited for a core 33% of the time " \
        "it was ready to run" in found.evidence[0]


def test_a_step_faulting_in_fresh_memory_in_the_kernel_is_told_to_keep_it_with_the_figures() -> None:
    check, found = outcome(run(DPSGD))
    assert check.status == "fired"
    assert found.expected_gain == pytest.approx(35 / 64 - 0.02, abs=0.001)
    assert found.evidence[0].startswith("the kernel's CPU time took 55% of the step over 27 steps after the warm-up")
    assert "35.0 ms a step" in found.evidence[0] and "33.3 ms median step" in found.evidence[0]
    assert "16,400 pages a step: 64 MiB of fresh memory" in found.evidence[1]
    assert "glibc" in found.evidence[2] and "set in the environment" not in found.evidence[2]
    # the fix keeps blocks up to the run's peak (398 MiB), rounded up to a power of two, and is the user's command
    assert found.fix.startswith("MALLOC_MMAP_THRESHOLD_=536870912 MALLOC_TRIM_THRESHOLD_=536870912 "
                                "python dpsgd.py --steps 30  # ")
    assert "jemalloc" in found.fix and "tcmalloc" in found.fix


def test_settings_already_made_are_named_without_their_values() -> None:
    _, found = outcome(run(memory(0.035, 0.029, 16_400, settings=("MALLOC_TOP_PAD_",))))
    assert found.evidence[2].endswith("(set in the environment: MALLOC_TOP_PAD_)")


@pytest.mark.parametrize(("sys_per_step", "pages_per_step", "why"), [
    (0.010, 16_400, "the kernel's time is a sixth of the step: 10 ms of 60 ms of CPU"),
    (0.035, 1_000, "4 MiB of fresh memory a step: the kernel's time went elsewhere (pipes, files, threads)"),
])
def test_it_stays_clear_without_both_signals(sys_per_step: float, pages_per_step: int, why: str) -> None:
    check, found = outcome(run(memory(sys_per_step, 0.060 - sys_per_step, pages_per_step)))
    assert (check.status, found) == ("clear", None), why


def test_a_run_whose_fix_took_is_clear_and_the_share_shows_it() -> None:
    fixed = run(memory(sys_per_step=0.0001, user_per_step=0.0216, pages_per_step=35, step_s=0.01), median_s=0.01)
    assert outcome(fixed)[0].status == "clear"
    assert kernel_share(fixed) < 0.02


@pytest.mark.parametrize(("allocator", "reason"), [
    ("jemalloc", "malloc was jemalloc's, not glibc's"),
    ("", "the C allocator serving malloc could not be told (not Linux?)"),
])
def test_another_allocator_is_not_checked_and_says_which(allocator: str, reason: str) -> None:
    check, _ = outcome(run(memory(0.035, 0.029, 16_400, allocator=allocator)))
    assert (check.status, check.reason) == ("not-checked", reason)


def test_without_host_memory_samples_it_is_not_checked() -> None:
    check, _ = outcome(run(None))
    assert (check.status, check.reason) == ("not-checked", "host memory was not sampled")


def test_a_run_of_a_record_without_cpu_times_is_clear() -> None:
    # a run.json of an earlier version: its series has no CPU times
    old = HostMemory(interval_s=0.1, t_s=(0.0, 0.1), process_bytes=(1, 2), workers_bytes=(0, 0), allocator="glibc")
    assert kernel_time(run(old)) is None
    assert outcome(run(old))[0].status == "clear"


def test_glibc_keeps_at_least_256_mib_and_otherwise_the_peak_rounded_up_to_a_power_of_two() -> None:
    assert keep_bytes(0) == keep_bytes(100 * MIB) == 256 * MIB
    assert keep_bytes(398 * MIB) == keep_bytes(512 * MIB) == 512 * MIB
    assert keep_bytes(512 * MIB + 1) == 1024 * MIB
