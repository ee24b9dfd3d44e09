"""Version strings as numbers, for the collectors and the analysis alike (neither imports the other)."""

from __future__ import annotations

import re


def parse_version(text: str | None) -> tuple[int, int] | None:
    """``"2.4.1+cu121"`` -> (2, 4); ``"8.0"`` -> (8, 0); None when there is no leading ``major.minor``."""
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None
