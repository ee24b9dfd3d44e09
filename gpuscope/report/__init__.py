"""The HTML report: rendered from a run's record only, so any past run can be re-rendered."""

from __future__ import annotations

from gpuscope.report.render import REPORT_HTML, render_report, template_dir, write_report

__all__ = ["REPORT_HTML", "render_report", "template_dir", "write_report"]
