"""How close ``gpuscope run --try`` comes to the truth: each case's fix tried by gpuscope (applied at run time to the
unchanged script), against the same fix made by hand in a copy of the script and timed under plain python.

Ground truth: the script and its hand-edited copy under plain python, in turn, ROUNDS times; each run's step (the
time between one ``optimizer.step()`` end and the next, over the steps after STEADY_FROM, their mean as a trial takes it)
and each round's ratio;
the truth is the median of the rounds' ratios. gpuscope: ``gpuscope run --try ID`` on the unchanged script; its
trial's speed-up. The acceptance bar (issue 46): within 20% of the truth.

    python benchmarks/try_accuracy.py [--rounds 5] [--only vae] [--json benchmarks/results/try-accuracy-....json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOPS = ROOT / "benchmarks" / "try_loops"
STEADY_FROM = 12
"""Steps left out at the start of every run: warm-up, and gpuscope's profiling windows (they end by step 11)."""


@dataclass(frozen=True)
class Case:
    name: str
    script: str
    args: tuple[str, ...]
    fix: str
    edit: tuple[str, str]
    """The hand edit: this text of the script replaced by that (``{workers}``, ``{threads}``: the worker count and the
    thread-count line the trial's change names)."""
    folder: Path = LOOPS
    """Where the script is, with the modules it imports (copied beside the edited copy)."""


CASES = (
    Case("vae", "vae.py", ("--epochs", "3"), "fused-optimizer",
         ("optim.Adam(model.parameters(), lr=1e-3)", "optim.Adam(model.parameters(), lr=1e-3, fused=True)")),
    Case("reinforce", "reinforce.py", ("--episodes", "200"), "skip-distribution-checks",
         ("env = Env(args.seed)", "torch.distributions.Distribution.set_default_validate_args(False)\n"
                                  "env = Env(args.seed)")),
    Case("lightning", "lightning_mlp.py", ("--epochs", "2"), "fused-optimizer",
         ("torch.optim.Adam(self.parameters(), lr=1e-3)", "torch.optim.Adam(self.parameters(), lr=1e-3, fused=True)")),
    Case("hf-trainer-slow-data", "hf_trainer.py", ("--slow-data", "--steps", "120"), "more-dataloader-workers",
         ("dataloader_num_workers=0)", "dataloader_num_workers={workers}, dataloader_persistent_workers=True)"),
         folder=ROOT / "tests" / "fixtures" / "scripts" / "frameworks"),
    Case("mnist-anomaly", "mnist_anomaly.py", ("--epochs", "2"), "disable-debug-apis",
         ("torch.autograd.set_detect_anomaly(True)", "")),
    Case("cpu-items", "cpu_items.py", ("--epochs", "1"), "more-dataloader-workers",
         ("loader = DataLoader(data, batch_size=32, shuffle=True)",
          "{threads}loader = DataLoader(data, batch_size=32, shuffle=True, num_workers={workers}, "
          "persistent_workers=True)")),
    Case("text-classifier", "text_classifier.py", ("--epochs", "2"), "more-dataloader-workers",
         ("train_loader = DataLoader(train_set, batch_size=32, shuffle=True, collate_fn=collate)",
          "{threads}train_loader = DataLoader(train_set, batch_size=32, shuffle=True, collate_fn=collate, "
          "num_workers={workers}, persistent_workers=True)")),
)

HARNESS = r"""
import os, runpy, sys, time, json
from torch.optim.optimizer import register_optimizer_step_post_hook
ends = []
register_optimizer_step_post_hook(lambda *a: ends.append(time.perf_counter()))
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    gaps = [b - a for a, b in list(zip(ends, ends[1:]))[int(os.environ["STEADY_FROM"]):]]
    print("STEP_S", sum(gaps) / len(gaps), file=sys.stderr)
"""


def plain_step(script: Path, args: tuple[str, ...], cwd: Path) -> float:
    """One run under plain python: its mean step after STEADY_FROM, as a trial takes it."""
    done = subprocess.run([sys.executable, "-c", HARNESS, str(script), *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "STEADY_FROM": str(STEADY_FROM)})
    line = next((l for l in done.stderr.splitlines() if l.startswith("STEP_S")), None)
    if line is None:
        raise RuntimeError(done.stderr[-2000:])
    return float(line.split()[1])


def truth(case: Case, rounds: int, workdir: Path, change: str) -> tuple[float, list[float]]:
    """The median over rounds of (the script's step / the hand-edited copy's), run in turn."""
    for module in case.folder.glob("*.py"):
        (workdir / module.name).write_text(module.read_text())
    source = (case.folder / case.script).read_text()
    before, after = case.edit
    workers = re.search(r"num_workers=(\d+)", change)
    threads = re.search(r"torch\.set_num_threads\((\d+)\)", change)
    edited = source.replace(before, after.format(workers=workers.group(1) if workers else 2,
                                                 threads=f"torch.set_num_threads({threads.group(1)})\n" if threads
                                                 else ""))
    if edited == source:
        raise RuntimeError(f"{case.name}: the edit found nothing to replace")
    base, fixed = workdir / case.script, workdir / f"fixed_{case.script}"
    base.write_text(source)
    fixed.write_text(edited)
    ratios = []
    for _ in range(rounds):
        ratios.append(plain_step(base, case.args, workdir) / plain_step(fixed, case.args, workdir))
    return statistics.median(ratios), ratios


def tried(case: Case, workdir: Path) -> tuple[float | None, dict]:
    """gpuscope's trial of the fix on the unchanged script: its speed-up, and the trial."""
    out = workdir / "run"
    subprocess.run([sys.executable, "-m", "gpuscope", "run", "-q", "-o", str(out), "--try", case.fix,
                    str(case.folder / case.script), *case.args], cwd=workdir, capture_output=True, text=True, check=True)
    record = json.loads((out / "run.json").read_text())
    trial = next(t for t in record["trials"] if t["id"] == case.fix)
    return trial["speedup"], trial


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", action="append", help="a case's name (repeatable)")
    parser.add_argument("--json", type=Path, help="write the results here")
    options = parser.parse_args()
    results = []
    for case in CASES:
        if options.only and case.name not in options.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            measured, trial = tried(case, workdir)
            true, ratios = truth(case, options.rounds, workdir, trial.get("change", ""))
        off = measured / true - 1 if measured else None
        results.append({"case": case.name, "fix": case.fix, "tried": measured, "truth": true,
                        "truth_rounds": ratios, "off": off, "effect": trial.get("effect"), "trial": trial})
        verdict = "within 20%" if off is not None and abs(off) <= 0.2 else "OFF"
        print(f"{case.name:16s} {case.fix:26s} tried {measured or 0:.2f}x ({trial.get('effect')})  truth {true:.2f}x "
              f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})  {off or 0:+.0%}  {verdict}", flush=True)
    if options.json:
        options.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
