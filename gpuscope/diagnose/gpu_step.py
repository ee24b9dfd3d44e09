"""One steady step on the GPU, and what a fix that makes some of its kernels faster saves.

The step's length is the steady median on the device's clock (``clock``); the kernels in it, and their kinds, come
from the profiled steps' kernel timeline, whose kernels run as in any other step while the profiler slows the host's
launches (so the profiled steps' own busy share understates a steady step's). A fix moves kernels between the
GPU's rates (float32 GEMMs from CUDA cores to TF32 or 16-bit Tensor Cores), at the ratio of this GPU's datasheet
peaks, or removes them (layout conversions); the step after it is no shorter than what the GPU still has to run,
nor than the host takes to queue it (``clock.host_pace``). Which kinds each fix speeds up, and by how much, is each
rule's; the sums are here.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.clock import HostPace, host_pace
from gpuscope.reduce.peaks import GpuPeak, find_gpu
from gpuscope.record import KernelTimeline, RunRecord


@dataclass(frozen=True, slots=True)
class KernelKinds:
    """A steady step's kernel time by kind, seconds (they add up to the step's kernel time)."""

    fp32_gemm: float
    """float32 matrix multiplies on CUDA cores (``sgemm``, ``..._ffma_...``)."""
    tc_gemm: float
    """Matrix multiplies on Tensor Cores."""
    tc_conv: float
    """Convolutions on Tensor Cores (in a float32 run: TF32, cuDNN's default)."""
    conv: float
    """Convolutions on CUDA cores."""
    layout: float
    """cuDNN's NCHW <-> NHWC conversions."""
    optimizer: float
    """Kernels the optimizer's step queued (the device breakdown's optimizer phase): they stay in float32."""
    communication: float
    """Collectives (NCCL)."""
    other: float
    """The rest: element-wise, normalisation, reductions, attention, copies made by kernels."""


@dataclass(frozen=True, slots=True)
class GpuStep:
    """A steady step on the GPU, seconds: its length, the kernels running in it, the gaps between queued kernels,
    other idle time (syncs, copies), and how fast the host queues it."""

    step_s: float
    kernel_s: float
    gap_s: float
    other_idle_s: float
    kinds: KernelKinds
    host: HostPace | None
    steady: bool
    """True where ``step_s`` is on the device's clock and the profiled steps' kernels fit in it; False where the
    profiled steps' own shares are all there is (the kernel time is their busy share of the step)."""
    window_busy: float
    """The profiled steps' own busy share."""
    window_step_s: float
    """The profiled steps' length on the device, a step."""
    gpu: GpuPeak | None

    @property
    def busy(self) -> float:
        """Share of the step with a kernel running, 0..1."""
        return min(1.0, self.kernel_s / self.step_s) if self.step_s > 0 else 0.0

    @property
    def launch_wait_s(self) -> float:
        """The GPU's idle time in the step that is neither a gap between queued kernels nor another kind of idle:
        the GPU waited for the host to queue work (launching, or waiting itself, for data say)."""
        return max(0.0, self.step_s - self.kernel_s - self.gap_s - self.other_idle_s)

    @property
    def host_floor_s(self) -> float:
        """No step is shorter than the host takes to queue it: its pace where known (it ran ahead, or it kept pace
        while the GPU waited on it); 0 where it kept pace with a busy GPU (it waited every step: its own pace is
        not known)."""
        host = self.host
        if host is None:
            return 0.0
        if host.how == "kept pace" and self.launch_wait_s < th.HOST_BOUNDS_WAIT * self.step_s:
            return 0.0
        return host.seconds

    def after_s(self, kernel_saved_s: float) -> float:
        """The step once a fix takes ``kernel_saved_s`` off its kernel time: the GPU runs the rest of its kernels,
        gaps and other idle, no faster than the host queues the step."""
        return max(self.kernel_s - kernel_saved_s + self.gap_s + self.other_idle_s, self.host_floor_s)

    def saving(self, kernel_saved_s: float) -> float:
        """The share of the measured step a fix saves that takes ``kernel_saved_s`` off the step's kernel time:
        the step as worked out before it less the step after it (``after_s``), over the step."""
        if self.step_s <= 0:
            return 0.0
        return max(0.0, (self.after_s(0.0) - self.after_s(kernel_saved_s)) / self.step_s)

    def peak_ratio(self, slow: str, fast: str) -> float | None:
        """How many times this GPU's ``fast`` peak is its ``slow`` one (``tfloat32`` over ``float32``, say); None
        where the datasheet table lacks either."""
        if self.gpu is None:
            return None
        low, high = self.gpu.tflops.get(slow), self.gpu.tflops.get(fast)
        return high / low if low and high else None


def gpu_step(record: RunRecord) -> GpuStep | None:
    """The steady GPU step of a CUDA run with a kernel timeline; None otherwise. The kernel time a step is the
    profiled steps' busy time over their count; where the step is on the device's clock and that fits in it (within
    ``KERNELS_FIT``), the busy share is of the steady step, else of the profiled steps themselves."""
    ops, steps = record.op_profile, record.steps
    kernels = ops.kernels if ops is not None else None
    if record.device != "cuda" or kernels is None or not steps.count or not steps.median_s or ops is None:
        return None
    window = ops.window
    recorded = window.last_step - window.first_step + 1 if window.first_step is not None and \
        window.last_step is not None else ops.steps
    window_step = kernels.window_s / recorded if recorded and kernels.window_s else 0.0
    step = steps.median_s
    kernel = kernels.busy_fraction * window_step
    steady = steps.clock == "device" and window_step > 0 and kernel <= step * th.KERNELS_FIT
    if steady:  # the profiled steps' gaps and other idle, in what the steady step leaves of its time
        kernel = min(kernel, step)
        gap = min(kernels.idle_kernel_wait_fraction * window_step, step - kernel)
        other = min(kernels.idle_other_fraction * window_step, step - kernel - gap)
    else:  # the profiled steps' shares, of the median step
        kernel = kernels.busy_fraction * step
        gap = kernels.idle_kernel_wait_fraction * step
        other = kernels.idle_other_fraction * step
    return GpuStep(step, kernel, gap, other, kernel_kinds(record, kernels, kernel), host_pace(record), steady,
                   kernels.busy_fraction, window_step, find_gpu(gpu_name(record) or ""))


def kernel_kinds(record: RunRecord, kernels: KernelTimeline, kernel_s: float) -> KernelKinds:
    """``kernel_s`` split by kind, from the timeline's shares (of compute-kernel time; communication's of all): the
    Tensor Core time not in GEMMs goes to convolutions first; the optimizer's kernels are its phase of the device
    breakdown, taken from the kernels of no other kind."""
    communication = kernels.communication_share * kernel_s
    compute = kernel_s - communication
    fp32_gemm = kernels.fp32_gemm_share * compute
    tc_gemm = max(0.0, kernels.gemm_share - kernels.fp32_gemm_share) * compute
    conv = kernels.conv_share * compute
    tc_conv = min(conv, max(0.0, kernels.tensor_core_share * compute - tc_gemm))
    layout = kernels.layout_transform_share * compute
    rest = max(0.0, compute - fp32_gemm - tc_gemm - conv - layout)
    optimizer = 0.0
    if record.steps.breakdown_basis == "device":
        optimizer = min(rest, record.breakdown.optimizer * record.steps.median_s)
    return KernelKinds(fp32_gemm, tc_gemm, tc_conv, conv - tc_conv, layout, optimizer, communication,
                       rest - optimizer)


def gpu_name(record: RunRecord) -> str | None:
    """The GPU the run used, by name: the FLOP count's device, else NVML's or the trace's first device."""
    if record.speed_of_light is not None and record.speed_of_light.device_name:
        return record.speed_of_light.device_name
    if record.gpus is not None and record.gpus.devices:
        return record.gpus.devices[0].name
    if record.source is not None and record.source.devices:
        return record.source.devices[0].name
    return None


@dataclass(frozen=True, slots=True)
class OwnCost:
    """gpuscope's own CUDA calls on the host, a step (counted in the run), and their time at a GPU machine's cost of
    each (``MARKER_COST_S`` and the others: ``benchmarks/cuda_calls.py`` on an H100)."""

    markers: float
    allocator_reads: float
    nvtx_ranges: float
    seconds: float


def own_cuda_cost(record: RunRecord) -> OwnCost | None:
    """What gpuscope's own CUDA calls cost a CUDA run's steps on the host; None on a CPU run or before any step. NVTX
    ranges are a step's and each phase's it ran (where the NVTX collector ran); the allocator readings are those
    kept (all of them up to 2000, about 15,000 steps)."""
    steps = record.steps
    if record.device != "cuda" or not steps.total or not steps.device_markers:
        return None
    memory = record.cuda_memory
    reads = len(memory.step) / steps.total if memory is not None else 0.0
    nvtx = record.collectors.get("nvtx")
    phases = record.host_breakdown or record.breakdown
    ranges = 1 + sum(share > 0 for name, share in phases.as_dict().items() if name != "other") \
        if nvtx is not None and nvtx.status == "ok" else 0
    markers = steps.device_markers / steps.total
    seconds = markers * th.MARKER_COST_S + reads * th.ALLOCATOR_READ_COST_S + ranges * th.NVTX_RANGE_COST_S
    return OwnCost(markers, reads, ranges, seconds)
