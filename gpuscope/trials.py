"""``gpuscope run --try ID[,ID...]|auto``: after the run, the script again once per fix, each in a fresh process
under gpuscope with the fix applied at run time (``collect.fixes``), over the same steps; then what each measured
against the untouched run (``diagnose.trials``) in run.json, the report, and the terminal.

A trial is ``gpuscope run`` itself, with two options the user does not see: ``--apply-fix`` (the fix and its
values, as JSON) and ``--stop-after-steps`` (``collect.fixes.TrialStop`` at that step's first safe point). It
writes ``trial.json`` beside its run.json: the step from which the fix was in effect, and what it noted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose import trials as plans
from gpuscope.diagnose.trials import TrialPlan
from gpuscope.errors import GpuscopeError
from gpuscope.options import RunOptions
from gpuscope.pipeline import conclude, render
from gpuscope.record import RunRecord, Trial, load_record

AUTO = "auto"
DEFAULT_TRY_BUDGET_S = 300.0
"""``--try-budget``'s default: five minutes of trials for ``--try auto``."""
CHILD = "import sys\nfrom gpuscope.cli import main\nsys.exit(main())"
"""A trial's run of the script: ``python -c CHILD run ...`` rather than ``python -m gpuscope run ...``, whose runpy
and ``__main__`` frames would lie under the script's. Whatever walks the whole stack pays for each frame: anomaly
detection formats it for every autograd node, about 7 us a frame a node here, so that the arm with the
anomaly-mode fix would gain its share of gpuscope's frames too (benchmarks/README.md, "A fix credited only where it is measured")."""
TRIAL_JSON = "trial.json"
OUTPUT_LOG = "output.log"
"""The trial's script's stdout and stderr (the user's terminal gets one line a trial)."""
APPLY_FIX, STOP_AFTER = "--apply-fix", "--stop-after-steps"
TIMEOUT_FACTOR, TIMEOUT_MIN_S = 4.0, 120.0
"""A trial still running after this many times its estimated time (and this long at least) is stopped: a fix that
hangs the script (a compile that never ends) costs the user minutes, not the night."""


def requested(text: str) -> list[str] | str:
    """``--try``'s value: ``auto``, or recommendation ids separated by commas, each one a fix gpuscope can apply (else
    a one-line error before anything runs)."""
    if text.strip() == AUTO:
        return AUTO
    ids = [part.strip() for part in text.split(",") if part.strip()]
    if not ids:
        raise GpuscopeError("--try needs recommendation ids separated by commas, or auto")
    known = plans.known_ids()
    for rec_id in ids:
        if rec_id not in known:
            raise GpuscopeError(f"--try {rec_id}: no such recommendation id (see docs/recommendation-ids.md)")
        if (reason := plans.refusal(rec_id)) is not None:
            raise GpuscopeError(f"--try {rec_id}: not tried at run time: {reason}")
    return list(dict.fromkeys(ids))


def run_trials(record: RunRecord, run_dir: Path, command: Sequence[str], options: RunOptions, wanted: list[str] | str,
               budget_s: float, quiet: bool = False, steps: int | None = None) -> RunRecord:
    """Try each fix ``wanted`` (``auto``: the run's own recommendations that can be applied at run time, best first,
    while their estimated time fits ``budget_s``) on ``command``, ``TRIAL_ROUNDS`` runs each of ``steps`` steps
    (default: ``diagnose.trials.window``), in rounds: the fixes one after another beside the untouched run, then the
    untouched script again and the fixes again (not one whose first run's loss was not finite: it cannot be credited,
    whatever its speed). Return the record with the trials, written, and its report rendered again."""
    say = (lambda line: None) if quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    if record.exit_status != 0 or not record.steps.count:
        why = "the script failed" if record.exit_status != 0 else "no steady step was measured"
        say(f"gpuscope: no fix tried: {why}")
        return record
    steps = min(steps, record.steps.total) if steps is not None else plans.window(record)
    rounds = th.TRIAL_ROUNDS
    each_s = plans.estimated_s(record, steps)
    ids = [r.id for r in record.recommendations if plans.refusal(r.id) is None] if wanted == AUTO else list(wanted)
    trials: dict[str, Trial] = {}
    chosen: list[TrialPlan] = []
    for rec_id in ids:
        found = plans.plan(rec_id, record)
        if isinstance(found, Trial):
            trials[rec_id] = found
        elif wanted == AUTO and chosen and ((len(chosen) + 1) * rounds + rounds - 1) * each_s > budget_s:
            trials[rec_id] = Trial(id=rec_id, status="not run", change=found.change,
                                   reason=f"over --try-budget {budget_s:.0f} s ({rounds} runs a fix, about "
                                          f"{each_s:.0f} s each)")
        else:
            chosen.append(found)
    if not ids:
        say("gpuscope: no fix tried: none of this run's recommendations can be applied at run time")
    if chosen:
        say(f"gpuscope: trying {len(chosen)} fix{'es' * (len(chosen) > 1)}, {rounds} runs of {steps} steps each, "
            f"beside the script untouched (about {each_s:.0f} s a run): {', '.join(p.id for p in chosen)}")
    done: dict[str, list[plans.Round]] = {p.id: [] for p in chosen}
    failures: dict[str, Trial] = {}
    settled: set[str] = set()  # fixes whose first run's loss was not finite: not credited whatever their speed
    notes_of: dict[str, list[str]] = {p.id: [] for p in chosen}
    bases = [record]
    for number in range(1, rounds + 1):
        if number > 1 and all(p.id in failures or p.id in settled for p in chosen):
            break  # (no fix is left to run again: the untouched script is not run again either)
        if number > 1:
            control = _run_once(None, run_dir / f"try-untouched-{number}", command, options, steps, each_s)
            if isinstance(control, str):
                say(f"  the untouched script's run {number} failed ({control}): no more runs")
                break
            bases.append(control[0])
        for trial_plan in chosen:
            if trial_plan.id in failures or trial_plan.id in settled:
                continue
            folder = f"try-{trial_plan.id}" + (f"-{number}" if number > 1 else "")
            outcome = _run_once(trial_plan, run_dir / folder, command, options, steps, each_s)
            if isinstance(outcome, str) and not done[trial_plan.id]:
                failures[trial_plan.id] = Trial(id=trial_plan.id, status="failed", reason=outcome, steps=steps,
                                                change=trial_plan.change, run_dir=folder,
                                                estimated_gain=trial_plan.estimated_gain)
                continue
            if isinstance(outcome, str):  # measured in an earlier round: this run is only missing
                notes_of[trial_plan.id].append(f"run {number} failed: {outcome}")
                continue
            tried, applied_at, notes = outcome
            done[trial_plan.id].append(plans.Round(bases[-1], tried, applied_at))
            if notes:
                notes_of[trial_plan.id].append(notes)
            if plans.loss_check(bases[-1], tried, applied_at + 1, steps).status == "not finite" and number < rounds:
                settled.add(trial_plan.id)
                notes_of[trial_plan.id].append("run once: its loss was not finite, so it cannot be credited")
            if number == 1:
                _compare_page(record, tried, run_dir / folder)
    natural = _natural_drift(bases, steps)
    for trial_plan in chosen:
        if trial_plan.id in failures:
            trial = failures[trial_plan.id]
        else:
            trial = plans.measure(done[trial_plan.id], trial_plan, steps, natural)
            notes = "; ".join(dict.fromkeys(notes_of[trial_plan.id]))
            trial = dataclasses.replace(trial, run_dir=f"try-{trial_plan.id}", reason=trial.reason or notes or None)
        trials[trial_plan.id] = trial
        say(f"  {_line(trial)}")
    ordered = [trials[i] for i in ids if i in trials]
    for line in _applied(tuple(ordered)):
        say(f"  {line}")
    updated = conclude(plans.with_trials(record, ordered), run_dir, diagnosed=True)
    render(updated, run_dir)
    return updated


def _natural_drift(bases: list[RunRecord], steps: int) -> float:
    """How far the untouched runs' losses are apart (0.0 with one run, or without a loss)."""
    if len(bases) < 2:
        return 0.0
    return plans.loss_check(bases[0], bases[1], 0, steps).drift or 0.0


def _run_once(trial_plan: TrialPlan | None, trial_dir: Path, command: Sequence[str], options: RunOptions,
              steps: int, each_s: float) -> tuple[RunRecord, int, str] | str:
    """One run of the script for ``steps`` steps into ``trial_dir``, with the fix of ``trial_plan`` (None: untouched):
    its record, the step from which the fix was in effect and its notes; or why it failed, in words."""
    folder = trial_dir.name
    argv = [sys.executable, "-c", CHILD, "run", *_options(options), "--no-probes", "-q", "-o", str(trial_dir)]
    if trial_plan is not None:
        argv += [APPLY_FIX, json.dumps({"id": trial_plan.id, "settings": trial_plan.settings})]
    argv += [STOP_AFTER, str(steps), "--", *command]
    timeout = max(TIMEOUT_MIN_S, TIMEOUT_FACTOR * each_s)
    trial_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **(trial_plan.env if trial_plan is not None else {})}
    try:
        status = _run(argv, trial_dir / OUTPUT_LOG, env, timeout)
    except subprocess.TimeoutExpired:
        return f"stopped after {timeout:.0f} s (its output: {folder}/{OUTPUT_LOG})"
    try:
        tried = load_record(trial_dir)
        applied = json.loads((trial_dir / TRIAL_JSON).read_text())
    except (GpuscopeError, OSError, ValueError) as exc:
        return f"the run left no record (exit status {status}; {folder}/{OUTPUT_LOG}): {getattr(exc, 'message', exc)}"
    if tried.exit_status != 0:
        return f"the script failed{' with the fix' if trial_plan else ''} (exit status {tried.exit_status}; its " \
               f"traceback: {folder}/{OUTPUT_LOG})"
    notes = "; ".join(applied.get("notes", ()))
    if applied.get("step") is None:
        return f"the fix never took effect: {notes or 'the script ended first'}"
    return tried, int(applied["step"]), notes


def _run(argv: list[str], log: Path, env: dict[str, str], timeout: float) -> int:
    """Run ``argv`` with its output in ``log``, in its own process group (killed whole on a timeout) within the user's
    session: Linux schedules a session as one group (autogroup), and a trial in a session of its own would get the
    cores on other terms than the untouched run beside a busy process."""
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   **group)  # type: ignore[call-overload]
        try:
            return process.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):  # (not the foreground group: Ctrl-C does not reach it)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise


def _options(options: RunOptions) -> list[str]:
    """The untouched run's collector options, for a trial measured the same way (its probes left out)."""
    out = ["--trace-steps", str(options.trace_steps), "--trace-max-mb", str(options.trace_max_mb),
           "--skip-steps", str(options.skip_steps)]
    out += ["--cprofile-all"] if options.cprofile_all else ["--cprofile-steps", str(options.cprofile_steps)]
    if options.profile_steps is not None:
        out += ["--profile-steps", str(options.profile_steps)]
    return out


def _compare_page(base: RunRecord, tried: RunRecord, trial_dir: Path) -> None:
    """The trial's compare.html against the untouched run; a page that cannot be rendered costs one line."""
    try:
        from gpuscope.report.render import COMPARE_HTML, write_compare

        write_compare(base, tried, trial_dir / COMPARE_HTML)
    except Exception as exc:
        print(f"gpuscope: error: could not write {trial_dir / 'compare.html'}: {exc}", file=sys.stderr)


def _line(trial: Trial) -> str:
    """One line of the terminal's trial list."""
    from gpuscope.report.trials_text import trial_line

    return trial_line(trial)


def _applied(trials: tuple[Trial, ...]) -> list[str]:
    from gpuscope.report.trials_text import applied_lines

    return applied_lines(trials)


def write_applied(run_dir: Path, applied: Any, stopped: bool) -> None:
    """A trial run's ``trial.json``: the fix (None: the script untouched), the step from which it was in effect,
    its notes, whether the trial ended the script."""
    if applied is None:
        (run_dir / TRIAL_JSON).write_text(json.dumps({"id": None, "step": 0, "notes": [], "stopped": stopped}))
        return
    notes = list(applied.notes)
    step = applied.step
    if applied.id in ("more-dataloader-workers", "persistent-workers", "pin-memory") and not applied.loaders:
        notes.append("no DataLoader was built at the recommended line: the fix was not applied")
        step = None
    (run_dir / TRIAL_JSON).write_text(json.dumps({"id": applied.id, "step": step, "notes": notes,
                                                  "loaders": applied.loaders, "stopped": stopped}, indent=1))


__all__ = ["AUTO", "APPLY_FIX", "STOP_AFTER", "requested", "run_trials", "write_applied"]
