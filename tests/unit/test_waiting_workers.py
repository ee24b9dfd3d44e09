"""``more-dataloader-workers`` when the loader already has as many workers as the machine has cores: more help
only when the workers mostly wait (files, the network) rather than compute, which their measured CPU time over the
time they ran (``host_memory``) tells. Figures from a real run on the 2-core machine: a streaming IterableDataset
whose items each wait 0.5 ms, two workers on a CPU 11% of their 3.2 s, the 10.5 ms step 85% data wait; with the 9
workers then advised the step measured 4.4 ms (8 are advised now: the count the step's CPU work over the cores
allows; measured again on that script, 7 advised now gave 5.2 ms, 9 gave 5.5). Workers that the loader probe
timed keeping up are idle because they are ahead, not blocked."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import make_record
from gpuscope.diagnose.rules.dataloader import more_dataloader_workers
from gpuscope.diagnose.speed import what_if
from gpuscope.diagnose.waiting_workers import waiting_workers
from gpuscope.record import Breakdown, HostMemory, Loader, RunMeta, RunRecord, Steps, Verdict

RECORDS = Path(__file__).parent.parent / "fixtures" / "records"

STREAM = Loader(dataset="Stream", num_workers=2, batch_size=32, iterable=True, batches=180, wait_s=1.5)


def run_with(workers_cpu_s: float, workers_watched_s: float, loader: Loader = STREAM, device: str = "cpu",
             workers_runnable_s: float = 0.06) -> object:
    return make_record(
        device=device,
        steps=Steps(count=170, median_s=0.0105, total=180, source="optimizer"),
        breakdown=Breakdown(data_wait=0.85, forward=0.04, backward=0.03, optimizer=0.04, other=0.04),
        loaders=(loader,), meta=RunMeta(cpu_count=2, torch_threads=2),
        host_memory=HostMemory(max_workers=2, peak_workers_bytes=600 << 20, workers_cpu_s=workers_cpu_s,
                               workers_runnable_s=workers_runnable_s, workers_watched_s=workers_watched_s))


def test_workers_that_mostly_wait_are_advised_past_the_cores_as_many_as_the_cores_make_room_for() -> None:
    # given: two workers on a CPU 11% of the time they ran (and waiting for one 2%), on two cores
    finding = more_dataloader_workers(run_with(0.35, 3.2))
    # then: 21 ms a batch against a 1.6 ms step would take 14 workers; a step's CPU work (the workers' 11% of 21 ms,
    # the 1.6 ms compute on two threads) over the two cores takes 2.7 ms, which 8 workers reach
    assert finding is not None
    assert finding.fix.startswith("DataLoader(..., num_workers=8, persistent_workers=True)")
    evidence = " | ".join(finding.evidence)
    assert ("its workers (the run's child processes but multiprocessing's helpers) were on a CPU or waiting for one "
            "13% of the 3.2 s they ran (on a CPU 0.35 s, measured by the kernel)") in evidence
    assert "14 workers keep up, 8 fit" in evidence
    assert "8 that busy bring the step down to its CPU work over the 2 cores" in evidence
    # and the step predicted is that bound
    step_s = (0.35 / 3.2 * 0.0105 * 2 + 0.0105 * 0.15 * 2) / 2
    assert f"predicted step {step_s * 1e3:.1f} ms" in evidence and "at best" in evidence
    assert finding.gain == pytest.approx(1 - step_s / 0.0105)
    # and what the workers would hold in memory, as measured: 300 MB each
    assert "each worker held up to 300 MB resident" in evidence and "8 would hold about 2.3 GB" in evidence
    # and an IterableDataset is reminded to split its stream among the workers
    assert "get_worker_info()" in evidence


def test_on_a_cpu_run_workers_are_advised_up_to_the_step_their_cpu_work_allows_not_one_core_less() -> None:
    # given: a Lightning script's two spawn workers reading "files" (a real run on the 2-core machine): on a CPU 27%
    # of their 10.2 s, the 17.6 ms step 81% data wait
    record = dataclasses.replace(
        run_with(2.75, 10.24, loader=dataclasses.replace(STREAM, dataset="Records", iterable=False),
                 workers_runnable_s=0.4),
        steps=Steps(count=190, median_s=0.0176, total=200, source="optimizer"),
        breakdown=Breakdown(data_wait=0.81, forward=0.03, backward=0.03, optimizer=0.01, other=0.12))
    finding = more_dataloader_workers(record)
    # then: 5 workers bring the step to its CPU work over the cores (8.1 ms); (cores - 1) / 27% would have capped
    # them at 3, which measured a mean step of 11.8 ms where 5 measured 7.1 ms
    assert finding is not None and finding.fix.startswith("DataLoader(..., num_workers=5,")
    assert any("predicted step 8.1 ms" in fact for fact in finding.evidence)


def test_the_verdicts_what_if_is_the_recommendations_step() -> None:
    record = run_with(0.35, 3.2)
    finding = more_dataloader_workers(record)
    estimate = what_if(record, Verdict(bound="data-loading", confidence=0.9))  # type: ignore[arg-type]
    assert finding is not None and estimate is not None
    assert finding.gain == pytest.approx(1 - estimate.step_s / 0.0105)
    assert estimate.explanation.startswith("with 8 DataLoader workers, more than the cores (they were blocked 87% "
                                           "of their time)")


def test_on_a_gpu_run_the_step_is_bounded_by_the_batches_not_the_cores() -> None:
    # the workers at 11% fill the core the step leaves with 9 of them
    finding = more_dataloader_workers(run_with(0.35, 3.2, device="cuda"))
    assert finding is not None and "num_workers=9" in finding.fix
    assert any("9 that busy fill the 1 core the step leaves" in fact for fact in finding.evidence)
    assert finding.gain == pytest.approx(1 - (0.0105 * 2 / 9) / 0.0105)


def test_workers_that_compute_most_of_the_time_are_not_advised_past_the_cores() -> None:
    # given: the same wait, but the workers were on a CPU 80% of the time: the cores, not the workers, are short
    assert more_dataloader_workers(run_with(2.56, 3.2)) is None
    # and so they are when they were on a CPU only 30% of it, waiting for a core another 40% (crowded cores)
    assert more_dataloader_workers(run_with(0.96, 3.2, workers_runnable_s=1.28)) is None


def test_too_little_watched_worker_time_is_no_evidence() -> None:
    # given: the workers watched for under a second in all (a first scan may fall in a spawned worker's start-up)
    assert more_dataloader_workers(run_with(0.05, 0.8)) is None
    # and a run with no host memory record advises nothing past the cores either
    assert more_dataloader_workers(dataclasses.replace(run_with(0.35, 3.2), host_memory=None)) is None


def test_children_other_than_the_loaders_workers_leave_their_cpu_share_unjudged() -> None:
    # given: four child processes at once for a loader of two workers (an idle pool of torch.compile workers, say,
    # whose idleness would pass for the workers' waiting)
    record = run_with(0.35, 6.4)
    crowded = dataclasses.replace(record, host_memory=dataclasses.replace(record.host_memory, max_workers=4))
    assert more_dataloader_workers(crowded) is None
    # but multiprocessing's own helpers (a forkserver and its resource tracker), told apart, leave the judgement
    helped = dataclasses.replace(record, host_memory=dataclasses.replace(record.host_memory, max_workers=4,
                                                                         max_helpers=2))
    assert more_dataloader_workers(helped) is not None


def test_a_map_style_dataset_gets_no_reminder_about_streams() -> None:
    finding = more_dataloader_workers(run_with(0.35, 3.2, loader=dataclasses.replace(STREAM, iterable=False)))
    assert finding is not None and not any("get_worker_info" in fact for fact in finding.evidence)


def test_workers_idle_because_ahead_are_not_taken_for_workers_blocked_on_files() -> None:
    # given (recorded: tests/fixtures/records/ckpt.py, an in-memory TensorDataset with 2 persistent workers on the
    # 2 cores, 5% of the 51 ms step waiting; the workers on a CPU 3% of the 12 s they ran, idle with their batches
    # built, which the kernel counts as blocked): the loader probe timed one worker at 533 batches/s, where the step
    # consumes 20.6
    run = RunRecord.from_json(json.loads((RECORDS / "ckpt_idle_workers.json").read_text()))
    # then: more workers are not advised (3 were, for 4%): the wait is not the workers' building
    assert waiting_workers(run) is None
    assert more_dataloader_workers(run) is None
    # without the probe's curve nothing tells idle from blocked: the advice stands, an estimate
    unprobed = dataclasses.replace(run, loader_probe=None)
    assert waiting_workers(unprobed) is not None
    finding = more_dataloader_workers(unprobed)
    assert finding is not None and "num_workers=3" in finding.fix
