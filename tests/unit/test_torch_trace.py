"""The torch.profiler window and trace.json: where the window lies, and how the trace is kept under its cap."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpuscope.analysis.kernels import kernel_timeline
from gpuscope.collectors.torch_trace import cap_trace, trace_window, window_wall_s

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "traces" / "cuda_small.json"


@pytest.mark.parametrize(
    ("index", "phase"),
    [(0, "before"), (5, "before"), (6, "warmup"), (7, "active"), (9, "active"), (10, "after"), (500, "after")],
)
def test_the_window_is_a_warmup_step_then_the_active_steps(index: int, phase: str) -> None:
    assert trace_window(index, start=6, active=3) == phase


def test_the_window_wall_time_spans_the_profiled_steps() -> None:
    events = json.loads(FIXTURE.read_text())["traceEvents"]
    assert window_wall_s(events) == pytest.approx(0.003)


def test_a_trace_under_its_cap_is_left_whole(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    shutil.copy(FIXTURE, path)
    before = path.read_bytes()
    events, detail = cap_trace(path, max_bytes=10**9)
    assert detail == "full"
    assert path.read_bytes() == before
    assert len(events) == len(json.loads(before)["traceEvents"])


def test_a_trace_over_its_cap_loses_detail_until_it_fits(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    shutil.copy(FIXTURE, path)
    cap = path.stat().st_size // 3
    events, detail = cap_trace(path, max_bytes=cap)
    assert path.stat().st_size <= cap
    assert detail != "full"
    assert json.loads(path.read_text())["traceEvents"] == events


def test_the_fixture_trace_gives_the_kernel_figures_the_collector_records() -> None:
    events = json.loads(FIXTURE.read_text())["traceEvents"]
    timeline = kernel_timeline(events, window_wall_s(events), steps=3)
    assert timeline is not None
    assert timeline.busy_fraction == pytest.approx(0.59)
    assert timeline.kernels_per_step == pytest.approx(5.0)
    assert timeline.h2d_pageable_copies == 3
