"""Jobs sharded or stepped another way than plain DDP (gloo, this CPU): FSDP2's ``fully_shard``, its all-gathers
measured on each rank, run by two simulated nodes (two torchrun launchers, ``--nnodes 2``, a rendezvous on
127.0.0.1) that write into one shared folder, which ``gpuscope report`` merges; DDP with gradient accumulation
(``no_sync()``), DDP around a ``torch.compile``'d model, and FSDP1's ``FullyShardedDataParallel`` on the CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import child_env, free_port, load_run, run_gpuscope, run_job

pytestmark = pytest.mark.slow
pytest.importorskip("torch.distributed")
SHARDED = str(Path(__file__).resolve().parent.parent / "fixtures" / "scripts" / "sharded.py")


def test_an_fsdp2_job_on_two_nodes_writes_one_folder_that_report_merges(tmp_path: Path) -> None:
    # given: two launchers, one a node, meeting at a rendezvous on 127.0.0.1, each rank profiled into one folder
    shared = tmp_path / "shared"
    port = free_port()
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
         "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--rdzv-id", "two-nodes", "-m", "gpuscope", "run", "-o", str(shared), "--no-probes", SHARDED,
         "--mode", "fsdp2", "--steps", "18"],
        cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in (0, 1)]
    outputs = [launcher.communicate(timeout=240)[0] for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0, 0], [out[-2000:] for out in outputs]
    # then: the folder holds both ranks, and gpuscope report merges them, each rank's host named
    result = run_gpuscope(["report", str(shared)], tmp_path)
    assert result.returncode == 0, result.stderr
    record = load_run(shared)
    assert [r["rank"] for r in record["ranks"]] == [0, 1] and record["missing_ranks"] == []
    assert all(r["host"] for r in record["ranks"]) and all(r["steps"] >= 5 for r in record["ranks"])
    # fully_shard gathers each block's parameters in forward and again in backward, and reduces the gradients
    comm = record["op_profile"]["communication"]
    assert {"all_gather"} <= {c["kind"] for c in comm["calls"]} and comm["calls_per_step"] >= 8
    # every rank's collectives were matched across the nodes, and each figure is of the same profiled steps
    for rank in record["ranks"]:
        assert 0 <= rank["waiting_s"] <= rank["comm_exposed_s"] <= rank["profiled_step_s"]



def ddp_job(tmp_path: Path, mode: str, *args: str, stderr: list[str] | None = None) -> dict:
    """A 2-rank job of ``sharded.py --mode MODE ARGS`` under ``gpuscope run --nproc-per-node 2``: its merged
    record."""
    record, result = run_job(tmp_path, SHARDED, "--mode", mode, "--steps", "16", *args)
    assert result.returncode == 0, result.stderr[-2000:]
    if stderr is not None:
        stderr.append(result.stderr)
    job = record["_dir"]
    # every rank's 16 optimizer steps, and each figure of the same profiled steps
    for rank in record["ranks"]:
        assert load_run(job / f"rank-{rank['rank']}")["steps"]["total"] == 16
        assert 0 <= rank["waiting_s"] <= rank["comm_exposed_s"] <= rank["profiled_step_s"]
    return record


def test_a_ddp_job_accumulating_gradients_counts_an_optimizer_step_as_its_step(tmp_path: Path) -> None:
    # given: DDP with two micro-batches a step, the first under model.no_sync() (no all-reduce), 16 optimizer steps
    record = ddp_job(tmp_path, "ddp-accum")
    # then: the steps are the optimizer's (16, not the 32 micro-batches), and the all-reduce is issued once a step,
    # by the micro-batch outside no_sync(), not once a micro-batch
    comm = record["op_profile"]["communication"]
    assert {c["kind"] for c in comm["calls"]} == {"all_reduce"} and comm["calls_per_step"] == pytest.approx(1)


def test_a_ddp_job_around_a_compiled_model_is_measured_as_one_without_compile(tmp_path: Path) -> None:
    # given: DDP around torch.compile(model) (the compiled graph calls DDP's hooks; its first step compiles), on the
    # aot_eager backend as test_frameworks' compiled model: Dynamo splits the graph at DDP's buckets and AOTAutograd
    # traces it as for inductor, without inductor's C++ build (a fresh job took 24 s on 2 cores with it, 9 s without)
    record = ddp_job(tmp_path, "ddp-compile", "--backend", "aot_eager")
    # then: its all-reduces are found on each rank, and its first, compiling, step is no steady step
    comm = record["op_profile"]["communication"]
    assert {c["kind"] for c in comm["calls"]} == {"all_reduce"} and comm["calls_per_step"] >= 1
    assert all(rank["comm_s"] > 0 for rank in record["ranks"])
    sample = record["steps"]["sample"]
    assert sample["status"][0] == "warmup" and sample["wall_s"][0] > 10 * record["steps"]["median_s"]


def test_an_fsdp1_job_is_measured_and_its_views_of_parameters_make_no_warning(tmp_path: Path) -> None:
    # given: FSDP1 around each block and the model, its parameters views of each unit's flat parameter
    stderr: list[str] = []
    record = ddp_job(tmp_path, "fsdp1", stderr=stderr)
    # then: its all-gathers (forward, and backward's again) and its gradients' reduce-scatters are found on each rank
    comm = record["op_profile"]["communication"]
    assert {"all_gather", "reduce_scatter"} <= {c["kind"] for c in comm["calls"]} and comm["calls_per_step"] >= 8
    assert all(rank["comm_s"] > 0 for rank in record["ranks"])
    # and the memory window's profiler, reading those views' gradients, left no warning on the user's stderr
    assert "not a leaf Tensor" not in stderr[0]
