"""Python functions, by cProfile: ``python.prof`` (``snakeviz python.prof`` or ``gpuscope view RUN_DIR``) and the
top functions by own and cumulative time.

cProfile can double the time of a Python-heavy loop, so by default it covers the start-up and the first
``steps`` steps only; those steps are marked profiled and left out of the steady-state figures. It profiles the
thread that runs the script (cProfile is per thread).

DataLoader workers started by fork are profiled over their first batches (``workers.prof``, see workers.py);
a forked worker never keeps the main thread's profiler running (it would run profiled, and slower, to no use).

Two profiles are kept: the start-up (through the first step, which also pays for lazy initialisation) and the
loop (the later steps of the window). The start-up profile pauses while torch itself is imported, and
torch._dynamo, which torch imports at the script's first optimizer (``PAUSED_IMPORTS``): that takes seconds, is not
the user's to fix, and under cProfile takes half as long again. ``python.prof`` holds both; the top functions
come from the loop, so the training loop's hot spots are not drowned by ``import torch``.
"""

from __future__ import annotations

import cProfile
import functools
import os
import pstats
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpuscope.collect.framework.base import CollectorResult, StepFollower, WindowRequest, register
from gpuscope.collect.framework.options import CPROFILE_STEPS
from gpuscope.collect.callsites import is_library_file, is_user_file
from gpuscope.collect.importwatch import ImportWatch
from gpuscope.collect.workers import WORKERS_PROF, WorkerProfiler, merge_worker_profiles
from gpuscope.record import CollectorStatus, FunctionStat, PythonProfile, Window

if TYPE_CHECKING:
    from gpuscope.collect.framework.options import CollectOptions
    from gpuscope.collect.framework.schedule import Plan, Window

PROF_FILE = "python.prof"
DEFAULT_STEPS = CPROFILE_STEPS
PAUSED_IMPORTS = ("torch", "torch._dynamo")
"""Imports the start-up profile pauses for: torch's own (about 1.5 s on a 2-core machine, more under cProfile), and
torch._dynamo's, which torch runs at the script's first optimizer (as long again: 1.8 s of a 6-step script's 3 s)."""
TOP_FUNCTIONS = 15
_GPUSCOPE_DIR = str(Path(__file__).resolve().parent.parent) + os.sep


@register
class CProfileCollector(StepFollower):
    """cProfile over the start-up and a window of steps (``steps=None``: the whole run)."""

    name: ClassVar[str] = "cprofile"
    field: ClassVar[str | None] = "python_profile"
    _running: ClassVar[CProfileCollector | None] = None  # read in a forked child, to stop the inherited profile
    _fork_hook: ClassVar[bool] = False

    def __init__(self, steps: int | None = DEFAULT_STEPS, first: int = 0) -> None:
        """``first``: the window's first step; past 0 (``--skip-steps``), the start-up is not profiled."""
        self.steps = steps
        self.first = first
        self._closed = False
        self._startup = cProfile.Profile()
        self._loop: cProfile.Profile | None = None
        self._active: cProfile.Profile | None = None
        self._last_step: int | None = None
        self._error: str | None = None
        self._importing = 0  # PAUSED_IMPORTS running: the start-up profile is off while it is above 0
        self._unwrap: Callable[[], None] | None = None
        self._workers_error: str | None = None
        self._forwards: frozenset[tuple[str, int, str]] | None = None  # the timed modules' forwards (``_close``)

    @classmethod
    def wants(cls, options: CollectOptions) -> WindowRequest | None:
        """The first steps, from step 0 (the start-up runs profiled before it); the whole run profiles steps that
        other windows own too, as the user asked."""
        if options.cprofile_steps is None:  # the whole run, or all of it from the skipped steps on
            return WindowRequest(1, startup=True) if options.skip_steps else None
        return WindowRequest(options.cprofile_steps, startup=True)

    @classmethod
    def create(cls, options: CollectOptions, plan: Plan) -> CProfileCollector:
        return cls(options.cprofile_steps, first=plan.start(cls.name) or 0)

    def unavailable_reason(self) -> str | None:
        return profiler_in_use()

    def move_window(self, cpu: Window | None, cuda: Window | None) -> None:
        """Steps are long, or few are measured: the window ends where ``cpu`` does (at once, where that has
        passed)."""
        if cpu is not None and self.steps is not None and not self._closed:
            self.steps = min(self.steps, cpu.steps)


    def start(self, run_dir: Path) -> None:
        self._run_dir = run_dir
        if not CProfileCollector._fork_hook:  # at-fork hooks cannot be removed: one for the process
            os.register_at_fork(after_in_child=_stop_inherited_profile)
            CProfileCollector._fork_hook = True
        CProfileCollector._running = self
        self._workers = WorkerProfiler(run_dir)
        self._watches = [ImportWatch(name, functools.partial(self._imported, name), before=self._importing_begins)
                         for name in PAUSED_IMPORTS]
        for watch in self._watches:
            watch.install()
        if not self.first:
            self._open(self._startup)

    def _importing_begins(self) -> None:
        self._importing += 1
        if self._importing == 1 and self._active is self._startup:
            self._startup.disable()

    def _imported(self, name: str) -> None:
        # installing a watch of a module already imported calls this at once, with no import paused
        if self._importing:
            self._importing -= 1
            # only what _importing_begins paused: with torch imported before the run (a notebook, gpuscope.profile()),
            # the start-up profile is running, and enabling it again raises on Python 3.12+ (one profiler at a time)
            if not self._importing and self._active is self._startup:
                self._startup.enable()
        if name == "torch":
            self._torch_imported()

    def _torch_imported(self) -> None:
        try:
            self._unwrap = self._workers.install()
        except Exception as exc:  # an older torch: workers are just not profiled
            self._workers_error = f"DataLoader workers not profiled: {exc}"

    def _on_step(self, index: int) -> None:
        """Step ``index`` begins."""
        if self._closed:
            self._unfollow()
            return
        if self._active is None:
            if self.first and index >= self.first:  # a window after skipped steps: no start-up profile
                self._loop = cProfile.Profile()
                self._open(self._loop)
            return
        if self.steps is not None and index >= self.first + self.steps:
            self._close(last_step=index - 1)
        elif self._active is self._startup and index >= 1:  # the first step belongs to the start-up
            self._loop = cProfile.Profile()
            self._switch(self._loop)

    def _open(self, profile: cProfile.Profile) -> None:
        self._switch(profile)
        if self._active is None:  # it could not be enabled (the reason is the status)
            self._closed = True
        elif self._events is not None:
            self._events.window_opened()

    def _switch(self, profile: cProfile.Profile | None) -> None:
        try:
            if self._active is not None:
                self._active.disable()
            if profile is not None:
                profile.enable()
        except Exception as exc:  # never into the user's step
            # Python 3.12+: cProfile takes sys.monitoring's one profiler slot for the whole process, and another
            # profiler (a leftover enabled cProfile included) holds it
            self._error = profiler_in_use() or f"cProfile could not be switched: {exc}"
            profile = None
        self._active = profile

    def _close(self, last_step: int | None) -> None:
        self._closed = True
        self._switch(None)
        self._last_step = last_step
        if self._events is not None:
            self._events.window_closed()
            # read while the models live (one made inside the script's train() is gone by the run's end)
            self._forwards = forward_codes([*self._events.root_modules(), *self._events.frozen_modules()])

    def stop(self) -> CollectorResult:
        CProfileCollector._running = None
        for watch in self._watches:
            watch.remove()
        if self._unwrap is not None:
            self._unwrap()
        whole_run = self._active is not None
        if self._active is not None:
            seen = self._events.steps_seen() if self._events is not None else 0
            self._close(last_step=seen - 1)
        if self._error:
            return CollectorResult(CollectorStatus("failed", self._error))
        if self.first and self._loop is None:
            return CollectorResult(CollectorStatus(
                "unavailable", f"the run ended before step {self.first}, where its window was to begin"))
        # each profile is turned into statistics once (tenths of a second for a start-up that imported torch);
        # the start-up's become the whole file's once its own figures are read
        loop = pstats.Stats(self._loop) if self._loop is not None else None
        startup = pstats.Stats(self._startup) if not self.first else None
        focus = loop if loop is not None else startup  # no loop: the whole run was start-up
        top_own, top_cumulative = top_functions(focus, by="own"), top_functions(focus, by="cumulative")
        startup_s = startup.total_tt if startup is not None else 0.0  # type: ignore[attr-defined]
        combined = startup if startup is not None else loop
        if loop is not None and startup is not None:
            startup.add(loop)
        combined.dump_stats(str(self._run_dir / PROF_FILE))  # type: ignore[union-attr]
        last = self._last_step if self._last_step is not None and self._last_step >= self.first else None
        profile = PythonProfile(
            window=Window(first_step=self.first if last is not None else None, last_step=last,
                          startup=not self.first),
            whole_run=whole_run and not self.first,
            total_s=combined.total_tt,  # type: ignore[union-attr]
            startup_s=startup_s,
            top_own=top_own,
            top_cumulative=top_cumulative,
            between_phases=between_phases(loop, forwards=self._forwards) if loop is not None else (),
            **self._worker_fields(),
        )
        return CollectorResult(CollectorStatus("ok"), profile)


    def _worker_fields(self) -> dict[str, Any]:
        stats, workers = merge_worker_profiles(self._run_dir)
        if stats is None:
            note = self._workers_error or (
                "no DataLoader worker was forked (workers started by spawn or forkserver are not profiled; "
                "with num_workers=0 the data pipeline runs in the main process and is in python.prof)")
            return {"workers_profiled": False, "workers_note": note}
        return {
            "workers_profiled": True,
            "workers_note": f"{workers} forked DataLoader worker processes, their first {self._workers.batches} batches "
                            f"each: {WORKERS_PROF}",
            "workers_top_own": top_functions(stats, by="own"),
        }


def profiler_in_use() -> str | None:
    """Why cProfile cannot start here, or None: another profiler holds ``sys.setprofile`` (Python 3.11 and
    older) or the profiler slot of ``sys.monitoring`` (3.12+, where cProfile itself uses it and ``getprofile()``
    stays None while it runs)."""
    if sys.getprofile() is not None:
        return "another profiler (or a debugger) is already using sys.setprofile"
    monitoring = getattr(sys, "monitoring", None)
    holder = monitoring.get_tool(monitoring.PROFILER_ID) if monitoring is not None else None
    if holder is not None:
        return f"another profiler ({holder}) is already running in this process"
    return None


def _stop_inherited_profile() -> None:
    """In a forked child: stop the profile the parent's thread had running; the child's copy would never be
    read, and would slow the child (a DataLoader worker) all its life."""
    collector = CProfileCollector._running
    if collector is not None and collector._active is not None:
        try:
            collector._active.disable()
        except Exception:
            pass
        collector._active = None


def top_functions(stats: pstats.Stats, by: str, limit: int = TOP_FUNCTIONS) -> tuple[FunctionStat, ...]:
    """The user's heaviest functions by own (``own``) or cumulative (``cumulative``) time; gpuscope's own
    functions and the profiler's are left out, and so are the calls gpuscope made to built-ins (its root-module
    search's ``gc.get_objects`` and ``issubclass``): python.prof keeps everything."""
    column = 4 if by == "own" else 5
    table: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    rows = [(file, line, function, *_users_share(calls, own, cumulative, callers if file == "~" else {}))
            for (file, line, function), (_, calls, own, cumulative, callers) in table.items()
            if not file.startswith(_GPUSCOPE_DIR) and "_lsprof.Profiler" not in function]
    rows = [row for row in rows if row[3]]
    rows.sort(key=lambda r: (-r[column], r[0], r[1], r[2]))  # thousands of rows: only the top are named
    return tuple(FunctionStat(function, short_path(file), line, calls, own, cumulative)
                 for file, line, function, calls, own, cumulative in rows[:limit])


MODULE_CALL = ("/torch/nn/modules/module.py", "_call_impl")
PHASE_CODE = (MODULE_CALL, ("/torch/autograd/__init__.py", ""), ("/torch/_tensor.py", "backward"),
              ("/torch/optim/", ""), ("/torch/utils/data/", ""))
"""(file, function) of the code that makes a step's phases (any function of the file where none is named): a
module's call (forward), autograd's backward, an optimizer, a DataLoader. Where the steps' timed modules are known,
their forwards stand for the module's call: another module the loop calls (a torchmetrics collection, a loss
module) runs between the phases, as the steps time it."""
NOT_PHASE_CODE = ("/torch/optim/swa_utils.py", "/torch/optim/lr_scheduler.py")
"""torch.optim's files whose code runs outside an optimizer's step: a weight average's update (``AveragedModel``'s
EMA, timed in "other"), a learning-rate schedule."""
BETWEEN_PHASES = 3


def forward_codes(models: list[Any]) -> frozenset[tuple[str, int, str]] | None:
    """The profile keys of the ``forward`` of ``models`` and of every module they hold, each unwrapped from its
    decorators (``functools.wraps``); None without a model, or where they cannot be read (the module's call stands
    for them). Read at a step boundary: never raises into the user's step."""
    import inspect

    codes = set()
    try:
        for model in models:
            for module in model.modules():
                forward = getattr(type(module), "forward", None)
                code = getattr(inspect.unwrap(forward), "__code__", None) if forward is not None else None
                if code is not None:
                    codes.add((code.co_filename, code.co_firstlineno, code.co_name))
    except Exception:  # a model's own modules() or a decorator's __wrapped__ gone wrong
        return None
    return frozenset(codes) if models else None


def between_phases(stats: pstats.Stats, limit: int = BETWEEN_PHASES,
                   forwards: frozenset[tuple[str, int, str]] | None = None) -> tuple[FunctionStat, ...]:
    """The functions of ``stats`` that neither call into a phase's code (``PHASE_CODE``) nor are called from inside
    it only, heaviest by cumulative time first: the code between the phases (an EMA update after the optimizer's
    step). The script's own (``callsites.is_user_file``), and a library's that the loop calls itself
    (``_called_by_the_loop``: ``AveragedModel.update_parameters``) unless it only wraps the script's (a decorator's
    ``decorate_context``); not the standard library's, gpuscope's or a built-in (``~``). ``forwards``: the timed
    modules' (``forward_codes``)."""
    table: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    callees: dict[tuple[str, int, str], list[tuple[str, int, str]]] = {}
    for key, (*_, callers) in table.items():
        for caller in callers:
            callees.setdefault(caller, []).append(key)
    phase = [key for key in table if _is_phase_code(key, module_calls=forwards is None) or key in (forwards or ())]
    inside = _only_under(phase, table, callees)
    around = _reach(phase, lambda key: table[key][4] if key in table else ())
    between = {key: row for key, row in table.items()
               if key not in inside and key not in around and key[0] != "~" and row[3] > 0}
    scripts = {key for key in between if is_user_file(key[0])}
    rows = [(key, row) for key, row in between.items() if key in scripts or (
        _called_by_the_loop(key, row) and not scripts & _reach([key], lambda k: callees.get(k, ())))]
    rows.sort(key=lambda item: -item[1][3])
    named: list[FunctionStat] = []
    under: set[tuple[str, int, str]] = set()  # what the functions named call: their time is in the named ones'
    for (file, line, function), row in rows:
        if len(named) == limit:
            break
        if (file, line, function) in under:
            continue
        named.append(FunctionStat(function, short_path(file), line, row[1], row[2], row[3]))
        under |= _reach([(file, line, function)], lambda key: callees.get(key, ()))
    return tuple(named)


def _is_phase_code(key: tuple[str, int, str], module_calls: bool = True) -> bool:
    """``module_calls``: a module's call is phase code (no timed module known)."""
    path = key[0].replace(os.sep, "/")
    return any(part in path and (not function or key[2] == function)
               and (module_calls or (part, function) != MODULE_CALL)
               for part, function in PHASE_CODE) and not path.endswith(NOT_PHASE_CODE)


def _loop_calls(row: tuple[Any, ...]) -> int:
    """A function's calls from the loop's own frame: calls with no caller in the profile come from the frames that
    ran before it began, and of those only the loop's goes on from step to step (the step boundary's and an
    optimizer's frames, running as the profile began, end within the step: one such call at most)."""
    unseen = row[1] - sum(edge[0] for edge in row[4].values())
    return unseen if unseen >= 2 else 0


def _called_by_the_loop(key: tuple[str, int, str], row: tuple[Any, ...]) -> bool:
    """A library's function (a site-package's, torch's) called from the script's code or the loop's own frame, or the
    forward of a library's module called there (its timed modules' are phase code), by name: not a special method (a
    module's ``__setattr__``, which a framework's loop sets attributes through) nor a comprehension."""
    file, _, function = key
    if not is_library_file(file) or function.startswith("<") or (function.startswith("__") and function.endswith("__")):
        return False
    return any(caller[0] != "~" and (is_user_file(caller[0]) or (_module_call(caller) and function == "forward"))
               for caller in row[4]) or _loop_calls(row) > 0


def _module_call(key: tuple[str, int, str]) -> bool:
    """torch's call of a module (``module(x)``): what it calls is the forward of a module the caller called."""
    return key[0].replace(os.sep, "/").endswith(MODULE_CALL[0]) and key[2] in ("_call_impl", "_wrapped_call_impl")


def _only_under(phase: list[Any], table: dict[Any, tuple[Any, ...]], callees: dict[Any, list[Any]]) -> set[Any]:
    """``phase`` and the functions called only from inside it (every caller but themselves inside). A function
    also called from outside is not (Lightning's ``_call_callback_hooks``, called from inside the optimizer's closure
    and from the loop, between the phases, where it calls the script's ``on_train_batch_end``); nor is one the loop's
    own frame calls (``_loop_calls``: ``torch.no_grad``'s ``decorate_context`` around an EMA update, and around
    torch's own code inside the optimizer)."""
    outside = {key: len(set(row[4]) - {key}) + (_loop_calls(row) > 0) for key, row in table.items()}
    inside = set(phase)
    todo = list(phase)
    while todo:
        for callee in callees.get(todo.pop(), ()):
            if callee in inside:
                continue
            outside[callee] -= 1
            if outside[callee] <= 0:
                inside.add(callee)
                todo.append(callee)
    return inside


def _reach(start: list[Any], step: Callable[[Any], Any]) -> set[Any]:
    seen = set(start)
    todo = list(start)
    while todo:
        for nxt in step(todo.pop()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _users_share(calls: int, own: float, cumulative: float, callers: dict[Any, tuple[Any, ...]]) -> tuple[
        int, float, float]:
    """A built-in's calls, own and cumulative time less those of its calls that came from gpuscope's code."""
    for (file, _, _), (caller_calls, _, caller_own, caller_cumulative) in callers.items():
        if file.startswith(_GPUSCOPE_DIR):
            calls, own, cumulative = calls - caller_calls, own - caller_own, cumulative - caller_cumulative
    return calls, max(own, 0.0), max(cumulative, 0.0)


def short_path(file: str) -> str:
    """A function's file as the user knows it: from site-packages (a virtual environment in the project's folder
    too), relative to the cwd, or from the stdlib; never a home directory."""
    if file == "~" or not os.path.isabs(file):
        return file  # built-ins ("~") and synthetic names ("<string>")
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in file:
            return file.split(marker, 1)[1]
    cwd = os.getcwd() + os.sep
    if file.startswith(cwd):
        return file[len(cwd):]
    stdlib = sysconfig.get_paths()["stdlib"] + os.sep
    if file.startswith(stdlib):
        return "<stdlib>/" + file[len(stdlib):]
    return os.path.basename(file)
