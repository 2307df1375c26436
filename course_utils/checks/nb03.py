"""Self-checks for notebook 03: scaled dot-product attention and trainable self-attention.

Expected outputs come from :mod:`course_utils.checks.expected` (computed live in the
instructor edition, recorded in the student edition). A failing output that matches a known
mistake exactly (no scaling, scaling by ``d_k`` instead of ``sqrt(d_k)``, scaling after the
softmax, softmax over the wrong dimension, parameters created in the wrong order, an
untransposed ``nn.Linear`` weight ...) is named by it; otherwise the checks read the symptoms:
parameter shapes against the expected ones, and code that breaks on a batch.

Each check is a spec (:mod:`course_utils.checks.spec`): a function's calls, a module's constructions
(with the projections' kinds that the diagnoses read) and forward passes, and for the copy what it left
in the modules (:func:`_copy_run`), judged by the same code in the kernel and, under the grader, outside.
"""

from __future__ import annotations

import ast
import textwrap
from typing import Callable

import torch
import torch.nn as nn

from course_utils import rules
from course_utils.checks import expected as _expected
from course_utils.checks import spec
from course_utils.checks.core import (
    NOT_IMPLEMENTED,
    is_stub_error,
    Case,
    CheckFailed,
    construct,
    expect,
    explain,
    fail,
    mistake_outputs,
    parameter_shapes,
    rand,
    tensor_difference,
)
from course_utils.checks.modules import helper_checks
from course_utils.checks.nb02 import batch_hint
from course_utils.data import book_inputs

__all__ = [
    "check_scaled_dot_product_attention",
    "check_SelfAttention_v1",
    "check_SelfAttention_v2",
    "check_copy_v2_weights_to_v1",
]

_NAMES = ("W_query", "W_key", "W_value")

#: The other exercises of this notebook an exercise's answer may call, by the names the notebook gives
#: them: its checks run with the reference's versions (:func:`modules.alone`), so that a wrong helper
#: costs only the helper's points.
HELPERS = {"SelfAttention_v1": ("scaled_dot_product_attention",),
           "SelfAttention_v2": ("scaled_dot_product_attention",)}


def _tree(obj: object) -> ast.AST | None:
    source = rules.source_of(obj)
    try:
        return ast.parse(textwrap.dedent(source)) if source else None
    except SyntaxError:
        return None


def _multiplies_by_weight(obj: object) -> bool:
    """Whether the source of ``obj`` multiplies by an ``nn.Linear``'s ``.weight`` as it is stored
    (``x @ layer.weight``, ``torch.matmul(x, layer.weight)``), not transposed."""
    tree = _tree(obj)
    if tree is None:
        return False

    def is_weight(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "weight"

    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and (is_weight(node.left) or is_weight(node.right)):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) and \
                getattr(node.func, "attr", getattr(node.func, "id", "")) in ("matmul", "mm") and \
                any(is_weight(a) for a in node.args):
            return True
    return False


def _breaks_on_batch(obj: object, case: Case, got: object, want: object) -> str | None:
    """The hint for code that raised, or gave the wrong shape, on a batched input."""
    x = case.args[0]
    wrong_shape = isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.shape != want.shape
    if (isinstance(got, BaseException) or wrong_shape) and x.dim() > 2:
        return batch_hint(obj)
    return None


# --------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# --------------------------------------------------------------------------------------------
def _qkv(Tq: int, Tk: int, dk: int, dv: int, *batch: int, seed: int, scale: float = 1.0) -> tuple:
    """Random ``(queries, keys, values)`` of shapes ``(*batch, Tq, dk)``, ``(*batch, Tk, dk)``, ``(*batch, Tk, dv)``."""
    return (rand(*batch, Tq, dk, seed=seed) * scale, rand(*batch, Tk, dk, seed=seed + 1) * scale,
            rand(*batch, Tk, dv, seed=seed + 2))


def _sdpa_cases() -> list[Case]:
    return [
        Case("self-attention, T=6, d_k=d_v=2", _qkv(6, 6, 2, 2, seed=51, scale=2.0)),
        Case("T=5, d_k=4, d_v=3", _qkv(5, 5, 4, 3, seed=54, scale=2.0)),
    ]


check_scaled_dot_product_attention = spec.declare(
    spec.function_spec("scaled_dot_product_attention", _sdpa_cases,
                       diagnose_for=lambda o: lambda case, got, want: _breaks_on_batch(o.student, case, got, want)),
    """Compare ``scaled_dot_product_attention(queries, keys, values)`` with the expected outputs.""")


# --------------------------------------------------------------------------------------------
# SelfAttention_v1 and SelfAttention_v2
# --------------------------------------------------------------------------------------------
def _module_diagnose(exercise: str, kind: str, kind_hint: str, transposed_hint: str):
    """A diagnose for a self-attention class, given its outcomes: the kind of its projections (``kind``:
    ``"Parameter"`` or ``"Linear"``, else ``kind_hint``), its parameter shapes against the expected ones
    (all reversed: ``transposed_hint``), and forward passes that break."""
    def for_outcomes(outcomes: spec.Outcomes):
        student_cls = outcomes.student
        untransposed_weight = _multiplies_by_weight(student_cls)

        def diagnose(case: Case, got: object, want: object) -> str | None:
            built = spec.built_of(outcomes, case.build)
            kinds = built.get("kinds", {}) if built else {}
            found = [kinds.get(name, "None") for name in _NAMES]
            if all(k != "None" for k in found) and not all(k == kind for k in found):
                return kind_hint
            if isinstance(got, CheckFailed):  # building the module failed (its forward's errors come unwrapped)
                return _shapes_hint(case.build, built) if "expected parameters of shapes" in str(got) else None
            if isinstance(got, BaseException) and untransposed_weight:
                return ("nn.Linear stores its weight as (d_out, d_in): call the layer, self.W_query(x), which "
                        "computes x @ weight.T (+ bias), instead of multiplying by the weight yourself.")
            return _breaks_on_batch(student_cls, case, got, want)

        return diagnose

    def _shapes_hint(build: tuple, built: dict | None) -> str | None:
        if not (built and built.get("module")):
            return None
        want = [tuple(s) for s in expect(
            exercise, f"parameter shapes {build}",
            lambda: parameter_shapes(construct(_expected.reference(exercise), build)))]
        got = [tuple(s) for s in built["shapes"]]
        if len(want) > len(got) and any(len(s) == 1 for s in want) and not any(len(s) == 1 for s in got):
            return "with qkv_bias=True each nn.Linear needs a bias: pass bias=qkv_bias to nn.Linear instead of a fixed value."
        if len(got) > len(want) and any(len(s) == 1 for s in got) and not any(len(s) == 1 for s in want):
            return ("nn.Linear has a bias unless told otherwise (bias=True is its default): pass bias=qkv_bias, so "
                    "that qkv_bias=False gives no bias.")
        if len(got) == len(want) and got != want and got == [tuple(reversed(s)) for s in want]:
            return transposed_hint
        return None

    return for_outcomes


def _v1_configs() -> list[tuple[tuple, list[Case]]]:
    return [
        ((3, 2), [Case("book sentence (6, 3)", (book_inputs(),))]),
        ((4, 3), [Case("T=5, d_in=4", (rand(5, 4, seed=71),))]),
    ]


check_SelfAttention_v1 = spec.declare(spec.module_spec(
    "SelfAttention_v1", _v1_configs, attributes=_NAMES,
    diagnose_for=_module_diagnose(
        "SelfAttention_v1", "Parameter",
        "SelfAttention_v1 keeps each projection as a matrix, nn.Parameter(torch.rand(d_in, d_out)), and computes "
        "x @ W; nn.Linear layers are SelfAttention_v2's way.",
        "each matrix must be (d_in, d_out), so that x @ W maps (..., T, d_in) to (..., T, d_out)."),
    helpers=lambda: helper_checks(globals(), "SelfAttention_v1")),
    """Build ``SelfAttention_v1(d_in, d_out)`` with the course's seed and compare its outputs with the expected ones.
    Runs with our ``scaled_dot_product_attention`` (:func:`modules.alone`).""")


def _v2_configs() -> list[tuple[tuple, list[Case]]]:
    return [
        ((3, 2), [Case("book sentence (6, 3)", (book_inputs(),))]),
        ((4, 3), [Case("T=5, d_in=4", (rand(5, 4, seed=81),))]),
    ]


check_SelfAttention_v2 = spec.declare(spec.module_spec(
    "SelfAttention_v2", _v2_configs, attributes=_NAMES,
    diagnose_for=_module_diagnose(
        "SelfAttention_v2", "Linear",
        "SelfAttention_v2 builds each projection as a layer, nn.Linear(d_in, d_out, bias=qkv_bias), and calls it: "
        "self.W_query(x).",
        "nn.Linear takes the input size first: nn.Linear(d_in, d_out). Its weight is then stored as (d_out, d_in)."),
    helpers=lambda: helper_checks(globals(), "SelfAttention_v2")),
    """Build ``SelfAttention_v2(d_in, d_out, qkv_bias)`` with the course's seed and compare its outputs with the expected
    ones. Runs with our ``scaled_dot_product_attention`` (:func:`modules.alone`).""")


# --------------------------------------------------------------------------------------------
# copy_v2_weights_to_v1 (the book's exercise 3.1)
# --------------------------------------------------------------------------------------------
_TRANSPOSE_HINT = ("did you transpose? nn.Linear stores its weight as (d_out, d_in) and computes x @ weight.T, "
                   "while SelfAttention_v1 computes x @ W with W of shape (d_in, d_out).")


class _LinearProjections(nn.Module):
    """Stands in for a ``SelfAttention_v2(d_in, d_out, qkv_bias=False)``: its three projections,
    ``nn.Linear`` layers without bias whose weights are the given ``(3, d_out, d_in)`` numbers."""

    def __init__(self, weights: torch.Tensor):
        super().__init__()
        d_out, d_in = weights.shape[1:]
        self.d_in = d_in
        for name, w in zip(_NAMES, weights):
            layer = nn.Linear(d_in, d_out, bias=False)
            layer.weight = nn.Parameter(w.clone())
            setattr(self, name, layer)


class _MatrixProjections(nn.Module):
    """Stands in for a ``SelfAttention_v1(d_in, d_out)``: three parameters holding the given
    ``(3, d_in, d_out)`` numbers."""

    def __init__(self, weights: torch.Tensor):
        super().__init__()
        self.d_in = weights.shape[1]
        for name, w in zip(_NAMES, weights):
            setattr(self, name, nn.Parameter(w.clone()))


def copy_case(d_in: int, d_out: int, name: str, *, seed: int) -> Case:
    """A case of ``copy_v2_weights_to_v1``: the weights of the v2 and the v1 module, ``(3, d_out, d_in)``
    and ``(3, d_in, d_out)``, drawn from ``seed``."""
    return Case(name, (rand(3, d_out, d_in, seed=seed), rand(3, d_in, d_out, seed=seed + 1, low=0.0)))


def after_copy(copy: Callable, v2_weights: torch.Tensor, v1_weights: torch.Tensor) -> torch.Tensor:
    """The v1 module's three parameters, stacked, after ``copy(sa_v2, sa_v1)`` on modules holding these weights."""
    sa_v2, sa_v1 = _LinearProjections(v2_weights), _MatrixProjections(v1_weights)
    copy(sa_v2, sa_v1)
    return torch.stack([getattr(sa_v1, name).detach() for name in _NAMES])


def _copy_diagnose(case: Case, got: object, want: object) -> str | None:
    if isinstance(got, BaseException):
        text = str(got)
        if "leaf Variable" in text:
            return ("an nn.Parameter that requires grad cannot be changed in place while autograd records: copy "
                    "into it inside `with torch.no_grad():`.")
        if "cannot assign" in text:
            return ("sa_v1's W_query, W_key and W_value are nn.Parameters: copy the numbers into them under "
                    "torch.no_grad() (W.copy_(...)), or assign a new nn.Parameter.")
        if "size" in text or "shape" in text:
            return _TRANSPOSE_HINT
        return None
    if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.shape == want.shape:
        for i, name in enumerate(_NAMES):
            for j, other in enumerate(_NAMES):
                if i != j and tensor_difference(want[j], got[i]) is None and tensor_difference(want[i], got[i]):
                    return (f"sa_v1.{name} holds what belongs in sa_v1.{other}: copy each projection of sa_v2 into "
                            f"the one of the same name.")
    return None


def _copy_run(copy_fn: Callable, case: Case) -> dict:
    """The kernel's part of one copy: fill a v2 and a v1 module with the case's weights, call the copy, and
    return what it left, as plain data: ``{"v2": [whether each projection of sa_v2 is as it was], "v1": [each
    of sa_v1's W_query, W_key, W_value as {"kind", "type", "value"} (``value``: its numbers, if a tensor)]}``."""
    v2_weights, v1_weights = case.args
    sa_v2, sa_v1 = _LinearProjections(v2_weights), _MatrixProjections(v1_weights)
    copy_fn(sa_v2, sa_v1)
    v2 = []
    for index, name in enumerate(_NAMES):
        layer = getattr(sa_v2, name, None)
        v2.append(isinstance(layer, nn.Linear) and torch.equal(layer.weight.detach(), v2_weights[index]))
    v1 = []
    for name in _NAMES:
        now = getattr(sa_v1, name, None)
        v1.append({"kind": probe_kind(now), "type": type(now).__name__,
                   "value": now.detach().clone() if isinstance(now, torch.Tensor) else None})
    return {"v2": v2, "v1": v1}


def probe_kind(value: object) -> str:
    """``"Parameter"``, ``"Tensor"`` or ``"other"``: what a projection of sa_v1 is after the copy."""
    return "Parameter" if isinstance(value, nn.Parameter) else "Tensor" if isinstance(value, torch.Tensor) else "other"


def _copy_state(exercise: str, found: object) -> tuple[list, list]:
    """The copy's outcome (:func:`_copy_run`), checked: it is the grader's to trust only in this form."""
    ok = isinstance(found, dict) and set(found) == {"v2", "v1"} and isinstance(found["v2"], list) \
        and len(found["v2"]) == 3 and all(isinstance(b, bool) for b in found["v2"]) \
        and isinstance(found["v1"], list) and len(found["v1"]) == 3 and all(
            isinstance(s, dict) and set(s) == {"kind", "type", "value"} and s["kind"] in ("Parameter", "Tensor", "other")
            and isinstance(s["type"], str) and (s["value"] is None) == (s["kind"] == "other")
            and (s["value"] is None or isinstance(s["value"], torch.Tensor)) for s in found["v1"])
    if not ok:
        spec.refuse(exercise, "copy into the modules")
    return found["v2"], found["v1"]


def _judge_copy(exercise: str, case: Case, found: object) -> None:
    v2_weights, v1_weights = case.args
    d_out, d_in = v2_weights.shape[1:]
    want = expect(exercise, case.key(),
                  lambda: after_copy(_expected.reference(exercise), v2_weights, v1_weights))
    if _expected.is_recording():
        mistake_outputs(exercise, case)

    def failure(message: str, got: object) -> None:
        try:
            fail(exercise, message, case)
        except CheckFailed as error:
            hint = explain(exercise, case, got, want, _copy_diagnose)
            raise CheckFailed(f"{error} Hint: {hint}" if hint else str(error)) from None

    if is_stub_error(found):
        fail(exercise, NOT_IMPLEMENTED)
    if isinstance(found, BaseException):
        text = f"your code raised {type(found).__name__}: {found}"
        failure(text if text.endswith((".", "?", "!")) else text + ".", found)
    v2_same, v1_states = _copy_state(exercise, found)
    for index, name in enumerate(_NAMES):
        if not v2_same[index]:
            fail(exercise, f"your function changed sa_v2.{name}. Copy FROM sa_v2 (the nn.Linear version) INTO "
                           f"sa_v1; sa_v2 must stay as it was.", case)
    for index, name in enumerate(_NAMES):
        now = v1_states[index]
        if now["kind"] != "Parameter":
            fail(exercise, f"sa_v1.{name} is no longer an nn.Parameter (got {now['type']}): keep it a "
                           f"parameter so that it is still trained, e.g. copy into it under torch.no_grad().", case)
        shape = tuple(now["value"].shape)
        if shape == (d_out, d_in) and d_in != d_out:
            fail(exercise, f"sa_v1.{name} now has shape {shape} = (d_out, d_in); v1 needs (d_in, d_out) "
                           f"= {(d_in, d_out)}. Hint: {_TRANSPOSE_HINT}", case)
        if shape != (d_in, d_out):
            fail(exercise, f"sa_v1.{name} has shape {shape}, expected (d_in, d_out) = {(d_in, d_out)}.", case)
    got = torch.stack([s["value"] for s in v1_states])
    for index, name in enumerate(_NAMES):
        problem = tensor_difference(want[index], got[index])
        if problem is None:
            continue
        if torch.equal(got[index], v1_weights[index]):
            unchanged = [n for i, n in enumerate(_NAMES) if torch.equal(got[i], v1_weights[i])]
            fail(exercise, f"sa_v1.{', sa_v1.'.join(unchanged)} {'was' if len(unchanged) == 1 else 'were'} not "
                           f"changed. Your function must modify sa_v1 itself (its return value is ignored).", case)
        failure(f"sa_v1.{name} does not hold what the copy must put there: {problem}.", got)


def _copy_cases() -> list[Case]:
    return [
        copy_case(3, 2, "book sizes d_in=3, d_out=2", seed=91),
        copy_case(4, 6, "d_in=4, d_out=6", seed=93),
    ]


def _copy_judge(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    exercise = "copy_v2_weights_to_v1"
    for step in plan:
        _judge_copy(exercise, step.case, outcomes[step.key])
    return (f"{len(plan)} copies make sa_v1 compute what sa_v2 computes "
            f"({'; '.join(s.case.name for s in plan)})")


_copy_cases_all = spec.with_hidden("copy_v2_weights_to_v1", _copy_cases)

check_copy_v2_weights_to_v1 = spec.declare(spec.Spec(
    "copy_v2_weights_to_v1",
    lambda hidden: [spec.Step(case.key(), case, "copy") for case in _copy_cases_all(hidden)],
    _copy_judge, runners={"copy": _copy_run}),
    """Fill a v2 and a v1 module with different numbers, call the copy, then compare v1's parameters
    with the expected ones.

    Also checks that ``sa_v2`` is untouched and that ``sa_v1`` keeps three ``(d_in, d_out)`` parameters.
    """)
