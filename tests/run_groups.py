"""How the slow tier's untimed part goes out to pytest-xdist's workers (``.ci/run``: ``-n 3 --dist loadgroup``): by
*run group*, the tests that share real runs, so that each run is made once, by one worker.

A run group is a test file, whose module and session fixtures share runs among its tests, except in the files of
``BY_PARAMETER``, whose runs are made per parameter (a framework of the matrix, a DataLoader start method): there
each parameter's tests are a group of their own, and the longest file of the tier (five frameworks, about 100 s
alone) spreads over the workers instead of holding one of them to the end. The groups go out longest first
(``LONGEST_FIRST``, from ``--durations``), so that no long group starts last; a group left out of that list, or
in the wrong place, costs time, never a wrong result.

pytest-xdist's own ``loadgroup`` (groups from ``xdist_group`` marks) no longer groups anything under pytest 9, whose
node ids it cannot amend; its ``loadscope`` scheduler does the sending here, with these groups as its scopes.
"""

from __future__ import annotations

from typing import Any

BY_PARAMETER = ("tests/integration/test_frameworks.py", "tests/integration/test_steps.py")
"""Test files whose runs are made per parameter: each parameter's tests are a run group."""

LONGEST_FIRST = (
    "tests/integration/test_frameworks.py[lightning-trainer]",
    "tests/integration/test_probe_safety.py",
    "tests/integration/test_runner.py",
    "tests/integration/test_try.py",
    "tests/integration/test_try_loss.py",
    "tests/integration/test_frameworks.py[transformers-trainer]",
    "tests/integration/test_distributed.py",
    "tests/integration/test_sharded_jobs.py",
    "tests/integration/test_collectors.py",
    "tests/integration/test_frameworks.py[accelerate-accumulation]",
    "tests/integration/test_profile_api.py",
    "tests/integration/test_frameworks.py[torch-compile]",
    "tests/report/test_browser.py",
    "tests/integration/test_steps.py[spawn]",
    "tests/integration/test_steps.py[forkserver]",
    "tests/integration/test_profile_window.py",
    "tests/integration/test_frameworks.py[manual-sgd]",
    "tests/integration/test_notebook.py",
    "tests/integration/test_steps.py[fork]",
)
"""The longest run groups, longest first (the others follow in the order they were collected)."""


SHARES_RUNS_WITH = {
    "tests/report/test_browser.py::test_the_report_of_a_fresh_run_works_in_a_browser":
        "tests/integration/test_collectors.py",
    "tests/report/test_browser.py::test_a_report_handed_over_while_the_script_ran_works_in_a_browser":
        "tests/integration/test_profile_window.py",
}
"""Tests whose run another file's tests make too (the session's run of the data-loading sample, the long job that
hands its report over mid-run): in that file's group, so that the run is made once (a worker that takes them starts
its own browser, a second, against a run of 10-20 s made twice)."""


def run_group(nodeid: str) -> str:
    """The run group of the test ``nodeid``."""
    if nodeid in SHARES_RUNS_WITH:
        return SHARES_RUNS_WITH[nodeid]
    path, _, name = nodeid.partition("::")
    if path in BY_PARAMETER and name.endswith("]") and "[" in name:
        return path + name[name.index("["):]
    return path


def rank(group: str) -> int:
    """Where ``group`` goes out: the longest groups first, the others after them."""
    return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)


def scheduler(config: Any, log: Any) -> Any:
    """pytest-xdist's scheduler sending whole run groups, the longest first."""
    from xdist.scheduler import LoadScopeScheduling  # only where pytest-xdist runs the tests

    class RunGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return run_group(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # the longest group left goes next (the scheduler takes the first of its queue, in collection order)
            self.workqueue.move_to_end(min(self.workqueue, key=rank), last=False)
            super()._assign_work_unit(node)

    return RunGroupScheduling(config, log)
