"""Self-checks for notebook 05: multi-head attention, from a list of heads to split weights.

Besides comparing with the reference, the checks recognise the classic mistakes by their symptoms:
one head repeated, heads concatenated on the wrong dimension, ``view`` without ``transpose`` (when
splitting or merging heads), ``view`` on a non-contiguous tensor, a missing ``out_proj``, the
``d_out``-per-head versus ``d_out``-total confusion, and counting frozen parameters or buffers.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn

from course_utils import reference
from course_utils.checks.core import (
    Case,
    call_student,
    check_rules,
    compare_function,
    compare_module,
    describe_shape,
    fail,
    passed,
    rand,
    require_callable,
    tensor_difference,
)
from course_utils.checks.nb04 import (
    build_student,
    check_causal_module,
    check_module_class,
    check_truncated,
    run_module,
)
from course_utils.data import book_batch

__all__ = [
    "check_MultiHeadAttentionWrapper",
    "check_split_heads",
    "check_merge_heads",
    "check_MultiHeadAttention",
    "check_count_parameters",
]


def _param_shapes(cls: Callable, args: tuple) -> list[tuple[int, ...]] | None:
    """Parameter shapes of ``cls(*args)``, or ``None`` if it cannot be built."""
    try:
        module = cls(*args)
    except Exception:  # noqa: BLE001 - build_pair reports construction errors
        return None
    return [tuple(p.shape) for p in module.parameters()]


# ------------------------------------------------------------------------------------------
# MultiHeadAttentionWrapper
# ------------------------------------------------------------------------------------------
def _wrapper_structure(exercise: str, cls: Callable) -> None:
    """Recognise a repeated head and the d_out confusion from the parameters alone."""
    args = (3, 6, 6, 0.0, 3)
    shapes = _param_shapes(cls, args)
    expected = _param_shapes(reference.MultiHeadAttentionWrapper, args)
    if shapes is None or shapes == expected:
        return
    if not shapes:
        fail(exercise, "the module has no parameters: heads kept in a plain Python list are invisible to "
                       ".parameters(), .to(...) and state_dict. Hold them in an nn.ModuleList")
    if len(shapes) * 3 == len(expected) and shapes == expected[: len(shapes)]:
        fail(exercise, f"one head repeated: built with num_heads=3 it has the parameters of ONE head {shapes}. "
                       f"`nn.ModuleList([head] * n)` (or a list comprehension over one existing head) holds the same "
                       f"module n times, so all heads share weights. Create a new CausalAttention per head")
    if shapes[0] == (2, 3):
        fail(exercise, f"each head has d_out // num_heads outputs (parameters {shapes[:3]} for d_out=6, num_heads=3). "
                       f"In the wrapper d_out is the size of ONE head: build every head with CausalAttention(d_in, "
                       f"d_out, ...); the output then has num_heads * d_out columns")


def _wrapper_output_shape(exercise: str, student: nn.Module, ref: nn.Module, x: torch.Tensor, heads: int) -> None:
    """Name a concatenation on the wrong dimension, or a repeated head, from one output."""
    student.eval()
    ref.eval()
    got = run_module(exercise, student, x, "book batch")
    expected = ref(x)
    if not isinstance(got, torch.Tensor):
        fail(exercise, f"forward must return a tensor, got {type(got).__name__}")
    b, T, total = expected.shape
    d = total // heads
    wrong_dims = {(b * heads, T, d): 0, (b, T * heads, d): 1, (heads, b, T, d): "a new dim 0 (torch.stack)",
                  (b, T, heads, d): "a new dim 2 (torch.stack)"}
    shape = tuple(got.shape)
    if shape in wrong_dims and shape != tuple(expected.shape):
        fail(exercise, f"heads concatenated on the wrong dim ({wrong_dims[shape]}): expected {tuple(expected.shape)}, "
                       f"got {shape}. Concatenate the heads' (b, T, d_out) outputs along the last dim, "
                       f"torch.cat(..., dim=-1)")
    if shape == tuple(expected.shape) and heads > 1:
        blocks = got.detach().split(d, dim=-1)
        if all(torch.allclose(blocks[0], blk) for blk in blocks[1:]):
            fail(exercise, "one head repeated: every head's block of the output is the same. Call each head in "
                           "self.heads once (e.g. [head(x) for head in self.heads]) and make sure they are distinct modules")


def check_MultiHeadAttentionWrapper(MultiHeadAttentionWrapper: Callable, hidden: bool = False) -> None:
    """Check ``MultiHeadAttentionWrapper(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)``."""
    exercise = "MultiHeadAttentionWrapper"
    require_callable(exercise, MultiHeadAttentionWrapper)
    check_rules(exercise, MultiHeadAttentionWrapper)
    _wrapper_structure(exercise, MultiHeadAttentionWrapper)
    batch = book_batch()
    student, ref = build_student(exercise, MultiHeadAttentionWrapper, reference.MultiHeadAttentionWrapper, (3, 2, 6, 0.0, 2))
    _wrapper_output_shape(exercise, student, ref, batch, 2)
    check_truncated(exercise, student, rand(2, 4, 3, seed=81), 6, "built with (3, 2, 6, 0.0, 2)")
    check_causal_module(exercise, student, batch)
    configs = [
        ((3, 2, 6, 0.0, 2), [Case("book batch (2, 6, 3)", (batch,))]),
        ((3, 1, 6, 0.0, 2), [Case("exercise 3.2: d_out=1, two heads", (batch,))]),
        ((3, 2, 6, 0.5, 2), [Case("dropout 0.5, T=4", (rand(2, 4, 3, seed=82),))]),
    ]
    if hidden:
        configs += [
            ((4, 3, 8, 0.2, 3, True), [Case("qkv_bias=True, T=5", (rand(3, 5, 4, seed=83),)),
                                       Case("T = context_length", (rand(1, 8, 4, seed=84),))]),
            ((5, 4, 7, 0.0, 1), [Case("one head", (rand(2, 7, 5, seed=85),))]),
            ((6, 2, 5, 0.1, 6), [Case("six heads, T=1", (rand(2, 1, 6, seed=86),)),
                                 Case("six heads, T=5", (rand(2, 5, 6, seed=87),))]),
        ]
        student6, ref6 = build_student(exercise, MultiHeadAttentionWrapper, reference.MultiHeadAttentionWrapper,
                                       (6, 2, 5, 0.0, 6))
        _wrapper_output_shape(exercise, student6, ref6, rand(2, 5, 6, seed=88), 6)
        check_causal_module(exercise, student6, rand(2, 5, 6, seed=89))
    compare_module(exercise, MultiHeadAttentionWrapper, reference.MultiHeadAttentionWrapper, configs, train=True, quiet=True)
    passed(exercise, f"outputs agree in eval() and train() mode for {len(configs)} constructions, exercise 3.2 included; "
                     f"heads are distinct and concatenated on the last dim")


# ------------------------------------------------------------------------------------------
# split_heads / merge_heads
# ------------------------------------------------------------------------------------------
def _split_diagnosis(x: torch.Tensor, num_heads: int, got: object) -> str | None:
    if not isinstance(got, torch.Tensor):
        return None
    b, T, d = x.shape
    D = d // num_heads
    expected = reference.split_heads(x, num_heads)
    if tensor_difference(expected, got) is None:
        return None
    if tuple(got.shape) == (b, T, num_heads, D) and (b, T, num_heads, D) != tuple(expected.shape):
        return (f"got shape (b, T, num_heads, head_dim) = {tuple(got.shape)}: the view is right, now swap the token "
                f"and head dimensions with .transpose(1, 2) to get (b, num_heads, T, head_dim)")
    if tensor_difference(x.reshape(b, num_heads, T, D), got) is None:
        return ("view without transpose: x.view(b, num_heads, T, head_dim) has the right shape but cuts the memory in "
                "the wrong places, so one 'head' holds pieces of several tokens. View as (b, T, num_heads, head_dim) "
                "(split the last dim), then transpose(1, 2)")
    if tensor_difference(x.reshape(b, T, D, num_heads).permute(0, 3, 1, 2), got) is None:
        return ("heads interleaved: head h must get the contiguous columns h*head_dim:(h+1)*head_dim. View as "
                "(b, T, num_heads, head_dim), not (b, T, head_dim, num_heads)")
    return None


def check_split_heads(split_heads: Callable, hidden: bool = False) -> None:
    """Check ``split_heads(x, num_heads)``: ``(b, T, d)`` -> ``(b, num_heads, T, d // num_heads)``."""
    exercise = "split_heads"
    cases = [
        Case("(2, 6, 4), 2 heads", (rand(2, 6, 4, seed=91), 2)),
        Case("(1, 5, 6), 3 heads", (rand(1, 5, 6, seed=92), 3)),
    ]
    if hidden:
        cases += [
            Case("(3, 7, 12), 4 heads", (rand(3, 7, 12, seed=93), 4)),
            Case("one head (2, 4, 8)", (rand(2, 4, 8, seed=94), 1)),
            Case("head_dim 1: (2, 3, 5), 5 heads", (rand(2, 3, 5, seed=95), 5)),
            Case("non-contiguous input (batch and tokens transposed)", (rand(6, 2, 8, seed=96).transpose(0, 1), 2)),
            Case("T=1, (4, 1, 6), 2 heads", (rand(4, 1, 6, seed=97), 2)),
        ]
    require_callable(exercise, split_heads)
    check_rules(exercise, split_heads)
    compare_function(exercise, split_heads, reference.split_heads, cases, rules_apply=False,
                     diagnose=lambda case, got: _split_diagnosis(*case.args, got))


def _merge_diagnosis(x: torch.Tensor, got: object) -> str | None:
    if not isinstance(got, torch.Tensor):
        return None
    b, H, T, D = x.shape
    expected = reference.merge_heads(x)
    if tensor_difference(expected, got) is None:
        return None
    if tensor_difference(x.reshape(b, T, H * D), got) is None:
        return ("view without transpose: (b, num_heads, T, head_dim) reshaped straight to (b, T, d) puts pieces of "
                "different tokens into one row. transpose(1, 2) to (b, T, num_heads, head_dim) first")
    if tensor_difference(x.permute(0, 2, 3, 1).reshape(b, T, H * D), got) is None:
        return ("heads interleaved: the result must hold head 0's head_dim columns, then head 1's, ... Use "
                "transpose(1, 2) (or permute(0, 2, 1, 3)), not permute(0, 2, 3, 1)")
    return None


def check_merge_heads(merge_heads: Callable, hidden: bool = False) -> None:
    """Check ``merge_heads(x)``: ``(b, H, T, D)`` -> ``(b, T, H * D)``, the inverse of ``split_heads``."""
    exercise = "merge_heads"
    cases = [
        Case("output of split_heads (2, 2, 6, 3), not contiguous", (reference.split_heads(rand(2, 6, 6, seed=101), 2),)),
        Case("(1, 3, 5, 2)", (rand(1, 3, 5, 2, seed=102),)),
    ]
    if hidden:
        cases += [
            Case("output of split_heads (3, 4, 7, 1), not contiguous", (reference.split_heads(rand(3, 7, 4, seed=103), 4),)),
            Case("one head (2, 1, 4, 8)", (rand(2, 1, 4, 8, seed=104),)),
            Case("(2, 8, 3, 2)", (rand(2, 8, 3, 2, seed=105),)),
            Case("T=1 (3, 2, 1, 4)", (rand(3, 2, 1, 4, seed=106),)),
        ]
    require_callable(exercise, merge_heads)
    check_rules(exercise, merge_heads)
    for case in cases:
        try:
            got = merge_heads(case.args[0].clone())
        except NotImplementedError:
            fail(exercise, "not implemented yet: replace `raise NotImplementedError()` with your code and run the cell")
        except RuntimeError as exc:
            if "view size is not compatible" in str(exc) or "contiguous" in str(exc):
                fail(exercise, f"view on a transposed tensor: after transpose the memory is not contiguous, so "
                               f".view raised: {str(exc).splitlines()[0]} Call .contiguous() before .view(...), or "
                               f"use .reshape(...)", case)
            fail(exercise, f"your code raised RuntimeError: {exc}", case)
        except Exception as exc:  # noqa: BLE001
            fail(exercise, f"your code raised {type(exc).__name__}: {exc}", case)
        problem = _merge_diagnosis(case.args[0], got)
        if problem:
            fail(exercise, f"{problem}. Input shape {describe_shape(case.args[0])}", case)
    compare_function(exercise, merge_heads, reference.merge_heads, cases, rules_apply=False)
    x = rand(2, 5, 12, seed=107)
    for heads in (1, 3, 4):
        back = call_student(exercise, merge_heads, Case("round trip", (reference.split_heads(x, heads),)))
        if tensor_difference(x, back) is not None:
            fail(exercise, f"merge_heads(split_heads(x, {heads})) does not give x back: "
                           f"{tensor_difference(x, back)}")


# ------------------------------------------------------------------------------------------
# MultiHeadAttention
# ------------------------------------------------------------------------------------------
def _mha_structure(exercise: str, cls: Callable) -> None:
    """Recognise a missing ``out_proj`` and the d_out-per-head confusion from the parameters."""
    args = (4, 6, 8, 0.0, 3)
    shapes = _param_shapes(cls, args)
    expected = _param_shapes(reference.MultiHeadAttention, args)
    if shapes is None or shapes == expected:
        return
    if shapes == expected[:3]:
        fail(exercise, f"out_proj missing: expected parameters {expected}, got {shapes}. After merging the heads, "
                     f"MultiHeadAttention applies self.out_proj = nn.Linear(d_out, d_out), created after W_value")
    if shapes and shapes[0] == (6 * 3, 4):
        fail(exercise, f"W_query has shape {shapes[0]} for d_out=6, num_heads=3: in MultiHeadAttention d_out is the "
                       f"TOTAL output size (all heads together); each head gets head_dim = d_out // num_heads = 2. "
                       f"(In the wrapper it was the size of one head.)")


def _mha_forward(m: nn.Module, x: torch.Tensor, split_ok: bool = True, merge_ok: bool = True,
                 scale: float | None = None, out_proj: bool = True) -> torch.Tensor:
    """The reference computation with one known mistake switched on."""
    b, T, _ = x.shape
    H, D = m.num_heads, m.head_dim

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(b, T, H, D).transpose(1, 2) if split_ok else t.reshape(b, H, T, D)

    q, k, v = split(m.W_query(x)), split(m.W_key(x)), split(m.W_value(x))
    scores = (q @ k.transpose(-2, -1)).masked_fill(m.mask[:T, :T], float("-inf"))
    w = torch.softmax(scores / math.sqrt(scale if scale is not None else D), dim=-1)
    c = w @ v  # (b, H, T, D)
    c = c.transpose(1, 2).reshape(b, T, H * D) if merge_ok else c.reshape(b, T, H * D)
    return m.out_proj(c) if out_proj else c


def _mha_values(exercise: str, cls: Callable) -> None:
    """Compare once in eval() mode and name the mistake if it is a known one."""
    args = (4, 6, 8, 0.0, 3)
    student, ref = build_student(exercise, cls, reference.MultiHeadAttention, args)
    x = rand(2, 8, 4, seed=111)  # T = context_length: shorter inputs are checked later, with their own message
    student.eval()
    got = run_module(exercise, student, x, f"built with {args}")
    with torch.no_grad():
        if tensor_difference(ref.eval()(x), got) is None:
            return
        variants = [
            ("view without transpose when splitting: .view(b, num_heads, T, head_dim) mixes tokens across heads; "
             "view as (b, T, num_heads, head_dim), then transpose(1, 2)", dict(split_ok=False)),
            ("merging the heads without transpose: (b, num_heads, T, head_dim) reshaped straight to (b, T, d_out) "
             "mixes tokens; transpose(1, 2) first, then .contiguous().view or .reshape", dict(merge_ok=False)),
            ("view without transpose, both when splitting and when merging the heads", dict(split_ok=False, merge_ok=False)),
            ("scores scaled by sqrt(d_out); each head must use sqrt(head_dim) = sqrt(d_out // num_heads)",
             dict(scale=float(ref.d_out))),
            ("out_proj is created but not applied: return self.out_proj(context), not the merged context itself",
             dict(out_proj=False)),
        ]
        for why, kwargs in variants:
            if tensor_difference(_mha_forward(ref, x, **kwargs), got) is None:
                fail(exercise, f"built with {args}, input {tuple(x.shape)}: {why}")


def check_MultiHeadAttention(MultiHeadAttention: Callable, hidden: bool = False) -> None:
    """Check ``MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)``."""
    exercise = "MultiHeadAttention"
    require_callable(exercise, MultiHeadAttention)
    check_rules(exercise, MultiHeadAttention)
    _mha_structure(exercise, MultiHeadAttention)
    _mha_values(exercise, MultiHeadAttention)
    batch = book_batch()
    configs = [
        ((4, 6, 8, 0.3, 3), [Case("(2, 8, 4)", (rand(2, 8, 4, seed=112),)), Case("T=5 < context_length", (rand(2, 5, 4, seed=113),))]),
        ((3, 2, 6, 0.0, 2), [Case("book batch (2, 6, 3)", (batch,))]),
    ]
    if hidden:
        configs += [
            ((6, 12, 10, 0.1, 4, True), [Case("qkv_bias=True, T=7", (rand(3, 7, 6, seed=114),))]),
            ((5, 4, 6, 0.0, 1), [Case("one head", (rand(2, 6, 5, seed=115),))]),
            ((8, 16, 12, 0.2, 16), [Case("16 heads of size 1", (rand(2, 12, 8, seed=116),)),
                                    Case("T=1", (rand(3, 1, 8, seed=117),))]),
            ((3, 2, 6, 0.0, 2), [Case("batch of 3, T=3", (rand(3, 3, 3, seed=118),))]),
        ]
    check_module_class(exercise, MultiHeadAttention, reference.MultiHeadAttention, configs, hidden=hidden)
    if hidden:
        student, _ = build_student(exercise, MultiHeadAttention, reference.MultiHeadAttention, (8, 16, 12, 0.0, 16))
        check_causal_module(exercise, student, rand(2, 9, 8, seed=119))


# ------------------------------------------------------------------------------------------
# count_parameters
# ------------------------------------------------------------------------------------------
def _count_cases(hidden: bool) -> list[Case]:
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        gpt2 = reference.MultiHeadAttention(768, 768, 1024, 0.0, num_heads=12)
        frozen = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
        frozen[0].requires_grad_(False)
        cases = [
            Case("exercise 3.3: GPT-2 small attention (768, 768, 1024, 0.0, 12)", (gpt2,)),
            Case("nn.Linear(3, 2)", (nn.Linear(3, 2),)),
            Case("Sequential with a frozen first layer", (frozen,)),
        ]
        if hidden:
            tied = nn.Sequential(nn.Linear(5, 5, bias=False), nn.Linear(5, 5, bias=False))
            tied[1].weight = tied[0].weight
            wrapper = reference.MultiHeadAttentionWrapper(3, 2, 6, 0.0, 4, True)
            cases += [
                Case("MultiHeadAttentionWrapper(3, 2, 6, 0.0, 4, qkv_bias=True)", (wrapper,)),
                Case("two layers sharing one weight", (tied,)),
                Case("a module without parameters", (nn.ReLU(),)),
                Case("CausalAttention(16, 8, 32, 0.1)", (reference.CausalAttention(16, 8, 32, 0.1),)),
            ]
    finally:
        torch.random.set_rng_state(state)
    return cases


def _count_diagnosis(module: nn.Module, got: object) -> str | None:
    expected = reference.count_parameters(module)
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if not isinstance(got, (int, float)) or isinstance(got, bool) or got == expected:
        return None
    everything = sum(p.numel() for p in module.parameters())
    buffers = sum(b.numel() for b in module.buffers())
    state = sum(t.numel() for t in module.state_dict().values())
    if got == len([p for p in module.parameters() if p.requires_grad]) or got == len(list(module.parameters())):
        return f"got {got:,}: that is the number of parameter TENSORS; count their elements with p.numel()"
    if buffers and got in (expected + buffers, everything + buffers, state):
        return (f"got {got:,}, expected {expected:,}: buffers are counted too (the mask has {buffers:,} entries). "
                f"Buffers are not trained: count module.parameters(), not state_dict()")
    if got == everything and everything != expected:
        return (f"got {got:,}, expected {expected:,}: parameters with requires_grad=False are counted too. "
                f"Count only trainable ones: `if p.requires_grad`")
    if got == state:
        return f"got {got:,}, expected {expected:,}: a weight shared by two layers is counted twice (state_dict lists it twice)"
    return None


def check_count_parameters(count_parameters: Callable, hidden: bool = False) -> None:
    """Check ``count_parameters(module)``: the number of trainable parameters (GPT-2 small attention: 2,360,064)."""
    exercise = "count_parameters"
    require_callable(exercise, count_parameters)
    check_rules(exercise, count_parameters)
    cases = _count_cases(hidden)
    for case in cases:
        got = call_student(exercise, count_parameters, case)
        problem = _count_diagnosis(case.args[0], got)
        if problem:
            fail(exercise, problem, case)
        if isinstance(got, float) and not float(got).is_integer():
            fail(exercise, f"expected a whole number, got {got}", case)
    compare_function(exercise, count_parameters, reference.count_parameters, cases, rules_apply=False)
