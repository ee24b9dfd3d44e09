"""Rules about training habits that cost time and buy nothing: debug APIs left on, zero-filled gradients, biases
that BatchNorm cancels, DataParallel."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import STEP, Metric
from gpuscope.versions import parse_version
from gpuscope.diagnose.rules.base import AtRunTime, Finding, Refused, rule
from gpuscope.record import CallSite, RunRecord


def _site(site: CallSite) -> str:
    return f"{site.file}:{site.line} `{site.code}`" if site.file else "a line outside the user's code"


def _sites(sites: tuple[CallSite, ...]) -> str:
    return ", ".join(f"{_site(s)} ({s.calls}x)" for s in sites[:3])


def _zero_fill(record: RunRecord) -> float | None:
    p = record.practices
    return p.zero_grad_fill_calls / p.zero_grad_calls if p is not None and p.zero_grad_calls else None


def _anomaly(record: RunRecord) -> float | None:
    p = record.practices
    return p.anomaly_steps / p.steps_checked if p is not None and p.steps_checked else None


def _layers(attr: str) -> Callable[[RunRecord], float | None]:
    """A reader of how many of the model's layers (or wrappers) the practices list under ``attr``."""
    def read(record: RunRecord) -> float | None:
        p = record.practices
        return float(len(getattr(p, attr))) if p is not None and p.modules_inspected else None
    return read


@rule(id="disable-debug-apis",
      title="Turn off the debug APIs left on in training",
      fix="remove torch.autograd.detect_anomaly() / set_detect_anomaly(True), the autograd profiler or emit_nvtx, "
          "and gradcheck calls from the training loop",
      needs=("practices",),
      resolved_by=(Metric("steps under anomaly detection", "share", _anomaly), STEP),
      trial=AtRunTime())
def disable_debug_apis(run: RunRecord) -> Finding | None:
    """Signal: anomaly detection on during steps, torch's autograd profiler (or emit_nvtx) on outside gpuscope's
    own window, or gradcheck called while training.
    Why it matters: anomaly detection records a Python stack for every op and checks every gradient for NaNs; the
    profiler records every op; gradcheck runs the model many times over in float64. All are for debugging.
    Fix: remove them from the training loop (the seeds: NVIDIA's tuning guide, "turn debug APIs off").
    Gain: anomaly detection's NaN-check ops as profiled, plus its stack capture per op (calibrated), per step."""
    p = run.practices
    assert p is not None
    evidence: list[str] = []
    gain: float | None = None
    if p.anomaly_steps:
        evidence.append(f"anomaly detection was on in {p.anomaly_steps} of {p.steps_checked} steps checked"
                        + (f", switched on at {_sites(p.anomaly_sites)}" if p.anomaly_sites else ""))
        cost_s, parts = _anomaly_cost(run)
        if cost_s and run.steps.median_s:
            share = min(1.0, cost_s / run.steps.median_s)
            gain = share * p.anomaly_steps / max(p.steps_checked, 1)
            evidence.append(f"it cost about {cost_s * 1e3:.1f} ms of the {run.steps.median_s * 1e3:.1f} ms step "
                            f"({share:.0%}): " + "; ".join(parts))
    if p.profiler_steps:
        evidence.append(f"torch's autograd profiler (or emit_nvtx) was on in {p.profiler_steps} of "
                        f"{p.steps_checked} steps checked, outside gpuscope's own profiling window")
    if p.gradcheck_sites:
        evidence.append(f"gradcheck ran during training: {_sites(p.gradcheck_sites)}")
    if not evidence:
        return None
    fix = None
    if p.anomaly_sites and p.anomaly_sites[0].file:
        fix = f"{_site(p.anomaly_sites[0])}: remove anomaly detection from the training loop (keep it for debugging)"
    return Finding(gain, tuple(evidence), fix=fix)


ANOMALY_CHECK_OPS = ("aten::isnan", "aten::ne", "aten::_is_any_true", "aten::any")
"""The ops of anomaly detection's NaN check on every gradient (``isnan(grad)._is_any_true()``, isnan being
``x != x``). A model's own ops of these names count too: the estimate is an upper bound for that part."""


def _anomaly_cost(run: RunRecord) -> tuple[float, list[str]]:
    """Seconds per step anomaly detection costs: its NaN checks as torch.profiler timed them, and its stack
    capture per op as calibration measured it on a tiny model."""
    ops, cal = run.op_profile, run.calibration
    cost, parts = 0.0, []
    if ops is not None and ops.steps:
        checks = [o for o in ops.top_host if o.name in ANOMALY_CHECK_OPS]
        if checks:
            per_step = sum(o.device_s if run.device == "cuda" else o.self_host_s for o in checks) / ops.steps
            cost += per_step
            parts.append(f"its NaN checks on every gradient took {per_step * 1e3:.1f} ms per profiled step ("
                         + ", ".join(f"{o.name} x{o.calls}" for o in checks) + f" in {ops.steps} steps)")
        if cal is not None and cal.anomaly_op_overhead_s and ops.ops_per_step:
            per_step = cal.anomaly_op_overhead_s * ops.ops_per_step
            cost += per_step
            parts.append(f"recording a stack for each op adds about {cal.anomaly_op_overhead_s * 1e6:.1f} us per op "
                         f"(measured here on a tiny model) x {ops.ops_per_step:.0f} ops = {per_step * 1e3:.1f} ms")
    return cost, parts


@rule(id="zero-grad-set-to-none",
      title="Drop gradients instead of zero-filling them",
      fix="optimizer.zero_grad(set_to_none=True)",
      needs=("practices",),
      resolved_by=(Metric("zero_grad calls that zero-fill", "share", _zero_fill), STEP),
      trial=AtRunTime())
def zero_grad_set_to_none(run: RunRecord) -> Finding | None:
    """Signal: zero_grad calls that zero-fill the gradients (set_to_none=False, or the default before torch 2.0).
    Why it matters: zero-filling writes every gradient once more per step, and the next backward then adds into
    the zeros instead of simply assigning (the seeds: NVIDIA's tuning guide).
    Fix: zero_grad(set_to_none=True), the default since torch 2.0.
    Gain: the time the profiled steps spent in aten::zero_, where torch.profiler saw it."""
    p = run.practices
    assert p is not None
    if not p.zero_grad_fill_calls:
        return None
    version = p.torch_version or "this torch"
    if (parse_version(p.torch_version) or (0, 0)) >= (2, 0):
        default = f"torch {version} drops gradients by default (set_to_none=True); these calls pass False"
    else:
        default = f"torch {version} zero-fills by default: pass set_to_none=True"
    evidence = [f"{p.zero_grad_fill_calls} of {p.zero_grad_calls} zero_grad calls zero-filled the gradients: "
                f"{_sites(p.zero_grad_fill_sites)}", default]
    gain = None
    ops = run.op_profile
    fills = [o for o in (ops.top_host if ops is not None else ()) if o.name in ("aten::zero_", "aten::fill_")]
    if fills and ops is not None and ops.steps and run.steps.median_s:
        device = run.device == "cuda"
        per_step = sum(o.device_s if device else o.self_host_s for o in fills) / ops.steps
        gain = min(1.0, per_step / run.steps.median_s)
        evidence.append(f"zero-filling took {per_step * 1e3:.2f} ms per profiled step ({gain:.0%} of the step), "
                        f"in {', '.join(o.name for o in fills)}")
    site = p.zero_grad_fill_sites[0] if p.zero_grad_fill_sites else None
    fix = f"{_site(site)}: zero_grad(set_to_none=True)" if site is not None and site.file else None
    return Finding(gain, tuple(evidence), fix=fix)


@rule(id="bias-before-batchnorm",
      title="Drop the bias of layers that feed BatchNorm",
      fix="nn.Conv2d(..., bias=False)  # directly before nn.BatchNorm2d",
      needs=("practices", "model"),
      resolved_by=(Metric("biases before BatchNorm", "number", _layers("bias_before_norm")), STEP),
      trial=Refused("it changes the model's layers, and its checkpoints"))
def bias_before_batchnorm(run: RunRecord) -> Finding | None:
    """Signal: a convolution or linear layer with a bias registered right before a BatchNorm of its width.
    Why it matters: BatchNorm subtracts the batch mean, which removes any constant the layer added: the bias is
    computed, its gradient reduced over the whole output and its update applied, for nothing (the seeds:
    NVIDIA's tuning guide).
    Fix: bias=False on those layers. No gain is estimated: it is a small saving per layer, measured by re-running."""
    p = run.practices
    assert p is not None
    if len(p.bias_before_norm) < th.BIAS_BEFORE_NORM_MIN_LAYERS:
        return None
    shown = "; ".join(p.bias_before_norm[:4]) + (f"; and {len(p.bias_before_norm) - 4} more"
                                                  if len(p.bias_before_norm) > 4 else "")
    return Finding(None, (
        f"{len(p.bias_before_norm)} layers with a bias feed a BatchNorm, which cancels it: {shown}",
        f"{p.wasted_bias_params} bias parameters are computed, reduced in backward and updated for nothing",
    ), fix=_bias_fix(p.bias_before_norm))


_PAIR = re.compile(r"\((\w+)\) -> .*\((\w+)\)$")
"""A pair as ``inspect_modules`` writes it: ``features.0 (Conv2d) -> features.1 (BatchNorm2d)``."""


def _bias_fix(pairs: tuple[str, ...]) -> str | None:
    """The fix for the kinds of layer seen (``nn.Linear(..., bias=False)  # directly before nn.BatchNorm1d``), rather
    than the rule's general one, which names a convolution; None where no pair reads as expected."""
    kinds = list(dict.fromkeys(m.groups() for pair in pairs if (m := _PAIR.search(pair))))
    if not kinds:
        return None
    if len({layer for layer, _ in kinds}) == 1 and len({norm for _, norm in kinds}) == 1:
        return f"nn.{kinds[0][0]}(..., bias=False)  # directly before nn.{kinds[0][1]}"
    layers = ", ".join(dict.fromkeys(f"nn.{layer}(..., bias=False)" for layer, _ in kinds))
    return f"{layers}  # each directly before its BatchNorm"


@rule(id="distributed-data-parallel",
      title="Use DistributedDataParallel instead of DataParallel",
      fix="torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])  # one process per GPU, "
          "launched with torchrun",
      needs=("practices", "model"),
      resolved_by=(Metric("DataParallel wrappers", "number", _layers("data_parallel")), STEP),
      trial=Refused("it needs the script launched as one process per GPU"))
def distributed_data_parallel(run: RunRecord) -> Finding | None:
    """Signal: a DataParallel wrapper around a trained model.
    Why it matters: DataParallel drives every GPU from one Python process: it scatters the batch, replicates the
    model and gathers the outputs on GPU 0 every step, and its GPUs wait on each other and on the one process's
    GIL. DistributedDataParallel runs a process per GPU and overlaps the gradient all-reduce with backward (the
    seeds: NVIDIA's tuning guide). On a CPU or a single GPU, DataParallel does nothing but wrap.
    Fix: DistributedDataParallel, launched with torchrun."""
    p = run.practices
    assert p is not None
    if not p.data_parallel:
        return None
    return Finding(None, (f"the model is wrapped in {', '.join(p.data_parallel)}",
                          "DataParallel drives every GPU from this one process, replicating the model each step"))


DISTRIBUTION_CHECKS_MIN_SHARE = 0.02
"""The share of the step torch.distributions' checks must take for ``skip-distribution-checks`` to fire: below it,
a line changed for a saving no run-to-run comparison could show."""


def _distribution_check_s(run: RunRecord) -> tuple[float, float] | None:
    """The checks' seconds and count a step: medians over the steady steps among those the practices kept (over
    all but the first where the step sample names none of them)."""
    p = run.practices
    if p is None or not p.distribution_check_steps:
        return None
    kept = _checks_in(run, "steady") or list(zip(p.distribution_check_s[1:], p.distribution_check_counts[1:]))
    if not kept:
        return None
    return statistics.median(s for s, _ in kept), statistics.median(n for _, n in kept)


def _checks_in(run: RunRecord, status: str) -> list[tuple[float, float]]:
    """The checks' (seconds, count) in each step the practices kept whose status in the step sample is ``status``."""
    p, sample = run.practices, run.steps.sample
    assert p is not None
    held = {i for i, kind in zip(sample.index, sample.status) if kind == status}
    return [(s, n) for i, s, n in zip(p.distribution_check_steps, p.distribution_check_s,
                                      p.distribution_check_counts) if i in held]


def _rollout_checks(run: RunRecord, checks: tuple[float, float]) -> tuple[float, float, float] | None:
    """Where the steps held rollouts (``steps.rollouts``): the checks' seconds and count in a rollout's step (medians
    over those the practices kept), and their share of the run's training time, updates (``checks`` a step) and
    rollouts together."""
    steps = run.steps
    if run.practices is None or not steps.rollouts or not steps.evaluated or not steps.evaluated_s:
        return None
    kept = _checks_in(run, "eval")
    if not kept:
        return None
    seconds, count = statistics.median(s for s, _ in kept), statistics.median(n for _, n in kept)
    total = steps.median_s * steps.count + steps.evaluated_s
    share = (checks[0] * steps.count + seconds * steps.evaluated) / total if total > 0 else 0.0
    return seconds, count, share


def _distribution_share(run: RunRecord) -> float | None:
    checks = _distribution_check_s(run)
    return checks[0] / run.steps.median_s if checks is not None and run.steps.median_s else None


@rule(id="skip-distribution-checks",
      title="Skip torch.distributions' argument checks while training",
      fix="torch.distributions.Distribution.set_default_validate_args(False)  # once, before the training loop",
      needs=("practices",),
      resolved_by=(Metric("torch.distributions' checks, share of the step", "share", _distribution_share), STEP),
      trial=AtRunTime())
def skip_distribution_checks(run: RunRecord) -> Finding | None:
    """Signal: torch.distributions checked its arguments and samples (``validate_args``, on by default) for 2% of
    the step or more.
    Why it matters: each distribution built checks every parameter against its constraint (probabilities on the
    simplex, a positive scale), and each ``log_prob`` checks its value: a Python loop and several small ops per
    call, and on CUDA a wait for the GPU to hand back each verdict. A policy that builds a distribution per
    environment step pays them at every one. They catch bugs in the model; they do not train it.
    Fix: ``Distribution.set_default_validate_args(False)`` once, or ``validate_args=False`` where one is built
    (keep them on while debugging).
    Gain: the checks' own time, timed around them in each steady step, over the median step. Where the steps left
    out as rollouts (a policy sampling an action an environment step: CleanRL's PPO) check too, the evidence adds
    theirs and the checks' share of the run's whole training time (a PPO on CartPole: 4% of an update, 11% of a
    rollout, 9% of the run, where the run without them was 10% faster)."""
    checks = _distribution_check_s(run)
    share = _distribution_share(run)
    if checks is None or share is None or share < DISTRIBUTION_CHECKS_MIN_SHARE:
        return None
    rollouts = _rollout_checks(run, checks)
    seconds, count = checks
    p = run.practices
    assert p is not None
    evidence = [f"torch.distributions checked its arguments or a sample {count:.0f} times a step (validate_args, "
                f"on by default), taking {seconds * 1e3:.2f} ms of the {run.steps.median_s * 1e3:.1f} ms median "
                f"step ({min(share, 1.0):.0%}), timed around the checks in each step"]
    if rollouts is not None:
        steps = run.steps
        each_s = steps.evaluated_s / steps.evaluated
        evidence.append(f"the {steps.evaluated} steps holding a rollout checked {rollouts[1]:.0f} times each, "
                        f"taking {rollouts[0] * 1e3:.2f} ms of each one's {each_s * 1e3:.1f} ms: with them the "
                        f"checks are {rollouts[2]:.0%} of the run's training time "
                        f"({steps.evaluated_s:.1f} s of rollouts and {steps.median_s * steps.count:.1f} s of updates), "
                        "which the step's share leaves out")
    if p.distribution_sites:
        evidence.append("the distributions were built at " + ", ".join(_site(s) for s in p.distribution_sites[:3]))
    if run.device == "cuda":
        evidence.append("on the GPU each check also waits for the device to hand back its verdict")
    site = p.distribution_sites[0] if p.distribution_sites else None
    fix = None
    if site is not None and site.file:
        fix = (f"{_site(site)}: pass validate_args=False to the distribution built there, or call "
               f"torch.distributions.Distribution.set_default_validate_args(False) once before training")
    return Finding(min(share, 1.0), tuple(evidence), fix=fix)
