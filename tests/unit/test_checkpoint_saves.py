"""``save-checkpoints-less-often``: checkpoint saves (``torch.save``, ``safetensors.torch.save_file``) timed call by
call with the step under way and the user's line, and their share of the training steps' time, which the median
step does not show."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
import pytest

from conftest import make_record
from gpuscope.collect.collectors.practices import PracticesCollector
from gpuscope.diagnose import analyze
from gpuscope.diagnose.rules.saving import save_checkpoints_less_often, save_share, training_saves
from gpuscope.record import Practices, RunRecord, StepSample, Steps

RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "records"


class Counted:
    """The part of the steps collector the practices collector reads: the steps completed so far."""

    def __init__(self) -> None:
        self.seen = 0

    def steps_seen(self) -> int:
        return self.seen


def test_each_save_is_timed_with_the_step_under_way_and_the_line_that_made_it() -> None:
    # given the practices collector's wrapper around a save that takes a known time on a virtual clock
    collector = PracticesCollector()
    collector._events = Counted()  # type: ignore[assignment]
    ticks = iter([10.0, 10.25, 20.0, 20.5])
    import gpuscope.collect.collectors.practices as practices

    real = practices.time.perf_counter
    practices.time.perf_counter = lambda: next(ticks)  # type: ignore[assignment]
    try:
        save = collector._wrap_save(lambda obj, path: None)
        for step in (25, 50):
            collector._events.seen = step  # type: ignore[union-attr]
            save({}, "a.pt")
    finally:
        practices.time.perf_counter = real  # type: ignore[assignment]
    # then each call is kept with its step and its time, and this file's line is named twice
    assert collector._save_steps == [25, 50] and collector._save_s == [0.25, 0.5]
    (site,) = collector._save_sites.sites()
    assert site.calls == 2 and site.file.endswith("test_checkpoint_saves.py")


def test_a_save_into_a_buffer_by_the_scripts_own_code_is_no_checkpoint(tmp_path: Path) -> None:
    import io

    torch = pytest.importorskip("torch")
    collector = PracticesCollector()
    collector._events = Counted()  # type: ignore[assignment]
    save = collector._wrap_save(torch.save)
    save({"x": 1}, io.BytesIO())  # a tensor serialised to be sent somewhere
    assert collector._save_s == []
    save({"x": 1}, tmp_path / "a.pt")  # a path
    save({"x": 1}, str(tmp_path / "b.pt"))
    with open(tmp_path / "c.pt", "wb") as file:  # an open file
        save({"x": 1}, file)
    assert len(collector._save_s) == 3 and (tmp_path / "c.pt").stat().st_size > 0


def run_saving(steps: tuple[int, ...], seconds: tuple[float, ...], total: int = 100) -> RunRecord:
    """A run of ``total`` steps at 40 ms (the sample: every one, steady) that saved in ``steps``."""
    sample = StepSample(index=tuple(range(total)), wall_s=(0.04,) * total, status=("steady",) * total)
    return make_record(steps=Steps(count=total, median_s=0.04, total=total, source="optimizer", sample=sample),
                       practices=Practices(checkpoint_save_steps=steps, checkpoint_save_s=seconds))


def test_saves_while_training_are_told_with_their_share_and_half_of_it_for_saving_half_as_often() -> None:
    # given a save before training (step 0), one every 10 steps of 0.1 s, and the trained model's after the loop
    run = run_saving((0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100), (0.3,) + (0.1,) * 9 + (0.3,))
    # then the nine saves made while it trained count: 0.9 s against 100 steps of 40 ms
    assert [step for step, _ in training_saves(run)] == [10, 20, 30, 40, 50, 60, 70, 80, 90]
    assert save_share(run) == pytest.approx(0.9 / (4.0 + 0.9))
    finding = save_checkpoints_less_often(run)
    assert finding.gain == pytest.approx(0.9 / 4.9 / 2)
    assert finding.evidence[0].startswith("9 checkpoints saved while the loop trained, every 10 steps, 100 ms each: "
                                          "0.90 s, 18% of the training steps' time")
    # a checkpoint of several files (a Trainer's weights, optimizer and scheduler) is one checkpoint
    run = run_saving((10, 10, 10, 20, 20, 20), (0.5, 0.2, 0.1) * 2)
    assert save_checkpoints_less_often(run).evidence[0].startswith(
        "2 checkpoints saved while the loop trained (6 files saved), every 10 steps, 800 ms each: 1.60 s")


def test_a_save_now_and_then_is_not_worth_a_recommendation() -> None:
    assert save_checkpoints_less_often(run_saving((50,), (0.1,))) is None  # 0.1 s of 4.1 s: 2%
    # one checkpoint, however long, is no habit: the trained model's, saved as the last step ended
    assert save_checkpoints_less_often(run_saving((99,), (2.0,))) is None
    assert save_checkpoints_less_often(run_saving((), ())) is None


def test_a_recorded_loop_saving_every_five_steps_is_told_to_save_every_ten() -> None:
    # given a recorded MLP saving itself and its Adam state (60 MB) every 5 steps (tests/fixtures/records/README.md)
    record = analyze(RunRecord.from_json(json.loads((RECORDS / "checkpoint_every.json").read_text())))
    found = {r.id: r for r in record.recommendations}["save-checkpoints-less-often"]
    # then 51 saves, 3.65 s, against 256 steps at the 34.8 ms median of the steady steps that did not save: 29%
    assert found.expected_gain == pytest.approx(0.29 / 2, abs=0.002)
    assert found.evidence[0].startswith('51 checkpoints saved while the loop trained at checkpoint_every.py:15 `torch.'
                                        'save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, '
                                        '"ckpt.pt")`, every 5 steps, 72 ms each: 3.65 s, 29% of the training steps')
    assert found.fix.startswith("checkpoint_every.py:15: save every 10 steps instead of every 5")
    # where a library saved for the script, the fix is that library's setting
    library = dataclasses.replace(record, practices=dataclasses.replace(record.practices,
                                                                       checkpoint_save_by="transformers"))
    assert save_checkpoints_less_often(library).fix.startswith("TrainingArguments(..., save_steps=10)  # saves "
                                                                "every 5 steps now")
    from gpuscope.diagnose.rules.base import RULES, Refused

    assert isinstance(next(r for r in RULES if r.id == "save-checkpoints-less-often").trial, Refused)


def test_safetensors_saves_are_timed_once_imported() -> None:
    pytest.importorskip("safetensors.torch")
    import safetensors.torch

    collector = PracticesCollector()
    collector._events = Counted()  # type: ignore[assignment]
    original = safetensors.torch.save_file
    collector._install_safetensors()
    try:
        assert safetensors.torch.save_file.__wrapped__ is original  # gpuscope's timing wrapper
    finally:
        for undo in reversed(collector._undo):
            undo()
    assert safetensors.torch.save_file is original
