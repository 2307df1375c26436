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
    "split_qkv",
    "MultiHeadAttentionCombinedQKV",
    "MHAPyTorchSDPA",
    "count_parameters",
    "attention_flops",
    "time_cuda_aware",
    "online_softmax",
    "flash_attention_forward",
    "flash_attention_triton",
    "decode_causal_mask",
    "MultiHeadAttentionKVCache",
    "repeat_kv",
    "GroupedQueryAttention",
    "sliding_window_mask",
    "sliding_window_mask_mod",
    "rope_angles",
    "apply_rope",
    "sinusoidal_positions",
    "LearnedPositionalEmbedding",
    "TransformerBlock",
    "TinyGPT",
    "train_step",
    "generate",
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


def split_qkv(qkv: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One combined projection ``(b, T, 3 * d_out)`` -> queries, keys and values, each
    ``(b, num_heads, T, d_out // num_heads)``.

    The weight rows are stacked ``[W_query; W_key; W_value]`` (as ``nn.MultiheadAttention``'s
    ``in_proj_weight`` and GPT-2's ``c_attn`` are), so the last dimension splits as ``(3, H, D)``.
    """
    b, T, three_d = qkv.shape
    qkv = qkv.view(b, T, 3, num_heads, three_d // (3 * num_heads))  # (b, T, 3, H, D)
    return qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (3, b, H, T, D) -> 3 x (b, H, T, D)


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
        queries, keys, values = split_qkv(self.qkv(x), self.num_heads)  # each (b, H, T, D)
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
        queries, keys, values = split_qkv(self.qkv(x), self.num_heads)  # each (b, H, T, D)
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


def time_cuda_aware(fn, warmup: int = 3, repeats: int = 10) -> float:
    """Median wall time of ``fn()`` in seconds, over ``repeats`` timed calls after ``warmup`` untimed ones.

    A CUDA kernel launch returns before the GPU has done the work, so when CUDA is available the
    device is synchronised before the clock starts (nothing queued earlier is charged to this call)
    and before it stops (the work of this call is finished). On a CPU there is nothing to wait for.
    """
    import statistics
    import time

    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# --------------------------------------------------------------------------------------------
# Notebook 07: FlashAttention from scratch
# --------------------------------------------------------------------------------------------
try:  # the Triton kernel's body uses ``tl``; its annotations stay strings (``from __future__ import annotations``)
    import triton.language as tl
except ImportError:  # pragma: no cover - a machine without Triton still has every other answer
    tl = None


def _check_block(value: int, name: str, order: str = "") -> None:
    """A ``ValueError`` unless ``value`` is a positive int. A bool in a block size's place is most often the
    causal flag given in another function's argument order: ``order`` (the function's own) is then named."""
    if isinstance(value, bool) and order:
        raise ValueError(f"{name} must be a positive int, got {value!r}: the causal flag in a block size's place? "
                         f"The order is {order}, causal last (FlashAttention.apply takes causal before the block "
                         f"sizes: apply(q, k, v, causal, block_q, block_k))")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def online_softmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Softmax over the last dimension of ``x`` (any shape ``(..., n)``), streaming ``block_size``
    columns at a time.

    One pass keeps, for every row, the running maximum ``m`` and the running sum ``l`` of
    ``exp(x - m)``. When a block raises the maximum from ``m`` to ``m_new``, every term already in
    ``l`` was computed against the old maximum, so ``l`` is multiplied by ``exp(m - m_new)``: that
    is exact, ``exp(a - m) * exp(m - m_new) = exp(a - m_new)``. A second pass writes
    ``exp(x - m) / l``. Exact for large values and for ``-inf`` entries, like ``softmax_stable``.
    """
    _check_block(block_size, "block_size")
    check_rank_at_least(x, 1, "x")
    m = torch.full(x.shape[:-1] + (1,), float("-inf"), dtype=x.dtype, device=x.device)  # (..., 1)
    l = torch.zeros_like(m)  # (..., 1)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]  # (..., B)
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))  # (..., 1)
        # A row that has seen only -inf so far has m_new = -inf: shift by 0 there, not by -inf.
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # (..., 1)
        l = l * torch.exp(m - shift) + torch.exp(block - shift).sum(dim=-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l  # (..., n)


def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_q: int, block_k: int, causal: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention computed tile by tile, as FlashAttention-2 does.

    ``q`` is ``(..., T, D)``, ``k`` is ``(..., Tk, D)``, ``v`` is ``(..., Tk, Dv)`` (``Tk = T`` when
    ``causal``). Returns the output ``(..., T, Dv)`` and the log-sum-exp of each query's scaled
    scores ``(..., T)``, which the backward pass needs. No tensor larger than ``(..., block_q,
    block_k)`` is ever made: for each block of ``block_q`` queries, the key/value blocks stream past
    with a running maximum ``m``, sum ``l`` and unnormalised output ``acc`` (float32 at least,
    whatever the inputs' dtype; ``lse`` is returned in that dtype), each rescaled by
    ``exp(m_old - m_new)`` when the maximum grows. With ``causal=True``, key blocks that start after
    the block's last query are skipped (never computed); only blocks that cross the diagonal are masked.
    """
    order = "flash_attention_forward(q, k, v, block_q, block_k, causal)"
    _check_block(block_q, "block_q", order)
    _check_block(block_k, "block_k", order)
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        check_rank_at_least(t, 2, name)
    check_same_last_dim(q, k, "q", "k")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v need the same number of positions, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    T, D = q.shape[-2], q.shape[-1]
    Tk = k.shape[-2]
    if causal and Tk != T:
        raise ValueError(f"causal attention here needs as many keys as queries, got {T} queries and {Tk} keys")
    scale = 1.0 / math.sqrt(D)
    # The statistics and the accumulator in float32 at least: in bfloat16 a long running sum loses terms.
    stats = torch.promote_types(q.dtype, torch.float32)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    out = q.new_empty(batch + (T, v.shape[-1]))  # (..., T, Dv)
    lse = q.new_empty(batch + (T,), dtype=stats)  # (..., T)
    for q_start in range(0, T, block_q):
        q_end = min(q_start + block_q, T)
        q_blk = q[..., q_start:q_end, :].to(stats) * scale  # (..., Bq, D)
        m = torch.full(q_blk.shape[:-1], float("-inf"), dtype=stats, device=q.device)  # (..., Bq)
        l = torch.zeros_like(m)  # (..., Bq)
        acc = torch.zeros(q_blk.shape[:-1] + (v.shape[-1],), dtype=stats, device=q.device)  # (..., Bq, Dv)
        k_stop = q_end if causal else Tk  # a key block starting at q_end or later is wholly in the future
        for k_start in range(0, k_stop, block_k):
            k_end = min(k_start + block_k, Tk)
            s = q_blk @ k[..., k_start:k_end, :].to(stats).transpose(-2, -1)  # (..., Bq, Bk)
            if causal and k_end - 1 > q_start:  # the block crosses the diagonal: mask its future part
                rows = torch.arange(q_start, q_end, device=q.device)[:, None]  # (Bq, 1)
                cols = torch.arange(k_start, k_end, device=q.device)[None, :]  # (1, Bk)
                s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))  # (..., Bq)
            alpha = torch.exp(m - m_new)  # (..., Bq): rescales what was summed against the old maximum
            p = torch.exp(s - m_new[..., None])  # (..., Bq, Bk)
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ v[..., k_start:k_end, :].to(stats)  # (..., Bq, Dv)
            m = m_new
        out[..., q_start:q_end, :] = (acc / l[..., None]).to(out.dtype)
        lse[..., q_start:q_end] = m + torch.log(l)
    return out, lse


def flash_attention_triton(Q, K, V, O, LSE, stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt,
                           stride_ob, stride_ot, T, scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """The Triton kernel of FlashAttention-2's forward pass (undecorated: ``triton.jit`` it to run).

    One program computes ``BLOCK_M`` rows of the output for one (batch, head): ``Q``, ``K``, ``V``,
    ``O`` are ``(BH, T, HEAD_DIM)`` with a unit stride along ``HEAD_DIM``, ``LSE`` is ``(BH, T)``
    float32. Launch it on the grid ``(cdiv(T, BLOCK_M), BH)`` with ``course_utils.flash.launch``.
    The loop over key/value blocks is ``flash_attention_forward``'s inner loop, written with
    ``tl.load``, ``tl.dot`` and ``tl.where``; statistics and accumulator stay in float32.
    """
    start_m = tl.program_id(0)  # which block of queries
    bh = tl.program_id(1)  # which (batch, head)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
    offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    offs_d = tl.arange(0, HEAD_DIM)  # (HEAD_DIM,)
    q = tl.load(Q + bh * stride_qb + offs_m[:, None] * stride_qt + offs_d[None, :],
                mask=offs_m[:, None] < T, other=0.0)  # (BLOCK_M, HEAD_DIM)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running maximum
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # unnormalised output
    # Stage 1: the key blocks no query of this block can see past (causal: wholly before its first
    # query; not causal: the full blocks), with no mask at all. Stage 2: the rest, which cross the
    # diagonal or the end of the sequence, masked by global positions.
    if CAUSAL:
        lo = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N  # key blocks before lo end before the first query
        hi = tl.minimum((start_m + 1) * BLOCK_M, T)  # key blocks from hi on are wholly in the future
    else:
        lo = T // BLOCK_N * BLOCK_N  # the full key blocks
        hi = T
    for start_n in range(0, lo, BLOCK_N):
        cols = start_n + offs_n  # (BLOCK_N,) key positions
        k = tl.load(K + bh * stride_kb + cols[:, None] * stride_kt + offs_d[None, :])  # (BLOCK_N, HEAD_DIM)
        v = tl.load(V + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :])  # (BLOCK_N, HEAD_DIM)
        s = tl.dot(q, tl.trans(k)) * scale  # (BLOCK_M, BLOCK_N)
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,)
        alpha = tl.exp(m_i - m_new)  # (BLOCK_M,)
        p = tl.exp(s - m_new[:, None])  # (BLOCK_M, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n  # (BLOCK_N,) key positions
        k = tl.load(K + bh * stride_kb + cols[:, None] * stride_kt + offs_d[None, :],
                    mask=cols[:, None] < T, other=0.0)  # (BLOCK_N, HEAD_DIM)
        v = tl.load(V + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :],
                    mask=cols[:, None] < T, other=0.0)  # (BLOCK_N, HEAD_DIM)
        s = tl.dot(q, tl.trans(k)) * scale  # (BLOCK_M, BLOCK_N)
        keep = cols[None, :] < T  # keys past the end of the sequence are padding
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,)
        alpha = tl.exp(m_i - m_new)  # (BLOCK_M,)
        p = tl.exp(s - m_new[:, None])  # (BLOCK_M, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(O + bh * stride_ob + offs_m[:, None] * stride_ot + offs_d[None, :], acc.to(O.dtype.element_ty),
             mask=offs_m[:, None] < T)
    tl.store(LSE + bh * T + offs_m, m_i + tl.log(l_i), mask=offs_m < T)




# --------------------------------------------------------------------------------------------
# Notebook 08: KV cache, grouped-query attention and sliding windows
# --------------------------------------------------------------------------------------------
def decode_causal_mask(num_queries: int, num_keys: int) -> torch.Tensor:
    """Boolean ``(Tq, Tk)`` mask, True where a key is in a query's future, for ``Tq <= Tk``.

    The queries are the LAST ``Tq`` of the ``Tk`` positions (bottom-right aligned): query ``i`` sits
    at position ``Tk - Tq + i`` and may see keys ``0 .. Tk - Tq + i``. With ``Tq == Tk`` this is
    ``causal_mask``; with ``Tq == 1`` (one decoding step) nothing is hidden.
    """
    if num_queries < 0 or num_keys < 0:
        raise ValueError(f"num_queries and num_keys must be non-negative, got {num_queries} and {num_keys}")
    if num_queries > num_keys:
        # the solution notebook's words: the self-check quotes them, and must say the same in both editions
        raise ValueError(f"num_queries > num_keys ({num_queries} > {num_keys}): the queries are the last positions")
    offset = num_keys - num_queries  # how many keys come before the first query
    return torch.triu(torch.ones(num_queries, num_keys, dtype=torch.bool), diagonal=offset + 1)


class MultiHeadAttentionKVCache(MultiHeadAttention):
    """:class:`MultiHeadAttention` with a cache of the keys and values of the tokens seen so far.

    ``forward(x)`` is notebook 05's causal forward on the whole input ``(b, T, d_in)``.
    ``forward(x, use_cache=True)`` treats ``x`` as the NEXT ``T`` tokens: their keys and values are
    appended to ``cache_k``/``cache_v`` (each ``(b, H, tokens so far, D)``), and their queries attend
    to every cached key up to their own position. A prompt followed by one token at a time gives
    exactly the outputs of ``forward`` on the whole sequence. ``reset_cache()`` starts a new sequence.

    With ``rope=True`` the queries and keys are rotated by :func:`apply_rope` (rotary position
    embeddings) at their positions, ``0 .. T-1`` for ``forward(x)`` and ``start .. start + T - 1`` with
    the cache, BEFORE the keys are cached: cached keys already carry their positions.
    """

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int, qkv_bias: bool = False,
        rope: bool = False,
    ):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        if rope and self.head_dim % 2:
            raise ValueError(f"rope=True needs an even head_dim (pairs of dimensions rotate), got {self.head_dim}")
        self.rope = rope
        # Buffers, so that .to(device) moves a filled cache; not saved in state_dict.
        self.register_buffer("cache_k", None, persistent=False)
        self.register_buffer("cache_v", None, persistent=False)

    @property
    def num_cached(self) -> int:
        """How many tokens' keys and values the cache holds."""
        return 0 if self.cache_k is None else self.cache_k.shape[2]

    def reset_cache(self) -> None:
        """Forget every cached key and value: the next ``use_cache=True`` call starts a new sequence."""
        self.cache_k = None
        self.cache_v = None

    def _rotate(self, t: torch.Tensor, start: int) -> torch.Tensor:
        """``(b, H, T, D)`` queries or keys rotated at positions ``start .. start + T - 1`` (with ``rope``)."""
        if not self.rope:
            return t
        return apply_rope(t, torch.arange(start, start + t.shape[2], device=t.device))

    def forward(self, x: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        if not use_cache and not self.rope:
            return super().forward(x)  # the whole sequence; the cache is left alone
        if not use_cache:  # the whole sequence with rotary positions 0 .. T-1; the cache is left alone
            b, num_tokens, _ = check_input_3d(x, self.d_in, self.context_length)
            queries = self._rotate(split_heads(self.W_query(x), self.num_heads), 0)  # (b, H, T, D)
            keys = self._rotate(split_heads(self.W_key(x), self.num_heads), 0)
            values = split_heads(self.W_value(x), self.num_heads)
            scores = (queries @ keys.transpose(2, 3)).masked_fill(self.mask[:num_tokens, :num_tokens], float("-inf"))
            weights = self.dropout(torch.softmax(scores / math.sqrt(self.head_dim), dim=-1))
            return self.out_proj(merge_heads(weights @ values))
        b, num_tokens, _ = check_input_3d(x, self.d_in, self.context_length)
        if num_tokens == 0:
            raise ValueError("empty input: use_cache=True needs at least one new token (an empty prompt?)")
        start = self.num_cached  # position of the first new token
        if start + num_tokens > self.context_length:
            raise ValueError(f"the cache holds {start} tokens and the input adds {num_tokens}: "
                             f"{start + num_tokens} > context_length={self.context_length}. "
                             f"Call reset_cache() to start a new sequence")
        if self.cache_k is not None and self.cache_k.shape[0] != b:
            raise ValueError(f"the cache holds a batch of {self.cache_k.shape[0]} sequences, the input has {b}: "
                             f"call reset_cache() before a new batch")
        queries = self._rotate(split_heads(self.W_query(x), self.num_heads), start)  # (b, H, T, D)
        keys_new = self._rotate(split_heads(self.W_key(x), self.num_heads), start)  # rotated BEFORE caching
        values_new = split_heads(self.W_value(x), self.num_heads)
        if self.cache_k is None:
            self.cache_k, self.cache_v = keys_new, values_new
        else:
            self.cache_k = torch.cat([self.cache_k, keys_new], dim=2)  # (b, H, start + T, D): grows along tokens
            self.cache_v = torch.cat([self.cache_v, values_new], dim=2)
        end = start + num_tokens
        scores = queries @ self.cache_k.transpose(2, 3)  # (b, H, T, start + T)
        # Rows start..end-1 of the causal mask: the bottom-right corner, decode_causal_mask(T, end).
        scores = scores.masked_fill(self.mask[start:end, :end], float("-inf"))
        weights = self.dropout(torch.softmax(scores / math.sqrt(self.head_dim), dim=-1))
        context = merge_heads(weights @ self.cache_v)  # (b, H, T, D) -> (b, T, d_out)
        return self.out_proj(context)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``(b, G, T, D)`` -> ``(b, G * n_rep, T, D)``: each key/value head repeated ``n_rep`` times in a row.

    Output head ``h`` is input head ``h // n_rep``, so query heads ``g * n_rep .. (g + 1) * n_rep - 1``
    share group ``g``, as in ``F.scaled_dot_product_attention(..., enable_gqa=True)``.
    """
    if x.dim() != 4:
        raise ValueError(f"repeat_kv expects (b, num_kv_groups, T, head_dim), got shape {tuple(x.shape)}")
    if n_rep < 1:
        raise ValueError(f"n_rep must be at least 1, got {n_rep}")
    b, G, T, D = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None].expand(b, G, n_rep, T, D).reshape(b, G * n_rep, T, D)  # copies each head n_rep times


class GroupedQueryAttention(nn.Module):
    """Causal grouped-query attention: ``num_heads`` query heads share ``num_kv_groups`` key/value heads.

    Input ``(b, T, d_in)`` with ``T <= context_length``, output ``(b, T, d_out)``. Query heads
    ``g * n_rep .. (g + 1) * n_rep - 1`` (``n_rep = num_heads // num_kv_groups``) use key/value group
    ``g``. ``num_kv_groups == num_heads`` is :class:`MultiHeadAttention` (same parameters, same
    outputs for the same seed); ``num_kv_groups == 1`` is multi-query attention.
    """

    def __init__(
        self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int, num_kv_groups: int,
        qkv_bias: bool = False,
    ):
        super().__init__()
        check_heads_divide(d_out, num_heads)
        if num_kv_groups < 1 or num_heads % num_kv_groups != 0:
            raise ValueError(f"num_kv_groups must divide num_heads: {num_heads} query heads cannot be shared evenly "
                             f"by {num_kv_groups} key/value groups")
        self.d_in = d_in
        self.d_out = d_out
        self.num_heads = num_heads
        self.num_kv_groups = num_kv_groups
        self.head_dim = d_out // num_heads  # D
        self.group_size = num_heads // num_kv_groups  # query heads per key/value head
        self.context_length = context_length
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)  # H heads of D
        self.W_key = nn.Linear(d_in, num_kv_groups * self.head_dim, bias=qkv_bias)  # only G heads of D
        self.W_value = nn.Linear(d_in, num_kv_groups * self.head_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", causal_mask(context_length))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, T, _ = check_input_3d(x, self.d_in, self.context_length)
        queries = split_heads(self.W_query(x), self.num_heads)  # (b, H, T, D)
        keys = split_heads(self.W_key(x), self.num_kv_groups)  # (b, G, T, D)
        values = split_heads(self.W_value(x), self.num_kv_groups)
        keys = repeat_kv(keys, self.group_size)  # (b, H, T, D)
        values = repeat_kv(values, self.group_size)
        scores = (queries @ keys.transpose(2, 3)).masked_fill(self.mask[:T, :T], float("-inf"))  # (b, H, T, T)
        weights = self.dropout(torch.softmax(scores / math.sqrt(self.head_dim), dim=-1))
        return self.out_proj(merge_heads(weights @ values))  # (b, T, d_out)


def sliding_window_mask(num_tokens: int, window: int) -> torch.Tensor:
    """Boolean ``(T, T)`` mask, True where a key is hidden from a query under a causal sliding window.

    Query ``i`` sees key ``j`` when ``i - window < j <= i``: itself and the ``window - 1`` tokens before
    it. ``window=1``: each token sees only itself; ``window >= T``: the plain causal mask.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1 (a token always sees itself), got {window}")
    i = torch.arange(num_tokens).unsqueeze(1)  # (T, 1): query positions
    j = torch.arange(num_tokens).unsqueeze(0)  # (1, T): key positions
    return (j > i) | (i - j >= window)  # the future, or too far back


def sliding_window_mask_mod(window: int):
    """The same rule as a FlexAttention ``mask_mod(b, h, q_idx, kv_idx)``.

    A ``mask_mod`` says where a query MAY attend (True = kept): the opposite of
    :func:`sliding_window_mask`, which marks what is hidden.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1 (a token always sees itself), got {window}")

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)

    return mask_mod


def rope_angles(head_dim: int, max_positions: int, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (RoPE) angles, ``(max_positions, head_dim // 2)``, float32.

    Pair ``i`` of a head turns by ``angle[p, i] = p * base ** (-2 i / head_dim)`` at position ``p``:
    pair 0 turns by one radian per position, the last pair almost not at all.
    """
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be even (RoPE rotates pairs of dimensions), got {head_dim}")
    if max_positions < 0:
        raise ValueError(f"max_positions must be non-negative, got {max_positions}")
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,): theta_i
    positions = torch.arange(max_positions, dtype=torch.float64)  # (P,)
    return torch.outer(positions, inv_freq).to(torch.float32)  # (P, D/2)


def apply_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotate queries or keys ``x`` ``(..., T, D)`` by RoPE at ``positions`` ``(T,)`` (integers).

    Rotate-half convention (GPT-NeoX, Hugging Face's Llama): dimension ``i`` pairs with
    ``i + D/2``, and pair ``i`` turns by ``rope_angles(D, ...)[position, i]``:
    ``(x_i, x_{i+D/2}) -> (x_i cos - x_{i+D/2} sin, x_i sin + x_{i+D/2} cos)``. The result has
    ``x``'s shape and dtype; the dot product of a rotated query and key depends only on the
    distance between their positions.
    """
    D = x.shape[-1]
    positions = torch.as_tensor(positions)
    if positions.dim() != 1 or positions.shape[0] != x.shape[-2]:
        raise ValueError(f"positions must be (T,) with T = x.shape[-2] = {x.shape[-2]}, got shape {tuple(positions.shape)}")
    if positions.is_floating_point() or (positions.numel() and int(positions.min()) < 0):
        raise ValueError("positions must be non-negative integers")
    size = int(positions.max()) + 1 if positions.numel() else 0
    angles = rope_angles(D, size).to(x.device)[positions.to(x.device)]  # (T, D/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]  # the two halves: pair i is (x1[i], x2[i])
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (..., T, D)


# --------------------------------------------------------------------------------------------
# Notebook 09: the capstone, a tiny causal transformer
# --------------------------------------------------------------------------------------------
def sinusoidal_positions(num_positions: int, d_model: int) -> torch.Tensor:
    """The fixed sinusoidal position encodings of "Attention Is All You Need", ``(num_positions, d_model)``.

    Row ``pos``, columns ``2i`` and ``2i + 1``: ``sin(pos / 10000^(2i / d_model))`` and
    ``cos(pos / 10000^(2i / d_model))``. ``d_model`` must be even.
    """
    if int(num_positions) != num_positions or num_positions < 1:
        raise ValueError(f"num_positions must be a positive integer, got {num_positions!r}")
    if int(d_model) != d_model or d_model < 2 or d_model % 2:
        raise ValueError(f"d_model must be a positive even integer (sin and cos come in pairs), got {d_model!r}")
    positions = torch.arange(num_positions, dtype=torch.float32).unsqueeze(1)  # (P, 1)
    frequencies = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)  # (d_model / 2,)
    angles = positions * frequencies  # (P, d_model / 2)
    encodings = torch.zeros(num_positions, d_model)  # (P, d_model)
    encodings[:, 0::2] = torch.sin(angles)  # even columns
    encodings[:, 1::2] = torch.cos(angles)  # odd columns
    return encodings


class LearnedPositionalEmbedding(nn.Module):
    """Learned absolute positions: one trained vector per position, added to the token embeddings.

    ``forward(x)``: ``x`` is ``(b, T, d_model)`` with ``T <= context_length``; returns
    ``x + position vectors 0 .. T-1``, ``(b, T, d_model)``.
    """

    def __init__(self, context_length: int, d_model: int):
        super().__init__()
        self.context_length = context_length
        self.embedding = nn.Embedding(context_length, d_model)  # (context_length, d_model), N(0, 1) at first

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """``x + position vectors start .. start+T-1``; ``start`` > 0 when decoding with a KV cache."""
        b, T, _ = check_input_3d(x, self.embedding.embedding_dim, self.context_length)
        if start < 0 or start + T > self.context_length:
            raise ValueError(f"positions {start}..{start + T - 1}, but context_length is {self.context_length}")
        positions = torch.arange(start, start + T, device=x.device)  # (T,)
        return x + self.embedding(positions)  # (b, T, d) + (T, d) -> (b, T, d)


class TransformerBlock(nn.Module):
    """A pre-LayerNorm transformer block (GPT-2's): ``(b, T, d_model) -> (b, T, d_model)``.

    ``x + dropout(attention(norm1(x)))``, then ``x + dropout(feed_forward(norm2(x)))``; the
    feed-forward network is ``Linear(d, 4d)``, GELU, ``Linear(4d, d)``. Layers are created in the
    order ``norm1, att, norm2, ff``. The attention is notebook 08's :class:`MultiHeadAttentionKVCache`
    (the same parameters and outputs as :class:`MultiHeadAttention`): ``forward(x, use_cache=True)``
    treats ``x`` as the next tokens of the sequence its cache holds.
    """

    def __init__(self, d_model: int, num_heads: int, context_length: int, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.att = MultiHeadAttentionKVCache(d_model, d_model, context_length, dropout, num_heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.drop_resid = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        h = self.norm1(x)
        h = self.att(h, use_cache=True) if use_cache else self.att(h)  # (b, T, d)
        x = x + self.drop_resid(h)  # (b, T, d): attention, then the residual
        return x + self.drop_resid(self.ff(self.norm2(x)))  # (b, T, d): feed-forward, then the residual


class TinyGPT(nn.Module):
    """A GPT-style causal language model: token ids ``(b, T)`` -> next-token logits ``(b, T, vocab_size)``.

    Token embeddings plus positions, dropout, ``num_layers`` :class:`TransformerBlock`, a final
    LayerNorm and a linear head without bias, created in that order. ``positions="learned"`` (the
    default) adds a :class:`LearnedPositionalEmbedding`; ``positions="sinusoidal"`` adds the fixed
    :func:`sinusoidal_positions` instead (a buffer, no parameters).
    """

    def __init__(self, vocab_size: int, d_model: int, num_heads: int, num_layers: int, context_length: int,
                 dropout: float, positions: str = "learned"):
        super().__init__()
        from course_utils.training import FixedPositions  # the given wrapper of a fixed table

        if positions not in ("learned", "sinusoidal"):
            raise ValueError(f"positions must be 'learned' or 'sinusoidal', got {positions!r}")
        self.context_length = context_length
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = (LearnedPositionalEmbedding(context_length, d_model) if positions == "learned"
                        else FixedPositions(sinusoidal_positions(context_length, d_model)))
        self.drop_emb = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *[TransformerBlock(d_model, num_heads, context_length, dropout) for _ in range(num_layers)])
        self.final_norm = nn.LayerNorm(d_model)
        self.out_head = nn.Linear(d_model, vocab_size, bias=False)
        self.num_cached = 0  # tokens held by the blocks' KV caches (forward with use_cache=True)

    def forward(self, idx: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        """Logits ``(b, T, vocab_size)``. With ``use_cache=True``, ``idx`` holds the NEXT tokens of the
        sequence the caches hold: they get positions ``num_cached ..`` and attend to every cached token."""
        if idx.dim() != 2:
            raise ValueError(f"TinyGPT expects token ids of shape (batch, num_tokens), got shape {tuple(idx.shape)}")
        if not use_cache:
            x = self.pos_emb(self.tok_emb(idx))  # (b, T, d_model): tokens plus positions
            x = self.blocks(self.drop_emb(x))  # (b, T, d_model)
            return self.out_head(self.final_norm(x))  # (b, T, vocab_size)
        start = self.num_cached
        x = self.drop_emb(self.pos_emb(self.tok_emb(idx), start=start))  # positions start .. start+T-1
        for block in self.blocks:
            x = block(x, use_cache=True)  # (b, T, d_model)
        self.num_cached = start + idx.shape[1]
        return self.out_head(self.final_norm(x))  # (b, T, vocab_size)

    def reset_cache(self) -> None:
        """Empty every block's KV cache: the next ``use_cache=True`` call starts a new sequence."""
        self.num_cached = 0
        for block in self.blocks:
            block.att.reset_cache()


@torch.no_grad()
def generate(model: nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, use_cache: bool = True) -> torch.Tensor:
    """Write ``max_new_tokens`` tokens after ``prompt_ids`` ``(b, T0)``; returns ``(b, T0 + max_new_tokens)``.

    ``temperature == 0``: greedy (the most likely token). Otherwise the logits are divided by
    ``temperature``, cut to the ``top_k`` largest when given, and a token is sampled from their
    softmax with the global random generator (seed it with ``torch.manual_seed``). With
    ``use_cache=True`` the model reads the prompt once (``model(prompt, use_cache=True)`` after
    ``model.reset_cache()``) and then only each new token; without, it reads the whole sequence at
    every step. Greedy generation writes the same tokens both ways. Every token the model reads needs
    a position: ``T0 + max_new_tokens - 1 > context_length`` raises a ``ValueError``.
    """
    if prompt_ids.dim() != 2 or prompt_ids.shape[1] == 0:
        raise ValueError(f"prompt_ids must be (batch, num_tokens) with at least one token, got {tuple(prompt_ids.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be at least 0, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be 0 (greedy) or positive, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be None or at least 1, got {top_k}")
    context_length = model.context_length
    read = prompt_ids.shape[1] + max_new_tokens - 1  # the last new token is never read
    if read > context_length:
        raise ValueError(f"the prompt's {prompt_ids.shape[1]} tokens and {max_new_tokens} new ones need {read} "
                         f"positions, but context_length is {context_length}")
    model.eval()
    tokens = prompt_ids
    if use_cache:
        model.reset_cache()
    for step in range(max_new_tokens):
        if use_cache:
            new = tokens if step == 0 else tokens[:, -1:]  # the prompt, then one token at a time
            logits = model(new, use_cache=True)[:, -1]  # (b, V): the last position predicts the next token
        else:
            logits = model(tokens)[:, -1]  # (b, V): the whole sequence again
        if temperature == 0:
            next_token = logits.argmax(dim=-1, keepdim=True)  # (b, 1)
        else:
            logits = logits / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (b, 1)
                logits = logits.masked_fill(logits < kth, float("-inf"))  # keep the k largest
            next_token = torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)  # (b, 1)
        tokens = torch.cat([tokens, next_token], dim=1)  # (b, T + 1)
    if use_cache:
        model.reset_cache()
    return tokens


def train_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
               optimizer: torch.optim.Optimizer) -> float:
    """One optimisation step on the answer positions only; returns the loss as a float.

    ``batch = (inputs, targets, answer_mask)``: token ids ``(b, T)``, the next token at every
    position ``(b, T)``, and a bool ``(b, T)`` that is True where the target is part of the answer.
    """
    inputs, targets, answer_mask = batch
    logits = model(inputs)  # (b, T, vocab)
    loss = F.cross_entropy(logits[answer_mask], targets[answer_mask])  # (n_answer, vocab) vs (n_answer,)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


# --------------------------------------------------------------------------------------------
# Notebook 10: the FlashAttention backward pass
# --------------------------------------------------------------------------------------------
__all__ += ["attention_backward_reference", "flash_attention_backward", "FlashAttention"]


def attention_backward_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                                 causal: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of ``o = softmax(q k^T / sqrt(D)) v`` from the plain, untiled formulas.

    ``q``, ``k`` are ``(..., T, D)``, ``v`` is ``(..., T, Dv)`` and ``do`` (the gradient of the loss
    with respect to ``o``) is ``(..., T, Dv)``. Returns ``(dq, dk, dv)``, shaped like ``q``, ``k``,
    ``v``. Every ``(T, T)`` matrix is built: this is the formula to test a tiled version against.
    """
    for t, name in ((q, "q"), (k, "k"), (v, "v"), (do, "do")):
        check_rank_at_least(t, 2, name)
    check_same_last_dim(q, k, "q", "k")
    if do.shape[-2:] != (q.shape[-2], v.shape[-1]):
        raise ValueError(f"do must have the output's shape (..., T, Dv) = (..., {q.shape[-2]}, {v.shape[-1]}), "
                         f"got {tuple(do.shape)}")
    T, D = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(D)
    s = q @ k.transpose(-2, -1) * scale  # (..., T, T)
    if causal:
        s = s.masked_fill(causal_mask(T, device=q.device), float("-inf"))
    p = torch.softmax(s, dim=-1)  # (..., T, T)
    o = p @ v  # (..., T, Dv)
    dv = p.transpose(-2, -1) @ do  # (..., T, Dv)
    dp = do @ v.transpose(-2, -1)  # (..., T, T)
    delta = (do * o).sum(dim=-1, keepdim=True)  # (..., T, 1): rowsum(dO * O) = rowsum(P * dP)
    ds = p * (dp - delta)  # (..., T, T): the softmax's backward
    dq = ds @ k * scale  # (..., T, D)
    dk = ds.transpose(-2, -1) @ q * scale  # (..., T, D)
    return dq, dk, dv


def flash_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                             lse: torch.Tensor, do: torch.Tensor, block_q: int, block_k: int,
                             causal: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention-2's backward pass, tile by tile: ``(dq, dk, dv)`` without any ``(T, T)`` tensor.

    ``q``, ``k``, ``v``, ``o``, ``do`` are ``(..., T, D)``; ``lse`` ``(..., T)`` is the forward's
    log-sum-exp. Each tile of weights is rebuilt from the scores, ``P = exp(S - lse)``. The outer loop
    runs over key blocks, so that a key block's ``dk`` and ``dv`` are summed over the query blocks in
    the inner loop and written once; ``dq`` gets a share from every key block (on a GPU: atomic adds
    into a float32 buffer, or a second loop over key blocks). With ``causal=True``, query blocks wholly
    before a key block are skipped. As the forward, every tile and every sum is computed in float32 at
    least (``lse`` is float32 for bfloat16 or float16 inputs), and the gradients are cast back to the
    inputs' dtypes at the end.
    """
    order = "flash_attention_backward(q, k, v, o, lse, do, block_q, block_k, causal)"
    _check_block(block_q, "block_q", order)
    _check_block(block_k, "block_k", order)
    for t, name in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (do, "do")):
        check_rank_at_least(t, 2, name)
    check_same_last_dim(q, k, "q", "k")
    T, Tk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    if causal and Tk != T:
        raise ValueError(f"causal attention here needs as many keys as queries, got {T} queries and {Tk} keys")
    if lse.shape != q.shape[:-1]:
        raise ValueError(f"lse must have shape (..., T) = {tuple(q.shape[:-1])}, got {tuple(lse.shape)}")
    scale = 1.0 / math.sqrt(D)
    acc = torch.promote_types(q.dtype, torch.float32)  # tiles and sums in float32 at least, as the forward
    delta = (do.to(acc) * o.to(acc)).sum(dim=-1)  # (..., T): delta_i = rowsum(dO * O), one number per query
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)  # (..., T, D)
    dk = torch.zeros(k.shape, dtype=acc, device=k.device)  # (..., Tk, D)
    dv = torch.zeros(v.shape, dtype=acc, device=v.device)  # (..., Tk, Dv)
    for k_start in range(0, Tk, block_k):
        k_end = min(k_start + block_k, Tk)
        k_blk = k[..., k_start:k_end, :].to(acc)  # (..., Bk, D)
        v_blk = v[..., k_start:k_end, :].to(acc)  # (..., Bk, Dv)
        dk_blk = torch.zeros_like(k_blk)  # (..., Bk, D)
        dv_blk = torch.zeros_like(v_blk)  # (..., Bk, Dv)
        first = (k_start // block_q) * block_q if causal else 0  # earlier query blocks see none of these keys
        for q_start in range(first, T, block_q):
            q_end = min(q_start + block_q, T)
            q_blk = q[..., q_start:q_end, :].to(acc)  # (..., Bq, D)
            do_blk = do[..., q_start:q_end, :].to(acc)  # (..., Bq, Dv)
            s = q_blk @ k_blk.transpose(-2, -1) * scale  # (..., Bq, Bk)
            if causal and k_end - 1 > q_start:  # the tile crosses the diagonal
                rows = torch.arange(q_start, q_end, device=q.device)[:, None]  # (Bq, 1)
                cols = torch.arange(k_start, k_end, device=q.device)[None, :]  # (1, Bk)
                s = s.masked_fill(cols > rows, float("-inf"))
            p = torch.exp(s - lse[..., q_start:q_end, None].to(acc))  # (..., Bq, Bk): the weights, rebuilt
            dv_blk = dv_blk + p.transpose(-2, -1) @ do_blk  # (..., Bk, Dv)
            dp = do_blk @ v_blk.transpose(-2, -1)  # (..., Bq, Bk)
            ds = p * (dp - delta[..., q_start:q_end, None])  # (..., Bq, Bk)
            dq[..., q_start:q_end, :] += ds @ k_blk * scale  # (..., Bq, D): a share from this key block
            dk_blk = dk_blk + ds.transpose(-2, -1) @ q_blk * scale  # (..., Bk, D)
        dk[..., k_start:k_end, :] = dk_blk
        dv[..., k_start:k_end, :] = dv_blk
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)  # back to the inputs' dtypes


class FlashAttention(torch.autograd.Function):
    """Attention with FlashAttention's memory: ``FlashAttention.apply(q, k, v, causal, block_q, block_k)``.

    ``q``, ``k``, ``v`` ``(..., T, D)`` -> the output ``(..., T, D)``. The forward pass is the tiled
    :func:`flash_attention_forward` and keeps only ``q``, ``k``, ``v``, the output and the log-sum-exp
    for the backward pass, which is :func:`flash_attention_backward`: no ``(T, T)`` tensor is kept.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, block_q: int = 32,
                block_k: int = 32) -> torch.Tensor:
        o, lse = flash_attention_forward(q, k, v, block_q, block_k, causal)  # (..., T, D), (..., T)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, ctx.block_q, ctx.block_k, ctx.causal)
        return dq, dk, dv, None, None, None  # no gradient for causal, block_q, block_k


__all__ += ["flash_attention_backward_triton"]


def flash_attention_backward_triton(Q, K, V, DO, LSE, DELTA, DK, DV, stride_b, stride_t, T, scale,
                                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                    CAUSAL: tl.constexpr):
    """The Triton kernel of FlashAttention-2's backward for ``dK`` and ``dV`` (undecorated: ``triton.jit`` it).

    One program owns ``BLOCK_N`` keys of one (batch, head): it loads its key and value block once, keeps
    ``dk`` and ``dv`` ``(BLOCK_N, HEAD_DIM)`` in float32 while the query blocks stream past, and writes
    them once. ``Q``, ``K``, ``V``, ``DO``, ``DK``, ``DV`` are ``(BH, T, HEAD_DIM)`` with strides
    ``(stride_b, stride_t, 1)``; ``LSE`` and ``DELTA = rowsum(dO * O)`` are ``(BH, T)`` float32. Launch on
    the grid ``(cdiv(T, BLOCK_N), BH)`` with ``course_utils.backward.launch_backward``.
    """
    start_n = tl.program_id(0)  # which block of keys
    bh = tl.program_id(1)  # which (batch, head)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
    offs_m = tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    offs_d = tl.arange(0, HEAD_DIM)  # (HEAD_DIM,)
    base = bh * stride_b
    k = tl.load(K + base + offs_n[:, None] * stride_t + offs_d[None, :], mask=offs_n[:, None] < T,
                other=0.0)  # (BLOCK_N, HEAD_DIM)
    v = tl.load(V + base + offs_n[:, None] * stride_t + offs_d[None, :], mask=offs_n[:, None] < T,
                other=0.0)  # (BLOCK_N, HEAD_DIM)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0  # earlier query blocks see none of these keys
    for start_m in range(lo, T, BLOCK_M):
        rows = start_m + offs_m  # (BLOCK_M,) query positions
        q = tl.load(Q + base + rows[:, None] * stride_t + offs_d[None, :], mask=rows[:, None] < T,
                    other=0.0)  # (BLOCK_M, HEAD_DIM)
        do = tl.load(DO + base + rows[:, None] * stride_t + offs_d[None, :], mask=rows[:, None] < T,
                     other=0.0)  # (BLOCK_M, HEAD_DIM)
        lse = tl.load(LSE + bh * T + rows, mask=rows < T, other=0.0)  # (BLOCK_M,)
        delta = tl.load(DELTA + bh * T + rows, mask=rows < T, other=0.0)  # (BLOCK_M,)
        s = tl.dot(q, tl.trans(k)) * scale  # (BLOCK_M, BLOCK_N)
        keep = (rows[:, None] < T) & (offs_n[None, :] < T)  # padding rows and columns get no weight
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= rows[:, None])
        p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)  # (BLOCK_M, BLOCK_N): the weights, rebuilt
        dv += tl.dot(tl.trans(p).to(do.dtype), do)  # (BLOCK_N, HEAD_DIM)
        dp = tl.dot(do, tl.trans(v))  # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])  # (BLOCK_M, BLOCK_N)
        dk += tl.dot(tl.trans(ds).to(q.dtype), q) * scale  # (BLOCK_N, HEAD_DIM)
    tl.store(DK + base + offs_n[:, None] * stride_t + offs_d[None, :], dk.to(DK.dtype.element_ty),
             mask=offs_n[:, None] < T)
    tl.store(DV + base + offs_n[:, None] * stride_t + offs_d[None, :], dv.to(DV.dtype.element_ty),
             mask=offs_n[:, None] < T)


# --------------------------------------------------------------------------------------------
# Notebook 11: serving: a paged KV cache and paged attention
# --------------------------------------------------------------------------------------------
__all__ += ["PagedKVCache", "paged_attention"]


class PagedKVCache:
    """A KV cache in fixed-size blocks, as vLLM keeps it: one pool of blocks shared by every sequence.

    ``key_blocks`` and ``value_blocks`` are ``(num_blocks, num_kv_heads, block_size, head_dim)``. Each
    sequence owns a list of blocks, its **block table**: token ``t`` of the sequence sits in block
    ``table[t // block_size]`` at slot ``t % block_size``. A block is taken from the free list (the
    lowest-numbered free block first) only when a sequence's tokens reach it, and goes back when the
    sequence is freed.
    """

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32):
        self.block_size = block_size
        self.key_blocks = torch.zeros(num_blocks, num_kv_heads, block_size, head_dim, dtype=dtype)
        self.value_blocks = torch.zeros(num_blocks, num_kv_heads, block_size, head_dim, dtype=dtype)
        self.free_list = list(range(num_blocks))  # block numbers, lowest first
        self.tables: dict[int, list[int]] = {}  # seq_id -> its blocks, in token order
        self.lengths: dict[int, int] = {}  # seq_id -> tokens written

    @property
    def num_free_blocks(self) -> int:
        """How many blocks no sequence holds."""
        return len(self.free_list)

    def allocate(self, seq_id: int) -> None:
        """Start an empty sequence: no block is taken until its first token arrives."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} is already allocated")
        self.tables[seq_id] = []
        self.lengths[seq_id] = 0

    def _table(self, seq_id: int) -> list[int]:
        if seq_id not in self.tables:
            raise KeyError(f"sequence {seq_id} is not allocated (or was freed)")
        return self.tables[seq_id]

    def append(self, seq_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k`` and ``v``, each ``(num_kv_heads, T_new, head_dim)``, after the sequence's tokens,
        taking new blocks as the tokens cross block boundaries. Out of blocks: a ``RuntimeError`` naming
        the sequence and the blocks it needed, and nothing changed."""
        table = self._table(seq_id)
        length, new = self.lengths[seq_id], k.shape[1]
        needed = -(-(length + new) // self.block_size) - len(table)  # blocks the new tokens start
        if needed > len(self.free_list):
            raise RuntimeError(f"out of blocks: sequence {seq_id} needs {needed} more blocks for its {new} new "
                               f"tokens, but only {len(self.free_list)} are free")
        for _ in range(needed):
            table.append(self.free_list.pop(0))  # the lowest-numbered free block
        positions = torch.arange(length, length + new)  # (T_new,) each new token's place in the sequence
        blocks = torch.tensor(table, dtype=torch.long)[positions // self.block_size]  # (T_new,)
        slots = positions % self.block_size  # (T_new,)
        self.key_blocks[blocks, :, slots] = k.transpose(0, 1).to(self.key_blocks.dtype)  # (T_new, kv, D)
        self.value_blocks[blocks, :, slots] = v.transpose(0, 1).to(self.value_blocks.dtype)
        self.lengths[seq_id] = length + new

    def gather(self, seq_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's keys and values in token order, each ``(num_kv_heads, T, head_dim)``."""
        table = self._table(seq_id)
        length = self.lengths[seq_id]
        num_kv_heads, head_dim = self.key_blocks.shape[1], self.key_blocks.shape[3]
        k = self.key_blocks[table]  # (n, num_kv_heads, block_size, head_dim)
        v = self.value_blocks[table]
        k = k.transpose(0, 1).reshape(num_kv_heads, -1, head_dim)[:, :length]  # (num_kv_heads, T, head_dim)
        v = v.transpose(0, 1).reshape(num_kv_heads, -1, head_dim)[:, :length]
        return k, v

    def block_table(self, seq_id: int) -> list[int]:
        """The sequence's blocks, in token order (a copy)."""
        return list(self._table(seq_id))

    def free(self, seq_id: int) -> None:
        """Give the sequence's blocks back to the free list and forget the sequence."""
        table = self._table(seq_id)
        self.free_list = sorted(self.free_list + table)
        del self.tables[seq_id], self.lengths[seq_id]


def paged_attention(q: torch.Tensor, key_blocks: torch.Tensor, value_blocks: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """One decode step of a ragged batch, reading keys and values from the blocks of a paged cache.

    ``q`` is ``(b, num_heads, head_dim)``: one new token per sequence. ``key_blocks`` and
    ``value_blocks`` are ``(num_blocks, num_kv_heads, block_size, head_dim)``; ``block_tables`` is
    ``(b, max_blocks)`` int64, each row a sequence's blocks padded with -1; ``seq_lens`` ``(b,)`` how many
    tokens each sequence holds. Query head ``h`` reads key/value head ``h // (num_heads // num_kv_heads)``
    (grouped-query attention), without copying the cache per head. Returns ``(b, num_heads, head_dim)``.
    """
    b, num_heads, head_dim = q.shape
    num_kv_heads, block_size = key_blocks.shape[1], key_blocks.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)  # (b, num_heads, head_dim)
    for i in range(b):
        length = int(seq_lens[i])
        blocks = block_tables[i, : -(-length // block_size)]  # this sequence's blocks only, no padding
        k = key_blocks[blocks].transpose(0, 1).reshape(num_kv_heads, -1, head_dim)[:, :length]  # (kv, T, D)
        v = value_blocks[blocks].transpose(0, 1).reshape(num_kv_heads, -1, head_dim)[:, :length]
        qi = q[i].view(num_kv_heads, group, head_dim)  # (kv, group, D): heads g*group .. share kv head g
        scores = qi @ k.transpose(-2, -1) / math.sqrt(head_dim)  # (kv, group, T)
        out[i] = (torch.softmax(scores, dim=-1) @ v).reshape(num_heads, head_dim)  # (H, D)
    return out


# --------------------------------------------------------------------------------------------
# Notebook 11: speculative decoding
# --------------------------------------------------------------------------------------------
__all__ += ["speculative_generate"]


@torch.no_grad()
def speculative_generate(target: nn.Module, draft: nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int,
                         k: int = 4, temperature: float = 0.0) -> tuple[torch.Tensor, dict[str, int]]:
    """Write ``max_new_tokens`` tokens after ``prompt_ids`` ``(1, T0)`` with ``target``, ``draft`` proposing.

    Each round the draft proposes ``n = min(k, tokens still to write - 1)`` tokens one at a time, with its
    KV cache; the target reads them all in one cached forward pass, which gives its distribution ``p`` at
    each proposal and one more after the last. Proposal ``d`` (the draft's probability ``q``) is accepted
    with probability ``min(1, p(d) / q(d))``; at the first rejection a token is drawn from the residual
    ``max(0, p - q)``, normalised, and the round ends; if all ``n`` are accepted, a bonus token is drawn from
    the target's last distribution. At temperature 0 both distributions are one-hot on their argmax, so the
    output is the target's greedy output. Both caches are then cut back (:func:`serving.truncate_cache`) to
    the tokens kept, less the last one, which the next round feeds.

    Returns the tokens ``(1, T0 + max_new_tokens)`` and ``{"proposed", "accepted", "target_calls"}``: draft
    tokens proposed and accepted, and the target's forward passes.
    """
    from course_utils.serving import truncate_cache

    if prompt_ids.dim() != 2 or prompt_ids.shape[0] != 1 or prompt_ids.shape[1] == 0:
        raise ValueError(f"prompt_ids must be (1, num_tokens): one sequence, got {tuple(prompt_ids.shape)}")
    if max_new_tokens < 0 or k < 1 or temperature < 0:
        raise ValueError(f"max_new_tokens >= 0, k >= 1 and temperature >= 0, got {max_new_tokens}, {k}, {temperature}")
    stats = {"proposed": 0, "accepted": 0, "target_calls": 0}
    target.eval()
    draft.eval()
    target.reset_cache()
    draft.reset_cache()
    tokens = prompt_ids  # (1, T)
    end = prompt_ids.shape[1] + max_new_tokens
    while tokens.shape[1] < end:
        n = min(k, end - tokens.shape[1] - 1)  # proposals this round
        proposals, draft_probs = [], []
        for j in range(n):
            new = tokens[:, draft.num_cached:] if j == 0 else proposals[-1].view(1, 1)  # what the draft has not read
            logits = draft(new, use_cache=True)[0, -1]  # (V,)
            if temperature == 0:
                proposals.append(logits.argmax())
            else:
                q = torch.softmax(logits / temperature, dim=-1)  # (V,)
                proposals.append(torch.multinomial(q, 1)[0])
                draft_probs.append(q)
        drafted = torch.stack(proposals).view(1, n) if n else tokens[:, :0]  # (1, n)
        logits = target(torch.cat([tokens[:, target.num_cached:], drafted], dim=1), use_cache=True)[0, -(n + 1):]
        stats["target_calls"] += 1
        stats["proposed"] += n
        kept = []
        for j in range(n + 1):  # (n + 1, V): the target's view of each proposal, and of the bonus
            if temperature == 0:
                best = logits[j].argmax()
                if j < n and best == proposals[j]:
                    kept.append(proposals[j])  # accepted
                    continue
                kept.append(best)  # a rejection's replacement, or the bonus
                break
            p = torch.softmax(logits[j] / temperature, dim=-1)  # (V,)
            if j == n:
                kept.append(torch.multinomial(p, 1)[0])  # all accepted: the bonus token
                break
            d, q = proposals[j], draft_probs[j]
            if torch.rand(()) < p[d] / q[d]:
                kept.append(d)  # accepted with probability min(1, p(d) / q(d))
                continue
            residual = (p - q).clamp(min=0)  # (V,): where the target wants more than the draft gave
            kept.append(torch.multinomial(residual / residual.sum(), 1)[0])
            break
        stats["accepted"] += len(kept) - 1
        tokens = torch.cat([tokens, torch.stack(kept).view(1, -1)], dim=1)
        truncate_cache(target, tokens.shape[1] - 1)  # drop the rejected proposals' keys and values
        truncate_cache(draft, min(draft.num_cached, tokens.shape[1] - 1))
    target.reset_cache()
    draft.reset_cache()
    return tokens, stats


# --------------------------------------------------------------------------------------------
# Notebook 11: continuous batching
# --------------------------------------------------------------------------------------------
__all__ += ["ContinuousBatcher"]


class ContinuousBatcher:
    """Greedy generation for many requests at once, each joining and leaving the batch at any step.

    ``model(cache, seq_ids, tokens, positions)`` is a paged model (``serving.PagedTinyGPT``): it reads each
    sequence's new tokens at the given positions against what ``cache`` holds of it, appends their keys and
    values, and returns each sequence's next-token logits. Each :meth:`step`: admit waiting requests in order
    while the batch has room and the cache has the blocks for a request's tokens (prefill: its prompt, and
    after a preemption what it had written too, at positions from 0), then decode every other running request
    in one forward pass (its last token at position = tokens it holds), preempting the newest running requests
    while the decode needs more new blocks than are free, and free each finished request's blocks at once.
    """

    def __init__(self, model: object, cache: object, max_batch_size: int):
        self.model, self.cache, self.max_batch_size = model, cache, max_batch_size
        self.num_blocks, self.block_size = cache.key_blocks.shape[0], cache.key_blocks.shape[2]
        self.prompts: dict[int, list[int]] = {}
        self.limits: dict[int, int] = {}
        self.written: dict[int, list[int]] = {}  # request id -> the tokens it wrote
        self.waiting: list[int] = []  # admitted in this order
        self.running: list[int] = []  # in the order they were admitted

    def add_request(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> int:
        """Queue a request: ``prompt_ids`` ``(T0,)`` token ids; returns its id (0, 1, 2, ...)."""
        prompt = [int(t) for t in prompt_ids.flatten()]
        if not prompt or max_new_tokens < 1:
            raise ValueError(f"a request needs a prompt and max_new_tokens >= 1, got {len(prompt)} and {max_new_tokens}")
        need = math.ceil((len(prompt) + max_new_tokens - 1) / self.block_size)
        if need > self.num_blocks:
            raise ValueError(f"the request needs {need} blocks, but the cache has only {self.num_blocks}")
        rid = len(self.prompts)
        self.prompts[rid], self.limits[rid], self.written[rid] = prompt, max_new_tokens, []
        self.waiting.append(rid)
        return rid

    def _next(self, rid: int, logits: torch.Tensor) -> int:
        token = int(logits.argmax())
        self.written[rid].append(token)
        return token

    def _preempt(self, rid: int) -> None:
        """Give the request's blocks back and queue it first: it will be recomputed from its tokens."""
        self.cache.free(rid)
        self.running.remove(rid)
        self.waiting.insert(0, rid)

    def step(self) -> dict[int, int]:
        """One step: ``{request id: the token it wrote}`` for every request that wrote one."""
        written: dict[int, int] = {}
        while self.waiting and len(self.running) < self.max_batch_size:
            rid = self.waiting[0]
            tokens = self.prompts[rid] + self.written[rid]  # a preempted request recomputes what it wrote
            if math.ceil(len(tokens) / self.block_size) > self.cache.num_free_blocks:
                break
            self.waiting.pop(0)
            self.cache.allocate(rid)
            self.running.append(rid)
            logits = self.model(self.cache, [rid], [torch.tensor(tokens)], [0])  # prefill
            written[rid] = self._next(rid, logits[0])
        while True:
            decode = [rid for rid in self.running if rid not in written]
            held = {rid: len(self.prompts[rid]) + len(self.written[rid]) - 1 for rid in decode}  # tokens cached
            new_blocks = sum(1 for n in held.values() if n % self.block_size == 0)
            if new_blocks <= self.cache.num_free_blocks:
                break
            self._preempt(self.running[-1])
        if decode:
            logits = self.model(self.cache, decode, [torch.tensor(self.written[rid][-1:]) for rid in decode],
                                [held[rid] for rid in decode])  # (len(decode), V): one forward pass
            for rid, row in zip(decode, logits):
                written[rid] = self._next(rid, row)
        for rid in list(self.running):
            if len(self.written[rid]) == self.limits[rid]:
                self._finish(rid)
        return written

    def _finish(self, rid: int) -> None:
        """A finished request leaves the batch, and its blocks are free for the next request at once."""
        self.cache.free(rid)
        self.running.remove(rid)

    def run(self) -> dict[int, list[int]]:
        """Step until every request is finished; ``{request id: the tokens it wrote}``."""
        while self.waiting or self.running:
            self.step()
        return {rid: list(tokens) for rid, tokens in self.written.items()}
