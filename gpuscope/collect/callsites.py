"""The user's line behind a call: advice is worth most when it names the line to change.

A hook that sees a call (``zero_grad``, a synchronising op, anomaly detection switched on) walks the Python stack
outwards to the first frame of the user's own code, and counts calls per line.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import traceback
from collections import Counter
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

from gpuscope.record import CallSite

_LIBRARY_ROOTS = tuple(
    os.path.realpath(p) + os.sep
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
)
_STDLIB_ROOT = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
_PACKAGE_DIRS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_GPUSCOPE_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
_GPUSCOPE_DIRS = tuple({_GPUSCOPE_ROOT, os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep})
"""gpuscope's package folder, resolved and as imported (a code object's file is named as it was imported)."""
LAUNCH_CODES: set[CodeType] = set()
"""The code of the functions that run the user's script (``runner.run_target``): every frame outside one of them
is gpuscope's launch (the console script, ``cli.main``), none of the script's."""


_USER_FILES: dict[str, bool] = {}
"""``is_user_file``'s answers by file name: a hook that looks for the user's line walks a few frames at each call it
sees, and resolving a path takes a system call per folder in it (100 us a frame where torch.distributions built a
policy's distribution at every action)."""
_FRAMEWORK_DIRS: tuple[tuple[int, int], tuple[str, ...]] = ((0, 0), ())


def is_user_file(file: str) -> bool:
    """Whether ``file`` is the user's code: a real file outside the stdlib, site-packages, gpuscope, and torch's
    and NumPy's own folders (which a source checkout puts outside site-packages)."""
    if not file or file.startswith("<"):
        return False  # <frozen importlib._bootstrap>, <string>: nobody's line to change
    frameworks = framework_dirs()  # (first: where it changes, the answers so far are forgotten)
    known = _USER_FILES.get(file)
    if known is None:
        path = os.path.realpath(file)
        known = _USER_FILES[file] = not (
            path.startswith(_GPUSCOPE_ROOT) or path.startswith(_LIBRARY_ROOTS) or path.startswith(frameworks)
            or any(packages in path for packages in _PACKAGE_DIRS))
    return known


def is_library_file(file: str) -> bool:
    """Whether ``file`` is an installed library's code (a site-package's, torch's source checkout's): a real file
    neither the user's (``is_user_file``), nor the standard library's (a site-packages inside it aside), nor
    gpuscope's."""
    if not file or file.startswith("<") or is_user_file(file):
        return False
    path = os.path.realpath(file)
    return not path.startswith(_GPUSCOPE_ROOT) and (
        not path.startswith(_STDLIB_ROOT) or any(packages in path for packages in _PACKAGE_DIRS))


def framework_dirs() -> tuple[str, ...]:
    """torch's and NumPy's folders, wherever they are installed; only those already imported (gpuscope never
    imports them itself)."""
    global _FRAMEWORK_DIRS
    modules = (sys.modules.get("numpy"), sys.modules.get("torch"))
    key = (id(modules[0]), id(modules[1]))
    if key != _FRAMEWORK_DIRS[0]:
        dirs = []
        for module in modules:
            file = getattr(module, "__file__", None)
            if file:
                dirs.append(os.path.dirname(os.path.realpath(file)) + os.sep)
        _FRAMEWORK_DIRS = (key, tuple(dirs))
        _USER_FILES.clear()
    return _FRAMEWORK_DIRS[1]


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


def script_format_stack(fx_traceback: Any) -> Callable[[], list[str]]:
    """A ``torch.fx.traceback.format_stack`` that leaves gpuscope's frames out, and never formats them.

    Anomaly detection keeps a formatted stack for every autograd node the forward pass creates, through that
    function: about 7 us a frame on a 2-core machine, each one paid again for every node. gpuscope's frames under
    the script (its launch, the forward timing's ``__call__``) made a small step under anomaly detection a fifth
    slower (benchmarks/README.md, "Trying fixes"); without them the stack kept is what ``python`` would keep."""
    original = fx_traceback.format_stack

    def format_stack() -> list[str]:
        if getattr(fx_traceback, "should_preserve_node_meta", False):
            return original()
        frames = []
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            if code in LAUNCH_CODES:
                break
            if not code.co_filename.startswith(_GPUSCOPE_DIRS):
                frames.append((frame, frame.f_lineno))
            frame = frame.f_back
        stack = traceback.StackSummary.extract(iter(frames))
        stack.reverse()
        return traceback.format_list(stack)

    return format_stack


SITE_CALLS = 64
"""Calls whose user line is looked up, at most, where each lookup walks the stack (a model called many times a step,
a queue waited on at every step, is called from the same few lines)."""


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
