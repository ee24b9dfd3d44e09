"""The cProfile collector under Python 3.12+'s rule (cProfile uses sys.monitoring's one profiler slot: enabling a
second profile, or the same one twice, raises), whatever Python runs the tests."""

from __future__ import annotations

import cProfile
import pstats
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


GPUSCOPE_CODE = '''
def find_roots(n):
    return sorted(range(n), reverse=True)  # gpuscope's own call to a built-in
'''


def test_the_top_functions_leave_out_the_time_gpuscope_spent_in_built_ins() -> None:
    # given: gpuscope's code (its root-module search) and the user's both call the built-in sorted()
    namespace: dict[str, object] = {}
    exec(compile(GPUSCOPE_CODE, collector_module._GPUSCOPE_DIR + "roots.py", "exec"), namespace)
    find_roots = namespace["find_roots"]
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(3):
        find_roots(200_000)  # type: ignore[operator]
    users = sorted(range(10))
    profile.disable()
    # when
    top = {stat.function: stat for stat in collector_module.top_functions(pstats.Stats(profile), "own")}
    # then: sorted() is the user's one call, and gpuscope's function is not named at all
    assert users == list(range(10))
    assert top["<built-in method builtins.sorted>"].calls == 1
    assert top["<built-in method builtins.sorted>"].own_s < 0.01
    assert "find_roots" not in top
