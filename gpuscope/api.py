"""``gpuscope.profile()``: the profiler inside a script or a notebook, with the same collectors, record, diagnosis
and report as ``gpuscope run``.

    with gpuscope.profile(output="runs/exp1") as prof:
        train()
    prof.verdict.bound, prof.report_path
    prof                # in Jupyter: the report, inline

or ``prof = gpuscope.profile(); prof.start(); ...; prof.stop()``. The keyword arguments are ``gpuscope run``'s
options (``gpuscope.options.RunOptions``): ``output``, ``cprofile_steps``, ``cprofile_all``, ``trace_steps``,
``trace_max_mb``, ``probe_loader``, ``probes``, ``skip_steps``, ``profile_steps`` (or ``steps``), with the same
defaults. One profile at a time per process (a second one inside the first is a clear error); every hook the
collectors set is removed when it stops, also when the block raises, so a kernel can profile again and again.

``gpuscope.profile(steps=N)`` measures N steps, then writes the record and report and takes every collector out
while the block goes on; the record is complete (``prof.record``) from then, and gets the exit status at the end.
"""

from __future__ import annotations

import dataclasses
import html
import sys
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from gpuscope.collect import oom
from gpuscope.errors import GpuscopeError
from gpuscope.options import RunOptions

if TYPE_CHECKING:
    from gpuscope.record import RunRecord, Verdict
    from gpuscope.session import Session

IFRAME_HEIGHT_PX = 900


class ProfileError(GpuscopeError):
    """A profile used out of order (started twice, read before it stopped, nested in another one)."""


class Profile:
    """One profiled stretch of the user's code; see the module's documentation."""

    def __init__(self, output: str | Path | None = None, *, quiet: bool | None = None, steps: int | None = None,
                 **options: Any) -> None:
        """``output``: the run's folder (default ``./gpuscope-runs/<name>-<timestamp>/``, as the CLI's); ``options``:
        the other fields of ``RunOptions`` by name, ``gpuscope run``'s options with ``_`` for ``-``
        (``cprofile_steps=None`` means ``cprofile_all=True``; ``probes=False`` is ``--no-probes``).
        ``quiet``: print no summary at the end; by default the summary goes to stderr outside notebooks, and a
        notebook shows the report inline instead. ``steps``: ``profile_steps``, shorter."""
        if steps is not None:
            if "profile_steps" in options:
                raise TypeError("gpuscope.profile() takes steps or profile_steps, not both")
            options["profile_steps"] = steps
        names = [f.name for f in dataclasses.fields(RunOptions)]
        unknown = sorted(set(options) - set(names))
        if unknown:
            raise TypeError(f"gpuscope.profile() has no option {', '.join(unknown)}; its options: "
                            f"{', '.join(names)}, steps, quiet")
        self.options = RunOptions(output=output, **options)
        self.quiet = _in_notebook() if quiet is None else quiet
        self.run_dir: Path | None = None
        self.record: RunRecord | None = None
        self.report_path: Path | None = None
        """report.html once stopped (None if it could not be written: the reason was printed)."""
        self._session: Session | None = None
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> Profile:
        """Start the collectors; raises ProfileError if this profile already ran or another is running."""
        from gpuscope.collect.collectors import default_collectors
        from gpuscope.rundirs import new_run_dir
        from gpuscope.session import Session, active_session

        if self._session is not None:
            raise ProfileError("this gpuscope profile has already been started; create a new one with gpuscope.profile()")
        if active_session() is not None:
            raise ProfileError("another gpuscope profile is already running in this process (profiles cannot nest; "
                               "under `gpuscope run` the whole script is already profiled)")
        name, command = _caller()
        self.run_dir = new_run_dir(self.options.output, name)
        session = Session(self.run_dir, command, default_collectors(self.options.collect_options()),
                          skip_steps=self.options.skip_steps, profile_steps=self.options.profile_steps)
        session.on_hand_over = self._hand_over
        session.start()
        self._session = session
        return self

    def _hand_over(self, session: Session) -> None:
        """The profiled steps are over (``steps=N``): the record and report now; the block goes on."""
        from gpuscope.finish import hand_over_session

        finished = hand_over_session(session, quiet=self.quiet)
        self.record, self.report_path = finished.record, finished.report_path

    def step(self) -> None:
        """Mark the end of one step, as ``gpuscope.step()`` does (only needed without ``optimizer.step()``)."""
        if self._session is not None and self.record is None:
            self._session.mark_step()

    def stop(self, exit_status: int = 0) -> RunRecord | None:
        """Stop the collectors, diagnose, write run.json and report.html; ``exit_status`` is recorded as the
        run's (1 when the profiled code raised). Calling it again returns the same record. None when the run's
        files could not be written: the reason is one line on stderr, and nothing is raised over the code's own
        outcome."""
        if self._session is None:
            raise ProfileError("this gpuscope profile was never started: call start() first, or use it in a with block")
        if self._stopped:
            return self.record
        from gpuscope.finish import finish_session

        self._stopped = True
        finished = finish_session(self._session, exit_status, quiet=self.quiet)
        self.record, self.report_path = finished.record, finished.report_path
        return self.record

    def __enter__(self) -> Profile:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            oom.note(exc, release=False)  # a memory error: what was live; its frames stay for the user's debugger
        self.stop(_exit_status(exc))  # the exception itself goes on to the caller, untouched

    # -- results -------------------------------------------------------------------------------------------
    @property
    def verdict(self) -> Verdict:
        """The diagnosis (``run.json``'s ``verdict``), once stopped."""
        return self._finished().verdict

    def summary(self) -> None:
        """Print the terminal summary: verdict, evidence, steps, top recommendations, where the files are."""
        from gpuscope.report.summary import summary_lines

        record = self._finished()
        print("\n".join(summary_lines(record, self.run_dir, self.report_path)))  # type: ignore[arg-type]

    def _finished(self) -> RunRecord:
        if self.record is None and self._stopped:
            raise ProfileError(f"the profile's run could not be recorded in {self.run_dir} (the reason was printed "
                               "when it stopped)")
        if self.record is None:
            raise ProfileError("the profile has not stopped yet: its results exist after the with block (or stop())")
        return self.record

    def _repr_html_(self) -> str:
        """The report, inline in Jupyter, inside an iframe so its styles and scripts cannot touch the notebook's
        (``sandbox`` without ``allow-same-origin`` gives it an origin of its own)."""
        if self.record is None:
            return f"<p>gpuscope profile: {self._state()}</p>"
        if self.report_path is None or not self.report_path.is_file():
            from gpuscope.report.summary import summary_lines

            lines = summary_lines(self.record, self.run_dir, None)  # type: ignore[arg-type]
            return f"<pre>{html.escape(chr(10).join(lines))}</pre>"
        page = self.report_path.read_text(encoding="utf-8")
        return (f'<iframe srcdoc="{html.escape(page, quote=True)}" sandbox="allow-scripts allow-popups" '
                f'style="width:100%;height:{IFRAME_HEIGHT_PX}px;border:1px solid #ddd" '
                f'title="gpuscope report: {html.escape(str(self.report_path), quote=True)}"></iframe>')

    def __repr__(self) -> str:
        if self.record is None:
            return f"<gpuscope.Profile {self._state()}>"
        return f"<gpuscope.Profile {self.record.verdict.bound}: {self.report_path or self.run_dir}>"

    def _state(self) -> str:
        """Where a profile without a record stands."""
        if self._stopped:
            return "stopped, not recorded (the reason was printed)"
        return "running" if self._session is not None else "not started"


def profile(output: str | Path | None = None, *, quiet: bool | None = None, **options: Any) -> Profile:
    """A profile of the code that follows: ``with gpuscope.profile() as prof: ...``; ``options`` are
    ``gpuscope run``'s (``gpuscope.options.RunOptions``), e.g. ``trace_steps=0, probes=False`` (see ``Profile``)."""
    return Profile(output, quiet=quiet, **options)


def _exit_status(exc: BaseException | None) -> int:
    """The status ``python`` would end with had ``exc`` reached the top."""
    if exc is None:
        return 0
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if isinstance(exc, KeyboardInterrupt):
        from gpuscope.collect.runner import EXIT_SIGINT

        return EXIT_SIGINT
    return 1


def _in_notebook() -> bool:
    """True inside an IPython kernel (Jupyter), where the report shows inline."""
    shell = sys.modules.get("IPython")
    get = getattr(shell, "get_ipython", None)
    return get is not None and type(get()).__name__ == "ZMQInteractiveShell"


def _caller() -> tuple[str, tuple[str, ...]]:
    """A name for the run's folder and the command the record names: the script being run (``sys.argv``), or
    ``notebook`` in a Jupyter kernel."""
    if _in_notebook():
        return "notebook", ("notebook",)
    script = sys.argv[0] if sys.argv else ""
    return (Path(script).stem if script.endswith(".py") else "profile"), tuple(sys.argv) or ("profile",)
