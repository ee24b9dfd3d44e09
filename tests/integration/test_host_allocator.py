"""The host allocator rule on real runs: a loop whose every step allocates tensors larger than glibc's mmap
threshold is told to let glibc keep them, and the settings the fix names, applied, clear it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SCRIPTS, child_env, load_run, run_gpuscope
from gpuscope.diagnose.rules.host_allocator import kernel_share
from gpuscope.record import RunRecord

pytestmark = pytest.mark.slow

SETTINGS = re.compile(r"^MALLOC_MMAP_THRESHOLD_=(\d+) MALLOC_TRIM_THRESHOLD_=(\d+) python ")


@pytest.mark.timing  # the kernel's share of the step and the pages a step, sampled: alone, as a user runs it
def test_steps_faulting_their_tensors_in_afresh_are_told_to_keep_them_and_the_named_settings_clear_it(
        tmp_path: Path) -> None:
    # given: per-sample gradients, 33 MiB a step, which glibc hands back to the kernel when they are freed
    script = str(SCRIPTS / "fresh_pages.py")
    run_gpuscope(["run", "-q", "--no-probes", "-o", str(tmp_path / "as-is"), script], tmp_path, preloaded=True)
    as_is = load_run(tmp_path / "as-is")
    # then: the kernel's time, faulting 64 MiB of fresh pages in each step, is a fifth of the step or more
    assert as_is["host_memory"]["allocator"] == "glibc"
    advice = {r["id"]: r for r in as_is["recommendations"]}["tune-host-allocator"]
    assert advice["expected_gain"] >= 0.15, advice["evidence"]
    assert re.search(r"faulted in [\d,]+ pages a step: (6[0-9]|7[0-9]) MiB of fresh memory", advice["why"])
    # and the fix names glibc's settings, sized from the run's peak, before the user's command
    settings = SETTINGS.match(advice["fix"])
    assert settings, advice["fix"]
    assert int(settings[1]) == int(settings[2]) >= as_is["host_memory"]["peak_process_bytes"]
    assert advice["fix"].startswith(f"{settings[0]}{script}")

    # when: the same run with those settings, in a process of its own (glibc reads them as it starts)
    env = {**child_env(), "MALLOC_MMAP_THRESHOLD_": settings[1], "MALLOC_TRIM_THRESHOLD_": settings[2]}
    done = subprocess.run([sys.executable, "-m", "gpuscope", "run", "-q", "--no-probes", "-o", str(tmp_path / "fixed"),
                           script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    fixed = load_run(tmp_path / "fixed")
    # then: the rule is clear, the kernel's share of the step has fallen, and the settings are named, not valued
    assert fixed["checks"]["tune-host-allocator"]["status"] == "clear"
    before, after = (kernel_share(RunRecord.from_json(r)) for r in (as_is, fixed))
    assert after < before / 2, (before, after)
    assert fixed["host_memory"]["malloc_settings"] == ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"]
    assert settings[1] not in (tmp_path / "fixed" / "run.json").read_text()
