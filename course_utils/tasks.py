"""Notebook 09's task, generated on the fly: reverse a sequence of digits.

A sequence is ``num_digits`` random digits, the separator ``|``, then the same digits reversed::

    3 1 4 1 5 9 2 6 | 6 2 9 5 1 4 1 3

A causal language model reads it left to right and predicts every next token. Only the tokens after
the separator (the *answer*) can be predicted; the digits before it are random. So a batch is
``(inputs, targets, answer_mask)``: the sequence without its last token, the sequence without its
first token (the next token at every position), and a bool mask that is True where the target is an
answer token. No download, no file: every batch is drawn from a ``torch.Generator``.

Held-out sequences are drawn once, from their own seed, and training batches never contain one of
them (a training row that equals a held-out sequence is drawn again).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

#: Tokens 0-9 are the digits; token 10 is the separator.
NUM_SYMBOLS = 10
SEP = 10
VOCAB_SIZE = 11
#: How each token id is written.
TOKEN_TEXT = [str(d) for d in range(NUM_SYMBOLS)] + ["|"]


class Batch(NamedTuple):
    """One batch of the task: ``inputs``, ``targets`` and ``answer_mask``, each ``(b, 2 * num_digits)``."""

    inputs: torch.Tensor  # token ids, long
    targets: torch.Tensor  # the next token at every position, long
    answer_mask: torch.Tensor  # bool: True where the target is an answer token


def sequences_from_digits(digits: torch.Tensor) -> torch.Tensor:
    """``(b, n)`` digits -> ``(b, 2n + 1)`` sequences: the digits, the separator, the digits reversed."""
    if digits.dim() != 2:
        raise ValueError(f"digits must have shape (batch, num_digits), got {tuple(digits.shape)}")
    if digits.numel() and (digits.min() < 0 or digits.max() >= NUM_SYMBOLS):
        raise ValueError(f"digits must lie in 0..{NUM_SYMBOLS - 1}")
    sep = torch.full((digits.shape[0], 1), SEP, dtype=torch.long, device=digits.device)  # (b, 1)
    return torch.cat([digits.long(), sep, digits.long().flip(1)], dim=1)  # (b, 2n + 1)


def batch_from_digits(digits: torch.Tensor) -> Batch:
    """The :class:`Batch` of the reversal sequences of ``digits`` ``(b, n)``; every tensor is ``(b, 2n)``."""
    sequences = sequences_from_digits(digits)  # (b, 2n + 1)
    n = digits.shape[1]
    inputs, targets = sequences[:, :-1], sequences[:, 1:]  # (b, 2n) each: position t predicts token t + 1
    answer_mask = torch.zeros_like(inputs, dtype=torch.bool)
    answer_mask[:, n:] = True  # inputs n .. 2n-1 (the separator and the answer so far) predict the answer
    return Batch(inputs, targets, answer_mask)


def _codes(digits: torch.Tensor) -> torch.Tensor:
    """One integer per row (its digits read as a number), to compare rows fast."""
    powers = NUM_SYMBOLS ** torch.arange(digits.shape[1] - 1, -1, -1, dtype=torch.long, device=digits.device)
    return (digits.long() * powers).sum(dim=1)


class ReversalTask:
    """Digit reversal with ``num_digits`` digits, and ``held_out_size`` held-out sequences.

    ``context_length`` (``2 * num_digits``) is the length of ``inputs``; ``vocab_size`` is 11.
    """

    vocab_size = VOCAB_SIZE

    def __init__(self, num_digits: int = 8, held_out_size: int = 1000, seed: int = 0):
        if num_digits < 1 or num_digits > 15:
            raise ValueError(f"num_digits must lie in 1..15, got {num_digits}")
        self.num_digits = num_digits
        self.context_length = 2 * num_digits
        generator = torch.Generator().manual_seed(seed)
        self.held_out_digits = torch.randint(0, NUM_SYMBOLS, (held_out_size, num_digits), generator=generator)
        self._held_out_codes = _codes(self.held_out_digits)

    def held_out(self) -> Batch:
        """The held-out sequences as one batch."""
        return batch_from_digits(self.held_out_digits)

    def sample_digits(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        """``(batch_size, num_digits)`` random digits, none of them a held-out sequence."""
        digits = torch.randint(0, NUM_SYMBOLS, (batch_size, self.num_digits), generator=generator)
        while True:
            seen = torch.isin(_codes(digits), self._held_out_codes)  # (batch_size,)
            if not seen.any():
                return digits
            digits[seen] = torch.randint(0, NUM_SYMBOLS, (int(seen.sum()), self.num_digits), generator=generator)

    def batch(self, batch_size: int, generator: torch.Generator) -> Batch:
        """A training batch of ``batch_size`` sequences."""
        return batch_from_digits(self.sample_digits(batch_size, generator))


def as_text(tokens: torch.Tensor | list[int]) -> str:
    """Token ids as text: ``3 1 4 | 4 1 3``."""
    ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
    return " ".join(TOKEN_TEXT[int(i)] for i in ids)
