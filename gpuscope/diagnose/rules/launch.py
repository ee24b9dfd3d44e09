"""Rules for launch-bound runs: fewer, larger ops (bigger batches, fusion, replayed graphs)."""

from __future__ import annotations

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import (
    FIXED_COST,
    LAUNCH_WAIT,
    STEP,
    accumulation_saving,
    batch_size,
    cpu_overhead,
    launch_wait,
)
from gpuscope.diagnose.gpu_step import gpu_step
from gpuscope.diagnose.rules.base import AtRunTime, Finding, Refused, rule
from gpuscope.diagnose.rules.dataloader import loader_call, site_comment
from gpuscope.record import RunRecord


def _launch_evidence(run: RunRecord) -> tuple[float, str] | None:
    """How much of the step is per-op overhead (CPU) or GPU idle waiting for launches (CUDA), with the fact."""
    if run.device == "cuda":
        kernels = run.op_profile.kernels if run.op_profile is not None else None
        share, step = launch_wait(run), gpu_step(run)
        if kernels is None or share is None or step is None:
            return None
        fact = (f"the GPU idles {1 - step.busy:.0%} of the step, {share:.0%} waiting for the host to launch the "
                f"next of {kernels.kernels_per_step:.0f} kernels per step")
        waited = step.launch_wait_s / step.step_s
        if share < waited:
            fact += f" (it waits {waited:.0%} for the host, less the {run.breakdown.data_wait:.0%} the host waits for data)"
        return share, fact
    overhead = cpu_overhead(run)
    if overhead is None:
        return None
    return overhead.share, (f"{overhead.ops_per_step:.0f} ops per step at {overhead.op_cost_s * 1e6:.2f} us of fixed "
                            f"cost each: {overhead.share:.0%} of the step is per-op overhead")


@rule(id="larger-batch",
      title="Raise the batch size",
      fix="DataLoader(..., batch_size=2 * B)  # then retune the learning rate and warm-up",
      needs=("op_profile",),
      resolved_by=(FIXED_COST, LAUNCH_WAIT, STEP),
      trial=Refused("it changes the optimisation (the samples each update averages over, and the learning "
                     "rate that suits them), not only the speed"))
def larger_batch(run: RunRecord) -> Finding | None:
    """Signal: per-op overhead (CPU) or host-wait idle (GPU) is a notable share of the step; or the step
    accumulates gradients over batches whose passes are fixed cost (``_accumulation_finding``).
    Why it matters: the op count per step does not grow with the batch, so a larger batch spreads the fixed cost
    over more samples (the seeds' lesson: larger batches hide CPU overhead).
    Fix: raise the batch size while memory allows; retune learning rate and warm-up."""
    if (accumulated := _accumulation_finding(run)) is not None:
        return accumulated
    found = _launch_evidence(run)
    if found is None or found[0] < th.LAUNCH_NOTABLE:
        return None
    share, fact = found
    batch = batch_size(run)
    evidence = (fact,) + ((f"the batch size is {batch}",) if batch else ())
    passes = run.steps.forwards_per_backward
    if passes is not None and passes >= th.ROLLOUT_FORWARDS and not run.loaders:
        # a rollout (no DataLoader batches the samples): more samples a step would be more forwards, as many ops a
        # sample; the fix is a wider forward. With a loader, its batch is what each forward takes (an RNN stepped
        # through time on a batch of sequences): a larger one still spreads the ops over more samples
        evidence += (f"the model runs forward {passes:.0f} times for each backward(): sample by sample, its op "
                     "count grows with the samples",)
        fix = ("run 2 environments (or sequences) side by side and call the model once on their stacked inputs, "
               f"instead of once for each ({passes:.0f} forwards for each backward() here)  # then retune the "
               "learning rate")
        return Finding(share / 2, evidence, fix=fix)
    # doubling the batch halves the fixed cost per sample: the time per sample falls by share / 2
    return Finding(share / 2, evidence, fix=_batch_fix(run, batch))


def _accumulation_finding(run: RunRecord) -> Finding | None:
    """``larger-batch`` where each step takes 2 batches or more from its loader (gradients accumulated before the
    optimizer steps) and its passes are fixed cost: the step's arithmetic ran at ``ACCUMULATED_MFU`` of the peak or
    less, and, on a CPU, its ops were tiny (``TINY_OP_RATIO``). One forward and backward over all of a step's samples
    makes the same update with one pass's fixed cost. Gain, with the forward and backward only (the loader's
    per-batch work and a loss per batch fall too): (k - 1) / k of their share, less their arithmetic at the peak."""
    sol, batch, accumulated = run.speed_of_light, batch_size(run), accumulation_saving(run)
    if accumulated is None or sol is None or not batch:
        return None
    passes, gain = accumulated
    overhead = cpu_overhead(run) if run.device != "cuda" else None
    if run.device != "cuda" and (overhead is None or run.op_profile is None
                                 or run.op_profile.compute_mean_op_s > th.TINY_OP_RATIO * overhead.op_cost_s):
        return None
    model = run.breakdown.forward + run.breakdown.backward
    evidence = (
        f"each optimizer step takes {passes} batches of {batch} from the DataLoader (gradients accumulated over "
        f"them): {passes} forward and backward passes a step, {model:.0%} of it",
        f"the step's arithmetic, {sol.flops_per_step / 1e6:.2f} MFLOP, ran at {sol.mfu:.1%} of the peak "
        f"({sol.peak_source}): each pass is fixed cost (Python, the ops' launches, autograd), paid {passes} times a "
        "step",
    )
    loader = max(run.loaders, key=lambda l: l.batch_size or 0)
    fix = loader_call(loader, f"per_device_train_batch_size={passes * batch}, gradient_accumulation_steps=1",
                      f"batch_size={passes * batch}")
    then = "while memory allows" if loader.created_by == "transformers" else (
        f"then accumulate no more: an optimizer step every batch, not every {passes} (accelerate: "
        f"Accelerator(gradient_accumulation_steps=1); Lightning: Trainer(accumulate_grad_batches=1); a loop of your "
        f"own: no division of the loss by {passes}), the same {passes * batch} samples an update in one forward and "
        "backward, while memory allows")
    where = site_comment(loader)
    fix = f"{fix}{where}, {then}" if where else f"{fix}  # {then}"
    return Finding(gain, evidence, fix=fix)


def _batch_fix(run: RunRecord, batch: int) -> str:
    """The code change: the loader's batch size (the Trainer's argument where transformers built the loader; the
    batch sampler's, where the script passed one), on the loader's line; for a loader whose batch size is not known
    (its dataset makes the batches), that loader's line too; without a DataLoader, where the script builds its
    batches."""
    retune = "then retune the learning rate and warm-up"
    loader = max(run.loaders, key=lambda l: l.batch_size or 0, default=None)
    if loader is None:
        return (f"build each step's batch from twice the samples where the script makes it (no DataLoader was "
                f"seen)  # {retune}")
    where = site_comment(loader)
    if not batch:
        return (f"DataLoader(...)  # twice the samples in each batch its dataset makes (batch_size=None)"
                f"{where.replace('  #', ';', 1)}, {retune}")
    if loader.batch_sampler:
        fix = f"DataLoader(..., batch_sampler={loader.batch_sampler}(..., batch_size={2 * batch}))"
    else:
        fix = loader_call(loader, f"per_device_train_batch_size={2 * batch}", f"batch_size={2 * batch}")
    return f"{fix}{where}, {retune}" if where else f"{fix}  # {retune}"


@rule(id="jit-fusion",
      title="Fuse chains of element-wise ops with torch.compile",
      fix="model = torch.compile(model)",
      needs=("op_profile",),
      resolved_by=(FIXED_COST, LAUNCH_WAIT, STEP),
      trial=AtRunTime())
def jit_fusion(run: RunRecord) -> Finding | None:
    """Signal: per-op overhead is notable and many of the ops are element-wise.
    Why it matters: each element-wise op is a launch and a round trip through memory; a fused kernel does a
    chain of them in one (the seeds: GELU's divide, erf and multiply as one kernel).
    Fix: torch.compile(model) (or torch.jit.script for a hot function)."""
    found = _launch_evidence(run)
    ops = run.op_profile
    if found is None or found[0] < th.LAUNCH_NOTABLE or ops is None or not ops.ops:
        return None
    elementwise = ops.calls_by_kind.get("elementwise", 0) / ops.ops
    if elementwise < th.ELEMENTWISE_NOTABLE:
        return None
    share, fact = found
    return Finding(share * elementwise, (fact, f"{elementwise:.0%} of the op calls are element-wise"))


STATIC_MODE = "reduce-overhead"
"""torch.compile's mode that captures the step in CUDA graphs: the static-graph fix's."""


@rule(id="static-graph",
      title="Replay the step as a static graph (CUDA graphs)",
      fix=f'model = torch.compile(model, mode="{STATIC_MODE}")  # or capture the step with torch.cuda.graphs',
      needs=("cuda", "kernels"),
      resolved_by=(LAUNCH_WAIT, FIXED_COST, STEP),
      trial=AtRunTime(settings={"mode": STATIC_MODE}))
def static_graph(run: RunRecord) -> Finding | None:
    """Signal: the GPU waits for the host to launch kernels ``SIDE_NOTABLE`` of the steady step or more (where that
    is a side of a mixed verdict, its advice).
    Why it matters: replaying a captured graph launches all of a step's kernels at once; the per-kernel launch
    gaps go (the seeds: static-graph caching took ResNet-50 from 11.9 to 15.5 it/s).
    Fix: torch.compile(mode="reduce-overhead"), or torch.cuda.graphs for a static step. Gain: that wait."""
    found = _launch_evidence(run)
    if found is None or found[0] < th.SIDE_NOTABLE:
        return None
    share, fact = found
    return Finding(share, (fact,))
