"""The ``%%gpuscope`` cell magic: ``%load_ext gpuscope`` once, then

    %%gpuscope -o runs/exp1
    for batch in loader:
        ...

profiles the cell exactly as ``with gpuscope.profile(): ...`` would and shows the report below it. The profile is
kept in the notebook's namespace as ``_gpuscope`` (``_gpuscope.verdict``, ``_gpuscope.report_path``).
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from gpuscope.errors import GpuscopeError

RESULT_NAME = "_gpuscope"


def load_ipython_extension(ipython: Any) -> None:
    """Called by ``%load_ext gpuscope``: registers the ``%%gpuscope`` cell magic."""
    ipython.register_magic_function(_cell_magic(ipython), magic_kind="cell", magic_name="gpuscope")


def _cell_magic(ipython: Any) -> Any:
    def gpuscope(line: str, cell: str) -> None:
        """%%gpuscope [-o DIR] [--trace-steps N] [--cprofile-steps N]: profile this cell and show the report."""
        from IPython.display import display

        from gpuscope.api import Profile

        try:
            options = _parse(line)
        except GpuscopeError as exc:
            print(f"gpuscope: error: {exc.message}")
            return
        prof = Profile(options.output, cprofile_steps=options.cprofile_steps, trace_steps=options.trace_steps,
                       quiet=True)
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


def _parse(line: str) -> argparse.Namespace:
    """The magic's options, with the CLI's parser (a bad option is a GpuscopeError, not an exit)."""
    from gpuscope.cli import _count, _Parser
    from gpuscope.collectors import cprofile, torch_trace

    parser = _Parser(prog="%%gpuscope", add_help=False)
    parser.add_argument("-o", "--output", default=None)
    parser.add_argument("--trace-steps", type=_count, default=torch_trace.DEFAULT_ACTIVE)
    parser.add_argument("--cprofile-steps", type=_count, default=cprofile.DEFAULT_STEPS)
    return parser.parse_args(shlex.split(line))
