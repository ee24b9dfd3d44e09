"""The README's two commands are the ones CI runs, word for word."""

from __future__ import annotations

import re

from conftest import ROOT


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:sh|bash|console)\n(.*?)```", text, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.startswith("pip install")]


def test_ci_runs_the_readmes_install_and_test_commands_verbatim() -> None:
    commands = readme_commands()
    assert any("gpuscope run sample_workloads/" in c for c in commands)
    assert any("pytest" in c for c in commands)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in commands:
        assert command in ci, f"CI does not run the README's command: {command}"
