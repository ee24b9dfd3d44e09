"""Peak dense arithmetic throughput of common GPUs, per dtype, from NVIDIA's datasheets and whitepapers.

Figures are *dense* TFLOP/s (datasheets print Tensor Core figures "with sparsity", twice the dense ones, marked
with an asterisk; those are halved here), at boost clock. ``float32`` is the CUDA-core (non-Tensor-Core) rate,
``tfloat32`` the Tensor Core rate a float32 matmul gets with TF32 allowed, ``float64`` the FP64 Tensor Core rate
where the GPU has them (A100, H100, H200: cuBLAS runs float64 matmuls there), else the FP64 rate, listed only where
the datasheet gives it. GeForce cards are listed with FP32 accumulation (what torch's half-precision matmuls use),
which their whitepapers give as half the FP16-accumulate rate. A GPU not in the table gets no peak: the record
says its model is unknown rather than guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TFLOPS = 1e12


@dataclass(frozen=True, slots=True)
class GpuPeak:
    """One GPU model's dense peaks (TFLOP/s) by dtype, and where they come from."""

    name: str
    tflops: dict[str, float]
    source: str


_A100 = ("NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS dense, FP64 Tensor "
         "Core 19.5")
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023)"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024)"

GPU_PEAKS: tuple[tuple[str, GpuPeak], ...] = (
    # (regex on the device name as torch / NVML report it, e.g. "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB")
    (r"H200.*NVL", GpuPeak("H200 NVL", {"float32": 60, "tfloat32": 417.5, "bfloat16": 835.5, "float16": 835.5},
                           _H200 + ", H200 NVL: FP32 60, TF32 835*, BF16/FP16 1,671* TFLOPS (* with sparsity)")),
    (r"H200", GpuPeak("H200", {"float32": 67, "tfloat32": 494.5, "bfloat16": 989.5, "float16": 989.5, "float64": 67},
                      _H200 + ", H200 SXM: FP32 67, TF32 989*, BF16/FP16 1,979* TFLOPS (* with sparsity), "
                              "FP64 Tensor Core 67")),
    (r"H100.*NVL", GpuPeak("H100 NVL", {"float32": 60, "tfloat32": 417.5, "bfloat16": 835.5, "float16": 835.5},
                           _H100 + ", H100 NVL: FP32 60, TF32 835*, BF16/FP16 1,671* TFLOPS (* with sparsity)")),
    (r"H100.*PCI", GpuPeak("H100 PCIe", {"float32": 51, "tfloat32": 378, "bfloat16": 756, "float16": 756,
                                         "float64": 51},
                           _H100 + ", H100 PCIe: FP32 51, TF32 756*, BF16/FP16 1,513* TFLOPS (* with sparsity), "
                                   "FP64 Tensor Core 51")),
    (r"H100", GpuPeak("H100 SXM", {"float32": 67, "tfloat32": 494.5, "bfloat16": 989.5, "float16": 989.5,
                                   "float64": 67},
                      _H100 + ", H100 SXM: FP32 67, TF32 989*, BF16/FP16 1,979* TFLOPS (* with sparsity), "
                              "FP64 Tensor Core 67")),
    (r"A100.*PCI", GpuPeak("A100 PCIe", {"float32": 19.5, "tfloat32": 156, "bfloat16": 312, "float16": 312,
                                         "float64": 19.5},
                           _A100 + " (PCIe and SXM alike)")),
    (r"A100", GpuPeak("A100 SXM", {"float32": 19.5, "tfloat32": 156, "bfloat16": 312, "float16": 312, "float64": 19.5},
                      _A100)),
    (r"L40S", GpuPeak("L40S", {"float32": 91.6, "tfloat32": 183, "bfloat16": 362.05, "float16": 362.05},
                      "NVIDIA L40S datasheet (2023): FP32 91.6, TF32 183 | 366*, BF16/FP16 362.05 | 733* TFLOPS")),
    (r"L40\b", GpuPeak("L40", {"float32": 90.5, "tfloat32": 90.5, "bfloat16": 181.05, "float16": 181.05},
                       "NVIDIA L40 datasheet (2022): FP32 90.5, TF32 90.5 | 181*, BF16/FP16 181.05 | 362.1* TFLOPS")),
    (r"\bL4\b", GpuPeak("L4", {"float32": 30.3, "tfloat32": 60, "bfloat16": 121, "float16": 121},
                        "NVIDIA L4 datasheet (2023): FP32 30.3, TF32 120*, BF16/FP16 242* TFLOPS (* with sparsity)")),
    (r"\bA10\b", GpuPeak("A10", {"float32": 31.2, "tfloat32": 62.5, "bfloat16": 125, "float16": 125},
                         "NVIDIA A10 datasheet (2021): FP32 31.2, TF32 62.5 | 125*, BF16/FP16 125 | 250* TFLOPS")),
    (r"\bT4\b", GpuPeak("T4", {"float32": 8.1, "float16": 65},
                        "NVIDIA T4 datasheet (2019): FP32 8.1, FP16/FP32 mixed precision 65 TFLOPS (no TF32/BF16)")),
    (r"V100S", GpuPeak("V100S PCIe", {"float32": 16.4, "float16": 130, "float64": 8.2},
                       "NVIDIA V100 datasheet (2020): V100S PCIe FP32 16.4, Tensor 130, FP64 8.2 TFLOPS")),
    (r"V100.*PCI", GpuPeak("V100 PCIe", {"float32": 14, "float16": 112, "float64": 7},
                           "NVIDIA V100 datasheet (2020): V100 PCIe FP32 14, Tensor 112, FP64 7 TFLOPS")),
    (r"V100", GpuPeak("V100 SXM2", {"float32": 15.7, "float16": 125, "float64": 7.8},
                      "NVIDIA V100 datasheet (2020): V100 SXM2 FP32 15.7, Tensor 125, FP64 7.8 TFLOPS")),
    (r"RTX 4090", GpuPeak("RTX 4090", {"float32": 82.6, "tfloat32": 82.6, "bfloat16": 165.2, "float16": 165.2},
                          "NVIDIA Ada Lovelace GPU architecture whitepaper (2022), GeForce RTX 4090: FP32 82.6, "
                          "TF32 82.6, FP16/BF16 with FP32 accumulate 165.2 TFLOPS dense")),
    (r"RTX 3090", GpuPeak("RTX 3090", {"float32": 35.6, "tfloat32": 35.6, "bfloat16": 71, "float16": 71},
                          "NVIDIA Ampere GA102 GPU architecture whitepaper (2020), GeForce RTX 3090: FP32 35.6, "
                          "TF32 35.6, FP16/BF16 with FP32 accumulate 71 TFLOPS dense")),
)
"""First match wins: more specific patterns (H100 NVL, H100 PCIe) come before the general one (H100 = SXM)."""


def find_gpu(device_name: str) -> GpuPeak | None:
    """The table's entry for a GPU named ``device_name`` (case-insensitive), or None for an unknown model."""
    for pattern, peak in GPU_PEAKS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return peak
    return None


def gpu_peak_flops(device_name: str, dtype: str) -> tuple[float | None, str]:
    """Dense peak FLOP/s of ``device_name`` in ``dtype`` (``float32``, ``tfloat32``, ``bfloat16``, ``float16``,
    ``float64``) and its source; (None, why) when the model or the dtype is not in the table."""
    peak = find_gpu(device_name)
    if peak is None:
        return None, f"unknown GPU model {device_name!r}: no peak in gpuscope's table"
    tflops = peak.tflops.get(dtype)
    if tflops is None:
        return None, f"no {dtype} peak for the {peak.name} in gpuscope's table ({peak.source})"
    return tflops * TFLOPS, peak.source
