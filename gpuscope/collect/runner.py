"""Run the user's script or module as ``__main__``, exactly as ``python`` would, and report its exit status.

What ``python SCRIPT ARGS`` gives a script, it gets here: ``sys.argv``, ``__name__ == "__main__"``, ``__file__``
(absolute), ``sys.path[0]`` (the script's real folder; the current folder for ``-m``), the cwd, its own
standard streams, and its traceback on an uncaught exception (with gpuscope's and runpy's frames left out).
DataLoader workers under spawn or forkserver re-import the *script* as ``__mp_main__``, since ``__main__`` is
the script's module while it runs.

Exit statuses: 0; the script's ``sys.exit`` code; 1 after an uncaught exception; 130 after Ctrl-C / SIGINT;
143 after SIGTERM, which is turned into an exception so that the run's files can still be written. Once the
script has ended, a SIGTERM waits until they are (torchrun sends one to every other rank as soon as one fails, a
scheduler one before its kill).
"""

from __future__ import annotations

import functools
import os
import runpy
import signal
import sys
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from gpuscope.collect import oom
from gpuscope.collect.callsites import LAUNCH_CODES
from gpuscope.collect.fixes import TrialStop
from gpuscope.errors import GpuscopeError

EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM

_GPUSCOPE_DIR = str(Path(__file__).resolve().parent) + os.sep
_RUNPY_FILE = runpy.__file__


@dataclass(frozen=True, slots=True)
class Target:
    """What to run: a script path or a module name, and its arguments."""

    script: str | None
    module: str | None
    args: tuple[str, ...]

    @property
    def stem(self) -> str:
        """A short name for the run's folder."""
        if self.module is not None:
            return self.module.rsplit(".", 1)[-1]
        return Path(self.script or "run").stem or "run"  # type: ignore[arg-type]

    @property
    def command(self) -> tuple[str, ...]:
        """The command line as the user would type it to python."""
        head = ("-m", self.module) if self.module is not None else (self.script or "",)
        return (*head, *self.args)


def resolve_target(script: str | None, module: str | None, args: list[str]) -> Target:
    """Check that the script or module exists; a problem is a GpuscopeError (one line, exit 2)."""
    if module is not None:
        if not module or module.startswith("."):
            raise GpuscopeError(f"not a module name: {module!r}")
        try:
            spec = _find_module(module)
        except (ImportError, ValueError) as exc:
            raise GpuscopeError(f"cannot find module {module!r}: {exc}") from None
        if spec is None:
            raise GpuscopeError(f"no module named {module!r}")
        return Target(None, module, tuple(args))
    if script is None:
        raise GpuscopeError("no script given: gpuscope run SCRIPT [ARGS...] or gpuscope run -m MODULE [ARGS...]")
    path = Path(script)
    if not path.exists():
        raise GpuscopeError(f"no such script: {script}")
    if path.is_dir() and not (path / "__main__.py").exists():
        raise GpuscopeError(f"{script} is a folder with no __main__.py")
    if not path.is_dir() and not os.access(path, os.R_OK):
        raise GpuscopeError(f"cannot read script: {script}")
    return Target(script, None, tuple(args))


def _find_module(name: str) -> object:
    """Look ``name`` up as ``python -m`` would: with the current folder first on sys.path."""
    saved = list(sys.path)
    if not getattr(sys.flags, "safe_path", False):
        sys.path[:1] = [os.getcwd()]
    try:
        return find_spec(name)
    finally:
        sys.path[:] = saved


class _Terminated(BaseException):
    """Raised in the main thread on SIGTERM, so the run unwinds and its files are written."""


def run_target(target: Target, end: Callable[[int], None] | None = None) -> int:
    """Run ``target`` as ``__main__``, print its traceback if it raised, then call ``end(status)`` (which writes
    the run's files), and return its exit status. ``end`` is also called if the script ends the process with
    ``os._exit``. From the script's end until ``end`` returns, SIGTERM is held off (``_sigterm_raises``).

    A plain script's code is executed here, in this frame, so that as few of gpuscope's frames as possible lie
    under the script's: whatever walks the whole stack pays for each one (about 4% of a small step under anomaly
    detection a frame, benchmarks/stack_depth.py; anomaly detection itself leaves them out: ``LAUNCH_CODES``).
    """
    with _sigterm_raises() as script_ended:
        with _script_sys(target), _hard_exit_hook(end, script_ended):
            try:
                try:
                    if target.module is not None:
                        runpy.run_module(target.module, run_name="__main__", alter_sys=True)
                    elif (script := _main_module(target.script)) is None:  # type: ignore[arg-type]
                        runpy.run_path(os.path.abspath(target.script), run_name="__main__")  # type: ignore[arg-type]
                    else:
                        code, main = script
                        with _as_main(main):
                            exec(code, main.__dict__)
                finally:
                    script_ended()
                status = 0
            except SystemExit as exc:
                status = _exit_status(exc)
            except TrialStop:  # a trial's steps are measured: the script ended there on purpose
                status = 0
            except KeyboardInterrupt as exc:
                _print_user_traceback(exc)
                status = EXIT_SIGINT
            except _Terminated:
                status = EXIT_SIGTERM
            except BaseException as exc:
                _print_user_traceback(exc)
                oom.note(exc)  # a memory error: what was live, then the failed step's frames let go
                status = 1
        script_ended()  # (again: a SIGTERM may have come before it could run)
        if end is not None:
            end(status)
    return status


LAUNCH_CODES.add(run_target.__code__)


def _main_module(script: str) -> tuple[types.CodeType, types.ModuleType] | None:
    """A script file's code and the ``__main__`` module to execute it in (None for a folder or zip with
    ``__main__.py``, which runpy runs).

    A plain file gets the globals python gives it: absolute ``__file__``, a source loader, ``__spec__`` None,
    while ``sys.argv[0]`` stays as typed (runpy.run_path would overwrite it with the path it is given).
    """
    path = os.path.abspath(script)
    if os.path.isdir(path) or _is_zip(path):
        return None
    import builtins
    import importlib.machinery
    import io

    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __package__=None,
        __spec__=None,
        __builtins__=builtins,
        __annotations__={},
    )
    return code, main


@contextmanager
def _as_main(main: types.ModuleType) -> Iterator[None]:
    """``main`` is ``sys.modules["__main__"]`` while the script runs."""
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        yield
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _exit_status(exc: SystemExit) -> int:
    """The status python gives for ``sys.exit(code)``: None is 0, an int is itself, anything else is printed and 1."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


@contextmanager
def _script_sys(target: Target) -> Iterator[None]:
    """``sys.argv`` and ``sys.path[0]`` as python sets them for the target; restored afterwards."""
    saved_argv = sys.argv
    saved_path0 = sys.path[0] if sys.path else None
    if target.module is not None:
        sys.argv = ["-m", *target.args]  # run_module replaces argv[0] with the module's file
        path0 = os.getcwd()
    else:
        script = target.script or ""
        sys.argv = [script, *target.args]
        real = os.path.realpath(script)
        path0 = real if os.path.isdir(real) or _is_zip(real) else os.path.dirname(real)
    replace_path0 = bool(sys.path) and not getattr(sys.flags, "safe_path", False)
    if replace_path0:
        sys.path[0] = path0
    try:
        yield
    finally:
        sys.argv = saved_argv
        if replace_path0 and saved_path0 is not None and sys.path and sys.path[0] == path0:
            sys.path[0] = saved_path0


def _is_zip(path: str) -> bool:
    import zipfile

    return os.path.isfile(path) and zipfile.is_zipfile(path)


@contextmanager
def _sigterm_raises() -> Iterator[Callable[[], None]]:
    """Under python, SIGTERM ends the process at once and nothing is written. Here, while the script runs, it raises
    ``_Terminated`` in the main process's main thread instead (forked children, DataLoader workers, still die at
    once). Once the script has ended (the function yielded is called), SIGTERM is ignored until the block ends: the
    run's files are being written, and a SIGTERM that arrived while the script's own traceback was printed ended
    the process before they were (a rank whose peer was killed fails, and torchrun terminates it a moment later).
    While the script runs, gpuscope's handler is hidden from it (``_hiding``)."""
    real_signal, real_getsignal = signal.signal, signal.getsignal
    if real_getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield lambda: None  # someone chose a handler (or to ignore it): leave theirs alone
        return
    pid = os.getpid()

    def on_sigterm(signum: int, frame: types.FrameType | None) -> None:
        if os.getpid() != pid:
            real_signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise _Terminated

    ours = {on_sigterm}

    def script_ended() -> None:
        signal.signal, signal.getsignal = real_signal, real_getsignal
        if os.getpid() == pid and real_getsignal(signal.SIGTERM) is on_sigterm:
            real_signal(signal.SIGTERM, signal.SIG_IGN)
            ours.add(signal.SIG_IGN)

    real_signal(signal.SIGTERM, on_sigterm)
    signal.signal, signal.getsignal = _hiding(on_sigterm, real_signal, real_getsignal)
    try:
        yield script_ended
    finally:
        signal.signal, signal.getsignal = real_signal, real_getsignal
        if os.getpid() == pid and real_getsignal(signal.SIGTERM) in ours:
            real_signal(signal.SIGTERM, signal.SIG_DFL)


def _hiding(handler: Callable[..., None], real_signal: Callable[..., Any], real_getsignal: Callable[..., Any],
            ) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``signal.signal`` and ``signal.getsignal`` as the script sees them: ``handler`` (gpuscope's) reads as
    ``SIG_DFL``, what python would show. Libraries decide by it: PyTorch Lightning, finding a SIGTERM handler, calls
    it after its own, so a SIGTERM that python's run answered with Lightning's graceful stop (exit status 0) ended
    gpuscope's with 143."""

    @functools.wraps(real_getsignal)
    def getsignal(signalnum: int) -> Any:
        current = real_getsignal(signalnum)
        return signal.SIG_DFL if current is handler else current

    @functools.wraps(real_signal)
    def set_handler(signalnum: int, new: Any) -> Any:
        previous = real_signal(signalnum, new)
        return signal.SIG_DFL if previous is handler else previous

    return set_handler, getsignal


@contextmanager
def _hard_exit_hook(before: Callable[[int], None] | None, script_ended: Callable[[], None]) -> Iterator[None]:
    """Let ``os._exit`` from the script's own process write the run's files before it ends the process."""
    if before is None:
        yield
        return
    real_exit = os._exit
    pid = os.getpid()

    def _exit(status: int) -> None:  # same name, so tracebacks read naturally
        if os.getpid() == pid:
            try:
                script_ended()
                before(status)
            except BaseException:
                pass
        real_exit(status)

    os._exit = _exit  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit = real_exit


def _print_user_traceback(exc: BaseException) -> None:
    """Print the exception as python would for the script: through ``sys.excepthook``, with gpuscope's and
    runpy's own frames removed from its traceback."""
    tb = _user_frames(exc.__traceback__)
    exc.__traceback__ = tb  # the default hook prints the exception's own traceback, not its argument
    try:
        sys.excepthook(type(exc), exc, tb)
    except Exception:
        traceback.print_exception(type(exc), exc, tb)


def _user_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    frames = []
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not (filename.startswith(_GPUSCOPE_DIR) or filename == _RUNPY_FILE):
            frames.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for frame_tb in reversed(frames):
        rebuilt = types.TracebackType(rebuilt, frame_tb.tb_frame, frame_tb.tb_lasti, frame_tb.tb_lineno)
    return rebuilt
