"""Where a run's files go: the folder asked for, else a new timestamped one under ``./gpuscope-runs/``.

Shared by ``gpuscope run`` and ``gpuscope.profile()``, which the contract gives the same default."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from gpuscope.errors import GpuscopeError

RUNS_FOLDER = "gpuscope-runs"


def new_run_dir(output: str | Path | None, stem: str) -> Path:
    """``output`` created if needed, else ``./gpuscope-runs/<stem>-<YYYYmmdd-HHMMSS>/`` (``-2``, ``-3``... when
    a run of the same name started in the same second); absolute."""
    if output is not None:
        path = Path(output)
    else:
        base = Path(RUNS_FOLDER) / f"{stem}-{datetime.now():%Y%m%d-%H%M%S}"
        path, n = base, 1
        while path.exists():
            n += 1
            path = base.with_name(f"{base.name}-{n}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuscopeError(f"cannot create the run folder {path}: {exc.strerror}") from None
    return path.resolve()
