"""Plotly figures of the report, as plain dicts built from the record (no HTML here).

Each figure is ``{"data": [...], "layout": {...}}``; the page passes it to ``Plotly.newPlot`` as it is. Series are
thinned to at most ``MAX_POINTS`` points and numbers are rounded to a few significant digits, so a run of any length
gives a page of bounded size; rounding happens here, at display time, never in the record.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from gpuscope.diagnose.clock import step_times
from gpuscope.record import PHASES, Breakdown, GpuDevice, RankSummary, RunRecord

Figure = dict[str, Any]

MAX_POINTS = 2000
"""Most bars or points one series draws; longer series are thinned evenly (the record's own sample is 2000)."""

PHASE_COLORS = {
    "data_wait": "#e4572e",
    "forward": "#4c78a8",
    "backward": "#72b7b2",
    "optimizer": "#54a24b",
    "other": "#b8b0a8",
}
GPU_STEP_COLOR = "#222222"
"""The line of each step's time on the GPU's timeline, over the host's phase bars."""
PHASE_NAMES = {"data_wait": "data wait", "forward": "forward", "backward": "backward", "optimizer": "optimizer",
               "other": "other"}
LEFT_OUT_OPACITY = 0.35
"""Bars of steps left out of the figures (warm-up, profiled, outlier, eval, other-loop) are drawn faded."""
CLIP_RATIO = 3.0
"""When a left-out step is this many times longer than the longest steady one, the y axis is cut to show the
steady steps; hovering still gives every bar's value."""
MIB = 2**20
GIB = 2**30


def _r(value: float | None) -> float | None:
    """``value`` rounded to 4 significant digits (None for missing or non-finite values)."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.4g}")


def _thin(n: int) -> range:
    """Indices of an even selection of at most ``MAX_POINTS`` of ``n`` items."""
    return range(0, n, max(1, math.ceil(n / MAX_POINTS)))


def _pick(series: Sequence[Any], keep: range, scale: float = 1.0) -> list[float | None]:
    return [_r(series[i] * scale) if series[i] is not None else None for i in keep if i < len(series)]


def _layout(height: int = 300, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 40, "b": 45},
        "font": {"family": "-apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif", "size": 12,
                 "color": "#333"},
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "traceorder": "normal"},
        "hovermode": "closest",
    }
    layout.update(extra)
    return layout


def _axis(title: str, **extra: Any) -> dict[str, Any]:
    return {"title": {"text": title}, "gridcolor": "#eee", "zerolinecolor": "#ccc", **extra}


def step_bars(record: RunRecord) -> Figure | None:
    """Per-step stacked bars of the host's phases (ms), left-out steps faded, and where the steps are read on the
    GPU's timeline, each step's time there as a line over them; None without a step sample."""
    sample = record.steps.sample
    if not sample.index or not sample.phases_s:
        return None
    keep = _thin(len(sample.index))
    x = [sample.index[i] for i in keep]
    status = [sample.status[i] if i < len(sample.status) else "steady" for i in keep]
    opacity = [1.0 if s == "steady" else LEFT_OUT_OPACITY for s in status]
    data = []
    for phase in PHASES:
        values = sample.phases_s.get(phase)
        if values is None:
            continue
        data.append({
            "type": "bar", "name": PHASE_NAMES[phase], "x": x, "y": _pick(values, keep, 1e3),
            "customdata": status, "marker": {"color": PHASE_COLORS[phase], "opacity": opacity},
            "hovertemplate": f"step %{{x}} (%{{customdata}})<br>{PHASE_NAMES[phase]}: %{{y:.2f}} ms<extra></extra>",
        })
    if record.steps.clock == "device" and any(d is not None for d in sample.device_wall_s):
        device = [sample.device_wall_s[i] if i < len(sample.device_wall_s) else None for i in keep]
        data.append({
            "type": "scatter", "mode": "lines+markers", "name": "step on the GPU's timeline", "x": x,
            "y": [_r(d * 1e3) if d is not None else None for d in device], "customdata": status,
            "line": {"color": GPU_STEP_COLOR, "width": 1.5}, "marker": {"size": 4, "color": GPU_STEP_COLOR},
            "hovertemplate": "step %{x} (%{customdata})<br>on the GPU: %{y:.2f} ms<extra></extra>",
        })
    yaxis = _axis("ms per step", rangemode="tozero")
    annotations = []
    times = step_times(record.steps)
    steady = [max(sample.wall_s[i], times[i]) for i in range(len(sample.wall_s)) if i < len(sample.status)
              and sample.status[i] == "steady"]
    if steady and sample.wall_s and max(max(sample.wall_s), max(times)) > CLIP_RATIO * max(steady):
        yaxis["range"] = [0, _r(max(steady) * 1.4e3)]
        annotations.append({"text": "longer left-out steps are cut off at the top: hover for their values",
                            "xref": "paper", "yref": "paper", "x": 1, "y": 1.0, "yanchor": "bottom",
                            "xanchor": "right", "showarrow": False, "font": {"size": 11, "color": "#59636e"}})
    layout = _layout(340, barmode="stack", bargap=0.1 if len(x) < 200 else 0, xaxis=_axis("step"), yaxis=yaxis,
                     annotations=annotations)
    return {"data": data, "layout": layout}


def breakdown_bar(record: RunRecord) -> Figure | None:
    """The median step split into phases, as one horizontal stacked bar per basis; None before any steady step."""
    rows: list[tuple[str, Breakdown]] = []
    if record.steps.count:
        main = "GPU timeline" if record.steps.breakdown_basis == "device" else "host timers"
        rows.append((main, record.breakdown))
        if record.host_breakdown is not None and record.steps.breakdown_basis == "device":
            rows.append(("host timers", record.host_breakdown))
    if not rows:
        return None
    data = []
    for phase in PHASES:
        shares = [getattr(b, phase) for _, b in rows]
        data.append({
            "type": "bar", "orientation": "h", "name": PHASE_NAMES[phase], "y": [name for name, _ in rows],
            "x": [_r(s * 100) for s in shares], "marker": {"color": PHASE_COLORS[phase]},
            "text": [f"{s:.0%}" if s >= 0.04 else "" for s in shares], "textposition": "inside",
            "hovertemplate": f"{PHASE_NAMES[phase]}: %{{x:.1f}}%<extra></extra>",
        })
    layout = _layout(110 + 40 * len(rows), barmode="stack", xaxis=_axis("% of the median step", range=[0, 100]),
                     yaxis={"automargin": True}, margin={"l": 90, "r": 20, "t": 40, "b": 40})
    return {"data": data, "layout": layout}


GPU_METRICS: tuple[tuple[str, str, str, float], ...] = (
    ("util", "sm_util", "GPU utilisation (%)", 100.0),
    ("memory", "memory_used_bytes", "memory used (GiB)", 1 / GIB),
    ("power", "power_w", "power (W)", 1.0),
    ("clock", "sm_clock_mhz", "SM clock (MHz)", 1.0),
)
"""(chart key, GpuDevice series, axis title, scale) of each NVML timeline."""


def gpu_timelines(record: RunRecord) -> dict[str, Figure]:
    """NVML timelines (utilisation, memory, power, clock), one line per GPU; empty without NVML samples."""
    devices: tuple[GpuDevice, ...] = record.gpus.devices if record.gpus is not None else ()
    figures: dict[str, Figure] = {}
    for key, attr, title, scale in GPU_METRICS:
        data = []
        for device in devices:
            series = getattr(device, attr)
            if not device.t_s or not any(v is not None for v in series):
                continue
            keep = _thin(len(device.t_s))
            data.append({"type": "scatter", "mode": "lines", "name": f"GPU {device.index}",
                         "x": _pick(device.t_s, keep), "y": _pick(series, keep, scale),
                         "hovertemplate": "%{x:.1f} s: %{y}<extra>GPU " + str(device.index) + "</extra>"})
        if data:
            yaxis = _axis(title, rangemode="tozero")
            if key == "util":
                yaxis["range"] = [0, 105]
            figures[f"gpu-{key}"] = {"data": data, "layout": _layout(240, showlegend=len(data) > 1,
                                                                   xaxis=_axis("seconds into the run"),
                                                                   yaxis=yaxis)}
    return figures


IDLE_PARTS = (
    ("busy_fraction", "busy", "#4c78a8"),
    ("idle_host_wait_fraction", "idle: waiting for the host", "#e4572e"),
    ("idle_kernel_wait_fraction", "idle: between queued kernels", "#f2a541"),
    ("idle_other_fraction", "idle: other (syncs, copies)", "#b8b0a8"),
)


def kernel_split(record: RunRecord) -> Figure | None:
    """The GPU's time over the profiled steps: busy, and idle split by cause; None without a kernel timeline."""
    kernels = record.op_profile.kernels if record.op_profile is not None else None
    if kernels is None:
        return None
    data = [{"type": "bar", "orientation": "h", "name": name, "y": ["GPU"], "x": [_r(getattr(kernels, attr) * 100)],
             "marker": {"color": color}, "text": [f"{getattr(kernels, attr):.0%}"], "textposition": "inside",
             "hovertemplate": f"{name}: %{{x:.1f}}%<extra></extra>"} for attr, name, color in IDLE_PARTS]
    layout = _layout(150, barmode="stack", xaxis=_axis("% of the profiled steps' wall time", range=[0, 100]),
                     yaxis={"automargin": True})
    return {"data": data, "layout": layout}


def top_ops(record: RunRecord) -> Figure | None:
    """Top torch ops by host self time, with their device time beside; None without an op profile."""
    profile = record.op_profile
    if profile is None or not profile.top_host:
        return None
    ops = list(profile.top_host[:12])[::-1]  # plotly draws horizontal bars bottom-up
    names = [op.name for op in ops]
    data = [{"type": "bar", "orientation": "h", "name": "host (self)", "y": names,
             "x": [_r(op.self_host_s * 1e3) for op in ops], "marker": {"color": "#4c78a8"},
             "hovertemplate": "%{y}: %{x:.2f} ms host<extra></extra>"}]
    if any(op.device_s for op in ops):
        data.append({"type": "bar", "orientation": "h", "name": "device", "y": names,
                     "x": [_r(op.device_s * 1e3) for op in ops], "marker": {"color": "#54a24b"},
                     "hovertemplate": "%{y}: %{x:.2f} ms device<extra></extra>"})
    layout = _layout(90 + 24 * len(ops), barmode="group", xaxis=_axis("ms over the profiled steps"),
                     yaxis={"automargin": True, "tickfont": {"family": "ui-monospace, Menlo, Consolas, monospace"}},
                     margin={"l": 10, "r": 20, "t": 40, "b": 45})
    return {"data": data, "layout": layout}


def host_memory(record: RunRecord) -> Figure | None:
    """Resident memory over time, the process and its DataLoader workers stacked; None without samples."""
    memory = record.host_memory
    if memory is None or not memory.t_s:
        return None
    keep = _thin(len(memory.t_s))
    x = _pick(memory.t_s, keep)
    data = [{"type": "scatter", "mode": "lines", "stackgroup": "rss", "name": "process", "x": x,
             "y": _pick(memory.process_bytes, keep, 1 / MIB), "line": {"color": "#4c78a8"},
             "hovertemplate": "%{x:.1f} s: %{y:.0f} MiB<extra>process</extra>"}]
    if any(memory.workers_bytes):
        data.append({"type": "scatter", "mode": "lines", "stackgroup": "rss", "name": "DataLoader workers", "x": x,
                     "y": _pick(memory.workers_bytes, keep, 1 / MIB), "line": {"color": "#f2a541"},
                     "hovertemplate": "%{x:.1f} s: %{y:.0f} MiB<extra>workers</extra>"})
    layout = _layout(280, xaxis=_axis("seconds into the run"), yaxis=_axis("resident memory (MiB)",
                                                                          rangemode="tozero"))
    return {"data": data, "layout": layout}


MEMORY_CATEGORIES: tuple[tuple[str, str, str], ...] = (
    ("parameters", "parameters", "#4c78a8"),
    ("gradients", "gradients", "#72b7b2"),
    ("optimizer_state", "optimizer state", "#54a24b"),
    ("inputs", "inputs", "#e4572e"),
    ("activations", "activations", "#f2a541"),
    ("temporaries", "temporaries", "#b279a2"),
    ("unknown", "unknown", "#b8b0a8"),
)
"""(``Memory`` field stem, name, color) of each category of memory, stacked in this order: what lasts the whole
step at the bottom."""


def _memory_unit(peak_bytes: float) -> tuple[str, float]:
    """GiB from a peak of 1 GiB up, else MiB: the unit of both memory figures."""
    return ("GiB", GIB) if peak_bytes >= GIB else ("MiB", MIB)


def memory_peak(record: RunRecord) -> Figure | None:
    """The measured steps' peak split by category, as one horizontal stacked bar; None without a measured peak."""
    memory = record.memory
    if memory is None or memory.peak_bytes <= 0:
        return None
    unit, scale = _memory_unit(memory.peak_bytes)
    data = []
    for stem, name, color in MEMORY_CATEGORIES:
        value = getattr(memory, f"{stem}_bytes")
        if value <= 0:
            continue
        share = value / memory.peak_bytes
        data.append({"type": "bar", "orientation": "h", "name": name, "y": ["peak"], "x": [_r(value / scale)],
                     "customdata": [_r(share * 100)], "marker": {"color": color},
                     "text": [f"{share:.0%}" if share >= 0.04 else ""], "textposition": "inside",
                     "hovertemplate": f"{name}: %{{x:.1f}} {unit} (%{{customdata:.0f}}%)<extra></extra>"})
    if not data:
        return None
    layout = _layout(150, barmode="stack", xaxis=_axis(f"memory at the peak ({unit})", rangemode="tozero"),
                     yaxis={"automargin": True})
    return {"data": data, "layout": layout}


def memory_timeline(record: RunRecord) -> Figure | None:
    """Memory over the measured steps by category, stacked (ms since the first one began); None without a
    timeline."""
    timeline = record.memory.timeline if record.memory is not None else None
    if timeline is None or not timeline.t_ms:
        return None
    keep = _thin(len(timeline.t_ms))
    x = _pick(timeline.t_ms, keep)
    series = [(name, color, getattr(timeline, stem)) for stem, name, color in MEMORY_CATEGORIES]
    series = [(name, color, values) for name, color, values in series if any(values)]
    if not series:
        return None
    unit, scale = _memory_unit(max((sum(v[i] for _, _, v in series if i < len(v)) for i in keep), default=0))
    data = [{"type": "scatter", "mode": "lines", "stackgroup": "memory", "name": name, "x": x,
             "y": _pick(values, keep, 1 / scale), "line": {"color": color, "width": 1},
             "hovertemplate": f"%{{x:.1f}} ms: %{{y:.1f}} {unit}<extra>{name}</extra>"}
            for name, color, values in series]
    layout = _layout(280, xaxis=_axis("ms since the first measured step began"),
                     yaxis=_axis(f"memory ({unit})", rangemode="tozero"))
    return {"data": data, "layout": layout}


LOSS_COLORS = ("#4c78a8", "#e4572e", "#54a24b", "#f2a541", "#b279a2", "#9d755d", "#72b7b2", "#ff9da6")
"""The untouched run's loss, then each trial's."""


def loss_curves(record: RunRecord) -> Figure | None:
    """The loss step by step; with trials (``--try``), each trial's beside it over the steps it ran. None without
    a loss."""
    measured = [t for t in record.trials if t.losses is not None and t.losses.index]
    if record.loss is None or not record.loss.index:
        return None
    end = max((t.steps for t in measured), default=None)
    series = [("this run", record.loss.index, record.loss.value)]
    series += [(f"with {t.id}", t.losses.index, t.losses.value) for t in measured]  # type: ignore[union-attr]
    data = []
    for (name, index, value), color in zip(series, LOSS_COLORS * 2):
        pairs = [(i, v) for i, v in zip(index, value) if end is None or i < end]
        keep = _thin(len(pairs))
        data.append({"type": "scatter", "mode": "lines", "name": name, "x": [pairs[k][0] for k in keep],
                     "y": [_r(pairs[k][1]) for k in keep], "line": {"color": color, "width": 1.5},
                     "hovertemplate": "step %{x}: %{y}<extra>" + name + "</extra>"})
    layout = _layout(280, xaxis=_axis("step"), yaxis=_axis("loss"))
    return {"data": data, "layout": layout}


def cuda_memory(record: RunRecord) -> Figure | None:
    """CUDA caching-allocator memory at the end of sampled steps; None without CUDA memory samples."""
    memory = record.cuda_memory
    if memory is None or not memory.step:
        return None
    keep = _thin(len(memory.step))
    x = [memory.step[i] for i in keep]
    data = []
    for name, series, color in (("allocated", memory.allocated_bytes, "#4c78a8"),
                                ("reserved", memory.reserved_bytes, "#72b7b2"),
                                ("step peak", memory.peak_bytes, "#e4572e")):
        if series:
            data.append({"type": "scatter", "mode": "lines", "name": name, "x": x, "y": _pick(series, keep, 1 / MIB),
                         "line": {"color": color}, "hovertemplate": "step %{x}: %{y:.0f} MiB<extra>" + name +
                         "</extra>"})
    layout = _layout(280, xaxis=_axis("step"), yaxis=_axis("CUDA memory (MiB)", rangemode="tozero"))
    return {"data": data, "layout": layout}


def loader_curve(record: RunRecord) -> Figure | None:
    """The loader probe's batches/s per worker count (with and without pin_memory where both were timed), and the
    rate the training step consumes batches as a line; None without a measured curve."""
    probe = record.loader_probe
    if probe is None or not any(r.batches_per_s for r in probe.rates):
        return None
    data = []
    for pin, name, color in ((False, "batches/s delivered", "#4c78a8"), (True, "with pin_memory", "#72b7b2")):
        rates = [r for r in probe.rates if r.pin_memory == pin and r.batches_per_s]
        if rates:
            data.append({"type": "scatter", "mode": "lines+markers", "name": name,
                         "x": [r.num_workers for r in rates], "y": [_r(r.batches_per_s) for r in rates],
                         "line": {"color": color},
                         "hovertemplate": "%{x} workers: %{y:.2f} batches/s<extra></extra>"})
    workers = [r.num_workers for r in probe.rates]
    if probe.consume_batches_per_s:
        data.append({"type": "scatter", "mode": "lines", "name": "the training step consumes",
                     "x": [min(workers), max(workers)], "y": [_r(probe.consume_batches_per_s)] * 2,
                     "line": {"color": "#e4572e", "dash": "dash"},
                     "hovertemplate": "consumed: %{y:.2f} batches/s<extra></extra>"})
    layout = _layout(280, xaxis=_axis("DataLoader workers", tickvals=workers),
                     yaxis=_axis("batches per second", rangemode="tozero"))
    return {"data": data, "layout": layout}


RANK_QUANTITIES: tuple[tuple[str, str, Callable[[RankSummary], float | None]], ...] = (
    ("median step", "#4c78a8", lambda r: r.median_s if r.steps else None),
    ("data wait", PHASE_COLORS["data_wait"], lambda r: r.breakdown.data_wait * r.median_s if r.steps else None),
    ("waiting on collectives", "#f2a541", lambda r: r.comm_exposed_s),
    ("waiting for a later rank", "#b07aa1", lambda r: r.waiting_s),
)
"""The rows of the ranks' chart: name, color, and a rank's seconds a step (None where the rank has no figure)."""
STRAGGLER_COLOR = "#953800"
BOX_MIN_RANKS = 8
"""Fewer ranks than this are drawn as their points alone: a box over a handful says less than the points do."""


def rank_spread(record: RunRecord) -> Figure | None:
    """How the job's ranks spread, one row a quantity (their median step, data wait a step and wait on collectives
    a step, ms): one point a rank (hover for its number) in a box from ``BOX_MIN_RANKS`` ranks on, and the straggler
    drawn over them. A world of more than ``MAX_POINTS`` ranks is an even sample of them (the straggler always
    drawn). None under two ranks."""
    ranks = record.ranks
    if len(ranks) < 2:
        return None
    shown = [ranks[i] for i in _thin(len(ranks))]
    boxes = len(ranks) >= BOX_MIN_RANKS
    late = next((r for r in ranks if record.straggler is not None and r.rank == record.straggler.rank), None)
    data: list[dict[str, Any]] = []
    rows, late_x, late_y = [], [], []
    for name, color, value in RANK_QUANTITIES:
        points = [(r.rank, v) for r in shown if (v := value(r)) is not None]
        if not points:
            continue
        rows.append(name)
        data.append({
            "type": "box", "orientation": "h", "name": name, "y": [name] * len(points),
            "x": [_r(v * 1e3) for _, v in points], "customdata": [rank for rank, _ in points],
            "boxpoints": "all", "jitter": 0.6, "pointpos": 0, "hoveron": "points", "showlegend": False,
            "marker": {"color": color, "size": 4 if boxes else 7, "opacity": 0.55 if boxes else 0.9},
            "line": {"color": color, "width": 1.5 if boxes else 0},
            "fillcolor": "rgba(0,0,0,0)",
            "hovertemplate": f"rank %{{customdata}}: %{{x:.1f}} ms<extra>{name}</extra>",
        })
        if late is not None and (v := value(late)) is not None:
            late_x.append(_r(v * 1e3))
            late_y.append(name)
    if not data:
        return None
    if late_x:
        name = f"rank {late.rank}: the straggler"  # type: ignore[union-attr]
        data.append({"type": "scatter", "mode": "markers", "name": name, "x": late_x, "y": late_y, "cliponaxis": False,
                     "marker": {"symbol": "diamond", "size": 12, "color": STRAGGLER_COLOR,
                                "line": {"color": "#fff", "width": 1.5}},
                     "hovertemplate": f"{name}: %{{x:.1f}} ms<extra>%{{y}}</extra>"})
    layout = _layout(100 + 60 * len(rows), boxmode="overlay", showlegend=bool(late_x),
                     xaxis=_axis("ms per step", rangemode="tozero"),
                     yaxis={"automargin": True, "autorange": "reversed", "categoryorder": "array",
                            "categoryarray": rows})
    return {"data": data, "layout": layout}


def build_charts(record: RunRecord) -> dict[str, Figure]:
    """Every figure the record supports, keyed by the id of the element that shows it."""
    charts: dict[str, Figure | None] = {
        "steps": step_bars(record),
        "breakdown": breakdown_bar(record),
        "loader-probe": loader_curve(record),
        "kernels": kernel_split(record),
        "ops": top_ops(record),
        "host-memory": host_memory(record),
        "loss": loss_curves(record),
        "cuda-memory": cuda_memory(record),
        "memory-peak": memory_peak(record),
        "memory-timeline": memory_timeline(record),
        "ranks": rank_spread(record),
        **gpu_timelines(record),
    }
    return {key: figure for key, figure in charts.items() if figure is not None}
