"""The command line: ``gpuscope run|...``. Subcommands come from one list; ``main(argv)`` returns the exit status,
and gpuscope's own errors become one line on stderr and exit status 2, in this one place."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpuscope import distributed
from gpuscope import sentinel
from gpuscope.errors import USAGE_EXIT, GpuscopeError
from gpuscope.finish import finish, finish_session, hand_over_session, open_in_browser
from gpuscope.options import Parser, RunOptions, count, positive_float, positive_int
from gpuscope.rundirs import new_run_dir
from gpuscope.analyze import AnalyzeCommand
from gpuscope.trials import APPLY_FIX, DEFAULT_TRY_BUDGET_S, STOP_AFTER, requested

if TYPE_CHECKING:
    from gpuscope.collect.fixes import Applied, StopAfter
    from gpuscope.collect.runner import Target
    from gpuscope.record import RunRecord
    from gpuscope.session import Session


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


class RunCommand:
    """``gpuscope run [OPTIONS] SCRIPT [ARGS...]`` / ``gpuscope run [OPTIONS] -m MODULE [ARGS...]``."""

    name = "run"
    help = "run a training script under the profiler, exactly as python would run it"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.usage = "gpuscope run [OPTIONS] (SCRIPT | -m MODULE) [ARGS...]"
        RunOptions.add_arguments(parser)
        parser.add_argument("-q", "--quiet", action="store_true", help="print no summary at the end")
        parser.add_argument("--open", action="store_true", help="open report.html in the browser when done")
        parser.add_argument("--nproc-per-node", metavar="N", type=positive_int,
                            help="run the script on N ranks through torch.distributed.run (torchrun), every rank "
                                 "profiled into RUN_DIR/rank-K/, one merged report in RUN_DIR")
        parser.add_argument("--try", dest="try_fixes", metavar="ID[,ID...]|auto",
                            help="after the run, run the script again once per fix, each with the fix applied by "
                                 "gpuscope at run time (no line edited) over the same steps, and measure what it "
                                 "gained and whether the loss stayed; auto: the run's own recommendations that can "
                                 "be applied so, best first, within --try-budget")
        parser.add_argument("--try-budget", metavar="SECONDS", type=positive_float, default=DEFAULT_TRY_BUDGET_S,
                            help="the time --try auto may spend on trials (default %(default)g s; each is about as "
                                 "long as the run's start-up and its first steps)")
        parser.add_argument("--try-steps", metavar="N", type=positive_int,
                            help="steps each trial runs (default: as many as the run had, up to 30 s of them, and "
                                 "20 past its profiled ones at least)")
        parser.add_argument(distributed.LAUNCHED, action="store_true", help=argparse.SUPPRESS)
        parser.add_argument(APPLY_FIX, dest="apply_fix", help=argparse.SUPPRESS)  # a trial's own (gpuscope.trials)
        parser.add_argument(STOP_AFTER, dest="stop_after_steps", type=positive_int, help=argparse.SUPPRESS)
        # For --help only: the target is split off before argparse sees the command line (split_target).
        parser.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script, like python -m")
        parser.add_argument("script", nargs="?", metavar="SCRIPT",
                            help="the training script; everything after SCRIPT or MODULE is the script's own")

    def split_target(self, parser: argparse.ArgumentParser, tokens: list[str]) -> tuple[list[str], list[str]]:
        """Split ``run``'s tokens into gpuscope's options and the target (``SCRIPT ARGS`` or ``-m MODULE ARGS``).

        Done by hand, as python does it: the first token that is not one of our options starts the target,
        and nothing after it is ever read as ours, however much it looks like an option.
        """
        takes_value = {s for a in parser._actions if a.option_strings and a.nargs != 0 for s in a.option_strings}
        i = 0
        while i < len(tokens):
            token = tokens[i]
            if token == "--":
                return tokens[:i], tokens[i + 1:]
            if token == "-m" or not token.startswith("-") or token == "-":
                return tokens[:i], tokens[i:]
            if token.startswith("-m") and not token.startswith("--"):
                return tokens[:i], ["-m", token[2:], *tokens[i + 1:]]
            i += 2 if token in takes_value else 1
        return tokens, []

    def run(self, args: argparse.Namespace) -> int | ScriptRun:
        from gpuscope.collect.collectors import default_collectors
        from gpuscope.collect.runner import resolve_target
        from gpuscope.session import Session

        target_tokens: list[str] = args.target
        if target_tokens[:1] == ["-m"]:
            if len(target_tokens) < 2:
                raise GpuscopeError("-m needs a module name")
            target = resolve_target(None, target_tokens[1], target_tokens[2:])
        else:
            target = resolve_target(target_tokens[0] if target_tokens else None, None, target_tokens[1:])
        wanted = requested(args.try_fixes) if args.try_fixes is not None else None
        if args.nproc_per_node:
            if wanted is not None:
                raise GpuscopeError("--try runs single-process scripts; with --nproc-per-node, try a fix on one rank")
            return _launch_ranks(args, target)
        options = RunOptions.from_args(args)
        rank = distributed.rank_env()
        if wanted is not None and rank is not None:
            raise GpuscopeError("--try runs single-process scripts, not a rank of a torchrun job")
        fix = _fix_to_apply(args.apply_fix)
        job_dir = distributed.job_run_dir(options.output, target.stem) if rank is not None else None
        run_dir = (distributed.rank_dir(job_dir, rank.rank) if job_dir is not None and rank is not None
                   else new_run_dir(options.output, target.stem))
        session = Session(run_dir, target.command, default_collectors(options.collect_options()), distributed=rank,
                          skip_steps=options.skip_steps, profile_steps=options.profile_steps)
        session.on_hand_over = partial(hand_over_session, quiet=args.quiet)
        session.start()
        trial = _TrialChild.start(session, fix, args.stop_after_steps) \
            if fix is not None or args.stop_after_steps is not None else None
        finished: list[RunRecord | None] = []
        # a run killed outright (the OOM killer) leaves no record of its own: a watcher writes one
        watcher = sentinel.start(run_dir, target.command) if job_dir is None and trial is None else None

        def end(status: int) -> None:
            if job_dir is None:
                done = finish_session(session, status, quiet=args.quiet, open_report=args.open and wanted is None)
                if watcher is not None:
                    watcher.stop()
                finished.append(done.record)
                if trial is not None:
                    trial.written(run_dir)
                return
            finish_session(session, status, quiet=True)  # this rank's own files and report, then the job's
            if not args.launched_by_gpuscope:  # else the launcher merges, once, when every rank has ended
                _finish_job(job_dir, args.quiet, args.open, only_if_complete=True)

        def after() -> None:
            record = finished[0] if finished else None
            if wanted is not None and record is not None:
                from gpuscope.trials import run_trials

                run_trials(record, run_dir, target.command, options, wanted, args.try_budget, quiet=args.quiet,
                           steps=args.try_steps)
                if args.open:
                    open_in_browser(run_dir / "report.html")

        return ScriptRun(target, end, after)


def _fix_to_apply(text: str | None) -> tuple[str, dict[str, Any]] | None:
    """A trial's ``--apply-fix`` (only gpuscope passes it): the fix's id and its values."""
    if text is None:
        return None
    import json

    from gpuscope.collect.fixes import INSTALLERS

    try:
        fix = json.loads(text)
        if fix["id"] not in INSTALLERS:
            raise KeyError(fix["id"])
        return fix["id"], dict(fix.get("settings", {}))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise GpuscopeError(f"{APPLY_FIX}: not a fix gpuscope applies: {exc}") from None


@dataclass
class _TrialChild:
    """This process is one run of a trial (``gpuscope.trials``): the fix applied, the script stopped after its
    steps; ``written`` leaves trial.json beside its run.json."""

    applied: Applied | None
    stop: StopAfter | None

    @classmethod
    def start(cls, session: Session, fix: tuple[str, dict[str, Any]] | None, stop_after: int | None) -> _TrialChild:
        from gpuscope.collect.fixes import StopAfter, apply

        steps = session.steps
        if steps is None:  # (the steps collector always runs: nothing to follow without it)
            return cls(None, None)
        return cls(apply(fix[0], fix[1], steps) if fix is not None else None,
                   StopAfter(steps, stop_after) if stop_after is not None else None)

    def written(self, run_dir: Path) -> None:
        from gpuscope.trials import write_applied

        write_applied(run_dir, self.applied, self.stop.stopped if self.stop is not None else False)


def _launch_ranks(args: argparse.Namespace, target: Target) -> int:
    """``--nproc-per-node N``: torchrun starts N ranks, each under ``gpuscope run``; then the merged report."""
    job_dir = new_run_dir(args.output, target.stem)
    status = distributed.launch(args.nproc_per_node, job_dir, _forwarded(args.own_tokens), args.target)
    _finish_job(job_dir, args.quiet, args.open)
    return status


def _forwarded(tokens: list[str]) -> list[str]:
    """gpuscope's own options for each rank, less those the launcher answers for itself."""
    dropped = {"--nproc-per-node": 1, "-o": 1, "--output": 1, "--open": 0, "-q": 0, "--quiet": 0,
               distributed.LAUNCHED: 0}
    out, i = [], 0
    while i < len(tokens):
        name = tokens[i].split("=", 1)[0]
        if name in dropped:
            i += 1 + (dropped[name] if "=" not in tokens[i] else 0)
            continue
        out.append(tokens[i])
        i += 1
    return out


def _finish_job(job_dir: Path, quiet: bool, open_report: bool = False, only_if_complete: bool = False) -> None:
    """Merge the job's rank records into RUN_DIR/run.json and report.html; the summary (unless ``quiet``) and the
    browser once every rank is in (``only_if_complete``), or from the launcher whatever is in."""

    def complete(record: RunRecord) -> bool:
        return not only_if_complete or (not record.missing_ranks and len(record.ranks) >= 2)

    finish(lambda: distributed.merge_job(job_dir), job_dir, quiet=quiet, open_report=open_report, announce=complete,
           failure=f"could not merge the ranks' records in {job_dir}")


class ViewCommand:
    """``gpuscope view RUN_DIR``: serve the run's python.prof with snakeviz on localhost and print the URL."""

    name = "view"
    help = "serve RUN_DIR/python.prof with snakeviz on localhost (no browser needed) and print its URL"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", metavar="RUN_DIR", help="a run's folder (it holds python.prof)")
        parser.add_argument("--port", type=count, default=8080,
                            help="port to serve on (default 8080; a free one is picked if it is taken)")

    def run(self, args: argparse.Namespace) -> int:
        import importlib.util
        import subprocess

        from gpuscope.collect.collectors.cprofile import PROF_FILE

        path = Path(args.run_dir) / PROF_FILE
        if not path.is_file():
            raise GpuscopeError(f"no {PROF_FILE} in {args.run_dir}")
        if importlib.util.find_spec("snakeviz") is None:
            raise GpuscopeError("snakeviz is not installed: pip install snakeviz")
        print(f"gpuscope: serving {path} with snakeviz on 127.0.0.1 (Ctrl-C stops); open the URL below", flush=True)
        server = subprocess.Popen([sys.executable, "-m", "snakeviz", "--server", "--hostname", "127.0.0.1",
                                   "--port", str(args.port), str(path.resolve())])
        try:
            return server.wait()
        except KeyboardInterrupt:
            server.terminate()
            server.wait()
            return 0


class ReportCommand:
    """``gpuscope report RUN_DIR``: re-render RUN_DIR/report.html from RUN_DIR/run.json."""

    name = "report"
    help = "re-render RUN_DIR/report.html from RUN_DIR/run.json"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", metavar="RUN_DIR", help="a run's folder (it holds run.json)")
        parser.add_argument("--open", action="store_true", help="open the report in the browser")

    def run(self, args: argparse.Namespace) -> int:
        from gpuscope.record import load_record
        from gpuscope.report import write_report

        run_dir = Path(args.run_dir)
        # a torchrun job's folder: merge whatever rank records it holds (a lost rank is named as missing)
        record = distributed.merge_job(run_dir) if distributed.is_job_dir(run_dir) else load_record(run_dir)
        try:
            path = write_report(record, run_dir)
        except GpuscopeError:
            raise
        except Exception as exc:  # one line, never a traceback: the contract's promise for gpuscope's errors
            raise GpuscopeError(f"could not render the report of {run_dir}: {type(exc).__name__}: {exc}") from None
        print(f"gpuscope: report written to {path}")
        if args.open:
            open_in_browser(path)
        return 0


class CompareCommand:
    """``gpuscope compare RUN_DIR_A RUN_DIR_B``: before/after report of two runs, in the terminal and in HTML."""

    name = "compare"
    help = "before/after report of two runs (A = before, B = after): speed-up, breakdown, verdict, recommendations"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir_a", metavar="RUN_DIR_A", help="the run before the change (it holds run.json)")
        parser.add_argument("run_dir_b", metavar="RUN_DIR_B", help="the run after the change (it holds run.json)")
        parser.add_argument("-o", "--output", metavar="OUT.html",
                            help="where the HTML page goes (default: RUN_DIR_B/compare.html)")
        parser.add_argument("--fail-if-slower", metavar="PCT", type=_percent,
                            help="a CI gate on the mean step, decided on its 95%% interval: exit with status 1 when B "
                                 "is slower than A by more than PCT percent with 95%% confidence, 0 when it is not "
                                 "slower than that with 95%% confidence, 3 when the runs cannot tell (the line says "
                                 "how many steps would, or that more would not)")
        parser.add_argument("--run-spread", metavar="PCT", type=_percent,
                            help="how much one run's mean step strays from the next run's of the same script on this "
                                 "machine, in percent (one standard deviation; default 4.5, measured on a shared "
                                 "2-core VM): the interval holds it for each run")
        parser.add_argument("--open", action="store_true", help="open the page in the browser")

    def run(self, args: argparse.Namespace) -> int:
        from gpuscope.diagnose.compare import PROCESS_SPREAD, compare
        from gpuscope.record import load_record
        from gpuscope.report.compare_text import GATE_STATUS, gate_text, summary_lines
        from gpuscope.report.render import COMPARE_HTML, write_compare

        a, b = load_record(Path(args.run_dir_a)), load_record(Path(args.run_dir_b))
        comparison = compare(a, b, PROCESS_SPREAD if args.run_spread is None else args.run_spread / 100)
        path = Path(args.output) if args.output is not None else Path(args.run_dir_b) / COMPARE_HTML
        try:
            path = write_compare(a, b, path, comparison)
        except GpuscopeError:
            raise
        except Exception as exc:  # one line, never a traceback: the contract's promise for gpuscope's errors
            raise GpuscopeError(f"could not render the comparison: {type(exc).__name__}: {exc}") from None
        for line in summary_lines(comparison, path):
            print(line)
        if args.open:
            open_in_browser(path)
        if args.fail_if_slower is None:
            return 0
        try:
            decided, line = gate_text(comparison.speedup, args.fail_if_slower)
        except ValueError as exc:
            raise GpuscopeError(f"--fail-if-slower cannot be checked: {exc}") from None
        print(f"  {line}")
        return GATE_STATUS[decided.decision]


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a percentage of 0 or more: {text}")
    return value


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
