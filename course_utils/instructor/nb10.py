"""Notebook 10's hidden cases and known mistakes (instructor only; see the package docstring)."""

from __future__ import annotations

import math
from typing import Callable

import torch

from course_utils.checks.core import Case
from course_utils.checks.nb10 import _backward_case, _backward_layout, _inputs, forward_statistics, kernel_case
from course_utils.instructor import Mistake

_INF = float("-inf")


# --------------------------------------------------------------------------------------------
# Hidden cases
# --------------------------------------------------------------------------------------------
def _reference_hidden() -> list[Case]:
    return [
        Case("a single token (1, 1, 4), causal", _inputs(1, 1, 4, seed=10101), {"causal": True}),
        Case("batch shape (3, 2, 2), T=9, D=5, causal=False", _inputs(3, 2, 2, 9, 5, seed=10105), {"causal": False}),
        Case("default causal: (2, 10, 6)", _inputs(2, 10, 6, seed=10109)),
        Case("large scores (2, 12, 8) up to +-10, causal=False", _inputs(2, 12, 8, seed=10113, scale=10.0),
             {"causal": False}),
    ]


def _flash_hidden() -> list[Case]:
    default = _backward_case("default causal: (2, 13, 4), block_q=5, block_k=3", (2, 13, 4), 10121, 5, 3, True)
    default.kwargs = {}
    return [
        _backward_case("float64 (2, 2, 19, 5), block_q=4, block_k=7, causal", (2, 2, 19, 5), 10125, 4, 7, True,
                       dtype=torch.float64),
        _backward_case("block_q=1, block_k=1, (5, 3), causal", (5, 3), 10129, 1, 1, True),
        _backward_case("blocks larger than T: (2, 6, 4), block_q=16, block_k=32, causal", (2, 6, 4), 10133, 16, 32,
                       True),
        _backward_case("large scores (1, 3, 24, 16) up to +-4, block_q=8, block_k=5, causal", (1, 3, 24, 16), 10137,
                       8, 5, True, scale=4.0),
        _backward_case("batch shape (3, 2, 2), T=11, D=6, block_q=3, block_k=4, causal=False", (3, 2, 2, 11, 6),
                       10141, 3, 4, False),
        _backward_case("block_q=7, block_k=3, (1, 30, 8), causal", (1, 30, 8), 10145, 7, 3, True),
        default,
    ]


def _function_hidden() -> list[Case]:
    return [
        Case("a single token (1, 1, 4), block_q=block_k=4, causal", (*_inputs(1, 1, 4, seed=10151), True, 4, 4)),
        Case("batch shape (2, 2, 2), T=9, D=4, block_q=2, block_k=5, causal",
             (*_inputs(2, 2, 2, 9, 4, seed=10155), True, 2, 5)),
        Case("blocks larger than T: (2, 7, 4), block_q=16, block_k=16, causal=False",
             (*_inputs(2, 7, 4, seed=10159), False, 16, 16)),
        Case("block_q=1, block_k=1, (6, 3), causal", (*_inputs(6, 3, seed=10163), True, 1, 1)),
    ]


def _triton_hidden() -> list[Case]:
    return [
        kernel_case("(1, 2, 40, 16), causal, BLOCK_M=BLOCK_N=16", (1, 2, 40, 16), 10171, True, 16, 16),
        kernel_case("(1, 1, 48, 32), causal, BLOCK_M=32, BLOCK_N=16", (1, 1, 48, 32), 10175, True, 32, 16,
                    scale=2.0),
        kernel_case("(1, 1, 36, 16), causal, BLOCK_M=16, BLOCK_N=32", (1, 1, 36, 16), 10179, True, 16, 32),
    ]


HIDDEN = {
    "attention_backward_reference": _reference_hidden,
    "flash_attention_backward": _flash_hidden,
    "FlashAttention": _function_hidden,
    "flash_attention_backward_triton": _triton_hidden,
}


# --------------------------------------------------------------------------------------------
# Known mistakes: attention_backward_reference (functions of q, k, v, do, causal)
# --------------------------------------------------------------------------------------------
def _full(q, k, v, do, causal=True, *, subtract_delta=True, dq_scale=1, dk_scale=1, transpose_p=True,
          mask=True, delta="do o", keepdim=True, scale_d=False, diagonal=False, parentheses=True,
          dq_transposed=False, dk_transposed=True):
    """The untiled backward with one thing changed (all defaults: the right answer). ``scale_d``: 1/D in
    place of 1/sqrt(D) everywhere; ``diagonal``: the mask hides the diagonal too; ``dq_transposed`` /
    ``dk_transposed``: dS^T K for dQ, dS Q for dK (both square, so they run)."""
    T, D = q.shape[-2], q.shape[-1]
    scale = 1 / D if scale_d else 1 / math.sqrt(D)
    s = q @ k.transpose(-2, -1) * scale
    if causal and mask:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(0 if diagonal else 1), _INF)
    p = torch.softmax(s, dim=-1)
    o = p @ v
    dv = (p.transpose(-2, -1) if transpose_p else p) @ do
    dp = do @ v.transpose(-2, -1)
    rows = {"do o": (do * o), "do": do, "p": p, "do v": do * v}[delta].sum(dim=-1, keepdim=keepdim)
    if not keepdim:
        rows = rows[..., None, :]  # (..., T) broadcast against (..., T, T): along the keys
    if not subtract_delta:
        ds = p * dp
    else:
        ds = p * (dp - rows) if parentheses else p * dp - rows
    return ((ds.transpose(-2, -1) if dq_transposed else ds) @ k * scale ** dq_scale,
            (ds.transpose(-2, -1) if dk_transposed else ds) @ q * scale ** dk_scale, dv)


NO_DELTA = ("dS = P * dP without subtracting delta: the softmax's backward is dS = P * (dP - delta), with "
            "delta = rowsum(dO * O) (one number per query), because every weight of a row moves when one score "
            "moves.")
DK_SCALE_MISSING = ("dK misses the scale: S = Q K^T / sqrt(D), so dK = dS^T Q / sqrt(D), like dQ = dS K / sqrt(D).")
DK_SCALE_TWICE = ("dK is scaled twice: dK = dS^T Q / sqrt(D), one factor 1/sqrt(D), the one of S = Q K^T / sqrt(D).")
DQ_SCALE_MISSING = "dQ misses the scale: S = Q K^T / sqrt(D), so dQ = dS K / sqrt(D)."
DV_NOT_TRANSPOSED = ("dV = P dO instead of P^T dO: value j collects from every query i that attended to it, a sum over "
                     "the rows of P, so transpose P.")
DQ_SCALE_TWICE = "dQ is scaled twice: dQ = dS K / sqrt(D), one factor 1/sqrt(D), the one of S = Q K^T / sqrt(D)."
DS_UNSCALED = ("dQ and dK both miss the scale: S = Q K^T / sqrt(D), so the gradient of the scores carries 1/sqrt(D) "
               "into both, dQ = dS K / sqrt(D) and dK = dS^T Q / sqrt(D).")
DELTA_FROM_V = ("delta is the row sum of dO * V: it is rowsum(dO * O), dO times the output O (one number per query), "
                "not times the values V.")
DELTA_NO_KEEPDIM = ("delta lost its last dimension (a sum without keepdim=True, or delta[..., rows] without None): dP - "
                    "delta then subtracts delta along the keys (the columns) instead of one number per query row. Keep "
                    "it (..., T, 1): sum(dim=-1, keepdim=True), or delta[..., None].")
SCALE_BY_D = ("the scores are scaled by 1/D: S = Q K^T / sqrt(D), and dQ and dK carry the same 1/sqrt(D) (D ** -0.5, "
              "not 1 / D).")
DIAGONAL_MASKED = ("the mask also hides the diagonal (>= instead of >, or triu(0) instead of triu(1)): a query sees its "
                   "own key, so mask only where the key position > the query position.")
NO_PARENTHESES = ("dS = P * dP - delta subtracts delta after the product: * binds before -, so write the parentheses, "
                  "dS = P * (dP - delta).")
DK_UNTRANSPOSED = ("dK = dS Q instead of dS^T Q: key j collects from every query i that attended to it, a sum over the "
                   "rows of dS, so transpose dS: dK = dS^T Q / sqrt(D) (dS is square, so the untransposed product runs).")
DQ_TRANSPOSED = ("dQ = dS^T K instead of dS K: query i collects from every key j it attended to, a sum over its own row "
                 "of dS, so dQ = dS K / sqrt(D) (dS is square, so the transposed product runs).")
CAUSAL_IGNORED = "the causal argument is ignored: with causal=False every query sees every key."
REFERENCE_MISTAKES = [
    Mistake(NO_DELTA, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, subtract_delta=False)),
    Mistake(DK_SCALE_MISSING, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, dk_scale=0)),
    Mistake(DK_SCALE_TWICE, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, dk_scale=2)),
    Mistake(DQ_SCALE_MISSING, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, dq_scale=0)),
    Mistake(DV_NOT_TRANSPOSED, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, transpose_p=False)),
    Mistake("the causal mask is missing: with causal=True the weights P of the forward are masked, so the backward's "
            "must be too (-inf above the diagonal before the softmax).",
            lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, mask=False) if causal else None),
    Mistake(CAUSAL_IGNORED, lambda q, k, v, do, causal=True: None if causal else _full(q, k, v, do, True)),
    Mistake("delta is the row sum of dO alone: delta = rowsum(dO * O), the product with the output, one number per "
            "query.",
            lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, delta="do")),
    Mistake(DELTA_FROM_V, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, delta="do v")),
    Mistake(DELTA_NO_KEEPDIM, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, keepdim=False)),
    Mistake(SCALE_BY_D, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, scale_d=True)),
    Mistake(DIAGONAL_MASKED, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, diagonal=True) if causal
            else None),
    Mistake(NO_PARENTHESES, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, parentheses=False)),
    Mistake(DS_UNSCALED, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, dq_scale=0, dk_scale=0)),
    Mistake(DQ_SCALE_TWICE, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, dq_scale=2)),
    Mistake(DK_UNTRANSPOSED, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, dk_transposed=False)),
    Mistake(DQ_TRANSPOSED, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, dq_transposed=True)),
]


# --------------------------------------------------------------------------------------------
# Known mistakes: flash_attention_backward (functions of q, k, v, o, lse, do, block_q, block_k, causal)
# --------------------------------------------------------------------------------------------
def _tiled(q, k, v, o, lse, do, block_q, block_k, causal=True, *, subtract_delta=True, dk_scale=1, use_lse=True,
           mask=True, dk_transposed=True, dv_transposed=True, dq_accumulate=True, delta="do o", dq_scale=1,
           keepdim=True, scale_d=False, exp2=False, diagonal=False, parentheses=True, dq_transposed=False,
           dk_accumulate=True, reset_per_block=True, q_tile=None, q_first="k_start"):
    """The tiled backward with one thing changed (all defaults: the right answer). ``scale_d``: 1/D in place of
    1/sqrt(D); ``exp2``: P = 2 ** (S - lse); ``diagonal``: the mask hides the diagonal too; ``q_first``: the causal
    query loop of a key block starts at the query block that holds ``"k_start"``, ``"k_end"`` or ``"k_last"``
    (k_end - 1), or at ``"times_block_k"``, (k_start // block_q) * block_k."""
    T, D = q.shape[-2], q.shape[-1]
    scale = 1 / D if scale_d else 1 / math.sqrt(D)
    full_delta = ((do * v) if delta == "do v" else (do * o)).sum(dim=-1)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dkb, dvb = 0.0, 0.0  # reset_per_block=False: one pair of sums for every key block
    for ks in range(0, T, block_k):
        ke = min(ks + block_k, T)
        kb, vb = k[..., ks:ke, :], v[..., ks:ke, :]
        if reset_per_block:
            dkb, dvb = torch.zeros_like(kb), torch.zeros_like(vb)
        first = {"k_start": ks // block_q * block_q, "k_end": ke // block_q * block_q,
                 "k_last": (ke - 1) // block_q * block_q, "times_block_k": ks // block_q * block_k}[q_first]
        for qs in range(first if causal else 0, T, block_q):
            qe = min(qs + (q_tile or block_q), T)  # q_tile: the query tile's size, if not block_q
            qb, dob = q[..., qs:qe, :], do[..., qs:qe, :]
            s = qb @ kb.transpose(-2, -1) * scale
            shift = 1 if diagonal else 0  # the diagonal hidden too: key position >= query position
            if causal and mask and ke - 1 > qs - shift:
                future = torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None] - shift
                s = s.masked_fill(future, _INF)
            shifted = s - lse[..., qs:qe, None] if use_lse else s
            p = torch.exp2(shifted) if exp2 else torch.exp(shifted)
            dvb = dvb + (p.transpose(-2, -1) if dv_transposed else p) @ dob
            dp = dob @ vb.transpose(-2, -1)
            if delta == "tile":
                rows = (p * dp).sum(dim=-1, keepdim=True)
            else:
                rows = full_delta[..., qs:qe, None] if keepdim else full_delta[..., None, qs:qe]
            if not subtract_delta:
                ds = p * dp
            else:
                ds = p * (dp - rows) if parentheses else p * dp - rows
            share = (ds.transpose(-2, -1) if dq_transposed else ds) @ kb * scale ** dq_scale
            if dq_accumulate:
                dq[..., qs:qe, :] += share
            else:
                dq[..., qs:qe, :] = share
            dk_share = (ds.transpose(-2, -1) if dk_transposed else ds) @ qb * scale ** dk_scale
            dkb = dkb + dk_share if dk_accumulate else dk_share
        dk[..., ks:ke, :], dv[..., ks:ke, :] = dkb, dvb
    return dq, dk, dv


def _when_it_shows(changed):
    """``changed`` where it differs from the right answer on this input, else ``None`` (no hint); each gradient that
    is the right one is ``None`` (the check reads the expected one there: the recording stays small)."""
    def wrong(*args, **kwargs):
        got = changed(*args, **kwargs)
        if got is None:
            return None
        right = _tiled(*args, **kwargs)
        got = tuple(None if torch.allclose(a, b, atol=1e-5, rtol=1e-4, equal_nan=True) else a
                    for a, b in zip(got, right))
        return None if all(a is None for a in got) else got
    return wrong


NO_LSE = ("P is rebuilt without the lse: exp(S) is not normalised. The forward saved lse = log(sum_j exp(S_ij)) "
          "for exactly this: P = exp(S - lse[..., None]) is the softmax, in one step.")
MASK_FORGOTTEN = ("the causal mask is forgotten in the backward: the tiles that cross the diagonal must be masked as in "
                  "the forward (S = -inf where key position > query position), or P has weights on future keys.")
#: The tiled loop's words for the same outputs: there a test picks the tiles to mask, and it can miss them.
TILES_UNMASKED = ("the tiles that cross the diagonal are left unmasked in the backward, so P has weights on future keys: "
                  "the causal mask is forgotten, or the test that picks the tiles to mask misses them. Mask every tile "
                  "whose last key is after its block's first query, k_end - 1 > q_start, as in the forward (S = -inf "
                  "where key position > query position).")
DQ_LAST_BLOCK = ("dQ holds only the last key block's share: a query receives a share of dQ from every key block, so "
                 "add to it (dq[..., q_start:q_end, :] += dS @ K_blk * scale), do not overwrite it.")
DK_WRONG_AXIS = ("dK is dS @ Q, accumulated over the wrong axis: dK_j sums over the queries i (the rows of dS), "
                 "so dK_blk += dS^T @ Q_blk * scale.")
DELTA_FROM_TILE = ("delta is taken from one tile, rowsum(P_tile * dP_tile): it needs the whole row, and one key "
                   "block sees part of it. Compute delta = rowsum(dO * O) once, before the loops: the same number, "
                   "from the output.")
def _causal_ignored(q, k, v, o, lse, do, block_q, block_k, causal=True):
    """A backward always causal: what it gives where causal is False."""
    return None if causal else _tiled(q, k, v, o, lse, do, block_q, block_k, True)


LSE_EXP2 = ("P is rebuilt with exp2, but lse is a natural log (07's forward returns m + log(l)): P = exp(S - lse). "
            "exp2 works only with S and lse both in base 2 (each times log2(e)).")
DQ_WRONG_AXIS = ("dQ is dS^T @ K, accumulated over the wrong axis: dQ_i sums over the keys j (the columns of dS), "
                 "so dQ_blk += dS @ K_blk * scale.")
DK_LAST_BLOCK = ("dK holds only the last query block's share: a key receives a share of dK from every query block, so "
                 "add to it (dK_blk += dS^T @ Q_blk * scale), do not overwrite it.")
DK_DV_NOT_RESET = ("dK and dV carry over from one key block to the next: their sums (dk_blk, dv_blk) are made once, "
                   "before the loop over key blocks, so each block also gets the earlier blocks' shares. Start them "
                   "at zero for every key block, dk_blk = torch.zeros_like(k_blk) inside the loop.")
LATE_START = ("the query loop of a key block starts at the query block that holds {at} instead of the one that holds "
              "k_start: the tiles where the key block's first keys meet their own queries are skipped (their dq, dk and "
              "dv shares are never added). The first query block that sees a key is the one that holds k_start, "
              "(k_start // block_q) * block_q.")
FLASH_MISTAKES = [
    Mistake(NO_DELTA, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, subtract_delta=False))),
    Mistake(DK_SCALE_MISSING, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dk_scale=0))),
    Mistake(DK_SCALE_TWICE, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dk_scale=2))),
    Mistake(NO_LSE, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, use_lse=False))),
    Mistake("a query tile ends at q_start + block_k, not q_start + block_q: when the two sizes differ, the query "
            "tiles overlap (their rows counted twice) or leave rows out. q_end = min(q_start + block_q, T).",
            _when_it_shows(lambda q, k, v, o, lse, do, bq, bk, *a, **kw: _tiled(q, k, v, o, lse, do, bq, bk, *a, **kw,
                                                                               q_tile=bk))),
    Mistake(TILES_UNMASKED, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, mask=False))),
    Mistake(DK_WRONG_AXIS, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dk_transposed=False))),
    Mistake(DV_NOT_TRANSPOSED, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dv_transposed=False))),
    Mistake(DQ_LAST_BLOCK, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dq_accumulate=False))),
    Mistake(DELTA_FROM_TILE, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, delta="tile"))),
    Mistake(DELTA_FROM_V, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, delta="do v"))),
    Mistake(DELTA_NO_KEEPDIM, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, keepdim=False))),
    Mistake(SCALE_BY_D, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, scale_d=True))),
    Mistake(LSE_EXP2, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, exp2=True))),
    Mistake(DIAGONAL_MASKED, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, diagonal=True))),
    Mistake(NO_PARENTHESES, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, parentheses=False))),
    Mistake(DS_UNSCALED, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dq_scale=0, dk_scale=0))),
    Mistake(DQ_SCALE_MISSING, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dq_scale=0))),
    Mistake(DQ_SCALE_TWICE, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dq_scale=2))),
    Mistake(DQ_WRONG_AXIS, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dq_transposed=True))),
    Mistake(DK_LAST_BLOCK, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dk_accumulate=False))),
    Mistake(CAUSAL_IGNORED, _when_it_shows(_causal_ignored)),
    Mistake(DK_DV_NOT_RESET, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, reset_per_block=False))),
    Mistake(LATE_START.format(at="k_end, (k_end // block_q) * block_q,"),
            _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, q_first="k_end"))),
    Mistake(LATE_START.format(at="the key block's last key, ((k_end - 1) // block_q) * block_q,"),
            _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, q_first="k_last"))),
    Mistake("the query loop of a key block starts at (k_start // block_q) * block_k, a query block's index times "
            "block_k: with block_k > block_q it starts past the key block's first queries, whose tiles are skipped "
            "(their dq, dk and dv shares are never added). Start at (k_start // block_q) * block_q, the query block "
            "that holds k_start.", _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, q_first="times_block_k"))),
]


# --------------------------------------------------------------------------------------------
# Known mistakes: FlashAttention (functions of q, k, v, do, causal, block_q, block_k -> o, dq, dk, dv)
# --------------------------------------------------------------------------------------------
def _function(q, k, v, do, causal, block_q, block_k, *, order=(0, 1, 2), backward_causal=None, swapped=False):
    """The autograd.Function's results with one thing changed in its backward (``swapped``: o and do)."""
    o, lse = forward_statistics(q, k, v, causal)
    given = (do, lse, o) if swapped else (o, lse, do)
    grads = _tiled(q, k, v, *given, block_q, block_k, causal if backward_causal is None else backward_causal)
    if any(grads[i].shape != grads[j].shape for i, j in enumerate(order)):
        return None
    return (o, *(grads[i] for i in order))


def _function_shows(changed):
    def wrong(*args):
        got, right = changed(*args), _function(*args)
        if got is None:
            return None
        same = all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(got, right))
        return None if same else got
    return wrong


FUNCTION_MISTAKES = [
    Mistake("backward returns the gradients in the wrong order: one per argument of forward, as forward takes them: "
            "dq, dk, dv (then None for causal, block_q, block_k).",
            _function_shows(lambda *a: _function(*a, order=(0, 2, 1)))),
    Mistake("backward returns the gradients in the wrong order: one per argument of forward, as forward takes them: "
            "dq, dk, dv (then None for causal, block_q, block_k).",
            _function_shows(lambda *a: _function(*a, order=(1, 0, 2)))),
    Mistake("the backward is always causal: keep forward's causal on ctx (ctx.causal = causal) and pass it to "
            "flash_attention_backward.", _function_shows(lambda *a: _function(*a, backward_causal=True))),
    Mistake("the backward is never causal: keep forward's causal on ctx (ctx.causal = causal) and pass it to "
            "flash_attention_backward.", _function_shows(lambda *a: _function(*a, backward_causal=False))),
    Mistake("o and do are swapped in the call of flash_attention_backward: it takes (q, k, v, o, lse, do, block_q, "
            "block_k, causal), the forward's output o before lse and the incoming gradient do after it.",
            _function_shows(lambda *a: _function(*a, swapped=True))),
]


def _for_kernel(mistake: Mistake) -> Mistake:
    """A mistake of the tiled loop, as the Triton check calls it: ``(q, k, v, o, lse, do, causal=, block_m=,
    block_n=)`` -> ``(dk, dv)``; the kernel masks every tile, so a mask missing is only forgotten there."""
    def wrong(q, k, v, o, lse, do, causal=True, block_m=16, block_n=16):
        got = mistake.wrong(q, k, v, o, lse, do, block_m, block_n, causal)
        return None if got is None or got[1] is None and got[2] is None else got[1:]
    return Mistake(MASK_FORGOTTEN if mistake.hint == TILES_UNMASKED else mistake.hint, wrong)


MISTAKES = {
    "attention_backward_reference": REFERENCE_MISTAKES,
    "flash_attention_backward": FLASH_MISTAKES,
    "FlashAttention": FUNCTION_MISTAKES,
    "flash_attention_backward_triton": [_for_kernel(m) for m in FLASH_MISTAKES  # dq is not the kernel's
                                        if m.hint not in (DQ_LAST_BLOCK, DQ_SCALE_MISSING, DQ_SCALE_TWICE, DQ_WRONG_AXIS,
                                                          DS_UNSCALED)],
}


# --------------------------------------------------------------------------------------------
# The backward's family of mistakes (issue 36): the tiled backward in float64 with one thing changed. Its model is
# the answer with one edit, so it lives here; the student edition holds its outputs on the visible cases.
# --------------------------------------------------------------------------------------------
def _backward_model(case: Case, block_q: int, block_k: int, causal: bool, keep: Callable = None,
                    scope: str = "every", lse_sign: float = -1.0, q_at: str = "query", do_at: str = "query",
                    dp_with: str = "v", dq_with: str = "ds", dk_with: str = "ds", delta_with: str = "o",
                    ds_form: str = "p(dp-delta)", q_step: str = "block_q", first_head: tuple[str, ...] = (),
                    on_keys: tuple[str, ...] = ()) -> tuple[torch.Tensor, ...] | None:
    """``(dq, dk, dv)`` (``(L, T, D)``, float64) of the tiled backward on ``case``'s ``q, k, v, do`` with one thing
    changed: the causal test ``keep(rows, cols, local_rows, local_cols)`` (``(Bq, Bk)`` bool; applied to every tile or
    to the ``"diagonal"`` ones, or only to those with ``"same_start"``, q_start == k_start), the sign of ``lse`` in ``P = exp(S + lse_sign * lse)``, the q or dO tile sliced with
    the ``"key"`` block's range, dP = dO X^T with X in ``v, o, k, q``, delta = rowsum(dO * X) with X in ``o, q, k, v``,
    dq / dk built from ``"p"`` instead of dS, or dS with P and dP in each other's places (``ds_form="dp(p-delta)"``).
    The loops are the right ones (a key block starts at the first query block that sees it), except that the query
    loop may step by ``q_step="block_k"`` while each tile still spans ``block_q`` queries. ``first_head``: the row
    statistics (``"lse"``, ``"delta"``) every (batch, head) reads at the first one's rows; ``on_keys``: those a tile
    lines up with its keys (``[None, :]``) instead of its queries; ``delta_with="lse"``: delta read from lse. ``None``
    where a slice does not fit."""
    do = case.args[3] if len(case.args) == 4 else case.args[5]
    q, k, v, do = (a.detach().double().cpu().reshape(-1, *a.shape[-2:]) for a in (*case.args[:3], do))  # (L, T, D)
    T, D = q.shape[-2:]
    scale = 1 / math.sqrt(D)
    s_all = q @ k.transpose(-2, -1) * scale  # (L, T, T)
    if causal:
        s_all = s_all.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    lse = s_all.logsumexp(-1)  # (L, T)
    o = torch.softmax(s_all, -1) @ v  # (L, T, D)
    delta = lse if delta_with == "lse" else (do * {"o": o, "q": q, "k": k, "v": v}[delta_with]).sum(-1)  # (L, T)
    if "lse" in first_head:
        lse = lse[:1].expand_as(lse)  # (L, T): the first (batch, head)'s row for every one
    if "delta" in first_head:
        delta = delta[:1].expand_as(delta)  # (L, T)
    keep = keep or (lambda r, c, lr, lc: c <= r)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for ks in range(0, T, block_k):
        ke = min(ks + block_k, T)
        for qs in range((ks // block_q) * block_q if causal else 0, T, block_k if q_step == "block_k" else block_q):
            qe = min(qs + block_q, T)
            qr, dr = (slice(ks, ke) if at == "key" else slice(qs, qe) for at in (q_at, do_at))
            if (qr.stop - qr.start) != qe - qs or (dr.stop - dr.start) != qe - qs:
                return None
            q_blk, do_blk = q[:, qr], do[:, dr]  # (L, Bq, D)
            s = q_blk @ k[:, ks:ke].transpose(-2, -1) * scale  # (L, Bq, Bk)
            if causal and (scope == "every" or scope == "diagonal" and ke - 1 > qs or scope == "same_start" and qs == ks):
                rows, cols = torch.arange(qs, qe)[:, None], torch.arange(ks, ke)[None, :]
                s = s.masked_fill(~keep(rows, cols, rows - qs, cols - ks), float("-inf"))
            if on_keys and qe - qs != ke - ks:
                return None  # a (Bq,) row along Bk keys: a shape error, not a model
            row_lse, row_delta = ((x[:, None, qs:qe] if n in on_keys else x[:, qs:qe, None])
                                  for n, x in (("lse", lse), ("delta", delta)))  # (L, Bq, 1) or (L, 1, Bq)
            p = torch.exp(s + lse_sign * row_lse)  # (L, Bq, Bk)
            dv[:, ks:ke] += p.transpose(-2, -1) @ do_blk
            x = {"v": v, "o": o, "k": k, "q": q}[dp_with][:, ks:ke]  # (L, Bk, D)
            dp = do_blk @ x.transpose(-2, -1)  # (L, Bq, Bk)
            ds = dp * (p - row_delta) if ds_form == "dp(p-delta)" else p * (dp - row_delta)
            dq[:, qs:qe] += (p if dq_with == "p" else ds) @ k[:, ks:ke] * scale
            dk[:, ks:ke] += (p if dk_with == "p" else ds).transpose(-2, -1) @ q_blk * scale
    return dq, dk, dv


def _backward_variants(kind: str) -> list[tuple[str, dict]]:
    """The one-thing-changed backwards of :func:`_backward_model` (a family of mistakes: one comparison turned,
    one slice shifted, one operand swapped, one sign flipped), each with the words that name it for ``kind``."""
    kernel = kind == "kernel"
    loop = "each query block's" if kind == "tiled" else "the"
    found = [("P is recomputed as exp(S + lse): the saved log-sum-exp is added where it must be subtracted, P = "
              "exp(S - lse)", {"lse_sign": 1.0})] if kind != "reference" else []
    for op, keep in ((">=", lambda r, c, lr, lc: c >= r), (">", lambda r, c, lr, lc: c > r),
                     ("<", lambda r, c, lr, lc: c < r)):
        test = (f"offs_n[None, :] {op} rows[:, None]" if kernel else f"key {op} query")
        what = {">=": "keeps each query's own key and the keys after it and hides the earlier ones: the comparison is "
                      "turned round", ">": "keeps only the keys after each query: the comparison is turned round",
                "<": "hides each query's own key (the diagonal) as well"}[op]
        right = "offs_n[None, :] <= rows[:, None]" if kernel else "key <= query (masked where cols > rows)"
        found += [(f"the causal test keeps {test}: it {what}. Keep {right}", {"keep": keep, "scope": scope})
                  for scope in ("every", "diagonal")]
    if kind == "tiled":
        for where, keep in (("query and key", lambda r, c, lr, lc: lc <= lr),
                            ("query", lambda r, c, lr, lc: c <= lr), ("key", lambda r, c, lr, lc: lc <= r)):
            found += [(f"the causal mask of a tile compares the {where} positions inside the tile (counted from 0 at the "
                       f"tile's first row or column) instead of the positions in the sequence: rows = arange(q_start, "
                       f"q_end)[:, None], cols = arange(k_start, k_end)[None, :]", {"keep": keep, "scope": scope})
                      for scope in ("every", "diagonal")]
    if kind == "tiled":
        found.append(("only the tile whose q_start == k_start is masked: that test finds the tiles that cross the "
                      "diagonal only when block_q == block_k. With other sizes other tiles cross it too: mask every "
                      "tile whose last key is after its first query, k_end - 1 > q_start", {"scope": "same_start"}))
    if kind != "reference":
        for name, arg in (("dO", "do_at"), ("q", "q_at")):
            found.append(((f"{name} is loaded at the key positions offs_n instead of the query rows rows = start_m + "
                           f"offs_m" if kernel else
                           f"the {name} tile is sliced with the key block's range, {name.lower()}[..., k_start:k_end, "
                           f":], instead of {loop} range, {name.lower()}[..., q_start:q_end, :]"), {arg: "key"}))
    for x in ("o", "k", "q"):
        found.append((f"dP = dO {x.upper()}^T takes {x.upper() if x != 'o' else 'the output O'} where it takes the "
                      f"values: dP = dO V^T", {"dp_with": x}))
    for x in ("q", "k", "v"):
        found.append((f"delta = rowsum(dO * {x.upper()}) takes {x.upper()} where it takes the output: delta = "
                      f"rowsum(dO * O), one number per query row", {"delta_with": x}))
    for g, formula in (("dk", "dk = dS^T Q / sqrt(D)"), ("dq", "dq = dS K / sqrt(D)")):
        found.append((f"{g} is built from P instead of dS (as dv is from P): {formula}", {f"{g}_with": "p"}))
    if kind != "reference":
        for axis in (("lse", "delta"), ("lse",), ("delta",)):
            names = " and ".join(axis)
            found.append((f"{names} {'are' if len(axis) > 1 else 'is'} lined up with the tile's keys, "
                          f"{axis[0]}[None, :], instead of its queries: one number per query row belongs along the "
                          f"rows, {axis[0]}[:, None] (each column then used another query's value; with BLOCK_M != "
                          f"BLOCK_N it is a shape error)" if kernel else
                          f"{names} {'are' if len(axis) > 1 else 'is'} lined up with the tile's keys, "
                          f"{axis[0]}[..., None, q_start:q_end], instead of its queries: one number per query row "
                          f"belongs along the rows, {axis[0]}[..., q_start:q_end, None]", {"on_keys": axis}))
    if kernel:
        found.append(("DELTA is loaded from the LSE pointer: delta takes the values of lse. Load it from DELTA, "
                      "tl.load(DELTA + bh * T + rows, ...)", {"delta_with": "lse"}))
        for first in (("lse", "delta"), ("lse",), ("delta",)):
            loads = " and ".join(f"{n.upper()} + bh * T + rows" for n in first)
            found.append((f"{' and '.join(n.upper() for n in first)} {'are' if len(first) > 1 else 'is'} loaded at the "
                          f"first (batch, head)'s rows in every program: the pointer lacks this program's offset. lse "
                          f"and delta are (B*H, T), one row per (batch, head): load {loads}, as Q, K and V are offset by "
                          f"bh * stride_b", {"first_head": first}))
    if kind == "tiled":
        found.append(("the loop over query blocks steps by block_k while each tile spans block_q queries: with "
                      "block_k > block_q some query rows are never visited, with block_k < block_q tiles overlap and "
                      "rows are counted twice. Step the query loop by block_q, range(first, T, block_q)",
                      {"q_step": "block_k"}))
    found.append(("dS is dP * (P - delta): P and dP are in each other's places. The softmax's backward is dS = P * "
                  "(dP - delta): the weights P times (dP minus the row's delta), which also makes dS 0 wherever P is 0 "
                  "(the masked keys)", {"ds_form": "dp(p-delta)"}))
    return found


def _backward_family(case: Case) -> list[list]:
    """``[[words, (dq, dk, dv)], ...]`` of the members of :func:`_backward_variants` whose gradients on ``case``
    differ from the right ones (``FAMILIES``: the checks complete the words). Each gradient ``(L, T, D)`` in float32
    (a hint's tolerance is far coarser), or ``None`` where it is the right one (the check reads the expected one
    there), and so for a kernel's dq, which the kernel does not compute: the recording stays small."""
    layout = _backward_layout(case)
    if layout is None:
        return []
    kind, block_q, block_k, causal = layout
    right = _backward_model(case, block_q, block_k, causal)
    found = []
    for words, change in _backward_variants(kind):
        if not causal and "keep" in change:
            continue
        model = _backward_model(case, block_q, block_k, causal, **change)
        if model is None:
            continue
        changed = tuple(None if (kind == "kernel" and n == 0) or torch.allclose(m, r, atol=1e-12, rtol=1e-9)
                        else m.float() for n, (m, r) in enumerate(zip(model, right)))
        if any(m is not None for m in changed):
            found.append([words, changed])
    return found


def _kernel_model(case: Case, q_read: torch.Tensor, do_read: torch.Tensor, lse_at: Callable, delta_at: Callable,
                  visits: Callable | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dk, dv)`` (``(L, T, D)``, float64) of a kernel launched on ``case`` whose program for key block ``b`` reads, for
    query row ``r``, the rows ``q_read[:, r]`` and ``do_read[:, r]`` (``(L, T, D)``) and the statistics at rows
    ``lse_at(r, b)`` and ``delta_at(r, b)`` (``(T,)`` index tensors; a row past ``T`` reads 0, as the masked loads do).
    The mask is the right one; so are the loops, unless ``visits(b)`` (``(T,)`` bool) says which query rows key block
    ``b``'s program reaches."""
    q, k, v, o, _, do = (a.detach().double().cpu().reshape(-1, *a.shape[-2:]) for a in case.args[:6])  # (L, T, D)
    L, T, D = q.shape
    lse = case.args[4].detach().double().cpu().reshape(L, T)
    delta = (do * o).sum(-1)  # (L, T)
    bn, causal = case.kwargs["block_n"], bool(case.kwargs["causal"])
    rows = torch.arange(T)
    dk, dv = torch.zeros(L, T, D, dtype=torch.float64), torch.zeros(L, T, D, dtype=torch.float64)

    def read(stat: torch.Tensor, at: torch.Tensor) -> torch.Tensor:  # (L, T) at rows ``at``, 0 past T
        return torch.where(at < T, stat[:, at.clamp(max=T - 1)], torch.zeros(()))

    for b in range(math.ceil(T / bn)):
        keys = torch.arange(b * bn, min((b + 1) * bn, T))
        s = q_read @ k[:, keys].transpose(-2, -1) / math.sqrt(D)  # (L, T, Bn)
        keep = (keys[None, :] <= rows[:, None]) if causal else torch.ones(T, len(keys), dtype=torch.bool)
        if visits is not None:
            keep = keep & visits(b)[:, None]
        p = torch.exp(s - read(lse, lse_at(rows, b))[..., None]) * keep  # (L, T, Bn)
        dv[:, keys] = p.transpose(-2, -1) @ do_read
        ds = p * (do_read @ v[:, keys].transpose(-2, -1) - read(delta, delta_at(rows, b))[..., None])
        dk[:, keys] = ds.transpose(-2, -1) @ q_read / math.sqrt(D)
    return dk, dv

def _reads_family(case: Case) -> list[list]:
    """``[[words, (dk, dv)], ...]`` (``(L, T, D)`` each, float32) of a kernel that reads some rows at the wrong place
    (:func:`_kernel_model`), the members whose gradients on ``case`` differ from the right ones (``FAMILIES``)."""
    q, do = (case.args[i].detach().double().cpu() for i in (0, 5))
    q, do = q.reshape(-1, *q.shape[-2:]), do.reshape(-1, *do.shape[-2:])  # (L, T, D)
    T, D = q.shape[-2:]
    bm, bn = case.kwargs["block_m"], case.kwargs["block_n"]

    def unstrided(x: torch.Tensor) -> torch.Tensor:  # (L, T, D): row r read as the D numbers from element r on
        return x.flatten(1).unfold(1, D, 1)[:, :T]

    right = lambda r, b: r  # noqa: E731
    at_keys = lambda r, b: b * bn + r % bm  # noqa: E731 - each query row i of a tile reads key start_n * BLOCK_N + i
    at_offsets = lambda r, b: r % bm  # noqa: E731
    models = [(f"{stat} is loaded at the key positions offs_n (query row i of each tile reads the {stat} of key "
               f"start_n * BLOCK_N + i) instead of at the query rows: load it at rows = start_m + offs_m, masked "
               f"with rows < T",
               q, do, *((at_keys, right) if stat == "lse" else (right, at_keys))) for stat in ("delta", "lse")]
    models += [(f"{stat} is loaded at the tile's offsets offs_m (0..BLOCK_M - 1, the first query block's rows) in "
                f"every iteration instead of at the query rows: load it at rows = start_m + offs_m",
                q, do, *((at_offsets, right) if stat == "lse" else (right, at_offsets))) for stat in ("delta", "lse")]
    models += [(f"{which} {'are' if which == 'q and dO' else 'is'} loaded at rows[:, None] + offs_d[None, :], "
                f"without the row stride: row r is read as the {D} numbers from element r on (overlapping slices of "
                f"the first rows), not from element r * stride_t. Load {'them' if which == 'q and dO' else 'it'} at "
                f"rows[:, None] * stride_t + "
                f"offs_d[None, :], as k and v are loaded", q_read, do_read, right, right)
               for which, q_read, do_read in (("q and dO", unstrided(q), unstrided(do)), ("q", unstrided(q), do),
                                              ("dO", q, unstrided(do)))]
    bm_, causal = bm, bool(case.kwargs["causal"])

    def scaled_again(b: int) -> torch.Tensor:  # (T,): rows = start_m * BLOCK_M + offs_m, start_m already a position
        seen = torch.zeros(T, dtype=torch.bool)
        for start_m in range((b * bn // bm_) * bm_ if causal else 0, T, bm_):
            seen[start_m * bm_:min(start_m * bm_ + bm_, T)] = True
        return seen

    models = [(*m, None) for m in models]
    models.append(("query rows are rows = start_m * BLOCK_M + offs_m while start_m is already a position (the loop "
                   "steps by BLOCK_M from lo): every query block after the first lands past T, masked out, so most "
                   "queries never reach dk and dv. Write rows = start_m + offs_m", q, do, right, right, scaled_again))
    right_grads = _kernel_model(case, q, do, right, right)
    found = []
    for words, q_read, do_read, lse_at, delta_at, visits in models:
        model = _kernel_model(case, q_read, do_read, lse_at, delta_at, visits)
        if not all(torch.allclose(m, r, atol=1e-12, rtol=1e-9) for m, r in zip(model, right_grads)):
            found.append([words, tuple(m.float() for m in model)])
    return found


FAMILIES = {
    "attention_backward_reference": {"backward": _backward_family},
    "flash_attention_backward": {"backward": _backward_family},
    "flash_attention_backward_triton": {"backward": _backward_family, "reads": _reads_family},
}
