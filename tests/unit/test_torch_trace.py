"""The torch.profiler window and trace.json: where the window lies, and how the trace is kept under its cap."""

from __future__ import annotations

import json
import os
import shutil
import sys
import types
import warnings
from pathlib import Path

import pytest

from gpuscope.reduce.kernels import kernel_timeline
from gpuscope.collect.lazy_dynamo import inductor_left_unimported
from gpuscope.collect.collectors.torch_trace import (
    cap_trace,
    kineto_quiet,
    release_cupti_after_trace,
    restore_cupti_setting,
    trace_window,
    window_wall_s,
)

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


def test_cupti_is_released_after_the_trace_window_on_cuda_that_allows_it() -> None:
    # Kineto keeps CUPTI attached after the profiler stops unless TEARDOWN_CUPTI=1: on an H100 every later step of
    # a launch-bound loop then ran 46% slower than under plain python
    environ: dict[str, str] = {}
    assert release_cupti_after_trace("13.0", environ) and environ == {"TEARDOWN_CUPTI": "1"}
    restore_cupti_setting(True, environ)
    assert environ == {}
    # before CUDA 12.6 a teardown could crash CUDA graphs; the user's own setting is never overridden
    assert not release_cupti_after_trace("12.4", environ) and environ == {}
    assert not release_cupti_after_trace(None, environ) and environ == {}
    environ["TEARDOWN_CUPTI"] = "0"
    assert not release_cupti_after_trace("12.8", environ)
    restore_cupti_setting(False, environ)
    assert environ == {"TEARDOWN_CUPTI": "0"}
    # torch.compile's CUDA graphs set it to 0 after gpuscope set it: left as they set it
    restore_cupti_setting(True, environ)
    assert environ == {"TEARDOWN_CUPTI": "0"}


def test_torchs_note_on_schedule_cycles_does_not_reach_the_users_stderr() -> None:
    # torch 2.11 (seen on an H100) warns on every profiler with a schedule; the user's stderr must read as under python
    note = ("Warning: Profiler clears events at the end of each cycle.Only events from the current cycle will be "
            "reported.To keep events across cycles, set acc_events=True.")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with kineto_quiet():
            warnings.warn(note, UserWarning)
            warnings.warn("the user's own warning", UserWarning)
    assert [str(w.message) for w in seen] == ["the user's own warning"]


def dropout_warning() -> None:
    """The script's call of a deprecated torch function, which warns once per line (Python's default filter)."""
    warnings.warn("dropout2d: Received a 2-D input to dropout2d, which is deprecated", UserWarning)


def test_a_warning_the_script_has_shown_is_not_shown_again_after_the_profilers_calls(shown: list[str]) -> None:
    # given a warning the script has shown once (pytorch/examples' mnist_rnn: dropout2d on a 2-D input each step)
    dropout_warning()
    # when the trace window calls the profiler each step, quieted, and the script warns again in each step
    for _ in range(3):
        with kineto_quiet():
            pass
        dropout_warning()
    # then the user saw it once, as under python (it was shown 8 times in a run of 188 steps)
    assert shown == ["dropout2d: Received a 2-D input to dropout2d, which is deprecated"]


def test_kinetos_lines_about_gpuscopes_profiler_are_kept_from_the_users_stderr(
        capfd: pytest.CaptureFixture[str]) -> None:
    with kineto_quiet():
        os.write(2, b"USDT: profiler_start\n")
        os.write(2, b"ERROR: External init callback must run in same thread as registerClient (-4605 != 6080)\n")
        os.write(2, b"the user's own line\n")
    assert capfd.readouterr().err == "the user's own line\n"


def lazy_torch(imported: list[str]) -> types.ModuleType:
    """A stand-in for torch whose lazy attributes import their submodule, as torch's own ``__getattr__`` does."""
    fake = types.ModuleType("torch")

    def lazy(name: str) -> object:
        imported.append(name)
        return types.ModuleType(f"torch.{name}")

    fake.__getattr__ = lazy  # type: ignore[attr-defined]
    return fake


def test_the_profilers_question_whether_inductor_is_on_imports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # given a torch whose inductor is not imported (torch.profiler asks hasattr(torch, "_inductor") as it starts:
    # 1.3 s of imports in a script without torch.optim or torch.compile)
    imported: list[str] = []
    fake = lazy_torch(imported)
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.delitem(sys.modules, "torch._inductor", raising=False)
    # when the profiler starts
    with inductor_left_unimported():
        inductor_on = hasattr(fake, "_inductor")
        other = hasattr(fake, "_dynamo")
    # then the question reads "no" and imports nothing; other lazy attributes still import, and afterwards all do
    assert (inductor_on, other, imported) == (False, True, ["_dynamo"])
    assert hasattr(fake, "_inductor") and imported == ["_dynamo", "_inductor"]


def test_with_inductor_imported_the_profiler_sees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    imported: list[str] = []
    fake = lazy_torch(imported)
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setitem(sys.modules, "torch._inductor", types.ModuleType("torch._inductor"))
    with inductor_left_unimported():
        assert hasattr(fake, "_inductor")
