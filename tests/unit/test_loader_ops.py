"""A DataLoader without workers builds each batch in the loop's process, inside its ``__next__``: those ops (each
item's conversions, the collate) are the data wait's work, counted apart (``op_profile.data_ops``) and left out of
the CPU verdict's per-op fixed cost, which they made read as launch overhead."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from gpuscope.diagnose import analyze
from gpuscope.record import RunRecord

RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "records"


def recorded() -> RunRecord:
    return RunRecord.from_json(json.loads((RECORDS / "vae_items.json").read_text()))


def test_a_vae_whose_items_are_made_tensors_one_by_one_is_not_called_launch_bound_for_them() -> None:
    # given: pytorch/examples' VAE on MNIST-shaped items, converted in __getitem__, no workers: 1,547 of its 2,164
    # ops a step are the items' conversions and the collate, inside the DataLoader's __next__ (the data wait, 19%)
    record = recorded()
    ops = record.op_profile
    assert ops is not None and round(ops.ops_per_step) == 2164
    assert round(ops.ops_per_step - ops.compute_ops_per_step) == 1547
    analyzed = analyze(record)
    # then: the step's own 617 ops' fixed cost is 7% of it; compute-bound, and no larger batch is advised for them
    assert analyzed.verdict.bound == "compute", analyzed.verdict.evidence
    assert analyzed.verdict.evidence[0].startswith(
        "617 torch ops per step (besides 1547 a step building its batches in the DataLoader's __next__, the data "
        "wait's work) at 0.85 us of fixed cost each")
    assert "larger-batch" not in {r.id for r in analyzed.recommendations}
    # where they were counted with the step's (records made before they were kept apart), their fixed cost, paid per
    # item and already in the data wait, read as the step's launch overhead: 24% of the step; and at the 1.21 us an
    # op the calibration measured in another run of the same script, launch-bound (now: compute-bound still)
    before = dataclasses.replace(record, op_profile=dataclasses.replace(ops, data_ops=0, data_ops_self_s=0.0))
    assert "make 1.83 ms: 24% of the 7.64 ms step" in analyze(before).verdict.evidence[0]
    slower = dataclasses.replace(record.calibration, op_overhead_s=1.21e-6)
    assert analyze(dataclasses.replace(before, calibration=slower)).verdict.bound == "cpu-launch"
    assert analyze(dataclasses.replace(record, calibration=slower)).verdict.bound == "compute"
