"""``gpuscope run``: the script under the collectors, exactly as python would run it; a torchrun job of N ranks
(``--nproc-per-node``); the trials of ``--try`` after it; and, run by gpuscope itself, one trial's child run."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuscope import distributed, sentinel
from gpuscope.commands import ScriptRun
from gpuscope.errors import GpuscopeError
from gpuscope.finish import finish, finish_session, hand_over_session, open_in_browser
from gpuscope.options import RunOptions, positive_float, positive_int
from gpuscope.rundirs import new_run_dir
from gpuscope.trials import APPLY_FIX, DEFAULT_TRY_BUDGET_S, STOP_AFTER, requested

if TYPE_CHECKING:
    from gpuscope.collect.fixes import Applied, StopAfter
    from gpuscope.collect.runner import Target
    from gpuscope.record import RunRecord
    from gpuscope.session import Session


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
    browser once every rank is in, from one rank (``only_if_complete``), or from the launcher whatever is in."""

    def complete(record: RunRecord) -> bool:
        return not only_if_complete or (not record.missing_ranks and len(record.ranks) >= 2
                                        and distributed.claim_summary(job_dir))

    finish(lambda: distributed.merge_job(job_dir), job_dir, quiet=quiet, open_report=open_report, announce=complete,
           failure=f"could not merge the ranks' records in {job_dir}")
