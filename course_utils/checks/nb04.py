"""Self-checks for notebook 04: causal masks, masked attention weights and ``CausalAttention``.

Besides comparing values with the reference, the checks look for the usual mistakes and name them:
a mask that covers the diagonal or the past, weights that do not sum to one, a missing or wrong
scale, a mask that is a plain attribute instead of a buffer, a mask not cut to the input's length,
dropout in the wrong place or still active in ``eval()`` mode. The module helpers here are reused
by notebook 05's checks.
"""

from __future__ import annotations

import copy
import math
from typing import Callable

import torch

from course_utils import reference
from course_utils.checks.core import (
    Case,
    CheckFailed,
    build_pair,
    call_student,
    check_causal,
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
from course_utils.data import book_batch, book_inputs

__all__ = ["check_causal_mask", "check_causal_attention_weights", "check_CausalAttention"]


# ------------------------------------------------------------------------------------------
# causal_mask
# ------------------------------------------------------------------------------------------
def _mask_diagnosis(got: object, T: int) -> str | None:
    """One sentence naming what is wrong with a ``(T, T)`` causal mask, or ``None``."""
    if not isinstance(got, torch.Tensor):
        return f"expected a torch.Tensor of shape ({T}, {T}), got {type(got).__name__}"
    if tuple(got.shape) != (T, T):
        return f"expected shape ({T}, {T}) for num_tokens={T}, got {tuple(got.shape)}"
    if got.dtype != torch.bool:
        return (f"expected dtype torch.bool, got {got.dtype}: `masked_fill` needs a boolean mask "
                f"(add `.bool()` or build it with dtype=torch.bool)")
    above = torch.ones(T, T, dtype=torch.bool).triu(1)
    below = torch.ones(T, T, dtype=torch.bool).tril(-1)
    diag = torch.eye(T, dtype=torch.bool)
    if T > 1 and got[below].all() and not got[above].any():
        return ("the meaning is inverted: True must mark the FUTURE (above the diagonal, j > i), "
                "the positions a token may NOT attend to. Did you use tril instead of triu?")
    if got[diag].any():
        i = int(got[diag].nonzero()[0])
        return (f"the diagonal is masked: a token must see itself (entry [{i}, {i}] is True). "
                f"Use triu with diagonal=1")
    missing = (above & ~got).nonzero()
    if len(missing):
        i, j = missing[0].tolist()
        return f"position {i} sees token {j}: entry [{i}, {j}] must be True because {j} > {i} is in the future"
    extra = (below & got).nonzero()
    if len(extra):
        i, j = extra[0].tolist()
        return f"position {i} cannot see the earlier token {j}: entry [{i}, {j}] must be False (only j > i is masked)"
    return None


def check_causal_mask(causal_mask: Callable, hidden: bool = False) -> None:
    """Check ``causal_mask(num_tokens)``: bool ``(T, T)``, True exactly where ``j > i``."""
    exercise = "causal_mask"
    require_callable(exercise, causal_mask)
    check_rules(exercise, causal_mask)
    sizes = [6, 1, 4] + ([2, 10, 33] if hidden else [])
    for T in sizes:
        case = Case(f"num_tokens={T}", (T,))
        got = call_student(exercise, causal_mask, case)
        problem = _mask_diagnosis(got, T)
        if problem:
            fail(exercise, problem, case)
    compare_function(exercise, causal_mask, reference.causal_mask,
                     [Case(f"num_tokens={T}", (T,)) for T in sizes], rules_apply=False)


# ------------------------------------------------------------------------------------------
# causal_attention_weights
# ------------------------------------------------------------------------------------------
def _book_queries_keys() -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys ``(6, 2)`` of the book's ``SelfAttention_v2`` built with seed 789."""
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(789)
        sa = reference.SelfAttention_v2(3, 2)
    finally:
        torch.random.set_rng_state(state)
    x = book_inputs()
    with torch.no_grad():
        return sa.W_query(x), sa.W_key(x)


def _masked_softmax(scores: torch.Tensor) -> torch.Tensor:
    T = scores.shape[-1]
    return torch.softmax(scores.masked_fill(reference.causal_mask(T), float("-inf")), dim=-1)


def _weights_diagnosis(queries: torch.Tensor, keys: torch.Tensor, got: object) -> str | None:
    """Name the mistake behind wrong causal attention weights, when it has a known symptom."""
    expected = reference.causal_attention_weights(queries, keys)
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None  # the generic comparison explains shapes
    if tensor_difference(expected, got) is None:
        return None
    T, dk = expected.shape[-1], keys.shape[-1]
    g = got.detach().to(torch.float64)
    if torch.isnan(g[..., 0, :]).any():
        return ("row 0 is NaN: the diagonal is masked, but a token must see itself (token 0 has nobody else). "
                "Mask only j > i: triu with diagonal=1")
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    leaks = (g.abs() > 1e-6) & future
    if leaks.any():
        idx = leaks.nonzero()[0].tolist()
        i, j = idx[-2], idx[-1]
        extra = ""
        if T > 1 and (g.abs() <= 1e-6)[..., torch.ones(T, T, dtype=torch.bool).tril(-1)].all():
            extra = " The mask looks inverted (tril instead of triu?)"
        elif (g.abs() > 1e-6).all():
            extra = (" Every weight is non-zero: was the mask filled with 0 instead of -inf? exp(0) = 1 is not "
                     "zero weight")
        return (f"position {i} sees token {j}: weight [{', '.join(map(str, idx))}] is {g[tuple(idx)].item():.4g}, "
                f"but weights above the diagonal must be 0{'.' if extra else ''}{extra}")
    sums = g.sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
        idx = (sums - 1).abs().argmax()
        idx = list(torch.unravel_index(idx, sums.shape))
        return (f"rows do not sum to 1 (row {[int(k) for k in idx]} sums to {sums[tuple(idx)].item():.4f}): "
                f"zeroing the future after softmax needs a renormalisation (divide each row by its sum); "
                f"or mask with -inf before softmax")
    scores = (queries @ keys.transpose(-2, -1)).to(torch.float64)
    for wrong, why in ((scores, "the scores are not scaled: divide them by sqrt(d_k) before softmax"),
                       (scores / dk, "the scores are divided by d_k; divide by sqrt(d_k)"),
                       (scores / math.sqrt(queries.shape[-2]), "the scores are divided by sqrt(T); divide by sqrt(d_k), "
                                                              "d_k = keys.shape[-1]")):
        if tensor_difference(_masked_softmax(wrong), g) is None:
            return why
    if tensor_difference(_masked_softmax(scores.transpose(-2, -1) / math.sqrt(dk)), g) is None:
        return "the scores are transposed: use queries @ keys^T (row i = query i), not keys @ queries^T"
    return None


def check_causal_attention_weights(causal_attention_weights: Callable, hidden: bool = False) -> None:
    """Check ``causal_attention_weights(queries, keys)`` -> ``(..., T, T)`` scaled, masked, softmaxed."""
    exercise = "causal_attention_weights"
    q, k = _book_queries_keys()
    cases = [
        Case("book: SelfAttention_v2 with seed 789, (6, 2)", (q, k)),
        Case("T=5, d_k=4, random", (rand(5, 4, seed=41, low=-2, high=2), rand(5, 4, seed=42, low=-2, high=2))),
    ]
    if hidden:
        cases += [
            Case("batch of 3, T=7, d_k=3", (rand(3, 7, 3, seed=43, low=-2, high=2), rand(3, 7, 3, seed=44, low=-2, high=2))),
            Case("two batch dims (2, 4, 5, 8): heads", (rand(2, 4, 5, 8, seed=45, low=-2, high=2),
                                                         rand(2, 4, 5, 8, seed=46, low=-2, high=2))),
            Case("T=1", (rand(1, 6, seed=47), rand(1, 6, seed=48))),
            Case("d_k=64 (scaling matters)", (rand(6, 64, seed=49, low=-1.5, high=1.5), rand(6, 64, seed=50, low=-1.5, high=1.5))),
            Case("float64, T=9, d_k=5", (rand(9, 5, seed=51, low=-3, high=3, dtype=torch.float64),
                                          rand(9, 5, seed=52, low=-3, high=3, dtype=torch.float64))),
        ]
    require_callable(exercise, causal_attention_weights)
    check_rules(exercise, causal_attention_weights)
    compare_function(exercise, causal_attention_weights, reference.causal_attention_weights, cases, rules_apply=False,
                     diagnose=lambda case, got: _weights_diagnosis(*case.args, got))
    check_follows_device(exercise, causal_attention_weights)


def check_follows_device(exercise: str, fn: Callable) -> None:
    """Fail unless ``fn(queries, keys)`` works on whatever device its inputs are on.

    PyTorch's ``meta`` device stands in for a GPU: tensors there have shapes but no data, and
    mixing them with a CPU tensor raises, just as mixing CUDA and CPU tensors does.
    """
    # (T, d_k) inputs: this tests devices only; batch dimensions are the other cases' job.
    q, k = torch.empty(5, 4, device="meta"), torch.empty(5, 4, device="meta")
    try:
        out = fn(q, k)
    except NotImplementedError:
        return  # an operation with no meta kernel says nothing about devices
    except Exception as exc:  # noqa: BLE001
        fail(exercise, f"inputs on another device (here 'meta', standing in for a GPU) raised "
                       f"{type(exc).__name__}: {exc}. Build the mask on the scores' device: "
                       f"torch.ones(T, T, device=scores.device) or causal_mask(T, device=scores.device)")
    if isinstance(out, torch.Tensor) and out.device.type != "meta":
        fail(exercise, f"inputs on device 'meta' gave an output on {out.device}: keep every tensor on the inputs' device")


# ------------------------------------------------------------------------------------------
# Module checks, shared with notebook 05
# ------------------------------------------------------------------------------------------
def build_student(exercise: str, cls: Callable, reference_cls: Callable, args: tuple, seed: int = 123):
    """:func:`core.build_pair` that also catches a constructor returning something unusable."""
    student, ref = build_pair(exercise, cls, reference_cls, args, seed)
    if not isinstance(student, torch.nn.Module):
        fail(exercise, f"{getattr(cls, '__name__', cls)} must be an nn.Module subclass")
    return student, ref


def run_module(exercise: str, module: torch.nn.Module, x: torch.Tensor, what: str, seed: int = 7) -> object:
    """Call ``module(x)`` under a fixed seed, turning errors into a readable failure."""
    torch.manual_seed(seed)
    return call_student(exercise, module, Case(what, (x.clone(),)))


def check_mask_buffer(exercise: str, module: torch.nn.Module, context_length: int, where: str) -> None:
    """The ``(context_length, context_length)`` mask must be a registered, persistent buffer."""
    shape = (context_length, context_length)
    for name, value in vars(module).items():
        if isinstance(value, torch.Tensor) and tuple(value.shape) == shape:
            fail(exercise, f"{where}: mask is a plain attribute, not a buffer: `self.{name} = ...` is not saved in "
                           f"state_dict and stays behind when the module moves with .to(device). Use "
                           f"self.register_buffer('{name}', ...)")
    buffers = [name for name, b in module.named_buffers() if tuple(b.shape) == shape]
    if not buffers:
        found = [f"{n} {tuple(b.shape)}" for n, b in module.named_buffers()]
        fail(exercise, f"{where}: no buffer of shape {shape} found (buffers: {found or 'none'}). Build the mask for "
                       f"context_length in __init__ and register it with self.register_buffer('mask', ...)")
    keys = module.state_dict().keys()
    missing = [n for n in buffers if n not in keys]
    if len(missing) == len(buffers):
        fail(exercise, f"{where}: the mask buffer '{missing[0]}' is not in state_dict (persistent=False?). "
                       f"Register it as an ordinary buffer so that a saved model keeps it")


def check_moves_with_module(exercise: str, student: torch.nn.Module, ref: torch.nn.Module, x: torch.Tensor,
                            where: str) -> None:
    """``.to(torch.float64)`` and ``.to('meta')`` must carry everything the forward pass needs."""
    s64 = copy.deepcopy(student).to(torch.float64).eval()
    r64 = copy.deepcopy(ref).to(torch.float64).eval()
    got = run_module(exercise, s64, x.to(torch.float64), f"{where}, after .to(torch.float64)")
    problem = tensor_difference(r64(x.to(torch.float64)), got)
    if problem:
        fail(exercise, f"{where}: after module.to(torch.float64) with a float64 input: {problem}. "
                       f"Do not fix a dtype inside forward; let the buffers and parameters follow the module")
    meta = copy.deepcopy(student).to("meta").eval()
    left = [f"{n} ({v.device})" for n, v in list(meta.named_parameters()) + list(meta.named_buffers())
            if v.device.type != "meta"]
    left += [f"{n} ({v.device})" for n, v in vars(meta).items() if isinstance(v, torch.Tensor)]
    if left:
        fail(exercise, f"{where}: after module.to('meta') these tensors stayed behind: {left}. On a GPU they would stay "
                       f"on the CPU. Make them parameters or buffers")
    try:
        torch.manual_seed(7)
        meta(x.to("meta"))
    except Exception as exc:  # noqa: BLE001
        fail(exercise, f"{where}: after module.to('meta') (a stand-in for .to('cuda')) the forward pass raised "
                       f"{type(exc).__name__}: {exc}. Every tensor forward uses must move with the module "
                       f"(a buffer), or be created on x.device")


def check_truncated(exercise: str, student: torch.nn.Module, x_short: torch.Tensor, context_length: int,
                    where: str) -> None:
    """An input shorter than ``context_length`` must work (the mask is cut to ``[:T, :T]``)."""
    student.eval()
    try:
        torch.manual_seed(7)
        student(x_short.clone())
    except NotImplementedError:
        fail(exercise, "not implemented yet: replace `raise NotImplementedError()` with your code and run the cell")
    except Exception as exc:  # noqa: BLE001
        fail(exercise, f"{where}: mask not truncated to num_tokens? With T={x_short.shape[1]} tokens and "
                       f"context_length={context_length} your forward raised {type(exc).__name__}: {exc}. "
                       f"Slice the buffer to mask[:num_tokens, :num_tokens]")


def check_too_long_raises(exercise: str, student: torch.nn.Module, d_in: int, context_length: int, where: str) -> None:
    """An input with ``context_length + 1`` tokens must raise: the mask does not cover it."""
    x = rand(1, context_length + 1, d_in, seed=77)
    student.eval()
    try:
        out = student(x)
    except NotImplementedError:
        fail(exercise, "not implemented yet: replace `raise NotImplementedError()` with your code and run the cell")
    except Exception:  # noqa: BLE001 - raising is what we want
        return
    fail(exercise, f"{where}: an input of T = context_length + 1 = {context_length + 1} tokens returned "
                   f"{describe_shape(out)} instead of raising an error. The mask covers only context_length "
                   f"positions; is it rebuilt for every input instead of being a buffer?")


def check_dropout_modes(exercise: str, student: torch.nn.Module, x: torch.Tensor, where: str) -> None:
    """With dropout > 0: ``eval()`` must be deterministic, ``train()`` must not be."""
    student.eval()
    a = run_module(exercise, student, x, f"{where}, eval()", seed=1)
    b = run_module(exercise, student, x, f"{where}, eval()", seed=2)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and not torch.allclose(a, b):
        fail(exercise, f"{where}: dropout is active in eval() mode: two calls in eval() gave different outputs. "
                       f"Use nn.Dropout, or F.dropout(weights, p, training=self.training)")
    student.train()
    a = run_module(exercise, student, x, f"{where}, train()", seed=1)
    b = run_module(exercise, student, x, f"{where}, train()", seed=2)
    student.eval()
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b):
        fail(exercise, f"{where}: no dropout in train() mode: with dropout=0.5 two calls gave the same output. "
                       f"Apply self.dropout to the attention weights")


def check_causal_module(exercise: str, student: torch.nn.Module, x: torch.Tensor) -> None:
    """No output position may depend on later tokens (module in ``eval()`` mode)."""
    student.eval()
    try:
        check_causal(exercise, lambda inp: student(inp), x)
    except CheckFailed as err:
        if "at position 0 " in str(err) and x.shape[1] > 2:
            changed = x.clone()
            changed[:, 2:] = rand(*changed[:, 2:].shape, seed=99) * 3
            with torch.no_grad():
                moved = (student(changed)[:, 1] - student(x)[:, 1]).abs().max().item()
            if moved < 1e-5:
                raise CheckFailed(f"{err} Only position 0 leaks: the diagonal is masked too, so row 0 has no "
                                  f"allowed key left and spreads its weight over every token. Use triu with "
                                  f"diagonal=1") from None
            raise CheckFailed(f"{err} Every position leaks: is the mask applied to the scores at all?") from None
        raise


def check_module_class(exercise: str, cls: Callable, reference_cls: Callable, configs, *, d_in_index: int = 0,
                       hidden: bool = False) -> None:
    """Everything a causal attention class must satisfy, then the value comparison.

    ``configs`` is a list of ``(constructor_args, cases)`` as for :func:`core.compare_module`; the
    first config must have ``dropout > 0`` and a case with ``T < context_length``.
    """
    require_callable(exercise, cls)
    check_rules(exercise, cls)
    args = configs[0][0]
    d_in, context_length = args[0], args[2]
    where = f"built with {args}"
    student, ref = build_student(exercise, cls, reference_cls, args)
    check_mask_buffer(exercise, student, context_length, where)
    x_full = rand(2, context_length, d_in, seed=71)
    x_short = rand(2, max(1, context_length - 2), d_in, seed=72)
    check_truncated(exercise, student, x_short, context_length, where)
    check_dropout_modes(exercise, student, x_full, where)
    check_causal_module(exercise, student, x_full)
    check_too_long_raises(exercise, student, d_in, context_length, where)
    compare_module(exercise, cls, reference_cls, configs, train=True, quiet=True)
    check_moves_with_module(exercise, student, ref, x_short, where)
    passed(exercise, f"outputs agree in eval() and train() mode for {len(configs)} constructions; the mask is a buffer, "
                     f"cut to the input's length, and no position sees the future")


def check_CausalAttention(CausalAttention: Callable, hidden: bool = False) -> None:
    """Check ``CausalAttention(d_in, d_out, context_length, dropout, qkv_bias=False)``."""
    batch = book_batch()
    configs = [
        ((3, 2, 6, 0.5), [Case("book batch (2, 6, 3)", (batch,)), Case("T=4 < context_length", (rand(2, 4, 3, seed=61),))]),
        ((3, 2, 6, 0.0), [Case("book batch (2, 6, 3)", (batch,))]),
    ]
    if hidden:
        configs += [
            ((5, 4, 10, 0.3, True), [Case("qkv_bias=True, (3, 7, 5)", (rand(3, 7, 5, seed=62),)),
                                     Case("T = context_length", (rand(1, 10, 5, seed=63),))]),
            ((8, 8, 16, 0.1), [Case("T=1", (rand(2, 1, 8, seed=64),)), Case("(4, 16, 8)", (rand(4, 16, 8, seed=65),))]),
            ((3, 1, 4, 0.0), [Case("d_out=1, (5, 3, 3)", (rand(5, 3, 3, seed=66),))]),
        ]
    check_module_class("CausalAttention", CausalAttention, reference.CausalAttention, configs, hidden=hidden)
    if hidden:
        student, ref = build_student("CausalAttention", CausalAttention, reference.CausalAttention, (5, 4, 10, 0.3, True))
        check_mask_buffer("CausalAttention", student, 10, "built with (5, 4, 10, 0.3, True)")
        check_causal_module("CausalAttention", student, rand(3, 7, 5, seed=67))
