"""Render the HTML report from a run's record: one Jinja environment, the templates' one lookup, and plotly.js
inlined once so the page works offline from a file.

Python passes the templates only the record, the chart dicts and a few derived facts; all markup is in
``reports/templates`` (shipped in the wheel as ``gpuscope/_templates``).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2 import BytecodeCache, Environment, FileSystemBytecodeCache, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from gpuscope.diagnose.gpu_step import own_cuda_cost
from gpuscope.diagnose.speed import headroom_text
from gpuscope.diagnose.compare import Comparison, compare
from gpuscope.errors import GpuscopeError
from gpuscope.record import PHASES, RunRecord
from gpuscope.report import charts, compare_charts, facts
from gpuscope.diagnose.words import (bound_label, flop_text, left_out, other_text, own_cost_text,
                                     sparse_flops_text, speedup_text, utilisation_text)
from gpuscope.diagnose.trials import slower, unchanged
from gpuscope.report.trials_text import estimate_words, loss_words, speedup_words

REPORT_HTML = "report.html"
TEMPLATE = "report.html"
COMPARE_HTML = "compare.html"
"""The comparison page's default name, in run B's folder (``gpuscope compare A B``)."""
COMPARE_TEMPLATE = "compare.html"
PLOTLY_JS = ("package_data", "plotly.min.js")
"""Where the installed ``plotly`` package keeps its bundle of plotly.js."""
_SCRIPT_END = re.compile("</script", re.IGNORECASE)
"""What would end the inline ``<script>`` that holds plotly.js early (HTML end tags are case-insensitive)."""


def gpu_collectors() -> list[str]:
    """The collectors that only have something to say about a GPU (``gpu_only``): on a CPU run their reasons
    explain the Device section."""
    from gpuscope.collect.collectors import collector_classes

    return [cls.name for cls in collector_classes() if cls.gpu_only]


def template_dir() -> Path:
    """The report's templates: ``gpuscope/_templates`` in an installed wheel, else the repository's
    ``reports/templates`` (a source checkout or an editable install). The one place that looks them up."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_templates", package.parent / "reports" / "templates"):
        if (candidate / TEMPLATE).is_file():
            return candidate
    raise GpuscopeError("the report's templates are missing from this gpuscope install (reinstall gpuscope)")


def _bytecode_cache() -> BytecodeCache | None:
    """Jinja's cache of compiled templates, in a folder of this user's in the temporary directory (Jinja checks it
    is theirs alone): compiling the report's templates takes longer than rendering them, on every run. A template
    whose text changed is compiled again. None where the folder cannot be used: then they are compiled each time."""
    try:
        return FileSystemBytecodeCache()
    except Exception:
        return None


def environment() -> Environment:
    """The Jinja environment: autoescaping on, undefined names an error, JSON with sorted keys."""
    env = Environment(
        loader=FileSystemLoader(str(template_dir())),
        bytecode_cache=_bytecode_cache(),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.policies["json.dumps_kwargs"] = {"sort_keys": True, "allow_nan": False}
    env.filters.update(seconds=facts.seconds, speedup=speedup_text, sparse_flops=sparse_flops_text,
                       percent=facts.percent, size=facts.size, flops=flop_text, ranges=rank_ranges,
                       utilisation=utilisation_text)
    return env


def rank_ranges(ranks: Sequence[int]) -> str:
    """Ranks as runs of consecutive numbers, "3, 8-15, 40": a job that lost a node lists its ranks in a line."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def plotly_js() -> str:
    """The text of plotly.js from the installed ``plotly`` package (read, never fetched)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise GpuscopeError("plotly is not installed: pip install plotly")
    path = Path(next(iter(spec.submodule_search_locations)), *PLOTLY_JS)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GpuscopeError(f"cannot read plotly.js from the plotly package ({path}): {exc.strerror}") from None
    if _SCRIPT_END.search(text):  # would end the inline <script> early; never seen in a release
        raise GpuscopeError("this plotly.js cannot be inlined (it contains '</script')")
    return text


def context(record: RunRecord) -> dict[str, Any]:
    """Everything the templates read: the record, its charts, and facts derived from it."""
    from gpuscope import __version__

    collectors = record.collectors
    return {
        "record": record,
        "charts": charts.build_charts(record),
        "label": bound_label(record),
        "headroom": headroom_text(record),
        "left_out": left_out(record),
        "other": other_text(record),
        "own_cost": own_cost_text(own_cost, record.steps.median_s) if (own_cost := own_cuda_cost(record)) else None,
        "command": facts.mask_command(record.command),
        "fixes": {i: facts.fix_lines(rec.fix) for i, rec in enumerate(record.recommendations)},
        "not_checked": facts.not_checked(record),
        "clear_checks": facts.clear_checks(record),
        "artifacts": facts.artifacts(record),
        "phases": PHASES,
        "phase_names": charts.PHASE_NAMES,
        "phase_colors": charts.PHASE_COLORS,
        "max_points": charts.MAX_POINTS,
        "box_min_ranks": charts.BOX_MIN_RANKS,
        "device_missing": [(name, collectors[name]) for name in gpu_collectors()
                           if name in collectors and collectors[name].status != "ok"],
        "window_text": facts.window_text,
        "renderer_version": __version__,
        **trials_context(record),
    }


def trials_context(record: RunRecord) -> dict[str, Any]:
    """The words of the Tried table, one entry a trial, and each tried recommendation's measured gain."""
    trials = record.trials
    tried = {}
    for t in trials:
        if t.status == "measured":
            measured = (f"measured {t.measured_gain:+.0%} of step time" if t.measured_gain is not None else
                        "measured slower" if slower(t) else "no measurable change" if unchanged(t) else
                        "not credited: the loss changed")
            tried[t.id] = (measured, "slower" if slower(t) else "" if t.credited else "none")
    return {
        "trial_speedups": [speedup_words(t) for t in trials],
        "trial_estimates": [estimate_words(t) for t in trials],
        "trial_losses": [loss_words(t) for t in trials],
        "trial_classes": ["slower" if slower(t) else "none" if unchanged(t) else
                          "flagged" if t.status == "measured" and not t.credited else ""
                          for t in trials],
        "tried_gains": tried,
    }


def render_report(record: RunRecord, *, inline_plotly: bool = True) -> str:
    """The report's HTML text. ``inline_plotly=False`` leaves a marker where plotly.js goes (for tests)."""
    js = plotly_js() if inline_plotly else "/* plotly.js */"
    template = environment().get_template(TEMPLATE)
    return template.render(plotly_js=Markup(js), **context(record))


def write_report(record: RunRecord, run_dir: Path) -> Path:
    """Render the report into ``RUN_DIR/report.html`` (atomically) and return its path."""
    return _write_atomically(Path(run_dir) / REPORT_HTML, render_report(record))


def _write_atomically(path: Path, html: str) -> Path:
    """Write ``html`` to ``path`` through a temporary file beside it (creating the folder): a reader never sees
    half a page, and a failure is one line."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise GpuscopeError(f"cannot write {path}: {exc.strerror}") from None
    return path


def compare_context(a: RunRecord, b: RunRecord, comparison: Comparison) -> dict[str, Any]:
    """Everything the comparison page reads: both records, the comparison, its charts and the runs' facts."""
    from gpuscope import __version__

    return {
        "a": a,
        "b": b,
        "comparison": comparison,
        "charts": compare_charts.build_compare_charts(a, b, comparison),
        "commands": (facts.mask_command(a.command), facts.mask_command(b.command)),
        "phase_names": charts.PHASE_NAMES,
        "phase_colors": charts.PHASE_COLORS,
        "renderer_version": __version__,
    }


def render_compare(a: RunRecord, b: RunRecord, comparison: Comparison | None = None, *,
                   inline_plotly: bool = True) -> str:
    """The comparison page's HTML text, run A (before) against run B (after). ``comparison`` defaults to
    ``compare(a, b)``; ``inline_plotly=False`` leaves a marker where plotly.js goes (for tests)."""
    js = plotly_js() if inline_plotly else "/* plotly.js */"
    comparison = compare(a, b) if comparison is None else comparison
    template = environment().get_template(COMPARE_TEMPLATE)
    return template.render(plotly_js=Markup(js), **compare_context(a, b, comparison))


def write_compare(a: RunRecord, b: RunRecord, path: Path, comparison: Comparison | None = None) -> Path:
    """Render the comparison page into ``path`` (atomically, creating its folder) and return the path."""
    return _write_atomically(Path(path), render_compare(a, b, comparison))
