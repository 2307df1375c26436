"""Notebook 11's hidden cases and known mistakes (instructor only; see the package docstring)."""

from __future__ import annotations

import math

import torch

from course_utils.checks.core import Case
from course_utils.checks.nb11 import (_SERVE_MODEL, _SMALL_DRAFT, _SMALL_TARGET, _TARGET, appended, greedy_case,
                                      paged_case, sampled_case, serve_case, session)
from course_utils.instructor import Mistake
from course_utils.reference import ContinuousBatcher


# --------------------------------------------------------------------------------------------
# Hidden cases
# --------------------------------------------------------------------------------------------
def _hidden_sessions() -> list[Case]:
    a = lambda s, seed, n, h=1, d=2: appended(s, seed, n, h, d)  # noqa: E731
    b = lambda s, seed, n: appended(s, seed, n, 3, 4)  # noqa: E731
    return [
        session("block_size 1: every token its own block", (5, 1, 1, 2), [
            ("allocate", 9), a(9, 11101, 2), ("block_table", 9), a(9, 11102, 1), a(9, 11103, 2), ("block_table", 9),
            ("gather", 9), ("num_free_blocks",), ("pool",), ("free", 9), ("num_free_blocks",)]),
        session("exactly full blocks, three sequences, frees in another order", (8, 3, 3, 4), [
            ("allocate", 0), ("allocate", 1), ("allocate", 2), b(0, 11111, 3), b(1, 11112, 6), b(2, 11113, 3),
            ("block_table", 0), ("block_table", 1), ("block_table", 2), ("free", 1), ("num_free_blocks",),
            b(2, 11114, 4), ("block_table", 2), ("gather", 2), ("gather", 0), ("free", 0), ("allocate", 4),
            b(4, 11115, 7), ("block_table", 4), ("block_table", 2), ("gather", 4), ("gather", 2), ("pool",),
            ("num_free_blocks",), ("gather", 1)]),
        session("out of blocks twice, then room after a free", (4, 4, 1, 2), [
            ("allocate", 3), a(3, 11121, 9), ("allocate", 7), a(7, 11122, 8), ("num_free_blocks",),
            ("block_table", 7), ("gather", 7), a(7, 11123, 4), a(7, 11124, 1), ("num_free_blocks",), ("free", 3),
            a(7, 11125, 8), ("block_table", 7), ("gather", 7), ("num_free_blocks",), ("pool",)]),
        session("one long append across many blocks, then tokens one at a time", (6, 5, 2, 3), [
            ("allocate", 42), appended(42, 11131, 21, 2, 3), ("block_table", 42), appended(42, 11132, 1, 2, 3),
            appended(42, 11133, 1, 2, 3), appended(42, 11134, 1, 2, 3), appended(42, 11135, 1, 2, 3),
            ("block_table", 42), ("gather", 42), ("num_free_blocks",), ("pool",)]),
    ]


def _hidden_paged() -> list[Case]:
    return [
        paged_case("block_size 1, lengths 3 and 1", (3, 1), 2, 1, 4, 1, seed=11141),
        paged_case("one sequence of 40 tokens, block_size 16, 8 query heads on 1 kv head", (40,), 8, 1, 8, 16,
                   seed=11142),
        paged_case("single head, extra -1 columns, lengths 4, 8, 12 (full blocks)", (4, 8, 12), 1, 1, 6, 4,
                   seed=11143, spare_columns=2),
        paged_case("inf in free slots, GQA 4 on 2, block_size 5, lengths 1, 5, 6, 11", (1, 5, 6, 11), 4, 2, 3, 5,
                   seed=11144, nan=True, spare_columns=1),
        paged_case("float64, 6 query heads on 3 kv heads, lengths 2, 7", (2, 7), 6, 3, 4, 2, seed=11145,
                   dtype=torch.float64),
    ]


def _hidden_speculative() -> list[Case]:
    far = (8, 32, 1161, 2.0, 11151, 3.0)  # a draft that is rarely right
    close = (8, 32, 1161, 2.0, 11152, 0.3)
    return [
        greedy_case("max_new_tokens=0: the prompt back, nothing proposed", _TARGET, close, [4, 4, 1], 0, 4),
        greedy_case("k=8 larger than the 5 tokens to write", _TARGET, close, [2, 6], 5, 8),
        greedy_case("a draft that is rarely right, k=3, 12 new tokens", _TARGET, far, [3], 12, 3),
        greedy_case("every position used: 3 + 30 tokens in a context of 32, k=2", _TARGET, close, [0, 1, 2], 30, 2),
        greedy_case("draft = target, k=5, 17 new tokens", _TARGET, _TARGET, [6], 17, 5),
        sampled_case("temperature 1.3, 3 tokens, k=3: 600 runs", _SMALL_TARGET, _SMALL_DRAFT, [2], 3, 1.3, 600, 11153),
    ]


HIDDEN = {"PagedKVCache": _hidden_sessions, "paged_attention": _hidden_paged, "speculative_generate": _hidden_speculative}


# --------------------------------------------------------------------------------------------
# Known mistakes of paged_attention
# --------------------------------------------------------------------------------------------
def _gathered(key_blocks, value_blocks, block_tables, padding_as_zero=True):
    """Every row's blocks, padding included (-1 read as block 0): ``(b, kv, max_blocks * block_size, D)``."""
    b, width = block_tables.shape
    num_kv_heads, block_size, head_dim = key_blocks.shape[1:]
    tables = block_tables.clamp(min=0)
    k = key_blocks[tables].permute(0, 2, 1, 3, 4).reshape(b, num_kv_heads, width * block_size, head_dim)
    v = value_blocks[tables].permute(0, 2, 1, 3, 4).reshape(b, num_kv_heads, width * block_size, head_dim)
    return k, v


def _attend(q, k, v, keep, kv_head_of):
    """Attention of ``q`` (b, H, D) over ``k``, ``v`` (b, kv, S, D) where ``keep`` (b, S) is True; query head
    ``h`` reads kv head ``kv_head_of[h]``."""
    k, v = k[:, kv_head_of], v[:, kv_head_of]  # (b, H, S, D)
    scores = (q[:, :, None] @ k.transpose(-2, -1))[:, :, 0] / math.sqrt(q.shape[-1])  # (b, H, S)
    scores = scores.masked_fill(~keep[:, None], float("-inf"))
    return (torch.softmax(scores, dim=-1)[:, :, None] @ v)[:, :, 0]  # (b, H, D)


def _heads(q, key_blocks, interleaved=True):
    H, kv = q.shape[1], key_blocks.shape[1]
    return torch.arange(H) // (H // kv) if interleaved else torch.arange(H) % kv


def _padding_as_block_zero(q, key_blocks, value_blocks, block_tables, seq_lens):
    """Masks the unused slots of each sequence's last block, but reads the -1 padding as block 0."""
    k, v = _gathered(key_blocks, value_blocks, block_tables)
    block_size = key_blocks.shape[2]
    pos = torch.arange(k.shape[2])  # (S,)
    real_blocks = -(-seq_lens // block_size)  # (b,)
    keep = (pos[None] < seq_lens[:, None]) | (pos[None] >= real_blocks[:, None] * block_size)
    return _attend(q, k, v, keep, _heads(q, key_blocks))


def _last_block_unmasked(q, key_blocks, value_blocks, block_tables, seq_lens):
    """Reads whole blocks: the last block's slots past seq_lens are attended to."""
    k, v = _gathered(key_blocks, value_blocks, block_tables)
    keep = (block_tables >= 0).repeat_interleave(key_blocks.shape[2], dim=1)  # (b, S)
    return _attend(q, k, v, keep, _heads(q, key_blocks))


def _heads_modulo(q, key_blocks, value_blocks, block_tables, seq_lens):
    """Query head h reads kv head h % num_kv_heads (repeat instead of repeat_interleave)."""
    if q.shape[1] == key_blocks.shape[1]:
        return None
    k, v = _gathered(key_blocks, value_blocks, block_tables)
    keep = torch.arange(k.shape[2])[None] < seq_lens[:, None]
    return _attend(q, k, v, keep, _heads(q, key_blocks, interleaved=False))


def _unscaled(q, key_blocks, value_blocks, block_tables, seq_lens):
    """Scores not divided by sqrt(head_dim)."""
    return _padding_free(q * math.sqrt(q.shape[-1]), key_blocks, value_blocks, block_tables, seq_lens)


def _padding_free(q, key_blocks, value_blocks, block_tables, seq_lens):
    k, v = _gathered(key_blocks, value_blocks, block_tables)
    keep = torch.arange(k.shape[2])[None] < seq_lens[:, None]
    return _attend(q, k, v, keep, _heads(q, key_blocks))


def _finite_pool(wrong):
    """``wrong`` on a pool without inf only: where the free slots hold inf, every mistake that reads them gives
    NaN alike, and the check's own diagnosis says which slots it read (``nb11.NAN_HINT``)."""
    def on_finite(q, key_blocks, value_blocks, block_tables, seq_lens):
        if torch.isinf(key_blocks).any():
            return None
        return wrong(q, key_blocks, value_blocks, block_tables, seq_lens)
    on_finite.__doc__ = wrong.__doc__
    return on_finite


MISTAKES = {
    "paged_attention": [
        Mistake("the -1 padding of block_tables was read as block 0 and attended to: mask every slot past seq_lens, "
                "in the padding too", _finite_pool(_padding_as_block_zero)),
        Mistake("seq_lens was ignored in the last block: its slots past seq_lens[i] hold no token of the sequence "
                "and must be masked", _finite_pool(_last_block_unmasked)),
        Mistake("query head h must read kv head h // (num_heads // num_kv_heads), as repeat_kv groups them; yours "
                "reads kv head h % num_kv_heads", _finite_pool(_heads_modulo)),
        Mistake("the scores are not divided by sqrt(head_dim)", _finite_pool(_unscaled)),
    ],
}



# --------------------------------------------------------------------------------------------
# ContinuousBatcher: hidden cases and known mistakes (each a batcher class, run on the check's stand-ins)
# --------------------------------------------------------------------------------------------
def _hidden_batcher() -> list[Case]:
    return [
        serve_case("one request, batch of 1, 1 new token", _SERVE_MODEL, (4, 4), 1, [([3, 3, 3], 1)]),
        serve_case("5 requests, batch of 4, blocks of 1", _SERVE_MODEL, (14, 1), 4,
                   [([1], 3), ([2, 3], 4), ([4], 1), ([5, 6, 7], 2), ([8], 5)]),
        serve_case("2 requests that each fill the whole cache: one waits", _SERVE_MODEL, (3, 3), 2,
                   [([1, 2, 3, 4], 6), ([5, 6], 8)]),
        serve_case("7 short requests, batch of 3, tight blocks of 3", _SERVE_MODEL, (5, 3), 3,
                   [([i, i + 1], 3 + i % 3) for i in range(7)]),
    ]


def _batcher_mistakes() -> list[Mistake]:
    class NeverFrees(ContinuousBatcher):
        def _finish(self, rid):
            self.running.remove(rid)  # the blocks stay taken

    class PositionsRestarted(ContinuousBatcher):
        def __init__(self, model, cache, max_batch_size):
            super().__init__(model, cache, max_batch_size)
            real = model

            def restarted(cache, seq_ids, tokens, positions):  # decode positions counted from the admission
                positions = [p if len(t) > 1 or p == 0 else len(self.written[r]) - 1
                             for r, t, p in zip(seq_ids, tokens, positions)]
                return real(cache, seq_ids, tokens, positions)
            self.model = restarted

    class Static(ContinuousBatcher):
        def step(self):
            if self.running:  # no one joins until the whole batch has finished
                waiting, self.waiting = self.waiting, []
                try:
                    return super().step()
                finally:
                    self.waiting = waiting + self.waiting
            return super().step()

    return [
        Mistake("a finished request's blocks must go back to the cache at once", NeverFrees),
        Mistake("a request's positions continue from its prompt", PositionsRestarted),
        Mistake("a batch that waits for all its requests to finish is static batching", Static),
    ]


HIDDEN["ContinuousBatcher"] = _hidden_batcher
MISTAKES["ContinuousBatcher"] = _batcher_mistakes()
