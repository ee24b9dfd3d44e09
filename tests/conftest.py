"""Shared test helpers: building records by hand, running gpuscope and python as a user would, checking every
run.json against docs/run.schema.json, and the slow tier's real runs, each made once per session and shared."""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import jsonschema
import pytest

from gpuscope.record import Breakdown, RunRecord, Steps
from preloaded import Preloaded
from processes import processes_in_session, processes_mentioning
from run_groups import scheduler

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_workloads"
SCRIPTS = Path(__file__).resolve().parent / "fixtures" / "scripts"
RUN_SCHEMA = ROOT / "docs" / "run.schema.json"


def make_record(**overrides: Any) -> RunRecord:
    """A plausible record of a finished run; keyword arguments replace its fields."""
    base = RunRecord(
        gpuscope_version="0.0.test",
        command=("train.py", "--epochs", "1"),
        steps=Steps(count=40, median_s=0.1, mean_s=0.1, total=42, warmup=2, source="optimizer"),
        breakdown=Breakdown(data_wait=0.1, forward=0.3, backward=0.4, optimizer=0.1, other=0.1),
    )
    return dataclasses.replace(base, **overrides)


def child_env() -> dict[str, str]:
    """The environment for child processes: unbuffered, with no inherited coverage or debugging hooks."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONSTARTUP", None)
    return env


def run_python(args: list[str], cwd: Path, timeout: float = 120, preloaded: bool = False,
               **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in ``cwd``; ``preloaded``: from the python with torch imported (``run_gpuscope``)."""
    if preloaded:
        return PRELOADED.run(args, cwd, child_env(), timeout, **kwargs)[0]
    return subprocess.run([sys.executable, *args], cwd=cwd, env=child_env(), capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def run_gpuscope(args: list[str], cwd: Path, timeout: float = 120, preloaded: bool = False,
                 **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``python -m gpuscope ARGS`` in ``cwd``; ``preloaded``: from a python with torch already imported
    (``PRELOADED``), for runs that test no part of the process's own start. With ``-o DIR``, also checks that no
    process it started (a probe, a DataLoader worker, a rank) is left once it has ended."""
    if preloaded:
        result, session = PRELOADED.run(["-m", "gpuscope", *args], cwd, child_env(), timeout, **kwargs)
        leftovers = functools.partial(processes_in_session, session)
    else:
        result = run_python(["-m", "gpuscope", *args], cwd, timeout, **kwargs)
        out = args[args.index("-o") + 1] if "-o" in args[:-1] else None
        leftovers = functools.partial(processes_mentioning, out) if out else list  # the processes name DIR
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := leftovers()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"gpuscope {' '.join(args)} left processes behind: {left}"
    return result


PRELOADED = Preloaded(child_env())
"""The session's python with torch imported, started on first use (tests/preloaded.py)."""


TWO_WORKERS_WAIT = 0.35
"""The data wait the data-bound sample may keep with two DataLoader workers on this machine's two cores (three busy
processes): around the 20% at which loading bounds the run (18% and 25% in one CI's two such runs, whose verdicts
then differed), far under the 70-95% without them. Tests that apply the workers fix accept a data-loading verdict
up to it."""


def run_job(tmp_path: Path, script: Path | str, *args: str, torchrun: bool = False,
            options: tuple[str, ...] = ()) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """A 2-rank job of ``script ARGS`` (gloo on this CPU), every rank under ``gpuscope run --no-probes OPTIONS`` (its
    post-run probes skipped: these jobs check the ranks, the merge and the communication), launched by gpuscope
    (``--nproc-per-node 2``) or by ``torchrun -m gpuscope run``: its merged record (its folder in ``_dir``) and the
    launch's result."""
    job = tmp_path / "job"
    own = ["-o", str(job), "--no-probes", *options, str(script), *args]
    if torchrun:
        result = run_python(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", "gpuscope", "run", *own], tmp_path, timeout=240)
    else:
        result = run_gpuscope(["run", "--nproc-per-node", "2", *own], tmp_path, timeout=240)
    assert (job / "run.json").is_file(), result.stderr
    record = load_run(job)
    record["_dir"] = job
    return record, result


def loading_cleared(record: dict[str, Any]) -> bool:
    """Whether a run of the data-bound sample with its workers fix applied is no longer bound by loading: its verdict
    says so, or its data wait is down to what two workers on two cores leave (``TWO_WORKERS_WAIT``)."""
    return record["verdict"]["bound"] != "data-loading" or record["breakdown"]["data_wait"] < TWO_WORKERS_WAIT


LEFTOVER_GRACE_S = 6.0
"""How long a process gpuscope started may outlive it: a DataLoader worker whose parent ended without shutting it
down notices within torch's 5 s status check."""


@functools.cache
def run_schema() -> jsonschema.Draft202012Validator:
    """A validator of docs/run.schema.json (checked to be a valid draft 2020-12 schema first)."""
    schema = json.loads(RUN_SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def schema_errors(data: Any) -> list[str]:
    """Where ``data`` breaks docs/run.schema.json, one line each (empty: it is a valid run.json)."""
    errors = sorted(run_schema().iter_errors(data), key=lambda e: list(e.absolute_path))
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]


def validate_run(data: Any, where: object = "run.json") -> None:
    """Fail the test if ``data`` is not a run.json as docs/run.schema.json describes it."""
    errors = schema_errors(data)
    assert not errors, f"{where} does not match docs/run.schema.json:\n" + "\n".join(errors[:20])


def collect_garbage() -> None:
    """A test's garbage collected (its models, which a later test's scan for root modules would find), and what is
    left frozen: the next collection, this one's or one Python makes by itself, scans only what later tests make. A
    full collection of a process holding torch and torch._dynamo (millions of objects) took 0.35-0.4 s; the fast
    tier ran 85 s on one core with a plain collection here, 52 s with this."""
    gc.collect()
    gc.freeze()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_run(run_dir: Path) -> dict[str, Any]:
    """The parsed run.json of a run folder, validated against docs/run.schema.json, its figures checked
    (``figures_check``: no share of a step above the whole, no negative time)."""
    from figures_check import figure_errors

    path = run_dir / "run.json"
    data = json.loads(path.read_text())
    validate_run(data, path)
    errors = figure_errors(data)
    assert not errors, f"{path}: " + "; ".join(errors[:10])
    return data


@pytest.fixture
def scripts() -> Path:
    """The folder of small test scripts."""
    return SCRIPTS


@pytest.fixture
def shown() -> Any:
    """The warnings that reach the user: a ``showwarning`` in place before the run, under Python's own filters (a
    warning shown once per line that warns)."""
    seen: list[str] = []
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.simplefilter("default")

        def showwarning(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                        line: Any = None) -> None:
            seen.append(str(message))

        warnings.showwarning = showwarning
        yield seen


def pytest_addoption(parser: pytest.Parser) -> None:
    """``pytest --update-golden`` rewrites the report's golden files instead of comparing with them."""
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/report/golden/*.html from the current templates")


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as a terminal gives it to the processes the tests start: a child inherits an ignored SIGINT, and
    pytest-xdist's workers (CI's slow tier, three at a time) and a shell's background jobs ignore it, where a script's
    Ctrl-C (test_runner.py) and the stop of ``gpuscope view`` (test_view.py) would then do nothing."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``timing`` must be ``slow`` too: CI runs the slow tier as "slow and not timing", then "slow and
    timing" (.ci/run), and the fast tier would take a fast one marked timing for its own."""
    stray = [item.nodeid for item in items if item.get_closest_marker("timing") and not item.get_closest_marker("slow")]
    if stray:
        raise pytest.UsageError(f"marked timing but not slow: {', '.join(stray)}")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: called only where it runs the tests
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` sends the tests out by run group (tests/run_groups.py)."""
    return scheduler(config, log) if config.getvalue("dist") == "loadgroup" else None


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """Whether this run rewrites golden files (``--update-golden``)."""
    return bool(request.config.getoption("--update-golden"))


# -- the slow tier: real runs, each made once per session -------------------------------------------------------

T = TypeVar("T")
CONCURRENT_RUNS = 2
"""Processes run side by side by ``side_by_side`` (the CI machine has two cores)."""


def side_by_side(*calls: Callable[[], T]) -> list[T]:
    """The results of ``calls``, run ``CONCURRENT_RUNS`` at a time. Only for runs whose tests check no timing: two
    processes at once share the cores, which a test of step times or of a probe's prediction would notice."""
    with ThreadPoolExecutor(CONCURRENT_RUNS) as pool:
        return list(pool.map(lambda call: call(), calls))


SAMPLE_ARGS = {
    "data_loading_bound": ("--steps", "24", "--print-step-times"),
    "cpu_launch_bound": ("--steps", "400", "--print-step-times"),
    "compute_bound": ("--steps", "18", "--print-step-times"),
    "data_loading_shared_cores": ("--steps", "60"),
}
"""The shared run of the samples several tests read: enough steps for each of them (the verdict, every collector's
output, the probes)."""
OWN_FIGURES = re.compile(r"steps=(\d+) median_step_s=([0-9.]+) data_wait_fraction=([0-9.]+)")
"""The line each sample workload prints about itself at the end."""
OWN_STEP_TIMES = re.compile(r"^step_times_s=([0-9.,]+)$", re.MULTILINE)
"""...and, with ``--print-step-times``, each step's time as the script measured it."""


@dataclasses.dataclass(frozen=True)
class Run:
    """One ``gpuscope run -q -o RUN_DIR [OPTIONS] SCRIPT [ARGS]`` and what it left."""

    run_dir: Path
    result: subprocess.CompletedProcess[str]

    @property
    def record(self) -> dict[str, Any]:
        """run.json, validated, with ``_run_dir`` added; a fresh copy each time, so no test can spoil a shared run."""
        assert self.result.returncode == 0, self.result.stderr
        record = load_run(self.run_dir)
        record["_run_dir"] = self.run_dir
        return record

    @property
    def own(self) -> dict[str, float]:
        """What a sample workload measured of itself (its last line)."""
        assert self.result.returncode == 0, self.result.stderr
        match = OWN_FIGURES.search(self.result.stdout)
        assert match, self.result.stdout
        return {"steps": int(match.group(1)), "median_step_s": float(match.group(2)),
                "data_wait_fraction": float(match.group(3))}

    @property
    def own_step_times(self) -> list[float]:
        """Each step's time as the sample measured it (run with ``--print-step-times``), in step order."""
        assert self.result.returncode == 0, self.result.stderr
        match = OWN_STEP_TIMES.search(self.result.stdout)
        assert match, self.result.stdout
        return [float(t) for t in match.group(1).split(",")]


class Runs:
    """Real ``gpuscope run`` runs for the slow tier, made once per pytest session for each distinct command line:
    tests that ask for the same run share it (and must not write into its folder what another test checks). Runs
    start from the preloaded python (``run_gpuscope``) unless asked for with ``preloaded=False``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._made: dict[tuple[object, ...], Run] = {}
        self._numbers = itertools.count(1)

    def get(self, script: Path, *args: str, options: tuple[str, ...] = (), fresh: bool = False,
            timeout: float = 180, preloaded: bool = True) -> Run:
        """The run of ``script args`` under ``gpuscope run options``; ``fresh``: a new one even if it was made."""
        key = self._key(script, args, options, preloaded)
        if fresh or key not in self._made:
            run = self._run(script, args, options, timeout, preloaded)
            if fresh:
                return run
            self._made[key] = run
        return self._made[key]

    def prefetch(self, *runs: tuple[Path, tuple[str, ...], tuple[str, ...]], preloaded: bool = True) -> None:
        """Make the runs ``(script, args, options)`` not made yet, side by side (``side_by_side``): only for runs
        whose tests check no timing."""
        todo = [(script, args, options) for script, args, options in dict.fromkeys(runs)
                if self._key(script, args, options, preloaded) not in self._made]
        made = side_by_side(*(functools.partial(self._run, script, args, options, 180, preloaded)
                              for script, args, options in todo))
        for (script, args, options), run in zip(todo, made):
            self._made[self._key(script, args, options, preloaded)] = run

    @staticmethod
    def _key(script: Path, args: tuple[str, ...], options: tuple[str, ...], preloaded: bool) -> tuple[object, ...]:
        """What tells runs apart: the command line, and whether it started preloaded."""
        return (preloaded, *options, "--", str(script), *args)

    def _run(self, script: Path, args: tuple[str, ...], options: tuple[str, ...], timeout: float,
             preloaded: bool) -> Run:
        folder = self.base / f"{next(self._numbers):02d}-{script.stem}"  # numbered in the order of asking
        folder.mkdir()
        run_dir = folder / "run"
        result = run_gpuscope(["run", "-q", "-o", str(run_dir), *options, str(script), *args], folder, timeout,
                              preloaded)
        return Run(run_dir, result)

    def sample(self, workload: str, *args: str, options: tuple[str, ...] = (), fresh: bool = False) -> Run:
        """A run of ``sample_workloads/WORKLOAD.py ARGS``; without ARGS, the workload's shared run (SAMPLE_ARGS)."""
        return self.get(SAMPLES / f"{workload}.py", *(args or SAMPLE_ARGS[workload]), options=options, fresh=fresh)


def compare_runs(a: dict[str, Any], b: dict[str, Any], *options: str) -> subprocess.CompletedProcess[str]:
    """``gpuscope compare`` of two runs' records (``Run.record``): B's folder gets compare.html."""
    return run_gpuscope(["compare", str(a["_run_dir"]), str(b["_run_dir"]), *options], a["_run_dir"])


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The session's shared real runs."""
    return Runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(autouse=True)
def _slow_runs_leave_valid_run_json(request: pytest.FixtureRequest) -> Any:
    """An integration test runs real code, so every run.json it leaves under its tmp_path was written by gpuscope:
    each is validated against docs/run.schema.json after the test (other tests write hand-made, even broken, ones)."""
    integration = ROOT / "tests" / "integration"
    if (request.node.get_closest_marker("slow") is None or "tmp_path" not in request.fixturenames
            or integration not in Path(request.node.path).parents):
        yield
        return
    tmp_path = request.getfixturevalue("tmp_path")  # set up before this fixture's end, so still there after the test
    yield
    for path in sorted(tmp_path.rglob("run.json")):
        validate_run(json.loads(path.read_text()), path)
