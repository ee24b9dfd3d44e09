"""The trials of ``gpuscope run --try`` in words: one line each, for the terminal and the report."""

from __future__ import annotations

from gpuscope.diagnose.trials import slower, unchanged
from gpuscope.record import Trial


def speedup_words(trial: Trial) -> str:
    """``5.5x (95%: 5.3x-5.7x)``; ``0.56x slower (95%: ...)`` where the step got longer; ``no measurable change:
    1.03x (95%: 0.95x-1.13x)`` where the interval holds 1."""
    if trial.speedup is None:
        return ""
    interval = f" (95%: {trial.speedup_low:.2f}x-{trial.speedup_high:.2f}x)" \
        if trial.speedup_low is not None and trial.speedup_high is not None else ""
    if unchanged(trial):
        return f"no measurable change: {trial.speedup:.2f}x{interval}"
    return f"{trial.speedup:.2f}x{' slower' if slower(trial) else ''}{interval}"


def estimate_words(trial: Trial) -> str:
    """The estimate the recommendation gave, as a speed-up: ``estimated 1.95x``; ``no estimate``."""
    gain = trial.estimated_gain
    if gain is None:
        return "no estimate"
    return f"estimated {1 / (1 - gain):.2f}x" if gain < 1 else "estimated more than 100x"


def loss_words(trial: Trial) -> str:
    """``loss steps 20-60 within 0.3%``, ``loss NOT FINITE from step 12``, ``loss drifted 8.1% (tolerance 2.0%)``."""
    check = trial.loss
    if check is None or check.status == "not compared":
        return "loss not compared"
    span = f"steps {check.first_step}-{check.last_step}"
    cause = f" ({check.cause})" if check.cause else ""
    if check.status == "not finite":
        return f"loss NOT FINITE from step {check.first_step}: speed not credited{cause}"
    if check.status == "drifted":
        return f"loss drifted {check.drift:.1%} over {span} (within {check.tolerance:.1%} is the same): speed not " \
               f"credited{cause}"
    return f"loss {span} within {check.drift:.1%}"


def trial_line(trial: Trial) -> str:
    """One line: ``tf32  35.7 -> 6.5 ms a step  5.49x (95%: ...)  estimated 1.95x  loss steps 20-60 within 0.3%``."""
    if trial.status != "measured":
        return f"{trial.id}: {trial.status}" + (f": {trial.reason}" if trial.reason else "")
    before, after = trial.step_before_s or 0.0, trial.step_after_s or 0.0
    return (f"{trial.id}: {before * 1e3:.3g} -> {after * 1e3:.3g} ms a step  {speedup_words(trial)}  "
            f"{estimate_words(trial)}  {loss_words(trial)}{memory_words(trial)}")


def memory_words(trial: Trial) -> str:
    """``  peak memory 512 MB -> 260 MB``, where both runs' peaks were sampled; else nothing."""
    before, after = trial.peak_memory_before_bytes, trial.peak_memory_after_bytes
    if before is None or after is None:
        return ""
    return f"  peak memory {before / 1e6:.0f} MB -> {after / 1e6:.0f} MB"


def applied_lines(trials: tuple[Trial, ...]) -> list[str]:
    """``apply: <the change>`` for each fix the trials measured faster with the loss unchanged, fastest first."""
    faster = [t for t in trials if t.credited]
    return [f"apply: {t.change}" for t in sorted(faster, key=lambda t: -(t.speedup or 0))]


__all__ = ["applied_lines", "estimate_words", "loss_words", "memory_words", "speedup_words", "trial_line"]
