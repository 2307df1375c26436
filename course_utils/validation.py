"""Input checks that turn a confusing PyTorch error into one sentence naming the problem.

Every function raises ``ValueError`` with the offending name and shape in the message.
"""

from __future__ import annotations

import torch


def check_rank_at_least(t: torch.Tensor, rank: int, name: str) -> None:
    """Raise unless ``t`` has at least ``rank`` dimensions."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() < rank:
        raise ValueError(f"{name} must have at least {rank} dimensions, got shape {tuple(t.shape)}")


def check_last_dim(t: torch.Tensor, size: int, name: str) -> None:
    """Raise unless the last dimension of ``t`` is ``size``."""
    if t.shape[-1] != size:
        raise ValueError(f"{name} has last dimension {t.shape[-1]}, expected {size} (shape {tuple(t.shape)})")


def check_same_last_dim(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    """Raise unless ``a`` and ``b`` agree in their last dimension."""
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(
            f"{name_a} and {name_b} must have the same last dimension, "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def check_heads_divide(d_out: int, num_heads: int) -> None:
    """Raise unless ``d_out`` splits evenly into ``num_heads`` heads."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be at least 1, got {num_heads}")
    if d_out % num_heads != 0:
        raise ValueError(
            f"d_out must be divisible by num_heads: d_out % num_heads != 0 "
            f"({d_out} % {num_heads} = {d_out % num_heads})"
        )


def check_input_3d(x: torch.Tensor, d_in: int, context_length: int) -> tuple[int, int, int]:
    """Validate a batch ``(b, T, d_in)`` with ``T <= context_length``; return ``(b, T, d_in)``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"expected input of shape (batch, num_tokens, d_in), got shape {tuple(x.shape)}")
    b, num_tokens, d = x.shape
    if d != d_in:
        raise ValueError(f"input has d_in={d} in its last dimension, the module was built for d_in={d_in}")
    if num_tokens > context_length:
        raise ValueError(
            f"num_tokens > context_length: the input has {num_tokens} tokens, "
            f"the module was built for at most {context_length}"
        )
    return b, num_tokens, d
