"""Rules about the host's memory allocator: steps that spend their time in the kernel, faulting in again the memory
the allocator handed back to it at the step before."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from gpuscope.diagnose.evidence import STEP, Metric
from gpuscope.diagnose.rules.base import AtRunTime, Finding, rule
from gpuscope.diagnose.words import command_text
from gpuscope.record import RunRecord

KERNEL_SHARE_MIN = 0.2
"""The share of the step the kernel's CPU time must take in the steady steps for ``tune-host-allocator`` to fire
(``kernel_share``): well above the sample workloads' 0-10%, well below the 67-71% of a loop whose every step faults
its memory in again (docs/diagnosis.md)."""
KERNEL_SHARE_BASELINE = 0.02
"""The kernel's share a step keeps with the fix (system calls, the memory a run does need afresh): taken off the
measured share for the gain. Measured with the fix: the training thread 0.1-1.8% of the step in the kernel."""
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
    """CPU time and page faults over the host memory samples taken while steady steps ran: the process's, and the
    training thread's kernel time where it was read."""

    steps: int
    """Steps that ended in those sample intervals."""
    seconds: float
    """The wall time the intervals span."""
    user_s: float
    sys_s: float
    faults: int
    thread_sys_s: float | None = None
    """The training thread's kernel time, where it was read."""
    thread_cpu_s: float = 0.0
    """The training thread's CPU time, user and kernel."""
    thread_runnable_s: float = 0.0
    """...and its time runnable but waiting for a core."""

    def stretch(self) -> float:
        """How much longer than its CPU time the training thread took to get it: 1 where it never waited for a
        core (another process holding it, or the step's other threads)."""
        if self.thread_cpu_s <= 0:
            return 1.0
        return (self.thread_cpu_s + self.thread_runnable_s) / self.thread_cpu_s

    def share(self) -> float:
        """The kernel's share of the step. The training thread's kernel time, as long as it took on the cores it
        had, over the time stepped, where it was read: the step stands still while the kernel serves its thread,
        and the other threads' faults overlap work. Else the process's kernel time, over the time stepped or over
        the process's CPU time where that is longer (the step's threads computing side by side, each paying its
        own faults)."""
        if self.thread_sys_s is not None:
            return min(1.0, self.thread_sys_s * self.stretch() / self.seconds)
        return self.sys_s / max(self.seconds, self.user_s + self.sys_s)

    def per_step(self, amount: float, median_s: float) -> float:
        """``amount`` (seconds, faults) over the time stepped, a median step's worth."""
        return amount / self.seconds * median_s


def kernel_time(run: RunRecord) -> KernelTime | None:
    """Summed over the intervals between host memory samples in which steady steps ran (not a warm-up step, nor
    one a profiler ran in, as far as the step sample tells): those in which steps ended, and those inside a step
    longer than the interval (none ended) up to twice the median step without one ending (longer: the loop
    paused, to evaluate or to save). None where those hold fewer than ``MIN_STEPS`` steps or no time."""
    m = run.host_memory
    if m is None or len(m.steps_seen) < 2 or not len(m.sys_s) == len(m.t_s) == len(m.steps_seen):
        return None
    threads = len(m.thread_sys_s) == len(m.thread_user_s) == len(m.t_s)
    sample = run.steps.sample
    unsteady = sorted(i for i, status in zip(sample.index, sample.status) if status != "steady")
    within: list[int] = []  # intervals inside the step in progress, none ended yet
    taken: list[int] = []
    steps = 0
    for a in range(len(m.steps_seen) - 1):
        first, last = m.steps_seen[a], m.steps_seen[a + 1]  # steps first..last - 1 ended in between, give or take one
        if first < run.steps.warmup or last < first:
            within = []
        elif last == first:
            within.append(a)
        elif not _any_within(unsteady, first - 1, last):
            if not within or m.t_s[a] - m.t_s[within[0]] <= 2 * run.steps.median_s:
                taken.extend(within)
            taken.append(a)
            steps += last - first
            within = []
        else:
            within = []
    seconds = sum(m.t_s[a + 1] - m.t_s[a] for a in taken)

    def summed(series: tuple[float, ...] | tuple[int, ...]) -> float:
        return sum(series[a + 1] - series[a] for a in taken)

    user_s, sys_s = summed(m.user_s), summed(m.sys_s)
    if steps < MIN_STEPS or seconds <= 0 or user_s + sys_s <= 0:
        return None
    if not threads:
        return KernelTime(steps, seconds, user_s, sys_s, int(summed(m.minor_faults)))
    waited = summed(m.thread_runnable_s) if len(m.thread_runnable_s) == len(m.t_s) else 0.0
    return KernelTime(steps, seconds, user_s, sys_s, int(summed(m.minor_faults)), summed(m.thread_sys_s),
                      summed(m.thread_user_s) + summed(m.thread_sys_s), waited)


def _any_within(indices: list[int], low: int, high: int) -> bool:
    """Whether sorted ``indices`` hold one from ``low`` to ``high``."""
    at = bisect.bisect_left(indices, low)
    return at < len(indices) and indices[at] <= high


def kernel_share(run: RunRecord) -> float | None:
    """The kernel's share of the steady step (``KernelTime.share``); None where it was not measured."""
    k = kernel_time(run)
    return k.share() if k is not None else None


def keep_bytes(peak_bytes: int) -> int:
    """What glibc should keep for reuse: the process's peak memory, rounded up to a power of two (256 MiB at
    least): no block the run frees can be larger."""
    return 1 << max(28, (max(peak_bytes, 1) - 1).bit_length())


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
    Gain: the kernel's share of the step, less the 2% a step keeps."""
    k = kernel_time(run)
    m = run.host_memory
    assert m is not None
    if k is None or not m.page_bytes:
        return None
    median = run.steps.median_s
    faults = k.per_step(k.faults, median)
    mib = faults * m.page_bytes / MIB
    share = k.share()
    if share < KERNEL_SHARE_MIN or mib < FAULTED_MIB_MIN:
        return None
    process = (f"{k.per_step(k.sys_s, median) * 1e3:.1f} ms a step on all the process's threads, "
               f"{k.sys_s / (k.user_s + k.sys_s):.0%} of its CPU time")
    if k.thread_sys_s is None:
        whose = process
    elif k.stretch() >= 1.05:
        whose = (f"{k.per_step(k.thread_sys_s, median) * 1e3:.1f} ms a step on the training thread, "
                 f"{k.per_step(k.thread_sys_s * k.stretch(), median) * 1e3:.1f} ms of the step as it waited for a "
                 f"core {k.thread_runnable_s / (k.thread_cpu_s + k.thread_runnable_s):.0%} of the time it was "
                 f"ready to run ({process})")
    else:
        whose = f"{k.per_step(k.thread_sys_s, median) * 1e3:.1f} ms a step on the training thread ({process})"
    evidence = [f"the kernel's CPU time took {share:.0%} of the step over {k.steps} steps after the warm-up: "
                f"{whose}, against a {median * 1e3:.1f} ms median step (getrusage"
                + (", and /proc for the thread" if k.thread_sys_s is not None else "")
                + ", read beside the host memory samples)",
                f"the process faulted in {faults:,.0f} pages a step: {mib:,.0f} MiB of fresh memory "
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
