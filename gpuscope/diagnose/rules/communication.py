"""Rules for data-parallel jobs whose steps wait on gradient communication."""

from __future__ import annotations

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import STEP
from gpuscope.diagnose.rules.base import Finding, rule
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
      needs=("op_profile",),
      resolved_by=(STEP,))
def reduce_communication(run: RunRecord) -> Finding | None:
    """Signal: the training thread waits on collectives (gradient all-reduce) for a notable share of the step.
    Why it matters: the gradients' size does not depend on the batch, so every step pays the whole all-reduce;
    what DDP cannot hide behind backward (its buckets overlap with the remaining backward work) is exposed.
    Fix: a larger batch per rank, or gradient accumulation with ``model.no_sync()`` (one all-reduce per k
    micro-batches); also DDP(bucket_cap_mb=...) to start all-reduces earlier, and ``gradient_as_bucket_view=True``."""
    comm = run.op_profile.communication  # type: ignore[union-attr]
    median = run.steps.median_s
    if comm is None or not median:
        return None
    share = comm.exposed_s / median
    if share < th.COMM_NOTABLE:
        return None
    evidence = (
        f"the training thread waits {comm.exposed_s * 1e3:.1f} ms a step on {comm.backend} collectives: {share:.0%} "
        f"of the {median * 1e3:.1f} ms step",
        f"{comm.calls_per_step:.0f} collectives per step are in flight {comm.comm_s * 1e3:.1f} ms; "
        f"{comm.overlap:.0%} of that overlaps with compute",
    )
    steps = th.ACCUMULATION_STEPS
    return Finding(share * (1 - 1 / steps), evidence)
