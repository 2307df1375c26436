"""Notebook 04's hidden cases and known mistakes (instructor only; see the package docstring).

The mistakes of ``causal_attention_weights`` are functions of ``(queries, keys)``; those of
``CausalAttention`` are mistaken classes with the reference's constructor, built and run with the
same seeds as the reference (so they create their layers in the book's order, unless the order is
the mistake).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from course_utils.checks.core import Case, rand
from course_utils.instructor import Mistake


# ------------------------------------------------------------------------------------------
# Hidden cases (seeds 4400-4499: used nowhere in the student edition)
# ------------------------------------------------------------------------------------------
def _weights_cases() -> list[Case]:
    return [
        Case("hidden: batch of 3, T=7, d_k=3", (rand(3, 7, 3, seed=4401, low=-2, high=2),
                                                  rand(3, 7, 3, seed=4402, low=-2, high=2))),
        Case("hidden: batch and heads (2, 4, 5, 8)", (rand(2, 4, 5, 8, seed=4403, low=-2, high=2),
                                                        rand(2, 4, 5, 8, seed=4404, low=-2, high=2))),
        Case("hidden: a single token, d_k=6", (rand(1, 6, seed=4405), rand(1, 6, seed=4406))),
        Case("hidden: d_k=64, scaling matters", (rand(6, 64, seed=4407, low=-1.5, high=1.5),
                                                   rand(6, 64, seed=4408, low=-1.5, high=1.5))),
        Case("hidden: float64, T=9, d_k=5", (rand(9, 5, seed=4409, low=-3, high=3, dtype=torch.float64),
                                              rand(9, 5, seed=4410, low=-3, high=3, dtype=torch.float64))),
    ]


def _module_cases() -> dict:
    """``configs``: more ``(constructor args, cases)`` for the value comparison; ``causal``: module
    cases (``build`` set) whose module must also have its buffer and see no future on ``args[0]``."""
    return {
        "configs": [
            ((5, 4, 10, 0.3, True), [Case("hidden: qkv_bias=True, (3, 7, 5)", (rand(3, 7, 5, seed=4411),)),
                                     Case("hidden: T equal to context_length 10", (rand(1, 10, 5, seed=4412),))]),
            ((8, 8, 16, 0.1), [Case("hidden: one token, (2, 1, 8)", (rand(2, 1, 8, seed=4413),)),
                               Case("hidden: full context (4, 16, 8)", (rand(4, 16, 8, seed=4414),))]),
            ((3, 1, 4, 0.0), [Case("hidden: d_out=1, (5, 3, 3)", (rand(5, 3, 3, seed=4415),))]),
        ],
        "causal": [
            Case("hidden: causality with qkv_bias, (3, 7, 5)", (rand(3, 7, 5, seed=4416),),
                 build=(5, 4, 10, 0.3, True)),
        ],
    }


HIDDEN = {
    "causal_mask": lambda: [Case(f"hidden: num_tokens={T}", (T,)) for T in (2, 10, 33)],
    "causal_attention_weights": _weights_cases,
    "CausalAttention": _module_cases,
}


# ------------------------------------------------------------------------------------------
# Hints shared by the function and the module
# ------------------------------------------------------------------------------------------
NOT_SCALED = "the scores are not scaled: divide them by sqrt(d_k) (d_k = keys.shape[-1]) before the softmax."
BY_D_K = "the scores are divided by d_k instead of sqrt(d_k): divide them by keys.shape[-1] ** 0.5."
NOT_RENORMALISED = ("each row of weights no longer sums to 1: the future is zeroed after the softmax, which had "
                    "already spread each row over all T keys, and the row is not renormalised. Mask the scores with "
                    "-inf before the softmax (or renormalise: divide each row by its sum).")
SCALED_AFTER_SOFTMAX = ("the weights are divided by sqrt(d_k) after the softmax (the softmax came too early), so each "
                        "row sums to 1/sqrt(d_k): divide the scores by sqrt(d_k) before the softmax.")
INF_AFTER_SOFTMAX = ("the mask is applied with -inf after the softmax: the weights hold -inf. Mask the scores before "
                     "the softmax, which turns -inf into a weight of 0.")
FILLED_WITH_ZERO = ("the masked scores are set to 0 instead of -inf: a score of 0 still gets the weight exp(0) = 1, "
                    "so the future is seen. Fill with -inf (float('-inf') or -torch.inf).")
NO_MASK = ("no mask is applied: every position sees the future. Fill the scores above the diagonal (j > i) with -inf "
           "before the softmax.")
DIAGONAL_MASKED = ("the diagonal is masked too: token 0 may see only itself, so its whole row of scores is masked and "
                   "its weights spread over the future (with -inf: 0/0 = NaN). Mask only j > i (triu with "
                   "diagonal=1).")
INVERTED = ("the mask is inverted: it hides the past (j < i) instead of the future (j > i). Use triu with diagonal=1, "
            "not tril.")
OVER_QUERIES = ("the softmax is over the queries (dim=-2): each row of weights must sum to 1, so take it over the "
                "keys, dim=-1.")


# ------------------------------------------------------------------------------------------
# causal_attention_weights: mistaken functions of (queries, keys)
# ------------------------------------------------------------------------------------------
def _future(scores: torch.Tensor) -> torch.Tensor:
    T = scores.shape[-1]
    return torch.ones(T, T, dtype=torch.bool, device=scores.device).triu(1)


def _with_diagonal(scores: torch.Tensor) -> torch.Tensor:
    return _future(scores) | torch.eye(scores.shape[-1], dtype=torch.bool, device=scores.device)


def _weights(queries: torch.Tensor, keys: torch.Tensor, *, scale: float | None = None, mask=_future,
             fill: float = float("-inf"), dim: int = -1, transpose: bool = False) -> torch.Tensor:
    """Masked softmax of ``queries @ keys^T * scale`` (default scale ``1/sqrt(d_k)``) with one
    thing changed: another scale, mask (``None``: no mask), fill value, softmax dim, or transposed scores."""
    scores = queries @ keys.transpose(-2, -1)
    if transpose:
        scores = scores.transpose(-2, -1)
    scores = scores * (1 / math.sqrt(keys.shape[-1]) if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(mask(scores), fill)
    return torch.softmax(scores, dim=dim)


def _softmax_then_mask(queries: torch.Tensor, keys: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """Softmax of all the scaled scores, then the future set to ``fill``: no renormalising."""
    w = torch.softmax(queries @ keys.transpose(-2, -1) / math.sqrt(keys.shape[-1]), dim=-1)
    return w.masked_fill(_future(w), fill)


def _by_sqrt_t(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
    if queries.shape[-2] == keys.shape[-1]:
        return None  # no different from the right answer
    return _weights(queries, keys, scale=1 / math.sqrt(queries.shape[-2]))


WEIGHTS_MISTAKES = [
    Mistake(NOT_SCALED, lambda q, k: _weights(q, k, scale=1.0)),
    Mistake(BY_D_K, lambda q, k: _weights(q, k, scale=1 / k.shape[-1])),
    Mistake("the scores are multiplied by sqrt(d_k) instead of divided by it.",
            lambda q, k: _weights(q, k, scale=math.sqrt(k.shape[-1]))),
    Mistake("the scores are divided by sqrt(T), the number of tokens; divide by sqrt(d_k), d_k = keys.shape[-1].",
            _by_sqrt_t),
    Mistake(SCALED_AFTER_SOFTMAX, lambda q, k: _weights(q, k, scale=1.0) / math.sqrt(k.shape[-1])),
    Mistake(NOT_RENORMALISED, _softmax_then_mask),
    Mistake(INF_AFTER_SOFTMAX, lambda q, k: _softmax_then_mask(q, k, float("-inf"))),
    Mistake(FILLED_WITH_ZERO, lambda q, k: _weights(q, k, fill=0.0)),
    Mistake(NO_MASK, lambda q, k: _weights(q, k, mask=None)),
    *[Mistake(DIAGONAL_MASKED, lambda q, k, fill=fill: _weights(q, k, fill=fill, mask=_with_diagonal))
      for fill in (float("-inf"), -1e9)],
    Mistake(INVERTED, lambda q, k: _weights(q, k, mask=lambda s: _future(s).mT)),
    Mistake("the mask is inverted: it hides the past and the diagonal, so the last token sees nothing (NaN). True "
            "must mark only the future, j > i: triu with diagonal=1.",
            lambda q, k: _weights(q, k, mask=lambda s: ~_future(s))),
    Mistake("the mask is off by one: triu with diagonal=2 lets each token see the next one; use diagonal=1.",
            lambda q, k: _weights(q, k, mask=lambda s: _future(s).triu(2))),
    Mistake(OVER_QUERIES, lambda q, k: _weights(q, k, dim=-2)),
    Mistake("the scores are transposed: row i must be query i against every key, queries @ keys.transpose(-2, -1), "
            "not keys @ queries.transpose(-2, -1).", lambda q, k: _weights(q, k, transpose=True)),
    Mistake("the softmax is applied twice: once is enough.", lambda q, k: torch.softmax(_weights(q, k), dim=-1)),
]


# ------------------------------------------------------------------------------------------
# CausalAttention: mistaken classes with the reference's constructor
# ------------------------------------------------------------------------------------------
class _Causal(nn.Module):
    """The book's CausalAttention, written so that each mistake overrides one step."""

    order = ("W_query", "W_key", "W_value")

    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        for name in self.order:
            setattr(self, name, nn.Linear(d_in, d_out, bias=qkv_bias))
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.ones(context_length, context_length, dtype=torch.bool).triu(1))
        self.d_in = d_in

    def project(self, x):
        return self.W_query(x), self.W_key(x), self.W_value(x)

    def scores(self, q, k):
        return q @ k.transpose(1, 2)

    def masked(self, scores, fill=float("-inf"), diagonal=False):
        T = scores.shape[-1]
        mask = self.mask[:T, :T]
        if diagonal:
            mask = mask | torch.eye(T, dtype=torch.bool, device=mask.device)
        return scores.masked_fill(mask, fill)

    def weights(self, scores, d_k):
        return torch.softmax(self.masked(scores) / math.sqrt(d_k), dim=-1)

    def forward(self, x):
        q, k, v = self.project(x)
        w = self.dropout(self.weights(self.scores(q, k), k.shape[-1]))
        return w @ v


def _variant(name: str, **methods) -> type:
    return type(name, (_Causal,), methods)


def _dropout_before_softmax(self, x):
    q, k, v = self.project(x)
    s = self.dropout(self.masked(self.scores(q, k)))
    return torch.softmax(s / math.sqrt(k.shape[-1]), dim=-1) @ v


def _dropout_on_context(self, x):
    q, k, v = self.project(x)
    return self.dropout(self.weights(self.scores(q, k), k.shape[-1]) @ v)


def _dropout_on_values(self, x):
    q, k, v = self.project(x)
    return self.weights(self.scores(q, k), k.shape[-1]) @ self.dropout(v)


def _dropout_always(self, x):
    q, k, v = self.project(x)
    w = nn.functional.dropout(self.weights(self.scores(q, k), k.shape[-1]), self.dropout.p, training=True)
    return w @ v


MODULE_MISTAKES = [
    Mistake(NOT_SCALED, _variant("NoScaling", weights=lambda self, s, d_k: torch.softmax(self.masked(s), dim=-1))),
    Mistake("the scores are divided by sqrt(d_in); divide by sqrt(d_k), d_k = keys.shape[-1] = d_out.",
            _variant("ScaledByDin", weights=lambda self, s, d_k: torch.softmax(
                self.masked(s) / math.sqrt(self.d_in), dim=-1))),
    Mistake(BY_D_K, _variant("ScaledByDk", weights=lambda self, s, d_k: torch.softmax(self.masked(s) / d_k, dim=-1))),
    Mistake(SCALED_AFTER_SOFTMAX, _variant("ScaledAfterSoftmax", weights=lambda self, s, d_k: torch.softmax(
        self.masked(s), dim=-1) / math.sqrt(d_k))),
    Mistake(NOT_RENORMALISED, _variant("MaskAfterSoftmax", weights=lambda self, s, d_k: self.masked(
        torch.softmax(s / math.sqrt(d_k), dim=-1), fill=0.0))),
    Mistake(INF_AFTER_SOFTMAX + " The output is then inf or NaN.", _variant(
        "InfAfterSoftmax", weights=lambda self, s, d_k: self.masked(torch.softmax(s / math.sqrt(d_k), dim=-1)))),
    Mistake(FILLED_WITH_ZERO, _variant("FilledWithZero", weights=lambda self, s, d_k: torch.softmax(
        self.masked(s, fill=0.0) / math.sqrt(d_k), dim=-1))),
    Mistake(NO_MASK, _variant("NoMask", weights=lambda self, s, d_k: torch.softmax(s / math.sqrt(d_k), dim=-1))),
    *[Mistake(DIAGONAL_MASKED, _variant("DiagonalMasked", weights=lambda self, s, d_k, fill=fill: torch.softmax(
        self.masked(s, fill=fill, diagonal=True) / math.sqrt(d_k), dim=-1)))
      for fill in (float("-inf"), -1e9)],
    Mistake(INVERTED, _variant("Inverted", weights=lambda self, s, d_k: torch.softmax(
        s.masked_fill(self.mask[:s.shape[-1], :s.shape[-1]].mT, float("-inf")) / math.sqrt(d_k), dim=-1))),
    Mistake(OVER_QUERIES, _variant("SoftmaxOverQueries", weights=lambda self, s, d_k: torch.softmax(
        self.masked(s) / math.sqrt(d_k), dim=1))),
    Mistake("the scores are transposed (keys @ queries^T), or W_query and W_key swap roles (created in another order "
            "than W_query, W_key, W_value?): row i must be query i against every key, "
            "queries @ keys.transpose(1, 2).",
            _variant("Transposed", scores=lambda self, q, k: k @ q.transpose(1, 2))),
    Mistake("the values are not W_value(x): multiply the weights by values = self.W_value(x).",
            _variant("ValuesFromKeys", project=lambda self, x: (self.W_query(x), self.W_key(x), self.W_key(x)))),
    Mistake("dropout is applied to the scores, before the softmax: apply it to the attention weights, after the "
            "softmax.", _variant("DropoutBeforeSoftmax", forward=_dropout_before_softmax)),
    Mistake("dropout is applied to the context vectors: apply it to the attention weights, before multiplying by "
            "the values.", _variant("DropoutOnContext", forward=_dropout_on_context)),
    Mistake("dropout is applied to the values: apply it to the attention weights.",
            _variant("DropoutOnValues", forward=_dropout_on_values)),
    Mistake("dropout is active in eval() mode: use self.dropout (nn.Dropout), or F.dropout(weights, p, "
            "training=self.training).", _variant("DropoutAlways", forward=_dropout_always)),
    *[Mistake(f"the layers are created in the order {', '.join(order)}: create them as W_query, W_key, W_value, so "
              f"that the course's seed gives them the book's weights.",
              _variant("Order_" + "_".join(order), order=order))
      for order in (("W_query", "W_value", "W_key"), ("W_value", "W_query", "W_key"),
                    ("W_value", "W_key", "W_query"), ("W_key", "W_value", "W_query"))],
]

MISTAKES = {
    "causal_attention_weights": WEIGHTS_MISTAKES,
    "CausalAttention": MODULE_MISTAKES,
}
