"""``gpuscope view RUN_DIR``: the run's cProfile in snakeviz, served on localhost."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuscope.errors import GpuscopeError
from gpuscope.options import count


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
