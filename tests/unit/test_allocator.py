"""Which allocator serves malloc, which of glibc's malloc settings are set (their names only), and the host memory
sampler's reading of the process's CPU time, page faults and steps beside its memory, and of the training
thread's own CPU time."""

from __future__ import annotations

import os
import platform
import threading
from pathlib import Path

import pytest

from gpuscope.collect.allocator import allocator_in_use, malloc_settings, own_usage, thread_usage
from gpuscope.collect.collectors.memory import HostMemoryCollector
from gpuscope.record import CollectorStatus, HostMemory

MAPS = """\
7f0000000000-7f0000001000 r-xp 00000000 fe:00 11 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000002000-7f0000003000 r-xp 00000000 fe:00 12 /venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so
"""


def test_a_preloaded_allocator_mapped_into_the_process_is_named(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(MAPS + "7f0000004000-7f0000005000 r-xp 00000000 fe:00 13 /usr/lib/libjemalloc.so.2\n")
    assert allocator_in_use(str(maps)) == "jemalloc"
    maps.write_text(MAPS + "7f0000004000-7f0000005000 r-xp 00000000 fe:00 13 /opt/lib/libtcmalloc_minimal.so.4\n")
    assert allocator_in_use(str(maps)) == "tcmalloc"


def test_without_one_it_is_glibc_on_a_glibc_system_and_unknown_without_proc(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(MAPS)
    assert allocator_in_use(str(maps)) == ("glibc" if platform.libc_ver()[0] == "glibc" else "")
    assert allocator_in_use(str(tmp_path / "no-such-file")) == ""


def test_malloc_settings_are_named_never_valued() -> None:
    environ = {"MALLOC_TRIM_THRESHOLD_": "1073741824", "MALLOC_ARENA_MAX": "2", "HOME": "/root",
               "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1073741824", "API_TOKEN": "secret"}
    assert malloc_settings(environ) == ("MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES")
    assert malloc_settings({"GLIBC_TUNABLES": "glibc.rtld.nns=2", "MALLOC_TOP_PAD_": ""}) == ()


class Steps:
    """The step events the sampler reads: how many steps were counted, and the thread they run in."""

    def __init__(self) -> None:
        self.count = 0
        self.thread = threading.get_native_id()

    def steps_seen(self) -> int:
        return self.count

    def loop_thread(self) -> int:
        return self.thread


def following(steps: Steps) -> HostMemoryCollector:
    """A sampler whose only samples are its first and last (at start and stop) and those a test takes, following
    ``steps``."""
    collector = HostMemoryCollector(interval_s=60.0)
    collector.follow(steps)  # type: ignore[arg-type]
    return collector


def fresh_pages(size: int) -> bytearray:
    """``size`` bytes of fresh memory, every page of it faulted in by the calling thread."""
    fresh = bytearray(size)
    fresh[::4096] = b"\x01" * len(range(0, size, 4096))
    return fresh


@pytest.mark.skipif(platform.system() != "Linux", reason="page faults as Linux counts them")
def test_each_sample_reads_the_cpu_time_the_page_faults_and_the_steps_so_far(tmp_path: Path) -> None:
    # given: a sampler whose only samples are its first and last (at start and stop), following the steps
    steps = Steps()
    collector = following(steps)
    collector.start(tmp_path)
    # when: seven steps run, which touch 64 MiB of fresh memory
    fresh = fresh_pages(64 << 20)
    steps.count = 7
    result = collector.stop()
    # then
    assert result.status == CollectorStatus("ok")
    memory: HostMemory = result.payload
    assert memory.steps_seen == (0, 7)
    assert memory.minor_faults[1] - memory.minor_faults[0] >= 0.9 * (64 << 20) / memory.page_bytes
    assert memory.user_s[1] >= memory.user_s[0] > 0 and memory.sys_s[1] >= memory.sys_s[0] > 0
    assert memory.page_bytes > 0
    # and the training thread's own time (this one's: it started the sampler), in which it faulted those pages in
    assert len(memory.thread_user_s) == len(memory.thread_sys_s) == len(memory.thread_runnable_s) == 2
    assert memory.sys_s[1] - memory.sys_s[0] + 0.02 >= memory.thread_sys_s[1] - memory.thread_sys_s[0] >= 0.01
    assert memory.allocator in ("glibc", "jemalloc", "tcmalloc", "mimalloc", "")
    del fresh


def test_the_process_cpu_time_grows() -> None:
    before = own_usage()
    sum(i * i for i in range(200_000))
    after = own_usage()
    assert after[0] + after[1] > before[0] + before[1]
    assert after[2] >= before[2]


def test_a_threads_cpu_time_is_read_from_its_stat_whatever_its_name_holds(tmp_path: Path) -> None:
    # /proc/self/task/TID/stat: the name in parentheses may hold spaces and parentheses; utime and stime are the
    # 14th and 15th fields, in clock ticks (100 a second on Linux)
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    task = tmp_path / "self" / "task" / "4242"
    task.mkdir(parents=True)
    (task / "stat").write_text("4242 (pt main (x) 1) R 1 4242 4242 0 -1 4194560 9079 0 0 0 1234 56 0 0 20 0 3 0\n")
    assert thread_usage(4242, str(tmp_path)) == (1234 / ticks, 56 / ticks)
    assert thread_usage(4243, str(tmp_path)) is None


@pytest.mark.skipif(platform.system() != "Linux", reason="threads' CPU time as Linux counts it")
def test_the_training_threads_time_is_the_one_the_steps_run_in(tmp_path: Path) -> None:
    # given: a script training in a thread of its own while the thread that started gpuscope waits for it
    steps = Steps()
    collector = following(steps)
    collector.start(tmp_path)

    def train() -> None:
        steps.thread = threading.get_native_id()  # the steps collector follows it (LoopThread.adopt)
        collector._sample(rescan=False)  # readings while it runs, as the sampler's own thread would take them
        fresh = fresh_pages(256 << 20)  # kernel time, this thread's
        collector._sample(rescan=False)
        del fresh
        steps.count = 5

    trainer = threading.Thread(target=train)
    trainer.start()
    trainer.join()
    memory = collector.stop().payload
    # then: the readings taken in training count its faults (the one at the end, its own too: it freed them after)
    assert len(memory.thread_sys_s) == 4
    assert memory.thread_sys_s[2] - memory.thread_sys_s[1] >= 0.01


@pytest.mark.skipif(platform.system() != "Linux", reason="threads as Linux lists them")
def test_a_loop_thread_that_has_ended_keeps_its_last_reading(tmp_path: Path) -> None:
    steps = Steps()
    collector = following(steps)
    gone = max(int(tid) for tid in os.listdir("/proc/self/task")) + 100_000  # no such thread
    steps.thread = gone
    assert collector._loop_thread_times() == (None, None, None)  # never read
    collector._thread_times = (gone, (1.5, 0.25, 0.125))  # read while it ran
    assert collector._loop_thread_times() == (1.5, 0.25, 0.125)
