"""The HTML report: rendered from a run's record only, so any past run can be re-rendered."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpuscope.errors import GpuscopeError
from gpuscope.report.render import REPORT_HTML, render_report, template_dir, write_report

if TYPE_CHECKING:
    from gpuscope.record import RunRecord


def write_report_softly(record: RunRecord, run_dir: Path) -> Path | None:
    """report.html for a finished run, or None after one line on stderr saying why it could not be written: a
    rendering problem must never cost the user the run (run.json is already written) or change its outcome."""
    try:
        return write_report(record, run_dir)
    except GpuscopeError as exc:
        reason = exc.message
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
    print(f"gpuscope: error: could not write the report (run.json is written; retry with gpuscope report "
          f"{run_dir}): {reason}", file=sys.stderr)
    return None


__all__ = ["REPORT_HTML", "render_report", "template_dir", "write_report", "write_report_softly"]
