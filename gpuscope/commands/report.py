"""``gpuscope report RUN_DIR``: the report rendered again from run.json (a job's folder: its ranks merged)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuscope import distributed
from gpuscope.commands import in_one_line
from gpuscope.finish import open_in_browser


class ReportCommand:
    """``gpuscope report RUN_DIR``: re-render RUN_DIR/report.html from RUN_DIR/run.json."""

    name = "report"
    help = "re-render RUN_DIR/report.html from RUN_DIR/run.json"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", metavar="RUN_DIR", help="a run's folder (it holds run.json)")
        parser.add_argument("--open", action="store_true", help="open the report in the browser")

    def run(self, args: argparse.Namespace) -> int:
        from gpuscope.record import load_record
        from gpuscope.report import write_report

        run_dir = Path(args.run_dir)
        # a torchrun job's folder: merge whatever rank records it holds (a lost rank is named as missing)
        record = distributed.merge_job(run_dir) if distributed.is_job_dir(run_dir) else load_record(run_dir)
        with in_one_line(f"could not render the report of {run_dir}"):
            path = write_report(record, run_dir)
        print(f"gpuscope: report written to {path}")
        if args.open:
            open_in_browser(path)
        return 0
