"""How fast does ``gpuscope analyze`` read a large trace, and how much memory does it take?

Builds traces of the sizes asked (default 50 MB, 1 GB and 5 GB) in a temporary folder by repeating the V100 fixture
trace (tests/fixtures/gpu/v100-resnet-ns.json.gz, five ProfilerSteps) end to end, as Kineto lays a long trace out:
every copy's host events (ops, annotations), then every copy's device side (runtime calls, kernels, copies, flow
arrows), then the metadata once. Each copy is the fixture's own text with its times shifted past the copy before,
its correlation ids, External ids, flow ids and ProfilerStep numbers renumbered, so launch links and windows stay
right. Then it runs ``python -m gpuscope analyze TRACE -q -o OUT`` on each in a subprocess and reports the wall time
(whole process: start-up, reading, figures, verdict, run.json and report.html), the CPU time (user + system) and
the peak resident memory of that process (``os.wait4``'s ``ru_maxrss``: the traces are built in another child, for
a child's peak counts the parent it was forked from), and the CPU time per MB of trace.
On the sizes up to ``--in-memory-upto`` (default 50 MB) it also runs the same command with the trace read whole
first (``reduce.tracefile.record_from_trace(read_trace(path))``, the path before streaming), for comparison.

    python benchmarks/analyze_speed.py                                  # 50M, 1G, 5G
    python benchmarks/analyze_speed.py --sizes 50M,1G --gzip            # also the same traces gzipped
    python benchmarks/analyze_speed.py --sizes 50M --json /tmp/out.json

The traces are deleted afterwards; 5 GB needs that much free disk where ``--dir`` (default: the temp folder) is.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "fixtures" / "gpu" / "v100-resnet-ns.json.gz"
RESULTS = ROOT / "benchmarks" / "results" / "analyze-speed-2cpu.json"
HOST_CATEGORIES = {"cpu_op", "user_annotation", "python_function", "fwdbwd"}
NUMBERS = re.compile(r'("ts": )(-?\d+)|("(?:correlation|id)": )(\d+)|(ProfilerStep#)(\d+)|("External id": )(\d+)')
"""The fields a copy renumbers: the whole microseconds of ``ts`` (its decimals stay), correlation and flow ids,
step numbers, External ids."""
IN_MEMORY = (
    "import sys\n"
    "from gpuscope.reduce import trace, tracefile\n"
    "tracefile.record_from_file = lambda path, name, size, progress=None: "
    "tracefile.record_from_trace(trace.read_trace(path), name, size)\n"
    "from gpuscope.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
"""``gpuscope`` with the trace read whole before indexing, as before streaming."""


class Template:
    """A run of the fixture's events as text with its numbers to renumber: literal pieces between (kind, value)
    slots, kind 0 a time, 1 a correlation or flow id, 2 a step number, 3 an External id."""

    def __init__(self, text: str) -> None:
        self.pieces: list[str] = []
        self.slots: list[tuple[int, int]] = []
        at = 0
        for m in NUMBERS.finditer(text):
            kind = next(k for k in range(4) if m.group(2 * k + 1))
            label, number = m.group(2 * kind + 1), m.group(2 * kind + 2)
            self.pieces.append(text[at:m.start()] + label)
            self.slots.append((kind, int(number)))
            at = m.end()
        self.pieces.append(text[at:])

    def render(self, shifts: tuple[int, int, int, int]) -> str:
        numbers = [str(value + shifts[kind]) for kind, value in self.slots]
        out = [None] * (len(self.pieces) + len(numbers))
        out[::2] = self.pieces
        out[1::2] = numbers
        return "".join(out)  # type: ignore[arg-type]

    def largest(self, kind: int) -> int:
        return max((v for k, v in self.slots if k == kind), default=0)


def build_trace(target_bytes: int, path: Path) -> dict[str, Any]:
    """Write a trace of about ``target_bytes`` to ``path`` (gzipped if its name ends in .gz); what it holds."""
    text = gzip.decompress(SOURCE.read_bytes()).decode()
    decoder = json.JSONDecoder()
    begin = text.index("[", text.index('"traceEvents"')) + 1
    spans = []  # (start, end, event) of each event's text
    at = begin
    while True:
        at = re.compile(r"[\s,]*").match(text, at).end()  # type: ignore[union-attr]
        if text[at] == "]":
            break
        event, end = decoder.raw_decode(text, at)
        spans.append((at, end, event))
        at = end
    head, tail = text[:begin] + "\n", "\n" + text[at:]
    kept = [(s, e, ev) for s, e, ev in spans if ev.get("ph") != "M" and ev.get("cat") not in (None, "Trace")]
    host = Template(",\n".join(text[s:e] for s, e, ev in kept if ev.get("cat") in HOST_CATEGORIES))
    device = Template(",\n".join(text[s:e] for s, e, ev in kept if ev.get("cat") not in HOST_CATEGORIES))
    copied = {s for s, _, _ in kept}
    meta = ",\n".join(text[s:e] for s, e, _ in spans if s not in copied)
    timed = [ev for _, _, ev in kept if isinstance(ev.get("ts"), (int, float))]
    span_us = int(max(ev["ts"] + (ev.get("dur") or 0) for ev in timed) - min(ev["ts"] for ev in timed)) + 1000
    ids = max(host.largest(1), device.largest(1)) + 1  # each copy's ids follow the last copy's, as in a longer run
    externals = max(host.largest(3), device.largest(3)) + 1
    steps = sum(1 for _, _, ev in kept if str(ev.get("name", "")).startswith("ProfilerStep#"))
    copy_bytes = len(host.render((0, 0, 0, 0))) + len(device.render((0, 0, 0, 0))) + 4
    copies = max(1, round((target_bytes - len(head) - len(tail) - len(meta)) / copy_bytes))
    zipped = path.name.endswith(".gz")  # the fastest level: reading hardly depends on it
    with (gzip.open(path, "wt", encoding="utf-8", compresslevel=1) if zipped else open(path, "w")) as out:
        written = out.write(head)
        for part in (host, device):
            for k in range(copies):
                written += out.write(("" if written == len(head) else ",\n")
                                     + part.render((k * span_us, k * ids, k * steps, k * externals)))
        written += out.write(",\n" + meta + tail)
    return {"copies": copies, "events": copies * len(kept) + len(spans) - len(kept), "steps": copies * steps,
            "text_bytes": written}


def measure(command: list[str]) -> dict[str, float]:
    """Run ``command``; its wall time, CPU time (user + system) and peak resident memory."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise SystemExit(f"{' '.join(command)} exited {process.returncode}")
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024)}  # Linux: kilobytes


def size_of(label: str) -> int:
    """Bytes of ``50M``, ``1G``, ``1.5G`` (decimal units)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([MG])", label.strip().upper())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {label} (50M, 1G...)")
    return int(float(match.group(1)) * (1e6 if match.group(2) == "M" else 1e9))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="50M,1G,5G", help="trace sizes to build (default 50M,1G,5G)")
    parser.add_argument("--gzip", action="store_true", help="also time each trace gzipped")
    parser.add_argument("--in-memory-upto", default="50M", help="also time the whole-file path up to this size")
    parser.add_argument("--dir", type=Path, help="where to build the traces (default: the temp folder)")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"where the results go (default {RESULTS})")
    parser.add_argument("--build", nargs=2, metavar=("BYTES", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        print(json.dumps(build_trace(int(args.build[0]), Path(args.build[1]))))
        return
    sizes = [(label.strip(), size_of(label)) for label in args.sizes.split(",")]
    in_memory_upto = size_of(args.in_memory_upto)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        print(f"building in {tmp}: {shutil.disk_usage(tmp).free / 1e9:.0f} GB free", flush=True)
        for label, size in sizes:
            names = [f"trace-{label}.json"] + ([f"trace-{label}.json.gz"] if args.gzip else [])
            for name in names:
                trace = Path(tmp) / name
                start = time.perf_counter()
                built = json.loads(subprocess.run(  # in a child: this process stays small, as each child forks it
                    [sys.executable, __file__, "--build", str(size), str(trace)], check=True, capture_output=True,
                    text=True).stdout)
                print(f"{name}: {trace.stat().st_size / 1e6:.0f} MB, {built['events']:,} events, "
                      f"{built['steps']} steps, built in {time.perf_counter() - start:.0f} s", flush=True)
                ways = [("stream", [sys.executable, "-m", "gpuscope"])]
                if size <= in_memory_upto:
                    ways.append(("whole file", [sys.executable, "-c", IN_MEMORY]))
                for way, command in ways:
                    out = Path(tmp) / "out"
                    result = measure([*command, "analyze", str(trace), "-q", "-o", str(out)])
                    record = json.loads((out / "run.json").read_text())
                    shutil.rmtree(out)
                    row = {"trace": name, "file_mb": round(trace.stat().st_size / 1e6),
                           "json_mb": round(built["text_bytes"] / 1e6), "events": built["events"],
                           "steps": built["steps"], "path": way, **result,
                           "cpu_ms_per_mb": round(result["cpu_s"] * 1e9 / built["text_bytes"], 1),
                           "verdict": record["verdict"]["bound"]}
                    rows.append(row)
                    print(f"  {way:10s}: {row['wall_s']:7.1f} s wall, {row['cpu_s']:7.1f} s CPU "
                          f"({row['cpu_ms_per_mb']} ms/MB), peak RSS {row['peak_rss_mb']} MB, "
                          f"verdict {row['verdict']}", flush=True)
                trace.unlink()
    print("\n| trace | path | wall s | CPU s | CPU ms per MB of JSON | peak RSS MB |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['trace']} ({r['file_mb']} MB, {r['events']:,} events) | {r['path']} | {r['wall_s']} | "
              f"{r['cpu_s']} | {r['cpu_ms_per_mb']} | {r['peak_rss_mb']} |")
    result = {"machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                          "load_average": round(os.getloadavg()[0], 1)},
              "date": time.strftime("%Y-%m-%d"), "runs": rows}
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwritten to {args.json}")


if __name__ == "__main__":
    main()
