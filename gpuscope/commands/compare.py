"""``gpuscope compare RUN_DIR_A RUN_DIR_B``: two runs before and after a change, and the CI gate on them."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuscope.commands import in_one_line
from gpuscope.errors import GpuscopeError
from gpuscope.finish import open_in_browser


class CompareCommand:
    """``gpuscope compare RUN_DIR_A RUN_DIR_B``: before/after report of two runs, in the terminal and in HTML."""

    name = "compare"
    help = "before/after report of two runs (A = before, B = after): speed-up, breakdown, verdict, recommendations"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir_a", metavar="RUN_DIR_A", help="the run before the change (it holds run.json)")
        parser.add_argument("run_dir_b", metavar="RUN_DIR_B", help="the run after the change (it holds run.json)")
        parser.add_argument("-o", "--output", metavar="OUT.html",
                            help="where the HTML page goes (default: RUN_DIR_B/compare.html)")
        parser.add_argument("--fail-if-slower", metavar="PCT", type=_percent,
                            help="a CI gate on the mean step, decided on its 95%% interval: exit with status 1 when B "
                                 "is slower than A by more than PCT percent with 95%% confidence, 0 when it is not "
                                 "slower than that with 95%% confidence, 3 when the runs cannot tell (the line says "
                                 "how many steps would, or that more would not)")
        parser.add_argument("--run-spread", metavar="PCT", type=_percent,
                            help="how much one run's mean step strays from the next run's of the same script on this "
                                 "machine, in percent (one standard deviation; default 4.5, measured on a shared "
                                 "2-core VM): the interval holds it for each run")
        parser.add_argument("--open", action="store_true", help="open the page in the browser")

    def run(self, args: argparse.Namespace) -> int:
        from gpuscope.diagnose.compare import PROCESS_SPREAD, compare
        from gpuscope.record import load_record
        from gpuscope.report.compare_text import GATE_STATUS, gate_text, summary_lines
        from gpuscope.report.render import COMPARE_HTML, write_compare

        a, b = load_record(Path(args.run_dir_a)), load_record(Path(args.run_dir_b))
        comparison = compare(a, b, PROCESS_SPREAD if args.run_spread is None else args.run_spread / 100)
        path = Path(args.output) if args.output is not None else Path(args.run_dir_b) / COMPARE_HTML
        with in_one_line("could not render the comparison"):
            path = write_compare(a, b, path, comparison)
        for line in summary_lines(comparison, path):
            print(line)
        if args.open:
            open_in_browser(path)
        if args.fail_if_slower is None:
            return 0
        try:
            decided, line = gate_text(comparison.speedup, args.fail_if_slower)
        except ValueError as exc:
            raise GpuscopeError(f"--fail-if-slower cannot be checked: {exc}") from None
        print(f"  {line}")
        return GATE_STATUS[decided.decision]


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a percentage of 0 or more: {text}")
    return value
