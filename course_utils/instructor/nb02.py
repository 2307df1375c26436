"""Notebook 02's hidden cases and known mistakes (instructor only; see the package docstring)."""

from __future__ import annotations

import math

import torch

from course_utils.checks.core import Case, rand
from course_utils.instructor import Mistake


# --------------------------------------------------------------------------------------------
# Hidden cases
# --------------------------------------------------------------------------------------------
def _softmax_hidden(stable: bool) -> list[Case]:
    cases = [
        Case("all-negative scores (3, 4), last dim", (rand(3, 4, seed=2201, low=-5, high=-1),)),
        Case("three-dim batch (2, 3, 4), dim=1", (rand(2, 3, 4, seed=2202, low=-2, high=2),), {"dim": 1}),
        Case("tall (4, 3), dim=-2", (rand(4, 3, seed=2203, low=-2, high=2),), {"dim": -2}),
        Case("a single score 0.3", (torch.tensor([0.3]),)),
    ]
    if not stable:
        return cases + [Case("moderate scores up to +-30 (2, 6)", (rand(2, 6, seed=2204, low=-30, high=30),))]
    big = rand(3, 5, seed=2205, low=-1, high=1) * 1000
    return cases + [
        Case("very negative scores [-1000, -1001, -1002]", (torch.tensor([-1000.0, -1001.0, -1002.0]),)),
        Case("rows on very different scales: [1000, 1001] and [0, 1]",
             (torch.tensor([[1000.0, 1001.0], [0.0, 1.0]]),)),
        Case("one row with scores 0, 1000 and 500", (torch.tensor([0.0, 1000.0, 500.0]),)),
        Case("(3, 5) scores up to +-1000 along dim=0", (big,), {"dim": 0}),
        Case("batch (2, 3, 3) with -inf above the diagonal",
             (rand(2, 3, 3, seed=2206).masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), float("-inf")),)),
        Case("float64 scores up to 5000", (torch.tensor([5000.0, 4990.0, -5000.0], dtype=torch.float64),)),
    ]


HIDDEN = {
    "softmax_naive": lambda: _softmax_hidden(stable=False),
    "softmax_stable": lambda: _softmax_hidden(stable=True),
    "context_vectors": lambda: [
        Case("a single token (1, 3)", (rand(1, 3, seed=2211),)),
        Case("two batch dims (3, 2, 4, 5)", (rand(3, 2, 4, 5, seed=2212),)),
        Case("T=7, d=2, negative entries", (rand(7, 2, seed=2213, low=-2, high=2),)),
        Case("large entries: scores in the hundreds (5, 4)", (rand(5, 4, seed=2214, low=-10, high=10),)),
        Case("square T=d=4, batch of 3", (rand(3, 4, 4, seed=2215, low=-2, high=2),)),
    ],
}


# --------------------------------------------------------------------------------------------
# Known mistakes
# --------------------------------------------------------------------------------------------
def _max(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.amax(dim=dim, keepdim=True)


def _same(a: object, b: object) -> bool:
    """Whether two outputs are equal within the checks' tolerance, NaN where NaN is."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
        return False
    a, b = a.double(), b.double()
    if not torch.equal(torch.isnan(a), torch.isnan(b)):
        return False
    return torch.allclose(a.nan_to_num(), b.nan_to_num(), atol=1e-5, rtol=1e-4, equal_nan=True)


def _when_equal(first, *others):
    """``first``'s output where every other mistake gives the same one (else ``None``): two mistakes
    that no case tells apart get a hint that names both, never one of them wrongly."""
    def wrong(*args, **kwargs):
        out = first(*args, **kwargs)
        return out if all(_same(out, other(*args, **kwargs)) for other in others) else None
    return wrong


def _without_nan(mistakes: list[Mistake]) -> list[Mistake]:
    """The mistakes, each applying only where its output holds no NaN.

    A NaN output names no mistake: many give NaN alike (no shift, the mean, the minimum or the
    maximum of the whole tensor subtracted ...), and the check's NaN symptom says what to do.
    """
    def drop_nan(wrong):
        def output(*args, **kwargs):
            out = wrong(*args, **kwargs)
            return None if isinstance(out, torch.Tensor) and torch.isnan(out).any() else out
        return output
    return [Mistake(m.hint, drop_nan(m.wrong)) for m in mistakes]


def _shifted(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` minus the maximum of each slice (the correct shift)."""
    m = _max(x, dim)
    return x - torch.where(torch.isfinite(m), m, torch.zeros_like(m))


_KEEPDIM = ("the sums (or maxima) lost the reduced dimension: without keepdim=True a (6, 6) tensor reduced over "
            "dim=-1 becomes (6,), which broadcasts along the LAST dimension again, so entry [i, j] is divided by "
            "the sum of row j. Use keepdim=True.")
_KEEPDIM_OR_DIM0 = ("entry [i, j] is divided by the sum of column j: either the sum lost the reduced dimension "
                    "(without keepdim=True, a (6, 6) tensor summed over dim=-1 becomes (6,), which broadcasts along "
                    "the last dimension again), or it runs over dim=0 whatever the `dim` argument says. Sum over "
                    "`dim`, with keepdim=True.")
_LAST_DIM = ("the slices are normalised along the last dimension whatever the `dim` argument says: pass dim=dim "
             "to every sum and max.")
_DIM0 = ("the sums run over dim=0 whatever the `dim` argument says (the book's formula for a 1-D tensor): sum "
         "over `dim`, with keepdim=True.")
_WHOLE = "the whole tensor sums to 1: sum only along `dim`, with keepdim=True, so that every slice sums to 1."
_NOT_NORMALISED = "exp(x) was not normalised: divide it by its sum over `dim` so that every slice sums to 1."
_NOT_NORMALISED_STABLE = ("exp(x - max) was not normalised (dividing it by its largest entry, which is 1, changes "
                          "nothing): divide it by its sum over `dim` so that every slice sums to 1.")
_BY_LARGEST = ("exp(x) was divided by its largest entry instead of by the sum over `dim`: the weights must sum "
               "to 1, not peak at 1.")


def _softmax_mistakes(stable: bool) -> list[Mistake]:
    """Mistakes of a softmax written from exp and sum; ``stable`` adds those of the max shift."""
    def naive_form(f):
        """``f(x, dim)`` written on the scores as they are (naive) or shifted by the max (stable)."""
        return lambda x, dim=-1: f(_shifted(x, dim) if stable else x, dim)

    common = [
        Mistake("exp is missing: the scores were divided by their sum. Softmax is exp(x) / sum(exp(x)), which "
                "also keeps negative scores from giving negative weights.",
                naive_form(lambda x, dim: x / x.sum(dim=dim, keepdim=True))),
        Mistake("exp(x) must be divided by the sum of exp(x) over `dim`, not by the sum of x.",
                naive_form(lambda x, dim: x.exp() / x.sum(dim=dim, keepdim=True))),
        # Shifted by the maximum, exp's largest entry is 1: dividing by it normalises nothing either.
        Mistake(_NOT_NORMALISED_STABLE if stable else _NOT_NORMALISED, naive_form(lambda x, dim: x.exp())),
        # On a symmetric score table, e / e.sum(dim=-1) and e / e.sum(dim=0) agree: say both.
        Mistake(_KEEPDIM_OR_DIM0, _when_equal(naive_form(lambda x, dim: x.exp() / x.exp().sum(dim=dim)),
                                              naive_form(lambda x, dim: x.exp() / x.exp().sum(dim=0)))),
        Mistake(_KEEPDIM, naive_form(lambda x, dim: x.exp() / x.exp().sum(dim=dim))),
        Mistake(_DIM0, naive_form(lambda x, dim: x.exp() / x.exp().sum(dim=0))),
        Mistake(_DIM0, naive_form(lambda x, dim: x.exp() / x.exp().sum(dim=0, keepdim=True))),
        Mistake(_LAST_DIM, naive_form(lambda x, dim: x.exp() / x.exp().sum(dim=-1, keepdim=True))),
        Mistake(_WHOLE, naive_form(lambda x, dim: x.exp() / x.exp().sum())),
        Mistake(_BY_LARGEST, naive_form(lambda x, dim: x.exp() / x.exp().amax(dim=dim, keepdim=True))),
        Mistake("these are log-probabilities (x - logsumexp(x)): softmax is their exp, every weight in [0, 1].",
                lambda x, dim=-1: x - torch.logsumexp(x, dim=dim, keepdim=True)),
    ]
    if not stable:
        return _without_nan(common)

    def shift(by):
        """The softmax of ``x`` shifted by ``by(x, dim)`` instead of each slice's maximum."""
        return lambda x, dim=-1: _naive(x - by(x, dim), dim)

    max_no_keepdim = shift(lambda x, dim: x.amax(dim=dim))
    max_dim0 = shift(lambda x, dim: _max(x, 0))
    # Shifts that only give NaN or the right answer (no shift, the mean, the minimum or the maximum of
    # the whole tensor) are left to the check's NaN symptom: a NaN output names no single mistake.
    return _without_nan([
        # On a symmetric score table, x - x.amax(dim=-1) and x - x.amax(dim=0, keepdim=True) agree.
        Mistake("each entry [i, j] is shifted by the maximum of column j: either the maximum lost its dimension "
                "(without keepdim=True, x.amax(dim=-1) of a (6, 6) tensor is (6,), which lines up with the last "
                "dimension again), or it is taken along dim=0 whatever `dim` says. Take the maximum along `dim`, "
                "with keepdim=True.", _when_equal(max_no_keepdim, max_dim0)),
        Mistake("the maximum lost its dimension: without keepdim=True, x.max(dim=dim).values (or amax) no "
                "longer lines up with x, so each slice is shifted by another slice's maximum. Use keepdim=True.",
                max_no_keepdim),
        Mistake("the maximum is taken along the last dimension whatever `dim` says, so each slice along `dim` "
                "is shifted by several different values: take the maximum along `dim`.",
                shift(lambda x, dim: _max(x, -1))),
        Mistake("the maximum is taken along dim=0 whatever `dim` says, so each slice along `dim` is shifted by "
                "several different values: take the maximum along `dim`.", max_dim0),
        Mistake("clamping the scores changes the result (every score above the bound becomes the same): shift "
                "every entry by its slice's maximum instead, which leaves the softmax unchanged.",
                lambda x, dim=-1: _naive(x.clamp(max=80.0), dim)),
        Mistake("only the numerator was shifted by the maximum: the sum must be taken over the same shifted "
                "exponentials, exp(x - max), or the slice no longer sums to 1.",
                lambda x, dim=-1: (x - _max(x, dim)).exp() / x.exp().sum(dim=dim, keepdim=True)),
        Mistake(_LAST_DIM, lambda x, dim=-1: _naive(x - _max(x, -1), -1)),
    ] + common)


def _naive(x: torch.Tensor, dim: int) -> torch.Tensor:
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)


def _scores(x: torch.Tensor) -> torch.Tensor:
    return x @ x.transpose(-2, -1)


_WRONG_DIM = ("the softmax ran over the queries' dimension (dim=-2: dim=0 of a (T, T) table, dim=1 of a batch "
              "(b, T, T)), so the columns sum to 1. Row i of the weights must be query i's distribution over "
              "the keys: softmax(scores, dim=-1).")


def _fixed_dim(d: int):
    def wrong(x: torch.Tensor) -> torch.Tensor | None:
        if d >= x.dim() - 2:
            return None  # that dim is -2 or -1 of the scores: another mistake, or none
        return torch.softmax(_scores(x), dim=d) @ x
    return wrong


def _batch_dim_hint(d: int) -> str:
    return (f"the softmax ran over dim={d}, which for a batched input is a batch dimension, not the keys: "
            f"use dim=-1, which is the keys' dimension whatever the number of batch dimensions.")


MISTAKES = {
    "softmax_naive": _softmax_mistakes(stable=False),
    "softmax_stable": _softmax_mistakes(stable=True),
    "context_vectors": _without_nan([
        Mistake("these are the attention weights (..., T, T): multiply them by the inputs to get the context "
                "vectors (..., T, d).", lambda x: torch.softmax(_scores(x), dim=-1)),
        Mistake(_WRONG_DIM, lambda x: torch.softmax(_scores(x), dim=-2) @ x),
        Mistake(_batch_dim_hint(0), _fixed_dim(0)),
        Mistake(_batch_dim_hint(1), _fixed_dim(1)),
        Mistake("no softmax: the raw scores were used as weights. Normalise each row with softmax first.",
                lambda x: _scores(x) @ x),
        Mistake("the rows of scores were divided by their sum instead of softmaxed: that is not a softmax and "
                "breaks for negative scores. Use softmax(scores, dim=-1).",
                lambda x: (_scores(x) / _scores(x).sum(dim=-1, keepdim=True)) @ x),
        Mistake("exp(scores) was not normalised: each row of weights must sum to 1 (softmax divides by the "
                "row's sum).", lambda x: _scores(x).exp() @ x),
        Mistake("the scores were divided by sqrt(d) before the softmax: scaling comes in notebook 03; here the "
                "weights are softmax(scores) of the raw dot products.",
                lambda x: torch.softmax(_scores(x) / math.sqrt(x.shape[-1]), dim=-1) @ x),
        Mistake("the scores were divided by d before the softmax: here the weights are softmax(scores) of the "
                "raw dot products, unscaled.", lambda x: torch.softmax(_scores(x) / x.shape[-1], dim=-1) @ x),
        Mistake("the softmax came too early: it was applied to the inputs before the dot products. Compute the "
                "scores inputs @ inputs^T first, then softmax each row of scores.",
                lambda x: (torch.softmax(x, dim=-1) @ x.transpose(-2, -1)) @ x),
        Mistake("the softmax was applied twice: softmax the scores once, then multiply the weights by the inputs.",
                lambda x: torch.softmax(torch.softmax(_scores(x), dim=-1), dim=-1) @ x),
        Mistake("the product is the wrong way round: the context vectors are weights @ inputs, (T, T) @ (T, d).",
                lambda x: x @ torch.softmax(_scores(x), dim=-1) if x.shape[-1] == x.shape[-2] else None),
        Mistake("the scores compare features, inputs^T @ inputs (d, d), instead of tokens, inputs @ inputs^T "
                "(T, T): row i of the scores holds token i's dot products with every token.",
                lambda x: x @ torch.softmax(x.transpose(-2, -1) @ x, dim=-1)),
        Mistake("exp overflowed: these inputs give scores in the hundreds, and exp(89) is inf in float32. Use "
                "your softmax_stable (or torch.softmax), not softmax_naive.",
                lambda x: _naive(_scores(x), -1) @ x),
    ]),
}
