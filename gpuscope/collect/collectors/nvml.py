"""GPU telemetry from NVML: utilization, memory, power, SM clock, temperature, PCIe traffic, throttle reasons.

A daemon thread reads every visible GPU every ``interval_s`` and keeps each reading as a plain dict in NVML's own
units (``RAW_FIELDS``); ``build_gpu_samples`` turns them into the record's ``GpuSamples``, so the conversion is
tested on recorded readings without a GPU.

Observe only: the collector calls nvmlInit, nvmlShutdown and nvml*Get* functions, nothing else. It never sets
clocks or limits and never turns on accounting or persistence mode.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from gpuscope.collect.collectors.memory import BoundedSeries, next_deadline
from gpuscope.collect.framework.base import CollectorResult, Watcher, register
from gpuscope.record import CollectorStatus, GpuDevice, GpuSamples

DEFAULT_INTERVAL_S = 0.05
DEFAULT_MAX_SAMPLES = 2000
PCIE_INTERVAL_S = 1.0
"""PCIe traffic is read at most this often: NVML counts bytes for 20 ms before it answers, and two such calls
per GPU at every 50 ms sample would leave the sampler no time for anything else. Readings in between hold None."""
JOIN_TIMEOUT_S = 2.0
KIB = 1024

RAW_FIELDS = (
    "index", "t_s", "gpu_util_pct", "memory_util_pct", "memory_used_bytes", "power_mw", "sm_clock_mhz",
    "temperature_c", "pcie_tx_kb_s", "pcie_rx_kb_s", "clocks_event_reasons",
)
"""Keys of one raw reading: NVML device index, seconds since start, then values in NVML's units (percent, bytes,
milliwatts, MHz, degrees C, KB/s, a reasons bitmask), each None where the query failed."""

THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x0000000000000002, "applications_clocks_setting"),
    (0x0000000000000004, "sw_power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000010, "sync_boost"),
    (0x0000000000000020, "sw_thermal_slowdown"),
    (0x0000000000000040, "hw_thermal_slowdown"),
    (0x0000000000000080, "hw_power_brake_slowdown"),
    (0x0000000000000100, "display_clocks_setting"),
)
"""nvmlClocksEventReason* bits (nvml.h; the values are ABI, so the builder needs no pynvml)."""
IDLE_REASON = 0x1
"""An idle GPU lowering its clocks is no throttle worth reporting."""

NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
FUNCTION_NOT_FOUND = 13  # NVML_ERROR_FUNCTION_NOT_FOUND: a driver older than the bindings
PERMANENT_ERRORS = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND})
"""Errors that will not change on retry: the query is not called again for that GPU."""
NO_DRIVER_ERRORS = frozenset({9, 12})  # NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND


def throttle_names(mask: int) -> tuple[str, ...]:
    """Names of the active throttle reasons in an NVML bitmask, idle left out, unknown bits as ``reason_0x..``."""
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    rest = mask & ~IDLE_REASON & ~sum(bit for bit, _ in THROTTLE_REASONS)
    names.extend(f"reason_{1 << b:#x}" for b in range(rest.bit_length()) if rest >> b & 1)
    return tuple(names)


def build_gpu_samples(
    raw_samples: Iterable[Mapping[str, Any]],
    devices_info: Sequence[Mapping[str, Any]],
    interval_s: float,
    driver: str | None,
) -> GpuSamples:
    """The record's ``GpuSamples`` from raw readings (``RAW_FIELDS``) and device descriptions
    (``index``, ``name``, ``memory_total_bytes``).

    A reading lacking utilization or memory use is left out of its GPU's series (the record holds those as
    plain numbers); the other fields keep None where NVML could not answer. Throttle reasons are the union
    over every reading.
    """
    readings: dict[int, list[Mapping[str, Any]]] = {int(d["index"]): [] for d in devices_info}
    for raw in raw_samples:
        readings.get(int(raw["index"]), []).append(raw)
    devices = []
    for info in devices_info:
        own = sorted(readings[int(info["index"])], key=lambda r: r["t_s"])
        masks = [m for r in own if (m := r.get("clocks_event_reasons")) is not None]
        seen = {name for m in masks for name in throttle_names(int(m))}
        kept = [r for r in own if all(r.get(k) is not None
                                      for k in ("gpu_util_pct", "memory_util_pct", "memory_used_bytes"))]
        devices.append(GpuDevice(
            index=int(info["index"]),
            name=str(info.get("name", "")),
            memory_total_bytes=int(info.get("memory_total_bytes") or 0),
            t_s=tuple(float(r["t_s"]) for r in kept),
            sm_util=tuple(r["gpu_util_pct"] / 100 for r in kept),
            memory_util=tuple(r["memory_util_pct"] / 100 for r in kept),
            memory_used_bytes=tuple(int(r["memory_used_bytes"]) for r in kept),
            power_w=tuple(_scaled(r.get("power_mw"), 1e-3) for r in kept),
            sm_clock_mhz=tuple(_int(r.get("sm_clock_mhz")) for r in kept),
            temperature_c=tuple(_int(r.get("temperature_c")) for r in kept),
            # NVML's KB here is 1024 bytes, as in its memory figures
            pcie_tx_bytes_s=tuple(_scaled(r.get("pcie_tx_kb_s"), KIB) for r in kept),
            pcie_rx_bytes_s=tuple(_scaled(r.get("pcie_rx_kb_s"), KIB) for r in kept),
            throttle_reasons=tuple(sorted(seen, key=_reason_order)),
        ))
    return GpuSamples(interval_s=interval_s, driver=driver, devices=tuple(devices))


def select_devices(
    visible: str | None, devices: Sequence[Mapping[str, Any]], device_order: str | None = None
) -> tuple[list[int], str | None]:
    """NVML indices of the GPUs that ``CUDA_VISIBLE_DEVICES`` (``visible``) leaves visible, and a note when it
    cannot be followed (then every GPU is sampled) or may be misread. ``devices`` hold ``index``, ``uuid`` and
    ``name``; ``device_order`` is ``CUDA_DEVICE_ORDER``."""
    every = [int(d["index"]) for d in devices]
    if visible is None:
        return every, None
    chosen: list[int] = []
    by_number = False
    for entry in (e.strip() for e in visible.split(",")) if visible.strip() else ():
        if not entry:
            break  # CUDA stops reading at an empty entry too
        if re.fullmatch(r"[+-]?\d+", entry):
            if int(entry) not in every:
                break  # as CUDA does: an invalid index hides it and every GPU listed after it
            chosen.append(int(entry))
            by_number = True
            continue
        matches = [int(d["index"]) for d in devices if entry.startswith("GPU-") and str(d["uuid"]).startswith(entry)]
        if len(matches) != 1:  # a MIG instance, or a UUID NVML does not list
            return every, f"CUDA_VISIBLE_DEVICES={visible!r} could not be matched to GPUs: every GPU was sampled"
        chosen.append(matches[0])
    chosen = list(dict.fromkeys(chosen))
    note = None
    names = {str(d["name"]) for d in devices}
    if by_number and len(names) > 1 and device_order != "PCI_BUS_ID":
        note = ("CUDA numbers unlike GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; "
                "CUDA_VISIBLE_DEVICES was read as NVML (PCI order) indices")
    return chosen, note


@register
class NvmlCollector(Watcher):
    """Samples every GPU that CUDA can see through NVML, reading only."""

    name: ClassVar[str] = "nvml"
    gpu_only: ClassVar[bool] = True  # on a CPU run its reason explains the report's Device section
    field: ClassVar[str | None] = "gpus"

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        pcie_interval_s: float = PCIE_INTERVAL_S,
        nvml: Any = None,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``nvml`` stands in for the pynvml module (tests); ``environ`` for os.environ."""
        self._series: BoundedSeries[list[dict[str, Any]]] = BoundedSeries(interval_s, max_samples)
        self._pcie_interval_s = pcie_interval_s
        self._nvml = nvml
        self._environ = environ
        self._clock = clock
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._unsupported: set[tuple[int, str]] = set()
        self._last_pcie = -float("inf")
        self._failures = 0
        self._last_error = ""
        self.notes: tuple[str, ...] = ()
        """Plain statements about what could not be measured, for the run's notes."""

    def unavailable_reason(self) -> str | None:
        try:
            nvml = self._load()
        except Exception as exc:
            return _one_line(f"NVML bindings (nvidia-ml-py) could not be imported: {exc}")
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError, OSError, or whatever a broken install raises
            return _init_failure(exc)
        try:
            if nvml.nvmlDeviceGetCount() == 0:
                return "NVML found no GPU"
            visible = self._env("CUDA_VISIBLE_DEVICES")
            if visible is not None and not select_devices(visible, self._describe(nvml))[0]:
                return _one_line(f"CUDA_VISIBLE_DEVICES={visible!r} leaves no GPU visible")
            return None
        except Exception as exc:
            return _one_line(f"NVML could not list the GPUs: {exc}")
        finally:
            _quietly(nvml.nvmlShutdown)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self, run_dir: Path) -> None:
        nvml = self._nvml = self._load()
        nvml.nvmlInit()
        try:
            self._driver = _text(_quietly(nvml.nvmlSystemGetDriverVersion))
            every = self._describe(nvml)
            chosen, note = select_devices(self._env("CUDA_VISIBLE_DEVICES"), every, self._env("CUDA_DEVICE_ORDER"))
            self._select_note = note
            self._handles = [(d["index"], d["handle"]) for d in every if d["index"] in chosen]
            # the record gets descriptions only, never a handle
            self._info = [{k: v for k, v in d.items() if k != "handle"} for d in every if d["index"] in chosen]
            self._reasons_call = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                                  or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
            self._t0 = self._clock()
            self._tick(pcie_allowed=False)
            self._thread = threading.Thread(target=self._run, name="gpuscope-nvml", daemon=True)
            self._thread.start()
        except BaseException:
            _quietly(nvml.nvmlShutdown)  # the session will not call stop() after a failed start
            raise

    def stop(self) -> CollectorResult:
        self._stopping.set()
        notes = [self._select_note] if self._select_note else []
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)
        if self._thread is not None and self._thread.is_alive():
            # Shutting NVML down under a call still in flight could crash the process; one leaked init does not.
            notes.append("NVML sampler did not stop in time; NVML was left initialised")
        else:
            self._tick(pcie_allowed=False)
            _quietly(self._nvml.nvmlShutdown)
        with self._lock:
            raw = [reading for tick in self._series.samples for reading in tick]
            interval_s = self._series.interval_s
        notes.extend(f"GPU {index}: NVML does not report {query}" for index, query in sorted(self._unsupported))
        if self._failures:
            notes.append(f"{self._failures} GPU samples failed (last: {self._last_error})")
        self.notes = tuple(notes)
        return CollectorResult(CollectorStatus("ok"), build_gpu_samples(raw, self._info, interval_s, self._driver),
                               notes=self.notes)

    # -- sampling ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        with self._lock:
            deadline = self._t0 + self._series.interval_s
        while not self._stopping.wait(max(0.0, deadline - self._clock())):
            self._tick()
            with self._lock:
                interval_s = self._series.interval_s
            deadline = next_deadline(deadline, interval_s, self._clock())

    def _tick(self, pcie_allowed: bool = True) -> None:
        """One reading of every sampled GPU; failures are counted, never raised (this runs on the thread).

        The readings taken in start() and stop() leave PCIe out: its 20 ms per query would hold up the script.
        """
        try:
            now = self._clock()
            pcie = pcie_allowed and now - self._last_pcie >= self._pcie_interval_s
            if pcie:
                self._last_pcie = now
            readings = [self._read(index, handle, now - self._t0, pcie) for index, handle in self._handles]
            with self._lock:
                self._series.add(readings)
        except Exception as exc:
            self._failures += 1
            self._last_error = _one_line(f"{type(exc).__name__}: {exc}")

    def _read(self, index: int, handle: Any, t_s: float, pcie: bool) -> dict[str, Any]:
        nvml = self._nvml
        ask = self._query
        util = ask(index, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        memory = ask(index, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        return {
            "index": index,
            "t_s": t_s,
            "gpu_util_pct": getattr(util, "gpu", None),
            "memory_util_pct": getattr(util, "memory", None),
            "memory_used_bytes": getattr(memory, "used", None),
            "power_mw": ask(index, "power", lambda: nvml.nvmlDeviceGetPowerUsage(handle)),
            "sm_clock_mhz": ask(index, "sm clock", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            "temperature_c": ask(index, "temperature",
                                 lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            "pcie_tx_kb_s": ask(index, "pcie tx", lambda: nvml.nvmlDeviceGetPcieThroughput(
                handle, nvml.NVML_PCIE_UTIL_TX_BYTES)) if pcie else None,
            "pcie_rx_kb_s": ask(index, "pcie rx", lambda: nvml.nvmlDeviceGetPcieThroughput(
                handle, nvml.NVML_PCIE_UTIL_RX_BYTES)) if pcie else None,
            "clocks_event_reasons": ask(index, "throttle reasons", lambda: self._clock_reasons(handle)),
        }

    def _query(self, index: int, query: str, call: Callable[[], Any]) -> Any:
        """One NVML query, or None when it fails; one that the GPU does not support is not asked again."""
        if (index, query) in self._unsupported:
            return None
        try:
            return call()
        except Exception as exc:
            if getattr(exc, "value", None) in PERMANENT_ERRORS:
                self._unsupported.add((index, query))
            return None

    def _clock_reasons(self, handle: Any) -> Any:
        if self._reasons_call is None:
            raise _Unsupported()
        try:
            return self._reasons_call(handle)
        except Exception as exc:
            legacy = getattr(self._nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
            if getattr(exc, "value", None) != FUNCTION_NOT_FOUND or legacy is None or legacy is self._reasons_call:
                raise
            self._reasons_call = legacy  # bindings newer than the driver: the query's older name
            return legacy(handle)

    # -- helpers -----------------------------------------------------------------------------------------
    def _load(self) -> Any:
        if self._nvml is None:
            import pynvml

            self._nvml = pynvml
        return self._nvml

    def _env(self, name: str) -> str | None:
        return (self._environ if self._environ is not None else os.environ).get(name)

    @staticmethod
    def _describe(nvml: Any) -> list[dict[str, Any]]:
        """Every GPU NVML lists, with its handle (kept out of the record)."""
        devices = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = _quietly(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
            devices.append({
                "index": index,
                "handle": handle,
                "name": _text(_quietly(lambda: nvml.nvmlDeviceGetName(handle))) or "",
                "uuid": _text(_quietly(lambda: nvml.nvmlDeviceGetUUID(handle))) or "",
                "memory_total_bytes": int(getattr(memory, "total", 0) or 0),
            })
        return devices


class _Unsupported(Exception):
    value = NOT_SUPPORTED


def _init_failure(exc: BaseException) -> str:
    if getattr(exc, "value", None) in NO_DRIVER_ERRORS or isinstance(exc, OSError):
        return _one_line(f"no NVIDIA driver (NVML could not be loaded: {exc})")
    return _one_line(f"NVML could not be initialised: {type(exc).__name__}: {exc}")


def _quietly(call: Callable[[], Any]) -> Any:
    """``call()``, or None if it fails: for descriptive reads whose absence costs only a label."""
    try:
        return call()
    except Exception:
        return None


def _text(value: Any) -> str | None:
    # older pynvml releases return bytes
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _scaled(value: Any, factor: float) -> float | None:
    return None if value is None else float(value) * factor


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


_REASON_RANK = {reason: rank for rank, (_, reason) in enumerate(THROTTLE_REASONS)}


def _reason_order(name: str) -> tuple[int, str]:
    return _REASON_RANK.get(name, len(_REASON_RANK)), name
