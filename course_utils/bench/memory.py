"""Memory: the peak a call allocates, and the size of the (T, T) score matrix."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from course_utils.bench.timing import synchronize


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
