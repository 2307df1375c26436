"""Notebook 07's hidden cases and known mistakes (instructor only; see the package docstring)."""

from __future__ import annotations

import math

import torch

from course_utils.checks.core import Case, rand
from course_utils.checks.nb07 import _CARRY_VARIANTS, _blocks_of
from course_utils.instructor import Mistake

_INF = float("-inf")


# --------------------------------------------------------------------------------------------
# Hidden cases
# --------------------------------------------------------------------------------------------
def _qkv(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float32):
    return tuple(rand(*shape, seed=seed + i, low=-scale, high=scale, dtype=dtype) for i in range(3))


def _online_hidden() -> list[Case]:
    return [
        Case("block_size=1, (3, 4)", (rand(3, 4, seed=7101, low=-2, high=2), 1)),
        Case("block_size larger than the row, (2, 5) with block_size=8", (rand(2, 5, seed=7102, low=-2, high=2), 8)),
        Case("float64 (2, 9) up to 5000, block_size=4", (rand(2, 9, seed=7103, low=-5000, high=5000,
                                                                dtype=torch.float64), 4)),
        Case("rows on very different scales, block_size=2",
             (torch.tensor([[1000.0, 1001.0, 0.0, -3.0], [0.0, 1.0, 2.0, 3.0]]), 2)),
        Case("maximum in the last block, (1, 10) rising scores, block_size=3",
             (torch.arange(10.0).mul(7).reshape(1, 10), 3)),
        Case("-inf in middle and last blocks, (2, 3, 7), block_size=3",
             (rand(2, 3, 7, seed=7104).masked_fill(rand(2, 3, 7, seed=7105) > 0.4, _INF).index_fill(-1,
              torch.tensor([0]), 0.25), 3)),
        Case("two leading blocks of -inf, (1, 6), block_size=2", (torch.tensor([[_INF, _INF, _INF, _INF, 1.0, -1.0]]), 2)),
    ]


def _flash_hidden() -> list[Case]:
    return [
        Case("float64 (2, 2, 19, 5), block_q=4, block_k=7, causal", (*_qkv(2, 2, 19, 5, seed=7111,
                                                                          dtype=torch.float64), 4, 7),
             {"causal": True}),
        Case("block_q=1, block_k=1, (5, 3), causal", (*_qkv(5, 3, seed=7114), 1, 1), {"causal": True}),
        Case("blocks larger than T: (2, 6, 4), block_q=16, block_k=32, causal", (*_qkv(2, 6, 4, seed=7117), 16, 32),
             {"causal": True}),
        Case("large scores (1, 3, 24, 16) up to +-8, block_q=8, block_k=5, causal",
             (*_qkv(1, 3, 24, 16, seed=7120, scale=8.0), 8, 5), {"causal": True}),
        Case("batch shape (3, 2, 2), T=11, D=6, block_q=3, block_k=4, causal=False",
             (*_qkv(3, 2, 2, 11, 6, seed=7123), 3, 4), {"causal": False}),
        Case("default causal: (2, 13, 4), block_q=5, block_k=3", (*_qkv(2, 13, 4, seed=7126), 5, 3)),
        Case("a single token (1, 1, 8), block_q=4, block_k=4, causal", (*_qkv(1, 1, 8, seed=7129), 4, 4),
             {"causal": True}),
    ]


def _triton_hidden() -> list[Case]:
    return [
        Case("(1, 2, 40, 16), causal, BLOCK_M=BLOCK_N=16", _qkv(1, 2, 40, 16, seed=7131),
             {"causal": True, "block_m": 16, "block_n": 16}),
        Case("(1, 1, 48, 32), causal, BLOCK_M=32, BLOCK_N=16", _qkv(1, 1, 48, 32, seed=7134, scale=3.0),
             {"causal": True, "block_m": 32, "block_n": 16}),
        Case("(1, 1, 36, 16), causal, BLOCK_M=16, BLOCK_N=32", _qkv(1, 1, 36, 16, seed=7137),
             {"causal": True, "block_m": 16, "block_n": 32}),
        Case("(2, 1, 45, 32), causal=False, BLOCK_M=16, BLOCK_N=64: one short key block", _qkv(2, 1, 45, 32, seed=7140),
             {"causal": False, "block_m": 16, "block_n": 64}),
    ]


HIDDEN = {
    "online_softmax": _online_hidden,
    "flash_attention_forward": _flash_hidden,
    "flash_attention_triton": _triton_hidden,
}


# --------------------------------------------------------------------------------------------
# Known mistakes: online_softmax (functions of x, block_size)
# --------------------------------------------------------------------------------------------
def _online(x: torch.Tensor, block_size: int, *, rescale: str = "right", final: str = "right",
            full_blocks: bool = False, short_slices: bool = False) -> torch.Tensor:
    """An online softmax with one thing changed: how ``l`` is rescaled, or how the output is made;
    ``full_blocks``: the last block, shorter than ``block_size``, left out; ``short_slices``: each block's slice
    stops one column early."""
    m = torch.full(x.shape[:-1] + (1,), _INF, dtype=x.dtype)
    l = torch.zeros_like(m)
    blocks = []
    n = x.shape[-1] - block_size + 1 if full_blocks else x.shape[-1]
    for start in range(0, n, block_size):
        block = x[..., start:start + block_size - (1 if short_slices else 0)]
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        terms = torch.exp(block - shift).sum(dim=-1, keepdim=True)
        if rescale == "right":
            l = l * torch.exp(m - shift) + terms
        elif rescale == "none":
            l = l + terms
        elif rescale == "inverted":
            l = l * torch.exp(shift - torch.where(torch.isinf(m), shift, m)) + terms
        elif rescale == "inverted raw":
            l = l * torch.exp(shift - m) + terms
        blocks.append(torch.exp(block - shift) / (terms if final == "per block" else l))
        m = m_new
    if final in ("per block", "running"):
        return torch.cat(blocks, dim=-1)
    return torch.exp(x - m) / l


NOT_RESCALED = ("the running sum l is not rescaled when the maximum grows: the terms already in l were computed "
                "against the old maximum. Multiply l by exp(m_old - m_new) before adding the new block's sum.")
ONLINE_MISTAKES = [
    Mistake(NOT_RESCALED, lambda x, b: _online(x, b, rescale="none")),
    Mistake("l is rescaled by exp(m_new - m_old), the inverse: it must shrink when the maximum grows, "
            "l * exp(m_old - m_new).", lambda x, b: _online(x, b, rescale="inverted")),
    Mistake("l is rescaled by exp(m_new - m_old), the inverse: it must shrink when the maximum grows, "
            "l * exp(m_old - m_new). On the first block m is still -inf, so the inverse is exp(+inf) = inf, and "
            "0 * inf turns l into NaN.", lambda x, b: _online(x, b, rescale="inverted raw")),
    Mistake("each block's slice stops one column early, x[..., start:start + block_size - 1]: one column per block "
            "never reaches m and l. Slice x[..., start:start + block_size] (the end is exclusive).",
            lambda x, b: None if b == 1 else _online(x, b, short_slices=True)),
    Mistake("each block is normalised by its own sum, so every block sums to 1: the denominator is the sum over the "
            "whole row, l after the last block, and every entry uses the final maximum m.",
            lambda x, b: _online(x, b, final="per block")),
    Mistake("each block's output is written with the running m and l of that moment, in one pass: a later block "
            "can still raise the maximum, and it always adds to the sum. Every entry needs the final m and l: after "
            "the last block, return exp(x - m) / l (a second pass over x).",
            lambda x, b: _online(x, b, final="running")),
    Mistake("no maximum is subtracted: exp of large scores overflows to inf (NaN after the division). Keep a running "
            "maximum m and compute exp(x - m).", lambda x, b: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)),
    Mistake("the last block, shorter than block_size when block_size does not divide the row, is left out of m and "
            "l: loop with range(0, n, block_size), and x[..., start:start + block_size] stops at the row's end by "
            "itself.", lambda x, b: None if x.shape[-1] % b == 0 else _online(x, b, full_blocks=True)),
]


# --------------------------------------------------------------------------------------------
# Known mistakes: flash_attention_forward (functions of q, k, v, block_q, block_k, causal)
# --------------------------------------------------------------------------------------------
def _flash(q, k, v, block_q, block_k, causal=True, *, rescale_acc=True, rescale_l=True, scale=True,
           mask_diagonal=True, lse="right", normalise=True, mask="global", factor=None, stop="q_end",
           p_shift="new", alpha="right", k_step="block_k"):
    """The tiled forward with one thing changed (all defaults: the right answer).

    ``mask``: ``"global"`` (right), ``"local"`` (tile-local positions), ``">="`` (the diagonal masked
    too); ``factor``: the scale of the scores (default ``1/sqrt(D)``); ``stop``: where the causal key
    loop ends, ``"q_end"`` (right) or ``"q_start"`` (the diagonal tiles skipped).
    """
    T, D, Tk = q.shape[-2], q.shape[-1], k.shape[-2]
    alpha_kind = alpha  # "right", or "inverse": exp(m_new - m)
    factor = (1 / math.sqrt(D) if scale else 1.0) if factor is None else factor
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    lses = q.new_empty(q.shape[:-1])
    for q_start in range(0, T, block_q):
        q_end = min(q_start + block_q, T)
        q_blk = q[..., q_start:q_end, :] * factor
        m = torch.full(q_blk.shape[:-1], _INF, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(q_blk.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for k_start in range(0, (q_end if stop == "q_end" else q_start) if causal else Tk,
                             block_q if k_step == "block_q" else block_k):
            k_end = min(k_start + block_k, Tk)
            s = q_blk @ k[..., k_start:k_end, :].transpose(-2, -1)
            if causal and mask_diagonal and (k_end - 1 > q_start or mask == "local all"):
                rows = torch.arange(q_start, q_end)[:, None]
                cols = torch.arange(k_start, k_end)[None, :]
                if mask in ("local", "local all"):
                    rows, cols = rows - q_start, cols - k_start
                hide = {">=": cols >= rows, "<": cols < rows, "<=": cols <= rows}.get(mask, cols > rows)
                s = s.masked_fill(hide, _INF)
            m_new = torch.maximum(m, s.amax(dim=-1))
            alpha = torch.exp(m - m_new) if alpha_kind == "right" else torch.exp(m_new - m)
            p = torch.exp(s - (m_new if p_shift == "new" else m)[..., None])
            l = (alpha * l if rescale_l else l) + p.sum(dim=-1)
            acc = (alpha[..., None] * acc if rescale_acc else acc) + p @ v[..., k_start:k_end, :]
            m = m_new
        out[..., q_start:q_end, :] = acc / l[..., None] if normalise else acc
        lses[..., q_start:q_end] = {"right": m + torch.log(l), "log l": torch.log(l), "m": m,
                                    "base 2": (m + torch.log(l)) / math.log(2), "log2 l": m + torch.log2(l),
                                    "m base 2": m / math.log(2) + torch.log(l)}[lse]
    return out, lses


def _keys_past_t_kept(q, k, v, block_q, block_k, causal=True):
    """A kernel that loads the last, shorter key block with ``other=0.0`` but never sets its scores past
    ``T`` to -inf: each padded key scores 0 and adds exp(0 - m) to l (with a zero value row)."""
    Tk = k.shape[-2]
    padded = -(-Tk // block_k) * block_k
    if causal or padded == Tk:
        return _flash(q, k, v, block_q, block_k, causal)
    zeros = k.new_zeros(k.shape[:-2] + (padded - Tk, k.shape[-1]))
    kp, vp = torch.cat([k, zeros], dim=-2), torch.cat([v, v.new_zeros(zeros.shape[:-1] + (v.shape[-1],))], dim=-2)
    return _flash(q, kp, vp, block_q, block_k, causal=False)


def _when_it_shows(changed):
    """``changed`` where it differs from the right answer on this input, else ``None`` (no hint)."""
    def wrong(q, k, v, block_q, block_k, causal=True):
        got, right = changed(q, k, v, block_q, block_k, causal), _flash(q, k, v, block_q, block_k, causal)
        same = all(torch.allclose(a, b, atol=1e-5, rtol=1e-4, equal_nan=True) for a, b in zip(got, right))
        return None if same else got
    return wrong


RESCALE_FORGOTTEN = ("the tiles are right but the rescaling is forgotten: when a key block raises the running "
                     "maximum, what was summed so far (acc and l) was computed against the old maximum. Multiply "
                     "both by alpha = exp(m_old - m_new) before adding the new block.")
ACC_NOT_RESCALED = ("acc is not rescaled: l is multiplied by alpha = exp(m_old - m_new) but the accumulated output is "
                    "not. Both must be: acc = alpha[..., None] * acc + p @ v_blk.")
L_NOT_RESCALED = ("l is not rescaled: acc is multiplied by alpha = exp(m_old - m_new) but the running sum is not. "
                  "Both must be: l = alpha * l + p.sum(-1).")
DIAGONAL_NOT_MASKED = ("the tiles that cross the diagonal are not masked: skipping the tiles wholly in the future is "
                       "not enough, a query must not see the later keys of its own diagonal tile. Fill the scores "
                       "where key position > query position with -inf in those tiles.")
TILE_LOCAL_MASK = ("the causal mask of a tile uses tile-local positions (0 .. block-1) instead of global ones: in "
                   "the tile of query block q_start and key block k_start, compare cols = k_start + arange(Bk) "
                   "with rows = q_start + arange(Bq), not arange(Bk) with arange(Bq).")
DIAGONAL_MASKED_TOO = ("the mask also hides the diagonal (cols >= rows, an off-by-one): a query may see its own key, "
                       "so hide only cols > rows. Query 0 then sees no key at all, hence NaN.")
MASK_REVERSED = ("the causal mask is reversed: it hides the keys BEFORE each query (the past) and keeps the later "
                 "ones. Hide the future: fill the scores where key position > query position (cols > rows) with -inf "
                 "(in a kernel's tl.where, keep cols <= rows).")
LSE_BASE_2 = ("lse is in base 2 (log2 instead of the natural log): the log-sum-exp is m + log(l) with natural "
              "logs, as torch.logsumexp. If you use exp2 with log2(e) folded in, convert back: multiply by ln 2.")
FLASH_MISTAKES = [
    Mistake(RESCALE_FORGOTTEN, _when_it_shows(lambda *a: _flash(*a, rescale_acc=False, rescale_l=False))),
    Mistake(ACC_NOT_RESCALED, _when_it_shows(lambda *a: _flash(*a, rescale_acc=False))),
    Mistake(L_NOT_RESCALED, _when_it_shows(lambda *a: _flash(*a, rescale_l=False))),
    Mistake("the scores are not scaled: multiply q (or each tile of scores) by 1/sqrt(D), D = q.shape[-1].",
            _when_it_shows(lambda *a: _flash(*a, scale=False))),
    Mistake(DIAGONAL_NOT_MASKED, _when_it_shows(lambda *a: _flash(*a, mask_diagonal=False))),
    Mistake("lse is log(l) without the maximum: l was summed as exp(s - m), so the log-sum-exp is m + log(l).",
            _when_it_shows(lambda *a: _flash(*a, lse="log l"))),
    Mistake("lse is the running maximum m alone: the log-sum-exp is m + log(l).",
            _when_it_shows(lambda *a: _flash(*a, lse="m"))),
    Mistake("the output is not divided by l: after the last key block, out = acc / l[..., None].",
            _when_it_shows(lambda *a: _flash(*a, normalise=False))),
    Mistake("the causal argument is ignored: with causal=False every query sees every key.",
            _when_it_shows(lambda q, k, v, bq, bk, causal=True: _flash(q, k, v, bq, bk, True))),
    Mistake(TILE_LOCAL_MASK, _when_it_shows(lambda *a: _flash(*a, mask="local"))),
    Mistake(TILE_LOCAL_MASK, _when_it_shows(lambda *a: _flash(*a, mask="local all"))),
    Mistake(DIAGONAL_MASKED_TOO, _when_it_shows(lambda *a: _flash(*a, mask=">="))),
    Mistake(MASK_REVERSED, _when_it_shows(lambda *a: _flash(*a, mask="<"))),
    Mistake(MASK_REVERSED, _when_it_shows(lambda *a: _flash(*a, mask="<="))),
    Mistake(LSE_BASE_2, _when_it_shows(lambda *a: _flash(*a, lse="base 2"))),
    Mistake("the running maximum m is kept in base-2 units (scores times log2(e), for exp2) but lse = m + log(l) "
            "needs natural units: keep m unscaled and use exp2((s - m) * log2(e)), or divide m by log2(e) at the end.",
            _when_it_shows(lambda *a: _flash(*a, lse="m base 2"))),
    Mistake("lse takes log2(l) where the natural log is needed: lse = m + log(l), both in natural-log units.",
            _when_it_shows(lambda *a: _flash(*a, lse="log2 l"))),
    Mistake("the scores are multiplied by sqrt(D) instead of divided by it: scale them by 1/sqrt(D).",
            _when_it_shows(lambda q, k, v, bq, bk, causal=True: _flash(q, k, v, bq, bk, causal,
                                                                       factor=math.sqrt(q.shape[-1])))),
    Mistake("the scores are scaled by 1/D (or by 1/sqrt(D) twice): scale them once, by 1/sqrt(D).",
            _when_it_shows(lambda q, k, v, bq, bk, causal=True: _flash(q, k, v, bq, bk, causal,
                                                                       factor=1 / q.shape[-1]))),
    Mistake("the key loop stops before the diagonal tiles (at q_start): a query never sees the keys of its own "
            "block, and the first query block sees none (0/0 = NaN). Run the key blocks up to q_end, and mask "
            "the ones that cross the diagonal.",
            _when_it_shows(lambda *a: _flash(*a, stop="q_start"))),
    Mistake("the key loop steps by block_q, not block_k: when the two sizes differ, the key tiles (block_k keys each) "
            "overlap, so some keys count twice, or leave keys out. Step over the keys by block_k: range(0, end, "
            "block_k).", _when_it_shows(lambda *a: _flash(*a, k_step="block_q"))),
]

FLASH_MISTAKES.append(Mistake(
    "the last, shorter key block is left out: when the block size does not divide T, the keys from T // block_k * "
    "block_k to T - 1 still need a block of their own (in a kernel, masked with cols < T): without causal the key "
    "loop runs to T, and the slice k[..., start:start + block_k] stops at T by itself.",
    _when_it_shows(lambda q, k, v, bq, bk, causal=True: None if causal or k.shape[-2] // bk * bk in (0, k.shape[-2])
                   else _flash(q, k[..., :k.shape[-2] // bk * bk, :], v[..., :k.shape[-2] // bk * bk, :], bq, bk,
                               False))))
FLASH_MISTAKES.append(Mistake(
    "p is computed against the old maximum: p = exp(s - m) before m is updated. On the first key block m is "
    "still -inf, so s - m = inf and everything turns NaN. Compute m_new first, then p = exp(s - m_new[..., None]).",
    _when_it_shows(lambda *a: _flash(*a, p_shift="old"))))
FLASH_MISTAKES.append(Mistake(
    "alpha is the inverse, exp(m_new - m): it must shrink what was summed when the maximum grows, alpha = "
    "exp(m - m_new). On the first key block m is still -inf, so the inverse is inf, and 0 * inf turns acc and l "
    "into NaN.", _when_it_shows(lambda *a: _flash(*a, alpha="inverse"))))

#: Mistakes only a kernel makes: the loads of the last, shorter key block are masked, its scores are not.
KERNEL_MISTAKES = [
    Mistake("the keys past T in the last, shorter key block are not masked in the scores: tl.load(..., other=0.0) "
            "gives them a score of 0, not -inf, so they still add exp(0 - m) to l. Keep only cols < T in tl.where "
            "(the loads' mask alone is not enough).", _when_it_shows(_keys_past_t_kept)),
]


def _kernel_like(q, k, v, block_m, block_n, causal=True, *, fill=_INF, reversed_mask=False, update_m=True,
                 drop_tail=False, unscaled=None):
    """What the notebook's kernel computes, in its order, with one thing changed (all defaults: the right
    answer): per query block, the key blocks below ``lo`` unmasked, then those from ``lo`` to ``hi`` masked
    (``cols < T``, and ``cols <= rows`` when causal), the keys padded with zeros to a whole block as the
    masked loads give them. ``fill``: what the masked scores become; ``reversed_mask``: ``cols >= rows``;
    ``update_m``: ``m_i = m_new`` after each block (``"masked only"``: in the second loop only, ``"unmasked
    only"``: in the first); ``drop_tail``: without causal, the last, shorter key
    block left out (``hi = lo``)."""
    T, D = q.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(D)
    pad = -(-T // block_n) * block_n - T
    kp = torch.cat([k, k.new_zeros(k.shape[:-2] + (pad, k.shape[-1]))], dim=-2)
    vp = torch.cat([v, v.new_zeros(v.shape[:-2] + (pad, v.shape[-1]))], dim=-2)
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    lses = q.new_empty(q.shape[:-1])
    for qs in range(0, T, block_m):
        qe = min(qs + block_m, T)
        rows = torch.arange(qs, qe)[:, None]
        qb = q[..., qs:qe, :]
        m = torch.full(qb.shape[:-1], _INF, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        if causal:
            lo, hi = qs // block_n * block_n, qe
        else:
            lo = T // block_n * block_n
            hi = lo if drop_tail else T
        tiles = [(ks, False) for ks in range(0, lo, block_n)] + [(ks, True) for ks in range(lo, hi, block_n)]
        for ks, masked in tiles:
            s = qb @ kp[..., ks:ks + block_n, :].transpose(-2, -1)
            if unscaled != ("masked" if masked else "unmasked"):  # unscaled: the loop that forgets the scale
                s = s * scale
            if masked:
                cols = torch.arange(ks, ks + block_n)[None, :]
                keep = cols < T
                if causal:
                    keep = keep & ((cols >= rows) if reversed_mask else (cols <= rows))
                s = torch.where(keep, s, torch.full_like(s, fill))
            m_new = torch.maximum(m, s.amax(dim=-1))
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new[..., None])
            l = l * alpha + p.sum(dim=-1)
            acc = acc * alpha[..., None] + p @ vp[..., ks:ks + block_n, :]
            if update_m is True or update_m == ("masked only" if masked else "unmasked only"):
                m = m_new
        out[..., qs:qe, :] = acc / l[..., None]
        lses[..., qs:qe] = m + torch.log(l)
    return out, lses


KERNEL_MISTAKES += [
    Mistake("the masked scores are set to 0, not -inf: tl.where(keep, s, 0.0) still gives each hidden key (a future "
            "one, or one past T) a weight exp(0 - m). Fill them with float(\"-inf\"), so that exp gives exactly 0.",
            _when_it_shows(lambda *a: _kernel_like(*a, fill=0.0))),
    Mistake("the causal mask is reversed: cols >= rows keeps the keys after each query and hides those before it in "
            "the tiles that cross the diagonal. Keep cols <= rows (a query sees itself and the past).",
            _when_it_shows(lambda *a: _kernel_like(*a, reversed_mask=True))),
    Mistake("m_i is never updated: after each key block m_i = m_new, or alpha = exp(m_i - m_new) stays exp(-inf) = 0, "
            "every block wipes out what acc and l held, and lse = m_i + log(l_i) is -inf.",
            _when_it_shows(lambda *a: _kernel_like(*a, update_m=False))),
    Mistake("the scores of the second loop, over the diagonal key blocks (stage 2, masked), are not multiplied by "
            "scale: both loops compute s = tl.dot(q, tl.trans(k)) * scale.",
            _when_it_shows(lambda *a: _kernel_like(*a, unscaled="masked"))),
    Mistake("the scores of the first loop, over the key blocks wholly in the past (stage 1, no mask), are not "
            "multiplied by scale: both loops compute s = tl.dot(q, tl.trans(k)) * scale.",
            _when_it_shows(lambda *a: _kernel_like(*a, unscaled="unmasked"))),
    Mistake("m_i is not updated in the first loop, over the key blocks wholly in the past (stage 1, no mask): every "
            "block there is rescaled against a stale maximum. Both loops make the same update, ending with "
            "m_i = m_new after each key block.", _when_it_shows(lambda *a: _kernel_like(*a, update_m="masked only"))),
    Mistake("m_i is not updated in the second loop, over the diagonal key blocks (stage 2, masked): every block "
            "there is rescaled against a stale maximum, and lse = m_i + log(l_i) is off. Both loops make the same "
            "update, ending with m_i = m_new after each key block.",
            _when_it_shows(lambda *a: _kernel_like(*a, update_m="unmasked only"))),
]


def _for_kernel(mistake: Mistake) -> Mistake:
    """A mistake of the Python loop, as the Triton check calls it: ``(q, k, v, causal=, block_m=, block_n=)``."""
    return Mistake(mistake.hint, lambda q, k, v, causal=True, block_m=16, block_n=16:
                   mistake.wrong(q, k, v, block_m, block_n, causal))


MISTAKES = {
    "online_softmax": ONLINE_MISTAKES,
    "flash_attention_forward": FLASH_MISTAKES,
    # the kernel names a reversed mask in its own terms (KERNEL_MISTAKES: keep cols >= rows)
    "flash_attention_triton": [_for_kernel(m) for m in FLASH_MISTAKES + KERNEL_MISTAKES if m.hint != MASK_REVERSED],
}


# --------------------------------------------------------------------------------------------
# Families of mistakes (issue 36): the streamed softmax and the tiled forward in float64 with one step of the
# carry-over changed. Their models are the answers with one edit, so they live here; the student edition holds
# their outputs on the visible cases and the ladders' rungs.
# --------------------------------------------------------------------------------------------
def _carry_models(x: torch.Tensor, block: int) -> dict[str, torch.Tensor]:
    """The family of one carry-over step changed (issue 36): exp(x - m) / l streamed in float64 over the blocks of
    ``x`` (``(..., n)``, blocks of ``block`` columns), with one step changed, by name: the new block's sum taken
    over the whole row x (``whole_row``), the factor exp(m - m_new) applied to the new block's sum instead of to l
    (``alpha_on_block``), l overwritten by each block's sum (``overwritten``), the running maximum started at 0
    instead of -inf (``m_from_zero``), the -inf scores of each block replaced by 0 (``inf_zeroed``; ``_all``: in x
    itself, the final exp(x - m) too), the block's terms exp(block - its own maximum) instead of exp(block - m_new)
    (``block_max``; ``_unguarded``: without the shift by 0 of an all -inf block)."""
    xd, n = x.detach().double(), x.shape[-1]
    found = {}
    for name in ("whole_row", "alpha_on_block", "overwritten", "m_from_zero", "inf_zeroed", "inf_zeroed_all",
                 "block_max", "block_max_unguarded", "sum_no_keepdim"):
        try:
            found[name] = _carried(xd, block, name)
        except RuntimeError:  # a shape that does not broadcast: the member raises there, as such code would
            continue
    return found


def _carried(xd: torch.Tensor, block: int, name: str) -> torch.Tensor:
    """One member of :func:`_carry_models`: exp(x - m) / l streamed over ``xd``'s blocks with the step ``name``
    changed (``sum_no_keepdim``: each block's sum without keepdim, a ``(rows,)`` that broadcasts against l's
    ``(rows, 1)`` into a ``(rows, rows)`` table)."""
    n = xd.shape[-1]
    row = torch.where(torch.isinf(xd), 0.0, xd) if name == "inf_zeroed_all" else xd
    m = torch.full(xd.shape[:-1] + (1,), 0.0 if name == "m_from_zero" else _INF, dtype=torch.float64)
    l = torch.zeros_like(m)
    for start in range(0, n, block):
        part = row[..., start:start + block]
        if name == "inf_zeroed":
            part = torch.where(torch.isinf(part), 0.0, part)
        m_new = torch.maximum(m, part.amax(-1, keepdim=True))
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - shift)
        if name == "sum_no_keepdim":
            l = l * alpha + torch.exp(part - shift).sum(-1)
        elif name == "whole_row":
            l = l * alpha + torch.exp(row - shift).sum(-1, keepdim=True)
        elif name == "alpha_on_block":
            l = l + alpha * torch.exp(part - shift).sum(-1, keepdim=True)
        elif name == "overwritten":
            l = torch.exp(part - shift).sum(-1, keepdim=True)
        elif name.startswith("block_max"):
            own = part.amax(-1, keepdim=True)
            if name == "block_max":
                own = torch.where(torch.isinf(own), torch.zeros_like(own), own)
            l = l * alpha + torch.exp(part - own).sum(-1, keepdim=True)
        else:
            l = l * alpha + torch.exp(part - shift).sum(-1, keepdim=True)
        m = m_new
    return torch.exp(row - m) / l


def _online_family(case: Case) -> list[list]:
    """``[[name, softmax], ...]``: :func:`_carry_models` on ``case``'s ``(x, block_size)``, in float32 (a hint's
    tolerance is far coarser); none where the block size is not a positive int."""
    x, block = case.args[0], case.args[1]
    if not (isinstance(x, torch.Tensor) and x.dim() >= 1 and type(block) is int and block > 0):
        return []
    return [[name, model.float()] for name, model in _carry_models(x, block).items()]


def _tiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_q: int, block_k: int, causal: bool,
           variant: str, padded: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The tiled forward in float64 (``(..., T, D)`` inputs; ``(out, lse)``, ``(..., T, Dv)`` and ``(..., T)``) with
    one factor of the carry-over from key block to key block changed (:data:`_CARRY_VARIANTS`). ``padded``: every
    query block holds ``block_q`` rows, the last one zero rows past T, as a kernel's tile does (they show only where
    a row's factor reaches another row: ``alpha_columns``). ``None`` where the variant cannot run (a factor per
    row that does not broadcast against the features)."""
    q, k, v = (a.detach().double().cpu() for a in (q, k, v))
    T = q.shape[-2]
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    lse = torch.empty(q.shape[:-1], dtype=torch.float64)
    for qs in range(0, T, block_q):
        qe = min(qs + block_q, T)
        qb = q[..., qs:qe, :] / math.sqrt(q.shape[-1])
        rows = qe - qs
        if padded and variant == "alpha_columns" and rows < block_q:
            qb = torch.cat([qb, qb.new_zeros(qb.shape[:-2] + (block_q - rows, qb.shape[-1]))], -2)
            qe = qs + block_q  # the tile's rows past T: zero queries, which see every key before T
        if variant == "alpha_columns" and qb.shape[-2] != v.shape[-1]:
            return None
        m = torch.full(qb.shape[:-1], _INF, dtype=torch.float64)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
        for ks in range(0, min(qe, T) if causal else T, block_k):
            ke = min(ks + block_k, T)
            s = qb @ k[..., ks:ke, :].transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None], _INF)
            m_new = torch.maximum(m, s.amax(-1))
            alpha = {"tile_max": lambda: torch.exp(m - s.amax(-1)), "inverted": lambda: torch.exp(m_new - m),
                     "none": lambda: torch.ones_like(m)}.get(variant, lambda: torch.exp(m - m_new))()
            p = torch.exp(s - m_new[..., None])
            l = (l if variant == "l_kept" else alpha * l) + p.sum(-1)
            factor = alpha[..., None, :] if variant == "alpha_columns" else alpha[..., None]
            acc = (acc if variant == "acc_kept" else factor * acc) + p @ v[..., ks:ke, :]
            m = m_new
        out[..., qs:qs + rows, :] = (acc / l[..., None])[..., :rows, :]
        lse[..., qs:qs + rows] = (m + torch.log(l))[..., :rows]
    return out, lse


def _carry_family(case: Case) -> list[list]:
    """``[[variant, (out, lse)], ...]`` (float32) of :func:`_tiled` on ``case`` for each of the checks'
    ``_CARRY_VARIANTS`` that runs there and changes out (a kernel's case: the blocks BLOCK_M and BLOCK_N, tiles
    padded to them)."""
    q, k, v = case.args[:3]
    if not (isinstance(q, torch.Tensor) and q.dim() >= 2 and q.shape[-2] <= 64):
        return []
    block_q, block_k = _blocks_of(case)
    causal, padded = bool(case.kwargs.get("causal", True)), "block_m" in case.kwargs
    right = _tiled(q, k, v, block_q, block_k, causal, "", padded=padded)[0]
    found = []
    for variant, _ in _CARRY_VARIANTS:
        model = _tiled(q, k, v, block_q, block_k, causal, variant, padded=padded)
        if model is not None and not torch.allclose(model[0], right, atol=1e-12, rtol=1e-9, equal_nan=True):
            found.append([variant, tuple(m.float() for m in model)])
    return found


FAMILIES = {
    "online_softmax": {"online": _online_family},
    "flash_attention_forward": {"carry": _carry_family},
    "flash_attention_triton": {"carry": _carry_family},
}
