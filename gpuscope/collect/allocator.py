"""Which C allocator serves the process's ``malloc``, which of glibc's malloc settings the environment sets, and
the process's own CPU time and page faults (``getrusage``), and the training thread's own CPU time.

A CPU step that allocates large tensors and frees them again can spend much of its time in the kernel: glibc hands
a freed block above its mmap threshold (dynamic, at most 32 MiB) back to the kernel at once, and trims freed memory
at the top of its heap, so the next step's tensors are new pages, each faulted in and zeroed by the kernel.
jemalloc and tcmalloc keep freed memory for reuse; so does glibc with a higher ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_``. The ``tune-host-allocator`` rule reads what is found here beside the kernel time the
host memory sampler measures.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

try:
    import resource
except ImportError:  # not a Unix: no getrusage, and no kernel time or page faults
    resource = None  # type: ignore[assignment]

PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")
"""Allocators that replace glibc's malloc when loaded (by ``LD_PRELOAD``, or linked in), by library name."""

GLIBC_MALLOC_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
                         "MALLOC_ARENA_MAX")
"""The environment variables glibc reads its malloc settings from (mallopt(3)); ``GLIBC_TUNABLES`` is the newer
form."""


def allocator_in_use(maps: str = "/proc/self/maps") -> str:
    """``jemalloc``, ``tcmalloc`` or ``mimalloc`` where one is mapped into this process (it then serves malloc),
    else ``glibc`` on a glibc system; empty where that cannot be told (no ``/proc``, another C library)."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as lines:
            names = {line.rsplit("/", 1)[-1] for line in lines if ".so" in line}
    except OSError:
        return ""
    for allocator in PRELOADED:
        if any(name.startswith(f"lib{allocator}") for name in names):
            return allocator
    return "glibc" if platform.libc_ver()[0] == "glibc" else ""


def malloc_settings(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The names (never the values) of glibc's malloc settings set in ``environ``."""
    names = [name for name in GLIBC_MALLOC_SETTINGS if environ.get(name)]
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        names.append("GLIBC_TUNABLES")
    return tuple(names)


def own_usage() -> tuple[float, float, int]:
    """This process's CPU seconds in user mode and in the kernel, and its minor page faults, so far (zeros where
    getrusage is missing)."""
    if resource is None:
        return 0.0, 0.0, 0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime, usage.ru_minflt


def thread_usage(tid: int, proc: str = "/proc") -> tuple[float, float] | None:
    """Thread ``tid``'s (of this process) CPU seconds in user mode and in the kernel so far, from
    ``/proc/self/task/TID/stat`` (clock ticks, 10 ms on Linux); None where that cannot be read (not Linux, the
    thread gone)."""
    try:
        with open(f"{proc}/self/task/{tid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # the name, in parentheses, may hold spaces
        return int(fields[11]) / _TICKS, int(fields[12]) / _TICKS
    except (OSError, ValueError, IndexError):
        return None


def _clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK")) or 100
    except (AttributeError, ValueError, OSError):
        return 100


_TICKS = _clock_ticks()


def page_bytes() -> int:
    """The size of a page of memory, bytes (0 where it cannot be told)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return 0


def return_freed_heap() -> None:
    """Give the heap's free memory back to the system (glibc's ``malloc_trim(0)``): glibc keeps freed memory for
    reuse, and after a trace window's 166k events (a loop of 55k ops a step) the rest of the run kept 200 MB more
    (``malloc_trim``: 20 ms). Elsewhere (no glibc), nothing."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError, TypeError):
        pass
