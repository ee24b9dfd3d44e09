"""Rules for data-parallel jobs: steps that wait on gradient communication, and ranks that wait for one of them."""

from __future__ import annotations

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import STEP, comm_share, forward_comm_share
from gpuscope.diagnose.rules.base import Finding, Refused, rule
from gpuscope.diagnose.words import comm_flight_text, comm_wait_text, unlike_window
from gpuscope.record import RunRecord

ACCUMULATE = f"""for i, (x, y) in enumerate(loader):
    last = (i + 1) % {th.ACCUMULATION_STEPS} == 0
    with (contextlib.nullcontext() if last else model.no_sync()):  # all-reduce once every {th.ACCUMULATION_STEPS}
        (loss_fn(model(x), y) / {th.ACCUMULATION_STEPS}).backward()
    if last:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)"""


@rule(id="reduce-communication",
      title="Send gradients less often: larger batches or gradient accumulation",
      fix=ACCUMULATE,
      needs=("collectives",),
      resolved_by=(STEP,),
      trial=Refused("it changes the optimisation (more samples an update) or the job's launch"))
def reduce_communication(run: RunRecord) -> Finding | None:
    """Signal: the training thread (the device) waits on the collectives' own work (gradient all-reduce), not on a
    later rank, for a notable share of the step.
    Why it matters: the gradients' size does not depend on the batch, so every step pays the whole all-reduce;
    what DDP cannot hide behind backward (its buckets overlap with the remaining backward work) is exposed. A wait
    for a rank that arrives late is imbalance (``balance-ranks``): sending less often leaves its cause in place.
    Fix: a larger batch per rank, or gradient accumulation with ``model.no_sync()`` (one all-reduce per k
    micro-batches); also DDP(bucket_cap_mb=...) to start all-reduces earlier, and ``gradient_as_bucket_view=True``.
    The share is of the profiled steps' own time, as the communication verdict's: where those steps ran at another
    pace than the steady ones, it stands where the verdict does (at its bar), and says so. Where they ran like the
    steady ones but for the profiler, the gain's share is of the steady step where it is larger there: the profiler
    slows the step's own work, not the collectives'. Collectives issued in forward (tensor parallelism's all-reduces
    of activations) come with every forward pass, however often gradients are sent: their part of the wait is left
    out of the gain."""
    comm = run.op_profile.communication  # type: ignore[union-attr]
    median = run.steps.median_s
    if comm is None or not median:
        return None
    forward = forward_comm_share(comm)
    share = comm_share(comm, median) * (1 - forward)
    if share < th.COMM_NOTABLE:
        return None
    in_forward = (f"{forward:.0%} of that wait is in collectives issued in forward (tensor parallelism's "
                  "activations, sharded parameters' gathers), which come with every forward pass: left out of the gain")
    where = run.distributed
    alone = (f"only this rank of {where.world_size} was profiled (the script started the others without gpuscope): "
             "its wait may hold waits for a slower rank, which are imbalance, not communication"
             if where is not None and where.profiled_alone else None)
    evidence = (
        comm_wait_text(comm, median),
        comm_flight_text(comm),
        *((in_forward,) if forward >= th.FORWARD_COMM_NOTABLE else ()),
        *((alone,) if alone is not None else ()),
        *((unlike,) if (unlike := unlike_window(run)) is not None else ()),
    )
    steps = th.ACCUMULATION_STEPS
    steady = min(1.0, comm.own_exposed_s / median) * (1 - forward)
    if comm.step_s and unlike is None and steady > share:  # the profiler slowed the step's work, not the collectives'
        evidence += (f"the profiler slowed the step's own work, not the collectives': against the {median * 1e3:.1f} "
                     f"ms steady-state step that wait is {steady:.0%}, the share the gain is of",)
        share = steady
    return Finding(share * (1 - 1 / steps), evidence)


BALANCE_FIXES = {
    "data_wait": "# its batches come slower: give its DataLoader workers (num_workers=...), or find what makes its "
                 "shard slower to load (a slow disk or node, larger items in its shard)",
    "forward": "# it computes more: even out the work per rank (similar sequence lengths per batch: a length-bucketing "
               "sampler), move work only it does (logging, metrics, evaluation) off the step, or check its device",
    "backward": "# its backward takes longer before its gradients are ready: even out the work per rank (similar "
                "sequence lengths per batch), look for hooks or extra losses only it runs, or check its device",
    "optimizer": "# its optimizer step takes longer: work only it does after backward (checkpointing, EMA, logging) "
                 "delays its next arrival; do it on every rank or off the step",
    "other": "# it spends longer outside the phases gpuscope names: the script's own code on that rank (logging, "
             "evaluation, checkpointing on rank 0); move it off the step or make it asynchronous",
}


@rule(id="balance-ranks",
      title="Even out the rank the others wait for",
      fix=BALANCE_FIXES["other"],
      needs=("job",),
      resolved_by=(STEP,),
      trial=Refused("what makes one rank slower is in your data, your model's inputs or your device, not a "
                     "setting"))
def balance_ranks(run: RunRecord) -> Finding | None:
    """Signal: in a data-parallel job one rank arrives last at the collectives step after step (``diagnose.ranks``),
    and the others sit waiting for it.
    Why it matters: every rank's step is as long as the slowest rank's; the waits are the cost, and sending
    gradients less often does not remove them.
    Fix: whatever makes that rank slower, by the phase its extra time lies in; the gain is the others' wait."""
    late = run.straggler
    if late is None:
        return None
    step_s = late.late_s / late.late_share if late.late_share else run.steps.median_s
    waited = late.others_wait_s if late.others_wait_s is not None else late.late_s
    gain = min(1.0, waited / step_s) if step_s else None
    return Finding(gain, late.evidence, fix=BALANCE_FIXES.get(late.cause, BALANCE_FIXES["other"]))
