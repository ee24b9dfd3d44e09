"""The loader probe: batches per second for several worker counts, bounded in time, leaving no trace; and the
``more-dataloader-workers`` rule's worker count from its curve."""

from __future__ import annotations

import dataclasses
import gc
import random
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from conftest import make_record
from gpuscope.diagnose.evidence import batches_per_step
from gpuscope.diagnose.rules import evaluate
from gpuscope.diagnose.rules.dataloader import file_system_sharing, more_dataloader_workers
from gpuscope.diagnose.speed import loader_plan, what_if
from gpuscope.collect.collectors.loader_probe import (
    LoaderProbeCollector,
    ProbeSampler,
    affordable_configs,
    probe_batch_size,
    probe_loader,
    worker_counts,
)
from gpuscope.collect.framework.probing import unseen
from gpuscope.collect.loader_timing import MIN_TIMED_S, close_workers, remove_shared_files, time_sampler
from gpuscope.record import Breakdown, CallSite, Loader, LoaderProbe, LoaderRate, RunMeta, Steps, Verdict
from gpuscope.session import post_run_facts

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")


class Squares(torch.utils.data.Dataset):
    """Draws from every global RNG while building an item, and prints: the probe must hide both."""

    def __init__(self, n: int = 64, sleep_s: float = 0.0) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        print("fetching", i)
        return torch.full((4,), float(i)) + torch.rand(4) + float(np.random.rand()) + random.random()


class Unpicklable(Squares):
    def __init__(self) -> None:
        super().__init__()
        self.transform = lambda x: x  # a lambda cannot be pickled for spawn workers


class Failing(Squares):
    def __getitem__(self, i: int) -> Any:
        raise KeyError("missing.jpg")


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self) -> Any:
        return iter(range(10))


def finished_run(dataset: Any, iterable: bool = False, data_wait: float = 0.5, median_s: float = 0.02) -> Any:
    """What the stage tells the probe of a finished run whose steps waited on ``dataset``'s loader."""
    info = {"dataset": type(dataset).__name__, "num_workers": 0, "batch_size": 4, "iterable": iterable,
            "start_method": None}
    loader = {"info": info, "batches": 10, "wait_s": 0.01, "dataset": dataset, "collate_fn": None,
              "drop_last": False, "worker_init_fn": None}
    return post_run_facts(data_wait=data_wait, median_s=median_s, steps=10, loader=loader)


def rng_states() -> tuple[Any, ...]:
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()


def test_worker_counts_double_up_to_the_cores() -> None:
    assert worker_counts(1) == [0, 1]
    assert worker_counts(2) == [0, 1, 2]
    assert worker_counts(6) == [0, 1, 2, 4, 6]
    assert worker_counts(64) == [0, 1, 2, 4, 8, 16, 32]


def test_the_probe_draws_enough_items_from_a_dataset_of_one_batch_and_never_materialises_a_huge_one() -> None:
    # given: a dataset of one batch (seen on an H100: batch 4096 of 4096 items ran out after one batch), and one
    # claiming 10^12 items
    small, huge = ProbeSampler(4096, 4096, batches=8), ProbeSampler(10**12, 32, batches=8)
    # then: each gives its batches' worth of valid indices, drawn one at a time, the same each time
    assert len(small) == len(list(small)) == 8 * 4096
    assert all(0 <= i < 4096 for i in small)
    assert len(list(huge)) == 256 and all(0 <= i < 10**12 for i in huge)
    assert list(huge) == list(huge)
    assert not isinstance(iter(huge), list)


def item_warning(text: str) -> None:
    """A dataset's item warning from one line, as Python's default filter shows it: once for each text."""
    warnings.warn(text, UserWarning)


def test_a_probe_shows_none_of_the_scripts_warnings_and_shows_none_again_after_it(shown: list[str]) -> None:
    # given a warning the script has shown
    item_warning("shown before the probe")
    # when a probe calls the script's dataset, which warns that again and one more
    with unseen():
        item_warning("shown before the probe")
        item_warning("first met in the probe")
    # and the script goes on, warning both
    item_warning("shown before the probe")
    item_warning("first met in the probe")
    # then the probe showed neither, the one shown before is not shown again, the other is shown the first time the
    # script itself meets it
    assert shown == ["shown before the probe", "first met in the probe"]


@pytest.mark.slow  # starts real DataLoader workers
@pytest.mark.timing
def test_the_probe_times_worker_counts_and_leaves_rng_and_output_untouched(capfd: pytest.CaptureFixture[str]) -> None:
    # given
    before = rng_states()
    # a budget with room for a worker's start on a busy runner (CI's once took the 0.7 s slot of a 2 s budget); the
    # probe stops at the first count that keeps up, so the room costs nothing on a quiet machine
    collector = LoaderProbeCollector(budget_s=6.0)
    # when
    result = collector.run(Path("."), finished_run(Squares()))
    # then
    assert result.status.status == "ok", result.status.reason
    probe = result.payload
    assert [r.num_workers for r in probe.rates][:2] == [0, 1]
    assert all(r.batches_per_s and r.batches_per_s > 0 for r in probe.rates)
    # batches of a millisecond: each worker count is timed for about 0.4 s after its first round (MIN_TIMED_S),
    # not for 3 rounds, a few milliseconds that a hiccup of the machine would make the rate
    assert MIN_TIMED_S == 0.4
    assert all(r.batches / r.batches_per_s >= 0.35 for r in probe.rates if r.num_workers), probe.rates
    # receiving a batch from a worker costs the main process some CPU, under the batch's whole time
    assert all(0 < r.handover_s < 1 / r.batches_per_s for r in probe.rates if r.num_workers), probe.rates
    assert all(r.handover_s is None for r in probe.rates if not r.num_workers)
    assert probe.consume_batches_per_s == pytest.approx(1 / 0.01)
    assert "not applicable" in probe.pin_memory_note  # a CPU-only run
    assert rng_states() == before
    assert "fetching" not in capfd.readouterr().out


@pytest.mark.slow  # starts a real DataLoader worker
def test_a_worker_killed_holding_the_loaders_shutdown_lock_does_not_hang_the_probe() -> None:
    # given: the probe's loader, one of whose workers was killed (the probe kills them, not drains them) while it
    # held the lock of the event torch's shutdown sets, as inside Event.is_set() in its loop: the lock stays held
    # for good (the slow tier hung in torch's Event.set() for 50 minutes once)
    iterator = iter(torch.utils.data.DataLoader(Squares(), batch_size=4, num_workers=1))
    next(iterator)
    killed = threading.Thread(target=iterator._workers_done_event._cond.acquire)  # held by a thread that ends
    killed.start()
    killed.join()
    # when the probe closes the loader
    closing = threading.Thread(target=close_workers, args=(iterator,), daemon=True)
    closing.start()
    closing.join(timeout=30)
    # then it is closed, its worker gone
    assert not closing.is_alive(), "close_workers hung in torch's shutdown"
    assert not any(worker.is_alive() for worker in iterator._workers)


@pytest.mark.slow  # starts real DataLoader workers
def test_workers_killed_under_the_file_system_strategy_leave_no_shared_memory_behind() -> None:
    # given: the probe's loader under the file_system sharing strategy (the probe times it when handing batches over
    # waits on the workers), whose workers have filled their prefetch queue: each queued batch is a named file in
    # /dev/shm, which torch removes when the batch is received, and no one does for a worker killed before that
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm here")
    sharing = torch.multiprocessing
    strategy = sharing.get_sharing_strategy()
    sharing.set_sharing_strategy("file_system")
    try:
        iterator = iter(torch.utils.data.DataLoader(Squares(), batch_size=4, num_workers=2))
        next(iterator)
        time.sleep(0.5)
        pids = [worker.pid for worker in iterator._workers]
        # when the probe closes the loader
        close_workers(iterator)
        del iterator  # the batches it had received and held: torch removes their files as they go
        gc.collect()
    finally:
        sharing.set_sharing_strategy(strategy)
    # then none of the files its workers made is left: they would hold the memory until the machine restarts
    assert [f.name for f in shm.iterdir() if f.name.startswith(tuple(f"torch_{pid}_" for pid in pids))] == []


def test_only_files_of_the_gone_workers_that_this_process_does_not_map_are_removed(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    for name in ("torch_11_5_0", "torch_11_6_1", "torch_12_7_0", "torch_110_8_0", "sem.mp-x"):
        (shm / name).write_bytes(b"")
    maps = tmp_path / "maps"  # this process still holds a batch of worker 11's: torch removes that file itself
    maps.write_text(f"7f00-7f01 rw-s 00000000 00:1b 77 {shm / 'torch_11_6_1'}\n"
                    "7f02-7f03 r-xp 00000000 fe:00 5 /lib/x.so\n")
    assert remove_shared_files([11], str(shm), str(maps)) == 1
    assert sorted(f.name for f in shm.iterdir()) == ["sem.mp-x", "torch_110_8_0", "torch_11_6_1", "torch_12_7_0"]
    assert remove_shared_files([], str(shm), str(maps)) == 0
    assert remove_shared_files([11], str(tmp_path / "none"), str(maps)) == 0  # not Linux: nothing was named


@pytest.mark.slow  # a dataset that sleeps, timed for its whole budget
@pytest.mark.timing
def test_the_probe_keeps_to_its_time_bound_with_a_slow_dataset() -> None:
    # given: 50 ms an item, 4 items a batch: 200 ms a batch in one process
    dataset = Squares(sleep_s=0.05)
    # when
    started = time.perf_counter()
    probe = probe_loader(torch, dataset, batch_size=4, cores=2, budget_s=1.5)
    elapsed = time.perf_counter() - started
    # then: within the bound, give or take the workers' shutdown
    assert elapsed <= 1.5 + 0.5
    assert probe.elapsed_s <= 1.5 + 0.5
    assert probe.rates[0].batches_per_s == pytest.approx(5.0, rel=0.5)


def test_where_the_run_timed_long_batches_the_probe_loads_fewer_items_a_batch() -> None:
    # about PROBE_BATCH_S (200 ms) a probe batch, at least one item, never more than the run's batch
    assert probe_batch_size(32, 0.4) == 16
    assert probe_batch_size(16, 0.66) == 5
    assert probe_batch_size(16, 10.0) == 1
    # batches already short, or not timed in the run (workers), or of no fixed size: the run's batch as it is
    assert probe_batch_size(32, 0.15) == 32
    assert probe_batch_size(32, None) == 32
    assert probe_batch_size(None, 0.5) is None


@pytest.mark.slow  # a dataset that sleeps, timed with real workers
@pytest.mark.timing
def test_small_probe_batches_give_rates_per_batch_of_the_runs_size() -> None:
    # given: 100 ms an item, 8 items a batch, and the run measured 800 ms a batch in the main process over 30
    dataset = Squares(sleep_s=0.1)
    # when
    probe = probe_loader(torch, dataset, batch_size=8, cores=2, budget_s=1.5, main_batch_s=0.8, main_batch_batches=30)
    # then: batches of two items (about PROBE_BATCH_S) were loaded, the 0-worker rate is the run's own, and one
    # worker's rate is per batch of 8 items: 1.25 a second, as the run's own batches
    assert probe.probe_batch_size == 2
    zero, one = probe.rates[0], probe.rates[1]
    assert (zero.num_workers, zero.batches_per_s, zero.batches) == (0, pytest.approx(1.25), 30)
    assert "not timed again" in zero.note
    assert one.num_workers == 1 and one.batches_per_s == pytest.approx(1.25, rel=0.5)
    assert probe.elapsed_s <= 1.5 + 0.5


@pytest.mark.slow  # times a real loader for its budget
@pytest.mark.timing
def test_an_unpicklable_dataset_under_spawn_is_timed_in_the_main_process_only_with_a_note() -> None:
    probe = probe_loader(torch, Unpicklable(), batch_size=4, start_method="spawn", cores=4, budget_s=1.0)
    assert [r.num_workers for r in probe.rates] == [0]
    assert "cannot be pickled" in probe.note and "spawn" in probe.note


def test_an_iterable_dataset_is_not_probed_and_says_why() -> None:
    result = LoaderProbeCollector().run(Path("."), finished_run(Stream(), iterable=True))
    assert result.status.status == "unavailable"
    assert "IterableDataset" in result.status.reason and "get_worker_info" in result.status.reason


def test_a_dataset_that_raises_is_a_note_not_a_crash() -> None:
    result = LoaderProbeCollector(budget_s=1.0).run(Path("."), finished_run(Failing()))
    assert result.status.status == "unavailable"
    assert "KeyError" in result.status.reason and "missing.jpg" in result.status.reason


@pytest.mark.slow  # the forced probe starts real DataLoader workers
@pytest.mark.timing
def test_little_data_wait_is_not_probed_unless_forced() -> None:
    run = finished_run(Squares(), data_wait=0.01)
    assert LoaderProbeCollector().run(Path("."), run).status.status == "unavailable"
    assert LoaderProbeCollector(forced=True, budget_s=1.0).run(Path("."), run).status.status == "ok"


def probed_record(rates: dict[int, float], device: str = "cuda") -> Any:
    probe = LoaderProbe(dataset="Images", batch_size=32, rates=tuple(LoaderRate(n, False, r, 8) for n, r in
                                                                     rates.items()),
                        consume_batches_per_s=20.0, main_threads=1)
    return make_record(
        device=device,
        steps=Steps(count=40, median_s=0.1, total=42, source="optimizer"),
        breakdown=Breakdown(data_wait=0.5, forward=0.3, backward=0.2),
        loaders=(Loader(dataset="Images", num_workers=0, batch_size=32, batches=40, wait_s=2.0),),
        meta=RunMeta(cpu_count=8), loader_probe=probe)


def test_the_rule_names_the_fewest_measured_workers_that_keep_up() -> None:
    # given: the step computes for 50 ms (20 batches/s); 2 workers deliver 23/s, at least 10% more
    record = probed_record({0: 10.0, 1: 12.0, 2: 23.0, 4: 40.0})
    # when
    finding = more_dataloader_workers(record)
    # then: the step becomes max(compute 50 ms, 1/23 s) = 50 ms: half the 100 ms step is saved
    assert finding is not None
    assert "num_workers=2" in finding.fix
    assert finding.gain == pytest.approx(0.5)
    assert any("2: 23.0" in fact and "4: 40.0" in fact for fact in finding.evidence)
    assert any("20.0 batches/s" in fact for fact in finding.evidence)


def test_when_no_worker_count_keeps_up_the_rule_names_the_fastest() -> None:
    record = probed_record({0: 5.0, 1: 6.0, 2: 11.0, 4: 15.0})
    finding = more_dataloader_workers(record)
    assert finding is not None and "num_workers=4" in finding.fix
    assert finding.gain == pytest.approx(1 - (1 / 15.0) / 0.1)
    assert any("no measured worker count keeps up" in fact for fact in finding.evidence)
    # 4 workers deliver 15 batches/s, far from 4x the one-worker 6: the workers do not scale here
    assert any(fact.startswith("loading cannot be hidden on this machine") and "workers that scale" in fact
               and "cheaper batches" in fact for fact in finding.evidence)


def test_when_the_cores_are_too_few_to_keep_up_the_rule_says_how_many_would() -> None:
    # given: 2 cores; a worker delivers 6 batches/s, and the step consumes 20 (22 with the margin)
    record = probed_record({0: 5.0, 1: 6.0, 2: 11.0})
    record = dataclasses.replace(record, meta=RunMeta(cpu_count=2))
    finding = more_dataloader_workers(record)
    assert finding is not None
    assert any("about 4 workers at the one-worker rate (6.0 batches/s) and a core for the step, so more than the "
               "2 cores here" in fact for fact in finding.evidence)


def test_on_a_cpu_run_the_prediction_counts_the_cores_the_workers_share() -> None:
    # given: 2 cores; the run had no workers, so its main process built each batch itself: 50 ms of its 100 ms step
    # over 40 batches; the step computes for 50 ms on 1 thread; the probe timed one worker at only 6 batches/s
    # (167 ms a batch, a few rounds on a shared machine) and two at 11/s (91 ms)
    record = dataclasses.replace(probed_record({0: 20.0, 1: 6.0, 2: 11.0}, device="cpu"), meta=RunMeta(cpu_count=2))
    # when
    plan = loader_plan(record)
    finding = more_dataloader_workers(record)
    # then: a step's CPU work is the run's 50 ms batch and its 50 ms of compute, on 2 cores: at least 50 ms; the
    # probe's two workers then bound the step at 91 ms (the probe's one-worker time would have said 108 ms)
    assert plan is not None and plan.shared_cpu_s == pytest.approx(0.05)
    assert plan.step_s == pytest.approx(1 / 11.0)
    assert finding is not None and finding.gain == pytest.approx(1 - (1 / 11.0) / 0.1)
    assert any("share 2 cores" in fact for fact in finding.evidence)


def test_on_a_cpu_run_whose_threads_and_workers_outnumber_the_cores_the_fix_keeps_the_threads_the_workers_leave(
) -> None:
    # given: 6 cores and torch's default of 6 intra-op threads in the main process; 2 workers keep up (23 batches/s
    # for the 20 the step consumes)
    base = probed_record({0: 10.0, 1: 12.0, 2: 23.0, 4: 40.0}, device="cpu")
    probe = dataclasses.replace(base.loader_probe, main_threads=6)
    record = dataclasses.replace(base, meta=RunMeta(cpu_count=6), loader_probe=probe)
    # when
    plan = loader_plan(record)
    finding = more_dataloader_workers(record)
    # then: 2 workers, and the step's compute on the 4 cores they leave (50 ms on 6 threads, 75 ms on 4): the fix
    # names both lines, as the prediction assumes them (6 threads and 2 busy workers on 6 cores stall each other)
    assert plan is not None and (plan.workers, plan.threads) == (2, 4)
    assert plan.step_s == pytest.approx(0.075)
    assert finding is not None
    assert finding.fix == "DataLoader(..., num_workers=2, persistent_workers=True)  and  torch.set_num_threads(4)"
    assert any("torch.set_num_threads(4)" in fact and "6 intra-op threads" in fact for fact in finding.evidence)
    # with threads enough to spare a core per worker (8 cores), or on a GPU run, the thread count is left alone
    roomy = dataclasses.replace(record, meta=RunMeta(cpu_count=8))
    assert loader_plan(roomy).threads is None  # type: ignore[union-attr]
    assert "set_num_threads" not in more_dataloader_workers(roomy).fix  # type: ignore[union-attr]
    on_gpu = dataclasses.replace(record, device="cuda")
    assert loader_plan(on_gpu).threads is None  # type: ignore[union-attr]
    # but on 4 cores, 2 workers leave 2 of the 4 threads: the compute's 50 ms become 100, the step's whole 100 ms
    # now; nothing is gained, and nothing is advised
    tight = dataclasses.replace(record, meta=RunMeta(cpu_count=4),
                                loader_probe=dataclasses.replace(probe, main_threads=4))
    assert loader_plan(tight).step_s == pytest.approx(0.1)  # type: ignore[union-attr]
    assert more_dataloader_workers(tight) is None


def test_workers_whose_batches_cost_the_main_process_more_to_receive_than_they_save_are_not_advised() -> None:
    # given: a 2.4 ms step waiting 0.35 ms for each batch its main process builds (2884 batches/s); one worker
    # delivers 689 batches/s, but receiving each of its batches costs the main process 0.6 ms of CPU
    base = probed_record({0: 2884.0, 1: 689.0}, device="cpu")
    rates = tuple(dataclasses.replace(r, handover_s=0.0006 if r.num_workers else None) for r in base.loader_probe.rates)
    record = dataclasses.replace(
        base, steps=Steps(count=40, median_s=0.0024, total=42, source="optimizer"),
        breakdown=Breakdown(data_wait=0.146, forward=0.5, backward=0.354),
        loaders=(Loader(dataset="Images", num_workers=0, batch_size=32, batches=40, wait_s=0.014),),
        meta=RunMeta(cpu_count=2), loader_probe=dataclasses.replace(base.loader_probe, rates=rates))
    # then: the step would be its 2.05 ms of compute and the 0.6 ms hand-over: longer than the 2.4 ms it is
    assert loader_plan(record).step_s == pytest.approx(0.0024 * (1 - 0.146) + 0.0006)  # type: ignore[union-attr]
    assert more_dataloader_workers(record) is None
    # where receiving costs little, the worker is advised, and the hand-over is part of the evidence
    cheap = tuple(dataclasses.replace(r, handover_s=0.0001 if r.num_workers else None) for r in rates)
    finding = more_dataloader_workers(dataclasses.replace(
        record, loader_probe=dataclasses.replace(record.loader_probe, rates=cheap)))
    assert finding is not None and "num_workers=1" in finding.fix
    assert any("costs the main process 0.10 ms of CPU" in fact for fact in finding.evidence)


def handing_over(record: Any, cpu_s: float, wall_s: float) -> Any:
    """``record`` whose probed worker counts took ``cpu_s`` of the main process's CPU (``handover_s``) and ``wall_s``
    (``receive_s``) to hand over each built batch."""
    rates = tuple(dataclasses.replace(r, handover_s=cpu_s, receive_s=wall_s) if r.num_workers else r
                  for r in record.loader_probe.rates)
    return dataclasses.replace(record, loader_probe=dataclasses.replace(record.loader_probe, rates=rates))


def taken_at_once(record: Any, back_to_back: int = 120) -> Any:
    """``record`` with its loader's batches taken four at a time: three of each four back to back (the Trainer takes
    a step's accumulated batches first)."""
    return dataclasses.replace(record, loaders=(dataclasses.replace(record.loaders[0], back_to_back=back_to_back),))


def test_a_hand_over_that_waits_for_a_busy_worker_counts_for_the_batches_a_step_takes_back_to_back() -> None:
    # given (recorded: the transformers Trainer, 4 batches a step taken at once, through a Python collate of 8 ms a
    # batch, 45 ms of compute): one worker delivers 113 batches/s, which keeps up by throughput, but receiving each
    # batch it built took 9.2 ms while it built the next (0.83 ms of it CPU)
    base = handing_over(accumulating_record({0: 119.0, 1: 112.9}), cpu_s=0.00083, wall_s=0.0092)
    record = taken_at_once(dataclasses.replace(base, meta=RunMeta(cpu_count=2)))
    # then the step predicted is its 50 ms of compute, the first batch's 0.83 ms of CPU and three 9.2 ms hand-overs
    # (78.4 ms), not the 50 ms that the worker's throughput alone gives
    plan = loader_plan(record)
    assert plan is not None and plan.step_s == pytest.approx(0.05 + 0.00083 + 3 * 0.0092)
    finding = more_dataloader_workers(record)
    assert finding is not None
    assert any("receiving a batch the workers have built takes the main process 9.20 ms" in fact
               and "for the 75% of its batches the loop takes back to back (28.4 ms a step)" in fact
               for fact in finding.evidence), finding.evidence
    # batches asked for one at a time, after compute, find the worker idle: the CPU time alone counts (a Lightning
    # loop of one batch a step measured 1 worker as fast with either sharing strategy), as in an older record
    apart = loader_plan(taken_at_once(record, back_to_back=0))
    assert apart is not None and apart.step_s == pytest.approx(0.05 + 4 * 0.00083)


def trainer_fed(file_system_receive_s: float) -> Any:
    """The Trainer loop above, built by transformers at train.py:43, probed: one worker hands its built batches over
    in 9.4 ms, and again with the file_system strategy in ``file_system_receive_s``."""
    record = handing_over(accumulating_record({0: 119.0, 1: 112.9}), cpu_s=0.0005, wall_s=0.0094)
    again = LoaderRate(1, False, 119.3, 48, handover_s=0.0005, receive_s=file_system_receive_s)
    site = CallSite(file="train.py", line=43, code="trainer.train()")
    loaders = (dataclasses.replace(record.loaders[0], created_at=site, created_by="transformers"),)
    return taken_at_once(dataclasses.replace(record, meta=RunMeta(cpu_count=2), loaders=loaders,
                                             loader_probe=dataclasses.replace(record.loader_probe, file_system=again)))


def test_where_handing_batches_over_waits_on_the_workers_the_file_system_strategy_is_advised_as_timed() -> None:
    record = trainer_fed(file_system_receive_s=0.0007)
    finding = file_system_sharing(record)
    # then: the step with it is 50 ms of compute, a first batch's 0.5 ms of CPU and three 0.7 ms hand-overs, against
    # 78.7 ms without it
    step = 0.05 + 0.0005 + 3 * 0.0007
    assert finding is not None
    assert finding.gain == pytest.approx(1 - step / 0.1)
    assert any("took 9.4 ms while they built the next" in fact for fact in finding.evidence), finding.evidence
    assert any("with the file_system strategy it took 0.7 ms" in fact for fact in finding.evidence)
    # and one worker holding 2 prefetched batches of the 4 a step takes at once is given a prefetch of 4
    assert finding.fix == ('torch.multiprocessing.set_sharing_strategy("file_system")  # before the DataLoader starts '
                           "its workers; then TrainingArguments(..., dataloader_num_workers=1, "
                           "dataloader_prefetch_factor=4) at transformers, called from train.py:43")
    # and the what-if is that step
    estimate = what_if(record, Verdict("data-loading", 0.9, ("50%",)))
    assert estimate is not None and estimate.step_s == pytest.approx(step)
    assert estimate.explanation.startswith("with 1 DataLoader worker handing batches over by file_system, measured")
    # where the strategy hands batches over no faster, it is not advised
    assert file_system_sharing(trainer_fed(file_system_receive_s=0.009)) is None


def test_a_file_system_timing_of_its_first_round_only_is_no_comparison_with_whole_rounds_without_it() -> None:
    # given (seen on a bucketed text loader: 2 workers timed over whole rounds at 60 batches/s, each batch handed
    # over in 6.2 ms; the file_system timing, left 0.4 s of the budget, saw its first round only, start-up
    # included, which the analysis completes from the run's batch time: 109 batches/s, "1.68x faster")
    record = trainer_fed(file_system_receive_s=0.0007)
    first_round = dataclasses.replace(record.loader_probe.file_system, batches_per_s=4.2, batches=1, receive_s=None,
                                      note="from the first round only, start-up included (a lower bound)")
    record = dataclasses.replace(record, loader_probe=dataclasses.replace(record.loader_probe,
                                                                          file_system=first_round))
    # then: an estimate of ideal workers set against a measurement is no comparison: not advised
    assert loader_plan(record, file_system=True) is not None
    assert file_system_sharing(record) is None


def test_a_file_system_timing_whose_hand_over_was_not_timed_says_so() -> None:
    record = trainer_fed(file_system_receive_s=0.0007)
    untimed = dataclasses.replace(record.loader_probe.file_system, receive_s=None)
    finding = file_system_sharing(dataclasses.replace(
        record, loader_probe=dataclasses.replace(record.loader_probe, file_system=untimed)))
    assert finding is not None
    assert any("with the file_system strategy its hand-over was not timed (119.3 batches/s)" in fact
               for fact in finding.evidence), finding.evidence


def test_once_a_hand_over_waits_the_budget_left_keeps_a_slot_for_the_file_system_timing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a 3 s budget on 2 cores (0, 1 and 2 workers; 0 taken from the run); every configuration uses its whole
    # slot, and never keeps up; one worker's built batches wait 6 ms to be handed over (0.5 ms of CPU)
    now = [0.0]
    slots: list[tuple[int, str, float]] = []

    def timing(loader: Any, workers: int, pin: bool, slot_s: float, clock: Any) -> LoaderRate:
        slots.append((workers, torch.multiprocessing.get_sharing_strategy(), slot_s))
        now[0] += slot_s
        received = 0.006 if workers == 1 else None  # 2 workers' slot ends before their hand-over is timed
        return LoaderRate(workers, pin, 5.0 * workers, 8, handover_s=0.0005, receive_s=received)

    def shm_manager(torch: Any) -> None:  # the file_system strategy's manager starts in 0.3 s
        now[0] += 0.3

    monkeypatch.setattr("gpuscope.collect.collectors.loader_probe.time_config", timing)
    monkeypatch.setattr("gpuscope.collect.collectors.loader_probe.start_shm_manager", shm_manager)
    probe = probe_loader(torch, Squares(), batch_size=4, cores=2, consume_batches_per_s=100.0, budget_s=3.0,
                         main_batch_s=0.01, main_batch_batches=10, clock=lambda: now[0])
    # then: 1 worker gets half (the budget split over 1 and 2 workers); its hand-over waited, so 2 workers get half
    # of the 1.5 s left, not all of it, and the file_system timing of 2 workers (the last count) the other half, its
    # shared-memory manager's start-up not taken from it: the probe ends that much past its budget
    assert [(n, strategy) for n, strategy, _ in slots] == [
        (1, "file_descriptor"), (2, "file_descriptor"), (2, "file_system")]
    assert [slot for *_, slot in slots] == pytest.approx([1.5, 0.75, 0.75])
    assert probe.elapsed_s == pytest.approx(3.0 + 0.3)
    assert probe.file_system is not None and probe.file_system.num_workers == 2


class PythonCollated(torch.utils.data.Dataset):
    """Items whose collation is pure Python for about 8 ms a batch (a tokenizer written in Python), returning four
    tensors: a worker building a batch holds its GIL all the while."""

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> int:
        return index

    @staticmethod
    def collate(items: list[int]) -> dict[str, torch.Tensor]:
        deadline = time.perf_counter() + 0.008
        while time.perf_counter() < deadline:
            sum(range(200))
        ids = torch.tensor(items)
        return {"a": ids, "b": ids + 1, "c": ids + 2, "d": ids + 3}


@pytest.mark.slow  # starts real DataLoader workers
@pytest.mark.timing
def test_the_probe_times_the_hand_over_of_a_built_batch_while_the_worker_builds_the_next() -> None:
    # given: a step of 4 batches consuming 25 a second, which one worker keeps up with
    for _ in range(3):  # (in a slow hour the main process's hand-over CPU swells: twice in CI, 4.6 and 2.2 ms, the
        # wait 12.7 and 1.6 ms; a probe whose every try fails is a real failure)
        probe = probe_loader(torch, PythonCollated(), batch_size=16, collate_fn=PythonCollated.collate, cores=2,
                             consume_batches_per_s=25.0, budget_s=2.0)
        one = next(r for r in probe.rates if r.num_workers == 1)
        assert one.receive_s is not None and one.handover_s is not None
        if one.receive_s > 3 * one.handover_s and one.receive_s > 0.002:
            break
    # then: each built batch's four tensors wait for the busy worker: milliseconds, several times the main
    # process's CPU for it; so the same worker count is timed again with the file_system strategy (how much faster
    # varies with the machine's load: 0.7 ms here alone, 5.6 ms once under CI, against 9-11 ms), which is put back
    assert one.receive_s > 3 * one.handover_s and one.receive_s > 0.002, one
    assert probe.file_system is not None and probe.file_system.num_workers == 1
    assert probe.file_system.batches_per_s and probe.file_system.receive_s is not None, probe
    assert torch.multiprocessing.get_sharing_strategy() == "file_descriptor"


def test_without_a_batch_timed_in_the_main_process_a_batchs_cpu_is_the_probes_one_worker_time() -> None:
    # given: 2 cores; the run had 1 worker, so no batch was timed in the main process; one worker is 1/6 s a batch
    record = probed_record({0: 5.0, 1: 6.0, 2: 11.0}, device="cpu")
    record = dataclasses.replace(record, meta=RunMeta(cpu_count=2), loaders=(
        dataclasses.replace(record.loaders[0], num_workers=1),))
    # when
    plan = loader_plan(record)
    # then: (1/6 s + 50 ms) / 2 cores = 108 ms a step, over the 100 ms it takes now: nothing to gain, nothing advised
    assert plan is not None and plan.shared_cpu_s == pytest.approx((1 / 6 + 0.05) / 2)
    assert plan.step_s >= 0.1
    assert more_dataloader_workers(record) is None


def test_a_rate_timed_over_the_first_round_only_is_completed_from_the_runs_batch_time() -> None:
    # given: batches of 0.5 s each (data wait 0.5 of a 1 s step, built in the main process); in its short slot the
    # probe saw 2 workers deliver only their first round, start-up included: 1.2 batches/s, a lower bound
    record = probed_record({0: 2.0, 2: 1.2})
    lower = dataclasses.replace(record.loader_probe.rates[1],
                                note="from the first round only, start-up included (a lower bound)")
    record = dataclasses.replace(
        record, steps=dataclasses.replace(record.steps, median_s=1.0),
        loader_probe=dataclasses.replace(record.loader_probe, rates=(record.loader_probe.rates[0], lower)))
    # when
    plan = loader_plan(record)
    # then: 2 workers build 2 batches at a time, 0.5 s each: 4 batches/s, and the step is its 0.5 s of compute
    assert plan is not None and plan.rate.batches_per_s == pytest.approx(4.0)
    assert plan.rate.note.startswith("estimated")
    assert plan.step_s == pytest.approx(0.5)
    # a rate timed over whole rounds is taken as measured
    measured = dataclasses.replace(record, loader_probe=dataclasses.replace(
        record.loader_probe, rates=(record.loader_probe.rates[0], dataclasses.replace(lower, note=""))))
    assert loader_plan(measured).rate.batches_per_s == pytest.approx(1.2)  # type: ignore[union-attr]


def test_a_probe_in_its_child_sees_the_users_thread_count_not_its_own() -> None:
    # the isolated child runs torch on one thread; the shared-cores prediction needs the step's threads (with 1 it
    # promised 1.77x on data_loading_shared_cores, where 1.28x was measured)
    from gpuscope.collect.framework.base import CollectorResult
    from gpuscope.collect.framework.probing import run_isolated, user_torch_threads
    from gpuscope.record import CollectorStatus

    def probe() -> CollectorResult:
        return CollectorResult(CollectorStatus("ok", f"{torch.get_num_threads()} {user_torch_threads(torch)}"))

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = run_isolated(probe, budget_s=5.0, what="the test probe")
    finally:
        torch.set_num_threads(before)
    assert result.status.reason == "1 2"


def test_with_half_second_batches_on_many_cores_the_budget_goes_to_the_worker_count_that_would_keep_up() -> None:
    # given: a run's batches took 0.5 s each in the main process, on 16 cores and a GPU whose step consumes 232
    # batches/s: 10 worker configurations would get half a second each, not even one batch (seen on an H100)
    notes: list[str] = []
    configs = affordable_configs([0, 1, 2, 4, 8, 16], (False, True), 5.0, 0.5, 232.0, 0.1, notes)
    # then: the 0-worker rate is the run's own; 16 workers, with and without pin_memory, get the budget
    assert configs == [(0, False), (0, True), (16, False), (16, True)]
    assert "timed 16 workers only" in notes[0]
    # and where 3 configurations fit, the count that keeps up (4: 5 batches/s x 1.1 x 0.4 s) and fewer
    assert affordable_configs([0, 1, 2, 4, 8, 16], (False, True), 5.0, 0.4, 5.0, 0.1, []) == [
        (0, False), (0, True), (2, False), (4, False), (4, True)]
    # and fast batches, or a 2-core machine, time every configuration
    assert len(affordable_configs([0, 1, 2, 4, 8, 16], (False, True), 5.0, 0.02, 50.0, 0.1, [])) == 12
    assert affordable_configs([0, 1, 2], (False,), 5.0, 0.47, 24.0, 0.1, []) == [(0, False), (1, False), (2, False)]


def test_with_smaller_probe_batches_the_count_that_would_keep_up_is_still_worked_out_from_the_runs_batches() -> None:
    # given: batches of 16 items taking 8 s in the run (0.5 s an item), so the probe loads batches of one item;
    # the step consumes 0.5 batches/s: 0.5 x 1.1 x 8 s = 4.4 batches in parallel, 8 workers; 2 configurations fit
    notes: list[str] = []
    configs = affordable_configs([0, 1, 2, 4, 8, 16], (False,), 4.0, 8.0, 0.5, 0.1, notes, probe_batch_s=0.5)
    # then: 8 workers and the next fewer are timed, as the run's 8-second batches need, not the 1 worker that 0.5 s
    # batches would
    assert configs == [(0, False), (4, False), (8, False)]
    assert "8.00 s in the run (0.50 s a batch of the probe's)" in notes[0]


def accumulating_record(rates: dict[int, float]) -> Any:
    """A loop accumulating gradients over 4 batches: 160 batches over 40 optimizer steps; the step computes for
    50 ms and waits 50 ms for its four batches."""
    record = probed_record(rates, device="cpu")
    loaders = (dataclasses.replace(record.loaders[0], batches=160),)
    return dataclasses.replace(record, loaders=loaders, steps=dataclasses.replace(record.steps, total=40))


def test_a_step_that_takes_four_batches_needs_workers_that_deliver_four_in_its_compute() -> None:
    # given: 1 worker delivers 50 batches/s, 2.5x one batch per 50 ms step, but the step takes four (80/s)
    record = accumulating_record({0: 40.0, 1: 50.0, 2: 90.0, 4: 160.0})
    plan = loader_plan(record)
    assert plan is not None
    # then two workers are the fewest that keep up, and the step is max(compute 50 ms, four batches at 90/s)
    assert plan.consume_batches_per_s == pytest.approx(80.0)
    assert plan.workers == 2
    assert plan.step_s == pytest.approx(0.05)
    finding = more_dataloader_workers(record)
    assert finding is not None and "num_workers=2" in finding.fix
    assert any("consumes 80.0 batches/s (4 per 50.0 ms of compute)" in fact for fact in finding.evidence)


def test_the_workers_step_counts_every_batch_a_step_takes() -> None:
    # given: no worker count keeps up with four batches a step; 4 workers deliver the most, 60/s
    plan = loader_plan(accumulating_record({0: 20.0, 1: 25.0, 2: 45.0, 4: 60.0}))
    # then the predicted step is four batches at that rate, not one
    assert plan is not None and plan.workers == 4 and not plan.keeps_up
    assert plan.step_s == pytest.approx(4 / 60.0)


def test_without_the_probe_a_step_of_four_batches_is_estimated_per_batch_and_named_as_four() -> None:
    # given: the same loop with no loader probe (it did not run): 50 ms of waiting a step builds its four batches
    record = dataclasses.replace(accumulating_record({}), loader_probe=None, meta=RunMeta(cpu_count=8, torch_threads=1))
    finding = more_dataloader_workers(record)
    assert finding is not None and "num_workers=1" in finding.fix
    # then a batch takes 12.5 ms and the model uses one every 12.5 ms of its 50 ms compute
    assert "a batch takes about 12 ms to prepare and the model uses one every 12 ms (4 a step): 1 workers keep up" \
        in finding.evidence
    # and the what-if names the step's four batches, not "one batch"
    estimate = what_if(record, Verdict("data-loading", 0.9, ("50%",)))
    assert estimate is not None and "a step's 4 batches 50.0 ms / 1)" in estimate.explanation, estimate.explanation


@pytest.mark.parametrize(("batches", "steps", "per"), [
    (160, 40, 4.0),  # gradient accumulation over 4 batches
    (41, 40, 1.0),  # a batch fetched before the first step was counted
    (40, 42, 1.0),
    (100, 40, 2.5),  # no whole number: as measured
    (20, 40, 0.5),  # two optimizer steps on each batch
    (0, 40, 1.0),  # unknown
])
def test_batches_per_step(batches: int, steps: int, per: float) -> None:
    assert batches_per_step(batches, steps) == per


def test_the_probe_is_told_the_rate_a_step_consumes_its_batches() -> None:
    facts = post_run_facts(data_wait=0.5, median_s=0.1, steps=40, batches_per_step=4.0)
    assert facts.consume_batches_per_s == pytest.approx(80.0)


# -- a sampler of the user's own: the main process runs it, workers or not ------------------------------------

class EveryOther(torch.utils.data.Sampler):
    """A user's sampler that works for each index it yields (a Python loop over a list)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length // 2

    def __iter__(self) -> Any:
        for index in range(0, self.length, 2):
            sum(range(2000))  # the per-index work
            yield index


def test_a_samplers_time_to_draw_a_batch_is_timed_where_the_sampler_is_the_users_own() -> None:
    # given: the index samplers a DataLoader iterates: a BatchSampler over the user's sampler, the user's own batch
    # sampler, and torch's own
    batches = torch.utils.data.BatchSampler(EveryOther(1000), batch_size=8, drop_last=False)
    # when / then: each batch of 8 indices timed, and the user's class named where its __iter__ is
    for index_sampler in (batches, EveryOther(1000)):
        timed = time_sampler(index_sampler)
        assert timed is not None and timed[0] > 0
        assert timed[1].startswith("EveryOther (")
        assert timed[1].endswith(f"{Path(__file__).name}:{EveryOther.__iter__.__code__.co_firstlineno})")
    # torch's own samplers are not timed: setting one up can cost more than the run's use of it (a RandomSampler
    # permutes the whole dataset)
    random_batches = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(range(10**6)), 8, False)
    assert time_sampler(random_batches) is None and time_sampler(None) is None


def test_where_the_users_sampler_is_most_of_the_wait_workers_are_not_advised_and_the_sampler_is_named() -> None:
    # given: a CPU run on 2 cores waiting 50 ms of its 100 ms step for each batch, of which the user's sampler takes
    # 48 ms drawing the indices; two workers would deliver 23 batches/s
    record = dataclasses.replace(probed_record({0: 20.0, 1: 12.0, 2: 23.0}, device="cpu"), meta=RunMeta(cpu_count=2))
    record = dataclasses.replace(record, loader_probe=dataclasses.replace(
        record.loader_probe, sampler_s=0.048, sampler="Balanced (data.py:33)"))
    # when
    plan = loader_plan(record)
    recommendations, _ = evaluate(record)
    # then: with workers the main process still draws the indices: the step is compute + 48 ms, 2% shorter (the
    # probe's workers, loading with a sampler of its own, would have promised 50%), under the 5% that makes workers
    # worth advising; a cheaper sampler is advised instead
    assert plan is not None and plan.sampler_s == pytest.approx(0.048) and plan.step_s == pytest.approx(0.098)
    assert [r.id for r in recommendations] == ["cheaper-batches"]
    found = recommendations[0]
    assert found.evidence[1] == ("the loader's sampler, Balanced (data.py:33), takes 48.0 ms to draw each batch's "
                                 "indices (timed again after the run): 96% of the 50.0 ms the loop waited for each "
                                 "batch")
    assert found.fix.startswith("data.py:33: draw each batch's indices with less work in Balanced.__iter__")
    assert found.expected_gain == pytest.approx(0.5 * 0.96)


def test_a_sampler_of_the_users_that_draws_one_batch_or_none_is_not_timed() -> None:
    # the first batch may set the sampler up: nothing is timed without a second one
    one = torch.utils.data.BatchSampler(EveryOther(8), batch_size=8, drop_last=False)
    assert time_sampler(one) is None and time_sampler(EveryOther(0)) is None
