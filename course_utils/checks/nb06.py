"""Self-checks for notebook 06: efficient multi-head attention and FLOP counting.

The module checks follow notebook 05's order: parameter shapes (one ``qkv`` layer, ``out_proj``,
``qkv_bias``), a finite output, the values compared in ``eval()`` mode with the known mistakes
named (a wrong layout of ``qkv(x)``, a missing ``is_causal``, SDPA's mask convention), then
causality, the mask buffer, dropout only in ``train()`` mode, and for SDPA a single call of the
fused kernel. A wrong FLOP count is named by its ratio to the expected one.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from course_utils.checks.core import (
    Case,
    build_student,
    call_student,
    check,
    compare_function,
    compare_module,
    fail,
    hidden_cases,
    passed,
    rand,
)
from course_utils.checks.modules import (
    check_causal_module,
    check_dropout_modes,
    check_finite,
    check_module_class,
    finite_then_values,
    module_checks,
    not_causal,
)
from course_utils.data import book_batch

__all__ = ["check_MultiHeadAttentionCombinedQKV", "check_MHAPyTorchSDPA", "check_attention_flops"]


def _configs() -> list[tuple[tuple, list[Case]]]:
    """Constructor arguments and inputs shared by both module checks, without dropout."""
    return [
        ((3, 2, 6, 0.0, 2), [Case("book batch (2, 6, 3)", (book_batch(),))]),
        ((8, 12, 10, 0.0, 3), [Case("T=10 = context_length", (rand(2, 10, 8, seed=61),)),
                               Case("T=7 < context_length", (rand(2, 7, 8, seed=62),))]),
    ]


def _dropout_config() -> tuple[tuple, list[Case]]:
    return (4, 6, 8, 0.5, 2), [Case("dropout=0.5, T=8", (rand(2, 8, 4, seed=76),))]


#: Compared first, in eval() mode: T = context_length (a shorter input gets its own message later).
def _values_config() -> tuple[tuple, list[Case]]:
    build, cases = _configs()[1]
    return build, cases[:1]


def _qkv_shapes(got: list, want: list, build: tuple) -> str | None:
    d_in, d_out = build[0], build[1]
    if got.count((d_out, d_in)) == 3 and (3 * d_out, d_in) in want:
        return ("three projections instead of one: self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias) computes "
                "queries, keys and values with one matrix product")
    return None


# ------------------------------------------------------------------------------------------
# MultiHeadAttentionCombinedQKV
# ------------------------------------------------------------------------------------------
@check
def check_MultiHeadAttentionCombinedQKV(MultiHeadAttentionCombinedQKV: Callable, hidden: bool = False) -> None:
    """Outputs equal the expected ones for the same seed in eval() and train() mode; one ``qkv`` layer;
    a causal mask buffer cut to the input's length; no position sees the future."""
    exercise = "MultiHeadAttentionCombinedQKV"
    cls = MultiHeadAttentionCombinedQKV
    extra = hidden_cases(exercise) if hidden else {"configs": [], "causal": []}
    configs = [_dropout_config()] + _configs() + extra["configs"]
    module_checks(exercise, cls, [build for build, _ in configs], _qkv_shapes)
    diagnose = not_causal(exercise, cls)
    finite_then_values(exercise, cls, _values_config(), diagnose)
    check_module_class(exercise, cls, configs, diagnose=diagnose)
    for case in extra["causal"]:
        check_causal_module(exercise, build_student(exercise, cls, case.build), case.args[0])


# ------------------------------------------------------------------------------------------
# MHAPyTorchSDPA
# ------------------------------------------------------------------------------------------
class _SDPACalls(TorchFunctionMode):
    """Counts calls of ``F.scaled_dot_product_attention`` made while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "scaled_dot_product_attention":
            self.count += 1
        return func(*args, **(kwargs or {}))


def _check_one_sdpa_call(exercise: str, module: torch.nn.Module, x: torch.Tensor) -> None:
    module.eval()
    spy = _SDPACalls()
    with spy, torch.no_grad():
        call_student(exercise, module, Case(f"T={x.shape[1]}", (x,)))
    if spy.count != 1:
        fail(exercise, f"forward called F.scaled_dot_product_attention {spy.count} times; it should call it once, "
                       f"on queries, keys and values of shape (b, num_heads, T, head_dim)")


@check
def check_MHAPyTorchSDPA(MHAPyTorchSDPA: Callable, hidden: bool = False) -> None:
    """Outputs equal the expected ones for the same seed (in train() mode too, with dropout), no position
    sees the future, and the core is one call of ``F.scaled_dot_product_attention``."""
    exercise = "MHAPyTorchSDPA"
    cls = MHAPyTorchSDPA
    extra = hidden_cases(exercise) if hidden else {"configs": [], "dropout": [], "causal": []}
    configs = _configs() + extra["configs"]
    dropout = [_dropout_config()] + extra["dropout"]
    module_checks(exercise, cls, [build for build, _ in configs + dropout], _qkv_shapes)
    diagnose = not_causal(exercise, cls)
    for config in configs:
        finite_then_values(exercise, cls, config, diagnose)
    main = build_student(exercise, cls, _values_config()[0])
    check_causal_module(exercise, main, rand(2, 10, 8, seed=74))
    for case in extra["causal"]:
        check_causal_module(exercise, build_student(exercise, cls, case.build), case.args[0])
    _check_one_sdpa_call(exercise, main, rand(2, 10, 8, seed=73))
    for build, cases in dropout:
        student = build_student(exercise, cls, build)
        for case in cases:
            check_finite(exercise, student, case.args[0], f"built with {build}, {case.name}")
        check_dropout_modes(exercise, student, cases[0].args[0], f"built with {build}", fix="sdpa")
    compare_module(exercise, cls, dropout, train=True, quiet=True, diagnose=diagnose)
    passed(exercise, f"outputs agree with the expected ones for {len(configs) + len(dropout)} constructions, dropout only "
                     f"in train() mode, one SDPA call, no position sees the future")


# ------------------------------------------------------------------------------------------
# attention_flops
# ------------------------------------------------------------------------------------------
def _flops_diagnose(case: Case, got: object, want: object) -> str | None:
    """Name a wrong count by its ratio to the expected one."""
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, (int, float)) or not isinstance(want, (int, float)) or not want:
        return None
    args = case.args
    seq_len = args[2]
    causal = case.kwargs.get("causal", args[4] if len(args) > 4 else None)  # None: the default
    ratio = got / want

    def near(value: float) -> bool:
        return math.isclose(ratio, value, rel_tol=1e-9)

    if near(2.0):
        if causal is None:
            return ("twice too large with causal left out: causal must default to True "
                    "(def attention_flops(..., causal=True)), and then the count is halved.")
        if causal:
            return "twice too large with causal=True: halve the count when causal is True (and only then)."
        return "twice too large with causal=False: 4 * B * H * T^2 * D in all, the two matrix products together."
    if near(0.5):
        if causal is False:
            return ("half the expected value with causal=False: the count is halved only when causal is True. Or is "
                    "the factor 2 per multiply-add, or one of the two matrix products, forgotten?")
        return ("half the expected value: halved twice, the factor 2 per multiply-add forgotten, or only one of the "
                "two matrix products (Q K^T and weights @ V) counted?")
    if near(0.25):
        return ("a quarter of the expected value: the factor 2 per multiply-add and the factor 2 for two matrix "
                "products, are both there?")
    batch, heads = args[0], args[1]
    if batch * heads > 1 and near(1 / (batch * heads)):
        return "the count is that of one batch entry and one head: multiply by batch * num_heads."
    if seq_len > 1 and near(1 / seq_len):
        return "T appears once, but each of the T queries meets T keys: T^2."
    if seq_len > 1 and causal is not False and near((seq_len + 1) / seq_len):
        return ("the diagonal is counted on top of half the pairs: T(T+1)/2 query-key pairs. Count exactly half of "
                "the T^2 pairs: T^2 / 2.")
    return None


@check
def check_attention_flops(attention_flops: Callable, hidden: bool = False) -> None:
    """Exact FLOP counts for causal and non-causal attention, with the default ``causal=True``."""
    cases = [
        Case("GPT-2 small: B=8, H=12, T=1024, D=64, causal=True", (8, 12, 1024, 64), {"causal": True}),
        Case("GPT-2 small, causal left to its default", (8, 12, 1024, 64)),
        Case("GPT-2 small, causal=False", (8, 12, 1024, 64), {"causal": False}),
        Case("all ones, causal=False", (1, 1, 1, 1), {"causal": False}),
    ]
    compare_function("attention_flops", attention_flops, cases + (hidden_cases("attention_flops") if hidden else []),
                     atol=0.0, rtol=1e-12, diagnose=_flops_diagnose)
