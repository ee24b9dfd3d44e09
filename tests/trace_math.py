"""The independent method the GPU trace tests compute their expected figures with: a few lines over a trace's raw
events, sharing no code with gpuscope. The busy share of a device is the union of its kernel intervals, clipped to
the device window, over the window's length. The window of the recorded steps on a device: the kernels are grouped by
the host step (``ProfilerStep#N`` range of the launching process) during which their launch call ran (runtime event
with the same ``args.correlation``); the window runs from the first kernel start of the earliest such step to the
last kernel end of the latest one."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

Events = list[dict[str, Any]]


def load(path: Path) -> Events:
    return json.loads(gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace"))["traceEvents"]


def union(spans: list[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def clipped(spans: list[list[float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in spans)


def kernels(events: Events, device: int) -> Events:
    return [e for e in events if e.get("cat") == "kernel" and e["args"].get("device", e["pid"]) == device]


def window(events: Events, device: int) -> tuple[float, float]:
    launch = {e["args"]["correlation"]: (e["ts"], e["pid"]) for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    steps = [(e["ts"], e["ts"] + e["dur"], e["pid"]) for e in events
             if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    by_step: dict[float, list[dict]] = {}
    for k in kernels(events, device):
        if k["args"]["correlation"] not in launch:
            continue  # launched before the recording began: in no recorded step
        ts, pid = launch[k["args"]["correlation"]]
        for start, end, step_pid in steps:
            if step_pid == pid and start <= ts <= end:
                by_step.setdefault(start, []).append(k)
    first, last = by_step[min(by_step)], by_step[max(by_step)]
    return min(k["ts"] for k in first), max(k["ts"] + k["dur"] for k in last)


def busy(events: Events, device: int, names: Any = lambda name: True) -> float:
    lo, hi = window(events, device)
    spans = union([(k["ts"], k["ts"] + k["dur"]) for k in kernels(events, device) if names(k["name"])])
    return clipped(spans, lo, hi) / (hi - lo)


