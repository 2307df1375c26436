"""Self-checks for notebook 01: dot products and attention scores."""

from __future__ import annotations

from typing import Callable

import torch

from course_utils import reference
from course_utils.checks.core import Case, compare_function, rand
from course_utils.data import book_inputs

__all__ = ["check_dot", "check_attention_scores_for_query", "check_attention_scores"]


def check_dot(dot: Callable, hidden: bool = False) -> None:
    """Compare ``dot(x, y)`` with the reference on the book's vectors, odd lengths and edge values."""
    inputs = book_inputs()
    cases = [
        Case("book: x^1 . x^2", (inputs[0], inputs[1])),
        Case("length 1", (torch.tensor([3.0]), torch.tensor([-2.0]))),
        Case("length 7, random", (rand(7, seed=1), rand(7, seed=2))),
    ]
    if hidden:
        cases += [
            Case("orthogonal vectors", (torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 5.0, 0.0]))),
            Case("negative entries, length 13", (rand(13, seed=3, low=-5, high=5), rand(13, seed=4, low=-5, high=5))),
            Case("large values", (torch.full((4,), 1e3), torch.full((4,), -2e3))),
        ]
    compare_function("dot", dot, reference.dot, cases)


def check_attention_scores_for_query(attention_scores_for_query: Callable, hidden: bool = False) -> None:
    """Compare ``attention_scores_for_query(inputs, query)`` on the book's sentence and other sizes."""
    inputs = book_inputs()
    cases = [
        Case("book: query = 'journey'", (inputs, inputs[1])),
        Case("T=5, d=4, random", (rand(5, 4, seed=5), rand(4, seed=6))),
    ]
    if hidden:
        cases += [
            Case("one token", (rand(1, 3, seed=7), rand(3, seed=8))),
            Case("T=9, d=16", (rand(9, 16, seed=9), rand(16, seed=10))),
            Case("query not in inputs, negative", (rand(6, 3, seed=11), -rand(3, seed=12, low=0, high=4))),
        ]
    compare_function("attention_scores_for_query", attention_scores_for_query, reference.attention_scores_for_query, cases)


def check_attention_scores(attention_scores: Callable, hidden: bool = False) -> None:
    """Compare ``attention_scores(inputs)`` on ``(T, d)`` and batched ``(..., T, d)`` inputs."""
    inputs = book_inputs()
    cases = [
        Case("book sentence (6, 3)", (inputs,)),
        Case("batch of 2, T=5, d=4", (rand(2, 5, 4, seed=13),)),
    ]
    if hidden:
        cases += [
            Case("T=1", (rand(1, 8, seed=14),)),
            Case("two batch dims (3, 2, 7, 5)", (rand(3, 2, 7, 5, seed=15),)),
            Case("T=4, d=64", (rand(4, 64, seed=16),)),
        ]
    compare_function("attention_scores", attention_scores, reference.attention_scores, cases)
