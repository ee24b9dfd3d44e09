"""Rules about the host's memory allocator: steps that spend their time in the kernel, faulting in again the memory
the allocator handed back to it at the step before."""

from __future__ import annotations

import bisect
import shlex
from dataclasses import dataclass

from gpuscope.diagnose.evidence import STEP, Metric
from gpuscope.diagnose.rules.base import AtRunTime, Finding, rule
from gpuscope.record import RunRecord

KERNEL_SHARE_MIN = 0.2
"""The share of the step the kernel's CPU time must take in the steady steps for ``tune-host-allocator`` to fire
(``kernel_share``): well above the sample workloads' 0-10%, well below the 54% of a loop whose every step faults
its memory in again (docs/diagnosis.md)."""
KERNEL_SHARE_BASELINE = 0.05
"""The kernel's share a step keeps with the fix (system calls, the memory a run does need afresh): taken off the
measured share for the gain."""
FAULTED_MIB_MIN = 8.0
"""Fresh memory a step must fault in, MiB, for the kernel's time to be the allocator's: below it, the kernel's time
went to something else (files, pipes, threads waking), which another allocator would not save."""
MIN_STEPS = 5
"""Steady steps the samples must span for the kernel's share to be told."""
MIB = 1 << 20
GENERIC_KEEP = 1 << 30
"""The thresholds of the rule's generic fix, where no run's peak sets them: 1 GiB."""
THRESHOLDS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@dataclass(frozen=True, slots=True)
class KernelTime:
    """The process's CPU time and page faults over the host memory samples that span steady steps."""

    steps: int
    user_s: float
    sys_s: float
    faults: int

    def share(self, median_s: float) -> float:
        """The kernel's share of the step: its CPU time a step over the median step, or over the process's CPU time
        a step where that is longer (the step's threads computing side by side, each paying its own faults)."""
        return self.sys_s / max(median_s * self.steps, self.user_s + self.sys_s)


def kernel_time(run: RunRecord) -> KernelTime | None:
    """Summed over each pair of consecutive host memory samples between which steps ran, all of them steady (not
    a warm-up step, nor one a profiler ran in, as far as the step sample tells); None where those span fewer than
    ``MIN_STEPS`` steps or kept no CPU time."""
    m = run.host_memory
    if m is None or len(m.steps_seen) < 2 or len(m.sys_s) != len(m.steps_seen):
        return None
    sample = run.steps.sample
    unsteady = sorted(i for i, status in zip(sample.index, sample.status) if status != "steady")
    steps = faults = 0
    user_s = sys_s = 0.0
    for a in range(len(m.steps_seen) - 1):
        first, last = m.steps_seen[a], m.steps_seen[a + 1]  # steps first..last - 1 ended in between, give or take one
        if first < run.steps.warmup or last <= first or _any_within(unsteady, first - 1, last):
            continue
        steps += last - first
        user_s += m.user_s[a + 1] - m.user_s[a]
        sys_s += m.sys_s[a + 1] - m.sys_s[a]
        faults += m.minor_faults[a + 1] - m.minor_faults[a]
    if steps < MIN_STEPS or user_s + sys_s <= 0:
        return None
    return KernelTime(steps, user_s, sys_s, faults)


def _any_within(indices: list[int], low: int, high: int) -> bool:
    """Whether sorted ``indices`` hold one from ``low`` to ``high``."""
    at = bisect.bisect_left(indices, low)
    return at < len(indices) and indices[at] <= high


def kernel_share(run: RunRecord) -> float | None:
    """The kernel's share of the steady step (``KernelTime.share``); None where it was not measured."""
    k = kernel_time(run)
    return k.share(run.steps.median_s) if k is not None else None


def keep_bytes(peak_bytes: int) -> int:
    """What glibc should keep for reuse: the process's peak memory, rounded up to a power of two (256 MiB at
    least): no block the run frees can be larger."""
    return 1 << max(28, (max(peak_bytes, 1) - 1).bit_length())


def command_text(run: RunRecord) -> str:
    """The run's command as a user types it after ``python``, shortened where long."""
    whole = shlex.join(run.command)
    if len(whole) <= 60:
        return whole
    return shlex.join(run.command[:2] if run.command[:1] == ("-m",) else run.command[:1]) + " ..."


@rule(id="tune-host-allocator",
      title="Keep freed host memory for reuse instead of faulting it in again every step",
      fix=f"{' '.join(f'{name}={GENERIC_KEEP}' for name in THRESHOLDS)} python train.py  "
          "# or preload jemalloc or tcmalloc (LD_PRELOAD)",
      needs=("host_memory", "glibc_malloc"),
      resolved_by=(Metric("the kernel's share of the step", "share", kernel_share), STEP),
      trial=AtRunTime(env=dict.fromkeys(THRESHOLDS, str(GENERIC_KEEP))))
def tune_host_allocator(run: RunRecord) -> Finding | None:
    """Signal: in the steady steps the kernel's CPU time took 20% of the step or more, while the process faulted in
    8 MiB of fresh memory a step or more.
    Why it matters: glibc's malloc hands a freed block above its mmap threshold (which adapts, up to 32 MiB) back to
    the kernel at once, and trims freed memory off the top of its heap; a step that allocates large tensors (a
    batch's activations, per-sample gradients) gets fresh pages each time, and the kernel maps in and zeroes each
    of them on first touch, on the training thread.
    Fix: let glibc keep what it frees (``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` above the largest
    block), or preload an allocator that does, jemalloc or tcmalloc (PyTorch's CPU performance tuning guide).
    Gain: the kernel's share of the step, less the 5% a step keeps."""
    k = kernel_time(run)
    m = run.host_memory
    assert m is not None
    if k is None or not m.page_bytes:
        return None
    mib = k.faults * m.page_bytes / k.steps / MIB
    median = run.steps.median_s
    share = k.share(median)
    if share < KERNEL_SHARE_MIN or mib < FAULTED_MIB_MIN:
        return None
    evidence = [f"the kernel's CPU time took {share:.0%} of the step over {k.steps} steps after the warm-up: "
                f"{k.sys_s / k.steps * 1e3:.1f} ms a step on all the process's threads, "
                f"{k.sys_s / (k.user_s + k.sys_s):.0%} of its CPU time, against a {median * 1e3:.1f} ms median step "
                f"(getrusage, read beside the host memory samples)",
                f"the process faulted in {k.faults / k.steps:,.0f} pages a step: {mib:,.0f} MiB of fresh memory "
                f"mapped in and zeroed by the kernel each step, as when the step's large tensors are freed back to "
                f"the kernel and allocated anew",
                "malloc is glibc's, which hands freed blocks above its mmap threshold (at most 32 MiB) back to the "
                "kernel at once" + (f" (set in the environment: {', '.join(m.malloc_settings)})"
                                    if m.malloc_settings else "")]
    keep = keep_bytes(m.peak_process_bytes)
    env = dict.fromkeys(THRESHOLDS, str(keep))
    settings = " ".join(f"{name}={value}" for name, value in env.items())
    fix = (f"{settings} python {command_text(run)}  # glibc then keeps "
           f"freed blocks up to {keep // MIB} MiB (the run's peak was {m.peak_process_bytes / MIB:,.0f} MiB) for the "
           f"next step; or preload jemalloc or tcmalloc (LD_PRELOAD=.../libjemalloc.so.2), as PyTorch's CPU "
           f"performance tuning guide advises")
    return Finding(max(0.0, min(share, 1.0) - KERNEL_SHARE_BASELINE), tuple(evidence), fix=fix, env=env)
