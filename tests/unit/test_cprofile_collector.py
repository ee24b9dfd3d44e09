"""The cProfile collector under Python 3.12+'s rule (cProfile uses sys.monitoring's one profiler slot: enabling a
second profile, or the same one twice, raises), whatever Python runs the tests."""

from __future__ import annotations

import cProfile
import sys
from pathlib import Path

import pytest

from gpuscope.collectors import cprofile as collector_module
from gpuscope.collectors.cprofile import CProfileCollector, profiler_in_use


class StrictProfile(cProfile.Profile):
    """A cProfile.Profile that, like Python 3.12's, refuses to be enabled while a profile is on."""

    on: StrictProfile | None = None

    def enable(self, *args, **kwargs) -> None:  # type: ignore[override]
        if StrictProfile.on is not None:
            raise ValueError("Another profiling tool is already active")
        StrictProfile.on = self
        super().enable(*args, **kwargs)

    def disable(self) -> None:
        if StrictProfile.on is self:
            StrictProfile.on = None
        super().disable()


def test_with_torch_imported_before_the_run_the_startup_profile_is_enabled_once(monkeypatch: pytest.MonkeyPatch,
                                                                             tmp_path: Path) -> None:
    # given: torch already imported (a notebook, gpuscope.profile()); seen on an H100 with Python 3.12 as
    # "ValueError: Another profiling tool is already active" and no python.prof
    pytest.importorskip("torch")
    assert "torch" in sys.modules
    monkeypatch.setattr(collector_module.cProfile, "Profile", StrictProfile)
    collector = CProfileCollector(steps=2)
    # when
    collector.start(tmp_path)
    try:
        sum(range(1000))
    finally:
        result = collector.stop()
    # then
    assert result.status.status == "ok", result.status.reason
    assert (tmp_path / "python.prof").is_file()
    assert StrictProfile.on is None


def test_another_profiler_in_the_process_is_named() -> None:
    profile = cProfile.Profile()
    profile.enable()
    try:
        reason = profiler_in_use()
    finally:
        profile.disable()
    assert reason is not None and "another profiler" in reason
    assert profiler_in_use() is None
