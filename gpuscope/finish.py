"""The end of every profiled run, one path for ``gpuscope run`` (a process, or a job's merge) and
``gpuscope.profile()``: make the record, write the report, print the summary, open the report if asked.

Nothing here raises: a failure is one line on stderr, never an exception over the script's exit status.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from gpuscope.record import RunRecord
    from gpuscope.session import Session


@dataclass(frozen=True, slots=True)
class Finished:
    """What the end of a run left: its record and report.html (None where they could not be made: the reason was
    printed)."""

    record: RunRecord | None
    report_path: Path | None


def finish(make_record: Callable[[], RunRecord], run_dir: Path, *, failure: str, quiet: bool = False,
           open_report: bool = False, announce: Callable[[RunRecord], bool] | None = None,
           stream: TextIO | None = None) -> Finished:
    """Make the run's record (``make_record``: the session's stop, which writes run.json, or a job's merge), write
    RUN_DIR/report.html, print the summary on stderr unless ``quiet``, and open the report when ``open_report``.

    ``failure`` says what could not be done should ``make_record`` raise ("could not write the run's files to
    DIR"). ``announce``: whether this record is worth the summary and the browser at all (a job's record before
    its last rank is in is not); the report is written either way. ``stream``: where the summary goes (stderr by
    default: a run's stdout is the script's; ``gpuscope analyze`` has no script and prints on stdout).
    """
    try:
        record = make_record()
    except Exception as exc:
        print(f"gpuscope: error: {failure}: {exc}", file=sys.stderr)
        return Finished(None, None)
    from gpuscope.pipeline import render

    report_path = render(record, run_dir)
    if announce is not None and not announce(record):
        return Finished(record, report_path)
    if not quiet:
        from gpuscope.report.summary import summary_lines

        for line in summary_lines(record, run_dir, report_path):
            print(line, file=stream or sys.stderr)
    if open_report and report_path is not None:
        open_in_browser(report_path)
    return Finished(record, report_path)


def finish_session(session: Session, status: int, *, quiet: bool = False, open_report: bool = False) -> Finished:
    """``finish`` for one process's run: stop ``session`` with the script's exit ``status``."""
    return finish(lambda: session.stop(status, say=None if quiet else _say), session.run_dir, quiet=quiet,
                  open_report=open_report, failure=f"could not write the run's files to {session.run_dir}")


def hand_over_session(session: Session, *, quiet: bool = False) -> Finished:
    """``Session.on_hand_over`` of a run whose profiled steps are over while the script goes on
    (``--profile-steps``): run.json and report.html now, one line on stderr, then the probes, and both again with
    what the probes found. The summary waits for the script's end; ``quiet`` keeps the probes' progress lines off
    the terminal."""
    reports: list[Path | None] = []

    def written(record: RunRecord) -> None:
        from gpuscope.pipeline import render

        path = render(record, session.run_dir)
        if path is not None and not any(reports):  # said even under -q: a long job's one line about gpuscope
            print(f"gpuscope: report ready at {path}; training continues unprofiled", file=sys.stderr, flush=True)
        reports.append(path)

    record = session.hand_over(say=None if quiet else _say, written=written)
    return Finished(record, reports[-1] if reports else None)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def open_in_browser(path: Path) -> None:
    """Open a page in the user's browser (only ever on request: ``--open``)."""
    import webbrowser

    if not webbrowser.open(path.resolve().as_uri()):
        print(f"gpuscope: no browser could be opened; the report is {path}", file=sys.stderr)


__all__ = ["Finished", "finish", "finish_session", "hand_over_session", "open_in_browser"]
