"""Self-checks for notebook 08: KV cache, grouped-query attention and sliding windows.

Besides comparing values with the expected ones, the checks replay what a model does when it
generates text: a prompt, then one token (or a few) at a time through a module with a key/value
cache, and compare the outputs with one causal forward over the whole sequence. A mismatch is
located (which chunk, which position) and named: a mask aligned top-left (what SDPA's
``is_causal=True`` does when there are fewer queries than keys), a cache that grows along the
wrong dimension, a cache that ``reset_cache()`` does not clear. Expected values come from
:func:`course_utils.checks.expected.expect`, live or recorded, like every other check.

Each check is a spec (:mod:`course_utils.checks.spec`): its plan is every call it makes into the student's
code, run by one executor in the kernel, and its judge reads the outcomes as plain data, in the self-check
and, under the grader, outside the kernel. The functions' plans hold their compared calls and the calls that
must raise (:data:`MUST_RAISE`); ``sliding_window_mask``'s holds, beside them, the masks made by the test
cell's ``sliding_window_mask_mod`` (:data:`MOD_STEP`, a runner bound to it by the check);
``GroupedQueryAttention``'s is one probed construction per build (``spec.probe_step``, read through
``spec.ModuleView`` by :mod:`course_utils.checks.probed`). ``MultiHeadAttentionKVCache``'s outputs depend on
every call before them (the cache): each session, a module built and then its calls in order (forward passes
with and without the cache, ``reset_cache()``, ``.to``, converted copies), is one step (:func:`session_step`,
:func:`_run_session`), whose outcome lists each call's outcome and the cache's shape after it
(:class:`SessionView`). ``apply_rope``, ``GroupedQueryAttention`` and ``MultiHeadAttentionKVCache`` run with
our versions of the notebook's other exercises they call (``modules.alone``, ``HELPERS``). Under the grader,
08's kernel has the student edition, as every notebook's: it makes the second tries alone (the student's own
helpers), and where one fails the grader makes the first in a kernel whose reference holds only those
helpers (``grader.judge.JudgeOutside.first_tries``; ``docs/threat-model.md``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch

from course_utils import rules
from course_utils.device import manual_seed
from course_utils.checks import expected as _expected
from course_utils.checks import probe as _probe
from course_utils.checks import ladder, probed, spec, symptoms, wire
from course_utils.checks.core import (
    FORWARD_SEED,
    NOT_IMPLEMENTED,
    is_stub_data,
    is_stub_error,
    is_stub_source,
    Case,
    CheckFailed,
    _hinted,
    call_student,
    check,
    check_rules,
    construct,
    describe_shape,
    expect,
    fail,
    hidden_cases,
    mistake_outputs,
    rand,
    reference_output,
    require_callable,
    tensor_difference,
)
from course_utils.checks.modules import (
    helper_checks,
)

__all__ = [
    "check_decode_causal_mask",
    "check_rope_angles",
    "check_apply_rope",
    "check_MultiHeadAttentionKVCache",
    "check_repeat_kv",
    "check_GroupedQueryAttention",
    "check_sliding_window_mask",
]


# ------------------------------------------------------------------------------------------
# One mistake, one exercise: an answer is checked with OUR versions of the notebook's other exercises
# ------------------------------------------------------------------------------------------
#: The other exercises of this notebook that an exercise's answer may call, by the names the notebook
#: gives them: its checks run with the reference's versions (:func:`modules.check_alone`), so a wrong
#: helper costs only the helper's points.
HELPERS = {"MultiHeadAttentionKVCache": ("decode_causal_mask", "apply_rope"), "GroupedQueryAttention": ("repeat_kv",),
           "apply_rope": ("rope_angles",)}


#: The prefix of the keys of a plan's calls that must raise (the rest are compared with the reference's).
MUST_RAISE = "must raise: "


def _split(plan: Sequence[spec.Step]) -> tuple[list[spec.Step], list[spec.Step]]:
    """A function plan's compared calls, and its calls that must raise (:data:`MUST_RAISE`)."""
    return [s for s in plan if not s.key.startswith(MUST_RAISE)], [s for s in plan if s.key.startswith(MUST_RAISE)]


def _returned(got: object) -> bool:
    """Whether a call that must raise returned instead (a stub's NotImplementedError is reported as such)."""
    if is_stub_error(got):
        raise got
    return not isinstance(got, BaseException)


def _bool_masks(exercise: str, steps: Sequence[spec.Step], outcomes: spec.Outcomes) -> None:
    """``masked_fill`` needs a boolean mask: fail on the first case whose dtype is not ``torch.bool``."""
    for step in steps:
        got = outcomes[step.key]
        if isinstance(got, torch.Tensor) and got.dtype != torch.bool:
            fail(exercise, f"the mask must have dtype torch.bool, yours is {got.dtype}: masked_fill needs a boolean "
                           f"mask, True where a score is hidden (dtype=torch.bool, or add .bool()).", step.case)


def _mask_ladder(rungs: ladder.Ladder, steps: Sequence[spec.Step], outcomes: spec.Outcomes) -> Callable[[], str | None]:
    """A mask exercise's last hint, its ladder's (:func:`ladder.diagnose`): none where a mask is not boolean, as the
    message names the dtype already."""
    def smallest() -> str | None:
        if any(isinstance(outcomes[s.key], torch.Tensor) and outcomes[s.key].dtype != torch.bool for s in steps):
            return None
        return ladder.diagnose(rungs, outcomes)
    return smallest


def _first_wrong_entry(got: torch.Tensor, want: torch.Tensor) -> tuple[int, int] | None:
    wrong = (got.detach().cpu().bool() != want.detach().cpu().bool()).nonzero()
    return None if len(wrong) == 0 else tuple(int(i) for i in wrong[0].tolist())


# ------------------------------------------------------------------------------------------
# decode_causal_mask
# ------------------------------------------------------------------------------------------
def _rows_slice(got: torch.Tensor, Tq: int, Tk: int) -> str | None:
    """The family "rows start..num_keys of the full (num_keys, num_keys) causal mask" with a start other than
    num_keys - num_queries: named where one start alone reproduces ``got``."""
    if got.dim() != 2 or got.shape[1] != Tk:
        return None
    full = torch.triu(torch.ones(Tk, Tk, dtype=torch.bool), diagonal=1)
    starts = [s for s in range(1, Tk + 1) if s != Tk - Tq and full[s:].shape == got.shape
              and torch.equal(full[s:], got.detach().cpu().bool())]
    if len(starts) != 1:
        return None
    s = starts[0]
    source = " (= num_queries)" if s == Tq else ""
    return (f"your mask is the rows {s}..{Tk - 1} of the full ({Tk}, {Tk}) causal mask ({Tk - s} rows): sliced from "
            f"row {s}{source}. The queries are the LAST num_queries rows: slice from num_keys - num_queries = "
            f"{Tk - Tq} (mask[num_keys - num_queries:], or mask[-num_queries:]), which gives {Tq} rows.")


def _decode_mask_diagnosis(case: Case, got: object, want: object) -> str | None:
    """Say which entry is wrong and what it means for the query at that row."""
    Tq, Tk = case.args
    if isinstance(got, ValueError) and Tq == Tk:
        return (f"num_queries == num_keys ({Tq}) is allowed: a whole prompt read with an empty cache, which gives "
                f"causal_mask({Tk}). Raise only when num_queries > num_keys (> rather than >=).")
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        return None
    sliced = _rows_slice(got, Tq, Tk)
    if sliced is not None:
        return sliced
    if tuple(got.shape) != tuple(want.shape):
        if tuple(got.shape) == (Tk, Tk):
            return (f"your mask is ({Tk}, {Tk}): one row per KEY. It needs one row per QUERY, shape (num_queries, "
                    f"num_keys) = ({Tq}, {Tk}): the last {Tq} positions attending to all {Tk} keys.")
        return f"the mask has one row per query and one column per key: shape (num_queries, num_keys) = ({Tq}, {Tk})."
    at = _first_wrong_entry(got, want)
    if at is None:
        return None
    i, j = at
    position = Tk - Tq + i
    if bool(want[i, j]):
        return (f"query {i} is the token at position {position} (the queries are the LAST {Tq} of {Tk} positions), "
                f"so key {j} is in its future and entry [{i}, {j}] must be True.")
    return (f"query {i} is the token at position {position} (the queries are the LAST {Tq} of {Tk} positions), so it "
            f"may see keys 0..{position}: entry [{i}, {j}] must be False.")


def _decode_cases() -> list[Case]:
    return [Case(f"num_queries={q}, num_keys={k}", (q, k)) for q, k in ((3, 7), (1, 5), (4, 4), (2, 3))]


def _decode_rungs() -> tuple[ladder.Rung, ...]:
    """decode_causal_mask's ladder (:mod:`course_utils.checks.ladder`): no offset first, then keys already
    cached."""
    def r(q: int, k: int, adds: str, suspects: str) -> ladder.Rung:
        return ladder.Rung(Case(f"num_queries={q}, num_keys={k}", (q, k)), adds, suspects)
    return (
        r(3, 3, "", "the square mask (no key cached): True where a key is in the query's future (j > i), a bool "
          "(num_queries, num_keys) mask, torch.triu(torch.ones(...), diagonal=1)?"),
        r(1, 4, "keys already cached (an offset)", "the offset: the queries are the LAST num_queries positions, so "
          "query i sits at position num_keys - num_queries + i and the diagonal moves to num_keys - num_queries + "
          "1?"),
        r(2, 5, "several queries after cached keys", "one row per query, each shifted by the same offset: shape "
          "(num_queries, num_keys) and diagonal = num_keys - num_queries + 1 (not num_queries - num_keys + 1)?"),
    )


DECODE_LADDER = ladder.Ladder("decode_causal_mask", _decode_rungs,
                              lambda case: _expected.reference("decode_causal_mask")(*case.args))


def _judge_decode(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    exercise = "decode_causal_mask"
    ladder.record(DECODE_LADDER)
    compared, raising = _split(plan)
    spec.compare_outcomes(exercise, compared, outcomes, diagnose=_decode_mask_diagnosis,
                          smallest=_mask_ladder(DECODE_LADDER, compared, outcomes))
    _bool_masks(exercise, compared, outcomes)
    for step in raising:
        q, k = step.case.args
        if _returned(outcomes[step.key]):
            fail(exercise, f"decode_causal_mask({q}, {k}) returned a mask: more queries than keys cannot be the last "
                           f"{q} of {k} positions. Raise a ValueError when num_queries > num_keys.")
    return (f"{len(compared)} shapes give a boolean mask aligned to the bottom right "
            f"({'; '.join(s.case.name for s in compared)}), and num_queries > num_keys raises")


_decode_all = spec.with_hidden("decode_causal_mask", _decode_cases)

check_decode_causal_mask = spec.declare(spec.Spec(
    "decode_causal_mask",
    lambda hidden: spec.calls(_decode_all(hidden)) + spec.calls(
        [Case(f"num_queries={q}, num_keys={k}", (q, k)) for q, k in ((5, 3), (2, 1))], MUST_RAISE)
    + ladder.steps(DECODE_LADDER, hidden),
    _judge_decode, {ladder.RUN: ladder.call}),
    """Check ``decode_causal_mask(num_queries, num_keys)``: bool ``(Tq, Tk)``, bottom-right aligned,
    and a clear error when there are more queries than keys.""")


# ------------------------------------------------------------------------------------------
# RoPE: rope_angles and apply_rope
# ------------------------------------------------------------------------------------------
def _angles_diagnosis(case: Case, got: object, want: object) -> str | None:
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        return None
    head_dim, max_positions = case.args[:2]
    if tuple(got.shape) == (max_positions, head_dim):
        return (f"one angle per DIMENSION, ({max_positions}, {head_dim}): RoPE turns pairs of dimensions, so there is "
                f"one angle per pair, shape (max_positions, head_dim // 2) = {tuple(want.shape)}. (Hugging Face's "
                f"cos/sin caches repeat the angles for both halves; that comes later, in apply_rope.)")
    if tuple(got.shape) == (head_dim // 2, max_positions):
        return "the axes are swapped: one row per position, one column per pair, (max_positions, head_dim // 2)."
    if got.dim() == 2 and got.shape[1] == head_dim // 2 and got.shape[0] != max_positions:
        rows = min(got.shape[0], max_positions)
        same = (f" The rows you have are right for positions 0..{rows - 1}."
                if rows and torch.allclose(got[:rows].double(), want[:rows].double(), atol=1e-5, rtol=1e-4) else "")
        return (f"{got.shape[0]} rows where there is one per position 0..max_positions - 1, {max_positions} rows."
                f"{same} The positions are torch.arange(max_positions): 0 to max_positions - 1, all of them.")
    if got.dim() == 2 and got.shape[0] == max_positions and 0 < got.shape[1] < head_dim // 2:
        return (f"{got.shape[1]} frequencies where there is one per pair of dimensions, head_dim // 2 = {head_dim // 2}: "
                f"the pair indices 2i run over the whole head, torch.arange(0, head_dim, 2) (not up to head_dim // 2), "
                f"and the exponent is 2i / head_dim.")
    return _frequencies_hint(case, got, want)


@symptoms.bonus
def _frequencies_hint(case: Case, got: torch.Tensor, want: torch.Tensor) -> str | None:
    """Angles ``(max_positions, head_dim // 2)`` that grow with the position as they should, ``angle[p, i] = p *
    theta_i``, but whose frequencies ``theta_i = base ** (-e_i)`` have exponents ``e_i`` a constant factor ``r`` times
    the right ``2i / head_dim`` (read off row 1; ``None`` unless every pair has the same factor, not 1)."""
    head_dim, max_positions = case.args[:2]
    base = float(case.kwargs.get("base", case.args[2] if len(case.args) > 2 else 10000.0))
    if got.shape != want.shape or max_positions < 2 or head_dim < 4 or base <= 1:
        return None
    g = got.detach().double()
    theta = g[1]  # (head_dim // 2,): the angle of position 1 is the frequency itself
    if not (bool(torch.isfinite(g).all()) and bool((theta > 0).all())) or abs(float(theta[0]) - 1) > 1e-4 \
            or not torch.allclose(g, torch.outer(torch.arange(max_positions, dtype=torch.float64), theta),
                                  atol=1e-5, rtol=1e-4):
        return None
    pairs = torch.arange(1, head_dim // 2, dtype=torch.float64)
    ratio = (-torch.log(theta[1:]) / math.log(base)) / (2 * pairs / head_dim)  # (head_dim // 2 - 1,)
    r = float(ratio.mean())
    if not torch.allclose(ratio, torch.full_like(ratio, r), rtol=1e-3) or abs(r - 1) < 1e-2:
        return None
    if base != 10000.0 and abs(r - math.log(10000.0) / math.log(base)) < 1e-2:
        return (f"the frequencies are those of base 10000.0, not of the base given, {base:g}: the base argument is "
                f"ignored (10000.0 is only its default).")
    said = (f"the angles grow with the position as they should (angle[p, i] = p * theta_i), but the frequencies "
            f"theta_i fall as base ** (-{2 * r:.3g} i / head_dim), not base ** (-2 i / head_dim): the exponent is "
            f"{r:.3g} times what it should be (pair 1: theta_1 = {float(theta[1]):.3g} where it is "
            f"{base ** (-2 / head_dim):.3g} with head_dim = {head_dim}).")
    if abs(r - 2) < 1e-2:
        return said + (" Is 2i divided by head_dim // 2? The exponent is 2i / head_dim, torch.arange(0, head_dim, 2) "
                       "/ head_dim.")
    return said + " The exponent is 2i / head_dim, torch.arange(0, head_dim, 2) / head_dim."


def _angles_cases() -> list[Case]:
    return [Case("head_dim=8, max_positions=6", (8, 6)), Case("head_dim=4, max_positions=3, base=100.0", (4, 3),
                                                               {"base": 100.0}),
            Case("head_dim=16, max_positions=40", (16, 40))]


def _judge_angles(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    exercise = "rope_angles"
    compared, raising = _split(plan)
    spec.compare_outcomes(exercise, compared, outcomes, diagnose=_angles_diagnosis)
    for step in compared[:1]:
        got = outcomes[step.key]
        if got.dtype != torch.float32:
            fail(exercise, f"the angles have dtype {got.dtype}; return float32, as the queries and keys are "
                           f"(compute in float64 if you like, then .float()).", step.case)
    if any(_returned(outcomes[step.key]) for step in raising):
        fail(exercise, "rope_angles(5, 4) returned angles: with an odd head_dim one dimension has no partner to "
                       "turn with. Raise a ValueError when head_dim is odd.")
    return f"{len(compared)} cases agree ({'; '.join(s.case.name for s in compared)}), and an odd head_dim raises"


_angles_all = spec.with_hidden("rope_angles", _angles_cases)

check_rope_angles = spec.declare(spec.Spec(
    "rope_angles",
    lambda hidden: spec.calls(_angles_all(hidden)) + spec.calls([Case("head_dim=5, max_positions=4", (5, 4))],
                                                               MUST_RAISE),
    _judge_angles),
    """Check ``rope_angles(head_dim, max_positions, base=10000.0)``: ``(P, D/2)`` float32,
    ``angle[p, i] = p * base ** (-2 i / D)``, a ValueError for an odd ``head_dim``.""")


def _rope_case(name: str, x: torch.Tensor, positions: Sequence[int]) -> Case:
    return Case(name, (x, torch.tensor(list(positions))))


def _rope_cases() -> list[Case]:
    return [
        _rope_case("(2, 3, 5, 8) at positions 0..4", rand(2, 3, 5, 8, seed=831), range(5)),
        _rope_case("(1, 2, 3, 4) at positions 10, 11, 12: a chunk after 10 cached tokens",
                   rand(1, 2, 3, 4, seed=832), (10, 11, 12)),
        _rope_case("(4, 6) at positions 3, 7, 8, 40", rand(4, 6, seed=833), (3, 7, 8, 40)),
    ]


_OUT_OF_BOUNDS = re.compile(r"index (\d+) is out of bounds for dimension 0 with size (\d+)")


def _rope_diagnosis(case: Case, got: object, want: object) -> str | None:
    """An angle table with fewer rows than the largest position needs (issue 36): indexed with the positions,
    it raises an IndexError naming a row past its end."""
    x, positions = case.args[0], case.args[1] if len(case.args) > 1 else None
    D = x.shape[-1]
    sizes = symptoms.broadcast_sizes(got) if isinstance(got, RuntimeError) else None
    if sizes and {sizes[0], sizes[1]} == {D // 2, D // 4}:
        return (f"the angle table has {D // 4} columns where each half of x has {D // 2}: it was built for head_dim "
                f"{D // 2}. Build it for the whole head, rope_angles(head_dim={D}, ...): (max_positions, head_dim // "
                f"2), one angle per pair.")
    if sizes and D % 2 == 0 and {sizes[0], sizes[1]} == {D, D // 2} and sizes[2] in (x.dim() - 1, -1):
        return (f"a tensor with all D = {D} features meets one with D // 2 = {D // 2} on the last dimension: a "
                f"half of x still has {D} features. Split x on its LAST dimension, the features: x1, x2 = "
                f"x[..., :D // 2], x[..., D // 2:] (not chunk(2, dim=-2), the tokens), each (..., T, {D // 2}) "
                f"like cos and sin (T, D // 2) (those stay one angle per pair, not repeated to D).")
    if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.dim() == want.dim() >= 2 \
            and got.shape[-1] * 2 == want.shape[-1] and got.shape[-2] == 2 * want.shape[-2] \
            and got.shape[:-2] == want.shape[:-2]:
        return (f"the output is {tuple(got.shape)}: twice the tokens, half the features. The two turned halves, each "
                f"(..., T, D // 2), were joined along the tokens (dim=-2): join them along the features, "
                f"torch.cat([..., ...], dim=-1), to give back (..., T, D) = {tuple(want.shape)}.")
    if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.shape == want.shape \
            and isinstance(positions, torch.Tensor) and D % 2 == 0:
        angle = positions.double()[:, None] * 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (T, D/2)
        cos, sin = angle.cos(), angle.sin()
        x1, x2 = x.double()[..., :D // 2], x.double()[..., D // 2:]
        for words, other in (("cos and sin are swapped: the sine is used where the cosine belongs and vice versa. "
                              "The pair (x1, x2) turns to (x1 cos - x2 sin, x1 sin + x2 cos).",
                              torch.cat([x1 * sin - x2 * cos, x1 * cos + x2 * sin], -1)),
                             ("each pair is turned the wrong way (by minus its angle): a sign flipped. The pair (x1, "
                              "x2) turns to (x1 cos - x2 sin, x1 sin + x2 cos).",
                              torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], -1)),
                             ("the two turned halves are right but put back interleaved: torch.stack([...], "
                              "dim=-1).flatten(-2) gives dimension 2i the first half's entry i and 2i + 1 the second's. "
                              "Output dimension i must hold x1 cos - x2 sin and dimension i + D/2 must hold x1 sin + "
                              "x2 cos: join the halves end to end, torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * "
                              "cos], dim=-1).",
                              torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)),
                             ("neighbours are paired, x_2i with x_(2i + 1) (the interleaved convention), and put back "
                              "interleaved: this course pairs x_i with x_(i + D/2), the two halves x[..., :D // 2] and "
                              "x[..., D // 2:], and joins the turned halves end to end with torch.cat(..., dim=-1).",
                              _neighbours_turned(x.double(), cos, sin, interleave=True)),
                             ("neighbours are paired, x_2i with x_(2i + 1) (x[..., 0::2] and x[..., 1::2]): this course "
                              "pairs x_i with x_(i + D/2), the two halves x[..., :D // 2] and x[..., D // 2:].",
                              _neighbours_turned(x.double(), cos, sin, interleave=False))):
            if torch.allclose(got.double(), other, atol=1e-4, rtol=1e-4):
                return words
        halves = _halves_hint(got.double(), want.double(), x1, x2, cos, sin)
        if halves:
            return halves
    tokens = _tokens_as_head_hint(x, got, positions)
    if tokens:
        return tokens
    found = _OUT_OF_BOUNDS.search(str(got)) if isinstance(got, IndexError) else None
    if not (found and isinstance(positions, torch.Tensor) and positions.numel()):
        return None
    size, largest = int(found.group(2)), int(positions.max())
    if largest < size:
        return None
    counted = " (one row per position given, len(positions))" if size == positions.numel() else ""
    return (f"the angle table has {size} rows{counted}, but the positions go up to {largest}: row p of "
            f"rope_angles(head_dim, max_positions) is position p, so build it for max_positions = "
            f"int(positions.max()) + 1 = {largest + 1} and index it with the positions themselves.")


def _neighbours_turned(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """``x`` (..., T, D) turned with the pairs (x_2i, x_(2i + 1)) instead of the halves, the turned pairs put back
    interleaved (dimensions 2i and 2i + 1) or end to end (i and i + D/2)."""
    a, b = x[..., 0::2], x[..., 1::2]
    first, second = a * cos - b * sin, a * sin + b * cos
    return torch.stack([first, second], -1).flatten(-2) if interleave else torch.cat([first, second], -1)


@symptoms.bonus
def _halves_hint(got: torch.Tensor, want: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> str | None:
    """``apply_rope``'s output ``(..., T, D)`` read half by half (issue 36): where one half,
    ``x1 cos - x2 sin`` (first) or ``x1 sin + x2 cos`` (second), is right and the other is not, that is said, with
    what the wrong half is where it is one of the inputs' halves unchanged or one of the formula's two terms
    (``x1``, ``x2``, ``x1 cos``, ``x2 sin``, ...). ``x1, x2``: ``(..., T, D/2)``; ``cos, sin``: ``(T, D/2)``."""
    D = got.shape[-1]

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and torch.allclose(a, b, atol=1e-4, rtol=1e-4)

    parts = [("first", "x1 cos - x2 sin", got[..., :D // 2], want[..., :D // 2]),
             ("second", "x1 sin + x2 cos", got[..., D // 2:], want[..., D // 2:])]
    right = [close(g, w) for _, _, g, w in parts]
    if right.count(True) != 1:
        return None
    (good, good_formula, _, _), (bad, bad_formula, g, _) = parts if right[0] else parts[::-1]
    terms = {"x1 unchanged (not turned)": x1, "x2 unchanged (not turned)": x2, "x1 cos alone": x1 * cos,
             "x2 cos alone": x2 * cos, "x1 sin alone": x1 * sin, "x2 sin alone": x2 * sin,
             "-x2 sin alone": -x2 * sin}
    seen = next((name for name, value in terms.items() if close(g, value)), None)
    what = f": it is {seen}" if seen else ""
    return (f"the {good} half of the output, {good_formula}, is right; the {bad} half (the last dimension's "
            f"{'first' if bad == 'first' else 'last'} D/2 entries) differs{what}. It must be {bad_formula}, with the "
            f"same cos and sin.")


@symptoms.bonus
def _tokens_as_head_hint(x: torch.Tensor, got: object, positions: object = None) -> str | None:
    """``apply_rope`` on ``x`` (``(..., T, D)``, ``T != D``) that raised as the head size ``T`` gives: ``rope_angles``
    refusing an odd head size (T odd, D even; a number its message names is T), or, for an even ``T``, halves and
    angles of sizes ``T // 2`` and ``D - T // 2`` that do not broadcast. Where the odd number refused is also the
    table's length ``P = int(positions.max()) + 1`` (positions 0..T-1 give P = T), the head size may have been
    given where the length belongs (the arguments of ``rope_angles`` swapped): both readings are said (issue 36)."""
    T, D = x.shape[-2], x.shape[-1]
    if not isinstance(got, BaseException) or T == D or D % 2:
        return None
    text = str(got)
    sizes = symptoms.broadcast_sizes(got) if isinstance(got, RuntimeError) else None
    numbers = {int(n) for n in re.findall(r"\b\d+\b", text)}
    P = int(positions.max()) + 1 if isinstance(positions, torch.Tensor) and positions.numel() else None
    refused = isinstance(got, ValueError) and bool(re.search(r"head_dim|even|odd|pair", text, re.I))
    if refused and P is not None and P % 2 == 1 and P != D and numbers == {P}:
        read = (f"the number of tokens, x.shape[-2], and also the table's length int(positions.max()) + 1"
                if P == T else "the table's length int(positions.max()) + 1, not any size of x")
        return (f"rope_angles refused head_dim {P}, and {P} is {read}, while the head size D of this x "
                f"{tuple(x.shape)} is x.shape[-1] = {D}. rope_angles takes the head size first, then the length: "
                f"rope_angles(D, int(positions.max()) + 1). Is it called with its arguments swapped, or with D read "
                f"from x.shape[-2]?")
    if refused and T % 2 == 1 and numbers <= {T}:
        if T in numbers:
            return (f"rope_angles refused head_dim {T}, and {T} is the number of tokens, x.shape[-2], of this x "
                    f"{tuple(x.shape)}: the head size D is x.shape[-1] = {D}. " + _HEAD_SIZE)
        return (f"an error for an odd head size, but the head size of this x {tuple(x.shape)} is x.shape[-1] = {D}, "
                f"even: was it read from the tokens, x.shape[-2] = {T}? " + _HEAD_SIZE)
    if T % 2 == 0 and sizes is not None and {sizes[0], sizes[1]} == {T // 2, D - T // 2}:
        return (f"the halves and the angle table have sizes {T // 2} and {D - T // 2}, a split at {T // 2} = T // 2: "
                f"T = x.shape[-2] = {T} is the number of tokens of this x {tuple(x.shape)}, and the head size D is "
                f"x.shape[-1] = {D}. " + _HEAD_SIZE)
    return None


_HEAD_SIZE = ("Read D from the last dimension, D = x.shape[-1], for the angle table (rope_angles(D, ...)) and the "
              "halves x[..., :D // 2], x[..., D // 2:].")


#: The key of ``apply_rope``'s bfloat16 step: its case's, after this.
HALF = "bfloat16: "


def _rope_half_case() -> Case:
    """A tiny bfloat16 ``x``: the angle table is float32, and the output must keep ``x``'s dtype. Far positions
    (1000..1002): an angle rounded to bfloat16 there (8 significant bits: 1001 becomes 1000) is off by radians."""
    return _rope_case("bfloat16 (1, 2, 3, 4) at positions 1000..1002", rand(1, 2, 3, 4, seed=834).to(torch.bfloat16),
                      range(1000, 1003))


#: How far a bfloat16 apply_rope may be from the exact rotation, per entry, relative to |x_i| + |x_(i+D/2)|:
#: cos and sin rounded to bfloat16, two products and a sum rounded, at most 3 * 2**-9 (about 0.006); four times
#: bfloat16's 2**-8 leaves room for any order of those steps (or float32 products cast once at the end).
_HALF_TOLERANCE = 2.0 ** -6


def _judge_rope_half_values(exercise: str, case: Case, got: torch.Tensor) -> None:
    """The bfloat16 output against the exact rotation (float64, from the float32 angle table's formula)."""
    x, positions = case.args
    D = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angle = positions.double()[:, None] * theta  # (T, D/2)
    x64 = x.double()
    x1, x2 = x64[..., :D // 2], x64[..., D // 2:]
    want = torch.cat([x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()], dim=-1)
    scale = (x1.abs() + x2.abs()).repeat(*([1] * (x.dim() - 1)), 2) + 1e-6
    off = ((got.detach().double() - want).abs() / scale)
    if not bool(torch.isfinite(off).all()) or float(off.max()) <= _HALF_TOLERANCE:
        return
    worst = float(off.max())
    fail(exercise, f"the bfloat16 output is off by up to {worst:.3g} x (|x_i| + |x_(i+D/2)|), far more than bfloat16 "
                   f"rounding allows ({_HALF_TOLERANCE:.3g}): the angles (or the positions) were rounded to bfloat16 "
                   f"before cos and sin. A bfloat16 angle keeps 8 significant bits (at position 1001 the angle 1001 "
                   f"becomes 1000). Take cos and sin of the float32 angle table, then cast them: "
                   f"angles.cos().to(x.dtype), angles.sin().to(x.dtype).", case)


def _judge_rope_half(exercise: str, case: Case, got: object) -> None:
    """The bfloat16 step: it runs and returns ``x``'s shape in ``x``'s dtype (its values are those of the float32
    cases, which passed)."""
    if isinstance(got, BaseException):
        failed = spec.raised(exercise, got, case)
        hint = symptoms.error_hint(got) if failed.student_error is not None else None
        raise _hinted(failed, hint) from None
    x = case.args[0]
    if not isinstance(got, torch.Tensor) or got.shape != x.shape:
        fail(exercise, f"expected a tensor of shape {tuple(x.shape)}, got {describe_shape(got)}.", case)
    if got.dtype != x.dtype:
        fail(exercise, f"returns {str(got.dtype).removeprefix('torch.')} for bfloat16 inputs: the angle table is "
                       f"float32, so cast cos and sin to x's dtype before the products (cos.to(x.dtype), "
                       f"sin.to(x.dtype)): the output keeps x's dtype.", case)
    _judge_rope_half_values(exercise, case, got)


def _rope_rungs() -> tuple[ladder.Rung, ...]:
    """apply_rope's ladder (:mod:`course_utils.checks.ladder`): position 0 (the identity), one pair turned,
    several pairs, positions not from 0, then batch and heads."""
    def r(shape: tuple, positions: Sequence[int], seed: int, adds: str, suspects: str) -> ladder.Rung:
        where = ", ".join(str(p) for p in positions)
        return ladder.Rung(_rope_case(f"{tuple(shape)} at position{'s' if len(positions) > 1 else ''} {where}",
                                      rand(*shape, seed=seed), positions), adds, suspects)
    return (
        r((1, 2), (0,), 835, "", "at position 0 every angle is 0, so cos = 1, sin = 0 and x must come back "
          "unchanged: the halves x1 = x[..., :D // 2] and x2 = x[..., D // 2:] joined back in that order "
          "(torch.cat(..., dim=-1)), cos and sin each in its place in (x1 cos - x2 sin, x1 sin + x2 cos), and the "
          "table built for the whole head, rope_angles(x.shape[-1], ...)?"),
        r((2, 2), (0, 1), 835, "a turn (one pair, at positions 0 and 1)", "the turn of one pair by its angle: (x1, "
          "x2) -> (x1 cos - x2 sin, x1 sin + x2 cos) and its two signs, with one angle row per token, "
          "angles[positions] of shape (T, D/2), lined up with x's token dimension (-2)?"),
        r((2, 4), (0, 1), 836, "several pairs (head_dim=4)", "which dimensions pair up and how fast each pair "
          "turns: x_i with x_(i + D/2) (the two halves, not the neighbours 2i and 2i + 1), turned by column i of "
          "the table, one column per pair (D/2 of them)?"),
        r((2, 4), (5, 6), 838, "positions that do not start at 0", "the positions given, not 0..T-1: a table for "
          "max_positions = int(positions.max()) + 1 (not len(positions)), indexed with the positions themselves?"),
        r((2, 2, 2, 4), (5, 6), 839, "batch and heads", "the leading dimensions: the halves sliced on the last "
          "dimension (x[..., :D // 2]), D read from x.shape[-1], cos and sin of shape (T, D/2) broadcast over "
          "(..., T, D/2)?"),
    )


ROPE_LADDER = ladder.Ladder("apply_rope", _rope_rungs,
                            lambda case: _expected.reference("apply_rope")(*[a.clone() for a in case.args]))


def _judge_rope(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    ladder.record(ROPE_LADDER)
    compared = [s for s in plan if not s.key.startswith(HALF)]
    spec.compare_outcomes("apply_rope", compared, outcomes, diagnose=_rope_diagnosis,
                          smallest=lambda: ladder.diagnose(ROPE_LADDER, outcomes))
    for step in plan:
        if step.key.startswith(HALF):
            _judge_rope_half("apply_rope", step.case, outcomes[step.key])
    return (f"{len(compared)} cases agree ({'; '.join(s.case.name for s in compared)}): each pair (x_i, x_(i+D/2)) "
            f"turned by its angle at its position")


_rope_all = spec.with_hidden("apply_rope", _rope_cases)

check_apply_rope = spec.declare(spec.Spec(
    "apply_rope", lambda hidden: spec.calls(_rope_all(hidden)) + spec.calls([_rope_half_case()], HALF)
    + ladder.steps(ROPE_LADDER, hidden), _judge_rope, {ladder.RUN: ladder.call},
    helpers=lambda: helper_checks(globals(), "apply_rope")),
    """Check ``apply_rope(x, positions)``: ``(..., T, D)`` rotated pair by pair (``x_i`` with ``x_{i+D/2}``)
    at the given positions; a rotation keeps each vector's length. Runs with our ``rope_angles``.""")


# ------------------------------------------------------------------------------------------
# MultiHeadAttentionKVCache: a prompt, then chunks, against one full forward
# ------------------------------------------------------------------------------------------
@dataclass
class DecodeCase(Case):
    """A module built with ``build`` reads ``x = args[0]`` (``(b, T, d_in)``) with ``use_cache=True``,
    chunk by chunk (``chunks`` are token counts that add up to ``T``): the outputs, joined along the
    tokens, must equal ``forward(x)`` on the whole sequence. ``dtype`` converts module and input first."""

    chunks: list = field(default_factory=list)
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if sum(self.chunks) != self.x.shape[1]:
            raise ValueError(f"{self.name}: chunks {self.chunks} do not add up to T={self.x.shape[1]}")
        self.args = (self.args[0].to(self.dtype),)

    @property
    def x(self) -> torch.Tensor:
        return self.args[0]

    def key(self) -> str:
        return f"{self.build} {self.dtype} decode {self.name}"

    def describe(self) -> str:
        return f"'{self.name}' (built with {self.build}, input {describe_shape(self.x)}, chunks of {self.chunks} tokens)"

    def spans(self) -> list[tuple[int, int]]:
        starts = [sum(self.chunks[:i]) for i in range(len(self.chunks))]
        return [(s, s + n) for s, n in zip(starts, self.chunks)]


def decode(module: torch.nn.Module, x: torch.Tensor, chunks: Sequence[int]) -> torch.Tensor:
    """``reset_cache()``, then ``module(chunk, use_cache=True)`` for each chunk of ``x``; the outputs
    joined along the tokens, ``(b, T, d_out)``. Runs in ``eval()`` mode without gradients."""
    module.eval()
    module.reset_cache()
    outputs, start = [], 0
    with torch.no_grad():
        for n in chunks:
            outputs.append(module(x[:, start:start + n], use_cache=True))
            start += n
    return torch.cat(outputs, dim=1)


def _full_forward(exercise: str, case: DecodeCase) -> torch.Tensor:
    """The reference module's ``forward(x)`` over the whole sequence: what decoding must reproduce."""
    def compute() -> torch.Tensor:
        module = construct(_expected.reference(exercise), case.build).to(case.dtype).eval()
        with torch.no_grad():
            return module(case.x.clone())
    return expect(exercise, f"full forward: {case.key()}", compute)


def _decode_mistakes(exercise: str, case: DecodeCase) -> list:
    """``[[hint, joined outputs], ...]`` of the known mistakes on ``case`` (recorded for the visible cases)."""
    def compute() -> list:
        found = []
        for mistake in _expected.instructor().mistakes(exercise):
            try:
                module = construct(mistake.wrong, case.build).to(case.dtype)
                found.append([mistake.hint, decode(module, case.x.clone(), case.chunks)])
            except Exception:  # noqa: BLE001 - a mistake that cannot run on this input does not apply
                continue
        return found
    return expect(exercise, f"mistakes: {case.key()}", compute)


_SIZES = re.compile(r"Sizes of tensors must match except in dimension (-?\d+)")


def _decode_error_hint(error: BaseException, start: int, n: int, cache: object = None) -> str | None:
    """Name the mistake behind an error raised while decoding a chunk of ``n`` tokens after ``start``
    (``cache``: the shape of the module's ``cache_k`` after the error, a list, where it is a tensor)."""
    text = str(error)
    cache = torch.Size(cache) if isinstance(cache, list) and all(type(d) is int for d in cache) else None
    if start > 0 and cache is not None and len(cache) == 4 and cache[2] == n and n < start + n:
        return (f"after this call the cache holds only the {n} new tokens: it was REPLACED by the new keys and values "
                f"instead of growing. Append them, torch.cat([self.cache_k, keys], dim=2), so that the new queries "
                f"attend to all {start + n} tokens so far.")
    broadcast = symptoms.BROADCAST_ERROR.search(text)
    if broadcast and start > 0 and cache is not None and len(cache) == 4 and cache[1] != start \
            and cache[1] + n in (int(broadcast.group(1)), int(broadcast.group(2))):
        return (f"the number of cached tokens is read on the wrong dimension: cache_k is (b, num_heads, t, head_dim), "
                f"so start = cache_k.shape[2] = {start} (the tokens), not shape[1] = {cache[1]} (the heads).")
    sizes = _SIZES.search(text)
    if sizes:
        return (f"torch.cat joined the cache and the new keys on the wrong dimension (dim {sizes.group(1)}): the "
                f"cache must grow along the TOKEN dimension, torch.cat([self.cache_k, keys], dim=2) for tensors of "
                f"shape (b, num_heads, T, head_dim).")
    if symptoms.BROADCAST_ERROR.search(text) or "masked_fill" in text or "shape mismatch" in text:
        return (f"the mask does not fit the scores: {n} new queries against {start + n} cached keys give scores "
                f"(b, num_heads, {n}, {start + n}), so the mask is the ({n}, {start + n}) rows {start}..{start + n - 1} "
                f"of the causal mask, decode_causal_mask({n}, {start + n}).")
    numbers = {int(v) for v in re.findall(r"\b\d+\b", text)}
    if isinstance(error, ValueError) and start > 0 and "context_length" not in text and {start + n, n} <= numbers:
        keys = f"{n} key" + ("" if n == 1 else "s")
        return (f"the mask was asked for {start + n} queries against {keys}: decode_causal_mask is called with its "
                f"arguments swapped. It takes the number of new queries first, then the number of keys so far: "
                f"decode_causal_mask(T, start + T) = decode_causal_mask({n}, {start + n}) here.")
    if "context_length" in text or "num_tokens" in text:
        return (f"only {start + n} tokens have been given since the last reset_cache(): is the number of cached "
                f"tokens read on the TOKEN dimension (cache_k.shape[2] for (b, num_heads, t, head_dim), not shape[1], "
                f"the heads), and set back to 0 by reset_cache()? And do context_length tokens in all pass: raise only "
                f"when start + T > context_length (>= refuses the last position: an off-by-one)?")
    return None


def _cache_growth_hint(case: DecodeCase, caches: Sequence[object]) -> str | None:
    """What ``cache_k``'s shape after each chunk (``_cache_shape``: a list where it is a tensor) says when the
    decoded outputs differ (issue 36): a cache that stopped growing, or was replaced. The token dimension is
    the one that holds the first chunk's tokens after it (dim 2 of (b, num_heads, t, head_dim))."""
    spans = case.spans()
    if len(caches) != len(spans) or len(spans) < 2:
        return None
    shapes = [c if isinstance(c, list) and len(c) == 4 and all(type(d) is int for d in c) else None for c in caches]
    if shapes[0] is None or shapes[0][2] != spans[0][1]:
        return None
    for (start, end), before, after in zip(spans[1:], shapes, shapes[1:]):
        if after is None or after[2] == end:
            continue
        if after[2] == before[2]:
            return (f"the cache stopped growing: after the call that read tokens {start}..{end - 1} it still holds "
                    f"{after[2]} tokens, not {end}. On every use_cache=True call, store the joined keys and values back, "
                    f"self.cache_k = torch.cat([self.cache_k, keys], dim=2) (and cache_v), not only on the first call.")
        if after[2] == end - start:
            return (f"after the call that read tokens {start}..{end - 1} the cache holds only its {end - start} new "
                    f"tokens: it was REPLACED by the new keys and values instead of growing. Append them, "
                    f"torch.cat([self.cache_k, keys], dim=2), so that the new queries attend to all {end} tokens so far.")
        return (f"after the call that read tokens {start}..{end - 1} the cache holds {after[2]} tokens, not the {end} "
                f"read so far: each call appends exactly its new keys and values, torch.cat([self.cache_k, keys], dim=2).")
    return None


def _decode_difference(exercise: str, case: DecodeCase, got: torch.Tensor, want: torch.Tensor, what: str,
                       atol: float, rtol: float, caches: Sequence[object] = (),
                       smallest: Callable[[], str | None] = lambda: None) -> None:
    """Fail, at the first chunk that differs, if the decoded outputs differ from the full forward (``caches``:
    ``cache_k``'s shape after each chunk, for :func:`_cache_growth_hint`). The hint: a known mistake's, the cache's
    growth, else the ladder's (``smallest()``), else where the first wrong chunk lies."""
    problem = tensor_difference(want, got, atol, rtol)
    if problem is None:
        return
    bad = None
    for k, (start, end) in enumerate(case.spans()):
        if tensor_difference(want[:, start:end], got[:, start:end], atol, rtol) is not None:
            bad = (k, start, end)
            break
    where = "" if bad is None else f" The first chunk that differs is chunk {bad[0]}, tokens {bad[1]}..{bad[2] - 1}."
    hint = None
    for mistake_hint, output in _decode_mistakes(exercise, case):
        if tensor_difference(output, got, atol, rtol) is None:
            hint = mistake_hint
            break
    if hint is None and bad is not None and bad[0] > 0:
        hint = _cache_growth_hint(case, caches)
    hint = hint or smallest()
    if hint is None and bad is not None:
        if bad[0] == 0:
            hint = ("with an empty cache, use_cache=True on the prompt must give what forward(prompt) gives: the "
                    "prompt's queries see the prompt's keys up to their own position (the causal mask).")
        else:
            hint = (f"the prompt is right, the later tokens are not: token {bad[1]} must attend to the keys of ALL "
                    f"{bad[1] + 1} tokens so far (the cached ones and its own), with the rows "
                    f"{bad[1]}..{bad[2] - 1} of the causal mask, decode_causal_mask({bad[2] - bad[1]}, {bad[2]}).")
    fail(exercise, f"case {case.describe()}: {what}: the outputs differ from forward(x) on the whole sequence: "
                   f"{problem.rstrip('.')}.{where}" + (f" Hint: {hint}" if hint else ""))


def require_limit_error(exercise: str, exc: BaseException, what: str, context_length: int) -> None:
    """The course's one standard past ``context_length``: a ``ValueError`` raised on purpose, whose message
    names the limit (the word context_length, or its value). PyTorch's own shape errors do not count."""
    first = (str(exc).splitlines() or [""])[0]
    if not isinstance(exc, ValueError):
        origin = ("an assert: raise a ValueError instead (assert statements vanish under python -O)"
                  if isinstance(exc, AssertionError) else
                  "mismatched shapes inside PyTorch, not from a check of yours, and tells the user nothing")
        fail(exercise, f"{what} raised {type(exc).__name__}: {first}. That error comes from {origin}. Check the "
                       f"length yourself and raise a ValueError that names the limit, context_length={context_length}.")
    if "context_length" not in str(exc) and str(context_length) not in str(exc):
        fail(exercise, f"{what} raised ValueError: {first}. Right error, but its message does not name the limit: "
                       f"say that the tokens exceed context_length={context_length}.")


def _require_clear(exercise: str, exc: BaseException, what: str, condition: str) -> None:
    """A ``ValueError`` the student raised on purpose, not one that PyTorch raised by accident of shapes."""
    if not isinstance(exc, ValueError):
        first = (str(exc).splitlines() or [""])[0]
        origin = ("an assert: raise a ValueError instead (assert statements vanish under python -O)"
                  if isinstance(exc, AssertionError) else "mismatched shapes, not from your code, and tells the user nothing")
        fail(exercise, f"{what} raised {type(exc).__name__}: {first}. That error comes from {origin}: check that "
                       f"yourself and raise a ValueError saying that {condition}.")


def _kv_cases() -> list[DecodeCase]:
    return [
        DecodeCase("prompt of 4, then one token at a time", (rand(2, 7, 6, seed=801),), build=(6, 8, 12, 0.0, 2),
                   chunks=[4, 1, 1, 1]),
        DecodeCase("batch of 1, prompt of 1, then 1 at a time", (rand(1, 4, 5, seed=802),), build=(5, 6, 6, 0.0, 3),
                   chunks=[1, 1, 1, 1]),
        DecodeCase("prompt of 2, then chunks of 2 and 1 tokens; dropout=0.5 in eval() mode, float64",
                   (rand(3, 5, 4, seed=803),), build=(4, 4, 8, 0.5, 2), chunks=[2, 2, 1], dtype=torch.float64),
        DecodeCase("rope=True: prompt of 3, then chunks of 1 and 2 tokens", (rand(2, 6, 6, seed=808),),
                   build=(6, 8, 12, 0.0, 2, False, True), chunks=[3, 1, 2]),
    ]


def _finite(exercise: str, view: spec.ModuleView, x: torch.Tensor, where: str) -> None:
    """:func:`probed.finite`, where an error the student's code raised gets :func:`symptoms.error_hint`'s
    translation (a view on a transposed tensor, a missing cast) when it has one."""
    try:
        probed.finite(exercise, view, x, where)
    except CheckFailed as error:
        student = getattr(error, "student_error", None)
        hint = symptoms.error_hint(student) if isinstance(student, BaseException) and " Hint: " not in str(error) \
            else None
        if not hint:
            raise
        raise _hinted(error, hint) from None


def _dropout_on_weights(exercise: str, view: spec.ModuleView, x: torch.Tensor, where: str) -> None:
    """In ``train()`` (the pass of :func:`probed.dropout_modes` under seed 1) dropout zeroes attention WEIGHTS:
    each output is out_proj (with its bias) of a mix of values, so an entry exactly 0 is all but impossible. A
    share of exact zeros near the dropout rate is dropout applied to the output itself."""
    out = probed.output(exercise, view, "train", 1, x, f"{where}, train()")
    if not isinstance(out, torch.Tensor) or not out.is_floating_point() or out.numel() < 16:
        return
    zeros = int((out == 0).sum())
    if zeros >= max(4, out.numel() // 10):
        fail(exercise, f"{where}, train(): {zeros} of {out.numel()} output entries are exactly 0: dropout is applied "
                       f"to the module's OUTPUT (after out_proj), zeroing output features. Apply it to the attention "
                       f"weights, right after the softmax and before they multiply the values: weights = "
                       f"self.dropout(torch.softmax(scores / head_dim ** 0.5, dim=-1)), as MultiHeadAttention does.")


def _kv_setup(exercise: str, hidden: bool) -> tuple[list[DecodeCase], tuple, tuple]:
    """The decoded cases (visible, then hidden) and the two whole-sequence configs of :func:`_judge_kv`."""
    extra = hidden_cases(exercise) if hidden else []
    cases = _kv_cases() + [c if isinstance(c, DecodeCase) else  # handed in as data under the grader
                           DecodeCase(c.name, c.args, build=c.build, chunks=c.chunks, dtype=c.dtype) for c in extra]
    full = ((6, 8, 12, 0.0, 2), [Case("whole sequence, use_cache=False", (rand(2, 10, 6, seed=804),))])
    full_rope = ((6, 8, 12, 0.0, 2, False, True), [Case("rope=True, whole sequence, use_cache=False",
                                                        (rand(2, 7, 6, seed=810),))])
    return cases, full, full_rope


def _too_long_view(exercise: str, view: spec.ModuleView, build: tuple) -> None:
    """:func:`_check_too_long` on a probed construction (its pass: eval, no seed, ``rand(1, context_length + 1,
    d_in, seed=77)``)."""
    d_in, context_length = build[0], build[2]
    exc = view.forward("eval", None, rand(1, context_length + 1, d_in, seed=77))
    if is_stub_error(exc):
        raise exc
    if not isinstance(exc, BaseException):
        fail(exercise, f"built with {build}: an input of T = context_length + 1 = {context_length + 1} tokens "
                       f"returned an output instead of raising an error. The mask covers only context_length "
                       f"positions: raise a ValueError that names the limit, context_length={context_length}.")
    require_limit_error(exercise, exc, f"built with {build}: an input of T = context_length + 1 = "
                                       f"{context_length + 1} tokens", context_length)


# ------------------------------------------------------------------------------------------
# MultiHeadAttentionKVCache's sessions: each output depends on every call before it
# ------------------------------------------------------------------------------------------
#: The runner of a session (:func:`_run_session`): one module built, then the session's operations in order.
SESSION = "session"


def session_step(key: str, build: tuple, ops: Sequence[tuple], name: str = "session") -> spec.Step:
    """The step of one session: ``cls(*build)`` under the course's seed, then each operation of ``ops`` in order
    on that module, as plain data: ``("reset",)`` (``reset_cache()``), ``("to", dtype name)``, ``("forward", x,
    use_cache, seed, mode)`` (under ``torch.no_grad()``; seed ``None``: 7), ``("buffers",)`` (what the cache is
    made of now), ``("copy", "float64" | "meta", x, seed)`` (a converted deep copy's forward)."""
    return spec.Step(key, Case(name, (tuple(tuple(op) for op in ops),), build=tuple(build)), SESSION)


def _cache_shape(module: torch.nn.Module) -> object:
    """``cache_k``'s shape (a list), ``None``, or its type's name: what a hint reads of the cache after a call."""
    value = getattr(module, "cache_k", None)
    return list(value.shape) if isinstance(value, torch.Tensor) else None if value is None else type(value).__name__


def _run_session(cls: Callable, case: Case) -> dict:
    """The kernel's run of a :func:`session_step`, as plain data: ``{"built": spec.describe_build(...) (with
    "meta_left", or "copy_error" where a copy could not be made), "steps": [{"value": ...} or {"error": [type,
    message]} (and "missing": True where the module has no such method), with "cache" (:func:`_cache_shape`)
    after a use_cache=True call]}``; the steps stop at a copy that could not be made."""
    import copy as _copy

    built = spec.describe_build(cls, case)
    found: dict = {"built": built, "steps": []}
    if "error" in built or not built["module"]:
        return found
    module = construct(cls, case.build)
    module.eval()
    for op in case.args[0]:
        kind, one = op[0], {}
        try:
            if kind == "reset":
                if not callable(getattr(module, "reset_cache", None)):
                    one["missing"] = True
                module.reset_cache()
                one["value"] = None
            elif kind == "to":
                module = module.to(getattr(torch, op[1]))
                one["value"] = None
            elif kind == "forward":
                _, x, cached, seed, mode = op
                getattr(module, mode)()
                manual_seed(7 if seed is None else seed)
                with torch.no_grad():
                    one["value"] = module(x.clone(), use_cache=True) if cached else module(x.clone())
            elif kind == "buffers":
                saved = set(module.state_dict())
                one["value"] = {name: [type(getattr(module, name, None)).__name__, name in module._buffers, name in saved]
                                for name in ("cache_k", "cache_v")}
            elif kind == "copy":
                _, target, x, seed = op
                try:
                    moved = _copy.deepcopy(module).to(torch.float64 if target == "float64" else target)
                except Exception as exc:  # noqa: BLE001 - the check reports what making the copy raised
                    built["copy_error"] = [type(exc).__name__, wire.error_data(exc)["message"]]
                    break
                if target == "meta":
                    built["meta_left"] = _probe.left_behind(moved)
                moved.eval()
                manual_seed(seed)
                one["value"] = moved(x.clone())
        except Exception as exc:  # noqa: BLE001 - a step's error is an outcome
            one.pop("value", None)
            error = wire.error_data(exc)
            one["error"] = [error["type"], error["message"]]
        if kind == "forward" and op[2]:
            one["cache"] = _cache_shape(module)
        found["steps"].append(one)
    return found


class SessionView:
    """A session as the judge reads it (:func:`_run_session`'s outcome for a :func:`session_step`): :attr:`built`,
    each operation's outcome by position (:meth:`step`, :meth:`value`), and, as ``spec.ModuleView`` offers them,
    :meth:`forward`, :meth:`index` and :meth:`ran` (so that ``probed``'s checks read a session too)."""

    def __init__(self, exercise: str, step: spec.Step, outcome: object):
        ops = step.case.args[0]
        ok = isinstance(outcome, dict) and set(outcome) == {"built", "steps"} and isinstance(outcome["built"], dict) \
            and isinstance(outcome["steps"], list) and len(outcome["steps"]) <= len(ops) and all(
                isinstance(o, dict) and set(o) - {"cache", "missing"} in ({"value"}, {"error"}) for o in outcome["steps"])
        if ok and len(outcome["steps"]) < len(ops) and "error" not in outcome["built"] \
                and outcome["built"].get("module") and "copy_error" not in outcome["built"]:
            ok = False  # fewer steps than the session's, with nothing that stopped it
        if not ok:
            spec.refuse(exercise, "session")
        self.exercise, self.ops, self.built, self._steps = exercise, ops, outcome["built"], outcome["steps"]

    def ran(self, i: int) -> bool:
        return i < len(self._steps)

    def step(self, i: int) -> dict:
        """The outcome of operation ``i`` (it ran: the judge reads a session only once it was built)."""
        if not self.ran(i):
            spec.refuse(self.exercise, "session (a step that did not run)")
        return self._steps[i]

    def value(self, i: int) -> object:
        """The value of operation ``i``, or the exception it raised (not raised)."""
        one = self.step(i)
        if "error" in one:
            return wire.error_of(*one["error"])
        return one["value"]

    def index(self, mode: str, seed: int | None, x: torch.Tensor, copy: str | None = None,
              kwargs: dict | None = None) -> int:
        """Where the forward pass without the cache (or the copy's) on ``x`` is in the session."""
        for i, op in enumerate(self.ops):
            if copy is None and op[0] == "forward" and not op[2] and (op[3], op[4]) == (seed, mode):
                px = op[1]
            elif copy is not None and op[0] == "copy" and (op[1], op[3]) == (copy, seed):
                px = op[2]
            else:
                continue
            if px.dtype == x.dtype and px.shape == x.shape and px.device.type == x.device.type and \
                    (x.device.type == "meta" or torch.equal(px, x)):
                return i
        raise KeyError(f"{self.exercise}'s session makes no {mode}() pass with seed {seed}, copy {copy} on an input of "
                       f"shape {tuple(x.shape)}")

    def forward(self, mode: str, seed: int | None, x: torch.Tensor, copy: str | None = None,
                kwargs: dict | None = None) -> object:
        return self.value(self.index(mode, seed, x, copy))


def _forward(x: torch.Tensor, cached: bool = False, seed: int | None = None, mode: str = "eval") -> tuple:
    return ("forward", x, cached, seed, mode)


_RESET = ("reset",)


def _decoded(case: DecodeCase, spans: Sequence[tuple[int, int]]) -> list[tuple]:
    return [_forward(case.x[:, s:e], cached=True) for s, e in spans]


def _kv_inputs() -> dict:
    """The inputs of the main module's checks and of the dropout's."""
    return {"buffers": rand(2, 3, 6, seed=809), "causal": rand(2, 5, 6, seed=805), "dropout": rand(2, 5, 4, seed=806),
            "moves": rand(2, 5, 6, seed=807), "other": 881}


def _left_alone_cases(cases: Sequence[DecodeCase]) -> dict[str, DecodeCase]:
    """The sessions with a forward without the cache between cached calls, by key: the first case's, and the
    first rope=True case's (issue 36: where forward without the cache runs the module's own code)."""
    rope = next(c for c in cases if len(c.build) > 6 and c.build[6])
    return {"a forward without the cache between cached calls": cases[0],
            "a forward without the cache between cached calls, rope=True": rope}


def _left_alone_other(case: DecodeCase) -> torch.Tensor:
    """The input of the forward without the cache in a :func:`_left_alone_cases` session, ``(b, 3, d_in)``."""
    return rand(*case.x.shape[:1], 3, case.x.shape[2], seed=_kv_inputs()["other"]).to(case.dtype)


def _kv_rungs() -> tuple[ladder.Rung, ...]:
    """MultiHeadAttentionKVCache's ladder (:mod:`course_utils.checks.ladder`): one token without the cache, then
    T = context_length, one token with the cache, a cached prompt, several cached calls, a call without the cache
    after them, several heads, then rope=True. Each rung
    is a session (:func:`session_step`'s operations, :func:`_run_session`) of a module built with ``(d_in, d_out,
    context_length, dropout, num_heads[, qkv_bias, rope])``; what is compared is each forward call's output."""
    x = rand(2, 4, 4, seed=845)
    one, several = [_forward(x[:, :1])], [_RESET] + _decoded(DecodeCase("", (x,), chunks=[1, 1, 2]),
                                                            [(0, 1), (1, 2), (2, 4)])

    def r(build: tuple, ops: list, name: str, adds: str, suspects: str) -> ladder.Rung:
        return ladder.Rung(Case(f"{name}, built with {build}", (tuple(ops),), build=build), adds, suspects)
    return (
        r((4, 4, 4, 0.0, 1), one, "x (2, 1, 4) without the cache", "", "the "
          "projections W_query, W_key and W_value, a query that sees only its own key (weight 1: the output is "
          "out_proj of its value), and out_proj?"),
        r((4, 4, 4, 0.0, 1), [_forward(x)], "x (2, 4, 4) without the cache", "several tokens (T = context_length)",
          "forward without the cache: the scores q @ k^T scaled by 1/sqrt(head_dim), the causal mask of T tokens "
          "before the softmax over the keys (dim=-1), weights @ values, and a length check that lets T = "
          "context_length through (T > context_length raises, not >=)?"),
        r((4, 4, 4, 0.0, 1), [_RESET, _forward(x[:, :1], cached=True)], "reset_cache(), then x[:, :1] with "
          "use_cache=True", "the cache (one token, nothing cached before)", "the cached path on an empty cache: "
          "reset_cache() emptying it, the new keys and values kept (self.cache_k, self.cache_v), and the same "
          "attention as without the cache?"),
        r((4, 4, 4, 0.0, 1), [_RESET, _forward(x, cached=True)], "reset_cache(), then x (2, 4, 4) with "
          "use_cache=True", "a cached prompt of several tokens (T = context_length)", "the attention of the cached "
          "path: the scores q @ k^T scaled by 1/sqrt(head_dim), the mask decode_causal_mask(T, num_keys) before the "
          "softmax over the keys (dim=-1), weights @ values, and a length check that lets num_cached + T = "
          "context_length through (> raises, not >=)?"),
        r((4, 4, 4, 0.0, 1), several, "reset_cache(), then chunks of 1, 1 and 2 tokens with use_cache=True",
          "several cached calls", "what carries over from call to call: the new keys appended to cache_k and the "
          "new values to cache_v (torch.cat(..., dim=2)) and stored back on every call, the queries attending to "
          "every key so far with the rows of decode_causal_mask(T_new, num_keys), and the length check counting the "
          "cached tokens?"),
        r((4, 4, 4, 0.0, 1), several + [_forward(x)], "reset_cache(), chunks of 1, 1 and 2 tokens with "
          "use_cache=True, then x without the cache", "a call without the cache after cached ones", "forward "
          "without use_cache after cached calls: x read as a whole sequence from position 0 (its positions and "
          "mask rows 0..T-1, a length check on T alone), whatever the cache holds, and the cache left alone?"),
        r((4, 8, 4, 0.0, 4), several, "reset_cache(), then chunks of 1, 1 and 2 tokens with use_cache=True",
          "several heads", "the head split and join: queries, keys and values viewed (b, T, heads, head_dim) and "
          "transposed to (b, heads, T, head_dim), the cache (b, heads, tokens, head_dim) joined along the tokens "
          "(dim=2), the context transposed back before .contiguous().view(b, T, d_out), and the scale "
          "1/sqrt(head_dim) with head_dim = d_out // num_heads?"),
        r((4, 8, 4, 0.0, 2, False, True), [_forward(x)] + several + [_forward(x)], "x without the cache, "
          "reset_cache(), chunks of 1, 1 and 2 tokens with use_cache=True, then x again without the cache",
          "rope=True", "RoPE: the queries AND the keys (not the values) turned by apply_rope at their positions, "
          "num_cached + i with the cache and 0..T-1 without it (whatever the cache holds), before the keys are "
          "cached?"),
    )


def _session_outputs(found: object) -> object:
    """A rung's session (:func:`_run_session`) as the ladder compares it: the outputs of its forward calls (a
    tuple), or the first error it raised (an exception, not raised)."""
    if not (isinstance(found, dict) and isinstance(found.get("built"), dict) and isinstance(found.get("steps"), list)):
        return found
    error = found["built"].get("error")
    outputs = []
    for one in ([{"error": error}] if error else []) + found["steps"]:
        if not isinstance(one, dict):
            return found
        if isinstance(one.get("error"), list) and len(one["error"]) == 2 and all(isinstance(e, str) for e in one["error"]):
            return wire.error_of(*one["error"])
        if one.get("value") is not None:
            outputs.append(one["value"])
    return tuple(outputs)


@symptoms.bonus
def _one_key_weight(outcomes: spec.Outcomes) -> str | None:
    """The ladder's rung of one token with the cache, nothing cached before (rung 3), wrong where the same token
    without the cache (rung 1) is right (issue 36, batch H). With one key, its weight is 1 whatever the score (the
    softmax of one number), so the output is ``out_proj(v) = W v + b``; an output ``W (c v) + b`` for every row,
    ``c`` not 1, means weights that sum to ``c``: something applied to them after the softmax. Read off the two
    rows of the batch: ``got_0 - got_1 = c (want_0 - want_1)``. ``None`` where no rung ran (the hidden plan)."""
    rungs = KV_LADDER.rungs
    if not ladder.ran(KV_LADDER, outcomes, 3) or ladder.right(KV_LADDER, outcomes, 0) is None:
        return None
    got = ladder.outcome(KV_LADDER, outcomes, rungs[2])
    want = ladder.expected_output(KV_LADDER, rungs[2])
    if not (isinstance(got, tuple) and isinstance(want, tuple) and len(got) == len(want) == 1
            and isinstance(got[0], torch.Tensor) and got[0].shape == want[0].shape and want[0].shape[0] >= 2):
        return None
    g, w = got[0].detach().double().flatten(1), want[0].detach().double().flatten(1)  # (b, T * d_out), T = 1
    dg, dw = g[1:] - g[:1], w[1:] - w[:1]
    norm = float((dw * dw).sum())
    if norm < 1e-12 or not bool(torch.isfinite(g).all()):
        return None
    c = float((dg * dw).sum()) / norm
    if abs(c - 1) < 1e-3 or not torch.allclose(dg, c * dw, atol=1e-5, rtol=1e-4):
        return None
    head_dim = rungs[2].case.build[1] // rungs[2].case.build[4]
    said = (f"with one token and nothing cached (reset_cache(), then x[:, :1] with use_cache=True), the only key's "
            f"weight must be 1 whatever its score (the softmax of one number), so the output is out_proj of its "
            f"value, as your call without the cache gives. Yours is out_proj of {c:.3g} times that value: the "
            f"weights of that call sum to {c:.3g}, not 1.")
    if abs(c - head_dim ** -0.5) < 1e-3:
        return said + (f" {c:.3g} is 1/sqrt(head_dim), head_dim = {head_dim}: the weights are divided by sqrt("
                       f"head_dim) after the softmax. The scale belongs to the scores, inside it: softmax(scores / "
                       f"sqrt(head_dim), dim=-1).")
    return said + " Is something applied to the weights after the softmax (a scale, a mask)?"


KV_LADDER = ladder.Ladder(
    "MultiHeadAttentionKVCache", _kv_rungs,
    lambda case: _session_outputs(_run_session(_expected.reference("MultiHeadAttentionKVCache"), case)),
    lambda outputs: [(f"call {i + 1}'s output", v) for i, v in enumerate(outputs)], runner=SESSION,
    output=_session_outputs, twins=False)


def _kv_steps(hidden: bool) -> list[spec.Step]:
    """Every session of :func:`_judge_kv`, in its order: the whole-sequence values (with their causality
    diagnosis), each sequence decoded (twice for the first and the hidden ones), a forward without the cache
    between cached calls, the main module's session (the cache's buffers, the context limit, the empty prompt,
    causality, too long, the moved copies), dropout's modes."""
    from course_utils.checks.core import causal_inputs
    from course_utils.checks.modules import _later_tokens_changed

    cases, full, full_rope = _kv_setup("MultiHeadAttentionKVCache", hidden)
    inputs = _kv_inputs()
    steps = []
    for build, checked in (full, full_rope):
        ops = [op for c in checked for op in (_forward(c.args[0], seed=FORWARD_SEED), _forward(c.args[0]),
                                             *[_forward(v) for v in causal_inputs(c.args[0])])]
        steps.append(session_step(f"values {build}", build, ops))
    for k, case in enumerate(cases):
        ops = [("to", str(case.dtype).removeprefix("torch.")), _RESET, *_decoded(case, case.spans())]
        if k == 0 or case.name.startswith("hidden"):
            ops += [_RESET, *_decoded(case, case.spans())]
        steps.append(session_step(f"decode {k}: {case.key()}", case.build, ops, case.name))
    for key, first in _left_alone_cases(cases).items():
        other = _left_alone_other(first)
        steps.append(session_step(key, first.build, [
            ("to", str(first.dtype).removeprefix("torch.")), _RESET, *_decoded(first, first.spans()[:1]),
            _forward(other), *_decoded(first, first.spans()[1:])]))
    d_in, context_length = full[0][0], full[0][2]
    long = rand(1, context_length + 1, d_in, seed=882)
    x = inputs["causal"]
    steps.append(session_step("the main module", full[0], [
        _RESET, _forward(inputs["buffers"], cached=True), ("buffers",),
        _RESET, _forward(long[:, :context_length - 1], cached=True),
        _forward(long[:, context_length - 1:context_length], cached=True), _forward(long[:, context_length:], cached=True),
        _RESET, _forward(rand(2, 0, d_in, seed=883), cached=True),
        *[_forward(v) for v in (x, *causal_inputs(x), _later_tokens_changed(x))],
        _forward(rand(1, context_length + 1, d_in, seed=77)),
        ("copy", "float64", inputs["moves"].to(torch.float64), 7), ("copy", "meta", inputs["moves"].to("meta"), 7)]))
    steps.append(session_step("dropout", cases[2].build, [_forward(inputs["dropout"], seed=seed, mode=mode)
                                                          for mode in ("eval", "train") for seed in (1, 2)]))
    return steps + ladder.steps(KV_LADDER, hidden)


def _called(exercise: str, got: object, case: Case, missing: bool = False) -> object:
    """``got``, or the failure ``core.call_student`` raises for it; a method the module does not have raises its
    ``AttributeError`` as it is (the check in hand looks the method up before calling it)."""
    if missing and isinstance(got, BaseException):
        raise got
    return call_student(exercise, probed.replayed(got), case)


def _decode_pass(exercise: str, view: SessionView, case: DecodeCase, first: int, what: str,
                 smallest: Callable[[], str | None] = lambda: None) -> torch.Tensor:
    """One decoding of ``case`` read from the session: ``reset_cache()`` at ``first``, then each chunk (an error's
    hint: :func:`_decode_error_hint`'s, else the ladder's, ``smallest()``)."""
    _called(exercise, view.value(first), Case(f"{what}: reset_cache()"), view.step(first).get("missing", False))
    outputs = []
    for k, (start, end) in enumerate(case.spans()):
        i = first + 1 + k
        got = view.value(i)
        if is_stub_error(got):
            fail(exercise, NOT_IMPLEMENTED)
        if isinstance(got, BaseException):
            hint = _decode_error_hint(got, start, end - start, view.step(i).get("cache")) or smallest()
            error = CheckFailed(
                f"❌ {exercise} on case {case.describe()}: {what}: tokens {start}..{end - 1} with use_cache=True "
                f"(after {start} cached tokens) raised {type(got).__name__}: {got}" + (f" Hint: {hint}" if hint else ""))
            error.student_error = got
            raise error from got
        outputs.append(got)
        if not isinstance(got, torch.Tensor) or got.dim() != 3 or got.shape[1] != end - start:
            fail(exercise, f"{what}: tokens {start}..{end - 1} with use_cache=True returned "
                           f"{describe_shape(got)}; expected the outputs of the {end - start} new tokens only, "
                           f"shape ({case.x.shape[0]}, {end - start}, d_out).")
    return torch.cat(outputs, dim=1)


def _judge_decode(exercise: str, view: SessionView, case: DecodeCase, again: bool,
                  smallest: Callable[[], str | None] = lambda: None) -> None:
    """Decode ``case``, and with ``again`` a second time after ``reset_cache()``: each pass must give the
    full forward's outputs (``smallest()``: the ladder's hint, :data:`KV_LADDER`)."""
    want = _full_forward(exercise, case)
    probed.built(exercise, view, case.build)
    converted = view.value(0)
    if isinstance(converted, BaseException):
        raise converted
    tight = case.dtype == torch.float64
    atol, rtol = (1e-10, 1e-8) if tight else (1e-5, 1e-4)
    if _expected.is_recording():
        _decode_mistakes(exercise, case)
    got = _decode_pass(exercise, view, case, 1, "first sequence", smallest)
    caches = [view.step(2 + k).get("cache") for k in range(len(case.spans()))]
    _decode_difference(exercise, case, got, want, "first sequence", atol, rtol, caches, smallest)
    if not again:
        return
    try:
        second = _decode_pass(exercise, view, case, 2 + len(case.spans()), "after reset_cache(), the same sequence again")
    except CheckFailed as error:
        raise CheckFailed(f"{error} The first pass was right, so reset_cache() does not clear everything: after it "
                          f"the cache must be empty and the next token at position 0.") from None
    if tensor_difference(want, second, atol, rtol) is not None:
        fail(exercise, f"case {case.describe()}: the first pass was right, but after reset_cache() the same sequence "
                       f"gives other outputs: {tensor_difference(want, second, atol, rtol)} reset_cache() must empty "
                       f"the cache and set the position back to 0.")


def _judge_left_alone(exercise: str, view: SessionView, case: DecodeCase) -> None:
    """A ``forward(x)`` without the cache between two cached calls must not change what they give."""
    want = _full_forward(exercise, case)
    probed.built(exercise, view, case.build)
    if isinstance(view.value(0), BaseException):
        raise view.value(0)
    _called(exercise, view.value(1), Case("reset_cache()"), view.step(1).get("missing", False))
    outs = [_called(exercise, view.value(2), Case(case.name))]
    alone_hint = ("Without use_cache, read x as a whole sequence from position 0 (start = 0: its positions and mask "
                  "rows 0..T-1), whatever the cache holds, and leave the cache alone.")
    try:
        between = _called(exercise, view.value(3), Case("a forward without the cache between two cached calls"))
    except CheckFailed as error:
        if NOT_IMPLEMENTED in str(error):
            raise
        raise _hinted(error, "forward(x) without use_cache raised after a cached call. " + alone_hint) from None
    other = _left_alone_other(case)
    alone = DecodeCase(f"{case.name}: forward without the cache after its first chunk", (other,), build=case.build,
                       chunks=[other.shape[1]], dtype=case.dtype)
    problem = tensor_difference(_full_forward(exercise, alone), between)
    if problem:
        fail(exercise, f"case {case.describe()}: after the first chunk with use_cache=True, forward(other_x) without "
                       f"the cache gives other outputs than on a fresh module: {problem} {alone_hint}")
    outs += [_called(exercise, view.value(4 + k), Case(case.name)) for k in range(len(case.spans()) - 1)]
    got = torch.cat(outs, dim=1)
    if tensor_difference(want, got) is not None:
        fail(exercise, f"case {case.describe()}: a call forward(other_x) with use_cache=False between two cached "
                       f"calls changed what the cached calls give ({tensor_difference(want, got)}). Without "
                       f"use_cache=True, forward must leave the cache alone.")


def _judge_main(exercise: str, view: SessionView, build: tuple) -> None:
    """The main module's session, read in its order: the cache's buffers, the context limit, the empty prompt."""
    x = _kv_inputs()["buffers"]
    _called(exercise, view.value(0), Case("reset_cache()"), view.step(0).get("missing", False))
    _called(exercise, view.value(1), Case(f"a prompt of {x.shape[1]} tokens"))
    made = view.value(2)
    if not (isinstance(made, dict) and set(made) == {"cache_k", "cache_v"} and all(
            isinstance(v, list) and len(v) == 3 and isinstance(v[0], str) and all(isinstance(b, bool) for b in v[1:])
            for v in made.values())):
        spec.refuse(exercise, "cache's buffers")
    where = f"built with {build}, after a prompt of {x.shape[1]} tokens with use_cache=True"
    for name in ("cache_k", "cache_v"):
        kind, buffer, _ = made[name]
        if kind not in ("Tensor", "Parameter"):
            fail(exercise, f"{where}: self.{name} is {kind}, not a tensor. Keep the cached "
                           f"{'keys' if name == 'cache_k' else 'values'} in self.{name}.")
        if not buffer:
            fail(exercise, f"{where}: self.{name} is a plain attribute, not a buffer, so module.to(device) would leave "
                           f"the cache behind on the CPU. Register it in __init__: "
                           f"self.register_buffer(\"{name}\", None, persistent=False).")
    saved = [name for name in ("cache_k", "cache_v") if made[name][2]]
    if saved:
        fail(exercise, f"{where}: state_dict() holds {saved}: a saved model would carry one sequence's cache. "
                       f"Register the cache buffers with persistent=False.")
    d_in, context_length = build[0], build[2]  # the context limit
    _called(exercise, view.value(3), Case("reset_cache()"), view.step(3).get("missing", False))
    for i, what in ((4, f"a prompt of context_length - 1 = {context_length - 1} tokens"),
                    (5, f"token {context_length - 1}, the last that fits")):
        found = view.value(i)
        if isinstance(found, ValueError):
            fail(exercise, f"built with {build}: {what}, with use_cache=True, raised ValueError: {found} It fits: the "
                           f"mask covers positions 0..{context_length - 1}, so context_length = {context_length} tokens "
                           f"in all are allowed. Raise only when the cached tokens plus the new ones exceed it, start + "
                           f"T > context_length (>= refuses the last position: an off-by-one).")
        _called(exercise, found, Case(what))
    exc = view.value(6)
    if is_stub_error(exc):
        raise exc
    if not isinstance(exc, BaseException):
        fail(exercise, f"built with {build}: with {context_length} = context_length tokens in the cache, one more "
                       f"token returned an output instead of raising an error. The mask (and the model's positions) "
                       f"cover only context_length tokens: raise a ValueError when the cached tokens plus the new "
                       f"ones exceed context_length.")
    require_limit_error(exercise, exc, f"built with {build}: with {context_length} = context_length tokens in the "
                                       f"cache, one more token", context_length)
    _called(exercise, view.value(7), Case("reset_cache()"), view.step(7).get("missing", False))  # the empty prompt
    shape = (2, 0, d_in)
    exc = view.value(8)
    if is_stub_error(exc):
        raise exc
    if not isinstance(exc, BaseException):
        fail(exercise, f"built with {build}: an empty prompt, shape {shape}, with use_cache=True returned "
                       f"an output instead of raising an error. There is nothing to attend to or to cache: raise a "
                       f"ValueError that says the input is empty.")
    _require_clear(exercise, exc, f"built with {build}: an empty prompt, shape {shape}, with "
                                  f"use_cache=True", "the input has no tokens")


def _judge_kv(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    exercise = "MultiHeadAttentionKVCache"
    cases, full, full_rope = _kv_setup(exercise, outcomes.hidden)
    ladder.record(KV_LADDER)
    smallest = lambda: _one_key_weight(outcomes) or ladder.diagnose(KV_LADDER, outcomes)  # noqa: E731
    views = {step.key: SessionView(exercise, step, outcomes[step.key]) for step in plan}
    by_build: dict[tuple, SessionView] = {}
    for step in plan:
        by_build.setdefault(tuple(step.case.build), views[step.key])
    for build in dict.fromkeys([c.build for c in cases] + [full[0]]):
        probed.check_shapes(exercise, by_build[tuple(build)], build)
    for build, checked in (full, full_rope):  # finite, then the values
        view = views[f"values {build}"]
        causal = _heads_mixed(probed.not_causal(exercise, {tuple(b): views[f"values {tuple(b)}"]
                                                           for b, _ in (full, full_rope)}))
        probed.built(exercise, view, build)
        for case in checked:
            _finite(exercise, view, case.args[0], f"built with {build}, {case.name}")
        for case in checked:
            mcase = Case(case.name, case.args, case.kwargs, build=build, mode="eval")
            want = reference_output(exercise, mcase)
            if _expected.is_recording():
                mistake_outputs(exercise, mcase)
            spec.judge_forward(exercise, view.forward("eval", 7, case.args[0]), want, mcase, diagnose=causal,
                               smallest=smallest)
    for k, case in enumerate(cases):
        _judge_decode(exercise, views[f"decode {k}: {case.key()}"], case, again=k == 0 or case.name.startswith("hidden"),
                      smallest=smallest)
    for key, case in _left_alone_cases(cases).items():
        _judge_left_alone(exercise, views[key], case)
    main = views["the main module"]
    probed.built(exercise, main, full[0])
    _judge_main(exercise, main, full[0])
    inputs = _kv_inputs()
    probed.causal_module(exercise, main, inputs["causal"])
    _too_long_view(exercise, main, full[0])
    dropout = views["dropout"]
    probed.built(exercise, dropout, cases[2].build)
    probed.dropout_modes(exercise, dropout, inputs["dropout"], f"built with {cases[2].build}")
    _dropout_on_weights(exercise, dropout, inputs["dropout"], f"built with {cases[2].build}")
    probed.moves_with_module(exercise, main, full[0], inputs["moves"], f"built with {full[0]}")
    return (f"{len(cases)} sequences read with the cache ({'; '.join(c.name for c in cases)}) give the "
            f"outputs of one forward over the whole sequence, again after reset_cache(); the cache is in "
            f"buffers, not in state_dict; past context_length and an empty prompt raise a ValueError")


check_MultiHeadAttentionKVCache = spec.declare(spec.Spec(
    "MultiHeadAttentionKVCache", _kv_steps, _judge_kv, runners={SESSION: _run_session},
    helpers=lambda: helper_checks(globals(), "MultiHeadAttentionKVCache")),
    """``forward(x)`` is notebook 05's forward; a prompt then chunks with ``use_cache=True`` give the same
    outputs; ``reset_cache()`` starts again; the cache lives in buffers; past ``context_length`` and an
    empty prompt raise a ValueError. Runs with our ``decode_causal_mask`` and ``apply_rope``
    (:func:`modules.alone`). Each session (a module built, then calls whose outputs depend on the calls before
    them) is one step of the plan, run in order in the kernel (:func:`_run_session`).""")


# ------------------------------------------------------------------------------------------
# repeat_kv
# ------------------------------------------------------------------------------------------
def _repeat_diagnosis(case: Case, got: object, want: object) -> str | None:
    if isinstance(got, BaseException):
        text = str(got)
        if "view size is not compatible" in text:
            return ("expand makes no copy (its copies share memory: stride 0), so .view cannot merge the groups and "
                    "their copies into one dimension: use .reshape, which copies when it must.")
        return None
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        return None
    x, n_rep = case.args
    b, G, T, D = x.shape
    if got.dim() == 5:
        return (f"your output has 5 dimensions {tuple(got.shape)}: merge the groups and their copies into one head "
                f"dimension, reshape to (b, G * n_rep, T, D) = {tuple(want.shape)}.")
    if tuple(got.shape) != tuple(want.shape):
        if n_rep == 1:
            return None
        shapes = {(b * n_rep, G, T, D): "the batch (dim 0)", (b, G, T * n_rep, D): "the tokens (dim 2)",
                  (b, G, T, D * n_rep): "head_dim (dim 3)"}
        if tuple(got.shape) in shapes:
            return (f"K and V are repeated on the wrong dimension: you repeated {shapes[tuple(got.shape)]}. Repeat "
                    f"the key/value HEADS, dim 1: (b, G, T, D) -> (b, G * n_rep, T, D).")
        if got.dim() == 1 and got.numel() == want.numel():
            return (f"the output is flat, {tuple(got.shape)}: repeat_interleave without dim flattens x and repeats each "
                    f"NUMBER n_rep times. Give the head dimension: x.repeat_interleave(n_rep, dim=1).")
        return None
    return _which_heads(x, n_rep, got)


def _which_heads(x: torch.Tensor, n_rep: int, got: torch.Tensor) -> str | None:
    """Name what each output head holds, when the shape is right but the values are not."""
    G = x.shape[1]
    source = []
    for h in range(got.shape[1]):
        match = [g for g in range(G) if torch.allclose(got[:, h].to(x.dtype), x[:, g], atol=1e-6)]
        source.append(match[0] if match else None)
    if all(s is not None for s in source):
        wrong = [h for h, s in enumerate(source) if s != h // n_rep]
        if not wrong:
            return None
        h = wrong[0]
        return (f"every output head is a copy of an input head, but in the wrong order: output head {h} holds group "
                f"{source[h]}, and query head {h} must get group {h} // n_rep = {h // n_rep}. The copies of one "
                f"group come together (groups 0, 0, 0, 1, 1, 1 for n_rep = 3), not tiled (0, 1, 0, 1, ...).")
    h = source.index(None)
    return (f"output head {h} is not a copy of any input head: its values come from other tokens or other heads. "
            f"That happens when the copies are made along the token axis (or with head and token axes flattened "
            f"together) and then reshaped: each head's (T, D) block must stay whole. Repeat along dim 1, the heads, "
            f"before any reshape: x[:, :, None].expand(b, G, n_rep, T, D) or repeat_interleave(n_rep, dim=1).")


#: A family of index maps (:func:`_repeat_family_hint`): output head h = input head map(h, G, n_rep), where the
#: right one is h // n_rep; each member names itself and what it swaps.
_HEAD_MAPS = {
    "h // G": (lambda h, G, n_rep: h // G,
               "output head h takes input head h // G, G = num_kv_groups = {G} the number of groups, instead of "
               "h // n_rep, n_rep = {n_rep} the copies of each group"),
    "h % n_rep": (lambda h, G, n_rep: h % n_rep,
                  "output head h takes input head h % n_rep (n_rep = {n_rep}) instead of h // n_rep: the copies of one "
                  "group are counted, not the groups"),
}


def _head_map_outcome(x: torch.Tensor, n_rep: int, rule: Callable) -> torch.Tensor | None:
    """``x`` (b, G, T, D) indexed along the heads by ``rule(h, G, n_rep)`` for h = 0..G * n_rep - 1; ``None``
    where an index reaches past the last head (an IndexError)."""
    G = x.shape[1]
    index = rule(torch.arange(G * n_rep), G, n_rep)
    return None if int(index.max()) >= G or int(index.min()) < 0 else x[:, index]


#: A family of copy counts (:func:`_repeat_count_hint`): each head repeated copies(G, n_rep) times, where the right
#: count is n_rep; each member names what it reads n_rep as.
_COPY_COUNTS = {
    "n_rep // G": (lambda G, n_rep: n_rep // G,
                   "you divide n_rep by the number of key/value heads G (copies = n_rep // G = {copies}), as if "
                   "n_rep were the total number of query heads. n_rep is already the number of copies of EACH "
                   "key/value head (num_heads // num_kv_groups, computed by the caller)"),
}


def _sole_head_rule(members: Iterable[tuple[Callable, str]], calls: Sequence[tuple[Case, object]],
                    outcome: Callable[[torch.Tensor, int, Callable], torch.Tensor | None]) -> tuple[Callable, str] | None:
    """The one ``(rule, words)`` of ``members`` whose ``outcome(x, n_rep, rule)`` (the tensor that rule gives, or
    ``None`` where its index reaches past the last head: an IndexError) is what the student's code gave on every call
    of ``calls``, and differs from the right repeat on some; ``None`` where no member or several do."""
    found = []
    for rule, words in members:
        differs, agrees = False, True
        for other, got in calls:
            ox, orep = other.args
            if not (isinstance(ox, torch.Tensor) and ox.dim() == 4 and isinstance(orep, int) and orep > 0):
                agrees = False
                break
            model = outcome(ox, orep, rule)
            if model is None:
                agrees = isinstance(got, BaseException) and "out of bounds" in str(got)
                differs = True
            else:
                agrees = isinstance(got, torch.Tensor) and got.shape == model.shape \
                    and torch.allclose(got.to(model.dtype), model, atol=1e-6)
                differs = differs or not torch.equal(model, ox.repeat_interleave(orep, dim=1))
            if not agrees:
                break
        if agrees and differs:
            found.append((rule, words))
    return found[0] if len(found) == 1 else None


def _count_outcome(x: torch.Tensor, n_rep: int, rule: Callable) -> torch.Tensor:
    """What ``x.repeat_interleave(count, dim=1)`` gives for the copy count ``rule(G, n_rep)`` of :data:`_COPY_COUNTS`."""
    copies = rule(x.shape[1], n_rep)
    return x.repeat_interleave(copies, dim=1) if copies > 0 else x[:, :0]


def _repeat_count_hint(case: Case, calls: Sequence[tuple[Case, object]]) -> str | None:
    """The member of :data:`_COPY_COUNTS` whose ``x.repeat_interleave(count, dim=1)`` gives what the student's
    code gave on every case, where exactly one does and it differs from n_rep on some case; ``None`` otherwise."""
    member = _sole_head_rule(_COPY_COUNTS.values(), calls, _count_outcome)
    if member is None:
        return None
    rule, words = member
    x, n_rep = case.args
    G = x.shape[1]
    copies = rule(G, n_rep)
    return (f"{words.format(copies=copies)}: that is what your code gives on every case (here G = {G}, n_rep = "
            f"{n_rep}: {G * copies} heads instead of G * n_rep = {G * n_rep}). Repeat each head n_rep times as "
            f"given: x.repeat_interleave(n_rep, dim=1).")


def _repeat_family_hint(case: Case, calls: Sequence[tuple[Case, object]]) -> str | None:
    """The member of :data:`_HEAD_MAPS` that gives what the student's code gave on every case (the same tensor, or
    an IndexError where the member's index reaches past the last head), where exactly one does and it differs from
    the right map on some case; ``None`` otherwise."""
    member = _sole_head_rule(_HEAD_MAPS.values(), calls, _head_map_outcome)
    if member is None:
        return None
    rule, words = member
    x, n_rep = case.args
    G = x.shape[1]
    index = [int(i) for i in rule(torch.arange(G * n_rep), G, n_rep)]
    if max(index) >= G:
        here = f"here its index reaches head {max(index)}, past the last of the G = {G} key/value heads"
    else:
        h = next(h for h, i in enumerate(index) if i != h // n_rep)
        here = f"here output head {h} gets group {index[h]}, not {h} // {n_rep} = {h // n_rep}"
    return (f"{words.format(G=G, n_rep=n_rep)}: that is what your code gives on every case ({here}). Output head h "
            f"is a copy of group h // n_rep: index with torch.arange(G * n_rep) // n_rep, or use "
            f"x.repeat_interleave(n_rep, dim=1).")


def _repeat_cases() -> list[Case]:
    return [
        Case("(2, 2, 5, 3), n_rep=3", (rand(2, 2, 5, 3, seed=811), 3)),
        Case("(1, 4, 3, 2), n_rep=2", (rand(1, 4, 3, 2, seed=812), 2)),
        Case("(2, 3, 4, 5), n_rep=1: nothing to repeat", (rand(2, 3, 4, 5, seed=813), 1)),
    ]


def _repeat_rungs() -> tuple[ladder.Rung, ...]:
    """repeat_kv's ladder (:mod:`course_utils.checks.ladder`): n_rep=1, then copies of one group, several groups,
    then a batch of 2 with T != D."""
    def r(shape: tuple, n_rep: int, seed: int, adds: str, suspects: str) -> ladder.Rung:
        return ladder.Rung(Case(f"{shape}, n_rep={n_rep}", (rand(*shape, seed=seed), n_rep)), adds, suspects)
    return (
        r((1, 1, 2, 2), 1, 814, "", "the shape (b, G * n_rep, T, D) whatever n_rep, the copies "
          "made on the head dimension, dim 1 (x.repeat_interleave(n_rep, dim=1), or x[:, :, None].expand(b, G, "
          "n_rep, T, D).reshape(b, G * n_rep, T, D))?"),
        r((1, 1, 2, 2), 2, 814, "copies (n_rep=2, one group)", "the copies: n_rep of them, along the heads (dim 1), "
          "not the batch, the tokens or head_dim?"),
        r((1, 2, 2, 2), 2, 815, "several groups", "the order of the copies: each group's n_rep copies together "
          "(groups 0, 0, 1, 1: repeat_interleave, or expand then reshape), not tiled (0, 1, 0, 1: x.repeat)?"),
        r((2, 2, 3, 2), 3, 816, "a batch of 2 (and T != D)", "the sizes read from x.shape, (b, G, T, D), and each "
          "head's (T, D) block kept whole (no reshape that mixes the tokens with the heads)?"),
    )


REPEAT_LADDER = ladder.Ladder("repeat_kv", _repeat_rungs,
                              lambda case: _expected.reference("repeat_kv")(case.args[0].clone(), case.args[1]))


def _judge_repeat(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    ladder.record(REPEAT_LADDER)
    calls = [(s.case, outcomes[s.key]) for s in plan if s.run == spec.CALL]
    spec.compare_outcomes("repeat_kv", plan, outcomes,
                          diagnose=lambda case, got, want: _repeat_family_hint(case, calls)
                          or _repeat_count_hint(case, calls)
                          or _repeat_diagnosis(case, got, want),
                          smallest=lambda: ladder.diagnose(REPEAT_LADDER, outcomes))
    return (f"{len(plan)} cases agree: each key/value head repeated n_rep times in a row "
            f"({'; '.join(s.case.name for s in plan)})")


_repeat_all = spec.with_hidden("repeat_kv", _repeat_cases)

check_repeat_kv = spec.declare(spec.Spec("repeat_kv", lambda hidden: spec.calls(_repeat_all(hidden))
                                         + ladder.steps(REPEAT_LADDER, hidden), _judge_repeat,
                                         {ladder.RUN: ladder.call}),
                               """Check ``repeat_kv(x, n_rep)``: ``(b, G, T, D) -> (b, G * n_rep, T, D)``, head ``h`` =
    group ``h // n_rep``.""")


# ------------------------------------------------------------------------------------------
# GroupedQueryAttention
# ------------------------------------------------------------------------------------------
def _gqa_shapes(got: list, want: list, build: tuple) -> str | None:
    d_in, d_out, num_heads, groups = build[0], build[1], build[4], build[5]
    kv = groups * (d_out // num_heads)
    if got.count((d_out, d_in)) == 3 and want.count((kv, d_in)) == 2 and kv != d_out:
        return (f"W_key and W_value have as many heads as W_query: with num_kv_groups={groups} they output only "
                f"num_kv_groups * head_dim = {kv} numbers, nn.Linear(d_in, num_kv_groups * head_dim)")
    return None


_INVALID_VIEW = re.compile(r"shape '\[([\d, -]+)\]' is invalid for input of size (\d+)")


def _gqa_error_hint(causal: Callable) -> Callable:
    """A ``diagnose`` that names a shape error between query heads and key/value heads, then falls back
    on ``causal`` (``probed.not_causal``)."""

    def diagnose(case: Case, got: object, want: object) -> str | None:
        if isinstance(got, BaseException) and case.build is not None:
            text = str(got)
            H, G = case.build[4], case.build[5]
            D = case.build[1] // H
            match = symptoms.BROADCAST_ERROR.search(text)
            sizes = {int(match.group(1)), int(match.group(2))} if match else set()
            if sizes == {H, G}:
                return (f"{H} query heads meet {G} key/value heads: repeat K and V n_rep = num_heads // "
                        f"num_kv_groups = {H // G} times along the HEAD dimension (dim 1 of (b, G, T, D)), "
                        f"repeat_kv(keys, n_rep), before the scores.")
            if sizes == {H, G * G}:
                return (f"the keys have {G * G} heads: they were repeated num_kv_groups = {G} times. Each key/value "
                        f"head is shared by n_rep = num_heads // num_kv_groups = {H // G} query heads: "
                        f"repeat_kv(keys, num_heads // num_kv_groups).")
            view = _INVALID_VIEW.search(text)
            if view:
                dims = [int(v) for v in view.group(1).split(",")]
                if H in dims and D in dims and G != H and int(view.group(2)) % (G * D) == 0:
                    return (f"the keys or values were split into num_heads = {H} heads, but W_key and W_value give "
                            f"only num_kv_groups * head_dim = {G * D} numbers per token: split them into "
                            f"num_kv_groups = {G} heads, view(b, T, num_kv_groups, head_dim).")
            context_length = case.build[2]
            T = case.args[0].shape[1] if case.args and isinstance(case.args[0], torch.Tensor) \
                and case.args[0].dim() == 3 else None
            if T is not None and T != context_length and sizes == {T, context_length}:
                return (f"something of size context_length = {context_length} met the T = {T} tokens of the input: "
                        f"the mask buffer is (context_length, context_length) and the scores (T, T). Cut the mask to "
                        f"the input's length before masked_fill, self.mask[:T, :T].")
            if match or "shape" in text:
                return ("the shapes of the queries and the repeated keys do not match: queries (b, num_heads, T, "
                        "head_dim), keys and values (b, num_kv_groups, T, head_dim) repeated along dim 1 to "
                        "(b, num_heads, T, head_dim). Were K and V repeated on the wrong dimension?")
            return None
        return _heads_mixed(causal)(case, got, want)
    return diagnose


def _heads_mixed(causal: Callable) -> Callable:
    """``causal`` (``probed.not_causal``), its hint followed by the other cause of that symptom in a module with
    heads: a reshape that mixes tokens and heads, which lets the future leak in without any mask being wrong."""
    def diagnose(case: Case, got: object, want: object) -> str | None:
        hint = causal(case, got, want)
        if hint:
            hint += (" If the mask is right, look at the split into heads and the merge back: a view (or reshape) "
                     "straight to (b, heads, T, head_dim) mixes tokens and heads, so the future leaks in through them: "
                     "view(b, T, heads, head_dim), then transpose(1, 2), for the queries, the keys and the values; and "
                     "back, the context (b, heads, T, head_dim).transpose(1, 2) before the reshape to (b, T, d_out).")
        return hint
    return diagnose


def _gqa_configs() -> list[tuple[tuple, list[Case]]]:
    return [
        ((6, 8, 10, 0.0, 4, 2), [Case("4 query heads, 2 key/value groups, T=10", (rand(2, 10, 6, seed=821),)),
                                 Case("T=7 < context_length", (rand(2, 7, 6, seed=822),))]),
        ((6, 8, 10, 0.0, 4, 4), [Case("num_kv_groups == num_heads: multi-head attention", (rand(2, 9, 6, seed=823),))]),
        ((6, 12, 8, 0.0, 6, 1), [Case("num_kv_groups == 1: multi-query attention", (rand(1, 8, 6, seed=824),))]),
    ]


_GQA_DROPOUT_BUILD = (4, 8, 6, 0.5, 4, 2)
_GQA_NOT_DIVIDING = [(8, 8, 6, 0.0, 4, 3), (6, 6, 6, 0.0, 2, 4)]
#: The inputs of :func:`_judge_gqa`'s own probes of the first construction: causality, too long, the moves.
_GQA_INPUTS = {"causal": (2, 6, 6, 825), "dropout": (2, 6, 4, 826), "moves": (2, 5, 6, 827)}


def _same_tokens() -> torch.Tensor:
    """``(2, 6, 6)``: one token repeated at every position, for :func:`_weights_sum`."""
    return rand(1, 1, 6, seed=828).expand(2, 6, 6).contiguous()


def _weights_sum(view: spec.ModuleView, then: Callable,
                 one_head: Callable[[], str | bool | None] = lambda: False) -> Callable:
    """A ``diagnose``: the output on :func:`_same_tokens` first, then ``then``. With every token the same, every
    value row is the same, so each query's output, a weighted average of the values, is that row whatever the
    scores and the mask: outputs that differ between positions mean weights that do not sum to 1 over the keys,
    or, where ``one_head()`` names a configuration of one head and several tokens that is right (its weights sum
    to 1), tokens and heads mixed by the split into heads or the merge back (issue 36, batch H); ``one_head()``
    ``None``: not known (no such run), both causes are said."""
    @symptoms.bonus
    def rows_differ() -> str | None:
        out = view.forward("eval", None, _same_tokens())
        if not (isinstance(out, torch.Tensor) and out.dim() == 3 and out.shape[1] > 1 and torch.isfinite(out).all()):
            return None
        spread = float((out - out[:, :1]).abs().max())
        if spread <= 1e-5 * max(1.0, float(out.abs().max())):
            return None
        right = one_head()
        if right is None:  # no rung ran (the hidden plan): both causes of this symptom stay open
            return ("with one token repeated at every position, every output row must be the same (each query "
                    "averages equal values), but yours differ between positions. Either a query's attention weights "
                    "do not sum to 1 over the keys (the softmax over dim=-1, the mask applied to the scores before it), or "
                    "tokens and heads are mixed in the split into heads or the merge back (the context (b, heads, T, "
                    "head_dim).transpose(1, 2) before the reshape to (b, T, d_out)).")
        if right:
            return ("with one token repeated at every position, every output row must be the same (each query "
                    "averages equal values), but yours differ between positions; with one head and several tokens "
                    f"({right}) your output is right, so there the weights sum to 1 over the keys. So tokens and heads "
                    "are mixed where there are several heads: in the split, view(b, T, heads, head_dim) then "
                    "transpose(1, 2), or in the merge back, the context (b, heads, T, head_dim).transpose(1, 2) "
                    "before the reshape to (b, T, d_out)?")
        return ("with one token repeated at every position, every output row must be the same (each query averages "
                "equal values), but yours differ between positions: a query's attention "
                "weights do not sum to 1 over the keys. Is the softmax taken over the keys, dim=-1 (not the queries, "
                "dim=-2), and is the mask applied to the scores before it (-inf), not to the weights after it?")

    def diagnose(case: Case, got: object, want: object) -> str | None:
        return (None if isinstance(got, BaseException) else rows_differ()) or then(case, got, want)
    return diagnose


def _gqa_plan(exercise: str, hidden: bool) -> list[tuple[tuple, list[_probe.Probe]]]:
    """Every construction and forward pass :func:`_judge_gqa` reads (its diagnoses' included), per
    construction: the probed steps of the plan (:func:`_gqa_steps`)."""
    from course_utils.checks.modules import ProbePlan, causal_probes

    extra = hidden_cases(exercise) if hidden else {"configs": [], "not_dividing": []}
    configs = _gqa_configs() + extra["configs"]
    first = configs[0][0]
    plan = ProbePlan()
    for build, _ in configs:
        plan.add(build)
    plan.add(_GQA_DROPOUT_BUILD)
    for build, cases in configs:  # _forward_runs (no seed of its own), finite_then_values
        plan.add(build, *[_probe.Probe("eval", None, case.args[0]) for case in cases],
                 *[_probe.Probe("eval", 7, case.args[0]) for case in cases])
        plan.compared([(build, cases)], diagnosed_causal=True)
    for build in _GQA_NOT_DIVIDING + extra["not_dividing"]:
        plan.add(build)
    plan.add(first, *causal_probes(rand(*_GQA_INPUTS["causal"][:3], seed=_GQA_INPUTS["causal"][3])),
             _probe.Probe("eval", None, rand(1, first[2] + 1, first[0], seed=77)))  # _check_too_long
    x = rand(*_GQA_INPUTS["dropout"][:3], seed=_GQA_INPUTS["dropout"][3])
    plan.add(_GQA_DROPOUT_BUILD, *[_probe.Probe(mode, seed, x) for mode in ("eval", "train") for seed in (1, 2)])
    x = rand(*_GQA_INPUTS["moves"][:3], seed=_GQA_INPUTS["moves"][3])
    plan.add(first, _probe.Probe("eval", 7, x.to(torch.float64), "float64"),  # check_moves_with_module
             _probe.Probe("eval", 7, x.to("meta"), "meta"))
    plan.add(first, _probe.Probe("eval", None, _same_tokens()))  # _weights_sum's diagnosis
    return plan.items()


def _gqa_rungs() -> tuple[ladder.Rung, ...]:
    """GroupedQueryAttention's ladder (:mod:`course_utils.checks.ladder`): one token and one head first, then T
    == context_length, T < context_length, several heads with num_kv_groups == num_heads, then groups, then a
    batch of 2. Each rung builds the module ``(d_in, d_out, context_length, dropout, num_heads, num_kv_groups)``
    and runs one forward pass in eval() mode (``spec.run_forward``)."""
    def r(build: tuple, shape: tuple, seed: int, adds: str, suspects: str) -> ladder.Rung:
        b, T, _ = shape
        name = (f"x {shape}, {build[4]} head{'s' if build[4] > 1 else ''}, {build[5]} key/value "
                f"group{'s' if build[5] > 1 else ''}, context_length={build[2]}")
        return ladder.Rung(Case(name, (rand(*shape, seed=seed),), build=build, mode="eval"), adds, suspects)
    return (
        r((4, 4, 1, 0.0, 1, 1), (1, 1, 4), 840, "", "the projections "
          "W_query, W_key and W_value (keys and values num_kv_groups * head_dim wide), one query seeing its own key "
          "only (its weight 1, so the output is out_proj of its value), and out_proj at the end?"),
        r((4, 4, 3, 0.0, 1, 1), (1, 3, 4), 841, "several tokens (T = context_length)", "the attention over "
          "several keys: the scores q @ k^T scaled by 1/sqrt(head_dim), the causal mask (-inf where the key is in "
          "the future) before the softmax, the softmax over the keys (dim=-1, not the queries), then weights @ "
          "values?"),
        r((4, 4, 3, 0.0, 1, 1), (1, 2, 4), 841, "T < context_length", "the mask cut to the input's length: "
          "mask[:T, :T] (T read from x), not the whole (context_length, context_length) buffer?"),
        r((4, 8, 3, 0.0, 4, 4), (1, 3, 4), 842, "several heads (num_kv_groups == num_heads)", "the head split "
          "and join: queries, keys AND values each viewed (b, T, heads, head_dim) then transposed to (b, heads, T, "
          "head_dim), the context transposed back before .contiguous().view(b, T, d_out), the scale 1/sqrt(head_dim) "
          "with head_dim = d_out // num_heads (not d_out), and repeat_kv's n_rep = num_heads // num_kv_groups (1 "
          "here)?"),
        r((4, 8, 3, 0.0, 4, 2), (1, 3, 4), 843, "key/value groups (num_kv_groups < num_heads)", "the groups: keys "
          "and values split into num_kv_groups heads, (b, G, T, head_dim), then repeat_kv(..., n_rep = num_heads // "
          "num_kv_groups) on both, along the head dimension (dim 1), so that query head h reads group h // n_rep?"),
        r((4, 8, 3, 0.0, 4, 2), (2, 3, 4), 844, "a batch of 2", "the batch dimension: b read from x.shape and kept "
          "in every view, transpose and matrix product (no dimension that mixes the sequences)?"),
    )


def _one_head_right(outcomes: spec.Outcomes) -> str | bool | None:
    """The name of the ladder's rung of one head and several tokens (T = context_length) when the student's
    output is right there (and on the rung before it); ``False`` where it is not; ``None`` where no rung ran (the
    hidden plan)."""
    if not ladder.ran(GQA_LADDER, outcomes, 2):
        return None
    rung = ladder.right(GQA_LADDER, outcomes, 1)
    return rung.case.name if rung is not None and ladder.right(GQA_LADDER, outcomes, 0) is not None else False


GQA_LADDER = ladder.Ladder(
    "GroupedQueryAttention", _gqa_rungs,
    lambda case: spec.run_forward(_expected.reference("GroupedQueryAttention"), case), runner="forward")


def _gqa_steps(hidden: bool) -> list[spec.Step]:
    """One probed construction per build of :func:`_gqa_plan` (``spec.probe_step``): what the judge reads; then
    the ladder's rungs."""
    return [spec.probe_step(build, [(p.mode, p.seed, p.copy, p.x, p.kwargs) for p in probes])
            for build, probes in _gqa_plan("GroupedQueryAttention", hidden)] + ladder.steps(GQA_LADDER, hidden)


def _judge_gqa(plan: list[spec.Step], outcomes: spec.Outcomes) -> str:
    exercise = "GroupedQueryAttention"
    hidden = outcomes.hidden
    extra = hidden_cases(exercise) if hidden else {"configs": [], "not_dividing": []}
    configs = _gqa_configs() + extra["configs"]
    ladder.record(GQA_LADDER)
    smallest = lambda: ladder.diagnose(GQA_LADDER, outcomes)  # noqa: E731
    views = probed.views(exercise, plan, outcomes)

    def view(build: tuple) -> spec.ModuleView:
        return views[tuple(build)]

    dropout_build = _GQA_DROPOUT_BUILD
    for build in dict.fromkeys([build for build, _ in configs] + [dropout_build]):
        probed.check_shapes(exercise, view(build), build, _gqa_shapes)
    diagnose = _weights_sum(view(configs[0][0]), _gqa_error_hint(probed.not_causal(exercise, views)),
                            lambda: _one_head_right(outcomes))
    for build, cases in configs:
        probed.built(exercise, view(build), build)  # the runs without a seed of their own
        for case in cases:
            try:
                probed.output(exercise, view(build), "eval", None, case.args[0], f"{case.name}, built with {build}")
            except CheckFailed as error:
                hint = diagnose(Case(case.name, case.args, build=build), getattr(error, "student_error", None) or error,
                                None) or smallest()
                if not hint:
                    raise
                hinted = CheckFailed(f"{error} Hint: {hint}")
                hinted.student_error = getattr(error, "student_error", None)
                raise hinted from None
        for case in cases:  # finite, then the values
            _finite(exercise, view(build), case.args[0], f"built with {build}, {case.name}")
        for case in cases:
            mcase = Case(case.name, case.args, case.kwargs, build=build, mode="eval")
            want = reference_output(exercise, mcase)
            if _expected.is_recording():
                mistake_outputs(exercise, mcase)
            spec.judge_forward(exercise, view(build).forward("eval", 7, case.args[0]), want, mcase, diagnose=diagnose,
                               smallest=smallest)
    for build in _GQA_NOT_DIVIDING + extra["not_dividing"]:
        found = view(build).built
        if "error" in found and is_stub_data(*found["error"]):
            raise wire.error_of(*found["error"])
        if "error" not in found:
            fail(exercise, f"GroupedQueryAttention{build} was built without an error, but num_kv_groups={build[5]} "
                           f"does not divide num_heads={build[4]}: the query heads cannot be shared evenly by the "
                           f"groups. Raise a ValueError in __init__ that says so.")
    first = configs[0][0]
    probed.built(exercise, view(first), first)
    b, t, d, seed = _GQA_INPUTS["causal"]
    probed.causal_module(exercise, view(first), rand(b, t, d, seed=seed))
    _too_long_view(exercise, view(first), first)
    b, t, d, seed = _GQA_INPUTS["dropout"]
    probed.built(exercise, view(dropout_build), dropout_build)
    probed.dropout_modes(exercise, view(dropout_build), rand(b, t, d, seed=seed), f"built with {dropout_build}")
    _dropout_on_weights(exercise, view(dropout_build), rand(b, t, d, seed=seed), f"built with {dropout_build}")
    b, t, d, seed = _GQA_INPUTS["moves"]
    probed.moves_with_module(exercise, view(first), first, rand(b, t, d, seed=seed), f"built with {first}")
    return (f"outputs agree for {len(configs)} constructions (grouped, multi-head and multi-query), no "
            f"position sees the future, num_kv_groups that do not divide num_heads raise, and so does an "
            f"input past context_length")


check_GroupedQueryAttention = spec.declare(spec.Spec(
    "GroupedQueryAttention", _gqa_steps, _judge_gqa, runners={spec.MODULE: spec.run_module, "forward": spec.run_forward},
    helpers=lambda: helper_checks(globals(), "GroupedQueryAttention")),
    """Outputs equal the expected ones for the same seed (MHA and MQA as special cases), no position sees
    the future, a clear error when ``num_kv_groups`` does not divide ``num_heads`` and a ValueError past
    ``context_length``. Runs with our ``repeat_kv`` (:func:`modules.alone`): a wrong ``repeat_kv`` costs only
    ``repeat_kv``'s points.""")


# ------------------------------------------------------------------------------------------
# sliding_window_mask and its FlexAttention mask_mod
# ------------------------------------------------------------------------------------------
def _window_diagnosis(case: Case, got: object, want: object) -> str | None:
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor) or got.shape != want.shape:
        return None
    at = _first_wrong_entry(got, want)
    if at is None:
        return None
    T, window = case.args
    i, j = at
    rows, cols = torch.arange(T)[:, None], torch.arange(T)[None, :]
    future, far = cols > rows, rows - cols >= window
    if bool(want.any()) and torch.equal(got.bool(), future & far):
        return ("the mask hides a key only when it is both in the future AND too far back, which never happens: a key "
                "is hidden when it is in the future OR too far back, (j > i) | (i - j >= window).")
    if bool(want[i, j]):
        why = "the future" if j > i else f"{i - j} positions back, and a window of {window} keeps {window} keys: " \
                                          f"the query itself and the {window - 1} before it"
        return f"query {i} must not see key {j} ({why}): entry [{i}, {j}] must be True."
    return (f"query {i} may see key {j} ({i - j} positions back; a window of {window} keeps the query itself and the "
            f"{window - 1} tokens before it): entry [{i}, {j}] must be False.")


def mask_from_mod(mask_mod: Callable, num_tokens: int) -> tuple[torch.Tensor, str]:
    """``(T, T)`` boolean matrix of ``mask_mod(0, 0, q_idx, kv_idx)`` for every pair, and how it was made.

    With FlexAttention (torch >= 2.5) it is ``create_mask``, which calls the ``mask_mod`` under
    ``vmap`` exactly as ``flex_attention`` does; otherwise the ``mask_mod`` is called on broadcast
    index tensors (the same rule, without FlexAttention).
    """
    try:
        from torch.nn.attention.flex_attention import create_mask
    except ImportError:
        q_idx = torch.arange(num_tokens).view(-1, 1)
        kv_idx = torch.arange(num_tokens).view(1, -1)
        out = mask_mod(torch.tensor(0), torch.tensor(0), q_idx, kv_idx)
        return torch.as_tensor(out).expand(num_tokens, num_tokens), "broadcast indices (no FlexAttention here)"
    return create_mask(mask_mod, None, None, num_tokens, num_tokens, device="cpu")[0, 0], "FlexAttention's create_mask"


#: The name of the companion the test cell passes beside ``sliding_window_mask`` (its masks are steps of that plan).
MASK_MOD = "sliding_window_mask_mod"


def _mask_mod_outcome(mask_mod_factory: Callable, case: Case, keep_error: bool = False) -> list:
    """What ``mask_mod_factory(window)``'s ``mask_mod`` gives on case ``(T, window)``, as plain data:
    ``["mask", (T, T) tensor, how it was made]``, ``["not_callable", type name]``, or
    ``["factory_error" | "mod_error", type name, message]`` (with ``keep_error``, the exception too,
    for the traceback a student sees in JupyterLab). Under the grader the kernel hands this out
    (a step of the plan) and the verdict is computed outside on it."""
    T, window = case.args

    def error(kind: str, exc: Exception) -> list:
        try:
            text = str(exc)
        except Exception:  # noqa: BLE001 - an exception whose __str__ fails
            text = ""
        return [kind, type(exc).__name__, text[:_probe.MAX_MESSAGE]] + ([exc] if keep_error else [])

    try:
        mask_mod = mask_mod_factory(window)
    except Exception as exc:  # noqa: BLE001 - any error in student code is an outcome
        return error("factory_error", exc)
    if not callable(mask_mod):
        return ["not_callable", type(mask_mod).__name__]
    try:
        got, how = mask_from_mod(mask_mod, T)
    except Exception as exc:  # noqa: BLE001
        return error("mod_error", exc)
    return ["mask", got, how]


def _mask_mod_run(mask_mod_factory: Callable | None, case: Case) -> list:
    """The runner of a mask_mod step: :func:`_mask_mod_outcome`, or ``["absent", type name]`` when the check
    was given no ``sliding_window_mask_mod`` (``None``) or something that cannot be called."""
    if mask_mod_factory is None or not callable(mask_mod_factory):
        return ["absent", type(mask_mod_factory).__name__]
    return _mask_mod_outcome(mask_mod_factory, case)


def _mod_of(student: object) -> Callable | None:
    """The ``sliding_window_mask_mod`` defined beside ``student`` (in its module or notebook), if any: the
    companion the unbound spec runs (``checks.SPECS``' plan-covers-judge test); a check call names its own."""
    found = getattr(student, "__globals__", {}).get(MASK_MOD)
    return found if callable(found) else None


def _valid_outcome(outcome: object, T: int) -> bool:
    """Whether a (handed out, so untrusted) outcome of :func:`_mask_mod_outcome` is one it can give."""
    if not isinstance(outcome, list) or not outcome or not isinstance(outcome[0], str):
        return False
    kind, rest = outcome[0], outcome[1:]
    if kind == "mask":
        return len(rest) == 2 and isinstance(rest[0], torch.Tensor) and tuple(rest[0].shape) == (T, T) \
            and isinstance(rest[1], str)
    if kind == "not_callable":
        return len(rest) == 1 and isinstance(rest[0], str)
    if kind in ("factory_error", "mod_error"):
        return len(rest) == 2 and isinstance(rest[0], str) and isinstance(rest[1], str)
    return False


def _check_mask_mod(exercise: str, mask_mod_factory: object, steps: Sequence[spec.Step],
                    outcomes: spec.Outcomes) -> str:
    """Each case's ``mask_mod`` must keep exactly what ``sliding_window_mask`` hides not (``steps``: the
    plan's mask_mod steps; ``mask_mod_factory``: the student's, or the grader's stand-in, read for its source)."""
    require_callable(exercise, mask_mod_factory)
    if is_stub_source(rules.source_of(mask_mod_factory) or ""):
        fail(exercise, "sliding_window_mask agrees with ours, but sliding_window_mask_mod is " + NOT_IMPLEMENTED)
    check_rules(exercise, mask_mod_factory)
    how = ""
    for step in steps:
        case = step.case
        T, window = case.args
        hidden_entries = expect(exercise, case.key(), lambda: _expected.reference(exercise)(T, window))
        outcome = outcomes[step.key]
        if not _valid_outcome(outcome, T):
            spec.refuse(MASK_MOD, f"mask_mod on case '{case.name}'")
        kind = outcome[0]
        if kind == "factory_error":
            if is_stub_data(outcome[1], outcome[2]):
                fail(exercise, NOT_IMPLEMENTED)
            said = outcome[2].strip()
            said += "" if said.endswith((".", "!", "?")) or not said else "."
            try:
                fail(exercise, f"your code raised {outcome[1]}: {said}", Case(f"{MASK_MOD}({window})", (window,)))
            except CheckFailed as error:
                error.student_error = wire.error_of(outcome[1], outcome[2])
                raise
        if kind == "not_callable":
            fail(exercise, f"{MASK_MOD}({window}) returned {outcome[1]}; it must return a "
                           f"function mask_mod(b, h, q_idx, kv_idx).")
        if kind == "mod_error":
            if is_stub_data(outcome[1], outcome[2]):
                fail(exercise, NOT_IMPLEMENTED)
            text = outcome[2]
            hint = ""
            if "data-dependent control flow" in text or "ambiguous" in text:
                hint = (" q_idx and kv_idx are tensors: combine conditions with & and |, not Python's `and`, `or` "
                        "or `if`.")
            error = CheckFailed(f"❌ {exercise} on case '{case.name}': your mask_mod raised {outcome[1]}: "
                                f"{text.splitlines()[0] if text else ''}.{hint}")
            error.student_error = wire.error_of(outcome[1], text)
            raise error from error.student_error
        got, how = outcome[1], outcome[2]
        allowed = ~hidden_entries
        if got.dtype != torch.bool:
            fail(exercise, f"your mask_mod returns dtype {got.dtype}; it must return a boolean tensor.", case)
        if torch.equal(got, allowed):
            continue
        if torch.equal(got, hidden_entries):
            fail(exercise, "your mask_mod returns True where a key is HIDDEN. FlexAttention's convention is the "
                           "opposite of sliding_window_mask's: a mask_mod returns True where the query MAY attend.",
                 case)
        i, j = _first_wrong_entry(got, allowed)
        fail(exercise, f"mask_mod(b, h, q_idx={i}, kv_idx={j}) is {bool(got[i, j])}, expected {bool(allowed[i, j])}: "
                       f"{'query %d may see key %d' % (i, j) if allowed[i, j] else 'query %d must not see key %d' % (i, j)}"
                       f" (a mask_mod returns True where the query MAY attend; window={window}). The mask_mod and "
                       f"sliding_window_mask must state the same rule.", case)
    return how


#: The prefix of the keys of ``sliding_window_mask``'s plan that run the companion's ``mask_mod``.
MOD_STEP = "mask_mod: "
_NO_MOD = object()  # the unbound spec's judge: the companion is the one defined beside the student's function


def _window_cases() -> list[Case]:
    return [Case(f"num_tokens={T}, window={w}", (T, w)) for T, w in ((6, 2), (7, 3), (5, 1), (4, 4))]


_window_all = spec.with_hidden("sliding_window_mask", _window_cases)


def _window_rungs() -> tuple[ladder.Rung, ...]:
    """sliding_window_mask's ladder (:mod:`course_utils.checks.ladder`): a window that hides nothing of the past
    first (window >= T: the causal mask), then smaller ones."""
    def r(T: int, w: int, adds: str, suspects: str) -> ladder.Rung:
        return ladder.Rung(Case(f"num_tokens={T}, window={w}", (T, w)), adds, suspects)
    return (
        r(3, 3, "", "the causal part, all a window >= T leaves: True where key j is in query i's future (j > i), a "
          "bool (T, T) mask, and the distance measured from the query back to the key, i - j (not j - i)?"),
        r(5, 2, "a window smaller than the sequence", "the window's far edge: query i keeps its window keys i - "
          "window + 1 .. i (itself included), so key j is hidden where i - j >= window (>=, not >; i - j, not j - "
          "i)?"),
        r(4, 1, "window=1", "the smallest window: each query keeps only its own key, the diagonal (i - j >= 1 "
          "hides every earlier key)?"),
    )


WINDOW_LADDER = ladder.Ladder("sliding_window_mask", _window_rungs,
                              lambda case: _expected.reference("sliding_window_mask")(*case.args))


def _window_plan(hidden: bool) -> list[spec.Step]:
    """The mask's calls, its call that must raise, and each case's mask made from the companion's ``mask_mod``
    (always planned: its runner says ``"absent"`` where the test cell gave none)."""
    cases = _window_all(hidden)
    return spec.calls(cases) + spec.calls([Case("num_tokens=4, window=0", (4, 0))], MUST_RAISE) + \
        [spec.Step(f"{MOD_STEP}{case.key()}", case, "mask_mod") for case in cases] + ladder.steps(WINDOW_LADDER, hidden)


def _judge_window(plan: list[spec.Step], outcomes: spec.Outcomes, mod: object = _NO_MOD) -> str:
    """``mod``: the test cell's ``sliding_window_mask_mod`` (the grader's stand-in for it, outside), ``None``
    where it gave none."""
    exercise = "sliding_window_mask"
    ladder.record(WINDOW_LADDER)
    mods = [s for s in plan if s.run == "mask_mod"]
    compared, raising = _split([s for s in plan if s.run != "mask_mod"])
    spec.compare_outcomes(exercise, compared, outcomes, diagnose=_window_diagnosis,
                          smallest=_mask_ladder(WINDOW_LADDER, compared, outcomes))
    _bool_masks(exercise, compared, outcomes)
    if any(_returned(outcomes[step.key]) for step in raising):
        fail(exercise, "sliding_window_mask(4, 0) returned a mask: with window=0 a token could not even see itself "
                       "(every row of scores -inf, NaN weights). Raise a ValueError when window < 1.")
    if mod is _NO_MOD:
        mod = _mod_of(outcomes.student)
    absent = [o[1] for o in (outcomes[s.key] for s in mods)
              if isinstance(o, list) and len(o) == 2 and o[0] == "absent" and isinstance(o[1], str)]
    if absent:
        if len(absent) != len(mods) or len(set(absent)) != 1:
            spec.refuse(MASK_MOD, "mask_mod (absent for some cases only)")
        if mod is not None:  # the grader's stand-in: what the kernel was given cannot be called
            mod = type(absent[0], (), {})()
    how = _check_mask_mod(exercise, mod, mods, outcomes) if mod is not None else ""
    return (f"{len(compared)} cases give a boolean mask, True outside the causal window "
            f"({'; '.join(s.case.name for s in compared)})"
            + (f"; the mask_mod keeps exactly the other entries (made by {how})" if mod is not None else ""))


_WINDOW_SPEC = spec.Spec("sliding_window_mask", _window_plan, _judge_window,
                         runners={"mask_mod": lambda student, case: _mask_mod_run(_mod_of(student), case),
                                  ladder.RUN: ladder.call})


@check
def check_sliding_window_mask(sliding_window_mask: Callable, sliding_window_mask_mod: Callable | None = None,
                              hidden: bool = False) -> None:
    """Check ``sliding_window_mask(num_tokens, window)`` (bool ``(T, T)``, True = hidden) and, when given,
    ``sliding_window_mask_mod(window)``, whose ``mask_mod`` must keep exactly the other entries.

    One spec (``check_sliding_window_mask.spec``): the companion's masks are steps of the exercise's plan,
    run by a runner bound here to the companion the test cell gives."""
    mod = sliding_window_mask_mod
    bound = dataclasses.replace(_WINDOW_SPEC, judge=functools.partial(_judge_window, mod=mod),
                                runners={"mask_mod": lambda student, case: _mask_mod_run(mod, case),
                                         ladder.RUN: ladder.call})
    bound.check(sliding_window_mask, hidden)


check_sliding_window_mask.spec = _WINDOW_SPEC  # type: ignore[attr-defined]
