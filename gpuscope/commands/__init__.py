"""The command line's commands, one module a command (``run``, ``report``, ``compare``, ``analyze``, ``view``): each
a class with its ``name``, ``help``, ``add_arguments`` and ``run``; ``cli`` builds the parser from them and holds
``main``. gpuscope's own errors are raised as ``GpuscopeError``, which ``main`` turns into one line."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gpuscope.errors import GpuscopeError

if TYPE_CHECKING:
    from gpuscope.collect.runner import Target


class Command(Protocol):
    """One subcommand."""

    name: str
    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int | ScriptRun: ...


@dataclass(frozen=True, slots=True)
class ScriptRun:
    """A ``gpuscope run`` ready to go, its collectors started: ``main`` hands it to ``runner.run_target``, which
    runs the script and then ``end``, so that only ``main`` and ``run_target`` lie between the console script and
    the user's code (see ``run_target``)."""

    target: Target
    end: Callable[[int], None]
    after: Callable[[], None] | None = None
    """What runs once the script and ``end`` are over, outside their signal handling (``--try``'s trials)."""


@contextlib.contextmanager
def in_one_line(failure: str) -> Iterator[None]:
    """Whatever fails inside becomes one line, ``FAILURE: Type: message`` (gpuscope's own errors as they are): never a
    traceback from gpuscope, the contract's promise for its errors."""
    try:
        yield
    except GpuscopeError:
        raise
    except Exception as exc:
        raise GpuscopeError(f"{failure}: {type(exc).__name__}: {exc}") from None


__all__ = ["Command", "ScriptRun", "in_one_line"]
