"""``gpuscope.profile()``: the same record, diagnosis and report as ``gpuscope run``, around a block of code; one at
a time; nothing left behind when it ends, normally or by an exception; usable again and again in one process."""

from __future__ import annotations

import html
import json
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real loops that sleep, and the post-run probes
torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import gpuscope  # noqa: E402
from conftest import load_run, run_gpuscope  # noqa: E402
from gpuscope.api import ProfileError  # noqa: E402
from gpuscope.session import active_session  # noqa: E402


class SlowData(Dataset):
    """Each item takes 6 ms to load: a loop over it waits for data most of the time."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        time.sleep(0.006)
        return torch.randn(8), torch.randn(1)


def train(steps: int = 18) -> None:
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(DataLoader(SlowData(), batch_size=2))
    for _ in range(steps):
        x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def global_state() -> dict[str, object]:
    """Everything a collector hooks into, process-wide: what must be exactly as it was after a profile."""
    from torch.optim import optimizer
    from torch.utils.data import dataloader

    return {
        "optimizer pre-hooks": dict(optimizer._global_optimizer_pre_hooks),
        "optimizer post-hooks": dict(optimizer._global_optimizer_post_hooks),
        "DataLoader __next__": dataloader._BaseDataLoaderIter.__next__,
        "autograd.backward": torch.autograd.backward,
        "autograd.grad": torch.autograd.grad,
        "set_anomaly_enabled": torch.set_anomaly_enabled,
        "Optimizer.zero_grad": torch.optim.Optimizer.zero_grad,
        "Module.zero_grad": torch.nn.Module.zero_grad,
        "gradcheck": torch.autograd.gradcheck,
        "sys.getprofile": sys.getprofile(),
        "sys.monitoring profiler": (sys.monitoring.get_tool(sys.monitoring.PROFILER_ID)  # cProfile on 3.12+
                                    if hasattr(sys, "monitoring") else None),
        "sys.gettrace": sys.gettrace(),
        "meta_path": list(sys.meta_path),
        "profiler on": torch.autograd.profiler._is_profiler_enabled,
        "anomaly mode": torch.is_anomaly_enabled(),
        "gpuscope threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("gpuscope")),
        "active session": active_session(),
    }


def test_a_profiled_block_gets_the_record_verdict_and_report_gpuscope_run_gives(tmp_path: Path) -> None:
    with gpuscope.profile(output=tmp_path / "run", quiet=True) as prof:
        train()
    assert prof.verdict.bound == "data-loading"
    assert prof.report_path == tmp_path / "run" / "report.html"
    assert prof.report_path.is_file()
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    assert saved["verdict"]["bound"] == prof.verdict.bound
    assert saved["steps"]["count"] >= 5
    assert saved["exit_status"] == 0
    assert (tmp_path / "run" / "python.prof").is_file(), saved["collectors"]["cprofile"]


def test_start_and_stop_work_without_a_with_block(tmp_path: Path) -> None:
    prof = gpuscope.profile(tmp_path, quiet=True)
    prof.start()
    train(steps=8)
    record = prof.stop()
    assert record.steps.total == 8
    assert prof.stop() is record  # stopping twice is harmless


def test_the_inline_report_is_isolated_in_an_iframe_and_holds_the_verdict(tmp_path: Path) -> None:
    with gpuscope.profile(tmp_path, quiet=True) as prof:
        train()
    inline = prof._repr_html_()
    assert inline.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts' in inline
    assert "allow-same-origin" not in inline  # its scripts cannot reach the notebook's page
    page = html.unescape(inline.split('srcdoc="', 1)[1].split('" sandbox=', 1)[0])
    assert page == prof.report_path.read_text(encoding="utf-8")
    assert "data-loading-bound" in page


def test_summary_prints_the_verdict_and_the_report_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with gpuscope.profile(tmp_path, quiet=True) as prof:
        train()
    assert capsys.readouterr().err == ""  # quiet
    prof.summary()
    out = capsys.readouterr().out
    assert "data-loading-bound" in out and str(prof.report_path) in out


def test_results_before_the_block_ends_are_a_clear_error(tmp_path: Path) -> None:
    with gpuscope.profile(tmp_path, quiet=True) as prof:
        with pytest.raises(ProfileError, match="has not stopped yet"):
            prof.verdict  # noqa: B018
        assert "running" in prof._repr_html_()


def test_a_profile_inside_a_profile_is_a_clear_error_and_the_outer_one_goes_on(tmp_path: Path) -> None:
    with gpuscope.profile(tmp_path / "outer", quiet=True) as outer:
        with pytest.raises(ProfileError, match="already running"):
            with gpuscope.profile(tmp_path / "inner", quiet=True):
                pass
        train(steps=8)
    assert outer.record.steps.total == 8
    assert not (tmp_path / "inner").exists()


def test_a_block_that_raises_leaves_nothing_behind_and_its_run_is_recorded(tmp_path: Path) -> None:
    train(steps=2)  # torch's own lazy state (DataLoader, optimizer) exists before the comparison
    before = global_state()
    with pytest.raises(RuntimeError, match="the user's loop failed"):
        with gpuscope.profile(tmp_path, quiet=True) as prof:
            train(steps=8)
            raise RuntimeError("the user's loop failed")
    assert global_state() == before
    assert prof.record.exit_status == 1
    assert prof.report_path.is_file()  # nothing the user ran is lost


def test_a_process_can_profile_many_times(tmp_path: Path) -> None:
    before = global_state()
    bounds = []
    for i in range(3):
        with gpuscope.profile(tmp_path / str(i), quiet=True) as prof:
            train()
        bounds.append(prof.verdict.bound)
        assert global_state() == before
    assert bounds == ["data-loading"] * 3


def test_the_default_folder_is_the_clis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "train.py"), "--lr", "0.1"])
    with gpuscope.profile(quiet=True) as prof:
        train(steps=4)
    assert prof.run_dir.parent == tmp_path / "gpuscope-runs"
    assert prof.run_dir.name.startswith("train-")
    assert prof.record.command == (str(tmp_path / "train.py"), "--lr", "0.1")


PROFILES_ITS_WORKER = '''
import multiprocessing, sys, time
import torch
import gpuscope

def train(out):
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuscope.profile(out, quiet=True, probes=False):
        for _ in range(12):
            time.sleep(0.002)
            loss = model(torch.randn(4, 8)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()

if __name__ == "__main__":
    worker = multiprocessing.get_context("fork").Process(target=train, args=(sys.argv[1],))
    worker.start()
    worker.join()
    sys.exit(worker.exitcode)
'''


def test_a_forked_worker_of_a_script_under_gpuscope_run_profiles_itself_as_under_python(tmp_path: Path) -> None:
    # what gpuscope advises where the training runs in child processes (a hogwild loop, torch.multiprocessing):
    # the parent's session, inherited by fork, is not the child's, so the child's own profile starts
    script = tmp_path / "hogwild.py"
    script.write_text(PROFILES_ITS_WORKER)
    result = run_gpuscope(["run", "-q", "--no-probes", "-o", str(tmp_path / "parent"), str(script),
                           str(tmp_path / "worker")], tmp_path, preloaded=True)
    assert result.returncode == 0, result.stderr
    assert load_run(tmp_path / "worker")["steps"]["total"] == 12
    parent = load_run(tmp_path / "parent")
    assert (parent["exit_status"], parent["steps"]["total"]) == (0, 0)
