"""What every record gpuscope writes must hold, whatever the run: no share of a step above the whole step, no
negative time. ``load_run`` (conftest) checks each run.json a test reads with it, so every record the slow tier
writes and reads is walked; tests/unit/test_record_figures.py walks the recorded ones."""

from __future__ import annotations

from typing import Any

SHARE_KEYS = ("share", "fraction", "overlap", "late_share", "cause_share", "busy", "mfu")
"""Keys whose value is a share of something (0..1): named so, or ending so."""
SIGNED_SECONDS = frozenset({"late_s"})
"""Seconds that may be negative by their meaning: none in a record (the straggler's lateness is positive)."""
SLACK = 1e-6


def figure_errors(data: Any, where: str = "run") -> list[str]:
    """Every share of a step above 1 (or below 0) and every negative number of seconds in ``data`` (run.json,
    parsed), each as ``path: value``."""
    errors: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{where}.{key}"
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if key.endswith("_s") and value < -SLACK:
                    errors.append(f"{path}: {value} (negative time)")
                if (key in SHARE_KEYS or key.endswith(("_share", "_fraction"))) and not -SLACK <= value <= 1 + SLACK:
                    errors.append(f"{path}: {value} (a share outside 0..1)")
            elif key == "breakdown" and isinstance(value, dict):
                errors.extend(f"{path}.{k}: {v} (a share outside 0..1)" for k, v in value.items()
                              if isinstance(v, (int, float)) and not -SLACK <= v <= 1 + SLACK)
            else:
                errors.extend(figure_errors(value, path))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            errors.extend(figure_errors(value, f"{where}[{i}]"))
    return errors
