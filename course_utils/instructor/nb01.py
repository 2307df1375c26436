"""Notebook 01's hidden cases and known mistakes (instructor only; see the package docstring)."""

from __future__ import annotations

import torch

from course_utils.checks.core import Case, rand
from course_utils.instructor import Mistake

HIDDEN = {
    "dot": lambda: [
        Case("orthogonal vectors", (torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 5.0, 0.0]))),
        Case("negative entries, length 13", (rand(13, seed=3, low=-5, high=5), rand(13, seed=4, low=-5, high=5))),
        Case("large values", (torch.full((4,), 1e3), torch.full((4,), -2e3))),
    ],
    "attention_scores_for_query": lambda: [
        Case("one token", (rand(1, 3, seed=7), rand(3, seed=8))),
        Case("T=9, d=16", (rand(9, 16, seed=9), rand(16, seed=10))),
        Case("query not in inputs, negative", (rand(6, 3, seed=11), -rand(3, seed=12, low=0, high=4))),
    ],
    "attention_scores": lambda: [
        Case("T=1", (rand(1, 8, seed=14),)),
        Case("two batch dims (3, 2, 7, 5)", (rand(3, 2, 7, 5, seed=15),)),
        Case("T=4, d=64", (rand(4, 64, seed=16),)),
    ],
}

MISTAKES = {
    "dot": [
        Mistake("the products are multiplied together instead of added: start from 0 and add x[i] * y[i].",
                lambda x, y: torch.prod(x * y)),
        Mistake("only the last product is returned: add each x[i] * y[i] to a running total (+=), "
                "do not overwrite it.", lambda x, y: x[-1] * y[-1]),
        Mistake("that is the sum of the entries of x and y, not of their products: add x[i] * y[i].",
                lambda x, y: x.sum() + y.sum()),
        Mistake("the loop stops one entry early: range(len(x)) visits every index.",
                lambda x, y: (x[:-1] * y[:-1]).sum() if len(x) > 1 else None),
    ],
    "attention_scores_for_query": [
        Mistake("every token is scored against inputs[0], not against `query`: use the query argument.",
                lambda inputs, query: inputs @ inputs[0]),
        Mistake("that is the cosine similarity (divided by both lengths); attention scores are the raw dot products.",
                lambda inputs, query: (inputs @ query) / (inputs.norm(dim=-1) * query.norm())),
        Mistake("the scores are softmaxed: this exercise wants the raw dot products; softmax comes in notebook 02.",
                lambda inputs, query: torch.softmax(inputs @ query, dim=-1)),
        Mistake("the scores are divided by sqrt(d): this exercise wants the raw dot products; scaling comes "
                "in notebook 03.", lambda inputs, query: inputs @ query / inputs.shape[-1] ** 0.5),
    ],
    "attention_scores": [
        Mistake("the scores are softmaxed: this exercise wants the raw dot products; softmax comes in notebook 02.",
                lambda inputs: torch.softmax(inputs @ inputs.transpose(-2, -1), dim=-1)),
        Mistake("the scores are divided by sqrt(d): this exercise wants the raw dot products; scaling comes "
                "in notebook 03.", lambda inputs: inputs @ inputs.transpose(-2, -1) / inputs.shape[-1] ** 0.5),
    ],
}
