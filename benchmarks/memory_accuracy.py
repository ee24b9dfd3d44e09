"""How close gpuscope's memory figures come to the truth, measured without gpuscope in fresh plain-python processes,
on the small CPU loops of ``benchmarks/memory_loops/``:

1. known sizes (``mlp.py``, ``blocks.py``): run.json's ``memory.parameters_bytes``, ``gradients_max_bytes`` (the
   gradients at their highest: at the peak, early in backward, most are not made yet), ``optimizer_state_bytes``
   against the tensors' own sizes (P, P, 2P and Adam's step scalars), within 10%; and
   ``activations_max_bytes`` against the storages saved for backward over one forward, counted with
   ``torch.autograd.graph.saved_tensors_hooks`` (each storage once, parameters left out), within 25%;
2. leaks (``leak_feats.py``: features appended without ``.detach()``; ``leak_eval.py``: an evaluation loop without
   ``torch.no_grad()`` summing the loss as a tensor, its steps the DataLoader's batches; ``no_leak``: the first
   loop without the leak, ``leak_feats.py --no-leak``): the leak's rate (``memory.growth.kept_per_step_bytes``, else ``per_step_bytes``)
   against the least-squares slope of what glibc's malloc has handed out (``mallinfo2``) after each step under
   plain python over the same steps, within 30%; and, for the record, ``per_step_bytes`` against the slope of the
   process's resident memory (``/proc/self/statm``) there, which the allocator's slack moves run by run;
   ``memory.kept[0].line`` against the line that made the kept tensor; ``fix-memory-leak`` fired on the leaks, not
   on the loop without one; ROUNDS runs of each, and (not with ``--quick``) as many again with glibc's mmap
   threshold fixed at 1 MiB on both sides (``FIXED_MMAP``), the control for the allocator's own swings;
3. checkpointing (``blocks.py``): the saving gpuscope predicts for ``activation-checkpointing`` against the same
   change made by hand (``blocks.py --checkpoint``), each peak the highest running sum of torch.profiler's raw
   allocation events over one steady step in a fresh process, within 30%;
4. death (``oom.py``, under an address-space limit): gpuscope's exit status equals plain python's, run.json and
   report.html are written, ``memory.out_of_memory`` is set, the verdict's first line says the run ran out of
   memory.

Every loop runs with OMP_NUM_THREADS=1 (``--threads``), under plain python and gpuscope alike: on this shared 2-core
machine a second OpenMP thread that finds no free core stalls every parallel op (a 3 ms step of leak_feats.py took
180 ms), and the figures measured here do not depend on the thread count.

    python benchmarks/memory_accuracy.py [--quick] [--rounds 3] [--json benchmarks/results/memory-accuracy-2cpu.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOOPS = ROOT / "benchmarks" / "memory_loops"
BIN = Path(sys.executable).parent
GPUSCOPE = [str(BIN / "gpuscope")] if (BIN / "gpuscope").exists() else [sys.executable, "-m", "gpuscope"]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "memory-accuracy-2cpu.json"
WINDOW_END = 12
"""The memory window's last step on a CPU run (steps 11-12): growth readings start after it."""

SIZES_TOL = 0.10
ACTIVATIONS_TOL = 0.25
GROWTH_TOL = 0.30
CHECKPOINT_TOL = 0.30


# -- running ---------------------------------------------------------------------------------------------------------
def env(threads: int, **extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k != "MEMORY_LOOP_RSS"}
    e.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1", **extra)
    return e


def plain(script: str, args: list[str], threads: int, timeout: float = 600, **extra: str) -> dict[str, Any]:
    """The loop under plain python in a fresh process."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, str(LOOPS / script), *args], capture_output=True, text=True,
                       env=env(threads, **extra), cwd=LOOPS, timeout=timeout)
    out = {"rc": p.returncode, "wall_s": round(time.perf_counter() - t0, 2),
           "stderr_tail": _tail(p.stderr)}
    for line in p.stdout.splitlines():
        if line.startswith("MEMORY_TRUTH "):
            out["truth"] = json.loads(line[len("MEMORY_TRUTH "):])
    return out


def under_gpuscope(script: str, args: list[str], threads: int, outdir: Path, timeout: float = 900,
                   **extra: str) -> dict[str, Any]:
    """The loop under ``gpuscope run --no-probes``; its run.json's memory section and recommendations."""
    if outdir.exists():
        shutil.rmtree(outdir)
    t0 = time.perf_counter()
    p = subprocess.run([*GPUSCOPE, "run", "--no-probes", "-o", str(outdir), str(LOOPS / script), *args],
                       capture_output=True, text=True, env=env(threads, **extra), cwd=LOOPS, timeout=timeout)
    out: dict[str, Any] = {"rc": p.returncode, "wall_s": round(time.perf_counter() - t0, 2),
                           "run_json": (outdir / "run.json").exists(), "report_html": (outdir / "report.html").exists(),
                           "summary": _summary(p.stdout + "\n" + p.stderr)}
    if not out["run_json"]:
        out["stderr_tail"] = _tail(p.stderr)
        return out
    record = json.loads((outdir / "run.json").read_text())
    memory = dict(record.get("memory") or {})
    timeline = memory.pop("timeline", None) or {}
    memory["timeline_max"] = {k: max(v) for k, v in timeline.items() if k not in ("t_ms", "phases") and v}
    memory["timeline_points"] = len(timeline.get("t_ms") or ())
    out.update(memory=memory, exit_status=record.get("exit_status"),
               recommendations=[r.get("id") for r in record.get("recommendations") or ()],
               verdict=record.get("verdict"), steps_count=(record.get("steps") or {}).get("count"),
               median_step_s=(record.get("steps") or {}).get("median_s"))
    return out


def _summary(text: str) -> list[str]:
    """gpuscope's summary: its lines from the last that starts ``gpuscope:`` (the headline) to the report's path."""
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("gpuscope:")]
    return [line for line in lines[heads[-1]:] if line.strip()][:16] if heads else []


def _tail(text: str, lines: int = 6) -> list[str]:
    return [l for l in text.splitlines() if "USDT" not in l][-lines:]


def rel(measured: float | None, truth: float | None) -> float | None:
    if measured is None or not truth:
        return None
    return (measured - truth) / truth


def slope(points: list[tuple[int, int]]) -> float | None:
    """Least-squares slope, bytes a step."""
    if len(points) < 2:
        return None
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else None


def marked(script: str, marker: str, function: str) -> str:
    """``FILE:LINE in FUNCTION`` of the line of ``script`` carrying ``# MARKER``, as gpuscope names lines."""
    for n, line in enumerate((LOOPS / script).read_text().splitlines(), 1):
        if f"# {marker}" in line:
            return f"{script}:{n} in {function}"
    raise ValueError(f"no '# {marker}' in {script}")


# -- the four checks --------------------------------------------------------------------------------------------------
def known_sizes(work: Path, threads: int) -> dict[str, Any]:
    out = {}
    for name, script in (("mlp", "mlp.py"), ("blocks", "blocks.py")):
        truth = plain(script, ["--truth"], threads)
        run = under_gpuscope(script, [], threads, work / f"sizes-{name}")
        t = truth.get("truth") or {}
        m = run.get("memory") or {}
        adam = t.get("optimizer_state_bytes")
        rows = {
            "parameters_bytes": (m.get("parameters_bytes"), t.get("parameters_bytes"), SIZES_TOL),
            "gradients_max_bytes": (m.get("gradients_max_bytes"), t.get("gradients_bytes"), SIZES_TOL),
            "optimizer_state_bytes": (m.get("optimizer_state_bytes"), adam, SIZES_TOL),
            "activations_max_bytes": (m.get("activations_max_bytes"), t.get("activations_bytes"), ACTIVATIONS_TOL),
        }
        checks = {k: {"gpuscope": g, "truth": tr, "error": rel(g, tr), "tolerance": tol,
                      "ok": rel(g, tr) is not None and abs(rel(g, tr)) <= tol} for k, (g, tr, tol) in rows.items()}
        tm = m.get("timeline_max") or {}
        info = {
            "peak_phase": m.get("peak_phase"),
            "gradients_at_peak_bytes": m.get("gradients_bytes"),
            "gradients_at_peak_error": rel(m.get("gradients_bytes"), t.get("gradients_bytes")),
            "activations_truth_without_batch_bytes":
                (t.get("activations_bytes") or 0) - (t.get("activations_batch_bytes") or 0),
            "activations_error_without_batch": rel(m.get("activations_max_bytes"),
                                                   (t.get("activations_bytes") or 0)
                                                   - (t.get("activations_batch_bytes") or 0)),
        }
        out[name] = {"truth_run": truth, "gpuscope_run": run, "checks": checks, "info": info}
    return out


LEAKS = (
    # name, script, args, leak expected
    ("leak_feats", "leak_feats.py", ["--steps", "60"], True),
    ("leak_eval", "leak_eval.py", ["--batches", "80"], True),
    ("no_leak", "leak_feats.py", ["--steps", "60", "--no-leak"], False),
)


FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
"""The control: glibc's mmap threshold fixed at 1 MiB (it otherwise rises to the size of the largest mmapped chunk
freed), so that every 2 MiB tensor has a mapping of its own and a freed one goes back to the kernel."""


def leaks(work: Path, threads: int, rounds: int, tag: str = "", extra: dict[str, str] | None = None) -> dict[str, Any]:
    out = {}
    extra = extra or {}
    for name, script, args, leaking in LEAKS:
        runs = []
        for r in range(rounds):
            run = under_gpuscope(script, args, threads, work / f"leak{tag}-{name}-{r}", **extra)
            rss_file = work / f"rss{tag}-{name}-{r}.json"
            truth = plain(script, args, threads, MEMORY_LOOP_RSS=str(rss_file), **extra)
            rss = [tuple(p) for p in json.loads(rss_file.read_text())] if rss_file.exists() else []
            m = run.get("memory") or {}
            growth = m.get("growth") or {}
            first = growth.get("from_step") or WINDOW_END + 1
            last = growth.get("to_step") or (rss[-1][0] if rss else 0)
            truth_rate = slope([(p[0], p[1]) for p in rss if first <= p[0] <= last])
            allocated_rate = slope([(p[0], p[2]) for p in rss if first <= p[0] <= last and p[2] >= 0])
            kept = m.get("kept") or []
            rate = growth.get("kept_per_step_bytes") or growth.get("per_step_bytes")
            runs.append({
                "gpuscope_run": run, "plain_run": truth, "rss": rss, "fit_steps": [first, last],
                "gpuscope_per_step_bytes": growth.get("per_step_bytes"), "truth_per_step_bytes": truth_rate,
                "error": rel(growth.get("per_step_bytes"), truth_rate),
                "leak": growth.get("leak"), "rule_fired": "fix-memory-leak" in (run.get("recommendations") or ()),
                "kept0_line": kept[0].get("line") if kept else None,
                "kept0_callers": kept[0].get("callers") if kept else None,
                "kept_bytes_per_step": m.get("kept_bytes_per_step"),
                "truth_allocated_per_step_bytes": allocated_rate,
                "leak_rate_bytes": rate, "leak_rate_error": rel(rate, allocated_rate),
            })
        g = [r["gpuscope_per_step_bytes"] for r in runs if r["gpuscope_per_step_bytes"] is not None]
        t = [r["truth_per_step_bytes"] for r in runs if r["truth_per_step_bytes"] is not None]
        result: dict[str, Any] = {
            "script": script, "args": args, "env": extra, "leak_expected": leaking, "runs": runs,
            "gpuscope_per_step_bytes": g, "truth_per_step_bytes": t,
            "gpuscope_median": statistics.median(g) if g else None, "truth_median": statistics.median(t) if t else None,
        }
        result["error"] = rel(result["gpuscope_median"], result["truth_median"])
        allocated = [r["truth_allocated_per_step_bytes"] for r in runs if r["truth_allocated_per_step_bytes"] is not None]
        kept = [r["kept_bytes_per_step"] for r in runs if r["kept_bytes_per_step"] is not None]
        result["truth_allocated_median"] = statistics.median(allocated) if allocated else None
        result["kept_median"] = statistics.median(kept) if kept else None
        result["kept_error_vs_allocated"] = rel(result["kept_median"], result["truth_allocated_median"])
        rates = [r["leak_rate_bytes"] for r in runs if r["leak_rate_bytes"] is not None]
        result["leak_rate_median"] = statistics.median(rates) if rates else None
        result["leak_rate_error"] = rel(result["leak_rate_median"], result["truth_allocated_median"])
        result["leak_flags"] = [r["leak"] for r in runs]
        result["rule_fired"] = [r["rule_fired"] for r in runs]
        if leaking:
            expected = marked(script, "MADE", "forward")
            caller = marked(script, "CALLER", "<module>")
            result["expected_line"] = expected
            result["expected_caller"] = caller
            result["line_ok"] = [r["kept0_line"] == expected for r in runs]
            result["caller_ok"] = [caller in (r["kept0_callers"] or ()) for r in runs]
            result["ok"] = (result["leak_rate_error"] is not None and abs(result["leak_rate_error"]) <= GROWTH_TOL
                            and all(r["leak_rate_error"] is not None and abs(r["leak_rate_error"]) <= GROWTH_TOL
                                    for r in runs)
                            and all(result["line_ok"]) and all(result["leak_flags"]) and all(result["rule_fired"]))
        else:
            result["ok"] = not any(result["leak_flags"]) and not any(result["rule_fired"]) and len(runs) == rounds
        out[name] = result
    return out


def checkpointing(work: Path, threads: int, rounds: int, sized: dict[str, Any] | None, full: bool) -> dict[str, Any]:
    run = (sized or {}).get("gpuscope_run") or under_gpuscope("blocks.py", [], threads, work / "sizes-blocks")
    m = run.get("memory") or {}
    fix = next((f for f in m.get("fixes") or () if f.get("id") == "activation-checkpointing"), None)
    plain_peaks = [plain("blocks.py", ["--peak"], threads) for _ in range(rounds)]
    ckpt_peaks = [plain("blocks.py", ["--peak", "--checkpoint"], threads) for _ in range(rounds)]
    before = [p["truth"]["peak_bytes"] for p in plain_peaks if "truth" in p]
    after = [p["truth"]["peak_bytes"] for p in ckpt_peaks if "truth" in p]
    savings = [b - a for b, a in zip(before, after)]
    truth = statistics.median(savings) if savings else None
    predicted = fix.get("saving_bytes") if fix else None
    out: dict[str, Any] = {
        "predicted_saving_bytes": predicted, "fix": fix, "truth_saving_bytes": truth, "truth_savings": savings,
        "truth_peak_bytes": before, "truth_checkpointed_peak_bytes": after,
        "error": rel(predicted, truth), "tolerance": CHECKPOINT_TOL,
        "plain_runs": plain_peaks, "checkpointed_runs": ckpt_peaks,
        "gpuscope_peak_bytes": m.get("peak_bytes"), "gpuscope_peak_error": rel(m.get("peak_bytes"),
                                                                               statistics.median(before) if before else None),
        "gpuscope_peak_phase": m.get("peak_phase"),
        "repeated_block": {k: m.get(k) for k in ("repeated_blocks", "repeated_block_count", "repeated_block_bytes",
                                                  "repeated_block_max_bytes", "repeated_block_inputs_bytes")},
        "activations_max_bytes": m.get("activations_max_bytes"),
    }
    out["ok"] = out["error"] is not None and abs(out["error"]) <= CHECKPOINT_TOL
    if full:  # gpuscope's own view of the checkpointed loop, for the record
        ck = under_gpuscope("blocks.py", ["--checkpoint"], threads, work / "ckpt-blocks")
        cm = ck.get("memory") or {}
        out["gpuscope_checkpointed_run"] = ck
        out["gpuscope_measured_saving_bytes"] = (m.get("peak_bytes") or 0) - (cm.get("peak_bytes") or 0) \
            if cm.get("peak_bytes") else None
    return out


def death(work: Path, threads: int) -> dict[str, Any]:
    p = plain("oom.py", [], threads)
    run = under_gpuscope("oom.py", [], threads, work / "oom")
    m = run.get("memory") or {}
    evidence = ((run.get("verdict") or {}).get("evidence") or [""])
    first = evidence[0] if evidence else ""
    checks = {
        "same_exit_status": run["rc"] == p["rc"] and p["rc"] != 0,
        "run_json": run["run_json"], "report_html": run["report_html"],
        "out_of_memory_set": bool(m.get("out_of_memory")),
        "verdict_first_line_says_out_of_memory": "ran out of memory" in first,
    }
    return {"plain_rc": p["rc"], "plain_stderr_tail": p["stderr_tail"], "gpuscope_rc": run["rc"],
            "gpuscope_run": run, "verdict_first_line": first, "headline": (run.get("summary") or [""])[0],
            "checks": checks, "ok": all(checks.values())}


# -- the record ------------------------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    import torch

    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                   if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "gpuscope"], capture_output=True, text=True, cwd=ROOT).stdout
    version = subprocess.run([*GPUSCOPE, "--version"], capture_output=True, text=True).stdout.strip()
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "nproc": os.cpu_count(), "cpu": cpu, "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "gpuscope": version, "git_commit": commit.strip(),
            "gpuscope_tree_dirty": bool(dirty.strip()), "load_average_at_start": os.getloadavg()}


def mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f} MB"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def table(result: dict[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    rows = []
    for name, s in (result.get("known_sizes") or {}).items():
        for key, c in s["checks"].items():
            rows.append((f"{name}: {key}", mb(c["gpuscope"]), mb(c["truth"]), pct(c["error"]),
                         f"±{c['tolerance']:.0%}", "ok" if c["ok"] else "FAIL"))
        info = s["info"]
        rows.append((f"{name}: gradients at the peak (info)", mb(info["gradients_at_peak_bytes"]),
                     mb(s["checks"]["gradients_max_bytes"]["truth"]), pct(info["gradients_at_peak_error"]),
                     f"peak: {info['peak_phase']}", ""))
    for tag, sets in (("", result.get("leaks") or {}), (" [mmap 1 MiB]", result.get("leaks_fixed_mmap") or {})):
        for name, s in sets.items():
            n = len(s["runs"])
            if s["leak_expected"]:
                rows.append((f"{name}{tag}: leak's rate vs malloc, median of {n}", mb(s["leak_rate_median"]),
                             mb(s["truth_allocated_median"]), pct(s["leak_rate_error"]), f"±{GROWTH_TOL:.0%}",
                             "ok" if s["ok"] else "FAIL"))
                rows.append((f"{name}{tag}: leak's rate, each run", ", ".join(mb(r["leak_rate_bytes"])
                                                                              for r in s["runs"]),
                             ", ".join(mb(r["truth_allocated_per_step_bytes"]) for r in s["runs"]),
                             ", ".join(pct(r["leak_rate_error"]) for r in s["runs"]), "", ""))
                rows.append((f"{name}{tag}: resident growth vs plain RSS, each run (info)",
                             ", ".join(mb(g) for g in s["gpuscope_per_step_bytes"]),
                             ", ".join(mb(r["truth_per_step_bytes"]) for r in s["runs"]),
                             ", ".join(pct(r["error"]) for r in s["runs"]), "", ""))
                rows.append((f"{name}{tag}: kept[0].line right; rule fired", f"{sum(s['line_ok'])}/{n}; "
                             f"{sum(s['rule_fired'])}/{n}", s["expected_line"], "", f"{n}/{n}; {n}/{n}",
                             "ok" if all(s["line_ok"]) and all(s["rule_fired"]) else "FAIL"))
                rows.append((f"{name}{tag}: kept_bytes_per_step vs malloc (info)", mb(s["kept_median"]),
                             mb(s["truth_allocated_median"]), pct(s["kept_error_vs_allocated"]), "", ""))
            else:
                rows.append((f"{name}{tag}: leak flagged; rule fired", f"{sum(map(bool, s['leak_flags']))}/{n}; "
                             f"{sum(s['rule_fired'])}/{n}", "0; 0",
                             "growth " + ", ".join(mb(g) for g in s["gpuscope_per_step_bytes"]), f"0/{n}; 0/{n}",
                             "ok" if s["ok"] else "FAIL"))
    c = result.get("checkpointing")
    if c:
        rows.append(("blocks: activation-checkpointing saving", mb(c["predicted_saving_bytes"]),
                     mb(c["truth_saving_bytes"]), pct(c["error"]), f"±{CHECKPOINT_TOL:.0%}",
                     "ok" if c["ok"] else "FAIL"))
        rows.append(("blocks: peak (info)", mb(c["gpuscope_peak_bytes"]),
                     mb(statistics.median(c["truth_peak_bytes"]) if c["truth_peak_bytes"] else None),
                     pct(c["gpuscope_peak_error"]), "", ""))
        if c.get("gpuscope_measured_saving_bytes") is not None:
            rows.append(("blocks: saving gpuscope measured (info)", mb(c["gpuscope_measured_saving_bytes"]),
                         mb(c["truth_saving_bytes"]), pct(rel(c["gpuscope_measured_saving_bytes"],
                                                              c["truth_saving_bytes"])), "", ""))
    d = result.get("death")
    if d:
        rows.append(("oom: exit status, files, out_of_memory, verdict", f"rc {d['gpuscope_rc']}",
                     f"rc {d['plain_rc']}", ", ".join(k for k, v in d["checks"].items() if not v) or "all hold",
                     "all", "ok" if d["ok"] else "FAIL"))
    return rows


def print_table(rows: list[tuple[str, ...]]) -> None:
    head = ("check", "gpuscope", "truth", "error", "accept", "")
    widths = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head))]
    for r in (head, *rows):
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round of each leak loop, one peak run each, "
                                                             "no gpuscope run of the checkpointed loop")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each leak loop (default 3; --quick: 1)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS for every loop (default 1)")
    parser.add_argument("--only", nargs="*", choices=("sizes", "leaks", "checkpointing", "death"),
                        help="run only these checks")
    parser.add_argument("--json", type=Path, default=None,
                        help=f"where the results go (default {DEFAULT_JSON.relative_to(ROOT)}; --quick: none)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    only = set(args.only or ("sizes", "leaks", "checkpointing", "death"))
    work = args.keep or Path(tempfile.mkdtemp(prefix="memory-accuracy-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine": machine(), "quick": args.quick, "rounds": rounds, "threads": args.threads,
                              "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
    t0 = time.perf_counter()
    try:
        if "sizes" in only:
            print("known sizes...", flush=True)
            result["known_sizes"] = known_sizes(work, args.threads)
        if "leaks" in only:
            print("leaks...", flush=True)
            result["leaks"] = leaks(work, args.threads, rounds)
            if not args.quick:
                print("leaks, glibc's mmap threshold fixed...", flush=True)
                result["leaks_fixed_mmap"] = leaks(work, args.threads, rounds, "-mmap", FIXED_MMAP)
        if "checkpointing" in only:
            print("checkpointing...", flush=True)
            result["checkpointing"] = checkpointing(work, args.threads, 1 if args.quick else 2,
                                                    (result.get("known_sizes") or {}).get("blocks"), not args.quick)
        if "death" in only:
            print("death...", flush=True)
            result["death"] = death(work, args.threads)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    rows = table(result)
    result["table"] = [dict(zip(("check", "gpuscope", "truth", "error", "accept", "result"), r)) for r in rows]
    print_table(rows)
    path = args.json or (None if args.quick else DEFAULT_JSON)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
