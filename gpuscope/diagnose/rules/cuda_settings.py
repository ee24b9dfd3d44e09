"""Rules about CUDA-side settings and habits: host-device syncs in the loop, and the backend flags that decide which
kernels run (TF32 for float32 matmuls, cuDNN autotuning, the convolutions' memory format)."""

from __future__ import annotations

import re

from gpuscope.diagnose import thresholds as th
from gpuscope.diagnose.evidence import STEP, Metric, kernel_share
from gpuscope.diagnose.gpu_step import gpu_name, gpu_step
from gpuscope.diagnose.words import datasheet_rates, gpu_busy, step_after
from gpuscope.versions import parse_version
from gpuscope.diagnose.rules.base import AtRunTime, Finding, Refused, rule
from gpuscope.record import CallSite, KernelTimeline, Practices, RunRecord, SyncProfile

SITES_IN_EVIDENCE = 3


@rule(id="avoid-host-sync",
      title="Stop synchronising the host with the GPU every step",
      fix="keep per-step values on the GPU (accumulate `loss.detach()`) and read them every N steps",
      needs=("cuda", "syncs"),
      resolved_by=(Metric("syncs per step", "number", lambda r: r.syncs.per_step if r.syncs else None), STEP),
      trial=Refused("it is a change to where your loop reads values back"))
def avoid_host_sync(run: RunRecord) -> Finding | None:
    """Signal: the steps synchronise host and GPU at least ``SYNCS_PER_STEP_NOTABLE`` times each (counted with
    torch's CUDA sync debug mode over a few steady-state steps, with the lines that did it).
    Why it matters: a sync (``.item()``, ``.cpu()``, ``print(tensor)``, ``nonzero``...) holds the host until the
    GPU has drained its queue, then the GPU idles while the host queues the next work. What it costs is at most the
    host's time blocked in syncs (from the kernel timeline), and at most the GPU's idle share: that is the gain.
    Without a kernel timeline, or with no sync call in it, there is no sound estimate.
    Fix: keep values on the GPU and read them every N steps; the first line named is the one to change."""
    syncs: SyncProfile = run.syncs  # type: ignore[assignment]
    if syncs.per_step < th.SYNCS_PER_STEP_NOTABLE:
        return None
    evidence = [f"{_number(syncs.per_step)} syncs per step over {syncs.steps} steps"]
    evidence += [_site_fact(site, syncs.steps) for site in syncs.sites[:SITES_IN_EVIDENCE]]
    gain = None
    kernels = run.op_profile.kernels if run.op_profile is not None else None
    profiled = run.op_profile.steps if run.op_profile is not None else 0
    if kernels is not None and kernels.sync_calls and profiled and run.steps.median_s > 0:
        wait_share = kernels.sync_wait_s / profiled / run.steps.median_s
        idle = 1 - kernels.busy_fraction
        gain = max(0.0, min(wait_share, idle))
        evidence.append(f"in the profiled steps the host waited {kernels.sync_wait_s / profiled * 1e3:.2f} ms per step "
                        f"in {_number(kernels.sync_calls / profiled)} sync calls ({wait_share:.0%} of the median "
                        f"step); the GPU idles {idle:.0%} of the step")
    first = next((s for s in syncs.sites if s.file), None)
    fix = f"{first.file}:{first.line}: {sync_hint(first.code)}" if first is not None else None
    return Finding(gain, tuple(evidence), fix=fix)


@rule(id="tf32",
      title="Let float32 matmuls use TF32 Tensor Cores",
      fix='torch.set_float32_matmul_precision("high")  # or torch.backends.cuda.matmul.allow_tf32 = True',
      needs=("cuda", "kernels", "practices"),
      resolved_by=(Metric("float32 GEMMs on CUDA cores", "share", kernel_share("fp32_gemm_share")), STEP),
      trial=AtRunTime())
def tf32(run: RunRecord) -> Finding | None:
    """Signal: on a GPU with TF32 Tensor Cores (compute capability 8.0 or later), TF32 is off for matmuls
    (``allow_tf32=False``, float32 matmul precision "highest") and float32 GEMMs on CUDA cores (``sgemm``
    kernels) take a notable share of kernel time.
    Why it matters: TF32 runs float32 matmuls on Tensor Cores, several times faster (7.4x on paper on an H100 or
    H200, 8x on an A100), keeping float32's range with a 10-bit mantissa; most training converges the same. torch
    turned it off by default for matmuls in 1.12, so many scripts run without it unknowingly; before 1.12 it was
    on, and off means the script switched it off.
    Fix: torch.set_float32_matmul_precision("high") (or allow_tf32 = True). Gain: the steady step's float32 GEMM
    time at the ratio of the GPU's datasheet TF32 and float32 rates, the rest of the step as it is, no shorter than
    the host takes to queue it (``gpu_step``); none where the datasheet table lacks the GPU (advised then only where
    the GPU is busy, ``GPU_BUSY_COMPUTE``). A GPU whose TF32 is no faster than its float32 (GeForce Ampere and Ada
    parts) gets no advice."""
    practices: Practices = run.practices  # type: ignore[assignment]
    kernels = _kernels(run)
    if practices.matmul_allow_tf32 is not False or practices.float32_matmul_precision not in (None, "highest"):
        return None
    capability = parse_version(practices.cuda_capability)
    if capability is None or capability < th.TF32_MIN_CAPABILITY or kernels.fp32_gemm_share < th.FP32_GEMM_NOTABLE:
        return None
    step = gpu_step(run)
    ratio = step.peak_ratio("float32", "tfloat32") if step is not None else None
    if ratio is not None and ratio <= 1:
        return None
    setting = "torch.backends.cuda.matmul.allow_tf32=False"
    if practices.float32_matmul_precision is not None:
        setting += f", float32_matmul_precision={practices.float32_matmul_precision}"
    evidence = [
        f"{kernels.fp32_gemm_share:.0%} of kernel time is float32 matrix multiplies on CUDA cores (sgemm kernels)"
        + (f"; {gpu_busy(step)}" if step is not None else ""),
        f"{setting} on a GPU of compute capability {practices.cuda_capability}, which has TF32 Tensor Cores",
    ]
    fix = None
    torch = parse_version(practices.torch_version)
    if torch is not None and torch >= th.TF32_DEFAULT_OFF_SINCE:
        evidence.append(f"torch {practices.torch_version} keeps TF32 off for float32 matmuls by default "
                        f"(since torch 1.12)")
    elif torch is not None:
        evidence.append(f"torch {practices.torch_version} uses TF32 for float32 matmuls by default (until torch "
                        f"1.12): this script turned it off")
        fix = "torch.backends.cuda.matmul.allow_tf32 = True  # drop the line that turns it off"
    if step is None or ratio is None:
        if (step.busy if step is not None else kernels.busy_fraction) < th.GPU_BUSY_COMPUTE:
            return None  # no estimate, and a GPU this idle gains little from faster GEMMs
        evidence.append(f"no datasheet TF32 rate for {gpu_name(run) or 'this GPU'} in gpuscope's table: the gain "
                        "is not estimated")
        return Finding(None, tuple(evidence), fix=fix)
    saved = step.kinds.fp32_gemm * (1 - 1 / ratio)
    evidence.append(f"float32 GEMMs on CUDA cores take {step.kinds.fp32_gemm * 1e3:.1f} ms a step; on TF32 Tensor "
                    f"Cores about {(step.kinds.fp32_gemm - saved) * 1e3:.1f} ms "
                    f"({datasheet_rates(step, 'float32', 'tfloat32')}); "
                    f"{step_after(step, saved)}")
    return Finding(step.saving(saved), tuple(evidence), fix=fix)


@rule(id="cudnn-benchmark",
      title="Let cuDNN pick the fastest convolution algorithms",
      fix="torch.backends.cudnn.benchmark = True  # for fixed input shapes: each new shape is autotuned again",
      needs=("cuda", "kernels", "practices"),
      resolved_by=(STEP,),
      trial=AtRunTime())
def cudnn_benchmark(run: RunRecord) -> Finding | None:
    """Signal: ``cudnn.benchmark`` is off (the default) while convolution kernels take a notable share of kernel
    time in a model with convolution layers, and of the steady step (``CONV_STEP_NOTABLE``).
    Why it matters: without it cuDNN picks each convolution's algorithm by heuristic; with it, it times the
    candidates on the first call of each input shape and keeps the fastest (the seeds: ResNet-50 on a V100 went
    from 8.32 to 8.93 it/s).
    Fix: torch.backends.cudnn.benchmark = True, where input shapes stay fixed: every new shape is autotuned again,
    which makes varying shapes slower. Gain: none is estimated. What autotuning saves depends on whether the
    heuristic's pick is already the fastest, which a trace of the picked kernels cannot tell: 7% of the step on the
    seeds' V100, nothing measurable on a ResNet-18 on an H200 (10.8 ms a step either way)."""
    practices: Practices = run.practices  # type: ignore[assignment]
    kernels = _kernels(run)
    if practices.cudnn_benchmark is not False or kernels.conv_share < th.CONV_SHARE_NOTABLE:
        return None
    if practices.modules_inspected and not practices.conv_layers:
        return None
    step = gpu_step(run)
    if step is not None and (step.kinds.conv + step.kinds.tc_conv) < th.CONV_STEP_NOTABLE * step.step_s:
        return None  # the GPU idles most of the step: its convolutions' algorithms hardly matter
    evidence = [
        "torch.backends.cudnn.benchmark=False (the default)",
        f"convolution kernels take {kernels.conv_share:.0%} of kernel time"
        + (f"; {gpu_busy(step)}" if step is not None else ""),
    ]
    if practices.modules_inspected:
        evidence.append(f"the model has {practices.conv_layers} convolution layers")
    evidence.append("what autotuning saves is not known until it is tried: the heuristic's pick may already be the "
                    "fastest (7% of the step on a V100's ResNet-50 in the seeds, nothing on an H200's ResNet-18)")
    return Finding(None, tuple(evidence))


@rule(id="channels-last",
      title="Keep the convolution net in channels_last memory format",
      fix="model = model.to(memory_format=torch.channels_last)  # and x = x.to(memory_format=torch.channels_last)",
      needs=("cuda", "kernels", "practices"),
      resolved_by=(Metric("layout conversions", "share", kernel_share("layout_transform_share")), STEP),
      trial=AtRunTime())
def channels_last(run: RunRecord) -> Finding | None:
    """Signal: a convolution net with few of its convolutions in channels_last runs them on Tensor Cores (a
    notable share of kernel time: TF32 in a float32 run, 16-bit under autocast), and cuDNN converts layouts (NCHW
    <-> NHWC kernels) for a notable share of kernel time, or convolutions take a notable share.
    Why it matters: Tensor Core convolutions work on NHWC data; with NCHW tensors cuDNN transposes around each
    convolution, or picks slower NCHW kernels.
    Fix: model.to(memory_format=torch.channels_last) and the same for the inputs. Gain: only what is measured, the
    conversion kernels' time in the steady step, which disappears, no shorter than the host takes to queue it
    (``gpu_step``); None when the trace shows no conversions (faster NHWC kernels may still come, but that is not
    measured here)."""
    practices: Practices = run.practices  # type: ignore[assignment]
    kernels = _kernels(run)
    if not practices.conv_layers or practices.channels_last_convs / practices.conv_layers >= th.CHANNELS_LAST_FEW:
        return None
    if kernels.tensor_core_share < th.REDUCED_PRECISION_TC_SHARE:
        return None
    if kernels.layout_transform_share < th.LAYOUT_TRANSFORM_NOTABLE and kernels.conv_share < th.CONV_SHARE_NOTABLE:
        return None
    evidence = [
        f"{practices.channels_last_convs} of {practices.conv_layers} convolution layers have channels_last weights",
        f"{kernels.tensor_core_share:.0%} of kernel time runs on Tensor Cores; convolutions take "
        f"{kernels.conv_share:.0%}",
    ]
    gain = None
    step = gpu_step(run)
    if kernels.layout_transform_share > 0 and step is not None:
        saved = step.kinds.layout
        evidence.append(f"cuDNN spends {kernels.layout_transform_share:.0%} of kernel time converting between NCHW "
                        f"and NHWC, {saved * 1e3:.1f} ms a step; {gpu_busy(step)}; without the conversions "
                        f"{step_after(step, saved)}")
        gain = step.saving(saved)
    return Finding(gain, tuple(evidence))


# -- helpers ---------------------------------------------------------------------------------------------------

def sync_hint(code: str) -> str:
    """What to do about the syncing line ``code``, by what it calls."""
    if ".item()" in code:
        receiver = re.search(r"(\w+(?:\.\w+)*)\.item\(\)", code)
        name = receiver.group(1) if receiver else "the tensor"
        return f"keep the value on the GPU (accumulate `{name}.detach()`), read it every N steps"
    if "print(" in code:
        return "print every N steps: printing a CUDA tensor copies it to the host and waits"
    if any(call in code for call in (".cpu()", ".numpy()", ".tolist()")):
        return "copy to the host every N steps, not every step"
    if any(call in code for call in ("nonzero", "masked_select", "unique(")):
        return "use a fixed-size form (torch.where, a multiplied mask): an output whose size depends on the data " \
               "makes the host wait for it"
    return "keep the value on the GPU and read it every N steps"


def _site_fact(site: CallSite, steps: int) -> str:
    where = f"{site.file}:{site.line} `{site.code}`" if site.file else "inside library code (no line of the script)"
    return f"{where} ({_number(site.calls / max(1, steps))} per step)"


def _number(value: float) -> str:
    """A count per step: whole numbers as such, others to one decimal."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def _kernels(run: RunRecord) -> KernelTimeline:
    return run.op_profile.kernels  # type: ignore[union-attr,return-value]
