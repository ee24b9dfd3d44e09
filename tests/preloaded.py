"""``python -m MODULE ARGS`` and ``python SCRIPT ARGS`` started from a python that has already imported torch: the
slow tier's runs without the 4 s each real start pays on the 2-core CI machine (2 s to import torch, 2 s more for
the torch._dynamo import that a script's first optimizer triggers).

Run as a script, this file is the server: it imports torch once, then forks a process for each request, which
takes the request's folder, environment, arguments and standard streams, and runs the module or script as
``python`` does (``sys.argv``, ``sys.path[0]``, ``__main__``), up to the interpreter's own exit (atexit handlers,
exit status). Imported, it is the client (``Preloaded``).

What differs from a real start, and so stays with real processes: torch is imported before gpuscope starts (the
import watch fires at once instead of when the script imports torch), environment variables torch reads at import
take the server's values (OMP_NUM_THREADS excepted: it is applied by hand), and the process's command line is the
server's. Tests of the process itself (exit statuses, signals, what the script sees, DataLoader start methods,
framework scripts, ranks) start real ones.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import json
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import Any


class Preloaded:
    """The client: starts the server on first use; safe to call from several threads at once."""

    def __init__(self, env: dict[str, str]) -> None:
        self._env = env
        self._server: subprocess.Popen[bytes] | None = None
        self._folder = Path()
        self._starting = threading.Lock()

    def _start(self) -> None:
        with self._starting:
            if self._server is not None:
                return
            self._folder = Path(tempfile.mkdtemp(prefix="gpuscope-preloaded-"))
            # The server ends when its stdin closes: when this process ends, however it ends.
            self._server = subprocess.Popen([sys.executable, __file__, str(self._folder / "server")],
                                            env=self._env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert self._server.stdout is not None
            ready = self._server.stdout.readline()
            assert ready == b"ready\n", f"the preloaded python did not start: {ready!r}"

    def run(self, args: list[str], cwd: Path, env: dict[str, str], timeout: float,
            input: str | None = None) -> tuple[subprocess.CompletedProcess[str], int]:
        """``python ARGS`` (``-m MODULE ...`` or ``SCRIPT ...``) in ``cwd``: its outcome, as subprocess.run with
        capture_output and text gives it, and its process id (its session's id too: every process it started
        is in that session unless it left it)."""
        self._start()
        streams = Path(tempfile.mkdtemp(dir=self._folder))
        (streams / "stdin").write_text(input or "")
        request = {"args": args, "cwd": str(cwd), "env": env, "streams": str(streams)}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(self._folder / "server"))
            conn.sendall(json.dumps(request).encode() + b"\n")
            replies = conn.makefile("rb", buffering=0)  # unbuffered: select() sees what is left to read
            pid = int(replies.readline())
            if not select.select([conn], [], [], timeout)[0]:
                os.killpg(pid, signal.SIGKILL)
                replies.readline()
                raise subprocess.TimeoutExpired([sys.executable, *args], timeout, *_read(streams))
            status = int(replies.readline())
        stdout, stderr = _read(streams)
        return subprocess.CompletedProcess([sys.executable, *args], status, stdout, stderr), pid


def _read(streams: Path) -> tuple[str, str]:
    return ((streams / "stdout").read_text(errors="replace"), (streams / "stderr").read_text(errors="replace"))


# -- the server ---------------------------------------------------------------------------------------------------

def _preload() -> None:
    import torch

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # imports what a first optimizer imports


def serve(address: str) -> dict[str, Any]:
    """Answer requests until the client has gone; returns only in a forked process, with the request it is to run."""
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the handlers below are reaped by the kernel
    print("ready", flush=True)
    while True:
        if sys.stdin in select.select([listener, sys.stdin], [], [])[0]:  # the client has gone
            shutil.rmtree(Path(address).parent, ignore_errors=True)
            sys.exit(0)
        conn, _ = listener.accept()
        if os.fork() == 0:  # the request's handler: runs it in a process of its own and reports its status
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            request = json.loads(conn.makefile("r").readline())
            pid = os.fork()
            if pid == 0:
                conn.close()
                return request
            conn.sendall(f"{pid}\n".encode())
            _, status = os.waitpid(pid, 0)
            conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            os._exit(0)
        conn.close()


def become(request: dict[str, Any]) -> None:
    """Turn this process into ``python ARGS`` as the request describes, and run it."""
    os.setsid()  # a process group of its own: a timeout kills it with everything it started
    for name in ("SIGINT", "SIGTERM", "SIGCHLD"):
        signal.signal(getattr(signal, name), signal.default_int_handler if name == "SIGINT" else signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    streams = Path(request["streams"])
    for fd, name, mode in ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY | os.O_CREAT),
                           (2, "stderr", os.O_WRONLY | os.O_CREAT)):
        os.dup2(os.open(streams / name, mode, 0o600), fd)
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = sys.__stdin__ = open(0, closefd=False, encoding="utf-8")
    sys.stdout = sys.__stdout__ = open(1, "w", closefd=False, encoding="utf-8", buffering=1 if unbuffered else -1)
    sys.stderr = sys.__stderr__ = open(2, "w", closefd=False, encoding="utf-8", errors="backslashreplace",
                                       buffering=1)
    if unbuffered:
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    if "OMP_NUM_THREADS" in os.environ:  # torch took its thread count from it at import: from the server's
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    args = request["args"]
    if args[0] == "-m":
        sys.path[0] = os.getcwd()  # as ``python -m`` sets it
        sys.argv = ["-m", *args[2:]]
        runpy._run_module_as_main(args[1])  # type: ignore[attr-defined]  # what ``python -m`` calls
    else:
        _run_script(args)


def _run_script(args: list[str]) -> None:
    """``python SCRIPT ARGS``: the script's folder first on sys.path, and its code run in a new ``__main__``."""
    path = os.path.abspath(args[0])
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    sys.argv = list(args)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __builtins__=builtins, __cached__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    code = compile(Path(path).read_bytes(), path, "exec", dont_inherit=True)  # not this file's __future__ flags
    try:
        exec(code, main.__dict__)
    except Exception as error:  # its traceback from the script's own frame on, as python prints it
        error.with_traceback(error.__traceback__.tb_next if error.__traceback__ else None)
        sys.excepthook(type(error), error, error.__traceback__)
        sys.exit(1)


if __name__ == "__main__":
    become(serve(sys.argv[1]))
    sys.exit(0)
