"""Self-checks for notebook 02: softmax and context vectors.

Expected outputs come from :mod:`course_utils.checks.expected` (computed live in the
instructor edition, recorded in the student edition). A failing output that matches a known
mistake exactly is named by it; otherwise these checks read the symptoms (weights that sum to one
along the wrong dimension, NaN from an overflowing ``exp``, negative "weights" from plain
sum-normalisation, a batch that breaks the code) and say so in the failure message.
"""

from __future__ import annotations

import ast
import math
import textwrap
from typing import Callable

import torch

from course_utils import rules
from course_utils.checks.core import Case, rand
from course_utils.checks.modules import helper_checks
from course_utils.checks.spec import declare, function_spec
from course_utils.data import book_inputs

__all__ = ["check_softmax_naive", "check_softmax_stable", "check_context_vectors"]

#: The other exercises of this notebook an exercise's answer may call, by the names the notebook gives
#: them: its checks run with the reference's versions (:func:`modules.alone`), so that a wrong helper
#: costs only the helper's points (an overflowing ``softmax_stable`` costs ``context_vectors`` nothing).
HELPERS = {"softmax_stable": ("softmax_naive",), "context_vectors": ("softmax_naive", "softmax_stable")}

#: ``exp`` of anything above this is ``inf`` in float32.
_EXP_OVERFLOW = 88.0


# --------------------------------------------------------------------------------------------
# softmax
# --------------------------------------------------------------------------------------------
def softmax_hint(x: torch.Tensor, dim: int, got: object) -> str | None:
    """Name the softmax symptom that explains ``got`` (the student's ``softmax(x, dim)``), if any.

    Reads only ``got`` and the input: NaN or inf, negative weights, and along which dimension (if
    any) the weights sum to 1.
    """
    if not isinstance(got, torch.Tensor) or got.shape != x.shape or not got.is_floating_point():
        return None
    g = got.detach().double()
    finite_x = x[torch.isfinite(x)]
    if torch.isnan(g).any():
        if torch.isinf(x).any():
            return ("an entry of -inf must get weight exactly 0 (exp(-inf) = 0). NaN comes from inf - inf or "
                    "0 / 0: subtract the maximum of each slice along `dim` (it is finite when the slice has a "
                    "finite entry), not the mean or the minimum.")
        if finite_x.numel() and finite_x.abs().max() > _EXP_OVERFLOW:
            return ("exp overflowed to inf (or every entry of a slice underflowed to 0). Subtract the maximum "
                    "of each slice along `dim` first, keeping that dimension (keepdim=True). The maximum of the "
                    "whole tensor is not enough when slices have very different scales.")
        return None
    if torch.isinf(g).any():
        return "the output holds inf: exp overflowed and was not divided by a finite sum. Every weight lies in [0, 1]."
    if (g < -1e-7).any():
        return ("softmax weights are never negative. Did you divide the scores by their sum instead of "
                "exponentiating them first?")
    if x.dim() == 0:
        return None
    sums = g.sum(dim=dim)
    if torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
        if x.dim() >= 2:
            return ("each slice sums to 1 but the values are off: is every entry of a slice shifted by that "
                    "slice's own maximum, and divided by that slice's own sum? Without keepdim=True a reduced "
                    "tensor broadcasts along the wrong dimension. (Clamping the scores changes the result.)")
        return None
    dim_n = dim % x.dim()
    for other in range(x.dim()):
        if other != dim_n:
            other_sums = g.sum(dim=other)
            if torch.allclose(other_sums, torch.ones_like(other_sums), atol=1e-4):
                return (f"your weights sum to 1 along dim={other}, but they must sum to 1 along dim={dim} "
                        f"(the `dim` argument). Sum over `dim`, not a fixed dimension, and keep it with "
                        f"keepdim=True so that the division broadcasts along that same dimension.")
    if math.isclose(float(g.sum()), 1.0, abs_tol=1e-4):
        return "the whole tensor sums to 1: sum only along `dim`, with keepdim=True, so that every slice sums to 1."
    shown = ", ".join(f"{v:.4g}" for v in sums.flatten()[:4].tolist())
    return (f"every slice along dim={dim} must sum to 1; yours sum to [{shown}{', ...' if sums.numel() > 4 else ''}]. "
            "Divide exp(x) by the SUM of exp(x) over `dim`, with keepdim=True so that it broadcasts back "
            "along the same dimension.")


def _softmax_diagnose(case: Case, got: object, want: object) -> str | None:
    x = case.args[0]
    dim = case.kwargs.get("dim", case.args[1] if len(case.args) > 1 else -1)
    if isinstance(got, BaseException):
        text = str(got)
        if "must match the size" in text or "broadcast" in text:
            return ("a reduction over `dim` without keepdim=True drops that dimension, so the result no longer "
                    "broadcasts against x: keep it with keepdim=True.")
        return None
    return softmax_hint(x, dim, got)


def _softmax_cases(stable: bool) -> list[Case]:
    inputs = book_inputs()
    scores_2 = inputs @ inputs[1]  # (6,): the book's scores of 'journey'
    cases = [
        Case("book: scores of 'journey' (6,)", (scores_2,)),
        Case("book: score table (6, 6), dim=-1", (inputs @ inputs.T,), {"dim": -1}),
        Case("(2, 5), dim=0", (rand(2, 5, seed=21, low=-3, high=3),), {"dim": 0}),
    ]
    if stable:
        cases += [
            Case("large scores [1000, 1001, 1002]", (torch.tensor([1000.0, 1001.0, 1002.0]),)),
            Case("(2, 4) with some -inf entries", (torch.tensor([[0.5, float("-inf"), 2.0, -1.0],
                                                                  [float("-inf"), float("-inf"), 3.0, 3.0]]),)),
        ]
    return cases


check_softmax_naive = declare(
    function_spec("softmax_naive", lambda: _softmax_cases(stable=False), diagnose=_softmax_diagnose),
    """Compare ``softmax_naive(x, dim)`` with the expected outputs on moderate inputs (no overflow cases).""")

check_softmax_stable = declare(
    function_spec("softmax_stable", lambda: _softmax_cases(stable=True), diagnose=_softmax_diagnose,
                  helpers=lambda: helper_checks(globals(), "softmax_stable")),
    """Compare ``softmax_stable(x, dim)`` with the expected outputs, including scores in the 1000s and ``-inf``.

    A slice made only of ``-inf`` has no defined softmax and is never tested. Runs with our
    ``softmax_naive`` (:func:`modules.alone`).
    """)


# --------------------------------------------------------------------------------------------
# context vectors
# --------------------------------------------------------------------------------------------
def uses_dot_T(obj: object) -> bool:
    """Whether the source of ``obj`` uses ``.T`` (which reverses every dimension) on something that
    may be batched: not on a module's weight matrix (``layer.weight.T``, ``self.W_query.T``), always 2-D."""
    source = rules.source_of(obj)
    if not source:
        return False
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return False

    def matrix(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and (node.attr == "weight" or node.attr.startswith("W_"))

    return any(isinstance(node, ast.Attribute) and node.attr == "T" and not matrix(node.value)
               for node in ast.walk(tree))


def batch_hint(obj: object) -> str:
    """What to say when code that works on ``(T, d)`` breaks on a batch ``(..., T, d)``."""
    if uses_dot_T(obj):
        return ("`.T` reverses every dimension, so it breaks as soon as there is a batch dimension: use "
                "transpose(-2, -1) (or .mT) to swap only the last two.")
    return ("your code breaks on a batched input (..., T, d): use operations that act on the last two "
            "dimensions (@ or torch.matmul, transpose(-2, -1), dim=-1), not ones made for 2-D tensors "
            "(torch.mm, .t(), dim=1).")


def _context_diagnose(context_vectors: Callable):
    def diagnose(case: Case, got: object, want: object) -> str | None:
        x = case.args[0]
        if isinstance(got, BaseException):
            return batch_hint(context_vectors) if x.dim() > 2 else None
        if not isinstance(got, torch.Tensor):
            return None
        if got.is_floating_point() and not torch.isfinite(got).all():
            bound = x.shape[-1] * float(x.abs().max()) ** 2  # no score can exceed it
            if bound > _EXP_OVERFLOW:
                return ("NaN or inf: these inputs give scores large enough to overflow exp (exp(89) is inf in "
                        "float32). Use your softmax_stable (or torch.softmax), not softmax_naive.")
            return None
        if got.shape != x.shape:
            if x.dim() > 2:
                return f"the output must have the shape of the input, (..., T, d). {batch_hint(context_vectors)}"
            return "the output must have the shape of the input, (T, d): weights (T, T) @ inputs (T, d)."
        return None

    return diagnose


def _context_cases() -> list[Case]:
    return [
        Case("book sentence (6, 3)", (book_inputs(),)),
        Case("batch of 2, T=5, d=4", (rand(2, 5, 4, seed=31),)),
    ]


check_context_vectors = declare(
    function_spec("context_vectors", _context_cases, diagnose_for=lambda o: _context_diagnose(o.student),
                  helpers=lambda: helper_checks(globals(), "context_vectors")),
    """Compare ``context_vectors(inputs)`` on the book's sentence and batched ``(..., T, d)`` inputs. Runs
    with our ``softmax_naive`` and ``softmax_stable`` (:func:`modules.alone`).""")
