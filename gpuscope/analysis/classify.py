"""The verdict: what bounds the run, from the record's measurements.

This first version decides data-loading-bound runs from the step breakdown alone. Telling launch-bound from
compute-bound needs the op-level profile (torch.profiler collector); until it is collected the verdict says so
rather than guess.
"""

from __future__ import annotations

from gpuscope.analysis import thresholds as th
from gpuscope.record import RunRecord, Verdict


def classify(record: RunRecord) -> Verdict:
    """The verdict on ``record``, with its confidence and the numbers it rests on."""
    steps = record.steps
    left_out = (f"{steps.total} steps in all; left out: {steps.warmup} warm-up, {steps.profiled} profiled, "
                f"{steps.outliers} outliers")
    if steps.count < th.MIN_STEADY_STEPS:
        return Verdict(
            "inconclusive",
            0.0,
            (f"only {steps.count} steady-state steps were measured ({left_out}); "
             f"at least {th.MIN_STEADY_STEPS} are needed",),
        )
    share = record.breakdown.data_wait
    basis = "of the GPU's step time" if steps.breakdown_basis == "device" else "of each step"
    loaders = sorted(record.loaders, key=lambda l: -l.wait_s)
    if share >= th.DATA_WAIT_BOUND:
        evidence = [f"{share:.0%} {basis} waits for the next batch (median step {steps.median_s * 1e3:.1f} ms, "
                    f"{steps.count} steady-state steps)"]
        if loaders:
            top = loaders[0]
            evidence.append(f"the {top.dataset} loader has {top.num_workers} worker processes")
        return Verdict("data-loading", _data_confidence(share), tuple(evidence))
    return Verdict(
        "inconclusive",
        0.0,
        (f"{share:.0%} {basis} waits for data, under the {th.DATA_WAIT_BOUND:.0%} at which loading bounds the run",
         "telling launch-bound from compute-bound needs the op-level profile, which this run did not collect"),
    )


def _data_confidence(share: float) -> float:
    """0.6 at the data-bound threshold, rising linearly to 0.95 where the wait is half the step or more."""
    span = 0.5 - th.DATA_WAIT_BOUND
    return round(min(0.95, 0.6 + 0.35 * (share - th.DATA_WAIT_BOUND) / span), 2)
