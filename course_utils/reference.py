"""Reference implementations of every graded exercise in the course.

These are the answers. They are written to be read by students after the deadline: one idea per
line, every tensor's shape in a comment. The classes follow the constructor signatures and the
parameter creation order of chapter 3 of *Build a Large Language Model (From Scratch)*, so that
``torch.manual_seed(123)`` followed by a constructor gives the same weights, and the same printed
numbers, as the book.

Shape letters used in comments:
    b  batch size             T  number of tokens (Tq queries, Tk keys)
    d  embedding size         d_in / d_out  input / output size of a projection
    H  number of heads        D  size of one head (d_out // H)
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils.validation import (
    check_heads_divide,
    check_input_3d,
    check_last_dim,
    check_rank_at_least,
    check_same_last_dim,
)

__all__ = [
    "dot",
    "attention_scores_for_query",
    "attention_scores",
    "softmax_naive",
    "softmax_stable",
    "context_vectors",
    "scaled_dot_product_attention",
    "SelfAttention_v1",
    "SelfAttention_v2",
    "copy_v2_weights_to_v1",
    "causal_mask",
    "causal_attention_weights",
    "CausalAttention",
    "MultiHeadAttentionWrapper",
    "split_heads",
    "merge_heads",
    "MultiHeadAttention",
    "MultiHeadAttentionEinsum",
    "MultiHeadAttentionCombinedQKV",
    "MHAPyTorchSDPA",
    "count_parameters",
    "attention_flops",
]


# --------------------------------------------------------------------------------------------
# Notebook 01: dot products
# --------------------------------------------------------------------------------------------
def dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Dot product of two 1-D tensors, with an explicit loop.

    Args:
        x: ``(n,)``.
        y: ``(n,)``.

    Returns:
        A 0-dim tensor: ``sum_i x[i] * y[i]``.
    """
    if x.dim() != 1 or y.dim() != 1:
        raise ValueError(f"dot expects two 1-D tensors, got shapes {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"dot expects tensors of equal length, got {x.shape[0]} and {y.shape[0]}")
    total = torch.zeros((), dtype=torch.promote_types(x.dtype, y.dtype), device=x.device)
    for i in range(x.shape[0]):
        total = total + x[i] * y[i]
    return total


def attention_scores_for_query(inputs: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """Unnormalised attention scores of one query against every input token.

    Args:
        inputs: ``(T, d)`` token embeddings.
        query: ``(d,)`` the query vector.

    Returns:
        ``(T,)``: ``scores[i] = inputs[i] . query``.
    """
    check_rank_at_least(inputs, 2, "inputs")
    if inputs.dim() != 2:
        raise ValueError(f"inputs must have shape (T, d), got {tuple(inputs.shape)}")
    if query.dim() != 1:
        raise ValueError(f"query must have shape (d,), got {tuple(query.shape)}")
    check_last_dim(query, inputs.shape[-1], "query")
    return inputs @ query  # (T, d) @ (d,) -> (T,)


def attention_scores(inputs: torch.Tensor) -> torch.Tensor:
    """Every pair's dot product: ``scores[..., i, j] = inputs[..., i, :] . inputs[..., j, :]``.

    Args:
        inputs: ``(..., T, d)``.

    Returns:
        ``(..., T, T)``.
    """
    check_rank_at_least(inputs, 2, "inputs")
    return inputs @ inputs.transpose(-2, -1)  # (..., T, d) @ (..., d, T) -> (..., T, T)


# --------------------------------------------------------------------------------------------
# Notebook 02: softmax and context vectors
# --------------------------------------------------------------------------------------------
def softmax_naive(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax straight from the formula ``exp(x) / sum(exp(x))``. Overflows for large ``x``.

    Args:
        x: any shape.
        dim: the dimension that sums to one.

    Returns:
        Same shape as ``x``.
    """
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def softmax_stable(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax that subtracts the maximum first, so ``exp`` never sees a positive number.

    ``softmax(x) == softmax(x - c)`` for any constant ``c``; with ``c = max(x)`` every exponent is
    ``<= 0`` and at least one is exactly ``0``, so nothing overflows and the sum is at least 1.
    Entries equal to ``-inf`` get weight 0.

    Args:
        x: any shape.
        dim: the dimension that sums to one.

    Returns:
        Same shape as ``x``.
    """
    x_max = x.amax(dim=dim, keepdim=True)
    # A slice that is entirely -inf has max -inf; subtracting it would give nan. Shift by 0 there.
    x_max = torch.where(torch.isfinite(x_max), x_max, torch.zeros_like(x_max))
    e = torch.exp(x - x_max)
    return e / e.sum(dim=dim, keepdim=True)


def context_vectors(inputs: torch.Tensor) -> torch.Tensor:
    """Simplified self-attention with no trainable weights.

    Args:
        inputs: ``(..., T, d)``.

    Returns:
        ``(..., T, d)``: row ``i`` is the softmax(scores[i])-weighted average of all inputs.
    """
    check_rank_at_least(inputs, 2, "inputs")
    scores = inputs @ inputs.transpose(-2, -1)  # (..., T, T)
    weights = torch.softmax(scores, dim=-1)  # (..., T, T), each row sums to 1
    return weights @ inputs  # (..., T, T) @ (..., T, d) -> (..., T, d)


# --------------------------------------------------------------------------------------------
# Notebook 03: trainable self-attention
# --------------------------------------------------------------------------------------------
def scaled_dot_product_attention(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
) -> torch.Tensor:
    """``softmax(Q K^T / sqrt(d_k)) V`` with no mask.

    Args:
        queries: ``(..., Tq, dk)``.
        keys: ``(..., Tk, dk)``.
        values: ``(..., Tk, dv)``.

    Returns:
        ``(..., Tq, dv)``.
    """
    for name, t in (("queries", queries), ("keys", keys), ("values", values)):
        check_rank_at_least(t, 2, name)
    check_same_last_dim(queries, keys, "queries", "keys")
    if keys.shape[-2] != values.shape[-2]:
        raise ValueError(
            f"keys and values must have the same number of tokens, got {keys.shape[-2]} and {values.shape[-2]}"
        )
    d_k = keys.shape[-1]
    scores = queries @ keys.transpose(-2, -1)  # (..., Tq, Tk)
    weights = torch.softmax(scores / math.sqrt(d_k), dim=-1)  # (..., Tq, Tk)
    return weights @ values  # (..., Tq, dv)


class SelfAttention_v1(nn.Module):
    """Self-attention with raw ``nn.Parameter`` weight matrices (the book's listing 3.1).

    Input ``(..., T, d_in)``, output ``(..., T, d_out)``.
    """

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.d_in = d_in
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))  # (d_in, d_out)
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_rank_at_least(x, 2, "x")
        check_last_dim(x, self.d_in, "x")
        queries = x @ self.W_query  # (..., T, d_out)
        keys = x @ self.W_key
        values = x @ self.W_value
        return scaled_dot_product_attention(queries, keys, values)


class SelfAttention_v2(nn.Module):
    """Self-attention with ``nn.Linear`` projections (the book's listing 3.2).

    Input ``(..., T, d_in)``, output ``(..., T, d_out)``.
    """

    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False):
        super().__init__()
        self.d_in = d_in
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)  # weight: (d_out, d_in)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_rank_at_least(x, 2, "x")
        check_last_dim(x, self.d_in, "x")
        return scaled_dot_product_attention(self.W_query(x), self.W_key(x), self.W_value(x))


def copy_v2_weights_to_v1(sa_v2: SelfAttention_v2, sa_v1: SelfAttention_v1) -> None:
    """Exercise 3.1: make ``sa_v1`` compute exactly what ``sa_v2`` computes.

    ``nn.Linear`` stores its weight as ``(d_out, d_in)`` and computes ``x @ weight.T``;
    ``SelfAttention_v1`` computes ``x @ W`` with ``W`` of shape ``(d_in, d_out)``. So ``W = weight.T``.
    The v2 module must have no biases (v1 has nowhere to put them).
    """
    for name in ("W_query", "W_key", "W_value"):
        linear = getattr(sa_v2, name)
        if linear.bias is not None:
            raise ValueError("copy_v2_weights_to_v1 needs sa_v2 built with qkv_bias=False: v1 has no bias")
        target = getattr(sa_v1, name)
        if target.shape != linear.weight.T.shape:
            raise ValueError(
                f"{name}: v1 expects shape {tuple(target.shape)}, v2's transposed weight is {tuple(linear.weight.T.shape)}"
            )
        with torch.no_grad():
            target.copy_(linear.weight.T)


# --------------------------------------------------------------------------------------------
# Notebook 04: causal attention
# --------------------------------------------------------------------------------------------
def causal_mask(num_tokens: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean ``(T, T)`` mask, True strictly above the diagonal: the future a token must not see.

    Row ``i`` is the query at position ``i``; column ``j > i`` is a later token.
    """
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be at least 1, got {num_tokens}")
    return torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device), diagonal=1)


def causal_attention_weights(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Scaled, causally masked, softmaxed attention weights.

    Args:
        queries: ``(..., T, dk)``.
        keys: ``(..., T, dk)``.

    Returns:
        ``(..., T, T)``: row ``i`` sums to 1 and is 0 for every column ``j > i``.
    """
    check_rank_at_least(queries, 2, "queries")
    check_rank_at_least(keys, 2, "keys")
    check_same_last_dim(queries, keys, "queries", "keys")
    T = queries.shape[-2]
    if keys.shape[-2] != T:
        raise ValueError(f"causal attention needs as many keys as queries, got {keys.shape[-2]} and {T}")
    scores = queries @ keys.transpose(-2, -1)  # (..., T, T)
    scores = scores.masked_fill(causal_mask(T, device=scores.device), float("-inf"))
    return torch.softmax(scores / math.sqrt(keys.shape[-1]), dim=-1)


class CausalAttention(nn.Module):
    """Single-head causal self-attention with dropout (the book's listing 3.3).

    Input ``(b, T, d_in)`` with ``T <= context_length``, output ``(b, T, d_out)``.
    The mask is a buffer: it is saved in ``state_dict`` and follows ``.to(device)``.
    """

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, qkv_bias: bool = False):
        super().__init__()
        self.d_in = d_in
        self.d_out = d_out
        self.context_length = context_length
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", causal_mask(context_length))  # (context_length, context_length)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, num_tokens, _ = check_input_3d(x, self.d_in, self.context_length)
        queries = self.W_query(x)  # (b, T, d_out)
        keys = self.W_key(x)
        values = self.W_value(x)
        scores = queries @ keys.transpose(1, 2)  # (b, T, T)
        scores = scores.masked_fill(self.mask[:num_tokens, :num_tokens], float("-inf"))
        weights = torch.softmax(scores / math.sqrt(keys.shape[-1]), dim=-1)
        weights = self.dropout(weights)  # only active in training mode
        return weights @ values  # (b, T, d_out)


# --------------------------------------------------------------------------------------------
# Notebook 05: multi-head attention
# --------------------------------------------------------------------------------------------
class MultiHeadAttentionWrapper(nn.Module):
    """``num_heads`` independent ``CausalAttention`` heads, outputs concatenated on the last dim.

    Input ``(b, T, d_in)``, output ``(b, T, num_heads * d_out)``: here ``d_out`` is the size of ONE head.
    """

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int, qkv_bias: bool = False
    ):
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"num_heads must be at least 1, got {num_heads}")
        self.heads = nn.ModuleList(
            [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([head(x) for head in self.heads], dim=-1)


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(b, T, d)`` -> ``(b, num_heads, T, d // num_heads)``: head ``h`` gets columns ``h*D:(h+1)*D``."""
    if x.dim() != 3:
        raise ValueError(f"split_heads expects (b, T, d), got shape {tuple(x.shape)}")
    b, T, d = x.shape
    check_heads_divide(d, num_heads)
    return x.view(b, T, num_heads, d // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(b, H, T, D)`` -> ``(b, T, H * D)``, the inverse of :func:`split_heads`."""
    if x.dim() != 4:
        raise ValueError(f"merge_heads expects (b, num_heads, T, head_dim), got shape {tuple(x.shape)}")
    b, H, T, D = x.shape
    return x.transpose(1, 2).contiguous().view(b, T, H * D)


class MultiHeadAttention(nn.Module):
    """Multi-head causal attention with split weights (the book's listing 3.5).

    Input ``(b, T, d_in)`` with ``T <= context_length``, output ``(b, T, d_out)``.
    ``d_out`` is the TOTAL output size; each of the ``num_heads`` heads has ``d_out // num_heads``.
    """

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int, qkv_bias: bool = False
    ):
        super().__init__()
        check_heads_divide(d_out, num_heads)
        self.d_in = d_in
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.context_length = context_length
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)  # mixes the heads' outputs
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", causal_mask(context_length))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, num_tokens, _ = check_input_3d(x, self.d_in, self.context_length)
        queries = split_heads(self.W_query(x), self.num_heads)  # (b, H, T, D)
        keys = split_heads(self.W_key(x), self.num_heads)
        values = split_heads(self.W_value(x), self.num_heads)
        scores = queries @ keys.transpose(2, 3)  # (b, H, T, T)
        scores = scores.masked_fill(self.mask[:num_tokens, :num_tokens], float("-inf"))
        weights = torch.softmax(scores / math.sqrt(self.head_dim), dim=-1)
        weights = self.dropout(weights)
        context = merge_heads(weights @ values)  # (b, H, T, D) -> (b, T, d_out)
        return self.out_proj(context)


def count_parameters(module: nn.Module) -> int:
    """Number of trainable parameters (``requires_grad=True``) of ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


# --------------------------------------------------------------------------------------------
# Notebook 06: efficient attention
# --------------------------------------------------------------------------------------------
class MultiHeadAttentionEinsum(MultiHeadAttention):
    """Same computation as :class:`MultiHeadAttention`, written with ``torch.einsum``.

    Input ``(b, T, d_in)``, output ``(b, T, d_out)``. It inherits the constructor, so parameters
    are created in the same order with the same shapes and a ``state_dict`` loads either way;
    only ``forward`` differs: the einsum strings name every axis instead of ``view``/``transpose``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, T, _ = check_input_3d(x, self.d_in, self.context_length)
        H, D = self.num_heads, self.head_dim
        q = self.W_query(x).view(b, T, H, D)
        k = self.W_key(x).view(b, T, H, D)
        v = self.W_value(x).view(b, T, H, D)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k)  # (b, H, T, T)
        scores = scores.masked_fill(self.mask[:T, :T], float("-inf"))
        weights = self.dropout(torch.softmax(scores / math.sqrt(D), dim=-1))
        context = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, T, self.d_out)
        return self.out_proj(context)


class MultiHeadAttentionCombinedQKV(nn.Module):
    """Multi-head causal attention with one ``(d_in -> 3 * d_out)`` projection for Q, K and V.

    Input ``(b, T, d_in)``, output ``(b, T, d_out)``. One matrix multiply instead of three.
    """

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int, qkv_bias: bool = False
    ):
        super().__init__()
        check_heads_divide(d_out, num_heads)
        self.d_in = d_in
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.context_length = context_length
        self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)  # weight: (3 * d_out, d_in)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", causal_mask(context_length))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, T, _ = check_input_3d(x, self.d_in, self.context_length)
        qkv = self.qkv(x)  # (b, T, 3 * d_out)
        qkv = qkv.view(b, T, 3, self.num_heads, self.head_dim)  # (b, T, 3, H, D)
        qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, b, H, T, D)
        queries, keys, values = qkv.unbind(0)  # each (b, H, T, D)
        scores = queries @ keys.transpose(-2, -1)  # (b, H, T, T)
        scores = scores.masked_fill(self.mask[:T, :T], float("-inf"))
        weights = self.dropout(torch.softmax(scores / math.sqrt(self.head_dim), dim=-1))
        context = merge_heads(weights @ values)  # (b, T, d_out)
        return self.out_proj(context)


class MHAPyTorchSDPA(nn.Module):
    """Multi-head causal attention that hands the core to ``F.scaled_dot_product_attention``.

    Input ``(b, T, d_in)``, output ``(b, T, d_out)``. ``is_causal=True`` lets PyTorch pick a fused
    kernel (FlashAttention, memory-efficient or cuDNN on a GPU) that never stores the ``(T, T)``
    matrix, so this module keeps no mask buffer; ``context_length`` is still enforced.
    """

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int, qkv_bias: bool = False
    ):
        super().__init__()
        check_heads_divide(d_out, num_heads)
        self.d_in = d_in
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.context_length = context_length
        self.dropout = dropout  # a probability: SDPA applies dropout itself
        self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, T, _ = check_input_3d(x, self.d_in, self.context_length)
        qkv = self.qkv(x).view(b, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        queries, keys, values = qkv.unbind(0)  # each (b, H, T, D)
        dropout_p = self.dropout if self.training else 0.0
        context = F.scaled_dot_product_attention(queries, keys, values, dropout_p=dropout_p, is_causal=True)
        return self.out_proj(merge_heads(context))  # (b, T, d_out)


def attention_flops(batch: int, num_heads: int, seq_len: int, head_dim: int, causal: bool = True) -> int:
    """Forward FLOPs of the attention core (``Q K^T`` and ``weights @ V``), projections excluded.

    Each of the two matrix products does ``B * H * T * T * D`` multiply-adds, 2 FLOPs each:
    ``4 * B * H * T^2 * D`` in all. A causal kernel can skip the masked half.
    """
    for name, value in (("batch", batch), ("num_heads", num_heads), ("seq_len", seq_len), ("head_dim", head_dim)):
        if int(value) != value or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    flops = 4 * batch * num_heads * seq_len * seq_len * head_dim
    return flops // 2 if causal else flops


# --------------------------------------------------------------------------------------------
# Notebook 07: FlashAttention from scratch
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Notebook 08: KV cache, grouped-query attention and sliding windows
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Notebook 09: the capstone, a tiny causal transformer
# --------------------------------------------------------------------------------------------
