"""Notebook 06's hidden cases and known mistakes (instructor only; see the package docstring).

The mistakes of both module exercises are mistaken classes with the reference's constructor, built
and run with the same seeds as the reference. ``attention_flops`` has none: its check names a
wrong count by its ratio to the expected one. ``time_cuda_aware`` has none either: its check runs
the timer on a simulated device that counts calls, synchronisations and clock reads, and names a
missing warm-up or synchronisation from those counts.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.checks.core import Case, rand
from course_utils.instructor import Mistake
from course_utils.instructor.nb05 import AttentionCore, core_mistakes, variant


# ------------------------------------------------------------------------------------------
# Hidden cases (seeds 6600-6699 and names starting "hidden:": used nowhere in the student edition)
# ------------------------------------------------------------------------------------------
def _configs() -> list:
    """More ``(constructor args, cases)`` for both module exercises, without dropout."""
    return [
        ((6, 8, 5, 0.0, 4, True), [Case("hidden: qkv_bias=True, T=5", (rand(3, 5, 6, seed=6601),)),
                                   Case("hidden: qkv_bias=True, T=1", (rand(1, 1, 6, seed=6602),))]),
        ((5, 9, 7, 0.0, 3), [Case("hidden: odd sizes, batch 3, T=4", (rand(3, 4, 5, seed=6603),))]),
        ((4, 4, 6, 0.0, 1), [Case("hidden: one head, (2, 6, 4)", (rand(2, 6, 4, seed=6604),))]),
        ((16, 32, 12, 0.0, 8), [Case("hidden: 8 heads of 4, T=11", (rand(2, 11, 16, seed=6605),))]),
    ]


def _combined_cases() -> dict:
    """``configs``: more ``(constructor args, cases)`` for the comparison (dropout ones in train() mode
    too); ``causal``: module cases (``build`` set) whose module must see no future on ``args[0]``."""
    return {
        "configs": [
            ((6, 8, 7, 0.3, 2), [Case("hidden: dropout=0.3, T=7", (rand(2, 7, 6, seed=6606),)),
                                 Case("hidden: dropout=0.3, T=4", (rand(3, 4, 6, seed=6607),))]),
            *_configs(),
        ],
        "causal": [Case("hidden: causality with qkv_bias, T=5", (rand(2, 5, 6, seed=6608),),
                        build=(6, 8, 5, 0.0, 4, True))],
    }


def _sdpa_cases() -> dict:
    """``configs`` (without dropout), ``dropout``: ``(constructor args, cases)`` with dropout, compared in
    ``eval()`` and ``train()`` mode; ``causal`` as for :func:`_combined_cases`."""
    return {
        "configs": _configs(),
        "dropout": [((6, 8, 7, 0.3, 2), [Case("hidden: dropout=0.3, T=7", (rand(2, 7, 6, seed=6609),)),
                                         Case("hidden: dropout=0.3, T=4", (rand(3, 4, 6, seed=6610),))])],
        "causal": [Case("hidden: causality with qkv_bias, T=5", (rand(2, 5, 6, seed=6611),),
                        build=(6, 8, 5, 0.0, 4, True))],
    }


def _flops_cases() -> list[Case]:
    return [
        Case("hidden: odd sizes B=3, H=5, T=7, D=9, causal=True", (3, 5, 7, 9), {"causal": True}),
        Case("hidden: odd sizes B=3, H=5, T=7, D=9, causal=False", (3, 5, 7, 9), {"causal": False}),
        Case("hidden: causal=False given positionally", (2, 4, 16, 8, False)),
        Case("hidden: one token, causal by default", (1, 2, 1, 4)),
        Case("hidden: large, B=16, H=32, T=8192, D=128", (16, 32, 8192, 128)),
        Case("hidden: large, causal=False", (16, 32, 8192, 128), {"causal": False}),
        Case("hidden: an empty batch, B=0", (0, 12, 1024, 64)),
    ]


def _timer_cases() -> list:
    from course_utils.checks.nb06 import TimerCase

    return [
        TimerCase("hidden: simulated GPU, warmup=5, repeats=7, five slow first calls", 5, 7, True, 5, 0.3,
                  (0.020, 0.021, 0.019, 0.200, 0.018, 0.022, 0.0205)),
        TimerCase("hidden: simulated GPU, warmup=0, repeats=1, no slow call", 0, 1, True, 0, 0.0, (0.007,)),
        TimerCase("hidden: simulated GPU, two slow repeats among nine", 2, 9, True, 2, 1.0,
                  (0.005, 0.0051, 0.09, 0.0049, 0.005, 0.08, 0.0052, 0.0048, 0.00505)),
        TimerCase("hidden: CPU without CUDA, warmup=0, repeats=5", 0, 5, False, 0, 0.0,
                  (0.002, 0.004, 0.003, 0.001, 0.005)),
    ]


HIDDEN = {
    "MultiHeadAttentionCombinedQKV": _combined_cases,
    "MHAPyTorchSDPA": _sdpa_cases,
    "attention_flops": _flops_cases,
    "time_cuda_aware": _timer_cases,
}


# ------------------------------------------------------------------------------------------
# The layout of qkv(x): (b, T, 3 * d_out) = all of Q, then all of K, then all of V
# ------------------------------------------------------------------------------------------
LAYOUT = ("The output of qkv(x), shape (b, T, 3 * d_out), holds all of Q first, then all of K, then all of V, each "
          "split into heads: view(b, T, 3, num_heads, head_dim), permute(2, 0, 3, 1, 4) to (3, b, num_heads, T, "
          "head_dim), then unbind(0) gives queries, keys, values in that order.")


def _qkv(self, x):
    b, T, _ = x.shape
    return self.qkv(x).view(b, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)


def _qkv_heads_first(self, x):
    b, T, _ = x.shape
    return self.qkv(x).view(b, T, self.num_heads, 3, self.head_dim).permute(3, 0, 2, 1, 4).unbind(0)


def _qkv_straight(self, x):
    b, T, _ = x.shape
    return self.qkv(x).reshape(3, b, self.num_heads, T, self.head_dim).unbind(0)


def _qkv_split_then_view(self, x):
    b, T, _ = x.shape
    return self.qkv(x).view(b, 3, T, self.num_heads, self.head_dim).permute(1, 0, 3, 2, 4).unbind(0)


def _qkv_order(*order: int):
    def split(self, x):
        parts = _qkv(self, x)
        return tuple(parts[i] for i in order)
    return split


def layout_mistakes(base: type) -> list[Mistake]:
    """Q, K and V cut out of qkv(x) the wrong way."""
    return [
        Mistake("the qkv output is viewed as (b, T, num_heads, 3, head_dim): heads first, so each 'query' mixes "
                "pieces of Q, K and V. " + LAYOUT, variant(base, "HeadsFirst", qkv_split=_qkv_heads_first)),
        Mistake("the qkv output is reshaped straight to (3, b, num_heads, T, head_dim): a reshape only re-reads the "
                "memory in order, which mixes tokens, heads and Q, K, V. " + LAYOUT,
                variant(base, "ReshapedStraight", qkv_split=_qkv_straight)),
        Mistake("the qkv output is viewed as (b, 3, T, ...): T and the 3 are swapped, which mixes tokens. " + LAYOUT,
                variant(base, "ThreeBeforeT", qkv_split=_qkv_split_then_view)),
        *[Mistake(f"queries, keys and values are unbound in the wrong order ({names}). " + LAYOUT,
                  variant(base, "Order" + "".join(map(str, order)), qkv_split=_qkv_order(*order)))
          for order, names in (((1, 0, 2), "keys, queries, values"), ((0, 2, 1), "queries, values, keys"),
                               ((2, 1, 0), "values, keys, queries"))],
    ]


def _merge_without_transpose(self, c):
    b, H, T, D = c.shape
    return c.reshape(b, T, H * D)


# ------------------------------------------------------------------------------------------
# MultiHeadAttentionCombinedQKV: mistaken classes with the reference's constructor
# ------------------------------------------------------------------------------------------
class _Combined(AttentionCore):
    """The course's MultiHeadAttentionCombinedQKV."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.d_out, self.num_heads, self.head_dim = d_out, num_heads, d_out // num_heads
        self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.ones(context_length, context_length, dtype=torch.bool).triu(1))

    qkv_split = _qkv

    def forward(self, x):
        return self.out_proj(self.attend(*self.qkv_split(x)))


COMBINED_MISTAKES = [
    *layout_mistakes(_Combined),
    Mistake("out_proj is created but not applied: return self.out_proj(context).",
            variant(_Combined, "OutProjNotApplied", forward=lambda self, x: self.attend(*self.qkv_split(x)))),
    *core_mistakes(_Combined),
]


# ------------------------------------------------------------------------------------------
# MHAPyTorchSDPA: mistaken classes with the reference's constructor
# ------------------------------------------------------------------------------------------
class _SDPA(nn.Module):
    """The course's MHAPyTorchSDPA, one step per method."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.d_out, self.num_heads, self.head_dim = d_out, num_heads, d_out // num_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)

    qkv_split = _qkv

    def dropout_p(self) -> float:
        return self.dropout if self.training else 0.0

    def core(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout_p(), is_causal=True)

    def merge(self, c):
        b, H, T, D = c.shape
        return c.transpose(1, 2).reshape(b, T, H * D)

    def forward(self, x):
        return self.out_proj(self.merge(self.core(*self.qkv_split(x))))


def _blocked_mask(self, q, k, v, nan_to_num: bool):
    T = q.shape[-2]
    blocked = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=blocked, dropout_p=self.dropout_p())
    return torch.nan_to_num(out) if nan_to_num else out


def _heads_not_moved(self, x):
    b, T, _ = x.shape
    return self.qkv(x).view(b, T, 3, self.num_heads, self.head_dim).permute(2, 0, 1, 3, 4).unbind(0)


def _sdpa(name: str, **methods) -> type:
    return variant(_SDPA, name, **methods)


SDPA_MISTAKES = [
    Mistake("is_causal=True is missing: without it every token attends to every token, the future included. Pass "
            "is_causal=True to F.scaled_dot_product_attention.",
            _sdpa("NotCausal", core=lambda self, q, k, v: F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout_p()))),
    *[Mistake("the mask has the wrong convention for SDPA: its boolean attn_mask marks the positions that MAY be "
              "attended to (True = allowed), the opposite of our causal mask. Pass is_causal=True (or "
              "attn_mask=~mask).",
              _sdpa("BlockedMask", core=lambda self, q, k, v, n=n: _blocked_mask(self, q, k, v, n)))
      for n in (True, False)],
    Mistake("the heads are not moved in front of the tokens: SDPA attends over the second-to-last dimension, so "
            "queries, keys and values must be (b, num_heads, T, head_dim): permute(2, 0, 3, 1, 4).",
            _sdpa("HeadsNotMoved", qkv_split=_heads_not_moved, merge=lambda self, c: c.reshape(
                c.shape[0], c.shape[1], -1))),
    *layout_mistakes(_SDPA),
    Mistake("the queries are scaled by hand as well: SDPA already divides the scores by sqrt(head_dim).",
            _sdpa("ScaledTwice", core=lambda self, q, k, v: F.scaled_dot_product_attention(
                q / math.sqrt(self.head_dim), k, v, dropout_p=self.dropout_p(), is_causal=True))),
    Mistake("the heads are merged without transpose: SDPA returns (b, num_heads, T, head_dim); transpose(1, 2) to "
            "(b, T, num_heads, head_dim) first, then reshape to (b, T, d_out).",
            _sdpa("MergeWithoutTranspose", merge=_merge_without_transpose)),
    Mistake("out_proj is created but not applied: return self.out_proj(context).",
            _sdpa("OutProjNotApplied", forward=lambda self, x: self.merge(self.core(*self.qkv_split(x))))),
    Mistake("dropout is active in eval() mode: pass dropout_p=self.dropout only when self.training, else 0.0.",
            _sdpa("DropoutAlways", dropout_p=lambda self: self.dropout)),
]


MISTAKES = {
    "MultiHeadAttentionCombinedQKV": COMBINED_MISTAKES,
    "MHAPyTorchSDPA": SDPA_MISTAKES,
}
