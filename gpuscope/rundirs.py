"""Where a run's files go: the folder asked for, else a new timestamped one under ``./gpuscope-runs/``.

Shared by ``gpuscope run`` and ``gpuscope.profile()``, which the contract gives the same default."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from gpuscope.errors import GpuscopeError

RUNS_FOLDER = "gpuscope-runs"


def new_run_dir(output: str | Path | None, stem: str) -> Path:
    """``output`` created if needed, else ``./gpuscope-runs/<stem>-<YYYYmmdd-HHMMSS>/`` (``-2``, ``-3``... when
    a run of the same name started in the same second: each process its own, as the processes of a script that
    profiles each of its workers start together); absolute."""
    try:
        if output is not None:
            path = Path(output)
            path.mkdir(parents=True, exist_ok=True)
            return path.resolve()
        base = Path(RUNS_FOLDER) / f"{stem}-{datetime.now():%Y%m%d-%H%M%S}"
        base.parent.mkdir(parents=True, exist_ok=True)
        path, n = base, 1
        while True:
            try:
                path.mkdir()  # made by this process, or taken: the next name
                return path.resolve()
            except FileExistsError:
                n += 1
                path = base.with_name(f"{base.name}-{n}")
    except OSError as exc:
        raise GpuscopeError(f"cannot create the run folder {exc.filename}: {exc.strerror}") from None
