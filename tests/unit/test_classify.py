"""The verdict from the breakdown: data-loading-bound runs are named, too few steps is inconclusive."""

from __future__ import annotations

import pytest

from conftest import make_record
from gpuscope.analysis.classify import classify
from gpuscope.record import Breakdown, Loader, Steps


@pytest.mark.parametrize(
    ("data_wait", "bound"),
    [(0.62, "data-loading"), (0.20, "data-loading"), (0.19, "inconclusive"), (0.02, "inconclusive")],
)
def test_data_wait_share_decides_data_loading(data_wait, bound) -> None:
    record = make_record(breakdown=Breakdown(data_wait=data_wait, forward=1 - data_wait))
    assert classify(record).bound == bound


def test_data_loading_evidence_carries_its_numbers() -> None:
    record = make_record(
        breakdown=Breakdown(data_wait=0.62, forward=0.38),
        loaders=(Loader(dataset="Images", num_workers=0, batches=40, wait_s=3.0),),
    )
    verdict = classify(record)
    assert verdict.confidence > 0.6
    assert any("62%" in e for e in verdict.evidence)
    assert any("0 worker" in e for e in verdict.evidence)


def test_too_few_steady_steps_is_inconclusive_and_says_so() -> None:
    record = make_record(steps=Steps(count=3, median_s=0.1, total=4, warmup=1),
                         breakdown=Breakdown(data_wait=0.9, forward=0.1))
    verdict = classify(record)
    assert verdict.bound == "inconclusive"
    assert "only 3 steady-state steps" in verdict.evidence[0]
