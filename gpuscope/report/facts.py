"""Small, pure helpers that turn parts of the record into what the templates show: the masked command line,
a recommendation's fix as diff lines, the rules not checked, the artifacts, and number formats."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuscope.record import RunRecord

SECRET_WORDS = ("token", "key", "secret", "password", "passwd", "auth", "credential")
"""An argument whose name holds one of these has its value masked in the report."""
MASK = "*****"


def _is_secret(name: str) -> bool:
    name = name.lower()
    return any(word in name for word in SECRET_WORDS)


def mask_command(command: tuple[str, ...] | list[str]) -> list[str]:
    """The command with secret values masked: ``--api-key=v``, ``--api-key v`` and ``api_key=v`` (Hydra style)
    become ``--api-key=*****``, ``--api-key *****`` and ``api_key=*****``. The script itself is never masked."""
    out: list[str] = []
    mask_next = False
    for i, token in enumerate(command):
        if mask_next:
            mask_next = False
            if not token.startswith("--"):
                out.append(MASK)
                continue
        if i > 0 and "=" in token:
            name, _ = token.split("=", 1)
            if _is_secret(name.lstrip("-")) and " " not in name:
                out.append(f"{name}={MASK}")
                continue
        elif i > 0 and token.startswith("-") and _is_secret(token.lstrip("-")):
            mask_next = True
        out.append(token)
    return out


@dataclass(frozen=True, slots=True)
class DiffLine:
    """One line of a fix shown as a diff: ``kind`` is ``loc`` (where), ``del`` (the line as it is), ``add``
    (what to write) or ``note`` (advice in words)."""

    kind: str
    text: str


_LOCATED = re.compile(r"^(?P<loc>\S+:\d+) `(?P<old>[^`]+)`: (?P<new>.+)$", re.S)
_CODE_LIKE = re.compile(r"^[\w.]+\(|=|^(torch|nn|model|optimizer)\.")


def fix_lines(fix: str) -> list[DiffLine]:
    """A recommendation's ``fix`` as a short diff. A fix that names a line (``file.py:12 `old`: new``) shows
    the old line removed and the new code added; advice in words becomes a ``#`` note; anything else is added code."""
    match = _LOCATED.match(fix.strip())
    if match is None:
        return [DiffLine("add", line) for line in fix.strip().splitlines() if line.strip()]
    lines = [DiffLine("loc", match["loc"]), DiffLine("del", match["old"])]
    new = match["new"].strip()
    lines.append(DiffLine("add", new) if _CODE_LIKE.search(new) else DiffLine("note", new))
    return lines


@dataclass(frozen=True, slots=True)
class Artifact:
    """A file of the run's folder and how to open it."""

    name: str
    what: str
    how: tuple[str, ...]


def artifacts(record: RunRecord) -> list[Artifact]:
    """The run's files that the record says were written, with the commands that open them."""
    found = [Artifact("run.json", "the run's record and verdict (schema gpuscope.run/1)",
                      ("gpuscope report RUN_DIR  # re-renders this page",))]
    if record.python_profile is not None:
        found.append(Artifact("python.prof", "cProfile statistics (pstats format)",
                              ("snakeviz python.prof", "gpuscope view RUN_DIR  # serves it on localhost")))
    if record.op_profile is not None:
        found.append(Artifact("trace.json", "torch.profiler trace of a few steady-state steps",
                              ("open it in Perfetto (ui.perfetto.dev) or chrome://tracing",)))
    return found


def not_checked(record: RunRecord) -> list[tuple[str, str]]:
    """(rule id, reason) of every rule that could not be checked, in id order."""
    return [(rule, check.reason or "an input it needs was not collected")
            for rule, check in sorted(record.checks.items()) if check.status == "not-checked"]


def clear_checks(record: RunRecord) -> list[str]:
    """Ids of the rules checked with nothing found."""
    return [rule for rule, check in sorted(record.checks.items()) if check.status == "clear"]


def window_text(first: int | None, last: int | None, startup: bool) -> str:
    """A profiling window in words: "start-up and steps 0-4"."""
    parts = ["start-up"] if startup else []
    if first is not None and last is not None:
        parts.append(f"step {first}" if first == last else f"steps {first}-{last}")
    return " and ".join(parts) or "no step"


def seconds(value: float | None) -> str:
    """A duration with a unit that suits it: "3.2 us", "675.9 ms", "14.4 s"."""
    if value is None:
        return "n/a"
    if value == 0:
        return "0 ms"
    if abs(value) < 1e-3:
        return f"{value * 1e6:.1f} \u00b5s"
    if abs(value) < 1:
        return f"{value * 1e3:.1f} ms"
    return f"{value:.2f} s"


def percent(value: float | None, digits: int = 0) -> str:
    """A 0..1 fraction as a percentage."""
    return "n/a" if value is None else f"{value * 100:.{digits}f}%"


def size(value: int | float | None) -> str:
    """Bytes in binary units: "445 MiB"."""
    if value is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}" if unit == "GiB" else f"{value / scale:.0f} {unit}"
    return f"{value:.0f} B"
