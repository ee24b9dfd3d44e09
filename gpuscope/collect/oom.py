"""A script that dies of a failed allocation: what was live when it failed.

``note(exc, steps)`` is called where the script's exception is caught (``runner.run_target``, ``gpuscope.profile()``'s
exit), while the frames it unwound are still reachable through its traceback. For a memory error (Python's
``MemoryError``, ``torch.OutOfMemoryError``, the CPU allocator's "can't allocate memory") it counts the live tensors by
what holds them; after a script run by ``gpuscope run`` it then lets the frames go, so that writing the record and the
report finds the memory the failed step held (under ``gpuscope.profile()`` the exception goes on to the user, whose
debugger may want those frames: they are kept). ``census()`` hands the result to the memory collector.

The count walks Python's tracked objects once: parameters and their gradients, optimizers' state, every other
tensor; activations saved inside autograd's graph are found from the ``grad_fn`` of each tensor that has one (its
nodes' ``_saved_*`` tensors). Each storage is counted once. Whatever fails in it (memory is short) is skipped.
"""

from __future__ import annotations

import gc
import re
import sys
import traceback
from typing import Any

from gpuscope.collect import warning_filters
from gpuscope.record import OutOfMemory

_LAST: OutOfMemory | None = None
_SIZE = re.compile(r"tried to allocate ([\d.]+)\s*(bytes|B|KiB|MiB|GiB|TiB)?", re.IGNORECASE)
_ENFORCE = re.compile(r"^\[enforce fail at [^\]]*\]\s*(err == 0\.\s*)?")
_UNITS = {"bytes": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
MAX_GRAPH_NODES = 200_000
"""Autograd nodes walked at most, over every graph: a failure in a huge graph is counted in part."""


def is_memory_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed, on the host or a GPU."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return "can't allocate memory" in text or "out of memory" in text or "not enough memory" in text
    return False


def requested_bytes(message: str) -> int | None:
    """The failed allocation's size, where the message says it ("tried to allocate 8589934592 bytes", "Tried to
    allocate 20.00 MiB")."""
    match = _SIZE.search(message)
    if match is None:
        return None
    unit = (match.group(2) or "bytes").lower()
    return round(float(match.group(1)) * _UNITS.get(unit, 1))


def note(exc: BaseException, steps: int = 0, release: bool = True) -> None:
    """Count what was live if ``exc`` is a memory error, then, with ``release`` (the script has ended: nothing will
    read them again), clear the frames its traceback holds."""
    global _LAST
    if not is_memory_error(exc):
        return
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    message = _ENFORCE.sub("", message)  # "[enforce fail at alloc_cpu.cpp:127] err == 0. ": the C++ check, not the news
    device = "cuda" if "cuda" in message.lower() or type(exc).__name__ == "OutOfMemoryError" else "cpu"
    try:
        with warning_filters.ignored():  # isinstance on every object wakes deprecated aliases' warnings
            counts = live_tensors(device)
    except Exception:  # MemoryError among them: the failure is still recorded, without the count
        counts = {}
    _LAST = OutOfMemory(error=f"{type(exc).__name__}: {message}" if message else type(exc).__name__,
                        device=device, requested_bytes=requested_bytes(message), step=steps, **counts)
    if release:
        try:
            traceback.clear_frames(exc.__traceback__)
        except Exception:
            pass
        gc.collect()


def census() -> OutOfMemory | None:
    """The last memory failure noted (once: a later run in this process starts afresh)."""
    global _LAST
    last, _LAST = _LAST, None
    return last


def live_tensors(device: str) -> dict[str, int]:
    """Bytes of the live tensors on ``device`` by what holds them; each storage counted once, in the first
    category that claims it (parameters, gradients, optimizer state, activations, other)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    seen: set[int] = set()
    counts = {"parameters_bytes": 0, "gradients_bytes": 0, "optimizer_state_bytes": 0, "activations_bytes": 0,
              "other_bytes": 0}

    def add(tensor: Any, category: str) -> None:
        try:
            if tensor.device.type != device or tensor.is_meta:
                return
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key in seen or not key:
                return
            seen.add(key)
            counts[category] += storage.nbytes()
        except Exception:
            pass

    # by each object's class, never isinstance: a metaclass's instance check reads attributes, and a lazy module's
    # attribute imports (a process with transformers loaded took 8 s)
    kinds: dict[type, str] = {}
    tensors, optimizers = [], []
    for o in gc.get_objects():
        cls = type(o)
        kind = kinds.get(cls)
        if kind is None:
            kind = kinds[cls] = ("tensor" if issubclass(cls, torch.Tensor) else
                                 "optimizer" if issubclass(cls, torch.optim.Optimizer) else "")
        if kind == "tensor":
            tensors.append(o)
        elif kind == "optimizer":
            optimizers.append(o)
    params = [t for t in tensors if issubclass(type(t), torch.nn.Parameter)]
    for t in params:
        add(t, "parameters_bytes")
    for t in params:
        if t.grad is not None:
            add(t.grad, "gradients_bytes")
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for value in state.values() if isinstance(state, dict) else ():
                if isinstance(value, torch.Tensor):
                    add(value, "optimizer_state_bytes")
    nodes: set[int] = set()
    for t in tensors:
        if t.grad_fn is not None:
            saved_in_graph(t.grad_fn, nodes, lambda s: add(s, "activations_bytes"), torch)
    for t in tensors:
        add(t, "other_bytes")
    return counts


def saved_in_graph(root: Any, seen: set[int], add: Any, torch: Any, limit: int = MAX_GRAPH_NODES) -> None:
    """Call ``add`` on every tensor saved in the graph under ``root`` (its nodes' ``_saved_*`` attributes), the nodes
    in ``seen`` left out and added to it, ``limit`` of them at most."""
    stack = [root]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for name in dir(node):
            if name.startswith("_saved_"):
                try:
                    value = getattr(node, name)
                except Exception:  # freed by a backward already
                    continue
                for item in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(item, torch.Tensor):
                        add(item)
        stack.extend(next_node for next_node, _ in getattr(node, "next_functions", ()) or ())


def memory_limit(device: str, address_space: bool = True) -> tuple[int, str]:
    """The most memory the run's tensors can have, and which limit that is: the GPU's memory on a CUDA run; on a
    CPU run the least of the host's memory, the cgroup's limit (a container's) and, with ``address_space``, this
    process's address-space limit (``RLIMIT_AS``, as a script or a scheduler sets it). (0, "") where none is
    known."""
    if device == "cuda":
        try:
            import torch.cuda

            return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory), "the GPU's memory"
        except Exception:
            return 0, ""
    found: list[tuple[int, str]] = []
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    found.append((int(line.split()[1]) * 1024, "the host's memory"))
    except (OSError, ValueError, IndexError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as limit:
                text = limit.read().strip()
            if text.isdigit() and int(text) < 1 << 60:
                found.append((int(text), "the container's (cgroup's) memory limit"))
                break
        except OSError:
            continue
    if address_space:  # (another process's limit is read from its /proc/PID/limits: sentinel.py)
        try:
            import resource

            soft = resource.getrlimit(resource.RLIMIT_AS)[0]
            if soft != resource.RLIM_INFINITY and soft > 0:
                found.append((soft, "the process's address-space limit (RLIMIT_AS)"))
        except (ImportError, OSError, ValueError):
            pass
    return min(found) if found else (0, "")
