"""The process's memory after each step, for the leak loops' ground truth under plain python (memory_accuracy.py
sets MEMORY_LOOP_RSS to a file): resident memory (``/proc/self/statm``) and the bytes glibc's malloc has handed out
and not had back (``mallinfo2``: in-use heap chunks plus mmapped ones), which the heap's free holes do not count."""

from __future__ import annotations

import ctypes
import json
import os


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


class Recorder:
    def __init__(self, path: str) -> None:
        self.path = path
        self.points: list[tuple[int, int, int]] = []
        self.page = os.sysconf("SC_PAGE_SIZE")
        try:
            self.libc = ctypes.CDLL("libc.so.6")
            self.libc.mallinfo2.restype = _MallInfo2
        except (OSError, AttributeError):
            self.libc = None

    def after(self, step: int) -> None:
        with open("/proc/self/statm") as statm:
            resident = int(statm.read().split()[1]) * self.page
        allocated = -1
        if self.libc is not None:
            info = self.libc.mallinfo2()
            allocated = info.uordblks + info.hblkhd
        self.points.append((step, resident, allocated))

    def save(self) -> None:
        with open(self.path, "w") as out:
            json.dump(self.points, out)


def recorder() -> Recorder | None:
    """A recorder where memory_accuracy.py asks for the ground truth (``MEMORY_LOOP_RSS``: the file), else None."""
    path = os.environ.get("MEMORY_LOOP_RSS")
    return Recorder(path) if path else None
