"""A run of three long LBFGS steps (issue 55): step 1's seconds place the windows one step each, the trace records
step 2's first closure call and the FLOP count its second, and the verdict comes from that step, its time the
call's times its calls."""

from __future__ import annotations

import pytest

from conftest import SCRIPTS, Runs

pytestmark = pytest.mark.slow


def test_three_long_lbfgs_steps_get_a_trace_a_flop_count_and_a_verdict_from_the_traced_step(runs: Runs) -> None:
    # given three LBFGS steps of 4 closure calls, each call 0.6 s
    run = runs.get(SCRIPTS / "lbfgs_long.py", options=("--no-probes",))
    record = run.record
    assert run.result.returncode == 0, run.result.stderr
    notes = record["meta"]["notes"]
    # then step 1 made the windows one step each, the FLOP count on the traced step's second call
    assert any(n.startswith("long-steps: step 1 took") and "torch.profiler step 2, the FLOP count step 2 (its second "
               "closure call)" in n for n in notes), notes
    # the trace holds step 2's first call, its op figures times the step's 4 calls
    ops = record["op_profile"]
    assert (ops["window"]["first_step"], ops["closure_calls"]) == (2, 4) and 0.6 < ops["closure_call_s"] < 3
    assert (run.run_dir / "trace.json").is_file()
    # the FLOPs are the second call's times 4: each call two matmuls forward, backward the first one's weight
    # gradient (the input needs none) and the second one's weight and input gradients
    sol = record["speed_of_light"]
    first_layer, second_layer = 2 * 256 * 32 * 64, 2 * 256 * 64 * 1
    assert sol["step"] == 2 and sol["flops_per_step"] == 4 * (2 * first_layer + 3 * second_layer)
    assert "no step ran unprofiled" in sol["note"] and sol["achieved_flops_per_s"]  # over step 2 (no peak: no probes)
    # and the verdict is the traced step's, timed as its call times its calls, not its wall (which holds the
    # trace's export and the FLOP count too)
    first = record["verdict"]["evidence"][0]
    assert first.startswith("thin evidence: no step ran unprofiled") and "times its 4 calls" in first


def test_three_long_steps_without_a_closure_get_their_flops_from_the_traced_steps_shapes(runs: Runs) -> None:
    # given three long steps of one forward and backward pass each: the FLOP count takes no step of its own
    run = runs.get(SCRIPTS / "long_steps_plain.py", options=("--no-probes",))
    record = run.record
    assert run.result.returncode == 0, run.result.stderr
    assert any(n.startswith("long-steps: step 1 took")
               and "torch.profiler step 2, the FLOPs read from the traced step's op shapes" in n
               for n in record["meta"]["notes"])
    assert record["op_profile"]["window"]["first_step"] == 2 and (run.run_dir / "trace.json").is_file()
    # then step 2's FLOPs are read from its trace's op shapes: its two matmuls forward, the first one's weight gradient
    # and the second one's weight and input gradients backward
    sol = record["speed_of_light"]
    first_layer, second_layer = 2 * 256 * 32 * 64, 2 * 256 * 64 * 1
    assert sol["step"] == 2 and sol["flops_per_step"] == 2 * first_layer + 3 * second_layer
    assert sol["flops_by_dtype"] == {"float32": sol["flops_per_step"]}
    assert "step 2's FLOPs: read from the shapes of its traced ops" in " ".join(record["meta"]["notes"])
    # and the verdict is the traced step's
    assert record["verdict"]["evidence"][0].startswith("thin evidence: no step ran unprofiled")
