"""Records for the report's tests: a full CUDA run (every optional part present), a bare CPU run (every optional
part None), a hostile one, one of 100k steps, and the recorded runs of the sample workloads."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from conftest import make_record

from gpuscope.diagnose.ranks import job_verdict
from gpuscope.record import (
    Breakdown,
    CallSite,
    CollectorStatus,
    CudaMemory,
    DataProbe,
    FunctionStat,
    GpuDevice,
    GpuSamples,
    HostMemory,
    KeptTensors,
    KernelTimeline,
    LineCost,
    Loader,
    Memory,
    MemoryFix,
    MemoryGrowth,
    MemoryHolder,
    MemoryTimeline,
    OpProfile,
    OpStat,
    OutOfMemory,
    Practices,
    PythonProfile,
    RankSummary,
    Recommendation,
    RuleCheck,
    RunMeta,
    RunRecord,
    StepSample,
    Steps,
    Straggler,
    SyncProfile,
    Verdict,
    Window,
)

RECORDS = Path(__file__).resolve().parent / "records"
SAMPLE_RECORDS = sorted(p.stem for p in RECORDS.glob("*.json"))
"""Recorded runs of the sample workloads (``gpuscope run sample_workloads/NAME.py``), by workload name."""
LEAK_RECORD = Path(__file__).resolve().parent / "memory" / "leak_feats.json"
"""The memory section of a recorded CPU run that keeps each step's activations in a list (``feats.append(h)`` in
``leak_feats.py``, an MLP under Adam, 80 steps), before the analysis filled in its growth and fixes."""


def sample_record(name: str) -> RunRecord:
    """The recorded run of a sample workload."""
    return RunRecord.from_json(json.loads((RECORDS / f"{name}.json").read_text()))


def fixed_data_loading_record() -> RunRecord:
    """The recorded data-loading-bound run as it would look with its fix applied: each step waits a tenth as long
    for data, ``more-dataloader-workers`` is clear, and the verdict is CPU-compute-bound (the "after" of a
    before/after comparison with ``sample_record("data_loading_bound")``)."""
    before = sample_record("data_loading_bound")
    sample = before.steps.sample
    waits = sample.phases_s["data_wait"]
    wall_s = tuple(t - 0.9 * w for t, w in zip(sample.wall_s, waits))
    phases_s = {**sample.phases_s, "data_wait": tuple(0.1 * w for w in waits)}
    steady = sorted(t for t, s in zip(wall_s, sample.status) if s == "steady")
    median_s = steady[len(steady) // 2]
    scale = before.steps.median_s / median_s
    others = {name: share * scale for name, share in before.breakdown.as_dict().items() if name != "data_wait"}
    steps = dataclasses.replace(before.steps, median_s=median_s, min_s=steady[0], max_s=steady[-1],
                                sample=dataclasses.replace(sample, wall_s=wall_s, phases_s=phases_s))
    return dataclasses.replace(
        before, steps=steps, breakdown=Breakdown(data_wait=1 - sum(others.values()), **others),
        command=(*before.command, "--workers", "2"), recommendations=(),
        checks={**before.checks, "more-dataloader-workers": RuleCheck("clear")},
        verdict=Verdict(bound="compute", confidence=0.8, evidence=("the steps compute most of the time",)))


def leak_record() -> RunRecord:
    """The recorded leaking run's memory section in a record of its own."""
    return RunRecord.from_json(json.loads(LEAK_RECORD.read_text()))


GIB = 2**30


def full_memory() -> Memory:
    """A CUDA run's memory section with every part filled in: a peak in backward, a repeated block, a leak that
    grows step over step, fixes, and headroom under the GPU's memory."""
    n = 50
    return Memory(
        device="cuda", steps=(20, 21), peak_bytes=40 * GIB, parameters_bytes=6 * GIB, gradients_bytes=6 * GIB,
        optimizer_state_bytes=12 * GIB, activations_bytes=12 * GIB, inputs_bytes=GIB, temporaries_bytes=2 * GIB,
        unknown_bytes=GIB, peak_phase="backward", activations_max_bytes=16 * GIB,
        holders=(MemoryHolder("Block_3", "model.py:41 in forward", 2 * GIB, 12),
                 MemoryHolder("Block_2", "model.py:41 in forward", 2 * GIB, 12),
                 MemoryHolder("Embedding_0", "model.py:30 in forward", GIB // 2, 1)),
        repeated_blocks="Block", repeated_block_count=6, repeated_block_bytes=12 * GIB,
        repeated_block_max_bytes=2 * GIB, repeated_block_inputs_bytes=GIB // 4, batch_size=32,
        reserved_bytes=44 * GIB, limit_bytes=80 * GIB, limit_source="the GPU's memory", headroom_bytes=36 * GIB,
        largest_batch=64,
        timeline=MemoryTimeline(t_ms=tuple(2.0 * i for i in range(n)),
                                parameters=(6 * GIB,) * n, gradients=tuple(6 * GIB * (i > 20) for i in range(n)),
                                optimizer_state=(12 * GIB,) * n,
                                activations=tuple(GIB * min(i, 50 - i) // 2 for i in range(n)),
                                inputs=(GIB,) * n, temporaries=(0,) * n, unknown=(0,) * n),
        kept=(KeptTensors("train.py:77 in main", ("train.py:120 in <module>",), 100 * 2**20, 1, "activations",
                          "the list `history` (12 items)"),),
        kept_bytes_per_step=100 * 2**20,
        growth=MemoryGrowth(source="cuda", per_step_bytes=100 * 2**20, from_step=10, to_step=60,
                            grew_bytes=5000 * 2**20, leak=True, kept_per_step_bytes=100 * 2**20),
        fixes=(MemoryFix("activation-checkpointing", "Checkpoint each Block", 10 * GIB, 0.25,
                         "6 blocks hold 12 GiB of activations; checkpointed, they keep their inputs and one block's"),
               MemoryFix("smaller-optimizer-state", "Keep Adam's state in bfloat16", 6 * GIB, 0.15,
                         "12 GiB of float32 state at half the size")),
        notes=("measured on steps 20-21",))


def step_sample(n: int) -> StepSample:
    """``n`` steps: two warm-up, a profiled stretch, one outlier, the rest steady, with a little variation."""
    status = ["warmup" if i < 2 else "profiled" if i < 6 else "outlier" if i == n // 2 else "steady" for i in range(n)]
    scale = [4.0 if s == "warmup" else 3.0 if s == "outlier" else 1.0 + 0.05 * (i % 7) for i, s in enumerate(status)]
    phases = {"data_wait": 0.010, "forward": 0.030, "backward": 0.040, "optimizer": 0.010, "other": 0.010}
    phases_s = {name: tuple(share * k for k in scale) for name, share in phases.items()}
    return StepSample(index=tuple(range(n)), wall_s=tuple(0.1 * k for k in scale), phases_s=phases_s,
                      status=tuple(status), device_wall_s=tuple(0.09 * k for k in scale))


def _functions(prefix: str) -> tuple[FunctionStat, ...]:
    return tuple(FunctionStat(function=f"{prefix}_{i}", file="train.py", line=10 + i, calls=100 * (i + 1),
                              own_s=0.5 / (i + 1), cumulative_s=1.0 / (i + 1)) for i in range(5))


def gpu_record() -> RunRecord:
    """A CUDA run with every part of the record filled in."""
    n = 64
    t = tuple(0.1 * i for i in range(n))
    devices = tuple(GpuDevice(
        index=i, name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 * 2**30, t_s=t,
        sm_util=tuple(0.4 + 0.5 * ((j + i) % 5) / 4 for j in range(n)), memory_util=tuple(0.3 for _ in t),
        memory_used_bytes=tuple((10 + j % 3) * 2**30 for j in range(n)),
        power_w=tuple(None if j == 3 else 300.0 + j for j in range(n)), sm_clock_mhz=tuple(1980 for _ in t),
        temperature_c=tuple(60 for _ in t), throttle_reasons=("sw_power_cap",) if i else ()) for i in range(2))
    ops = tuple(OpStat(name=name, calls=calls, self_host_s=host, device_s=dev) for name, calls, host, dev in (
        ("aten::mm", 120, 0.012, 0.210), ("aten::add_", 900, 0.020, 0.015), ("aten::convolution", 60, 0.008, 0.090)))
    return make_record(
        command=("train.py", "--epochs", "1", "--token=abc123", "--api-key", "sk-secret", "--lr", "0.1"),
        device="cuda",
        steps=Steps(count=56, median_s=0.1, mean_s=0.102, p10_s=0.095, p90_s=0.11, min_s=0.09, max_s=0.3,
                    total=64, warmup=2, outliers=1, profiled=4, source="optimizer", breakdown_basis="device",
                    device_median_s=0.09, sample=step_sample(n)),
        verdict=Verdict(bound="compute", confidence=0.82,
                        evidence=("the GPU is busy 91% of the profiled steps", "data wait is 4% of each step")),
        recommendations=(
            Recommendation(id="mixed-precision", title="Use mixed precision", why="93% of GEMM time is float32",
                           fix="with torch.autocast(\"cuda\", dtype=torch.bfloat16):\n    loss = model(x)",
                           expected_gain=0.35, evidence=("93% of GEMM time runs float32 on CUDA cores",)),
            Recommendation(id="zero-grad-set-to-none", title="Drop gradients instead of zero-filling them",
                           why="20 of 20 zero_grad calls zero-filled the gradients",
                           fix="train.py:92 `optimizer.zero_grad(set_to_none=False)`: optimizer.zero_grad(set_to_none=True)",
                           expected_gain=0.02),
            Recommendation(id="disable-debug-apis", title="Turn off the debug APIs left on in training",
                           why="anomaly detection was on", expected_gain=None,
                           fix="train.py:88 `torch.autograd.set_detect_anomaly(True)`: remove anomaly detection from the "
                               "training loop (keep it for debugging)"),
        ),
        checks={"mixed-precision": RuleCheck("fired"), "zero-grad-set-to-none": RuleCheck("fired"),
                "disable-debug-apis": RuleCheck("fired"), "more-dataloader-workers": RuleCheck("clear"),
                "channels-last": RuleCheck("not-checked", "no convolution layer was inspected")},
        collectors={name: CollectorStatus("ok") for name in
                    ("steps", "cprofile", "torch-trace", "memory", "memory-window", "nvml", "cuda-memory", "syncs",
                     "practices", "data-probe", "nvtx", "calibration")},
        loaders=(Loader(dataset="ImageFolder", num_workers=4, batch_size=64, pin_memory=True, persistent_workers=True,
                        prefetch_factor=2, start_method="fork", batches=64, wait_s=0.25,
                        batch_tensors=("float16[64, 3, 224, 224] cpu", "int64[64] cpu")),),
        python_profile=PythonProfile(window=Window(0, 3, True), total_s=2.5, startup_s=1.2,
                                     top_own=_functions("own"), top_cumulative=_functions("cum"),
                                     workers_profiled=True, workers_note="4 forked workers profiled",
                                     workers_top_own=_functions("worker")),
        op_profile=OpProfile(window=Window(5, 7), steps=3, trace_bytes=1_000_000, ops=3000, ops_per_step=1000,
                             mean_op_s=2e-5, calls_by_kind={"elementwise": 2000, "matmul": 600, "other": 400},
                             top_host=ops, top_device=ops,
                             kernels=KernelTimeline(busy_fraction=0.91, idle_host_wait_fraction=0.04,
                                                    idle_kernel_wait_fraction=0.03, idle_other_fraction=0.02,
                                                    kernels=2400, kernels_per_step=800, mean_kernel_s=1.1e-4,
                                                    tensor_core_share=0.07, h2d_copies=6, h2d_pageable_copies=0,
                                                    h2d_copy_s=0.002, fp32_gemm_share=0.6, sync_calls=3,
                                                    sync_wait_s=0.004)),
        host_memory=HostMemory(interval_s=0.1, peak_bytes=3 * 2**30, peak_process_bytes=2 * 2**30,
                               peak_workers_bytes=2**30, max_workers=4, t_s=t,
                               process_bytes=tuple((1 + j / n) * 2**30 for j in range(n)),
                               workers_bytes=tuple(2**28 for _ in t)),
        gpus=GpuSamples(interval_s=0.1, driver="550.54.15", devices=devices),
        cuda_memory=CudaMemory(peak_allocated_bytes=9 * 2**30, peak_reserved_bytes=10 * 2**30, step=tuple(range(n)),
                               allocated_bytes=tuple(8 * 2**30 for _ in t), reserved_bytes=tuple(10 * 2**30 for _ in t),
                               peak_bytes=tuple(9 * 2**30 for _ in t)),
        practices=Practices(torch_version="2.13.0", steps_checked=64, anomaly_steps=60, zero_grad_calls=64,
                            zero_grad_fill_calls=64, modules_inspected=True, conv_layers=4,
                            anomaly_sites=(CallSite("train.py", 88, "main", "torch.autograd.set_detect_anomaly(True)", 1),),
                            cudnn_benchmark=False, matmul_allow_tf32=False, cudnn_allow_tf32=True,
                            float32_matmul_precision="highest", cuda_capability="9.0"),
        data_probe=DataProbe(dataset="ImageFolder", items=3, item_s=0.02, float16_s=0.012,
                             lines=(LineCost("data.py", 40, "__getitem__", "img = img.astype(np.float16) / 255", 0.012,
                                             True), LineCost("data.py", 41, "__getitem__", "img = blur(img)", 0.006)),
                             numpy_float16_slowdown=12.5, note="times measured under a line tracer"),
        syncs=SyncProfile(window=Window(9, 11), steps=3, syncs=6, per_step=2.0,
                          sites=(CallSite("train.py", 95, "main", "loss.item()", 3),)),
        memory=full_memory(),
        meta=RunMeta(started_at="2026-01-02T03:04:05+00:00", duration_s=12.5, python="3.11.7", torch="2.13.0",
                     cpu_count=16, platform="Linux-x86_64", notes=("forward timed on root modules: Net",)),
    )


def cpu_bare_record() -> RunRecord:
    """A CPU run whose optional parts are all missing, as an older or a crashed run leaves them."""
    return make_record(
        exit_status=1,
        collectors={"nvml": CollectorStatus("unavailable", "no NVIDIA driver"),
                    "cprofile": CollectorStatus("failed", "RuntimeError: another profiler is active")},
        meta=RunMeta(started_at="2026-01-02T03:04:05+00:00", python="3.11.7"),
    )


HOSTILE = "<script>alert(1)</script>"


def hostile_record() -> RunRecord:
    """Markup, quotes and script ends in every place the user's code can put text."""
    record = gpu_record()
    evil = f"x\"'</script><script>window.__pwned=1</script>{HOSTILE}"
    functions = tuple(dataclasses.replace(f, function=evil, file=f"{HOSTILE}.py") for f in record.python_profile.top_own)
    ops = tuple(dataclasses.replace(op, name=evil) for op in record.op_profile.top_host)
    return dataclasses.replace(
        record,
        command=(f"{HOSTILE}.py", "--name", evil, f"--note='{HOSTILE}'"),
        verdict=dataclasses.replace(record.verdict, evidence=(evil,)),
        recommendations=tuple(dataclasses.replace(r, title=evil, fix=f"{evil}\n{HOSTILE}") for r in record.recommendations),
        python_profile=dataclasses.replace(record.python_profile, top_own=functions, top_cumulative=functions),
        op_profile=dataclasses.replace(record.op_profile, top_host=ops, top_device=ops),
        loaders=(dataclasses.replace(record.loaders[0], dataset=evil),),
        memory=dataclasses.replace(
            record.memory, holders=(MemoryHolder(evil, f"{HOSTILE}.py:1 in {evil}", 2**20, 1),),
            kept=(KeptTensors(f"{HOSTILE}.py:2 in f", (evil,), 2**20, 1, evil, evil),), repeated_blocks=evil,
            fixes=(MemoryFix(evil, evil, 2**20, 0.1, evil),),
            out_of_memory=OutOfMemory(error=f"RuntimeError: {evil}")),
    )


def long_record(steps: int = 100_000) -> RunRecord:
    """A run of ``steps`` steps whose sample keeps every one (more than the record's own bound keeps)."""
    record = gpu_record()
    return dataclasses.replace(record, steps=dataclasses.replace(record.steps, total=steps, count=steps - 10,
                                                                 sampled=True, sample=step_sample(steps)))


JOB_STRAGGLER = 617
"""The late rank of ``job_record``'s job."""


def job_record(world: int = 1024, base: str = "compute_bound") -> RunRecord:
    """A data-parallel job of ``world`` ranks, as merged from the recorded run of sample workload ``base``: every
    rank that run with small deterministic variations, eight ranks a host, every 100th rank without a figure of its
    wait on collectives, and rank ``JOB_STRAGGLER`` (the last rank in a smaller world) late by a slow data pipeline
    while the others wait for it in the all-reduce."""
    record = sample_record(base)
    step_s, shares = record.steps.median_s, record.breakdown
    late = JOB_STRAGGLER if world > JOB_STRAGGLER else world - 1
    late_s = 0.3 * step_s
    ranks = []
    for i in range(world):
        jitter = ((i * 37) % 11 - 5) / 250  # -2% .. +2%, the same for every run of the tests
        wait_s = 0.0 if i == late else late_s * (1 + jitter)
        breakdown = shares
        if i == late:  # the same step (the others wait for it), its data wait longer by late_s, the rest shorter
            data = shares.data_wait + late_s / step_s
            rest = (1 - data) / (1 - shares.data_wait)
            breakdown = Breakdown(**{name: data if name == "data_wait" else share * rest
                                     for name, share in shares.as_dict().items()})
        comm = i % 100 != 99
        ranks.append(RankSummary(rank=i, host=f"node-{i // 8:03d}", exit_status=0, steps=record.steps.count,
                                 median_s=step_s * (1 + jitter / 4),
                                 breakdown=breakdown, comm_s=1.2 * wait_s + 0.01 if comm else None,
                                 comm_exposed_s=wait_s if comm else None, bound=record.verdict.bound))
    straggler = Straggler(
        rank=late, late_s=late_s, late_share=late_s / step_s, cause="data_wait",
        evidence=(f"rank {late} is late by {late_s * 1e3:.1f} ms a step ({late_s / step_s:.0%} of the "
                  f"{step_s * 1e3:.1f} ms step)",
                  f"its data wait takes {(shares.data_wait * step_s + late_s) * 1e3:.1f} ms a step, "
                  f"{late_s * 1e3:.1f} ms more than on the other ranks"))
    return dataclasses.replace(record, ranks=tuple(ranks), straggler=straggler,
                               verdict=job_verdict(record.verdict, straggler))


PLOTLY_MARKER = "/* plotly.js inlined here */"


def normalise(html: str, plotly_js: str, version: str) -> str:
    """The page with its volatile parts fixed: the plotly.js blob becomes a marker, the renderer's version a name."""
    assert html.count(plotly_js) == 1, "plotly.js must be inlined exactly once"
    html = html.replace(plotly_js, PLOTLY_MARKER)
    return re.sub(rf"gpuscope {re.escape(version)}\b", "gpuscope RENDERER_VERSION", html)
