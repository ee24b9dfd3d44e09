"""Rules about number formats: mixed precision on Tensor Cores, and on a CPU whose bfloat16 matmuls and convolutions
measured faster than its float32 ones; float32 on a CPU whose bfloat16 / float16 matmuls or convolutions are slower
than its float32 ones, or whose step ran in float64; and attention in float32 where its bfloat16 / float16 forward
and backward are."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import STEP, Metric, kernel_share, median_compute_s
from gpuscope.reduce.optable import op_kind
from gpuscope.diagnose.gpu_step import GpuStep, gpu_name, gpu_step
from gpuscope.diagnose.words import command_text, datasheet_rates, gpu_busy, step_after
from gpuscope.diagnose.rules.base import AtRunTime, Finding, Refused, rule
from gpuscope.diagnose.rules.host_allocator import THRESHOLDS, keep_bytes
from gpuscope.collect.captures import LOW_PRECISION
from gpuscope.record import AttentionTiming, AutocastTiming, CallSite, KernelTimeline, RunRecord

MIXED_PRECISION_OFF = {
    "pytorch_lightning": 'Trainer(..., precision="32-true")',
    "lightning": 'Trainer(..., precision="32-true")',
    "accelerate": 'Accelerator(mixed_precision="no")',
    "transformers": "TrainingArguments(..., bf16=False, fp16=False)",
}
"""Where a library entered the CPU autocast, the setting of that library that trains in float32."""
MIXED_PRECISION_ON = {
    "pytorch_lightning": 'Trainer(..., precision="bf16-mixed")',
    "lightning": 'Trainer(..., precision="bf16-mixed")',
    "accelerate": 'Accelerator(mixed_precision="bf16")',
    "transformers": "TrainingArguments(..., bf16=True)",
}
"""Where a library steps the optimizer (``steps.optimizer_by``), its setting that trains in bfloat16 mixed
precision (a CPU autocast around the forward and the loss)."""
SLOW_CONVS = ("_slow_conv2d_forward", "_slow_conv2d_backward", "slow_conv3d_forward", "slow_conv_dilated2d",
              "slow_conv_dilated3d", "slow_conv_transpose2d", "slow_conv_transpose3d")
"""torch's reference convolution kernels (``aten::_slow_conv2d_forward``...): a CPU runs its convolutions on them
where oneDNN has no kernel for the dtype (bfloat16 / float16 without instructions for them)."""


def compute_busy(kernels: KernelTimeline) -> float:
    """Share of the window with a compute kernel running: communication kernels (NCCL's) left out, since mixed
    precision does not speed them up. Records made before it was measured fall back to all kernels."""
    return kernels.compute_busy_fraction if kernels.compute_busy_fraction is not None else kernels.busy_fraction


MIXED_PRECISION_FIX = ("with torch.autocast('cuda', dtype=torch.bfloat16): loss = model(x)  # fp16: add "
                       "torch.amp.GradScaler")


@rule(id="mixed-precision",
      title="Train in mixed precision (autocast + GradScaler)",
      fix=MIXED_PRECISION_FIX,
      needs=("cuda", "kernels"),
      resolved_by=(Metric("kernel time on Tensor Cores", "share", kernel_share("tensor_core_share")), STEP),
      trial=AtRunTime(cuda_only="its low-precision advice is cpu-fp32-over-low-precision's"))
def mixed_precision(run: RunRecord) -> Finding | None:
    """Signal: little of the compute kernels' time runs on Tensor Cores (the step's matmuls and convolutions are in
    float32).
    Why it matters: Tensor Cores do 16-bit matrix math many times faster than float32 on CUDA cores (14.8x on paper
    on an H100 or H200, 2x TF32's), and 16-bit activations are half the bytes to stream; measured training time
    falls to 45-60% of float32 (the seeds: T4, five CNNs), at the same accuracy with float32 master weights and loss
    scaling.
    Fix: torch.autocast (bf16 where supported), GradScaler for fp16.
    Gain: the steady step's kernels by kind (``gpu_step``): float32 GEMMs and convolutions at the ratio of the GPU's
    datasheet 16-bit and float32 (or TF32, where they ran on Tensor Cores already) rates, the kernels streaming
    activations at ``SIXTEEN_BIT_BYTES`` of their time; the optimizer's kernels, communication and the gaps between
    kernels as they are; no step shorter than the host takes to queue it. None where the datasheet table lacks the
    GPU (advised then only where the GPU is busy, ``GPU_BUSY_COMPUTE``)."""
    kernels = run.op_profile.kernels  # type: ignore[union-attr]
    assert kernels is not None  # the rule needs "kernels"
    if kernels.tensor_core_share >= th.TENSOR_CORE_ENOUGH:
        return None
    step = gpu_step(run)
    evidence = [
        (gpu_busy(step) if step is not None else f"the GPU runs kernels {compute_busy(kernels):.0%} of the step")
        + (f" ({kernels.communication_share:.0%} of kernel time is communication, left out)"
           if kernels.communication_share else ""),
        f"only {kernels.tensor_core_share:.0%} of compute-kernel time is on Tensor Cores",
    ]
    low = _sixteen_bit(step) if step is not None else None
    if step is None or low is None:
        if (step.busy if step is not None else compute_busy(kernels)) < th.GPU_BUSY_COMPUTE:
            return None  # no estimate, and a GPU this idle gains little from faster kernels
        evidence.append(f"no datasheet 16-bit Tensor Core rate for {gpu_name(run) or 'this GPU'} in gpuscope's "
                        "table: the gain is not estimated")
        return _with_logits(Finding(None, tuple(evidence)), run, MIXED_PRECISION_FIX, cuda=True)
    kinds, tf32 = step.kinds, step.peak_ratio("tfloat32", low)
    on_cores = kinds.fp32_gemm + kinds.conv
    tensor = kinds.tc_conv + (kinds.tc_gemm if _float32_run(run) else 0.0)
    streamed = kinds.layout + kinds.other
    saved = on_cores * (1 - 1 / step.peak_ratio("float32", low)) + tensor * (1 - 1 / (tf32 or 1.0)) + \
        streamed * (1 - th.SIXTEEN_BIT_BYTES)  # type: ignore[operator]
    moved = [f"float32 GEMMs and convolutions on CUDA cores {on_cores * 1e3:.1f} ms a step "
             f"({datasheet_rates(step, 'float32', low)})"] if on_cores else []
    if tensor and tf32:
        moved.append(f"TF32 Tensor Core work {tensor * 1e3:.1f} ms ({datasheet_rates(step, 'tfloat32', low)})")
    evidence.append(f"in {low}: " + "; ".join(moved + [
        f"the kernels streaming activations (element-wise, normalisation, attention, layout conversions) "
        f"{streamed * 1e3:.1f} ms at half their time (half the bytes); the optimizer's {kinds.optimizer * 1e3:.1f} ms "
        "stays in float32"]) + f"; {step_after(step, saved)}")
    fix = _at_forward(run, "cuda", "; fp16 (no bfloat16 on the GPU): add torch.amp.GradScaler")
    return _with_logits(Finding(step.saving(saved), tuple(evidence), fix=fix), run, MIXED_PRECISION_FIX, cuda=True)


def _at_forward(run: RunRecord, device: str, scaler: str) -> str | None:
    """The autocast fix at the line where the script's own code calls its model's training forward
    (``steps.forward_sites``); None where that line is not known or a library steps the optimizer (its setting is
    the fix)."""
    sites = [s for s in run.steps.forward_sites if s.file]
    if not sites or run.steps.optimizer_by:
        return None
    return (f"{_site(sites[0])}: run it, and the loss computed from its output, under torch.autocast('{device}', "
            f"dtype=torch.bfloat16); backward and the optimizer's step outside it{scaler}")


def _with_logits(finding: Finding, run: RunRecord, fix: str, cuda: bool) -> Finding:
    """``finding`` with, where the step computed a binary cross-entropy on probabilities (``nn.BCELoss``), what the
    autocast of its fix would do to it, and the loss on the logits in its fix: CUDA's autocast refuses that loss
    ("unsafe to autocast"), and a CPU's bfloat16 sigmoid before it rounds probabilities near 1 to 1 (a sigmoid
    over a Linear's outputs: BCELoss 1.44 against 1.07 in float32; docs/diagnosis.md)."""
    loss = run.speed_of_light.probability_loss if run.speed_of_light is not None else None
    if loss is None:
        return finding
    site = loss.called_at
    where = _site(site) if site is not None else "a line of library code"
    why = ("torch.autocast('cuda') refuses it (RuntimeError: unsafe to autocast)" if cuda else
           "under bfloat16 autocast the sigmoid before it rounds probabilities near 1 to 1 (the closest below is "
           "0.996), and the loss over outputs that near comes out wrong")
    evidence = f"the step computes BCELoss on probabilities at {where}: {why}"
    line = (f"{where + ': ' if site is not None and site.file else ''}compute the loss on the logits before "
            "autocasting: nn.BCEWithLogitsLoss() (F.binary_cross_entropy_with_logits) in place of the sigmoid and "
            "nn.BCELoss")
    return dataclasses.replace(finding, evidence=(*finding.evidence, evidence), fix=f"{finding.fix or fix}\n{line}")


def _sixteen_bit(step: GpuStep) -> str | None:
    """The 16-bit dtype autocast would use on this GPU (bfloat16 where it has it, else float16), where the
    datasheet table gives its rate and float32's; None otherwise."""
    for dtype in ("bfloat16", "float16"):
        if step.peak_ratio("float32", dtype) is not None:
            return dtype
    return None


def _float32_run(run: RunRecord) -> bool:
    """Whether the step's matmuls ran in float32 (their Tensor Core GEMMs, if any, are TF32 ones)."""
    sol = run.speed_of_light
    return sol is None or sol.dtype in (None, "float32", "tfloat32")


def op_share(run: RunRecord, which: Callable[[str], bool]) -> float | None:
    """Share of the profiled steps' op time (self time of every op) in the listed ops ``which`` names; None without
    an op profile."""
    ops = run.op_profile
    if ops is None or not ops.ops or not ops.mean_op_s:
        return None
    return min(1.0, sum(o.self_host_s for o in ops.top_host if which(o.name)) / (ops.mean_op_s * ops.ops))


def matmul_share(run: RunRecord) -> float | None:
    """Share of the profiled steps' op time in matmul ops (``mm``, ``addmm``, ``bmm``...)."""
    return op_share(run, lambda name: op_kind(name) == "matmul")


def slow_conv_share(run: RunRecord) -> float | None:
    """Share of the profiled steps' op time in torch's reference convolution kernels (``SLOW_CONVS``)."""
    return op_share(run, lambda name: name.removeprefix("aten::") in SLOW_CONVS)


@rule(id="cpu-fp32-over-low-precision",
      title="Train in float32 on this CPU: its bfloat16 / float16 matmuls or convolutions are slower",
      fix="train in float32 on this CPU: drop torch.autocast('cpu', dtype=torch.bfloat16), or keep the model and its "
          "inputs in float32 (no .to(torch.bfloat16) / .half())",
      needs=("cpu", "op_profile", "matmul_rates"),
      resolved_by=(Metric("op time in matmuls", "share", matmul_share),
                   Metric("op time on reference convolution kernels", "share", slow_conv_share), STEP),
      trial=AtRunTime())
def cpu_fp32_over_low_precision(run: RunRecord) -> Finding | None:
    """Signal: a CPU run whose matmuls ran in bfloat16 or float16 (under autocast, or a model cast to it), on a
    machine whose float32 matmul rate, measured after the run, is ``CPU_LOW_PRECISION_SLOWER`` times its rate in
    that dtype or more; or whose step ran convolutions on torch's reference kernels (``SLOW_CONVS``) and FLOPs in
    that dtype, where a convolution measured after the run is as much slower in it than in float32 (a student
    under bf16 autocast beside a float32 teacher: most of the step's FLOPs are float32, most of its time the
    student's convolutions).
    Why it matters: a CPU without matrix instructions for the dtype (AVX512-BF16 or AMX for bfloat16) runs those
    matmuls, and torch its reference convolutions, on a slow path, many times slower than float32's.
    Fix: drop the autocast (naming its line where gpuscope saw it) or the cast to half precision: train in float32.
    Gain: the matmul ops' time in the step (their share of the profiled op time) less the same matmuls in float32:
    their counted FLOPs at the measured float32 rate, or their time scaled by the two measured rates, the longer;
    and the reference kernels' time less the same convolutions in float32: the step's FLOPs in their dtype at the
    measured float32 convolution rate, or their time scaled by the two measured rates, the longer."""
    sol = run.speed_of_light
    if sol is None:
        return None
    found = _matmuls_in_float32(run, th.CPU_LOW_PRECISION_SLOWER) if sol.dtype in LOW_PRECISION else None
    convs = _slow_convs(run, th.CPU_LOW_PRECISION_SLOWER)
    if found is None and convs is None:
        return None
    dtype = sol.dtype if found is not None else convs.dtype  # type: ignore[union-attr]
    sites = run.practices.cpu_autocast_sites if run.practices is not None else ()
    by = run.practices.cpu_autocast_by if run.practices is not None else ""
    cast = run.practices.half_precision_sites if run.practices is not None else ()
    how = ""
    if sites:
        how = f", under torch.autocast at {_sites(sites)}" + (f", entered by {by}" if by else "")
    elif cast:
        how = f", the model's or torch's dtype made so at {_sites(cast)}"
    evidence, what, slower, gain = _together(found, convs, dtype, how)
    fix = None
    if by and sites and sites[0].file:  # a library's mixed-precision setting, not a line of the user's, enters it
        setting = MIXED_PRECISION_OFF.get(by, f"{by}'s mixed precision off")
        fix = (f"{setting}  # {by}, called from {sites[0].file}:{sites[0].line}, enters torch.autocast in "
               f"{dtype}: train in float32 on this CPU, whose {dtype} {what} are {slower} slower than its float32 "
               "ones")
    elif sites and sites[0].file:
        fix = (f"{_site(sites[0])}: drop the autocast (or pass enabled=False) and train in float32 on this CPU, "
               f"whose {dtype} {what} are {slower} slower than its float32 ones")
    elif cast and cast[0].file:
        fix = (f"{_site(cast[0])}: keep the model (and its inputs) in float32 on this CPU, whose {dtype} {what} "
               f"are {slower} slower than its float32 ones")
    elif run.practices is not None:
        fix = (f"keep the model and its inputs in float32 (no .to(torch.{dtype}) / .half()) on this CPU, whose "
               f"{dtype} {what} are {slower} slower than its float32 ones")
    return Finding(gain, evidence, fix=fix)


def _together(found: Float32Matmuls | None, convs: SlowConvs | None, dtype: str, how: str,
              rates_once: bool = False) -> tuple[tuple[str, ...], str, str, float]:
    """The matmuls' and the reference convolutions' findings as one (either may be None, not both): the evidence
    (``how`` the dtype came about, said once; the convolutions' rates left out where ``rates_once`` and the matmuls
    gave them), what runs slower in ``dtype`` ("matmuls" first), by how much, and the two gains summed."""
    evidence: tuple[str, ...] = ()
    if found is not None:
        evidence = (f"the step's matmuls ran in {dtype}{how}", *found.evidence(dtype))
    if convs is not None:
        evidence += convs.evidence("" if found is not None else how, rates=not (rates_once and found is not None))
    shown = found if found is not None else convs
    assert shown is not None
    gain = (found.gain() if found is not None else 0.0) + (convs.gain if convs is not None else 0.0)
    return evidence, "matmuls" if found is not None else "convolutions", shown.slower(), gain


@dataclass(frozen=True, slots=True)
class SlowConvs:
    """The step's convolutions on torch's reference kernels, and what they would take at the float32 rate."""

    dtype: str
    """The low-precision dtype the step ran FLOPs in, whose convolution rate was measured."""
    share: float
    """Their share of the profiled op time."""
    conv_s: float
    """Their time in the median step."""
    rate: float
    """This machine's measured convolution rate in ``dtype``..."""
    fp32: float
    """...and in float32."""
    median_s: float
    names: tuple[str, ...]
    fp32_s: float
    """The same convolutions in float32."""
    flops: float
    """The step's FLOPs in ``dtype``."""
    measured: str
    """What the two rates are the rates of (a 3x3 convolution; float64's: a matmul, as the kernel runs them)."""

    @property
    def gain(self) -> float:
        return (self.conv_s - self.fp32_s) / self.median_s

    def evidence(self, how: str, rates: bool = True) -> tuple[str, ...]:
        """Where their time went, and the measured rates (``rates``: unless the evidence gives them already)."""
        return (
            f"the step's convolutions ran on torch's reference kernels ({', '.join(self.names)}), as it runs "
            f"{self.dtype} ones on this CPU{how}: {self.share:.0%} of the step's op time, about "
            f"{self.conv_s * 1e3:.1f} ms of the {self.median_s * 1e3:.1f} ms step; in float32 they would take about "
            f"{self.fp32_s * 1e3:.1f} ms ({self.flops / 1e9:.2f} GFLOP in {self.dtype} at the float32 rate)",
            f"this machine's rate for {self.measured}, measured after the run: float32 {_rate(self.fp32)}, "
            f"{self.dtype} {_rate(self.rate)} ({self.slower()} slower)",
        )[:2 if rates else 1]

    def slower(self) -> str:
        ratio = self.fp32 / self.rate
        return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def _slow_convs(run: RunRecord, slower: float, float64: bool = False) -> SlowConvs | None:
    """The step's reference-kernel convolutions, where the step ran FLOPs in bfloat16 / float16 (``float64``: in
    float64) and this machine's measured float32 rate is at least ``slower`` times that dtype's; None otherwise.
    The rates: a 3x3 convolution's, timed by the cpu-peak probe; for float64, its matmuls', as the reference kernel
    runs a float64 convolution as an unfolding and a float64 matmul (a small 3x3 convolution's float64 time is too
    close to float32's to tell them apart)."""
    sol, median, share = run.speed_of_light, run.steps.median_s, slow_conv_share(run)
    if sol is None or not share or not median or not run.steps.count:
        return None
    if float64:
        dtype, measured = "float64", "a square matmul"
        rate, fp32 = sol.peak_flops_per_s if sol.dtype == "float64" else None, sol.float32_flops_per_s
    else:
        dtype, measured = next((d for d in LOW_PRECISION if d in sol.conv_flops_per_s), None), "a 3x3 convolution"
        rate, fp32 = sol.conv_flops_per_s.get(dtype or ""), sol.conv_flops_per_s.get("float32")
    if not rate or not fp32 or fp32 < rate * slower:
        return None
    ops = run.op_profile
    assert ops is not None  # slow_conv_share read it
    slow = [o for o in ops.top_host if o.name.removeprefix("aten::") in SLOW_CONVS]
    conv_s, flops = share * median_compute_s(run), sol.flops_by_dtype.get(dtype, 0)  # type: ignore[arg-type]
    fp32_s = max(flops / fp32, conv_s * rate / fp32)
    if fp32_s >= conv_s:
        return None
    return SlowConvs(dtype, share, conv_s, rate, fp32, median, tuple(o.name for o in slow),  # type: ignore[arg-type]
                     fp32_s, flops, measured)


@dataclass(frozen=True, slots=True)
class Float32Matmuls:
    """The step's matmuls in their dtype, and what they would take in float32 at this machine's measured rates."""

    share: float
    """Their share of the profiled op time."""
    matmul_s: float
    """Their time in the median step."""
    fp32_s: float
    """The same matmuls at the float32 rate."""
    flops: float
    rate: float
    """This machine's measured matmul rate in the step's dtype..."""
    fp32: float
    """...and in float32."""
    median_s: float

    def gain(self) -> float:
        return (self.matmul_s - self.fp32_s) / self.median_s

    def evidence(self, dtype: str) -> tuple[str, str]:
        """The measured rates, and the matmuls' time in the step against the same in float32."""
        return (
            f"this machine's matmul rates, measured after the run: float32 {_rate(self.fp32)}, {dtype} "
            f"{_rate(self.rate)} ({self.slower()} slower)",
            f"matmul ops take {self.share:.0%} of the step's op time, about {self.matmul_s * 1e3:.1f} ms of the "
            f"{self.median_s * 1e3:.1f} ms step; in float32 they would take about {self.fp32_s * 1e3:.1f} ms "
            f"({self.flops / 1e9:.2f} GFLOP at the float32 rate)",
        )

    def slower(self) -> str:
        ratio = self.fp32 / self.rate
        return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def _rate(flops_per_s: float) -> str:
    return f"{flops_per_s / 1e9:.1f} GFLOP/s" if flops_per_s >= 10e9 else f"{flops_per_s / 1e9:.2f} GFLOP/s"


def _matmuls_in_float32(run: RunRecord, slower: float) -> Float32Matmuls | None:
    """The step's matmuls in its dtype and in float32, on a machine whose measured float32 matmul rate is at least
    ``slower`` times the dtype's; None where float32 would not be faster. In float32: the counted FLOPs at the
    measured float32 rate, or their time scaled by the two measured rates, the longer."""
    sol, median = run.speed_of_light, run.steps.median_s
    if sol is None or not sol.peak_flops_per_s or not sol.float32_flops_per_s:
        return None
    rate, fp32 = sol.peak_flops_per_s, sol.float32_flops_per_s
    share = matmul_share(run)
    if fp32 < rate * slower or not share or not median or not run.steps.count:
        return None
    matmul_s = share * median_compute_s(run)
    flops = sum(n for op, n in sol.flops_by_op.items() if op_kind(op) == "matmul")
    fp32_s = max(flops / fp32, matmul_s * rate / fp32)
    return Float32Matmuls(share, matmul_s, fp32_s, flops, rate, fp32, median) if fp32_s < matmul_s else None


def conv_share(run: RunRecord) -> float | None:
    """Share of the profiled steps' op time in convolution ops (oneDNN's, torch's reference ones, their backward)."""
    return op_share(run, lambda name: op_kind(name) == "conv")


def bfloat16_share(run: RunRecord) -> float | None:
    """Share of the counted step's FLOPs that ran in bfloat16; None where none were counted."""
    sol = run.speed_of_light
    total = sum(sol.flops_by_dtype.values()) if sol is not None else 0
    return sol.flops_by_dtype.get("bfloat16", 0) / total if sol is not None and total else None


@dataclass(frozen=True, slots=True)
class Autocast:
    """One kind of the step's ops (convolutions, matmuls) under bfloat16 autocast, from its timed shapes."""

    kind: str
    share: float
    """The kind's share of the profiled op time."""
    seconds: float
    """Its time in the median step."""
    ratio: float
    """Its timed shapes' time under autocast over their float32 time, weighted by their FLOPs."""
    fresh_ratio: float | None
    """...the same with the pages they allocate faulted in afresh at each run (None where not measured)."""
    shapes: tuple[AutocastTiming, ...]

    @property
    def saved_s(self) -> float:
        return self.seconds * (1 - self.ratio)

    @property
    def fresh_saved_s(self) -> float:
        return self.seconds * (1 - self.fresh_ratio) if self.fresh_ratio is not None else self.saved_s

    def evidence(self, median_s: float) -> str:
        name = {"conv": "convolution ops", "matmul": "matmul ops"}[self.kind]
        timed = "; ".join(f"{t.shape} ({t.flops_share:.0%} of their FLOPs): float32 {t.float32_s * 1e3:.2f} ms, "
                          f"bfloat16 autocast {t.bfloat16_s * 1e3:.2f} ms" for t in self.shapes)
        return (f"{name} take {self.share:.0%} of the step's op time, about {self.seconds * 1e3:.1f} ms of the "
                f"{median_s * 1e3:.1f} ms step; their heaviest shapes, forward and backward as the step ran them, "
                f"timed after the run: {timed}: "
                f"{1 / self.ratio:.1f}x faster in bfloat16, about {self.seconds * self.ratio * 1e3:.1f} ms")


def _under_autocast(run: RunRecord) -> list[Autocast]:
    """Each kind of the step's ops whose timed shapes ran faster under bfloat16 autocast than in float32."""
    sol, compute_s = run.speed_of_light, median_compute_s(run)
    found = []
    for kind, share in (("conv", conv_share(run)), ("matmul", matmul_share(run))):
        timed = tuple(t for t in (sol.autocast if sol is not None else ()) if t.kind == kind and t.float32_s > 0)
        weight = sum(t.flops_share for t in timed)
        if not share or share < th.AUTOCAST_KIND_NOTABLE or not timed or weight <= 0:
            continue
        ratio = sum(t.flops_share * t.bfloat16_s / t.float32_s for t in timed) / weight
        fresh = sum(t.flops_share * t.bfloat16_fresh_s / t.float32_fresh_s for t in timed) / weight \
            if all(t.float32_fresh_s > 0 and t.bfloat16_fresh_s > 0 for t in timed) else None
        if ratio < 1:
            found.append(Autocast(kind, share, share * compute_s, ratio, fresh, timed))
    return found


@dataclass(frozen=True, slots=True)
class AttentionUnderAutocast:
    """The float32 step's attention, which autocast would run in bfloat16: its time in the median step and the ratio
    of one forward and backward at its shapes in bfloat16 and in float32, timed after the run."""

    seconds: float
    ratio: float
    timing: AttentionTiming

    def evidence(self, median_s: float) -> str:
        shape = " x ".join(map(str, self.timing.query))
        seconds = self.timing.seconds
        return (f"the step's attention (query {shape}) takes about {self.seconds * 1e3:.1f} ms of the "
                f"{median_s * 1e3:.1f} ms step; one forward and backward of it, timed after the run: float32 "
                f"{seconds['float32'] * 1e3:.1f} ms, bfloat16 {seconds['bfloat16'] * 1e3:.1f} ms "
                + (f"({self.ratio:.1f}x slower)" if self.ratio > 1 else f"({1 / self.ratio:.1f}x faster)"))


def _attention_under_autocast(run: RunRecord) -> AttentionUnderAutocast | None:
    """The float32 step's attention timed in bfloat16 and float32 after the run; None where it was not."""
    sol = run.speed_of_light
    timing = sol.attention if sol is not None else None
    share = attention_share(run)
    if timing is None or timing.dtype != "float32" or not share or not timing.seconds.get("float32") \
            or not timing.seconds.get("bfloat16"):
        return None
    return AttentionUnderAutocast(share * median_compute_s(run),
                                  timing.seconds["bfloat16"] / timing.seconds["float32"], timing)


def _fresh_pages(found: list[Autocast], gain: float, run: RunRecord) -> tuple[str, int]:
    """Where the gain shrinks to under half with the shapes' pages faulted in afresh at each run (glibc handing
    autocast's bfloat16 copies of the weights back to the system each step), what that costs, and what glibc's
    thresholds must keep (bytes, ``keep_bytes``); else "" and 0."""
    median = run.steps.median_s
    fresh = sum(kind.fresh_saved_s for kind in found) / median
    if all(kind.fresh_ratio is None for kind in found) or fresh >= gain / 2:
        return "", 0
    keep = keep_bytes(run.host_memory.peak_process_bytes if run.host_memory is not None else 0)
    return ("with the pages they allocate faulted in afresh at each run, as where glibc hands freed blocks back to "
            "the kernel at once (autocast's bfloat16 copies of the weights are made every step), the same shapes "
            "measured " + "; ".join(f"{kind.kind} {1 / kind.fresh_ratio:.2f}x" if kind.fresh_ratio else kind.kind
                                       for kind in found) + f" float32's speed: {max(fresh, 0.0):.0%} of the step "
            f"saved, not {gain:.0%}: the gain needs glibc to keep what it frees ({keep >> 20} MiB, "
            f"{THRESHOLDS[0]} and {THRESHOLDS[1]})"), keep


FLOAT32_ATTENTION = ("with torch.autocast('cpu', enabled=False): out = F.scaled_dot_product_attention(q.float(), "
                     "k.float(), v.float()).to(q.dtype)")
"""Attention in float32 inside a CPU autocast: ``cpu-float32-attention``'s fix, and ``cpu-mixed-precision``'s where
the step's attention measured slower in bfloat16."""
CPU_MIXED_PRECISION_FIX = (
    "with torch.autocast('cpu', dtype=torch.bfloat16): output = model(x); loss = loss_fn(output, y)  # the forward "
    "and the loss only; backward and the optimizer's step outside it; bfloat16 needs no GradScaler (Lightning: "
    "Trainer(precision=\"bf16-mixed\"); transformers: TrainingArguments(bf16=True); accelerate: "
    "Accelerator(mixed_precision=\"bf16\"))")


@rule(id="cpu-mixed-precision",
      title="Train in bfloat16 mixed precision on this CPU: its bfloat16 matmuls and convolutions measured faster",
      fix=CPU_MIXED_PRECISION_FIX,
      needs=("cpu", "op_profile", "autocast_timing"),
      resolved_by=(Metric("counted FLOPs in bfloat16", "share", bfloat16_share), STEP),
      trial=AtRunTime())
def cpu_mixed_precision(run: RunRecord) -> Finding | None:
    """Signal: a CPU run in float32 whose convolutions or matmuls take much of the step, on a machine where the
    step's heaviest shapes of them, timed after the run, ran faster under ``torch.autocast('cpu',
    dtype=torch.bfloat16)`` than in float32 (a CPU with AVX512-BF16 or AMX).
    Why it matters: such a CPU does bfloat16 matrix math at twice float32's rate or more (on this project's VM
    431 against 180 GFLOP/s for a 1024x1024 matmul), and autocast runs only the matmuls and convolutions in it,
    keeping float32 weights and the optimizer's update: bfloat16's range needs no loss scaling.
    Fix: autocast around the forward and the loss (where a library steps the optimizer, its setting); and where the
    shapes timed with their pages faulted in afresh keep under half the gain, glibc's thresholds raised, so that
    autocast's bfloat16 copies of the weights, made every step, are not faulted in again each time.
    Gain: each kind's share of the step's op time, at the ratio of its timed shapes' autocast and float32 times
    (weighted by their FLOPs, the casts included, the pages kept); the rest of the step as it is, its attention
    too: where one forward and backward of it measured 1.5x slower in bfloat16 or more (torch's CPU flash attention
    can be), the fix keeps it in float32 inside the autocast. pytorch/examples'
    fast_neural_style (convolutions 82% of the op time, its shapes 1.8x faster under autocast): promised 38%,
    measured 37% (294 -> 184 ms a step); more in docs/diagnosis.md."""
    sol = run.speed_of_light
    practices = run.practices
    if sol is None or sol.dtype != "float32" or not run.steps.median_s or not run.steps.count:
        return None
    if practices is not None and (practices.cpu_autocast_sites or practices.half_precision_sites):
        return None  # in bfloat16 already, in part: the low-precision rules weigh it
    found, attention = _under_autocast(run), _attention_under_autocast(run)
    median = run.steps.median_s
    gain = sum(kind.saved_s for kind in found) / median
    if gain < th.CPU_MIXED_PRECISION_NOTABLE:
        return None
    # the attention as it is: where it measured clearly slower in bfloat16, the fix keeps it in float32 inside the
    # autocast (cpu-float32-attention's fix); its timing alone is too noisy here to move the gain by (a GPT-2's
    # measured 1.9x slower after one run, 1.0-1.3x in three more, and the step under autocast ran 35-45% faster)
    keep_attention = attention is not None and attention.ratio >= th.CPU_LOW_PRECISION_SLOWER
    by = run.steps.optimizer_by
    fix = [f"{MIXED_PRECISION_ON[by]}  # {by} steps the optimizer: its bfloat16 mixed precision runs the forward and "
           "the loss under torch.autocast('cpu', dtype=torch.bfloat16)" if by in MIXED_PRECISION_ON
           else _at_forward(run, "cpu", "; bfloat16 needs no GradScaler") or CPU_MIXED_PRECISION_FIX]
    if keep_attention:
        site = attention.timing.called_at  # type: ignore[union-attr]
        where = f"{_site(site)}: " if site is not None and site.file else ""
        fix.append(f"{where}keep the attention in float32 inside it, where it measured slower in bfloat16: "
                   f"{FLOAT32_ATTENTION}")
    pages, keep = _fresh_pages(found, gain, run)
    env = dict.fromkeys(THRESHOLDS, str(keep)) if keep else {}
    if env:
        fix.append(f"{' '.join(f'{k}={v}' for k, v in env.items())} python {command_text(run)}  # glibc keeps freed "
                   f"blocks up to {keep >> 20} MiB for the next step: autocast's bfloat16 copies of the weights, made "
                   "every step, not faulted in afresh")
    evidence = tuple(kind.evidence(median) for kind in found) + (
        (attention.evidence(median),) if attention is not None else ()) + ((pages,) if pages else ())
    return _with_logits(Finding(gain, evidence, fix="\n".join(fix), env=env), run, CPU_MIXED_PRECISION_FIX,
                        cuda=False)


@rule(id="float32-over-float64",
      title="Train in float32: the step's matmuls or convolutions ran in float64",
      fix="keep the model and its inputs in float32, unless it needs float64's precision: no model.double() or "
          "torch.set_default_dtype(torch.float64); NumPy data as torch.from_numpy(a).float() (NumPy's default "
          "dtype is float64)",
      needs=("cpu", "op_profile", "matmul_rates"),
      resolved_by=(Metric("op time in matmuls", "share", matmul_share),
                   Metric("op time on reference convolution kernels", "share", slow_conv_share), STEP),
      trial=Refused("it changes the dtypes your code chooses"))
def float32_over_float64(run: RunRecord) -> Finding | None:
    """Signal: a CPU run whose matmuls ran in float64 (the model made ``.double()``, float64 the default dtype, or
    NumPy's float64 arrays fed in), on a machine whose float32 matmul rate, measured after the run, is
    ``CPU_FLOAT64_SLOWER`` times its float64 rate or more; or whose convolutions ran in float64 on torch's reference
    kernels (``SLOW_CONVS``: oneDNN has no float64 kernel), where a convolution measured after the run is as much
    slower in float64 (a small CNN made ``.double()``: promised 1% by its matmuls alone, measured 41% in float32).
    Why it matters: deep-learning training needs no more than float32's precision (mixed precision goes lower
    still), and a float64 matmul moves twice the bytes and fills half the vector lanes: half the speed on a CPU.
    Some scientific models do need float64: the advice says so.
    Fix: keep the model and its data in float32, naming the lines that made float64 the model's or torch's dtype.
    Gain: as ``cpu-fp32-over-low-precision``'s: the matmuls' time less the same matmuls at the float32 rate, and the
    reference kernels' time less the same at the float32 convolution rate."""
    sol = run.speed_of_light
    if sol is None or sol.dtype != "float64":
        return None
    found = _matmuls_in_float32(run, th.CPU_FLOAT64_SLOWER)
    convs = _slow_convs(run, th.CPU_FLOAT64_SLOWER, float64=True)
    if found is None and convs is None:
        return None
    sites = run.practices.float64_sites if run.practices is not None else ()
    how = f", the model's or torch's dtype made so at {_sites(sites)}" if sites else ""
    # the convolutions' rates are the matmul rates, which the matmuls' lines give already
    evidence, what, slower, gain = _together(found, convs, "float64", how, rates_once=True)
    fix = None
    if sites and sites[0].file:
        fix = (f"{_site(sites[0])}: keep the model (and its inputs) in float32 on this CPU, whose float64 {what} "
               f"are {slower} slower than its float32 ones, unless it needs float64's precision (training rarely "
               "does: mixed precision goes below float32)")
    return Finding(gain, evidence, fix=fix)


def attention_share(run: RunRecord) -> float | None:
    """Share of the profiled steps' op time in scaled dot-product attention (its CPU kernels, forward and backward)."""
    return op_share(run, lambda name: "scaled_dot_product" in name)


@rule(id="cpu-float32-attention",
      title="Run attention in float32 on this CPU: its bfloat16 / float16 attention is slower",
      fix=FLOAT32_ATTENTION,
      needs=("cpu", "op_profile", "attention_timing"),
      resolved_by=(Metric("op time in attention", "share", attention_share), STEP),
      trial=Refused("it is a change to your attention code"))
def cpu_float32_attention(run: RunRecord) -> Finding | None:
    """Signal: a CPU run whose attention (``F.scaled_dot_product_attention``, or a module running it) ran in
    bfloat16 or float16, where one forward and backward at its shapes, timed after the run, took
    ``CPU_LOW_PRECISION_SLOWER`` times longer in that dtype than in float32 or more.
    Why it matters: torch's CPU flash attention backward in bfloat16 is several times slower than in float32 even
    where the CPU's bfloat16 matmuls are faster (AMX); dropping the autocast would lose the matmuls' gain.
    Fix: run the attention in float32 inside the autocast, naming the line that made it.
    Gain: the attention ops' time in the step (their share of the profiled op time) less the same at the measured
    float32 / low-precision ratio."""
    sol = run.speed_of_light
    timing = sol.attention if sol is not None else None
    if timing is None or timing.dtype not in ("bfloat16", "float16"):  # none, or a float32 one: nothing to hold
        return None
    low, fp32, share = timing.seconds[timing.dtype], timing.seconds["float32"], attention_share(run)
    if low < fp32 * th.CPU_LOW_PRECISION_SLOWER or not share or not run.steps.count or not run.steps.median_s:
        return None
    attention_s = share * median_compute_s(run)
    shape = " x ".join(map(str, timing.query))
    evidence = (
        f"the step's attention ran in {timing.dtype}: {share:.0%} of the step's op time, about "
        f"{attention_s * 1e3:.1f} ms of the {run.steps.median_s * 1e3:.1f} ms step",
        f"one forward and backward of it (query {shape}{', causal' if timing.is_causal else ''}), timed after the "
        f"run: {timing.dtype} {low * 1e3:.1f} ms, float32 {fp32 * 1e3:.1f} ms ({low / fp32:.1f}x slower)",
    )
    faster = sol.peak_flops_per_s / sol.float32_flops_per_s if sol is not None and sol.dtype == timing.dtype \
        and sol.peak_flops_per_s and sol.float32_flops_per_s else None
    keep = f" (keep the rest in {timing.dtype}: its matmuls measured {faster:.1f}x float32's rate here)" \
        if faster is not None and faster > 1 else ""
    site = timing.called_at
    fix = f"{_site(site)}: run the attention in float32{keep}: {FLOAT32_ATTENTION}" \
        if site is not None and site.file else None
    return Finding(attention_s * (1 - fp32 / low) / run.steps.median_s, evidence, fix=fix)


def _site(site: CallSite) -> str:
    return f"{site.file}:{site.line} `{site.code}`" if site.file else "a line outside the user's code"


def _sites(sites: tuple[CallSite, ...]) -> str:
    return ", ".join(f"{_site(s)} ({s.calls}x)" for s in sites[:3])
