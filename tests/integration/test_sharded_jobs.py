"""Jobs sharded other ways than plain DDP, and jobs on several nodes (gloo, this CPU): FSDP2's ``fully_shard`` with
its all-gathers, and two simulated nodes (two torchrun launchers, ``--nnodes 2``, a rendezvous on 127.0.0.1)
writing into one shared folder that ``gpuscope report`` merges."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SAMPLES, child_env, load_run, run_gpuscope, run_python

pytestmark = pytest.mark.slow
pytest.importorskip("torch.distributed")
SHARDED = str(Path(__file__).resolve().parent.parent / "fixtures" / "scripts" / "sharded.py")


def test_an_fsdp2_job_measures_each_ranks_all_gathers_and_their_waits(tmp_path: Path) -> None:
    job = tmp_path / "job"
    result = run_python(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "gpuscope",
                         "run", "-o", str(job), "--no-probes", SHARDED, "--mode", "fsdp2", "--steps", "20"],
                        tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    record = load_run(job)
    assert [r["rank"] for r in record["ranks"]] == [0, 1]
    comm = record["op_profile"]["communication"]
    # fully_shard gathers each block's parameters in forward and again in backward, and reduces the gradients
    assert {"all_gather"} <= {c["kind"] for c in comm["calls"]}
    assert comm["calls_per_step"] >= 8
    for rank in record["ranks"]:
        assert rank["steps"] >= 8
        assert 0 <= rank["waiting_s"] <= rank["comm_exposed_s"] <= rank["profiled_step_s"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_write_one_folder_that_report_merges(tmp_path: Path) -> None:
    # given: two launchers, one a node, meeting at a rendezvous on 127.0.0.1, each rank profiled into one folder
    shared = tmp_path / "shared"
    port = free_port()
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
         "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--rdzv-id", "two-nodes", "-m", "gpuscope", "run", "-o", str(shared), "--no-probes",
         str(SAMPLES / "ddp_training.py"), "--steps", "20"],
        cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in (0, 1)]
    outputs = [launcher.communicate(timeout=240)[0] for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0, 0], outputs
    # then: the folder holds both ranks, and gpuscope report merges them, each rank's host named
    result = run_gpuscope(["report", str(shared)], tmp_path)
    assert result.returncode == 0, result.stderr
    record = load_run(shared)
    assert [r["rank"] for r in record["ranks"]] == [0, 1] and record["missing_ranks"] == []
    assert all(r["host"] for r in record["ranks"]) and all(r["steps"] >= 8 for r in record["ranks"])
    assert all(r["waiting_s"] is not None for r in record["ranks"])  # their collectives matched across nodes
