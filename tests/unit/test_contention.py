"""The run's own process waiting for a core (the kernel's per-thread schedstat, summed): where its threads waited a
fifth of the time they were ready to run or more, the verdict says that the step times hold that wait, and what
else the cores ran (its DataLoader's workers, processes it started, or other programs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import make_record
from gpuscope.collect.children import OwnThreads
from gpuscope.diagnose.classify import classify
from gpuscope.diagnose.contention import contention
from gpuscope.record import HostMemory, Loader, RunMeta, StartedProcess


def schedstat(proc: Path, tid: int, cpu_s: float, waiting_s: float) -> None:
    folder = proc / "100" / "task" / str(tid)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "schedstat").write_text(f"{int(cpu_s * 1e9)} {int(waiting_s * 1e9)} 7\n")


def test_the_threads_times_are_summed_from_the_first_reading_a_thread_that_ends_keeping_its_last(
        tmp_path: Path) -> None:
    # given: the main thread and a torch thread at the first reading
    schedstat(tmp_path, 100, 2.0, 0.1)
    schedstat(tmp_path, 101, 1.0, 0.0)
    own = OwnThreads(100, str(tmp_path))
    own.read()
    # when: both run on, a worker thread begins, and the torch thread ends after one more reading
    schedstat(tmp_path, 100, 5.0, 1.1)
    schedstat(tmp_path, 101, 2.0, 0.5)
    schedstat(tmp_path, 102, 0.5, 0.5)
    own.read()
    (tmp_path / "100" / "task" / "101" / "schedstat").unlink()
    (tmp_path / "100" / "task" / "101").rmdir()
    schedstat(tmp_path, 100, 6.0, 1.1)
    own.read()
    # then: (6 - 2) + (2 - 1) + 0.5 on a CPU, (1.1 - 0.1) + 0.5 + 0.5 waiting
    assert own.totals() == pytest.approx((5.5, 2.0))


def test_no_reading_no_totals(tmp_path: Path) -> None:
    own = OwnThreads(100, str(tmp_path))  # no such process folder: no schedstat here
    own.read()
    assert own.totals() is None


def memory(cpu_s: float, waiting_s: float, *processes: StartedProcess) -> HostMemory:
    return HostMemory(interval_s=0.1, own_cpu_s=cpu_s, own_runnable_s=waiting_s, processes=processes)


def test_a_process_waiting_on_cores_its_workers_share_is_told_what_else_ran_there() -> None:
    # given the data-loading sample with 2 workers on the 2-core machine: 2.7 s waiting against 8.1 s on a CPU
    record = make_record(host_memory=memory(8.1, 2.7), loaders=(Loader(dataset="Images", num_workers=2),),
                         meta=RunMeta(cpu_count=2))
    line = contention(record)
    assert line == ("this process's threads waited for a core 25% of the time they were ready to run (2.7 s, against "
                    "8.1 s on a CPU): the machine's 2 cores also ran its DataLoader's 2 worker processes (and "
                    "whatever else runs there); the step times hold that wait")
    assert line in classify(record).evidence


def test_with_nothing_of_its_own_beside_it_the_cores_were_busy_with_other_programs() -> None:
    # the launch-bound sample beside two busy loops of another program: 13.8 s waiting against 14.8 s on a CPU
    line = contention(make_record(host_memory=memory(14.8, 13.8), meta=RunMeta(cpu_count=2)))
    assert line is not None
    assert "48% of the time" in line and "the machine's 2 cores were busy with other programs too" in line


def test_processes_the_script_started_are_named_among_what_ran() -> None:
    trainers = [StartedProcess(pid=i, target="__main__.train", cpu_s=6.0) for i in (1, 2)]
    line = contention(make_record(host_memory=memory(3.0, 1.0, *trainers), meta=RunMeta(cpu_count=2)))
    assert line is not None and "also ran 2 processes the script started" in line


@pytest.mark.parametrize(("cpu_s", "waiting_s"), [(8.4, 0.03), (1.0, 0.4), (None, None)],
                         ids=["the launch-bound sample alone", "under half a second", "no schedstat"])
def test_little_or_no_waiting_goes_unsaid(cpu_s: float | None, waiting_s: float | None) -> None:
    assert contention(make_record(host_memory=HostMemory(own_cpu_s=cpu_s, own_runnable_s=waiting_s))) is None
