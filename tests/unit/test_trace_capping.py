"""trace.json's cap is about the file on disk, never about the figures: they come from the whole trace first."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpuscope.reduce.fields import trace_op_profile
from gpuscope.collect.collectors.torch_trace import capture_trace

TRACE = Path(__file__).resolve().parent.parent / "fixtures" / "gpu" / "a100-resnet-ddp-nccl.json.gz"


def test_per_step_figures_are_the_same_with_and_without_capping(tmp_path: Path) -> None:
    # given the A100 DDP trace (3 steps, ~10 MB as JSON) written twice as the collector writes trace.json
    whole, capped = tmp_path / "whole" / "trace.json", tmp_path / "capped" / "trace.json"
    for path in (whole, capped):
        path.parent.mkdir()
        path.write_bytes(gzip.decompress(TRACE.read_bytes()))
    # when one is kept whole and the other capped at 2 MB (all but the first step and more are dropped)
    whole_capture = capture_trace(whole, max_bytes=10**10, recorded=(4, 5, 6), cuda=True)
    capped_capture = capture_trace(capped, max_bytes=2 * 2**20, recorded=(4, 5, 6), cuda=True)
    full, full_detail = trace_op_profile(whole_capture), whole_capture.trace_detail
    cut, cut_detail = trace_op_profile(capped_capture), capped_capture.trace_detail
    # then only the file differs
    assert full_detail == "full" and cut_detail != "full"
    assert capped.stat().st_size <= 2 * 2**20
    assert len(json.loads(capped.read_text())["traceEvents"]) < len(json.loads(whole.read_text())["traceEvents"])
    assert full.kernels is not None and cut.kernels is not None
    assert full.communication is not None and cut.communication is not None
    assert cut.kernels.kernels_per_step == pytest.approx(full.kernels.kernels_per_step, rel=0.01)
    assert cut.kernels.busy_fraction == pytest.approx(full.kernels.busy_fraction, rel=0.01)
    for figure in ("calls_per_step", "comm_s", "exposed_s"):
        assert getattr(cut.communication, figure) == pytest.approx(getattr(full.communication, figure), rel=0.01)
    assert cut.steps == full.steps == 3
