"""One lease of a GPU machine: every sample workload under plain ``python`` and under ``gpuscope run``.

What a CPU-only machine cannot show: the verdicts on a real GPU, the CUDA collectors (NVML sampling, CUDA kernels in
the trace, syncs), and what gpuscope costs a GPU loop. For each case it runs the script under plain python, then
under ``gpuscope run -o DIR``, and keeps each run's folder (run.json, report, trace), its stdout and stderr, and a
line of figures; everything lands in one tarball (``OUT/gpu-session.tar.gz``) so that trimmed recordings can be
copied into ``tests/fixtures/gpu/`` on the CPU machine.

    python benchmarks/gpu_session.py --out /tmp/gpu --deadline 480

Cases run in order and stop at the deadline (the lease is short); the summary says which ran.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_workloads"
LINE = re.compile(r"median_step_s=([0-9.]+)")

CASES: list[tuple[str, str, list[str], list[str]]] = [
    # name, sample, script arguments, gpuscope options
    ("launch", "cpu_launch_bound", ["--steps", "1000"], []),
    ("launch-notrace", "cpu_launch_bound", ["--steps", "1000"], ["--trace-steps", "0"]),
    ("data", "data_loading_bound", ["--steps", "60"], []),
    ("data-fixed", "data_loading_bound", ["--steps", "60", "--workers", "6", "--pin-memory"], []),
    ("compute", "compute_bound", ["--steps", "60"], []),
    ("compute-bf16", "compute_bound", ["--steps", "60", "--bf16"], []),
    ("habits", "compute_bound_habits", [], []),
    ("habits-fixed", "compute_bound_habits", ["--fixed"], []),
    ("fp16", "data_loading_bound_fp16", [], []),
    ("fp16-fixed", "data_loading_bound_fp16", ["--fp32"], []),
    ("ddp-1rank", "ddp_training", [], ["--nproc-per-node", "1"]),
    ("ddp-2ranks", "ddp_training", [], ["--nproc-per-node", "2"]),
    ("data-spawn", "data_loading_bound", ["--steps", "30", "--workers", "2", "--start-method", "spawn"], []),
]


def timed(command: list[str], log: Path, timeout: float) -> dict:
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        rc, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout, stderr = "timeout", str(exc.stdout or ""), str(exc.stderr or "")
    wall = time.perf_counter() - start
    Path(f"{log}.out").write_text(stdout)
    Path(f"{log}.err").write_text(stderr)
    match = LINE.search(stdout)
    return {"rc": rc, "wall_s": round(wall, 2), "median_step_s": float(match.group(1)) if match else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline", type=float, default=480, help="seconds for all the cases")
    parser.add_argument("--only", nargs="*", help="case names to run")
    args = parser.parse_args()
    work = args.out / "gpu-session"
    work.mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + args.deadline
    try:
        info = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"],
                              capture_output=True, text=True)
        (work / "nvidia-smi.txt").write_text(info.stdout + info.stderr)
    except FileNotFoundError:
        (work / "nvidia-smi.txt").write_text("no nvidia-smi on this machine\n")
    results = {}
    for name, sample, script_args, options in CASES:
        if args.only and name not in args.only:
            continue
        left = end - time.monotonic()
        if left < 30:
            results[name] = {"skipped": "deadline"}
            continue
        script = str(SAMPLES / f"{sample}.py")
        plain_cmd = [sys.executable, script, *script_args]
        if sample == "ddp_training":
            ranks = options[options.index("--nproc-per-node") + 1]
            plain_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", ranks,
                         script, *script_args]
        plain = timed(plain_cmd, work / f"{name}.plain", min(left, 120))
        run_dir = work / name
        profiled = timed([sys.executable, "-m", "gpuscope", "run", "-o", str(run_dir), "--trace-max-mb", "8", *options,
                          script,
                          *script_args], work / f"{name}.gpuscope", min(end - time.monotonic(), 180))
        record = run_dir / "run.json"
        verdict = None
        if record.is_file():
            data = json.loads(record.read_text())
            verdict = (data.get("verdict") or {}).get("bound")
        results[name] = {"plain": plain, "gpuscope": profiled, "verdict": verdict}
        print(name, json.dumps(results[name]), flush=True)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    pack(work, args.out)


def _small(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Traces go in their own tarballs; reports are re-rendered from run.json (``gpuscope report``)."""
    return None if "trace.json" in info.name or info.name.endswith(".html") else info


def pack(work: Path, out: Path, limit: int = 15 * 2**20) -> None:
    """Everything but the traces in one tarball; the traces in as few more as the transfer's 16 MiB a file allows."""
    traces = sorted(work.glob("*/trace.json*"))
    with tarfile.open(out / "gpu-session.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="gpu-session", filter=_small)
    part, size, tar = 0, 0, None
    for trace in traces:
        if tar is None or size > limit * 0.8:
            if tar is not None:
                tar.close()
            part += 1
            tar = tarfile.open(out / f"gpu-traces-{part}.tar.gz", "w:gz")
        tar.add(trace, arcname=f"gpu-session/{trace.relative_to(work)}")
        tar.fileobj.flush()
        size = (out / f"gpu-traces-{part}.tar.gz").stat().st_size
    if tar is not None:
        tar.close()
    for made in sorted(out.glob("*.tar.gz")):
        print("tarball", made.name, made.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
