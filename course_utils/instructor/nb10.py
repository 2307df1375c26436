"""Notebook 10's hidden cases and known mistakes (instructor only; see the package docstring)."""

from __future__ import annotations

import math

import torch

from course_utils.checks.core import Case
from course_utils.checks.nb10 import _backward_case, _inputs, forward_statistics, kernel_case
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
          mask=True, delta="do o"):
    """The untiled backward with one thing changed (all defaults: the right answer)."""
    T, D = q.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(D)
    s = q @ k.transpose(-2, -1) * scale
    if causal and mask:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), _INF)
    p = torch.softmax(s, dim=-1)
    o = p @ v
    dv = (p.transpose(-2, -1) if transpose_p else p) @ do
    dp = do @ v.transpose(-2, -1)
    rows = {"do o": (do * o), "do": do, "p": p}[delta].sum(dim=-1, keepdim=True)
    ds = p * (dp - rows) if subtract_delta else p * dp
    return ds @ k * scale ** dq_scale, ds.transpose(-2, -1) @ q * scale ** dk_scale, dv


NO_DELTA = ("dS = P * dP without subtracting delta: the softmax's backward is dS = P * (dP - delta), with "
            "delta = rowsum(dO * O) (one number per query), because every weight of a row moves when one score "
            "moves.")
DK_SCALE_MISSING = ("dK misses the scale: S = Q K^T / sqrt(D), so dK = dS^T Q / sqrt(D), like dQ = dS K / sqrt(D).")
DK_SCALE_TWICE = ("dK is scaled twice: dK = dS^T Q / sqrt(D), one factor 1/sqrt(D), the one of S = Q K^T / sqrt(D).")
DQ_SCALE_MISSING = "dQ misses the scale: S = Q K^T / sqrt(D), so dQ = dS K / sqrt(D)."
DV_NOT_TRANSPOSED = ("dV = P dO instead of P^T dO: value j collects from every query i that attended to it, a sum over "
                     "the rows of P, so transpose P.")
REFERENCE_MISTAKES = [
    Mistake(NO_DELTA, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, subtract_delta=False)),
    Mistake(DK_SCALE_MISSING, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, dk_scale=0)),
    Mistake(DK_SCALE_TWICE, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, dk_scale=2)),
    Mistake(DQ_SCALE_MISSING, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, dq_scale=0)),
    Mistake(DV_NOT_TRANSPOSED, lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, transpose_p=False)),
    Mistake("the causal mask is missing: with causal=True the weights P of the forward are masked, so the backward's "
            "must be too (-inf above the diagonal before the softmax).",
            lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, mask=False) if causal else None),
    Mistake("the causal argument is ignored: with causal=False every query sees every key.",
            lambda q, k, v, do, causal=True: None if causal else _full(q, k, v, do, True)),
    Mistake("delta is the row sum of dO alone: delta = rowsum(dO * O), the product with the output, one number per "
            "query.",
            lambda q, k, v, do, causal=True: _full(q, k, v, do, causal, delta="do")),
]


# --------------------------------------------------------------------------------------------
# Known mistakes: flash_attention_backward (functions of q, k, v, o, lse, do, block_q, block_k, causal)
# --------------------------------------------------------------------------------------------
def _tiled(q, k, v, o, lse, do, block_q, block_k, causal=True, *, subtract_delta=True, dk_scale=1, use_lse=True,
           mask=True, dk_transposed=True, dv_transposed=True, dq_accumulate=True, delta="do o"):
    """The tiled backward with one thing changed (all defaults: the right answer)."""
    T, D = q.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(D)
    full_delta = (do * o).sum(dim=-1)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for ks in range(0, T, block_k):
        ke = min(ks + block_k, T)
        kb, vb = k[..., ks:ke, :], v[..., ks:ke, :]
        dkb, dvb = torch.zeros_like(kb), torch.zeros_like(vb)
        for qs in range((ks // block_q) * block_q if causal else 0, T, block_q):
            qe = min(qs + block_q, T)
            qb, dob = q[..., qs:qe, :], do[..., qs:qe, :]
            s = qb @ kb.transpose(-2, -1) * scale
            if causal and mask and ke - 1 > qs:
                s = s.masked_fill(torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None], _INF)
            p = torch.exp(s - lse[..., qs:qe, None]) if use_lse else torch.exp(s)
            dvb = dvb + (p.transpose(-2, -1) if dv_transposed else p) @ dob
            dp = dob @ vb.transpose(-2, -1)
            rows = full_delta[..., qs:qe, None] if delta == "do o" else (p * dp).sum(dim=-1, keepdim=True)
            ds = p * (dp - rows) if subtract_delta else p * dp
            if dq_accumulate:
                dq[..., qs:qe, :] += ds @ kb * scale
            else:
                dq[..., qs:qe, :] = ds @ kb * scale
            dkb = dkb + (ds.transpose(-2, -1) if dk_transposed else ds) @ qb * scale ** dk_scale
        dk[..., ks:ke, :], dv[..., ks:ke, :] = dkb, dvb
    return dq, dk, dv


def _when_it_shows(changed):
    """``changed`` where it differs from the right answer on this input, else ``None`` (no hint)."""
    def wrong(*args, **kwargs):
        got, right = changed(*args, **kwargs), _tiled(*args, **kwargs)
        same = all(torch.allclose(a, b, atol=1e-5, rtol=1e-4, equal_nan=True) for a, b in zip(got, right))
        return None if same else got
    return wrong


NO_LSE = ("P is rebuilt without the lse: exp(S) is not normalised. The forward saved lse = log(sum_j exp(S_ij)) "
          "for exactly this: P = exp(S - lse[..., None]) is the softmax, in one step.")
MASK_FORGOTTEN = ("the causal mask is forgotten in the backward: the tiles that cross the diagonal must be masked as in "
                  "the forward (S = -inf where key position > query position), or P has weights on future keys.")
DQ_LAST_BLOCK = ("dQ holds only the last key block's share: a query receives a share of dQ from every key block, so "
                 "add to it (dq[..., q_start:q_end, :] += dS @ K_blk * scale), do not overwrite it.")
DK_WRONG_AXIS = ("dK is dS @ Q, accumulated over the wrong axis: dK_j sums over the queries i (the rows of dS), "
                 "so dK_blk += dS^T @ Q_blk * scale.")
DELTA_FROM_TILE = ("delta is taken from one tile, rowsum(P_tile * dP_tile): it needs the whole row, and one key "
                   "block sees part of it. Compute delta = rowsum(dO * O) once, before the loops: the same number, "
                   "from the output.")
FLASH_MISTAKES = [
    Mistake(NO_DELTA, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, subtract_delta=False))),
    Mistake(DK_SCALE_MISSING, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dk_scale=0))),
    Mistake(DK_SCALE_TWICE, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dk_scale=2))),
    Mistake(NO_LSE, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, use_lse=False))),
    Mistake(MASK_FORGOTTEN, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, mask=False))),
    Mistake(DK_WRONG_AXIS, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dk_transposed=False))),
    Mistake(DV_NOT_TRANSPOSED, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dv_transposed=False))),
    Mistake(DQ_LAST_BLOCK, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, dq_accumulate=False))),
    Mistake(DELTA_FROM_TILE, _when_it_shows(lambda *a, **kw: _tiled(*a, **kw, delta="tile"))),
]


# --------------------------------------------------------------------------------------------
# Known mistakes: FlashAttention (functions of q, k, v, do, causal, block_q, block_k -> o, dq, dk, dv)
# --------------------------------------------------------------------------------------------
def _function(q, k, v, do, causal, block_q, block_k, *, order=(0, 1, 2), backward_causal=None):
    """The autograd.Function's results with one thing changed in its backward."""
    o, lse = forward_statistics(q, k, v, causal)
    grads = _tiled(q, k, v, o, lse, do, block_q, block_k, causal if backward_causal is None else backward_causal)
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
]


def _for_kernel(mistake: Mistake) -> Mistake:
    """A mistake of the tiled loop, as the Triton check calls it: ``(q, k, v, o, lse, do, causal=, block_m=,
    block_n=)`` -> ``(dk, dv)``."""
    def wrong(q, k, v, o, lse, do, causal=True, block_m=16, block_n=16):
        got = mistake.wrong(q, k, v, o, lse, do, block_m, block_n, causal)
        return None if got is None else got[1:]
    return Mistake(mistake.hint, wrong)


MISTAKES = {
    "attention_backward_reference": REFERENCE_MISTAKES,
    "flash_attention_backward": FLASH_MISTAKES,
    "FlashAttention": FUNCTION_MISTAKES,
    "flash_attention_backward_triton": [_for_kernel(m) for m in FLASH_MISTAKES if m.hint != DQ_LAST_BLOCK],
}
