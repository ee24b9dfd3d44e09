"""In a trace every step is profiled (``gpuscope analyze``): the host's pace there holds the profiler's own cost,
and a GPU that waits for such a host is not, on that evidence alone, waiting on launching. Held against the H200
loops measured under plain python (tests/fixtures/gpu/h200/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.diagnose import analyze
from gpuscope.diagnose import thresholds as th
from gpuscope.reduce.tracefile import record_from_file

H200 = Path(__file__).resolve().parent.parent / "fixtures" / "gpu" / "h200"


def analysed(name: str):
    path = H200 / f"{name}.trace.json.gz"
    return analyze(record_from_file(path, path.name, path.stat().st_size))


def test_a_wait_for_the_host_that_the_profiler_makes_is_not_launch_bound() -> None:
    # given: resnet-b96's trace: 15.2 ms profiled steps, 10.3 ms of kernels, the GPU waiting for the host 29% of
    # them; under plain python the same loop takes 10.8 ms a step, its GPU busy most of it
    record = analysed("resnet-b96")
    # then: with about 3 us an op taken off the host's 14.9 ms (1,058 ops: 3.2 ms), the host would queue a step in
    # 11.8 ms against the GPU's 10.9: compute-bound, with less confidence, and the reason said
    assert record.verdict.bound == "compute"
    assert record.verdict.confidence == th.MIXED_CONFIDENCE
    said = " ".join(record.verdict.evidence)
    assert "every step of a trace is profiled" in said and "1058 torch ops a step (3.2 ms)" in said
    assert "about 11.8 ms" in said  # within 10% of the 10.8 ms plain python measured


def test_a_host_slower_than_the_profiler_explains_stays_launch_bound() -> None:
    # given: overhead-loop's trace: 1.0 ms of kernels in a 4.5 ms step, 421 ops a step (1.3 ms of profiler cost);
    # under plain python 2.3 ms a step, still more than twice its kernels
    record = analysed("overhead-loop")
    assert record.verdict.bound == "cpu-launch" and record.verdict.confidence > 0.9


@pytest.mark.parametrize("name", ["wide-mlp", "resnet-b256", "gpt-fp32"])
def test_a_busy_gpu_keeps_its_confident_compute_verdict(name: str) -> None:
    record = analysed(name)
    assert record.verdict.bound == "compute" and record.verdict.confidence == 0.95
    assert not any("every step of a trace is profiled" in fact for fact in record.verdict.evidence)
