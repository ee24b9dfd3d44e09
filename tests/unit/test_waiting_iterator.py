"""A loop fed by an iterator of the script's own, whose batches a thread builds and hands over through a queue
(prefetch_generator's ``BackgroundGenerator``): no DataLoader wait times it, and the Python profile has the steps
waiting on the queue's lock under the iterator's ``__next__``. The verdict is data-loading, naming the iterator."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpuscope.diagnose import analyze
from gpuscope.diagnose.classify import classify
from gpuscope.record import FunctionStat, RunRecord

RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "records"


@pytest.fixture(scope="module")
def record() -> RunRecord:
    return RunRecord.from_json(json.loads((RECORDS / "background_thread.json").read_text()))


def test_a_loop_waiting_on_its_own_iterators_queue_is_data_loading_bound(record: RunRecord) -> None:
    verdict = classify(record)
    assert verdict.bound == "data-loading" and verdict.confidence >= 0.9
    assert verdict.evidence[0].startswith("the loop waits for its batches: the Python profile's steps (steps 12-16) "
                                          "spend 87% of their time waiting on a lock under __next__ (bg.py:16)")
    assert not any(line.startswith("data wait is") for line in verdict.evidence)  # no DataLoader's wait to tell


def with_profile(record: RunRecord, **changes: object) -> RunRecord:
    profile = record.python_profile
    assert profile is not None
    return dataclasses.replace(record, python_profile=dataclasses.replace(profile, **changes))


def test_a_wait_under_no_iterator_of_the_scripts_own_stays_inconclusive(record: RunRecord) -> None:
    # the same wait, under a function that is no iterator (a lock the loop takes to log, say)
    profile = record.python_profile
    assert profile is not None
    renamed = tuple(dataclasses.replace(f, function="log_metrics") if f.function == "__next__" else f
                    for f in profile.top_cumulative)
    verdict = classify(with_profile(record, top_cumulative=renamed))
    assert verdict.bound == "inconclusive"
    assert any("in <method 'acquire' of '_thread.lock' objects>" in line for line in verdict.evidence)


def test_a_short_wait_is_not_the_bound(record: RunRecord) -> None:
    # the lock's wait is a tenth of the profiled steps: under the 20% at which loading bounds the run
    profile = record.python_profile
    assert profile is not None
    lead = profile.top_own[0]
    short = FunctionStat(**{**dataclasses.asdict(lead), "own_s": 0.1 * (profile.total_s - profile.startup_s)})
    assert classify(with_profile(record, top_own=(short, *profile.top_own[1:]))).bound != "data-loading"


def test_its_what_if_is_the_step_without_the_wait(record: RunRecord) -> None:
    # the step with the batches ready when asked for: 13.6 ms less the 87% waited; with batches built cheaply
    # (torch.randn in the thread instead of 16k random.gauss calls) the script's own step measured 0.83 ms
    what_if = analyze(record).what_if
    assert what_if is not None
    assert what_if.step_s == pytest.approx(record.steps.median_s * (1 - 0.8661), rel=0.02)
    assert what_if.explanation.endswith("waiting under __next__ (bg.py:16)")
