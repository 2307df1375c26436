"""Self-checks for notebook 02: softmax and context vectors.

Besides comparing with the reference, these checks recognise the common mistakes by their
symptoms (weights that sum to one along the wrong dimension, NaN from an overflowing ``exp``,
negative "weights" from plain sum-normalisation) and say so in the failure message.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from course_utils import reference
from course_utils.checks.core import Case, compare_function, rand, tensor_difference
from course_utils.data import book_inputs

__all__ = ["check_softmax_naive", "check_softmax_stable", "check_context_vectors"]

#: ``exp`` of anything above this is ``inf`` in float32.
_EXP_OVERFLOW = 88.0

def _close(a: torch.Tensor, b: object) -> bool:
    return isinstance(b, torch.Tensor) and tensor_difference(a, b) is None


# --------------------------------------------------------------------------------------------
# softmax
# --------------------------------------------------------------------------------------------
def softmax_hint(x: torch.Tensor, dim: int, got: object) -> str | None:
    """Name the softmax mistake that explains ``got`` (the student's ``softmax(x, dim)``), if any."""
    if not isinstance(got, torch.Tensor) or got.shape != x.shape:
        return None
    g = got.detach().double()
    finite_x = x[torch.isfinite(x)]
    if torch.isnan(g).any():
        if torch.isinf(x).any():
            return ("an entry of -inf must get weight exactly 0 (exp(-inf) = 0). NaN comes from inf - inf or "
                    "0 / 0: subtract the maximum of each slice along `dim` (it is finite when the slice has a "
                    "finite entry), not the mean or the minimum.")
        if finite_x.numel() and finite_x.abs().max() > _EXP_OVERFLOW:
            return ("exp overflowed to inf (or every entry of a slice underflowed to 0). Subtract the maximum "
                    "of each slice along `dim` first: x - x.amax(dim=dim, keepdim=True). The maximum of the "
                    "whole tensor is not enough when slices have very different scales.")
        spread = x.amax(dim=dim) - x.amin(dim=dim)
        if spread.max() > 2 * _EXP_OVERFLOW:
            return "exp overflowed: shift by the maximum of each slice, not by the mean or the minimum."
        return None
    if (g < -1e-7).any():
        return ("softmax weights are never negative. Did you divide the scores by their sum instead of "
                "exponentiating them first?")
    if x.dim() == 0:
        return None
    sums = g.sum(dim=dim)
    if torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
        if x.dim() >= 2:
            return ("each slice sums to 1 but the values are off: is every entry of a slice shifted by that "
                    "slice's own maximum, and divided by that slice's own sum? Without keepdim=True a reduced "
                    "tensor broadcasts along the wrong dimension. (Clamping the scores changes the result.)")
        return None
    dim_n = dim % x.dim()
    for other in range(x.dim()):
        if other != dim_n:
            other_sums = g.sum(dim=other)
            if torch.allclose(other_sums, torch.ones_like(other_sums), atol=1e-4):
                return (f"your weights sum to 1 along dim={other}, but they must sum to 1 along dim={dim} "
                        f"(the `dim` argument). Sum over `dim`, not a fixed dimension, and keep it with "
                        f"keepdim=True so that the division broadcasts along that same dimension.")
    if math.isclose(float(g.sum()), 1.0, abs_tol=1e-4):
        return "the whole tensor sums to 1: sum only along `dim`, with keepdim=True, so that every slice sums to 1."
    shown = ", ".join(f"{v:.4g}" for v in sums.flatten()[:4].tolist())
    return (f"every slice along dim={dim} must sum to 1; yours sum to [{shown}{', ...' if sums.numel() > 4 else ''}]. "
            "Divide exp(x) by the SUM of exp(x) over `dim`, with keepdim=True so that it broadcasts back "
            "along the same dimension.")


def _softmax_diagnose(case: Case, got: object) -> str | None:
    x = case.args[0]
    dim = case.kwargs.get("dim", case.args[1] if len(case.args) > 1 else -1)
    return softmax_hint(x, dim, got)


def _softmax_cases(hidden: bool, stable: bool) -> list[Case]:
    inputs = book_inputs()
    scores_2 = inputs @ inputs[1]  # (6,): the book's scores of 'journey'
    cases = [
        Case("book: scores of 'journey' (6,)", (scores_2,)),
        Case("book: score table (6, 6), dim=-1", (inputs @ inputs.T,), {"dim": -1}),
        Case("(2, 5), dim=0", (rand(2, 5, seed=21, low=-3, high=3),), {"dim": 0}),
    ]
    if stable:
        cases += [
            Case("large scores [1000, 1001, 1002]", (torch.tensor([1000.0, 1001.0, 1002.0]),)),
            Case("(2, 4) with some -inf entries", (torch.tensor([[0.5, float("-inf"), 2.0, -1.0],
                                                                  [float("-inf"), float("-inf"), 3.0, 3.0]]),)),
        ]
    if hidden:
        cases += [
            Case("negative scores (3, 4), dim=-1", (rand(3, 4, seed=22, low=-5, high=-1),)),
            Case("batch (2, 3, 4), dim=1", (rand(2, 3, 4, seed=23, low=-2, high=2),), {"dim": 1}),
            Case("(4, 3), dim=-2", (rand(4, 3, seed=24, low=-2, high=2),), {"dim": -2}),
            Case("a single entry", (torch.tensor([0.3]),)),
        ]
    if hidden and stable:
        big = rand(3, 5, seed=25, low=-1, high=1) * 1000
        cases += [
            Case("very negative scores [-1000, -1001, -1002]", (torch.tensor([-1000.0, -1001.0, -1002.0]),)),
            Case("rows on very different scales: [1000, 1001] and [0, 1]",
                 (torch.tensor([[1000.0, 1001.0], [0.0, 1.0]]),)),
            Case("one row with scores 0 and 1000", (torch.tensor([0.0, 1000.0, 500.0]),)),
            Case("(3, 5) scores up to +-1000, dim=0", (big,), {"dim": 0}),
            Case("batch (2, 3, 3) with -inf above the diagonal",
                 (rand(2, 3, 3, seed=26).masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), float("-inf")),)),
            Case("float64 scores up to 5000", (torch.tensor([5000.0, 4990.0, -5000.0], dtype=torch.float64),)),
        ]
    elif hidden:
        cases += [Case("scores up to +-30", (rand(2, 6, seed=27, low=-30, high=30),))]
    return cases


def check_softmax_naive(softmax_naive: Callable, hidden: bool = False) -> None:
    """Compare ``softmax_naive(x, dim)`` with the reference on moderate inputs (no overflow cases)."""
    compare_function("softmax_naive", softmax_naive, reference.softmax_naive,
                     _softmax_cases(hidden, stable=False), diagnose=_softmax_diagnose)


def check_softmax_stable(softmax_stable: Callable, hidden: bool = False) -> None:
    """Compare ``softmax_stable(x, dim)`` with the reference, including scores in the 1000s and ``-inf``.

    A slice made only of ``-inf`` has no defined softmax and is never tested.
    """
    compare_function("softmax_stable", softmax_stable, reference.softmax_stable,
                     _softmax_cases(hidden, stable=True), diagnose=_softmax_diagnose)


# --------------------------------------------------------------------------------------------
# context vectors
# --------------------------------------------------------------------------------------------
def _context_diagnose(case: Case, got: object) -> str | None:
    x = case.args[0]
    if isinstance(got, Exception) and x.dim() > 2:
        return "`.T` reverses every dimension of a batch (..., T, d): use x.transpose(-2, -1) to swap only the last two."
    if not isinstance(got, torch.Tensor):
        return None
    if got.shape != x.shape:
        if x.dim() > 2:
            return ("the output must have the same shape as the input, (..., T, d). `.T` reverses every "
                    "dimension of a batch: use x.transpose(-2, -1).")
        return "the output must have the same shape as the input, (T, d): weights (T, T) @ inputs (T, d)."
    scores = x @ x.transpose(-2, -1)
    if torch.isnan(got).any():
        return ("NaN: the scores are large enough to overflow exp. Use your softmax_stable (or torch.softmax), "
                "not softmax_naive.")
    d = x.shape[-1]
    variants = [
        (torch.softmax(scores, dim=-2) @ x,
         "the softmax ran over dim=-2 (columns). Row i of the weights must be query i's distribution "
         "over the keys: softmax(scores, dim=-1)."),
        (scores @ x, "no softmax: the raw scores were used as weights. Normalise each row with softmax first."),
        ((scores / scores.sum(dim=-1, keepdim=True)) @ x,
         "the rows were divided by their sum. That fails for negative scores; use softmax."),
        (torch.softmax(scores / math.sqrt(d), dim=-1) @ x,
         "the scores were divided by sqrt(d). Scaling comes in notebook 03; here use softmax(scores) directly."),
        (x @ torch.softmax(scores, dim=-1).transpose(-2, -1) if x.shape[-1] == x.shape[-2] else None,
         "the product is the wrong way round: weights @ inputs, (T, T) @ (T, d)."),
    ]
    for value, hint in variants:
        if value is not None and _close(value, got):
            return hint
    if _close(torch.softmax(scores, dim=-1), got):
        return "these are the attention weights; multiply them by the inputs to get the context vectors."
    return None


def check_context_vectors(context_vectors: Callable, hidden: bool = False) -> None:
    """Compare ``context_vectors(inputs)`` on the book's sentence and batched ``(..., T, d)`` inputs."""
    cases = [
        Case("book sentence (6, 3)", (book_inputs(),)),
        Case("batch of 2, T=5, d=4", (rand(2, 5, 4, seed=31),)),
    ]
    if hidden:
        cases += [
            Case("T=1", (rand(1, 3, seed=32),)),
            Case("two batch dims (3, 2, 4, 5)", (rand(3, 2, 4, 5, seed=33),)),
            Case("T=7, d=2, negative entries", (rand(7, 2, seed=34, low=-2, high=2),)),
            Case("large entries: scores in the hundreds (5, 4)", (rand(5, 4, seed=35, low=-10, high=10),)),
        ]
    compare_function("context_vectors", context_vectors, reference.context_vectors, cases, diagnose=_context_diagnose)
