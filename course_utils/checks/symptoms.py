"""Generic symptom diagnoses (issue 36): read WHERE and HOW an output is wrong, or what a raised error's sizes
and dtypes stand for, and say it in terms of the code that causes it.

Per-mistake hints (a known mistake's recorded output) name one mistake; these name a symptom that many
mistakes share, so they also name mistakes nobody listed. Each exercise declares once how its outputs hold
tokens (:class:`Tokens`: blocks of queries and keys, the leading batch and head dimensions, causal or not), and
the sizes its errors can mention (:func:`error_hint`'s ``sizes``). Every function returns a sentence or
``None`` and never raises (a hint is a bonus); numbers are rounded as the other messages round them.
Used after the specific hints of notebooks 07 and 10 (and ``core.explain``'s fallback for dtype and index
errors), so a known mistake keeps its own words.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

_ATOL, _RTOL = 1e-5, 1e-4


@dataclass(frozen=True)
class Tokens:
    """How an exercise's outputs hold tokens, declared once per exercise (and case).

    An output is ``(*lead, T, D)``: ``lead`` names its leading dimensions (``("batch", "head")``), the
    next-to-last holds tokens in blocks of ``block`` (``rows``: ``"query"`` for out, lse's and dq's rows,
    ``"key"`` for dk's and dv's), the last the features. ``other_block`` is the block size of the other token
    axis (the key blocks a query row runs through); ``causal`` whether the attention is."""

    block: int | None = None
    other_block: int | None = None
    causal: bool = True
    rows: str = "query"
    lead: tuple[str, ...] = ("batch", "head")


def sizes_of(q: Any, tokens: Tokens) -> dict[str, int]:
    """The sizes a raised error can mention (:func:`error_hint`'s ``sizes``), by what they stand for, for queries
    ``q`` (``(..., T, head_dim)``) in the blocks of ``tokens`` (a query row's): ``block_q``, ``block_k``,
    ``head_dim``, ``T`` and a last block's ``T % block_q``/``T % block_k``; ``{}`` where ``q`` is no such tensor."""
    if not isinstance(q, torch.Tensor) or q.dim() < 2:
        return {}
    T, D = q.shape[-2], q.shape[-1]
    blocks = (("q", tokens.block), ("k", tokens.other_block)) if tokens.block and tokens.other_block else ()
    return {**{f"block_{n}": b for n, b in blocks}, "head_dim": D, "T": T,
            **{f"T % block_{n}": T % b for n, b in blocks if T % b}}


def bonus(fn: Callable[..., str | None]) -> Callable[..., str | None]:
    """``fn``, returning ``None`` where it would raise: a hint is a bonus, and a diagnosis never raises."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> str | None:
        try:
            return fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - a hint is a bonus
            return None
    return wrapper


def _off(want: torch.Tensor, got: torch.Tensor, atol: float = _ATOL, rtol: float = _RTOL) -> torch.Tensor:
    w, g = want.detach().double().cpu(), got.detach().double().cpu()
    return ((g - w).abs() > atol + rtol * w.abs()) | torch.isnan(g)


def off_rows(want: torch.Tensor, got: torch.Tensor, atol: float = _ATOL, rtol: float = _RTOL) -> torch.Tensor:
    """Which rows of ``got`` (``(..., T, D)``) differ from ``want`` anywhere (NaN included): ``(..., T)``."""
    return _off(want, got, atol, rtol).any(-1)


def _span(rows: list[int]) -> str:
    return f"{rows[0]}..{rows[-1]}" if len(rows) > 1 else f"{rows[0]}"


@bonus
def where_wrong(tokens: Tokens, want: Any, got: Any, name: str = "out", vector: bool = False,
                atol: float = _ATOL, rtol: float = _RTOL, loops_right: bool = False) -> str | None:
    """Which (batch, head) slices or which token rows of ``got`` (``(*lead, T, D)`` or ``(*lead, T)``) are wrong,
    when that pattern points at code: only the first (batch, head) right (an offset that ignores them); NaN on
    whole blocks (a tile never computed); rows from the first one that reads a second block on (the update
    carried from block to block); every block but the first (state not started afresh per block); the last,
    shorter block alone (its end). ``vector``: ``got`` has no feature dimension (lse: ``(*lead, T)``).
    ``loops_right``: another output that sums over every tile the loops visit agrees (the backward's dv), so the
    patterns that blame a loop's range are not said."""
    if not (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)) or got.shape != want.shape:
        return None
    w = want if not vector else want[..., None]
    g = got if not vector else got[..., None]
    if w.dim() < 2:
        return None
    off = _off(w, g, atol, rtol)
    if not bool(off.any()):
        return None
    slices = off.flatten(0, -3) if off.dim() > 2 else off[None]  # (L, T, D)
    if len(slices) >= 2:
        bad = slices.flatten(1).any(1)
        nan = torch.isnan(g.detach().double()).flatten(0, -3).flatten(1).all(1) if g.dim() > 2 else None
        if nan is not None and not bool(bad[0]) and bool(nan[1:].all()):
            dims = ", ".join(tokens.lead[-(off.dim() - 2):])
            return (f"{name} is right for the first ({dims}) slice and NaN for every other: those slices were "
                    f"computed from NaN, read past the end of an input (a kernel's launch here puts NaN after each "
                    f"buffer's last row), so their pointers are offset by the ({dims}) index with a stride too large. "
                    f"Each input's own stride: a row statistic such as lse or delta, (B*H, T), starts the row of "
                    f"(batch, head) bh at bh * T, not at bh * stride_b, the stride of q, k and v.")
        if nan is not None and not bool(nan[0]) and bool(nan[1:].all()):
            dims = ", ".join(tokens.lead[-(off.dim() - 2):])
            gs, ws = g.detach().double().flatten(0, -3), w.detach().double().flatten(0, -3)  # (L, T, D)
            if any(bool(torch.allclose(gs[0], ws[j], atol=atol, rtol=rtol)) for j in range(1, len(ws))):
                return (f"{name} is NaN (never written) for every ({dims}) slice but the first, which holds another "
                        f"slice's values: every program or iteration writes to the first slice. Offset the stores "
                        f"(and the loads) by the ({dims}) index, with that dimension's stride.")
            return (f"{name} is NaN for every ({dims}) slice but the first, and the first is wrong too: rows read "
                    f"past the end of an input (a kernel's launch here puts NaN after each buffer's last row) reach "
                    f"the other slices. Does a load's mask let rows past T through (a (BLOCK_M, HEAD_DIM) tile needs "
                    f"the 2-D mask rows[:, None] < T, not rows < T, which lines up with the columns), or do the "
                    f"stores all go to the first slice (a store not offset by the ({dims}) index)?")
        if not bool(bad[0]) and bool(bad[1:].all()):
            dims = ", ".join(tokens.lead[-(off.dim() - 2):]) if off.dim() > 2 else "batch"
            return (f"{name} is right for the first ({dims}) slice only and wrong for every other: an offset or a "
                    f"stride that ignores the {dims} (each slice must read and write its own rows: in a kernel, "
                    f"offset every pointer by the program's ({dims}) index, and the strides of that dimension).")
    T = off.shape[-2]
    rows_off = slices.any(0).any(-1)  # (T,)
    rows_nan = torch.isnan(g.detach().double()).flatten(0, -3).any(0).any(-1) if g.dim() > 2 else \
        torch.isnan(g.detach().double()).any(-1)
    rows = torch.arange(T)
    who, block = tokens.rows, tokens.block
    if block and bool(rows_nan.any()):
        blocks = sorted({int(r) // block for r in rows[rows_nan]})
        whole = torch.zeros(T, dtype=torch.bool)
        for b in blocks:
            whole[b * block:(b + 1) * block] = True
        if torch.equal(whole, rows_nan) and len(blocks) < math.ceil(T / block):
            listed = ", ".join(str(b) for b in blocks)
            offsets = "start_m * BLOCK_M" if who == "query" else "start_n * BLOCK_N"
            return (f"{name} is NaN on whole {who} block{'s' if len(blocks) > 1 else ''} {listed} (rows "
                    f"{_span([int(r) for r in rows[rows_nan]])}) and nowhere else: nothing was computed or stored "
                    f"for those rows (0/0 = NaN, or never written). Are those blocks' rows ever loaded and stored "
                    f"(in a kernel, the program's offsets {offsets} + arange), and does the loop over tiles run "
                    f"for them (its bounds)?")
    zero = (g.detach().double() == 0).flatten(0, -3).all(0).all(-1) if g.dim() > 2 else (g.detach() == 0).all(-1)
    want_zero = (w.detach().double() == 0).flatten(0, -3).any(0).all(-1) if w.dim() > 2 else (w.detach() == 0).all(-1)
    zero = zero & ~want_zero & rows_off
    if block and bool(zero.any()) and not bool(zero.all()) and not loops_right:
        other = "key" if who == "query" else "query"
        return (f"{name} is exactly 0 on rows {spans([int(r) for r in rows[zero]])} (where it must not be): no "
                f"{other} block ever added its share to those {who} rows. Does the loop over {other} blocks include "
                f"them, its start and its end? Each key block must meet every query that sees it: when causal, the "
                f"queries from the query block that holds its first key k_start on, up to T.")
    if not block or bool(rows_off.all()):
        return None
    n = math.ceil(T / block)
    bad = [b for b in range(n) if bool(rows_off[b * block:min((b + 1) * block, T)].any())]
    if not bad or len(bad) == n:
        return None
    whole = torch.zeros(T, dtype=torch.bool)
    for b in bad:
        whole[b * block:min((b + 1) * block, T)] = True
    exact = torch.equal(whole, rows_off)
    prefix, suffix = bad == list(range(len(bad))), bad == list(range(n - len(bad), n))
    last = (T // block) * block
    span = f"rows {bad[0] * block}..{min((bad[-1] + 1) * block, T) - 1}"
    flag = "causal" if tokens.causal else "causal=False"
    if suffix and bad == [n - 1] and 0 < last < T and exact and not (who == "key" and not tokens.causal):
        return (f"only the last, shorter {who} block (rows {last}..{T - 1}; T = {T} is not a multiple of the block "
                f"size {block}) is wrong: that block ends at min(start + block, T), and its slices, mask and "
                f"stores must use that end.")
    other = tokens.other_block
    inside = [b for b in range(n) if other and (b * block) % other]
    if who == "query" and tokens.causal and other and other > block and inside and bad == inside:
        wrong = spans([r for b in bad for r in range(b * block, min((b + 1) * block, T))])
        return (f"{name} is wrong exactly on query block{'s' if len(bad) > 1 else ''} {spans(bad)} (rows {wrong}), "
                f"right on the others: those whose first query is not a multiple of the key block size {other}, so "
                f"their diagonal begins inside a key block. Does the split between the key blocks read without a mask "
                f"and the masked diagonal ones fall on a key-block boundary: the query block's start rounded down to a "
                f"multiple of the key block size, (start_m * BLOCK_M) // BLOCK_N * BLOCK_N?")
    if name in ("out", "lse") and who == "query" and tokens.causal and other and other < T \
            and torch.equal(rows_off, rows >= other):
        return (f"{name} is right for queries 0..{other - 1}, which read one key block, and wrong from query {other} "
                f"on, the first to read a second key block (block_k = {other}): look at what carries from one key "
                f"block to the next: m_new, alpha = exp(m - m_new), l and acc rescaled by alpha, and m = m_new.")
    if who == "key" and not tokens.causal and suffix and not loops_right:
        return (f"{name} is right for the first key block{'s' if bad[0] > 1 else ''} and wrong for key blocks "
                f"{_span(bad)} ({span}), in a case with causal=False: with causal=False every query sees every key, "
                f"also the queries before a key block. Does the query loop start at 0 when causal is False (not at "
                f"the key block's diagonal, which is the causal start)?")
    if who == "key" and prefix and not loops_right:
        return (f"{name} is wrong for key blocks {_span(bad)} ({span}) and right for the last key block{'s' if n - len(bad) > 1 else ''} "
                f"({flag}): each key must receive a gradient from every query that sees it, up to the last query "
                f"T - 1. Does the query loop for a key block run to T (and not stop at that key block's own end)?")
    if who == "query" and not tokens.causal and prefix and not loops_right:
        return (f"{name} is wrong for query blocks {_span(bad)} ({span}) and right for the later ones, in a case with "
                f"causal=False: with causal=False every query reads all T keys; the early query blocks are those "
                f"that a causal end (q_end) cuts short. Does the key loop run to T when causal is False?")
    if suffix and bad[0] == 1 and exact:
        state = {"query": "m, l and acc (or dq's accumulator)", "key": "dk's and dv's accumulators"}.get(who, "state")
        more = (" When causal, the later query blocks are also those that read more than one key tile: check the key "
                "loop's range and step too (range(0, q_end, block_k), each tile k_start..min(k_start + block_k, "
                "T)), so that each key is read once." if who == "query" and tokens.causal and name != "dq" else "")
        return (f"{name} is right for the first {who} block (rows 0..{block - 1}) and wrong for every later one "
                f"({flag}). Does something carry over from one {who} block to the next ({state} must start afresh: "
                f"zeros, or -inf for a maximum, at the top of each {who} block's loop)? Or do the later blocks "
                f"overlap the earlier ones (each {who} block ends at min(start + its own block size, T))?{more}")
    if prefix and bad == [0] and exact:
        return (f"only the first {who} block (rows 0..{min(block, T) - 1}) is wrong ({flag}), every later one is "
                f"right. What differs for it? It is the first iteration (is a value used before it is set?)"
                f"{' and the block with the fewest keys (is its key loop or its mask right?)' if who == 'query' and tokens.causal else ''}.")
    return None


def spans(rows: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0..2, 5"``."""
    parts, start = [], None
    for i, r in enumerate(rows):
        start = r if start is None else start
        if i + 1 == len(rows) or rows[i + 1] != r + 1:
            parts.append(_span([start, r]) if r != start else f"{r}")
            start = None
    return ", ".join(parts)


@bonus
def keys_seen(q: Any, k: Any, v: Any, want: Any, got: Any, causal: bool, name: str = "out") -> str | None:
    """Which keys each wrong query row of an attention output ``got`` (``(..., T, Dv)``, from ``q``, ``k`` ``(..., T,
    D)`` and ``v``) attended to, when each is softmax attention over a prefix of the keys 0..e-1 with the wrong end:
    a causal output that sees future keys (a tile left unmasked), or one with ``causal=False`` that stops short of
    T (a loop's end, or a mask, that ignores the flag). ``None`` unless every wrong row is explained."""
    tensors = (q, k, v, want, got)
    if not all(isinstance(t, torch.Tensor) for t in tensors) or got.shape != want.shape or q.dim() < 2:
        return None
    Q, K, V, W, G = (t.detach().double().cpu().reshape(-1, *t.shape[-2:]) for t in tensors)
    T, D = Q.shape[-2], Q.shape[-1]
    off = _off(W, G).any(-1)  # (L, T)
    if not bool(off.any()) or K.shape[-2] != T:
        return None
    ends: dict[int, int] = {}
    for l, i in off.nonzero().tolist():
        s = (Q[l, i] @ K[l].T) / math.sqrt(D)  # (T,)
        found = None
        for e in range(1, T + 1):
            o = torch.softmax(s[:e], -1) @ V[l, :e]
            if not bool(_off(o, G[l, i]).any()):
                found = e
                break
        if found is None or (causal and found == i + 1) or (not causal and found == T):
            return None
        ends.setdefault(i, found)
        if ends[i] != found:
            return None
    rows = sorted(ends)
    r = rows[0]
    short = [i for i in rows if ends[i] < i + 1]
    if causal and short:
        if len(short) != len(rows):
            return None
        return (f"{name}'s query rows {spans(rows)} stop short of themselves (row {r} attends only to keys 0.."
                f"{ends[r] - 1}): the keys from there up to each query are never read. Does the causal loop over keys "
                f"run up to the query block's end (q_end, or (start_m + 1) * BLOCK_M in a kernel), rather than an end "
                f"counted in key blocks?")
    if causal:
        return (f"{name}'s query rows {spans(rows)} also attend to future keys (row {r} to keys 0..{ends[r] - 1}, "
                f"past itself): a tile that holds keys after some of its queries is left unmasked. Is every tile that "
                f"crosses the diagonal masked (any tile whose last key, k_end - 1, is after the block's first query, "
                f"q_start), and does each tile start and end on its block's boundaries?")
    if all(ends[i] == i + 1 for i in rows):
        return (f"with causal=False every query must attend to all {T} keys, but {name}'s query rows {spans(rows)} "
                f"attend only to the keys up to themselves (row {r} to keys 0..{r}): that is the causal output. Is "
                f"causal passed on to every call that takes it (its default is causal), and the mask applied only "
                f"when causal is True?")
    return (f"with causal=False every query must attend to all {T} keys, but {name}'s query rows {spans(rows)} attend "
            f"only to keys 0..{ends[r] - 1} (row {r}): the end a causal loop would use. Does the key loop (or the mask) "
            f"run to T when causal is False?")


@bonus
def queries_seen(q: Any, k: Any, do: Any, want: Any, got: Any, block_k: int, block_q: int, causal: bool,
                 name: str = "dv") -> str | None:
    """Which queries each wrong key block of ``got``, a ``dv`` (``(..., T, D)``, from ``q``, ``k`` and ``do``), took
    its gradient from, when each is the share of one run of ``block_q`` consecutive queries counted a whole number of
    times: the rows of the query loop's iterations, read at the wrong place. ``None`` unless every wrong key block is
    explained."""
    tensors = (q, k, do, want, got)
    if not all(isinstance(t, torch.Tensor) for t in tensors) or got.shape != want.shape or not (block_k and block_q):
        return None
    Q, K, dO, W, G = (t.detach().double().cpu().reshape(-1, *t.shape[-2:]) for t in tensors)
    T = Q.shape[-2]
    s = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (L, T, T)
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    P = torch.softmax(s, -1)
    found: dict[int, tuple[int, int]] = {}
    for b in range(math.ceil(T / block_k)):
        keys = slice(b * block_k, min((b + 1) * block_k, T))
        if not bool(_off(W[:, keys], G[:, keys]).any()):
            continue
        match = None
        for start in range(T):
            rows = slice(start, min(start + block_q, T))
            share = P[:, rows, keys].transpose(-2, -1) @ dO[:, rows]  # (L, keys, D)
            for times in range(1, math.ceil(T / block_q) + 1):
                if not bool(_off(times * share, G[:, keys]).any()):
                    match = (start, times)
                    break
            if match:
                break
        if match is None:
            return None
        found[b] = match
    if not found or all(start % block_q == 0 and times == 1 for start, times in found.values()):
        return None
    said = "; ".join(f"key block {b} (keys {b * block_k}..{min((b + 1) * block_k, T) - 1}): queries {start}.."
                     f"{min(start + block_q, T) - 1}{f', {times} times' if times > 1 else ''}"
                     for b, (start, times) in found.items())
    return (f"{name} of each wrong key block is the share of one run of {block_q} queries only ({said}): every "
            f"iteration of the query loop read the same rows, and not a query block. Are the query rows of each "
            f"iteration offset by the loop's own start (rows = start_m + arange(BLOCK_M), start_m running over the "
            f"query blocks), not by the program's key block?")


@bonus
def row_relation(want: Any, got: Any, name: str = "out") -> str | None:
    """A factor or a shift of its own for each row of ``got`` (``(..., T, D)``), when it is not one for all:
    each row multiplied by its own factor is a normalisation with a wrong sum; each row shifted by its own
    constant, a maximum subtracted or added where it should not be."""
    if not (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)) or got.shape != want.shape \
            or want.dim() < 2 or want.shape[-1] < 2:
        return None
    w, g = want.detach().double().cpu(), got.detach().double().cpu()
    if not (torch.isfinite(w).all() and torch.isfinite(g).all()) or not bool(_off(w, g).any()):
        return None
    shift = (g - w).mean(-1, keepdim=True)
    if torch.allclose(g - w, shift.expand_as(w), atol=1e-6, rtol=1e-4) and shift.flatten().std() > 1e-6:
        return (f"each row of {name} is the expected row plus a constant of its own (a per-row shift): a row "
                f"statistic (the row maximum, or a log-sum) is subtracted or added where it should not be, or twice.")
    if bool((w.abs() < 1e-9).any()):
        return None
    ratio = g / w
    factor = ratio.mean(-1, keepdim=True)
    if torch.allclose(ratio, factor.expand_as(ratio), atol=1e-6, rtol=1e-4) and factor.flatten().std() > 1e-6:
        return (f"each row of {name} is the expected row times a factor of its own (a per-row factor, not one for "
                f"all): the normalisation divides by the wrong sum: is l (the sum of exp) rescaled with alpha at "
                f"every block, summed over the keys only, and is the output divided by it once, at the end?")
    return None


@bonus
def lse_relation(want: Any, got: Any, row_max: torch.Tensor | None = None) -> str | None:
    """How a wrong lse ``got`` (``(..., T)``) relates to the right one: a constant shift, the maximum missing,
    alone or twice (``row_max``: each query's maximum scaled score, where the judge can compute it), the sum
    itself instead of its log, or a base-2 log."""
    if not (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)) or got.shape != want.shape:
        return None
    w, g = want.detach().double().cpu(), got.detach().double().cpu()
    if not torch.isfinite(w).all() or not bool(_off(w, g).any()):
        return None

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return bool(torch.isfinite(a).all()) and torch.allclose(a, b, atol=1e-5, rtol=1e-4)

    if row_max is not None:
        m = row_max.detach().double().cpu()
        if m.shape == w.shape:
            if close(g, w - m):
                return "lse lacks the maximum: lse = m + log(l), and log(l) alone is the log-sum of exp(s - m)."
            if close(g, m):
                return "lse is only the maximum m: add log(l), the log of the sum of exp(s - m): lse = m + log(l)."
            if close(g, w + m):
                return "lse holds the maximum twice: lse = m + log(l), with l the sum of exp(s - m)."
            if close(g, torch.exp(w - m)):
                return "lse holds l, the sum of exp(s - m), not lse = m + log(l): take its log and add m back."
    if close(g, torch.exp(w)):
        return "lse holds the sum of exp(scores) itself, not its log: lse = m + log(l)."
    if close(g, w / math.log(2)) or close(g, w * math.log(2)):
        return "lse is in base 2 (a log2 or exp2 where the natural log is meant): lse = m + ln(l), in base e."
    shift = float((g - w).mean())
    if close(g, w + shift) and abs(shift) > 1e-4:
        return (f"lse is off by the same constant everywhere ({shift:+.4g}): a term added to every row (a log of a "
                f"count or of a block size, a constant in the scale), not a wrong row.")
    return None


#: PyTorch's broadcasting error, read in one place for every check (:func:`broadcast_sizes`).
BROADCAST_ERROR = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)"
                             r"(?: at non-singleton dimension (-?\d+))?")
_TRITON_SHAPES = re.compile(r"incompatible dimensions at index (\d+): (\d+) and (\d+)")  # Triton's


def broadcast_sizes(error: Any) -> tuple[int, int, int | None] | None:
    """``(a, b, dim)`` of PyTorch's "The size of tensor a (a) must match the size of tensor b (b) at non-singleton
    dimension dim" in ``error`` (an exception or its text; ``dim`` ``None`` where the text has none), else ``None``."""
    found = BROADCAST_ERROR.search(str(error))
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2)), None if found.group(3) is None else int(found.group(3))
_DTYPES = (re.compile(r"expected scalar type ([\w:]+) but found ([\w:]+)", re.I),
           re.compile(r"same dtype,? but got:? (?:mat1 is )?([\w:]+) (?:and|!=) (?:mat2 is )?([\w:]+)", re.I),
           re.compile(r"([\w:]+) != ([\w:]+)"),
           re.compile(r"expected (?:both )?.*?dtype ([\w:]+).*?(?:got|but) ([\w:]+)", re.I))
_FLOATS = {"float", "float32", "half", "float16", "bfloat16", "double", "float64", "c10::bfloat16", "c10::half"}
_INDEX = re.compile(r"(?:'indices' to have one of the following scalar types: Long, Int; but got torch\.(\w+)Tensor)|"
                    r"(?:tensors used as indices must be long, int(?:, byte)? or bool)|"
                    r"(?:index_select\(\): Expected dtype int(?:32|64) for index)|(?:expected .*index.* Long)", re.I)


@bonus
def dot_T_hint(error: BaseException, shapes: list[tuple[int, ...]]) -> str | None:
    """An error that ``.T`` on a tensor of more than two dimensions explains: ``x @ y.T`` or ``x.T @ y`` of two zero
    tensors of ``shapes`` (the operands an exercise multiplies: ``(..., T, D)`` inputs, ``(..., T, T)`` weights)
    raises the very same message. ``.T`` reverses every dimension, not the last two. ``None`` otherwise."""
    import warnings

    text = str(error)
    big = [s for s in dict.fromkeys(tuple(s) for s in shapes) if len(s) > 2]
    for a in big:
        for b in big:
            for turned, product in ((b, lambda x, y: x @ y.T), (a, lambda x, y: x.T @ y)):
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # .T's own deprecation warning on more than two dimensions
                        product(torch.zeros(a), torch.zeros(b))
                except Exception as found:  # noqa: BLE001 - the message is what is compared
                    if str(found) == text:
                        return (f"x.T on a tensor of more than two dimensions reverses ALL its dimensions (a "
                                f"{_shape(turned)} tensor becomes {_shape(tuple(reversed(turned)))}), not the last "
                                f"two: .T suits a 2-D matrix only. Transpose the last two dimensions of a batch "
                                f"(..., T, D) with .transpose(-2, -1) (or .mT).")
    return None


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


#: PyTorch's words for a dimension past a tensor's last: ``[-n, n - 1]``, and the one asked for.
_DIM_RANGE = re.compile(r"Dimension out of range \(expected to be in range of \[-(\d+), (\d+)\], but got (-?\d+)\)")


@bonus
def error_hint(error: BaseException, sizes: dict[str, int] | None = None) -> str | None:
    """A raised error translated: two tensors of different float dtypes meeting (a missing cast), a float
    tensor used as indices (values where token ids or positions were meant), or two sizes that do not fit,
    named by what they stand for in the exercise (``sizes``: ``{"block_q": 2, "block_k": 4, "T": 6, ...}``)."""
    text = str(error)
    if "view size is not compatible with input tensor's size and stride" in text:
        return ("a .view(...) on a tensor that is not contiguous in memory: a transpose (or permute) just before it "
                "only swaps the strides, and view cannot regroup those entries. Typically the heads merged back, "
                "context.transpose(1, 2).view(b, T, d_out): use .reshape(b, T, d_out) there, or "
                ".contiguous().view(b, T, d_out).")
    if "upper bound and lower bound inconsistent with step sign" in text:
        return ("torch.arange(start, end) was given an end before its start: the end must count from the start. "
                "Positions start..start + T - 1 are torch.arange(start, start + T), not torch.arange(start, T).")
    dim = _DIM_RANGE.search(text)
    if dim:
        n, got = int(dim.group(1)), int(dim.group(3))
        if got < 0:  # counted from the end, and still past the first: the input has fewer dimensions than the code thinks
            return (f"dimension {got} of a tensor that has only {n}: the code counts on more dimensions than this input "
                    f"has (a (T, D) input where (batch, T, D) was assumed?). Use only the last two, -1 (the features) "
                    f"and -2 (the tokens), so that the same code takes (T, D) inputs and batched (..., T, D) ones.")
        return (f"dimension {got} of a tensor that has {n}: a dimension numbered from the front, which moves when the "
                f"input has fewer (or more) leading dimensions. The same code must take (T, D) inputs and batched "
                f"(..., T, D) ones: count from the end, -1 the last (the features) and -2 the one before (the tokens), "
                f"as in .transpose(-2, -1) and softmax(dim=-1).")
    cat = re.search(r"Sizes of tensors must match except in dimension (\d+)\. Expected size (\d+) but got size "
                    r"(\d+) for tensor number (\d+)", text)
    if cat:
        return (f"torch.cat joins tensors along dimension {cat.group(1)}, and every other dimension must match, but "
                f"tensor number {cat.group(4)} has {cat.group(3)} entries where the first has {cat.group(2)}: is "
                f"dimension {cat.group(1)} the one to join along, and was that tensor reduced over the right dimension?")
    if _INDEX.search(text):
        return ("a float tensor is used where indices are meant (token ids, positions, an index into a table): values "
                "where indices were meant. torch.argmax, topk(...).indices and max(...).indices give indices; "
                "max(...).values gives the values themselves.")
    for pattern in _DTYPES:
        found = pattern.search(text)
        if found and {t.lower() for t in found.groups()} <= _FLOATS and found.group(1).lower() != found.group(2).lower():
            one, two = (t.replace("c10::", "") for t in found.groups())
            return (f"two tensors of different dtypes meet in one operation ({one} and {two}): a "
                    f"cast is missing. Bring one to the other's dtype (x.to(y.dtype)) before the product, or compute "
                    f"in float32 and cast the result back once, at the end.")
    triton = _TRITON_SHAPES.search(text)
    found = broadcast_sizes(text) or (triton and (int(triton.group(2)), int(triton.group(3)), int(triton.group(1))))
    if found and sizes:
        a, b, dim = found
        if 0 in (a, b) and a != b:
            return (f"one operand is empty (size 0) where the other has {max(a, b)} entries: a slice start:end that "
                    f"begins past the end of its tensor, which is shorter than you think. A row statistic (delta, "
                    f"lse, m) must hold one number per token, (..., T): one reduced over the tokens (dim=-2) instead "
                    f"of the features (dim=-1) holds head_dim numbers instead.")
        names = {n: [k for k, s in sizes.items() if s == n] for n in (a, b)}
        if a != b and names[a] and names[b]:
            advice = list(dict.fromkeys(_PAIRS[pair] for na in names[a] for nb in names[b]
                                        if (pair := frozenset((_kind(na), _kind(nb)))) in _PAIRS))
            where = f" along dimension {dim}" if dim is not None else ""
            return (f"a tensor sized by {' = '.join(names[a])} = {a} meets one sized by {' = '.join(names[b])} = {b}"
                    f"{where}: on that line, one operand has the wrong extent. "
                    f"{' Or: '.join(advice) if advice else 'Print both shapes there.'}")
    return None


def _kind(name: str) -> str:
    return "rest" if "%" in name else name


_PAIRS = {
    frozenset(("block_q", "block_k")): ("Query rows and key columns met: a row statistic (m, l, lse, delta) goes "
                                        "with the query rows (reduce the scores over the keys: dim=-1, or axis 1 of a "
                                        "Triton tile), and a tile's slices use the block they belong to "
                                        "(q_start..q_end, k_start..k_end)."),
    frozenset(("block_q", "rest")): "The last, shorter block: end it at min(start + block, T).",
    frozenset(("block_k", "rest")): "The last, shorter block: end it at min(start + block, T).",
    frozenset(("T", "head_dim")): "Tokens met features: a missing transpose, or a sum over the wrong dimension?",
    frozenset(("block_q", "head_dim")): "Tokens met features: a missing transpose, or a sum over the wrong dimension?",
    frozenset(("block_k", "head_dim")): "Tokens met features: a missing transpose, or a sum over the wrong dimension?",
    frozenset(("n_heads", "n_kv_heads")): "Query heads met key/value heads: repeat K and V to n_heads (repeat_kv).",
    frozenset(("T", "context_length")): "A buffer of context_length met T tokens: slice it to [:T, :T].",
}
