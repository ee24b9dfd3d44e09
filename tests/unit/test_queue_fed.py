"""A loop fed through a queue by a thread or process of the script's own, no DataLoader: its waits in the queue's
``get`` between its passes are its data wait, and the verdict names the line; the what-if is the step without the
wait, as no worker count was measured (tests/fixtures/records/queue_fed.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpuscope.diagnose import analyze
from gpuscope.diagnose.classify import classify
from gpuscope.record import RunRecord

RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "records"


@pytest.fixture(scope="module")
def record() -> RunRecord:
    return RunRecord.from_json(json.loads((RECORDS / "queue_fed.json").read_text()))


def test_the_recorded_loop_waited_in_its_queues_get(record: RunRecord) -> None:
    (site,) = record.steps.queue_waits
    assert (site.file, site.line, site.code) == ("queue_fed.py", 30, "item = q.get()")
    assert not record.loaders and record.breakdown.data_wait == pytest.approx(0.67, abs=0.01)


def test_a_loop_waiting_on_its_queue_is_data_loading_bound_at_that_line(record: RunRecord) -> None:
    verdict = classify(record)
    assert verdict.bound == "data-loading" and verdict.confidence == 0.95
    assert verdict.evidence[0].startswith("67% of each step waits for the next batch (median step 4.6 ms")
    assert verdict.evidence[1].startswith("the wait is at queue_fed.py:30 `item = q.get()`, on a queue: a thread or "
                                          "process of the script's own hands the batches over, no DataLoader")


def test_its_what_if_is_the_step_without_the_wait_not_a_worker_count(record: RunRecord) -> None:
    # 4.6 ms less the 67% waited: 1.5 ms; with the batches built at no cost the script's step measured 1.3-1.9 ms
    what_if = analyze(record).what_if
    assert what_if is not None
    assert what_if.step_s == pytest.approx(record.steps.median_s * (1 - record.breakdown.data_wait))
    assert what_if.explanation == ("with the batches ready when the step asks for them: without the 67% of each "
                                   "step spent waiting at queue_fed.py:30 `item = q.get()`")


def test_no_dataloader_advice_is_given_for_batches_no_dataloader_built(record: RunRecord) -> None:
    advice = {rec.id for rec in analyze(record).recommendations}
    assert not advice & {"more-dataloader-workers", "pin-memory", "persistent-workers", "cheaper-batches"}


def test_a_short_wait_on_the_queue_is_not_the_bound(record: RunRecord) -> None:
    breakdown = dataclasses.replace(record.breakdown, data_wait=0.1, other=record.breakdown.other + 0.57)
    verdict = classify(dataclasses.replace(record, breakdown=breakdown))
    assert verdict.bound != "data-loading"
    assert "data wait is 10% of each step (at queue_fed.py:30 `item = q.get()`, on a queue), under the 20% at which " \
           "loading bounds the run" in verdict.evidence
