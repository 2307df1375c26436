"""Self-checks for notebook 05: multi-head attention, from a list of heads to split weights.

Outputs are compared with the expected ones (see :mod:`course_utils.checks.expected`). Before and
after that, the checks name a mistake by its symptom: parameters of the wrong shapes (one head
repeated, the ``d_out``-per-head versus ``d_out``-total confusion, a missing ``out_proj`` or bias,
layers created in another order), heads joined on the wrong dimension or added, one head's output
repeated, ``view`` on a non-contiguous tensor, a module that sees the future, NaN in the output;
and the known mistakes by their exact outputs.

Each check is a spec (:mod:`course_utils.checks.spec`): the calls of ``split_heads``, ``merge_heads`` and
``count_parameters`` (whose modules cross into the grading kernel as layouts, ``layouts.module_layout``, and
are rebuilt there, ``layouts.build_layout``), and for the two module classes one probed construction per set
of constructor arguments, with every forward pass their checks make (:mod:`course_utils.checks.probed`),
judged by the same code in the kernel and, under the grader, outside.
"""

from __future__ import annotations


import torch
import torch.nn as nn

from course_utils.checks import expected as _expected
from course_utils.checks import probed, spec
from course_utils.checks.core import Case, expect, hidden_cases, rand, tensor_difference
from course_utils.checks.modules import ProbePlan, causal_probes, helper_checks
from course_utils.checks.probe import Probe
from course_utils.data import book_batch

__all__ = [
    "check_MultiHeadAttentionWrapper",
    "check_split_heads",
    "check_merge_heads",
    "check_MultiHeadAttention",
    "check_count_parameters",
]

#: The other exercises of this notebook an exercise's answer may call, by the names the notebook gives
#: them: its checks run with the reference's versions (:func:`modules.alone`), so that a wrong helper
#: costs only the helper's points.
HELPERS = {"MultiHeadAttention": ("split_heads", "merge_heads")}


def _hidden_modules(exercise: str, hidden: bool) -> dict:
    return hidden_cases(exercise) if hidden else {"configs": [], "causal": []}


# ------------------------------------------------------------------------------------------
# MultiHeadAttentionWrapper
# ------------------------------------------------------------------------------------------
#: Three heads of 2 (d_out=6 would be 2 per head in MultiHeadAttention): shows the d_out confusion.
_WRAPPER_SHAPES = (3, 6, 6, 0.0, 3)


def _wrapper_shapes(got: list, want: list, build: tuple) -> str | None:
    d_in, d_out, heads = build[0], build[1], build[4]
    if not got:
        return ("the module has no parameters: heads kept in a plain Python list are invisible to .parameters(), "
                ".to(...) and state_dict. Hold them in an nn.ModuleList")
    if heads > 1 and len(got) * heads == len(want) and got == want[:len(got)]:
        return (f"one head repeated: with num_heads={heads} it has the parameters of ONE head. "
                f"`nn.ModuleList([head] * n)` (or a list comprehension over one existing head) holds the same module "
                f"n times, so all heads share weights. Create a new CausalAttention per head")
    if heads > 1 and d_out % heads == 0 and got[0] == (d_out // heads, d_in):
        return (f"each head has d_out // num_heads = {d_out // heads} outputs. In the wrapper d_out is the size of ONE "
                f"head: build every head with CausalAttention(d_in, d_out, ...); the output then has num_heads * d_out "
                f"columns")
    return None


def _wrapper_diagnose(case: Case, got: object, want: object) -> str | None:
    """Heads joined on the wrong dimension, added up, or one head's output repeated."""
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor) or case.build is None:
        return None
    heads = case.build[4]
    b, T, total = want.shape
    d = total // heads
    shape = tuple(got.shape)
    if heads < 2:
        return None
    if shape != tuple(want.shape):
        wrong_dim = {(b * heads, T, d): "dim 0, the batch", (b, T * heads, d): "dim 1, the tokens",
                     (heads, b, T, d): "a new dim 0 (torch.stack)", (b, heads, T, d): "a new dim 1 (torch.stack)",
                     (b, T, heads, d): "a new dim 2 (torch.stack)"}
        if shape in wrong_dim:
            return (f"the heads are joined on the wrong dim ({wrong_dim[shape]}): concatenate the heads' (b, T, d_out) "
                    f"outputs along the last dim, torch.cat(..., dim=-1), to get (b, T, num_heads * d_out).")
        if shape == (b, T, d):
            blocks = want.split(d, dim=-1)
            total_out = sum(blocks[1:], blocks[0])
            if tensor_difference(total_out, got) is None:
                return "the heads' outputs are added up: concatenate them along the last dim, torch.cat(..., dim=-1)."
            if tensor_difference(total_out / heads, got) is None:
                return "the heads' outputs are averaged: concatenate them along the last dim, torch.cat(..., dim=-1)."
            return "the output has the size of one head: concatenate all heads' outputs along the last dim."
        return None
    blocks = got.detach().split(d, dim=-1)
    if all(torch.allclose(blocks[0], block) for block in blocks[1:]):
        return ("one head repeated: every head's block of the output is the same. Call each head in self.heads once "
                "(e.g. [head(x) for head in self.heads]) and make sure they are distinct modules.")
    return None


def _wrapper_configs(more: dict) -> list[tuple[tuple, list[Case]]]:
    batch = book_batch()
    return [
        ((3, 2, 6, 0.0, 2), [Case("book batch (2, 6, 3)", (batch,))]),
        ((3, 1, 6, 0.0, 2), [Case("exercise 3.2: d_out=1, two heads", (batch,))]),
        ((3, 2, 6, 0.5, 2), [Case("dropout 0.5, T=4", (rand(2, 4, 3, seed=82),))]),
    ] + more["configs"]


def _wrapper_short() -> torch.Tensor:
    """A shorter input than the first construction's context_length (6)."""
    return rand(2, 4, 3, seed=81)


def _wrapper_plan(hidden: bool) -> list[spec.Step]:
    more = _hidden_modules("MultiHeadAttentionWrapper", hidden)
    configs = _wrapper_configs(more)
    plan = ProbePlan()
    for build in [_WRAPPER_SHAPES] + [build for build, _ in configs]:
        plan.add(build)
    plan.add(configs[0][0], Probe("eval", 7, book_batch()), Probe("eval", 7, _wrapper_short()),
             *causal_probes(book_batch()))
    plan.causal(more["causal"])
    plan.compared(configs, train=True)
    return probed.steps(plan.items())


def _wrapper_judge(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    exercise = "MultiHeadAttentionWrapper"
    views = probed.views(exercise, plan, outcomes)
    more = _hidden_modules(exercise, outcomes.hidden)
    configs = _wrapper_configs(more)
    probed.module_checks(exercise, views, [_WRAPPER_SHAPES] + [build for build, _ in configs], _wrapper_shapes)
    first = configs[0][0]
    batch = book_batch()
    probed.built(exercise, views[first], first)
    probed.finite(exercise, views[first], batch, f"built with {first}")
    probed.truncated(exercise, views[first], _wrapper_short(), 6, f"built with {first}")
    probed.causal_module(exercise, views[first], batch)
    for case in more["causal"]:
        probed.built(exercise, views[case.build], case.build)
        probed.causal_module(exercise, views[case.build], case.args[0])
    probed.compare(exercise, views, configs, train=True, diagnose=_wrapper_diagnose)
    return (f"outputs agree in eval() and train() mode for {len(configs)} constructions, exercise 3.2 "
            f"included; heads are distinct and concatenated on the last dim")


check_MultiHeadAttentionWrapper = spec.declare(spec.Spec(
    "MultiHeadAttentionWrapper", _wrapper_plan, _wrapper_judge, runners={spec.MODULE: spec.run_module}),
    """Check ``MultiHeadAttentionWrapper(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)``.""")


# ------------------------------------------------------------------------------------------
# split_heads / merge_heads
# ------------------------------------------------------------------------------------------
def _split_diagnose(case: Case, got: object, want: object) -> str | None:
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        return None
    x, num_heads = case.args
    b, T, d = x.shape
    shape = (b, T, num_heads, d // num_heads)
    if tuple(got.shape) == shape and shape != tuple(want.shape):
        return (f"got shape (b, T, num_heads, head_dim) = {shape}: the token and head dimensions are not swapped "
                f"yet; .transpose(1, 2) gives (b, num_heads, T, head_dim).")
    return None


def _split_cases() -> list[Case]:
    return [
        Case("(2, 6, 4), 2 heads", (rand(2, 6, 4, seed=91), 2)),
        Case("(1, 5, 6), 3 heads", (rand(1, 5, 6, seed=92), 3)),
    ]


check_split_heads = spec.declare(
    spec.function_spec("split_heads", _split_cases, diagnose=_split_diagnose),
    """Check ``split_heads(x, num_heads)``: ``(b, T, d)`` -> ``(b, num_heads, T, d // num_heads)``.""")


def _split_input(name: str, x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``split_heads(x, num_heads)``, an input of merge_heads: (b, H, T, D), laid out in memory like
    the output of a transpose (recorded in the student edition, strides included)."""
    return expect("merge_heads", f"input: {name}", lambda: _expected.reference("split_heads")(x, num_heads))


def _merge_diagnose(case: Case, got: object, want: object) -> str | None:
    if isinstance(got, RuntimeError):
        text = str(got)
        if "view size is not compatible" in text or "contiguous" in text:
            return ("view on a transposed tensor: after transpose the memory is not contiguous, so .view raised. Call "
                    ".contiguous() before .view(...), or use .reshape(...).")
        return None
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor) or got.shape != want.shape:
        return None
    _, H, _, D = case.args[0].shape
    blocks = got.detach().split(D, dim=-1)
    if H > 1 and all(torch.equal(blocks[0], block) for block in blocks[1:]):
        return ("every head's block of head_dim columns in your output is the same: keep all heads, head h in "
                "columns h*head_dim:(h+1)*head_dim.")
    return None


def _merge_cases() -> list[Case]:
    x = rand(2, 5, 12, seed=107)
    return [
        Case("output of split_heads (2, 2, 6, 3), not contiguous",
             (_split_input("split_heads(x (2, 6, 6), 2)", rand(2, 6, 6, seed=101), 2),)),
        Case("(1, 3, 5, 2)", (rand(1, 3, 5, 2, seed=102),)),
        *[Case(f"merge_heads(split_heads(x, {heads})) must give x (2, 5, 12) back",
               (_split_input(f"split_heads(x (2, 5, 12), {heads})", x, heads),)) for heads in (3, 4)],
    ]


check_merge_heads = spec.declare(
    spec.function_spec("merge_heads", _merge_cases, diagnose=_merge_diagnose),
    """Check ``merge_heads(x)``: ``(b, H, T, D)`` -> ``(b, T, H * D)``, the inverse of ``split_heads``.""")


# ------------------------------------------------------------------------------------------
# MultiHeadAttention
# ------------------------------------------------------------------------------------------
def _mha_shapes(got: list, want: list, build: tuple) -> str | None:
    d_in, d_out, heads = build[0], build[1], build[4]
    if got and heads > 1 and got[0] == (d_out * heads, d_in):
        return (f"W_query has shape {got[0]} for d_out={d_out}, num_heads={heads}: in MultiHeadAttention d_out is the "
                f"TOTAL output size (all heads together); each head gets head_dim = d_out // num_heads = "
                f"{d_out // heads}; in the wrapper it was the size of one head")
    return None


#: Without dropout, T = context_length: compared first, so that a known mistake is named before the
#: causality and dropout checks see its symptoms (shorter inputs get their own message).
def _mha_values() -> tuple[tuple, list[Case]]:
    return (4, 6, 8, 0.0, 3), [Case("(2, 8, 4), T = context_length, no dropout", (rand(2, 8, 4, seed=111),))]


def _mha_configs(more: dict) -> list[tuple[tuple, list[Case]]]:
    return [
        ((4, 6, 8, 0.3, 3), [Case("(2, 8, 4)", (rand(2, 8, 4, seed=112),)),
                             Case("T=5 < context_length", (rand(2, 5, 4, seed=113),))]),
        ((3, 2, 6, 0.0, 2), [Case("book batch (2, 6, 3)", (book_batch(),))]),
    ] + more["configs"]


def _mha_plan(hidden: bool) -> list[spec.Step]:
    more = _hidden_modules("MultiHeadAttention", hidden)
    values, configs = _mha_values(), _mha_configs(more)
    builds = [values[0]] + [build for build, _ in configs]
    return probed.steps(probed.attention_class_plan(builds, values, configs, more["causal"]))


def _mha_judge(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    exercise = "MultiHeadAttention"
    more = _hidden_modules(exercise, outcomes.hidden)
    values, configs = _mha_values(), _mha_configs(more)
    return probed.attention_class(exercise, probed.views(exercise, plan, outcomes),
                                  [values[0]] + [build for build, _ in configs], values, configs, more["causal"],
                                  _mha_shapes)


check_MultiHeadAttention = spec.declare(spec.Spec(
    "MultiHeadAttention", _mha_plan, _mha_judge, runners={spec.MODULE: spec.run_module},
    helpers=lambda: helper_checks(globals(), "MultiHeadAttention")),
    """Check ``MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)``. Runs with our
    ``split_heads`` and ``merge_heads`` (:func:`modules.alone`).""")


# ------------------------------------------------------------------------------------------
# count_parameters
# ------------------------------------------------------------------------------------------
def _attention_parameters(d_in: int, d_out: int, context_length: int) -> nn.Module:
    """What count_parameters sees of MultiHeadAttention(d_in, d_out, context_length, 0.0, num_heads):
    its layers, and a (context_length, context_length) buffer like its mask."""
    module = nn.Module()
    module.W_query = nn.Linear(d_in, d_out, bias=False)
    module.W_key = nn.Linear(d_in, d_out, bias=False)
    module.W_value = nn.Linear(d_in, d_out, bias=False)
    module.out_proj = nn.Linear(d_out, d_out)
    module.dropout = nn.Dropout(0.0)
    module.register_buffer("mask", torch.zeros(context_length, context_length, dtype=torch.bool))
    return module


def _count_diagnose(case: Case, got: object, want: object) -> str | None:
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, (int, float)) or not isinstance(want, int):
        return None
    if got == 0 and want:
        return ("nothing is counted: sum p.numel() over module.parameters() (which visits every submodule), keeping "
                "the parameters with requires_grad=True.")
    if isinstance(got, float) and not got.is_integer():
        return "a count is a whole number: sum p.numel() (an int) over the parameters."
    return None


def _count_cases() -> list[Case]:
    frozen = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    frozen[0].requires_grad_(False)
    return [
        Case("exercise 3.3: GPT-2 small attention (768, 768, 1024, 0.0, 12)", (_attention_parameters(768, 768, 1024),)),
        Case("nn.Linear(3, 2)", (nn.Linear(3, 2),)),
        Case("Sequential with a frozen first layer", (frozen,)),
    ]


check_count_parameters = spec.declare(
    spec.function_spec("count_parameters", _count_cases, atol=0.0, rtol=0.0, diagnose=_count_diagnose),
    """Check ``count_parameters(module)``: the number of trainable parameters (GPT-2 small attention with
    ``qkv_bias=False``: 2,360,064; with GPT-2's own QKV biases, 2,362,368). Under the grader each module
    crosses into the kernel as its layout (``layouts.module_layout``), rebuilt there.""")
