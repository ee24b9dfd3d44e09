"""``fewer-torch-threads``: a CPU run whose own threads wait for cores that other processes hold (sibling trainers, a
busy program beside it) while torch runs an intra-op thread per core is told to run as many threads as the cores it
got: its threads times the share of their ready time they ran."""

from __future__ import annotations

import pytest
from conftest import make_record

from gpuscope.diagnose.rules import evaluate
from gpuscope.record import HostMemory, Loader, RunMeta


def run(cpu_s: float, waiting_s: float, threads: int | None = 2, cores: int = 2, workers: int = 0):
    return make_record(device="cpu", host_memory=HostMemory(interval_s=0.1, own_cpu_s=cpu_s, own_runnable_s=waiting_s),
                       meta=RunMeta(cpu_count=cores, torch_threads=threads),
                       loaders=(Loader(dataset="TensorDataset", num_workers=workers),))


def test_a_trainer_whose_two_threads_got_one_core_is_told_to_run_one() -> None:
    # given a Hogwild trainer profiled with gpuscope.profile(): torch's 2 threads on 2 cores beside its sibling, 10.1 s
    # waiting for a core against 10.0 s on one (37-39 ms a batch; with one thread each, 9-10 ms)
    recommendations, checks = evaluate(run(10.0, 10.1))
    (found,) = [r for r in recommendations if r.id == "fewer-torch-threads"]
    # then one thread is advised, its wait's share the gain (a floor: the spinning it saves is not counted)
    assert found.fix == ("`torch.set_num_threads(1)` before the training loop, in the process that runs it (or "
                         "`OMP_NUM_THREADS=1` in its environment): 2 threads on the 1.0 cores it gets")
    assert found.evidence == ("this process's threads waited for a core 50% of the time they were ready to run "
                              "(10.1 s, against 10.0 s on a CPU) with torch's 2 intra-op threads: it got about 1.0 "
                              "cores of the machine's 2, other processes holding the rest",)
    assert found.expected_gain == pytest.approx(0.502, abs=1e-3)


def test_eight_threads_a_third_of_the_time_waiting_are_told_to_run_five() -> None:
    (found,) = [r for r in evaluate(run(20.0, 10.0, threads=8, cores=8))[0] if r.id == "fewer-torch-threads"]
    assert found.fix.startswith("`torch.set_num_threads(5)` before the training loop")  # 8 x 2/3 = 5.3 cores


@pytest.mark.parametrize(("cpu_s", "waiting_s", "threads", "workers"), [
    (10.0, 2.0, 2, 0),   # a sixth of the time waiting: under the quarter
    (10.0, 10.0, 1, 0),  # one thread: none fewer to run
    (10.0, 10.0, 2, 2),  # DataLoader workers share the cores: more-dataloader-workers sizes the threads with them
    (10.0, 10.0, None, 0),  # torch never imported
], ids=["little wait", "one thread", "dataloader workers", "no torch"])
def test_no_fewer_threads_where_the_wait_is_small_or_threads_cannot_be_fewer_or_workers_share_the_cores(
        cpu_s: float, waiting_s: float, threads: int | None, workers: int) -> None:
    assert evaluate(run(cpu_s, waiting_s, threads=threads, workers=workers))[1]["fewer-torch-threads"].status != "fired"


def test_a_gpu_run_is_not_checked() -> None:
    record = make_record(device="cuda", host_memory=HostMemory(own_cpu_s=10.0, own_runnable_s=10.0),
                         meta=RunMeta(cpu_count=2, torch_threads=2))
    assert evaluate(record)[1]["fewer-torch-threads"].status == "not-checked"
