"""gpuscope's own errors: one line for the user and an exit status, never a traceback."""

from __future__ import annotations

USAGE_EXIT = 2
"""Exit status for gpuscope's own bad input (the contract fixes it at 2)."""


class GpuscopeError(Exception):
    """A problem with gpuscope's input, shown to the user as one line."""

    def __init__(self, message: str, exit_code: int = USAGE_EXIT) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
