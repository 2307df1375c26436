"""The book's running example: "Your journey starts with one step" as six 3-D embeddings."""

from __future__ import annotations

import torch

#: The six tokens of the example sentence, in order.
TOKENS: list[str] = ["Your", "journey", "starts", "with", "one", "step"]


def book_inputs() -> torch.Tensor:
    """The six token embeddings of chapter 3, shape ``(6, 3)`` (float32).

    Row ``i`` is the embedding of ``TOKENS[i]``. A new tensor each call, so changing it is harmless.
    """
    return torch.tensor(
        [
            [0.43, 0.15, 0.89],  # Your     (x^1)
            [0.55, 0.87, 0.66],  # journey  (x^2)
            [0.57, 0.85, 0.64],  # starts   (x^3)
            [0.22, 0.58, 0.33],  # with     (x^4)
            [0.77, 0.25, 0.10],  # one      (x^5)
            [0.05, 0.80, 0.55],  # step     (x^6)
        ]
    )


def book_batch() -> torch.Tensor:
    """Two copies of :func:`book_inputs` stacked as a batch, shape ``(2, 6, 3)``."""
    inputs = book_inputs()
    return torch.stack((inputs, inputs), dim=0)
