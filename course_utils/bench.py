"""Measuring attention: timing, FLOPs, throughput, memory, and the implementations to compare.

Used by notebook 06 and by the benchmark command::

    python -m course_utils.bench --out bench-results

which times every implementation over a sweep of sequence lengths on the best device present,
after checking each one against the reference (a wrong implementation is reported, never timed),
and writes ``attention_bench.json`` and ``attention_bench.png`` into the output folder.
``python -m course_utils.bench --help`` lists the options (``--threads 1`` gives steadier numbers on
a busy CPU; ``--broken-demo`` adds a deliberately wrong implementation to show the gate).

Timing rules this module follows (notebook 06 explains why):
    1. warm up first (the first calls pay for allocation, kernel selection and compilation);
    2. synchronise the GPU before reading a clock (CUDA kernels run asynchronously), or use CUDA
       events, which are timestamps recorded on the GPU itself;
    3. report the median of several repeats, which one slow outlier cannot move.

Shape letters: ``b`` batch, ``T`` tokens, ``d`` model size, ``H`` heads, ``D`` head size.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils import reference
from course_utils.checks.core import tensor_difference
from course_utils.device import describe_device, get_device
from course_utils.validation import check_heads_divide, check_input_3d

__all__ = [
    "Timing",
    "synchronize",
    "time_fn",
    "attention_flops",
    "training_flops",
    "tflops_per_s",
    "GpuSpec",
    "GPU_SPECS",
    "gpu_spec",
    "peak_tflops",
    "percent_of_peak",
    "MemoryReport",
    "peak_memory",
    "score_matrix_bytes",
    "max_seq_len_for_scores",
    "IncorrectImplementation",
    "verify",
    "checked_time",
    "SDPA_KERNELS",
    "sdpa_backend_used",
    "sdpa_backends_available",
    "flex_attention_status",
    "MHASDPAExplicitMask",
    "MHAPyTorchClass",
    "MHAFlexAttention",
    "copy_weights",
    "run_benchmark",
    "main",
]

DEFAULT_OUT = "bench-results"


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------
@dataclass
class Timing:
    """Result of :func:`time_fn`.

    Attributes:
        median_s: median of the repeats, in seconds: the number to report.
        times_s: every repeat, in seconds, in the order they ran.
        warmup: calls made (and discarded) before timing.
        method: ``"cuda-events"`` (timestamps recorded on the GPU) or ``"perf_counter"`` (host
            clock, after synchronising the device).
    """

    median_s: float
    times_s: list[float]
    warmup: int
    method: str

    @property
    def repeats(self) -> int:
        return len(self.times_s)

    @property
    def median_ms(self) -> float:
        return 1e3 * self.median_s

    @property
    def spread(self) -> float:
        """``(max - min) / median``: large values mean a noisy machine."""
        return (max(self.times_s) - min(self.times_s)) / self.median_s if self.median_s > 0 else 0.0

    def __str__(self) -> str:
        return f"{self.median_ms:.3f} ms (median of {self.repeats}, {self.warmup} warm-up, {self.method})"


def synchronize(device: torch.device | str) -> None:
    """Wait until every kernel queued on ``device`` has finished (no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_fn(
    fn: Callable[[], object],
    *,
    device: torch.device | str = "cpu",
    warmup: int = 3,
    repeats: int = 10,
    clock: Callable[[], float] | None = None,
) -> Timing:
    """Median wall time of ``fn()`` after ``warmup`` discarded calls.

    On a CUDA device (and no ``clock`` given) each repeat is measured with a pair of CUDA events;
    elsewhere with ``clock`` (default ``time.perf_counter``), synchronising the device before
    starting and before stopping the clock, so queued GPU work is neither missed nor charged to
    the next repeat.

    Args:
        fn: the work to time, called with no arguments. Wrap it in ``torch.no_grad()`` yourself for
            inference timings.
        device: where ``fn`` runs; decides how to synchronise.
        warmup: calls made first and not timed (``>= 0``).
        repeats: timed calls (``>= 1``).
        clock: a function returning seconds; tests pass a fake one.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be non-negative, got {warmup}")
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    synchronize(device)
    times: list[float] = []
    if device.type == "cuda" and clock is None:
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)  # elapsed_time is in milliseconds
        method = "cuda-events"
    else:
        clock = clock or time.perf_counter
        for _ in range(repeats):
            synchronize(device)
            t0 = clock()
            fn()
            synchronize(device)
            times.append(clock() - t0)
        method = "perf_counter"
    return Timing(median_s=statistics.median(times), times_s=times, warmup=warmup, method=method)


# --------------------------------------------------------------------------------------------
# FLOPs and throughput
# --------------------------------------------------------------------------------------------
def attention_flops(batch: int, num_heads: int, seq_len: int, head_dim: int, causal: bool = True) -> int:
    """Forward FLOPs of the attention core: ``4 * B * H * T^2 * D``, halved when causal.

    Same as :func:`course_utils.reference.attention_flops` (notebook 06's exercise).
    """
    return reference.attention_flops(batch, num_heads, seq_len, head_dim, causal)


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


# --------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------
@dataclass
class MemoryReport:
    """Peak memory that a call allocated beyond what was already allocated.

    Attributes:
        peak_bytes: ``None`` when it cannot be measured on this device.
        method: how it was measured, or why it was not.
    """

    peak_bytes: int | None
    method: str

    def __str__(self) -> str:
        if self.peak_bytes is None:
            return f"not measured ({self.method})"
        return f"{self.peak_bytes / 2**20:.1f} MiB ({self.method})"


def peak_memory(fn: Callable[[], object], device: torch.device | str) -> MemoryReport:
    """Extra device memory at the peak of ``fn()``.

    On CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus what was
    allocated before the call. On the CPU this returns ``peak_bytes=None``: PyTorch's CPU
    allocator is invisible to Python's ``tracemalloc`` (it would report almost nothing), and the
    process's resident size cannot be reset between measurements. Use :func:`score_matrix_bytes`
    to reason about CPU memory instead.
    """
    device = torch.device(device)
    if device.type != "cuda":
        fn()
        return MemoryReport(None, f"not available on {device.type}: tracemalloc cannot see PyTorch's CPU allocator")
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    synchronize(device)
    return MemoryReport(torch.cuda.max_memory_allocated(device) - before, "torch.cuda.max_memory_allocated")


def score_matrix_bytes(batch: int, num_heads: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one ``(b, H, T, T)`` score (or weight) tensor: ``b * H * T^2 * bytes_per_element``."""
    element = torch.empty((), dtype=dtype).element_size()
    return batch * num_heads * seq_len * seq_len * element


def max_seq_len_for_scores(
    memory_bytes: float, batch: int, num_heads: int, dtype: torch.dtype = torch.float32, copies: int = 1
) -> int:
    """Largest ``T`` for which ``copies`` score tensors of shape ``(b, H, T, T)`` fit in ``memory_bytes``."""
    element = torch.empty((), dtype=dtype).element_size()
    per_t2 = copies * batch * num_heads * element
    t = math.isqrt(int(memory_bytes // per_t2))
    while copies * score_matrix_bytes(batch, num_heads, t + 1, dtype) <= memory_bytes:
        t += 1
    while t > 0 and copies * score_matrix_bytes(batch, num_heads, t, dtype) > memory_bytes:
        t -= 1
    return t


# --------------------------------------------------------------------------------------------
# Correctness before speed
# --------------------------------------------------------------------------------------------
class IncorrectImplementation(AssertionError):
    """An implementation's output differs from the reference, so it is not timed."""


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(atol, rtol)`` that separate rounding from bugs for outputs of order 1 in ``dtype``."""
    if dtype in (torch.float16, torch.bfloat16):
        return 3e-2, 3e-2
    return 1e-4, 1e-3


def verify(expected: torch.Tensor, got: object, *, atol: float | None = None, rtol: float | None = None) -> str | None:
    """``None`` if ``got`` matches ``expected``, else one sentence saying how it differs."""
    d_atol, d_rtol = default_tolerance(got.dtype if isinstance(got, torch.Tensor) else torch.float32)
    return tensor_difference(expected, got, atol=d_atol if atol is None else atol, rtol=d_rtol if rtol is None else rtol)


def checked_time(
    fn: Callable[[], torch.Tensor],
    expected: torch.Tensor,
    *,
    name: str = "implementation",
    device: torch.device | str = "cpu",
    warmup: int = 3,
    repeats: int = 10,
    atol: float | None = None,
    rtol: float | None = None,
    clock: Callable[[], float] | None = None,
) -> Timing:
    """Check ``fn()`` against ``expected`` first; time it with :func:`time_fn` only if it agrees.

    Raises:
        IncorrectImplementation: the output differs; the message says how. Nothing was timed.
    """
    with torch.no_grad():
        got = fn()
    problem = verify(expected, got, atol=atol, rtol=rtol)
    if problem:
        raise IncorrectImplementation(f"{name} is wrong, so it was not timed: {problem}")
    return time_fn(fn, device=device, warmup=warmup, repeats=repeats, clock=clock)


# --------------------------------------------------------------------------------------------
# Which SDPA backend ran
# --------------------------------------------------------------------------------------------
#: The ATen operator each fused backend of ``F.scaled_dot_product_attention`` dispatches to. The
#: math backend has no operator of its own: it decomposes into ``bmm``, ``_safe_softmax``, ...
SDPA_KERNELS: dict[str, str] = {
    "aten._scaled_dot_product_flash_attention_for_cpu": "flash (CPU kernel)",
    "aten._scaled_dot_product_flash_attention": "flash",
    "aten._scaled_dot_product_efficient_attention": "memory-efficient",
    "aten._scaled_dot_product_cudnn_attention": "cuDNN",
    "aten._scaled_dot_product_fused_attention_overrideable": "overrideable (third-party device)",
}


def sdpa_backend_used(fn: Callable[[], object]) -> list[str]:
    """Names of the SDPA backends that ran during ``fn()``, e.g. ``["flash"]`` or ``["math"]``.

    Watches the call at two levels: a ``TorchFunctionMode`` sees every call of
    ``F.scaled_dot_product_attention``; a ``TorchDispatchMode`` sees the ATen operators it turns
    into, and each fused backend has its own (:data:`SDPA_KERNELS`). An SDPA call that reached
    none of them ran the math backend. Empty list: no SDPA call happened. (``torch.profiler``
    shows the same operators, but prints log lines into a notebook.)
    """
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: list[int] = []
    ops: list[str] = []

    class _Calls(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") == "scaled_dot_product_attention":
                calls.append(len(ops))
            return func(*args, **(kwargs or {}))

    class _Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with _Calls(), _Ops():
        fn()
    labels: list[str] = []
    # Calls made by user code: the operators between one call and the next belong to it.
    bounds = calls + [len(ops)]
    for start, stop in zip(bounds[:-1], bounds[1:]):
        fused = [SDPA_KERNELS[op] for op in ops[start:stop] if op in SDPA_KERNELS]
        labels.append(fused[0] if fused else "math")
    # Calls made inside another torch function (nn.MultiheadAttention) are invisible to the
    # function mode; their operators still show. ``_safe_softmax`` is the math backend's softmax.
    for op in ops:
        if op in SDPA_KERNELS:
            labels.append(SDPA_KERNELS[op])
        elif op == "aten._safe_softmax":
            labels.append("math")
        elif op == "aten._native_multi_head_attention":
            labels.append("nn.MultiheadAttention fast path (fused C++ kernel)")
    return list(dict.fromkeys(labels))


def sdpa_backends_available(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True
) -> dict[str, str]:
    """Try ``q, k, v`` with each backend forced by ``sdpa_kernel``: ``"ok"`` or why it refused.

    Returns:
        ``{"FLASH_ATTENTION": "ok", "EFFICIENT_ATTENTION": "No available kernel ...", ...}``.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    result: dict[str, str] = {}
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            result[name] = "not in this torch version"
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
                result[name] = "ok"
                continue
            except RuntimeError as exc:
                error = str(exc).strip().splitlines()[0]
        # On CUDA, SDPA explains each refusal in warnings ("... not used because:", then the reason).
        reasons = [str(w.message).strip() for w in caught if not str(w.message).strip().endswith(":")]
        if reasons:
            result[name] = "refused: " + reasons[-1].splitlines()[0][:110]
        elif q.device.type == "cpu" and name in ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
            result[name] = "refused: no CPU implementation (on a CPU only FLASH_ATTENTION and MATH exist)"
        else:
            result[name] = "refused: " + error[:110]
    return result


# --------------------------------------------------------------------------------------------
# The implementations that are not exercises
# --------------------------------------------------------------------------------------------
class MHASDPAExplicitMask(nn.Module):
    """Like :class:`~course_utils.reference.MHAPyTorchSDPA`, but passing a boolean mask to SDPA.

    SDPA's boolean ``attn_mask`` means True = "may attend", the opposite of the course's
    ``causal_mask`` (True = blocked), hence the ``~``. With an arbitrary mask SDPA cannot assume
    the causal pattern, so it may pick a slower kernel than with ``is_causal=True``.
    Input ``(b, T, d_in)``, output ``(b, T, d_out)``; parameters as in ``MHAPyTorchSDPA``.
    """

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int, qkv_bias: bool = False
    ):
        super().__init__()
        check_heads_divide(d_out, num_heads)
        self.d_in, self.d_out, self.num_heads = d_in, d_out, num_heads
        self.head_dim = d_out // num_heads
        self.context_length = context_length
        self.dropout = dropout
        self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.register_buffer("mask", reference.causal_mask(context_length))  # True = future, blocked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, T, _ = check_input_3d(x, self.d_in, self.context_length)
        qkv = self.qkv(x).view(b, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (b, H, T, D)
        allowed = ~self.mask[:T, :T]  # (T, T), True = may attend
        dropout_p = self.dropout if self.training else 0.0
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)
        return self.out_proj(reference.merge_heads(context))


class MHAPyTorchClass(nn.Module):
    """Multi-head causal attention with PyTorch's ``nn.MultiheadAttention``.

    ``nn.MultiheadAttention`` needs ``d_in == d_out`` (its ``embed_dim``); its one ``bias`` flag
    covers both the input and the output projection, so it is built with ``bias=True`` and the
    input bias is zeroed when ``qkv_bias=False`` (the course's ``out_proj`` always has a bias).
    Its boolean ``attn_mask`` means True = NOT allowed, the same convention as ``causal_mask``.
    ``need_weights=False`` lets it call SDPA instead of materialising the weights.
    Input ``(b, T, d)``, output ``(b, T, d)``.
    """

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int, qkv_bias: bool = False
    ):
        super().__init__()
        if d_in != d_out:
            raise ValueError(f"nn.MultiheadAttention needs d_in == d_out, got {d_in} and {d_out}")
        self.d_in, self.d_out, self.context_length = d_in, d_out, context_length
        self.multihead_attn = nn.MultiheadAttention(
            embed_dim=d_out, num_heads=num_heads, dropout=dropout, bias=True, batch_first=True
        )
        if not qkv_bias:
            with torch.no_grad():
                self.multihead_attn.in_proj_bias.zero_()
            self.multihead_attn.in_proj_bias.requires_grad_(False)
        self.register_buffer("mask", reference.causal_mask(context_length))  # True = blocked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, T, _ = check_input_3d(x, self.d_in, self.context_length)
        out, _ = self.multihead_attn(x, x, x, attn_mask=self.mask[:T, :T], need_weights=False, is_causal=True)
        return out


def flex_attention_status(device: torch.device | str, compile: bool | None = None) -> tuple[bool, str]:
    """Whether FlexAttention runs here: ``(True, how)`` or ``(False, why not)``.

    Tries a tiny causal call. ``compile`` defaults to True on CUDA (the fused kernel only exists
    compiled) and False elsewhere (eager FlexAttention runs everywhere but materialises the scores,
    so it shows the API, not the speed).
    """
    device = torch.device(device)
    compile = device.type == "cuda" if compile is None else compile
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as exc:
        return False, f"torch {torch.__version__} has no torch.nn.attention.flex_attention ({exc}); it needs torch >= 2.5"
    try:
        q = torch.randn(1, 1, 128, 16, device=device)
        block_mask = create_block_mask(_causal_mask_mod, None, None, 128, 128, device=device)
        fn = torch.compile(flex_attention) if compile else flex_attention
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn(q, q, q, block_mask=block_mask)
        expected = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        problem = verify(expected, out)
        if problem:
            return False, f"FlexAttention ran but disagrees with SDPA: {problem}"
    except Exception as exc:  # noqa: BLE001 - any failure means "not here", with the reason
        return False, f"FlexAttention failed on {device.type}: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}"
    if compile:
        return True, f"compiled with torch.compile on {device.type} (fused kernel)"
    return True, f"eager on {device.type}: unfused, it materialises the scores (compile it for speed)"


def _causal_mask_mod(b, h, q_idx, kv_idx):
    """FlexAttention ``mask_mod``: True where query ``q_idx`` may see key ``kv_idx``."""
    return q_idx >= kv_idx


class MHAFlexAttention(nn.Module):
    """Multi-head causal attention with FlexAttention (``torch.nn.attention.flex_attention``).

    The causal pattern is a ``mask_mod`` function, turned into a block-sparse ``BlockMask`` once
    per sequence length; blocks entirely in the future are skipped, not computed and masked.
    ``compile=True`` wraps ``flex_attention`` in ``torch.compile`` (needed for the fused kernel).
    No dropout: FlexAttention has no ``dropout_p``. Parameters as in ``MHAPyTorchSDPA``.
    Input ``(b, T, d_in)``, output ``(b, T, d_out)``.
    """

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
        qkv_bias: bool = False, compile: bool = False,
    ):
        super().__init__()
        from torch.nn.attention.flex_attention import flex_attention

        check_heads_divide(d_out, num_heads)
        if dropout:
            raise ValueError("FlexAttention has no dropout; build MHAFlexAttention with dropout=0.0")
        self.d_in, self.d_out, self.num_heads = d_in, d_out, num_heads
        self.head_dim = d_out // num_heads
        self.context_length = context_length
        self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self._flex = torch.compile(flex_attention) if compile else flex_attention
        self._block_masks: dict = {}

    def _block_mask(self, T: int, device: torch.device):
        from torch.nn.attention.flex_attention import create_block_mask

        key = (T, str(device))
        if key not in self._block_masks:
            self._block_masks[key] = create_block_mask(_causal_mask_mod, None, None, T, T, device=device)
        return self._block_masks[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, T, _ = check_input_3d(x, self.d_in, self.context_length)
        qkv = self.qkv(x).view(b, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (b, H, T, D)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            context = self._flex(q, k, v, block_mask=self._block_mask(T, x.device))
        return self.out_proj(reference.merge_heads(context))


def copy_weights(source: nn.Module, target: nn.Module) -> nn.Module:
    """Give ``target`` the weights of ``source``, a notebook-05 style ``MultiHeadAttention``
    (``W_query``, ``W_key``, ``W_value``, ``out_proj``), so that both compute the same function.

    Handles targets with separate projections (``W_query``...), a combined ``qkv`` layer (rows
    ``[W_query; W_key; W_value]``), and :class:`MHAPyTorchClass`. Returns ``target``.
    """
    ws = [getattr(source, n).weight for n in ("W_query", "W_key", "W_value")]
    bs = [getattr(source, n).bias for n in ("W_query", "W_key", "W_value")]
    with torch.no_grad():
        if hasattr(target, "W_query"):
            target.load_state_dict(source.state_dict())
            return target
        if isinstance(target, MHAPyTorchClass):
            mha = target.multihead_attn
            mha.in_proj_weight.copy_(torch.cat(ws, dim=0))
            mha.in_proj_bias.copy_(torch.cat(bs) if bs[0] is not None else torch.zeros_like(mha.in_proj_bias))
            mha.out_proj.weight.copy_(source.out_proj.weight)
            mha.out_proj.bias.copy_(source.out_proj.bias)
            return target
        if hasattr(target, "qkv"):
            target.qkv.weight.copy_(torch.cat(ws, dim=0))  # (3 * d_out, d_in)
            if target.qkv.bias is not None:
                target.qkv.bias.copy_(torch.cat(bs) if bs[0] is not None else torch.zeros_like(target.qkv.bias))
            target.out_proj.load_state_dict(source.out_proj.state_dict())
            return target
    raise TypeError(f"do not know how to copy weights into {type(target).__name__}")


# --------------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------------
#: name -> constructor with the book's signature. Flex is added when it runs on the device.
IMPLEMENTATIONS: dict[str, Callable[..., nn.Module]] = {
    "notebook05_mha": reference.MultiHeadAttention,
    "combined_qkv": reference.MultiHeadAttentionCombinedQKV,
    "einsum": reference.MultiHeadAttentionEinsum,
    "sdpa_is_causal": reference.MHAPyTorchSDPA,
    "sdpa_explicit_mask": MHASDPAExplicitMask,
    "nn_multiheadattention": MHAPyTorchClass,
}


class _BrokenSDPA(reference.MHAPyTorchSDPA):
    """A deliberately wrong implementation (forgets ``is_causal``), to show the correctness gate."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, T, _ = x.shape
        q, k, v = self.qkv(x).view(b, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return self.out_proj(reference.merge_heads(F.scaled_dot_product_attention(q, k, v)))


@dataclass
class BenchConfig:
    """Sizes and settings of one benchmark run."""

    device: str
    dtype: str
    batch: int
    d_model: int
    num_heads: int
    seq_lens: list[int]
    modes: list[str]
    warmup: int
    repeats: int
    compile: bool = False
    broken_demo: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


@dataclass
class BenchRow:
    """One (implementation, mode, T) measurement, or why there is none."""

    impl: str
    mode: str
    seq_len: int
    status: str  # "ok", "wrong" (failed the correctness gate), "error" (raised), "skipped" (not supported here)
    median_ms: float | None = None
    min_ms: float | None = None  # the fastest repeat: a hint of how noisy the machine was
    flops: int | None = None
    tflops: float | None = None
    percent_of_peak: float | None = None
    peak_memory_bytes: int | None = None
    message: str = ""


@dataclass
class BenchResult:
    config: BenchConfig
    environment: dict
    rows: list[BenchRow] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"environment": self.environment, "config": asdict(self.config),
                "results": [asdict(r) for r in self.rows]}


def _dtype(name: str) -> torch.dtype:
    table = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if name not in table:
        raise ValueError(f"dtype must be one of {sorted(table)}, got {name!r}")
    return table[name]


def build_implementations(config: BenchConfig, log: Callable[[str], None] = print) -> dict[str, nn.Module]:
    """Every implementation, with weights copied from one seeded notebook-05 module, in ``config.dtype``."""
    device, dtype = torch.device(config.device), _dtype(config.dtype)
    args = (config.d_model, config.d_model, max(config.seq_lens), 0.0, config.num_heads)
    torch.manual_seed(123)
    source = reference.MultiHeadAttention(*args)
    constructors = dict(IMPLEMENTATIONS)
    ok, why = flex_attention_status(device, compile=config.compile or device.type == "cuda")
    if ok:
        compiled = config.compile or device.type == "cuda"
        constructors["flex_attention"] = lambda *a: MHAFlexAttention(*a, compile=compiled)
    else:
        log(f"flex_attention skipped: {why}")
    if config.broken_demo:
        constructors["broken_no_causal"] = _BrokenSDPA
    modules = {}
    for name, make in constructors.items():
        module = copy_weights(source, make(*args)).to(device=device, dtype=dtype).eval()
        modules[name] = module
        if config.compile and name in ("notebook05_mha", "sdpa_is_causal"):
            modules[name + "+compile"] = torch.compile(module)
    return modules


def run_benchmark(config: BenchConfig, log: Callable[[str], None] = print) -> BenchResult:
    """Check, then time, every implementation at every sequence length and mode.

    The expected output at each ``T`` comes from the notebook-05 module in float32. An
    implementation that disagrees gets ``status="wrong"`` and is not timed; one that raises gets
    ``status="error"``; the rest are timed with :func:`time_fn`.
    """
    device, dtype = torch.device(config.device), _dtype(config.dtype)
    environment = {
        "device": describe_device(device),
        "device_type": device.type,
        "dtype": config.dtype,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
        "peak_tflops": peak_tflops(device, dtype),
        "peak_source": (gpu_spec(device).source if gpu_spec(device) else None),
    }
    result = BenchResult(config, environment)
    modules = build_implementations(config, log)
    expected_module = modules["notebook05_mha"]
    gen = torch.Generator().manual_seed(0)
    for T in config.seq_lens:
        x = torch.randn(config.batch, T, config.d_model, generator=gen).to(device)
        expected = _expected_output(modules, x, dtype, log)
        x = x.to(dtype)
        fwd = attention_flops(config.batch, config.num_heads, T, config.head_dim, causal=True)
        for name, module in modules.items():
            try:
                with torch.no_grad():
                    got = module(x)
            except Exception as exc:  # noqa: BLE001 - out of memory included: reported, not fatal
                _free_memory(device)
                for mode in config.modes:
                    result.rows.append(BenchRow(name, mode, T, "error", message=f"{type(exc).__name__}: {exc}"[:200]))
                continue
            problem = verify(expected, got)
            if problem:
                for mode in config.modes:
                    result.rows.append(BenchRow(name, mode, T, "wrong", message=problem[:200]))
                continue
            for mode in config.modes:
                result.rows.append(_measure(name, module, x, mode, fwd, device, dtype, config))
        log(f"T={T}: done")
    return result


def _expected_output(modules: dict[str, nn.Module], x: torch.Tensor, dtype: torch.dtype,
                     log: Callable[[str], None]) -> torch.Tensor:
    """The notebook-05 module's output in float32; if its (T, T) matrices do not fit in memory,
    the SDPA module's output in float32 (both were checked against each other at smaller T)."""
    for name in ("notebook05_mha", "sdpa_is_causal"):
        module = modules[name]
        try:
            with torch.no_grad():
                return module.float()(x)
        except torch.cuda.OutOfMemoryError:
            _free_memory(x.device)
            log(f"T={x.shape[1]}: {name} in float32 ran out of memory for the expected output; trying the next")
        finally:
            module.to(dtype)
    raise RuntimeError(f"no reference output fits in memory at T={x.shape[1]}")


def _free_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _measure(name, module, x, mode, fwd_flops, device, dtype, config) -> BenchRow:
    if mode == "inference":
        def step():
            with torch.no_grad():
                return module(x)
        flops = fwd_flops
    elif mode == "training":
        xg = x.detach().clone().requires_grad_(True)

        def step():
            out = module(xg)
            out.float().sum().backward()
            return out
        flops = training_flops(fwd_flops)
    else:
        raise ValueError(f"mode must be 'inference' or 'training', got {mode!r}")
    try:
        timing = time_fn(step, device=device, warmup=config.warmup, repeats=config.repeats)
        memory = peak_memory(step, device)
    except NotImplementedError as exc:  # e.g. FlexAttention has no backward on a CPU
        return BenchRow(name, mode, x.shape[1], "skipped", message=f"not supported here: {exc}"[:200])
    except Exception as exc:  # noqa: BLE001 - out of memory included: reported, not fatal
        _free_memory(device)
        return BenchRow(name, mode, x.shape[1], "error", message=f"{type(exc).__name__}: {exc}"[:200])
    finally:
        module.zero_grad(set_to_none=True)
    achieved = tflops_per_s(flops, timing.median_s)
    return BenchRow(name, mode, x.shape[1], "ok", timing.median_ms, 1e3 * min(timing.times_s), flops, achieved,
                    percent_of_peak(achieved, peak_tflops(device, dtype)), memory.peak_bytes)


def format_table(result: BenchResult, mode: str, baseline: str = "sdpa_is_causal") -> str:
    """Median ms per implementation (rows) and T (columns), plus each one's time relative to
    ``baseline`` at the largest T (``2.0x`` = twice as slow)."""
    rows = [r for r in result.rows if r.mode == mode]
    seq_lens = sorted({r.seq_len for r in rows})
    impls = list(dict.fromkeys(r.impl for r in rows))
    cell = {(r.impl, r.seq_len): r for r in rows}
    t_max = seq_lens[-1] if seq_lens else 0
    base = cell.get((baseline, t_max))
    header = f"{'implementation':24s}" + "".join(f"{'T=' + str(t):>11s}" for t in seq_lens) + f"{'vs SDPA @T=' + str(t_max):>17s}"
    lines = [f"{mode} (median ms; TFLOP/s at T={t_max} in brackets)", header, "-" * len(header)]
    for impl in impls:
        line = f"{impl:24s}"
        for t in seq_lens:
            r = cell.get((impl, t))
            line += f"{(f'{r.median_ms:.3f}' if r and r.status == 'ok' else (r.status.upper() if r else '-')):>11s}"
        r = cell.get((impl, t_max))
        if r and r.status == "ok" and base and base.status == "ok":
            line += f"{r.median_ms / base.median_ms:>8.2f}x [{r.tflops:.3g}]".rjust(17)
        elif r and r.status != "ok":
            line += f"  {r.message[:60]}"
        lines.append(line)
    return "\n".join(lines)


def plot_results(result: BenchResult, path: Path) -> None:
    """Median time vs T, log-log, one panel per mode; saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    modes = list(dict.fromkeys(r.mode for r in result.rows))
    fig, axes = plt.subplots(1, max(1, len(modes)), figsize=(6 * max(1, len(modes)), 4.5), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        rows = [r for r in result.rows if r.mode == mode and r.status == "ok"]
        for impl in dict.fromkeys(r.impl for r in rows):
            pts = sorted((r.seq_len, r.median_ms) for r in rows if r.impl == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel("median time (ms)")
        ax.set_title(f"{mode}: {result.environment['device']}, {result.environment['dtype']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def default_config(device: torch.device, dtype: str | None = None) -> BenchConfig:
    """Sizes that finish in a few minutes: GPT-2-small-like on a GPU, smaller on a CPU."""
    if device.type == "cuda":
        # BF16 needs Ampere (compute capability 8) or newer; a T4 (7.5) gets FP16.
        chosen = dtype or ("bfloat16" if torch.cuda.get_device_capability(device)[0] >= 8 else "float16")
        return BenchConfig(str(device), chosen, batch=8, d_model=768, num_heads=12, seq_lens=[256, 512, 1024, 2048, 4096],
                           modes=["inference", "training"], warmup=5, repeats=20)
    return BenchConfig(str(device), dtype or "float32", batch=2, d_model=256, num_heads=8,
                       seq_lens=[128, 256, 512, 1024], modes=["inference", "training"], warmup=2, repeats=5)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: ``python -m course_utils.bench [--out DIR] ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.bench",
        description="Check, then time, every attention implementation of notebook 06 over a sweep of "
                    "sequence lengths; write attention_bench.json and attention_bench.png into --out.",
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT}/)")
    parser.add_argument("--device", default=None, help="cpu, cuda, mps (default: the best available)")
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                        help="default: bfloat16 (or float16) on a GPU, float32 on a CPU")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=None, help="sequence lengths to sweep")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--d-model", type=int, default=None)
    parser.add_argument("--num-heads", type=int, default=None)
    parser.add_argument("--modes", nargs="+", default=None, choices=["inference", "training"])
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for PyTorch (torch.set_num_threads); 1 is steadier on a busy machine")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd versions (slow to compile on a CPU)")
    parser.add_argument("--broken-demo", action="store_true",
                        help="add a deliberately wrong implementation to show that it is reported, not timed")
    args = parser.parse_args(argv)

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = get_device(args.device)
    config = default_config(device, args.dtype)
    for attr in ("seq_lens", "batch", "d_model", "num_heads", "modes", "warmup", "repeats"):
        value = getattr(args, attr)
        if value is not None:
            setattr(config, attr, value)
    config.compile, config.broken_demo = args.compile, args.broken_demo
    check_heads_divide(config.d_model, config.num_heads)
    torch.manual_seed(0)

    print(f"device: {describe_device(device)}, dtype {config.dtype}, torch {torch.__version__}")
    print(f"batch {config.batch}, d_model {config.d_model}, heads {config.num_heads} (head_dim {config.head_dim}), "
          f"T in {config.seq_lens}, {config.warmup} warm-up + median of {config.repeats}")
    result = run_benchmark(config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "attention_bench.json", out / "attention_bench.png"
    json_path.write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    plot_results(result, png_path)
    for mode in config.modes:
        print()
        print(format_table(result, mode))
    print()
    for status, what in (("wrong", "not timed, output differs from the reference"), ("error", "not timed, raised an error"),
                         ("skipped", "not timed, not supported on this device")):
        names = sorted({r.impl for r in result.rows if r.status == status})
        if names:
            print(f"{what}: {', '.join(names)}")
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
