"""Training in processes the script starts (pytorch/examples' Hogwild: ``mp.Process(target=train)`` on a shared
model), which gpuscope does not profile, is named in the verdict with the CPU it used, and how to profile it."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import SCRIPTS, load_run, run_gpuscope

pytestmark = pytest.mark.slow


def test_training_in_processes_the_script_started_is_named_in_the_verdict(tmp_path: Path) -> None:
    # given a script whose two trainers each use 1.5 s of CPU, then evaluate through a DataLoader with one worker
    run_dir = tmp_path / "run"
    done = run_gpuscope(["run", "-q", "-o", str(run_dir), "--no-probes", str(SCRIPTS / "hogwild.py")], tmp_path,
                        preloaded=True)
    assert done.returncode == 0, done.stderr
    record = load_run(run_dir)
    # then the two trainers are recorded, with the line that started them and their CPU time; the worker is not
    processes = record["host_memory"]["processes"]
    assert [p["target"] for p in processes] == ["__main__.train"] * 2, processes
    assert all(p["kind"] == "script" and p["start_method"] == "fork" for p in processes)
    # (read every 0.5 s while the run is watched: the last reading may come up to that long before a trainer ends)
    assert all(p["cpu_s"] is not None and p["cpu_s"] >= 0.5 for p in processes), processes
    # (summed over their threads, those that did work counted: the first, and torch's intra-op ones)
    assert all(p["threads"] is not None and p["threads"] >= 1 for p in processes), processes
    assert processes[0]["started_at"]["code"] == "p.start()"
    # and the verdict says that their work is not in the figures, and how to profile it
    line = next((e for e in record["verdict"]["evidence"] if "processes the script started" in e), None)
    assert line is not None, record["verdict"]
    assert "2 ran train, started at hogwild.py:" in line
    assert "run the body of train inside `with gpuscope.profile():`" in line
