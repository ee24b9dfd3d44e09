"""What fills memory: two steady steps under torch.profiler's memory timeline, after every other window.

torch.profiler with ``profile_memory``, ``record_shapes`` and ``with_stack`` records every allocation and free
(CPU and CUDA alike) with the ops and Python frames it happened under; its memory profile
(``torch.profiler._memory_profiler.MemoryProfile``) sorts each tensor into parameters, gradients, optimizer
state, inputs, activations (saved for backward) and temporaries from the ops' data flow. From that, after the
run (``summarise``): each category at the steps' peak, activations at their own highest and the modules holding
them, the model's repeated block and its input, and what the first step made that was still alive at the end of
the second (a leak), each by the script's line that made it. The window costs its two steps (marked profiled,
left out of the figures); the analysis runs after the script, on the events the profiler kept.

Where the script dies of a failed allocation, ``collect/oom.py`` takes a census of the live tensors and this
collector hands it on as ``Memory.out_of_memory``, measured steps or not. docs/memory.md.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpuscope.collect import oom, warning_filters
from gpuscope.collect.callsites import is_user_file
from gpuscope.collect.collectors.cprofile import profiler_in_use
from gpuscope.collect.allocator import return_freed_heap
from gpuscope.collect.collectors.torch_trace import kineto_quiet
from gpuscope.collect.framework.base import CollectorResult, StepFollower, StepWindow, WindowRequest, register
from gpuscope.collect.last_reading import statm_bytes
from gpuscope.collect.lazy_dynamo import inductor_left_unimported
from gpuscope.collect.oom import memory_limit, saved_in_graph
from gpuscope.record import MEMORY_CATEGORIES as CATEGORIES
from gpuscope.record import CollectorStatus, KeptTensors, Memory, MemoryHolder, MemoryTimeline

if TYPE_CHECKING:
    from gpuscope.collect.framework.options import CollectOptions
    from gpuscope.collect.framework.schedule import Plan, Window

STEPS = 2
"""Two steps: what the first makes and the second has not freed is what a step leaves behind."""
MAX_EVENTS = 400_000
"""Profiled events (ops, allocations and the calls above them: ``_TorchOnly``) past which the memory profile is not
built: its analysis runs in Python over every event (a few seconds for 100k); a step that large (an LBFGS step of
373k ops) says so in the notes instead."""
TIMELINE_POINTS = 300
"""Points kept of the timeline for the page: each bucket's highest."""
TOP_HOLDERS = 8
TOP_KEPT = 5
KEPT_MIN_BYTES = 4096
"""What one line left alive below this is not shown: a loss the loop still names until its next step rebinds it."""
MIN_BLOCKS = 3
"""Instances of one module class, each holding activations, that make it the model's repeated block."""
MARK = "gpuscope#memory-step-"
NON_LEAF_GRAD = "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed"
"""torch's profiler with stacks reads the gradient of every parameter of each module called: a parameter that is a
view (FSDP's ``use_orig_params``) makes torch warn on the user's stderr, which says nothing under python."""


@register
class MemoryWindowCollector(StepFollower):
    """Two steps under torch.profiler's memory timeline; the analysis after the run."""

    name: ClassVar[str] = "memory-window"
    field: ClassVar[str | None] = "memory"

    def __init__(self, start: int | None, cuda_start: int | None = None, steps: int = STEPS) -> None:
        """Measure steps ``start`` and on (``cuda_start`` on a CUDA run; None: not on that kind of run)."""
        self._window = StepWindow(start, steps, self._open, self._close, cuda_start=cuda_start)
        self._prof: Any = None
        self._filter: tuple[Any, ...] | None = None  # the warnings filter of NON_LEAF_GRAD, while the window is open
        self._mark: Any = None
        self._device = "cpu"
        self._reserved = 0
        self._process = 0
        self._lines: UserLines | None = None
        self._skipped = ""  # why the window did not open: another profiler holds the slot its stacks need
        self._held: dict[int, str] = {}  # storage address -> the script's variable that keeps it alive

    @classmethod
    def wants(cls, options: CollectOptions) -> WindowRequest | None:
        """Two steps after every other window (none where steps are long); none at all where torch.profiler was
        turned off (``--trace-steps 0``) or ``--profile-steps`` is too few to hold them."""
        wanted = options.trace_steps > 0 and options.memory_window
        return WindowRequest(STEPS, after="flops", long_steps=0) if wanted else None

    @classmethod
    def create(cls, options: CollectOptions, plan: Plan) -> MemoryWindowCollector:
        return cls(plan.start(cls.name), plan.start(cls.name, cuda=True))

    def unavailable_reason(self) -> str | None:
        return None

    def start(self, run_dir: Path) -> None:
        pass

    def move_window(self, cpu: Window | None, cuda: Window | None) -> None:
        """Steps are long (``schedule.long_steps_plan``): none is measured (``long_steps=0``), as one long step under
        this profiler (stacks, every allocation) would cost the run as much again."""
        self._window.move(*(w if w is not None and w.steps else None for w in (cpu, cuda)))

    def _on_step(self, index: int) -> None:
        window = self._window
        if window.state == "open" and len(window.counted) + 1 < window.steps:
            self._next_mark(index)  # the window's next step begins
        if window.start is None and window.cuda_start is None:
            self._unfollow()
            return
        window.on_step(index, self._events, "the memory timeline")  # type: ignore[arg-type]
        if window.over:
            self._unfollow()

    # -- the window ----------------------------------------------------------------------------------------
    def _open(self, index: int) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        self._device = "cuda" if self._events.cuda_in_use() else "cpu"  # type: ignore[union-attr]
        if (why := profiler_in_use()) is not None:  # torch's Python tracer would take its place, and not give it back
            self._skipped = why
            raise RuntimeError(why)
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                             with_stack=True)
        self._quiet_non_leaf()
        made_before = torch.empty(1)  # freed while the profile runs: the allocator's one warning, here, swallowed
        with kineto_quiet(), inductor_left_unimported():  # (as torch_trace's window: no compiler imported)
            self._prof.start()
            del made_before
        self._next_mark(index)

    def _next_mark(self, index: int) -> None:
        from torch.autograd.profiler import record_function

        if self._mark is not None:
            self._mark.__exit__(None, None, None)
        self._mark = record_function(f"{MARK}{index}")
        self._mark.__enter__()

    def _close(self) -> None:
        if self._mark is not None:
            mark, self._mark = self._mark, None
            mark.__exit__(None, None, None)
        if self._prof is not None:
            with kineto_quiet(), inductor_left_unimported():
                self._prof.stop()
        self._loud_non_leaf()
        self._process = _rss()
        self._lines = UserLines()  # now, while the script's __main__ is loaded
        try:
            self._held = references()  # what the script's variables hold now, as the window's second step ends
        except Exception:
            self._held = {}
        if self._device == "cuda":
            try:
                import torch.cuda

                self._reserved = int(torch.cuda.memory_reserved())
            except Exception:
                self._reserved = 0

    def _quiet_non_leaf(self) -> None:
        """Drop torch's warning of ``NON_LEAF_GRAD`` while the window is open (an "ignore" filter in front:
        ``collect/warning_filters.py``)."""
        self._loud_non_leaf()
        self._filter = warning_filters.put_in_front("ignore", NON_LEAF_GRAD, UserWarning)

    def _loud_non_leaf(self) -> None:
        warning_filters.take_out(self._filter)
        self._filter = None

    # -- after the run -------------------------------------------------------------------------------------
    def stop(self) -> CollectorResult:
        window = self._window
        self._loud_non_leaf()  # (the run ended inside the window)
        died = oom.census()
        if window.state == "open":  # the run ended inside the window: what it recorded is no whole step
            window.fail("the run ended inside the memory window")
            self._prof = None
            if died is None:
                return CollectorResult(CollectorStatus("unavailable", "the run ended inside the memory window (steps "
                                                                      f"{window.counted[0] if window.counted else '?'}"
                                                                      f" and on): no whole step to measure"))
        if self._skipped and died is None:
            return CollectorResult(CollectorStatus("unavailable", f"{self._skipped}: the memory window's stacks "
                                                                  f"would have stopped it"))
        if window.state == "failed" and died is None:
            return CollectorResult(CollectorStatus("failed", window.reason))
        notes: list[str] = []
        memory = Memory(device=self._device)  # type: ignore[arg-type]
        if self._prof is not None and window.complete:
            try:
                events = extract(self._prof, self._lines)
            except Exception as exc:
                events = None
                notes.append(f"the memory timeline could not be read: {type(exc).__name__}: {exc}".splitlines()[0])
            finally:
                self._prof = None
                return_freed_heap()
            if events is not None:
                if events.too_many:
                    notes.append(f"the measured steps held {events.too_many:,} profiled events, more than the "
                                 f"{MAX_EVENTS:,} the memory timeline is built for: no breakdown")
                else:
                    memory = summarise(events, self._device, self._held)
                    memory = dataclasses.replace(memory, reserved_bytes=self._reserved, process_bytes=self._process)
        elif died is None:
            steps = self._window.cuda_start if self._device == "cuda" else self._window.start
            return CollectorResult(CollectorStatus(
                "unavailable", "no memory window on this run" if steps is None else
                f"the run ended before the memory window (steps {steps}-{steps + self._window.steps - 1})"))
        if died is not None:
            if self._events is not None:
                died = dataclasses.replace(died, step=self._events.steps_seen())
            memory = dataclasses.replace(memory, out_of_memory=died, device=died.device)
        limit, source = memory_limit(memory.device)
        memory = dataclasses.replace(memory, limit_bytes=limit, limit_source=source, address_space_peak_bytes=_vm_peak(),
                          notes=tuple(notes))
        return CollectorResult(CollectorStatus("ok"), memory, notes=tuple(notes))


def _vm_peak() -> int:
    try:
        with open(f"/proc/{os.getpid()}/status") as status:
            for line in status:
                if line.startswith("VmPeak:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _rss() -> int:
    return statm_bytes(os.getpid())[1]


# -- the profile, as plain data ------------------------------------------------------------------------------
@dataclass(slots=True)
class Allocation:
    """One tensor's storage as the memory timeline saw it, with where it was made."""

    key: int  # allocation id
    nbytes: int
    category: str
    device: str
    created_ns: int | None  # None: it existed before the window
    destroyed_ns: int | None  # None: alive at the window's end
    module_chain: tuple[str, ...] = ()  # the modules it was made under, outermost first
    lines: tuple[str, ...] = ()  # the script's lines it was made under, innermost first
    in_optimizer: bool = False
    in_backward: bool = False
    ptr: int = 0  # its storage's address


@dataclass(slots=True)
class ProfileEvents:
    """What the analysis needs of a profile: the allocations, the steps' spans, the phases' spans, the modules'
    inputs."""

    allocations: list[Allocation] = field(default_factory=list)
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # (step, start ns, end ns)
    backward: list[tuple[int, int]] = field(default_factory=list)  # spans of backward
    optimizer: list[tuple[int, int]] = field(default_factory=list)  # spans of optimizer.step
    module_inputs: dict[str, int] = field(default_factory=dict)  # module instance -> its input's bytes
    too_many: int = 0  # events, where there were too many to analyse


_TORCH_CATEGORY = {"PARAMETER": "parameters", "OPTIMIZER_STATE": "optimizer_state", "INPUT": "inputs",
                   "TEMPORARY": "temporaries", "ACTIVATION": "activations", "GRADIENT": "gradients",
                   "AUTOGRAD_DETAIL": "temporaries"}


def extract(prof: Any, lines: UserLines | None = None) -> ProfileEvents:
    """The profile's allocations, categorised by torch's memory profile, each with the modules and the script's
    lines it was made under; the gpuscope step marks and the backward and optimizer spans."""
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import Action, TensorKey

    result = prof.profiler.kineto_results
    out = ProfileEvents()
    tree = _TorchOnly(result.experimental_event_tree(), _EventType)
    if tree.count > MAX_EVENTS:
        out.too_many = tree.count
        return out
    profile = _memory_profile(result, tree)
    lines = lines or UserLines()
    made: dict[int, tuple[tuple[str, ...], tuple[str, ...], bool, bool]] = {}
    for event in profile._op_tree.dfs():
        kind = event.typed[0]
        name = event.name
        if kind == _EventType.TorchOp or kind == _EventType.PyCall:
            if name.startswith(MARK):
                out.steps.append((int(name[len(MARK):]), event.start_time_ns, event.end_time_ns))
            elif _in_optimizer(name) and not (event.parent is not None and _in_optimizer(event.parent.name)):
                out.optimizer.append((event.start_time_ns, event.end_time_ns))
            elif name.startswith("autograd::engine::evaluate_function"):
                out.backward.append((event.start_time_ns, event.end_time_ns))
            if kind == _EventType.PyCall and event.typed[1].module is not None:
                module = _module_name(name)
                if module not in out.module_inputs:
                    out.module_inputs[module] = _first_input_bytes(event, _EventType)
        elif kind == _EventType.Allocation and event.typed[1].alloc_size > 0:
            made[event.typed[1].allocation_id] = _made_under(event, _EventType, lines)
    live: dict[Any, Allocation] = {}
    found: list[Allocation] = []
    for t, action, (key, version), nbytes in profile.timeline:
        if not isinstance(key, TensorKey):
            continue  # an allocation the profiler could not tie to a tensor (no id to pair its free with): left out
        if action in (Action.PREEXISTING, Action.CREATE):
            category = profile._categories.get(key, version)
            name = _TORCH_CATEGORY.get(category.name, "unknown") if category is not None else "unknown"
            modules, lines, in_optimizer, in_backward = made.get(key.storage.allocation_id, ((), (), False, False))
            allocation = Allocation(key.storage.allocation_id, int(nbytes), name, str(key.device),
                                    None if action == Action.PREEXISTING else t, None, modules, lines,
                                    in_optimizer, in_backward, key.storage.ptr)
            previous = live.get(key)
            if previous is not None and action == Action.CREATE:
                continue
            live[key] = allocation
            found.append(allocation)
        elif action == Action.DESTROY and key in live:
            live.pop(key).destroyed_ns = t
    out.allocations = found
    out.steps.sort()
    return out


class _TorchOnly:
    """The profile's event tree without the Python calls under which no op ran and nothing was allocated (but those of
    a module or an optimizer, which name their tensors: ``zero_grad`` that sets gradients to None runs no op): with
    ``with_stack`` every Python call of the window is an event (the data-bound sample's two steps: 86k of 87k events,
    its dataset's Python), and the memory profile, which reads ops, allocations and the calls of modules and
    optimizers, would walk them all (1.5 s of its 2 s there). ``count``: the events kept."""

    def __init__(self, roots: Sequence[Any], event_type: Any) -> None:
        python = (event_type.PyCall, event_type.PyCCall)
        order: list[Any] = []  # parents before children; holding them keeps each event's Python object, and its id
        stack = list(roots)
        while stack:
            event = stack.pop()
            order.append(event)
            stack.extend(event.children)
        kept: dict[int, list[Any]] = {}
        for event in reversed(order):  # children before parents
            children = [child for child in event.children if id(child) in kept]
            if children or event.tag not in python or _holds_tensors(event, event_type):
                kept[id(event)] = children
        self._kept = kept
        self._roots = [root for root in roots if id(root) in kept]
        self.count = len(kept)
        self._sorted_nodes: tuple[Any, ...] = ()

    def op_tree(self, result: Any) -> Any:
        """Stands in for torch's ``OpTree(result)``: the same walks, over the kept events."""
        self._sorted_nodes = tuple(sorted(self.dfs(), key=lambda event: event.start_time_ns))
        return self

    def dfs(self, *args: Any, children_fn: Any = None, **kwargs: Any) -> Any:
        from torch.profiler import _utils

        kept = self._kept
        if children_fn is None:
            def children(event: Any) -> list[Any]:
                return kept[id(event)]
        else:
            def children(event: Any) -> list[Any]:
                return [child for child in children_fn(event) if id(child) in kept]
        yield from _utils.traverse_dfs(self._roots, *args, children_fn=children, **kwargs)

    @property
    def sorted_nodes(self) -> tuple[Any, ...]:
        return self._sorted_nodes


def _holds_tensors(event: Any, event_type: Any) -> bool:
    """A call of a module or an optimizer, whose tensors the profiler names with it."""
    if event.tag != event_type.PyCall:
        return False
    fields = event.typed[1]
    return fields.module is not None or fields.optimizer is not None


def _memory_profile(result: Any, tree: _TorchOnly) -> Any:
    """torch's ``MemoryProfile`` of ``result``, over ``tree``'s events (its ``OpTree`` swapped for ``tree`` while it
    is built)."""
    from torch.profiler import _memory_profiler

    op_tree = _memory_profiler.OpTree
    _memory_profiler.OpTree = tree.op_tree  # type: ignore[assignment,misc]
    try:
        return _memory_profiler.MemoryProfile(result)
    finally:
        _memory_profiler.OpTree = op_tree  # type: ignore[misc]


def _module_name(name: str) -> str:
    return name.removeprefix("nn.Module: ")


def _first_input_bytes(event: Any, event_type: Any) -> int:
    """The bytes of the first tensor input of the first op under ``event`` (a module's call): its input."""
    stack = list(reversed(event.children))
    while stack:
        child = stack.pop()
        if child.typed[0] == event_type.TorchOp:
            for arg in child.typed[1].inputs:
                sizes = getattr(arg, "sizes", None)
                if sizes is not None and hasattr(arg, "dtype"):
                    numel = 1
                    for size in sizes:
                        numel *= size
                    return numel * _itemsize(arg.dtype)
            return 0
        stack.extend(reversed(child.children))
    return 0


def _itemsize(dtype: Any) -> int:
    try:
        return int(dtype.itemsize)
    except AttributeError:
        return 4


def _in_optimizer(name: str) -> bool:
    """Whether a profiled event is an optimizer's code (``torch/optim/...``, or torch's record_function for it)."""
    return "torch/optim/" in name or name.startswith(("Optimizer.step#", "Optimizer.zero_grad#"))


def _made_under(event: Any, event_type: Any, user_lines: UserLines) -> tuple[tuple[str, ...], tuple[str, ...], bool,
                                                                            bool]:
    """The modules (outermost first) and the script's lines (innermost first) an allocation was made under, and
    whether inside an optimizer's step or backward."""
    modules: list[str] = []
    lines: list[str] = []
    in_optimizer = in_backward = False
    inner = None  # the Python call made from the frame reached next: its caller's line is that frame's line now
    parent = event.parent
    while parent is not None:
        name = parent.name
        kind = parent.typed[0]
        if _in_optimizer(name):
            in_optimizer = True
        if kind == event_type.PyCall:
            if user_lines.launcher(name):
                break
            if parent.typed[1].module is not None:
                modules.append(_module_name(name))
            elif len(lines) < 4:
                caller = inner.typed[1].caller if inner is not None else None
                line = user_lines(name, caller.line_number if caller is not None else None)
                if line:
                    lines.append(line)
        elif name.startswith("autograd::engine::evaluate_function"):
            in_backward = True
        if kind in (event_type.PyCall, event_type.PyCCall):
            inner = parent
        parent = parent.parent
    return tuple(reversed(modules)), tuple(lines), in_optimizer, in_backward


class UserLines:
    """``FILE:LINE in FUNCTION`` for a profiler's Python frame (``torch/optim/adam.py(347): step``) in the script's own
    code, else empty. The profiler names files relative to the ``sys.path`` entry they were found under (a file of
    the script's folder by its name alone): each is matched to a loaded module's file to tell whose it is."""

    def __init__(self) -> None:
        """Made while the script's modules are loaded (its ``__main__`` among them)."""
        self._files = [f for f in (getattr(m, "__file__", None) for m in list(sys.modules.values()))
                       if isinstance(f, str)]
        self._known: dict[str, str | None] = {}  # the profiler's name -> the file, None: not found

    def __call__(self, frame: str, line: int | None = None) -> str:
        """``line``: the frame's line at the time (the profiler's name has the function's first line)."""
        head, _, function = frame.partition("): ")
        path, _, first = head.rpartition("(")
        file = self._file(path)
        if not first.isdigit() or file is None or not is_user_file(file):
            return ""
        return f"{os.path.basename(path)}:{line or first} in {function}"

    def launcher(self, frame: str) -> bool:
        """Whether ``frame`` is gpuscope's own launch of the script: every frame outside it is gpuscope's too."""
        file = self._file(frame.partition("): ")[0].rpartition("(")[0])
        return file is not None and file.endswith(RUNNER_FILE)

    def _file(self, path: str) -> str | None:
        if path not in self._known:
            tail = os.sep + path
            self._known[path] = path if os.path.isabs(path) else next(
                (f for f in self._files if f.endswith(tail)), None)
        return self._known[path]


RUNNER_FILE = os.path.join("gpuscope", "collect", "runner.py")


# -- the summary -----------------------------------------------------------------------------------------------
def category_of(allocation: Allocation) -> str:
    """The category shown: an optimizer's and backward's intermediate results are temporaries, whatever the timeline's
    data flow made of them (it took Adam's per-parameter quotients for activations, left its foreach results
    unplaced, and took their square roots, made and freed inside the measured steps, for parameters), and nothing
    made inside the measured steps is a parameter: a steady step's parameters were all made before it (the timeline
    took per-sample gradients from ``torch.func``, 13.3 MB of a 55k-parameter CNN's, for parameters)."""
    made_here = allocation.created_ns is not None
    if allocation.category in ("activations", "unknown") and (allocation.in_optimizer or allocation.in_backward):
        return "temporaries"  # (and what it could not place there: Adam's foreach results, 8.4 MB of an MLP's peak)
    if allocation.category == "parameters" and made_here:
        return "temporaries" if allocation.in_optimizer else "unknown"
    return allocation.category


def summarise(events: ProfileEvents, device: str, held: dict[int, str] | None = None) -> Memory:
    """The breakdown at the peak, activations at their highest and who holds them, and what a step left behind."""
    on_device = [a for a in events.allocations if a.device.split(":")[0] == device]
    if not on_device or not events.steps:
        return Memory(device=device, notes=("no tensor allocation on the device was recorded",))  # type: ignore[arg-type]
    start = events.steps[0][1]
    moments = sorted({start, *(a.created_ns for a in on_device if a.created_ns is not None),
                      *(a.destroyed_ns for a in on_device if a.destroyed_ns is not None)})
    by_time: dict[int, list[tuple[Allocation, int]]] = defaultdict(list)
    for a in on_device:
        by_time[a.created_ns if a.created_ns is not None else start].append((a, 1))
        if a.destroyed_ns is not None:
            by_time[a.destroyed_ns].append((a, -1))
    totals = dict.fromkeys(CATEGORIES, 0)
    alive: set[int] = set()
    points: list[tuple[int, dict[str, int]]] = []
    peak = (-1, start, totals)
    acts_max = (-1, start, set())  # type: ignore[var-annotated]
    grads_max = 0
    for t in moments:
        for a, sign in by_time.get(t, ()):
            totals[category_of(a)] += sign * a.nbytes
            (alive.add if sign > 0 else alive.discard)(id(a))
        total = sum(totals.values())
        snapshot = dict(totals)
        points.append((t, snapshot))
        if total > peak[0]:
            peak = (total, t, snapshot)
        grads_max = max(grads_max, totals["gradients"])
        if totals["activations"] > acts_max[0]:
            acts_max = (totals["activations"], t, set(alive))
    peak_total, peak_t, at_peak = peak
    holders, blocks = _holders(
        [a for a in on_device if id(a) in acts_max[2] and category_of(a) == "activations"], events.module_inputs)
    kept = _kept(on_device, events.steps, held or {})
    return Memory(
        device=device,  # type: ignore[arg-type]
        steps=tuple(step for step, _, _ in events.steps),
        peak_bytes=peak_total,
        parameters_bytes=at_peak["parameters"],
        gradients_bytes=at_peak["gradients"],
        optimizer_state_bytes=at_peak["optimizer_state"],
        activations_bytes=at_peak["activations"],
        inputs_bytes=at_peak["inputs"],
        temporaries_bytes=at_peak["temporaries"],
        unknown_bytes=at_peak["unknown"],
        peak_phase=_phase(peak_t, events),
        activations_max_bytes=max(acts_max[0], 0),
        gradients_max_bytes=grads_max,
        holders=holders,
        repeated_blocks=blocks.name,
        repeated_block_count=blocks.count,
        repeated_block_bytes=blocks.bytes,
        repeated_block_max_bytes=blocks.largest,
        repeated_block_inputs_bytes=blocks.inputs,
        timeline=_timeline(points, start, events),
        kept=kept,
        kept_bytes_per_step=sum(k.bytes for k in kept),
    )


def _phase(t: int, events: ProfileEvents) -> str:
    if any(a <= t <= b for a, b in events.optimizer):
        return "optimizer"
    if any(a <= t <= b for a, b in events.backward):
        return "backward"
    step = next(((s, e) for _, s, e in events.steps if s <= t <= e), None)
    if step is not None:
        first_backward = min((a for a, _ in events.backward if step[0] <= a <= step[1]), default=None)
        if first_backward is None or t < first_backward:
            return "forward"
    return "other"


@dataclass(slots=True)
class Blocks:
    """The model's repeated block: its class, how many instances hold activations, their activations together and
    the largest one's, and their inputs together."""

    name: str = ""
    count: int = 0
    bytes: int = 0
    largest: int = 0
    inputs: int = 0


def _holders(activations: Sequence[Allocation], inputs: dict[str, int]) -> tuple[tuple[MemoryHolder, ...], Blocks]:
    """The innermost modules holding the most activations, and the repeated block: the module class, not a
    leaf, with the most activations under ``MIN_BLOCKS`` or more of its instances (and its input's bytes taken
    off each: checkpointing keeps a block's input)."""
    by_module: dict[str, list[Allocation]] = defaultdict(list)
    by_instance: dict[str, int] = defaultdict(int)
    parents: set[str] = set()
    for a in activations:
        inner = a.module_chain[-1] if a.module_chain else ""
        by_module[inner].append(a)
        for module in a.module_chain:
            by_instance[module] += a.nbytes
        parents.update(a.module_chain[:-1])
    holders = sorted(
        (MemoryHolder(module=module, line=_most_common(a.lines[0] for a in allocs if a.lines),
                      bytes=sum(a.nbytes for a in allocs), tensors=len(allocs))
         for module, allocs in by_module.items()),
        key=lambda h: -h.bytes)[:TOP_HOLDERS]
    by_class: dict[str, list[str]] = defaultdict(list)
    for instance in by_instance:
        if instance in parents:
            by_class[instance.rpartition("_")[0] or instance].append(instance)
    best = Blocks()
    for cls, instances in by_class.items():
        total = sum(by_instance[i] for i in instances)
        if len(instances) >= MIN_BLOCKS and total > best.bytes:
            best = Blocks(cls, len(instances), total, max(by_instance[i] for i in instances),
                          sum(inputs.get(i, 0) for i in instances))
    return tuple(holders), best


def _most_common(lines: Iterable[str]) -> str:
    counts: dict[str, int] = defaultdict(int)
    for line in lines:
        counts[line] += 1
    return max(counts, key=lambda k: counts[k]) if counts else ""


@dataclass(frozen=True, slots=True)
class Holder:
    """The script's variable that keeps a tensor alive: its kind (``KeptTensors.holder_kind``), name and length."""

    kind: str
    name: str
    items: int | None = None

    @property
    def words(self) -> str:
        if self.kind == "graph":
            return f"the autograd graph of `{self.name}`"
        if self.kind == "variable":
            return f"`{self.name}`"
        return f"the {self.kind} `{self.name}` ({self.items} items)"


NO_HOLDER = Holder("", "")


def _kept(allocations: Sequence[Allocation], steps: Sequence[tuple[int, int, int]],
          held: dict[int, Holder]) -> tuple[KeptTensors, ...]:
    """Tensors made in the first measured step and alive at the end of the second, by the line that made them and
    the script's variable that keeps them (``held``: ``references()``); gradients (set to None, they are made again
    each step) and optimizer state (made once) left out."""
    if len(steps) < 2:
        return ()
    _, first_start, first_end = steps[0]
    groups: dict[tuple[str, tuple[str, ...], str, Holder], list[Allocation]] = defaultdict(list)
    for a in allocations:
        if a.created_ns is None or not first_start <= a.created_ns <= first_end or a.destroyed_ns is not None:
            continue
        category = category_of(a)
        if category in ("gradients", "optimizer_state", "parameters"):
            continue
        groups[(a.lines[0] if a.lines else "", a.lines[1:4], category, held.get(a.ptr, NO_HOLDER))].append(a)
    kept = [KeptTensors(line=line, callers=callers, bytes=sum(a.nbytes for a in allocs), tensors=len(allocs),
                        category=category, held_by=holder.words if holder.kind else "", holder_kind=holder.kind,
                        holder_name=holder.name, holder_items=holder.items)
            for (line, callers, category, holder), allocs in groups.items()
            if sum(a.nbytes for a in allocs) >= KEPT_MIN_BYTES]
    return tuple(sorted(kept, key=lambda k: -k.bytes)[:TOP_KEPT])


MAX_ITEMS = 10_000
"""Items of one container, and autograd nodes of one graph, looked at: enough for a list a step appends to."""


def references() -> dict[int, Holder]:
    """Storage address -> the script's variable that keeps that tensor alive: a container it sits in (``the list
    `feats` (13 items)``), the autograd graph of a tensor it is saved in (``the graph of `total```), or itself
    (`` `loss` ``). Read from the script's frames on the stack (the loop's thread) and its ``__main__``'s
    globals, in that order of preference, as the memory window ends."""
    torch = sys.modules["torch"]
    names: list[tuple[str, Any]] = []
    frame = sys._getframe(1)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            names += [(name, value) for name, value in frame.f_locals.items()]
        frame = frame.f_back
    main = sys.modules.get("__main__")
    if main is not None:
        names += [(name, value) for name, value in vars(main).items() if not name.startswith("__")]
    found: dict[int, Holder] = {}

    def note(tensor: Any, what: Holder) -> None:
        try:
            found.setdefault(tensor.untyped_storage().data_ptr(), what)
        except Exception:
            pass

    for name, value in names:  # containers first: a list that grows is the usual keeper
        if isinstance(value, (list, tuple, dict, set)) and not isinstance(value, torch.Tensor):
            items = value.values() if isinstance(value, dict) else value
            kind = type(value).__name__
            for i, item in enumerate(items):
                if i >= MAX_ITEMS:
                    break
                if isinstance(item, torch.Tensor):
                    note(item, Holder(kind, name, len(value)))
    for name, value in names:
        if isinstance(value, torch.Tensor) and value.grad_fn is not None:
            own = value.untyped_storage().data_ptr()  # an output its own graph saved (relu's) is held by its name

            def in_graph(saved: Any, n: str = name, own: int = own) -> None:
                if saved.untyped_storage().data_ptr() != own:
                    note(saved, Holder("graph", n))

            saved_in_graph(value.grad_fn, set(), in_graph, torch, MAX_ITEMS)
    for name, value in names:
        if isinstance(value, torch.Tensor):
            note(value, Holder("variable", name))
    return found


def _timeline(points: Sequence[tuple[int, dict[str, int]]], start: int, events: ProfileEvents) -> MemoryTimeline:
    """At most ``TIMELINE_POINTS`` points: each bucket's highest total."""
    if len(points) > TIMELINE_POINTS:
        size = len(points) / TIMELINE_POINTS
        kept = []
        for i in range(TIMELINE_POINTS):
            bucket = points[int(i * size):int((i + 1) * size)]
            if bucket:
                kept.append(max(bucket, key=lambda p: sum(p[1].values())))
        points = kept
    return MemoryTimeline(
        t_ms=tuple(round((t - start) / 1e6, 3) for t, _ in points),
        **{c: tuple(p[c] for _, p in points) for c in CATEGORIES},
        phases=tuple(_phase(t, events) for t, _ in points),
    )


