"""gpuscope view: python.prof served by snakeviz on localhost, for machines with no browser."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import child_env, free_port, run_gpuscope

pytestmark = pytest.mark.slow


def test_view_serves_python_prof_on_localhost_and_prints_the_url(tmp_path: Path) -> None:
    # given a run folder with a python.prof
    script = tmp_path / "work.py"
    script.write_text("import math\nprint(sum(math.sqrt(i) for i in range(100000)) > 0)\n")
    run_dir = tmp_path / "run"
    run = run_gpuscope(["run", "-q", "-o", str(run_dir), "--no-probes", str(script)], tmp_path, preloaded=True)
    assert run.returncode == 0
    # when it is viewed
    server = subprocess.Popen([sys.executable, "-m", "gpuscope", "view", str(run_dir), "--port", str(free_port())],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())
    try:
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = server.stdout.readline()  # type: ignore[union-attr]
            match = re.search(r"http://127\.0\.0\.1:\d+/snakeviz/\S+", line)
            url = match.group(0) if match else None
        # then the printed URL answers with snakeviz's page for that profile
        assert url is not None
        with urllib.request.urlopen(url, timeout=10) as response:
            page = response.read().decode()
        assert response.status == 200
        assert "snakeviz" in page.lower()
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=10)


def test_view_of_a_folder_without_python_prof_is_a_one_line_error(tmp_path: Path) -> None:
    result = run_gpuscope(["view", str(tmp_path)], tmp_path)
    assert result.returncode == 2
    assert result.stderr == f"gpuscope: error: no python.prof in {tmp_path}\n"
