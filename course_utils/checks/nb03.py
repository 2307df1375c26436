"""Self-checks for notebook 03: scaled dot-product attention and trainable self-attention.

When an output differs, the checks recompute the usual mistakes (no scaling, scaling by ``d_k``
instead of ``sqrt(d_k)``, softmax over the wrong dimension, parameters created in the wrong order,
an untransposed ``nn.Linear`` weight) and name the one that matches.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn

from course_utils import reference
from course_utils.checks.core import (
    Case,
    CheckFailed,
    check_rules,
    compare_module,
    compare_function,
    describe_shape,
    fail,
    passed,
    rand,
    require_callable,
    tensor_difference,
)
from course_utils.data import book_batch, book_inputs

__all__ = [
    "check_scaled_dot_product_attention",
    "check_SelfAttention_v1",
    "check_SelfAttention_v2",
    "check_copy_v2_weights_to_v1",
]

_NAMES = ("W_query", "W_key", "W_value")
_TRANSPOSE_BATCH_HINT = ("`.T` reverses every dimension, so it breaks as soon as there is a batch dimension: "
                         "use keys.transpose(-2, -1) (or keys.mT) to swap only the last two.")


def _close(a: torch.Tensor, b: object) -> bool:
    return isinstance(b, torch.Tensor) and tensor_difference(a, b) is None


def attention_hint(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, got: object,
                   d_in: int | None = None) -> str | None:
    """Name the mistake that turns ``(queries, keys, values)`` into ``got`` instead of attention, if known.

    Args:
        queries, keys, values: ``(..., Tq, dk)``, ``(..., Tk, dk)``, ``(..., Tk, dv)`` as the reference sees them.
        got: the student's output, or the exception the student's code raised.
        d_in: the module's input size, to recognise scaling by ``sqrt(d_in)`` inside a module.
    """
    if isinstance(got, Exception):
        if keys.dim() > 2:
            return _TRANSPOSE_BATCH_HINT
        return None
    if not isinstance(got, torch.Tensor):
        return None
    expected_shape = (*queries.shape[:-1], values.shape[-1])
    if tuple(got.shape) != expected_shape:
        if keys.dim() > 2:
            return _TRANSPOSE_BATCH_HINT
        return None
    d_k, d_v, T_k = keys.shape[-1], values.shape[-1], keys.shape[-2]
    scores = queries @ keys.transpose(-2, -1)  # (..., Tq, Tk)

    def attend(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return torch.softmax(s, dim=dim) @ values

    variants = [
        (attend(scores), "the scores were not scaled: divide them by sqrt(d_k) before the softmax."),
        (attend(scores / d_k), "the scores were divided by d_k; divide by sqrt(d_k) = d_k ** 0.5."),
        (attend(scores * math.sqrt(d_k)), "the scores were multiplied by sqrt(d_k); divide by it."),
        (torch.softmax(scores, dim=-1) / math.sqrt(d_k) @ values,
         "the division by sqrt(d_k) came after the softmax; scale the scores before the softmax."),
        (attend(scores / math.sqrt(d_k), dim=-2) if scores.shape[-2] > 1 else None,
         "the softmax ran over dim=-2: each query's row of weights (dim=-1) must sum to 1."),
        (attend(scores / math.sqrt(d_v)) if d_v != d_k else None,
         "the scores were divided by sqrt of the values' size. d_k is the size of the keys: keys.shape[-1]."),
        (attend(scores / math.sqrt(T_k)) if T_k != d_k else None,
         "the scores were divided by sqrt(number of tokens). For a 2-D tensor keys.shape[0] is the number of "
         "tokens; d_k is keys.shape[-1]."),
        (attend(scores / math.sqrt(d_in)) if d_in is not None and d_in != d_k else None,
         "the scores were divided by sqrt(d_in). d_k is the size of the projected keys (d_out): keys.shape[-1]."),
        (attend((keys @ queries.transpose(-2, -1)) / math.sqrt(d_k)) if keys.shape[-2] == queries.shape[-2] else None,
         "queries and keys are swapped: scores = queries @ keys^T, row i for query i."),
    ]
    for value, hint in variants:
        if value is not None and _close(value, got):
            return hint
    return None


# --------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# --------------------------------------------------------------------------------------------
def _qkv(Tq: int, Tk: int, dk: int, dv: int, *batch: int, seed: int, scale: float = 1.0) -> tuple:
    return (rand(*batch, Tq, dk, seed=seed) * scale, rand(*batch, Tk, dk, seed=seed + 1) * scale,
            rand(*batch, Tk, dv, seed=seed + 2))


def _sdpa_diagnose(case: Case, got: object) -> str | None:
    return attention_hint(*case.args, got)


def check_scaled_dot_product_attention(scaled_dot_product_attention: Callable, hidden: bool = False) -> None:
    """Compare ``scaled_dot_product_attention(queries, keys, values)`` with the reference."""
    cases = [
        Case("self-attention, T=6, d_k=d_v=2", _qkv(6, 6, 2, 2, seed=51, scale=2.0)),
        Case("T=5, d_k=4, d_v=3", _qkv(5, 5, 4, 3, seed=54, scale=2.0)),
    ]
    if hidden:
        cases += [
            Case("Tq=3 queries, Tk=5 keys, d_k=4, d_v=6", _qkv(3, 5, 4, 6, seed=57, scale=2.0)),
            Case("batch of 2, Tq=4, Tk=7, d_k=8, d_v=5", _qkv(4, 7, 8, 5, 2, seed=60, scale=2.0)),
            Case("two batch dims (2, 3), T=5, d_k=16", _qkv(5, 5, 16, 16, 2, 3, seed=63)),
            Case("d_k=64 and one query", _qkv(1, 6, 64, 4, seed=66)),
            Case("Tq=6 queries, Tk=2 keys", _qkv(6, 2, 3, 3, seed=69, scale=3.0)),
        ]
    compare_function("scaled_dot_product_attention", scaled_dot_product_attention,
                     reference.scaled_dot_product_attention, cases, diagnose=_sdpa_diagnose)


# --------------------------------------------------------------------------------------------
# SelfAttention_v1 and SelfAttention_v2
# --------------------------------------------------------------------------------------------
def _weight(module: nn.Module, name: str) -> torch.Tensor | None:
    """The matrix behind ``module.<name>``: a Parameter itself, or an ``nn.Linear``'s weight."""
    obj = getattr(module, name, None)
    if isinstance(obj, nn.Linear):
        return obj.weight
    return obj if isinstance(obj, torch.Tensor) else None


def _order_hint(student: nn.Module, ref: nn.Module, how: str) -> str | None:
    """A hint if the student's W_query/W_key/W_value hold the reference's numbers in another order."""
    stu = {n: _weight(student, n) for n in _NAMES}
    ref_w = {n: _weight(ref, n) for n in _NAMES}
    if any(t is None for t in stu.values()):
        missing = [n for n, t in stu.items() if t is None]
        return f"the module has no {', '.join(missing)}: name the three projections W_query, W_key and W_value."
    for name in _NAMES:
        if stu[name].shape != ref_w[name].shape:
            return None
        if torch.equal(stu[name].detach(), ref_w[name].detach()):
            continue
        for other in _NAMES:
            if torch.equal(stu[name].detach(), ref_w[other].detach()):
                return (f"your {name} holds the numbers the reference puts in {other}: create the three "
                        f"projections in the order W_query, W_key, W_value (with a fixed seed, the order of "
                        f"creation decides which random numbers each one gets).")
        return f"your {name} is not initialised like the reference: {how}."
    return None


def _module_diagnose(student_cls: Callable, reference_cls: Callable, project: Callable, how: str,
                     shape_hint: str, error_hint: str | None = None):
    """A ``diagnose(args, case)`` for a self-attention class; ``project(module, x)`` gives its q, k, v.

    ``shape_hint`` is said when the parameters have the reference's shapes transposed;
    ``error_hint`` when the forward pass of a 2-D input raises a shape error.
    """

    def diagnose(args: tuple, case: Case) -> str | None:
        torch.manual_seed(123)
        ref = reference_cls(*args)
        torch.manual_seed(123)
        student = student_cls(*args)
        ref_shapes = [tuple(p.shape) for p in ref.parameters()]
        stu_shapes = [tuple(p.shape) for p in student.parameters()]
        if ref_shapes != stu_shapes:
            if len(ref_shapes) > len(stu_shapes) and any(len(s) == 1 for s in ref_shapes):
                return ("with qkv_bias=True each nn.Linear needs a bias: pass bias=qkv_bias "
                        "to nn.Linear instead of a fixed value.")
            if len(stu_shapes) > len(ref_shapes) and any(len(s) == 1 for s in stu_shapes):
                return ("nn.Linear has a bias unless told otherwise (bias=True is its default): pass "
                        "bias=qkv_bias, so that qkv_bias=False gives no bias.")
            if stu_shapes == [tuple(reversed(s)) for s in ref_shapes]:
                return shape_hint
            return None
        order = _order_hint(student, ref, how)
        if order:
            return order
        x = case.args[0]
        try:
            got = student(x.clone())
        except Exception as exc:  # noqa: BLE001
            if x.dim() == 2 and error_hint and ("shape" in str(exc) or "size" in str(exc)):
                return error_hint
            got = exc
        with torch.no_grad():
            q, k, v = project(ref, x)
            return attention_hint(q, k, v, got if isinstance(got, Exception) else got.detach(), d_in=args[0])

    return diagnose


def _v1_configs(hidden: bool) -> list[tuple[tuple, list[Case]]]:
    configs = [
        ((3, 2), [Case("book sentence (6, 3)", (book_inputs(),))]),
        ((4, 3), [Case("T=5, d_in=4", (rand(5, 4, seed=71),))]),
    ]
    if hidden:
        configs += [
            ((3, 2), [Case("book batch (2, 6, 3)", (book_batch(),))]),
            ((8, 4), [Case("batch (2, 7, 8)", (rand(2, 7, 8, seed=72),)), Case("one token (1, 8)", (rand(1, 8, seed=73),))]),
            ((5, 5), [Case("two batch dims (3, 2, 4, 5)", (rand(3, 2, 4, 5, seed=74),))]),
            ((6, 1), [Case("d_out=1, T=4", (rand(4, 6, seed=75),))]),
        ]
    return configs


def check_SelfAttention_v1(SelfAttention_v1: Callable, hidden: bool = False) -> None:
    """Build ``SelfAttention_v1(d_in, d_out)`` and the reference with one seed and compare their outputs."""
    diagnose = _module_diagnose(
        SelfAttention_v1, reference.SelfAttention_v1,
        lambda m, x: (x @ m.W_query, x @ m.W_key, x @ m.W_value),
        "use nn.Parameter(torch.rand(d_in, d_out)) (uniform on [0, 1), shape (d_in, d_out)), not torch.randn",
        "each matrix must be (d_in, d_out), so that x @ W maps (..., T, d_in) to (..., T, d_out).",
    )
    compare_module("SelfAttention_v1", SelfAttention_v1, reference.SelfAttention_v1,
                   _v1_configs(hidden), diagnose=diagnose)


def check_SelfAttention_v2(SelfAttention_v2: Callable, hidden: bool = False) -> None:
    """Build ``SelfAttention_v2(d_in, d_out, qkv_bias)`` and the reference with one seed and compare outputs."""
    configs = [
        ((3, 2), [Case("book sentence (6, 3)", (book_inputs(),))]),
        ((4, 3), [Case("T=5, d_in=4", (rand(5, 4, seed=81),))]),
    ]
    if hidden:
        configs += [
            ((3, 2, True), [Case("qkv_bias=True, book sentence", (book_inputs(),)),
                            Case("qkv_bias=True, book batch (2, 6, 3)", (book_batch(),))]),
            ((8, 4), [Case("batch (2, 7, 8)", (rand(2, 7, 8, seed=82),))]),
            ((5, 5, True), [Case("qkv_bias=True, two batch dims (3, 2, 4, 5)", (rand(3, 2, 4, 5, seed=83),))]),
            ((6, 1, False), [Case("d_out=1, one token (1, 6)", (rand(1, 6, seed=84),))]),
        ]
    diagnose = _module_diagnose(
        SelfAttention_v2, reference.SelfAttention_v2,
        lambda m, x: (m.W_query(x), m.W_key(x), m.W_value(x)),
        "use nn.Linear(d_in, d_out, bias=qkv_bias) for each projection",
        "nn.Linear takes the input size first: nn.Linear(d_in, d_out). Its weight is then stored as "
        "(d_out, d_in).",
        "nn.Linear's weight is stored as (d_out, d_in): call the layer, self.W_query(x), which computes "
        "x @ weight.T (+ bias), instead of multiplying by the weight yourself.",
    )
    compare_module("SelfAttention_v2", SelfAttention_v2, reference.SelfAttention_v2, configs, diagnose=diagnose)


# --------------------------------------------------------------------------------------------
# copy_v2_weights_to_v1 (the book's exercise 3.1)
# --------------------------------------------------------------------------------------------
_TRANSPOSE_HINT = ("did you transpose? nn.Linear stores its weight as (d_out, d_in) and computes x @ weight.T, "
                   "while SelfAttention_v1 computes x @ W with W of shape (d_in, d_out): W = weight.T.")


def _copy_case(copy_fn: Callable, d_in: int, d_out: int, x: torch.Tensor, label: str) -> None:
    exercise = "copy_v2_weights_to_v1"
    case = Case(label)
    torch.manual_seed(11)
    sa_v2 = reference.SelfAttention_v2(d_in, d_out)
    torch.manual_seed(12)
    sa_v1 = reference.SelfAttention_v1(d_in, d_out)
    v2_before = {k: v.detach().clone() for k, v in sa_v2.state_dict().items()}
    v1_before = {n: getattr(sa_v1, n).detach().clone() for n in _NAMES}
    try:
        copy_fn(sa_v2, sa_v1)
    except NotImplementedError:
        fail(exercise, "not implemented yet: replace `raise NotImplementedError()` with your code and run the cell")
    except CheckFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - any error in student code becomes a verdict
        hint = f" Hint: {_TRANSPOSE_HINT}" if "size" in str(exc) or "shape" in str(exc) else ""
        fail(exercise, f"your code raised {type(exc).__name__}: {exc}.{hint}", case)
    for key, before in v2_before.items():
        if not torch.equal(sa_v2.state_dict()[key], before):
            fail(exercise, f"your function changed sa_v2's {key}. Copy FROM sa_v2 (the nn.Linear version) INTO "
                           f"sa_v1; sa_v2 must stay as it was.", case)
    for name in _NAMES:
        now = getattr(sa_v1, name, None)
        if not isinstance(now, nn.Parameter):
            fail(exercise, f"sa_v1.{name} is no longer an nn.Parameter (got {type(now).__name__}): keep it a "
                           f"parameter so that it is still trained, e.g. copy into it under torch.no_grad().", case)
        linear_w = sa_v2.state_dict()[f"{name}.weight"]  # (d_out, d_in)
        if tuple(now.shape) == tuple(linear_w.shape) and d_in != d_out:
            fail(exercise, f"sa_v1.{name} now has shape {tuple(now.shape)} = (d_out, d_in); v1 needs (d_in, d_out) "
                           f"= {(d_in, d_out)}. Hint: {_TRANSPOSE_HINT}", case)
        if tuple(now.shape) != (d_in, d_out):
            fail(exercise, f"sa_v1.{name} has shape {tuple(now.shape)}, expected (d_in, d_out) = {(d_in, d_out)}.", case)
        if torch.equal(now.detach(), linear_w):
            fail(exercise, f"sa_v1.{name} holds sa_v2.{name}.weight untransposed. Hint: {_TRANSPOSE_HINT}", case)
        if d_in != d_out and torch.equal(now.detach(), linear_w.reshape(d_in, d_out)):
            fail(exercise, f"sa_v1.{name} holds sa_v2.{name}.weight reshaped to (d_in, d_out). reshape and view "
                           f"keep the numbers in memory order; they do not transpose. Hint: {_TRANSPOSE_HINT}", case)
        if torch.equal(now.detach(), v1_before[name]):
            fail(exercise, f"sa_v1.{name} was not changed. Your function must modify sa_v1 itself (its return "
                           f"value is ignored).", case)
        problem = tensor_difference(linear_w.T, now.detach())
        if problem:
            for other in _NAMES:
                if other != name and torch.equal(now.detach(), sa_v2.state_dict()[f"{other}.weight"].T):
                    fail(exercise, f"sa_v1.{name} holds the weight of sa_v2.{other}: copy each projection into "
                                   f"the one of the same name.", case)
            fail(exercise, f"sa_v1.{name} should equal sa_v2.{name}.weight.T: {problem}.", case)
    with torch.no_grad():
        expected = sa_v2(x)
        try:
            got = sa_v1(x)
        except Exception as exc:  # noqa: BLE001
            fail(exercise, f"after your copy, sa_v1({describe_shape(x)}) raised {type(exc).__name__}: {exc}", case)
    problem = tensor_difference(expected, got)
    if problem:
        fail(exercise, f"after the copy, sa_v1 and sa_v2 give different outputs: {problem}", case)


def check_copy_v2_weights_to_v1(copy_v2_weights_to_v1: Callable, hidden: bool = False) -> None:
    """Build a v2 and a v1 module with different seeds, call the copy, then compare both modules' outputs.

    Also checks that ``sa_v2`` is untouched and that ``sa_v1`` keeps three ``(d_in, d_out)`` parameters.
    """
    exercise = "copy_v2_weights_to_v1"
    require_callable(exercise, copy_v2_weights_to_v1)
    check_rules(exercise, copy_v2_weights_to_v1)
    cases = [
        (3, 2, book_inputs(), "book sizes d_in=3, d_out=2"),
        (4, 6, rand(5, 4, seed=91), "d_in=4, d_out=6"),
    ]
    if hidden:
        cases += [
            (3, 3, book_inputs(), "square d_in=d_out=3"),
            (8, 2, rand(2, 7, 8, seed=92), "d_in=8, d_out=2, batch (2, 7, 8)"),
            (5, 5, rand(2, 4, 5, seed=93), "square d_in=d_out=5, batch (2, 4, 5)"),
        ]
    for d_in, d_out, x, label in cases:
        _copy_case(copy_v2_weights_to_v1, d_in, d_out, x, label)
    passed(exercise, f"{len(cases)} copies make sa_v1 compute what sa_v2 computes "
                     f"({'; '.join(c[3] for c in cases)})")
