"""Trying fixes (``gpuscope run --try``), from recorded runs: which fixes can be tried and with what values, how many
steps a trial runs, what a trial measured against the untouched run, the loss check, and the ranking after."""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
from pathlib import Path

import pytest

from conftest import make_record
from gpuscope.collect.fixes import INSTALLERS
from gpuscope.diagnose import analyze, trials
from gpuscope.diagnose.evidence import STEP
from gpuscope.diagnose.rules import RULES, AtRunTime, Refused, by_id, finding
from gpuscope.diagnose.rules.base import rule
from gpuscope.diagnose.trials import TrialPlan
from gpuscope.errors import GpuscopeError
from gpuscope.record import (CallSite, Losses, ProbabilityLoss, Recommendation, RunMeta, RunRecord, SpeedOfLight,
                             StepSample, Steps, Trial)

from gpuscope.report.render import render_report
from gpuscope.report.trials_text import applied_lines, trial_line
from gpuscope.trials import requested

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def run(median_s: float, steps: int = 100, profiled: tuple[int, ...] = tuple(range(1, 11)), seed: int = 0,
        losses: list[float | None] | None = None, **overrides):
    """A record of ``steps`` steps around ``median_s`` (2% jitter), step 0 warm-up and ``profiled`` profiled."""
    rng = random.Random(seed)
    times = tuple(median_s * (1 + rng.uniform(-0.02, 0.02)) for _ in range(steps))
    status = tuple("warmup" if i == 0 else "profiled" if i in profiled else "steady" for i in range(steps))
    sample = StepSample(index=tuple(range(steps)), wall_s=times, status=status)
    record = make_record(steps=Steps(count=status.count("steady"), median_s=median_s, mean_s=median_s, total=steps,
                                     source="optimizer", sample=sample),
                         meta=RunMeta(duration_s=2.0 + steps * median_s), **overrides)
    if losses is not None:
        record = dataclasses.replace(record, loss=Losses(tuple(range(len(losses))), tuple(losses)))
    return record


def falling(steps: int = 100, noise: float = 0.0, seed: int = 1, scale: float = 1.0) -> list[float | None]:
    """A loss falling from 2.0, with per-step noise (an unseeded script's two runs differ by it)."""
    rng = random.Random(seed)
    return [scale * (2.0 * 0.99 ** i + rng.gauss(0, noise)) for i in range(steps)]


PLAN = TrialPlan("fused-optimizer", "torch.optim.Adam(..., fused=True)  # train.py:41", estimated_gain=0.1)


# --- which fixes, with what values ----------------------------------------------------------------------------------

def fixture_records() -> list[tuple[str, RunRecord]]:
    """The recorded runs of tests/: the CPU records, the report's, and the GPU runs'."""
    found = []
    for path in sorted([*FIXTURES.glob("records/*.json"), *(FIXTURES.parent / "report" / "records").glob("*.json"),
                        *FIXTURES.glob("gpu/**/*.run.json.gz")]):
        text = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        found.append((path.name, analyze(RunRecord.from_json(json.loads(text)))))
    return found


def rendered(fix: str, settings: dict[str, object], env: dict[str, str]) -> list[str]:
    """The values of ``settings`` and ``env`` that ``fix`` does not name as it writes them."""
    forms = {"site": "{}", "threads": "torch.set_num_threads({})", "optimizer": "torch.optim.{}(", "mode": 'mode="{}"',
             "block": "{}"}
    wanted = [forms.get(name, name + "={}").format(value) for name, value in settings.items()]
    wanted += [f"{name}={value}" for name, value in env.items()]
    return [w for w in wanted if w not in fix]


def test_every_rule_is_either_tried_at_run_time_or_refused_with_a_reason() -> None:
    for r in RULES:
        assert isinstance(r.trial, AtRunTime) != isinstance(r.trial, Refused), r.id
    assert not trials.APPLIED_AT_RUN_TIME & set(trials.REFUSED)
    assert trials.APPLIED_AT_RUN_TIME | set(trials.REFUSED) == trials.known_ids()
    # and what is applied at run time has an installer, one an id
    assert set(INSTALLERS) == trials.APPLIED_AT_RUN_TIME
    assert "changes the optimisation" in trials.refusal("larger-batch")
    assert "dataset" in trials.refusal("cheaper-batches")
    assert trials.refusal("tf32") is None
    with pytest.raises(ValueError, match="neither how its fix is tried nor why"):
        rule("no-trial", "a rule that does not say", "nothing", resolved_by=(STEP,), trial=None)(lambda r: None)


RECORDED = fixture_records()


@pytest.mark.parametrize(("name", "record"), RECORDED, ids=[name for name, _ in RECORDED])
def test_a_trial_applies_its_rules_values_never_its_fixs_words(name: str, record: RunRecord) -> None:
    tried = [rec for rec in record.recommendations if trials.refusal(rec.id) is None]
    for rec in tried:
        r = by_id(rec.id)
        found = finding(record, rec.id)
        assert found is not None and found.fix in (None, rec.fix)
        plan = trials.plan(rec.id, record)
        assert isinstance(plan, TrialPlan)
        assert plan.settings == {**r.trial.settings, **found.settings} and plan.env == {**r.trial.env, **found.env}
        # the fix's words are written from those values...
        assert rendered(rec.fix, dict(found.settings), dict(found.env)) == []
        # ...and rewording them changes nothing a trial applies
        reworded = dataclasses.replace(rec, fix="num_workers=99  # other.py:1  torch.optim.SGD(")
        again = trials.plan(rec.id, dataclasses.replace(record, recommendations=(reworded,)))
        assert isinstance(again, TrialPlan) and (again.settings, again.env) == (plan.settings, plan.env)


def test_the_recorded_runs_recommend_fixes_with_values() -> None:
    valued = {(name, rec.id) for name, record in RECORDED for rec in record.recommendations
              if trials.refusal(rec.id) is None and finding(record, rec.id).settings}
    assert ("mnist_slow_test_set.json", "more-dataloader-workers") in valued
    assert ("ckpt_idle_workers.json", "fused-optimizer") in valued
    (mnist,) = [record for name, record in RECORDED if name == "mnist_slow_test_set.json"]
    assert trials.plan("more-dataloader-workers", mnist).settings == {  # type: ignore[union-attr]
        "num_workers": 1, "persistent_workers": True, "site": "mnist_slow_test_set.py:72"}


def test_a_worker_count_is_tried_only_where_the_run_measured_one() -> None:
    record = run(0.1)
    found = trials.plan("more-dataloader-workers", record)
    assert isinstance(found, Trial) and found.status == "refused" and "no worker count" in found.reason
    (mnist,) = [record for name, record in RECORDED if name == "mnist_slow_test_set.json"]
    found = trials.plan("more-dataloader-workers", mnist)
    assert isinstance(found, TrialPlan) and found.settings["num_workers"] == 1
    assert found.estimated_gain == next(r.expected_gain for r in mnist.recommendations
                                        if r.id == "more-dataloader-workers")


@pytest.mark.parametrize(("rec_id", "settings", "env"), [
    ("fused-optimizer", {}, {}),  # every fused optimizer torch has, not the one its words show (Adam)
    ("static-graph", {"mode": "reduce-overhead"}, {}),
    ("tune-host-allocator", {}, {"MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "1073741824"}),
    ("persistent-workers", {"persistent_workers": True}, {}),
    ("pin-memory", {"pin_memory": True}, {}),
])
def test_a_fix_the_run_did_not_recommend_is_tried_with_its_rules_generic_values(rec_id, settings, env) -> None:
    found = trials.plan(rec_id, run(0.1, device="cuda"))
    assert isinstance(found, TrialPlan) and (found.settings, found.env) == (settings, env)
    assert rendered(by_id(rec_id).fix, settings, env) == []


def test_a_fix_the_run_did_not_recommend_is_tried_as_the_rule_writes_it() -> None:
    found = trials.plan("zero-grad-set-to-none", run(0.1))
    assert isinstance(found, TrialPlan)
    assert found.change == "optimizer.zero_grad(set_to_none=True)" and found.estimated_gain is None


def test_mixed_precision_is_not_tried_on_a_cpu_run() -> None:
    found = trials.plan("mixed-precision", run(0.1, device="cpu"))
    assert isinstance(found, Trial) and found.status == "refused"


@pytest.mark.parametrize(("text", "error"), [
    ("tf32,no-such-fix", "--try no-such-fix: no such recommendation id"),
    ("larger-batch", "--try larger-batch: not tried at run time: it changes the optimisation"),
    (" , ", "--try needs recommendation ids"),
])
def test_a_bad_try_list_is_one_line_before_anything_runs(text: str, error: str) -> None:
    with pytest.raises(GpuscopeError, match=error.replace("(", r"\(")):
        requested(text)


def test_a_try_list_keeps_its_order_once_each() -> None:
    assert requested("tf32, fused-optimizer,tf32") == ["tf32", "fused-optimizer"]
    assert requested("auto") == "auto"


def test_a_trial_runs_in_a_process_group_of_its_own_within_the_users_session(tmp_path: Path) -> None:
    # Linux schedules a session as one group (autogroup): a trial in a session of its own would not share the cores
    # as the untouched run does; its own process group is what a timeout kills whole
    import os
    import sys

    from gpuscope.trials import _run

    log = tmp_path / "output.log"
    assert _run([sys.executable, "-c", "import os; print(os.getsid(0), os.getpgid(0), os.getpid())"], log,
                dict(os.environ), timeout=60) == 0
    session, group, pid = map(int, log.read_text().split())
    assert session == os.getsid(0) and group == pid != os.getpgid(0)


# --- how many steps ----------------------------------------------------------------------------------------------

def test_a_trial_runs_as_many_steps_as_the_untouched_run_had() -> None:
    assert trials.window(run(0.01, steps=500)) == 500


def test_a_trial_of_fast_steps_runs_thirty_seconds_of_them() -> None:
    assert trials.window(run(0.001, steps=100_000)) == 30_000


def test_slow_steps_still_give_a_trial_twenty_steps_past_the_profiled_ones() -> None:
    # 2 s steps: 30 s is 15 steps, fewer than the profiled ones (to step 10) and 20 more
    assert trials.window(run(2.0, steps=500)) == 11 + 20
    assert trials.window(run(2.0, steps=25)) == 25


# --- what a trial measured ---------------------------------------------------------------------------------------

def test_a_trial_measures_the_speedup_over_the_steady_steps_both_ran_after_the_fix_took_effect() -> None:
    # given the untouched run at 10 ms a step, and a trial at 8 ms whose fix took effect at step 3
    base, tried = run(0.010, losses=falling()), run(0.008, seed=7, losses=falling())
    trial = trials.measure([trials.Round(base, tried, 3)], PLAN, steps=61)
    # then it compares steps 11-60 (after the profiled ones) of both: 1.25x, its interval holding it
    assert trial.status == "measured" and trial.compared_steps == 50
    assert trial.speedup == pytest.approx(1.25, rel=0.03)
    assert trial.speedup_low < trial.speedup < trial.speedup_high
    assert trial.credited and trial.measured_gain == pytest.approx(0.2, abs=0.02)
    assert trial.loss.status == "within"


def test_reduce_memory_is_tried_as_checkpointing_of_the_repeated_block_the_memory_window_found() -> None:
    from gpuscope.record import Memory

    tried = trials.plan("reduce-memory", RunRecord(memory=Memory(steps=(11, 12), repeated_blocks="GPT2Block")))
    assert isinstance(tried, TrialPlan) and tried.settings["block"] == "GPT2Block"
    assert tried.change.startswith("checkpoint each GPT2Block block")
    refused = trials.plan("reduce-memory", RunRecord(memory=Memory(steps=(11, 12))))
    assert isinstance(refused, Trial) and refused.status == "refused" and "no repeated block" in refused.reason


def test_a_trial_records_both_arms_peak_memory_beside_its_speedup() -> None:
    from gpuscope.record import HostMemory

    def peaked(record, peak: int):  # noqa: ANN001, ANN202
        return dataclasses.replace(record, host_memory=HostMemory(peak_process_bytes=peak))

    rounds = [trials.Round(peaked(run(0.010), 900 << 20), peaked(run(0.008, seed=7), 500 << 20), 3),
              trials.Round(peaked(run(0.010, seed=2), 950 << 20), run(0.008, seed=8), 3)]
    trial = trials.measure(rounds, PLAN, steps=61)
    # the highest of the rounds, each arm taken alone; a round that sampled nothing adds nothing
    assert (trial.peak_memory_before_bytes, trial.peak_memory_after_bytes) == (950 << 20, 500 << 20)
    assert trial_line(trial).endswith("peak memory 996 MB -> 524 MB")
    assert trials.measure([trials.Round(run(0.010), run(0.008), 3)], PLAN, steps=61).peak_memory_after_bytes is None


def test_where_every_run_measured_its_tensors_peak_a_trial_holds_those_not_the_processes() -> None:
    from gpuscope.record import HostMemory, Memory

    def measured(record, tensors: int, rss: int):  # noqa: ANN001, ANN202
        return dataclasses.replace(record, memory=Memory(steps=(11, 12), peak_bytes=tensors),
                                   host_memory=HostMemory(peak_process_bytes=rss))

    trial = trials.measure([trials.Round(measured(run(0.010), 120 << 20, 750 << 20),
                                         measured(run(0.012, seed=3), 70 << 20, 680 << 20), 3)], PLAN, steps=61)
    assert (trial.peak_memory_before_bytes, trial.peak_memory_after_bytes) == (120 << 20, 70 << 20)


def test_the_runs_of_a_fix_pool_their_steps_and_its_interval_holds_the_spread_between_runs() -> None:
    # given two rounds: in the first the machine ran both runs 20% slower than in the second
    slow = trials.Round(run(0.012, seed=1), run(0.0096, seed=2), 1)
    fast = trials.Round(run(0.010, seed=3), run(0.008, seed=4), 1)
    trial = trials.measure([slow, fast], PLAN, steps=61)
    # then the speed-up is both rounds' 1.25x, over both runs' steps
    assert trial.runs == 2 and trial.compared_steps == 2 * 50
    assert trial.speedup == pytest.approx(1.25, rel=0.05)
    # and an untouched run as slow as another's fix would be: the interval widens to hold it
    mixed = trials.measure([trials.Round(run(0.010, seed=5), run(0.008, seed=6), 1),
                            trials.Round(run(0.008, seed=7), run(0.008, seed=8), 1)], PLAN, steps=61)
    assert mixed.speedup_low <= 1.02 and mixed.speedup_high >= 1.2


def test_a_trial_whose_steps_alternate_fast_and_slow_is_measured_by_their_pace_not_their_median() -> None:
    # given an untouched loop at 54.5 ms a step, and with 2 workers delivering in rounds: 5 and 44 ms by turns
    base = run(0.0545)
    tried = dataclasses.replace(run(0.005), steps=dataclasses.replace(run(0.005).steps, sample=dataclasses.replace(
        run(0.005).steps.sample, wall_s=tuple(0.005 if i % 2 else 0.044 for i in range(100)))))
    trial = trials.measure([trials.Round(base, tried, 1)], PLAN, steps=100)
    # then the step is their mean, 24.5 ms: 2.2x, where a median would say 1.2x or 11x
    assert trial.step_after_s == pytest.approx(0.0245, rel=0.03)
    assert trial.speedup == pytest.approx(2.22, rel=0.03)


def test_a_trials_step_keeps_its_long_steps_the_waits_that_make_a_loop_slow() -> None:
    # given a trial whose steps take 10 ms but every tenth, 46 ms (workers falling behind: the loop waits)
    waits = run(0.010, steps=111)
    tried = dataclasses.replace(waits, steps=dataclasses.replace(waits.steps, sample=dataclasses.replace(
        waits.steps.sample, wall_s=tuple(0.046 if i % 10 == 0 else 0.010 for i in range(111)))))
    trial = trials.measure([trials.Round(run(0.0136, steps=111), tried, 1)], PLAN, steps=111)
    # then over the steps compared, 11-110, its step is 0.9 x 10 + 0.1 x 46 = 13.6 ms: no faster than the untouched run's 13.6 ms (a trimmed mean,
    # 10 ms, would have credited it with 1.36x)
    assert trial.step_after_s == pytest.approx(0.0136, rel=0.01)
    assert trial.effect == "no measurable change" and not trial.credited


def test_a_fix_whose_interval_holds_one_made_no_measurable_change_and_is_not_credited() -> None:
    # given two rounds that disagree: the fix 5% faster in one, 5% slower in the other
    rounds = [trials.Round(run(0.0100, seed=1), run(0.0095, seed=2), 1),
              trials.Round(run(0.0095, seed=3), run(0.0100, seed=4), 1)]
    trial = trials.measure(rounds, PLAN, steps=61)
    # then its interval holds 1: no gain is credited, and the words say so
    assert trial.speedup_low < 1 < trial.speedup_high
    assert trial.effect == "no measurable change"
    assert not trial.credited and trial.measured_gain is None
    assert "no measurable change: 1.00x (95%: " in trial_line(trial)
    assert applied_lines((trial,)) == []


def test_a_fix_whose_interval_lies_below_one_is_slower() -> None:
    trial = trials.measure([trials.Round(run(0.010), run(0.012, seed=5), 1)], PLAN, steps=61)
    assert trial.effect == "slower" and trials.slower(trial) and not trial.credited
    assert "0.84x slower (95%: " in trial_line(trial)


def test_a_trial_with_too_few_steps_after_its_fix_took_effect_is_not_measured() -> None:
    trial = trials.measure([trials.Round(run(0.01), run(0.008), 57)], PLAN, steps=61)
    assert trial.status == "failed" and "fewer than 5 steady steps" in trial.reason


def test_a_trial_whose_loss_went_to_nan_is_flagged_and_its_speed_not_credited() -> None:
    poisoned = falling()
    poisoned[30:] = [float("nan")] * 70
    trial = trials.measure([trials.Round(run(0.010, losses=falling()), run(0.005, losses=poisoned), 1)], PLAN, steps=61)
    assert trial.loss.status == "not finite" and trial.loss.first_step == 30
    assert not trial.credited and trial.measured_gain is None
    assert "loss NOT FINITE from step 30: speed not credited" in trial_line(trial)
    assert applied_lines((trial,)) == []


def test_a_loss_that_drifts_beyond_the_runs_own_spread_is_flagged() -> None:
    trial = trials.measure([trials.Round(run(0.010, losses=falling()), run(0.008, losses=falling(scale=1.3)), 1)],
                           PLAN, steps=61)
    assert trial.loss.status == "drifted" and trial.loss.drift == pytest.approx(0.3, abs=0.01)
    assert not trial.credited


@pytest.mark.parametrize("trial_id", ["cpu-mixed-precision", "fused-optimizer"])
def test_an_autocast_trial_whose_loss_drifted_over_a_loss_on_probabilities_says_so(trial_id: str) -> None:
    # given: a run whose step computes BCELoss on a sigmoid's output at train.py:30, and a trial whose loss drifted
    site = CallSite("train.py", 30, "main", "loss = criterion(model(x), y)", 1)
    base = dataclasses.replace(run(0.010, losses=falling()), speed_of_light=SpeedOfLight(
        flops_per_step=10**9, probability_loss=ProbabilityLoss("float32", site)))
    plan = TrialPlan(trial_id, "with torch.autocast('cpu', dtype=torch.bfloat16): ...", estimated_gain=0.3)
    trial = trials.measure([trials.Round(base, run(0.007, losses=falling(scale=1.3)), 1)], plan, steps=61)
    # then: not credited; an autocast trial names the loss as what moved it, another trial names nothing
    assert trial.loss.status == "drifted" and not trial.credited
    cause = ("the step computes BCELoss on probabilities at train.py:30, which autocast's 16-bit sigmoid rounds near "
             "1: nn.BCEWithLogitsLoss on the logits keeps the loss")
    assert trial.loss.cause == (cause if trial_id == "cpu-mixed-precision" else "")
    assert trial_line(trial).endswith(f"speed not credited ({cause})" if trial.loss.cause else "speed not credited")


def test_an_unseeded_scripts_noisy_loss_is_not_flagged_for_its_noise() -> None:
    # two runs of a script that seeds nothing: the same curve, each with its own per-step noise of 10%
    base = run(0.010, losses=falling(noise=0.1, seed=1))
    tried = run(0.008, losses=falling(noise=0.1, seed=2))
    trial = trials.measure([trials.Round(base, tried, 1)], PLAN, steps=61)
    assert trial.loss.status == "within" and trial.loss.tolerance > trials.th.LOSS_DRIFT_FLOOR
    assert trial.credited


def test_without_a_loss_the_speed_is_credited_and_the_check_says_why() -> None:
    trial = trials.measure([trials.Round(run(0.010), run(0.008), 1)], PLAN, steps=61)
    assert trial.loss.status == "not compared" and "backward()" in trial.loss.note
    assert trial.credited


# --- the ranking after --------------------------------------------------------------------------------------------

def recommendation(rec_id: str, gain: float) -> Recommendation:
    return Recommendation(id=rec_id, title=rec_id, fix="f", expected_gain=gain)


def measured(rec_id: str, speedup: float, low: float, high: float, credited: bool = True) -> Trial:
    return Trial(id=rec_id, status="measured", speedup=speedup, speedup_low=low, speedup_high=high,
                 credited=credited, measured_gain=1 - 1 / speedup if credited else None)


def test_a_fix_measured_slower_ranks_last_and_one_measured_better_moves_up() -> None:
    recs = (recommendation("more-dataloader-workers", 0.27), recommendation("fused-optimizer", 0.10),
            recommendation("zero-grad-set-to-none", 0.05))
    tried = (measured("more-dataloader-workers", 0.56, 0.52, 0.60), measured("zero-grad-set-to-none", 1.3, 1.25, 1.35))
    ranked = [r.id for r in trials.rerank(recs, tried)]
    assert ranked == ["zero-grad-set-to-none", "fused-optimizer", "more-dataloader-workers"]


def test_a_fix_that_made_no_measurable_change_ranks_after_those_measured_faster() -> None:
    recs = (recommendation("tf32", 0.5), recommendation("fused-optimizer", 0.1), recommendation("jit-fusion", 0.2))
    unclear = dataclasses.replace(measured("tf32", 1.06, 0.90, 1.20, credited=False), effect="no measurable change")
    tried = (unclear, measured("jit-fusion", 1.3, 1.25, 1.35))
    assert [r.id for r in trials.rerank(recs, tried)] == ["jit-fusion", "fused-optimizer", "tf32"]


def test_a_fix_whose_loss_check_failed_ranks_after_the_others_but_before_a_slower_one() -> None:
    recs = (recommendation("tf32", 0.5), recommendation("fused-optimizer", 0.1), recommendation("jit-fusion", 0.2))
    tried = (measured("tf32", 3.0, 2.9, 3.1, credited=False), measured("jit-fusion", 0.8, 0.7, 0.9))
    assert [r.id for r in trials.rerank(recs, tried)] == ["fused-optimizer", "tf32", "jit-fusion"]


def test_the_report_leads_its_recommendations_with_what_was_tried() -> None:
    slower = Trial(id="more-dataloader-workers", status="measured", change="DataLoader(..., num_workers=2) <b>",
                   run_dir="try-more-dataloader-workers", steps=61, compared_steps=50, step_before_s=0.01,
                   step_after_s=0.018, speedup=0.56, speedup_low=0.52, speedup_high=0.6, estimated_gain=0.27,
                   credited=True, measured_gain=1 - 1 / 0.56)
    record = trials.with_trials(run(0.01, recommendations=(recommendation("more-dataloader-workers", 0.27),
                                                           recommendation("fused-optimizer", 0.1))), (slower,))
    html = render_report(record, inline_plotly=False)
    tried = html[html.index('id="tried"'):html.index("Most valuable first")]
    assert "0.56x slower (95%: 0.52x-0.60x)" in tried and "estimated 1.37x" in tried
    assert "DataLoader(..., num_workers=2) &lt;b&gt;" in tried  # the fix text is escaped
    assert 'href="try-more-dataloader-workers/compare.html"' in tried
    assert [r.id for r in record.recommendations] == ["fused-optimizer", "more-dataloader-workers"]
    assert "measured -79% of step time" in html
