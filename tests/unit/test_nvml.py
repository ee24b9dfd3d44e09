"""NVML sampling without a GPU: why it is unavailable, raw readings to the record, and a stand-in pynvml that
shows the collector only reads and copes with queries a GPU does not support."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import make_record
from gpuscope.collect.collectors.nvml import (
    THROTTLE_REASONS,
    NvmlCollector,
    build_gpu_samples,
    select_devices,
    throttle_names,
)
from gpuscope.record import CollectorStatus, GpuSamples, RunRecord

GIB = 1 << 30

# Two GPUs as NVML might report them over three samples (NVML's units: percent, bytes, mW, MHz, C, KB/s).
DEVICES_INFO = [
    {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-aaaa", "memory_total_bytes": 80 * GIB},
    {"index": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-bbbb", "memory_total_bytes": 80 * GIB},
]
RAW_SAMPLES = [
    {"index": 0, "t_s": 0.0, "gpu_util_pct": 0, "memory_util_pct": 0, "memory_used_bytes": 1 * GIB,
     "power_mw": 70_000, "sm_clock_mhz": 345, "temperature_c": 30, "pcie_tx_kb_s": 100, "pcie_rx_kb_s": 200,
     "clocks_event_reasons": 0x1},
    {"index": 1, "t_s": 0.0, "gpu_util_pct": 0, "memory_util_pct": 0, "memory_used_bytes": 1 * GIB,
     "power_mw": None, "sm_clock_mhz": 345, "temperature_c": 31, "pcie_tx_kb_s": None, "pcie_rx_kb_s": None,
     "clocks_event_reasons": 0x0},
    {"index": 0, "t_s": 0.05, "gpu_util_pct": 97, "memory_util_pct": 45, "memory_used_bytes": 30 * GIB,
     "power_mw": 650_500, "sm_clock_mhz": 1980, "temperature_c": 61, "pcie_tx_kb_s": None, "pcie_rx_kb_s": None,
     "clocks_event_reasons": 0x4},
    {"index": 1, "t_s": 0.05, "gpu_util_pct": 50, "memory_util_pct": 20, "memory_used_bytes": 20 * GIB,
     "power_mw": None, "sm_clock_mhz": 1755, "temperature_c": 58, "pcie_tx_kb_s": None, "pcie_rx_kb_s": None,
     "clocks_event_reasons": 0x20 | 0x40},
    {"index": 0, "t_s": 0.1, "gpu_util_pct": 100, "memory_util_pct": 50, "memory_used_bytes": 30 * GIB,
     "power_mw": 700_000, "sm_clock_mhz": 1755, "temperature_c": 70, "pcie_tx_kb_s": None, "pcie_rx_kb_s": None,
     "clocks_event_reasons": 0x4 | 0x8},
    # utilization could not be read here: the record cannot hold a gap in sm_util, so this reading is left out
    {"index": 1, "t_s": 0.1, "gpu_util_pct": None, "memory_util_pct": None, "memory_used_bytes": 20 * GIB,
     "power_mw": None, "sm_clock_mhz": None, "temperature_c": 59, "pcie_tx_kb_s": None, "pcie_rx_kb_s": None,
     "clocks_event_reasons": 0x80},
]


class TestUnavailable:
    def test_without_a_driver_the_reason_is_one_clear_line(self) -> None:
        reason = NvmlCollector().unavailable_reason()
        if reason is None:
            pytest.skip("NVML initialised: this machine has an NVIDIA GPU and driver")
        assert reason.strip() and "\n" not in reason
        assert "NVML" in reason

    def test_a_missing_library_reads_as_no_driver(self) -> None:
        fake = FakeNvml(init_error=FakeNvmlError(12, "NVML Shared Library Not Found"))
        reason = NvmlCollector(nvml=fake).unavailable_reason()
        assert reason == "no NVIDIA driver (NVML could not be loaded: NVML Shared Library Not Found)"

    def test_an_os_error_while_loading_reads_as_no_driver(self) -> None:
        fake = FakeNvml(init_error=OSError("libnvidia-ml.so.1: cannot open shared object file"))
        assert NvmlCollector(nvml=fake).unavailable_reason().startswith("no NVIDIA driver (")

    def test_a_driver_with_no_gpu_says_so_and_shuts_nvml_down(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # given pynvml itself replaced, as the collector imports it
        fake = FakeNvml(gpus=0)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        # when asked whether it can run
        reason = NvmlCollector().unavailable_reason()
        # then it cannot, and NVML's init is balanced
        assert reason == "NVML found no GPU"
        assert fake._calls["nvmlInit"] == fake._calls["nvmlShutdown"] == 1

    def test_cuda_visible_devices_hiding_every_gpu_makes_it_unavailable(self) -> None:
        collector = NvmlCollector(nvml=FakeNvml(), environ={"CUDA_VISIBLE_DEVICES": ""})
        assert "leaves no GPU visible" in collector.unavailable_reason()

    def test_gpus_present_make_it_available(self) -> None:
        assert NvmlCollector(nvml=FakeNvml(), environ={}).unavailable_reason() is None


class TestBuildGpuSamples:
    def test_readings_become_the_record_in_its_units(self) -> None:
        samples = build_gpu_samples(RAW_SAMPLES, DEVICES_INFO, interval_s=0.05, driver="550.54.15")
        assert samples.interval_s == 0.05 and samples.driver == "550.54.15"
        first, second = samples.devices
        assert (first.index, first.name, first.memory_total_bytes) == (0, "NVIDIA H100 80GB HBM3", 80 * GIB)
        assert first.t_s == (0.0, 0.05, 0.1)
        assert first.sm_util == pytest.approx((0.0, 0.97, 1.0))
        assert first.memory_util == pytest.approx((0.0, 0.45, 0.5))
        assert first.memory_used_bytes == (1 * GIB, 30 * GIB, 30 * GIB)
        assert first.power_w == pytest.approx((70.0, 650.5, 700.0))
        assert first.sm_clock_mhz == (345, 1980, 1755)
        assert first.temperature_c == (30, 61, 70)
        assert first.pcie_tx_bytes_s == (100 * 1024, None, None)
        assert first.pcie_rx_bytes_s == (200 * 1024, None, None)

    def test_an_unsupported_field_stays_none_and_the_rest_is_kept(self) -> None:
        second = build_gpu_samples(RAW_SAMPLES, DEVICES_INFO, 0.05, None).devices[1]
        assert second.power_w == (None, None)
        assert second.sm_util == pytest.approx((0.0, 0.5))
        assert second.temperature_c == (31, 58)

    def test_a_reading_without_utilization_is_left_out_of_the_series(self) -> None:
        second = build_gpu_samples(RAW_SAMPLES, DEVICES_INFO, 0.05, None).devices[1]
        assert second.t_s == (0.0, 0.05)
        assert len(second.memory_used_bytes) == len(second.sm_clock_mhz) == len(second.pcie_rx_bytes_s) == 2

    def test_throttle_reasons_are_the_union_over_the_run_without_idle(self) -> None:
        first, second = build_gpu_samples(RAW_SAMPLES, DEVICES_INFO, 0.05, None).devices
        assert first.throttle_reasons == ("sw_power_cap", "hw_slowdown")
        # the reading left out of the series still shows its throttle reason
        assert second.throttle_reasons == ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")

    def test_a_gpu_without_readings_is_still_listed(self) -> None:
        samples = build_gpu_samples([], DEVICES_INFO[:1], 0.05, None)
        assert len(samples.devices) == 1 and samples.devices[0].t_s == ()

    def test_the_samples_survive_run_json(self) -> None:
        samples = build_gpu_samples(RAW_SAMPLES, DEVICES_INFO, 0.05, "550.54.15")
        record = make_record(gpus=samples)
        assert RunRecord.from_json(record.to_json()).gpus == samples


class TestThrottleNames:
    def test_bits_name_their_reasons_and_idle_is_left_out(self) -> None:
        assert throttle_names(0) == ()
        assert throttle_names(0x1) == ()
        assert throttle_names(0x1 | 0x2 | 0x100) == ("applications_clocks_setting", "display_clocks_setting")
        assert throttle_names(0x10 | 0x8000) == ("sync_boost", "reason_0x8000")

    def test_bits_match_the_nvml_bindings(self) -> None:
        pynvml = pytest.importorskip("pynvml")
        expected = {
            "applications_clocks_setting": "ApplicationsClocksSetting", "sw_power_cap": "SwPowerCap",
            "hw_slowdown": "HwSlowdown", "sync_boost": "SyncBoost", "sw_thermal_slowdown": "SwThermalSlowdown",
            "hw_thermal_slowdown": "HwThermalSlowdown", "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
            "display_clocks_setting": "DisplayClockSetting",
        }
        for bit, name in THROTTLE_REASONS:
            assert getattr(pynvml, "nvmlClocksThrottleReason" + expected[name]) == bit


class TestSelectDevices:
    GPUS = [{"index": i, "uuid": f"GPU-{c * 8}-1111", "name": "A100"} for i, c in enumerate("abcd")]

    @pytest.mark.parametrize("visible, expected", [
        (None, [0, 1, 2, 3]),
        ("2", [2]),
        ("3,1", [3, 1]),
        (" 1 , 2 ", [1, 2]),
        ("", []),
        ("-1", []),
        ("0,7,1", [0]),  # CUDA stops at the first invalid index
        ("GPU-cccccccc-1111", [2]),
        ("GPU-dddd,0", [3, 0]),  # a unique prefix is enough
    ])
    def test_visible_gpus_are_the_nvml_indices_cuda_would_use(self, visible: str | None, expected: list[int]) -> None:
        assert select_devices(visible, self.GPUS) == (expected, None)

    @pytest.mark.parametrize("visible", ["MIG-0a1b2c3d-4e5f-6789-abcd-ef0123456789", "GPU-ffff", "GPU-"])
    def test_unmatched_ids_sample_every_gpu_with_a_note(self, visible: str) -> None:
        chosen, note = select_devices(visible, self.GPUS)
        assert chosen == [0, 1, 2, 3]
        assert note is not None and "every GPU" in note

    def test_indices_on_unlike_gpus_note_cudas_own_ordering(self) -> None:
        gpus = [dict(self.GPUS[0], name="RTX 4090"), *self.GPUS[1:]]
        assert select_devices("1", gpus)[1] is not None
        assert select_devices("1", gpus, device_order="PCI_BUS_ID") == ([1], None)


class TestSamplingThread:
    def _run(self, fake: FakeNvml, ticks: int = 4, **kwargs: Any) -> tuple[GpuSamples, NvmlCollector]:
        """Sample with the real thread until it has read the GPUs ``ticks`` times (not for a fixed time, which a
        loaded machine may fill with fewer samples), then stop."""
        collector = NvmlCollector(interval_s=0.01, nvml=fake, environ=kwargs.pop("environ", {}), **kwargs)
        assert collector.unavailable_reason() is None
        collector.start(Path("unused"))
        deadline = time.monotonic() + 10
        while max(fake._util_reads.values(), default=0) < ticks and time.monotonic() < deadline:
            time.sleep(0.002)
        result = collector.stop()
        assert result.status == CollectorStatus("ok")
        assert isinstance(result.payload, GpuSamples)
        return result.payload, collector

    def test_the_collector_only_reads(self) -> None:
        # given a stand-in pynvml that records every name the collector touches
        fake = FakeNvml()
        # when a run is sampled
        self._run(fake)
        # then nothing but init, shutdown, getters and constants was touched, and init and shutdown balance
        touched = set(fake._accessed)
        assert not {name for name in touched if name.startswith("nvmlDeviceSet")}
        assert all(name in {"nvmlInit", "nvmlShutdown", "NVMLError"} or name.startswith(("nvmlDeviceGet",
                   "nvmlSystemGet", "NVML_")) for name in touched), touched
        assert fake._calls["nvmlInit"] == fake._calls["nvmlShutdown"] == 2

    def test_an_unsupported_query_gives_none_and_is_not_asked_again(self) -> None:
        fake = FakeNvml(power_unsupported=("handle-1",))
        samples, collector = self._run(fake)
        first, second = samples.devices
        assert len(second.t_s) >= 3
        assert second.power_w == (None,) * len(second.t_s)
        assert fake._power_calls["handle-1"] == 1
        # the other fields of that GPU, and the other GPU's power, carry on
        assert second.sm_util[-1] == pytest.approx(0.9) and second.temperature_c[-1] == 65
        assert set(first.power_w) == {300.0}
        assert "GPU 1: NVML does not report power" in collector.notes

    def test_a_passing_error_is_none_only_for_that_sample(self) -> None:
        fake = FakeNvml(temperature_errors=1)
        samples, _ = self._run(fake)
        temperatures = samples.devices[0].temperature_c
        assert temperatures[0] is None and set(temperatures[1:]) == {65}

    def test_each_gpu_is_read_at_every_tick_in_record_units(self) -> None:
        samples, _ = self._run(FakeNvml())
        assert samples.driver == "550.54.15" and samples.interval_s == 0.01
        first, second = samples.devices
        assert (first.name, second.name) == ("Fake GPU 0", "Fake GPU 1")  # bytes from older bindings decoded
        assert first.memory_total_bytes == 80 * GIB
        assert set(first.memory_used_bytes) == {10 * GIB}
        assert set(first.sm_clock_mhz) == {1980}
        assert first.throttle_reasons == ("sw_power_cap",)
        # PCIe is read at most once a second, first by the sampling thread (not in start, where it would wait)
        assert first.pcie_tx_bytes_s[0] is None
        assert [v for v in first.pcie_tx_bytes_s if v is not None] == [1000 * 1024]
        assert [v for v in first.pcie_rx_bytes_s if v is not None] == [2000 * 1024]
        assert list(first.t_s) == sorted(first.t_s) and len(first.t_s) >= 3

    def test_only_the_gpus_cuda_can_see_are_sampled(self) -> None:
        samples, _ = self._run(FakeNvml(), environ={"CUDA_VISIBLE_DEVICES": "1"})
        assert [d.index for d in samples.devices] == [1]

    def test_a_long_run_stays_bounded(self) -> None:
        samples, _ = self._run(FakeNvml(), ticks=10, max_samples=4)
        assert all(len(d.t_s) <= 4 for d in samples.devices)
        assert samples.interval_s >= 0.02


class FakeNvmlError(Exception):
    """pynvml's NVMLError: the NVML return code in ``value``."""

    def __init__(self, value: int, message: str = "") -> None:
        super().__init__(message or f"NVML error {value}")
        self.value = value


class FakeNvml:
    """Stands in for the pynvml module: two GPUs (by default) that answer every getter with fixed values.

    Every public name the collector reads is recorded in ``_accessed``. Setters exist, as in pynvml, so that a
    collector calling one would be caught rather than fail on a missing name.
    """

    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVMLError = FakeNvmlError

    def __init__(self, gpus: int = 2, init_error: BaseException | None = None,
                 power_unsupported: tuple[str, ...] = (), temperature_errors: int = 0) -> None:
        self._gpus = gpus
        self._init_error = init_error
        self._power_unsupported = power_unsupported
        self._temperature_errors = temperature_errors
        self._accessed: list[str] = []
        self._calls: Counter[str] = Counter()
        self._power_calls: Counter[str] = Counter()
        self._util_reads: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_"):
            with object.__getattribute__(self, "_lock"):
                object.__getattribute__(self, "_accessed").append(name)
        return object.__getattribute__(self, name)

    def nvmlInit(self) -> None:
        self._calls["nvmlInit"] += 1
        if self._init_error is not None:
            raise self._init_error

    def nvmlShutdown(self) -> None:
        self._calls["nvmlShutdown"] += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return self._gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        assert 0 <= index < self._gpus
        return f"handle-{index}"

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return f"Fake GPU {handle[-1]}".encode()

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        return f"GPU-{handle[-1] * 8}-0000"

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(total=80 * GIB, used=10 * GIB, free=70 * GIB)

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        self._util_reads[handle] += 1
        return SimpleNamespace(gpu=90, memory=35)

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        self._power_calls[handle] += 1
        if handle in self._power_unsupported:
            raise FakeNvmlError(self.NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        return 300_000

    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        if handle == "handle-0" and self._temperature_errors:
            self._temperature_errors -= 1
            raise FakeNvmlError(999, "Unknown Error")
        return 65

    def nvmlDeviceGetPcieThroughput(self, handle: str, counter: int) -> int:
        return 1000 if counter == self.NVML_PCIE_UTIL_TX_BYTES else 2000

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: str) -> int:
        return 0x1 | 0x4

    def nvmlDeviceSetPersistenceMode(self, handle: str, mode: int) -> None:
        raise AssertionError("the collector changed persistence mode")

    def nvmlDeviceSetAccountingMode(self, handle: str, mode: int) -> None:
        raise AssertionError("the collector turned on accounting")

    def nvmlDeviceSetApplicationsClocks(self, handle: str, memory_mhz: int, graphics_mhz: int) -> None:
        raise AssertionError("the collector set clocks")
