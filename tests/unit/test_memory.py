"""Host memory sampling: real RSS of the process and its children, bounded and evenly spaced series, peaks."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuscope.collect.collectors.children import EXEC_GRACE_S, ChildrenCpu, helper_verdict, schedstat
from gpuscope.collect.collectors.memory import (
    BoundedSeries,
    HostMemoryCollector,
    MemoryPeaks,
    MemorySample,
    build_host_memory,
    descendants,
    next_deadline,
    peaks_of,
    thin,
)
from gpuscope.record import CollectorStatus, HostMemory

MB = 1 << 20


def _hold_memory(size: int, ready: Any, release: Any) -> None:
    """A worker's body: touch ``size`` bytes, say so, and keep them until released."""
    block = b"\x01" * size  # written, so resident (a zeroed allocation may not be)
    ready.set()
    release.wait(10)
    del block


CHILDREN = """
import json, multiprocessing, sys, time
from pathlib import Path
from gpuscope.collect.collectors.memory import HostMemoryCollector

def body(spin):  # 1.5 s on a CPU (spin) or waiting, as for a file or the network
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        if not spin:
            time.sleep(0.01)

collector = HostMemoryCollector(interval_s=0.05, children_scan_s=0.1)
collector.start(Path("."))
children = [multiprocessing.get_context("fork").Process(target=body, args=(sys.argv[1] == "spin",)) for _ in "ab"]
for child in children:
    child.start()
for child in children:
    child.join(10)
memory = collector.stop().payload
print(json.dumps([memory.workers_cpu_s, memory.workers_runnable_s, memory.workers_watched_s]))
"""
"""A process with two children and no other (the test's own process may have more: the slow tier's preloaded
interpreter), the collector watching them; prints their CPU, runnable and watched seconds."""


def _stop(collector: HostMemoryCollector) -> HostMemory:
    """Stop the collector and return its (successful) payload."""
    result = collector.stop()
    assert result.status == CollectorStatus("ok")
    assert isinstance(result.payload, HostMemory)
    return result.payload


def fake_proc(root: Path, threads: dict[int, dict[int, list[int]]]) -> str:
    """A /proc of ``{pid: {tid: [child pids]}}``: each thread's ``task/TID/children`` list, as Linux keeps it."""
    for pid, tasks in threads.items():
        for tid, children in tasks.items():
            task = root / str(pid) / "task" / str(tid)
            task.mkdir(parents=True)
            (task / "children").write_text("".join(f"{child} " for child in children))
    return str(root)


class TestDescendants:

    def test_children_of_every_thread_and_their_children_are_found(self, tmp_path: Path) -> None:
        # given: the main thread started a worker and a forkserver, whose child is a worker; another thread
        # started a third process
        proc = fake_proc(tmp_path, {100: {100: [101, 102], 105: [103]}, 101: {101: []}, 102: {102: [104]},
                                    103: {103: []}, 104: {104: []}})
        # then
        assert sorted(descendants(100, proc)) == [101, 102, 103, 104]  # type: ignore[arg-type]
        assert descendants(102, proc) == [104]
        assert descendants(101, proc) == []

    def test_a_listed_process_gone_since_does_not_stop_the_walk(self, tmp_path: Path) -> None:
        # given: the kernel listed 102, which has exited since (its /proc entry is gone)
        proc = fake_proc(tmp_path, {100: {100: [101, 102]}, 101: {101: []}})
        assert descendants(100, proc) == [101, 102]  # listed, so its RSS is tried (and skipped if it has gone)

    def test_without_the_kernels_children_lists_it_says_so(self, tmp_path: Path) -> None:
        # given: a /proc without task/TID/children (another OS, or a kernel built without them)
        (tmp_path / "100" / "task" / "100").mkdir(parents=True)
        # then: None, so psutil's scan of every process is used instead
        assert descendants(100, str(tmp_path)) is None


class TestHostMemoryCollector:
    @pytest.mark.slow  # holds memory for half a second of real sampling
    @pytest.mark.timing
    def test_an_allocation_held_during_the_run_shows_in_the_peak(self, tmp_path: Path) -> None:
        # given a collector sampling a run that holds 200 MB for half a second, then frees it before stop
        collector = HostMemoryCollector(interval_s=0.05)
        assert collector.unavailable_reason() is None
        collector.start(tmp_path)
        block = b"\x01" * (200 * MB)
        time.sleep(0.5)
        del block
        # when it stops
        memory = _stop(collector)
        # then the sampling thread caught the allocation while it was held
        assert memory.peak_process_bytes - memory.process_bytes[0] >= 150 * MB
        assert memory.peak_bytes >= memory.peak_process_bytes
        assert len(memory.t_s) == len(memory.process_bytes) == len(memory.workers_bytes) >= 5
        assert list(memory.t_s) == sorted(memory.t_s) and memory.t_s[0] == pytest.approx(0.0, abs=0.05)

    @pytest.mark.slow  # forks a real child process
    @pytest.mark.timing
    def test_a_child_process_counts_as_a_worker(self, tmp_path: Path) -> None:
        # given a forked child holding 100 MB while the collector runs
        context = multiprocessing.get_context("fork")
        ready, release = context.Event(), context.Event()
        collector = HostMemoryCollector(interval_s=0.05, children_scan_s=0.05)
        collector.start(tmp_path)
        child = context.Process(target=_hold_memory, args=(100 * MB, ready, release), daemon=True)
        child.start()
        try:
            assert ready.wait(10)
            time.sleep(0.15)
            # when the collector stops while the child is alive
            memory = _stop(collector)
        finally:
            release.set()
            child.join(10)
        # then the child's memory is in the workers' series, and it was counted
        assert memory.max_workers >= 1
        assert memory.peak_workers_bytes >= 90 * MB
        assert max(memory.workers_bytes) == memory.peak_workers_bytes
        assert memory.peak_bytes >= memory.peak_workers_bytes + min(memory.process_bytes)

    @pytest.mark.slow  # two real child processes for 1.5 s
    @pytest.mark.timing
    @pytest.mark.parametrize("spin", [False, True], ids=["waiting", "computing"])
    def test_the_childrens_cpu_time_tells_a_waiting_worker_from_a_computing_one(self, tmp_path: Path,
                                                                                spin: bool) -> None:
        # given a process whose only two (forked) children wait or compute for 1.5 s, scanned every 0.1 s
        script = tmp_path / "children.py"
        script.write_text(CHILDREN)
        done = subprocess.run([sys.executable, str(script), "spin" if spin else "wait"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        cpu_s, runnable_s, watched_s = json.loads(done.stdout)
        # then both were watched for most of their 1.5 s, and the share of it on a CPU or waiting for one (two
        # spinning children on two cores shared with whatever else runs: runnable when not running) tells which
        assert 2.0 <= watched_s <= 3.2
        busy = (cpu_s + runnable_s) / watched_s
        assert busy > 0.8 if spin else busy < 0.1

    def test_a_very_short_run_still_has_a_first_and_a_last_sample(self, tmp_path: Path) -> None:
        collector = HostMemoryCollector(interval_s=10.0)
        collector.start(tmp_path)
        memory = _stop(collector)
        assert len(memory.t_s) >= 2
        assert memory.interval_s == 10.0
        assert min(memory.process_bytes) > 0
        assert memory.max_workers == 0 and memory.peak_workers_bytes == 0

    @pytest.mark.slow  # samples for a real 0.3 s
    @pytest.mark.timing
    def test_a_long_run_stays_bounded_with_a_coarser_interval(self, tmp_path: Path) -> None:
        # given a tiny capacity and a fast interval
        collector = HostMemoryCollector(interval_s=0.005, max_samples=8)
        collector.start(tmp_path)
        time.sleep(0.3)
        memory = _stop(collector)
        # then at most 8 samples are kept, the final one included, and the interval has doubled each time
        assert len(memory.t_s) <= 8
        assert memory.interval_s >= 0.01
        assert memory.interval_s / 0.005 in {2.0**k for k in range(1, 12)}


class TestChildrenCpu:
    def test_each_child_adds_the_cpu_time_and_the_time_between_its_first_and_last_reading(self) -> None:
        cpu = ChildrenCpu()
        cpu.read(0.0, 101, 5.0, 1.0)  # a spawned worker seen after its start-up: 5 s of CPU already
        cpu.read(0.5, 102, 0.2, 0.0)
        cpu.read(1.0, 101, 5.1, 1.2)
        cpu.read(1.0, 102, 0.7, 0.1)
        cpu.read(2.0, 101, 5.3, 1.2)  # 102 has exited: its last reading stands
        cpu.read(2.0, 103, 1.0, 0.5)  # seen once: nothing to measure yet
        assert cpu.totals() == pytest.approx((0.3 + 0.5, 0.2 + 0.1, 2.0 + 0.5))

    def test_a_childs_figures_begin_once_its_start_up_is_behind_it(self) -> None:
        # a worker started by spawn imports torch (busy, on a CPU or waiting for one), then mostly waits
        cpu = ChildrenCpu()
        cpu.read(0.0, 201, 0.1, 0.0)
        cpu.read(0.5, 201, 0.5, 0.05)  # 90% busy: starting
        cpu.read(1.0, 201, 0.9, 0.1)  # 90%
        cpu.read(1.5, 201, 1.0, 0.1)  # 20%: started; its figures begin at 1.0 s
        cpu.read(2.5, 201, 1.5, 0.2)  # a busy second after that counts
        assert cpu.totals() == pytest.approx((0.6, 0.1, 1.5))
        # a child busy throughout keeps every reading
        busy = ChildrenCpu()
        for t in range(4):
            busy.read(t * 0.5, 7, t * 0.4, t * 0.05)
        assert busy.totals() == pytest.approx((1.2, 0.15, 1.5))

    def test_no_child_is_no_time(self) -> None:
        assert ChildrenCpu().totals() == (0.0, 0.0, 0.0)

    def test_the_kernels_schedstat_gives_seconds_on_a_cpu_and_waiting_for_one(self, tmp_path: Path) -> None:
        (tmp_path / "7").mkdir()
        (tmp_path / "7" / "schedstat").write_text("1500000000 250000000 42\n")
        assert schedstat(7, str(tmp_path)) == pytest.approx((1.5, 0.25))
        assert schedstat(8, str(tmp_path)) is None  # exited, or no such statistics: nothing claimed


class TestHelperVerdict:
    RUN = ["/venv/bin/python", "-m", "gpuscope", "run", "train.py"]
    TRACKER = ["/venv/bin/python", "-B", "-c", "from multiprocessing.resource_tracker import main;main(5)"]

    def test_multiprocessings_resource_tracker_and_forkserver_are_helpers_when_direct_children(self) -> None:
        forkserver = ["/venv/bin/python", "-c", "from multiprocessing.forkserver import main; main(8, 9, ['__main__'])"]
        assert helper_verdict(self.TRACKER, self.RUN, 5.0, direct=True) is True
        assert helper_verdict(forkserver, self.RUN, 5.0, direct=True) is True
        # a forkserver's workers share its command line but are its children, not the run's
        assert helper_verdict(forkserver, self.RUN, 5.0, direct=False) is False

    def test_a_child_still_showing_the_runs_command_line_is_judged_only_once_it_is_old_enough(self) -> None:
        # just forked, before its exec: it may yet become the resource tracker
        assert helper_verdict(self.RUN, self.RUN, 0.01, direct=True) is None
        assert helper_verdict(self.TRACKER, self.RUN, 0.02, direct=True) is True
        # a DataLoader worker started by fork shows the run's command line all its life: a worker
        assert helper_verdict(self.RUN, self.RUN, EXEC_GRACE_S, direct=True) is False
        assert helper_verdict(["/venv/bin/python", "-c", "print(1)"], self.RUN, 0.01, direct=True) is False


class TestBoundedSeries:
    def test_thinning_keeps_every_other_sample_from_the_first(self) -> None:
        assert thin(list(range(10))) == [0, 2, 4, 6, 8]
        assert thin([7]) == [7]
        assert thin([]) == []

    def test_a_full_series_halves_and_doubles_its_interval(self) -> None:
        # given a series of at most 8 samples, fed on the schedule its interval sets (as the sampler does)
        series: BoundedSeries[float] = BoundedSeries(interval_s=1.0, max_samples=8)
        t = 0.0
        for _ in range(20):
            series.add(t)
            t += series.interval_s
            # then it never holds more than 8 samples, all evenly spaced at the current interval
            kept = series.samples
            assert len(kept) <= 8
            assert {b - a for a, b in zip(kept, kept[1:])} <= {series.interval_s}
        # and it spans the whole run at a coarser interval (thinned at the 9th, 13th and 17th sample)
        assert series.interval_s == 8.0
        assert series.samples == [0.0, 8.0, 16.0, 24.0, 32.0, 40.0, 48.0, 56.0]

    def test_an_odd_capacity_is_rounded_up_to_keep_the_spacing_even(self) -> None:
        series: BoundedSeries[int] = BoundedSeries(interval_s=1.0, max_samples=5)
        assert series.max_samples == 6

    @pytest.mark.parametrize("interval_s, max_samples", [(0.0, 10), (-1.0, 10), (0.1, 1)])
    def test_nonsense_settings_are_refused(self, interval_s: float, max_samples: int) -> None:
        with pytest.raises(ValueError):
            BoundedSeries(interval_s, max_samples)


class TestPeaks:
    SAMPLES = [
        MemorySample(0.0, 100, 0, 0, 0.5, 0.1, 1000, 0),
        MemorySample(0.1, 300, 50, 2, 0.6, 0.13, 1800, 3),
        MemorySample(0.2, 200, 400, 4, 0.7, 0.16, 2600, 6),
        MemorySample(0.3, 150, 10, 1, 0.8, 0.19, 3400, 9),
    ]

    def test_peaks_are_the_highest_readings_and_the_highest_sum_at_one_sample(self) -> None:
        peaks = peaks_of(self.SAMPLES)
        assert peaks == MemoryPeaks(total_bytes=600, process_bytes=300, workers_bytes=400, workers=4)

    def test_the_record_carries_the_series_and_the_peaks(self) -> None:
        memory = build_host_memory(self.SAMPLES, interval_s=0.1, allocator=("glibc", ("MALLOC_TOP_PAD_",)))
        assert memory == HostMemory(
            interval_s=0.1, peak_bytes=600, peak_process_bytes=300, peak_workers_bytes=400, max_workers=4,
            t_s=(0.0, 0.1, 0.2, 0.3), process_bytes=(100, 300, 200, 150), workers_bytes=(0, 50, 400, 10),
            user_s=(0.5, 0.6, 0.7, 0.8), sys_s=(0.1, 0.13, 0.16, 0.19), minor_faults=(1000, 1800, 2600, 3400),
            steps_seen=(0, 3, 6, 9), page_bytes=os.sysconf("SC_PAGE_SIZE"), allocator="glibc",
            malloc_settings=("MALLOC_TOP_PAD_",),
        )

    def test_peaks_of_thinned_samples_are_not_lost(self) -> None:
        # given peaks from samples that thinning dropped
        earlier = MemoryPeaks(total_bytes=5000, process_bytes=4000, workers_bytes=1000, workers=8)
        memory = build_host_memory(self.SAMPLES[::2], interval_s=0.2, peaks=earlier)
        assert (memory.peak_bytes, memory.peak_process_bytes, memory.peak_workers_bytes, memory.max_workers) == (
            5000, 4000, 1000, 8)
        assert memory.t_s == (0.0, 0.2)


class TestSchedule:
    def test_the_next_sample_is_one_interval_after_the_last_deadline(self) -> None:
        assert next_deadline(10.0, 0.5, now=10.2) == 10.5

    def test_an_overrun_restarts_the_schedule_instead_of_bursting(self) -> None:
        assert next_deadline(10.0, 0.5, now=11.3) == pytest.approx(11.8)
