"""Where every record ends, whichever way it came: a run's collectors (``gpuscope run``, its hand-over under
``--profile-steps``, a rank, ``gpuscope.profile()``), a trace read by ``gpuscope analyze``, a job's ranks merged, a
run's trials, the watcher's record of a run killed outright. ``conclude`` diagnoses it (where it is not yet) and
writes run.json, the only place gpuscope does; ``render`` writes its report."""

from __future__ import annotations

from pathlib import Path

from gpuscope.record import RunRecord, write_record


def conclude(record: RunRecord, run_dir: Path, *, diagnosed: bool = False) -> RunRecord:
    """``record`` diagnosed (``diagnose.analyze``) unless it is already (a merge diagnosed as the job, a record
    re-ranked by its trials, an exit status set after its hand-over), written as RUN_DIR/run.json, and returned."""
    if not diagnosed:
        from gpuscope.diagnose import analyze

        record = analyze(record)
    write_record(record, run_dir)
    return record


def render(record: RunRecord, run_dir: Path) -> Path | None:
    """RUN_DIR/report.html, or None after one line on stderr saying why not (run.json is written by then)."""
    from gpuscope.report import write_report_softly

    return write_report_softly(record, run_dir)


__all__ = ["conclude", "render"]
