"""The slow tier's run groups (tests/run_groups.py): how CI's untimed part shares its runs among its workers."""

from __future__ import annotations

import re

from conftest import ROOT
from run_groups import BY_PARAMETER, LONGEST_FIRST, SHARES_RUNS_WITH, rank, run_group

FRAMEWORKS = "tests/integration/test_frameworks.py"


def test_a_files_tests_are_one_group_and_the_framework_matrix_a_group_per_framework() -> None:
    runner = "tests/integration/test_runner.py"
    assert run_group(f"{runner}::test_exit_status_is_the_scripts_and_the_run_is_written[normal]") == runner
    assert run_group(f"{runner}::test_sigterm_exits_143_with_the_run_written") == runner
    tests = ("test_a_framework_script_runs_as_under_python", "test_slow_data_is_called_data_loading_bound")
    for framework in ("lightning-trainer", "manual-sgd"):
        assert {run_group(f"{FRAMEWORKS}::{test}[{framework}]") for test in tests} == {f"{FRAMEWORKS}[{framework}]"}
    # a test of the file that runs no framework of the matrix is the file's
    assert run_group(f"{FRAMEWORKS}::test_an_optimizer_closure_leaves_only_the_update_in_the_optimizer_phase") == \
        FRAMEWORKS


def test_the_longest_groups_go_first_and_name_groups_that_exist() -> None:
    assert rank(f"{FRAMEWORKS}[lightning-trainer]") == 0
    assert rank("tests/integration/test_view.py") == len(LONGEST_FIRST)  # a short group: after the listed ones
    for group in LONGEST_FIRST:  # a renamed file or parameter would silently lose its place
        path, _, parameter = group.partition("[")
        assert (ROOT / path).is_file(), group
        if parameter:
            assert path in BY_PARAMETER
            assert re.search(re.escape(parameter.rstrip("]")), (ROOT / path).read_text()), group


def test_a_test_that_shares_another_files_run_is_in_that_files_group() -> None:
    browser = "tests/report/test_browser.py"
    assert run_group(f"{browser}::test_the_report_of_a_fresh_run_works_in_a_browser") == \
        "tests/integration/test_collectors.py"
    assert run_group(f"{browser}::test_hostile_names_stay_text_in_a_browser") == browser
    for nodeid, group in SHARES_RUNS_WITH.items():  # a renamed test would silently make its run twice
        path, _, name = nodeid.partition("::")
        assert f"def {name}(" in (ROOT / path).read_text(), nodeid
        assert (ROOT / group).is_file(), group
