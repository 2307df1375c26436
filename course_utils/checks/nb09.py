"""Self-checks for notebook 09: the capstone, a tiny causal transformer.

Positions (``sinusoidal_positions``, ``LearnedPositionalEmbedding``), the pre-LayerNorm
``TransformerBlock``, the whole ``TinyGPT`` and one optimisation step, ``train_step``.

The module checks build your class, check its parameter shapes (naming a missing LayerNorm, a
feed-forward of the wrong width, a head with a bias, tied weights), then **copy the reference's
weights into it** in parameter order, so that your own initialisation never matters, and compare
outputs in ``eval()`` mode and, with dropout, in ``train()`` mode under the same seed. ``TinyGPT``
must also be causal as a whole: no logit may change when only later tokens change.

The block and the model must also work with notebook 08's KV cache: fed in pieces with
``use_cache=True`` after a reset, they must give the outputs of the whole input, and again after
``reset_cache()``; a failure says which piece differs and, from the student's own module, why (the
cache never filled, the piece read as a new sequence, positions that restart at 0).

``generate`` runs on :class:`CachedStandInLM`, a stand-in language model with a cache of its own (a
causal mean, no attention), which writes down every call: the tokens written are compared with the
reference's, position by position, and so are the calls (the prompt once, then one token per step).

``train_step`` runs on a small stand-in language model (an embedding and a linear layer: no
attention, so nothing of an answer) with an optimizer that records the gradients it is given when
``step()`` is called. Two steps are compared with the expected ones: the returned loss, the
gradients the optimizer stepped with, and the parameters after each step.

Each check is a spec (:mod:`course_utils.checks.spec`), judged on plain data in the self-check and, under the
grader, outside the kernel: the functions' calls (the one with an odd ``d_model`` too), one probed construction
per build of the positions module, the block and the model with the test weights loaded (``start=`` among the
inputs; for the block and the model, the names under which a parameter appears twice and ``context_length``
too: :func:`_block_plan`, :func:`_gpt_plan`), each build's cached path as one trace (:mod:`course_utils.checks.cached`,
:func:`_cached_steps`), and each spec's trace of ``train_step`` and of ``generate`` (:func:`_step_run`,
:func:`_generate_run`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from typing import Callable, Sequence

import torch
import torch.nn as nn

from course_utils.checks import expected as _expected
from course_utils.checks import modules
from course_utils.checks import probe as _probe
from course_utils.checks import spec as _spec
from course_utils.checks import probed, wire
from course_utils.checks import ladder, symptoms
from course_utils.checks.cached import cached_trace, check_cached_path, piece_sizes, trace_has_form
from course_utils.checks.core import (
    NOT_IMPLEMENTED,
    is_stub_data,
    is_stub_error,
    causal_inputs,
    construct,
    Case,
    CheckFailed,
    _hinted,
    describe_shape,
    expect,
    expected_parameter_shapes,
    fail,
    hidden_cases,
    mistake_outputs,
    random_outputs_comparable,
    modes_to_compare,
    passed,
    rand,
    tensor_difference,
)
from course_utils.device import manual_seed

__all__ = [
    "check_sinusoidal_positions",
    "check_LearnedPositionalEmbedding",
    "check_TransformerBlock",
    "check_TinyGPT",
    "check_train_step",
    "check_generate",
]


def tokens(b: int, T: int, vocab_size: int, seed: int) -> torch.Tensor:
    """Random token ids ``(b, T)`` from their own generator."""
    return torch.randint(0, vocab_size, (b, T), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------
# sinusoidal_positions
# ------------------------------------------------------------------------------------------
def _sinusoid_diagnose(case: Case, got: object, want: object) -> str | None:
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        return None
    P, d = want.shape
    if tuple(got.shape) == (d, P) and d != P:
        return "rows are positions and columns are dimensions: return (num_positions, d_model)."
    if got.shape != want.shape:
        return None
    if torch.allclose(got[0], torch.zeros(d)):
        return ("row 0 is all zeros: cos(0) = 1, so position 0 is [0, 1, 0, 1, ...]. Are the odd columns filled with "
                "cos?")
    return _frequency_hint(got.double(), want.double()) or _layout_hint(got.double(), want.double())


def _overlapping_pairs(want: torch.Tensor, backwards: bool) -> torch.Tensor:
    """``(P, d)``: a loop over the pairs that writes pair ``i`` into columns ``i`` and ``i + 1`` (not ``2i`` and
    ``2i + 1``) into zeros, pair 0 first (``backwards``: the last pair first), so each pair overwrites a column of the
    pair written before it. Built from the right sines and cosines, ``want``'s columns. (Within a pair the order of
    the two writes changes nothing.)"""
    found = torch.zeros_like(want)
    pairs = range(want.shape[1] // 2)
    for i in (reversed(pairs) if backwards else pairs):
        found[:, i], found[:, i + 1] = want[:, 2 * i], want[:, 2 * i + 1]
    return found


_OVERLAP_FIX = ("Write pair i into its own two columns, pe[:, 2 * i] (sin) and pe[:, 2 * i + 1] (cos), or all at once, "
                "pe[:, 0::2] = sin and pe[:, 1::2] = cos.")

#: The column layouts of a loop over the pairs that writes them into the wrong columns (issue 36), each with its
#: words: ``(build from the right encodings, words)``; named where it alone gives the student's table.
_LAYOUT_FAMILY = (
    (functools.partial(_overlapping_pairs, backwards=False),
     "pair i is written into columns i and i + 1 instead of 2i and 2i + 1, so the pairs overlap: each pair's sine "
     "overwrites the cosine of the pair before. Columns 0..d_model/2 - 1 end up holding the sines of pairs 0..d_model/2 "
     "- 1, column d_model/2 the last pair's cosine, and the columns after it stay zero. " + _OVERLAP_FIX),
    (functools.partial(_overlapping_pairs, backwards=True),
     "pair i is written into columns i and i + 1 instead of 2i and 2i + 1, so the pairs overlap: looping from the last "
     "pair down, each pair's cosine overwrites the sine of the pair after it. Column 0 ends up holding the sine of pair "
     "0, columns 1..d_model/2 the cosines of pairs 0..d_model/2 - 1, and the columns after them stay zero. "
     + _OVERLAP_FIX),
)


def _layout_hint(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """Where ``got`` ``(P, d)`` holds our columns (sines and cosines of the right angles) or zeros, in other places
    (issue 36): the member of :data:`_LAYOUT_FAMILY` that alone gives it, else which columns are zero or hold
    another column's values. ``None`` where some column is none of ours, or matches several."""
    P, d = want.shape
    named = [words for build, words in _LAYOUT_FAMILY
             if torch.allclose(build(want), got, atol=1e-4, rtol=1e-4)]
    if len(named) == 1:
        return named[0]
    columns = [torch.zeros(P, dtype=want.dtype)] + [want[:, j] for j in range(d)]  # 0: zeros; 1 + j: column j
    held = []
    for j in range(d):
        matches = [m for m, c in enumerate(columns) if torch.allclose(got[:, j], c, atol=1e-4, rtol=1e-4)]
        if len(matches) != 1:
            return None
        held.append(matches[0] - 1)  # -1: zeros
    wrong = [j for j in range(d) if held[j] != j]
    if not wrong:
        return None
    if all(held[j] == -1 for j in wrong):
        return (f"column{'s' if len(wrong) > 1 else ''} {', '.join(map(str, wrong))} "
                f"{'are' if len(wrong) > 1 else 'is'} all zero: nothing was written there, where the other columns "
                f"are right. Every pair i = 0..d_model/2 - 1 fills two columns, 2i with the sine and 2i + 1 with the "
                f"cosine: does the loop cover every pair, and write each into its own two columns?")
    j = next(j for j in wrong if held[j] != -1)
    m = held[j]
    kind = "sine" if m % 2 == 0 else "cosine"
    return (f"column {j} holds the {kind} of pair {m // 2}, which belongs in column {m}: pair i's sine goes in column "
            f"2i and its cosine in column 2i + 1 (pe[:, 0::2] = sin, pe[:, 1::2] = cos).")


def _frequency_hint(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """Where every column pair of ``got`` ``(P, d)`` is the sine and cosine of one angle (the layout right) but the
    angles are not ours: the frequencies (each pair's angle at position 1) read off both, named where they are those
    of a family member (:func:`_frequency_family`), else the first pair whose frequency differs."""
    P, d = want.shape
    if P < 2 or d < 2 or not torch.allclose(got[:, 0::2] ** 2 + got[:, 1::2] ** 2, torch.ones_like(got[:, 0::2]), atol=1e-3):
        return None
    turned, meant = torch.atan2(got[1, 0::2], got[1, 1::2]), torch.atan2(want[1, 0::2], want[1, 1::2])
    off = [i for i in range(d // 2) if abs(float(turned[i] - meant[i])) > 1e-3]
    if not off:
        return None
    i = off[0]
    said = (f"each column pair holds the sine and cosine of one angle, but the angles are off: pair {i} (columns "
            f"{2 * i}, {2 * i + 1}) turns by {float(turned[i]):.3g} per position, where 1 / 10000 ** ({2 * i} / {d}) = "
            f"{float(meant[i]):.3g}")
    named = _frequency_family(turned, d)
    if named:
        return f"{said}. {named}"
    return (f"{said}. The frequency of pair i is 1 / 10000 ** (2i / d_model), for i = 0, 1, ..., d_model / 2 - 1 "
            f"(pair 0 turns by 1 per position).")


def _frequency_family(turned: torch.Tensor, d: int) -> str | None:
    """The member of a family of frequency formulas (the exponent 2i / d_model with one thing changed) whose pair
    frequencies ``(d/2,)`` are ``turned``, in words; ``None`` where none is. Computed from ``d`` alone."""
    i = torch.arange(d // 2, dtype=torch.float64)
    family = (
        (10000.0 ** (-(2 * i + 2) / d),
         "Every pair turns at the next pair's frequency, 1 / 10000 ** ((2i + 2) / d_model): the pairs are counted "
         "from i = 1 (2i runs 2, 4, ..., d_model) instead of from 0. 2i runs 0, 2, ..., d_model - 2: "
         "torch.arange(0, d_model, 2), so that pair 0 turns by 1 radian per position."),
        (10000.0 ** (-2 * i) / d,
         "Pair i turns by 1 / 10000 ** 2i / d_model, that is (1 / 10000 ** 2i) / d_model: the frequency of pair i "
         "is 1 / 10000 ** (2i / d_model): mind the parentheses around the exponent."),
    )
    for frequencies, words in family:
        if frequencies.max() < math.pi and torch.allclose(turned.double(), frequencies, rtol=1e-3, atol=1e-6):
            return words
    return None


#: The key of ``sinusoidal_positions``' call with an odd ``d_model``, which must raise.
_ODD = "must raise: num_positions=4, d_model=5"


def _sinusoid_cases() -> list[Case]:
    return [
        Case("num_positions=6, d_model=4", (6, 4)),
        Case("num_positions=16, d_model=32 (the trained model's size)", (16, 32)),
        Case("one position, d_model=2", (1, 2)),
    ]


_sinusoid_all = _spec.with_hidden("sinusoidal_positions", _sinusoid_cases)


def _judge_sinusoid(plan: list[_spec.Step], outcomes: _spec.Outcomes) -> str:
    exercise = "sinusoidal_positions"
    compared = [s for s in plan if s.key != _ODD]
    passed(exercise, _spec.compare_outcomes(exercise, compared, outcomes, atol=1e-4, rtol=1e-4,
                                           diagnose=_sinusoid_diagnose))
    got = outcomes[_ODD]
    if is_stub_error(got):
        fail(exercise, NOT_IMPLEMENTED)
    if isinstance(got, BaseException) and not isinstance(got, ValueError):
        fail(exercise, f"sinusoidal_positions(4, 5) raised {type(got).__name__}: {got}. An odd d_model cannot hold "
                       f"sin and cos pairs: raise a ValueError that says so")
    if not isinstance(got, BaseException):
        fail(exercise, "sinusoidal_positions(4, 5) returned a result: sin and cos come in pairs, so an odd d_model "
                       "must raise a ValueError")
    return "an odd d_model raises a ValueError"


check_sinusoidal_positions = _spec.declare(_spec.Spec(
    "sinusoidal_positions",
    lambda hidden: _spec.calls(_sinusoid_all(hidden)) + [_spec.Step(_ODD, Case("num_positions=4, d_model=5", (4, 5)))],
    _judge_sinusoid),
    """Check ``sinusoidal_positions(num_positions, d_model)`` -> ``(num_positions, d_model)``.""")


# ------------------------------------------------------------------------------------------
# Modules with the same test weights copied in
# ------------------------------------------------------------------------------------------
def set_test_weights(module: nn.Module) -> nn.Module:
    """Overwrite every parameter of ``module``, in creation order, with fixed random test values.

    Parameter ``i`` gets uniform values from its own seed: a matrix in ``±1/sqrt(columns)``, a vector
    (a bias, a LayerNorm's weight or bias) in ``±1``. Two modules whose parameters have the same shapes
    in the same order get the same weights, whatever their own initialisation did; the LayerNorms
    no longer start as the identity, so using one norm for another shows.
    """
    with torch.no_grad():
        for i, parameter in enumerate(module.parameters()):
            bound = 1.0 / parameter.shape[-1] ** 0.5 if parameter.dim() > 1 else 1.0
            parameter.copy_(rand(*parameter.shape, seed=9700 + i, low=-bound, high=bound))
    return module


def expected_output(exercise: str, case: Case) -> object:
    """The reference module's output on a module case, with the test weights (live or recorded)."""
    from course_utils.checks.core import construct, module_output

    return expect(exercise, case.key(), lambda: module_output(
        set_test_weights(construct(_expected.reference(exercise), case.build)), case))


def compare_modules(exercise: str, views: dict, configs: Sequence[tuple[tuple, Sequence[Case]]], *,
                    diagnose: Callable | None = None, atol: float = 1e-5, rtol: float = 1e-4) -> int:
    """For each ``(build, cases)``: the student's module with the test weights (``views[build]``, a probed
    construction) must give the expected outputs in ``eval()`` mode and, when the build's dropout (its float
    argument) is positive, in ``train()`` mode under the same seed (7). Returns the number of outputs compared."""
    count = 0
    for build, cases in configs:
        view = views[tuple(build)]
        probed.built(exercise, view, build)
        dropout = next((a for a in build if isinstance(a, float)), 0.0)  # the one float argument, if any
        for mode in modes_to_compare(exercise, dropout > 0):
            for case in cases:
                mcase = Case(case.name, case.args, case.kwargs, build=build, mode=mode)
                want = expected_output(exercise, mcase)
                if _expected.is_recording():
                    mistake_outputs(exercise, mcase)
                got = view.forward(mode, 7, case.args[0], None, dict(case.kwargs) or None)
                _spec.judge_forward(exercise, got, want, mcase, atol=atol, rtol=rtol, diagnose=diagnose)
                count += 1
    return count


class OneDevice(torch.overrides.TorchFunctionMode):
    """Raise when an operation mixes a tensor on the CPU with one on another device, as CUDA would.

    A module moved to ``"meta"`` (a device without data) stands in for one moved to a GPU; some
    operations accept a CPU index with a meta weight, which a GPU would refuse. A CPU scalar (0-dim)
    is allowed, as on a GPU.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devices = {t.device.type for t in _tensors((args, kwargs)) if t.dim() > 0 or t.device.type != "cpu"}
        if len(devices) > 1:
            raise RuntimeError(f"{getattr(func, '__name__', func)} got tensors on different devices: "
                               f"{' and '.join(sorted(devices))}")
        return func(*args, **kwargs)


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def moves_with_module(exercise: str, view: "_spec.ModuleView", x: torch.Tensor, where: str) -> None:
    """After ``.to(torch.float64)`` the module must run on a float64 input (and agree with float32);
    after ``.to('meta')``, a stand-in for ``.to('cuda')``, it must still run (:class:`OneDevice`). Its passes,
    each under seed 7: ``x`` as built, then a float64 copy and a meta copy."""
    base = view.forward("eval", 7, x)
    if isinstance(base, BaseException):
        raise base
    x64 = x.to(torch.float64) if x.is_floating_point() else x
    i = view.index("eval", 7, x64, "float64")
    if not view.ran(i):
        raise wire.error_of(*view.built["copy_error"])
    out = view.forward("eval", 7, x64, "float64")
    if isinstance(out, BaseException):
        fail(exercise, f"{where}: after module.to(torch.float64) the forward pass raised {type(out).__name__}: {out}. "
                       f"Do not fix a dtype inside forward; let everything follow the module")
    if not isinstance(out, torch.Tensor) or out.dtype != torch.float64 or tensor_difference(base, out, atol=1e-4) is not None:
        fail(exercise, f"{where}: after module.to(torch.float64) the output is not the float32 output in float64 "
                       f"(dtype {getattr(out, 'dtype', type(out).__name__)}). Let every tensor follow the module")
    i = view.index("eval", 7, x.to("meta"), "meta")
    if not view.ran(i):
        raise wire.error_of(*view.built["copy_error"])
    got = view.forward("eval", 7, x.to("meta"), "meta")
    if isinstance(got, BaseException):
        fail(exercise, f"{where}: after module.to('meta') (a stand-in for .to('cuda')) the forward pass raised "
                       f"{type(got).__name__}: {got}. Create every tensor forward needs on the input's device "
                       f"(torch.arange(T, device=x.device)), or make it a buffer")


def _shape_check(exercise: str, view: "_spec.ModuleView", build: tuple,
                 name: Callable[[list, list, tuple], "str | None"]) -> None:
    want = expected_parameter_shapes(exercise, build)
    got = probed.student_shapes(exercise, view)
    if got is None or got == want:
        return
    problem = name(got, want, build)
    if problem is None and sorted(got) == sorted(want):
        problem = "the right parameters, created in another order: create the layers in the order the exercise gives"
    if problem:
        fail(exercise, f"built with {build}: expected parameters of shapes {want} (in this order), got {got}: {problem}.")


def _too_long_raises(exercise: str, view: "_spec.ModuleView", x: torch.Tensor, context_length: int, where: str,
                     **kwargs) -> None:
    """An input one token longer than ``context_length`` must raise a ``ValueError`` that names the limit (its
    pass: eval, seed 7, ``x`` with ``kwargs``).

    The course's one standard for "too long" (notebooks 08 and 09): a ``ValueError`` whose message
    holds the number ``context_length``, not the ``IndexError`` that ``nn.Embedding`` raises by itself
    nor a shape error from deeper inside.
    """
    T = x.shape[1]
    start = kwargs.get("start", 0)
    if start:
        what = (f"{T} tokens from start={start} (positions {start}..{start + T - 1}), one past "
                f"context_length = {context_length}")
    else:
        what = f"an input of {T} tokens, one more than context_length = {context_length}"
    exc = view.forward("eval", 7, x, None, kwargs or None)
    if is_stub_error(exc):
        fail(exercise, NOT_IMPLEMENTED)
    if isinstance(exc, ValueError):
        if str(context_length) not in str(exc):
            fail(exercise, f"{where}: {what}, raised ValueError({str(exc)!r}), which does not name the limit: say "
                           f"that context_length is {context_length}, e.g. "
                           f"f\"{{T}} tokens, but context_length is {{self.context_length}}\".")
        return
    if isinstance(exc, BaseException):
        fail(exercise, f"{where}: {what}, raised {type(exc).__name__}: {exc}. That error comes from deeper inside "
                       f"PyTorch, not from your code: check the positions against self.context_length at the start "
                       f"of forward and raise a ValueError that names the limit.")
    fail(exercise, f"{where}: {what}, returned an output instead of raising an error: raise a ValueError that "
                   f"names the limit.")


# ------------------------------------------------------------------------------------------
# The KV cache path of TransformerBlock and TinyGPT
# ------------------------------------------------------------------------------------------
def _cached_case(build: tuple, x: torch.Tensor) -> Case:
    """The cached path of the module built with ``build`` on ``x``, as a case whose inputs are plain data: what
    the case of a step of the plan (:func:`_cached_steps`)."""
    return Case("the cached path", (x,), {"build": tuple(build)})


def _cached_run(exercise: str) -> Callable:
    """The kernel's run of :func:`cached_trace` for a case of :func:`_cached_case`: the student's class built
    with the case's arguments, the test weights loaded, in ``eval()`` mode. Under the grader."""
    def run(cls: Callable, case: Case) -> list:
        model = construct(cls, case.kwargs["build"])
        if not isinstance(model, nn.Module):
            raise TypeError(f"{type(model).__name__} is not an nn.Module")
        return cached_trace(exercise, set_test_weights(model).eval(), case.args[0])
    return run


# ------------------------------------------------------------------------------------------
# LearnedPositionalEmbedding
# ------------------------------------------------------------------------------------------
def _learned_shapes(got: list, want: list, build: tuple) -> str | None:
    context_length, d_model = build
    if not got:
        return ("the module has no parameters: the position vectors must be trained. Hold them in "
                "nn.Embedding(context_length, d_model) (or an nn.Parameter)")
    if got == [(d_model, context_length)]:
        return "the table is (d_model, context_length): one ROW per position, nn.Embedding(context_length, d_model)"
    return None


def _learned_error(case: Case, error: BaseException) -> str | None:
    """A raw PyTorch error inside the student's forward, translated into what it means."""
    text = str(error)
    b, T, _ = case.args[0].shape
    context_length = case.build[0] if case.build else None
    start = case.kwargs.get("start", 0)
    if isinstance(error, ValueError) and context_length is not None and isinstance(start, int) \
            and start + T <= context_length:
        return (f"positions {start}..{start + T - 1} fit: the table has context_length = {context_length} rows, "
                f"positions 0..{context_length - 1}. Raise only when start + T > context_length (with >= the last "
                f"position is refused: an off-by-one).")
    if "'indices'" in text or "Expected tensor for argument #1 'indices'" in text:
        return ("nn.Embedding looks up integer ids: give it the positions torch.arange(T, device=x.device), not x "
                "(x holds the token vectors).")
    match = symptoms.broadcast_sizes(text)
    if match:
        sizes, dim = {match[0], match[1]}, match[2]
        if dim == 1 and sizes == {b, T}:
            return (f"the position vectors have {b} rows, the batch size: the number of tokens is x.shape[1] (x is "
                    f"(b, T, d_model)), so look up torch.arange(x.shape[1]).")
        if dim == 1 and sizes == {context_length, T}:
            return (f"all {context_length} rows of the table are added to {T} tokens: take the first T, the vectors "
                    f"of positions 0..T-1.")
        if dim == 0 and sizes == {b, T}:
            return ("the position vectors line up with the batch axis: (T, d_model) broadcasts against x's "
                    "(b, T, d_model) as it is (or unsqueeze(0) to (1, T, d_model)); (T, 1, d_model) does not.")
        if dim == 1 and T in sizes and len(sizes) == 2 and isinstance(start, int):
            n = next(iter(sizes - {T}))  # the position vectors added, where x has T tokens (issue 36)
            return (f"{n} position vectors met the {T} tokens of x along dimension 1: there must be one per token, "
                    f"positions {start}..{start + T - 1} (start..start + T - 1), which torch.arange(start, start + T, "
                    f"device=x.device) gives: arange's end is left out, so it is start + T, with T = x.shape[1].")
    return None


def _learned_diagnose(case: Case, got: object, want: object) -> str | None:
    if isinstance(got, BaseException):
        if isinstance(got, TypeError) and "start" in str(got):
            return "forward takes the first position as a second argument: def forward(self, x, start=0)."
        return _learned_error(case, got)
    if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
        return None
    x = case.args[0]
    b, T, d = x.shape
    start = case.kwargs.get("start", 0)
    if start and case.build and got.shape == want.shape:
        context_length = case.build[0]
        bound = 1.0 / d ** 0.5
        table = rand(context_length, d, seed=9700, low=-bound, high=bound)  # the test weights of the table
        if tensor_difference(x + table[:T], got) is None:
            return (f"start is ignored: with start={start} the tokens get the vectors of positions {start}.."
                    f"{start + T - 1}, torch.arange(start, start + T, device=x.device).")
    if tuple(got.shape) == (b, T, 2 * d):
        return "the position vectors are concatenated to x (the last dimension doubled): add them, x + positions."
    if tuple(got.shape) == (T, d):
        return "you return the position vectors alone: add them to x, x + positions, to get (b, T, d_model)."
    if got.shape == want.shape and tensor_difference(want - x, got) is None:
        return "you return the position vectors alone (broadcast to x's shape): add them to x."
    if got.shape == want.shape and tensor_difference(x, got) is None:
        return "the output equals the input: add the position vectors to x."
    return None


def _learned_configs() -> list[tuple[tuple, list[Case]]]:
    return [
        ((8, 4), [Case("(3, 5, 4), T < context_length", (rand(3, 5, 4, seed=9012),)),
                  Case("(2, 8, 4), T = context_length", (rand(2, 8, 4, seed=9011),)),
                  Case("(1, 1, 4), one token", (rand(1, 1, 4, seed=9013),)),
                  Case("(2, 3, 4) with start=5: positions 5..7", (rand(2, 3, 4, seed=9017),), {"start": 5})]),
        ((16, 32), [Case("(2, 16, 32), the trained model's size", (rand(2, 16, 32, seed=9014),))]),
    ]


def _learned_inputs() -> tuple[list[tuple[torch.Tensor, dict]], torch.Tensor]:
    """The inputs too long (with their keyword arguments), and the input of :func:`moves_with_module`."""
    return [(rand(1, 9, 4, seed=9015), {}), (rand(1, 3, 4, seed=9018), {"start": 6})], rand(2, 5, 4, seed=9016)


def _learned_all(hidden: bool) -> list[tuple[tuple, list[Case]]]:
    return _learned_configs() + (list(hidden_cases("LearnedPositionalEmbedding")) if hidden else [])


def _probe_steps(plan: list[tuple[tuple, list[_probe.Probe]]]) -> list[_spec.Step]:
    """A list of ``(build, probes)`` (``modules.ProbePlan.items``) as one probed construction each."""
    return [_spec.probe_step(build, [(p.mode, p.seed, p.copy, p.x, p.kwargs) for p in probes]) for build, probes in plan]


def _learned_steps(hidden: bool) -> list[_spec.Step]:
    return _probe_steps(_learned_plan(_learned_all(hidden), *_learned_inputs()))


def _judge_learned(plan: list[_spec.Step], outcomes: _spec.Outcomes) -> str:
    exercise = "LearnedPositionalEmbedding"
    configs = _learned_all(outcomes.hidden)
    too_long, moved = _learned_inputs()
    views = probed.views(exercise, plan, outcomes)
    for build, _ in configs:
        _shape_check(exercise, views[build], build, _learned_shapes)
    count = compare_modules(exercise, views, configs, diagnose=_learned_diagnose)
    first = views[(8, 4)]
    probed.built(exercise, first, (8, 4))
    for x, kwargs in too_long:
        _too_long_raises(exercise, first, x, 8, "built with (8, 4)", **kwargs)
    moves_with_module(exercise, first, moved, "built with (8, 4)")
    return (f"{count} outputs agree with the reference (x plus position vectors start..start+T-1); "
            f"positions past context_length raise a ValueError; the positions follow the module to another "
            f"device")


def _learned_plan(configs: Sequence[tuple[tuple, Sequence[Case]]], too_long: Sequence[tuple[torch.Tensor, dict]],
                  moved: torch.Tensor) -> list[tuple[tuple, list[_probe.Probe]]]:
    """Every forward pass :func:`check_LearnedPositionalEmbedding` makes, per construction (each with the test
    weights loaded, under seed 7): the compared cases in ``eval()`` mode, then, built with ``(8, 4)``, the
    inputs that are too long and :func:`moves_with_module`'s three (as built, a float64 copy, a meta copy).
    The probed steps of the plan (:func:`_probe_steps`)."""
    plan = modules.ProbePlan()
    for build, cases in configs:
        plan.add(build, *[_probe.Probe("eval", 7, case.args[0], kwargs=dict(case.kwargs) or None) for case in cases])
    plan.add((8, 4), *[_probe.Probe("eval", 7, x, kwargs=kwargs or None) for x, kwargs in too_long],
             _probe.Probe("eval", 7, moved), _probe.Probe("eval", 7, moved.to(torch.float64), "float64"),
             _probe.Probe("eval", 7, moved.to("meta"), "meta"))
    return plan.items()


def _one_device(p: "tuple | _probe.Probe") -> "contextlib.AbstractContextManager":
    """The context a probed forward pass (``(mode, seed, copy, x, kwargs)``, or a ``probe.Probe``) runs in:
    :class:`OneDevice` for a meta copy's, as :func:`moves_with_module` runs it."""
    copy_ = p[2] if isinstance(p, tuple) else p.copy
    return OneDevice() if copy_ == "meta" else contextlib.nullcontext()


#: The runner of a probed construction of 09: the test weights loaded first, a meta copy's passes on one device.
_RUN_MODULE = functools.partial(_spec.run_module, prepare=set_test_weights, within=_one_device)

check_LearnedPositionalEmbedding = _spec.declare(_spec.Spec(
    "LearnedPositionalEmbedding", _learned_steps, _judge_learned, runners={_spec.MODULE: _RUN_MODULE}),
    """Check ``LearnedPositionalEmbedding(context_length, d_model)``: ``(b, T, d_model)`` -> ``x + positions``.""")


# ------------------------------------------------------------------------------------------
# TransformerBlock
# ------------------------------------------------------------------------------------------
def _block_shapes(got: list, want: list, build: tuple) -> str | None:
    d_model = build[0]
    widths = {n for shape in got if len(shape) == 2 for n in shape} - {d_model}
    if widths and widths != {4 * d_model}:
        return (f"the feed-forward's hidden layer has {sorted(widths)} units: it must have 4 * d_model = {4 * d_model} "
                f"(nn.Linear(d_model, 4 * d_model), GELU, nn.Linear(4 * d_model, d_model))")
    if len(got) < len(want) and sum(s == (d_model,) for s in got) < sum(s == (d_model,) for s in want) and \
            [s for s in got if len(s) == 2] == [s for s in want if len(s) == 2]:
        return ("a LayerNorm is missing: a pre-LN block has two, norm1 before the attention and norm2 before the "
                "feed-forward network (each has a weight and a bias of size d_model)")
    if sorted(got) == sorted(want):
        return ("the right parameters, created in another order: create norm1, att, norm2, ff in this order (the "
                "check loads its test weights in parameter order)")
    return None


def _attention_arguments(exercise: str, view: "_spec.ModuleView", build: tuple) -> None:
    """Fail with the cause where the block's construction raised because the attention got its number of heads and
    its dropout rate in each other's places (issue 36): the error names ``num_heads`` with the block's dropout rate,
    or the dropout probability with the block's number of heads."""
    error = view.built.get("error") if isinstance(view.built, dict) else None
    if not (isinstance(error, (list, tuple)) and len(error) == 2) or is_stub_data(*error):
        return
    kind, message = error
    num_heads, dropout = build[1], build[3]
    heads = re.search(r"num_heads\b.*?\bgot (-?\d+(?:\.\d+)?)", str(message))
    rate = re.search(r"dropout probability has to be between 0 and 1, but got (-?\d+(?:\.\d+)?)", str(message))
    if heads and "." in heads.group(1) and float(heads.group(1)) == dropout:
        said = f"the attention got the dropout rate, {dropout}, as its number of heads"
    elif rate and float(rate.group(1)) == num_heads:
        said = f"the attention got the number of heads, {num_heads}, as its dropout probability"
    else:
        return
    fail(exercise, f"constructing TransformerBlock{build} raised {kind}: {message}. Hint: {said}: num_heads and "
                   f"dropout are swapped in the call of MultiHeadAttentionKVCache, whose arguments come in the order "
                   f"(d_in, d_out, context_length, dropout, num_heads), dropout BEFORE num_heads: "
                   f"self.att = MultiHeadAttentionKVCache(d_model, d_model, context_length, dropout, num_heads).")


_BLOCK_TRAIN_HINT = ("eval() mode agrees but train() mode does not: dropout goes on the attention weights (inside "
                     "MultiHeadAttention) and on the output of each branch, attention and feed-forward, before it is "
                     "added back to x; nowhere else, each once.")


def _block_diagnose(causal: Callable) -> Callable:
    """The block's diagnose, then ``causal`` (``probed.not_causal``)."""

    def diagnose(case: Case, got: object, want: object) -> str | None:
        if isinstance(got, TypeError) and "use_cache" in str(got):
            return ("self.att does not take use_cache: it must be notebook 08's MultiHeadAttentionKVCache (section 0), "
                    "or an attention with the same forward(x, use_cache=False) and reset_cache().")
        filled = _cache_filled_without_use_cache(case, got)
        if filled:
            return (f"{filled}: the block calls its attention with use_cache=True whatever the caller asked, so every "
                    f"plain forward appends its keys and values to the cache (and attends to earlier inputs' keys). "
                    f"Hand on the block's own argument: self.att(self.norm1(x), use_cache=use_cache).")
        if case.mode == "train" and isinstance(got, torch.Tensor):
            return _BLOCK_TRAIN_HINT
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.shape == want.shape:
            x = case.args[0]
            if tensor_difference(want - x, got, atol=1e-4) is None:
                return "the input is not added back: return x + the branches' outputs (the residual connections)."
            if case.mode == "eval" and _lacks_attention(case, got, want):
                return ("your output is ours minus the attention branch, att(norm1(x)): the attention's result is "
                        "not in the output (the feed-forward branch may have read it). The second residual adds to "
                        "x AFTER the attention: x = x + drop_resid(att(norm1(x))), then return x + "
                        "drop_resid(ff(norm2(x))) with that x, not with the block's input.")
            if case.mode == "eval":
                floored = _ff_branch_floor(case, got, want)
                if floored:
                    return floored
        return causal(case, got, want)
    return diagnose


#: GELU's smallest value, GELU(-0.7518) = -0.16997: a branch that ends in a GELU never goes below it.
_GELU_FLOOR = -0.16997


#: The KV cache's refusal of more tokens than it has room for (notebook 08's MultiHeadAttentionKVCache): the tokens
#: it holds, and those the input adds.
_CACHE_FULL = re.compile(r"cache holds (\d+) tokens and the input adds (\d+)")


def _cache_filled_without_use_cache(case: Case, got: object) -> str | None:
    """Where a forward pass made WITHOUT ``use_cache=True`` raised the KV cache's "the cache holds N tokens" error
    (issue 36): the cache was filled by earlier plain passes, so ``use_cache=True`` reached the attention where the
    caller did not ask for it. The fact in words, else ``None``."""
    if not isinstance(got, ValueError) or case.kwargs.get("use_cache"):
        return None
    full = _CACHE_FULL.search(str(got))
    if not full:
        return None
    return (f"a forward pass without use_cache found the attention's KV cache already holding {full.group(1)} tokens, "
            f"from the earlier passes, which none asked to cache")


def _ff_branch_floor(case: Case, got: torch.Tensor, want: torch.Tensor) -> str | None:
    """Where the feed-forward branch of ``got`` (its output minus x + att(norm1(x)), the recorded attention branch)
    never goes below GELU's minimum while ours does: the branch ends in an activation (issue 36). ``None`` where
    this edition holds no attention branch for the case, or the symptom is not there."""
    try:
        branch = _attention_branch(case)
    except _expected.MissingExpectation:
        return None
    if not (isinstance(branch, torch.Tensor) and branch.shape == want.shape):
        return None
    h = case.args[0] + branch  # (b, T, d): the residual stream after the attention
    mine, ours = (got - h).double(), (want - h).double()
    if not bool(torch.isfinite(mine).all()) or float(ours.min()) > 2 * _GELU_FLOOR or float(mine.min()) < _GELU_FLOOR - 1e-4:
        return None
    floor = "0" if float(mine.min()) > -1e-4 else f"{_GELU_FLOOR:.3g}, GELU's minimum"
    return (f"your feed-forward branch (your output minus x + att(norm1(x))) never goes below {floor}, "
            f"where ours goes down to {float(ours.min()):.3g}: your feed-forward network ends in an activation. The "
            f"GELU goes only between its two Linears, nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), "
            f"nn.Linear(4 * d_model, d_model)); the output Linear's values go to the residual as they are.")


def _lacks_attention(case: Case, got: torch.Tensor, want: torch.Tensor) -> bool:
    """``got`` is the expected output minus the attention branch (:func:`_attention_branch`); ``False`` where this
    edition holds no such branch (a hidden case in the student edition)."""
    try:
        branch = _attention_branch(case)
    except _expected.MissingExpectation:
        return False
    return isinstance(branch, torch.Tensor) and branch.shape == want.shape and \
        tensor_difference(want - branch, got, atol=1e-4) is None


def _attention_branch(case: Case) -> torch.Tensor:
    """The reference block's attention branch, ``att(norm1(x))`` ``(b, T, d)``, with the test weights, on an
    ``eval()`` module case (recorded for the visible cases): what a block whose output lacks it left out."""
    def compute() -> torch.Tensor:
        block = set_test_weights(construct(_expected.reference("TransformerBlock"), case.build)).eval()
        with torch.no_grad():
            return block.att(block.norm1(case.args[0]))

    return expect("TransformerBlock", f"attention branch: {case.key()}", compute)


def _block_configs() -> list[tuple[tuple, list[Case]]]:
    return [
        ((8, 2, 6, 0.0), [Case("(2, 6, 8), T = context_length", (rand(2, 6, 8, seed=9021, low=-2, high=2),)),
                          Case("(2, 4, 8), T < context_length", (rand(2, 4, 8, seed=9022, low=-2, high=2),))]),
        ((8, 2, 6, 0.25), [Case("(2, 6, 8) with dropout 0.25", (rand(2, 6, 8, seed=9023, low=-2, high=2),))]),
        ((12, 3, 5, 0.0), [Case("(3, 5, 12), three heads", (rand(3, 5, 12, seed=9024, low=-2, high=2),))]),
    ]


def _block_all(hidden: bool) -> list[tuple[tuple, list[Case]]]:
    return _block_configs() + (list(hidden_cases("TransformerBlock")) if hidden else [])


def _block_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """The input of the finite, causal and dropout checks, and that of :func:`moves_with_module`."""
    return rand(2, 6, 8, seed=9021, low=-2, high=2), rand(2, 4, 8, seed=9026)


#: The runner of each build's cached path (:func:`_cached_run`).
CACHED = "cached"


def _cached_steps(configs: Sequence[tuple[tuple, Sequence[Case]]]) -> list[_spec.Step]:
    """The cached path of every build on its first case (:func:`_cached_case`): one step each."""
    return [_spec.Step(f"cached {tuple(build)}: {cases[0].name}", _cached_case(build, cases[0].args[0]), CACHED)
            for build, cases in configs]


def _block_steps(hidden: bool) -> list[_spec.Step]:
    configs = _block_all(hidden)
    return _probe_steps(_block_plan(configs, *_block_inputs())) + _cached_steps(configs)


def _judge_block(plan: list[_spec.Step], outcomes: _spec.Outcomes) -> str:
    exercise = "TransformerBlock"
    configs = _block_all(outcomes.hidden)
    x, moved = _block_inputs()
    views = probed.views(exercise, plan, outcomes)
    for build, _ in configs:
        _attention_arguments(exercise, views[build], build)
        _sharing_check(exercise, views[build], build)
        _shape_check(exercise, views[build], build, _block_shapes)
    diagnose = _block_diagnose(probed.not_causal(exercise, views))
    if _expected.is_recording():  # the attention branch a diagnosis compares with (_attention_branch)
        for build, cases in configs:
            for case in cases:
                _attention_branch(Case(case.name, case.args, case.kwargs, build=build, mode="eval"))
    first, dropped = (8, 2, 6, 0.0), (8, 2, 6, 0.25)
    probed.built(exercise, views[first], first)
    probed.finite(exercise, views[first], x, "built with (8, 2, 6, 0.0)")
    count = compare_modules(exercise, views, configs, diagnose=diagnose)
    probed.causal_module(exercise, views[first], x)
    probed.built(exercise, views[dropped], dropped)
    probed.dropout_modes(exercise, views[dropped], x, "built with (8, 2, 6, 0.25)")
    moves_with_module(exercise, views[first], moved, "built with (8, 2, 6, 0.0)")
    _cached_views(exercise, views, plan, outcomes, configs)
    return (f"{count} outputs agree with the reference in eval() and train() mode; the block is causal, "
            f"drops out only in train() mode and moves with .to(); fed in pieces with use_cache=True it "
            f"gives the whole input's outputs")


def _moves_probes(x: torch.Tensor) -> list[_probe.Probe]:
    """The forward passes :func:`moves_with_module` makes on ``x``: as built, of a float64 copy, of a meta copy."""
    x64 = x.to(torch.float64) if x.is_floating_point() else x
    return [_probe.Probe("eval", 7, x), _probe.Probe("eval", 7, x64, "float64"),
            _probe.Probe("eval", 7, x.to("meta"), "meta")]


def _compared_probes(plan: modules.ProbePlan, configs: Sequence[tuple[tuple, Sequence[Case]]],
                     causal: Callable[[torch.Tensor], list[torch.Tensor]]) -> None:
    """:func:`compare_modules`' passes (``eval()``, and ``train()`` where the build's dropout is positive, under
    seed 7) and, per case, what its causality diagnosis runs in ``eval()`` (``causal(x)``: the inputs, no seed)."""
    for build, cases in configs:
        dropout = next((a for a in build if isinstance(a, float)), 0.0)
        plan.add(build, *[_probe.Probe(mode, 7, case.args[0]) for mode in ("eval", "train")[:1 + (dropout > 0)]
                          for case in cases])
        plan.add(build, *[_probe.Probe("eval", None, v) for case in cases for v in causal(case.args[0])])


def _dropout_probes(x: torch.Tensor) -> list[_probe.Probe]:
    """The passes ``modules.check_dropout_modes`` makes on ``x``."""
    return [_probe.Probe(mode, seed, x) for mode in ("eval", "train") for seed in (1, 2)]


def _block_plan(configs: Sequence[tuple[tuple, Sequence[Case]]], x: torch.Tensor,
                moved: torch.Tensor) -> list[tuple[tuple, list[_probe.Probe]]]:
    """Every construction and forward pass :func:`check_TransformerBlock` makes (``(8, 2, 6, 0.0)``: the finite
    pass, causality and the moved copies; ``(8, 2, 6, 0.25)``: dropout's modes), its diagnoses' too."""
    plan = modules.ProbePlan()
    for build, _ in configs:
        plan.add(build)
    first, dropped = (8, 2, 6, 0.0), (8, 2, 6, 0.25)
    plan.add(first, _probe.Probe("eval", 7, x))

    def causal(v: torch.Tensor) -> list[torch.Tensor]:
        return [v, *causal_inputs(v)] if v.dim() == 3 and v.shape[1] > 1 else []

    _compared_probes(plan, configs, causal)
    plan.add(first, *modules.causal_probes(x))
    plan.add(dropped, *_dropout_probes(x))
    plan.add(first, *_moves_probes(moved))
    return plan.items()


check_TransformerBlock = _spec.declare(_spec.Spec(
    "TransformerBlock", _block_steps, _judge_block,
    runners={_spec.MODULE: functools.partial(_RUN_MODULE, tied=True), CACHED: _cached_run("TransformerBlock")}),
    """Check ``TransformerBlock(d_model, num_heads, context_length, dropout)``: ``(b, T, d) -> (b, T, d)``.""")


# ------------------------------------------------------------------------------------------
# TinyGPT
# ------------------------------------------------------------------------------------------
#: The other exercises of this notebook that ``TinyGPT`` builds on, with their checks: while grading,
#: ``TinyGPT`` is checked with the reference's versions of them (:func:`modules.check_alone`).
def _gpt_helpers() -> dict:
    return {"LearnedPositionalEmbedding": check_LearnedPositionalEmbedding,
            "TransformerBlock": check_TransformerBlock,
            "sinusoidal_positions": check_sinusoidal_positions}


#: The other exercises of this notebook an exercise's answer may call, by name (``grader/reference_subset.py``).
HELPERS = {"TinyGPT": tuple(_gpt_helpers())}


def _gpt_shapes(got: list, want: list, build: tuple) -> str | None:
    vocab_size, d_model, context_length = build[0], build[1], build[4]
    sinusoidal = len(build) > 6 and build[6] == "sinusoidal"
    if sinusoidal and len(got) == len(want) + 1 and got[0] == want[0] and got[1] == (context_length, d_model) and \
            got[2:] == want[1:]:
        return ("with positions='sinusoidal' the model still has a trained table of positions: the sinusoids are "
                "fixed, not trained. Use self.pos_emb = training.FixedPositions(sinusoidal_positions(context_length, "
                "d_model)) (a buffer, no parameters) when positions == 'sinusoidal'")
    if not sinusoidal and len(got) == len(want) - 1 and got[0] == want[0] and got[1:] == want[2:]:
        return ("the position embedding is missing (or fixed): with positions='learned' (the default) add "
                "self.pos_emb = LearnedPositionalEmbedding(context_length, d_model) right after the token embedding")
    if len(got) == len(want) + 1 and got[:-1] == want and got[-1] == (vocab_size,):
        return "out_head has a bias: nn.Linear(d_model, vocab_size, bias=False)"
    if len(got) == len(want) and got[:-1] == want[:-1] and got[-1] == (d_model, vocab_size):
        return ("out_head is nn.Linear(vocab_size, d_model): it maps each token's d_model-vector to vocab_size logits, "
                "nn.Linear(d_model, vocab_size, bias=False)")
    if len(got) == len(want) - 1 and got == want[:-1]:
        return ("out_head is missing (or shares the token embedding's weight): the last layer is its own "
                "nn.Linear(d_model, vocab_size, bias=False)")
    if len(got) == len(want) - 2 and got[-1] == want[-1] and got[:-1] == want[:-3]:
        return "the final LayerNorm is missing: normalise once more after the last block, before out_head"
    if got and got[0] == (d_model, vocab_size):
        return "the token embedding is (d_model, vocab_size): it has one row per token, nn.Embedding(vocab_size, d_model)"
    return None


def _sharing_check(exercise: str, view: "_spec.ModuleView", build: tuple) -> None:
    """Fail when two parts of the model are one and the same module or parameter, and say which (read from the
    construction's ``tied`` names, ``probe.tied_parameters``)."""
    built = view.built
    if "error" in built:
        if is_stub_data(*built["error"]):
            fail(exercise, NOT_IMPLEMENTED)
        return  # probed.built reports construction errors with the arguments
    if not built.get("module"):
        return
    pairs = built.get("tied", [])
    if not (isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 and all(isinstance(n, str) for n in p)
                                            for p in pairs)):
        _spec.refuse(exercise, "names of the parameters that appear twice")
    if not pairs:
        return
    second, first = pairs[0]
    if first.startswith("blocks.") and second.startswith("blocks."):
        a, b = first.split(".")[1], second.split(".")[1]
        fail(exercise, f"built with {build}: blocks[{a}] and blocks[{b}] share one set of weights (the same "
                       f"parameter {first} is also {second}): [TransformerBlock(...)] * num_layers repeats ONE "
                       f"block num_layers times. Create a new block for each layer: "
                       f"[TransformerBlock(...) for _ in range(num_layers)].")
    if {first.split(".")[0], second.split(".")[0]} == {"norm1", "norm2"}:
        fail(exercise, f"built with {build}: norm1 and norm2 are one and the same LayerNorm: each branch needs its "
                       f"own nn.LayerNorm(d_model), with its own trained scale and shift.")
    if {first, second} == {"tok_emb.weight", "out_head.weight"}:
        fail(exercise, f"built with {build}: out_head shares the token embedding's weight (weight tying, as GPT-2 "
                       f"does): here the head is its own nn.Linear(d_model, vocab_size, bias=False), so do not "
                       f"assign out_head.weight = tok_emb.weight.")
    fail(exercise, f"built with {build}: {first} and {second} are one and the same parameter: every layer needs "
                   f"its own weights (create a new module for each, never reuse one object).")


_GPT_ERRORS = (
    ("is missing the required \"forward\" function",
     "nn.ModuleList has no forward of its own: loop over it (for block in self.blocks: x = block(x)), or hold the "
     "blocks in an nn.Sequential, which you can call."),
    ("normalized_shape",
     "a LayerNorm got a tensor of another size: final_norm works on the d_model-sized x, before out_head, so "
     "out_head(final_norm(x)), not final_norm(out_head(x))."),
    ("expected input of shape (batch, num_tokens",
     "pos_emb takes the token embeddings (b, T, d_model), not the ids (b, T): pos_emb(tok_emb(idx))."),
    ("'indices'",
     "an nn.Embedding was given float vectors: tok_emb takes the ids idx (b, T); the positions are added to its "
     "output, pos_emb(tok_emb(idx))."),
)


def _gpt_error(case: Case, error: BaseException) -> str | None:
    """A raw PyTorch error inside the model's forward, translated: a known message (:data:`_GPT_ERRORS`), or the
    token embeddings (d_model features) meeting vectors of context_length entries, a position table built
    (d_model, context_length) (issue 36: was the generic words of a broadcast)."""
    text = str(error)
    hint = next((hint for key, hint in _GPT_ERRORS if key in text), None)
    found = symptoms.broadcast_sizes(text)
    if hint or not found or not case.build or len(case.build) < 5:
        return hint
    d_model, context_length = case.build[1], case.build[4]
    sinusoidal = len(case.build) > 6 and case.build[6] == "sinusoidal"
    if found[2] == 2 and {found[0], found[1]} == {d_model, context_length} and d_model != context_length:
        table = ("sinusoidal_positions(context_length, d_model), in that order" if sinusoidal else
                 "LearnedPositionalEmbedding(context_length, d_model), in that order")
        return (f"the token embeddings, d_model = {d_model} features each, met vectors of {context_length} = "
                f"context_length entries along dimension 2: is the position table (d_model, context_length), its "
                f"two sizes swapped? It is (context_length, d_model), one row of d_model numbers per position: "
                f"{table}.")
    return None


def _gpt_diagnose(exercise: str, views: dict) -> Callable:
    def diagnose(case: Case, got: object, want: object) -> str | None:
        filled = _cache_filled_without_use_cache(case, got)
        if filled:
            return (f"{filled}: use_cache=True reached the attention although the model was called without it. Hand "
                    f"the caller's use_cache on at every level: block(x, use_cache=use_cache) in TinyGPT.forward, and "
                    f"self.att(..., use_cache=use_cache) in the block.")
        if isinstance(got, BaseException):
            return _gpt_error(case, got)
        if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
            return None
        if got.dim() == 2 and tuple(got.shape) == (want.shape[0], want.shape[2]):
            return ("the logits are (b, vocab_size): return them for EVERY position, (b, T, vocab_size); training "
                    "needs a prediction at each answer position, not only the last.")
        if got.shape == want.shape and got.min() >= 0 and torch.allclose(got.sum(-1), torch.ones(got.shape[:-1])):
            return ("every row sums to 1: return the logits of out_head; cross_entropy applies the softmax itself "
                    "(and more stably).")
        if case.mode == "train":
            return ("eval() mode agrees but train() mode does not: dropout goes on the embeddings (tokens plus "
                    "positions) before the first block, and inside every block; not after the final norm.")
        leak = _causal_problem(exercise, views[tuple(case.build)], case.args[0])
        return f"your model is not causal: {leak}" if leak else None
    return diagnose


def _gpt_causal_inputs(idx: torch.Tensor) -> list[torch.Tensor]:
    """The ids :func:`_causal_problem` gives after ``idx`` (``(b, T)``): for each position ``t`` but the last,
    ``idx`` with the tokens after ``t`` changed to other ids of the same vocabulary."""
    vocab_size = int(idx.max()) + 1
    found = []
    for t in range(idx.shape[1] - 1):
        changed = idx.clone()
        changed[:, t + 1:] = (changed[:, t + 1:] + 1 + tokens(*changed[:, t + 1:].shape, max(vocab_size - 1, 1),
                                                                seed=9090 + t)) % vocab_size
        found.append(changed)
    return found


def _causal_problem(exercise: str, view: "_spec.ModuleView", idx: torch.Tensor) -> str | None:
    """Where the logits at some position change when only later tokens change, or ``None`` (its passes: eval, no
    seed, ``idx`` then :func:`_gpt_causal_inputs`)."""
    base = probed.output(exercise, view, "eval", None, idx, "causality")
    T = idx.shape[1]
    for t, changed in enumerate(_gpt_causal_inputs(idx)):
        out = probed.output(exercise, view, "eval", None, changed, "causality")
        if not isinstance(out, torch.Tensor) or not isinstance(base, torch.Tensor) or out.shape != base.shape:
            return None
        diff = (out[:, : t + 1] - base[:, : t + 1]).abs()
        if diff.max() > 1e-5:
            pos = int(diff.amax(dim=(0, 2)).argmax())
            return (f"the logits at position {pos} changed when only tokens {t + 1}..{T - 1} changed (largest "
                    f"change {diff.max().item():.3g}). Every block must be causal, and nothing else may mix "
                    f"positions.")
    return None


def _forward_exists(exercise: str, view: "_spec.ModuleView", build: tuple, idx: torch.Tensor) -> None:
    """PyTorch raises ``NotImplementedError`` for a module without ``forward`` (an ``nn.ModuleList`` called
    like a function): say what it means, instead of "not implemented yet" (its pass: eval, no seed, ``idx``)."""
    if "error" in view.built or not view.built.get("module"):
        return
    exc = view.forward("eval", None, idx)
    if isinstance(exc, NotImplementedError):
        for key, hint in _GPT_ERRORS:
            if key in str(exc):
                fail(exercise, f"built with {build}: your forward raised NotImplementedError: {exc}. {hint}")


def _positions_option(exercise: str, view: "_spec.ModuleView") -> None:
    """``positions`` other than ``"learned"`` or ``"sinusoidal"`` must raise a ``ValueError`` (its construction,
    :data:`_ROTARY`)."""
    error = view.built.get("error")
    if error is not None:
        kind, message = error
        if kind == "ValueError":
            return
        if is_stub_data(kind, message):
            fail(exercise, NOT_IMPLEMENTED)
        fail(exercise, f"TinyGPT(..., positions='rotary') raised {kind}: {message}. Raise a ValueError that "
                       f"names the two choices, 'learned' and 'sinusoidal'.")
    fail(exercise, "TinyGPT(..., positions='rotary') built a model: positions must be 'learned' or 'sinusoidal'; "
                   "raise a ValueError for anything else.")


def _cached_views(exercise: str, views: dict, plan: Sequence[_spec.Step], outcomes: _spec.Outcomes,
                  configs: Sequence[tuple[tuple, Sequence[Case]]]) -> None:
    """The cached path (:func:`check_cached_path`) on the first case of every build, in eval() mode, judged on the
    trace its step gave (:func:`_cached_steps`), refused unless it has the trace's form."""
    steps = {s.key: s for s in plan if s.run == CACHED}
    for build, cases in configs:
        case = cases[0]
        probed.built(exercise, views[tuple(build)], build)
        want = expected_output(exercise, Case(case.name, case.args, case.kwargs, build=build, mode="eval"))
        key = f"cached {tuple(build)}: {case.name}"
        if key not in steps:
            raise KeyError(f"{exercise}'s plan makes no step {key!r}")
        trace = outcomes[key]
        if isinstance(trace, BaseException):  # the runner's own set-up (the construction is checked above)
            raise trace
        if not trace_has_form(trace, len(piece_sizes(case.args[0].shape[1]))):
            _spec.refuse(exercise, "cached path (the trace of its pieces, the whole input and the hints' passes)")
        try:
            check_cached_path(exercise, trace, case.args[0], want, f"built with {build}")
        except CheckFailed as error:
            raise _hinted(error, _reset_error_hint(exercise, trace)) from None


def _reset_error_hint(exercise: str, trace: list) -> str | None:
    """Where the model's ``reset_cache()`` raised an ``AttributeError`` for a ``reset_cache`` that a part of it lacks
    (issue 36): the cache lives in each block's attention, not in the block nor in the blocks' container."""
    if exercise != "TinyGPT":
        return None
    for outcome in (trace[0], trace[3], (trace[4] or [None])[0]):
        if not (isinstance(outcome, list) and len(outcome) == 4 and outcome[:2] == ["reset", "error"]
                and outcome[2] == "AttributeError"):
            continue
        lacking = re.search(r"'(\w+)' object has no attribute 'reset_cache'", str(outcome[3]))
        if not lacking:
            return None
        name = lacking.group(1)
        if name in ("Sequential", "ModuleList"):
            return (f"reset_cache() calls self.blocks.reset_cache(), but an nn.{name} has no reset_cache: loop over "
                    f"the blocks and empty each one's cache, which lives in its attention: for block in self.blocks: "
                    f"block.att.reset_cache().")
        return (f"reset_cache() calls reset_cache on a {name}, which has none: a block's KV cache lives in its "
                f"attention, notebook 08's MultiHeadAttentionKVCache. Empty it there: for block in self.blocks: "
                f"block.att.reset_cache() (and set self.num_cached = 0).")
    return None


def _gpt_configs(hidden: bool) -> list[tuple[tuple, list[Case]]]:
    """The builds and cases :func:`_check_gpt` compares (the hidden ones after the visible)."""
    extra = hidden_cases("TinyGPT") if hidden else []
    return [
        ((11, 8, 2, 2, 6, 0.0), [Case("ids (2, 6), T = context_length", (tokens(2, 6, 11, seed=9031),)),
                                 Case("ids (3, 4), T < context_length", (tokens(3, 4, 11, seed=9032),))]),
        ((11, 8, 2, 2, 6, 0.2), [Case("ids (2, 6) with dropout 0.2", (tokens(2, 6, 11, seed=9033),))]),
        ((7, 12, 3, 1, 5, 0.0), [Case("one block of three heads, ids (2, 5)", (tokens(2, 5, 7, seed=9034),))]),
        ((11, 8, 2, 2, 6, 0.0, "sinusoidal"), [Case("positions='sinusoidal', ids (2, 5)", (tokens(2, 5, 11, seed=9038),))]),
    ] + extra


#: The construction :func:`_positions_option` makes, which must raise a ``ValueError``.
_ROTARY = (11, 8, 2, 1, 6, 0.0, "rotary")


def _gpt_plan(configs: Sequence[tuple[tuple, Sequence[Case]]]) -> list[tuple[tuple, list[_probe.Probe]]]:
    """Every construction and forward pass :func:`_check_gpt` makes (``(11, 8, 2, 2, 6, 0.0)``: the pass without
    test weights of :func:`_forward_exists`, the leak check, the too-long input and the moved copies;
    ``(11, 8, 2, 2, 6, 0.2)``: dropout's modes; :data:`_ROTARY`, built only), its diagnoses' too. The kernel
    loads the test weights into every construction, the one :func:`_forward_exists` runs too: that pass only
    tells a ``NotImplementedError`` of a module without ``forward``."""
    plan = modules.ProbePlan()
    for build, _ in configs:
        plan.add(build)
    first, dropped = (11, 8, 2, 2, 6, 0.0), (11, 8, 2, 2, 6, 0.2)
    plan.add(first, _probe.Probe("eval", None, configs[0][1][0].args[0]))
    _compared_probes(plan, configs, lambda idx: [idx, *_gpt_causal_inputs(idx)])
    leak = tokens(2, 6, 11, seed=9035)
    plan.add(first, *[_probe.Probe("eval", None, v) for v in (leak, *_gpt_causal_inputs(leak))])
    plan.add(dropped, *_dropout_probes(tokens(2, 6, 11, seed=9033)))
    plan.add(first, _probe.Probe("eval", 7, tokens(1, 7, 11, seed=9036)), *_moves_probes(tokens(2, 4, 11, seed=9037)))
    plan.add(_ROTARY)
    return plan.items()


def _gpt_steps(hidden: bool) -> list[_spec.Step]:
    configs = _gpt_configs(hidden)
    return _probe_steps(_gpt_plan(configs)) + _cached_steps(configs)


def _judge_gpt(plan: list[_spec.Step], outcomes: _spec.Outcomes) -> str:
    exercise = "TinyGPT"
    configs = _gpt_configs(outcomes.hidden)
    views = probed.views(exercise, plan, outcomes)
    for build, _ in configs:
        _sharing_check(exercise, views[build], build)
        _shape_check(exercise, views[build], build, _gpt_shapes)
    _forward_exists(exercise, views[configs[0][0]], configs[0][0], configs[0][1][0].args[0])
    diagnose = _gpt_diagnose(exercise, views)
    count = compare_modules(exercise, views, configs, diagnose=diagnose)
    first, dropped = (11, 8, 2, 2, 6, 0.0), (11, 8, 2, 2, 6, 0.2)
    probed.built(exercise, views[first], first)
    leak = _causal_problem(exercise, views[first], tokens(2, 6, 11, seed=9035))
    if leak:
        fail(exercise, f"the future leaks: {leak}")
    probed.built(exercise, views[dropped], dropped)
    probed.dropout_modes(exercise, views[dropped], tokens(2, 6, 11, seed=9033),
                               "built with (11, 8, 2, 2, 6, 0.2)")
    _too_long_raises(exercise, views[first], tokens(1, 7, 11, seed=9036), 6, "built with (11, 8, 2, 2, 6, 0.0)")
    moves_with_module(exercise, views[first], tokens(2, 4, 11, seed=9037), "built with (11, 8, 2, 2, 6, 0.0)")
    _positions_option(exercise, views[_ROTARY])
    _has_context_length(exercise, views[first], 6)
    _cached_views(exercise, views, plan, outcomes, configs)
    return (f"{count} outputs (logits) agree with the reference in eval() and train() mode, with learned "
            f"and sinusoidal positions; no position sees a later token; too long an input raises a "
            f"ValueError; a sequence fed in pieces with use_cache=True gives the whole sequence's logits, "
            f"and reset_cache() starts a new one")


check_TinyGPT = _spec.declare(_spec.Spec(
    "TinyGPT", _gpt_steps, _judge_gpt,
    runners={_spec.MODULE: functools.partial(_RUN_MODULE, tied=True, values=("context_length",)),
             CACHED: _cached_run("TinyGPT")},
    helpers=_gpt_helpers),
    """Check ``TinyGPT(vocab_size, d_model, num_heads, num_layers, context_length, dropout, positions)``.

    While grading (the instructor edition) the model is built with the reference's
    ``LearnedPositionalEmbedding``, ``TransformerBlock`` and ``sinusoidal_positions`` in place of the
    student's (``modules.alone``), so that a mistake in one of those costs only its own exercise; the student's
    own versions are put back afterwards. In the student edition a failure that comes from one of them is
    named as such.
    """)


def _has_context_length(exercise: str, view: "_spec.ModuleView", context_length: int) -> None:
    """``model.context_length`` is the constructor's ``context_length`` (generate reads it; the construction's
    ``values``, ``None`` where it has none)."""
    values = view.built.get("values")
    if not (isinstance(values, dict) and "context_length" in values):
        _spec.refuse(exercise, "value of context_length")
    value = values["context_length"]
    if value != context_length:
        fail(exercise, f"built with context_length={context_length}, model.context_length is {value!r}: keep "
                       f"self.context_length = context_length (generate reads it).")


# ------------------------------------------------------------------------------------------
# train_step
# ------------------------------------------------------------------------------------------
class StandInLM(nn.Module):
    """A stand-in language model for checking ``train_step``: ``(b, T)`` ids -> ``(b, T, vocab)`` logits.

    An embedding, tanh, and a linear layer: each position sees only its own token, which is all a
    check of the loss, the gradients and the step needs (and it holds nothing of an answer).
    """

    def __init__(self, vocab_size: int, d: int, dropout: float = 0.0):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(d, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(torch.tanh(self.embed(idx))))


def recording(optimizer_class: type) -> type:
    """``optimizer_class`` that keeps a copy of every parameter's gradient when ``step()`` is called."""
    class Recording(optimizer_class):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seen: list[list[torch.Tensor | None]] = []

        def step(self, closure=None):  # noqa: D401 - torch's signature
            self.seen.append([None if p.grad is None else p.grad.detach().clone()
                              for group in self.param_groups for p in group["params"]])
            return super().step(closure)

    Recording.__name__ = optimizer_class.__name__
    return Recording


OPTIMIZERS = {"SGD": lambda params: recording(torch.optim.SGD)(params, lr=0.5),
              "SGD with momentum": lambda params: recording(torch.optim.SGD)(params, lr=0.3, momentum=0.9),
              "AdamW": lambda params: recording(torch.optim.AdamW)(params, lr=0.05)}


def step_batch(b: int, T: int, vocab_size: int, answer_from: int | Sequence[int], seed: int) -> tuple:
    """``(inputs, targets, answer_mask)``: random ids, random targets, answers from ``answer_from`` on
    (one start for all rows, or one per row)."""
    inputs = tokens(b, T, vocab_size, seed)
    targets = tokens(b, T, vocab_size, seed + 50)
    starts = torch.tensor([answer_from] * b if isinstance(answer_from, int) else list(answer_from))
    answer_mask = torch.arange(T).unsqueeze(0) >= starts.unsqueeze(1)  # (b, T)
    return inputs, targets, answer_mask


def step_trace(train_step: Callable, spec: dict) -> dict:
    """Run ``train_step`` ``spec["steps"]`` times on a fresh stand-in model; what happened at each step.

    ``spec``: ``vocab_size``, ``d``, ``b``, ``T``, ``answer_from`` (an int or one per row), ``optimizer``
    (a key of :data:`OPTIMIZERS`), ``steps``, ``seed`` and optionally ``dropout``. Returns
    ``{"loss": [...], "grads": [[...], ...], "params": [[...], ...], "names": [...]}`` (the gradients
    the optimizer stepped with, and the parameters after each step; ``None`` for a missing gradient).
    """
    manual_seed(spec["seed"])
    model = StandInLM(spec["vocab_size"], spec["d"], spec.get("dropout", 0.0))
    model.train()
    optimizer = OPTIMIZERS[spec["optimizer"]](model.parameters())
    trace: dict = {"loss": [], "returned": [], "grads": [], "params": [],
                   "names": [n for n, _ in model.named_parameters()]}
    for k in range(spec["steps"]):
        batch = step_batch(spec["b"], spec["T"], spec["vocab_size"], spec["answer_from"], spec["seed"] + 10 * k)
        steps_before = len(optimizer.seen)
        manual_seed(spec["seed"] + 100 + k)
        loss = train_step(model, batch, optimizer)
        trace["returned"].append(_returned(loss))
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            loss = loss.detach().item()
        trace["loss"].append(loss)
        trace["grads"].append(optimizer.seen[-1] if len(optimizer.seen) > steps_before else None)
        trace["params"].append([p.detach().clone() for p in model.parameters()])
    return trace


def _step_case(spec: dict) -> Case:
    """A spec of :func:`step_trace` as a case whose keyword arguments are the spec (plain data): what the kernel
    hands out beside each trace, and what the grader's replay checks it against."""
    return Case(_step_spec_name(spec), (), dict(spec))


def _step_run(train_step: Callable, case: Case) -> list:
    """:func:`step_trace` of ``case``'s spec as plain data: ``[losses, returned, grads, params]`` (a loss that is
    a ``float`` or ``int`` of another type, numpy's ``float64``, as a Python number). Under the grader what the
    kernel hands out (a step's outcome): the verdict is computed outside."""
    trace = step_trace(train_step, case.kwargs)
    losses = [float(v) if isinstance(v, float) else int(v) if isinstance(v, int) and not isinstance(v, bool) else v
              for v in trace["loss"]]
    return [losses, trace["returned"], trace["grads"], trace["params"]]


def _step_trace_of(outcome: object, spec: dict) -> dict:
    """The trace :func:`_step_run` gave for ``spec`` (an outcome, so untrusted under the grader), refused
    (``spec.Forged``) unless it is one loss, one word for what was returned, the gradients the optimizer
    stepped with (or ``None``) and the parameters after the step, per step, for the stand-in model's parameters."""
    found = outcome
    with torch.device("meta"):  # the stand-in's parameter names, without drawing from the random generator
        names = [n for n, _ in StandInLM(spec["vocab_size"], spec["d"]).named_parameters()]
    steps = spec["steps"]

    def tensors(value: object, may_be_none: bool) -> bool:
        return isinstance(value, list) and len(value) == len(names) and all(
            isinstance(t, torch.Tensor) or (may_be_none and t is None) for t in value)

    if not (isinstance(found, (list, tuple)) and len(found) == 4 and all(isinstance(f, list) and len(f) == steps
                                                                         for f in found)
            and all(isinstance(r, str) for r in found[1])
            and all(g is None or tensors(g, True) for g in found[2]) and all(tensors(p, False) for p in found[3])):
        _spec.refuse("train_step", "steps on the stand-in model (per step: the loss, what was returned, the "
                                   "gradients the optimizer stepped with and the parameters after the step)")
    return {"loss": found[0], "returned": found[1], "grads": found[2], "params": found[3], "names": names}


def _returned(value: object) -> str:
    """What ``train_step`` returned, in words: ``float``, ``tensor with graph``, ``tensor``, or a type name."""
    if isinstance(value, float):
        return "float"
    if isinstance(value, torch.Tensor):
        return "tensor with graph" if value.grad_fn is not None or value.requires_grad else "tensor"
    return type(value).__name__


def _return_problem(returned: str) -> str | None:
    """Why a returned value is not the Python float the exercise asks for, or ``None``."""
    if returned == "float":
        return None
    if returned == "tensor with graph":
        return ("train_step returned the loss tensor, which still holds its computation graph (grad_fn): return "
                "loss.item(), a Python float. A loop that keeps every step's loss, as training.train keeps them in a "
                "list, would otherwise keep every step's whole graph alive, and memory would grow with every step")
    if returned == "tensor":
        return ("train_step returned a torch.Tensor: return loss.item(), a Python float, as the exercise asks (a "
                "list of losses, as training.train keeps, should hold plain numbers)")
    return f"train_step returned {returned}: return the loss as a Python float, loss.item()"


def _step_spec_name(spec: dict) -> str:
    dropout = f", dropout {spec['dropout']}" if spec.get("dropout") else ""
    return (f"{spec['optimizer']}, batch ({spec['b']}, {spec['T']}), answers from position {spec['answer_from']}, "
            f"{spec['steps']} steps{dropout}")


def _trace_problem(want: dict, got: dict) -> tuple[str, int] | None:
    """The first difference between two traces, in words, and the step where it is."""
    for k, (w_loss, g_loss) in enumerate(zip(want["loss"], got["loss"])):
        step = f"step {k + 1}"
        if not isinstance(g_loss, (int, float)) or isinstance(g_loss, bool):
            return f"train_step returned {type(g_loss).__name__}; return the loss as a Python float, loss.item()", k
        if abs(g_loss - w_loss) > 1e-4 + 1e-4 * abs(w_loss):
            return f"{step}: the returned loss is {g_loss:.6g}, expected {w_loss:.6g}", k
        if (want["grads"][k] is None) != (got["grads"][k] is None):
            return (f"{step}: optimizer.step() was never called" if got["grads"][k] is None else
                    f"{step}: optimizer.step() was called, but it should not have been"), k
        for name, w, g in zip(want["names"], want["grads"][k] or [], got["grads"][k] or []):
            if (w is None) != (g is None):
                return (f"{step}: when optimizer.step() ran, {name} had no gradient (None): call "
                        f"optimizer.zero_grad() BEFORE loss.backward(), and loss.backward() before optimizer.step()"
                        if g is None else f"{step}: {name} has a gradient where none was expected"), k
            if w is None:
                continue
            problem = tensor_difference(w, g)
            if problem:
                return f"{step}: the gradient of {name} that optimizer.step() used differs: {problem}", k
        for name, w, g in zip(want["names"], want["params"][k], got["params"][k]):
            problem = tensor_difference(w, g)
            if problem:
                return f"{step}: the parameter {name} after the step differs: {problem}", k
    return None


def _step_error_hint(error: BaseException) -> str | None:
    """A raw PyTorch error inside ``train_step``, translated into what it means."""
    text = str(error)
    if "does not require grad" in text:
        return ("the loss has no computation graph: the forward pass ran under torch.no_grad() (or the logits were "
                "detached, or the loss was made from loss.item()). Compute the loss from model(inputs) with "
                "gradients on, then call loss.backward().")
    sizes = re.search(r"Expected target size \[(\d+), (\d+)\], got \[(\d+), (\d+)\]", text)
    if sizes and sizes.group(1) == sizes.group(3):
        b, classes, second = sizes.group(1), sizes.group(2), sizes.group(4)
        return (f"F.cross_entropy takes the classes on dim 1: given 3-D logits (b, T, V) it reads T as the classes "
                f"and expects targets (b, V) = ({b}, {classes}), while yours are ({b}, {second}). Give it (n, V) "
                f"logits and (n,) targets, logits[answer_mask] and targets[answer_mask] (or move the classes to dim "
                f"1 first: logits.transpose(1, 2)).")
    if "Expected input batch_size" in text or "size mismatch" in text or "must match the size" in text:
        return ("the logits and the targets do not line up: select the same positions from both, "
                "logits[answer_mask] (n, V) and targets[answer_mask] (n,).")
    if "softmax" in text and "not implemented for" in text and ("'Long'" in text or "'Int'" in text):
        return ("a softmax was taken of integer token ids: F.cross_entropy takes the logits first and the targets "
                "second, F.cross_entropy(logits[answer_mask], targets[answer_mask]), (n, V) floats then (n,) ids. "
                "Are its arguments swapped?")
    return None


def _same_trace(a: dict, b: dict) -> bool:
    return _trace_problem(a, b) is None


def _common_factor(want: list | None, got: list) -> float | None:
    """``c`` where every gradient of ``got`` is ``c`` times the one of ``want`` (``c`` not 1), else ``None``."""
    if want is None or len(want) != len(got) or any((w is None) != (g is None) for w, g in zip(want, got)):
        return None
    pairs = [(w.double(), g.double()) for w, g in zip(want, got) if w is not None and w.shape == g.shape]
    if len(pairs) != len([w for w in want if w is not None]) or not pairs:
        return None
    dot = sum(float((w * g).sum()) for w, g in pairs)
    norm = sum(float((w * w).sum()) for w, _ in pairs)
    if norm == 0:
        return None
    c = dot / norm
    if abs(c - 1.0) < 1e-3 or abs(c) < 1e-6:
        return None
    if all(tensor_difference(c * w, g, atol=1e-6) is None for w, g in pairs):
        return c
    return None


def _step_diagnose(want: dict, got: dict, k: int, spec: dict) -> str | None:
    """Name a mistake from its symptoms (answer-free)."""
    grads_w, grads_g = want["grads"][k], got["grads"][k]
    if grads_g is None:
        return "call optimizer.step() after loss.backward()."
    if k > 0 and grads_w is not None and all(g is not None for g in grads_g):
        summed = [w + p for w, p in zip(grads_w, want["grads"][k - 1])]
        if all(tensor_difference(s, g) is None for s, g in zip(summed, grads_g)):
            return ("the gradients of step 2 are those of steps 1 and 2 added up: call optimizer.zero_grad() in every "
                    "step (loss.backward() adds to .grad).")
    factor = _common_factor(grads_w, grads_g)
    if factor is not None and abs(factor - 2.0) < 1e-3:
        return ("every gradient is twice the expected one: loss.backward() ran twice before optimizer.step() (the "
                "gradients add up in .grad): call it once per step.")
    diluted = _diluted_mean(factor, want, got, k, spec)
    if diluted:
        return diluted
    if factor is not None:
        return (f"every gradient is {factor:.3g} times the expected one when optimizer.step() runs: the gradients of "
                f"the mean loss itself go to the optimizer, not rescaled ones (no clip_grad_norm_ here, no loss "
                f"multiplied or divided before loss.backward()).")
    if all(g is not None and not g.abs().any() for g in grads_g):
        return ("every gradient was zero when optimizer.step() ran: call optimizer.zero_grad() BEFORE loss.backward(), "
                "not between backward and step.")
    if got["loss"] and isinstance(got["loss"][k], (int, float)) and k == 0:
        same_params = all(torch.equal(a, b) for a, b in zip(got["params"][0], want["params"][0]))
        if not same_params and abs(got["loss"][0] - want["loss"][0]) < 1e-4 * (1 + abs(want["loss"][0])):
            return "the loss is right but the step is not: step once with the gradients of this loss."
    return None


def _diluted_mean(factor: float | None, want: dict, got: dict, k: int, spec: dict) -> str | None:
    """Where the loss of step ``k`` and every gradient are ``n / (b * T)`` times ours (``n`` answer positions of
    ``b * T``): the loss is the mean over every position, those outside the answers counted as 0 (issue 36)."""
    b, T, answer_from = spec["b"], spec["T"], spec["answer_from"]
    starts = [answer_from] * b if isinstance(answer_from, int) else list(answer_from)
    n = sum(max(T - int(a), 0) for a in starts)
    loss, ours = got["loss"][k], want["loss"][k]
    if factor is None or not 0 < n < b * T or not isinstance(loss, (int, float)) or isinstance(loss, bool) \
            or not isinstance(ours, (int, float)) or abs(ours) < 1e-6:
        return None
    share = n / (b * T)
    if abs(factor - share) > 1e-3 * share or abs(loss / ours - share) > 1e-3 * share:
        return None
    return (f"the loss and every gradient are {share:.3g} times ours, the share of answer positions ({n} of b * T = "
            f"{b * T}): the loss is averaged over every position, the ones outside the answers counting as 0. "
            f"Average over the {n} answer positions only: F.cross_entropy(logits[answer_mask], targets[answer_mask]) "
            f"(or divide the masked sum by answer_mask.sum(), not by b * T).")


def _step_specs() -> list[dict]:
    return [
        {"vocab_size": 7, "d": 6, "b": 3, "T": 6, "answer_from": 3, "optimizer": "SGD", "steps": 2, "seed": 9041},
        {"vocab_size": 5, "d": 4, "b": 2, "T": 5, "answer_from": [1, 4], "optimizer": "AdamW", "steps": 2,
         "seed": 9042, "dropout": 0.2},
    ]


def _step_rungs() -> tuple[ladder.Rung, ...]:
    """train_step's ladder (:mod:`course_utils.checks.ladder`): one SGD step on one row, then two steps, a batch
    of 2 with its own answer start per row, then AdamW. Each rung is a run of :func:`step_trace` (the ``"steps"``
    runner) on a tiny stand-in model."""
    def r(b: int, answer_from: int | list, optimizer: str, steps: int, adds: str, suspects: str) -> ladder.Rung:
        spec = {"vocab_size": 5, "d": 4, "b": b, "T": 3, "answer_from": answer_from, "optimizer": optimizer,
                "steps": steps, "seed": 9046}
        return ladder.Rung(_step_case(spec), adds, suspects)
    return (
        r(1, 1, "SGD", 1, "", "logits = model(inputs), the loss F.cross_entropy(logits["
          "answer_mask], targets[answer_mask]) (the logits first, then the targets; the answer positions only; "
          "their mean), then optimizer.zero_grad(), loss.backward(), optimizer.step() in that order, and "
          "loss.item() returned?"),
        r(1, 1, "SGD", 2, "a second step", "what carries over from one step to the next: the gradients zeroed "
          "before each backward (optimizer.zero_grad() on every call, before loss.backward()), and one "
          "optimizer.step() per call?"),
        r(2, [1, 2], "SGD", 2, "a batch of 2 (each row its own answer start)", "the mask across the batch: "
          "logits[answer_mask] (the answer positions of every row, (n, vocab_size)) with targets[answer_mask] at the "
          "same positions, and one mean over all of them (not per row, not over the whole batch)?"),
        r(2, [1, 2], "AdamW", 2, "an optimizer with a state (AdamW)", "the optimizer given, used as it is: no new "
          "optimizer and no change of its settings inside train_step, one optimizer.step() per call?"),
    )


def _step_rung_output(found: object) -> object:
    """A rung's run (:func:`_step_run`) as the ladder compares it: ``(the losses, the parameters after the last
    step, joined)``; anything else as it is (not the expected form)."""
    if not (isinstance(found, list) and len(found) == 4 and all(isinstance(f, list) and f for f in found)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in found[0])
            and isinstance(found[3][-1], list) and all(isinstance(t, torch.Tensor) for t in found[3][-1])):
        return found
    return (torch.tensor(found[0], dtype=torch.float64), torch.cat([t.detach().flatten() for t in found[3][-1]]))


STEP_LADDER = ladder.Ladder(
    "train_step", _step_rungs, lambda case: _step_rung_output(_step_run(_expected.reference("train_step"), case)),
    lambda pair: [("the loss", pair[0]), ("the model after the steps", pair[1])], runner="steps",
    output=_step_rung_output, twins=False)


def _step_plan(hidden: bool) -> list[_spec.Step]:
    """One step per spec of :func:`step_trace`: the whole run of ``train_step`` on a fresh stand-in model; then
    the ladder's rungs."""
    specs = _step_specs() + (list(hidden_cases("train_step")) if hidden else [])
    return [_spec.Step(_step_spec_name(s), _step_case(s), "steps") for s in specs] + ladder.steps(STEP_LADDER, hidden)


def _judge_train_step(plan: list[_spec.Step], outcomes: _spec.Outcomes) -> str:
    exercise = "train_step"
    ladder.record(STEP_LADDER)
    smallest = lambda: ladder.diagnose(STEP_LADDER, outcomes)  # noqa: E731
    specs = [step.case.kwargs for step in plan]
    if any(s.get("dropout") for s in specs) and not random_outputs_comparable(exercise):
        plan = [step for step in plan if not step.case.kwargs.get("dropout")]
    for step in plan:
        spec = step.case.kwargs
        case = Case(_step_spec_name(spec), (spec,))
        want = expect(exercise, case.key(), lambda: step_trace(_expected.reference(exercise), spec))
        if _expected.is_recording():
            mistake_outputs(exercise, case)
        found = outcomes[step.key]
        if is_stub_error(found):
            fail(exercise, NOT_IMPLEMENTED)
        if isinstance(found, BaseException):
            try:
                fail(exercise, f"your code raised {type(found).__name__}: {found}.", case)
            except CheckFailed as error:
                error.student_error = found
                raise _hinted(error, _step_error_hint(found) or smallest()) from found
        got = _step_trace_of(found, spec)
        problem = _trace_problem(want, got)
        if problem is None:
            returned = next((r for r in got["returned"] if r != "float"), "float")
            said = _return_problem(returned)
            if said:
                fail(exercise, said + ".", case)
            continue
        problem, k = problem
        hint = None
        for mistake_hint, output in mistake_outputs(exercise, case):
            if _same_trace(output, got):
                hint = mistake_hint
                break
        hint = hint or _step_diagnose(want, got, k, spec) or smallest()
        try:
            fail(exercise, problem.rstrip(".") + ".", case)
        except CheckFailed as error:
            raise _hinted(error, hint) from None
    return (f"{len(plan)} runs of two steps agree with the reference: the loss on the answer positions, "
            f"the gradients the optimizer stepped with, and the parameters after each step")


check_train_step = _spec.declare(_spec.Spec("train_step", _step_plan, _judge_train_step, runners={"steps": _step_run}),
                                 """Check ``train_step(model, batch, optimizer)`` on a stand-in model: loss,
    gradients, parameters.""")


# ------------------------------------------------------------------------------------------
# generate
# ------------------------------------------------------------------------------------------
class CachedStandInLM(nn.Module):
    """A stand-in language model with a cache, for checking ``generate``: ids ``(b, T)`` -> logits ``(b, T, V)``.

    Position ``t``'s logits come from the mean of the token vectors ``0..t`` plus ``t``'s position vector
    (a causal mean, no attention: nothing of an answer). Like ``TinyGPT`` it has ``context_length``,
    ``forward(idx, use_cache=False)`` (the cache holds a running sum and ``num_cached``) and
    ``reset_cache()``; it refuses positions past ``context_length`` with a ``ValueError``. Every call is
    written down in ``calls`` as ``(tokens read, use_cache, tokens cached before)``. Cached and whole
    reads agree to float64 rounding, so greedy decoding writes the same tokens both ways.
    """

    def __init__(self, vocab_size: int, d: int, context_length: int):
        super().__init__()
        self.context_length = context_length
        self.embed = nn.Embedding(vocab_size, d)
        self.pos = nn.Embedding(context_length, d)
        self.head = nn.Linear(d, vocab_size)
        self.calls: list[tuple[int, bool, int]] = []
        self.reset_cache()

    def reset_cache(self) -> None:
        """Forget the cached sequence: the next ``use_cache=True`` call starts at position 0."""
        self.total: torch.Tensor | None = None  # (b, 1, d) float64: the sum of the cached token vectors
        self.num_cached = 0

    def forward(self, idx: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        """Token ids ``(b, T)`` -> logits ``(b, T, V)``; with ``use_cache`` at positions ``num_cached ..``."""
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2:
            raise ValueError(f"the stand-in model takes token ids (b, T), got {describe_shape(idx)}")
        b, T = idx.shape
        start = self.num_cached if use_cache else 0
        self.calls.append((T, bool(use_cache), start))
        if T == 0:
            raise ValueError("the stand-in model was given no tokens to read")
        if start + T > self.context_length:
            raise ValueError(f"the stand-in model cannot read positions {start}..{start + T - 1}: it has "
                             f"{self.context_length} positions")
        if use_cache and self.total is not None and self.total.shape[0] != b:
            raise ValueError(f"the stand-in model's cache holds {self.total.shape[0]} sequences, the input {b}")
        x = self.embed(idx).double()  # (b, T, d)
        before = self.total if use_cache and self.total is not None else torch.zeros(b, 1, x.shape[-1],
                                                                                      dtype=torch.float64)
        sums = before + x.cumsum(dim=1)  # (b, T, d): sums of the token vectors so far
        counts = torch.arange(start + 1, start + T + 1, dtype=torch.float64).view(1, T, 1)
        h = torch.tanh(sums / counts + self.pos(torch.arange(start, start + T)).double())  # (b, T, d)
        if use_cache:
            self.total, self.num_cached = sums[:, -1:], start + T
        return 3.0 * self.head(h.float())  # (b, T, V)


def _calls_text(calls: Sequence) -> str:
    """A model's calls in words: ``read 3 tokens (use_cache=True, 0 cached), ...``."""
    words = [f"read {n} token{'s' if n != 1 else ''} ({'use_cache=True, ' + str(s) + ' cached' if c else 'no cache'})"
             for n, c, s in calls]
    more = f", ... ({len(words)} calls)" if len(words) > 5 else ""
    return ", ".join(words[:5]) + more if words else "no call"


def _spec_text(spec: dict) -> str:
    """How ``generate`` is called in a case, in words."""
    runs = spec["runs"]
    first = runs[0]
    args = (f"prompt ({spec['b']}, {first[0]}), max_new_tokens={first[1]}, temperature={spec['temperature']}, "
            f"top_k={spec['top_k']}, use_cache={spec['use_cache']}")
    extra = []
    if spec.get("prefill"):
        extra.append(f"the model's cache holding {spec['prefill']} tokens of an earlier sequence")
    if len(runs) > 1:
        extra.append(f"then {len(runs) - 1} more call{'s' if len(runs) > 2 else ''} on the same model "
                     + ", ".join(f"(prompt ({spec['b']}, {t0}), max_new_tokens={n})" for t0, n in runs[1:]))
    return f"generate(model, {args}) with context_length={spec['context_length']}" + (
        "; " + "; ".join(extra) if extra else "")


def stand_in_model(spec: dict) -> CachedStandInLM:
    """The stand-in model of a ``generate`` case (``spec``: ``vocab_size``, ``d``, ``context_length``, ``seed``),
    its weights drawn after ``manual_seed(spec["seed"])``: the same model wherever it is built."""
    manual_seed(spec["seed"])
    model = CachedStandInLM(spec["vocab_size"], spec["d"], spec["context_length"])
    if spec.get("logits"):  # the same logits at every position, exactly tied where the spec's values are equal
        with torch.no_grad():
            model.head.weight.zero_()
            model.head.bias.copy_(torch.tensor(spec["logits"]) / 3.0)
    return model


def generate_trace(generate: Callable, spec: dict) -> dict:
    """Run ``generate`` on a fresh stand-in model as ``spec`` says; what came out of each call.

    ``spec``: ``vocab_size``, ``d``, ``context_length``, ``b``, ``runs`` (a list of ``(T0,
    max_new_tokens)``, one call of ``generate`` each, on the same model), ``temperature``, ``top_k``,
    ``use_cache``, ``seed`` and optionally ``prefill`` (tokens read into the cache before the first call).
    Returns ``{"runs": [{"out", "error", "calls"}, ...]}``: the returned tensor (or ``None``), the error
    raised as ``[type name, message]`` (or ``None``), and the model's calls.
    """
    model = stand_in_model(spec)
    if spec.get("prefill"):
        with torch.no_grad():
            model(tokens(spec["b"], spec["prefill"], spec["vocab_size"], spec["seed"] + 5), use_cache=True)
    runs = []
    for k, (T0, n) in enumerate(spec["runs"]):
        prompt = tokens(spec["b"], T0, spec["vocab_size"], spec["seed"] + 10 + k)
        model.calls = []
        manual_seed(spec["seed"] + 100 + k)
        out, error = None, None
        try:
            result = generate(model, prompt.clone(), n, temperature=spec["temperature"], top_k=spec["top_k"],
                              use_cache=spec["use_cache"])
        except NotImplementedError as exc:
            if is_stub_error(exc):
                raise
            error = [type(exc).__name__, str(exc)]
        except Exception as exc:  # noqa: BLE001 - part of the trace
            error = [type(exc).__name__, str(exc)]
        else:
            out = result.detach().clone() if isinstance(result, torch.Tensor) else [type(result).__name__]
        runs.append({"out": out, "error": error, "calls": [list(c) for c in model.calls]})
    return {"runs": runs}


def _generate_case(spec: dict) -> Case:
    """A spec of :func:`generate_trace` as a case whose keyword arguments are the spec (plain data): what the
    kernel hands out beside each trace, and what the grader's replay checks it against."""
    return Case(spec["name"], (), dict(spec))


def _generate_run(generate: Callable, case: Case) -> list:
    """:func:`generate_trace` of ``case``'s spec as plain data: per call of ``generate``, ``[out, error,
    calls]``, the model's calls as an ``(n, 3)`` integer tensor (tokens read, use_cache, tokens cached
    before) and an error's message cut to ``probe.MAX_MESSAGE``. Under the grader what the kernel hands out
    (a step's outcome): the verdict is computed outside."""
    trace = generate_trace(generate, case.kwargs)
    return [[run["out"], None if run["error"] is None else [run["error"][0], run["error"][1][:_probe.MAX_MESSAGE]],
             torch.tensor(run["calls"], dtype=torch.int64).reshape(-1, 3)] for run in trace["runs"]]


def _generate_trace_of(outcome: object, spec: dict) -> dict:
    """The trace :func:`_generate_run` gave for ``spec`` (an outcome, so untrusted under the grader), refused
    (``spec.Forged``) unless it is, per call of ``generate``, its tokens (a tensor, or the type name of what it
    returned) or ``None``, what it raised (``[type name, message]``) or ``None``, and the model's calls."""
    found = outcome

    def names(value: object, n: int) -> bool:
        return isinstance(value, list) and len(value) == n and all(isinstance(v, str) for v in value)

    def calls(value: object) -> bool:
        return isinstance(value, torch.Tensor) and value.dtype == torch.int64 and value.dim() == 2 and \
            value.shape[1] == 3 and bool((value >= 0).all()) and bool((value[:, 1] <= 1).all())

    if not (isinstance(found, list) and len(found) == len(spec["runs"]) and all(
            isinstance(run, list) and len(run) == 3 and (run[0] is None or isinstance(run[0], torch.Tensor)
                                                         or names(run[0], 1))
            and (run[1] is None or names(run[1], 2)) and calls(run[2]) for run in found)):
        _spec.refuse("generate", "calls on the stand-in model (per call: the tokens it returned, what it raised "
                                 "and the model's calls)")
    return {"runs": [{"out": out, "error": error, "calls": [[int(n), bool(c), int(s)] for n, c, s in made.tolist()]}
                     for out, error, made in found]}


def _raising_mistake(exercise: str, case: Case, got: dict, passed: Sequence[tuple[Case, dict]]) -> str | None:
    """The hint of the one known mistake whose trace is ``got``'s in every call (the tokens, the error's type and
    message, the model's calls), for a ``generate`` that raised, among those whose traces on the cases the student
    passed (``passed``: each case with our trace there) are ours: an error's message alone (torch.multinomial's,
    say) has several causes, so a mistake is named only where no other one gives the same traces (issue 36)."""
    def said(error: list | None) -> tuple | None:
        return None if error is None else (error[0], str(error[1])[:_probe.MAX_MESSAGE])

    def calls(made: list) -> list:
        return [[int(n), bool(c), int(before)] for n, c, before in made]

    def same(a: dict, b: dict) -> bool:
        return _same_generation(a, b) and all(said(x["error"]) == said(y["error"]) and calls(x["calls"]) == calls(y["calls"])
                                              for x, y in zip(a["runs"], b["runs"]))

    found = [hint for hint, output in mistake_outputs(exercise, case) if same(output, got)]
    for earlier, want in passed:  # a mistake whose trace differs from ours where the student's agreed is not theirs
        outputs = {hint: output for hint, output in mistake_outputs(exercise, earlier)}
        found = [hint for hint in found if hint not in outputs or same(outputs[hint], want)]
    return found[0] if len(found) == 1 else None


def _same_generation(a: dict, b: dict) -> bool:
    """Two traces return the same tokens (or raise the same kind of error) in every call."""
    for x, y in zip(a["runs"], b["runs"]):
        if (x["error"] is None) != (y["error"] is None):
            return False
        if x["error"] is not None:
            if x["error"][0] != y["error"][0]:
                return False
            continue
        if not (isinstance(x["out"], torch.Tensor) and isinstance(y["out"], torch.Tensor)
                and x["out"].shape == y["out"].shape and torch.equal(x["out"], y["out"])):
            return False
    return True


def _calls_hint(spec: dict, want_calls: list, got_calls: list, raised: bool = False) -> str | None:
    """What the model's calls say about a ``generate`` whose calls differ from ours (answer-free). ``raised``:
    ``generate`` raised, so fewer calls than reads are its consequence, not a cause (issue 36): not said."""
    got = [tuple(c) for c in got_calls]
    want = [tuple(c) for c in want_calls]
    if got == want:
        return None
    if spec["use_cache"]:
        if got and not got[0][1]:
            return ("use_cache=True was asked, but the model was called without it: read the prompt with "
                    "model(prompt_ids, use_cache=True), then each new token with model(tokens[:, -1:], use_cache=True).")
        if got and got[0][2] > 0:
            return (f"the first call found {got[0][2]} tokens already in the cache, from an earlier sequence: call "
                    f"model.reset_cache() before reading the prompt.")
        if any(c[1] and c[0] > 1 for c in got[1:]):
            return ("after the prompt, a use_cache=True call read more than the newest token: the cache already holds "
                    "the earlier tokens, so reading them again stores them twice (and moves every position). Feed "
                    "only tokens[:, -1:].")
        if want and got and got[0][0] != want[0][0]:
            return (f"the first call read {got[0][0]} tokens: read the whole prompt ({want[0][0]} tokens) in one "
                    f"call with use_cache=True.")
        for i in range(1, len(got)):  # a cached call finds every token read since the prompt, unless emptied
            read = sum(n for n, _, _ in got[:i])
            if got[i][1] and got[i][2] < read and all(c[1] for c in got[:i]):
                return (f"call {i + 1} found {got[i][2]} tokens in the cache where the calls before it had read {read}: "
                        f"the cache was emptied between steps, so each new token was read without the tokens before "
                        f"it. Call model.reset_cache() once before the prompt and once after the loop, not inside it.")
    elif any(c[1] for c in got):
        return "use_cache=False was asked, but the model was called with use_cache=True: read model(tokens) every step."
    elif want and got and (any(g[0] != w[0] for g, w in zip(got, want)) if raised else got[-1][0] != want[-1][0]):
        # after a raise, only the calls made count: those that read what ours read say nothing (issue 36)
        return ("without the cache every step reads the whole sequence so far, model(tokens), prompt and new tokens "
                "together.")
    if len(got) != len(want) and not (raised and len(got) < len(want)):
        return (f"the model was called {len(got)} times for {len(want)} reads: one call per new token, and none "
                f"after the last one (the last new token is never read).")
    return None


@symptoms.bonus
def _temperature_order_hint(spec: dict, error: list, plan: Sequence[_spec.Step], outcomes: _spec.Outcomes) -> str | None:
    """Where torch.multinomial refused a row with top_k at a temperature other than 1, while every case with top_k
    at temperature 1 ran: the top-k threshold and the logits it masks were taken on different sides of the
    division by the temperature (issue 36), which at temperature 1 are the same."""
    if "probability tensor contains" not in error[1] or not spec.get("top_k") or spec["temperature"] in (0, 1):
        return None
    at_one = [step for step in plan if step.case.kwargs.get("top_k") and step.case.kwargs.get("temperature") == 1.0
              and "says" not in step.case.kwargs]
    if not at_one or any(run["error"] is not None for step in at_one
                         for run in _generate_trace_of(outcomes[step.key], step.case.kwargs)["runs"]):
        return None
    return (f"top_k sampled at temperature 1, but at temperature {spec['temperature']} the top-k mask left a row with "
            f"no token: the k-th largest logit and the logits it masks were taken on different sides of the division "
            f"by the temperature (at temperature 1 both sides are the same). Divide first, logits = logits / "
            f"temperature, then take the k-th largest of those and mask the logits below it.")


@symptoms.bonus
def _loop_error_hint(spec: dict, k: int, error: list, calls: list,
                     named: Callable[[], str | None] = lambda: None,
                     batch_of_one: Callable[[], bool | None] = lambda: None,
                     prompt_read_as_float: Callable[[], bool] = lambda: False) -> str | None:
    """The cause of an error ``generate`` raised in a case where it must not raise (``error``: ``[type name,
    message]``), read from the message and the case (issue 36: the cause, not the count of the model's calls).
    Where the message has several causes, ``named()`` first: the one known mistake whose traces are the student's
    (:func:`_raising_mistake`), if there is one. ``batch_of_one()``: whether greedy decoding of a single sequence is
    right (the ladder's smallest rungs, :func:`_greedy_batch_of_one`; ``None`` where they did not run);
    ``prompt_read_as_float()``: whether the ladder's smallest rung raised for float ids at its first call, the
    prompt's (:func:`_prompt_read_as_float`)."""
    kind, message = error
    if kind == "TypeError" and spec.get("top_k") is None and "NoneType" in message \
            and re.search(r"'[<>]=?' not supported", message):
        return ("top_k = None (the default: no top-k) was compared with a number, which Python refuses: test for None "
                "first, `if top_k is not None and top_k < 1`, and apply the top-k mask only when top_k is not None.")
    sizes = symptoms.broadcast_sizes(message)
    b, V = spec["b"], spec["vocab_size"]
    if sizes and sizes[2] in (None, 1) and spec.get("top_k") and spec["temperature"] > 0 and b != V \
            and {sizes[0], sizes[1]} == {b, V}:
        return (f"one value per row, ({b},), met the ({b}, {V}) logits along the vocabulary: with top_k the k-th "
                f"largest logit of each row lost its dimension. Keep it (b, 1), torch.topk(logits, k, "
                f"dim=-1).values[:, -1:] (not values[:, -1]), so that each row is compared with its own k-th largest.")
    if "probability tensor contains" in message:
        if spec["temperature"] == 0 and spec.get("top_k"):
            return (f"at temperature 0 with top_k = {spec['top_k']} your code sampled, dividing the logits by 0 (inf "
                    f"and NaN, which torch.multinomial refuses): temperature 0 means greedy decoding WHATEVER top_k is. "
                    f"Test temperature == 0 alone, before any top-k or sampling, and take logits.argmax(dim=-1, "
                    f"keepdim=True); top_k only matters when sampling.")
        if spec["temperature"] == 0:
            return ("dividing the logits by temperature 0 gives inf and NaN, which torch.multinomial refuses: "
                    "temperature 0 means greedy decoding, logits.argmax(dim=-1, keepdim=True), without sampling.")
        if spec.get("top_k"):
            return named() or ("torch.multinomial was given a row it cannot sample from: either it got the logits, not "
                    "probabilities (sample from torch.softmax(logits / temperature, dim=-1)), or the top-k mask set "
                    f"every logit of a row to -inf (top_k = {spec['top_k']}: the k-th largest logit itself stays, so "
                    "mask logits < kth, not <= kth), or torch.topk ran over another dimension than the vocabulary "
                    "(torch.topk(logits, top_k, dim=-1): the batch is dim 0).")
        return ("torch.multinomial takes probabilities (each row non-negative, not all zero), not logits: sample from "
                "torch.softmax(logits / temperature, dim=-1).")
    if spec.get("top_k") and spec["top_k"] > spec["vocab_size"] and "out of range" in message:
        return (f"top_k = {spec['top_k']} is larger than the vocabulary ({spec['vocab_size']} tokens): then every token "
                f"is kept, torch.topk(logits, min(top_k, logits.shape[-1])).")
    first_read = len(calls) == 1 and calls[0][0] == spec["runs"][k][0] and calls[0][2] == 0
    if "'indices'" in message and "Float" in message and (first_read or prompt_read_as_float()):
        return (("the model's very first call, reading the prompt, already got float token ids, before any new token "
                 "was made" if first_read else
                 "in the smallest case (greedy, one new token, without the cache) the model's first call, reading the "
                 "prompt, already got float token ids, before any new token was made") +
                ": the tensor that holds the tokens is float. A buffer made with torch.zeros(b, T0 + max_new_tokens) "
                "(or torch.empty) is float32 unless told otherwise: create it with dtype=torch.long (or "
                "prompt_ids.new_zeros(...)), so that the prompt copied into it and the tokens fed to the model stay "
                "integer ids, and so does the output.")
    if "'indices'" in message and "Float" in message:
        return ("the new token is a float: the model looks up integer token ids. logits.max(dim=-1).values is the largest "
                "logit itself; the token is its index, logits.argmax(dim=-1, keepdim=True) (or max(...).indices).")
    dims = re.search(r"same number of dimensions: got (\d+) and (\d+)", message)
    if dims and int(dims.group(2)) > int(dims.group(1)):
        return (f"the new token has {dims.group(2)} dimensions where the tokens (b, T) have {dims.group(1)}: it was "
                f"taken from the logits of every position, (b, T, vocab_size). Keep only the last position's, "
                f"logits[:, -1, :] (b, vocab_size), before the argmax or the sampling (with the cache too).")
    if "must have same number of dimensions" in message or "Tensors must have same" in message:
        return ("the new token has lost its token dimension: logits.argmax(dim=-1) gives (b,); torch.cat with the "
                "tokens (b, T) needs (b, 1): argmax(dim=-1, keepdim=True) (torch.multinomial already gives (b, 1)).")
    cat = re.search(r"Sizes of tensors must match except in dimension (\d+)\. Expected size (\d+) but got size (\d+)",
                    message)
    if cat and cat.group(1) == "0":
        return ("torch.cat joins along dim=0, the batch: the new token (b, 1) goes after the tokens (b, T) along the "
                "sequence, torch.cat([tokens, new_token], dim=1).")
    if cat and cat.group(1) == "1" and cat.group(3) == "1" and int(cat.group(2)) > 1:
        rows = f"the new token has 1 row where the batch has {cat.group(2)}"
        fix = "logits.argmax(dim=-1, keepdim=True) gives (b, 1) (or logits.argmax(dim=-1).unsqueeze(-1))"
        one = batch_of_one()
        if one is True:
            return (f"{rows}, yet with a batch of one sequence your greedy tokens are right (the smallest cases): "
                    f"the argmax was taken over the vocabulary, but its (b,) result was given its new axis in front, "
                    f"(1, b) (unsqueeze(0)), instead of after, (b, 1). {fix}.")
        if one is False:
            return (f"{rows}, and already with a batch of one sequence the greedy tokens are wrong: it was reduced "
                    f"over dim=0, the batch, instead of dim=-1, the vocabulary: {fix}.")
        return (f"{rows}: it is (1, ...) where it must be (b, 1): either the argmax ran over dim=0, the batch, or its "
                f"(b,) result was unsqueezed on axis 0, (1, b). {fix}.")
    fed = re.search(r"takes token ids \(b, T\), got \((\d+),\)", message)
    if fed:
        return (f"the model was given a one-dimensional ({fed.group(1)},) tensor, one token per row without the "
                f"sequence dimension; it reads token ids (b, T). Feed the newest token as tokens[:, -1:], (b, 1), "
                f"not tokens[:, -1], (b,).")
    if cat and cat.group(1) == "1" and calls and int(cat.group(2)) == spec["b"] \
            and int(cat.group(3)) == int(calls[-1][0]) != spec["b"]:
        return (f"the new token has {cat.group(3)} rows where the batch has {spec['b']}, and {cat.group(3)} is the "
                f"number of tokens the model had just read: the logits were indexed along the batch (logits[-1] is "
                f"the last sequence's (T, vocab_size)). Take the last position of every sequence, logits[:, -1], "
                f"(b, vocab_size).")
    T0, n = spec["runs"][k]
    if kind == "ValueError" and not calls and "context" not in message.lower():
        said = message.lower()
        if "temperature" in said and spec["temperature"] >= 0:
            return (f"temperature = {spec['temperature']} was refused, but it is valid: 0 means greedy decoding (argmax, "
                    f"no sampling). Raise a ValueError only for a negative temperature, temperature < 0.")
        if "top_k" in said and (spec["top_k"] is None or spec["top_k"] >= 1):
            return (f"top_k = {spec['top_k']} was refused, but it is valid: None means no top-k, and any top_k >= 1 is "
                    f"allowed (one larger than the vocabulary keeps every token). Raise only when top_k < 1.")
        if "max_new_tokens" in said and n >= 0:
            return (f"max_new_tokens = {n} was refused, but it is valid (0 returns the prompt as it is): raise only "
                    f"when max_new_tokens < 0.")
    if kind == "ValueError" and not calls and T0 + n - 1 <= spec["context_length"]:
        return (f"the model reads T0 + max_new_tokens - 1 = {T0 + n - 1} tokens (the last new token is never read), "
                f"and context_length = {spec['context_length']} of them fit: raise only when T0 + max_new_tokens - 1 "
                f"> context_length.")
    return None


@symptoms.bonus
def _tie_hint(spec: dict, k: int, want: torch.Tensor, got: object) -> str | None:
    """On a case whose stand-in model gives the same logits at every step (``spec["logits"]``), two of them tied
    for the k-th largest (issue 36): where the student's new tokens are all among those the top-k keeps and hold
    some, but not all, of the tied tokens, where ours hold them all, exactly k tokens were kept, a tied one dropped
    (the text keeps every logit equal to the k-th largest)."""
    logits, top_k, T0 = spec.get("logits"), spec.get("top_k"), spec["runs"][k][0]
    if not (logits and top_k and isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == torch.int64):
        return None
    kth = sorted(logits, reverse=True)[min(top_k, len(logits)) - 1]
    kept = {t for t, v in enumerate(logits) if v >= kth}
    tied = {t for t, v in enumerate(logits) if v == kth}
    drawn, ours = set(got[:, T0:].flatten().tolist()), set(want[:, T0:].flatten().tolist())
    if len(kept) <= top_k or not (drawn <= kept and tied <= ours and drawn & tied and not tied <= drawn):
        return None
    never = sorted(tied - drawn)
    names = " and ".join(str(t) for t in sorted(tied))
    return (f"the model's logits are {[float(v) for v in logits]} at every step, so tokens {names} tie for the "
            f"{_ordinal(top_k)} largest, and top_k = {top_k}: the exercise keeps every logit equal to the k-th largest, "
            f"so {len(kept)} tokens stay, yet in {got[:, T0:].numel()} draws you never drew token "
            f"{' or '.join(map(str, never))}: exactly k tokens were kept, one of the tied dropped (as a scatter of "
            f"torch.topk's k indices, or a sort cut after k, does). Keep every logit >= the k-th largest: kth = "
            f"torch.topk(logits, k, dim=-1).values[:, -1:], then logits.masked_fill(logits < kth, float('-inf')).")


@symptoms.bonus
def _greedy_batch_of_one(rungs: ladder.Ladder, plan: Sequence[_spec.Step], outcomes: _spec.Outcomes) -> bool | None:
    """Whether greedy decoding of a batch of ONE sequence is right, read from the ladder's smallest rungs (without the
    cache, one then several new tokens) and from the plan's greedy cases of one sequence (the hidden plan has one):
    the values a batch of one gives, to tell a new token reduced over the batch from one unsqueezed on the batch axis
    (issue 36). ``None`` where no such case ran with its expected value, or they disagree."""
    found = []
    if ladder.ran(rungs, outcomes, 2):
        for i, rung in enumerate(rungs.rungs[:2]):
            if rung.case.kwargs["b"] != 1:
                continue
            try:
                ladder.expected_output(rungs, rung)
            except _expected.MissingExpectation:
                continue
            found.append(ladder.right(rungs, outcomes, i) is not None)
    for step in plan:
        spec = step.case.kwargs
        if step.run != "generate" or spec.get("b") != 1 or spec.get("temperature") != 0 or "says" in spec:
            continue
        try:
            want = expect("generate", Case(spec["name"], (spec,)).key(),
                          lambda: generate_trace(_expected.reference("generate"), spec))
        except _expected.MissingExpectation:
            continue
        found.append(_same_generation(want, _generate_trace_of(outcomes[step.key], spec)))
    return found[0] if found and len(set(found)) == 1 else None


@symptoms.bonus
def _prompt_read_as_float(rungs: ladder.Ladder, outcomes: _spec.Outcomes) -> bool:
    """Whether the ladder's smallest rung (greedy, one new token, without the cache: the model reads only the
    prompt) raised for float token ids (issue 36): the tokens were float before any new token was made, so the
    float comes from the tensor that holds them, not from the new token."""
    if not ladder.ran(rungs, outcomes, 1):
        return False
    found = outcomes[ladder.RUNG_PREFIX + rungs.rungs[0].case.key()]
    if not (isinstance(found, list) and len(found) == 1 and isinstance(found[0], list) and len(found[0]) == 3):
        return False
    error, calls = found[0][1], found[0][2]
    return isinstance(error, list) and len(error) == 2 and "'indices'" in str(error[1]) and "Float" in str(error[1]) \
        and isinstance(calls, torch.Tensor) and calls.dim() == 2 and calls.shape[0] == 1


def _top_k_positions_hint(spec: dict, k: int, want: torch.Tensor, got: object) -> str | None:
    """With top_k, new tokens that are all below top_k (where ours are not) are positions in torch.topk's result,
    not token ids (issue 36)."""
    top_k, T0 = spec.get("top_k"), spec["runs"][k][0]
    if not (top_k and isinstance(got, torch.Tensor) and got.shape == want.shape and top_k < spec["vocab_size"]):
        return None
    new, ours = got[:, T0:], want[:, T0:]
    if new.numel() and bool((new < top_k).all()) and not bool((ours < top_k).all()):
        return (f"every new token is below top_k = {top_k}: these are positions among torch.topk's k values, not token "
                f"ids. Map them back to the vocabulary (indices.gather(-1, choice)), or sample from the full (b, V) "
                f"softmax with -inf outside the top k.")
    return None


@symptoms.bonus
def _top_k_rank_hint(spec: dict, k: int, want: torch.Tensor, got: object) -> str | None:
    """With top_k and a temperature above 0, where a sampled token stands among the stand-in model's logits
    at its step (issue 36): a token that is the (k+1)-th most likely, and none further down, says the
    sampling kept k + 1 candidates; one further down, that the top-k mask let through tokens it must drop.
    The stand-in model is rebuilt (:func:`stand_in_model`, as :func:`generate_trace` builds it) and reads the
    returned tokens (data, not the student's code), without the cache: its logits are those of a cached read up
    to rounding."""
    top_k, T0, V = spec.get("top_k"), spec["runs"][k][0], spec["vocab_size"]
    if not (top_k and spec["temperature"] > 0 and isinstance(got, torch.Tensor) and got.shape == want.shape
            and got.dtype == torch.int64 and got.shape[1] > T0 and bool(((got >= 0) & (got < V)).all())):
        return None
    with torch.random.fork_rng():
        model = stand_in_model(spec)

    def ranks_of(tokens: torch.Tensor) -> torch.Tensor:
        """``(b, n)``: each new token's rank among the logits it was drawn from, 0 for the most likely."""
        with torch.no_grad():
            logits = model(tokens[:, :-1]).double()[:, T0 - 1:]  # (b, n, V)
        return (logits > logits.gather(-1, tokens[:, T0:].unsqueeze(-1))).sum(dim=-1)

    ranks = ranks_of(got)
    worst = int(ranks.max())
    if top_k >= V:  # every token stays: a sample that never goes below some rank where ours does kept fewer
        ours = int(ranks_of(want).max())
        if worst >= ours:
            return None
        return (f"top_k = {top_k} is at least the vocabulary ({V} tokens), so every token stays; yet each token you "
                f"sampled is among the model's {worst + 1} most likely at its step, where ours reach the "
                f"{_ordinal(ours + 1)} most likely: fewer tokens were kept. Clip top_k to the vocabulary, the last dimension of "
                f"the logits: torch.topk(logits, min(top_k, logits.shape[-1])).")
    if worst < top_k:
        return None
    row, step = (int(v) for v in (ranks == worst).nonzero()[0])
    if worst == top_k:
        return (f"top_k keeps k + 1 candidates: row {row}, new token {step + 1} is the model's "
                f"{_ordinal(top_k + 1)} most likely token, and top_k = {top_k}. The threshold is the k-th largest "
                f"logit, torch.topk(logits, k).values[:, -1:] (or the sorted logits' column k - 1, not column k), and "
                f"every logit below it becomes -inf, so exactly k tokens stay.")
    return (f"a token outside the top k was sampled: row {row}, new token {step + 1} is the model's "
            f"{_ordinal(worst + 1)} most likely token, and top_k = {top_k}. Keep the k largest logits "
            f"(torch.topk(logits, k).values[:, -1:] is the k-th largest) and set every logit below it to -inf "
            f"before the softmax.")


@symptoms.bonus
def _token_rank_hint(spec: dict, k: int, want: torch.Tensor, got: object) -> str | None:
    """Generic (issue 36, after the specific hints): where the student's new tokens stand in the stand-in model's
    distribution at their own steps. Greedy decoding (temperature 0) whose first differing token is not the most
    likely one; sampling whose every new token is the most likely one (the argmax taken where a sample is
    asked); every new token of a row the same while ours are not (the input never grows). The model is rebuilt
    (:func:`stand_in_model`) and reads the returned tokens (data), as in :func:`_top_k_rank_hint`."""
    T0 = spec["runs"][k][0]
    if not (isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == torch.int64
            and got.shape[1] > T0 + 1 and bool(((got >= 0) & (got < spec["vocab_size"])).all())):
        return None
    new, ours = got[:, T0:], want[:, T0:]
    same = (new == new[:, :1]).all(dim=1) & ~(ours == ours[:, :1]).all(dim=1)
    if bool(same.any()):
        row = int(same.nonzero()[0])
        return (f"every new token of row {row} is the same token, {int(new[row, 0])}, where the model's are not: each "
                f"step reads the same input. Append each new token (torch.cat along dim=1) and give the model what it "
                f"has not read yet: the whole sequence without the cache, only the new token with it.")
    with torch.random.fork_rng():
        model = stand_in_model(spec)
    with torch.no_grad():
        logits = model(got[:, :-1]).double()[:, T0 - 1:]  # (b, n, V): the logits each new token was chosen from
    chosen = logits.gather(-1, new.unsqueeze(-1))  # (b, n, 1)
    ranks = (logits > chosen).sum(dim=-1)  # (b, n): 0 for the most likely token
    differ = (new != ours).nonzero()
    if not len(differ):
        return None
    row, step = (int(v) for v in differ[0])
    if spec["temperature"] == 0 and int(ranks[row, step]) > 0:
        return (f"greedy decoding (temperature 0) takes the most likely token at each step, but row {row}, new token "
                f"{step + 1} is the model's {_ordinal(int(ranks[row, step]) + 1)} most likely: take "
                f"torch.argmax(logits[:, -1, :], dim=-1) of the last position's logits, unchanged (no sampling, no "
                f"division by temperature 0, no other position or dimension).")
    if spec["temperature"] > 0 and bool((ranks == 0).all()) and not torch.equal(new, ours):
        kept = (f" Or the top-k mask keeps only the largest logit: with top_k = {spec['top_k']}, the threshold is the "
                f"k-th largest, torch.topk(logits, k).values[:, -1:], not values[:, :1]." if spec.get("top_k") else "")
        return (f"temperature = {spec['temperature']:g} asks for sampling, but every new token is the model's most "
                f"likely one: that is greedy decoding. Sample with torch.multinomial(torch.softmax(logits / "
                f"temperature, dim=-1), 1) (after the top-k mask, if any).{kept}")
    return None


def _ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ..."""
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _tokens_problem(spec: dict, k: int, prompt_len: int, want: torch.Tensor, got: object) -> str | None:
    """The first difference between the expected and the returned tokens of call ``k``, in words."""
    if not isinstance(got, torch.Tensor):
        return f"generate returned {got[0] if isinstance(got, list) else type(got).__name__}, not a tensor of token ids"
    n = want.shape[1] - prompt_len
    if got.shape != want.shape:
        if got.dim() == 2 and got.shape[0] == want.shape[0] and prompt_len <= got.shape[1] < want.shape[1] \
                and torch.equal(got[:, :prompt_len], want[:, :prompt_len]):
            k = got.shape[1] - prompt_len
            short = (f" {n - k} is the prompt's length: does the loop run max_new_tokens - T0 times, as if "
                     f"max_new_tokens were the total length? max_new_tokens counts the NEW tokens only"
                     if n - k == prompt_len else " The loop must add max_new_tokens new tokens")
            return (f"the output has shape {tuple(got.shape)}: the prompt ({prompt_len} tokens) followed by only {k} "
                    f"new token{'' if k == 1 else 's'} where max_new_tokens = {n} asks for {n}, ({want.shape[0]}, {want.shape[1]}) in "
                    f"all.{short}")
        if tuple(got.shape) == (want.shape[0], n) and n != want.shape[1]:
            return (f"the output has shape {tuple(got.shape)}: only the {n} new tokens. Return the prompt followed "
                    f"by the new tokens, ({want.shape[0]}, {want.shape[1]})")
        return f"the output has shape {tuple(got.shape)}, expected {tuple(want.shape)} (the prompt and {n} new tokens)"
    if got.dtype != want.dtype:
        return f"the output's dtype is {got.dtype}, expected {want.dtype} (token ids)"
    if not torch.equal(got[:, :prompt_len], want[:, :prompt_len]):
        return f"the first {prompt_len} tokens of each row must be the prompt, unchanged"
    diff = (got != want).nonzero()
    if len(diff) == 0:
        return None
    row, position = (int(v) for v in diff[0])
    return (f"row {row}, new token {position - prompt_len + 1} (position {position}): expected token "
            f"{int(want[row, position])}, got {int(got[row, position])} ({int((got != want).sum())} of "
            f"{want.shape[0] * n} new tokens differ)")


def _prompt_problem(spec: dict, k: int, want: torch.Tensor, got: object) -> str | None:
    """Where the output of call ``k`` does not start with the prompt (issue 36): ``None`` where it does (or has
    not the expected shape); else where the prompt is, if every row holds it in one place, or ``""``."""
    T0 = spec["runs"][k][0]
    if not (isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype):
        return None
    prompt = want[:, :T0]
    if torch.equal(got[:, :T0], prompt):
        return None
    n = want.shape[1] - T0
    at = [p for p in range(1, n + 1) if torch.equal(got[:, p:p + T0], prompt)]
    if not at:
        return ""
    if at[-1] == n:
        return ("the prompt ends each row instead of starting it: the new tokens were put in front of it "
                "(torch.cat([new, tokens], dim=1)). Append each new token after the tokens so far, "
                "torch.cat([tokens, new], dim=1): the output is the prompt followed by the new tokens.")
    return (f"the prompt starts at position {at[0]} of each row instead of 0: tokens were put in front of it. "
            f"Append each new token after the tokens so far, torch.cat([tokens, new], dim=1).")


#: What an argument case of ``generate`` must refuse, by the case's name (issue 36, batch N: ``if top_k and ...``).
_REFUSE = {
    "max_new_tokens=-1": "max_new_tokens=-1 asks for a negative number of tokens: check the arguments first, before "
                         "the model is called, and raise a ValueError that names max_new_tokens when it is below 0",
    "temperature=-0.5": "a negative temperature has no meaning: check the arguments first, before the model is called, "
                        "and raise a ValueError that names temperature when it is below 0 (0 itself is greedy decoding)",
    "top_k=0": "top_k=0 keeps no token at all: check the arguments first, before the model is called, and raise a "
               "ValueError that names top_k when top_k is not None and below 1. Is it tested at all, and not as "
               "`if top_k and top_k < 1`? 0 is falsy, so that test lets it through",
}


def _error_problem(spec: dict, k: int, want: dict, got: dict) -> tuple[str, str | None] | None:
    """What is wrong with call ``k`` of a case where ``generate`` must raise a ``ValueError``."""
    says = spec.get("says", [])
    refuse = _REFUSE.get(spec["name"], "")
    if got["error"] is None:
        return (f"generate returned a result instead of raising a ValueError{': ' + refuse if refuse else ''}", None)
    kind, message = got["error"]
    if kind != "ValueError":
        return (f"generate raised {kind}: {message}. {refuse or 'Raise a ValueError that says what is wrong'}", None)
    if got["calls"]:
        T0, n = spec["runs"][k]
        b, limit = spec["b"], spec["context_length"]
        length = ""
        if T0 + n - 1 > limit:  # the length is what must be refused here: the numbers to compare
            length = (f": the model reads T0 + max_new_tokens - 1 = {T0} + {n} - 1 = {T0 + n - 1} tokens, more than "
                      f"context_length = {limit}, where T0 = prompt_ids.shape[1] = {T0}, the prompt's length")
            if b != T0:
                length += f" (prompt_ids.shape[0] = {b} is the batch size)"
        return (f"the ValueError ({message!r}) came after the model had been called ({_calls_text(got['calls'])}), "
                f"from the model itself: check the arguments and the length at the start of generate, before "
                f"calling the model{length}", None)
    missing = [w for w in says if w not in message]
    if missing:
        return (f"the ValueError's message {message!r} does not name {' and '.join(repr(w) for w in missing)}: "
                f"{spec['explain']}", None)
    return None


def _generate_specs() -> list[dict]:
    base = {"vocab_size": 7, "d": 6, "top_k": None, "prefill": 0}
    specs = [
        {**base, "name": "greedy with the cache", "context_length": 12, "b": 2, "runs": [(3, 6)],
         "temperature": 0.0, "use_cache": True, "seed": 9051},
        {**base, "name": "greedy without the cache", "context_length": 12, "b": 2, "runs": [(3, 6)],
         "temperature": 0.0, "use_cache": False, "seed": 9051},
        {**base, "name": "sampling at temperature 0.5 with the cache", "context_length": 12, "b": 4,
         "runs": [(2, 7)], "temperature": 0.5, "use_cache": True, "seed": 9052},
        {**base, "name": "sampling at temperature 2.0, top_k=3, without the cache", "context_length": 12, "b": 3,
         "runs": [(4, 5)], "temperature": 2.0, "top_k": 3, "use_cache": False, "seed": 9053},
        {**base, "name": "top_k=2 with a stale cache, then a second call", "context_length": 10, "b": 2,
         "runs": [(2, 4), (3, 5)], "temperature": 1.0, "top_k": 2, "use_cache": True, "seed": 9054, "prefill": 3},
        {**base, "name": "the model reads context_length tokens", "context_length": 8, "b": 2, "runs": [(4, 5)],
         "temperature": 0.0, "use_cache": True, "seed": 9055},
    ]
    errors = [
        {**base, "name": "9 tokens to read, context_length 8, with the cache", "context_length": 8, "b": 1,
         "runs": [(4, 6)], "temperature": 0.0, "use_cache": True, "seed": 9056, "says": ["9", "8"],
         "explain": "name the tokens the model would read, T0 + max_new_tokens - 1 = 9, and context_length = 8"},
        {**base, "name": "11 tokens to read, context_length 10, without the cache", "context_length": 10, "b": 2,
         "runs": [(6, 6)], "temperature": 1.0, "use_cache": False, "seed": 9057, "says": ["11", "10"],
         "explain": "name the tokens the model would read, T0 + max_new_tokens - 1 = 11, and context_length = 10"},
        {**base, "name": "max_new_tokens=-1", "context_length": 8, "b": 1, "runs": [(2, -1)], "temperature": 0.0,
         "use_cache": True, "seed": 9058, "says": ["max_new_tokens"], "explain": "say which argument is wrong"},
        {**base, "name": "temperature=-0.5", "context_length": 8, "b": 1, "runs": [(2, 3)], "temperature": -0.5,
         "use_cache": True, "seed": 9058, "says": ["temperature"], "explain": "say which argument is wrong"},
        {**base, "name": "top_k=0", "context_length": 8, "b": 1, "runs": [(2, 3)], "temperature": 1.0, "top_k": 0,
         "use_cache": True, "seed": 9058, "says": ["top_k"], "explain": "say which argument is wrong"},
    ]
    # issue 36: what the text states beyond the cases above, each a small case of its own. At temperature 0 the
    # decoding is greedy whatever top_k is; and a logit equal to the k-th largest is kept too, so a tie can keep more
    # than k tokens: a model whose logits are the same at every step, tokens 1 and 3 tied for the 2nd largest
    tied = [
        {**base, "name": "greedy with top_k=2 (temperature 0 is greedy whatever top_k is)", "context_length": 12,
         "b": 2, "runs": [(3, 4)], "temperature": 0.0, "top_k": 2, "use_cache": True, "seed": 9060},
        {**base, "name": "top_k=2 where two logits tie for the 2nd largest", "vocab_size": 4, "context_length": 12,
         "b": 4, "runs": [(2, 6)], "temperature": 1.0, "top_k": 2, "use_cache": True, "seed": 9061,
         "logits": [0.0, 1.0, 2.0, 1.0]},
    ]
    return specs + errors + tied


def _generate_rungs() -> tuple[ladder.Rung, ...]:
    """generate's ladder (:mod:`course_utils.checks.ladder`): greedy, batch 1, one new token; then several new
    tokens, batch 2, the cache, sampling, a temperature, top_k. Each rung is one call of ``generate`` on a fresh
    stand-in model (:func:`generate_trace`, the ``"generate"`` runner)."""
    base = {"vocab_size": 7, "d": 6, "context_length": 12, "top_k": None, "prefill": 0}

    def r(name: str, b: int, n: int, temperature: float, top_k: int | None, use_cache: bool, seed: int, adds: str,
          suspects: str) -> ladder.Rung:
        spec = {**base, "name": name, "b": b, "runs": [(2, n)], "temperature": temperature, "top_k": top_k,
                "use_cache": use_cache, "seed": seed}
        return ladder.Rung(_generate_case(spec), adds, suspects)
    return (
        r("greedy, prompt (1, 2), 1 new token, without the cache", 1, 1, 0.0, None, False, 9070, "",
          "the model read on the prompt, the logits of its LAST position (logits[:, -1, :], (b, V)), with "
          "temperature 0 their argmax over the vocabulary (dim=-1, keepdim=True: token ids, not values; no "
          "division by the temperature first), and the new token appended after the prompt (torch.cat([tokens, "
          "new], dim=1): the output (b, T0 + max_new_tokens), prompt first)?"),
        r("greedy, prompt (1, 2), 3 new tokens, without the cache", 1, 3, 0.0, None, False, 9070,
          "several new tokens", "the loop: max_new_tokens steps, each reading the whole sequence so far "
          "(model(tokens), prompt and new tokens, not the prompt alone) and appending its token, so that the next "
          "step reads it?"),
        r("greedy, prompt (2, 2), 3 new tokens, without the cache", 2, 3, 0.0, None, False, 9071, "batch 2",
          "something that mixes the batch rows: the last position of EACH row (logits[:, -1, :], not logits[-1]), "
          "the argmax over the vocabulary (dim=-1, not dim=0), the new tokens appended along the tokens (dim=1, not "
          "dim=0)?"),
        r("greedy, prompt (2, 2), 3 new tokens, with the cache", 2, 3, 0.0, None, True, 9071, "the cache",
          "the cached path: reset_cache() first, the whole prompt read once with use_cache=True, then only the "
          "newest token (tokens[:, -1:]) per step with use_cache=True, its logits logits[:, -1, :], and no read "
          "after the last new token?"),
        r("sampling at temperature 1.0, prompt (2, 2), 5 new tokens, with the cache", 2, 5, 1.0, None, True, 9072,
          "sampling (temperature 1.0)", "the sampling branch (temperature > 0): torch.multinomial on the "
          "probabilities softmax(logits, dim=-1) (not on the logits, not softmax over the batch), one sample per "
          "row, (b, 1) token ids?"),
        r("sampling at temperature 0.5, prompt (2, 2), 5 new tokens, with the cache", 2, 5, 0.5, None, True, 9072,
          "a temperature other than 1", "the temperature: the logits divided by it (logits / temperature, not "
          "multiplied) BEFORE the softmax?"),
        r("top_k=3 at temperature 2.0, prompt (2, 2), 8 new tokens, with the cache", 2, 8, 2.0, 3, True, 9073,
          "top_k", "top_k, row by row: the k-th largest logit of each row (torch.topk(logits, k, dim=-1).values[:, "
          "-1:], exactly k kept, k clipped only to the vocabulary, min(top_k, logits.shape[-1])), the logits below it "
          "set to -inf before the softmax, on the logits already divided by the temperature?"),
    )


GENERATE_LADDER = ladder.Ladder(
    "generate", _generate_rungs,
    lambda case: _generate_rung_output(_generate_run(_expected.reference("generate"), case)),
    lambda pair: [("the output", pair[0]), ("the model's calls", pair[1])], runner="generate",
    output=lambda found: _generate_rung_output(found), twins=False)
#: The same rungs where sampled tokens are not compared (:func:`random_outputs_comparable`): the greedy ones.
GREEDY_LADDER = ladder.Ladder(
    "generate", lambda: GENERATE_LADDER.rungs[:4], GENERATE_LADDER.reference, GENERATE_LADDER.parts,
    runner="generate", output=GENERATE_LADDER.output, twins=False)


def _generate_rung_output(found: object) -> object:
    """A rung's outcome (:func:`_generate_run`, one call of ``generate``) as the ladder compares it: ``(tokens,
    the model's calls)``, or the error ``generate`` raised (an exception of its type name, not raised)."""
    if not (isinstance(found, list) and len(found) == 1 and isinstance(found[0], list) and len(found[0]) == 3):
        return found
    out, error, calls = found[0]
    if isinstance(error, list) and len(error) == 2 and all(isinstance(e, str) for e in error):
        return wire.error_of(*error)
    return (out, calls)


def _generate_plan(hidden: bool) -> list[_spec.Step]:
    """One step per spec of :func:`generate_trace`: every call of ``generate`` on a fresh stand-in model; then
    what the exercise states beyond the tokens (:func:`_leaves_run`), then the ladder's rungs."""
    specs = _generate_specs() + (list(hidden_cases("generate")) if hidden else [])
    return [_spec.Step(s["name"], _generate_case(s), "generate") for s in specs] + \
        [_spec.Step(s["name"], Case(s["name"], (), dict(s)), LEAVES) for s in _LEAVES_SPECS] + \
        [_spec.Step(_SEEDS_SPEC["name"], Case(_SEEDS_SPEC["name"], (), dict(_SEEDS_SPEC)), SEEDS)] + \
        ladder.steps(GENERATE_LADDER, hidden)


#: The runner of the steps that check what the exercise states beyond the tokens (:func:`_leaves_run`).
LEAVES = "leaves"
_LEAVES_SPECS = [
    {"name": "generate on a model in train() mode", "vocab_size": 7, "d": 6, "context_length": 12, "b": 2, "T0": 3,
     "n": 4, "temperature": 0.0, "top_k": None, "seed": 9059},
    {"name": "top_k larger than the vocabulary", "vocab_size": 7, "d": 6, "context_length": 12, "b": 2, "T0": 3,
     "n": 4, "temperature": 1.0, "top_k": 10, "seed": 9059},
    {"name": "generate without the cache on a model in train() mode", "vocab_size": 7, "d": 6, "context_length": 12,
     "b": 2, "T0": 3, "n": 4, "temperature": 0.0, "top_k": None, "seed": 9059, "use_cache": False},
    # a top_k above the vocabulary keeps every token, so it samples as top_k=None does after the same seed; on
    # 3 tokens at temperature 2 the least likely is drawn often, so one kept fewer tokens shows (issue 36)
    {"name": "top_k above a vocabulary of 3, against top_k=None", "vocab_size": 3, "d": 6, "context_length": 12,
     "b": 2, "T0": 3, "n": 6, "temperature": 2.0, "top_k": 5, "seed": 9059, "against_none": True},
]


#: The runner of the step that asks whether ``generate`` draws from the caller's seed (:func:`_seeds_run`).
SEEDS = "seeds"
_SEEDS_SPEC = {"name": "sampling after two different seeds", "vocab_size": 7, "d": 6, "context_length": 12, "b": 2,
               "T0": 3, "n": 6, "temperature": 1.0, "seed": 9059, "seeds": [1, 2]}


def _seeds_run(generate: Callable, case: Case) -> list:
    """``generate`` sampling (temperature 1, with the cache) on the same stand-in model and prompt after
    ``torch.manual_seed(s)`` for each seed ``s`` of the case, as plain data: each run's tokens ``(b, T0 + n)`` as
    nested lists of ints, or ``None`` where it gave no tensor. Our ``generate`` draws different tokens after
    seeds 1 and 2; the same tokens say that ``generate`` seeds the generator itself (issue 36)."""
    spec = case.kwargs
    manual_seed(spec["seed"])
    model = CachedStandInLM(spec["vocab_size"], spec["d"], spec["context_length"]).eval()
    prompt = tokens(spec["b"], spec["T0"], spec["vocab_size"], spec["seed"] + 10)
    runs = []
    for seed in spec["seeds"]:
        manual_seed(seed)
        out = generate(model, prompt.clone(), spec["n"], temperature=spec["temperature"], top_k=None, use_cache=True)
        runs.append(out.tolist() if isinstance(out, torch.Tensor) and out.dtype == torch.long else None)
    return runs


def _seeds_hint(steps: Sequence[_spec.Step], outcomes: _spec.Outcomes) -> str | None:
    """Where sampled tokens differ from ours: whether ``generate`` drew the same tokens after two different seeds
    (:func:`_seeds_run`), which says it seeds the generator itself."""
    for step in steps:
        found = outcomes[step.key]
        if isinstance(found, list) and len(found) == 2 and found[0] is not None and found[0] == found[1]:
            return ("generate drew the same tokens after torch.manual_seed(1) and after torch.manual_seed(2): it "
                    "does not draw from the caller's seed. Does it call torch.manual_seed itself? Seeding is the "
                    "caller's job; generate only draws, with torch.multinomial.")
    return None


class _WatchedLM(CachedStandInLM):
    """:class:`CachedStandInLM` that also writes down whether it was in ``train()`` mode at each call."""

    def __init__(self, vocab_size: int, d: int, context_length: int):
        super().__init__(vocab_size, d, context_length)
        self.modes: list[bool] = []

    def forward(self, idx: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        self.modes.append(self.training)
        return super().forward(idx, use_cache=use_cache)


def _leaves_run(generate: Callable, case: Case) -> list:
    """``generate`` (with the cache unless the case says ``use_cache``) on a stand-in model left in ``train()`` mode,
    as plain data: ``[whether the model was in train() mode at each call, the tokens still cached afterwards, the
    output's shape, None]`` (issue 36: what the exercise states, ``model.eval()``, the final ``reset_cache()``, and a
    ``top_k`` larger than the vocabulary that keeps every token). Where the case says ``against_none``, the last item
    is the tokens ``(b, T0 + n)`` as nested lists (``None`` where no tensor of ids came back) of that run and of a
    second one after the same seed with ``top_k=None``, which must be the same."""
    spec = case.kwargs

    def run(top_k: int | None) -> tuple[_WatchedLM, object]:
        manual_seed(spec["seed"])
        model = _WatchedLM(spec["vocab_size"], spec["d"], spec["context_length"])
        model.train()
        prompt = tokens(spec["b"], spec["T0"], spec["vocab_size"], spec["seed"] + 10)
        return model, generate(model, prompt, spec["n"], temperature=spec["temperature"], top_k=top_k,
                               use_cache=spec.get("use_cache", True))

    def ids(out: object) -> list | None:
        return out.tolist() if isinstance(out, torch.Tensor) and out.dtype == torch.long and out.dim() == 2 else None

    model, out = run(spec["top_k"])
    found = [[bool(m) for m in model.modes], int(model.num_cached),
             list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__, None]
    if spec.get("against_none"):  # the same seed again, without top_k: the tokens of both runs
        try:
            again = run(None)[1]
        except Exception:  # noqa: BLE001 - top_k=None has cases of its own; here only a comparison is missing
            again = None
        found[3] = [ids(out), ids(again)]
    return found


def _judge_leaves(exercise: str, plan: Sequence[_spec.Step], outcomes: _spec.Outcomes) -> None:
    """What the exercise states beyond the tokens (:func:`_leaves_run`): the model in eval() mode while it
    generates, its cache emptied at the end, and a top_k larger than the vocabulary keeping every token."""
    for step in (s for s in plan if s.run == LEAVES):
        spec, case = step.case.kwargs, Case(step.case.name, ())
        found = outcomes[step.key]
        if is_stub_error(found):
            fail(exercise, NOT_IMPLEMENTED)
        if isinstance(found, BaseException):
            said = f"generate(model, prompt ({spec['b']}, {spec['T0']}), max_new_tokens={spec['n']}, temperature=" \
                   f"{spec['temperature']}, top_k={spec['top_k']}) with a vocabulary of {spec['vocab_size']} raised " \
                   f"{type(found).__name__}: {found}."
            if spec["top_k"] and spec["top_k"] > spec["vocab_size"]:
                said += (" A top_k larger than the vocabulary keeps every token: torch.topk(logits, min(top_k, "
                         "logits.shape[-1])).")
            fail(exercise, said, case)
        if not (isinstance(found, list) and len(found) == 4 and isinstance(found[0], list)
                and all(isinstance(m, bool) for m in found[0]) and type(found[1]) is int
                and (found[3] is None or _token_pair(found[3]))):
            _spec.refuse(exercise, "calls on a model in train() mode")
        modes, cached, _, pair = found
        if any(modes):
            without = spec.get("use_cache", True) is False
            fail(exercise, "the model was in train() mode while generate called it" +
                 (" with use_cache=False" if without else "") + ": call model.eval() first, as the exercise says" +
                 (", whether or not the cache is used" if without else "") + " (dropout must be off while generating).",
                 case)
        if cached:
            fail(exercise, f"after generate the model's cache still holds {cached} tokens: call model.reset_cache() at "
                           f"the end too, as the exercise says, so that the model's next call starts a new sequence.",
                 case)
        if spec.get("against_none") and pair is not None and None not in pair and pair[0] != pair[1]:
            fail(exercise, _against_none_text(spec, *pair), case)


def _token_pair(value: object) -> bool:
    """Two runs' tokens as :func:`_leaves_run` gives them: each ``None`` or rows of ints (an outcome: untrusted)."""
    def rows(v: object) -> bool:
        return v is None or (isinstance(v, list) and all(isinstance(r, list) and all(type(t) is int for t in r)
                                                         for r in v))
    return isinstance(value, list) and len(value) == 2 and all(rows(v) for v in value)


def _against_none_text(spec: dict, with_k: list, without: list) -> str:
    """Why a ``top_k`` above the vocabulary must sample as ``top_k=None`` does, with the first token that differs."""
    said = (f"generate(model, prompt ({spec['b']}, {spec['T0']}), max_new_tokens={spec['n']}, temperature="
            f"{spec['temperature']}, top_k={spec['top_k']}) with a vocabulary of {spec['vocab_size']} tokens drew other "
            f"tokens than with top_k=None after the same seed")
    if len(with_k) == len(without) and all(len(a) == len(b) for a, b in zip(with_k, without)):
        row, pos = next((r, p) for r in range(len(with_k)) for p in range(len(with_k[r]))
                        if with_k[r][p] != without[r][p])
        said += f" (row {row}, position {pos}: token {with_k[row][pos]}, where top_k=None drew {without[row][pos]})"
    return (said + ": were tokens dropped? As the exercise says, a top_k above the vocabulary size keeps every "
            "token, so it samples exactly as top_k=None does. Clip top_k to the vocabulary, the last dimension of the "
            "logits: torch.topk(logits, min(top_k, logits.shape[-1])).")


def _judge_generate(plan: list[_spec.Step], outcomes: _spec.Outcomes) -> str:
    exercise = "generate"
    leaves, plan = plan, [step for step in plan if step.run not in (LEAVES, SEEDS)]
    seeds = [step for step in leaves if step.run == SEEDS]
    specs = [step.case.kwargs for step in plan]
    sampled = [s for s in specs if s.get("temperature", 0) > 0 and "says" not in s]
    compared = "greedy and seeded sampling (temperature, top_k)"
    rungs = GENERATE_LADDER
    ladder.record(GENERATE_LADDER)
    if sampled and not random_outputs_comparable(exercise, "sampling"):
        plan = [step for step in plan if step.case.kwargs not in sampled]
        compared = "greedy decoding"
        rungs = GREEDY_LADDER
    smallest = lambda: ladder.diagnose(rungs, outcomes)  # noqa: E731
    passed: list[tuple[Case, dict]] = []  # the cases before this one, each with our trace: the student's agreed
    for step in plan:
        spec = step.case.kwargs
        case = Case(spec["name"], (spec,))
        want = expect(exercise, case.key(), lambda: generate_trace(_expected.reference(exercise), spec))
        if _expected.is_recording():
            mistake_outputs(exercise, case)
        found = outcomes[step.key]
        if is_stub_error(found):
            fail(exercise, NOT_IMPLEMENTED)
        if isinstance(found, BaseException):  # generate_trace keeps generate's own errors: only its set-up raises
            raise found
        got = _generate_trace_of(found, spec)
        where = _spec_text(spec)
        for k, (w, g) in enumerate(zip(want["runs"], got["runs"])):
            call = f"call {k + 1}: " if len(spec["runs"]) > 1 else ""
            if w["error"] is not None:
                found = _error_problem(spec, k, w, g)
                if found:
                    fail(exercise, f"{where}: {call}{found[0]}.", case)
                continue
            if g["error"] is not None:
                hint = (_temperature_order_hint(spec, g["error"], plan, outcomes)
                        or _loop_error_hint(spec, k, g["error"], g["calls"],
                                            named=lambda: _raising_mistake(exercise, case, got, passed),
                                            batch_of_one=lambda: _greedy_batch_of_one(rungs, plan, outcomes),
                                            prompt_read_as_float=lambda: _prompt_read_as_float(rungs, outcomes))
                        or symptoms.error_hint(RuntimeError(str(g["error"][1])))
                        or _calls_hint(spec, w["calls"], g["calls"], raised=True) or smallest())
                try:
                    fail(exercise, f"{where}: {call}generate raised {g['error'][0]}: {g['error'][1]}; the model's "
                                   f"calls were: {_calls_text(g['calls'])}.", case)
                except CheckFailed as error:
                    raise _hinted(error, hint) from None
            problem = _tokens_problem(spec, k, spec["runs"][k][0], w["out"], g["out"])
            calls = _calls_hint(spec, w["calls"], g["calls"])
            if problem is None and calls is None:
                continue
            hint = calls
            if hint is None or problem is not None:
                for mistake_hint, output in mistake_outputs(exercise, case):
                    if _same_generation(output, got):
                        hint = mistake_hint
                        break
            if hint is None and spec.get("temperature", 0) > 0:
                hint = _seeds_hint(seeds, outcomes)
            moved = _prompt_problem(spec, k, w["out"], g["out"])
            if moved is not None:  # the rank hints read the new tokens after the prompt: not where the prompt is not
                hint = (moved or None) if hint is None else hint
                hint = hint or smallest()
            if hint is None:
                hint = (_tie_hint(spec, k, w["out"], g["out"]) or _top_k_positions_hint(spec, k, w["out"], g["out"])
                        or _top_k_rank_hint(spec, k, w["out"], g["out"]) or _token_rank_hint(spec, k, w["out"], g["out"])
                        or smallest())
            text = problem or (f"the tokens are right, but the model's calls were: {_calls_text(g['calls'])}; "
                               f"expected: {_calls_text(w['calls'])}")
            try:
                fail(exercise, f"{where}: {call}{text}.", case)
            except CheckFailed as error:
                raise _hinted(error, hint) from None
        passed.append((case, want))
    _judge_leaves(exercise, leaves, outcomes)
    return (f"{len(plan)} cases agree with the reference: {compared} "
            f"with and without the cache, the model read once per new token, reset_cache between calls, "
            f"and a ValueError before any model call for too long an output or a bad argument")


check_generate = _spec.declare(_spec.Spec("generate", _generate_plan, _judge_generate,
                                          runners={"generate": _generate_run, LEAVES: _leaves_run, SEEDS: _seeds_run}),
                               """Check ``generate(model, prompt_ids, max_new_tokens, temperature, top_k,
    use_cache)`` on a stand-in model.""")
