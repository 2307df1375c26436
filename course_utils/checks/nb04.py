"""Self-checks for notebook 04: causal masks, masked attention weights and ``CausalAttention``.

Besides comparing values with the expected ones, the checks look for the usual mistakes and name
them: a mask that covers the diagonal or the past, weights that do not sum to one, a missing or
wrong scale, a mask that is a plain attribute instead of a buffer, a mask not cut to the input's
length, dropout in the wrong place or still active in ``eval()`` mode. Every diagnosis here reads
symptoms off the student's output and the expected one; the module checks shared with notebooks 05
and 06 live in :mod:`course_utils.checks.modules`.

Each check is a spec (:mod:`course_utils.checks.spec`): the calls of ``causal_mask`` (whose outputs its
dtype pass reads too), those of ``causal_attention_weights`` and its call on the meta device, and for
``CausalAttention`` one probed construction per set of constructor arguments, with every forward pass its
checks make (:mod:`course_utils.checks.probed`), judged by the same code in the kernel and, under the
grader, outside.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from course_utils.checks import expected as _expected
from course_utils.checks import probed, spec
from course_utils.checks.core import (
    Case,
    CheckFailed,
    describe_shape,
    expect,
    explain,
    fail,
    hidden_cases,
    name_factor,
    rand,
    reference_output,
    tensor_difference,
)
from course_utils.checks.modules import helper_checks
from course_utils.checks.probe import Probe
from course_utils.data import book_batch, book_inputs
from course_utils.device import manual_seed

__all__ = ["check_causal_mask", "check_causal_attention_weights", "check_CausalAttention"]

#: The other exercises of this notebook an exercise's answer may call, by the names the notebook gives
#: them: its checks run with the reference's versions (:func:`modules.alone`), so that a wrong helper
#: costs only the helper's points.
HELPERS = {"causal_attention_weights": ("causal_mask",),
           "CausalAttention": ("causal_mask", "causal_attention_weights")}


def _at(index) -> str:
    return "[" + ", ".join(str(int(i)) for i in index) + "]"


# ------------------------------------------------------------------------------------------
# causal_mask
# ------------------------------------------------------------------------------------------
def _mask_diagnosis(case: Case, got: object, want: object) -> str | None:
    """Name what is wrong with a causal mask by comparing its entries with the expected mask."""
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        return None
    T = want.shape[-1]
    if tuple(got.shape) != tuple(want.shape):
        if got.numel() == want.numel():
            return f"return the ({T}, {T}) mask itself, without extra dimensions (yours has shape {tuple(got.shape)})."
        return (f"your mask has shape {tuple(got.shape)} for num_tokens={T}: build it from num_tokens, "
                f"shape (num_tokens, num_tokens), not for a fixed size.")
    found = [hint for hint in (_mask_entries(got.detach().cpu() != 0, want.detach().cpu().bool()),
                               _mask_dtype(got, want)) if hint]
    return " ".join(found) or None


def _mask_dtype(got: torch.Tensor, want: torch.Tensor) -> str | None:
    if got.dtype == want.dtype:
        return None
    return (f"The mask must have dtype {want.dtype}, yours is {got.dtype}: `masked_fill` needs a boolean mask, "
            f"True where a score is hidden (build it with dtype=torch.bool, or add `.bool()`).")


def _mask_entries(masked: torch.Tensor, future: torch.Tensor) -> str | None:
    """What the True entries of ``masked`` get wrong, compared with the expected mask ``future``."""
    T = future.shape[-1]
    past = future.mT
    diagonal = ~(future | past)
    if T > 1 and masked[past].all() and not masked[future].any():
        also = " and the diagonal" if masked[diagonal].any() else ""
        return (f"the meaning is inverted: your mask marks the past (below the diagonal){also}, but True must mark "
                f"the FUTURE (above the diagonal, j > i), the positions a token may NOT attend to: triu, not tril.")
    if masked[diagonal].any():
        i = int(masked[diagonal].nonzero()[0])
        return (f"the diagonal is masked: entry [{i}, {i}] is True, but a token must see itself. "
                f"Use triu with diagonal=1.")
    missing = (future & ~masked).nonzero()
    if len(missing):
        i, j = missing[0].tolist()
        return f"position {i} sees token {j}: entry [{i}, {j}] must be True because {j} > {i} is in the future."
    extra = (past & masked).nonzero()
    if len(extra):
        i, j = extra[0].tolist()
        return f"position {i} cannot see the earlier token {j}: entry [{i}, {j}] must be False (only j > i is masked)."
    return None


def _mask_cases() -> list[Case]:
    return [Case(f"num_tokens={T}", (T,)) for T in (6, 1, 4)]


def _mask_judge(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    """The values first (a 0/1 mask reads as booleans there), then the dtype: masked_fill needs it too."""
    exercise = "causal_mask"
    spec.compare_outcomes(exercise, plan, outcomes, diagnose=_mask_diagnosis)
    for step in plan:
        case = step.case
        want = expect(exercise, case.key(), lambda: _expected.reference(exercise)(*case.args))
        got = outcomes[step.key]
        if got.dtype != want.dtype:
            message = _mask_dtype(got, want)
            fail(exercise, message[0].lower() + message[1:], case)
    return (f"{len(plan)} sizes give a boolean mask, True exactly above the diagonal "
            f"({'; '.join(s.case.name for s in plan)})")


_mask_cases_all = spec.with_hidden("causal_mask", _mask_cases)

check_causal_mask = spec.declare(
    spec.Spec("causal_mask", lambda hidden: spec.calls(_mask_cases_all(hidden)), _mask_judge),
    """Check ``causal_mask(num_tokens)``: bool ``(T, T)``, True exactly where ``j > i``.""")


# ------------------------------------------------------------------------------------------
# causal_attention_weights
# ------------------------------------------------------------------------------------------
def _book_queries_keys() -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys ``(6, 2)`` of the book's ``SelfAttention_v2(3, 2)`` built after seed 789."""
    def compute() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.random.fork_rng(devices=[]):
            manual_seed(789)
            sa = _expected.reference("SelfAttention_v2")(3, 2)
        x = book_inputs()
        with torch.no_grad():
            return sa.W_query(x), sa.W_key(x)

    queries, keys = expect("causal_attention_weights", "book queries and keys: SelfAttention_v2(3, 2), seed 789",
                           compute)
    return queries.clone(), keys.clone()


def _score_factor(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """``a`` when ``got`` is the softmax of ``a`` times the scores that give ``want`` (same mask).

    Within a row, ``log w_ij - log w_ik`` is the difference of two scores times the scale, so the
    ratio of these differences between two outputs is the ratio of their scales, the same
    everywhere. Weights that are 0 in ``got`` only are allowed when ``a > 1``: larger scores make
    small weights underflow to 0.
    """
    seen = want > 1e-30
    if bool(((got > 1e-30) & ~seen).any()):
        return None
    top = got.argmax(-1, keepdim=True)  # a column every row of ``got`` sees
    lg, lw = got.clamp_min(1e-300).log(), want.clamp_min(1e-300).log()
    dg, dw = lg - lg.gather(-1, top), lw - lw.gather(-1, top)
    use = seen & (got > 1e-30) & (dw.abs() > 1e-3)
    if int(use.sum()) < 2:
        return None
    ratio = dg[use] / dw[use]
    factor = float(ratio.median())
    if not torch.allclose(ratio, torch.full_like(ratio, factor), rtol=2e-3, atol=1e-4) or abs(factor - 1) < 1e-3:
        return None
    if factor < 1 and not torch.equal(seen, got > 1e-30):
        return None
    return factor


def _scale_hint(factor: float, T: int, d_k: int) -> str:
    named = [
        (math.sqrt(d_k), "the scores are not scaled: divide them by sqrt(d_k) (d_k = keys.shape[-1]) before the "
                         "softmax."),
        (1 / math.sqrt(d_k), "the scores are divided by d_k instead of sqrt(d_k): divide them by keys.shape[-1] ** 0.5."),
        (d_k, "the scores are multiplied by sqrt(d_k) instead of divided by it."),
        (math.sqrt(d_k / T), "the scores are divided by sqrt(T), the number of tokens; divide by sqrt(d_k), "
                             "d_k = keys.shape[-1]."),
    ]
    for value, hint in named:
        if math.isclose(factor, value, rel_tol=2e-3):
            return hint
    return (f"the scores reaching the softmax are {factor:.4g}{name_factor(factor)} times the expected ones: divide "
            f"queries @ keys^T by sqrt(d_k) = sqrt({d_k}) (d_k = keys.shape[-1]), once, and nothing else.")


def _weights_diagnosis(case: Case, got: object, want: object) -> str | None:
    """Name the mistake behind wrong causal attention weights from its symptoms (NaN first)."""
    queries, keys = case.args
    if isinstance(got, BaseException):
        if queries.dim() > 2:
            return (f"your code fails on inputs with batch dimensions (queries of shape {tuple(queries.shape)}): "
                    f"write it for any number of leading dimensions: keys.transpose(-2, -1) swaps the last two "
                    f"(keys.T reverses them all), and sizes are read from the end (queries.shape[-2]).")
        return None
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor) or got.shape != want.shape:
        return None
    g = got.detach().to("cpu", torch.float64)
    w = want.detach().to("cpu", torch.float64)
    T, d_k = w.shape[-1], keys.shape[-1]
    diagonal = g.diagonal(0, -2, -1)
    nan = torch.isnan(g)
    if nan.any():
        rows = sorted({int(i) for i in nan.nonzero()[:, -2]})
        if rows == [0]:
            if T > 1 and bool((diagonal[..., 1:] == 0).all()):
                return ("row 0 is NaN and every other row gives its own token a weight of 0: the diagonal is masked. "
                        "Token 0 may see only itself, so its row of scores is all -inf and the softmax divides 0 by 0. "
                        "Mask only j > i (triu with diagonal=1).")
            return ("row 0 is NaN: token 0 may see only itself, so when its own score is masked (the diagonal) the "
                    "softmax divides 0 by 0. Mask only j > i (triu with diagonal=1).")
        if T > 1 and rows == [T - 1]:
            return (f"row {T - 1} is NaN: the last token may see every token, yet all its scores are masked. True in "
                    f"the mask must mark only the future (j > i), not the past and the diagonal.")
        return (f"the weights hold NaN in rows {rows[:8]}: a softmax over a row whose scores are all -inf (every "
                f"key masked), or that overflowed, divides 0 by 0.")
    inf = torch.isinf(g)
    if inf.any():
        idx = inf.nonzero()[0].tolist()
        if bool((w[inf] == 0).all()):
            return (f"weight {_at(idx)} is {g[tuple(idx)].item():g} where 0 was expected: -inf belongs in the scores "
                    f"before the softmax (which turns it into a weight of 0), not in the weights after it.")
        return f"weight {_at(idx)} is {g[tuple(idx)].item():g}: weights come out of a softmax and lie between 0 and 1."
    if bool((g < -1e-6).any()):
        idx = (g < -1e-6).nonzero()[0].tolist()
        return (f"weight {_at(idx)} is negative ({g[tuple(idx)].item():.4g}): weights come out of a softmax and lie "
                f"between 0 and 1.")
    future = [t for t in (w == 0).nonzero().tolist() if t[-1] > t[-2]]
    leaks = [t for t in future if abs(g[tuple(t)].item()) > 1e-6]
    if leaks:
        past = [t for t in (w > 1e-12).nonzero().tolist() if t[-1] < t[-2]]
        if past and all(g[tuple(t)].item() == 0 for t in past):
            return ("the weights of the past (j < i) are 0 and those of the future (j > i) are not: the mask is "
                    "inverted. True must mark the future: triu with diagonal=1, not tril.")
        if {t[-2] for t in leaks} == {0} and T > 1 and bool((diagonal[..., 1:] == 0).all()):
            return ("every row gives its own token a weight of 0, and row 0 spreads its weight over the future: the "
                    "diagonal is masked. A token must see itself: mask only j > i (triu with diagonal=1).")
        if len(leaks) == len(future):
            if T > 2 and _future_equal_in_rows(g, future):
                return ("every weight above the diagonal is non-zero and the same within its row, the weight of a "
                        "score of 0 (exp(0) = 1): the masked entries reach a softmax as 0, not -inf. Fill the "
                        "masked scores with -inf, and apply the softmax once, after masking.")
            return ("no weight above the diagonal is 0: the future is not masked. Fill the scores where j > i with "
                    "-inf before the softmax.")
        t = leaks[0]
        return (f"position {t[-2]} sees token {t[-1]}: weight {_at(t)} is {g[tuple(t)].item():.4g}, but weights "
                f"above the diagonal (j > i) must be 0.")
    sums = g.sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
        return _sums_diagnosis(g, w, sums, d_k)
    factor = _score_factor(g, w)
    if factor is not None:
        return _scale_hint(factor, T, d_k)
    hidden_past = ((w > 1e-6) & (g.abs() <= 1e-12)).nonzero()
    if len(hidden_past):
        t = hidden_past[0].tolist()
        return (f"weight {_at(t)} is 0, but position {t[-2]} may see token {t[-1]} (j <= i): only the future, "
                f"j > i, is masked.")
    return None


def _future_equal_in_rows(g: torch.Tensor, future: list) -> bool:
    """Whether, in every row, the weights above the diagonal are all equal."""
    rows: dict = {}
    for t in future:
        rows.setdefault(tuple(t[:-1]), []).append(g[tuple(t)].item())
    return all(math.isclose(v, values[0], rel_tol=1e-5, abs_tol=1e-12) for values in rows.values() for v in values)


def _sums_diagnosis(g: torch.Tensor, w: torch.Tensor, sums: torch.Tensor, d_k: int) -> str:
    """Rows of weights that do not sum to 1: say how they relate to the expected ones."""
    ones = torch.ones_like(sums)
    if torch.allclose(g.sum(-2), ones, atol=1e-4):
        return ("the columns sum to 1, not the rows: the softmax runs over the queries (dim=-2); take it over the "
                "keys, dim=-1.")
    r = list(torch.unravel_index((sums - 1).abs().argmax(), sums.shape))
    worst = f"row {_at(r)} sums to {sums[tuple(r)].item():.4f}"
    if not bool((sums > 0).all()):
        return f"{worst}: each row of weights must sum to 1 (a softmax over the last dimension, the keys)."
    normalised = g / sums.unsqueeze(-1)
    proportional = tensor_difference(w, normalised) is None
    factor = None if proportional else _score_factor(normalised, w)
    c = float(sums.mean())
    if torch.allclose(sums, torch.full_like(sums, c), rtol=1e-4) and (proportional or factor is not None):
        if math.isclose(c, 1 / math.sqrt(d_k), rel_tol=1e-3) and (proportional or
                                                                 math.isclose(factor, math.sqrt(d_k), rel_tol=2e-3)):
            return (f"every row sums to {c:.4g} = 1/sqrt(d_k) instead of 1: the weights are divided by sqrt(d_k) "
                    f"after the softmax (the softmax came too early). Divide the scores by sqrt(d_k) before the "
                    f"softmax.")
        after = (f"every weight is {c:.4g}{name_factor(c)} times what it should be, so each row sums to {c:.4g}: a "
                 f"factor is applied after the softmax. Scale the scores before it, the weights not at all.")
        return after if proportional else f"{after} Besides, {_scale_hint(factor, g.shape[-1], d_k)}"
    if proportional:
        return (f"{worst}, not 1, though each row is proportional to the expected one. If you zero the future "
                f"after the softmax, renormalise each row (divide it by its sum); simpler: mask the scores with "
                f"-inf before the softmax.")
    return f"{worst}: each row of weights must sum to 1 (a softmax over the last dimension, the keys)."


def _weights_cases() -> list[Case]:
    q, k = _book_queries_keys()
    return [
        Case("book: SelfAttention_v2 with seed 789, (6, 2)", (q, k)),
        Case("T=5, d_k=4, random", (rand(5, 4, seed=41, low=-2, high=2), rand(5, 4, seed=42, low=-2, high=2))),
    ]


#: The step of the call on the meta device: ``(T, d_k)`` inputs there (this tests devices only; batch
#: dimensions are the other cases' job).
_ON_META = spec.Step("inputs on the meta device", Case("inputs on the meta device", (5, 4)), "meta")


def _on_meta(fn: Callable, case: Case) -> object:
    """``fn(queries, keys)`` on empty ``(T, d_k)`` inputs on the meta device: what it returned."""
    T, d_k = case.args
    return fn(torch.empty(T, d_k, device="meta"), torch.empty(T, d_k, device="meta"))


def follows_device(exercise: str, got: object) -> None:
    """Fail unless the call on the meta device (``got``: its output, or what it raised) worked there.

    PyTorch's ``meta`` device stands in for a GPU: tensors there have shapes but no data, and
    mixing them with a CPU tensor raises, just as mixing CUDA and CPU tensors does.
    """
    if isinstance(got, NotImplementedError):
        return  # an operation with no meta kernel says nothing about devices
    if isinstance(got, BaseException):
        fail(exercise, f"inputs on another device (here 'meta', standing in for a GPU) raised "
                       f"{type(got).__name__}: {got}. Build the mask on the scores' device: "
                       f"torch.ones(T, T, dtype=torch.bool, device=scores.device).triu(1), or move a mask you already have "
                       f"with .to(scores.device)")
    if isinstance(got, torch.Tensor) and got.device.type != "meta":
        fail(exercise, f"inputs on device 'meta' gave an output on {got.device}: keep every tensor on the inputs' device")


def _weights_judge(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    exercise = "causal_attention_weights"
    text = spec.compare_outcomes(exercise, plan, outcomes, diagnose=_weights_diagnosis)
    follows_device(exercise, outcomes[_ON_META.key])
    return text


_weights_cases_all = spec.with_hidden("causal_attention_weights", _weights_cases)

check_causal_attention_weights = spec.declare(spec.Spec(
    "causal_attention_weights", lambda hidden: spec.calls(_weights_cases_all(hidden)) + [_ON_META], _weights_judge,
    runners={"meta": _on_meta}, helpers=lambda: helper_checks(globals(), "causal_attention_weights")),
    """Check ``causal_attention_weights(queries, keys)`` -> ``(..., T, T)`` scaled, masked, softmaxed, also on
    inputs on another device. Runs with our ``causal_mask`` (:func:`modules.alone`).""")


# ------------------------------------------------------------------------------------------
# CausalAttention
# ------------------------------------------------------------------------------------------
def _module_diagnosis(case: Case, got: object, want: object) -> str | None:
    """Symptoms of a wrong ``CausalAttention`` output that its shape alone shows."""
    if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.dim() == want.dim() == 3 and \
            got.shape[:-1] == want.shape[:-1] and got.shape[-1] == got.shape[-2] != want.shape[-1]:
        return (f"your output has shape {tuple(got.shape)}, (b, T, T): attention weights. Return the context "
                f"vectors, attn_weights @ values, of shape (b, T, d_out).")
    return None


def _known_mistake_first(exercise: str, view: spec.ModuleView, config: tuple) -> None:
    """Fail now if an ``eval()`` output of the first construction shows a known mistake.

    The structural checks that come next (buffer, causality, dropout) see only a symptom: a
    softmax over the wrong dimension, or the future zeroed after the softmax, looks to them like
    a leak of the future. The outputs name the mistake itself; any other difference is left to
    those checks and to the value comparison.
    """
    build, cases = config
    try:
        probed.built(exercise, view, build)
    except CheckFailed:
        return  # the full check says why
    for case in cases:
        mcase = Case(case.name, case.args, case.kwargs, build=build, mode="eval")
        want = reference_output(exercise, mcase)
        got = view.forward("eval", 7, case.args[0])
        if isinstance(got, BaseException):
            return  # the full check explains errors
        problem = tensor_difference(want, got)
        if problem is None:
            continue
        hint = explain(exercise, mcase, got, want, _module_diagnosis)
        if hint:
            ending = "" if problem.endswith((".", "?", "!")) else "."
            fail(exercise, f"{problem}{ending} Input shape {describe_shape(case.args[0])}. Hint: {hint}",
                 Case(f"{case.name}, eval() mode, built with {build}"))
    _check_rows_sum_to_one(exercise, view, build)


def _identical_tokens(build: tuple) -> torch.Tensor:
    """``(1, T, d_in)``: one token repeated ``T = context_length`` times."""
    d_in, T = build[0], build[2]
    return rand(1, 1, d_in, seed=71).expand(1, T, d_in).clone()


def _check_rows_sum_to_one(exercise: str, view: spec.ModuleView, build: tuple) -> None:
    """With ``T`` copies of one token every value vector is the same, so every position must output
    that vector whatever its weights, provided each row of weights sums to 1."""
    T = build[2]
    out = view.forward("eval", 7, _identical_tokens(build))
    if not isinstance(out, torch.Tensor) or out.dim() != 3 or out.shape[:2] != (1, T) or \
            not bool(torch.isfinite(out).all()):
        return  # an error, or an output the full check explains
    out = out.detach()[0].to(torch.float64)
    last = out[-1]
    if float(last.norm()) < 1e-6:
        return
    c = out @ last / (last @ last)
    if float((out - c[:, None] * last).abs().max()) > 1e-5 * (1 + float(last.abs().max())) or \
            torch.allclose(c, torch.ones_like(c), atol=1e-4):
        return
    i = int((c - 1).abs().argmax())
    why = ""
    if torch.allclose(c, torch.arange(1, T + 1, dtype=c.dtype) / T, atol=1e-4):
        why = (f" That is (i + 1)/{T}: a softmax over all {T} tokens whose future is zeroed afterwards, without "
               f"renormalising.")
    fail(exercise, f"built with {build}, {T} identical tokens: every position must output the same vector (all "
                   f"values are equal, and each row of weights sums to 1), but position {i} gives {c[i].item():.4f} "
                   f"times the output of position {T - 1}: the rows of your attention weights do not all sum to 1."
                   f"{why} Mask the scores with -inf before the softmax over the keys (or renormalise each row: "
                   f"divide it by its sum).")


def _ca_configs() -> list[tuple[tuple, list[Case]]]:
    batch = book_batch()
    return [
        ((3, 2, 6, 0.5), [Case("book batch (2, 6, 3)", (batch,)), Case("T=4 < context_length", (rand(2, 4, 3, seed=61),))]),
        ((3, 2, 6, 0.0), [Case("book batch (2, 6, 3)", (batch,))]),
    ]


def _ca_hidden(hidden: bool) -> dict:
    """The hidden groups: ``configs`` (more constructions compared) and ``causal`` (cases built with their
    own arguments, checked for a mask buffer, a finite output and causality)."""
    return hidden_cases("CausalAttention") if hidden else {"configs": [], "causal": []}


def _ca_plan(hidden: bool) -> list[spec.Step]:
    configs, more = _ca_configs(), _ca_hidden(hidden)
    build, cases = configs[0]  # _known_mistake_first's passes first
    first = [Probe("eval", 7, case.args[0]) for case in cases] + [Probe("eval", 7, _identical_tokens(build))]
    return probed.steps(probed.module_class_plan(configs + more["configs"], first, more["causal"]))


def _ca_judge(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    exercise = "CausalAttention"
    views = probed.views(exercise, plan, outcomes)
    configs, more = _ca_configs(), _ca_hidden(outcomes.hidden)
    _known_mistake_first(exercise, views[configs[0][0]], configs[0])
    text = probed.module_class(exercise, views, configs + more["configs"], diagnose=_module_diagnosis)
    for case in more["causal"]:
        where = f"built with {case.build}"
        probed.built(exercise, views[case.build], case.build)
        probed.mask_buffer(exercise, views[case.build], case.build[2], where)
        probed.finite(exercise, views[case.build], case.args[0], where)
        probed.causal_module(exercise, views[case.build], case.args[0])
    return text


check_CausalAttention = spec.declare(spec.Spec(
    "CausalAttention", _ca_plan, _ca_judge, runners={spec.MODULE: spec.run_module},
    helpers=lambda: helper_checks(globals(), "CausalAttention")),
    """Check ``CausalAttention(d_in, d_out, context_length, dropout, qkv_bias=False)``. Runs with our
    ``causal_mask`` and ``causal_attention_weights`` (:func:`modules.alone`).""")
