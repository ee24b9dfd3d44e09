"""Few, long steps (issue 55): what a run of a handful of steps of seconds gets, and what gpuscope costs it.

Runs ``long_loops/lbfgs_lstm.py`` (pytorch/examples' time-sequence prediction: LBFGS with a closure) or, with
``--loop transformer_lm``, ``long_loops/transformer_lm.py`` (its word-language-model Transformer: one pass a step, no
closure) for 3, 5 and 8 steps, under plain python and under ``gpuscope run``, in turn, and prints for each: the whole run's wall time under
both and their ratio, the verdict and its confidence, whether trace.json and a speed of light came out, and where
the windows went (the long-steps collector's note).

    python benchmarks/long_steps.py [--steps 3 5 8] [--length 300] [--max-iter 4] [--rounds 1] [--json PATH]
    python benchmarks/long_steps.py --loop transformer_lm [--batch 48]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from overhead import ROOT, in_turn

LOOPS = ROOT / "benchmarks" / "long_loops"


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, capture_output=True, text=True, check=True)
    return time.perf_counter() - start


def measure(steps: int, loop: list[str], rounds: int, tmp: str) -> dict[str, object]:
    script = [*loop, "--steps", str(steps)]
    plain, profiled, record = [], [], {}
    for i in range(rounds):
        out = Path(tmp) / f"run{steps}-{i}"
        gpuscope = [sys.executable, "-m", "gpuscope", "run", "-q", "-o", str(out)]
        for name, prefix in in_turn([("python", [sys.executable]), ("gpuscope", gpuscope)], i):
            (plain if name == "python" else profiled).append(timed([*prefix, *script]))
        record = json.loads((out / "run.json").read_text())
        print(f"  {steps} steps, round {i + 1}: python {plain[-1]:.1f} s, gpuscope {profiled[-1]:.1f} s "
              f"({profiled[-1] / plain[-1]:.2f}x)", flush=True)
    sol = record.get("speed_of_light") or {}
    sample = record["steps"]["sample"]
    return {
        "steps": steps, "loop": [Path(loop[0]).name, *loop[1:]],
        "python_s": plain, "gpuscope_s": profiled,
        "ratio": sum(profiled) / sum(plain),
        "verdict": record["verdict"]["bound"], "confidence": record["verdict"]["confidence"],
        "evidence": record["verdict"]["evidence"][:2],
        "trace": record["collectors"]["torch-trace"]["status"] == "ok",
        "speed_of_light": bool(sol.get("flops_per_step")),
        "step_wall_s": [round(w, 2) for w in sample["wall_s"]], "step_status": sample["status"],
        "closure_calls_per_step": record["steps"].get("closure_calls_per_step"),
        "notes": [n for n in record["meta"].get("notes", []) if n.startswith(("long-steps", "flops"))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loop", choices=["lbfgs_lstm", "transformer_lm"], default="lbfgs_lstm")
    parser.add_argument("--steps", type=int, nargs="+", default=[3, 5, 8])
    parser.add_argument("--length", type=int, default=300, help="lbfgs_lstm's sequence length")
    parser.add_argument("--max-iter", type=int, default=4, help="lbfgs_lstm's closure calls a step")
    parser.add_argument("--batch", type=int, default=48, help="transformer_lm's batch")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        loop = [str(LOOPS / f"{args.loop}.py")] + (
            ["--length", str(args.length), "--max-iter", str(args.max_iter)] if args.loop == "lbfgs_lstm"
            else ["--batch", str(args.batch)])
        results = [measure(n, loop, args.rounds, tmp) for n in args.steps]
    print()
    for r in results:
        print(f"{r['steps']} steps: {r['ratio']:.2f}x the plain run; {r['verdict']} ({r['confidence']:.2f}); "
              f"trace {'yes' if r['trace'] else 'no'}, speed of light {'yes' if r['speed_of_light'] else 'no'}; "
              f"steps {r['step_wall_s']} {r['step_status']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
