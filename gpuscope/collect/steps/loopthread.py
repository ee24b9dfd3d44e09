"""The training loop's thread, whose events the steps collector counts: the thread that started it, or the one
whose optimizer step, ``backward()`` or ``gpuscope.step()`` defines the first step while that thread defines none
(a script training in a ``threading.Thread`` while its main thread waits), followed from then on. Never a forked
child's (a DataLoader worker forked from the loop's thread has the same thread id)."""

from __future__ import annotations

import os
import threading
import weakref


class LoopThread:
    """The thread followed, and whether it has defined a step yet. ``ident`` is the followed thread's id in the
    process that made it, and None in a forked child (no thread there is the loop's): the hot paths compare it with
    ``threading.get_ident()`` themselves, a call fewer than ``mine()``."""

    __slots__ = ("ident", "native_id", "pid", "stepped", "adopted", "__weakref__")

    def __init__(self) -> None:
        self.ident: int | None = threading.get_ident()
        self.native_id = threading.get_native_id()
        """The kernel's id for the followed thread (its ``/proc/self/task/TID``)."""
        self.pid = _this_pid
        self.stepped = False
        """The followed thread has defined a step: no other thread is adopted after that."""
        self.adopted = ""
        """The name of the thread followed instead of the one that started the collector."""
        _made.add(self)

    def mine(self) -> bool:
        """Whether the calling thread is the loop's (and not a forked child's)."""
        return threading.get_ident() == self.ident

    def forked(self) -> bool:
        """Whether the caller is a forked child of the loop's process."""
        return _this_pid != self.pid

    def adopt(self) -> bool:
        """A step-defining event from another thread of this process: while the followed thread has defined no
        step, the loop runs in the calling thread, followed from now on (True)."""
        if self.stepped or self.forked():
            return False
        self.ident = threading.get_ident()
        self.native_id = threading.get_native_id()
        self.adopted = threading.current_thread().name
        return True


_this_pid = os.getpid()
"""This process's id, kept current across forks: ``mine`` runs several times a step, and ``os.getpid()`` is a
system call each time."""


_made: weakref.WeakSet[LoopThread] = weakref.WeakSet()
"""Every LoopThread of this process, whose thread a forked child follows no more."""


def _forked() -> None:
    global _this_pid
    _this_pid = os.getpid()
    for loop in list(_made):
        if loop.pid != _this_pid:
            loop.ident = None


os.register_at_fork(after_in_child=_forked)
