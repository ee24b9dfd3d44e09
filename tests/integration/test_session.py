"""A session in this very process: it measures a loop, and leaves no hook behind."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timing]  # real loops that sleep, and the default collectors' post-run probes
torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import gpuscope  # noqa: E402
from gpuscope.session import Session, active_session  # noqa: E402


class SleepyData(Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):
        time.sleep(0.004)
        return torch.randn(4), torch.randn(1)


def torch_hooks_in_place() -> dict[str, object]:
    from torch.optim import optimizer
    from torch.utils.data import dataloader

    return {
        "optimizer pre": dict(optimizer._global_optimizer_pre_hooks),
        "optimizer post": dict(optimizer._global_optimizer_post_hooks),
        "next": dataloader._BaseDataLoaderIter.__next__,
        "backward": torch.autograd.backward,
        "grad": torch.autograd.grad,
    }


def train(model: torch.nn.Module, batches: int = 12) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    waited = 0.0
    it = iter(DataLoader(SleepyData(), batch_size=1))
    for _ in range(batches):
        t = time.perf_counter()
        x, y = next(it)
        waited += time.perf_counter() - t
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return waited


def test_a_session_measures_the_loop_and_removes_every_hook(tmp_path: Path) -> None:
    before = torch_hooks_in_place()
    model = torch.nn.Linear(4, 1)
    session = Session(tmp_path, ["in-process"])
    session.start()
    assert active_session() is session
    train(model)
    record = session.stop(0)
    assert active_session() is None
    assert torch_hooks_in_place() == before
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert record.steps.total == 12
    assert record.breakdown.data_wait > 0.3
    assert (tmp_path / "run.json").exists()


def test_hooks_are_removed_when_the_code_raises(tmp_path: Path) -> None:
    before = torch_hooks_in_place()
    session = Session(tmp_path, ["in-process"])
    session.start()
    try:
        with pytest.raises(RuntimeError):
            train(torch.nn.Linear(4, 1), batches=3)
            raise RuntimeError("the user's loop failed")
    finally:
        session.stop(1)
    assert torch_hooks_in_place() == before


def test_code_that_fails_before_its_first_step_ends_is_told_so_and_no_probe_runs_it_again(tmp_path: Path) -> None:
    # an argparse error, or a bug in the first batch: nothing to time, so nothing is probed (the probes took 3 s)
    session = Session(tmp_path, ["in-process"])
    session.start()
    try:
        with pytest.raises(ZeroDivisionError):
            x, y = next(iter(DataLoader(SleepyData(), batch_size=1)))
            torch.nn.functional.mse_loss(torch.nn.Linear(4, 1)(x), y).backward()
            1 / 0  # the script's bug, before its first optimizer step
    finally:
        record = session.stop(1)
    assert record.steps.total == 0
    assert any("exit status 1, after 1 batch" in fact for fact in record.verdict.evidence), record.verdict.evidence
    probes = [name for name in ("calibration", "cpu-peak", "loader-probe", "data-probe") if name in record.collectors]
    assert probes
    for name in probes:
        assert record.collectors[name].status == "unavailable"
        assert "no steady-state step" in record.collectors[name].reason


def test_a_second_session_while_one_runs_is_an_error(tmp_path: Path) -> None:
    session = Session(tmp_path / "a", ["a"])
    session.start()
    try:
        with pytest.raises(gpuscope.errors.GpuscopeError, match="already running"):
            Session(tmp_path / "b", ["b"]).start()
    finally:
        session.stop(0)


def test_step_marks_outside_a_session_do_nothing() -> None:
    gpuscope.step()  # no session: must not raise


def test_the_data_wait_gpuscope_measures_matches_a_direct_measurement(tmp_path: Path) -> None:
    session = Session(tmp_path, ["in-process"])
    session.start()
    waited = train(torch.nn.Linear(4, 1), batches=12)
    record = session.stop(0)
    (loader,) = record.loaders
    assert loader.wait_s == pytest.approx(waited, rel=0.1)
