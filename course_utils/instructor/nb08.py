"""Notebook 08's hidden cases and known mistakes (instructor only; see the package docstring).

The mistakes of ``decode_causal_mask``, ``repeat_kv`` and ``sliding_window_mask`` are functions of a
case's arguments; those of ``MultiHeadAttentionKVCache`` and ``GroupedQueryAttention`` are mistaken
classes with the reference's constructor, each the reference with one step changed. The KV-cache
mistakes are compared on whole decoded sequences (a prompt, then chunks) by the check.
"""

from __future__ import annotations

import math

import torch

from course_utils import reference
from course_utils.checks.core import Case, rand
from course_utils.checks.nb08 import DecodeCase
from course_utils.instructor import Mistake


# ------------------------------------------------------------------------------------------
# Hidden cases (seeds 8500-8599 and names starting "hidden:": used nowhere in the student edition)
# ------------------------------------------------------------------------------------------
def _decode_mask_cases() -> list[Case]:
    return [Case(f"hidden: num_queries={q}, num_keys={k}", (q, k)) for q, k in ((1, 1), (5, 9), (6, 6), (1, 12),
                                                                                  (7, 20))]


def _kv_cases() -> list[DecodeCase]:
    def case(name, build, x, chunks, dtype=torch.float32):
        return DecodeCase(name, (x,), build=build, chunks=chunks, dtype=dtype)

    return [
        case("hidden: chunks of different sizes", (6, 8, 12, 0.0, 2), rand(2, 10, 6, seed=8501), [3, 2, 1, 4]),
        case("hidden: batch of 1, chunks 2, 3, 1, 1, 5", (5, 12, 12, 0.0, 4), rand(1, 12, 5, seed=8502),
             [2, 3, 1, 1, 5]),
        case("hidden: float64, batch of 3, chunks 5, 2, 2, 1", (4, 6, 10, 0.0, 3), rand(3, 10, 4, seed=8503),
             [5, 2, 2, 1], dtype=torch.float64),
        case("hidden: qkv_bias=True, chunks 1, 4, 1, 2", (7, 6, 9, 0.0, 3, True), rand(2, 8, 7, seed=8504),
             [1, 4, 1, 2]),
        case("hidden: the whole sequence as one prompt", (6, 8, 12, 0.0, 2), rand(2, 7, 6, seed=8505), [7]),
        case("hidden: rope=True, float64, chunks 2, 1, 3, 1", (4, 8, 10, 0.0, 2, False, True),
             rand(1, 7, 4, seed=8506), [2, 1, 3, 1], dtype=torch.float64),
    ]


def _repeat_cases() -> list[Case]:
    return [
        Case("hidden: one group (multi-query), n_rep=4", (rand(3, 1, 6, 4, seed=8511), 4)),
        Case("hidden: T=1, (1, 2, 1, 8), n_rep=2", (rand(1, 2, 1, 8, seed=8512), 2)),
        Case("hidden: non-contiguous input, n_rep=3", (rand(2, 5, 2, 3, seed=8513).transpose(1, 2), 3)),
        Case("hidden: n_rep=8, (2, 2, 3, 2)", (rand(2, 2, 3, 2, seed=8514), 8)),
    ]


def _gqa_cases() -> dict:
    return {
        "configs": [
            ((8, 16, 12, 0.0, 8, 2, True), [Case("hidden: qkv_bias=True, 8 heads, 2 groups", (rand(2, 11, 8, seed=8521),))]),
            ((6, 12, 8, 0.0, 6, 3), [Case("hidden: 6 heads, 3 groups, batch of 1", (rand(1, 8, 6, seed=8522),)),
                                     Case("hidden: T=1", (rand(3, 1, 6, seed=8523),))]),
            ((5, 8, 6, 0.0, 8, 8), [Case("hidden: 8 heads of size 1, one per group", (rand(2, 6, 5, seed=8524),))]),
            ((5, 8, 6, 0.0, 8, 1), [Case("hidden: 8 heads of size 1, one group", (rand(2, 6, 5, seed=8525),))]),
        ],
        "not_dividing": [(12, 12, 6, 0.0, 6, 4), (8, 8, 6, 0.0, 8, 3)],
    }


def _window_cases() -> list[Case]:
    return [Case(f"hidden: num_tokens={T}, window={w}", (T, w)) for T, w in ((8, 1), (9, 9), (5, 10), (12, 5), (1, 1),
                                                                              (10, 3))]


def _angles_cases() -> list[Case]:
    return [Case("hidden: head_dim=2, max_positions=1", (2, 1)),
            Case("hidden: head_dim=6, max_positions=10, base=500000.0 (Llama 3's)", (6, 10), {"base": 500000.0}),
            Case("hidden: head_dim=32, max_positions=5", (32, 5)),
            Case("hidden: head_dim=64, max_positions=2048", (64, 2048))]


def _rope_cases() -> list[Case]:
    return [
        Case("hidden: float64 (3, 7, 16) at positions 0..6", (rand(3, 7, 16, seed=8531, dtype=torch.float64),
                                                             torch.arange(7))),
        Case("hidden: D=2, one token at position 9", (rand(2, 1, 1, 2, seed=8532), torch.tensor([9]))),
        Case("hidden: positions out of order", (rand(1, 4, 4, 6, seed=8533), torch.tensor([5, 0, 2, 1]))),
        Case("hidden: a chunk at positions 100..102, D=32", (rand(2, 2, 3, 32, seed=8534), torch.arange(100, 103))),
    ]


HIDDEN = {
    "decode_causal_mask": _decode_mask_cases,
    "rope_angles": _angles_cases,
    "apply_rope": _rope_cases,
    "MultiHeadAttentionKVCache": _kv_cases,
    "repeat_kv": _repeat_cases,
    "GroupedQueryAttention": _gqa_cases,
    "sliding_window_mask": _window_cases,
}


# ------------------------------------------------------------------------------------------
# decode_causal_mask
# ------------------------------------------------------------------------------------------
TOP_LEFT = ("the mask is aligned to the top left, as if the queries were the FIRST num_queries positions: that is "
            "what SDPA's is_causal=True does when there are fewer queries than keys, and it hides from a new token "
            "the keys just before it. The queries are the LAST num_queries positions: triu with "
            "diagonal = num_keys - num_queries + 1.")


def _ones(q: int, k: int) -> torch.Tensor:
    return torch.ones(q, k, dtype=torch.bool)


def _shifted(q: int, k: int, diagonal: int) -> torch.Tensor | None:
    return torch.triu(_ones(q, k), diagonal=diagonal)


DECODE_MASK_MISTAKES = [
    Mistake(TOP_LEFT, lambda q, k: None if q == k else _shifted(q, k, 1)),
    Mistake("each query's own key is hidden (the diagonal of the bottom-right corner): a token always sees itself. "
            "Use diagonal = num_keys - num_queries + 1, not num_keys - num_queries.",
            lambda q, k: _shifted(q, k, k - q)),
    Mistake("the meaning is inverted: True must mark the keys a query may NOT see (its future), not the ones it "
            "may see.", lambda q, k: ~torch.triu(_ones(q, k), diagonal=k - q + 1)),
    Mistake("the offset has the wrong sign: the first query sits at position num_keys - num_queries, so the mask "
            "starts at diagonal = num_keys - num_queries + 1, not num_queries - num_keys + 1.",
            lambda q, k: None if q == k else _shifted(q, k, q - k + 1)),
]


# ------------------------------------------------------------------------------------------
# rope_angles and apply_rope
# ------------------------------------------------------------------------------------------
def _angles(head_dim: int, max_positions: int, base: float = 10000.0, *, exponent=None, first: int = 0):
    steps = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim if exponent is None else exponent(head_dim)
    positions = torch.arange(first, first + max_positions, dtype=torch.float64)
    return torch.outer(positions, base ** -steps).float()


ANGLES_MISTAKES = [
    Mistake("the frequencies are off: theta_i = base ** (-2 i / head_dim) for pairs i = 0 .. head_dim/2 - 1, so the "
            "exponent steps by 2 / head_dim: torch.arange(0, head_dim, 2) / head_dim, not arange(head_dim // 2) / "
            "head_dim.", lambda d, p, base=10000.0: _angles(d, p, base, exponent=lambda D: torch.arange(
                D // 2, dtype=torch.float64) / D) if d > 2 else None),
    Mistake("the exponent's sign: theta_i = base ** (-2 i / head_dim), which SHRINKS with i (pair 0 turns fastest). "
            "Yours grows: 1 / base ** (-2 i / head_dim) is base ** (2 i / head_dim).",
            lambda d, p, base=10000.0: _angles(d, p, base, exponent=lambda D: -torch.arange(
                0, D, 2, dtype=torch.float64) / D) if d > 2 else None),
    Mistake("the base argument is ignored: 10000.0 is only its default (Llama 3 uses 500000.0).",
            lambda d, p, base=10000.0: None if base == 10000.0 else _angles(d, p, 10000.0)),
    Mistake("positions start at 0: the first token is not rotated at all (angle 0), so use torch.arange(max_positions).",
            lambda d, p, base=10000.0: _angles(d, p, base, first=1)),
]


def _halves(x):
    D = x.shape[-1]
    return x[..., : D // 2], x[..., D // 2:]


def _cos_sin(x, positions):
    angles = reference.rope_angles(x.shape[-1], int(positions.max()) + 1)[positions]  # (T, D/2)
    return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def _rope_neighbours(x, positions):
    cos, sin = _cos_sin(x, positions)
    even, odd = x[..., 0::2], x[..., 1::2]  # pairs (2i, 2i+1), Meta's original Llama
    out = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return None if x.shape[-1] == 2 else out.flatten(-2)


def _rope_neighbours_halves(x, positions):
    cos, sin = _cos_sin(x, positions)
    even, odd = x[..., 0::2], x[..., 1::2]  # neighbours paired, the result written as two halves
    return None if x.shape[-1] == 2 else torch.cat([even * cos - odd * sin, even * sin + odd * cos], dim=-1)


def _rope_other_way(x, positions):
    cos, sin = _cos_sin(x, positions)
    x1, x2 = _halves(x)
    return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)


def _rope_halves_swapped(x, positions):
    cos, sin = _cos_sin(x, positions)
    x1, x2 = _halves(x)
    return torch.cat([x1 * sin + x2 * cos, x1 * cos - x2 * sin], dim=-1)


def _rope_no_minus(x, positions):
    cos, sin = _cos_sin(x, positions)
    x1, x2 = _halves(x)
    return torch.cat([x1 * cos + x2 * sin, x1 * sin + x2 * cos], dim=-1)


APPLY_ROPE_MISTAKES = [
    Mistake("neighbours are paired, (x_0, x_1), (x_2, x_3), ...: that is Meta's original Llama convention. This "
            "course follows the rotate-half convention of GPT-NeoX and Hugging Face's Llama: dimension i pairs with "
            "i + D/2, x1 = x[..., :D/2] and x2 = x[..., D/2:].", _rope_neighbours),
    Mistake("the pairs are neighbours, (x_0, x_1), (x_2, x_3), ... (x[..., 0::2] and x[..., 1::2]): this course "
            "pairs dimension i with i + D/2 (the rotate-half convention of GPT-NeoX and Hugging Face's Llama), "
            "x1 = x[..., :D/2] and x2 = x[..., D/2:].", _rope_neighbours_halves),
    Mistake("positions restarting at 0: the rotation uses 0 .. T-1 instead of the positions given. With a cache, "
            "the new tokens sit at start + i: use rope_angles(...)[positions].",
            lambda x, positions: None if torch.equal(positions, torch.arange(len(positions))) else
            reference.apply_rope(x, torch.arange(len(positions)))),
    Mistake("the pairs turn the wrong way (the sine's sign is flipped): (x1, x2) -> (x1 cos - x2 sin, "
            "x1 sin + x2 cos).", _rope_other_way),
    Mistake("the two halves of the output are swapped: the first half is x1 cos - x2 sin, the second "
            "x1 sin + x2 cos.", _rope_halves_swapped),
    Mistake("the minus sign is missing: rotate_half(x) is cat(-x2, x1), so the first half is x1 cos - x2 sin.",
            _rope_no_minus),
]


# ------------------------------------------------------------------------------------------
# MultiHeadAttentionKVCache: the reference with one step changed
# ------------------------------------------------------------------------------------------
class _Cache(reference.MultiHeadAttentionKVCache):
    """The reference, written so that each mistake overrides one step of the cached forward."""

    def keys_for_scores(self, keys_new, values_new):
        """Append the new keys and values to the cache; return what the queries attend to."""
        if self.cache_k is None:
            self.cache_k, self.cache_v = keys_new, values_new
        else:
            self.cache_k = torch.cat([self.cache_k, keys_new], dim=2)
            self.cache_v = torch.cat([self.cache_v, values_new], dim=2)
        return self.cache_k, self.cache_v

    def rows(self, start: int, end: int, num_keys: int) -> torch.Tensor:
        return self.mask[start:end, :num_keys]

    def turn(self, t: torch.Tensor, start: int) -> torch.Tensor:
        """RoPE at positions start .. start + T - 1 (with rope=True)."""
        return reference.apply_rope(t, torch.arange(start, start + t.shape[2])) if self.rope else t

    def whole(self, x):
        """forward(x) without the cache."""
        return reference.MultiHeadAttentionKVCache.forward(self, x)

    def turn_keys(self, t: torch.Tensor, start: int) -> torch.Tensor:
        """The keys' RoPE (as the queries')."""
        return self.turn(t, start)

    def scaled(self, scores: torch.Tensor) -> torch.Tensor:
        return scores / math.sqrt(self.head_dim)

    def own_code_without_cache(self) -> bool:
        """Whether forward without the cache runs the steps above (a mistake there too) or the reference's."""
        return False

    def forward(self, x, use_cache=False):
        if not use_cache and not self.own_code_without_cache():
            return self.whole(x)
        T = x.shape[1]
        start = self.num_cached if use_cache else 0
        q = self.turn(reference.split_heads(self.W_query(x), self.num_heads), start)  # (b, heads, T, head_dim)
        k_new = self.turn_keys(reference.split_heads(self.W_key(x), self.num_heads), start)
        v_new = reference.split_heads(self.W_value(x), self.num_heads)
        keys, values = self.keys_for_scores(k_new, v_new) if use_cache else (k_new, v_new)
        scores = q @ keys.transpose(2, 3)  # (b, heads, T, num_keys)
        scores = scores.masked_fill(self.rows(start, start + T, keys.shape[2]), float("-inf"))
        weights = self.dropout(self.softmax(self.scaled(scores)))
        return self.out_proj(reference.merge_heads(weights @ values))

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores, dim=-1)


class _MaskInverted(_Cache):
    """The mask inverted (decode_causal_mask, True = hidden, given to SDPA's attn_mask, True = may attend): each
    query sees only its future keys; a query with none (the last) gets SDPA's zero row."""

    def own_code_without_cache(self):
        return True

    def rows(self, start, end, num_keys):
        return ~super().rows(start, end, num_keys)

    def softmax(self, scores):
        return torch.softmax(scores, dim=-1).nan_to_num(0.0)


class _ValuesAfterKeys(_Cache):
    """The new values concatenated to the cached KEYS (a copy-paste slip)."""

    def keys_for_scores(self, keys_new, values_new):
        if self.cache_k is None:
            self.cache_k, self.cache_v = keys_new, values_new
        else:
            old_k = self.cache_k
            self.cache_k = torch.cat([old_k, keys_new], dim=2)
            self.cache_v = torch.cat([old_k, values_new], dim=2)
        return self.cache_k, self.cache_v


class _NewBeforeCache(_Cache):
    """The new keys and values put in front of the cached ones: the cache out of position order."""

    def keys_for_scores(self, keys_new, values_new):
        if self.cache_k is None:
            self.cache_k, self.cache_v = keys_new, values_new
        else:
            self.cache_k = torch.cat([keys_new, self.cache_k], dim=2)
            self.cache_v = torch.cat([values_new, self.cache_v], dim=2)
        return self.cache_k, self.cache_v


class _TopLeft(_Cache):
    def rows(self, start, end, num_keys):
        return self.mask[:end - start, :num_keys]


class _NoMaskWithCache(_Cache):
    def rows(self, start, end, num_keys):
        return torch.zeros(end - start, num_keys, dtype=torch.bool, device=self.mask.device)


class _CacheIgnored(_Cache):
    def keys_for_scores(self, keys_new, values_new):
        super().keys_for_scores(keys_new, values_new)
        return keys_new, values_new

    def rows(self, start, end, num_keys):
        return self.mask[:end - start, :num_keys]


class _DiagonalHidden(_Cache):
    def rows(self, start, end, num_keys):
        mask = self.mask[start:end, :num_keys].clone()
        if end - start == 1 and start > 0:
            mask[:, start] = True  # the new token does not see itself
        return mask


class _MaskFirstCallOnly(_Cache):
    def rows(self, start, end, num_keys):
        if start == 0:
            return self.mask[start:end, :num_keys]
        return torch.zeros(end - start, num_keys, dtype=torch.bool, device=self.mask.device)


class _RowsOffByOne(_Cache):
    def rows(self, start, end, num_keys):
        return self.mask[start + 1:end + 1, :num_keys]


class _StartFromHeads(_Cache):
    @property
    def num_cached(self):
        return 0 if self.cache_k is None else self.cache_k.shape[1]


class _CacheScaledByDout(_Cache):
    def forward(self, x, use_cache=False):
        if not use_cache:
            return self.whole(x)
        start, T = self.num_cached, x.shape[1]
        q = self.turn(reference.split_heads(self.W_query(x), self.num_heads), start)
        keys, values = self.keys_for_scores(self.turn(reference.split_heads(self.W_key(x), self.num_heads), start),
                                            reference.split_heads(self.W_value(x), self.num_heads))
        scores = (q @ keys.transpose(2, 3)).masked_fill(self.rows(start, start + T, keys.shape[2]), float("-inf"))
        weights = torch.softmax(scores / math.sqrt(self.d_out), dim=-1)
        return self.out_proj(reference.merge_heads(weights @ values))


class _Unscaled(_Cache):
    """The scores of the module's own code (with the cache, and without it when rope=True) not divided by
    sqrt(head_dim); forward without the cache and without rope is notebook 05's, which scales them."""

    def own_code_without_cache(self):
        return self.rope

    def scaled(self, scores):
        return scores


class _RopeOnly(_Cache):
    """A mistake that exists only with rope=True (built without it, it does not apply)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.rope:
            raise ValueError("this mistake needs rope=True")


class _RopeRestartsAtZero(_RopeOnly):
    def turn(self, t, start):
        return reference.apply_rope(t, torch.arange(t.shape[2]))


class _RopeTurnedAgain(_RopeOnly):
    def keys_for_scores(self, keys_new, values_new):
        keys, values = super().keys_for_scores(keys_new, values_new)
        return reference.apply_rope(keys, torch.arange(keys.shape[2])), values  # cached keys turned a second time


class _RopeNotWithoutCache(_RopeOnly):
    def whole(self, x):
        return reference.MultiHeadAttention.forward(self, x)


class _RopeKeysNotTurned(_RopeOnly):
    """RoPE turns the queries only, with the cache and without it."""

    def own_code_without_cache(self):
        return True

    def turn_keys(self, t, start):
        return t


class _RopeValuesTurned(_RopeOnly):
    def keys_for_scores(self, keys_new, values_new):
        return super().keys_for_scores(keys_new, self.turn(values_new, self.num_cached))


KV_MISTAKES = [
    Mistake(TOP_LEFT.replace("the mask is aligned", "with the cache, the mask is aligned").replace(
        "triu with diagonal = num_keys - num_queries + 1.", "use rows start..start+T-1 of the causal mask, "
        "decode_causal_mask(T, start + T)."), _TopLeft),
    Mistake("the new values are concatenated to the cached KEYS: cache_v = torch.cat([self.cache_v, values], dim=2), "
            "not [self.cache_k, values]. The prompt is right; from the second call on, the earlier tokens' values are "
            "their keys.", _ValuesAfterKeys),
    Mistake("the new keys and values are put in FRONT of the cached ones, torch.cat([keys, self.cache_k], dim=2): the "
            "cache is then out of position order, and the causal mask, which reads column j as position j, hides the "
            "wrong keys (one new token at a time still sees them all). Append them after the cache: "
            "torch.cat([self.cache_k, keys], dim=2), and the same for the values.", _NewBeforeCache),
    Mistake("with use_cache=True no mask is applied: for one new token that hides nothing, but a prompt's queries "
            "then see the future. Mask the new queries with decode_causal_mask(T, start + T).", _NoMaskWithCache),
    Mistake("the new queries attend only to the new tokens' keys and values: they must attend to the whole cache "
            "(the earlier tokens' keys and values and their own).", _CacheIgnored),
    Mistake("the mask is inverted: each query attends only to the keys in its FUTURE (and the last query to none). "
            "decode_causal_mask is True where a key is HIDDEN, but F.scaled_dot_product_attention's boolean attn_mask "
            "is True where a query MAY attend: pass attn_mask=~mask (or masked_fill the scores with -inf where the "
            "mask is True).", _MaskInverted),
    Mistake("a new token does not see its own key: the last column of its mask row must be False (it sees keys "
            "0..start).", _DiagonalHidden),
    Mistake("the causal mask is applied only on the first call (the prompt): a later chunk of several new tokens "
            "needs it too, or its first tokens see the ones after them. Mask every call with rows start..start+T-1 "
            "of the causal mask, decode_causal_mask(T, start + T).", _MaskFirstCallOnly),
    Mistake("the mask rows are shifted by one position: query i of a chunk sits at position start + i, so its row "
            "of the causal mask is start + i. Use rows start..start+T-1, not start+1..start+T.", _RowsOffByOne),
    Mistake("the number of cached tokens is read on the wrong dimension: cache_k is (b, num_heads, t, head_dim), so "
            "start = cache_k.shape[2] (the tokens), not shape[1] (the heads).", _StartFromHeads),
    Mistake("with use_cache=True the scores are divided by sqrt(d_out); each head's dot products have head_dim "
            "terms: divide by sqrt(head_dim), as forward does.", _CacheScaledByDout),
    Mistake("the scores are not divided by sqrt(head_dim) before the softmax in your own forward (with the cache, "
            "and without it when rope=True): weights = softmax(scores / sqrt(head_dim)), as notebook 05's forward "
            "does.", _Unscaled),
    Mistake("with rope=True the positions restart at 0 at every call: the new tokens sit at start .. start + T - 1, "
            "so turn them with apply_rope(..., torch.arange(start, start + T)).", _RopeRestartsAtZero),
    Mistake("with rope=True the keys are turned again after caching: each key was turned at its position before it "
            "went into the cache; turn only the new queries and keys, once.", _RopeTurnedAgain),
    Mistake("with rope=True, forward without the cache must turn the queries and keys too (positions 0 .. T-1): "
            "super().forward(x) knows nothing of RoPE.", _RopeNotWithoutCache),
    Mistake("with rope=True only the queries are turned: turn the keys too, at the same positions, "
            "apply_rope(keys, positions): a score q . k compares the two angles, so both must be turned.",
            _RopeKeysNotTurned),
    Mistake("with rope=True the values are turned too: RoPE turns only the queries and keys, never the values.",
            _RopeValuesTurned),
]


# ------------------------------------------------------------------------------------------
# repeat_kv
# ------------------------------------------------------------------------------------------
TILED = ("the heads are tiled, not repeated in a row: x.repeat(1, n_rep, 1, 1) gives groups 0, 1, .., G-1, 0, 1, ..; "
         "query head h must get group h // n_rep, so each group's copies come together: "
         "x.repeat_interleave(n_rep, dim=1), or x[:, :, None].expand(b, G, n_rep, T, D).reshape(b, G * n_rep, T, D).")


TOKENS_INTERLEAVED = ("the copies were made along the token axis and then reshaped into heads (the head and token "
                      "axes flattened together): each output head holds a mix of tokens, and in attention a query "
                      "would see the wrong tokens, even future ones. Repeat along dim 1, the heads, before any "
                      "reshape: x.repeat_interleave(n_rep, dim=1), or x[:, :, None].expand(b, G, n_rep, T, D)"
                      ".reshape(b, G * n_rep, T, D).")


def _tokens_interleaved(x: torch.Tensor, n: int) -> torch.Tensor | None:
    b, G, T, D = x.shape
    if n == 1 or T == 1:
        return None
    return x.repeat_interleave(n, dim=2).reshape(b, G * n, T, D)  # (b, G, T*n, D) read as (b, G*n, T, D)


REPEAT_MISTAKES = [
    Mistake(TILED, lambda x, n: None if n == 1 or x.shape[1] == 1 else x.repeat(1, n, 1, 1)),
    Mistake(TOKENS_INTERLEAVED, _tokens_interleaved),
]


# ------------------------------------------------------------------------------------------
# GroupedQueryAttention: the reference with one step changed
# ------------------------------------------------------------------------------------------
class _GQA(reference.GroupedQueryAttention):
    def repeat(self, t):
        return reference.repeat_kv(t, self.group_size)

    def split_kv(self, t):
        return reference.split_heads(t, self.num_kv_groups)

    def scale(self):
        return math.sqrt(self.head_dim)

    def forward(self, x):
        b, T, _ = x.shape
        q = reference.split_heads(self.W_query(x), self.num_heads)
        k = self.repeat(self.split_kv(self.W_key(x)))
        v = self.repeat(self.split_kv(self.W_value(x)))
        s = (q @ k.transpose(2, 3)).masked_fill(self.mask[:T, :T], float("-inf"))
        w = self.dropout(torch.softmax(s / self.scale(), dim=-1))
        return self.out_proj(reference.merge_heads(w @ v))


class _GQATiled(_GQA):
    def repeat(self, t):
        return t.repeat(1, self.group_size, 1, 1) if self.group_size > 1 and self.num_kv_groups > 1 else None


class _GQAScaledByDout(_GQA):
    def scale(self):
        return math.sqrt(self.d_out)


class _GQANoOutProj(_GQA):
    def forward(self, x):
        b, T, _ = x.shape
        q = reference.split_heads(self.W_query(x), self.num_heads)
        k = self.repeat(reference.split_heads(self.W_key(x), self.num_kv_groups))
        v = self.repeat(reference.split_heads(self.W_value(x), self.num_kv_groups))
        s = (q @ k.transpose(2, 3)).masked_fill(self.mask[:T, :T], float("-inf"))
        return reference.merge_heads(torch.softmax(s / self.scale(), dim=-1) @ v)


class _GQAViewWithoutTranspose(_GQA):
    def split_kv(self, t):
        b, T, _ = t.shape
        return t.reshape(b, self.num_kv_groups, T, self.head_dim)  # (b, T, G*D) read as (b, G, T, D): scrambled


class _GQAKeysViewWithoutTranspose(_GQA):
    def forward(self, x):
        b, T, _ = x.shape
        q = reference.split_heads(self.W_query(x), self.num_heads)
        k = self.repeat(_GQAViewWithoutTranspose.split_kv(self, self.W_key(x)))
        v = self.repeat(self.split_kv(self.W_value(x)))
        s = (q @ k.transpose(2, 3)).masked_fill(self.mask[:T, :T], float("-inf"))
        return self.out_proj(reference.merge_heads(self.dropout(torch.softmax(s / self.scale(), dim=-1)) @ v))


class _GQAValuesViewWithoutTranspose(_GQA):
    def forward(self, x):
        b, T, _ = x.shape
        q = reference.split_heads(self.W_query(x), self.num_heads)
        k = self.repeat(self.split_kv(self.W_key(x)))
        v = self.repeat(_GQAViewWithoutTranspose.split_kv(self, self.W_value(x)))
        s = (q @ k.transpose(2, 3)).masked_fill(self.mask[:T, :T], float("-inf"))
        return self.out_proj(reference.merge_heads(self.dropout(torch.softmax(s / self.scale(), dim=-1)) @ v))


class _GQATokensInterleaved(_GQA):
    def repeat(self, t):
        return _tokens_interleaved(t, self.group_size)


GQA_MISTAKES = [
    Mistake(TILED.replace("x.repeat", "keys.repeat").replace("the heads are tiled", "the key/value heads are tiled"),
            _GQATiled),
    Mistake("the scores are divided by sqrt(d_out); each head's dot products have head_dim terms: divide by "
            "sqrt(head_dim).", _GQAScaledByDout),
    Mistake("out_proj is created but not applied: return self.out_proj(context).", _GQANoOutProj),
    Mistake("the keys and values are split into heads with a view (or reshape) to (b, num_kv_groups, T, head_dim) "
            "straight from (b, T, num_kv_groups * head_dim), which mixes tokens and heads: view(b, T, num_kv_groups, "
            "head_dim), then transpose(1, 2).", _GQAViewWithoutTranspose),
    Mistake("the keys are split into heads with a view (or reshape) to (b, num_kv_groups, T, head_dim) straight from "
            "(b, T, num_kv_groups * head_dim), which mixes tokens and heads (and lets the future leak in): "
            "view(b, T, num_kv_groups, head_dim), then transpose(1, 2), as for the queries.",
            _GQAKeysViewWithoutTranspose),
    Mistake("the values are split into heads with a view (or reshape) to (b, num_kv_groups, T, head_dim) straight "
            "from (b, T, num_kv_groups * head_dim), which mixes tokens and heads (and lets the future leak in): "
            "view(b, T, num_kv_groups, head_dim), then transpose(1, 2), as for the queries.",
            _GQAValuesViewWithoutTranspose),
    Mistake(TOKENS_INTERLEAVED.replace("x.repeat", "keys.repeat").replace("x[:, :, None]", "keys[:, :, None]"),
            _GQATokensInterleaved),
]


# ------------------------------------------------------------------------------------------
# sliding_window_mask
# ------------------------------------------------------------------------------------------
def _distance(T: int) -> torch.Tensor:
    i = torch.arange(T).unsqueeze(1)
    return i - torch.arange(T).unsqueeze(0)  # (T, T): how far back key j is from query i


WINDOW_MISTAKES = [
    Mistake("off by one: each query keeps window + 1 keys. A window of w keeps the query itself and the w - 1 "
            "tokens before it: hide i - j >= window, not i - j > window.",
            lambda T, w: None if w >= T else (_distance(T) < 0) | (_distance(T) > w)),
    Mistake("off by one: each query keeps window - 1 keys. A window of w keeps the query itself and the w - 1 "
            "tokens before it: hide i - j >= window, not i - j >= window - 1.",
            lambda T, w: (_distance(T) < 0) | (_distance(T) >= w - 1)),
    Mistake("the window is not causal: it hides keys more than window - 1 positions away on BOTH sides, so a query "
            "sees tokens after it. Hide the future too: j > i.",
            lambda T, w: None if T == 1 else _distance(T).abs() >= w),
    Mistake("the meaning is inverted: True must mark the keys a query may NOT see (outside its window).",
            lambda T, w: (_distance(T) >= 0) & (_distance(T) < w)),
    Mistake("only the window is applied, not the causal part: keys after the query must be hidden too (j > i).",
            lambda T, w: None if T == 1 else _distance(T) >= w),
    Mistake("the window is mirrored: the distance is computed as j - i, so the mask hides the past and opens the "
            "window into the future. Key j lies i - j positions back from query i: torch.arange(T).view(-1, 1) - "
            "torch.arange(T).view(1, -1).", lambda T, w: None if T == 1 else (_distance(T) > 0) | (_distance(T) <= -w)),
]


MISTAKES = {
    "decode_causal_mask": DECODE_MASK_MISTAKES,
    "rope_angles": ANGLES_MISTAKES,
    "apply_rope": APPLY_ROPE_MISTAKES,
    "MultiHeadAttentionKVCache": KV_MISTAKES,
    "repeat_kv": REPEAT_MISTAKES,
    "GroupedQueryAttention": GQA_MISTAKES,
    "sliding_window_mask": WINDOW_MISTAKES,
}
