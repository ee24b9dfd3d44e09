"""The options of a profiled run, declared once: ``gpuscope run``'s command line, ``gpuscope.profile(...)``'s keyword
arguments and the ``%%gpuscope`` cell magic all read ``RunOptions``, with the same names, defaults and help.

Each field carries its command-line spelling, type and help text (``dataclasses.field`` metadata);
``RunOptions.add_arguments(parser)`` puts them on an argparse parser, ``RunOptions.from_args(args)`` reads them back,
and ``collect_options()`` turns them into the collectors' ``CollectOptions``.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from gpuscope.collect.collectors import CollectOptions
from gpuscope.errors import GpuscopeError

MB = 2**20
_COLLECT = CollectOptions()
"""The collectors' own defaults, which are the options' defaults."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage problem is a one-line GpuscopeError rather than usage text and an exit."""

    def error(self, message: str) -> NoReturn:
        raise GpuscopeError(message)


def count(text: str) -> int:
    """An argparse type: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number, 1 or more."""
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more: {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0: {text}")
    return value


def _option(default: Any, *flags: str, help: str, **argparse_kwargs: Any) -> Any:
    """A field of ``RunOptions`` with its command-line spelling (``flags``), help and argparse settings."""
    return field(default=default, metadata={"flags": flags, "help": help, **argparse_kwargs})


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What the user chose for one profiled run; each field is also ``gpuscope run``'s option of that name."""

    output: str | Path | None = _option(
        None, "-o", "--output", metavar="DIR",
        help="where the run's files go (default: ./gpuscope-runs/<script>-<timestamp>/)")
    cprofile_steps: int | None = _option(
        _COLLECT.cprofile_steps, "--cprofile-steps", metavar="N", type=count,
        help="steps cProfile covers after the start-up (default %(default)s); profiled steps are left out of the "
             "step figures")
    """None (in ``gpuscope.profile()``) means the whole run, as ``cprofile_all`` does."""
    cprofile_all: bool = _option(
        False, "--cprofile-all", action="store_true",
        help="profile the whole run with cProfile (slows Python-heavy loops)")
    trace_steps: int = _option(
        _COLLECT.trace_steps, "--trace-steps", metavar="N", type=count,
        help="steps torch.profiler records into trace.json (default %(default)s; 0: none)")
    trace_max_mb: float = _option(
        _COLLECT.trace_max_bytes / MB, "--trace-max-mb", metavar="MB", type=positive_float,
        help="trace.json's size cap in MB (default %(default)g); detail is dropped to meet it")
    probe_loader: bool = _option(
        False, "--probe-loader", action="store_true",
        help="after the run, time the slowest DataLoader with 0, 1, 2, 4... workers (a few seconds) even when data "
             "wait was under 5%% of the step (above, it always runs)")
    probes: bool = _option(
        True, "--no-probes", action="store_false",
        help="skip the post-run probes (data probe, loader probe, optimizer probe, per-op cost calibration, CPU "
             "matmul peak): a faster exit with the timings only; the CPU verdict then cannot tell launch- from "
             "compute-bound")

    skip_steps: int = _option(
        0, "--skip-steps", metavar="K", type=count,
        help="run the first K steps unmeasured (a learning-rate warm-up, a first epoch that fills caches): every "
             "profiler's window comes after them")
    profile_steps: int | None = _option(
        None, "--profile-steps", metavar="N", type=positive_int,
        help="measure N steps (after --skip-steps), then write run.json and report.html at once and take every "
             "collector out: the rest of the run goes at full speed; at its end run.json gets the exit status. N too "
             "few for the profilers' windows at their full length gets them one step each")

    def __post_init__(self) -> None:
        # the command line checks its text with the argparse types; keyword arguments are checked here
        for name in ("cprofile_steps", "trace_steps", "skip_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise GpuscopeError(f"{name} must be a whole number, 0 or more: {value!r}")
        if not isinstance(self.trace_max_mb, (int, float)) or not self.trace_max_mb > 0:
            raise GpuscopeError(f"trace_max_mb must be a number above 0: {self.trace_max_mb!r}")
        if self.profile_steps is not None:
            if not isinstance(self.profile_steps, int) or isinstance(self.profile_steps, bool) or self.profile_steps < 1:
                raise GpuscopeError(f"profile_steps must be a whole number, 1 or more: {self.profile_steps!r}")
            needed = self.fewest_profile_steps(compact=True)
            if self.profile_steps < needed:
                untraced = dataclasses.replace(self, trace_steps=0, profile_steps=None).fewest_profile_steps(
                    compact=True)
                fewer = f" ({untraced} with --trace-steps 0)" if untraced < needed else ""
                raise GpuscopeError(
                    f"--profile-steps {self.profile_steps} is too few: the profilers' windows take {needed} at one "
                    f"step each{fewer}; "
                    f"{self.fewest_profile_steps()} hold them at full length and the steady steps the figures need")

    def fewest_profile_steps(self, memory: bool = False, compact: bool = False) -> int:
        """The fewest ``profile_steps`` that hold every window (on a CUDA run, which has the most) and
        ``thresholds.MIN_STEADY_STEPS`` clean steps; the memory window among them with ``memory`` (without it, where
        they are too few to hold it: it is left out, not the run refused). ``compact``: the fewest that hold every
        window at one step each (``schedule.compact_plan``), and no steady step: the verdict then comes from the
        steps there are."""
        from gpuscope.diagnose.thresholds import MIN_STEADY_STEPS
        from gpuscope.collect.collectors import plan_windows

        plan = plan_windows(dataclasses.replace(self._collect_options(), profile_steps=None, memory_window=memory,
                                                compact_windows=compact))
        return max(plan.end(cuda=True) - self.skip_steps, 0) + (0 if compact else MIN_STEADY_STEPS)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add every option to ``parser`` (``--no-probes`` sets ``probes``; each dest is the field's name)."""
        for f in dataclasses.fields(cls):
            settings = dict(f.metadata)
            flags = settings.pop("flags")
            parser.add_argument(*flags, dest=f.name, default=f.default, **settings)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunOptions:
        """The options a parser set up by ``add_arguments`` parsed."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def parse(cls, line: str, prog: str) -> RunOptions:
        """The options in one line of text, as a shell would split it (the cell magic's line); a bad option is a
        GpuscopeError."""
        import shlex

        parser = Parser(prog=prog, add_help=False)
        cls.add_arguments(parser)
        try:
            tokens = shlex.split(line)
        except ValueError as exc:
            raise GpuscopeError(f"cannot read the options: {exc}") from None
        return cls.from_args(parser.parse_args(tokens))

    def collect_options(self) -> CollectOptions:
        """The collectors' options for these choices: the memory window left out where ``--profile-steps`` is too few
        to hold it beside the other windows and the steady steps."""
        fits = self.profile_steps is None or self.profile_steps >= self.fewest_profile_steps(memory=True)
        compact = self.profile_steps is not None and self.profile_steps < self.fewest_profile_steps()
        return dataclasses.replace(self._collect_options(), memory_window=fits, compact_windows=compact)

    def _collect_options(self) -> CollectOptions:
        return CollectOptions(
            cprofile_steps=None if self.cprofile_all else self.cprofile_steps,
            trace_steps=self.trace_steps,
            trace_max_bytes=int(self.trace_max_mb * MB),
            probe_loader=self.probe_loader,
            probes=self.probes,
            skip_steps=self.skip_steps,
            profile_steps=self.profile_steps,
        )


__all__ = ["Parser", "RunOptions", "count", "positive_float", "positive_int"]
