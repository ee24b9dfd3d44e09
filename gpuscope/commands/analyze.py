"""``gpuscope analyze PATH``: the verdict, recommendations and report of a torch.profiler trace a user already has,
or of a folder of them (one per rank, as ``torch.profiler.tensorboard_trace_handler`` writes), with no run.

A single trace gives one record (``reduce.tracefile.record_from_file``, which reads the file as a stream: memory
holds the index of the trace, never its events), diagnosed by the same analysis as a run. A folder of rank traces
gives one job record, laid out as ``gpuscope run --nproc-per-node`` lays it out: each rank's record in ``rank-K/``,
the merge (every rank's steps and breakdown, the straggler, the missing ranks) in the output folder. A trace that
takes more than a few seconds to read gets a progress line on stderr (``ReadProgress``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from gpuscope.errors import GpuscopeError
from gpuscope.pipeline import conclude
from gpuscope.record import RunRecord

TRACE_SUFFIXES = (".json", ".json.gz")


class AnalyzeCommand:
    """``gpuscope analyze PATH [-o DIR] [--open] [-q]``."""

    name = "analyze"
    help = "diagnose a torch.profiler trace (.json, .json.gz) or a folder of rank traces, with no run"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("path", metavar="PATH", help="a trace file, or a folder of them (one per rank)")
        parser.add_argument("-o", "--output", metavar="DIR",
                            help="where run.json and report.html go (default: ./gpuscope-runs/<trace>-<timestamp>/)")
        parser.add_argument("-q", "--quiet", action="store_true", help="print no summary")
        parser.add_argument("--open", action="store_true", help="open report.html in the browser when done")

    def run(self, args: argparse.Namespace) -> int:
        from gpuscope.finish import finish
        from gpuscope.rundirs import new_run_dir

        path = Path(args.path)
        files = trace_files(path)
        records = [analyzed(f, quiet=args.quiet) for f in files]  # every input is read before any folder is made
        run_dir = new_run_dir(args.output, _stem(path))
        record = write_job(records, run_dir) if len(records) > 1 else records[0]
        conclude(record, run_dir, diagnosed=True)
        finish(lambda: record, run_dir, failure=f"could not write the report to {run_dir}", quiet=args.quiet,
               open_report=args.open, stream=sys.stdout)
        return 0


def trace_files(path: Path) -> list[Path]:
    """``path`` itself, or the trace files of a folder by name; GpuscopeError when there is nothing to read."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
        if not files:
            raise GpuscopeError(f"no trace files (.json, .json.gz) in {path}")
        return files
    if not path.exists():
        raise GpuscopeError(f"no such trace file or folder: {path}")
    return [path]


def analyzed(path: Path, quiet: bool = False) -> RunRecord:
    """The diagnosed record of one trace file, read as a stream (a progress line on stderr while a large one is read:
    ``ReadProgress``; ``quiet``: only on a terminal)."""
    from gpuscope.diagnose import analyze
    from gpuscope.reduce.tracefile import record_from_file

    progress = ReadProgress(path.name, quiet=quiet)
    try:
        record = record_from_file(path, path.name, path.stat().st_size, progress=progress)
    finally:
        progress.close()
    return analyze(record)


class ReadProgress:
    """``gpuscope: reading NAME: 1.2 of 5.0 GB`` on stderr while a trace is read, once the reading has taken
    ``AFTER_S``: rewritten in place at most every ``TTY_EVERY_S`` on a terminal, else (unless ``quiet``) a line every
    ``LOG_EVERY_S``. A trace read in a few seconds shows none."""

    AFTER_S = 3.0
    TTY_EVERY_S = 1.0
    LOG_EVERY_S = 10.0

    def __init__(self, name: str, *, quiet: bool = False, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _is_tty(self.stream)
        self.quiet = quiet
        self.clock = clock
        self.started = clock()
        self.shown = 0.0  # when a line was last written (0: none yet)
        self.last = ""

    def __call__(self, done: int, total: int) -> None:
        """Told that ``done`` of the file's ``total`` bytes are read."""
        now = self.clock()
        if now - self.started < self.AFTER_S or (self.quiet and not self.tty):
            return
        if self.shown and now - self.shown < (self.TTY_EVERY_S if self.tty else self.LOG_EVERY_S):
            return
        self.shown = now
        self._write(f"gpuscope: reading {self.name}: {_amount(done, total)}")

    def close(self) -> None:
        """Clear the line rewritten in place, if one was written: the summary follows on a clean line."""
        if self.tty and self.shown:
            self.stream.write("\r" + " " * len(self.last) + "\r")
            self.stream.flush()

    def _write(self, line: str) -> None:
        if self.tty:
            self.stream.write("\r" + line.ljust(len(self.last)))
        else:
            self.stream.write(line + "\n")
        self.last = line
        self.stream.flush()


def _amount(done: int, total: int) -> str:
    unit, scale = ("GB", 1e9) if total >= 1e9 else ("MB", 1e6)
    return f"{done / scale:.1f} of {total / scale:.1f} {unit}" if total else f"{done / scale:.1f} {unit}"


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def write_job(records: list[RunRecord], job_dir: Path) -> RunRecord:
    """Write each rank's record to ``job_dir/rank-K/`` and return the job's merged record."""
    from gpuscope.diagnose import analyze
    from gpuscope.diagnose.ranks import combine
    from gpuscope.distributed import rank_dir
    from gpuscope.record import Distributed

    ranks = [r.distributed.rank if r.distributed is not None else None for r in records]
    renumber = None in ranks or len(set(ranks)) != len(ranks)
    placed = []
    for position, record in enumerate(records):
        where = record.distributed or Distributed(world_size=len(records))
        if renumber:  # ranks the traces do not tell apart: their order by file name stands for the rank
            where = dataclasses.replace(where, rank=position, world_size=max(where.world_size, len(records)))
        record = dataclasses.replace(record, distributed=where)
        folder = rank_dir(job_dir, where.rank)
        folder.mkdir(parents=True, exist_ok=True)
        conclude(record, folder, diagnosed=True)
        placed.append(record)
    job = analyze(combine(placed))
    files = tuple(f for r in placed if r.source is not None for f in r.source.files)
    source = dataclasses.replace(job.source, files=files) if job.source is not None else None
    note = ("each rank's own record is in rank-K/run.json (gpuscope report RUN_DIR/rank-K renders its report)",)
    return dataclasses.replace(job, source=source, meta=dataclasses.replace(job.meta, notes=(*job.meta.notes, *note)))


def _stem(path: Path) -> str:
    name = path.resolve().name if path.name in ("", ".", "..") else path.name
    for suffix in (".json.gz", ".json", ".gz"):
        if name.endswith(suffix):
            return name[: -len(suffix)] or "trace"
    return name or "trace"
