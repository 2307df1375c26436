"""Self-checks for notebook 06: efficient multi-head attention and FLOP counting."""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from course_utils import reference
from course_utils.checks.core import (
    Case,
    CheckFailed,
    call_student,
    check_causal,
    check_rules,
    compare_module,
    fail,
    passed,
    rand,
    require_callable,
)
from course_utils.data import book_batch

__all__ = ["check_MultiHeadAttentionCombinedQKV", "check_MHAPyTorchSDPA", "check_attention_flops"]


def _module_configs(hidden: bool) -> list[tuple[tuple, list[Case]]]:
    """Constructor arguments and inputs shared by both module checks."""
    configs = [
        ((3, 2, 6, 0.0, 2), [Case("book batch (2, 6, 3)", (book_batch(),))]),
        ((8, 12, 10, 0.0, 3), [Case("T=10 = context_length", (rand(2, 10, 8, seed=61),)),
                               Case("T=7 < context_length", (rand(2, 7, 8, seed=62),))]),
    ]
    if hidden:
        configs += [
            ((6, 8, 5, 0.0, 4, True), [Case("qkv_bias=True, T=5", (rand(3, 5, 6, seed=63),)),
                                       Case("qkv_bias=True, T=1", (rand(1, 1, 6, seed=64),))]),
            ((5, 9, 7, 0.0, 3), [Case("odd sizes, batch 3, T=4", (rand(3, 4, 5, seed=65),))]),
            ((4, 4, 6, 0.0, 1), [Case("one head", (rand(2, 6, 4, seed=66),))]),
            ((16, 32, 12, 0.0, 8), [Case("8 heads of 4, T=11", (rand(2, 11, 16, seed=67),))]),
        ]
    return configs


def _check_causality(exercise: str, cls: Callable, args: tuple, seed: int) -> None:
    torch.manual_seed(123)
    module = cls(*args).eval()
    x = rand(2, args[2], args[0], seed=seed)
    with torch.no_grad():
        check_causal(exercise, module, x)


def check_MultiHeadAttentionCombinedQKV(MultiHeadAttentionCombinedQKV: Callable, hidden: bool = False) -> None:
    """Outputs equal the reference's for the same seed; one ``qkv`` layer; a causal mask buffer."""
    name = "MultiHeadAttentionCombinedQKV"
    cls = MultiHeadAttentionCombinedQKV
    check_rules(name, cls)
    # Causality first: a missing or misplaced mask is named as such, not as "values differ".
    _check_causality(name, cls, (8, 12, 10, 0.0, 3), seed=68)
    try:
        compare_module(name, cls, reference.MultiHeadAttentionCombinedQKV, _module_configs(hidden), quiet=True)
    except CheckFailed as exc:
        if "values differ" not in str(exc):
            raise
        raise CheckFailed(f"{exc} Hint: check the layout of qkv(x), shape (b, T, 3 * d_out): all of Q comes "
                          f"first, then K, then V, each split into heads. view(b, T, 3, num_heads, head_dim), "
                          f"permute(2, 0, 3, 1, 4) to (3, b, num_heads, T, head_dim), then unbind(0) gives "
                          f"queries, keys, values in that order.") from None
    torch.manual_seed(123)
    module = cls(8, 12, 10, 0.0, 3)
    if not any(tuple(b.shape) == (10, 10) for b in module.buffers()):
        fail(name, "no (context_length, context_length) buffer found: register the causal mask with "
                   "self.register_buffer('mask', ...) so it moves with .to(device) and is not a parameter")
    if hidden:
        # Dropout: the same RNG seed must give the same output as the reference in train() mode,
        # and nothing random may happen in eval() mode.
        compare_module(name, cls, reference.MultiHeadAttentionCombinedQKV,
                       [((4, 6, 8, 0.5, 2), [Case("dropout=0.5, T=8", (rand(2, 8, 4, seed=69),)),
                                             Case("dropout=0.5, T=5", (rand(2, 5, 4, seed=70),))])],
                       train=True, quiet=True)
        _check_causality(name, cls, (6, 8, 5, 0.0, 4, True), seed=71)
    passed(name, f"outputs agree with the reference ({'all' if hidden else 'visible'} cases), "
                 f"no position sees the future, the mask is a buffer")


class _SDPACalls(TorchFunctionMode):
    """Counts calls of ``F.scaled_dot_product_attention`` made while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "scaled_dot_product_attention":
            self.count += 1
        return func(*args, **(kwargs or {}))


def _check_dropout_sdpa(name: str, cls: Callable) -> None:
    """eval(): no dropout at all; train(): dropout happens, as in the reference with the same seed."""
    args = (4, 6, 8, 0.5, 2)
    x = rand(2, 8, 4, seed=72)
    torch.manual_seed(123)
    module = cls(*args)
    torch.manual_seed(123)
    ref = reference.MHAPyTorchSDPA(*args)
    module.eval(), ref.eval()
    with torch.no_grad():
        expected_eval = ref(x)
        first = call_student(name, module, Case("dropout=0.5, eval()", (x,)))
        second = call_student(name, module, Case("dropout=0.5, eval()", (x,)))
    if not torch.allclose(first, second) or not torch.allclose(first, expected_eval, atol=1e-5, rtol=1e-4):
        fail(name, "in eval() mode with dropout=0.5 the output must be deterministic and equal the "
                   "reference: pass dropout_p=self.dropout only when self.training, else 0.0",
             Case(f"dropout=0.5, eval() mode, built with {args}"))
    module.train()
    with torch.no_grad():
        got_train = call_student(name, module, Case("dropout=0.5, train()", (x,)))
    if torch.allclose(got_train, expected_eval, atol=1e-6):
        fail(name, "in train() mode with dropout=0.5 the output equals the eval() output: dropout is "
                   "never applied. Pass dropout_p=self.dropout to F.scaled_dot_product_attention when training",
             Case(f"dropout=0.5, train() mode, built with {args}"))
    compare_module(name, cls, reference.MHAPyTorchSDPA, [(args, [Case("dropout=0.5, T=8", (x,))])],
                   train=True, quiet=True)


def check_MHAPyTorchSDPA(MHAPyTorchSDPA: Callable, hidden: bool = False) -> None:
    """Outputs equal the reference's for the same seed, and the core is ``F.scaled_dot_product_attention``."""
    name = "MHAPyTorchSDPA"
    cls = MHAPyTorchSDPA
    check_rules(name, cls)
    _check_causality(name, cls, (8, 12, 10, 0.0, 3), seed=74)  # first: names a missing is_causal
    compare_module(name, cls, reference.MHAPyTorchSDPA, _module_configs(hidden), quiet=True)
    torch.manual_seed(123)
    module = cls(8, 12, 10, 0.0, 3).eval()
    spy = _SDPACalls()
    with spy, torch.no_grad():
        call_student(name, module, Case("T=10", (rand(2, 10, 8, seed=73),)))
    if spy.count != 1:
        fail(name, f"forward called F.scaled_dot_product_attention {spy.count} times; it should call it once, "
                   f"on queries, keys and values of shape (b, num_heads, T, head_dim)")
    if hidden:
        _check_dropout_sdpa(name, cls)
        _check_causality(name, cls, (6, 8, 5, 0.0, 4, True), seed=75)
    passed(name, f"outputs agree with the reference ({'all' if hidden else 'visible'} cases), "
                 f"one SDPA call, no position sees the future")


def _flops_hint(expected: float, got: float, seq_len: int, causal: bool) -> str:
    if expected == 0 or got == 0:
        return ""
    ratio = got / expected
    hints = {
        2.0: "twice too large: halve the count when causal=True" if causal
        else "twice too large: is the count halved even when causal=False?",
        0.5: "half the expected value: halved twice, halved when causal=False, or the factor 2 per "
             "multiply-add forgotten?",
        0.25: "a quarter of the expected value: the factor 2 per multiply-add and the factor 2 for two "
              "matrix products, are both there?",
    }
    for value, hint in hints.items():
        if math.isclose(ratio, value, rel_tol=1e-9):
            return f" ({hint})"
    if seq_len > 1 and math.isclose(ratio, 1 / seq_len, rel_tol=1e-9):
        return " (T appears once, but each of the T queries meets T keys: T^2)"
    return ""


def check_attention_flops(attention_flops: Callable, hidden: bool = False) -> None:
    """Exact FLOP counts for causal and non-causal attention, with the default ``causal=True``."""
    name = "attention_flops"
    require_callable(name, attention_flops)
    check_rules(name, attention_flops)
    cases = [
        Case("GPT-2 small: B=8, H=12, T=1024, D=64 (default causal)", (8, 12, 1024, 64)),
        Case("GPT-2 small, causal=False", (8, 12, 1024, 64), {"causal": False}),
        Case("all ones, causal=False", (1, 1, 1, 1), {"causal": False}),
    ]
    if hidden:
        cases += [
            Case("odd sizes B=3, H=5, T=7, D=9, causal=True", (3, 5, 7, 9), {"causal": True}),
            Case("odd sizes, causal=False", (3, 5, 7, 9), {"causal": False}),
            Case("causal given positionally", (2, 4, 16, 8, False)),
            Case("T=1, causal", (1, 2, 1, 4)),
            Case("large: B=16, H=32, T=8192, D=128", (16, 32, 8192, 128)),
            Case("large, causal=False", (16, 32, 8192, 128), {"causal": False}),
            Case("batch 0", (0, 12, 1024, 64)),
        ]
    for case in cases:
        expected = reference.attention_flops(*case.args, **case.kwargs)
        got = call_student(name, attention_flops, case)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            fail(name, f"expected a number, got {type(got).__name__}", case)
        if not math.isclose(got, expected, rel_tol=1e-12, abs_tol=0.0):
            causal = case.kwargs.get("causal", case.args[4] if len(case.args) > 4 else True)
            fail(name, f"expected {expected:,} FLOPs, got {got:,}{_flops_hint(expected, got, case.args[2], causal)}. "
                       f"Arguments: {case.args}, {case.kwargs}", case)
    passed(name, f"{len(cases)} cases agree with the reference")
