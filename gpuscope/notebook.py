"""The ``%%gpuscope`` cell magic: ``%load_ext gpuscope`` once, then

    %%gpuscope -o runs/exp1
    for batch in loader:
        ...

profiles the cell exactly as ``with gpuscope.profile(): ...`` would and shows the report below it. The profile is
kept in the notebook's namespace as ``_gpuscope`` (``_gpuscope.verdict``, ``_gpuscope.report_path``). The magic's
options are ``gpuscope run``'s (``gpuscope.options.RunOptions``): ``-o DIR``, ``--cprofile-steps N``,
``--cprofile-all``, ``--trace-steps N``, ``--trace-max-mb MB``, ``--probe-loader``, ``--no-probes``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuscope.errors import GpuscopeError

RESULT_NAME = "_gpuscope"


def load_ipython_extension(ipython: Any) -> None:
    """Called by ``%load_ext gpuscope``: registers the ``%%gpuscope`` cell magic."""
    ipython.register_magic_function(_cell_magic(ipython), magic_kind="cell", magic_name="gpuscope")


def _cell_magic(ipython: Any) -> Any:
    def gpuscope(line: str, cell: str) -> None:
        """%%gpuscope [OPTIONS]: profile this cell and show the report; the options are gpuscope run's
        (-o DIR, --cprofile-steps N, --cprofile-all, --trace-steps N, --trace-max-mb MB, --probe-loader,
        --no-probes)."""
        from IPython.display import display

        from gpuscope.api import Profile
        from gpuscope.options import RunOptions

        try:
            options = RunOptions.parse(line, prog="%%gpuscope")
        except GpuscopeError as exc:
            print(f"gpuscope: error: {exc.message}")
            return
        prof = Profile(quiet=True, **dataclasses.asdict(options))
        prof.start()
        status = 1
        try:
            result = ipython.run_cell(cell)  # the cell's own output and traceback show as usual
            status = 0 if result.success else 1
        finally:
            prof.stop(status)
            ipython.user_ns[RESULT_NAME] = prof
        display(prof)

    return gpuscope
