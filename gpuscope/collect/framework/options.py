"""What the user chose on the command line (or in ``gpuscope.profile()``) for the collectors, and the defaults."""

from __future__ import annotations

from dataclasses import dataclass

CPROFILE_STEPS = 5
"""Steps cProfile profiles after the start-up: enough to see the loop's hot functions, few enough to cost little."""
TRACE_STEPS = 3
"""Steps torch.profiler records: a few are enough to see the loop's ops and kernels; each costs trace size."""
TRACE_MAX_BYTES = 50 * 1024 * 1024
"""trace.json's cap: Perfetto and chrome://tracing open 50 MB comfortably; much larger traces do not open."""


@dataclass(frozen=True, slots=True)
class CollectOptions:
    """What the user chose on the command line (or in ``gpuscope.profile()``); defaults are the collectors' own."""

    cprofile_steps: int | None = CPROFILE_STEPS
    """Steps cProfile covers after the start-up; None: the whole run."""
    trace_steps: int = TRACE_STEPS
    """Steps torch.profiler records; 0: no torch.profiler."""
    trace_max_bytes: int = TRACE_MAX_BYTES
    probe_loader: bool = False
    """Time the slowest loader with several worker counts after the run even when data wait was under
    ``thresholds.DATA_WAIT_NOTABLE`` (it always runs above)."""
    probes: bool = True
    """Run the post-run probes (data probe, loader probe, calibration, the CPU's matmul peak), which run code
    after the script; False (``--no-probes``): a fast exit with the timings only."""
    skip_steps: int = 0
    """Steps before any window (``--skip-steps``): a learning-rate warm-up, a first epoch that fills caches. They
    are left out of the figures."""
    profile_steps: int | None = None
    """Steps measured after the skipped ones (``--profile-steps``), every window among them; then the collectors
    hand the record over and come out (None: they stay to the end of the run)."""
    compact_windows: bool = False
    """Every window one step (``WindowRequest.long_steps``), one after another from the start
    (``schedule.compact_plan``): ``--profile-steps`` too few to hold them at their full length."""
    memory_window: bool = True
    """Two steps under the memory timeline after the other windows; off where ``--profile-steps`` is too few to hold
    them beside the others and the steady steps."""


__all__ = ["CPROFILE_STEPS", "TRACE_MAX_BYTES", "TRACE_STEPS", "CollectOptions"]
