"""FLOPs, throughput and GPU peaks: how far from the hardware's best a measured time is."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def training_flops(forward_flops: int) -> int:
    """FLOPs of forward + backward, by the usual convention ``3 x forward``.

    The backward pass of a matrix product needs two products of the same size (one gradient for
    each input), so it costs about twice the forward. Kernels that recompute the scores in the
    backward (FlashAttention) do more work than this; the convention still counts ``3x`` so
    numbers stay comparable between implementations.
    """
    return 3 * forward_flops


def tflops_per_s(flops: float, seconds: float) -> float:
    """Achieved throughput in TFLOP/s (``1e12`` FLOPs per second)."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return flops / seconds / 1e12


@dataclass(frozen=True)
class GpuSpec:
    """Dense (no sparsity) peak figures of one GPU, from its vendor data sheet.

    Attributes:
        name: the product, e.g. ``"H100 SXM"``.
        tensor_16bit_tflops: FP16/BF16 tensor-core peak, dense. ``bf16_supported`` says whether BF16 exists.
        fp32_tflops: plain FP32 peak (no tensor cores). PyTorch uses it for float32 matmuls unless
            TF32 is switched on (``torch.backends.cuda.matmul.allow_tf32``).
        memory_gb: memory on the card, in GB (1e9 bytes).
        bandwidth_gbs: memory bandwidth in GB/s.
        source: where the figures come from.
    """

    name: str
    tensor_16bit_tflops: float
    bf16_supported: bool
    fp32_tflops: float
    memory_gb: float
    bandwidth_gbs: float
    source: str


#: Data-sheet figures. Vendors often print the "with sparsity" tensor number; the dense peak is half.
GPU_SPECS: dict[str, GpuSpec] = {
    "T4": GpuSpec("T4", 65.0, False, 8.1, 16, 320,
                  "NVIDIA T4 Tensor Core GPU data sheet: 65 TFLOPS mixed-precision FP16, 8.1 TFLOPS FP32, 16 GB GDDR6, 320 GB/s"),
    "A100": GpuSpec("A100 80GB SXM", 312.0, True, 19.5, 80, 2039,
                    "NVIDIA A100 Tensor Core GPU data sheet: 312 TFLOPS BF16/FP16 (624 with sparsity), 19.5 TFLOPS FP32, 80 GB HBM2e, 2,039 GB/s"),
    "H100 PCIe": GpuSpec("H100 PCIe", 756.0, True, 51.0, 80, 2000,
                         "NVIDIA H100 Tensor Core GPU data sheet: 1,513 TFLOPS BF16/FP16 with sparsity (756 dense), 51 TFLOPS FP32, 80 GB, 2 TB/s"),
    "H100 NVL": GpuSpec("H100 NVL", 835.0, True, 60.0, 94, 3900,
                        "NVIDIA H100 Tensor Core GPU data sheet: 1,671 TFLOPS BF16/FP16 with sparsity (835 dense), 60 TFLOPS FP32, 94 GB, 3.9 TB/s"),
    "H100": GpuSpec("H100 SXM", 989.5, True, 67.0, 80, 3350,
                    "NVIDIA H100 Tensor Core GPU data sheet: 1,979 TFLOPS BF16/FP16 with sparsity (989.5 dense), 67 TFLOPS FP32, 80 GB HBM3, 3.35 TB/s"),
    "H200 NVL": GpuSpec("H200 NVL", 835.0, True, 60.0, 141, 4800,
                        "NVIDIA H200 Tensor Core GPU data sheet: 1,671 TFLOPS BF16/FP16 with sparsity (835 dense), 60 TFLOPS FP32, 141 GB HBM3e, 4.8 TB/s"),
    "H200": GpuSpec("H200 SXM", 989.5, True, 67.0, 141, 4800,
                    "NVIDIA H200 Tensor Core GPU data sheet: 1,979 TFLOPS BF16/FP16 with sparsity (989.5 dense), 67 TFLOPS FP32, 141 GB HBM3e, 4.8 TB/s"),
}


def gpu_spec(device: torch.device | str | None = None, name: str | None = None) -> GpuSpec | None:
    """The :data:`GPU_SPECS` entry for a CUDA device (or a device name), ``None`` if unknown or not a GPU.

    Matching is by substring of ``torch.cuda.get_device_name``: ``"Tesla T4"`` -> T4,
    ``"NVIDIA H100 80GB HBM3"`` -> H100 SXM, ``"NVIDIA H100 PCIe"`` -> H100 PCIe, ...
    """
    if name is None:
        if device is None or torch.device(device).type != "cuda":
            return None
        name = torch.cuda.get_device_name(torch.device(device))
    upper = name.upper()
    for key in ("H200 NVL", "H200", "H100 NVL", "H100 PCIE", "H100", "A100", "T4"):
        if key.split()[0] in upper and all(part in upper for part in key.split()[1:]):
            return GPU_SPECS["H100 PCIe" if key == "H100 PCIE" else key]
    return None


def peak_tflops(device: torch.device | str, dtype: torch.dtype) -> float | None:
    """Dense peak TFLOP/s of ``device`` for matmuls in ``dtype``; ``None`` on a CPU or an unknown GPU."""
    spec = gpu_spec(device)
    if spec is None:
        return None
    if dtype == torch.float16 or (dtype == torch.bfloat16 and spec.bf16_supported):
        return spec.tensor_16bit_tflops
    if dtype == torch.float32:
        return spec.fp32_tflops
    return None


def percent_of_peak(achieved_tflops: float, peak: float | None) -> float | None:
    """``100 * achieved / peak``, or ``None`` when the peak is unknown."""
    return None if peak is None else 100.0 * achieved_tflops / peak
