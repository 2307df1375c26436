"""Helpers for notebook 10 (the FlashAttention backward pass) that are not an exercise's answer.

- :func:`saved_for_backward`: every tensor that autograd keeps for the backward pass of a call,
  measured with ``torch.autograd.graph.saved_tensors_hooks``;
- :func:`peak_memory_with_backward`: the peak bytes of tensors alive during a forward **and**
  backward pass, on any device (notebook 07's :class:`~course_utils.checks.tensors.TensorWatcher`,
  with autograd on);
- :func:`swap_attention_core`: notebook 09's ``TinyGPT`` with the attention core of every block
  (scores, mask, softmax, weights times values) replaced by any ``core(q, k, v)``, the same weights
  kept: how the capstone trains on your own ``FlashAttention``.

The answers (``flash_attention_backward``, ``FlashAttention``) are in the notebook, never here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn

from course_utils.checks.tensors import TensorWatcher

__all__ = ["Saved", "saved_for_backward", "peak_memory_with_backward", "CoreAttention", "swap_attention_core",
           "launch_backward"]


@dataclass(frozen=True)
class Saved:
    """One tensor kept for the backward pass: its shape, dtype and bytes (shared storage counted once)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    is_input: bool

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.shape} {dtype}{' (an input)' if self.is_input else ''}"


def saved_for_backward(fn: Callable[..., Any], *inputs: torch.Tensor, **kwargs: Any) -> list[Saved]:
    """Every tensor that autograd keeps while ``fn(*inputs, **kwargs)`` runs, for its backward pass.

    The inputs are made to require gradients (copies: the caller's tensors are untouched). A tensor
    saved twice, or a view of one already saved, is listed once; its bytes are those of its storage.
    ``is_input`` tells the inputs apart from the tensors made by the forward pass.
    """
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    input_storages = {t.untyped_storage().data_ptr() for t in leaves}
    found: dict[int, Saved] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in found:
            found[storage.data_ptr()] = Saved(tuple(tensor.shape), tensor.dtype, storage.nbytes(),
                                              storage.data_ptr() in input_storages)
        return tensor

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn(*leaves, **kwargs)
    return list(found.values())


def peak_memory_with_backward(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor, **kwargs: Any) -> int:
    """Peak bytes held at once by the tensors made while ``fn(*inputs, **kwargs)`` runs and then its
    backward pass (with a gradient of ones for the output): the inputs are not counted, the output
    and the gradients are. Notebook 07's :func:`course_utils.flash.measure_peak_memory` measures a
    forward pass without autograd; this one keeps autograd on, so what the forward saves counts."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    watcher = TensorWatcher(with_lines=False)
    with torch.enable_grad(), watcher:
        out = fn(*leaves, **kwargs)
        out.backward(torch.ones_like(out))
        del out
    return watcher.peak_bytes


class CoreAttention(nn.Module):
    """Notebook 05's ``MultiHeadAttention`` with its core replaced: ``(b, T, d_in) -> (b, T, d_out)``.

    Keeps ``att``'s own ``W_query``, ``W_key``, ``W_value`` and ``out_proj`` (the same parameters, in
    the same order, so an optimizer and a saved state see no difference) and its ``num_heads`` and
    ``head_dim``; between the projections and ``out_proj`` it calls ``core(q, k, v)`` on
    ``(b, H, T, D)`` tensors, which must return causal attention's output ``(b, H, T, D)``. The core
    has no dropout, so ``att`` must have none (``dropout=0.0``).
    """

    def __init__(self, att: nn.Module, core: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]):
        super().__init__()
        for name in ("W_query", "W_key", "W_value", "out_proj", "num_heads", "head_dim"):
            if not hasattr(att, name):
                raise TypeError(f"the attention module has no {name!r}: CoreAttention needs notebook 05's "
                                f"MultiHeadAttention (W_query, W_key, W_value, out_proj, num_heads, head_dim)")
        dropout = getattr(att, "dropout", None)
        if isinstance(dropout, nn.Dropout) and dropout.p > 0:
            raise ValueError(f"the attention module has dropout {dropout.p}, and the new core has none: build the "
                             f"model with dropout=0.0")
        self.W_query, self.W_key, self.W_value, self.out_proj = att.W_query, att.W_key, att.W_value, att.out_proj
        self.num_heads, self.head_dim = att.num_heads, att.head_dim
        self.core = core

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, T, _ = x.shape
        heads = (b, T, self.num_heads, self.head_dim)
        q = self.W_query(x).view(heads).transpose(1, 2)  # (b, H, T, D)
        k = self.W_key(x).view(heads).transpose(1, 2)  # (b, H, T, D)
        v = self.W_value(x).view(heads).transpose(1, 2)  # (b, H, T, D)
        context = self.core(q, k, v)  # (b, H, T, D)
        return self.out_proj(context.transpose(1, 2).reshape(b, T, self.num_heads * self.head_dim))  # (b, T, d_out)


def swap_attention_core(model: nn.Module, core: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
                        ) -> nn.Module:
    """``model`` (a ``TinyGPT``: ``model.blocks``, each with ``.att``) with every block's attention core
    replaced by ``core(q, k, v)`` (see :class:`CoreAttention`); the weights are kept. Returns ``model``."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise TypeError("swap_attention_core needs a model with .blocks, each with .att (notebook 09's TinyGPT)")
    for block in blocks:
        block.att = CoreAttention(block.att, core)
    return model


# --------------------------------------------------------------------------------------------
# Triton: the host side of the backward kernel for dK and dV
# --------------------------------------------------------------------------------------------
def launch_backward(kernel: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                    lse: torch.Tensor, do: torch.Tensor, causal: bool = True, block_m: int = 16,
                    block_n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the notebook's Triton backward kernel for ``dk`` and ``dv``: ``(..., T, D)`` tensors and the
    forward's ``lse`` ``(..., T)``.

    The host side: ``delta = rowsum(do * o)`` ``(BH, T)`` in float32, every tensor flattened to
    ``(BH, T, D)`` and made contiguous (one pair of strides for all), ``dk`` and ``dv`` allocated, and one
    program launched per block of ``block_n`` keys and per (batch, head): the grid ``(cdiv(T, block_n),
    BH)``. Returns ``(dk, dv)``, shaped like ``k`` and ``v``. On a CPU the kernel runs in Triton's
    interpreter (see :func:`course_utils.flash.use_interpreter_without_gpu`).
    """
    from course_utils import flash

    if q.dim() < 2 or any(t.shape != q.shape for t in (k, v, o, do)):
        raise ValueError(f"q, k, v, o and do must have the same shape (..., T, D), got "
                         f"{[tuple(t.shape) for t in (q, k, v, o, do)]}")
    if lse.shape != q.shape[:-1]:
        raise ValueError(f"lse must have shape (..., T) = {tuple(q.shape[:-1])}, got {tuple(lse.shape)}")
    T, D = flash.check_launch(q, block_m, block_n)
    run = flash._jitted(kernel)
    # Each in a buffer with NaN after its last row, as flash.launch's: a kernel that reads past the end reads that
    # NaN, the same on every run, never whatever the memory held. The row statistics' NaN reaches as far as q's
    # heads do: a row of lse or delta offset by the stride of q's heads (bh * stride_b, not bh * T) reads NaN too.
    pad = (-(-T // block_m) + 1) * max(block_m, block_n)
    q3, k3, v3, do3 = (flash._padded(t.reshape(-1, T, D), pad) for t in (q, k, v, do))  # (BH, T, D)
    delta, lse2 = (flash._padded(t.reshape(-1, T, 1), q3.numel() + pad).view(-1, T)  # (BH, T) each
                   for t in ((do.float() * o.float()).sum(dim=-1), lse.float()))
    dk, dv = (torch.full_like(t, float("nan")) for t in (k3, v3))  # (BH, T, D), NaN until written (flash.launch)
    grid = (-(-T // block_n), q3.shape[0])
    run[grid](q3, k3, v3, do3, lse2, delta, dk, dv, q3.stride(0), q3.stride(1), T, 1.0 / D ** 0.5,
              HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal))
    return dk.reshape(k.shape), dv.reshape(v.shape)
