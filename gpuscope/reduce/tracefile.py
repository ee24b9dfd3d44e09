"""A run's record built from a torch.profiler trace alone (``gpuscope analyze``), with no run to measure.

What a trace can give, and how:
- steps: the training thread's ``ProfilerStep#N`` ranges (host), and on the device the time from each step's first
  launched kernel to the next one's (``reduce.windows``);
- the breakdown of each step on the host, by the ranges it holds: data wait in DataLoader ``__next__`` ranges,
  forward / backward / optimizer where annotated (``DistributedDataParallel.forward``, ``## forward ##``,
  ``Optimizer.step#...``), the rest "other"; where ranges overlap the first of data wait, optimizer, backward,
  forward takes the time;
- the kernel timeline of every device, communication, and the op table (``reduce.figures``,
  ``reduce.optable``); the devices from ``deviceProperties``, the rank from ``distributedInfo``.
What it cannot give (so the rules that need it say "not checked", with the reason in ``collectors``): the loader's
settings, the framework's flags and the model's layers, this machine's per-op cost, NVML samples, FLOPs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuscope.reduce.figures import TraceFigures, trace_figures
from gpuscope.reduce.phases import step_phases
from gpuscope.reduce.optable import OpTable, indexed_table, op_table, window_events
from gpuscope.reduce.fields import op_profile
from gpuscope.reduce.stream import Progress
from gpuscope.reduce.trace import StepSpan, TraceIndex, index_file, index_trace, recorded_steps
from gpuscope.record import (
    PHASES,
    Breakdown,
    CollectorStatus,
    Distributed,
    OpProfile,
    RunMeta,
    RunRecord,
    StepSample,
    Steps,
    TraceDevice,
    TraceSource,
    Window,
)

TOP_OPS = 15
NOT_IN_A_TRACE = {
    "calibration": "a trace holds no per-op cost measured on this machine (gpuscope run measures it)",
    "practices": "a trace shows neither the framework's settings nor the model's layers",
    "syncs": "syncs are counted under torch's sync debug mode during a run",
    "data-probe": "a trace holds no dataset to probe",
    "loader-probe": "a trace holds no DataLoader to probe",
    "nvml": "a trace holds no NVML samples",
    "flops": "a trace holds no FLOP count",
    "memory": "a trace holds no memory samples",
    "cprofile": "a trace holds no Python profile",
}
"""The collectors of ``gpuscope run`` whose data a trace lacks, and why: the rules that need them say so."""


def record_from_trace(trace: Mapping[str, Any], name: str, size_bytes: int) -> RunRecord:
    """The record (measurements only, no verdict yet) of a parsed trace named ``name`` of ``size_bytes``, whole in
    memory (``record_from_file`` reads a file as a stream to the same record)."""
    events = trace["traceEvents"]
    index = index_trace(events)
    figures = trace_figures(events, index)
    table = op_table(window_events(events, *_window(figures.steps)))
    return _record(index, figures, table, trace, name, size_bytes)


def record_from_file(path: Path, name: str, size_bytes: int, progress: Progress | None = None) -> RunRecord:
    """The record of the trace file at ``path``, read as a stream (``reduce.stream``): only the index is kept, never
    the events (``progress``: told how far the reading is)."""
    index, header = index_file(path, progress)
    table = indexed_table(index.host, index.device, index.names, *_window(recorded_steps(index)))
    return _record(index, trace_figures((), index), table, header, name, size_bytes)


def _window(spans: Sequence[StepSpan]) -> tuple[float, float]:
    """The op table's window: the recorded steps (the whole trace without any)."""
    return (spans[0].start_us, spans[-1].end_us) if spans else (float("-inf"), float("inf"))


def _record(index: TraceIndex, figures: TraceFigures, table: OpTable, header: Mapping[str, Any], name: str,
            size_bytes: int) -> RunRecord:
    from gpuscope import __version__

    spans = list(figures.steps)
    steps, breakdown = trace_steps(index, figures), Breakdown()
    if spans:
        breakdown = _median_breakdown(steps.sample)
    return RunRecord(
        gpuscope_version=__version__,
        command=(name,),
        device="cuda" if figures.devices else "cpu",
        steps=steps,
        breakdown=breakdown,
        collectors={"steps": CollectorStatus("ok", f"ProfilerStep ranges of {name}"),
                    "torch-trace": CollectorStatus("ok", f"read from {name}"),
                    **{c: CollectorStatus("unavailable", why) for c, why in NOT_IN_A_TRACE.items()}},
        op_profile=_op_profile(table, figures, size_bytes),
        meta=RunMeta(duration_s=(spans[-1].end_us - spans[0].start_us) / 1e6 if spans else 0.0,
                     notes=(f"built from the torch.profiler trace {name} alone: no run was measured", *figures.notes)),
        distributed=_distributed(header.get("distributedInfo"), header.get("host_name")),
        source=TraceSource(files=(name,), trace_bytes=size_bytes, devices=_devices(header.get("deviceProperties"))),
    )


def trace_steps(index: TraceIndex, figures: TraceFigures) -> Steps:
    """The recorded steps as steady-state steps: each one's host wall time and phases, and its device time."""
    spans = list(figures.steps)
    if not spans:
        return Steps()
    walls = [(s.end_us - s.start_us) / 1e6 for s in spans]
    phases = [step_phases(index, s) for s in spans]
    device = _device_steps(figures, len(spans))
    ordered = sorted(walls)
    sample = StepSample(
        index=tuple(s.number for s in spans), wall_s=tuple(walls),
        phases_s={p: tuple(ph[p] for ph in phases) for p in PHASES},
        status=("steady",) * len(spans), device_wall_s=tuple(device) if device else (),
    )
    return Steps(count=len(spans), median_s=statistics.median(walls), mean_s=statistics.fmean(walls),
                 p10_s=_quantile(ordered, 0.1), p90_s=_quantile(ordered, 0.9), min_s=ordered[0], max_s=ordered[-1],
                 total=len(spans), source="profiler",
                 device_median_s=statistics.median(device) if device else None, sample=sample)


def _median_breakdown(sample: StepSample) -> Breakdown:
    """Shares of the summed step time per phase (summing, as the steps' total time, keeps the shares adding to 1)."""
    total = sum(sample.wall_s)
    if total <= 0:
        return Breakdown()
    shares = {p: sum(sample.phases_s.get(p, ())) / total for p in PHASES}
    shares["other"] = max(0.0, 1.0 - sum(shares[p] for p in PHASES if p != "other"))
    return Breakdown(**shares)


def _device_steps(figures: TraceFigures, count: int) -> list[float]:
    """Each step's time on the main device: from its first launched kernel's start to the next step's (the last
    one: to the end of the window); empty when some step launched nothing there."""
    if figures.kernels is None:
        return []
    window = next((w for w in figures.windows if w.device == figures.kernels.device), None)
    if window is None or len(window.step_starts_us) != count:
        return []
    bounds = [*window.step_starts_us, window.end_us]
    return [(b - a) / 1e6 for a, b in zip(bounds, bounds[1:])]


def _op_profile(table: OpTable, figures: TraceFigures, size_bytes: int) -> OpProfile:
    spans = figures.steps
    steps = Window(spans[0].number if spans else None, spans[-1].number if spans else None)
    return op_profile(table, steps, len(spans), figures, cuda=True, trace_bytes=size_bytes)


def _distributed(info: Any, host: Any = None) -> Distributed | None:
    """The rank, from ``distributedInfo``; its host from the trace's ``host_name`` (ranks of one host share a
    clock)."""
    if not isinstance(info, dict) or not isinstance(info.get("rank"), int):
        return None
    world = info.get("world_size")
    backend = info.get("backend")
    return Distributed(rank=info["rank"], world_size=world if isinstance(world, int) and world > 0 else 1,
                       backend=backend if isinstance(backend, str) else None,
                       host=host if isinstance(host, str) else "")


def _devices(properties: Any) -> tuple[TraceDevice, ...]:
    if not isinstance(properties, list):
        return ()
    devices = []
    for p in properties:
        if not isinstance(p, dict):
            continue
        major, minor = p.get("computeMajor"), p.get("computeMinor")
        devices.append(TraceDevice(
            index=p["id"] if isinstance(p.get("id"), int) else len(devices), name=str(p.get("name", "")),
            memory_total_bytes=p["totalGlobalMem"] if isinstance(p.get("totalGlobalMem"), int) else 0,
            compute_capability=f"{major}.{minor}" if isinstance(major, int) and isinstance(minor, int) else None,
            multiprocessors=p["numSms"] if isinstance(p.get("numSms"), int) else 0))
    return tuple(devices)


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks of sorted values."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
