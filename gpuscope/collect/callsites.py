"""The user's line behind a call: advice is worth most when it names the line to change.

A hook that sees a call (``zero_grad``, a synchronising op, anomaly detection switched on) walks the Python stack
outwards to the first frame of the user's own code, and counts calls per line.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
from collections import Counter
from types import FrameType

from gpuscope.record import CallSite

_LIBRARY_ROOTS = tuple(
    os.path.realpath(p) + os.sep
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
)
_GPUSCOPE_ROOT = os.path.dirname(os.path.realpath(__file__)) + os.sep


def is_user_file(file: str) -> bool:
    """Whether ``file`` is the user's code: a real file outside the stdlib, site-packages, gpuscope, and torch's
    and NumPy's own folders (which a source checkout puts outside site-packages)."""
    if not file or file.startswith("<"):
        return False  # <frozen importlib._bootstrap>, <string>: nobody's line to change
    path = os.path.realpath(file)
    if path.startswith(_GPUSCOPE_ROOT) or path.startswith(_LIBRARY_ROOTS) or path.startswith(framework_dirs()):
        return False
    return os.sep + "site-packages" + os.sep not in path and os.sep + "dist-packages" + os.sep not in path


def framework_dirs() -> tuple[str, ...]:
    """torch's and NumPy's folders, wherever they are installed; only those already imported (gpuscope never
    imports them itself)."""
    dirs = []
    for name in ("numpy", "torch"):
        file = getattr(sys.modules.get(name), "__file__", None)
        if file:
            dirs.append(os.path.dirname(os.path.realpath(file)) + os.sep)
    return tuple(dirs)


def user_frame(start: FrameType | None = None) -> FrameType | None:
    """The innermost frame of the user's code at or outside ``start`` (default: the caller's caller)."""
    frame = start if start is not None else sys._getframe(2)
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def calling_library(frame: FrameType | None, outermost: bool = False) -> str:
    """The top-level package of the code that made a call gpuscope watches for (``transformers`` building a
    DataLoader), or "" when it was the user's own code: the first frame at or outside ``frame`` that is not torch's
    (or NumPy's). ``outermost``: the library the user's code called into, the last such frame before the user's
    (``transformers`` for a Trainer whose autocast ``accelerate`` enters)."""
    frameworks = framework_dirs()
    library = ""
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        if not os.path.realpath(frame.f_code.co_filename).startswith(frameworks):
            library = str(frame.f_globals.get("__name__", "")).split(".", 1)[0]
            if not outermost:
                break
        frame = frame.f_back
    return library


class SiteCounter:
    """Calls counted per user line; ``sites()`` turns them into record entries, most frequent first."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, int, str]] = Counter()

    def count(self, frame: FrameType | None) -> None:
        """Count one call made from ``frame`` (None: from no user code, counted as an unknown site)."""
        if frame is None:
            self.counts[("", 0, "")] += 1
        else:
            self.counts[(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)] += 1

    def total(self) -> int:
        return sum(self.counts.values())

    def sites(self, limit: int = 5) -> tuple[CallSite, ...]:
        ranked = sorted(self.counts.items(), key=lambda item: (-item[1], item[0]))[:limit]
        return tuple(_call_site(file, line, function, calls) for (file, line, function), calls in ranked)


def call_site(frame: FrameType | None) -> CallSite:
    """The record entry of one call made from ``frame`` (None: from no user code, an unknown site)."""
    if frame is None:
        return _call_site("", 0, "", 1)
    return _call_site(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, 1)


def _call_site(file: str, line: int, function: str, calls: int) -> CallSite:
    from gpuscope.collect.collectors.cprofile import short_path

    return CallSite(file=short_path(file) if file else "", line=line, function=function,
                    code=linecache.getline(file, line).strip() if file else "", calls=calls)
