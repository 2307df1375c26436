"""Measuring attention: timing, FLOP arithmetic, throughput, GPU peaks, memory, and the
correctness gate. Used by notebook 06.

Nothing here is an exercise's answer: the attention implementations that the benchmark compares,
and the benchmark runner, are in the instructor edition (``course_utils.instructor.bench_impls``;
notebook 06 shows the comparison classes it uses). ``python -m course_utils.bench --out DIR``
(``make bench``) runs that benchmark where the instructor edition is installed, and says so where
it is not.

Timing rules this module follows (notebook 06 explains why):
    1. warm up first (the first calls pay for allocation, kernel selection and compilation);
    2. synchronise the GPU before reading a clock (CUDA kernels run asynchronously), or use CUDA
       events, which are timestamps recorded on the GPU itself;
    3. report the median of several repeats, which one slow outlier cannot move.

Shape letters: ``b`` batch, ``T`` tokens, ``d`` model size, ``H`` heads, ``D`` head size.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils.checks.core import tensor_difference

__all__ = [
    "Timing",
    "synchronize",
    "time_fn",
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
    "causal_mask_mod",
    "copy_weights",
    "main",
]


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
    """An implementation's output differs from the expected one, so it is not timed."""


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
# FlexAttention, and weights shared between implementations
# --------------------------------------------------------------------------------------------
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
        block_mask = create_block_mask(causal_mask_mod, None, None, 128, 128, device=device)
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


def causal_mask_mod(b, h, q_idx, kv_idx):
    """FlexAttention ``mask_mod``: True where query ``q_idx`` may see key ``kv_idx`` (not a later one)."""
    return q_idx >= kv_idx


def copy_weights(source: nn.Module, target: nn.Module) -> nn.Module:
    """Give ``target`` the weights of ``source``, a notebook-05 style ``MultiHeadAttention``
    (``W_query``, ``W_key``, ``W_value``, ``out_proj``), so that both compute the same function.

    Handles targets with separate projections (``W_query``...), a combined ``qkv`` layer (rows
    ``[W_query; W_key; W_value]``), and a wrapper of ``nn.MultiheadAttention`` kept in
    ``target.multihead_attn`` (``MHAPyTorchClass``). Returns ``target``.
    """
    ws = [getattr(source, n).weight for n in ("W_query", "W_key", "W_value")]
    bs = [getattr(source, n).bias for n in ("W_query", "W_key", "W_value")]
    with torch.no_grad():
        if hasattr(target, "W_query"):
            target.load_state_dict(source.state_dict())
            return target
        if isinstance(getattr(target, "multihead_attn", None), nn.MultiheadAttention):
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
# The benchmark command
# --------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_utils.bench [--out DIR] ...``: the benchmark of notebook 06's implementations.

    The runner compares the exercises' answers, so it lives in the instructor edition
    (``course_utils.instructor.bench_impls``); it is imported only here, when the command runs.
    Where it is missing (the student edition), exit with a one-line message.
    """
    try:
        from course_utils.instructor.bench_impls import main as run
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("course_utils.instructor"):
            raise
        raise SystemExit(
            "python -m course_utils.bench: the benchmark runner is part of the instructor edition of the "
            "course; notebook 06 times the implementations itself."
        ) from None
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
