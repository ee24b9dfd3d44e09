"""The templates ship in a built wheel (as gpuscope/_templates), and an installed gpuscope renders from there."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, child_env

pytestmark = pytest.mark.slow


def test_a_built_wheel_holds_the_templates_and_renders_from_them(tmp_path: Path) -> None:
    # given a wheel built from this tree
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("gpuscope-*.whl")
    # then every template is in it, under gpuscope/_templates
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    templates = sorted(p.name for p in (ROOT / "reports" / "templates").iterdir() if p.is_file())
    assert templates
    for name in templates:
        assert f"gpuscope/_templates/{name}" in names
    assert "gpuscope/report/render.py" in names
    # and the installed package finds and renders them, not the repository's copy
    code = ("from gpuscope.report import template_dir, render_report; from gpuscope.record import RunRecord; "
            "print(template_dir()); html = render_report(RunRecord()); print(len(html) > 1_000_000)")
    env = child_env()
    env["PYTHONPATH"] = str(tmp_path / "site")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    where, rendered = result.stdout.split()
    assert Path(where) == tmp_path / "site" / "gpuscope" / "_templates"
    assert rendered == "True"
