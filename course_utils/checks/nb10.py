"""Self-checks for notebook 10: the FlashAttention backward pass.

- ``attention_backward_reference``: the plain formulas, ``(dq, dk, dv)``, against autograd's
  gradients of attention in float64.
- ``flash_attention_backward``: the same gradients tile by tile; like notebook 07's forward it is
  watched (:mod:`course_utils.checks.tensors`): no ``(T, T)`` tensor may be made, and in a causal
  backward the tiles wholly in the future must be skipped (the check counts the score entries).
- ``FlashAttention``: a ``torch.autograd.Function``; its output and gradients against autograd's,
  what it keeps for the backward (exactly ``q``, ``k``, ``v``, the output and ``lse``: no ``P``),
  ``torch.autograd.gradcheck`` in float64, SDPA's gradients in float32 at ``T = 256``, and one case
  in bfloat16 (output and gradients against float64 attention on the same inputs, within 1e-2).
- ``flash_attention_backward_triton``: the Triton kernel for ``dK`` and ``dV``, launched with
  :func:`course_utils.backward.launch_backward`: in Triton's interpreter on a CPU, compiled on a GPU; in float32,
  and once in float16 (``tl.dot`` refuses a float32 P or dS next to a half-precision operand).

Every expected value comes from :func:`expect` (autograd on PyTorch's attention, recorded for the
student edition), and known mistakes are named by their outputs, as in every notebook.

Each check is a spec (:mod:`course_utils.checks.spec`): its plan lists every run of the student's code,
keyed: the gradients of every case; for the tiled backward, each watched run (the first ``(T, T)`` tensor,
the entries of S and dP computed); for ``FlashAttention``, whether it is a ``torch.autograd.Function``,
``(o, dq, dk, dv)`` of each run, what its forward keeps (the saved tensors' shapes and which of q, k, v, o,
lse each is, the tensors kept on ctx, the first ``(T, T)`` tensor) and what ``gradcheck`` said; for the
Triton kernel, ``(dk, dv)`` of each launch. Its judge builds every message from those outcomes, in the
kernel or, under the grader, outside it; a runner's outcome of the wrong form is refused there
(``spec.refuse``: the grader's ``HandOffError``).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import torch
import torch.nn.functional as F

from course_utils.checks import expected as _expected
from course_utils.checks import ladder, symptoms, wire
from course_utils.checks.core import (
    Case,
    CheckFailed,
    _clone,
    _hinted,
    expect,
    fail,
    family_outputs,
    mistake_outputs,
    record_families,
    shape_error_hint,
    rand,
    tensor_difference,
)
from course_utils.checks.modules import helper_checks
from course_utils.checks.nb07 import (
    WATCHED,
    KernelSpec,
    kernel_rules,
    short_block_hint,
    _first_full,
    _full_matrix_text,
    _full_ok,
    _shape_ok,
    _short_text,
    computed_tiles,
    launch_outcome,
    launched_on,
    outcome_of,
    watched_structure,
)
from course_utils.checks.spec import CALL, Outcomes, Spec, Step, declare, raised, refuse, with_hidden
from course_utils.checks.tensors import TensorWatcher

__all__ = ["check_attention_backward_reference", "check_flash_attention_backward", "check_FlashAttention",
           "check_flash_attention_backward_triton", "attention_with_grads", "forward_statistics", "tiles_problem"]

GRADS = ("dq", "dk", "dv")

#: The other exercises of this notebook an exercise's answer may call, by the names the notebook gives
#: them: its checks run with the reference's versions (:func:`modules.alone`), so that a wrong helper
#: costs only the helper's points.
HELPERS = {"FlashAttention": ("attention_backward_reference", "flash_attention_backward")}


# ------------------------------------------------------------------------------------------
# Inputs and expected values (PyTorch's own attention and autograd: no answer here)
# ------------------------------------------------------------------------------------------
def _inputs(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float64) -> tuple:
    """``q, k, v, do``, each ``shape``, from their own seeds."""
    return tuple(rand(*shape, seed=seed + i, low=-scale, high=scale, dtype=dtype) for i in range(4))


def attention_with_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                         causal: bool = True) -> tuple[torch.Tensor, ...]:
    """``(o, dq, dk, dv)``: PyTorch's attention ``(..., T, D)`` and autograd's gradients for ``do``."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (..., T, Dv)
        o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


def forward_statistics(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """What the forward pass saves: the output ``(..., T, Dv)`` and the log-sum-exp ``(..., T)``."""
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, T)
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal), scores.logsumexp(dim=-1)


def _backward_case(name: str, shape: tuple, seed: int, block_q: int, block_k: int, causal: bool,
                   scale: float = 1.0, dtype: torch.dtype = torch.float32) -> Case:
    """A case of ``flash_attention_backward``: ``(q, k, v, o, lse, do, block_q, block_k)``, ``causal=``."""
    q, k, v, do = _inputs(*shape, seed=seed, scale=scale, dtype=dtype)
    o, lse = forward_statistics(q, k, v, causal)
    return Case(name, (q, k, v, o, lse, do, block_q, block_k), {"causal": causal})


# ------------------------------------------------------------------------------------------
# Comparing (dq, dk, dv), naming the gradient that differs and the mistake behind it
# ------------------------------------------------------------------------------------------
def _triple_difference(want: Any, got: Any, names: tuple[str, ...], atol: float, rtol: float) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != len(names):
        length = f" of length {len(got)}" if isinstance(got, (tuple, list)) else ""
        return f"expected a tuple ({', '.join(names)}), got {type(got).__name__}{length}: return {', '.join(names)}"
    for name, w, g in zip(names, want, got):
        problem = tensor_difference(w, g, atol, rtol)
        if problem:
            return f"{name}: {problem}"
    return None


def _hint(exercise: str, case: Case, got: Any, want: Any, names: tuple[str, ...]) -> str | None:
    """The known mistake whose outputs equal ``got``, if any (an output recorded as ``None`` is the right one:
    ``want``'s)."""
    try:
        for hint, output in mistake_outputs(exercise, case):
            output = tuple(w if o is None else o for o, w in zip(output, want))
            if _triple_difference(output, got, names, 1e-5, 1e-4) is None:
                return hint
    except Exception:  # noqa: BLE001 - a hint is a bonus
        return None
    return None


def _agreement_hint(want: Any, got: Any, names: tuple[str, ...], atol: float, rtol: float) -> str | None:
    """Which gradients agree and which do not, and where that points (issue 36): dv = P^T dO needs only P, dq and
    dk share dS = P * (dP - delta). ``None`` unless ``got`` has every gradient's shape, or the output o differs."""
    if not (isinstance(got, (tuple, list)) and len(got) == len(names)
            and all(isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor) and g.shape == w.shape
                    for w, g in zip(want, got))):
        return None
    if any(bool(torch.isnan(g.detach()).any()) for g in got):
        return None  # NaN says where (symptoms.where_wrong), not which formula: agreement is about values
    agree = {n: tensor_difference(w, g, atol, rtol) is None for n, w, g in zip(names, want, got)}
    if not agree.get("o", True):
        return None
    grads = [n for n in names if n != "o"]
    ok, off = [n for n in grads if agree[n]], [n for n in grads if not agree[n]]
    if not off or not ok and len(off) == 1:
        return None

    def listed(found: list[str]) -> str:
        return " and ".join(found) if len(found) < 3 else f"{found[0]}, {found[1]} and {found[2]}"

    said = f"{listed(ok)} {'agree' if len(ok) > 1 else 'agrees'}; {listed(off)} {'do' if len(off) > 1 else 'does'} not"
    if not ok:
        return (f"{listed(off)} all differ: P itself is off, or tiles are missed: dv = P^T dO needs nothing but P (a "
                f"wrong P also gives a wrong dS and wrong row sums), so look at the scores' scale, the mask and P = "
                f"exp(S - lse), or at the loops' ranges (each key block must meet every query that sees it).")
    if "dv" in ok and "dv" in names:
        where = {"dq": "dQ = dS K / sqrt(D)", "dk": "dK = dS^T Q / sqrt(D)"}
        if len(off) > 1:
            return (f"{said}: dv = P^T dO needs only P, so P is right; look at what {listed(off)} share, dS = P * (dP - "
                    f"delta) and delta = rowsum(dO * O), or a scale they share.")
        if "dq" in names and "dk" in names:
            return (f"{said}: dv and the other gradient show that P and dS are right; look at {where[off[0]]} itself: "
                    f"its scale, its transpose, and whether the share of every block is added.")
        return (f"{said}: dv = P^T dO needs only P, so P is right; look at dS = P * (dP - delta), delta = "
                f"rowsum(dO * O) and {where[off[0]]}.")
    if off == ["dv"]:
        return f"{said}: P and dS are right; look at dV = P^T dO: the transpose, and whether every block's share is added."
    return f"{said}."


@symptoms.bonus
def _swapped_hint(want: Any, got: Any, names: tuple[str, ...], atol: float, rtol: float) -> str | None:
    """A gradient that holds another one's values (issue 36): the other's accumulator stored or returned in its place.
    ``None`` unless some output that differs equals what another output should be."""
    if not (isinstance(got, (tuple, list)) and len(got) == len(names)):
        return None
    for name, w, g in zip(names, want, got):
        if not (isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor)) or tensor_difference(w, g, atol, rtol) is None:
            continue
        for other, w2 in zip(names, want):
            if other != name and isinstance(w2, torch.Tensor) and w2.shape == g.shape \
                    and tensor_difference(w2, g, atol, rtol) is None:
                return (f"{name} holds the values {other} should have: is {other}'s accumulator stored (or returned) in "
                        f"{name}'s place? Check the store or return of each gradient: which tensor goes where.")
    return None


def _compare(exercise: str, case: Case, got: Any, want: Any, names: tuple[str, ...] = GRADS,
             atol: float = 1e-5, rtol: float = 1e-4, name_mistakes: bool = True,
             smallest: Callable[[], str | None] = lambda: None,
             rows_hint: Callable[[], str | None] | None = None,
             p_hint: Callable[[], str | None] | None = None) -> None:
    """Fail unless ``got`` agrees with ``want``, with the first hint found: a known mistake, ``rows_hint()`` (the
    backward's ``lse`` read at other rows), which keys were seen, a gradient holding another's values, ``p_hint()``
    (what is wrong with P, read off a probe's dv), then where the wrong values lie with ``smallest()`` (the
    ladder's smallest failing configuration beyond the first, which also says which gradients differ there), else
    which gradients agree."""
    problem = _triple_difference(want, got, names, atol, rtol)
    if problem:
        shapes = ", ".join(str(tuple(a.shape)) for a in case.args if isinstance(a, torch.Tensor))
        try:
            fail(exercise, f"{problem.rstrip('.')}. Input shapes: {shapes}.", case)
        except CheckFailed as error:
            hint = _hint(exercise, case, got, want, names) if name_mistakes else None
            raise _hinted(error, hint or _overflow_hint(case, got, names, atol, rtol)
                          or _masked_fill_hint(case, got, names, atol, rtol)
                          or _moved_rows_hint(want, got, names, atol, rtol)
                          or _backward_family_hint(exercise, case, want, got, names, atol, rtol)
                          or (rows_hint() if rows_hint else None) or _seen_hint(exercise, case, want, got, names, atol, rtol)
                          or _swapped_hint(want, got, names, atol, rtol)
                          or (p_hint() if p_hint else None)
                          or _scaled_hint(case, want, got, names, atol, rtol)
                          or _joined(_where_hint(case, want, got, names, atol, rtol),
                                     smallest() or _agreement_hint(want, got, names, atol, rtol))) from None


@symptoms.bonus
def _scaled_hint(case: Case, want: Any, got: Any, names: tuple[str, ...], atol: float, rtol: float) -> str | None:
    """Gradients (``(..., T, D)``) that differ from the right ones by one constant factor each, the same for all of
    them (a scale applied twice, or missing, on the way to them); ``None`` otherwise."""
    if not (isinstance(got, (tuple, list)) and len(got) == len(names)):
        return None
    D = next((a.shape[-1] for a in case.args if isinstance(a, torch.Tensor) and a.dim() >= 2), None)
    factors = {}
    for name, w, g in zip(names, want, got):
        if not (isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor) and g.shape == w.shape) \
                or tensor_difference(w, g, atol, rtol) is None:
            continue
        w, g = w.detach().double().cpu(), g.detach().double().cpu()
        norm = float((w * w).sum())
        if not (norm > 1e-12 and bool(torch.isfinite(g).all())):
            return None
        c = float((w * g).sum()) / norm
        if abs(c) < 1e-3 or not torch.allclose(g, c * w, atol=atol, rtol=rtol):  # 0 times: nothing was added
            return None
        factors[name] = c
    if not factors or D is None \
            or max(factors.values()) - min(factors.values()) > 1e-3 * max(map(abs, factors.values())):
        return None
    c = sum(factors.values()) / len(factors)
    off = [n for n in names if n in factors]
    ok = [n for n in names if n not in factors]
    which = " and ".join(off) if len(off) < 3 else f"{off[0]}, {off[1]} and {off[2]}"
    are, it, them = ("are", "they", "them") if len(off) > 1 else ("is", "it", "it")
    said = (f"{' and '.join(ok)} {'agree' if len(ok) > 1 else 'agrees'}; {which} {'do' if len(off) > 1 else 'does'} "
            f"not: " if ok else "") + (f"{which} {are} {c:.4g} times the right values, everywhere (D = {D}, sqrt(D) = "
                                       f"{math.sqrt(D):.4g})")
    formulas = {"dq": "dq = dS K / sqrt(D)", "dk": "dk = dS^T Q / sqrt(D)", "dv": "dv = P^T dO, with no scale",
                "o": "o = P V, with no scale"}
    written = ", ".join(formulas.get(n, n) for n in off)
    shared = "in dS = P * (dP - delta), which they share, or in " if set(off) == {"dq", "dk"} else "in "
    root = math.sqrt(D)
    if set(off) <= {"dq", "dk"}:
        for value, why in ((1 / root, f"the 1/sqrt(D) is applied twice on the way to {them} (to dS, say, and again in "
                                      f"{written}): apply it once"),
                           (root, f"the 1/sqrt(D) of {written} is missing"),
                           (float(D), f"{it} {are} multiplied by sqrt(D) where {it} must be divided by it ({written})"),
                           (-1.0, f"a sign is flipped ({shared}{written})")):
            if abs(c - value) <= 1e-3 * abs(value):
                return f"{said}: {why}."
    elif abs(c - 1 / root) <= 1e-3 / root:
        return f"{said}: {it} {are} multiplied by the scale 1/sqrt(D), which {written.replace(', with no scale', '')} " \
               f"does not take."
    times = round(c)
    added = f" (each share added {times} times, or a factor {times})" if times >= 2 and abs(c - times) < 1e-3 else ""
    return f"{said}: a constant factor on the way to {them}{added}; look at the scales ({written})."


def _backward_layout(case: Case) -> tuple[str, int, int, bool] | None:
    """``(kind, block_q, block_k, causal)`` of a backward's case: ``"reference"`` (``(q, k, v, do)``, one tile),
    ``"tiled"`` (``(q, k, v, o, lse, do, block_q, block_k)``) or ``"kernel"`` (block sizes in the kwargs)."""
    args, kw = case.args, case.kwargs
    if not (args and isinstance(args[0], torch.Tensor)):
        return None
    T = args[0].shape[-2]
    if "block_m" in kw:
        return "kernel", kw["block_m"], kw["block_n"], bool(kw.get("causal", True))
    if len(args) == 4:
        return "reference", T, T, bool(kw.get("causal", True))
    if len(args) >= 8 and type(args[6]) is int and type(args[7]) is int:
        flags = [a for a in args[8:] if type(a) is bool]
        return "tiled", args[6], args[7], bool(kw.get("causal", flags[0] if flags else True))
    return None


@symptoms.bonus
def _backward_family_hint(exercise: str, case: Case, want: Any, got: Any, names: tuple[str, ...], atol: float,
                          rtol: float) -> str | None:
    """The one thing changed in the backward whose gradients equal ``got`` (issue 36): the members of the family
    modelled in ``course_utils.instructor.nb10`` (a turned causal test, a slice shifted, an operand swapped, a sign
    flipped), their outputs on ``case`` recorded for the visible cases (:func:`family_outputs`). ``None`` where none
    matches."""
    if not (isinstance(got, (tuple, list)) and len(got) == len(names)
            and all(isinstance(g, torch.Tensor) and g.shape == w.shape for g, w in zip(got, want))):
        return None
    index = {"dq": 0, "dk": 1, "dv": 2}
    if not set(names) <= set(index):
        return None
    mine = [g.detach().double().cpu().reshape(-1, *g.shape[-2:]) for g in got]  # (L, T, D) each
    if not all(bool(torch.isfinite(g).all()) for g in mine):
        return None
    for words, model in family_outputs(exercise, case, "backward"):
        model = [model[index[n]] for n in names]  # (L, T, D) each, recorded in float32; None: the right one
        if all(m is None for m in model):
            continue
        model = [w.detach().double().cpu().reshape(g.shape) if m is None else m.double()
                 for m, w, g in zip(model, want, mine)]
        if all(torch.allclose(m, w.detach().double().cpu().reshape(m.shape), atol=atol, rtol=rtol)
               for m, w in zip(model, want)):
            continue  # the change does nothing to these gradients: it cannot be told from the right backward
        # float32 noise grows with the largest gradient (P = exp(S + lse) makes them large): tolerate a tenth of rtol of it
        if all(torch.allclose(g, m, atol=atol + 0.1 * rtol * float(m.abs().max()), rtol=rtol)
               for g, m in zip(mine, model)):
            agree = [n for n, w, g in zip(names, want, got) if tensor_difference(w, g, atol, rtol) is None]
            if len(agree) == len(names):
                return None
            said = f" ({' and '.join(agree)} {'agree' if len(agree) > 1 else 'agrees'})" if agree else ""
            return f"{', '.join(names[:-1])} and {names[-1]} are what a backward gives when {words}{said}."
    return None


@symptoms.bonus
def _moved_rows_hint(want: Any, got: Any, names: tuple[str, ...], atol: float, rtol: float) -> str | None:
    """dq (``(..., T, D)``) wrong row by row while its rows add up to the right total over the queries: every share is
    right and added at the wrong rows. (dk's and dv's totals over the keys say nothing: the rows of dS sum to 0 and
    those of P to 1 whatever the mistake.)"""
    if "dq" not in names or not (isinstance(got, (tuple, list)) and len(got) == len(names)):
        return None
    w, g = want[names.index("dq")], got[names.index("dq")]
    if not (isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor) and g.shape == w.shape and w.dim() >= 2) \
            or tensor_difference(w, g, atol, rtol) is None or not bool(torch.isfinite(g).all()):
        return None
    total, got_total = w.detach().double().sum(-2), g.detach().double().sum(-2)  # (..., D)
    if float(total.abs().max()) < 1e-3 or not torch.allclose(got_total, total, atol=1e-6, rtol=1e-5):
        return None
    return ("dq's rows add up to the right total (summed over the queries), but row by row dq is wrong: every share "
            "is right and added at the wrong rows. Add each tile's dS K / sqrt(D) to its own query rows, "
            "dq[..., q_start:q_end, :].")


def _seen_hint(exercise: str, case: Case, want: Any, got: Any, names: tuple[str, ...], atol: float = 1e-5,
               rtol: float = 1e-4) -> str | None:
    """Which keys the wrong rows of a wrong output o attended to (:func:`symptoms.keys_seen`)."""
    if not (isinstance(got, (tuple, list)) and len(got) == len(names)):
        return None
    if "dv" in names and "block_m" in case.kwargs:  # a kernel's launch: which queries each key block read
        q, k, *_, do = case.args
        return symptoms.queries_seen(q, k, do, want[names.index("dv")], got[names.index("dv")],
                                     case.kwargs["block_n"], case.kwargs["block_m"], bool(case.kwargs["causal"])) \
            or _local_mask_hint(case, want[names.index("dv")], got[names.index("dv")], atol, rtol) \
            or _kernel_reads_hint(exercise, case, want, got, names, atol, rtol)
    if "dv" in names and len(case.args) >= 8 and type(case.args[6]) is int:  # the tiled backward's case
        return _last_share_hint(case, want[names.index("dv")], got[names.index("dv")])
    if names[0] != "o":
        return None
    flags = [a for a in case.args if type(a) is bool]
    causal = case.kwargs.get("causal", flags[0] if flags else True)
    return symptoms.keys_seen(*case.args[:3], want[0], got[0], bool(causal), "o")


@symptoms.bonus
def _last_share_hint(case: Case, want: Any, got: Any) -> str | None:
    """The tiled backward's ``dv`` (``(..., T, D)``) whose every wrong key block holds the share of only the last query
    block that reads it: an accumulator set, not added to, in the query loop. ``None`` otherwise."""
    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.shape == want.shape):
        return None
    q, k, _, _, lse, do, block_q, block_k = case.args[:8]
    flags = [a for a in case.args[8:] if type(a) is bool]
    causal = bool(case.kwargs.get("causal", flags[0] if flags else True))
    q, k, lse, do = (t.detach().double() for t in (q, k, lse, do))
    T = q.shape[-2]
    p = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) - lse[..., None])  # (..., T, T)
    if causal:
        p = p.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), 0.0)
    last = (T - 1) // block_q * block_q  # the last query block's first row: every key block's last iteration
    model = p[..., last:, :].transpose(-2, -1) @ do[..., last:, :]  # (..., T, D)
    wrong = symptoms.off_rows(want, got)
    if not bool(wrong.any()) or bool((symptoms.off_rows(model, got) & wrong).any()):
        return None
    return (f"dv of each wrong key block holds the share of the last query block alone (queries {last}..{T - 1}): "
            f"the shares of the earlier query blocks are lost. In the loop over query blocks, add each block's share "
            f"to the accumulator (dv_blk = dv_blk + P^T dO), instead of setting it; and make the accumulators zero "
            f"once per key block, before the loop over query blocks, not inside it.")


@symptoms.bonus
def _local_mask_hint(case: Case, want: Any, got: Any, atol: float = 1e-5, rtol: float = 1e-4) -> str | None:
    """A kernel's ``dv`` (``(..., T, D)``) that a causal mask gives which compares tile-local offsets (a query's place in
    its block, 0..BLOCK_M - 1, or a key's in its block) instead of positions; ``None`` where no such mask gives it."""
    kw = case.kwargs
    if not (kw.get("causal") and isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
            and got.shape == want.shape):
        return None
    q, k, _, _, lse, do = (a.detach().double() for a in case.args[:6])
    T, D = q.shape[-2], q.shape[-1]
    bm, bn = kw["block_m"], kw["block_n"]
    s = q @ k.transpose(-2, -1) / math.sqrt(D)  # (..., T, T)
    pos = torch.arange(T)
    wrong = symptoms.off_rows(want, got, atol, rtol).flatten(0, -2).any(0)  # (T,) key rows
    for rows, cols, what in ((pos % bm, pos, "each query's place in its own block (0..BLOCK_M - 1, offs_m) instead of "
                              "its position rows = start_m + offs_m"),
                             (pos, pos % bn, "each key's place in its own block (0..BLOCK_N - 1) instead of its "
                              "position offs_n = start_n * BLOCK_N + arange")):
        keep = cols[None, :] <= rows[:, None]  # (T, T)
        lo = (pos // bn * bn) // bm * bm  # (T,) the first query each key's block visits
        keep &= pos[:, None] >= lo[None, :]
        p = torch.exp(s - lse[..., None]) * keep  # (..., T, T): P read with the right lse
        if not bool(symptoms.off_rows(p.transpose(-2, -1) @ do, got, atol, rtol).any()):
            unseen = [j for j in range(T) if not bool(keep[:, j].any())]
            return (f"dv is what a causal mask gives that compares {what}: "
                    + (f"keys {symptoms.spans(unseen)} get no gradient from any query, and " if unseen else "")
                    + f"keys {symptoms.spans([j for j in range(T) if bool(wrong[j]) and j not in unseen])} get it from "
                    f"fewer queries than see them. The causal test must compare positions: offs_n[None, :] <= "
                    f"rows[:, None].")
    causal = pos[None, :] <= pos[:, None]  # (T, T)
    local = pos % bm  # (T,) the row each query's iteration reads at the tile's own offsets
    for names, read_q, read_do in (("q and dO", local, local), ("q", local, pos), ("dO", pos, local)):
        p = torch.exp(q[..., read_q, :] @ k.transpose(-2, -1) / math.sqrt(D) - lse[..., None]) * causal  # (..., T, T)
        if not bool(symptoms.off_rows(p.transpose(-2, -1) @ do[..., read_do, :], got, atol, rtol).any()):
            return (f"dv is what a query loop gives whose every iteration reads {names} at the first query block's "
                    f"rows 0..{bm - 1} (the tile's offsets offs_m) while lse and delta follow the query blocks: load "
                    f"{names} at the iteration's positions, rows = start_m + offs_m, as lse and delta are.")
    return None


@symptoms.bonus
def _kernel_reads_hint(exercise: str, case: Case, want: Any, got: Any, names: tuple[str, ...], atol: float,
                       rtol: float) -> str | None:
    """A kernel's ``(dk, dv)`` that equals what it gives when it reads some rows at the wrong place (issue 36): lse or
    delta at the key positions ``offs_n`` or at the tile's offsets ``offs_m`` instead of the query rows, q and dO
    at ``rows + offs_d`` without the row stride (overlapping slices of the first rows), or query rows scaled by
    BLOCK_M twice. Output-only: the family ``"reads"`` modelled in ``course_utils.instructor.nb10``, its outputs on
    the visible cases recorded (:func:`family_outputs`). ``None`` where none gives it."""
    if names != ("dk", "dv") or not (isinstance(got, (tuple, list)) and len(got) == 2
                                     and all(isinstance(g, torch.Tensor) and g.shape == w.shape
                                             for g, w in zip(got, want))):
        return None
    agree = [tensor_difference(w, g, atol, rtol) is None for w, g in zip(want, got)]
    for words, model in family_outputs(exercise, case, "reads"):
        if all(not bool(symptoms.off_rows(m.double(), g.detach().double().cpu().reshape(m.shape), atol, rtol).any())
               for m, g in zip(model, got)):
            said = {(False, True): "dv agrees, dk does not", (True, False): "dk agrees, dv does not"}.get(
                tuple(agree), "both are wrong")
            return f"dk and dv are what a kernel gives whose {words} ({said})."
    return None


def _same_nonfinite(model: tuple, got: Any, atol: float, rtol: float) -> bool:
    """Whether ``got`` (tensors, some entries NaN or infinite) is NaN or infinite exactly where ``model`` (float64) is,
    and agrees with it elsewhere."""
    if not (isinstance(got, (tuple, list)) and len(got) == len(model)
            and all(isinstance(g, torch.Tensor) and g.numel() == m.numel() for g, m in zip(got, model))):
        return False
    mine = [g.detach().double().cpu().reshape(m.shape) for g, m in zip(got, model)]
    if all(bool(torch.isfinite(g).all()) for g in mine):
        return False
    for g, m in zip(mine, model):
        bad = ~torch.isfinite(m)
        top = float(m[~bad].abs().max()) if bool((~bad).any()) else 0.0
        if not torch.equal(~torch.isfinite(g), bad) \
                or not torch.allclose(g[~bad], m[~bad], atol=atol + 0.1 * rtol * top, rtol=rtol):
            return False
    return True


@symptoms.bonus
def _masked_fill_hint(case: Case, got: Any, names: tuple[str, ...], atol: float, rtol: float) -> str | None:
    """A kernel's ``(dk, dv)`` with NaN or infinite entries exactly where a kernel gives them that sets the masked
    weights of P (future keys, rows or keys past T) to -inf, as masked scores are, instead of 0 (issue 36).
    Output-only: the kernel's tiles, padding included, are modelled here in float64."""
    if names != ("dk", "dv") or "block_m" not in case.kwargs:
        return None
    q, k, v, o, lse, do = (a.detach().double().cpu() for a in case.args[:6])
    q, k, v, o, do = (x.reshape(-1, *x.shape[-2:]) for x in (q, k, v, o, do))  # (L, T, D)
    L, T, D = q.shape
    lse, delta = lse.reshape(L, T), (do * o).sum(-1)  # (L, T)
    bm, bn, causal = case.kwargs["block_m"], case.kwargs["block_n"], bool(case.kwargs["causal"])
    n_blocks = math.ceil(T / bn)
    size = max(n_blocks * bn, math.ceil(T / bm) * bm + bm)

    def padded(x: torch.Tensor) -> torch.Tensor:  # rows past T read as 0, as the masked loads give them
        return torch.cat([x, x.new_zeros(L, size - T, *x.shape[2:])], 1)

    q, k, v, do, lse, delta = map(padded, (q, k, v, do, lse, delta))
    dk, dv = (torch.zeros(L, n_blocks * bn, D, dtype=torch.float64) for _ in range(2))  # (L, keys padded, D)
    with torch.no_grad():
        for b in range(n_blocks):
            cols = torch.arange(b * bn, (b + 1) * bn)
            for start in range((b * bn // bm) * bm if causal else 0, T, bm):
                rows = torch.arange(start, start + bm)
                s = q[:, rows] @ k[:, cols].transpose(-2, -1) / math.sqrt(D)  # (L, BM, BN)
                keep = (rows[:, None] < T) & (cols[None, :] < T)
                if causal:
                    keep = keep & (cols[None, :] <= rows[:, None])
                p = torch.where(keep, torch.exp(s - lse[:, rows, None]), float("-inf"))
                dv[:, cols] += p.transpose(-2, -1) @ do[:, rows]
                ds = p * (do[:, rows] @ v[:, cols].transpose(-2, -1) - delta[:, rows, None])
                dk[:, cols] += ds.transpose(-2, -1) @ q[:, rows] / math.sqrt(D)
    if not _same_nonfinite((dk[:, :T], dv[:, :T]), got, atol, rtol):
        return None
    return ("dk and dv are NaN or infinite exactly where a kernel gives them that sets the masked weights to -inf: P "
            "is already exp(S - lse), so a hidden key's weight must be 0, and -inf times dO (or times 0 for a padding "
            "row) makes -inf and NaN in every key block that has a masked entry. Write p = tl.where(keep, tl.exp(s - "
            "lse[:, None]), 0.0).")


@symptoms.bonus
def _overflow_hint(case: Case, got: Any, names: tuple[str, ...], atol: float, rtol: float) -> str | None:
    """The reference's ``(dq, dk, dv)`` NaN exactly where a softmax written exp(S) / rowsum(exp(S)), without the row
    maximum subtracted, gives NaN: exp overflows to inf on the large scores, inf / inf (issue 36)."""
    layout = _backward_layout(case)
    if layout is None or layout[0] != "reference" or tuple(names) != GRADS:
        return None
    q, k, v, do = case.args[:4]
    T, D = q.shape[-2:]
    s = q @ k.transpose(-2, -1) / math.sqrt(D)  # (..., T, T) in the case's dtype
    if layout[3]:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    e = torch.exp(s)
    p = e / e.sum(-1, keepdim=True)
    o = p @ v
    ds = p * (do @ v.transpose(-2, -1) - (do * o).sum(-1, keepdim=True))
    model = tuple(t.double().reshape(-1, T, D) for t in (ds @ k / math.sqrt(D), ds.transpose(-2, -1) @ q / math.sqrt(D),
                                                         p.transpose(-2, -1) @ do))
    if not _same_nonfinite(model, got, atol, rtol):
        return None
    top = float(s.masked_fill(~torch.isfinite(s), 0).max())
    kind, limit = str(q.dtype).removeprefix("torch."), math.log(torch.finfo(q.dtype).max)
    return (f"dq, dk and dv are NaN where a softmax written exp(S) / rowsum(exp(S)) makes them: the scores reach "
            f"{top:.4g} here and exp overflows to inf ({kind} overflows past exp({limit:.1f})), "
            f"so P = inf / inf = NaN. Subtract each row's maximum before exp, exp(S - S.amax(-1, keepdim=True)), "
            f"or use torch.softmax(S, dim=-1), which does.")


def _joined(*hints: str | None) -> str | None:
    return " ".join(h for h in hints if h) or None


def tokens_of(case: Case, name: str) -> symptoms.Tokens:
    """How gradient ``name`` of any of this notebook's cases holds tokens (:mod:`symptoms`): o and dq have a row
    per query, in blocks of block_q (BLOCK_M); dk and dv a row per key, in blocks of block_k (BLOCK_N). A case
    without blocks (the reference) declares none."""
    if "block_m" in case.kwargs:
        block_q, block_k, causal = case.kwargs["block_m"], case.kwargs["block_n"], case.kwargs["causal"]
    else:
        flags = [a for a in case.args if type(a) is bool]
        sizes = [a for a in case.args if type(a) is int]
        block_q, block_k = sizes[:2] if len(sizes) >= 2 else (None, None)
        causal = case.kwargs.get("causal", flags[0] if flags else True)
    if name in ("dk", "dv"):
        return symptoms.Tokens(block_k, block_q, bool(causal), rows="key")
    return symptoms.Tokens(block_q, block_k, bool(causal))


def _where_hint(case: Case, want: Any, got: Any, names: tuple[str, ...], atol: float, rtol: float) -> str | None:
    """Where the first gradient that differs is wrong (:func:`symptoms.where_wrong`), when that names code."""
    if not (isinstance(got, (tuple, list)) and len(got) == len(names)):
        return None
    try:
        # dv = P^T dO sums over every tile the loops visit: where it agrees, the loops' ranges are right
        dv = names.index("dv") if "dv" in names else None
        loops_right = dv is not None and isinstance(got[dv], torch.Tensor) and got[dv].shape == want[dv].shape \
            and tensor_difference(want[dv], got[dv], atol, rtol) is None
        for name, w, g in zip(names, want, got):
            if isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor) and g.shape == w.shape \
                    and tensor_difference(w, g, atol, rtol) is not None:
                return symptoms.where_wrong(tokens_of(case, name), w, g, name, atol=atol, rtol=rtol,
                                            loops_right=loops_right)
    except Exception:  # noqa: BLE001 - a hint is a bonus
        return None
    return None


def _sizes_of(case: Case) -> dict[str, int]:
    """The sizes a raised error of a case can mention, by what they stand for (:func:`symptoms.sizes_of`; none if
    the case has no such sizes: a hint is a bonus)."""
    try:
        return symptoms.sizes_of(case.args[0], tokens_of(case, "dq"))
    except Exception:  # noqa: BLE001 - a hint is a bonus
        return {}


def _operand_shapes(case: Case) -> list[tuple[int, ...]]:
    """The shapes the backward multiplies on ``case``: its ``(..., T, D)`` tensors and the ``(..., T, T)`` weights."""
    tensors = [tuple(a.shape) for a in case.args if isinstance(a, torch.Tensor) and a.dim() >= 2]
    return tensors + [t[:-1] + t[-2:-1] for t in tensors[:1]]


def _record_mistakes(exercise: str, case: Case) -> None:
    """Record the known mistakes' and the families' outputs on ``case`` (``make build``): a passing reference never
    asks for them."""
    if _expected.is_recording():
        mistake_outputs(exercise, case)
    record_families(exercise, [case])


# ------------------------------------------------------------------------------------------
# P read off dv: with dO the identity's first T rows, dv = P^T dO holds P^T in its first T columns
# ------------------------------------------------------------------------------------------
#: The key of the step that reads the student's P off dv: its case's, after this.
P_PROBE = "P read off dv: "
_PROBE_T, _PROBE_D = 6, 8


def _p_probe_inputs() -> tuple[torch.Tensor, ...]:
    """``q, k, v`` ``(6, 8)`` in float64, and ``do = eye(6, 8)``: then ``dv[j, i] = P[i, j]``."""
    q, k, v, _ = _inputs(_PROBE_T, _PROBE_D, seed=1071, scale=2.0)
    return q, k, v, torch.eye(_PROBE_T, _PROBE_D, dtype=torch.float64)


def _p_probe_reference() -> Case:
    q, k, v, do = _p_probe_inputs()
    return Case("(6, 8), causal, dO = the identity's first 6 rows", (q, k, v, do), {"causal": True})


def _p_probe_backward() -> Case:
    q, k, v, do = _p_probe_inputs()
    o, lse = forward_statistics(q, k, v, True)  # (6, 8), (6,)
    return Case("(6, 8), block_q=block_k=3, causal, dO = the identity's first 6 rows", (q, k, v, o, lse, do, 3, 3),
                {"causal": True})


@symptoms.bonus
def _p_hint(case: Case, found: Any) -> str | None:
    """What is wrong with the student's P, read off the probe's dv (``found``: ``(dq, dk, dv)``): future keys with
    weight, scores at another scale (``log P`` linear in ``QK^T`` with another slope), or rows that do not sum to 1
    with the right proportions (the normalisation). ``None`` where P is right or reads as none of these (dv itself
    may be wrong)."""
    if not (isinstance(found, (tuple, list)) and len(found) == 3 and isinstance(found[2], torch.Tensor)
            and found[2].shape == (_PROBE_T, _PROBE_D)):
        return None
    T, D = _PROBE_T, _PROBE_D
    P = found[2].detach().double()[:, :T].T  # (T, T): P[i, j] = dv[j, i]
    q, k = case.args[0].double(), case.args[1].double()
    raw = q @ k.T  # (T, T), unscaled
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    want = torch.softmax((raw / math.sqrt(D)).masked_fill(future, float("-inf")), dim=-1)
    if not torch.isfinite(P).all() or torch.allclose(P, want, atol=1e-6, rtol=1e-5):
        return None
    for c, what in ((1.0, "not scaled at all: S = QK^T where it must be QK^T / sqrt(D)"),
                    (1 / D, "scaled twice: QK^T / D, the 1/sqrt(D) applied to the queries (or the keys) and to the "
                            "scores"),
                    (math.sqrt(D), "multiplied by sqrt(D) where they must be divided by it: S = QK^T * sqrt(D), not "
                                   "QK^T / sqrt(D) (the scale is 1 / math.sqrt(D))")):
        if torch.allclose(P, torch.softmax((raw * c).masked_fill(future, float("-inf")), dim=-1), atol=1e-6, rtol=1e-5):
            return f"P is the softmax of scores {what}."
    past = ~future
    below = torch.ones(T, T, dtype=torch.bool).tril(-1)  # (T, T): the keys before each query
    hidden_past, kept_future = (P.abs() <= 1e-12) & below, (P.abs() > 1e-9) & future  # (T, T) each
    if bool(hidden_past.any()) and torch.equal(hidden_past.T, kept_future):
        return ("P is the causal mask's mirror image: the keys before a query that get no weight are exactly those "
                "after it that keep some. The causal mask has the wrong direction, it hides the past and keeps the "
                "future: hide key j from query i when j > i (triu(1); in a tile, k_start + j > q_start + i), the "
                "diagonal kept.")
    if float(P[past].abs().min()) <= 1e-12:
        return None  # a key it may see has no weight at all: not a P this diagnosis reads
    if float(P[future].abs().max()) > 1e-9:
        return ("future keys get weight: P is not 0 above the diagonal. The causal mask must set the future scores to "
                "-inf before the exponential (a score of 0 still gives exp(0 - lse) > 0).")
    if bool((P[past] <= 0).any()):
        return None
    # log P[i, j] = c * raw[i, j] - z_i on the keys row i may see: c from the differences within each row
    logs, xs = [], []
    for i in range(1, T):
        logs.append(P[i, : i + 1].log() - P[i, 0].log())
        xs.append(raw[i, : i + 1] - raw[i, 0])
    y, x = torch.cat(logs), torch.cat(xs)
    c = float((x * y).sum() / (x * x).sum())
    if float((y - c * x).abs().max()) > 1e-6 * max(1.0, float(y.abs().max())):
        return None
    sums = P.sum(dim=-1)
    ratio = c * math.sqrt(D)  # the student's scale over 1 / sqrt(D)
    if abs(ratio - 1) > 1e-6:
        if abs(ratio - math.sqrt(D)) < 1e-6:
            what = "not scaled at all: S = QK^T where it must be QK^T / sqrt(D)"
        elif abs(ratio - 1 / math.sqrt(D)) < 1e-6:
            what = "scaled twice: QK^T / D, the 1/sqrt(D) applied to the queries (or the keys) and to the scores"
        else:
            return ("P follows scores at another scale than QK^T / sqrt(D): look at how the scores are scaled (once, "
                    "by 1 / sqrt(D)).")
        return f"P is the softmax of scores {what}."
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-6):
        return ("within each row P has the right proportions, but its rows do not sum to 1: the normalisation is off. "
                "Apply the causal mask to the scores (-inf) before the softmax (or exp(S - lse)), so that each row is "
                "normalised over the keys it may see; zeroing the weights after the softmax leaves rows summing below 1.")
    return None


# ------------------------------------------------------------------------------------------
# attention_backward_reference
# ------------------------------------------------------------------------------------------
def _reference_cases() -> list[Case]:
    return [
        Case("(5, 3), causal", _inputs(5, 3, seed=1001), {"causal": True}),
        Case("batch (2, 2, 7, 4), causal", _inputs(2, 2, 7, 4, seed=1005), {"causal": True}),
        Case("(2, 6, 4), causal=False", _inputs(2, 6, 4, seed=1009), {"causal": False}),
        Case("large scores (1, 8, 4) up to +-6, causal", _inputs(1, 8, 4, seed=1013, scale=6.0), {"causal": True}),
        # scores up to 764: exp overflows float64 past 709, so a softmax without the row maximum subtracted gives NaN
        Case("huge scores (1, 6, 4) up to +-40, causal", _inputs(1, 6, 4, seed=1019, scale=40.0), {"causal": True}),
    ]


def _expected_grads(exercise: str, case: Case) -> tuple[torch.Tensor, ...]:
    """Autograd's ``(dq, dk, dv)`` for the case's ``q, k, v, do`` (the first four arguments)."""
    q, k, v = case.args[:3]
    do = case.args[3] if len(case.args) == 4 else case.args[5]  # (q, k, v, do) or (q, k, v, o, lse, do, ...)
    return expect(exercise, case.key(), lambda: attention_with_grads(q, k, v, do, case.kwargs.get("causal", True))[1:])


def _reference_rungs() -> tuple[ladder.Rung, ...]:
    """attention_backward_reference's ladder (:mod:`course_utils.checks.ladder`): one token, then one feature at
    a time; at the first wrong rung the message says which of dq, dk and dv differ."""
    def r(shape: tuple, causal: bool, seed: int, adds: str, suspects: str) -> ladder.Rung:
        name = f"{tuple(shape)}, {'causal' if causal else 'causal=False'}"
        return ladder.Rung(Case(name, _inputs(*shape, seed=seed), {"causal": causal}), adds, suspects)
    return (
        r((1, 3), False, 1090, "", "what a single token gives: P = [[1]], so dv = P^T dO = dO, and dq = dk = 0 "
          "(dS = P * (dP - delta) vanishes): the shape of every product (dP = dO V^T is (T, T), dv = P^T dO is "
          "(T, D)) and of the three gradients?"),
        r((3, 3), False, 1091, "several tokens", "the softmax's backward: dP = dO V^T, delta = rowsum(dO * O) (or "
          "rowsum(P * dP)), dS = P * (dP - delta), dq = dS K / sqrt(D) and dk = dS^T Q / sqrt(D), with P the "
          "softmax over the keys (dim=-1)?"),
        r((3, 3), True, 1091, "the causal mask", "the mask: scores of keys after their query set to -inf (triu(1), "
          "the diagonal kept) before the softmax, and the causal flag read?"),
        r((3, 5), True, 1092, "T != D", "the transposes, which a square case hides: dP = dO V^T is (T, T), dv = "
          "P^T dO, dk = dS^T Q (with T == D a missing transpose still runs)?"),
        r((2, 2, 3, 5), True, 1093, "batch and heads > 1", "the leading (batch, head) dimensions: sizes read from "
          "the end (D = q.shape[-1]), every transpose of the last two dimensions (transpose(-2, -1), not .T or .t()), "
          "every row sum over dim=-1 with keepdim?"),
    )


REFERENCE_LADDER = ladder.Ladder(
    "attention_backward_reference", _reference_rungs,
    lambda case: attention_with_grads(*case.args[:4], case.kwargs["causal"])[1:],
    lambda grads: list(zip(GRADS, grads)), atol=1e-8, rtol=1e-6)


def _reference_judge(plan: list[Step], outcomes: Outcomes) -> str:
    exercise = "attention_backward_reference"
    ladder.record(REFERENCE_LADDER)
    smallest = lambda: ladder.diagnose(REFERENCE_LADDER, outcomes, defer=2)  # noqa: E731
    probe = next((s for s in plan if s.key.startswith(P_PROBE)), None)
    plan = [s for s in plan if not s.key.startswith(P_PROBE)]
    for step in plan:
        want = _expected_grads(exercise, step.case)
        _record_mistakes(exercise, step.case)
        got = outcomes[step.key]
        if isinstance(got, BaseException):  # a raw shape error gets its words (core.shape_error_hint), as elsewhere
            failed = raised(exercise, got, step.case)
            raise _hinted(failed, None if failed.student_error is None else
                          (symptoms.dot_T_hint(got, _operand_shapes(step.case)) or shape_error_hint(got)
                           or symptoms.error_hint(got, _sizes_of(step.case))
                           or ladder.diagnose(REFERENCE_LADDER, outcomes))) from None
        _compare(exercise, step.case, got, want, atol=1e-8, rtol=1e-6, smallest=smallest,
                 p_hint=(lambda: _p_hint(probe.case, outcomes[probe.key])) if probe else None)
    return f"{len(plan)} cases agree with autograd in float64 ({'; '.join(s.case.name for s in plan)})"


check_attention_backward_reference = declare(
    Spec("attention_backward_reference",
         lambda hidden: [Step(c.key(), c) for c in with_hidden("attention_backward_reference", _reference_cases)(hidden)]
         + [Step(P_PROBE + _p_probe_reference().key(), _p_probe_reference())] + ladder.steps(REFERENCE_LADDER, hidden),
         _reference_judge, {ladder.RUN: ladder.call}),
    """Check ``attention_backward_reference(q, k, v, do, causal)`` -> ``(dq, dk, dv)`` against autograd.""")


# ------------------------------------------------------------------------------------------
# flash_attention_backward
# ------------------------------------------------------------------------------------------
def _flash_cases() -> list[Case]:
    return [
        _backward_case("(1, 2, 24, 8), block_q=block_k=8, causal", (1, 2, 24, 8), 1029, 8, 8, True),
        _backward_case("(6, 4), block_q=2, block_k=4, causal", (6, 4), 1021, 2, 4, True),
        _backward_case("(2, 3, 37, 8), block_q=8, block_k=16, causal: T not a multiple of the blocks",
                       (2, 3, 37, 8), 1025, 8, 16, True),
        _backward_case("(2, 20, 8), block_q=16, block_k=6, causal=False", (2, 20, 8), 1033, 16, 6, False),
    ]


#: The case on which the check counts the scores computed: T = 40 is larger than every other size.
_STRUCTURE = ("tiles: (2, 40, 4), block_q=8, block_k=16, causal", (2, 40, 4), 1037, 8, 16)


def tiles_problem(watcher: TensorWatcher, T: int, head_dim: int, block_q: int, block_k: int, heads: int) -> str | None:
    """Whether a causal backward skipped the tiles wholly in the future, read from the products made.

    Each computed tile makes two ``(Bq, Bk)`` products that contract over the head size: the
    scores ``Q_blk K_blk^T`` and ``dP = dO_blk V_blk^T`` (the head size of ``v`` is the same here).
    Products whose output's last dimension is the head size (``P^T dO``, ``dS K``, ``dS^T Q``) are
    not counted, nor products with a single row or column (``einsum`` makes ``rowsum(dO * O)`` one). An
    answer whose products the watcher cannot see is not judged here.
    """
    return _tiles_text(_tile_entries(watcher, head_dim), T, block_q, block_k, heads)


def _tile_entries(watcher: TensorWatcher, head_dim: int) -> int:
    """The entries of S and dP computed: products contracting over the head size (see :func:`tiles_problem`)."""
    return int(sum(p.entries for p in watcher.products if p.contraction == head_dim and p.out_shape[-1] != head_dim
                   and min(p.out_shape[-2:]) > 1))  # not a row-by-row dot product, D = rowsum(dO * O) by einsum


def _tiles_text(computed: int, T: int, block_q: int, block_k: int, heads: int) -> str | None:
    """:func:`tiles_problem` from the number of entries of S and dP computed."""
    if computed == 0:
        return None
    needed, _, total = (2 * n * heads for n in computed_tiles(T, block_q, block_k))
    if computed <= needed:
        return None
    if computed >= total:
        return (f"no tile was skipped: your code computed {computed:,} entries of S and dP, those of every (query "
                f"block, key block) tile, but a causal backward needs only the tiles that reach the diagonal or "
                f"lie below it ({needed:,}). For a key block starting at k_start, the query blocks that end at or "
                f"before k_start see none of its keys: start the query loop at the block holding k_start, "
                f"(k_start // block_q) * block_q (or, with query blocks outside, stop the key loop at q_end).")
    start = _loop_start_member(computed, T, block_q, block_k, heads)
    if start:
        return (f"your code computed {computed:,} entries of S and dP, but the causal tiles need only {needed:,}: "
                f"exactly as many as a query loop computes that starts, for the key block at k_start, at {start}. The first "
                f"query block that sees a key block is the one that holds k_start, (k_start // block_q) * block_q: "
                f"the query blocks before it end before k_start and see none of its keys.")
    return (f"your code computed {computed:,} entries of S and dP, but the causal tiles need only {needed:,}: some "
            f"tiles wholly in the future are still computed (an off-by-one in a loop's start or end?), or some tiles "
            f"twice. Compute each needed tile once, and add its share into the rows of dq right there.")


#: Wrong starts of the query loop of a key block (issue 36), each ``k_start, block_q, block_k`` -> the first query.
_LOOP_STARTS = {
    "(k_start // block_k) * block_q, the key block's index times block_q": lambda ks, bq, bk: ks // bk * bq,
    "the query block before the one that holds k_start, (k_start // block_q - 1) * block_q":
        lambda ks, bq, bk: max(0, (ks // bq - 1) * bq),
    "k_start // block_q, a block index used as a position": lambda ks, bq, bk: ks // bq,
    "(k_start // block_q) * block_k, a query block's index times block_k": lambda ks, bq, bk: ks // bq * bk,
}


def _loop_start_member(computed: int, T: int, block_q: int, block_k: int, heads: int) -> str | None:
    """The one wrong start of :data:`_LOOP_STARTS` whose key-block-outside loops compute exactly ``computed`` entries
    of S and dP (two ``(Bq, Bk)`` products a tile), or ``None``: its words."""
    def entries(first: Callable[[int, int, int], int]) -> int:
        return sum(2 * heads * (min(qs + block_q, T) - qs) * (min(ks + block_k, T) - ks)
                   for ks in range(0, T, block_k) for qs in range(first(ks, block_q, block_k), T, block_q))
    right = entries(lambda ks, bq, bk: ks // bq * bq)
    found = [words for words, first in _LOOP_STARTS.items() if entries(first) == computed != right]
    return found[0] if len(found) == 1 else None


def _structure_run(student: Callable, case: Case) -> list:
    """The runner of a watched step: ``student`` on ``case`` under a :class:`TensorWatcher`, ``[first_full,
    entries]`` (the first ``(T, T)`` tensor made, nb07's ``_first_full``, and :func:`_tile_entries`), plain
    data. Raises what the student's code raised."""
    q = case.args[0]
    watcher = TensorWatcher(memory=False)  # what was made, multiplied, reduced: no byte counts
    with torch.no_grad(), watcher:
        student(*_clone(case.args), **case.kwargs)
    return [_first_full(watcher, q.shape[-2]), _tile_entries(watcher, q.shape[-1])]


def _judge_backward_structure(exercise: str, outcomes: Outcomes, step: Step) -> None:
    """A watched step of the backward: no ``(T, T)`` tensor, future tiles skipped."""
    case = step.case
    q, k, v, o, lse, do, block_q, block_k = case.args
    causal = case.kwargs.get("causal", True)
    T = q.shape[-2]
    big, computed = watched_structure(exercise, outcomes, step, "the entries of S and dP computed")
    if T > max(block_q, block_k, q.shape[-1], v.shape[-1]):
        problem = _full_matrix_text(big, T)
        if problem:
            fail(exercise, problem.replace("FlashAttention never", "FlashAttention's backward never")
                 .replace("compute one (block_q, block_k) tile of scores at a time, q_blk @ k_blk.transpose(-2, -1)",
                          "rebuild one (block_q, block_k) tile of P at a time from q_blk, k_blk and lse"), case)
    if causal and T > block_k and q.shape[-1] == v.shape[-1]:
        problem = _tiles_text(computed, T, block_q, block_k, math.prod(q.shape[:-2]))
        if problem:
            fail(exercise, problem, case)


def _blocks_of(case: Case) -> tuple[int, int, int, bool] | None:
    """``(T, block_q, block_k, causal)`` of a tiled backward's case, ``None`` if it has no block sizes."""
    sizes = [a for a in case.args if type(a) is int]
    flags = [a for a in case.args if type(a) is bool]
    if len(sizes) < 2 or not isinstance(case.args[0], torch.Tensor):
        return None
    return case.args[0].shape[-2], sizes[0], sizes[1], bool(case.kwargs.get("causal", flags[0] if flags else True))


@symptoms.bonus
def _mask_shape_hint(plan: list[Step], outcomes: Outcomes, step: Step, error: BaseException) -> str | None:
    """A causal tile's mask of another shape than the tile's ``(Bq, Bk)`` scores (issue 36): ``error`` met the sizes
    ``block_q`` and ``block_k`` of ``step``'s causal case, another causal case raised so too where no last, shorter
    block has either size (``T % block`` is 0 or neither block size), and a case with ``causal=False`` (no mask) and
    ``block_q != block_k`` ran."""
    sizes, blocks = symptoms.broadcast_sizes(error), _blocks_of(step.case)
    if sizes is None or blocks is None:
        return None
    T, block_q, block_k, causal = blocks
    if not causal or block_q == block_k or {sizes[0], sizes[1]} != {block_q, block_k}:
        return None
    even = unmasked = None
    for other in plan:
        found, b = outcomes[other.key], _blocks_of(other.case)
        if other is step or b is None or b[1] == b[2]:
            continue
        if b[3] and isinstance(found, BaseException) and (s := symptoms.broadcast_sizes(found)) \
                and {s[0], s[1]} == {b[1], b[2]} and b[0] % b[1] not in (b[1], b[2]) and b[0] % b[2] not in (b[1], b[2]):
            even = even or other.case
        if not b[3] and not isinstance(found, BaseException):
            unmasked = unmasked or other.case
    if even is None or unmasked is None:
        return None
    return (f"a causal tile's mask does not have the shape of the tile's scores, (Bq, Bk) = (block_q = {block_q} "
            f"query rows, block_k = {block_k} key columns): they met with sizes {sizes[0]} and {sizes[1]}. The case "
            f"'{unmasked.name}' (no mask, block_q != block_k) runs; the causal ones with block_q != block_k raise "
            f"with their two block sizes, also '{even.name}', where no last, shorter block has either size. Build the "
            f"mask with the "
            f"queries down the rows and the keys across: rows = arange(q_start, q_end)[:, None] (Bq, 1), cols = "
            f"arange(k_start, k_end)[None, :] (1, Bk), masked where cols > rows.")


def _backward_diagnose(error: BaseException) -> str | None:
    """The hint for a tiled backward that raised ``error``: a row statistic sliced without its last dimension."""
    found = symptoms.broadcast_sizes(error)
    if found and found[1] == 0:
        return ("a row statistic's slice is empty (size 0): delta (or lse) holds fewer than T numbers per row. delta = "
                "rowsum(dO * O) sums over the head dimension, (do * o).sum(dim=-1): one number per query, (..., T); a "
                "sum over dim=-2, the tokens, gives (..., D).")
    if "must match the size of tensor" in str(error):
        return ("a row statistic (delta or lse) sliced without its last dimension: delta[..., q_start:q_end] is "
                "(..., Bq), which does not broadcast against a (..., Bq, Bk) tile. Index it delta[..., q_start:q_end, "
                "None], as lse[..., q_start:q_end, None] (or keep the dimension with keepdim=True when you sum).")
    return None


#: The key of the bfloat16 step of ``flash_attention_backward``: its case's, after this.
HALF = "bfloat16: "
#: The key of the step that runs the first case again with ``lse`` raised row by row: its case's, after this.
LSE_RAISED = "lse raised row by row: "


def _lse_raised(case: Case) -> Case:
    """``case`` with query row ``i``'s ``lse`` raised by ``c_i = i / T`` (``(T,)``, the same for every head): a
    backward that reads ``lse`` at the query's own row then gives ``dq_i`` times ``exp(-c_i)``, since ``P_i = exp(S_i
    - lse_i)`` and ``delta`` comes from ``o`` and ``do`` alone (:func:`_lse_rows_hint`)."""
    q, k, v, o, lse, do, *rest = case.args
    T = lse.shape[-1]
    higher = lse + torch.arange(T, dtype=lse.dtype) / T  # (..., T)
    return Case(f"{case.name}, lse raised by i / T at row i", (q, k, v, o, higher, do, *rest), dict(case.kwargs))


@symptoms.bonus
def _lse_rows_hint(case: Case, got: Any, shifted: Any) -> str | None:
    """Whether ``dq`` followed ``lse`` row by row (:func:`_lse_raised`): ``shifted`` is what the same backward gave
    with ``lse`` raised. ``None`` where it did (``dq_i`` times ``exp(-c_i)``) or where ``dq`` did not change at all
    (a backward that recomputes the softmax without ``lse``)."""
    def dq_of(found: Any) -> torch.Tensor | None:
        ok = isinstance(found, (tuple, list)) and len(found) == 3 and isinstance(found[0], torch.Tensor)
        return found[0].detach().double() if ok and found[0].shape == case.args[0].shape else None

    dq, dq_raised = dq_of(got), dq_of(shifted)
    if dq is None or dq_raised is None or not (torch.isfinite(dq).all() and torch.isfinite(dq_raised).all()):
        return None
    T = dq.shape[-2]
    factor = torch.exp(-torch.arange(T, dtype=torch.float64) / T)[:, None]  # (T, 1)
    if torch.allclose(dq_raised, dq * factor, atol=1e-5, rtol=1e-4) or torch.allclose(dq_raised, dq, atol=1e-6, rtol=0):
        return None
    return ("lse is read at other rows than the queries': raising query row i's lse by c must scale dq's row i by "
            "exp(-c), since P_i = exp(S_i - lse_i), and yours does not. Slice lse with the query block's range, "
            "lse[..., q_start:q_end, None], as the scores' rows.")


def _backward_rung(shape: tuple, block_q: int, block_k: int, causal: bool, seed: int, adds: str, suspects: str,
                   note: str = "") -> ladder.Rung:
    name = f"{tuple(shape)}, block_q={block_q}, block_k={block_k}, {'causal' if causal else 'causal=False'}{note}"
    return ladder.Rung(_backward_case(name, shape, seed, block_q, block_k, causal), adds, suspects)


def backward_rungs() -> tuple[ladder.Rung, ...]:
    """The tiled backward's ladder (:mod:`course_utils.checks.ladder`): one tile, then the tiles' features one
    at a time; at the first wrong rung the message says which of dq, dk and dv differ."""
    r = _backward_rung
    return (
        r((4, 4), 4, 4, False, 1080, "", "the work on one tile: P = exp(S / sqrt(D) - lse), dv = P^T dO, dP = "
          "dO V^T, delta = rowsum(dO * O), dS = P * (dP - delta), dq = dS K / sqrt(D) and dk = dS^T Q / sqrt(D)?",
          ": one tile"),
        r((4, 4), 4, 4, True, 1080, "the causal mask", "the mask inside a tile: P = 0 for a key after its query "
          "(k_start + j > q_start + i), before P is used for dv and dS, and the query loop still reaching the "
          "diagonal tile (it starts at the query block that holds k_start)?", ": one tile"),
        r((8, 4), 8, 4, False, 1081, "a second key block", "what each key block owns and what it shares: dk and "
          "dv of a key block started afresh and stored at its own rows k_start:k_end, and dq summed over every "
          "key block (dq[q_start:q_end] += ...)? And, as block_q != block_k here for the first time: does each loop "
          "step by its own block size and end each block with it (q_end = min(q_start + block_q, T))?"),
        r((8, 4), 4, 8, False, 1082, "a second query block", "what each query block reads: its rows q_start:q_end "
          "of q, do, lse and delta, and dk and dv summed over every query block, not set by the last one?"),
        r((8, 4), 4, 4, False, 1083, "several query and key blocks (causal=False)", "which query blocks a key "
          "block meets when not causal: all of them, from 0 up to T?"),
        r((8, 4), 4, 4, True, 1083, "several blocks with the causal mask", "which query blocks a causal key block "
          "meets (from the query block that holds its first key k_start on, up to T; none before it) and the "
          "diagonal tile's mask from the global positions k_start + j > q_start + i?"),
        r((12, 4), 4, 6, True, 1084, "block_q != block_k", "what must use each block size: the query loop's "
          "start (k_start // block_q * block_q, rounded down to a query block) and step block_q, the key loop's "
          "step block_k, and each slice and mask with its own block's start and end?"),
        r((14, 4), 4, 6, True, 1085, "a short last block (T not a multiple of the blocks)", "the last, shorter "
          "blocks: each ends at min(start + block, T), and its slices, mask and stores use that end?"),
        r((2, 2, 14, 4), 4, 6, True, 1086, "batch and heads > 1", "the leading (batch, head) dimensions: sizes "
          "read from the end (T = q.shape[-2], D = q.shape[-1]), every index with ... in front (q[..., rows, :], "
          "lse[..., rows, None]), every row sum over dim=-1 with "
          "keepdim, and every transpose of the last two dimensions (transpose(-2, -1), not .T)?"),
    )


BACKWARD_LADDER = ladder.Ladder(
    "flash_attention_backward", backward_rungs,
    lambda case: attention_with_grads(*case.args[:3], case.args[5], case.kwargs["causal"])[1:],
    lambda grads: list(zip(GRADS, grads)))


def _backward_plan(hidden: bool) -> list[Step]:
    """Each case called (and watched, for the hidden and the non-causal ones: the causal structure is watched
    on T = 40); then the T = 40 case watched; then the bfloat16 cases called (the second sums 48 key blocks' shares
    into each row of dq)."""
    steps = []
    for case in with_hidden("flash_attention_backward", _flash_cases)(hidden):
        steps.append(Step(case.key(), case))
        if hidden or not case.kwargs.get("causal", True):
            steps.append(Step(WATCHED + case.key(), case, "structure"))
    first = _flash_cases()[0]
    steps.append(Step(LSE_RAISED + first.key(), _lse_raised(first)))
    steps.append(Step(P_PROBE + _p_probe_backward().key(), _p_probe_backward()))
    name, shape, seed, block_q, block_k = _STRUCTURE
    structure = _backward_case(name, shape, seed, block_q, block_k, True)
    halves = [Step(HALF + half.key(), half) for half in (_half_backward_case(), _half_long_case())]
    return steps + [Step(WATCHED + structure.key(), structure, "structure"), *halves] \
        + ladder.steps(BACKWARD_LADDER, hidden)


def _backward_judge(plan: list[Step], outcomes: Outcomes) -> str:
    exercise = "flash_attention_backward"
    calls = [s for s in plan if s.run == CALL and not s.key.startswith((HALF, LSE_RAISED, P_PROBE))]
    probe = next((s for s in plan if s.key.startswith(P_PROBE)), None)
    ladder.record(BACKWARD_LADDER)
    smallest = lambda: ladder.diagnose(BACKWARD_LADDER, outcomes, defer=1)  # noqa: E731
    for step in plan:
        case = step.case
        if step.run == "structure":
            _judge_backward_structure(exercise, outcomes, step)
        elif step.key.startswith((LSE_RAISED, P_PROBE)):
            continue  # read by the hints of the other cases (_lse_rows_hint, _p_hint)
        elif step.key.startswith(HALF):
            q, k, v, _, _, do = (t.to(torch.float64) for t in case.args[:6])
            want = attention_with_grads(q, k, v, do, case.kwargs["causal"])[1:]  # PyTorch's, in float64, run here
            got = outcomes[step.key]
            if isinstance(got, BaseException):
                failed = raised(exercise, got, case)
                raise _hinted(failed, _half_diagnose(got if failed.student_error is not None else failed)) from None
            _half_dtypes(exercise, case, got)
            _compare(exercise, case, got, want, atol=HALF_ATOL, rtol=HALF_RTOL, name_mistakes=False)
            _half_tiles(exercise, case, got)
        else:
            want = _expected_grads(exercise, case)
            _record_mistakes(exercise, case)
            tol = 1e-8 if case.args[0].dtype == torch.float64 else 1e-5
            got = outcomes[step.key]
            if isinstance(got, BaseException):
                failed = raised(exercise, got, case)
                hint = None if failed.student_error is None else (
                    _mask_shape_hint(plan, outcomes, step, got)
                    or short_block_hint(exercise, plan, outcomes, step, got) or _backward_diagnose(got)
                    or symptoms.error_hint(got, _sizes_of(case)) or ladder.diagnose(BACKWARD_LADDER, outcomes))
                raise _hinted(failed, hint) from None
            lse_key = LSE_RAISED + step.key
            rows = (lambda: _lse_rows_hint(case, got, outcomes[lse_key])) if lse_key in {s.key for s in plan} else None
            _compare(exercise, case, got, want, atol=tol, rtol=1e-4, smallest=smallest, rows_hint=rows,
                     p_hint=(lambda: _p_hint(probe.case, outcomes[probe.key])) if probe else None)
    return (f"{len(calls)} cases agree with autograd, no (T, T) tensor is made, and causal tiles wholly in the "
            f"future are skipped ({'; '.join(s.case.name for s in calls)}); in bfloat16 the gradients are within "
            f"{HALF_ATOL:g} of float64 attention")


check_flash_attention_backward = declare(
    Spec("flash_attention_backward", _backward_plan, _backward_judge,
         {"structure": _structure_run, ladder.RUN: ladder.call}),
    """Check ``flash_attention_backward(q, k, v, o, lse, do, block_q, block_k, causal)`` -> ``(dq, dk, dv)``:
    autograd's gradients, with no ``(T, T)`` tensor made and the causal tiles in the future skipped; and in
    bfloat16 (``lse`` in float32, as notebook 07's forward returns it) within bfloat16's tolerance.""")


# ------------------------------------------------------------------------------------------
# FlashAttention
# ------------------------------------------------------------------------------------------
def run_function(cls: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, causal: bool,
                 block_q: int, block_k: int) -> tuple[torch.Tensor, ...]:
    """``(o, dq, dk, dv)``: ``cls.apply(q, k, v, causal, block_q, block_k)`` and its backward for ``do``."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        o = cls.apply(q, k, v, causal, block_q, block_k)
        if not isinstance(o, torch.Tensor):
            raise TypeError(f"FlashAttention.apply returned {type(o).__name__}: forward must return the output "
                            f"tensor o alone (keep lse for the backward with ctx.save_for_backward)")
        if o.grad_fn is None:
            raise TypeError("the output has no grad_fn: autograd cannot reach your backward. Return forward's "
                            "output as it is")
        o.backward(do)
    grads = tuple(t.grad if t.grad is not None else torch.zeros_like(t) for t in (q, k, v))
    return (o.detach(), *grads)


def _function_cases() -> list[Case]:
    return [
        Case("(6, 4), block_q=2, block_k=4, causal", (*_inputs(6, 4, seed=1041), True, 2, 4)),
        Case("(2, 2, 13, 8), block_q=4, block_k=4, causal: T not a multiple of the blocks",
             (*_inputs(2, 2, 13, 8, seed=1045), True, 4, 4)),
        Case("(2, 11, 4), block_q=8, block_k=3, causal=False", (*_inputs(2, 11, 4, seed=1049), False, 8, 3)),
    ]


def _saved_order(cls: Any) -> tuple[list[str], list[str]] | None:
    """The names given to ``ctx.save_for_backward`` in ``cls``'s source and those ``ctx.saved_tensors`` is unpacked
    into, when both are plain names (``None`` if unread)."""
    import ast
    import textwrap

    from course_utils import rules

    try:
        tree = ast.parse(textwrap.dedent(rules.source_of(cls) or ""))
    except SyntaxError:
        return None
    saved = unpacked = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "save_for_backward" \
                and all(isinstance(a, ast.Name) for a in node.args):
            saved = [a.id for a in node.args]
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr == "saved_tensors" \
                and len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple) \
                and all(isinstance(e, ast.Name) for e in node.targets[0].elts):
            unpacked = [e.id for e in node.targets[0].elts]
    if saved is None or unpacked is None or sorted(saved) != sorted(unpacked):
        return None
    return saved, unpacked


def _forward_parameters(cls: Any) -> list[str] | None:
    """The names of the parameters of ``cls``'s ``forward``, read from its source (``None`` if unread)."""
    import ast
    import textwrap

    from course_utils import rules

    source = rules.source_of(cls)
    try:
        tree = ast.parse(textwrap.dedent(source or ""))
    except SyntaxError:
        return None
    found = next((node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "forward"), None)
    return None if found is None else [a.arg for a in found.args.args]


def _function_diagnose(error: BaseException, cls: Any = None) -> str | None:
    """The hint for a run of ``FlashAttention`` that raised ``error``; ``cls``, the student's class (or the grader's
    stand-in, which carries its source), is read for forward's parameters, never called."""
    text = str(error)
    if "causal flag in a block size's place" in text and cls is not None:
        names = _forward_parameters(cls)
        if names and len(names) >= 7 and names[4] != "causal" and "causal" in names[5:]:
            return (f"your forward takes (ctx, {', '.join(names[1:])}), but apply passes its arguments to forward in "
                    f"the order it is given them, FlashAttention.apply(q, k, v, causal, block_q, block_k): write "
                    f"forward(ctx, q, k, v, causal, block_q, block_k), and call flash_attention_forward(q, k, v, "
                    f"block_q, block_k, causal) inside it.")
    missing = re.search(r"'(\w*Backward\w*)' object has no attribute '(\w+)'", text)
    if missing:
        name = missing.group(2)
        return (f"backward read ctx.{name}, which forward never set: ctx is the only thing forward hands on to backward, "
                f"so every value backward reads from it must be saved there in forward (ctx.{name} = {name}; tensors "
                f"with ctx.save_for_backward).")
    if isinstance(error, ZeroDivisionError) or text.startswith("ZeroDivisionError"):
        return ("a division by zero: a block size of 0 (False, the causal flag, where a block size goes?). The order is "
                "flash_attention_backward(q, k, v, o, lse, do, block_q, block_k, causal), causal last, while "
                "FlashAttention.apply(q, k, v, causal, block_q, block_k) takes it before the block sizes.")
    given = re.search(r"forward\(\) takes (?:from \d+ to )?(\d+) positional arguments? but 7 were given", text)
    if given:
        names = _forward_parameters(cls) if cls is not None else None
        yours = (f": yours takes ({', '.join(names)}), without ctx" if names and "ctx" not in names
                 else f", but yours takes at most {given.group(1)}")
        return (f"apply calls forward with ctx first and then its own 6 arguments, (ctx, q, k, v, causal, block_q, "
                f"block_k): 7 in all{yours}. Write forward(ctx, q, k, v, causal, block_q, block_k), ctx first as in "
                f"backward(ctx, do).")
    if "'tuple' object is not callable" in text:
        return ("a tuple was called like a function, name(...). If it is ctx.saved_tensors: it is an attribute that "
                "holds the saved tensors, not a method: unpack it without parentheses, q, k, v, o, lse = "
                "ctx.saved_tensors.")
    if "incorrect number of gradients" in text:
        return ("backward must return one gradient per argument of forward, in order: dq, dk, dv, and None for "
                "causal, block_q and block_k.")
    if "different than None at position" in text:
        return ("causal, block_q and block_k are not tensors: backward returns None for each of them (a number such as "
                "0 or False is refused), after dq, dk and dv: return dq, dk, dv, None, None, None.")
    order = _saved_order(cls) if cls is not None else None
    if order is not None and order[0] != order[1]:
        saved, unpacked = ", ".join(order[0]), ", ".join(order[1])
        return (f"ctx.saved_tensors gives the tensors in the order save_for_backward got them, ({saved}), but backward "
                f"unpacks them as ({unpacked}): unpack them in that same order, {saved} = ctx.saved_tensors.")
    if re.match(r"(o|lse) must have", text):
        return ("o or lse has the other's shape, (..., T) against (..., T, D): ctx.saved_tensors gives the tensors in the "
                "order save_for_backward got them, so unpack them in that same order: ctx.save_for_backward(q, k, v, o, "
                "lse) in forward, q, k, v, o, lse = ctx.saved_tensors in backward.")
    if "save_for_backward can only save" in text or "saved_tensors" in text:
        return "ctx.save_for_backward(q, k, v, o, lse) in forward; q, k, v, o, lse = ctx.saved_tensors in backward."
    unpack = re.match(r"not enough values to unpack \(expected (\d+), got (\d+)\)", text)
    if unpack and isinstance(error, ValueError):
        return (f"a tuple of {unpack.group(2)} was unpacked into {unpack.group(1)} names. If it is ctx.saved_tensors: "
                f"it holds what the LAST call of ctx.save_for_backward saved (a second call replaces the first), so "
                f"save all five tensors in one call, ctx.save_for_backward(q, k, v, o, lse).")
    return None


#: The size of the check of what forward keeps: (1, 2, T, D), block_q = block_k = 8, causal.
_KEPT_T = 24
_KEPT_NAMES = ("q", "k", "v", "o", "lse")


def _kept_problem(cls: Any) -> str | None:
    """What ``cls``'s forward keeps for the backward: exactly q, k, v, the output and lse, nothing (T, T)."""
    return _kept_text(_kept_facts(cls))


def _kept_facts(cls: Any, case: Any = None) -> list:
    """What ``cls``'s forward keeps, as plain data: ``[saved_error, saved, kept, first_full]``:
    ``saved_error`` (``[type, message]`` of reading ``ctx.saved_tensors``, or ``None``); ``saved``
    (``[shape, name]`` per saved tensor, ``name`` the one of q, k, v, o, lse it is, or ``None``);
    ``kept`` (``[attribute, shape]`` per tensor kept as an attribute of ctx); ``first_full`` (the first
    ``(T, T)`` tensor made while running forward and backward, nb07's ``_first_full``). Raises what the
    student's code raised. The runner of the step ``kept``."""
    T, D, block_q, block_k = _KEPT_T, 4, 8, 8
    q, k, v, do = _inputs(1, 2, T, D, seed=1053)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    watcher = TensorWatcher(memory=False)  # what was made, multiplied, reduced: no byte counts
    with torch.enable_grad(), watcher:
        o = cls.apply(q, k, v, True, block_q, block_k)
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    ctx = o.grad_fn
    try:
        saved = list(ctx.saved_tensors)
    except Exception as exc:  # noqa: BLE001 - described by the message
        return [[type(exc).__name__, str(exc)[:wire.MAX_MESSAGE]], [], [], None]
    kept = [[str(name), [int(d) for d in value.shape]] for name, value in vars(ctx).items()
            if isinstance(value, torch.Tensor)]
    lse_shape = q.shape[:-1]
    want = {"q": q, "k": k, "v": v, "o": o}
    found: list = []
    for tensor in saved:
        name = next((n for n, w in want.items() if n not in found and tensor.shape == w.shape
                     and torch.equal(tensor.detach(), w.detach())), None)
        if name is None and "lse" not in found and tensor.shape == lse_shape:
            name = "lse"
        found.append(name)
    return [None, [[[int(d) for d in t.shape], n] for t, n in zip(saved, found)], kept, _first_full(watcher, T)]


def _kept_of(exercise: str, outcomes: Outcomes, step: Step) -> list | BaseException:
    """The outcome of the step ``kept`` (:func:`_kept_facts`, or the error it raised), refused
    (``spec.refuse``) unless it has that form."""
    facts = outcomes[step.key]
    if isinstance(facts, BaseException):
        return facts
    ok = isinstance(facts, (list, tuple)) and len(facts) == 4
    if ok:
        error, saved, kept, big = facts
        ok = ((error is None or (isinstance(error, (list, tuple)) and len(error) == 2 and _short_text(error[0])
                                 and error[0].isidentifier() and _short_text(error[1])))
              and isinstance(saved, (list, tuple)) and len(saved) <= 64
              and all(isinstance(e, (list, tuple)) and len(e) == 2 and _shape_ok(e[0]) and e[1] in (*_KEPT_NAMES, None)
                      for e in saved)
              and isinstance(kept, (list, tuple)) and len(kept) <= 64
              and all(isinstance(e, (list, tuple)) and len(e) == 2 and _short_text(e[0]) and e[0].isidentifier()
                      and _shape_ok(e[1]) for e in kept)
              and _full_ok(big))
    if not ok:
        refuse(exercise, "forward's record of what it keeps ([an error or None, the saved tensors' shapes and names, "
                         "the tensors kept on ctx, the first (T, T) tensor or None])")
    return facts


def _kept_text(facts: list) -> str | None:
    """The message for what forward keeps (:func:`_kept_facts`), or ``None`` when it keeps the right tensors."""
    T = _KEPT_T
    error, saved, kept, big = facts
    if error is not None:
        return f"reading ctx.saved_tensors raised {error[0]}: {error[1]}"
    for where, shape in [("ctx.save_for_backward", e[0]) for e in saved] + [(f"ctx.{n}", sh) for n, sh in kept]:
        if sum(d >= T for d in shape) >= 2:
            return (f"{where} keeps a tensor of shape {tuple(shape)}, with T = {T} rows and columns: that is P "
                    f"(or the scores), the (T, T) matrix FlashAttention never keeps. Save only q, k, v, o and lse, and "
                    f"rebuild each tile of P in the backward from q, k and lse.")
    if kept:
        names = ", ".join(f"ctx.{name}" for name, _ in kept)
        return (f"tensors are kept as attributes of ctx ({names}): autograd cannot track them (a later in-place "
                f"change would go unnoticed). Pass every tensor to ctx.save_for_backward.")
    found = [n for _, n in saved]
    missing = [n for n in _KEPT_NAMES if n not in found]
    extra = [tuple(shape) for shape, n in saved if n is None]
    if missing or extra:
        return (f"ctx.save_for_backward saved {len(saved)} tensors of shapes {[tuple(shape) for shape, _ in saved]}: "
                f"{'missing ' + ', '.join(missing) if missing else ''}{'; ' if missing and extra else ''}"
                f"{'not needed: ' + str(extra) if extra else ''}. Save exactly q, k, v, the output o and lse "
                f"(..., T): everything the backward needs, and nothing (T, T).")
    problem = _full_matrix_text(big, T)
    if problem:
        return (problem.split(": that is")[0] + " while running forward and backward: FlashAttention never makes a "
                "(T, T) tensor, in either pass. forward calls flash_attention_forward and backward your tiled "
                "flash_attention_backward, nothing that builds the whole matrix.")
    return None


def _sdpa_cases() -> list[Case]:
    """``T = 256`` in float32 against SDPA, causal or not, with blocks that do not divide ``T``."""
    return [
        Case("float32 (1, 2, 256, 16), block_q=48, block_k=40, causal: against SDPA",
             (*_inputs(1, 2, 256, 16, seed=1057, dtype=torch.float32), True, 48, 40)),
        Case("float32 (1, 2, 256, 16), block_q=96, block_k=56, causal=False: against SDPA",
             (*_inputs(1, 2, 256, 16, seed=1061, dtype=torch.float32), False, 96, 56)),
    ]


#: bfloat16's tolerance for ``o``, ``dq``, ``dk``, ``dv`` of order 1 against float64 attention on the same
#: inputs: with float32 tiles and sums, what is left is the rounding of the bfloat16 output (8 significant
#: bits, up to 4e-3 here, measured); PyTorch's own bfloat16 SDPA is off by up to 1.1e-2 at 1.5.
HALF_ATOL, HALF_RTOL = 1e-2, 1.6e-2


def _half_cases() -> list[Case]:
    """One bfloat16 case, ``T`` not a multiple of the blocks: the forward returns ``lse`` in float32, so a
    backward that does not compute its tiles in float32 fails with a dtype error."""
    return [Case("bfloat16 (1, 2, 50, 16), block_q=16, block_k=24, causal: against float64 attention",
                 (*(t.to(torch.bfloat16) for t in _inputs(1, 2, 50, 16, seed=1067, dtype=torch.float32)), True, 16, 24))]


def _half_backward_case() -> Case:
    """``flash_attention_backward``'s bfloat16 case: ``q``, ``k``, ``v``, ``o`` and ``do`` ``(1, 2, 50, 16)`` in
    bfloat16, ``lse`` ``(1, 2, 50)`` in float32, as notebook 07's forward returns them."""
    q, k, v, do = (t.to(torch.bfloat16) for t in _inputs(1, 2, 50, 16, seed=1067, dtype=torch.float32))
    o, lse = forward_statistics(*(t.float() for t in (q, k, v)), True)  # (1, 2, 50, 16), (1, 2, 50)
    return Case("bfloat16 (1, 2, 50, 16), lse in float32, block_q=16, block_k=24, causal: against float64 attention",
                (q, k, v, o.to(torch.bfloat16), lse, do, 16, 24), {"causal": True})


def _half_long_case() -> Case:
    """``flash_attention_backward``'s second bfloat16 case: 48 key blocks of 2 keys, not causal, so each row of dq sums
    48 shares: in a float32 buffer they add up within a step of bfloat16, in a bfloat16 buffer each addition rounds
    to 8 bits and the sum drifts by several steps (:func:`_half_tiles`)."""
    q, k, v, do = (t.to(torch.bfloat16) for t in _inputs(1, 1, 96, 16, seed=1111, dtype=torch.float32))
    o, lse = forward_statistics(*(t.float() for t in (q, k, v)), False)  # (1, 1, 96, 16), (1, 1, 96)
    return Case("bfloat16 (1, 1, 96, 16), lse in float32, block_q=32, block_k=2, causal=False: 48 key blocks",
                (q, k, v, o.to(torch.bfloat16), lse, do, 32, 2), {"causal": False})


def _dq_in_half(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                do: torch.Tensor, block_q: int, block_k: int, causal: bool = True) -> torch.Tensor:
    """dq ``(..., T, D)`` of a tiled backward whose tiles are float32 but whose dq buffer has the inputs' dtype
    (``torch.zeros_like(q)``): every key block's share is added into it and rounded to that dtype."""
    T, D = q.shape[-2:]
    scale = 1 / math.sqrt(D)
    delta = (do.float() * o.float()).sum(-1)  # (..., T)
    dq = torch.zeros_like(q)
    for ks in range(0, T, block_k):
        ke = min(ks + block_k, T)
        k_blk, v_blk = k[..., ks:ke, :].float(), v[..., ks:ke, :].float()
        for qs in range((ks // block_q) * block_q if causal else 0, T, block_q):
            qe = min(qs + block_q, T)
            s = q[..., qs:qe, :].float() @ k_blk.transpose(-2, -1) * scale  # (..., Bq, Bk)
            if causal:
                s = s.masked_fill(torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None], float("-inf"))
            p = torch.exp(s - lse[..., qs:qe, None])
            ds = p * (do[..., qs:qe, :].float() @ v_blk.transpose(-2, -1) - delta[..., qs:qe, None])
            dq[..., qs:qe, :] += ds @ k_blk * scale
    return dq


def _half_diagnose(error: BaseException) -> str | None:
    """The hint for a bfloat16 run that raised: the dtype mismatch of a backward without float32 tiles."""
    text = str(error)
    if "dtype" in text or "scalar type" in text:
        return ("in bfloat16, notebook 07's forward returns lse in float32, so P = exp(S - lse) is float32 and a "
                "product with a bfloat16 tile fails. In flash_attention_backward, compute every tile in float32: "
                "acc = torch.promote_types(q.dtype, torch.float32), .to(acc) on each block you slice, dq, dk and dv "
                "made with dtype=acc, and return them cast back, dq.to(q.dtype) and so on.")
    return None


def _half_dtypes(exercise: str, case: Case, got: Any) -> None:
    """Fail unless the bfloat16 case's ``(dq, dk, dv)`` come back in the inputs' dtypes (``q``, ``k``, ``v``): the
    float32 accumulators cast back, as the exercise states."""
    if not (isinstance(got, (tuple, list)) and len(got) == 3 and all(isinstance(t, torch.Tensor) for t in got)):
        return  # _compare names what was returned
    wrong = [(name, g.dtype) for name, g, x in zip(GRADS, got, case.args[:3]) if g.dtype != x.dtype]
    if wrong:
        kinds = sorted({str(d).removeprefix("torch.") for _, d in wrong})
        fail(exercise, f"returns {', '.join(n for n, _ in wrong)} in {' and '.join(kinds)} for bfloat16 inputs: "
                       f"accumulate in float32, but cast the gradients back to the inputs' dtypes at the end, "
                       f"dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype).", case)


def _half_tiles(exercise: str, case: Case, got: Any) -> None:
    """Fail unless the bfloat16 case's ``(dq, dk, dv)`` (``(..., T, D)``) are, within two steps of bfloat16 (and a
    thousandth of the largest gradient), what the answer gives with ``delta``, every tile and every sum in float32,
    as the exercise states ("Compute `delta`, every tile and the running `dk_blk`, `dv_blk` in `acc`"): float32 sums
    taken in another order move a bfloat16 result by one step at most; a ``delta`` or a tile rounded to bfloat16
    moves it by more."""
    model = expect(exercise, "float32 tiles: " + case.key(),
                   lambda: _expected.reference("flash_attention_backward")(*case.args, **case.kwargs))
    off = {}
    for name, m, g in zip(GRADS, model, got):
        m, g = m.float(), g.detach().float().cpu()
        step = torch.ldexp(torch.ones_like(m), torch.frexp(m.abs())[1] - 8)  # bfloat16's step at |m| (8 bits)
        excess = (g - m).abs() / (2 * step + 1e-3 * float(m.abs().max()))  # (..., T, D): over 1 is too far
        if bool((excess > 1).any()):
            at = tuple(int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
            off[name] = (at, float(g[at]), float(m[at]))
    if not off:
        return
    name, (at, g, m) = next(iter(off.items()))
    if list(off) == ["dq"]:
        try:
            model = _dq_in_half(*case.args, **case.kwargs).float()
            mine = got[0].detach().float().cpu()
            step = torch.ldexp(torch.ones_like(model), torch.frexp(model.abs())[1] - 8)
            alike = bool(((mine - model).abs() <= 2 * step + 1e-3 * float(model.abs().max())).all())
        except Exception:  # noqa: BLE001 - a hint is a bonus
            alike = False
        if alike:
            blocks = math.ceil(case.args[0].shape[-2] / case.args[7])
            fail(exercise, f"in bfloat16, dq is off by more than two steps of bfloat16 ({name} at {list(at)} is "
                           f"{g:.4g} where float32 sums give {m:.4g}) while dk and dv are right: dq is what a backward "
                           f"gives whose dq buffer is in bfloat16 (torch.zeros_like(q) keeps q's dtype), so each of "
                           f"the {blocks} key blocks' shares is rounded to 8 bits as it is added. Make dq with "
                           f"dtype=acc, "
                           f"as dk and dv, and cast it back only when you return it, dq.to(q.dtype).", case)
    names = " and ".join(off)
    same = [n for n in GRADS if n not in off]
    only = f" ({' and '.join(same)} {'are' if len(same) > 1 else 'is'}): something only {names} use" if same \
        else ": something"
    fail(exercise, f"in bfloat16, {names} are within bfloat16's tolerance of float64 attention but not what float32 "
                   f"tiles give: {name} at {list(at)} is {g:.4g} where float32 tiles give {m:.4g}, more than two "
                   f"steps of bfloat16 apart{only} was rounded to bfloat16 on the way, delta = rowsum(dO * O) computed "
                   f"before .to(acc)? Compute delta, every tile and every sum in acc = torch.promote_types(q.dtype, "
                   f"torch.float32), and cast only the returned gradients back.", case)


def _judge_half(exercise: str, case: Case, got: Any, names: tuple[str, ...]) -> None:
    """``FlashAttention`` on a bfloat16 case, from what the run gave (``got``: ``(o, dq, dk, dv)`` or the error it
    raised): it runs, returns ``o`` in bfloat16, and ``(o, dq, dk, dv)`` agree with float64 attention on the same
    inputs within bfloat16's tolerance."""
    q, k, v, do = (t.to(torch.float64) for t in case.args[:4])
    want = attention_with_grads(q, k, v, do, case.args[4])  # PyTorch's attention in float64, run here
    if isinstance(got, BaseException):
        failed = raised(exercise, got, case)
        raise _hinted(failed, _half_diagnose(got if failed.student_error is not None else failed)) from None
    if isinstance(got, (tuple, list)) and got and isinstance(got[0], torch.Tensor) and got[0].dtype != torch.bfloat16:
        fail(exercise, f"for bfloat16 inputs the output o has dtype {got[0].dtype}: return it in the inputs' dtype, "
                       f"as notebook 07's flash_attention_forward does", case)
    _compare(exercise, case, got, want, names, atol=HALF_ATOL, rtol=HALF_RTOL, name_mistakes=False)


def _same_dtype(exercise: str, case: Case, got: Any) -> None:
    """Fail unless a run's output ``o`` has its inputs' dtype (the cases are float64): a forward that casts its inputs
    (``.float()``) returns float32 and loses float64's precision (issue 36)."""
    q = case.args[0]
    if not (isinstance(got, (tuple, list)) and got and isinstance(got[0], torch.Tensor)
            and got[0].is_floating_point() and got[0].dtype != q.dtype):
        return
    have, want = (str(d).removeprefix("torch.") for d in (got[0].dtype, q.dtype))
    fail(exercise, f"for {want} inputs the output o has dtype {have}: FlashAttention returns o in its inputs' dtype, as "
                   f"notebook 07's flash_attention_forward does. Pass q, k and v to the forward as they are (no "
                   f".float() or .to(...) on them): casting {want} inputs to {have} loses their precision (gradcheck "
                   f"runs in float64), and bfloat16 inputs would give a float32 output.", case)


def _gradcheck_run(cls: Any, case: Case) -> list | None:
    """The runner of the step ``gradcheck``: ``torch.autograd.gradcheck`` of ``cls`` on ``case``: ``None`` when
    it passes, ``["disagrees", first line of its error]`` when it does not; raises what else it raised."""
    q, k, v, _, causal, block_q, block_k = case.args
    inputs = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    try:
        with torch.enable_grad():
            torch.autograd.gradcheck(lambda a, b, c: cls.apply(a, b, c, causal, block_q, block_k), inputs,
                                     eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=True)
    except torch.autograd.gradcheck.GradcheckError as error:
        return ["disagrees", str(error).strip().splitlines()[0][:wire.MAX_MESSAGE] if str(error).strip() else ""]
    return None


def _judge_gradcheck(exercise: str, outcomes: Outcomes, step: Step) -> None:
    outcome = outcomes[step.key]
    if isinstance(outcome, BaseException):
        fail(exercise, f"torch.autograd.gradcheck raised {type(outcome).__name__}: {outcome}", step.case)
    if outcome is None:
        return
    if not (isinstance(outcome, (list, tuple)) and len(outcome) == 2 and outcome[0] == "disagrees"
            and _short_text(outcome[1])):
        refuse(exercise, 'gradcheck (None or ["disagrees", its first line])')
    fail(exercise, f"torch.autograd.gradcheck disagrees: the gradients your backward returns are not the "
                   f"numerical derivatives of your forward ({outcome[1]}).", step.case)


def _function_run(cls: Any, case: Case) -> tuple[torch.Tensor, ...]:
    """The runner of a run of ``FlashAttention``: :func:`run_function` on ``case``'s arguments ``(q, k, v, do,
    causal, block_q, block_k)``."""
    return run_function(cls, *_clone(case.args))


def _function_kind(cls: Any, case: Case) -> bool:
    """The runner of the step ``kind``: whether ``cls`` is a class that subclasses ``torch.autograd.Function``."""
    return isinstance(cls, type) and issubclass(cls, torch.autograd.Function)


#: Where the kernel says what the student's FlashAttention is (a ``torch.autograd.Function`` or not).
_KIND = Case("what FlashAttention is", ("kind",))
#: The gradcheck case.
_GRADCHECK = ("gradcheck: float64 (1, 5, 3), block_q=2, block_k=3, causal", 1065)
#: The keys of the steps that are not a run on a case: what the class is, what forward keeps, gradcheck.
KIND, KEPT, GRADCHECK = "kind", "kept", "gradcheck"
#: The keys of the runs against SDPA and in bfloat16: the case's, after these.
SDPA = "sdpa: "


def _function_rungs() -> tuple[ladder.Rung, ...]:
    """FlashAttention's ladder (:mod:`course_utils.checks.ladder`): its glue, one feature at a time (the check runs
    it with the reference's forward and backward functions, so what is left is what the class passes and keeps)."""
    def r(shape: tuple, block_q: int, block_k: int, causal: bool, seed: int, adds: str, suspects: str) -> ladder.Rung:
        name = f"{tuple(shape)}, block_q={block_q}, block_k={block_k}, {'causal' if causal else 'causal=False'}"
        return ladder.Rung(Case(name, _inputs(*shape, seed=seed),
                                {"causal": causal, "block_q": block_q, "block_k": block_k}), adds, suspects)
    return (
        r((4, 4), 4, 4, False, 1100, "", "the glue itself: forward returns o alone and saves q, k, v, o and lse "
          "(ctx.save_for_backward), backward unpacks them in the order saved and calls the backward with (q, k, v, "
          "o, lse, do), returning dq, dk, dv and None for causal, block_q and block_k?"),
        r((4, 4), 4, 4, True, 1100, "causal=True", "the flag: causal passed on to the forward and to the backward "
          "(kept on ctx), each by keyword or in its own place?"),
        r((8, 4), 8, 4, False, 1101, "block_q != block_k", "the block sizes: block_q and block_k passed in the order "
          "each function takes them (kept on ctx for the backward)?"),
        r((2, 2, 7, 4), 2, 4, True, 1102, "batch, heads and a short last block", "shapes: nothing reshaped or "
          "flattened on the way, lse saved as (..., T)?"),
    )


FUNCTION_LADDER = ladder.Ladder(
    "FlashAttention", _function_rungs,
    lambda case: attention_with_grads(*case.args, case.kwargs["causal"]),
    lambda found: list(zip(("o", *GRADS), found)), atol=1e-8, rtol=1e-6, runner="ladder_function")


def _ladder_function_run(cls: Any, case: Case) -> tuple[torch.Tensor, ...]:
    """The runner of a rung of FlashAttention's ladder: :func:`run_function` on ``(q, k, v, do)`` and the case's
    ``causal``, ``block_q`` and ``block_k``."""
    kw = case.kwargs
    return run_function(cls, *_clone(case.args), kw["causal"], kw["block_q"], kw["block_k"])


def _function_plan(hidden: bool) -> list[Step]:
    """What the class is; each case run (forward and backward); what forward keeps; gradcheck; the runs
    against SDPA at T = 256; the bfloat16 run."""
    cases = with_hidden("FlashAttention", _function_cases)(hidden)
    gradcheck = Case(_GRADCHECK[0], (*_inputs(1, 5, 3, seed=_GRADCHECK[1]), True, 2, 3))
    return ([Step(KIND, _KIND, "kind")] + [Step(c.key(), c, "function") for c in cases]
            + [Step(KEPT, Case("what forward keeps", ("kept",)), "kept"), Step(GRADCHECK, gradcheck, "gradcheck")]
            + [Step(SDPA + c.key(), c, "function") for c in _sdpa_cases()]
            + [Step(HALF + c.key(), c, "function") for c in _half_cases()] + ladder.steps(FUNCTION_LADDER, hidden))


def _function_judge(plan: list[Step], outcomes: Outcomes) -> str:
    exercise = "FlashAttention"
    names = ("o", *GRADS)
    kind = outcomes[KIND]
    if type(kind) is not bool:
        refuse(exercise, "kind (True or False: whether it is a torch.autograd.Function)")
    if not kind:
        fail(exercise, "FlashAttention must be a class that subclasses torch.autograd.Function, with static "
                       "methods forward(ctx, q, k, v, causal, block_q, block_k) and backward(ctx, do)")
    cases = [s for s in plan if s.run == "function" and not s.key.startswith((SDPA, HALF))]
    ladder.record(FUNCTION_LADDER)
    for step in cases:
        case = step.case
        q, k, v, do = case.args[:4]
        want = expect(exercise, case.key(), lambda: attention_with_grads(q, k, v, do, case.args[4]))
        _record_mistakes(exercise, case)
        got = outcomes[step.key]
        if isinstance(got, BaseException):
            failed = raised(exercise, got, case)
            raise _hinted(failed, _function_diagnose(got if failed.student_error is not None else failed,
                                                     outcomes.student)
                          or ((symptoms.error_hint(got, _sizes_of(case))
                               or ladder.diagnose(FUNCTION_LADDER, outcomes, defer=1))
                              if failed.student_error is not None else None)) from None
        _same_dtype(exercise, case, got)
        _compare(exercise, case, got, want, names, atol=1e-8, rtol=1e-6,
                 smallest=lambda: ladder.diagnose(FUNCTION_LADDER, outcomes, defer=1))
    facts = _kept_of(exercise, outcomes, next(s for s in plan if s.key == KEPT))
    if isinstance(facts, BaseException):
        problem = f"your code raised {type(facts).__name__}: {facts}"
    else:
        problem = _kept_text(facts)
    if problem:
        fail(exercise, problem, Case("what forward keeps: (1, 2, 24, 4), block_q=block_k=8, causal"))
    _judge_gradcheck(exercise, outcomes, next(s for s in plan if s.key == GRADCHECK))
    for step in (s for s in plan if s.key.startswith(SDPA)):
        q, k, v, do = step.case.args[:4]
        want = attention_with_grads(q, k, v, do, step.case.args[4])  # PyTorch's kernel, run here
        _compare(exercise, step.case, outcome_of(exercise, outcomes, step), want, names, atol=1e-4, rtol=1e-3,
                 name_mistakes=False)
    for step in (s for s in plan if s.key.startswith(HALF)):
        _judge_half(exercise, step.case, outcomes[step.key], names)
    return (f"{len(cases)} cases agree with autograd in float64 ({'; '.join(s.case.name for s in cases)}); "
            f"forward keeps exactly q, k, v, o and lse; gradcheck passes; the gradients equal SDPA's "
            f"at T = 256 in float32, causal and not; and in bfloat16 the output and gradients are within "
            f"{HALF_ATOL:g} of float64 attention")


check_FlashAttention = declare(
    Spec("FlashAttention", _function_plan, _function_judge,
         {"kind": _function_kind, "function": _function_run, "kept": _kept_facts, "gradcheck": _gradcheck_run,
          "ladder_function": _ladder_function_run},
         helpers=lambda: helper_checks(globals(), "FlashAttention")),
    """Check ``FlashAttention``, a ``torch.autograd.Function``: ``apply(q, k, v, causal, block_q, block_k)``.

    Output and gradients against autograd's in float64; what its forward keeps for the backward;
    ``gradcheck``; gradients against SDPA's in float32 at ``T = 256``, causal and not; and a bfloat16 case.
    Runs with our ``attention_backward_reference`` and ``flash_attention_backward`` (:func:`modules.alone`).
    """)


# ------------------------------------------------------------------------------------------
# flash_attention_backward_triton
# ------------------------------------------------------------------------------------------
def kernel_case(name: str, shape: tuple, seed: int, causal: bool, block_m: int, block_n: int,
                scale: float = 1.0) -> Case:
    """A case of the kernel: ``(q, k, v, o, lse, do)`` in float32, ``causal``, ``block_m``, ``block_n``."""
    q, k, v, do = _inputs(*shape, seed=seed, scale=scale, dtype=torch.float32)
    o, lse = forward_statistics(q, k, v, causal)
    return Case(name, (q, k, v, o, lse, do), {"causal": causal, "block_m": block_m, "block_n": block_n})


def _triton_cases() -> list[Case]:
    return [
        kernel_case("(1, 1, 32, 16), causal, BLOCK_M=BLOCK_N=16", (1, 1, 32, 16), 1071, True, 16, 16),
        kernel_case("(2, 1, 20, 16), causal=False, BLOCK_M=BLOCK_N=16: T not a multiple of the blocks",
                    (2, 1, 20, 16), 1075, False, 16, 16),
    ]


def _triton_half_case() -> Case:
    """The kernel's half-precision launch: ``q``, ``k``, ``v``, ``o`` and ``do`` ``(1, 1, 32, 16)`` in float16, ``lse``
    in float32, as notebook 07's forward returns them. ``tl.dot`` takes two operands of one dtype, in Triton's
    interpreter as on a GPU: P and dS, float32 (lse and delta are), must be cast to the inputs' dtype first. float16,
    not bfloat16: the interpreter multiplies bfloat16 tiles as their raw 16-bit patterns, float16 ones as numbers."""
    q, k, v, do = (t.half() for t in _inputs(1, 1, 32, 16, seed=1113, dtype=torch.float32))
    o, lse = forward_statistics(*(t.float() for t in (q, k, v)), True)  # (1, 1, 32, 16), (1, 1, 32)
    return Case("float16 (1, 1, 32, 16), lse in float32, causal, BLOCK_M=BLOCK_N=16: against float64 attention",
                (q, k, v, o.half(), lse, do), {"causal": True, "block_m": 16, "block_n": 16})


def _kernel_half_hint(error: BaseException) -> str | None:
    """The hint for the kernel's float16 launch that raised: a ``tl.dot`` of a float32 and a float16 operand."""
    text = str(error)
    if "same dtype" in text or ("dot" in text and "dtype" in text):
        return ("the float32 launches run, the float16 one does not: tl.dot takes two operands of one dtype, and p = "
                "exp(s - lse) and ds are float32 (lse and delta are float32) while dO and q are in half precision. "
                "Cast them before each product, tl.dot(tl.trans(p).to(do.dtype), do) and tl.dot(tl.trans(ds).to("
                "q.dtype), q); the accumulators dk and dv stay float32.")
    return None


def _kernel_rungs() -> tuple[ladder.Rung, ...]:
    """The Triton backward's ladder (:mod:`course_utils.checks.ladder`): one tile, then one feature at a time; each
    launch tiny (16 is tl.dot's smallest tile), as the interpreter runs them on a CPU. A program is a key block."""
    def r(shape: tuple, block_m: int, block_n: int, causal: bool, seed: int, adds: str, suspects: str) -> ladder.Rung:
        name = f"{tuple(shape)}, {'causal' if causal else 'causal=False'}, BLOCK_M={block_m}, BLOCK_N={block_n}"
        return ladder.Rung(kernel_case(name, shape, seed, causal, block_m, block_n), adds, suspects)
    return (
        r((1, 1, 16, 16), 16, 16, False, 1095, "", "the work on one tile: the pointers (offsets times strides), "
          "P = exp(s * scale - lse), dv += P^T dO, dP = dO V^T, dS = P * (dP - delta), dk += dS^T Q * scale, and "
          "the stores of dk and dv?"),
        r((1, 1, 16, 16), 16, 16, True, 1095, "the causal mask", "the diagonal tile's mask: P = 0 where a key "
          "comes after its query (cols > offs_m, from the global offsets), and the query loop still reaching the "
          "diagonal tile when causal?"),
        r((1, 1, 32, 16), 16, 32, False, 1096, "a second query block", "the loop over query blocks: from lo up to "
          "T in steps of BLOCK_M, its query, dO, lse and delta pointers advanced, and dk and dv summed over every "
          "query block (not reset inside the loop)?"),
        r((1, 1, 32, 16), 16, 16, False, 1097, "a second key block (a second program)", "each program's key "
          "block: its rows offs_n = start_n * BLOCK_N + arange for k, v, dk and dv, and the query loop covering "
          "every query when not causal: from lo = 0 up to T, not stopping at its own key block?"),
        r((1, 1, 32, 16), 16, 16, True, 1097, "several blocks with the causal mask", "the query loop of a causal "
          "program: it starts at the query block that holds its first key (lo = start_n * BLOCK_N rounded down "
          "to BLOCK_M) and runs to T, not stopping at its own key block?"),
        r((1, 1, 20, 16), 16, 16, False, 1098, "a short last block (T not a multiple of the blocks)", "the rows and "
          "keys past T: loads masked with offs < T (other=0), P = 0 for queries past T, and stores masked?"),
        r((2, 2, 20, 16), 16, 16, True, 1099, "batch and heads > 1", "the program's (batch, head) offset: every "
          "pointer of Q, K, V, dO, dK, dV, lse and delta offset by bh with that tensor's stride?"),
    )


#: Compared at the GPU tolerance everywhere (every mistake is off by far more); no causal twins: causal and not
#: run different loop bounds, so a twin that is right does not mean the flag is misread.
KERNEL_LADDER = ladder.Ladder(
    "flash_attention_backward_triton", _kernel_rungs,
    lambda case: attention_with_grads(*case.args[:3], case.args[5], case.kwargs["causal"])[2:],
    lambda grads: list(zip(("dk", "dv"), grads)), atol=5e-3, rtol=5e-3, runner="launch",
    output=lambda found: found[0], twins=False, compiled_only=True)


def _kernel_judge(plan: list[Step], outcomes: Outcomes) -> str:
    exercise = "flash_attention_backward_triton"
    kernel_rules(exercise, outcomes)
    ladder.record(KERNEL_LADDER)
    devices = set()
    for step in plan:
        case = step.case
        q, k, v, o, lse, do = case.args
        if step.key.startswith(HALF):
            want = attention_with_grads(*(t.double() for t in (q, k, v, do)), case.kwargs["causal"])[2:]  # run here
            got, on_gpu = launch_outcome(exercise, outcomes, step, _kernel_half_hint)
            devices.add(on_gpu)
            _compare(exercise, case, got, want, ("dk", "dv"), atol=HALF_ATOL, rtol=HALF_RTOL, name_mistakes=False)
            continue
        want = expect(exercise, case.key(), lambda: attention_with_grads(q, k, v, do, case.kwargs["causal"])[2:])
        _record_mistakes(exercise, case)
        got, on_gpu = launch_outcome(exercise, outcomes, step,
                                     lambda error: symptoms.error_hint(error, _sizes_of(case))
                                     or ladder.diagnose(KERNEL_LADDER, outcomes))
        devices.add(on_gpu)
        atol, rtol = (5e-3, 5e-3) if on_gpu else (1e-5, 1e-4)
        _compare(exercise, case, got, want, ("dk", "dv"), atol=atol, rtol=rtol,
                 smallest=lambda: ladder.diagnose(KERNEL_LADDER, outcomes, defer=1))
    return (f"{len(plan)} launches agree with autograd (dk and dv), the float16 one within {HALF_ATOL:g} of float64 "
            f"attention, {launched_on(devices)} "
            f"({'; '.join(s.case.name for s in plan)})")


def _triton_run(kernel: Any, case: Case) -> list:
    """The runner of a launch: ``[(dk, dv), device]`` of ``kernel`` launched on ``case`` with
    :func:`course_utils.backward.launch_backward` (on the GPU where there is one: ``"gpu"``, else ``"cpu"``),
    the gradients on the CPU. Raises what the launch raised."""
    from course_utils.backward import launch_backward

    on_gpu = torch.cuda.is_available()
    args = tuple(a.cuda() if on_gpu else a for a in _clone(case.args))
    dk, dv = launch_backward(kernel, *args, **case.kwargs)
    return [(dk.cpu(), dv.cpu()), "gpu" if on_gpu else "cpu"]


check_flash_attention_backward_triton = declare(
    KernelSpec("flash_attention_backward_triton",
               lambda hidden: [Step(c.key(), c, "launch")
                               for c in with_hidden("flash_attention_backward_triton", _triton_cases)(hidden)]
               + [Step(HALF + _triton_half_case().key(), _triton_half_case(), "launch")]
               + ladder.steps(KERNEL_LADDER, hidden),
               _kernel_judge, {"launch": _triton_run}),
    """Check the Triton kernel ``flash_attention_backward_triton`` (``dk`` and ``dv``), launched with
    :func:`course_utils.backward.launch_backward`, against autograd's gradients.

    On a CPU it runs in Triton's interpreter (float32, tolerance 1e-5); on a GPU it is compiled and
    float32 products use TF32 tensor cores (tolerance 5e-3); one launch in float16, within 1e-2 of float64
    attention, needs p and dS cast before ``tl.dot``. Where Triton is not installed the
    self-check is skipped with the reason; the grader always has Triton.
    """)
