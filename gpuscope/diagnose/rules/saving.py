"""Rules about checkpoint saves in the training loop (``practices.checkpoint_save_*``): time the median step leaves
out, paid every few steps."""

from __future__ import annotations

import statistics

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import STEP, Metric
from gpuscope.diagnose.rules.base import Finding, Refused, rule
from gpuscope.record import RunRecord


LIBRARY_FIX = {
    "transformers": "TrainingArguments(..., save_steps={twice})  # saves every {every} steps now: what a crash loses "
                    "doubles",
    "lightning": "ModelCheckpoint(..., every_n_train_steps={twice})  # saves every {every} steps now: what a crash "
                 "loses doubles",
    "pytorch_lightning": "ModelCheckpoint(..., every_n_train_steps={twice})  # saves every {every} steps now: what a "
                         "crash loses doubles",
}
"""The fix where a library saves for the user, by the library whose code called the save."""


def training_saves(run: RunRecord) -> list[tuple[int, float]]:
    """The checkpoint saves made while the loop trained: (the step under way, seconds), those in the first step (a
    save before training) and after the last one (the trained model's, once) left out."""
    p = run.practices
    if p is None or not run.steps.total:
        return []
    return [(step, seconds) for step, seconds in zip(p.checkpoint_save_steps, p.checkpoint_save_s)
            if 1 <= step < run.steps.total]


def save_share(run: RunRecord, saves: list[tuple[int, float]] | None = None) -> float | None:
    """The saves' share of the training steps' time: their seconds over the steps at their median without a save
    plus the saves (the median of all leaves out the few steps that saved, or is raised by them where one step in a
    few saves); None without steps. ``saves``: ``training_saves(run)``, where already read."""
    if not run.steps.count or not run.steps.median_s:
        return None
    saves = training_saves(run) if saves is None else saves
    saved = sum(seconds for _, seconds in saves)
    return saved / (_median_without_saves(run, {step for step, _ in saves}) * run.steps.total + saved)


def _median_without_saves(run: RunRecord, saved_in: set[int]) -> float:
    """The median of the sampled steady steps that made no save (the steady median where fewer than
    ``MIN_STEADY_STEPS`` of them are sampled)."""
    sample = run.steps.sample
    walls = [wall for index, wall, status in zip(sample.index, sample.wall_s, sample.status)
             if status == "steady" and index not in saved_in]
    return statistics.median(walls) if len(walls) >= th.MIN_STEADY_STEPS else run.steps.median_s


@rule(id="save-checkpoints-less-often",
      title="Save checkpoints less often, or in the background",
      fix="save every 2N steps instead of every N, or in the background: torch.distributed.checkpoint.async_save",
      needs=("practices",),
      resolved_by=(Metric("checkpoint saves' share of the training time", "share", save_share), STEP),
      trial=Refused("it changes how much training a crash loses, not only the speed"))
def save_checkpoints_less_often(run: RunRecord) -> Finding | None:
    """Signal: checkpoint saves (``torch.save``, ``safetensors.torch.save_file``, timed call by call) made in two steps
    or more while the loop trained take ``SAVES_NOTABLE`` of the training steps' time or more (``save_share``): the
    median step leaves them out, as the steps that save are few, and the run pays them all the same.
    Why it matters: each save stops training while the state is serialised and written (a 60 MB model and its Adam
    state every 25 steps of 44 ms: 65 ms a save, 6% of the run).
    Fix: save half as often (the gain: half their time), or in the background (``async_save``, or a thread writing
    a CPU copy of the state dict: most of it).
    Gain: half the saves' share, for saving half as often."""
    saves = training_saves(run)
    share = save_share(run, saves)
    p = run.practices
    steps = [step for step, _ in saves]
    if len(set(steps)) < 2 or share is None or share < th.SAVES_NOTABLE or p is None:
        return None  # (one checkpoint is no habit to save less often: the trained model's, saved as it ended)
    gaps = [b - a for a, b in zip(steps, steps[1:]) if b > a]
    every = round(statistics.median(gaps)) if gaps else None
    site = p.checkpoint_save_sites[0] if p.checkpoint_save_sites else None
    where = f" at {site.file}:{site.line} `{site.code}`" if site is not None and site.file else ""
    seconds, saved_in = sum(s for _, s in saves), len(set(steps))  # (a checkpoint may be several files)
    often = f", every {every} step{'s' * (every != 1)}" if every else ""
    files = f" ({len(saves)} files saved)" if len(saves) > saved_in else ""
    evidence = (f"{saved_in} checkpoint{'s' * (saved_in != 1)} saved while the loop trained{files}{where}{often}, "
                f"{seconds / saved_in * 1e3:.0f} ms each: {seconds:.2f} s, {share:.0%} of the training steps' time "
                f"(the median step, {run.steps.median_s * 1e3:.1f} ms, does not show them)",)
    library = p.checkpoint_save_by.split(",")[0]
    if every and library in LIBRARY_FIX:
        fix = LIBRARY_FIX[library].format(every=every, twice=2 * every)
    elif every and site is not None and site.file and not library:
        fix = (f"{site.file}:{site.line}: save every {2 * every} steps instead of every {every} (what a crash "
               "loses doubles), or in the background: torch.distributed.checkpoint.async_save, or a thread writing "
               "a copy of the state dict moved to the CPU")
    else:
        fix = None
    return Finding(share / 2, evidence, fix=fix)
