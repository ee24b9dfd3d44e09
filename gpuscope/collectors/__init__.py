"""One module per source of measurements; ``default_collectors()`` lists those a run starts with."""

from __future__ import annotations

from dataclasses import dataclass

from gpuscope.collectors import cprofile, torch_trace
from gpuscope.collectors.base import Collector, CollectorResult


@dataclass(frozen=True, slots=True)
class CollectOptions:
    """What the user chose on the command line (or in ``gpuscope.profile()``); defaults are the collectors' own."""

    cprofile_steps: int | None = cprofile.DEFAULT_STEPS
    """Steps cProfile covers after the start-up; None: the whole run."""
    trace_steps: int = torch_trace.DEFAULT_ACTIVE
    """Steps torch.profiler records; 0: no torch.profiler."""
    trace_max_bytes: int = torch_trace.DEFAULT_MAX_BYTES
    probe_loader: bool = False
    """Time the slowest loader with several worker counts after the run even when data wait was under
    ``thresholds.DATA_WAIT_NOTABLE`` (it always runs above)."""
    probes: bool = True
    """Run the post-run probes (data probe, loader probe, calibration), which re-run code after the script;
    False (``--no-probes``): a fast exit with the timings only."""

    @property
    def trace_start(self) -> int:
        """torch.profiler's window begins one clean step after cProfile's."""
        return (self.cprofile_steps or 0) + 1

    @property
    def sync_start(self) -> int:
        """Syncs are counted from the step at whose start torch.profiler's window (one warm-up step, then
        ``trace_steps`` recorded ones) closes: the two never overlap."""
        return self.trace_start + self.trace_steps + 1

    @property
    def flops_start(self) -> int:
        """The step whose FLOPs are counted: the first after torch.profiler's window on a CPU run, the first after
        the sync count's window (CUDA only) on a CUDA run."""
        return self.sync_start

    @property
    def flops_cuda_start(self) -> int:
        from gpuscope.collectors.syncs import DEFAULT_STEPS

        return self.sync_start + DEFAULT_STEPS


def default_collectors(options: CollectOptions | None = None) -> list[Collector]:
    """Fresh instances of the collectors a run uses, in start order (the steps collector before those that follow
    its steps)."""
    from gpuscope.collectors.calibration import CalibrationCollector
    from gpuscope.collectors.cprofile import CProfileCollector
    from gpuscope.collectors.cuda_memory import CudaMemoryCollector
    from gpuscope.collectors.data_probe import DataProbeCollector
    from gpuscope.collectors.flops import SpeedOfLightCollector
    from gpuscope.collectors.loader_probe import LoaderProbeCollector
    from gpuscope.collectors.memory import HostMemoryCollector
    from gpuscope.collectors.nvml import NvmlCollector
    from gpuscope.collectors.nvtx import NvtxCollector
    from gpuscope.collectors.practices import PracticesCollector
    from gpuscope.collectors.steps import StepsCollector
    from gpuscope.collectors.syncs import SyncCollector
    from gpuscope.collectors.torch_trace import TorchTraceCollector

    options = options or CollectOptions()
    practices = PracticesCollector()
    steps = StepsCollector()
    probes: list[Collector] = [
        # stopped after all the others (collectors stop in reverse order), calibration included: it runs the
        # user's dataset code again under a line tracer, which no hook, profiler or timing of theirs may see.
        # Listed before the steps collector, it is not bound to it by the session: it gets it here.
        DataProbeCollector(steps),
        # after the data probe, like it: loads the user's dataset again with several worker counts
        LoaderProbeCollector(steps, forced=options.probe_loader),
        # stopped next to last: it runs a few training steps of its own, which no hook or profiling window of the
        # others may see
        CalibrationCollector(anomaly_used=practices.anomaly_seen),
    ] if options.probes else []
    return [
        *probes,
        steps,
        # right after the steps collector: stopped after the profilers, so its end-of-run CPU matmul benchmark
        # is profiled by none of them
        SpeedOfLightCollector(options.flops_start, options.flops_cuda_start),
        CProfileCollector(options.cprofile_steps),
        TorchTraceCollector(options.trace_start, options.trace_steps, options.trace_max_bytes),
        SyncCollector(options.sync_start),
        HostMemoryCollector(),
        NvmlCollector(),
        NvtxCollector(),
        CudaMemoryCollector(),
        practices,
    ]


__all__ = ["CollectOptions", "Collector", "CollectorResult", "default_collectors"]
