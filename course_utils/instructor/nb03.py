"""Notebook 03's hidden cases and known mistakes (instructor only; see the package docstring)."""

from __future__ import annotations

import itertools
import math
from typing import Callable

import torch
import torch.nn as nn

from course_utils import reference
from course_utils.checks.core import Case, rand
from course_utils.checks.nb03 import _qkv, after_copy, copy_case
from course_utils.data import book_batch, book_inputs
from course_utils.instructor import Mistake

_NAMES = ("W_query", "W_key", "W_value")

# --------------------------------------------------------------------------------------------
# Hidden cases
# --------------------------------------------------------------------------------------------
HIDDEN = {
    "scaled_dot_product_attention": lambda: [
        Case("Tq=3 queries against Tk=5 keys, d_k=4, d_v=6", _qkv(3, 5, 4, 6, seed=3301, scale=2.0)),
        Case("batch of 2, Tq=4, Tk=7, d_k=8, d_v=5", _qkv(4, 7, 8, 5, 2, seed=3305, scale=2.0)),
        Case("two batch dims (2, 3), T=5, d_k=16", _qkv(5, 5, 16, 16, 2, 3, seed=3309)),
        Case("d_k=64 and a single query", _qkv(1, 6, 64, 4, seed=3313)),
        Case("Tq=6 queries against Tk=2 keys", _qkv(6, 2, 3, 3, seed=3317, scale=3.0)),
    ],
    "SelfAttention_v1": lambda: [
        ((3, 2), [Case("the book's batch of two sentences (2, 6, 3)", (book_batch(),))]),
        ((8, 4), [Case("batch (2, 7, 8) into d_out=4", (rand(2, 7, 8, seed=3321),)),
                  Case("a single token (1, 8)", (rand(1, 8, seed=3322),))]),
        ((5, 5), [Case("two batch dims (3, 2, 4, 5), square weights", (rand(3, 2, 4, 5, seed=3323),))]),
        ((6, 1), [Case("d_out=1 over T=4 tokens", (rand(4, 6, seed=3324),))]),
    ],
    "SelfAttention_v2": lambda: [
        ((3, 2, True), [Case("qkv_bias=True on the book sentence", (book_inputs(),)),
                        Case("qkv_bias=True on the book's batch (2, 6, 3)", (book_batch(),))]),
        ((8, 4), [Case("batch (2, 7, 8) into d_out=4, no bias", (rand(2, 7, 8, seed=3331),))]),
        ((5, 5, True), [Case("qkv_bias=True, two batch dims (3, 2, 4, 5)", (rand(3, 2, 4, 5, seed=3332),))]),
        ((6, 1, False), [Case("d_out=1 on a single token (1, 6)", (rand(1, 6, seed=3333),))]),
    ],
    "copy_v2_weights_to_v1": lambda: [
        copy_case(3, 3, "square d_in=d_out=3", seed=3341),
        copy_case(8, 2, "d_in=8 into d_out=2", seed=3343),
        copy_case(5, 5, "square d_in=d_out=5", seed=3345),
    ],
}


# --------------------------------------------------------------------------------------------
# Known mistakes of the attention itself: (hint, f(queries, keys, values, d_in) -> output or None)
# --------------------------------------------------------------------------------------------
def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1)


def _attend(scores: torch.Tensor, values: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return torch.softmax(scores, dim=dim) @ values


def _scaled_by(size: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "int | None"], "int | None"]):
    """Attention with the scores divided by ``sqrt(size(q, k, v, d_in))`` instead of ``sqrt(d_k)``;
    ``None`` where that size is 1 (no scaling) or ``d_k`` (right) or ``d_k ** 2`` (dividing by d_k)."""
    def wrong(q, k, v, d_in):
        n = size(q, k, v, d_in)
        d_k = k.shape[-1]
        if n is None or n in (1, d_k, d_k * d_k):
            return None
        return _attend(_scores(q, k) / math.sqrt(n), v)
    return wrong


_SHAPE_0 = ("the scores were divided by sqrt(.shape[0]): for 2-D keys or queries that is their number of tokens "
            "(for batched ones, the batch size), not d_k. d_k is the size of each key: keys.shape[-1].")
_SHAPE_1 = ("the scores were divided by sqrt(.shape[1]): that is d_k only for 2-D inputs; for a batch it is the "
            "number of tokens. d_k is keys.shape[-1], whatever the number of dimensions.")
_SWAPPED = "queries and keys are swapped: scores = queries @ keys^T, row i for query i."

ATTENTION: list[tuple[str, Callable]] = [
    ("the scores were not scaled: divide them by sqrt(d_k) before the softmax.",
     lambda q, k, v, d_in: _attend(_scores(q, k), v)),
    ("the scores were divided by d_k (or by sqrt(d_k) twice); divide them once by sqrt(d_k) = d_k ** 0.5.",
     lambda q, k, v, d_in: _attend(_scores(q, k) / k.shape[-1], v)),
    ("the scores were multiplied by sqrt(d_k); divide them by it.",
     lambda q, k, v, d_in: _attend(_scores(q, k) * math.sqrt(k.shape[-1]), v)),
    ("the division by sqrt(d_k) came after the softmax (the softmax came too early, and the weights no longer "
     "sum to 1): divide the scores before the softmax, softmax(scores / sqrt(d_k)).",
     lambda q, k, v, d_in: torch.softmax(_scores(q, k), dim=-1) / math.sqrt(k.shape[-1]) @ v),
    ("the softmax ran over the queries' dimension (dim=-2, which is dim=0 of 2-D scores): each query's row of "
     "weights, along dim=-1, must sum to 1.",
     lambda q, k, v, d_in: _attend(_scores(q, k) / math.sqrt(k.shape[-1]), v, dim=-2)),
    ("the softmax ran over dim=0, which for batched inputs is a batch dimension: use dim=-1, the keys' "
     "dimension whatever the number of batch dimensions.",
     lambda q, k, v, d_in: _attend(_scores(q, k) / math.sqrt(k.shape[-1]), v, dim=0) if q.dim() > 2 else None),
    ("the scores were divided by sqrt of the values' size. d_k is the size of the keys: keys.shape[-1].",
     _scaled_by(lambda q, k, v, d_in: v.shape[-1])),
    (_SHAPE_0, _scaled_by(lambda q, k, v, d_in: k.shape[0])),
    (_SHAPE_0, _scaled_by(lambda q, k, v, d_in: q.shape[0])),
    (_SHAPE_1, _scaled_by(lambda q, k, v, d_in: k.shape[1] if k.dim() > 2 else None)),
    (_SHAPE_1, _scaled_by(lambda q, k, v, d_in: q.shape[1] if q.dim() > 2 else None)),
    ("the scores were divided by sqrt(d_in). d_k is the size of the projected keys (d_out): keys.shape[-1].",
     _scaled_by(lambda q, k, v, d_in: d_in)),
    (_SWAPPED,
     lambda q, k, v, d_in: _attend(_scores(k, q) / math.sqrt(k.shape[-1]), v) if q.shape == k.shape else None),
    ("the scores compare the queries with themselves: scores = queries @ keys^T.",
     lambda q, k, v, d_in: _attend(_scores(q, q) / math.sqrt(k.shape[-1]), v) if q.shape == k.shape else None),
    ("the weights multiply the keys; the output is weights @ values.",
     lambda q, k, v, d_in: _attend(_scores(q, k) / math.sqrt(k.shape[-1]), k)),
]


# --------------------------------------------------------------------------------------------
# Mistaken modules: the reference's constructor, one mistake each
# --------------------------------------------------------------------------------------------
_ORDER_HINT = ("the three projections are created in another order than W_query, W_key, W_value: with a fixed "
               "seed, the order of creation decides which random numbers each one gets. Create them in that order.")


def _v1_attending(f: Callable) -> type:
    class Mistaken(reference.SelfAttention_v1):
        def forward(self, x):
            return f(x @ self.W_query, x @ self.W_key, x @ self.W_value, self.d_in)
    return Mistaken


def _v2_attending(f: Callable) -> type:
    class Mistaken(reference.SelfAttention_v2):
        def forward(self, x):
            return f(self.W_query(x), self.W_key(x), self.W_value(x), self.d_in)
    return Mistaken


def _v1_created_in(order: tuple[str, ...], make: Callable = torch.rand) -> type:
    class Mistaken(nn.Module):
        def __init__(self, d_in, d_out):
            super().__init__()
            self.d_in = d_in
            for name in order:
                setattr(self, name, nn.Parameter(make(d_in, d_out)))
        forward = reference.SelfAttention_v1.forward
    return Mistaken


def _v2_created_in(order: tuple[str, ...]) -> type:
    class Mistaken(nn.Module):
        def __init__(self, d_in, d_out, qkv_bias=False):
            super().__init__()
            self.d_in = d_in
            for name in order:
                setattr(self, name, nn.Linear(d_in, d_out, bias=qkv_bias))
        forward = reference.SelfAttention_v2.forward
    return Mistaken


class _V1StoredTransposed(nn.Module):
    """Matrices created as (d_out, d_in) and used as x @ W.T (only shows when d_in == d_out)."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_out, d_in))
        self.W_key = nn.Parameter(torch.rand(d_out, d_in))
        self.W_value = nn.Parameter(torch.rand(d_out, d_in))

    def forward(self, x):
        return reference.scaled_dot_product_attention(x @ self.W_query.T, x @ self.W_key.T, x @ self.W_value.T)


class _V2WeightNotTransposed(reference.SelfAttention_v2):
    """x @ layer.weight (+ bias) instead of layer(x) (only runs when d_in == d_out)."""

    def forward(self, x):
        def project(layer):
            out = x @ layer.weight
            return out if layer.bias is None else out + layer.bias
        return reference.scaled_dot_product_attention(project(self.W_query), project(self.W_key),
                                                      project(self.W_value))


_ORDERS = [order for order in itertools.permutations(_NAMES) if order != _NAMES]
#: In a module, W_key created before W_query gives exactly what swapping queries and keys in the scores
#: gives (keys @ queries^T): no output tells these two apart, so their hint names both.
_KEY_FIRST = ("W_key", "W_query", "W_value")
_KEY_FIRST_HINT = ("queries and keys are swapped: either W_key is created before W_query (with a fixed seed, the "
                   "order of creation decides which random numbers each one gets: create W_query, W_key, W_value in "
                   "that order), or the scores are keys @ queries^T instead of queries @ keys^T.")


def _order_mistakes(created_in: Callable) -> list[Mistake]:
    return [Mistake(_KEY_FIRST_HINT if order == _KEY_FIRST else _ORDER_HINT, created_in(order)) for order in _ORDERS]


#: The attention mistakes a module can make; swapped queries and keys are named with the creation order.
_MODULE_ATTENTION = [(hint, f) for hint, f in ATTENTION if hint != _SWAPPED]


# --------------------------------------------------------------------------------------------
# Mistaken copies of v2's weights into v1
# --------------------------------------------------------------------------------------------
def _copy_each(source: Callable[[nn.Module, str], torch.Tensor], names: dict | None = None):
    """A copy that puts ``source(sa_v2, from_name)`` into each ``sa_v1.<name>``."""
    def copy(sa_v2, sa_v1):
        with torch.no_grad():
            for name in _NAMES:
                getattr(sa_v1, name).copy_(source(sa_v2, (names or {}).get(name, name)))
    return copy


def _copy_mistake(copy: Callable) -> Callable:
    return lambda v2_weights, v1_weights: after_copy(copy, v2_weights, v1_weights)


MISTAKES = {
    "scaled_dot_product_attention": [
        Mistake(hint, lambda q, k, v, f=f: f(q, k, v, None)) for hint, f in ATTENTION
    ],
    "SelfAttention_v1": (
        _order_mistakes(_v1_created_in)
        + [Mistake("the matrices are drawn with torch.randn (normal); the exercise uses torch.rand (uniform on "
                   "[0, 1)): nn.Parameter(torch.rand(d_in, d_out)).", _v1_created_in(_NAMES, torch.randn)),
           Mistake("the matrices were created as (d_out, d_in) and used as x @ W.T: create each as (d_in, d_out) "
                   "and compute x @ W.", _V1StoredTransposed)]
        + [Mistake(hint, _v1_attending(f)) for hint, f in _MODULE_ATTENTION]
    ),
    "SelfAttention_v2": (
        _order_mistakes(_v2_created_in)
        + [Mistake("nn.Linear stores its weight as (d_out, d_in): call the layer, self.W_query(x), which computes "
                   "x @ weight.T (+ bias), instead of multiplying by the weight yourself.", _V2WeightNotTransposed)]
        + [Mistake(hint, _v2_attending(f)) for hint, f in _MODULE_ATTENTION]
    ),
    "copy_v2_weights_to_v1": (
        [Mistake("sa_v1's matrices hold sa_v2's weights untransposed. nn.Linear stores its weight as (d_out, d_in) "
                 "and computes x @ weight.T, while SelfAttention_v1 computes x @ W: transpose each weight.",
                 _copy_mistake(_copy_each(lambda m, name: getattr(m, name).weight))),
         Mistake("reshape and view keep the numbers in memory order; they do not transpose. nn.Linear computes "
                 "x @ weight.T, SelfAttention_v1 computes x @ W: transpose each weight.",
                 _copy_mistake(lambda sa_v2, sa_v1: _copy_each(
                     lambda m, name: getattr(m, name).weight.reshape(sa_v1.W_query.shape))(sa_v2, sa_v1)))]
        + [Mistake("a projection was copied into another one (e.g. W_key's weight into W_query): copy each "
                   "projection into the one of the same name.",
                   _copy_mistake(_copy_each(lambda m, name: getattr(m, name).weight.T, dict(zip(_NAMES, order)))))
           for order in _ORDERS]
    ),
}
