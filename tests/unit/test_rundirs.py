"""Where a run's files go when no folder is named: a new folder under ``./gpuscope-runs/`` for each run."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.rundirs import RUNS_FOLDER, new_run_dir


def test_a_default_run_folder_is_named_for_the_script_and_the_second_it_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    folder = new_run_dir(None, "train")
    assert folder.parent == tmp_path / RUNS_FOLDER and folder.name.startswith("train-") and folder.is_dir()


def test_each_default_run_folder_is_its_own_even_when_started_in_the_same_second(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # processes of one script, each profiling itself, start together and ask for the same name: each looks before
    # any has made its folder (as if Path.exists always came first)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Path, "exists", lambda self: False)
    folders = [new_run_dir(None, "hogwild") for _ in range(3)]
    assert len(set(folders)) == 3 and all(f.is_dir() for f in folders)
