"""Trying fixes (``gpuscope run --try``): which recommendations can be applied at run time and with what values,
how many steps a trial runs, and, from the untouched run's record and a trial's, what the fix measured: the
speed-up over the steps both ran after the fix took effect, and whether the loss stayed where it was.

Pure functions of records; running the trials is ``gpuscope.trials``'s, applying a fix ``collect.fixes``'s.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.clock import step_times
from gpuscope.diagnose.rules import RULES, AtRunTime, Refused, by_id, finding
from gpuscope.record import Effect, LossCheck, Recommendation, RunRecord, Trial

APPLIED_AT_RUN_TIME = frozenset(r.id for r in RULES if isinstance(r.trial, AtRunTime))
"""The fixes gpuscope can apply to an unchanged script as it runs (``collect.fixes``): each rule says (``trial``)."""

REFUSED = {r.id: r.trial.reason for r in RULES if isinstance(r.trial, Refused)}
"""Why each other fix is not tried: it needs the user's code edited, or it changes more than the speed."""


@dataclass(frozen=True, slots=True)
class TrialPlan:
    """One fix to try: its recommendation id, the change as its fix writes it, the values ``collect.fixes`` applies,
    and the environment the trial runs with (the allocator's thresholds)."""

    id: str
    change: str
    settings: dict[str, object] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    estimated_gain: float | None = None


def known_ids() -> frozenset[str]:
    """Every recommendation id a rule of this gpuscope can give."""
    return frozenset(r.id for r in RULES)


def refusal(rec_id: str) -> str | None:
    """Why ``rec_id`` cannot be tried, or None where it can."""
    if rec_id in APPLIED_AT_RUN_TIME:
        return None
    return REFUSED.get(rec_id, "gpuscope cannot apply it to an unchanged script")


def plan(rec_id: str, record: RunRecord) -> TrialPlan | Trial:
    """How to try ``rec_id`` on the script of ``record``: with the values of the rule's finding on it where the run
    recommended the fix, over the rule's own (``AtRunTime``); a refused ``Trial`` where it cannot be applied as it
    stands. The values are the rule's data, never read back out of its fix's words."""
    reason = refusal(rec_id)
    if reason is not None:
        return Trial(id=rec_id, status="refused", reason=reason)
    rule = by_id(rec_id)
    tried: AtRunTime = rule.trial  # type: ignore[assignment]
    recommended = next((r for r in record.recommendations if r.id == rec_id), None)
    found = finding(record, rec_id) if recommended is not None else None
    settings = {**tried.settings, **(tried.settings_of(record) if tried.settings_of else {}),
                **(found.settings if found is not None else {})}
    env = {**tried.env, **(found.env if found is not None else {})}
    change = recommended.fix if recommended is not None else rule.fix
    for name, why in tried.requires.items():
        if name not in settings:
            return Trial(id=rec_id, status="refused", change=change, reason=why)
    if tried.change:
        change = tried.change.format(**settings)
    if tried.cuda_only and record.device != "cuda":
        return Trial(id=rec_id, status="refused", change=change, reason=f"a CPU run: {tried.cuda_only}")
    return TrialPlan(rec_id, change, settings, env,
                     recommended.expected_gain if recommended is not None else None)


def window(record: RunRecord) -> int:
    """Steps a trial runs: as many as the untouched run had, up to those that take ``TRIAL_MAX_S`` at its median
    step, but at least ``TRIAL_STEADY_STEPS`` past its last profiled step (its windows come first; a trial has the
    same)."""
    sample = record.steps.sample
    total = max(record.steps.total, max(sample.index, default=-1) + 1)
    profiled = max((i for i, s in zip(sample.index, sample.status) if s == "profiled"), default=-1) + 1
    median = record.steps.median_s
    wanted = max(profiled + th.TRIAL_STEADY_STEPS, int(th.TRIAL_MAX_S / median)) if median > 0 else total
    return max(1, min(total, wanted))


def estimated_s(record: RunRecord, steps: int) -> float:
    """About how long a trial of ``steps`` steps takes: the untouched run's start-up (its time less its steps') and
    that many of its steps."""
    stepped = record.steps.total * record.steps.mean_s
    startup = max(0.0, record.meta.duration_s - stepped)
    return startup + steps * max(record.steps.mean_s, record.steps.median_s)


@dataclass(frozen=True, slots=True)
class Round:
    """One round of a trial: an untouched run and the run with the fix, one after the other (the first round's
    untouched run is the user's own; a later one's, the script run again untouched), and the step from which the
    fix was in effect."""

    base: RunRecord
    tried: RunRecord
    applied_at: int


def measure(rounds: Sequence[Round], trial_plan: TrialPlan, steps: int, natural_drift: float = 0.0) -> Trial:
    """What the fix measured over ``rounds``, each ``steps`` steps: the untouched runs' step over the runs' with the
    fix (``mean_step``), on the steady steps each pair ran after the fix took effect, pooled, with a 95% interval
    that resamples the rounds and the steps within them (runs of one script differ from process to process by more
    than their steps do within one); and the loss check (``natural_drift``: how far two untouched runs' losses are
    apart)."""
    trial = Trial(id=trial_plan.id, status="measured", change=trial_plan.change, steps=steps,
                  estimated_gain=trial_plan.estimated_gain, runs=len(rounds))
    pairs: list[tuple[list[float], list[float]]] = []
    checks = []
    for r in rounds:
        start = r.applied_at + 1  # the step in which it took effect ran part of it without
        before, after = _steady(r.base, start, steps), _steady(r.tried, start, steps)
        common = sorted(before.keys() & after.keys())
        checks.append(loss_check(r.base, r.tried, start, steps, natural_drift))
        if len(common) >= th.MIN_STEADY_STEPS:
            pairs.append(([before[i] for i in common], [after[i] for i in common]))
    loss = max(checks, key=lambda c: (LOSS_SEVERITY[c.status], c.drift or 0.0)) if checks else LossCheck()
    if loss.status in ("drifted", "not finite") and trial.id in AUTOCAST_TRIALS and rounds:
        loss = dataclasses.replace(loss, cause=probability_loss_cause(rounds[0].base))
    tensors = bool(rounds) and all(_window_peak(r.base) and _window_peak(r.tried) for r in rounds)
    trial = dataclasses.replace(trial, loss=loss, losses=rounds[0].tried.loss if rounds else None,
                                peak_memory_before_bytes=_highest(peak_memory(r.base, tensors) for r in rounds),
                                peak_memory_after_bytes=_highest(peak_memory(r.tried, tensors) for r in rounds))
    if not pairs:
        return dataclasses.replace(trial, status="failed", runs=0,
                                   reason=f"fewer than {th.MIN_STEADY_STEPS} steady steps of both runs after the fix "
                                          "took effect")
    a = [t for pair in pairs for t in pair[0]]
    b = [t for pair in pairs for t in pair[1]]
    step_a, step_b = mean_step(a), mean_step(b)
    low, high = bootstrap_rounds(pairs)
    speedup = step_a / step_b
    found = effect(low, high)
    credited = loss.status in ("within", "not compared") and found == "faster"
    return dataclasses.replace(
        trial, runs=len(pairs), compared_steps=len(a), step_before_s=step_a, step_after_s=step_b,
        speedup=speedup, speedup_low=low, speedup_high=high, credited=credited, effect=found,
        measured_gain=1 - 1 / speedup if credited else None)


def _window_peak(record: RunRecord) -> int:
    return record.memory.peak_bytes if record.memory is not None and record.memory.steps else 0


def peak_memory(record: RunRecord, tensors: bool = False) -> int | None:
    """A run's peak memory: ``tensors``, torch's tensors at its memory window's peak (what the memory fixes' savings
    are predicted on; the allocator's cache and Python's own memory left out); else the CUDA allocator's peak
    allocated bytes on a CUDA run, the process's peak resident memory on a CPU one; None where none was measured."""
    if tensors:
        return _window_peak(record) or None
    if record.device == "cuda" and record.cuda_memory is not None:
        return record.cuda_memory.peak_allocated_bytes
    return record.host_memory.peak_process_bytes if record.host_memory is not None else None


def _highest(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def effect(low: float, high: float) -> Effect:
    """What a trial's interval of the speed-up says: ``faster`` where it lies above 1, ``slower`` where below, and
    ``no measurable change`` where it holds 1 (a gain inside the noise is no gain to rank a fix by)."""
    return "faster" if low > 1 else "slower" if high < 1 else "no measurable change"


LOSS_SEVERITY = {"not compared": 0, "within": 1, "drifted": 2, "not finite": 3}
"""Which of a trial's rounds' loss checks it reports: the worst."""
RESAMPLES, LEVEL, SEED = 1000, 0.95, 20260101


def mean_step(times: Sequence[float]) -> float:
    """The mean step: the run's pace, its throughput's inverse. Not the median, which misreads a loop whose steps
    alternate fast and slow (a Trainer's 2 workers delivering in rounds: 5 and 44 ms, median 5 or 44 by chance, mean
    24.5); nor a trimmed mean, which leaves out the long steps that are the waits making such a loop slow."""
    return statistics.fmean(times)


def bootstrap_rounds(pairs: Sequence[tuple[Sequence[float], Sequence[float]]], resamples: int = RESAMPLES,
                     level: float = LEVEL, seed: int = SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of the step before over the step after (``mean_step``), pooled over rounds:
    each resample draws the rounds with replacement (a round's two runs together), then each drawn round's steps with
    replacement. Deterministic for a given seed."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        drawn = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        a = [t for before, _ in drawn for t in rng.choices(before, k=len(before))]
        b = [t for _, after in drawn for t in rng.choices(after, k=len(after))]
        ratios.append(mean_step(a) / mean_step(b))
    ratios.sort()
    tail = (1 - level) / 2
    return ratios[round(tail * (resamples - 1))], ratios[round((1 - tail) * (resamples - 1))]


def _steady(record: RunRecord, start: int, end: int) -> dict[int, float]:
    """The steady steps of ``record``'s sample from ``start`` to before ``end``, by index, on its steps' clock."""
    sample = record.steps.sample
    status = sample.status or ("steady",) * len(sample.index)
    return {i: t for i, t, s in zip(sample.index, step_times(record.steps), status)
            if start <= i < end and s == "steady" and t > 0 and math.isfinite(t)}


AUTOCAST_TRIALS = ("mixed-precision", "cpu-mixed-precision")
"""The trials that run the model under autocast."""


def probability_loss_cause(base: RunRecord) -> str:
    """What an autocast trial's loss left the untouched run's by, where the step computes a binary cross-entropy on
    probabilities (``nn.BCELoss``): under autocast the sigmoid before it runs in 16 bits and rounds them."""
    loss = base.speed_of_light.probability_loss if base.speed_of_light is not None else None
    if loss is None:
        return ""
    site = loss.called_at
    where = f" at {site.file}:{site.line}" if site is not None and site.file else ""
    return (f"the step computes BCELoss on probabilities{where}, which autocast's 16-bit sigmoid rounds near 1: "
            "nn.BCEWithLogitsLoss on the logits keeps the loss")


def loss_check(base: RunRecord, tried: RunRecord, start: int, end: int, natural_drift: float = 0.0) -> LossCheck:
    """The trial's loss against the untouched run's over the steps both kept from ``start`` to before ``end``:
    not finite where any of the trial's was (from the step the fix took effect) and none of the untouched run's;
    else their means' relative difference against a tolerance made of the untouched run's own step-to-step spread
    (``LOSS_SPREADS`` standard errors of the difference), ``LOSS_NATURAL`` times ``natural_drift`` (two untouched
    runs' own difference) and ``LOSS_DRIFT_FLOOR``, whichever is largest."""
    if base.loss is None or tried.loss is None:
        return LossCheck(note="no loss to compare: the loop called backward() on no one-element tensor")
    mine = {i: v for i, v in zip(base.loss.index, base.loss.value) if start <= i < end}
    theirs = {i: v for i, v in zip(tried.loss.index, tried.loss.value) if start <= i < end}
    bad = sorted(i for i, v in theirs.items() if not _finite(v))
    if bad and not any(not _finite(v) for v in mine.values()):
        return LossCheck("not finite", bad[0], bad[-1],
                         note=f"the trial's loss was not finite from step {bad[0]} ({len(bad)} steps), where the "
                              "untouched run's was")
    common = sorted(i for i in mine.keys() & theirs.keys() if _finite(mine[i]) and _finite(theirs[i]))
    if len(common) < th.MIN_STEADY_STEPS:
        return LossCheck(note=f"{len(common)} steps with a finite loss in both runs: too few to compare")
    a = [float(mine[i]) for i in common]  # type: ignore[arg-type]
    b = [float(theirs[i]) for i in common]  # type: ignore[arg-type]
    mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
    if mean_a == 0:
        return LossCheck(first_step=common[0], last_step=common[-1], note="the untouched run's mean loss is 0")
    drift = abs(mean_b - mean_a) / abs(mean_a)
    steps_apart = [y - x for x, y in zip(a, a[1:])]
    noise = statistics.stdev(steps_apart) / math.sqrt(2) if len(steps_apart) > 1 else 0.0
    tolerance = max(th.LOSS_DRIFT_FLOOR, th.LOSS_SPREADS * noise * math.sqrt(2 / len(common)) / abs(mean_a),
                    th.LOSS_NATURAL * natural_drift)
    status = "within" if drift <= tolerance else "drifted"
    note = (f"mean loss over steps {common[0]}-{common[-1]}: {mean_a:.4g} untouched, {mean_b:.4g} with the fix "
            f"({drift:.1%} apart; within {tolerance:.1%} counts as the same: the untouched runs' own spread, as an "
            "unseeded script's two runs differ anyway)")
    return LossCheck(status, common[0], common[-1], drift, tolerance, note)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def slower(trial: Trial) -> bool:
    """Whether the trial measured the step slower: its whole interval below 1 (its point estimate, without one)."""
    if trial.status != "measured" or trial.speedup is None:
        return False
    return trial.speedup_high < 1 if trial.speedup_high is not None else trial.speedup < 1


def unchanged(trial: Trial) -> bool:
    """Whether the trial measured no change it could tell from the noise: its interval holds 1."""
    return trial.status == "measured" and trial.effect == "no measurable change"


def rerank(recommendations: Sequence[Recommendation], trials: Sequence[Trial]) -> tuple[Recommendation, ...]:
    """The recommendations ranked with what the trials measured: a measured gain takes the estimate's place; a fix
    that measured no change it could tell from the noise, or whose loss check failed, comes after the others, one
    measured slower last."""
    tried = {t.id: t for t in trials if t.status == "measured"}

    def key(item: tuple[int, Recommendation]) -> tuple[int, float, int]:
        position, rec = item
        trial = tried.get(rec.id)
        if trial is not None and slower(trial):
            group = 2
        elif trial is not None and not trial.credited:
            group = 1
        else:
            group = 0
        gain = trial.measured_gain if trial is not None and trial.credited else rec.expected_gain
        return group, -(gain if gain is not None else -1.0), position

    return tuple(rec for _, rec in sorted(enumerate(recommendations), key=key))


def with_trials(record: RunRecord, trials: Sequence[Trial]) -> RunRecord:
    """``record`` with its trials and its recommendations re-ranked by them."""
    return dataclasses.replace(record, trials=tuple(trials),
                               recommendations=rerank(record.recommendations, trials))


__all__ = ["APPLIED_AT_RUN_TIME", "REFUSED", "Round", "TrialPlan", "bootstrap_rounds", "estimated_s",
           "effect", "known_ids", "loss_check", "mean_step", "measure", "plan", "refusal", "rerank", "slower",
           "unchanged", "window",
           "with_trials"]
