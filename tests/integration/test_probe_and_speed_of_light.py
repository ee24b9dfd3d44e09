"""The loader probe's advice applied, and the speed of light of a compute-bound run, on the sample workloads."""

from __future__ import annotations

import re
from typing import Any

import pytest

from conftest import Runs, loading_cleared

pytestmark = [pytest.mark.slow, pytest.mark.timing]
FIX = re.compile(r"num_workers=(\d+)")
THREADS = re.compile(r"torch\.set_num_threads\((\d+)\)")


def advised(record: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The ``more-dataloader-workers`` recommendation of a run's record, and the worker count its fix names."""
    advice = next(r for r in record["recommendations"] if r["id"] == "more-dataloader-workers")
    return advice, int(FIX.search(advice["fix"]).group(1))  # type: ignore[union-attr]


def advised_threads(record: dict[str, Any]) -> int | None:
    """The intra-op thread count the ``more-dataloader-workers`` fix names, if it names one."""
    found = THREADS.search(advised(record)[0]["fix"])
    return int(found.group(1)) if found else None


def applied(runs: Runs, sample: str, args: tuple[str, ...], slow: dict[str, Any], fresh: bool,
            by_cycles: bool = False, threads_option: bool = False) -> tuple[float, float, str]:
    """``slow``'s advice applied to a run of SAMPLE ARGS: (the speed-up measured, the one predicted, the
    prediction's explanation). Measured as the prediction is made, from the slow run's median step, against the
    fixed run's median step or, ``by_cycles``, its throughput (``cycle_step_s``). The advised worker count is
    passed as ``--workers``; a thread count the fix names as ``--threads`` (``threads_option``), else it must be
    the one the sample keeps itself with workers (a core per worker, at least one thread)."""
    _, workers = advised(slow)
    threads, extra = advised_threads(slow), ()
    if threads is not None and threads_option:
        extra = ("--threads", str(threads))
    elif threads is not None:
        assert threads == max(1, slow["meta"]["cpu_count"] - workers), advised(slow)[0]["fix"]
    fixed = runs.sample(sample, *args, "--workers", str(workers), *extra, fresh=fresh).record
    step_s = cycle_step_s(fixed, workers) if by_cycles else fixed["steps"]["median_s"]
    return slow["steps"]["median_s"] / step_s, slow["what_if"]["speedup"], slow["what_if"]["explanation"]


def cycle_step_s(record: dict[str, Any], workers: int) -> float:
    """The mean step over whole cycles of ``workers`` steps: N workers in lockstep hand over N batches at once (one
    step waits, the next N - 1 do not), so neither the median step nor the mean of steady steps cut anywhere in a
    cycle is the throughput. Taken over the longest stretch of consecutive steady steps, less its first ones (the
    stretch begins after a profiling window, when the workers may have batches in hand)."""
    sample = record["steps"]["sample"]
    stretches: list[list[int]] = []
    for i, (index, status) in enumerate(zip(sample["index"], sample["status"])):
        if status != "steady":
            continue
        if stretches and sample["index"][stretches[-1][-1]] == index - 1:
            stretches[-1].append(i)
        else:
            stretches.append([i])
    longest = max(stretches, key=len)
    whole = longest[len(longest) % workers:]
    assert len(whole) >= 3 * workers, (workers, sample["status"])
    return sum(sample["wall_s"][i] for i in whole) / len(whole)


def as_predicted(outcome: tuple[Any, ...]) -> bool:
    """Whether a measured speed-up is the predicted one, within 25%."""
    return isinstance(outcome[0], float) and outcome[0] == pytest.approx(outcome[1], rel=0.25)


def test_the_loader_probes_worker_count_applied_clears_the_data_wait_as_predicted(runs: Runs) -> None:
    # This shared 2-core machine's load swings step times by 2x and more between runs: a pair spoiled by it is
    # measured again, up to three pairs (a real error in the prediction fails them all; CI on 2026-11-29 had two
    # spoiled pairs in a row, 1 worker advised and 37% data wait left); the first pair is the session's shared runs.
    for attempt in range(3):
        # given: the data-bound sample, run with no workers
        slow = runs.sample("data_loading_bound", fresh=attempt > 0).record
        assert slow["collectors"]["loader-probe"]["status"] == "ok"
        probe = slow["loader_probe"]
        assert probe["elapsed_s"] <= probe["budget_s"] + 1.0
        advice, workers = advised(slow)
        predicted = slow["what_if"]["speedup"]  # the same estimate as the advice's gain, not clipped at 0
        # when: the suggested worker count is applied
        fixed = runs.sample("data_loading_bound", "--steps", "24", "--workers", str(workers),
                            fresh=attempt > 0).record
        # steady-state medians: the script's own median includes the profiled steps, slower with workers
        # (cProfile follows the forked workers' first batches)
        measured = slow["steps"]["median_s"] / fixed["steps"]["median_s"]
        cleared = loading_cleared(fixed)
        if cleared and kept_its_promise(measured, predicted):
            break
    # then: loading no longer bounds the run, and the speed-up is at least the predicted one less 25%, and not
    # above it by more than UNDER_PROMISE allows
    assert cleared, fixed["verdict"]["evidence"]
    assert kept_its_promise(measured, predicted), (
        f"measured {measured:.2f}x, predicted {predicted:.2f}x: {slow['what_if']['explanation']}; "
        f"without workers {figures(slow)}; with them {figures(fixed)}")  # a str: pytest shortens other objects


UNDER_PROMISE = 1.5
"""How far a measured speed-up may exceed the predicted one. The prediction takes the step's compute, moved to one
thread, to cost what it cost on its threads together (linear scaling): where the two cores scale worse, as on CI's
machine (2.12x and 1.91x measured for 1.51-1.60x predicted, where this machine measures 1.57-1.78x), the fix gains
more than promised, which no user minds. Over-promising, which misleads, is held to 25%."""


def kept_its_promise(measured: float, predicted: float) -> bool:
    """Whether a measured speed-up is at least the predicted one less 25%, and at most UNDER_PROMISE times it."""
    return 0.75 * predicted <= measured <= UNDER_PROMISE * predicted


def figures(record: dict[str, Any]) -> dict[str, Any]:
    """What a failed prediction is read against: the median step, its phases, the loader probe's rates and what the
    workers did."""
    probe = record.get("loader_probe") or {}
    memory = record.get("host_memory") or {}
    return {"median_ms": round(record["steps"]["median_s"] * 1e3, 1),
            "breakdown": {k: round(v, 3) for k, v in record["breakdown"].items()},
            "rates": {r["num_workers"]: round(r["batches_per_s"] or 0, 2) for r in probe.get("rates", ())},
            "workers_cpu_s": memory.get("workers_cpu_s"), "workers_watched_s": memory.get("workers_watched_s"),
            "cpu_count": record["meta"]["cpu_count"], "torch_threads": record["meta"].get("torch_threads")}


def test_on_cores_the_workers_share_with_the_step_the_predicted_speedup_is_the_measured_one(runs: Runs) -> None:
    # given: NumPy preprocessing in __getitem__ and a conv net that keeps every core busy (2 cores): each worker
    # takes a core from the step, so the loader's rate alone would promise far too much (issue 14: 1.49x promised,
    # 1.16x measured); and torch's default threads, one per core, which stall each other once workers are busy too
    # (advised 2 workers alone, CI measured 1.11-1.17x by the median for 1.53-1.58x predicted, and the mean step
    # barely moved)
    # This 2-core machine's load swings the probe's rates and the step times by up to 2x between runs: a pair
    # spoiled by it is measured again (a real error in the prediction fails every pair)
    outcomes = []
    for attempt in range(3):
        slow = runs.sample("data_loading_shared_cores", fresh=attempt > 0).record
        ids = {r["id"] for r in slow["recommendations"]}
        if slow["verdict"]["bound"] != "data-loading" or "more-dataloader-workers" not in ids or not slow["what_if"]:
            outcomes.append(("spoiled", slow["verdict"]["evidence"]))
            continue
        _, workers = advised(slow)
        if workers + slow["loader_probe"]["main_threads"] > slow["meta"]["cpu_count"]:
            # the fix keeps the threads the workers leave
            assert advised_threads(slow) == max(1, slow["meta"]["cpu_count"] - workers), advised(slow)[0]
        # when: the whole fix is applied (workers and threads); the run's throughput is measured over whole cycles
        # of its workers
        outcomes.append(applied(runs, "data_loading_shared_cores", ("--steps", "60"), slow, fresh=attempt > 0,
                                by_cycles=True, threads_option=True))
        if as_predicted(outcomes[-1]):
            break
    # then: the prediction counted the cores the workers take, and the run sped up as predicted, within 25%
    assert as_predicted(outcomes[-1]), str(outcomes)  # a str: pytest shortens other objects
    assert "cores" in outcomes[-1][2], outcomes[-1]


def test_with_half_second_batches_the_predicted_speedup_is_the_measured_one_over_whole_worker_cycles(runs: Runs) -> None:
    # given: the float16 sample, whose batches take about half a second in the main process: the probe times
    # batches of a few items, not whole ones, to fit its budget (before, it predicted 1.40x for a measured 1.6-1.9x)
    # This 2-core machine's speed drifts by a third and more over seconds: the probe, timed over a second, and the
    # run with workers, a few seconds later, can see different machines (a pair spoiled so is measured again; a
    # real error in the prediction fails every pair)
    outcomes = []
    for attempt in range(3):
        slow = runs.sample("data_loading_bound_fp16", "--steps", "24", fresh=attempt > 0).record
        probe = slow["loader_probe"]
        assert probe["probe_batch_size"] < probe["batch_size"], probe
        assert probe["elapsed_s"] <= probe["budget_s"] + 1.0
        # when: the suggested worker count is applied; its throughput is measured over whole cycles of its workers
        # (26 steps: after the profiling windows, the memory window's two among them, three whole cycles and more)
        outcomes.append(applied(runs, "data_loading_bound_fp16", ("--steps", "26"), slow, attempt > 0,
                                by_cycles=True))
        if as_predicted(outcomes[-1]):
            break
    # then: the run sped up as predicted, within 25%
    assert as_predicted(outcomes[-1]), str(outcomes)  # a str: pytest shortens other objects


def test_a_cpu_compute_bound_run_reports_its_achieved_flops_against_the_measured_peak(runs: Runs) -> None:
    record = runs.sample("compute_bound").record
    sol = record["speed_of_light"]
    # 1024 -> 4096 -> 4096 -> 1024 on batches of 256: forward 2*256*(4M + 16M + 4M) FLOPs, backward twice that
    # less the first layer's input gradient
    forward = 2 * 256 * (1024 * 4096 + 4096 * 4096 + 4096 * 1024)
    assert sol["flops_per_step"] == 3 * forward - 2 * 256 * 1024 * 4096
    assert 0 < sol["achieved_flops_per_s"] <= sol["peak_flops_per_s"]  # a measured peak is at least the run's rate
    assert sol["peak_measured"] and 0 < sol["mfu"] <= 1
    html = (record["_run_dir"] / "report.html").read_text()
    assert f"{sol['achieved_flops_per_s'] / 1e9:.2f} GFLOP/s" in html
    # the headline of a compute-bound run says how far from the peak it is
    assert record["verdict"]["bound"] == "compute", record["verdict"]["evidence"]
    assert re.search(r"at \d+% of this machine(&#39;|')s measured float32 matmul peak", html)
