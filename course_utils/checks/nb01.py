"""Self-checks for notebook 01: dot products and attention scores, each declared as a spec
(:mod:`course_utils.checks.spec`): its cases, and how a failing case is explained."""

from __future__ import annotations

import torch

from course_utils.checks.core import Case, rand
from course_utils.checks.spec import declare, function_spec
from course_utils.data import book_inputs

__all__ = ["check_dot", "check_attention_scores_for_query", "check_attention_scores"]


def _dot_cases() -> list[Case]:
    inputs = book_inputs()
    return [
        Case("book: x^1 . x^2", (inputs[0], inputs[1])),
        Case("length 1", (torch.tensor([3.0]), torch.tensor([-2.0]))),
        Case("length 7, random", (rand(7, seed=1), rand(7, seed=2))),
    ]


check_dot = declare(function_spec("dot", _dot_cases), """Compare ``dot(x, y)`` with the reference on the
book's vectors, odd lengths and edge values.""")


def _fixed_size_hint(case: Case, got: object, want: object) -> str | None:
    if isinstance(got, IndexError):
        return "does your code assume a fixed number of tokens? Loop over len(inputs) (or inputs.shape[0]) tokens."
    return None


def _query_cases() -> list[Case]:
    inputs = book_inputs()
    return [
        Case("book: query = 'journey'", (inputs, inputs[1])),
        Case("T=5, d=4, random", (rand(5, 4, seed=5), rand(4, seed=6))),
    ]


check_attention_scores_for_query = declare(
    function_spec("attention_scores_for_query", _query_cases, diagnose=_fixed_size_hint),
    """Compare ``attention_scores_for_query(inputs, query)`` on the book's sentence and other sizes.""")


def _batch_transpose_hint(case: Case, got: object, want: object) -> str | None:
    if isinstance(got, Exception) and case.args[0].dim() > 2:
        return ("with a batch (b, T, d) your code fails: `.T` reverses every dimension. Use "
                "inputs.transpose(-2, -1) (or inputs.mT) to swap only the last two.")
    return None


def _scores_cases() -> list[Case]:
    return [
        Case("book sentence (6, 3)", (book_inputs(),)),
        Case("batch of 2, T=5, d=4", (rand(2, 5, 4, seed=13),)),
    ]


check_attention_scores = declare(
    function_spec("attention_scores", _scores_cases, diagnose=_batch_transpose_hint),
    """Compare ``attention_scores(inputs)`` on ``(T, d)`` and batched ``(..., T, d)`` inputs.""")
