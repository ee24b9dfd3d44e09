"""Work done in processes the script started, which gpuscope does not profile (pytorch/examples' Hogwild trains in
``mp.Process(target=train)`` children): the processes are recorded with what they ran, the line that started them
and their CPU time (DataLoader workers left out: the DataLoader figures cover them), and where they used notable
CPU against the run's own process, the verdict says their work is not in the figures and how to profile one."""

from __future__ import annotations

import concurrent.futures.process
import dataclasses
import json
import multiprocessing
import multiprocessing.pool
from pathlib import Path

import pytest
from conftest import make_record

from gpuscope.collect.children import ProcessThreads
from gpuscope.collect.process_starts import MAX_STARTED, ProcessStarts, describe
from gpuscope.diagnose.child_processes import child_processes
from gpuscope.diagnose.classify import classify
from gpuscope.diagnose.compare import compare
from gpuscope.diagnose.rules import evaluate
from gpuscope.record import CallSite, HostMemory, RunMeta, StartedProcess, Steps
from gpuscope.report.compare_text import summary_lines
from gpuscope.report.render import render_compare

SITE = CallSite(file="hogwild.py", line=93, function="<module>", code="p.start()", calls=1)


def train(rank: int) -> None:
    """A process target of the script's own."""


def _wrap(fn, i, args, error_queue) -> None:
    """Stands for torch.multiprocessing.spawn's ``_wrap``, which each spawned process runs."""


_wrap.__module__ = "torch.multiprocessing.spawn"


def _worker_loop() -> None:
    """Stands for the DataLoader's worker loop."""


_worker_loop.__module__ = "torch.utils.data._utils.worker"


class Trainer(multiprocessing.Process):
    def run(self) -> None:
        """A Process subclass's own run()."""


def test_a_process_is_named_by_the_function_it_runs_and_sorted_by_kind() -> None:
    here = __name__
    assert describe(multiprocessing.Process(target=train, args=(0,))) == (f"{here}.train", "script")
    # torch.multiprocessing.spawn: the function spawned, not its wrapper
    assert describe(multiprocessing.Process(target=_wrap, args=(train, 0, (), None))) == (f"{here}.train", "script")
    assert describe(Trainer()) == (f"{here}.Trainer.run", "script")
    # a library's function (Lightning's ddp_spawn starts its own)
    assert describe(multiprocessing.Process(target=json.dumps)) == ("json.dumps", "library")
    assert describe(multiprocessing.Process(target=_worker_loop))[1] == "dataloader-worker"
    assert describe(multiprocessing.Process(target=multiprocessing.pool.worker)) == (
        "multiprocessing.pool.worker", "pool-worker")
    assert describe(multiprocessing.Process(target=concurrent.futures.process._process_worker)) == (
        "concurrent.futures.process._process_worker", "pool-worker")


class Started:
    """A started process, as ``BaseProcess.start`` leaves it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid


def test_processes_are_recorded_with_their_cpu_time_and_dataloader_workers_left_out() -> None:
    starts = ProcessStarts()
    starts.note(Started(11), f"{__name__}.train", "script", None)
    starts.note(Started(12), "torch.utils.data._utils.worker._worker_loop", "dataloader-worker", None)
    starts.note(Started(13), "multiprocessing.pool.worker", "pool-worker", None)
    recorded = starts.record({11: (4.7444, 1.2), 12: (9.0, 0.0), 13: (2.0, 0.5)}, {13: (3.5, 0.75, 2)})
    # the first thread's figures where its threads were not read; all its threads' where they were, with their count
    assert [(p.pid, p.kind, p.cpu_s, p.runnable_s, p.threads) for p in recorded] == [
        (11, "script", 4.744, 1.2, None), (13, "pool-worker", 3.5, 0.75, 2)]


def test_only_the_first_processes_are_listed_and_the_rest_counted() -> None:
    starts = ProcessStarts()
    for pid in range(MAX_STARTED + 3):
        starts.note(Started(pid), "multiprocessing.pool.worker", "pool-worker", None)
    assert len(starts.record({}, {})) == MAX_STARTED and starts.more == 3


def memory(*processes: StartedProcess, own_s: float = 2.3) -> HostMemory:
    return HostMemory(interval_s=0.1, t_s=(0.0, 8.0), user_s=(0.3, own_s - 0.1), sys_s=(0.0, 0.1),
                      processes=processes)


def trainer(pid: int, cpu_s: float | None, target: str = "__mp_main__.train") -> StartedProcess:
    return StartedProcess(pid=pid, target=target, kind="script", started_at=SITE, start_method="spawn", cpu_s=cpu_s)


def test_trainers_busier_than_the_run_are_named_with_the_line_that_started_them_and_how_to_profile_one() -> None:
    # given two trainers that used 28.7 s of CPU, and the run's own process 2.3 s (its evaluation)
    record = make_record(host_memory=memory(trainer(1, 14.2), trainer(2, 14.5)))
    # then the verdict says so, with the figures, the function and its line
    line = child_processes(record)
    assert line is not None
    assert line.startswith("2 processes the script started used 28.7 s of CPU, 12.5x this process's 2.3 s: ")
    assert "2 ran train, started at hogwild.py:93 `p.start()`, 28.7 s" in line
    assert "their work is not in these figures" in line
    assert "run the body of train inside `with gpuscope.profile():`" in line
    assert line in classify(record).evidence


def test_a_run_that_found_no_step_of_its_own_still_says_where_the_work_went() -> None:
    record = make_record(steps=Steps(), host_memory=memory(trainer(1, 5.0), trainer(2, 5.0)))
    verdict = classify(record)
    assert verdict.bound == "inconclusive"
    assert verdict.evidence[1:] == ("no training step was found in the script's own process",
                                    child_processes(record))
    assert verdict.evidence[2].startswith("2 processes the script started used 10.0 s")


@pytest.mark.parametrize(("cpus", "own_s"), [((0.5, 0.4), 0.5), ((1.0, 0.9), 4.0), ((None, None), 0.5)],
                         ids=["under a second", "under half the run's", "never read"])
def test_processes_that_did_little_go_unsaid(cpus: tuple[float | None, ...], own_s: float) -> None:
    record = make_record(host_memory=memory(*(trainer(i, cpu) for i, cpu in enumerate(cpus)), own_s=own_s))
    assert child_processes(record) is None


def test_processes_running_a_librarys_function_are_told_to_profile_the_users_code_they_run() -> None:
    spawned = [StartedProcess(pid=i, target="lightning.pytorch.strategies.launchers.multiprocessing."
                              "_MultiProcessingLauncher._wrapping_function", kind="library", started_at=SITE, cpu_s=3.0)
               for i in range(2)]
    line = child_processes(make_record(host_memory=memory(*spawned)))
    assert line is not None
    assert "open `with gpuscope.profile():` in the code of yours they run" in line
    assert "the body of lightning" not in line


def test_trainers_waiting_for_cores_are_told_to_share_them_out() -> None:
    # given Hogwild's two trainers on the 2-core machine, each with torch's 2 threads: 15.9 s on a CPU and 12.0 s
    # waiting for one each (with torch.set_num_threads(1): 6.1 s and 0.1 s, the run 30.8 -> 8.4 s)
    crowded = [dataclasses.replace(trainer(i, 15.9), runnable_s=12.0) for i in (1, 2)]
    record = make_record(host_memory=memory(*crowded), meta=RunMeta(cpu_count=2))
    line = child_processes(record)
    assert line is not None
    assert line.endswith(". They waited for a core 43% of the time they were ready to run (24.0 s, against 31.8 s on "
                         "a CPU): 2 processes, each running torch's own threads (by default as many as the cores), "
                         "outnumber the machine's 2 cores; `torch.set_num_threads(1)` at the start of train shares "
                         "them out")
    # and with one thread each they wait 2% of it: nothing said
    shared = [dataclasses.replace(trainer(i, 6.1), runnable_s=0.1) for i in (1, 2)]
    assert "waited for a core" not in (child_processes(make_record(host_memory=memory(*shared))) or "")


def test_one_busy_process_is_told_in_the_singular() -> None:
    line = child_processes(make_record(host_memory=memory(trainer(1, 6.0))))
    assert line is not None and line.startswith("1 process the script started used 6.0 s of CPU, 2.6x this ")


def test_a_pools_workers_are_named_as_such_without_the_profile_advice() -> None:
    pool = [StartedProcess(pid=i, target="multiprocessing.pool.worker", kind="pool-worker", started_at=SITE,
                           cpu_s=3.0) for i in range(4)]
    line = child_processes(make_record(host_memory=memory(*pool)))
    assert line is not None
    assert "4 ran multiprocessing.pool.worker (a process pool's workers)" in line
    assert "gpuscope.profile" not in line


def test_compare_shows_what_the_started_processes_used_and_the_whole_runs_time() -> None:
    # given Hogwild before (two trainers waiting for the cores) and after torch.set_num_threads(1) in each; the main
    # process's own steps (its test pass) alike in both
    before = make_record(host_memory=memory(*(dataclasses.replace(trainer(i, 15.85), runnable_s=12.0) for i in (1, 2))),
                         meta=RunMeta(cpu_count=2, duration_s=30.8))
    after = make_record(host_memory=memory(*(dataclasses.replace(trainer(i, 6.1), runnable_s=0.1) for i in (1, 2))),
                        meta=RunMeta(cpu_count=2, duration_s=8.4))
    comparison = compare(before, after)
    assert comparison.children is not None
    line = ("the processes the script started: on a CPU 31.7 s -> 12.2 s, waiting for a core 24.0 s -> 0.2 s; the "
            "whole run 30.8 s -> 8.4 s (3.67x) (their work is in none of the step figures)")
    assert comparison.children.line() == line
    assert f"  {line}" in summary_lines(comparison)
    page = render_compare(before, after, comparison)
    assert f'<p id="child-work">Besides the steps, {line.replace(">", "&gt;")}.</p>' in page
    # and two runs whose processes did little have no such line
    assert compare(make_record(), make_record()).children is None


def test_a_started_processs_time_is_summed_over_its_threads_and_its_working_threads_counted(tmp_path: Path) -> None:
    # given a trainer's three threads: its first and torch's second near alike, a helper waiting all run
    task = tmp_path / "77" / "task"
    for tid, on_cpu_ns, waiting_ns in ((77, 4_000_000_000, 3_000_000_000), (78, 3_600_000_000, 2_500_000_000),
                                       (79, 20_000_000, 1_000_000)):
        (task / str(tid)).mkdir(parents=True)
        (task / str(tid) / "schedstat").write_text(f"{on_cpu_ns} {waiting_ns} 12\n")
    threads = ProcessThreads(77, str(tmp_path))
    assert threads.totals() is None  # never read
    threads.read()
    assert threads.totals() == pytest.approx((7.62, 5.501, 2))
    # a thread that ends keeps its last reading
    (task / "78" / "schedstat").unlink()
    (task / "78").rmdir()
    threads.read()
    assert threads.totals() == pytest.approx((7.62, 5.501, 2))


def crowded_trainers(n: int, threads: int, cpu_s: float, runnable_s: float) -> list[StartedProcess]:
    return [dataclasses.replace(trainer(i, cpu_s), runnable_s=runnable_s, threads=threads) for i in range(n)]


def test_trainers_with_torchs_threads_each_outnumbering_the_cores_are_told_to_run_fewer() -> None:
    # given Hogwild's two trainers on the 2-core machine, each with torch's 2 threads doing work: 13.1 s on a CPU
    # and 10.5 s waiting for one each (with torch.set_num_threads(1): 5.4 s and 0.2 s, 14.1 -> 6.1 s a run)
    record = make_record(host_memory=memory(*crowded_trainers(2, 2, 13.1, 10.5)), meta=RunMeta(cpu_count=2))
    recommendations, checks = evaluate(record)
    (found,) = [r for r in recommendations if r.id == "fewer-threads-per-process"]
    # then one thread each is advised at the function they run, with their wait as the evidence, and no share of
    # this process's step promised: their time is not its steps'
    assert found.fix == ("`torch.set_num_threads(1)` as the first line of train (started at hogwild.py:93 "
                         "`p.start()`): 2 processes sharing the machine's 2 cores")
    assert found.evidence == (
        "2 processes the script started ran train (started at hogwild.py:93 `p.start()`), 2 threads each doing work, "
        "on the machine's 2 cores: they waited for a core 44% of the time they were ready to run (21.0 s, against "
        "26.2 s on a CPU), 4 threads on 2 cores; this process's step figures do not hold their time",)
    assert found.expected_gain is None
    # and four on 8 cores get two threads each
    wide = make_record(host_memory=memory(*crowded_trainers(4, 8, 13.1, 10.5)), meta=RunMeta(cpu_count=8))
    (found,) = [r for r in evaluate(wide)[0] if r.id == "fewer-threads-per-process"]
    assert found.fix.startswith("`torch.set_num_threads(2)` as the first line of train")


@pytest.mark.parametrize(("n", "threads", "runnable_s"), [(4, 1, 5.0), (2, 2, 1.0)],
                         ids=["one thread each, more processes than cores", "little wait"])
def test_trainers_that_run_as_few_threads_as_fit_or_hardly_wait_are_not_told_to(
        n: int, threads: int, runnable_s: float) -> None:
    # four single-threaded trainers on 2 cores wait half their time whatever their threads: fewer cannot help
    record = make_record(host_memory=memory(*crowded_trainers(n, threads, 5.0, runnable_s)), meta=RunMeta(cpu_count=2))
    assert evaluate(record)[1]["fewer-threads-per-process"].status == "clear"
    assert "waited for a core" not in (child_processes(record) or "")
