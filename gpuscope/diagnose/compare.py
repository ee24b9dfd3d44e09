"""Before/after comparison of two runs (A = before, B = after): the speed-up with its uncertainty, how each phase
of the step moved, how the verdict changed, and what became of A's recommendations in B.

A pure function of the two records: ``compare(a, b)`` returns a ``Comparison`` that the terminal summary
(``gpuscope.report.compare_text``) and the HTML page (``gpuscope.report.render_compare``) both read. The figures that
show a recommendation's fix took are the rule's own (``resolved_by`` in ``diagnose/rules``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Literal

from gpuscope.diagnose.child_processes import notable, started_work
from gpuscope.diagnose.clock import on_device_clock, step_times
from gpuscope.diagnose.contention import waited
from gpuscope.diagnose.evidence import STEP, Metric, Unit, batch_size, show, step_batches
from gpuscope.diagnose.rules import RULES
from gpuscope.record import PHASES, RunRecord
from gpuscope.diagnose.words import bound_label

MAX_STEPS = 2000
"""Most steady steps of a run the interval uses: an even subsample beyond that keeps 100k-step runs fast."""
MIN_STEPS = 5
"""Fewest steady steps of each run for an interval."""
LEVEL = 0.95
BATCHES = 10
"""Each run's steady steps, in their order, are cut into this many consecutive batches (fewer, of two steps at
least, in short runs): the spread of the batches' means gives the mean step's uncertainty with the slow swings of a
busy machine in it, which steps taken one by one (as if independent) hide."""
T_95 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101}
"""Student's t, two-sided 95%, by degrees of freedom (the two runs' batches less one each)."""
PROCESS_SPREAD = 0.045
"""The relative spread (one standard deviation) of a script's mean step from one run to the next beyond what its
steps show: which cores and neighbours its process drew, the machine's drift between runs. Measured: four identical
runs of the gate benchmark's loop in a quiet hour of the shared 2-core machine, pooled over four kinds, 4.5%
(``benchmarks/gate_noise.py``; benchmarks/README.md, "The gate under noise"). ``--run-spread`` sets a machine's
own."""

Status = Literal["resolved", "symptom gone, step slower", "still there", "not checked in B", "unknown", "new in B"]
"""``symptom gone, step slower``: B's check of the rule is clear, but B's step is longer than A's (``SLOWER``): the
fix removed what the rule measures and cost more than it saved (2 workers on 2 cores computing the step)."""
SLOWER = 0.95
"""Without an interval, B's step counts as slower from this ratio of A's median to B's down (5% longer)."""


@dataclass(frozen=True, slots=True)
class SpeedUp:
    """A's mean step over B's (above 1: B is faster): the runs' throughput, their steady steps' time on the whole
    over their number, with a 95% interval of that ratio (``interval``). The medians are shown beside it: with
    workers, a loader's batches arrive in bursts and the median step can be a fifth of the mean.

    ``note`` says why there is no ratio or no interval.
    """

    median_a_s: float | None
    median_b_s: float | None
    ratio: float | None
    low: float | None = None
    high: float | None = None
    steps_a: int = 0
    steps_b: int = 0
    note: str | None = None
    clock_a: str = "host"
    clock_b: str = "host"
    """The clock each run's steps are read on (``Steps.clock``): ``device`` on a CUDA run timed on the GPU."""
    mean_a_s: float | None = None
    mean_b_s: float | None = None
    spread: float | None = None
    """The ratio's uncertainty, one standard deviation of its logarithm (``interval``); None without an interval."""
    run_spread: float = PROCESS_SPREAD
    """The spread from one run to the next that ``spread`` holds (``PROCESS_SPREAD``, or the user's)."""

    @property
    def clock(self) -> str:
        """Which clock the steps are on, in words."""
        names = {"device": "the GPU's timeline", "host": "the host's clock"}
        if self.clock_a == self.clock_b:
            return names.get(self.clock_a, self.clock_a)
        return f"A on {names.get(self.clock_a, self.clock_a)}, B on {names.get(self.clock_b, self.clock_b)}"

    @property
    def slower_pct(self) -> float | None:
        """How much slower B's mean step is than A's, in percent (negative: faster); None without a ratio."""
        return (1 / self.ratio - 1) * 100 if self.ratio else None

    def reading(self) -> str:
        """What the figures say: B faster, B slower, or no clear difference (the interval holds 1)."""
        if self.ratio is None:
            return "no speed-up figure"
        if self.low is not None and self.high is not None:
            if self.low > 1:
                return "B is faster"
            if self.high < 1:
                return "B is slower"
            return "no clear difference"
        word = "faster" if self.ratio > 1 else "slower" if self.ratio < 1 else "as fast"
        return f"B is {word} (point estimate only)"


Decision = Literal["passed", "failed", "cannot tell"]


@dataclass(frozen=True, slots=True)
class Gate:
    """``--fail-if-slower PCT`` decided on the interval: ``failed`` where B's step is longer than A's by more than
    PCT with 95% confidence (the interval's slow end beyond it), ``passed`` where B is not slower than PCT with that
    confidence (the whole interval within it), ``cannot tell`` where the interval straddles the limit.
    ``steps_needed``: about how many steady steps a run would tell (None where more steps would not: the runs'
    difference sits at the limit, or within the spread from one run to the next)."""

    decision: Decision
    max_slower_pct: float
    slower_pct: float
    slower_low_pct: float
    slower_high_pct: float
    steps_needed: int | None = None


def gate(s: SpeedUp, max_slower_pct: float) -> Gate:
    """The gate's decision on ``s`` (``Gate``): ``cannot tell`` without an interval (too few steady steps). Raises
    ValueError without a ratio."""
    if s.ratio is None or s.slower_pct is None:
        raise ValueError(s.note or "no speed-up figure")
    if s.low is None or s.high is None or s.spread is None:
        return Gate("cannot tell", max_slower_pct, s.slower_pct, s.slower_pct, s.slower_pct, MIN_STEPS)
    limit = 1 + max_slower_pct / 100
    # the two-sided interval's ends: each one-sided claim at 97.5%, a margin that busy machines' runs, straying
    # beyond PROCESS_SPREAD, need (at 95% one-sided, 3 in 12 identical pairs failed: benchmarks/README.md)
    slow_end, fast_end = 1 / s.high, 1 / s.low  # B's step over A's
    decision: Decision = "failed" if slow_end > limit else "passed" if fast_end <= limit else "cannot tell"
    needed = None
    if decision == "cannot tell":
        needed = _steps_to_tell(s, math.log(limit) - math.log(1 / s.ratio))
    return Gate(decision, max_slower_pct, s.slower_pct, (slow_end - 1) * 100, (fast_end - 1) * 100, needed)


def _steps_to_tell(s: SpeedUp, distance: float) -> int | None:
    """The steady steps a run needs for the interval to clear the limit, ``distance`` away on the log scale: the
    runs' own spread shrinks as one over the root of their steps, the spread from one run to the next does not."""
    within = s.spread ** 2 - 2 * s.run_spread ** 2  # type: ignore[operator]
    room = (distance / T_95[2 * (BATCHES - 1)]) ** 2 - 2 * s.run_spread ** 2
    if within <= 0 or room <= 0:
        return None
    return math.ceil(max(s.steps_a, s.steps_b) * within / room)


@dataclass(frozen=True, slots=True)
class PhaseShift:
    """One phase of the step in A and in B: its share of the median step (0..1) and its seconds per step."""

    phase: str
    share_a: float
    share_b: float
    seconds_a: float
    seconds_b: float


@dataclass(frozen=True, slots=True)
class VerdictChange:
    """A's verdict and B's, as people say them (``bound_label``), with their confidences (0..1)."""

    label_a: str
    confidence_a: float
    label_b: str
    confidence_b: float

    @property
    def changed(self) -> bool:
        """Whether B's bound differs from A's."""
        return self.label_a != self.label_b


@dataclass(frozen=True, slots=True)
class Change:
    """One measured figure in A and in B, e.g. the data-wait share; ``unit`` says how to show it."""

    name: str
    a: float
    b: float
    unit: Unit

    def text(self) -> str:
        """The change in words: "data wait 64% -> 3%"."""
        return f"{self.name} {show(self.a, self.unit)} -> {show(self.b, self.unit)}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of a recommendation in B, with the figures that show the change."""

    id: str
    title: str
    status: Status
    reason: str | None = None
    """B's reason for not checking the rule (status ``not checked in B``), or how much slower B's step is."""
    changes: tuple[Change, ...] = ()

    def line(self) -> str:
        """One line: "more-dataloader-workers: resolved, data wait 64% -> 3%"."""
        status = f"{self.status} ({self.reason})" if self.reason else self.status
        return ", ".join([f"{self.id}: {status}", *(c.text() for c in self.changes)])


@dataclass(frozen=True, slots=True)
class Comparison:
    """Run A (before) against run B (after)."""

    script_a: str
    script_b: str
    speedup: SpeedUp
    phases: tuple[PhaseShift, ...]
    verdict: VerdictChange
    outcomes: tuple[Outcome, ...]
    """A's recommendations in A's order, then those new in B (status ``new in B``)."""
    flags: tuple[str, ...]
    """Warnings that the runs differ in more than the change under test (script, device, torch, CPUs)."""
    per_sample: PerSample | None = None
    """When the batch size changed, the time per sample (what a larger batch is for)."""
    children: ChildWork | None = None
    """When processes the script started did notable work in either run, theirs and the whole run's time."""
    busy: tuple[str, ...] = ()
    """That A's or B's machine was busy (``busy``), said beside the speed-up."""


@dataclass(frozen=True, slots=True)
class PerSample:
    """Median step over the samples a step takes (its batch size x its batches), in A and B."""

    batch_a: int
    batch_b: int
    seconds_a: float
    seconds_b: float
    batches_a: float = 1.0
    """Batches a step takes in A (8 where gradients accumulate over 8 batches before each optimizer step)."""
    batches_b: float = 1.0

    def line(self) -> str:
        """One line: "per sample (batch 32 -> batch 64): A 0.194 ms -> B 0.1 ms: 1.94x the throughput" (three
        significant digits: a sample can take microseconds); with batches accumulated, "(batch 8, 8 a step -> ..."."""
        return (f"per sample (batch {self.batch_a}{_accumulated(self.batches_a)} -> batch {self.batch_b}"
                f"{_accumulated(self.batches_b)}): A {self.seconds_a * 1e3:.3g} ms -> B {self.seconds_b * 1e3:.3g} ms: "
                f"{self.seconds_a / self.seconds_b:.2f}x the throughput")


@dataclass(frozen=True, slots=True)
class ChildWork:
    """What the processes the script started used (``HostMemory.processes``), and the whole run's time, in A and B:
    their work is no part of the step figures (Hogwild's trainers, ``torch.multiprocessing.spawn``'s ranks)."""

    cpu_a: float
    cpu_b: float
    waiting_a: float
    waiting_b: float
    run_a: float
    run_b: float

    def line(self) -> str:
        """One line: "the processes the script started: on a CPU 31.7 s -> 12.2 s, waiting for a core 24.0 s ->
        0.2 s; the whole run 30.8 s -> 8.4 s (3.67x) ..."."""
        ratio = f" ({self.run_a / self.run_b:.2f}x)" if self.run_a and self.run_b else ""
        return (f"the processes the script started: on a CPU {self.cpu_a:.1f} s -> {self.cpu_b:.1f} s, waiting for a "
                f"core {self.waiting_a:.1f} s -> {self.waiting_b:.1f} s; the whole run {self.run_a:.1f} s -> "
                f"{self.run_b:.1f} s{ratio} (their work is in none of the step figures)")


def child_work(a: RunRecord, b: RunRecord) -> ChildWork | None:
    """Both runs' started processes' figures, where either run's are worth saying (``notable``)."""
    if not notable(a) and not notable(b):
        return None
    (cpu_a, waiting_a), (cpu_b, waiting_b) = started_work(a), started_work(b)
    return ChildWork(cpu_a, cpu_b, waiting_a, waiting_b, a.meta.duration_s, b.meta.duration_s)


def _accumulated(batches: float) -> str:
    return "" if round(batches, 1) == 1 else f", {batches:.3g} a step"


def per_sample(a: RunRecord, b: RunRecord) -> PerSample | None:
    """Time per sample in both runs when the samples their steps take (of their main loaders) differ and both are
    known: a step that accumulates gradients over 8 batches takes 8 batches' samples."""
    batch_a, batch_b = batch_size(a), batch_size(b)
    batches_a, batches_b = step_batches(a), step_batches(b)
    samples_a, samples_b = batch_a * batches_a, batch_b * batches_b
    if not samples_a or not samples_b or samples_a == samples_b or not a.steps.median_s or not b.steps.median_s:
        return None
    return PerSample(batch_a, batch_b, a.steps.median_s / samples_a, b.steps.median_s / samples_b, batches_a,
                     batches_b)


def resolved_by(rec_id: str) -> tuple[Metric, ...]:
    """The figures that show ``rec_id``'s fix took, as its rule declares them; the median step for an id no rule
    of this gpuscope has (a record from another version)."""
    return next((r.resolved_by for r in RULES if r.id == rec_id), (STEP,))


def changes(rec_id: str, a: RunRecord, b: RunRecord) -> tuple[Change, ...]:
    """The figures of ``rec_id``'s rule known in both runs, and not zero in both (a rule's figure for a case the
    runs do not have: the convolutions' share of a model that has none); the median step where none is."""
    found = []
    for metric in resolved_by(rec_id):
        value_a, value_b = metric.read(a), metric.read(b)
        if value_a is not None and value_b is not None and (value_a or value_b):
            found.append(Change(metric.name, value_a, value_b, metric.unit))
    if not found:
        value_a, value_b = STEP.read(a), STEP.read(b)
        if value_a is not None and value_b is not None:
            found.append(Change(STEP.name, value_a, value_b, STEP.unit))
    return tuple(found)


def outcomes(a: RunRecord, b: RunRecord, speed: SpeedUp | None = None,
             sample: PerSample | None = None) -> tuple[Outcome, ...]:
    """What became of each of A's recommendations in B, then the recommendations new in B. With ``speed`` (the
    runs' speed-up), a rule clear in B whose step got slower is not called resolved; where the steps take different
    numbers of samples (``sample``: a larger batch), whose time per sample got longer."""
    slower = _slower(speed, sample) if speed is not None else None
    found = []
    for rec in a.recommendations:
        check = b.checks.get(rec.id)
        status: Status
        reason = None
        if check is None:
            status = "unknown"
        elif check.status == "clear" and slower is not None:
            status, reason = "symptom gone, step slower", slower
        elif check.status == "clear":
            status = "resolved"
        elif check.status == "fired":
            status = "still there"
        else:
            status, reason = "not checked in B", check.reason or "an input it needs was not collected"
        found.append(Outcome(rec.id, rec.title, status, reason, changes(rec.id, a, b)))
    in_a = {rec.id for rec in a.recommendations}
    found += [Outcome(rec.id, rec.title, "new in B", None, changes(rec.id, a, b))
              for rec in b.recommendations if rec.id not in in_a]
    return tuple(found)


def _slower(speed: SpeedUp, sample: PerSample | None = None) -> str | None:
    """How much longer B's mean step is than A's, in words, where B is slower (its interval below 1, or without
    one a ratio of ``SLOWER`` or less); None otherwise. Where the steps take different numbers of samples, the time
    per sample is what counts (a larger batch makes each step longer and the run faster)."""
    if sample is not None:
        ratio = sample.seconds_a / sample.seconds_b
        return f"B's time per sample {(1 / ratio - 1) * 100:.0f}% longer than A's, {ratio:.2f}x" \
            if ratio <= SLOWER else None
    if speed.ratio is None or speed.slower_pct is None:
        return None
    slower = speed.high < 1 if speed.high is not None else speed.ratio <= SLOWER
    return f"B's mean step {speed.slower_pct:.0f}% longer than A's, {speed.ratio:.2f}x" if slower else None


def steady_times(record: RunRecord, limit: int = MAX_STEPS) -> list[float]:
    """Times (s) of the steady-state steps in the record's step sample, on its steps' clock, an even subsample of at
    most ``limit``."""
    sample = record.steps.sample
    times = [t for t, status in zip(step_times(record.steps), sample.status)
             if status == "steady" and math.isfinite(t) and t > 0]
    if len(times) <= limit:
        return times
    return [times[i * len(times) // limit] for i in range(limit)]


def mean_and_error(times: Sequence[float]) -> tuple[float, float, int]:
    """The mean of ``times`` (in their order), its standard error from the means of ``BATCHES`` consecutive batches
    (fewer, of two steps at least, in short runs; the last batch takes the remainder), and those batches' count."""
    count = max(2, min(BATCHES, len(times) // 2))
    edges = [round(k * len(times) / count) for k in range(count + 1)]
    means = [statistics.fmean(times[lo:hi]) for lo, hi in zip(edges, edges[1:])]
    return statistics.fmean(times), statistics.stdev(means) / math.sqrt(count), count


def interval(a: Sequence[float], b: Sequence[float], run_spread: float = PROCESS_SPREAD) -> tuple[float, float, float]:
    """The 95% interval of mean(a) / mean(b), and its spread (one standard deviation of its logarithm): each run's
    mean step's relative error from its batches (``mean_and_error``), and ``run_spread`` for each run's process,
    combined; Student's t on the batches' degrees of freedom."""
    mean_a, error_a, count_a = mean_and_error(a)
    mean_b, error_b, count_b = mean_and_error(b)
    spread = math.sqrt((error_a / mean_a) ** 2 + (error_b / mean_b) ** 2 + 2 * run_spread ** 2)
    reach = T_95[min(max(T_95), count_a + count_b - 2)] * spread
    ratio = mean_a / mean_b
    return ratio * math.exp(-reach), ratio * math.exp(reach), spread


def speedup(a: RunRecord, b: RunRecord, run_spread: float = PROCESS_SPREAD) -> SpeedUp:
    """A's mean step over B's, with its interval where both step samples allow one; without a step sample, the
    records' means (their medians in older records without one)."""
    clocks = {"clock_a": a.steps.clock, "clock_b": b.steps.clock}
    median_a = a.steps.median_s if a.steps.count and a.steps.median_s > 0 else None
    median_b = b.steps.median_s if b.steps.count and b.steps.median_s > 0 else None
    if median_a is None or median_b is None:
        missing = " and ".join(name for name, m in (("A", median_a), ("B", median_b)) if m is None)
        return SpeedUp(median_a, median_b, None, note=f"no steady-state step in {missing}: no speed-up figure",
                       **clocks)
    times_a, times_b = steady_times(a), steady_times(b)
    mean_a = statistics.fmean(times_a) if times_a else a.steps.mean_s or median_a
    mean_b = statistics.fmean(times_b) if times_b else b.steps.mean_s or median_b
    means = {"mean_a_s": mean_a, "mean_b_s": mean_b}
    short = [f"{name} has {len(t)}" for name, t in (("A", times_a), ("B", times_b)) if len(t) < MIN_STEPS]
    if short:
        note = (f"no interval: too few steady steps in the step sample ({', '.join(short)}; "
                f"at least {MIN_STEPS} each are needed)")
        return SpeedUp(median_a, median_b, mean_a / mean_b, steps_a=len(times_a), steps_b=len(times_b), note=note,
                       **clocks, **means)
    low, high, spread = interval(times_a, times_b, run_spread)
    return SpeedUp(median_a, median_b, mean_a / mean_b, low, high, len(times_a), len(times_b), **clocks, **means,
                   spread=spread, run_spread=run_spread)


def busy(record: RunRecord, name: str) -> str | None:
    """That the machine was busy during run ``name``, where its process's threads waited for a core a notable share
    of the time they were ready to run (``contention.waited``); None otherwise."""
    found = waited(record)
    if found is None:
        return None
    wait, ran = found
    return (f"{name}'s machine was busy: its threads waited for a core {wait / (wait + ran):.0%} of the time they "
            f"were ready to run ({wait:.1f} s): its steps hold that wait, and the comparison with it")


def phase_shifts(a: RunRecord, b: RunRecord) -> tuple[PhaseShift, ...]:
    """Each phase's share of the median step and seconds per step, in A and in B."""
    shares_a, shares_b = a.breakdown.as_dict(), b.breakdown.as_dict()
    median_a = a.steps.median_s if a.steps.count else 0.0
    median_b = b.steps.median_s if b.steps.count else 0.0
    return tuple(PhaseShift(phase, shares_a[phase], shares_b[phase], shares_a[phase] * median_a,
                            shares_b[phase] * median_b) for phase in PHASES)


def script_name(record: RunRecord) -> str:
    """The script's file name (``train.py``), or ``-m MODULE``; ``?`` when the record has no command."""
    command = record.command
    if not command:
        return "?"
    if command[0] == "-m" and len(command) > 1:
        return f"-m {command[1]}"
    return PurePath(command[0]).name or command[0]


def _torch(record: RunRecord) -> str:
    return record.meta.torch or (record.practices.torch_version if record.practices is not None else "") or ""


def _clock(record: RunRecord) -> str:
    return "GPU's timeline" if record.steps.clock == "device" else "host's clock"


def _gpu(record: RunRecord) -> str:
    devices = record.gpus.devices if record.gpus is not None else ()
    return devices[0].name if devices else ""


def flags(a: RunRecord, b: RunRecord) -> tuple[str, ...]:
    """Warnings that A and B differ in more than the change under test; a fact unknown in one run is not flagged."""
    found = []
    pairs = (("scripts", script_name(a), script_name(b)), ("devices", a.device, b.device),
             ("GPUs", _gpu(a), _gpu(b)), ("torch versions", _torch(a), _torch(b)),
             ("CPU counts", a.meta.cpu_count or "", b.meta.cpu_count or ""))
    for what, value_a, value_b in pairs:
        if value_a not in ("", "?") and value_b not in ("", "?") and value_a != value_b:
            found.append(f"the runs have different {what} (A: {value_a}, B: {value_b}): the change is not only yours")
    if a.steps.count and b.steps.count and a.steps.clock != b.steps.clock:
        found.append(f"A's steps are on the {_clock(a)}, B's on the {_clock(b)}: a CUDA run's host clock says how fast "
                     "it launched, not how long its steps took")
    threads_a, threads_b = a.meta.torch_threads, b.meta.torch_threads
    if threads_a and threads_b and threads_a != threads_b:  # the change itself when it was torch.set_num_threads
        found.append(f"the runs used different torch thread counts (A: {threads_a}, B: {threads_b}): every op's "
                     "time changes with it, so a phase's share can move without its own time changing")
    return tuple(found)


def compare(a: RunRecord, b: RunRecord, run_spread: float = PROCESS_SPREAD) -> Comparison:
    """Compare run A (before) with run B (after), each CUDA run's steps on the GPU's clock where its record has
    the device times (``clock.on_device_clock``: records written before the figures were read there)."""
    a, b = on_device_clock(a), on_device_clock(b)
    speed, sample = speedup(a, b, run_spread), per_sample(a, b)
    return Comparison(
        script_a=script_name(a),
        script_b=script_name(b),
        speedup=speed,
        phases=phase_shifts(a, b),
        verdict=VerdictChange(bound_label(a), a.verdict.confidence, bound_label(b), b.verdict.confidence),
        outcomes=outcomes(a, b, speed, sample),
        flags=flags(a, b),
        per_sample=sample,
        children=child_work(a, b),
        busy=tuple(line for line in (busy(a, "A"), busy(b, "B")) if line is not None),
    )
