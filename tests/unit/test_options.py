"""The run options, declared once: ``gpuscope run``, ``gpuscope.profile()`` and the ``%%gpuscope`` magic take the
same options with the same defaults, and all of them turn into the same collectors' options."""

from __future__ import annotations

import dataclasses

import pytest

import gpuscope
from gpuscope.cli import _parse, build_parser
from gpuscope.collect.collectors import CollectOptions
from gpuscope.errors import GpuscopeError
from gpuscope.options import RunOptions

CHOSEN = ["-o", "runs/x", "--cprofile-all", "--trace-steps", "0", "--trace-max-mb", "2", "--probe-loader",
          "--no-probes"]
EXPECTED = CollectOptions(cprofile_steps=None, trace_steps=0, trace_max_bytes=2 * 2**20, probe_loader=True,
                          probes=False)


def cli_options(tokens: list[str]) -> RunOptions:
    return RunOptions.from_args(_parse(build_parser(), ["run", *tokens, "train.py"]))


def test_with_no_options_the_cli_the_api_and_the_magic_agree_with_the_collectors_defaults() -> None:
    # given no options anywhere
    # when each way in reads them
    cli, magic, api = cli_options([]), RunOptions.parse("", prog="%%gpuscope"), gpuscope.profile().options
    # then they are one and the same, and the collectors get their own defaults
    assert cli == magic == api == RunOptions()
    assert RunOptions().collect_options() == CollectOptions()


def test_the_same_choices_give_the_same_collectors_options_in_the_cli_the_api_and_the_magic() -> None:
    # given the same choices, spelled as options and as keyword arguments
    keywords = {"output": "runs/x", "cprofile_all": True, "trace_steps": 0, "trace_max_mb": 2, "probe_loader": True,
                "probes": False}
    # when each way in reads them
    cli = cli_options(CHOSEN)
    magic = RunOptions.parse(" ".join(CHOSEN), prog="%%gpuscope")
    api = gpuscope.profile(**keywords).options
    # then each gives the collectors the same options
    assert cli == magic
    assert cli.collect_options() == magic.collect_options() == api.collect_options() == EXPECTED
    assert api.output == cli.output == "runs/x"


def test_every_run_option_is_a_keyword_of_profile_named_as_on_the_command_line() -> None:
    run_parser = next(a for a in build_parser()._actions if a.dest == "command").choices["run"]
    flags = {s for a in run_parser._actions for s in a.option_strings}
    for f in dataclasses.fields(RunOptions):
        assert set(f.metadata["flags"]) <= flags
        long_flag = f.metadata["flags"][-1]
        assert long_flag.removeprefix("--").removeprefix("no-").replace("-", "_") == f.name


def test_cprofile_steps_none_in_profile_means_the_whole_run() -> None:
    assert gpuscope.profile(cprofile_steps=None).options.collect_options().cprofile_steps is None


@pytest.mark.parametrize(("line", "message"), [
    ("--trace-steps many", "not a whole number"),
    ("--trace-max-mb 0", "must be more than 0"),
    ("--open", "unrecognized arguments: --open"),
    ("-o 'unclosed", "cannot read the options"),
])
def test_a_bad_magic_option_is_one_gpuscope_error(line: str, message: str) -> None:
    with pytest.raises(GpuscopeError, match=message):
        RunOptions.parse(line, prog="%%gpuscope")


def test_a_bad_profile_keyword_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="no option trace_step; its options: output, cprofile_steps"):
        gpuscope.profile(trace_step=2)
    with pytest.raises(GpuscopeError, match="trace_steps must be a whole number"):
        gpuscope.profile(trace_steps=-1)


def test_the_cell_magic_profiles_with_the_options_on_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("IPython")
    from gpuscope import api, notebook

    # given a notebook shell and a profile that records how it was made
    made: list[RunOptions] = []

    class RecordingProfile(api.Profile):
        def start(self) -> api.Profile:
            made.append(self.options)
            return self

        def stop(self, exit_status: int = 0) -> None:
            return None

    class Shell:
        user_ns: dict[str, object] = {}

        def run_cell(self, cell: str):
            return type("Result", (), {"success": True})()

    monkeypatch.setattr(api, "Profile", RecordingProfile)
    magic = notebook._cell_magic(Shell())
    # when a cell runs under the magic with options
    magic(" ".join(CHOSEN), "pass")
    # then its profile has them, as gpuscope run would
    assert [m.collect_options() for m in made] == [EXPECTED]
    assert made[0].output == "runs/x" and isinstance(Shell.user_ns[notebook.RESULT_NAME], RecordingProfile)
