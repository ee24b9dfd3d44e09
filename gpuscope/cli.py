"""The command line: ``gpuscope run|report|compare|analyze|view``, one module a command in ``gpuscope/commands/``.
``main(argv)`` returns the exit status, and gpuscope's own errors become one line on stderr and exit status 2, in
this one place."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpuscope.commands import Command, ScriptRun
from gpuscope.commands.analyze import AnalyzeCommand
from gpuscope.commands.compare import CompareCommand
from gpuscope.commands.report import ReportCommand
from gpuscope.commands.run import RunCommand
from gpuscope.commands.view import ViewCommand
from gpuscope.errors import USAGE_EXIT, GpuscopeError
from gpuscope.options import Parser


COMMANDS: tuple[Command, ...] = (RunCommand(), ReportCommand(), CompareCommand(), ViewCommand(), AnalyzeCommand())


def build_parser() -> argparse.ArgumentParser:
    """The parser for every subcommand in ``COMMANDS``."""
    from gpuscope import __version__

    parser = Parser(prog="gpuscope", description="Why is my training loop slow, and which few lines make it faster?")
    parser.add_argument("--version", action="version", version=f"gpuscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command_parser = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(command_parser)
        command_parser.set_defaults(handler=command, target=[])
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; a command that runs a target gets the target's tokens untouched, in ``args.target``."""
    by_name = {c.name: c for c in COMMANDS}
    command = by_name.get(argv[0]) if argv else None
    split = getattr(command, "split_target", None)
    if command is None or split is None:
        return parser.parse_args(argv)
    own, target = split(_subparser(parser, command.name), argv[1:])
    args = parser.parse_args([command.name, *own])
    args.target, args.own_tokens = target, own
    return args


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise LookupError(name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run gpuscope with ``argv`` (default: the process's) and return the exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parse(parser, argv)
        handler = getattr(args, "handler", None)
        if handler is None:
            names = ", ".join(c.name for c in COMMANDS)
            raise GpuscopeError(f"a command is needed ({names}); see gpuscope --help")
        outcome = handler.run(args)
        if isinstance(outcome, ScriptRun):
            from gpuscope.collect.runner import run_target

            status = run_target(outcome.target, outcome.end)
            if outcome.after is not None:
                outcome.after()
            return status
        return outcome
    except GpuscopeError as exc:
        print(f"gpuscope: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


__all__ = ["COMMANDS", "USAGE_EXIT", "build_parser", "main"]
