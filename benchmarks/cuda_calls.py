"""What each call gpuscope makes on a CUDA training loop's hot path costs, in microseconds (a GPU machine only).

The steps collector records a CUDA event at every phase change and queries them at each step's end; the CUDA
memory collector reads the allocator's counters once a step; NVTX ranges open and close with every phase; the
NVML sampler reads every GPU each 50 ms in its own thread. On a launch-bound loop (7 ms steps on an H100, a few
thousand host-side calls each) ten microseconds a phase change is a percent of the step. Each call is timed in
batches, the median batch reported; the alternatives gpuscope chose between are timed side by side.

    python benchmarks/cuda_calls.py
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

import torch


def per_call_us(call: Callable[[], object], number: int = 2000, repeats: int = 7) -> float:
    call()
    batches = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            call()
        batches.append((time.perf_counter() - start) / number)
    return statistics.median(batches) * 1e6


def nvml_sample() -> Callable[[], object] | None:
    """One sample of the readings gpuscope's NVML sampler takes (PCIe throughput aside: once a second)."""
    try:
        import pynvml as nvml

        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
    except Exception as exc:
        print(f"NVML: {exc}")
        return None

    def sample() -> object:
        return (nvml.nvmlDeviceGetUtilizationRates(handle), nvml.nvmlDeviceGetMemoryInfo(handle),
                nvml.nvmlDeviceGetPowerUsage(handle), nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
                nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))

    return sample


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark times CUDA calls")
    cuda = torch.cuda
    blocks = [torch.empty(2**k, device="cuda") for k in range(8, 24)]  # an allocator with some history
    event, done = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    done.record()
    cuda.synchronize()
    calls: dict[str, Callable[[], object]] = {
        "torch.cuda.is_initialized()": cuda.is_initialized,
        "memory_allocated() + memory_reserved() + max_memory_allocated()":
            lambda: (cuda.memory_allocated(), cuda.memory_reserved(), cuda.max_memory_allocated()),
        "memory_stats()": cuda.memory_stats,
        "memory_stats_as_nested_dict()": cuda.memory_stats_as_nested_dict,
        "torch.cuda.Event.record()": event.record,
        "torch.cuda.Event.query() (passed)": done.query,
        "torch.Event.record()": torch.Event(device="cuda", enable_timing=True).record,
        "is_current_stream_capturing()": cuda.is_current_stream_capturing,
        "torch.is_anomaly_enabled()": torch.is_anomaly_enabled,
        "torch.autograd._profiler_enabled()": torch.autograd._profiler_enabled,
    }
    try:
        import nvtx

        calls["nvtx.start_range() + end_range()"] = lambda: nvtx.end_range(
            nvtx.start_range(message="forward", domain="gpuscope"))
    except ImportError:
        print("nvtx: not installed")
    sample = nvml_sample()
    if sample is not None:
        calls["one NVML sample (5 readings)"] = sample
    width = max(map(len, calls))
    for name, call in calls.items():
        number = 50 if "NVML" in name else 2000
        print(f"{name:<{width}}  {per_call_us(call, number):9.2f} us")
    del blocks
    if sample is not None:
        launches_beside_a_sampler(sample)


def launches_beside_a_sampler(sample: Callable[[], object], rounds: int = 15) -> None:
    """A launch-bound loop (250 tiny kernels, then a synchronize), timed alone and with a thread beside it that
    takes NVML samples every 50 ms, every 500 ms, or back to back, or a thread that only wakes every 50 ms."""
    x = torch.zeros(16, device="cuda")

    def loop_ms(launches: int = 250, loops: int = 40) -> float:
        times = []
        for _ in range(loops):
            start = time.perf_counter()
            for _ in range(launches):
                x.add_(1)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    def beside(interval_s: float | None, work: Callable[[], object]) -> float:
        stop = threading.Event()

        def run() -> None:
            while not stop.is_set():
                work()
                if interval_s:
                    stop.wait(interval_s)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            return loop_ms()
        finally:
            stop.set()
            thread.join()

    variants: dict[str, Callable[[], float]] = {
        "alone": loop_ms,
        "a thread waking every 50 ms": lambda: beside(0.05, lambda: None),
        "NVML sample every 50 ms": lambda: beside(0.05, sample),
        "NVML sample every 500 ms": lambda: beside(0.5, sample),
        "NVML samples back to back": lambda: beside(None, sample),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    loop_ms()
    for _ in range(rounds):
        for name, variant in variants.items():
            times[name].append(variant())
    alone = statistics.median(times["alone"])
    print(f"\n250 launches and a synchronize (median of {rounds} rounds of 40 loops):")
    for name in variants:
        median = statistics.median(times[name])
        print(f"  {name:<30} {median:7.3f} ms  {100 * (median / alone - 1):+6.1f}%")


if __name__ == "__main__":
    main()
