"""Self-checks for notebook 01: dot products and attention scores."""

from __future__ import annotations

from typing import Callable

import torch

from course_utils.checks.core import Case, check, compare_function, hidden_cases, rand
from course_utils.data import book_inputs

__all__ = ["check_dot", "check_attention_scores_for_query", "check_attention_scores"]


@check
def check_dot(dot: Callable, hidden: bool = False) -> None:
    """Compare ``dot(x, y)`` with the reference on the book's vectors, odd lengths and edge values."""
    inputs = book_inputs()
    cases = [
        Case("book: x^1 . x^2", (inputs[0], inputs[1])),
        Case("length 1", (torch.tensor([3.0]), torch.tensor([-2.0]))),
        Case("length 7, random", (rand(7, seed=1), rand(7, seed=2))),
    ]
    compare_function("dot", dot, cases + (hidden_cases("dot") if hidden else []))


def _fixed_size_hint(case: Case, got: object, want: object) -> str | None:
    if isinstance(got, IndexError):
        return "does your code assume a fixed number of tokens? Loop over len(inputs) (or inputs.shape[0]) tokens."
    return None


@check
def check_attention_scores_for_query(attention_scores_for_query: Callable, hidden: bool = False) -> None:
    """Compare ``attention_scores_for_query(inputs, query)`` on the book's sentence and other sizes."""
    inputs = book_inputs()
    cases = [
        Case("book: query = 'journey'", (inputs, inputs[1])),
        Case("T=5, d=4, random", (rand(5, 4, seed=5), rand(4, seed=6))),
    ]
    compare_function("attention_scores_for_query", attention_scores_for_query,
                     cases + (hidden_cases("attention_scores_for_query") if hidden else []),
                     diagnose=_fixed_size_hint)


def _batch_transpose_hint(case: Case, got: object, want: object) -> str | None:
    if isinstance(got, Exception) and case.args[0].dim() > 2:
        return ("with a batch (b, T, d) your code fails: `.T` reverses every dimension. Use "
                "inputs.transpose(-2, -1) (or inputs.mT) to swap only the last two.")
    return None


@check
def check_attention_scores(attention_scores: Callable, hidden: bool = False) -> None:
    """Compare ``attention_scores(inputs)`` on ``(T, d)`` and batched ``(..., T, d)`` inputs."""
    inputs = book_inputs()
    cases = [
        Case("book sentence (6, 3)", (inputs,)),
        Case("batch of 2, T=5, d=4", (rand(2, 5, 4, seed=13),)),
    ]
    compare_function("attention_scores", attention_scores,
                     cases + (hidden_cases("attention_scores") if hidden else []), diagnose=_batch_transpose_hint)
