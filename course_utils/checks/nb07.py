"""Self-checks for notebook 07: FlashAttention from scratch.

Besides comparing outputs with the expected ones, these checks watch how the answer computes
(:mod:`course_utils.checks.tensors`): an online softmax must reduce one block at a time, never a
whole row; a tiled attention must never make a ``(T, T)`` tensor (the check names the line that
did), and a causal one must skip the key blocks wholly in the future instead of computing and
masking them (the check counts the score entries computed). Known mistakes (the rescaling
forgotten, the diagonal block not masked, a log-sum-exp without the maximum) are named by their
outputs; every expected value comes from :func:`expect`, so the student edition holds no answer.

Each check is a spec (:mod:`course_utils.checks.spec`): its plan lists every run of the student's code,
keyed (each case called; each watched run of the tensor watcher, :class:`TensorWatcher`, whose runner hands
out plain data: the whole row reduced, or the first ``(T, T)`` tensor made and the score entries computed;
each launch of the Triton kernel, ``[(out, lse), where it ran]``), and its judge builds every message from
those outcomes, in the kernel or, under the grader, outside it. A runner's outcome of the wrong form is
refused there (``spec.refuse``: the grader's ``HandOffError``).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import torch

from course_utils import flash
from course_utils.checks import core, ladder, symptoms, wire
from course_utils.checks import expected as _expected
from course_utils.checks.core import (
    Case,
    CheckFailed,
    _clone,
    _hinted,
    _sentence,
    expect,
    fail,
    family_outputs,
    mistake_outputs,
    rand,
    record_families,
    shape_error_hint,
    tensor_difference,
    transformation_hint,
)
from course_utils.checks.nb02 import softmax_hint
from course_utils.checks.spec import CALL, Outcomes, Spec, Step, declare, expected_output, judge_case, raised, refuse, \
    with_hidden
from course_utils.checks.tensors import Made, TensorWatcher
from course_utils.data import book_inputs

__all__ = ["check_online_softmax", "check_flash_attention_forward", "check_flash_attention_triton",
           "full_matrix_problem", "skipped_blocks_problem", "short_block_hint"]

_INF = float("-inf")
ONLINE = "online_softmax"


# ------------------------------------------------------------------------------------------
# online_softmax
# ------------------------------------------------------------------------------------------
_NO_KEEPDIM = ("m and l must keep their last dimension, shape (..., 1), one number per row: reduce a block over its "
               "LAST dimension and keep it. A reduction without keepdim=True gives (...,), and one over another "
               "dimension (dim=0: across the rows) gives (1, block_size); either broadcasts against the wrong "
               "dimension of a block (..., block_size). Use amax(dim=-1, keepdim=True) and sum(dim=-1, keepdim=True), "
               "or index m[..., None].")


def _online_diagnose(case: Case, got: object, want: object) -> str | None:
    """NaN where a row's first block is all ``-inf`` (the rescaling factor was ``exp(-inf - -inf)``);
    statistics that lost their last dimension; else the softmax symptoms of notebook 02, worded for a
    function that works along the last dimension (it has no ``dim`` argument)."""
    x, block = case.args[0], case.args[1]
    if isinstance(got, BaseException):
        found = symptoms.broadcast_sizes(got)
        if found and found[2] is not None and x.dim() >= 2 and 0 <= found[2] < x.dim() - 1 \
                and {found[0], found[1]} == {x.shape[found[2]], block}:
            return (f"a block of {block} meets the {x.shape[found[2]]} rows along dimension "
                    f"{found[2]}: a block sliced along the first dimension (x[start:start + block_size], "
                    f"rows) instead of the last one: x[..., start:start + block_size], the columns.")
        return _NO_KEEPDIM if shape_error_hint(got) and "must match the size" in str(got) else None
    if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and x.dim() == 1 and got.dim() == 2 \
            and got.shape == (x.shape[0], x.shape[0]) and want.shape == x.shape \
            and torch.allclose(got.detach().double(), want.detach().double().expand(got.shape), atol=1e-5, rtol=1e-4):
        n = x.shape[0]
        return (f"for this 1-D x of {n} columns your output is {tuple(got.shape)}: {n} copies of the right softmax. m "
                f"and l were made with x.shape[0] = {n} rows, shape ({n}, 1), as if x were always a matrix; for a 1-D x "
                f"x.shape[0] counts the columns, and ({n}, 1) broadcasts against the row. Shape them from the end, "
                f"x.shape[:-1] + (1,) ((1,) here), one number per row whatever the leading dimensions.")
    streamed = _columns_streamed(x, block, got)
    if streamed is not None:
        n = x.shape[-1]
        return (f"m and l hold the statistics of columns 0..{streamed - 1} only, not of all {n}: the loop over "
                f"blocks stops early, so the columns from {streamed} on never reach m and l (and exp(x - m) / l of "
                f"those columns can exceed 1, even overflow). Stream every column: for start in range(0, n, "
                f"block_size) with n = x.shape[-1], the number of columns (not x.shape[0], the rows).")
    stepped = _blocks_stepped(x, block, got)
    if stepped is not None:
        first, step, length, counts = stepped
        said = _counted(counts)
        if first == 0 and length == block:
            if step < block:
                return (f"l counts each column once per block that holds it ({said}; block_size={block}): the "
                        f"blocks overlap, as they do when the loop over blocks steps by {step} instead of block_size. "
                        f"Step by the block size, for start in range(0, n, block_size), so that each column is in "
                        f"exactly one block.")
            return (f"m and l leave columns out ({said}; block_size={block}): the blocks leave gaps, as they do when "
                    f"the loop over blocks steps by {step} instead of block_size. Step by the block size, for start in "
                    f"range(0, n, block_size), so that each column is in exactly one block.")
        n = x.shape[-1]
        last = (n - 1) // block * block
        if counts == [0] * last + [1] * (n - last):  # what l overwritten by each block's sum gives too
            return (f"l sums only the last block's columns {last}..{n - 1} (block_size={block}; columns "
                    f"0..{last - 1} never): the earlier blocks are lost. Either the loop skips them (it must start at "
                    f"0: range(0, n, block_size)), or l is overwritten by each block's sum instead of rescaled and "
                    f"added to: l = l * exp(m - m_new) + exp(block - m_new).sum(...).")
        seen = []
        if first != 0:
            seen.append(f"the first block starts at column {first}, not 0 (range({first}, n, ...))")
        if length != block:
            sign = "+" if length > block else "-"
            seen.append(f"each block holds {length} columns, not block_size = {block} (x[..., start:start + "
                        f"block_size {sign} {abs(length - block)}])")
        if step != block:
            seen.append(f"the loop steps by {step}")
        return (f"m and l count {said} (block_size={block}): each column must be counted exactly once. That is what "
                f"blocks give where {' and '.join(seen)}. Use for start in range(0, n, block_size) and the block "
                f"x[..., start:start + block_size], so that each column is in exactly one block.")
    if isinstance(got, torch.Tensor) and got.shape == x.shape and got.is_floating_point() and got.numel() \
            and bool(torch.isfinite(x).all()) and isinstance(want, torch.Tensor):
        g, w, xd = got.detach().double(), want.detach().double(), x.detach().double()
        if bool((g == 0).all()) and bool((w != 0).any()):
            return ("every entry is 0: the sum l is inf (or the exponentials vanish). Is each block's exp taken "
                    "against the same shift that l is rescaled to, the new maximum m_new (exp(block - m_new))? Against "
                    "the old maximum m, still -inf at the first block, exp(block - m) is inf.")
        if torch.allclose(g, w * torch.exp(xd.amax(-1, keepdim=True)), atol=1e-5, rtol=1e-4) \
                and not torch.allclose(g, w, atol=1e-5, rtol=1e-4):
            return ("each row is the right one times exp(m), its maximum: the final exponentials are not shifted. l "
                    "holds the sum of exp(x - m), so return exp(x - m) / l, not exp(x) / l.")
    if isinstance(got, torch.Tensor) and got.shape == x.shape and got.is_floating_point():
        first = x[..., :block]
        lost = torch.isnan(got).any(dim=-1) & ~torch.isnan(want).any(dim=-1) & torch.isinf(first).all(dim=-1) \
            & (first < 0).all(dim=-1)
        if bool(lost.any()):
            return ("a row whose first block is all -inf gives NaN: while the running maximum is still -inf, "
                    "m - m_new is -inf - (-inf) = NaN. Shift by 0 instead of by m_new while m_new is -inf "
                    "(torch.where), so that exp(m - shift) is exp(-inf) = 0.")
    if isinstance(got, torch.Tensor) and got.shape == x.shape and got.is_floating_point() and got.numel() \
            and bool((got == float("inf")).all()) and bool(torch.isfinite(x).all()):
        return ("every entry is inf: exp(x - m) with m still -inf. The running maximum is never updated: set "
                "m = m_new after each block, so that the final exp(x - m) / l uses the row's maximum.")
    if isinstance(got, torch.Tensor) and got.shape == x.shape and x.dim() >= 2 and torch.isfinite(got).all():
        g = got.detach().double()
        last = g.sum(dim=-1)
        if not torch.allclose(last, torch.ones_like(last), atol=1e-4):
            for other in range(x.dim() - 1):
                sums = g.sum(dim=other)
                if torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
                    return f"your weights sum to 1 along dim={other}, not along the last dimension. {_NO_KEEPDIM}"
    hint = softmax_hint(x, -1, got)
    if (hint is None or "yours sum to" in hint) and _wrong_l(x, got, want):
        return ("each row has the right proportions but does not sum to 1: it was divided by a wrong l. l must be "
                "the sum of exp(x - m) for the final maximum m: when a block raises the maximum, rescale l by "
                "exp(m - m_new) before adding exp(block - m_new); and on the first block, where m is still -inf, "
                "shift by m_new itself (the guard tests m_new, not m).")
    if hint and "dim" in hint:  # notebook 02's words speak of a `dim` argument, which online_softmax has not
        hint = (hint.replace("along `dim`", "along the last dimension").replace("over `dim`", "over the last dimension")
                .replace(" (the `dim` argument)", ""))
    return hint


_CARRY_WORDS = {
    "whole_row": ("l adds the sum of exp over the WHOLE row at every block (exp(x - m_new).sum(...), x instead of the "
                  "block), so l counts every column once per block ({blocks} blocks here: each row sums to 1/{blocks}). "
                  "Add only the new block's columns: l = l * exp(m - m_new) + exp(block - m_new).sum(dim=-1, "
                  "keepdim=True)."),
    "alpha_on_block": ("the rescaling factor exp(m - m_new) multiplies the new block's sum instead of l: l = l + "
                       "exp(m - m_new) * exp(block - m_new).sum(...) leaves the old sum unrescaled, and on the first "
                       "block (m = -inf) the factor is 0, so the first block is lost. Rescale the running sum, then "
                       "add the block: l = l * exp(m - m_new) + exp(block - m_new).sum(dim=-1, keepdim=True)."),
    "m_from_zero": ("the running maximum m starts at 0 instead of -inf, so it never drops below 0: a row whose scores "
                    "are all far below 0 (here around -1000) is shifted by 0, every exp(x - 0) underflows to 0, and "
                    "exp(x - m) / l is 0/0 = NaN. Start m at -inf, torch.full(x.shape[:-1] + (1,), float(\"-inf\")), "
                    "so that the first block's maximum replaces it."),
    "inf_zeroed": ("the -inf scores (masked entries) are replaced by 0: each then adds exp(0 - m) to l (and can raise "
                   "the maximum to 0), so the rows that hold -inf are divided by too large a sum. A masked score must "
                   "stay -inf: exp(-inf - shift) = 0 is its right contribution. The trap is only in the shift: "
                   "subtract 0 instead of m_new while m_new is -inf (torch.where on m_new, not on the scores)."),
    "block_max": ("the new block's terms are taken against the block's own maximum, exp(block - block.amax(...)), "
                  "instead of against the new running maximum: whenever the running maximum is larger than the "
                  "block's, they come out too large, and l with them. Take them against the same shift that l is "
                  "rescaled to: l = l * exp(m - m_new) + exp(block - m_new).sum(dim=-1, keepdim=True)."),
    "sum_no_keepdim": ("each block's sum is taken without keepdim, exp(block - m_new).sum(dim=-1): a (rows,) vector, "
                       "which broadcasts against l's (rows, 1) into a (rows, rows) table, so each row's l mixes in "
                       "the other rows' sums. Keep the dimension: l = l * exp(m - m_new) + exp(block - m_new).sum("
                       "dim=-1, keepdim=True)."),
}
#: Members of :func:`_carry_models` said with another member's words (the same mistake, with or without a guard).
_CARRY_ALIASES = {"inf_zeroed_all": "inf_zeroed", "block_max_unguarded": "block_max"}


def _same_model(model: torch.Tensor, got: object) -> bool:
    """Whether ``got`` is ``model``: the same shape, NaN and inf in the same places, the rest within 1e-5."""
    if not (isinstance(got, torch.Tensor) and got.is_floating_point() and got.shape == model.shape):
        return False
    model, g = model.double(), got.detach().double()
    nan = torch.isnan(model)
    return torch.equal(nan, torch.isnan(g)) and _same_softmax(torch.where(nan, 0.0, model), torch.where(nan, 0.0, g))


def _carry_family_hint(case: Case, got: object, calls: list[tuple[Case, object]]) -> str | None:
    """The member of the family ``"online"`` (one carry-over step of the streamed softmax changed, modelled in
    ``course_utils.instructor.nb07``; its outputs on the visible cases recorded, :func:`family_outputs`) that gives
    what the student's code gave on this case and on every other case it returned a tensor of the right shape for,
    where exactly one member does (``overwritten``, the words of :func:`_online_diagnose`, is only there to leave a
    case it explains too undecided); ``None`` otherwise."""
    x, block = case.args[0], case.args[1]
    if not (isinstance(x, torch.Tensor) and x.dim() >= 1 and isinstance(block, int) and block > 0
            and isinstance(got, torch.Tensor) and got.shape == x.shape and got.is_floating_point()):
        return None
    found = [name for name, model in family_outputs(ONLINE, case, "online") if _same_model(model, got)]
    for other, outcome in calls:
        if len({_CARRY_ALIASES.get(name, name) for name in found}) < 2:
            break
        ox, oblock = other.args[0], other.args[1]
        if other is case or not isinstance(ox, torch.Tensor) or not isinstance(oblock, int) or oblock <= 0 \
                or not isinstance(outcome, torch.Tensor) or outcome.shape != ox.shape:
            continue
        models = dict(family_outputs(ONLINE, other, "online"))
        found = [name for name in found if name in models and _same_model(models[name], outcome)]
    said = {_CARRY_ALIASES.get(name, name) for name in found}
    if len(said) != 1 or next(iter(said)) not in _CARRY_WORDS:
        return None
    return _CARRY_WORDS[next(iter(said))].format(blocks=-(-x.shape[-1] // block))


@symptoms.bonus
def _columns_streamed(x: torch.Tensor, block: int, got: object) -> int | None:
    """``c`` where ``got`` is exp(x - m) / l with m and l the statistics of the first ``c`` columns of ``x`` only (a
    whole number of blocks, fewer than all ``n``): a loop over blocks that stops early. ``None`` otherwise."""
    if not _streamable(x, block, got):
        return None
    g, xd, n = got.detach().double(), x.detach().double(), x.shape[-1]
    for c in range(block, n, block):
        m = xd[..., :c].amax(-1, keepdim=True)  # (..., 1)
        model = torch.exp(xd - m) / torch.exp(xd[..., :c] - m).sum(-1, keepdim=True)  # (..., n)
        if _same_softmax(model, g):
            return c
    return None


def _streamable(x: torch.Tensor, block: object, got: object) -> bool:
    """Whether ``got`` can be modelled as a streamed softmax of the finite ``x`` (``(..., n)``) in blocks of ``block``
    columns, fewer than ``n``: a float tensor of ``x``'s shape."""
    return (isinstance(got, torch.Tensor) and got.shape == x.shape and got.is_floating_point() and x.dim() >= 1
            and isinstance(block, int) and 0 < block < x.shape[-1] and bool(torch.isfinite(x).all()))


def _same_softmax(model: torch.Tensor, got: torch.Tensor) -> bool:
    """Whether ``got`` is ``model`` (both ``(..., n)``, float64): inf in the same places, the rest within 1e-5."""
    inf = torch.isinf(model)
    return torch.equal(inf, torch.isinf(got)) and torch.allclose(
        torch.where(inf, 0.0, model), torch.where(torch.isinf(got), 0.0, got), atol=1e-5, rtol=1e-4)


@symptoms.bonus
def _blocks_stepped(x: torch.Tensor, block: int, got: object) -> tuple[int, int, int, list[int]] | None:
    """``(first, step, length, counts)`` where ``got`` is exp(x - m) / l with m and l streamed from blocks of
    ``length`` columns that start at ``first`` and then every ``step`` columns, not each column exactly once (blocks
    that overlap, leave gaps, or skip the first ones); ``counts[j]`` the number of blocks that hold column ``j``: l
    sums column ``j`` that many times, and m is the largest column counted. The loops tried first are those of the
    right block size from column 0 (a wrong step); then a first block that is not at 0, a block one column too long
    or too short. ``None`` otherwise."""
    if not _streamable(x, block, got):
        return None
    g, xd, n = got.detach().double(), x.detach().double(), x.shape[-1]
    columns = torch.arange(n)
    loops = [(0, s, block) for s in range(1, min(2 * block, n - 1) + 1) if s != block]
    loops += [(f, s, length) for length in (block, block + 1, block - 1) for f in range(0, min(2 * block, n - 1) + 1)
              for s in (block, block + 1, block - 1) if (f, s, length) != (0, block, block) and length > 0 and s > 0
              and (f, s, length) not in loops]
    for first, step, length in loops:
        starts = torch.arange(first, n, step)
        counts = ((columns[None, :] >= starts[:, None]) & (columns[None, :] < starts[:, None] + length)).sum(0)  # (n,)
        if bool((counts == 1).all()) or not bool((counts > 0).any()):
            continue
        m = xd.masked_fill(counts == 0, float("-inf")).amax(-1, keepdim=True)  # (..., 1)
        model = torch.exp(xd - m) / (counts * torch.exp(xd - m)).sum(-1, keepdim=True)  # (..., n)
        if _same_softmax(model, g):
            return first, step, length, [int(c) for c in counts]
    return None


def _counted(counts: list[int]) -> str:
    """``[1, 2, 2, 0]`` as "column 0 once, columns 1..2 twice, column 3 never"."""
    times = {0: "never", 1: "once", 2: "twice"}
    parts, start = [], 0
    for j in range(1, len(counts) + 1):
        if j == len(counts) or counts[j] != counts[start]:
            which = f"column {start}" if j - 1 == start else f"columns {start}..{j - 1}"
            parts.append(f"{which} {times.get(counts[start], f'{counts[start]} times')}")
            start = j
    return ", ".join(parts)


@symptoms.bonus
def _wrong_l(x: torch.Tensor, got: object, want: object) -> bool:
    """Whether every row of ``got`` is the right one times a factor (not 1), and not exp(x - max) undivided: the
    right exponentials divided by a wrong sum l."""
    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.shape == want.shape == x.shape
            and got.is_floating_point() and got.numel() and bool(torch.isfinite(got).all())):
        return False
    g, w, xd = got.detach().double(), want.detach().double(), x.detach().double()
    factor = g.sum(-1, keepdim=True)  # a row that is the right one times a factor sums to that factor
    unit = torch.exp(xd - xd.amax(-1, keepdim=True))  # exp(x - max), not divided at all
    return bool((w > 0).all()) and torch.allclose(g, w * factor, atol=1e-6, rtol=1e-5) \
        and not torch.allclose(factor, torch.ones_like(factor), atol=1e-4) \
        and not torch.allclose(g, unit, atol=1e-6, rtol=1e-5)


def _whole_row(watcher: TensorWatcher, block_size: int) -> list | None:
    """The first reduction of a whole row (longer than a block) along the last dimension, as plain
    data: ``[op, columns, where]`` (``where``: the line of the student's code, or ``""``); ``None``."""
    whole = next((r for r in watcher.reductions if r.reduces_last_dim_longer_than(block_size)), None)
    if whole is None:
        return None
    return [str(whole.op), int(whole.in_shape[-1]), str(whole.line) if whole.line else ""]


def _streaming_text(whole: list | None, block_size: int) -> str | None:
    """The message for a whole row reduced (:func:`_whole_row`), or ``None``."""
    if whole is None:
        return None
    op, columns, line = whole
    where = f" at {line}" if line else ""
    return (f"your code reduced a whole row of {columns} columns at once{where} ({op}), but the "
            f"blocks have only {block_size}. An online softmax never sees a whole row: keep a running maximum m "
            f"and sum l, update them from one block x[..., start:start + block_size] at a time, and rescale l by "
            f"exp(m_old - m_new) when the maximum grows.")


#: The block size of the streaming case (3, 12), block_size=4.
_STREAMING_BLOCK = 4


def _streaming_run(student: Callable, case: Case) -> list | None:
    """The runner of the streaming step: ``student`` on ``case`` under a :class:`TensorWatcher`,
    :func:`_whole_row` of what it did. Raises what the student's code raised."""
    watcher = TensorWatcher(memory=False)  # what was made, multiplied, reduced: no byte counts
    with torch.no_grad(), watcher:
        student(*_clone(case.args), **case.kwargs)
    return _whole_row(watcher, case.args[1])


def _short_text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= wire.MAX_MESSAGE


def outcome_of(exercise: str, outcomes: Outcomes, step: Step) -> Any:
    """The outcome of ``step``, a runner's: its value, or the failure of the student's code it raised
    (``spec.raised``: the words a call that raised gets)."""
    found = outcomes[step.key]
    if isinstance(found, BaseException):
        raise raised(exercise, found, step.case)
    return found


def _streaming_of(exercise: str, outcomes: Outcomes, step: Step) -> list | None:
    """The streaming step's outcome (:func:`_streaming_run`), refused (``spec.refuse``) unless it is ``None``
    or ``[op, columns, where]`` with a whole row longer than a block."""
    whole = outcome_of(exercise, outcomes, step)
    if whole is not None and not (isinstance(whole, (list, tuple)) and len(whole) == 3 and _short_text(whole[0])
                                  and type(whole[1]) is int and step.case.args[1] < whole[1] < 2**31
                                  and _short_text(whole[2])):
        refuse(exercise, "tensor watcher (None or [operation, columns, line] of a whole row)")
    return whole


def _online_cases() -> list[Case]:
    scores = book_inputs() @ book_inputs()[1]  # (6,): the book's scores of 'journey'
    return [
        Case("book: scores of 'journey' (6,), block_size=4", (scores, 4)),
        Case("book: score table (6, 6), block_size=2", (book_inputs() @ book_inputs().T, 2)),
        Case("large scores (2, 5) in the 1000s, block_size=2",
             (torch.tensor([[1000.0, 1001.0, 1002.0, 999.0, 1003.0], [3.0, 1.0, 1000.0, -1000.0, 2.0]]), 2)),
        Case("(2, 5) whose first block is all -inf, block_size=2",
             (torch.tensor([[_INF, _INF, 1.0, 2.0, 3.0], [0.5, _INF, 2.0, _INF, -1.0]]), 2)),
        Case("batch (2, 3, 7), block_size=3", (rand(2, 3, 7, seed=71, low=-4, high=4), 3)),
        Case("very negative scores (2, 4): a row all around -1000, block_size=2",
             (torch.tensor([[-1000.0, -1002.0, -999.0, -1001.0], [-998.0, 1000.0, -1001.0, 999.0]]), 2)),
    ]


def _streaming_case() -> Case:
    return Case("streaming: (3, 12), block_size=4", (rand(3, 12, seed=72, low=-3, high=3), _STREAMING_BLOCK))


def _online_rungs() -> tuple[ladder.Rung, ...]:
    """online_softmax's ladder (:mod:`course_utils.checks.ladder`): one block, then one feature at a time."""
    def r(shape: tuple, block: int, seed: int, adds: str, suspects: str, first_inf: bool = False) -> ladder.Rung:
        x = rand(*shape, seed=seed, low=-3, high=3)
        if first_inf:
            x[..., :block] = _INF
        name = f"{tuple(shape)}, block_size={block}{': its first block all -inf' if first_inf else ''}"
        return ladder.Rung(Case(name, (x, block)), adds, suspects)
    return (
        r((4,), 4, 760, "", "one block's work: the block x[..., start:start + block_size], m_new = max(m, its "
          "maximum), l rescaled by exp(m - m_new) (0 while m is -inf) plus the sum of exp(block - m_new), m = m_new, "
          "and the final exp(x - m) / l with that same m?"),
        r((8,), 4, 761, "a second block", "what carries over from block to block: m = m_new after each block, "
          "and l rescaled by exp(m - m_new) before the new block's sum is added?"),
        r((7,), 4, 762, "a short last block", "the last, shorter block: the loop over range(0, n, block_size) and "
          "the slice x[..., start:start + block_size] reaching the end?"),
        r((3, 7), 4, 763, "several rows", "one statistic per row: blocks sliced along the last dimension "
          "(x[..., start:start + block_size]), m and l of shape (..., 1), reductions over dim=-1 with keepdim=True?"),
        r((2, 3, 7), 4, 764, "more leading dimensions", "shapes read from the end: m and l of shape "
          "x.shape[:-1] + (1,), every slice and reduction on the last dimension?"),
        r((2, 8), 4, 765, "a first block all -inf", "a row whose running maximum is still -inf: m - m_new is -inf "
          "- (-inf) = NaN unless the shift is 0 while m_new is -inf?", first_inf=True),
    )


ONLINE_LADDER = ladder.Ladder("online_softmax", _online_rungs,
                              lambda case: _expected.reference("online_softmax")(*_clone(case.args)))


def _online_plan(hidden: bool) -> list[Step]:
    """Every case called, then the streaming run watched, then the ladder's rungs."""
    cases = with_hidden("online_softmax", _online_cases)(hidden)
    return [Step(c.key(), c) for c in cases] + [Step(f"watched: {_streaming_case().key()}", _streaming_case(),
                                                     "streaming")] + ladder.steps(ONLINE_LADDER, hidden)


def _online_judge(plan: list[Step], outcomes: Outcomes) -> str:
    exercise = ONLINE
    calls = [s for s in plan if s.run == CALL]
    ladder.record(ONLINE_LADDER)
    record_families(exercise, [s.case for s in calls])
    returned = [(s.case, outcomes[s.key]) for s in calls]
    for step in calls:
        judge_case(exercise, outcomes[step.key], outcomes.changed(step.key), expected_output(exercise, step.case),
                   step.case, diagnose=lambda case, got, want: _carry_family_hint(case, got, returned)
                   or _online_diagnose(case, got, want), smallest=lambda: ladder.diagnose(ONLINE_LADDER, outcomes))
    for step in (s for s in plan if s.run == "streaming"):
        problem = _streaming_text(_streaming_of(exercise, outcomes, step), step.case.args[1])
        if problem:
            fail(exercise, problem, step.case)
    return (f"{len(calls)} cases agree with the softmax, and rows are reduced one block at a time "
            f"({'; '.join(s.case.name for s in calls)})")


check_online_softmax = declare(Spec("online_softmax", _online_plan, _online_judge,
                                    {"streaming": _streaming_run, ladder.RUN: ladder.call}),
                               """Check ``online_softmax(x, block_size)``: the softmax over the last dimension,
block by block, each row reduced one block at a time (watched on a (3, 12) input).""")


# ------------------------------------------------------------------------------------------
# What a tiled attention may make: shared by the Python and (for the values) the Triton check
# ------------------------------------------------------------------------------------------
def full_matrix_problem(watcher: TensorWatcher, T: int) -> str | None:
    """The first tensor with two dimensions of at least ``T`` (a ``(T, T)`` scores, weights or mask
    tensor), described with the line of the student's code that made it; ``None`` if there is none."""
    return _full_matrix_text(_first_full(watcher, T), T)


def _first_full(watcher: TensorWatcher, T: int) -> list | None:
    """The first tensor with two dimensions of at least ``T``, as plain data: ``[shape, is_mask,
    where]`` (``where``: the line of the student's code that made it, or ``""``); ``None``."""
    big: Made | None = watcher.first_made(lambda m: sum(d >= T for d in m.shape) >= 2)
    if big is None:
        return None
    return [[int(d) for d in big.shape], big.dtype == torch.bool, str(big.line) if big.line else ""]


def _full_matrix_text(big: list | None, T: int) -> str | None:
    """The message for a ``(T, T)`` tensor made (:func:`_first_full`), or ``None``."""
    if big is None:
        return None
    shape, is_mask, line = big
    where = f" at {line}" if line else ""
    what = ("a mask" if is_mask else "the full score matrix (or the weights)")
    return (f"your code made a tensor of shape {tuple(shape)}{where}: that is {what}, with T = {T} rows and "
            f"columns. FlashAttention never holds a (T, T) tensor, so its memory grows like T, not T^2: compute "
            f"one (block_q, block_k) tile of scores at a time, q_blk @ k_blk.transpose(-2, -1), and build the "
            f"causal mask of a tile from the positions of its rows and columns.")


def computed_tiles(T: int, block_q: int, block_k: int) -> tuple[int, int, int]:
    """``(needed, crossing, total)`` score entries for one head: in the tiles a causal kernel must
    compute, in those that cross the diagonal, and in all tiles."""
    grid = flash.causal_block_grid(T, block_q, block_k)
    needed = crossing = 0
    for i in range(grid.shape[0]):
        rows = min(block_q, T - i * block_q)
        for j in range(grid.shape[1]):
            cols = min(block_k, T - j * block_k)
            if grid[i, j] > 0:
                needed += rows * cols
            if grid[i, j] == 1:
                crossing += rows * cols
    return needed, crossing, T * T


def skipped_blocks_problem(watcher: TensorWatcher, T: int, head_dim: int, value_dim: int, block_q: int,
                           block_k: int, heads: int) -> str | None:
    """Whether the causal tiles wholly in the future were skipped, read from the score entries computed.

    ``heads`` is the number of (batch, head) pairs. An answer that computes fewer entries (skipping
    inside the diagonal tiles too) is fine; one that computes every tile, or some future tile, is
    not. An answer whose products the watcher cannot see (no ``@``) is not judged here.
    """
    return _skipped_text(watcher.score_entries(head_dim, value_dim), T, block_q, block_k, heads)


def _skipped_text(computed: int, T: int, block_q: int, block_k: int, heads: int) -> str | None:
    """:func:`skipped_blocks_problem` from the number of score entries computed."""
    if computed == 0:
        return None
    needed, _, total = (n * heads for n in computed_tiles(T, block_q, block_k))
    grid = flash.causal_block_grid(T, block_q, block_k)
    future = int((grid == 0).sum())
    if computed <= needed:
        return None
    if computed >= total:
        return (f"no key block was skipped: your code computed all {total:,} scores (every (query block, key block) "
                f"tile), and {future} of the {grid.numel()} tiles lie wholly in the future, so they are computed "
                f"only to be masked. In the loop over key blocks, stop at the end of the query block "
                f"(range(0, q_end, block_k) when causal): those tiles are skipped, not masked, which halves the work.")
    return (f"your code computed {computed:,} scores, but the causal tiles need only {needed:,}: some key blocks "
            f"wholly in the future are still computed (an off-by-one in the loop's end?). Stop the key loop at the "
            f"end of the query block, q_end = min(q_start + block_q, T).")


def _pair_difference(want: Any, got: Any, atol: float, rtol: float) -> str | None:
    """How ``got`` differs from the expected ``(out, lse)``, in words."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return (f"expected a pair (out, lse), got {type(got).__name__}"
                f"{f' of length {len(got)}' if isinstance(got, (tuple, list)) else ''}: return out, lse")
    for name, w, g in (("out", want[0], got[0]), ("lse", want[1], got[1])):
        problem = tensor_difference(w, g, atol, rtol)
        if problem:
            if name == "lse" and isinstance(g, torch.Tensor) and g.shape == w.shape[:-1] + (1,):
                problem += " (drop the last dimension: lse is (..., T))"
            return f"{name}: {problem}"
    return None


def _pair_hint(exercise: str, case: Case, got: Any, want: Any, smallest: Callable[[], str | None] = lambda: None,
               tolerance: tuple[float, float] = (1e-5, 1e-4)) -> str | None:
    """The known mistake whose ``(out, lse)`` equals ``got``; else a symptom read off the output; where only lse
    is wrong and no symptom names why, ``smallest()`` (the ladder's smallest failing configuration beyond the
    first) before the formula of lse."""
    try:
        if isinstance(got, (tuple, list)) and len(got) == 2:
            for hint, output in mistake_outputs(exercise, case):
                if _pair_difference(output, got, 1e-5, 1e-4) is None:
                    return hint
            out, lse = got
            q, k, v = case.args[:3]
            symptom = _unmasked_past_t_hint(case, out, lse, want, *tolerance) or \
                _noncausal_partial_block_hint(case, out, want, *tolerance) or \
                _scale_hint(case, out, want[0], *tolerance) or _values_hint(case, out, want[0], *tolerance) \
                or _keys_weighed(case, out, lse, *tolerance) or \
                _stages_hint(case, out, want[0], *tolerance) or _future_zero_hint(case, out, want[0]) or \
                _carry_hint(exercise, case, out, lse, want[0], *tolerance) or \
                _state_kept_hint(case, out, want[0], *tolerance) or \
                _rows_symptom(case, out, want[0]) or _base_hint(case, out, want[0], *tolerance) or \
                _block_cut_hint(case, out, want[0], *tolerance) or \
                symptoms.keys_seen(q, k, v, want[0], out, bool(case.kwargs.get("causal", True)))
            if symptom:
                return symptom
            for name, w, g in (("out", want[0], out), ("lse", want[1], lse)):
                if isinstance(g, torch.Tensor) and g.shape == w.shape and tensor_difference(w, g) is not None:
                    factor = transformation_hint(w, g)
                    if factor:
                        return f"{name}: {factor}"
            tokens = tokens_of(case)
            generic = symptoms.where_wrong(tokens, want[0], out) or symptoms.row_relation(want[0], out)
            if generic:
                return generic
            if isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor) and \
                    tensor_difference(want[0], out) is None and lse.shape == want[1].shape:
                if tensor_difference(want[1], lse) is not None:
                    own_rows = _lse_rows_hint(want[1], lse)
                    if own_rows:
                        return own_rows
                    generic = symptoms.lse_relation(want[1], lse, row_max(case)) or \
                        symptoms.where_wrong(tokens, want[1], lse, "lse", vector=True)
                    if generic:
                        return generic
                    return smallest() or ("the output is right but lse is not: lse = m + log(l), the log of the sum of "
                            "exp(scaled scores) of each query, with the running maximum m added back.")
    except Exception:  # noqa: BLE001 - a hint is a bonus
        return None
    return None


def _lse_rows_hint(want: torch.Tensor, got: torch.Tensor) -> str | None:
    """With several (batch, head) rows of lse ``(..., T)``: the rows after the first are all wrong while the
    first holds some row's right values, which is what rows written at one place (the (batch, head) offset
    forgotten) give."""
    if want.dim() < 2 or want.shape[:-1].numel() < 2:
        return None
    w, g = want.reshape(-1, want.shape[-1]), got.reshape(-1, got.shape[-1])  # (B*H, T) each
    if any(tensor_difference(w[i], g[i]) is None for i in range(1, len(w))):
        return None
    if not any(tensor_difference(w[j], g[0]) is None for j in range(len(w))):
        return None
    return ("the output is right, but lse is right at most for the first (batch, head) and wrong for every other: "
            "each (batch, head) must store its lse in its own row. In a kernel, offset the pointer by the program's "
            "(batch, head) as for Q, K, V and O: tl.store(LSE + bh * T + offs_m, ...), lse being (B*H, T).")


def _blocks_of(case: Case) -> tuple[int, int]:
    """``(block_q, block_k)`` of a case of either check."""
    if "block_m" in case.kwargs:
        return case.kwargs["block_m"], case.kwargs["block_n"]
    return case.args[3], case.args[4]


def tokens_of(case: Case) -> symptoms.Tokens:
    """How the outputs of either check's case hold tokens (:mod:`symptoms`): rows of queries in blocks of
    block_q (BLOCK_M), read against key blocks of block_k (BLOCK_N), under the flag ``causal``."""
    block_q, block_k = _blocks_of(case)
    return symptoms.Tokens(block_q, block_k, bool(case.kwargs.get("causal", True)))


def sizes_of(case: Case) -> dict[str, int]:
    """The sizes a raised error of either check's case can mention, by what they stand for
    (:func:`symptoms.sizes_of`; none if the case has no such sizes: a hint is a bonus)."""
    try:
        return symptoms.sizes_of(next(a for a in case.args if isinstance(a, torch.Tensor)), tokens_of(case))
    except Exception:  # noqa: BLE001 - a hint is a bonus
        return {}


def row_max(case: Case) -> torch.Tensor | None:
    """Each query's largest scaled score on ``case`` (``(..., T)``), the m of lse = m + log(l); ``None`` if the
    case has no (q, k) pair."""
    q, k = (a for a in case.args[:2])
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)):
        return None
    s = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if case.kwargs.get("causal", True):
        T = s.shape[-1]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return s.amax(-1)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """Softmax attention in float64 with the scores scaled by ``scale``: ``(..., T, Dv)`` from ``(..., T, D)`` q and k
    and ``(..., T, Dv)`` v."""
    q, k, v = (a.detach().double().cpu() for a in (q, k, v))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def _is(model: torch.Tensor, got: torch.Tensor, atol: float, rtol: float) -> bool:
    """Whether ``got`` is ``model`` within the tolerance, every entry (NaN is not)."""
    return got.shape == model.shape and not bool(symptoms.off_rows(model, got, atol, rtol).any())


@symptoms.bonus
def _unmasked_past_t_hint(case: Case, out: Any, lse: Any, want: Any, atol: float = 1e-5, rtol: float = 1e-4
                          ) -> str | None:
    """A kernel's ``out`` (``(..., T, D)``) NaN on exactly the rows of the last (batch, head) whose masked stage
    reads a key block that runs past T, every other row right, and ``lse`` (``(..., T)``) right everywhere: a value
    tile loaded past T without a mask. :func:`course_utils.flash.launch` puts NaN rows after the last head (the
    other heads read the next head's rows there), and a masked score gives p = 0, but 0 * NaN is NaN in p @ v;
    lse, which reads no value, stays right. ``None`` otherwise."""
    kw = case.kwargs
    q = case.args[0]
    if not ("block_m" in kw and isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor)
            and out.shape == want[0].shape and lse.shape == want[1].shape):
        return None
    T, bm, bn, causal = q.shape[-2], kw["block_m"], kw["block_n"], bool(kw["causal"])
    rows = torch.arange(T)
    starts = rows // bm * bm
    lo = starts // bn * bn if causal else torch.full((T,), T // bn * bn)
    hi = torch.clamp(starts + bm, max=T) if causal else torch.full((T,), T)
    reach = (hi + bn - 1) // bn * bn  # (T,) the end of the masked stage's last key block
    past = (lo < hi) & (reach > T)  # (T,) rows whose masked stage reads a block that runs past T
    g = out.detach().double().cpu().reshape(-1, T, out.shape[-1])  # (L, T, D)
    nan = torch.isnan(g).any(-1)  # (L, T)
    expected_nan = torch.zeros_like(nan)
    expected_nan[-1] = past
    if not bool(past.any()) or not torch.equal(nan, expected_nan) or tensor_difference(want[1], lse, atol, rtol):
        return None
    w = want[0].detach().double().cpu().reshape(g.shape)
    if bool((symptoms.off_rows(w, g, atol, rtol) & ~nan).any()):
        return None
    said = symptoms.spans([int(r) for r in past.nonzero()[:, 0]])
    last = int(reach[past][-1])
    heads = g.shape[0]
    which = "the last (batch, head)" if heads > 1 else "the (batch, head)"
    return (f"out is NaN on rows {said} of {which}, and right everywhere else, lse too: exactly the query blocks whose "
            f"masked stage reads the last, partial key block, whose keys {T}..{last - 1} lie past the end of the "
            f"sequence. A value tile there is loaded without a mask: its rows past T are whatever the memory holds "
            f"(NaN here, where the check's launch fills the memory past the last head with NaN; elsewhere anything, or "
            f"a fault), and although those keys' scores are -inf, so p = 0, 0 * NaN "
            f"is NaN in tl.dot(p, v). Mask V's load in that stage as K's: mask=cols[:, None] < T, other=0.0.")


@symptoms.bonus
def _noncausal_partial_block_hint(case: Case, out: Any, want: Any, atol: float = 1e-5, rtol: float = 1e-4
                                  ) -> str | None:
    """A non-causal kernel's ``out`` (``(..., T, D)``, several (batch, head)s) whose unmasked stage also reads the
    last, partial key block: every row of the last (batch, head) NaN (its keys past T are the NaN rows
    :func:`course_utils.flash.launch` puts after the last head), and every other (batch, head)'s rows attention over
    its own T keys plus the next head's first keys, the rows past T that an unmasked load reads there. ``None``
    otherwise."""
    kw = case.kwargs
    q, k, v = case.args[:3]
    if not ("block_m" in kw and not kw.get("causal", True) and isinstance(out, torch.Tensor)
            and out.shape == want[0].shape):
        return None
    T, D, bn = q.shape[-2], q.shape[-1], kw["block_n"]
    extra = -T % bn  # keys past T in the last, partial key block
    q3, k3, v3 = (a.detach().double().cpu().reshape(-1, T, a.shape[-1]) for a in (q, k, v))  # (L, T, D) each
    g = out.detach().double().cpu().reshape(q3.shape[0], T, -1)  # (L, T, Dv)
    if extra == 0 or g.shape[0] < 2 or not bool(torch.isnan(g[-1]).any(-1).all()) or bool(torch.isnan(g[:-1]).any()):
        return None
    keys = torch.cat([k3[:-1], k3[1:, :extra]], dim=1)  # (L - 1, T + extra, D): the next head's first keys after T
    values = torch.cat([v3[:-1], v3[1:, :extra]], dim=1)  # (L - 1, T + extra, Dv)
    model = torch.softmax(q3[:-1] @ keys.transpose(-2, -1) / math.sqrt(D), dim=-1) @ values  # (L - 1, T, Dv)
    if not _is(model, g[:-1], atol, rtol):
        return None
    full = T // bn * bn
    return (f"with causal=False, out is NaN on every row of the last (batch, head), and every other (batch, head) also "
            f"weighs {extra} keys past T = {T} (the next head's first rows): the unmasked stage reads every key block up "
            f"to T, the last, partial one (keys {full}..{T + extra - 1}) too, whose loads and scores have no mask. "
            f"Without causal the unmasked stage must stop at lo = T // BLOCK_N * BLOCK_N = {full}, the end of the last "
            f"full block, and the masked stage read the partial block, range(lo, T, BLOCK_N), with mask=cols[:, None] < T "
            f"on the loads and keep = cols < T on the scores.")


@symptoms.bonus
def _scale_hint(case: Case, out: Any, want: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> str | None:
    """``out`` (``(..., T, D)``) that is attention's with the scores scaled by 1/sqrt(n) or 1/n for another size n of
    the case (the number of tokens T, a block size) instead of 1/sqrt(D), or attention over unscaled scores with the
    output divided by sqrt(D). ``None`` otherwise."""
    q, k, v = case.args[:3]
    if not (isinstance(out, torch.Tensor) and out.shape == want.shape and q.dim() >= 2):
        return None
    causal = bool(case.kwargs.get("causal", True))
    T, D = q.shape[-2], q.shape[-1]
    kernel = "block_m" in case.kwargs
    block_q, block_k = _blocks_of(case)
    sizes = [("T", T, "the number of tokens"), ("BLOCK_M" if kernel else "block_q", block_q, "a block size"),
             ("BLOCK_N" if kernel else "block_k", block_k, "a block size")]
    for form, power in (("1/sqrt({})", 0.5), ("1/{}", 1.0)):
        values = sorted({n for _, n, _ in sizes if n > 1 and abs(n ** -power - D ** -0.5) > 1e-9})
        for n in values:
            if not _is(_attention(q, k, v, n ** -power, causal), out, atol, rtol):
                continue
            named = " or ".join(f"{form.format(name)}, {name} = {n} {what}" for name, size, what in sizes if size == n)
            right = ("scale, which the launch passes as 1/sqrt(HEAD_DIM)" if kernel
                     else "1/math.sqrt(D), D = q.shape[-1]")
            return (f"out is attention's with the scores scaled by {form.format(n)} ({named}) instead of "
                    f"1/sqrt(D) = 1/sqrt({D}), D the head size (the size of each query and key): scale them by "
                    f"{right}.")
    if D > 1 and _is(_attention(q, k, v, 1.0, causal) * D ** -0.5, out, atol, rtol):
        return (f"out is attention over unscaled scores, divided by sqrt(D) = sqrt({D}) afterwards: the 1/sqrt(D) "
                f"is applied to the output instead of to the scores. It belongs inside the softmax: scale the "
                f"scores (or the query block) by 1/sqrt(D), and divide the output only by l.")
    return None


@symptoms.bonus
def _values_hint(case: Case, out: Any, want: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> str | None:
    """``out`` (``(..., T, D)``) that is the right attention weights applied to the keys (or the queries) instead of
    the values. ``None`` otherwise."""
    q, k, v = case.args[:3]
    if not (isinstance(out, torch.Tensor) and out.shape == want.shape and q.shape == k.shape == v.shape):
        return None
    causal = bool(case.kwargs.get("causal", True))
    kernel = "block_m" in case.kwargs
    for name, pointer, other in (("keys", "K", k), ("queries", "Q", q)):
        if torch.equal(other, v) or not _is(_attention(q, k, other, q.shape[-1] ** -0.5, causal), out, atol, rtol):
            continue
        where = (f"load each value block from V (V + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :]), "
                 f"not from {pointer}, in both stages" if kernel else
                 f"multiply p by the value block v[..., k_start:k_end, :], not the {name}' block")
        return (f"out is the right attention weights applied to the {name} instead of the values (out = P {pointer}, "
                f"not P V): every row of out is a weighted mean of the {name}' rows. {where[0].upper()}{where[1:]}.")
    return None


@symptoms.bonus
def _keys_weighed(case: Case, out: Any, lse: Any, atol: float = 1e-5, rtol: float = 1e-4) -> str | None:
    """With ``causal=False``: how many times ``out`` (``(..., T, D)``) and ``lse`` (``(..., T)``) weigh each key, when
    that is a whole number shared by every query (``c_j``: a key read twice, or never), plus a number of padding
    keys past ``T`` (zero key, so score 0, and zero value, as a kernel loads them with other=0.0): solved from the
    outputs (``exp(lse_i)`` is the sum of the weights of row ``i``, ``out_i`` their mean of the values), then checked.
    ``None`` unless whole numbers explain both outputs and some key is not weighed once."""
    kw = case.kwargs
    q, k, v = case.args[:3]
    if kw.get("causal", True) or not (isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor)):
        return None
    Q, K, V = (a.detach().double().cpu().reshape(-1, *a.shape[-2:]) for a in (q, k, v))  # (L, T, D) each
    L, T, D = Q.shape
    G = out.detach().double().cpu().reshape(L, T, V.shape[-1])  # (L, T, Dv)
    Z = lse.detach().double().cpu().reshape(L, T)  # (L, T)
    if not (bool(torch.isfinite(G).all()) and bool(torch.isfinite(Z).all())):
        return None
    s = Q @ K.transpose(-2, -1) / math.sqrt(D)  # (L, T, T)
    a = torch.exp(s - Z[..., None])  # (L, T, T): each key's weight for c_j = 1
    if not bool(torch.isfinite(a).all()):
        return None
    pad = torch.exp(-Z)  # (L, T): a padding key's weight
    means = torch.cat([(a[..., None] * V[:, None]).permute(0, 1, 3, 2).reshape(-1, T),  # (L*T*Dv, T)
                       torch.zeros(L * T * V.shape[-1], 1, dtype=torch.float64)], 1)
    sums = torch.cat([a.reshape(-1, T), pad.reshape(-1, 1)], 1)  # (L*T, T + 1)
    system = torch.cat([means, sums])
    found = torch.linalg.lstsq(system, torch.cat([G.reshape(-1), torch.ones(L * T, dtype=torch.float64)])[:, None])
    weights = found.solution[:, 0]  # (T + 1,)
    counts = weights.round()
    if bool(((weights - counts).abs() > 0.05).any()) or bool((counts < 0).any()):
        return None
    c, padding = counts[:T], int(counts[T])
    if bool((c == 1).all()) and padding == 0:
        return None
    e = c * torch.exp(s - s.amax(-1, keepdim=True))  # (L, T, T)
    total = e.sum(-1) + padding * torch.exp(-s.amax(-1))  # (L, T)
    model_out, model_lse = (e @ V) / total[..., None], torch.log(total) + s.amax(-1)
    if not (_is(model_out, G, atol, rtol) and _is(model_lse[..., None], Z[..., None], atol, rtol)):
        return None
    return _weighed_text(case, [int(x) for x in c], padding)


def _weighed_text(case: Case, counts: list[int], padding: int) -> str:
    """The message of :func:`_keys_weighed`: what ``counts`` (each key's weight) and ``padding`` say."""
    T = len(counts)
    kernel = "block_m" in case.kwargs
    block = case.kwargs["block_n"] if kernel else case.args[4]
    groups: dict[int, list[int]] = {}
    for j, n in enumerate(counts):
        groups.setdefault(n, []).append(j)
    times = {0: "never", 2: "twice"}
    said = [f"key{'s' if len(keys) > 1 else ''} {symptoms.spans(keys)} {times.get(n, f'{n} times')}"
            for n, keys in sorted(groups.items(), key=lambda item: -item[0]) if n != 1]
    if padding:
        said.append(f"{'one' if padding == 1 else padding} key{'s' if padding > 1 else ''} past the end of the sequence as well (position"
                    f"{'s' if padding > 1 else ''} {T}{f'..{T + padding - 1}' if padding > 1 else ''}, loaded as 0: "
                    f"score 0, value 0)")
    text = (f"with causal=False each query must weigh each of the {T} keys once, but out and lse weigh "
            f"{'; '.join(said)}.")
    twice, never = [j for j, n in enumerate(counts) if n > 1], [j for j, n in enumerate(counts) if n == 0]
    if kernel:
        lo = T // block * block
        if twice:
            text += (f" Keys {symptoms.spans(twice)} are read by two key blocks that overlap: the masked stage must "
                     f"start where the first stage stopped, at lo, a key position on a block boundary (T // BLOCK_N * "
                     f"BLOCK_N = {lo} here)")
            text += (f", not T // BLOCK_N = {T // block}, a number of blocks." if twice[0] == T // block != lo
                     else ".")
        elif never:
            text += (f" Keys {symptoms.spans(never)} are in no key block: the first stage must run up to lo = T // "
                     f"BLOCK_N * BLOCK_N ({lo} here) and the masked stage from lo up to hi = T.")
        if padding:
            text += (" Keys at positions T and later are padding: keep only cols < T"
                     + (" (cols <= T keeps position T)." if padding == 1 else "; set the others' scores to -inf."))
    elif twice or never:
        text += (" The key blocks overlap or leave gaps: the key loop must step by block_k, for k_start in range(0, T, "
                 "block_k), and each block end at k_end = min(k_start + block_k, T).")
    return text


@symptoms.bonus
def _stages_hint(case: Case, out: Any, want: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> str | None:
    """What the wrong rows of a causal kernel's ``out`` (``(..., T, D)``) are, read against the kernel's two stages (a
    query block at ``start`` reads the key blocks before ``lo = start // BLOCK_N * BLOCK_N`` without a mask, then those
    up to its end with one): rows that give the first stage's keys twice their weight (those blocks read again by the
    second stage); rows that weigh every key of their masked blocks, future ones and the zero padding past T alike
    (a mask that keeps them all); or rows wrong exactly where the running maximum grows in the first stage after its
    first block (no rescaling there). ``None`` where no model explains every wrong row. ``atol``, ``rtol``: the
    check's tolerance (a compiled kernel's TF32 is looser than the interpreter's float32)."""
    kw = case.kwargs
    if not (kw.get("causal") and "block_m" in kw and isinstance(out, torch.Tensor) and out.shape == want.shape):
        return None
    q, k, v = (a.detach().double().reshape(-1, *a.shape[-2:]) for a in case.args[:3])  # (L, T, D) each
    g = out.detach().double().reshape(q.shape[0], -1, v.shape[-1])  # (L, T, Dv)
    w = want.detach().double().reshape(g.shape)
    L, T, D = q.shape
    bm, bn = kw["block_m"], kw["block_n"]
    off = symptoms.off_rows(w, g, atol, rtol)  # (L, T)
    if not bool(off.any()):
        return None
    s = q @ k.transpose(-2, -1) / math.sqrt(D)  # (L, T, T)
    rows = torch.arange(T)
    starts = rows // bm * bm  # (T,) each row's query block start
    lo = starts // bn * bn  # (T,) where its masked stage begins
    past = rows[None, :] < lo[:, None]  # (T, T): keys of the unmasked stage
    causal = rows[None, :] <= rows[:, None]  # (T, T)

    def attend(weight: torch.Tensor, extra: torch.Tensor | float = 0.0) -> torch.Tensor:
        """sum_j weight_ij exp(s_ij) v_j / (sum_j weight_ij exp(s_ij) + extra_i), per row, stable."""
        m = torch.where(weight > 0, s, float("-inf")).amax(-1, keepdim=True).clamp(min=0.0)  # (L, T, 1)
        e = weight * torch.exp(s - m)  # (L, T, T)
        return (e @ v) / (e.sum(-1, keepdim=True) + extra * torch.exp(-m))

    def explains(model: torch.Tensor) -> bool:
        return not bool((symptoms.off_rows(model, g, atol, rtol) & off).any())  # every wrong row is the model's

    wrong = sorted({int(r) for r in off.nonzero()[:, 1]})
    said = symptoms.spans(wrong)
    staged = _stage_bounds_hint(case, g, off, attend, rows, starts, lo, causal, atol, rtol)
    if staged:
        return staged
    twice = causal.double() + past.double()
    if bool(past.any()) and explains(attend(twice)):
        firsts = sorted({int(lo[r]) for r in wrong})
        return (f"query rows {said} give the keys their unmasked stage reads (keys 0..{firsts[0] - 1} for row "
                f"{wrong[0]}) twice their weight: those key blocks are read twice, once in the first stage and again "
                f"in the masked one. The masked (diagonal) stage must start where the first stage stopped: "
                f"range(lo, hi, BLOCK_N).")
    ends = ((torch.clamp(starts + bm, max=T) - 1) // bn + 1) * bn  # (T,) the end of the masked stage's last block
    seen = rows[None, :] < ends[:, None].clamp(max=T)  # (T, T): every real key of the masked blocks
    padding = (ends - T).clamp(min=0).double()[None, :, None]  # (1, T, 1): zero keys past T, score 0
    if explains(attend(seen.double(), padding)):
        right_first = [r for r in range(T) if int(lo[r]) == 0 and r not in wrong]
        text = (f"query rows {said} weigh every key of their masked key blocks (row {wrong[0]}: keys 0.."
                f"{min(int(ends[wrong[0]]), T) - 1}, its future ones too"
                f"{f', and {int(ends[wrong[0]]) - T} padding positions past T, loaded as 0' if ends[wrong[0]] > T else ''}"
                f"): the mask of the diagonal stage keeps keys it must hide there.")
        if right_first:
            text += (f" Rows whose masked stage starts at key 0 (rows {symptoms.spans(right_first)}) are right: is the mask "
                     f"built from the tile's own offsets offs_n (0..BLOCK_N - 1) instead of the keys' positions cols = "
                     f"start_n + offs_n (cols < T, cols <= offs_m)?")
        return text
    blocks = torch.arange(T) // bn  # (T,) each key's block
    grows = torch.zeros(L, T, dtype=torch.bool)
    for b in range(1, math.ceil(T / bn)):
        before = torch.where(blocks < b, s, float("-inf")).amax(-1)  # (L, T)
        now = torch.where(blocks == b, s, float("-inf")).amax(-1)
        grows |= (now > before + 1e-9) & (b * bn < lo)[None, :]
    if bool(grows.any()) and torch.equal(grows, off):
        return (f"only query rows {said} are wrong: exactly those whose running maximum grows at a key block of the "
                f"first stage (the blocks read without a mask) after its first one; the rows where it does not grow "
                f"there are right. In that loop, rescale by alpha = exp(m_i - m_new) when the maximum grows: "
                f"l_i = l_i * alpha + ..., acc = acc * alpha[:, None] + ..., then m_i = m_new.")
    return None


def _stage_bounds_hint(case: Case, g: torch.Tensor, off: torch.Tensor, attend: Callable, rows: torch.Tensor,
                       starts: torch.Tensor, lo: torch.Tensor, causal: torch.Tensor, atol: float, rtol: float
                       ) -> str | None:
    """Two members of the family of the kernel's unmasked stage changed (issue 36), each named where it gives every
    row of ``g`` (``(L, T, Dv)``) that it can model: the key positions of that stage without start_n (each iteration
    loads key block 0 again: block 0 weighed once per iteration, the other blocks before lo never), and the stage
    ending at start_m * BLOCK_N instead of lo (the query block's index times the key block size: a query block sees
    every key before there unmasked; rows whose stage runs past T read keys that are not there, anything, and are
    left out of the comparison). ``lo``: each row's right end of the stage; ``starts``: its query block's start."""
    kw = case.kwargs
    bm, bn, T = kw["block_m"], kw["block_n"], g.shape[1]

    def gives(model: torch.Tensor, free: torch.Tensor) -> bool:
        """Whether ``g`` is ``model`` on every row not ``free``, and some such row is wrong."""
        kept = ~free[None, :]
        return bool((off & kept).any()) and not bool((symptoms.off_rows(model, g, atol, rtol) & kept).any())

    keys = rows[None, :]  # (1, T)
    iterations = (lo // bn).double()[:, None]  # (T, 1): the unmasked stage's iterations of each row
    first = torch.where(keys < lo[:, None], torch.where(keys < bn, iterations, 0.0), causal.double())
    none_free = torch.zeros(T, dtype=torch.bool)
    if bool((lo > bn).any()) and gives(attend(first), none_free):
        said = symptoms.spans(sorted({int(r) for r in off.nonzero()[:, 1]}))
        r = int(next(i for i in range(T) if int(lo[i]) > bn))
        return (f"query rows {said} weigh key block 0 (keys 0..{bn - 1}) once per iteration of the unmasked stage "
                f"({int(lo[r]) // bn} times for row {r}) and the other keys of that stage (keys {bn}..{int(lo[r]) - 1}) "
                f"never: every iteration loads the first key block again. The key positions there must move with the "
                f"loop, cols = start_n + offs_n, as in the masked stage.")
    his = torch.clamp(starts + bm, max=T)  # (T,) hi, the end of each row's diagonal stage
    reach = (his + bn - 1) // bn * bn  # (T,) the end of the last key block an unmasked stage up to hi reads
    past_t = reach > T  # rows whose unmasked stage would read past the last key
    to_hi = (keys < reach[:, None]).double() + (causal & (keys >= lo[:, None])).double()
    if gives(attend(to_hi), past_t):
        wrong = sorted({int(r) for r in off.nonzero()[:, 1]})
        seen = [r for r in wrong if not bool(past_t[r])]
        beyond = [r for r in wrong if bool(past_t[r])]
        r = seen[0]
        text = (f"query rows {symptoms.spans(seen)} weigh keys 0..{int(reach[r]) - 1} without a mask, their future "
                f"ones too (row {r}), and their keys from lo = {int(lo[r])} on a second time with the mask")
        if beyond:
            text += (f"; rows {symptoms.spans(beyond)} read keys up to {int(reach[beyond[0]]) - 1}, past T = {T}, "
                     f"without a mask")
        return (f"{text}: the unmasked stage runs up to hi instead of lo, so the diagonal key blocks are read twice, "
                f"first without any mask. The unmasked stage must stop at lo = (start_m * BLOCK_M) // BLOCK_N * "
                f"BLOCK_N; only the masked stage runs from lo to hi: range(lo, hi, BLOCK_N).")
    masked = (keys >= lo[:, None]) & (keys < torch.clamp(reach, max=T)[:, None])  # (T, T): the masked stage's keys
    local = (keys < lo[:, None]) | (masked & (keys % bn <= rows[:, None]))  # key offset in its tile vs query position
    if gives(attend(local.double()), none_free):
        wrong = sorted({int(r) for r in off.nonzero()[:, 1]})
        r = wrong[0]
        seen = [int(c) for c in range(T) if bool(local[r, c])]
        return (f"query rows {symptoms.spans(wrong)} see the keys of their masked key blocks whose offset inside the "
                f"tile, 0..BLOCK_N - 1, is at most the query's position (row {r} sees keys {symptoms.spans(seen)}): the "
                f"causal test compares the tile's own offsets offs_n with the queries' positions offs_m. Compare the "
                f"keys' positions in the sequence, cols = start_n + offs_n: keep cols[None, :] <= offs_m[:, None].")
    ends = starts // bm * bn  # (T,) start_m * BLOCK_N of each row's query block
    free = ends > T  # rows whose unmasked stage reads past the last key
    unmasked = (keys < ends[:, None]) | causal
    if bool((ends != lo).any()) and gives(attend(unmasked.double()), free):
        wrong = sorted({int(r) for r in off.nonzero()[:, 1]})
        seen = [r for r in wrong if not bool(free[r])]
        past = [r for r in wrong if bool(free[r])]
        r = seen[0]
        text = (f"query rows {symptoms.spans(seen)} see keys 0..{int(ends[r]) - 1} without a mask, their future ones "
                f"too (row {r})")
        if past:
            text += (f", and rows {symptoms.spans(past)} read keys up to {int(ends[past[0]]) - 1}, past T = {T}, "
                     f"without a mask")
        return (f"{text}: the unmasked stage of query block {int(starts[r]) // bm} ends at start_m * BLOCK_N = "
                f"{int(ends[r])}, its index times the key block size, instead of its first query position rounded down "
                f"to a key block, lo = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N = {int(lo[r])}. The two differ when "
                f"BLOCK_N (= {bn}) > BLOCK_M (= {bm}): key blocks that cross the diagonal are then read without the "
                f"causal mask.")
    return None


@symptoms.bonus
def _row_vector_hint(error: BaseException, case: Case) -> str | None:
    """A size mismatch on the LAST dimension between the head size and a number of query rows (a block's): a vector of
    one number per row (l, m, alpha: ``(..., rows)``) broadcast against a ``(..., rows, D)`` tile, which lines it up
    with the features. ``None`` otherwise."""
    found = symptoms.broadcast_sizes(error)
    q, v = case.args[0], case.args[2]
    if found is None or found[2] is None or found[2] != q.dim() - 1:
        return None
    T, block_q = q.shape[-2], case.args[3]
    features = {q.shape[-1], v.shape[-1]}
    counts = {block_q, T % block_q, min(block_q, T)} - {0}
    a, b = found[:2]
    rows = a if b in features and a in counts else b if a in features and b in counts else None
    if rows is None or rows in features:
        return None
    return (f"a vector of {rows} numbers, one per query row (l, m or alpha: shape (..., {rows})), met the "
            f"{a if rows == b else b} features of a ({rows}, head_dim) tile along the last dimension: broadcasting "
            f"lines a vector up with a tensor's LAST dimension, the features. Give the row statistic its trailing axis, "
            f"l[..., None] (or keepdim=True), so that each row is divided or scaled by its own number.")


@symptoms.bonus
def _leading_dims_hint(error: BaseException, case: Case) -> str | None:
    """A size mismatch in the LEADING dimensions of inputs with (batch, head) dimensions, between one of those sizes
    and a size a tile has only in its last two dimensions (a block size, the head size): a tile whose dimensions
    were all reversed (``.T`` on more than two dimensions) or permuted, so its own sizes stand where the batch
    dimensions belong. ``None`` otherwise."""
    found = symptoms.broadcast_sizes(error)
    q = case.args[0]
    if found is None or found[2] is None or not isinstance(q, torch.Tensor) or q.dim() < 3:
        return None
    lead = [int(n) for n in q.shape[:-2]]
    T, D = q.shape[-2], q.shape[-1]
    block_q, block_k = _blocks_of(case)
    tile = {"block_k": block_k, "block_q": block_q, "the head size D": D, "T % block_k": T % block_k,
            "T % block_q": T % block_q}
    a, b, dim = found
    if not 0 <= dim < q.dim() - 2:
        return None
    batch, other = (a, b) if a in lead and b not in lead else (b, a) if b in lead and a not in lead else (None, None)
    names = [name for name, n in tile.items() if n == other and n > 1]
    if batch is None or not names:
        return None
    block = tuple(lead) + (block_k, D)
    return (f"a leading (batch, head) dimension of size {batch} met a size {other} ({' or '.join(names)}), a size a "
            f"tile has only in its last two dimensions: a tile's dimensions are out of order, its own sizes moved in "
            f"front. .T reverses ALL the dimensions of a tensor with more than two (a key block {block}.T is "
            f"{block[::-1]}), which only works for plain 2-D inputs: swap the last two with .transpose(-2, -1) "
            f"(or .mT).")


@symptoms.bonus
def _future_zero_hint(case: Case, out: Any, want: torch.Tensor) -> str | None:
    """The tiled forward's causal ``out`` (``(..., T, D)``) whose wrong rows weigh the future keys of the tiles they
    compute as if those scores were 0 (masked with 0, not -inf). ``None`` otherwise."""
    if "block_m" in case.kwargs or not (case.kwargs.get("causal", True) and isinstance(out, torch.Tensor)
                                        and out.shape == want.shape and len(case.args) >= 5):
        return None
    q, k, v = (a.detach().double() for a in case.args[:3])
    block_q, block_k = case.args[3], case.args[4]
    T = q.shape[-2]
    rows = torch.arange(T)
    q_end = torch.clamp(rows // block_q * block_q + block_q, max=T)  # (T,)
    ends = torch.clamp(((q_end - 1) // block_k + 1) * block_k, max=T)  # (T,) the end of the last tile computed
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, T)
    future = rows[None, :] > rows[:, None]
    s = s.masked_fill(future, 0.0).masked_fill(rows[None, :] >= ends[:, None], float("-inf"))
    model = torch.softmax(s, -1) @ v
    wrong = symptoms.off_rows(want, out)
    if not bool(wrong.any()) or bool((symptoms.off_rows(model, out) & wrong).any()):
        return None
    r = int(wrong.flatten(0, -2).any(0).nonzero()[0]) if wrong.dim() > 1 else int(wrong.nonzero()[0])
    return (f"future keys get weight: row {r} weighs the keys after it in its tiles (keys {r + 1}.."
            f"{int(ends[r]) - 1}) as if their scores were 0. A masked score must be -inf, so that exp gives 0: "
            f"masked_fill(mask, float(\"-inf\")), not 0 (exp(0 - m) > 0).")


def _rows_symptom(case: Case, out: Any, want: torch.Tensor) -> str | None:
    """Which query rows of ``out`` are wrong, when that pattern names the mistake: NaN on exactly the
    rows of the first query block (its diagonal tile was never computed), or values off only in the
    last, shorter query block."""
    if not isinstance(out, torch.Tensor) or out.shape != want.shape:
        return None
    T = want.shape[-2]
    block_q, _ = _blocks_of(case)
    g, w = out.detach().double(), want.detach().double()
    rows_nan = torch.isnan(g).flatten(0, -3).any(0).any(-1) if g.dim() > 2 else torch.isnan(g).any(-1)
    off = ((g - w).abs() > 1e-5 + 1e-4 * w.abs()) | torch.isnan(g)
    rows_off = off.flatten(0, -3).any(0).any(-1) if g.dim() > 2 else off.any(-1)
    rows = torch.arange(T)
    if bool(rows_nan.any()) and torch.equal(rows_nan, rows < min(block_q, T)) and T > block_q:
        return (f"NaN on exactly the first query block (rows 0..{min(block_q, T) - 1}), whose only key block is its "
                f"diagonal tile: that tile is never computed, or wholly masked, so l = 0 and 0/0 = NaN. Run the key "
                f"blocks up to the end of the query block, and mask only the keys after each query.")
    last = (T // block_q) * block_q
    if 0 < last < T and bool(rows_off.any()) and torch.equal(rows_off, rows >= last):
        text = (f"only the rows of the last, shorter query block (rows {last}..{T - 1}) are wrong: does the loop over "
                f"query blocks reach T, and does that block stop at q_end = min(q_start + block_q, T)?")
        _, block_k = _blocks_of(case)
        causal = case.kwargs.get("causal", True)
        if causal and [qs for qs in range(0, T, block_q) if qs >= block_k] == [last]:
            past = last // block_k * block_k
            text += (f" It is also the only query block with key blocks wholly in the past (keys 0..{past - 1}, read "
                     f"without a mask): is the update in that loop the same as in the masked one "
                     f"(m_new, alpha, l, acc, and m = m_new after each block)?")
        return text
    return None


#: One factor of the carry-over changed (:func:`_carry_hint`): its name, then what the loop did, in words.
_CARRY_VARIANTS = (
    ("tile_max", "alpha taken against the tile's own maximum, exp(m - rowmax(s)), instead of against the new running "
                 "maximum: alpha = exp(m - m_new), m_new = max(m, rowmax(s))"),
    ("inverted", "alpha inverted, exp(m_new - m) instead of exp(m - m_new) (it must be at most 1)"),
    ("l_kept", "l not rescaled: l = alpha * l + p.sum(-1), not l + p.sum(-1)"),
    ("acc_kept", "acc not rescaled: acc = alpha * acc + p @ v_blk, not acc + p @ v_blk"),
    ("none", "nothing rescaled (alpha left out of both l and acc)"),
    ("alpha_columns", "acc rescaled by alpha lined up with its LAST axis, the features: alpha, one factor per query "
                      "row, broadcasts against acc's last dimension, so column d of acc is multiplied by query d's "
                      "factor (this runs only because the query block and the head have the same size). Give alpha "
                      "the query axis: acc * alpha{col}"),
)


@symptoms.bonus
def _carry_hint(exercise: str, case: Case, out: Any, lse: Any, want: torch.Tensor, atol: float = 1e-5,
                rtol: float = 1e-4) -> str | None:
    """``out`` (``(..., T, D)``, and ``lse`` ``(..., T)``) equal to the tiled forward's with ONE factor of the
    carry-over between key blocks changed (:data:`_CARRY_VARIANTS`), where that changes the output: the change,
    named. Both checks' cases (a kernel's blocks are BLOCK_M and BLOCK_N). The models are the family ``"carry"`` of
    ``course_utils.instructor.nb07``, their outputs on the visible cases and rungs recorded (:func:`family_outputs`).
    ``None`` otherwise."""
    q = case.args[0]
    if not (isinstance(out, torch.Tensor) and out.shape == want.shape and q.dim() >= 2 and q.shape[-2] <= 64):
        return None
    kernel = "block_m" in case.kwargs
    models = dict(family_outputs(exercise, case, "carry"))
    for variant, words in _CARRY_VARIANTS:
        if variant not in models:
            continue
        model_out, model_lse = (m.double() for m in models[variant])
        words = words.format(col="[:, None]" if kernel else "[..., None]")
        if _is(model_out, want.detach().double().cpu(), atol, rtol) or not _is(model_out, out.detach().double().cpu(),
                                                                                atol, rtol):
            continue
        both = isinstance(lse, torch.Tensor) and lse.shape == model_lse.shape and \
            _is(model_lse[..., None], lse.detach().double().cpu()[..., None], atol, rtol)
        names = ("m_i", "l_i") if kernel else ("m", "l")
        return (f"out{' and lse are' if both else ' is'} what the loop over key blocks gives with {words}. Such a "
                f"slip shows only where the running maximum {names[0]} changes from one key block to the next"
                f"{' (in either stage)' if kernel else ''}.")
    return None


@symptoms.bonus
def _state_kept_hint(case: Case, out: Any, want: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> str | None:
    """The tiled forward's ``out`` (``(..., T, D)``) whose running statistics m, l and acc are made once, before the
    loop over query blocks (issue 36, batch N): row j of each query block then goes on from row j of the block
    before, so it is softmax attention over the keys that every row of that chain sees (each with its own mask).
    Blocks of block_q that divide T only (a shorter last block would not broadcast). ``None`` otherwise."""
    q, k, v = case.args[:3]
    if "block_m" in case.kwargs or not (isinstance(out, torch.Tensor) and out.shape == want.shape and q.dim() >= 2):
        return None
    block_q, _ = _blocks_of(case)
    Q, K, V = (a.detach().double().cpu().reshape(-1, *a.shape[-2:]) for a in (q, k, v))  # (L, T, D) each
    L, T, D = Q.shape
    if T % block_q or T == block_q or not bool(torch.isfinite(out).all()):
        return None
    s = Q @ K.transpose(-2, -1) / math.sqrt(D)  # (L, T, T)
    if case.kwargs.get("causal", True):
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), _INF)
    e = torch.exp(s - s.amax((-2, -1), keepdim=True))  # (L, T, T): one shift for the whole chain
    blocks = T // block_q
    num = torch.cumsum((e @ V).reshape(L, blocks, block_q, -1), 1)  # (L, nb, Bq, Dv): row j of blocks 0..b
    den = torch.cumsum(e.sum(-1).reshape(L, blocks, block_q, 1), 1)  # (L, nb, Bq, 1)
    model = (num / den).reshape(L, T, -1)  # (L, T, Dv)
    g, w = out.detach().double().cpu().reshape(model.shape), want.detach().double().cpu().reshape(model.shape)
    if _is(model, w, atol, rtol) or not _is(model, g, atol, rtol):
        return None
    return (f"out is right for the first query block (rows 0..{block_q - 1}) and wrong for the later ones exactly as a "
            f"loop gives whose m, l and acc are made once, before the loop over query blocks: each query block goes "
            f"on from the previous block's maximum, sum and accumulator, so its rows also weigh the keys of the rows "
            f"before it. Start them afresh at the top of each query block: m = -inf, l = 0, acc = 0.")


@symptoms.bonus
def _block_cut_hint(case: Case, out: Any, want: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> str | None:
    """``out`` (``(..., T, D)``) whose rows are each softmax attention over the keys 0..c, with ONE cut ``c`` shared by
    every row of a query block (in blocks of block_q or BLOCK_M) where the right cut is each query's own position
    (causal) or T - 1: with causal, the block's first query position (the mask compares the keys with the block's
    start); with causal=False, its last (the keys stop at the query block's end). ``None`` unless every row of every
    query block with a wrong row is explained by one of those two. (A causal cut at the block's last query is also
    what a crossing tile left unmasked gives, and a cut at a key block's end what a loop's end gives: those are
    :func:`symptoms.keys_seen`'s to say.)"""
    q, k, v = case.args[:3]
    if not (isinstance(out, torch.Tensor) and out.shape == want.shape and q.dim() >= 2 and k.shape[-2] == q.shape[-2]):
        return None
    block_q, _ = _blocks_of(case)
    causal = bool(case.kwargs.get("causal", True))
    Q, K, V = (a.detach().double().cpu().reshape(-1, *a.shape[-2:]) for a in (q, k, v))  # (L, T, D) each
    G = out.detach().double().cpu().reshape(Q.shape[0], Q.shape[1], V.shape[-1])  # (L, T, Dv)
    W = want.detach().double().cpu().reshape(G.shape)
    L, T, _ = Q.shape
    if block_q < 2 or T > 64 or not bool(torch.isfinite(G).all()):
        return None
    s = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (L, T, T)
    e = torch.exp(s - s.amax(-1, keepdim=True))  # (L, T, T)
    prefix = torch.cumsum(e[..., None] * V[:, None], -2) / torch.cumsum(e, -1)[..., None]  # (L, T, c, Dv): keys 0..c
    fits = ~symptoms.off_rows(prefix, G[:, :, None, :].expand_as(prefix), atol, rtol).any(0)  # (T, c)
    off = symptoms.off_rows(W, G, atol, rtol).any(0)  # (T,)
    cuts: dict[tuple[int, int], int] = {}
    for qs in range(0, T, block_q):
        qe = min(qs + block_q, T)
        if not bool(off[qs:qe].any()):
            continue
        common = fits[qs:qe].all(0).nonzero()
        if qe - qs < 2 or len(common) != 1:
            return None
        cuts[(qs, qe)] = int(common[0])
    if not cuts:
        return None
    said = "; ".join(f"rows {qs}..{qe - 1} see keys 0..{c}" for (qs, qe), c in cuts.items())
    kernel = "block_m" in case.kwargs
    seen = (f"every query of a query block sees the same keys, 0..c for one c per block ({said}), where "
            + ("each query i must see the keys 0..i. " if causal else f"with causal=False each must see all {T}. "))
    if causal and all(c == qs for (qs, _), c in cuts.items()):
        own = "offs_m" if kernel else "q_start + i, the rows of the tile"
        first = "start_m * BLOCK_M" if kernel else "q_start"
        return seen + (f"c is the block's first query position: the causal mask compares the keys with {first} "
                       f"instead of each query's own position, {own} (keep key j for query i when j <= i).")
    if not causal and all(c == qe - 1 for (_, qe), c in cuts.items()):
        return seen + ("c is the query block's last position: the keys stop at the query block's end q_end, as a "
                       "causal loop's would. With causal=False the key loop runs to T and each key block ends at "
                       "k_end = min(k_start + block_k, T), whatever the query block.")
    return None


@symptoms.bonus
def _base_hint(case: Case, out: Any, want: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> str | None:
    """``out`` (``(..., T, D)``) that is attention with the scaled scores also multiplied by ln 2 (exponentials in base
    2, exp2, of scores never multiplied by log2(e)) or by log2(e) (scores ready for exp2 given to exp). ``None``
    otherwise."""
    q, k, v = case.args[:3]
    if not (isinstance(out, torch.Tensor) and out.shape == want.shape and q.dim() >= 2):
        return None
    causal = bool(case.kwargs.get("causal", True))
    kernel = "block_m" in case.kwargs
    exp2, exp = ("tl.exp2", "tl.exp") if kernel else ("torch.exp2", "torch.exp")
    for factor, words in (
            (math.log(2), f"ln 2: a softmax in base 2. {exp2}(x) is 2**x = exp(x * ln 2), so the scaled scores must be "
                          f"multiplied by log2(e) = 1.4427 before every {exp2} (and lse turned back to base e, "
                          f"(m + log2(l)) * ln 2); or use {exp}."),
            (1 / math.log(2), f"log2(e): the scores were scaled for {exp2} but given to {exp}. Use {exp2} with those "
                              f"scores, or leave log2(e) out.")):
        if _is(_attention(q, k, v, factor / math.sqrt(q.shape[-1]), causal), out.detach().double().cpu(), atol, rtol):
            return f"out is attention with every score multiplied by {factor:.4f} = {words}"
    return None


_BATCH_PRODUCT = re.compile(r"Expected size for first two dimensions of batch2 tensor to be: \[(\d+), (\d+)\] but got: "
                            r"\[(\d+), (\d+)\]")


@symptoms.bonus
def _tile_product_hint(error: BaseException, case: Case) -> str | None:
    """A matrix product whose inner sizes are a query block's and a key block's (``block_q != block_k``): one tile of
    the product sliced with the query block's range, the other with the key block's (p @ v_blk with v sliced by
    q_start:q_end, or the keys). ``None`` otherwise."""
    text = str(error)
    found = core._MATMUL_ERROR.search(text)
    if found:
        inner = {int(found.group(2)), int(found.group(3))}
    elif (found := _BATCH_PRODUCT.search(text)):
        inner = {int(found.group(2)), int(found.group(4))}
    else:
        return None
    q = case.args[0]
    block_q, block_k = _blocks_of(case)
    T = q.shape[-2]
    queries = {min(block_q, T)} | ({T % block_q} if T % block_q else set())
    keys = {min(block_k, T)} | ({T % block_k} if T % block_k else set())
    if block_q == block_k or len(inner) != 2 or not any(a in queries and b in keys for a in inner for b in inner):
        return None
    a, b = sorted(inner)
    return (f"a matrix product met {a} against {b} along its inner dimension, a query block's size and a key block's "
            f"(block_q = {block_q}, block_k = {block_k}): one of its tiles was sliced with the query block's range "
            f"where the key block's belongs. Only q takes q_start:q_end; k and v both take the key block's rows, "
            f"[..., k_start:k_end, :], so that p, (block_q, block_k), meets the value tile's block_k rows in p @ v.")



@symptoms.bonus
def rung_symptom(steps: ladder.Ladder, outcomes: Outcomes) -> str | None:
    """Where the failing case raised: the symptom (:func:`_block_cut_hint`, :func:`_carry_hint`) of the output of the
    smallest rung of ``steps`` (a forward's ladder, outputs ``(out, lse)``) that is wrong, said with that rung's name;
    ``None`` where there is none."""
    found = ladder.first_wrong(steps, outcomes)
    if found is None:
        return None
    rung, got, want = found
    out, lse = got
    hint = _block_cut_hint(rung.case, out, want[0]) or _carry_hint(steps.exercise, rung.case, out, lse, want[0])
    return f"on the smallest configuration that goes wrong, {rung.case.name}, {hint[0].lower()}{hint[1:]}" \
        if hint else None

_SIZES_DIFFER = (symptoms.BROADCAST_ERROR,
                 re.compile(r"Expected size (\d+) but got size (\d+)"))


def short_block_hint(exercise: str, plan: list[Step], outcomes: Outcomes, step: Step, error: BaseException
                     ) -> str | None:
    """A last, shorter block taken as a full one (issue 36): ``error`` is a size mismatch between the block
    size and the remainder ``T % block`` on ``step``'s case, while every case whose ``T`` both block sizes
    divide ran without an error. Notebooks 07 and 10 (``case.args``: the tensors, then ``block_q, block_k``)."""
    found = next((m for pattern in _SIZES_DIFFER if (m := pattern.search(str(error)))), None)
    if found is None:
        return None

    def blocks(case: Case) -> tuple[int, int, int] | None:
        sizes = [a for a in case.args if type(a) is int]
        tensors = [a for a in case.args if isinstance(a, torch.Tensor)]
        return (tensors[0].shape[-2], *sizes[:2]) if len(sizes) >= 2 and tensors else None

    even = [s for s in plan if s.run == CALL and s is not step and (b := blocks(s.case)) and b[0] % b[1] == 0
            and b[0] % b[2] == 0]
    if not even or any(isinstance(outcomes[s.key], BaseException) for s in even) or blocks(step.case) is None:
        return None
    T, block_q, block_k = blocks(step.case)
    sizes = {int(found.group(1)), int(found.group(2))}
    for which, name, block in (("query", "q", block_q), ("key", "k", block_k)):
        rest = T % block
        if rest and sizes == {block, rest}:
            return (f"the last, shorter {which} block is taken as a full one: T = {T} is not a multiple of "
                    f"block_{name} = {block}, so the last {which} block holds only {rest} positions, but something of "
                    f"it has {block} (its end {name}_start + block_{name}, or its mask's arange). End it at "
                    f"{name}_end = min({name}_start + block_{name}, T) and build its slices and mask from "
                    f"{name}_start..{name}_end: the cases whose T the blocks divide pass."
                    + (f" Or, as block_q = {block_q} and block_k = {block_k} are these sizes too: a row statistic "
                       f"of the queries met the key axis: reduce the scores over dim=-1, the keys (amax, sum), and "
                       f"give each tile the slices of its own block." if sizes == {block_q, block_k} else ""))
    return None


def _compare_pair(exercise: str, case: Case, got: Any, want: Any, atol: float, rtol: float,
                  smallest: Callable[[int], str | None] = lambda defer: None,
                  first: Callable[[], str | None] = lambda: None) -> None:
    """``got`` against the expected ``(out, lse)``; a failure is hinted by ``first()`` (what the caller read from
    other runs), a known mistake or a symptom (:func:`_pair_hint`), else by ``smallest(defer)`` (the ladder's
    smallest failing configuration, :func:`ladder.diagnose`)."""
    problem = _pair_difference(want, got, atol, rtol)
    if problem:
        try:
            fail(exercise, f"{_sentence(problem)} Input shapes: "
                           f"{', '.join(str(tuple(a.shape)) for a in case.args if isinstance(a, torch.Tensor))}.", case)
        except CheckFailed as error:
            raise _hinted(error, first() or _pair_hint(exercise, case, got, want, lambda: smallest(1), (atol, rtol))
                          or smallest(0)) \
                from None


# ------------------------------------------------------------------------------------------
# flash_attention_forward
# ------------------------------------------------------------------------------------------
def _qkv(*shape: int, seed: int, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(rand(*shape, seed=seed + i, low=-scale, high=scale) for i in range(3))  # type: ignore[return-value]


def _flash_cases() -> list[Case]:
    x = book_inputs()  # (6, 3)
    return [
        Case("the book's six tokens as q, k and v (6, 3), block_q=2, block_k=4, causal",
             (x, x, x, 2, 4), {"causal": True}),
        Case("(1, 2, 37, 8), block_q=8, block_k=16, causal: T not a multiple of the blocks",
             (*_qkv(1, 2, 37, 8, seed=701), 8, 16), {"causal": True}),
        Case("(1, 2, 32, 8), block_q=8, block_k=8, causal", (*_qkv(1, 2, 32, 8, seed=704), 8, 8), {"causal": True}),
        Case("(2, 20, 8), block_q=16, block_k=6, causal=False", (*_qkv(2, 20, 8, seed=707), 16, 6), {"causal": False}),
    ]


#: The case on which the check counts the scores computed: T = 40 is larger than every other size.
_STRUCTURE = ("tiles: (2, 40, 4), block_q=8, block_k=16, causal", (2, 40, 4), 8, 16)


def _structure_run(student: Callable, case: Case) -> list:
    """The runner of a watched step: ``student`` on ``case`` under a :class:`TensorWatcher`,
    ``[first_full, score_entries]`` (:func:`_first_full`, and the score entries computed), plain data.
    Raises what the student's code raised."""
    q, k, v = case.args[:3]
    watcher = TensorWatcher(memory=False)  # what was made, multiplied, reduced: no byte counts
    with torch.no_grad(), watcher:
        student(*_clone(case.args), **case.kwargs)
    return [_first_full(watcher, q.shape[-2]), int(watcher.score_entries(q.shape[-1], v.shape[-1]))]


def _shape_ok(shape: Any) -> bool:
    return isinstance(shape, (list, tuple)) and len(shape) <= 8 and all(type(d) is int and 0 <= d < 2**31 for d in shape)


def _full_ok(big: Any) -> bool:
    """Whether ``big`` has the form of :func:`_first_full`'s outcome: ``None`` or ``[shape, is a mask, line]``."""
    return big is None or (isinstance(big, (list, tuple)) and len(big) == 3 and _shape_ok(big[0])
                           and type(big[1]) is bool and _short_text(big[2]))


def watched_structure(exercise: str, outcomes: Outcomes, step: Step,
                      counted: str = "the score entries computed") -> tuple[list | None, int]:
    """A watched step's outcome (:func:`_structure_run`, or notebook 10's own runner), refused
    (``spec.refuse``) unless it is ``[the first (T, T) tensor as [shape, is a mask, line] or None, a count]``;
    ``counted`` names the count."""
    found = outcome_of(exercise, outcomes, step)
    if not (isinstance(found, (list, tuple)) and len(found) == 2 and type(found[1]) is int and 0 <= found[1] < 2**62
            and _full_ok(found[0])):
        refuse(exercise, f"tensor watcher ([the first (T, T) tensor or None, {counted}])")
    return found[0], found[1]


def _judge_structure(exercise: str, outcomes: Outcomes, step: Step) -> None:
    """A watched step of the forward: no ``(T, T)`` tensor; causal tiles skipped."""
    case = step.case
    q, k, v, block_q, block_k = case.args
    causal = case.kwargs.get("causal", True)
    T = q.shape[-2]
    big, computed = watched_structure(exercise, outcomes, step)
    if T > max(block_q, block_k, q.shape[-1], v.shape[-1]):
        problem = _full_matrix_text(big, T)
        if problem:
            fail(exercise, problem, case)
    if causal and T > block_k:
        heads = math.prod(q.shape[:-2])
        problem = _skipped_text(computed, T, block_q, block_k, heads)
        if problem:
            fail(exercise, problem, case)


#: The key of a watched step: the case's, after this.
WATCHED = "watched: "


#: The key of the bfloat16 step of ``flash_attention_forward``: its case's, after this.
HALF = "bfloat16: "
HALF_ATOL, HALF_RTOL = 1e-2, 1.6e-2


def _half_case() -> Case:
    """A tiny bfloat16 case, ``T`` not a multiple of the blocks: ``out`` must come back in bfloat16 (``q.dtype``),
    as the exercise states."""
    q, k, v = (t.to(torch.bfloat16) for t in _qkv(1, 2, 10, 8, seed=713))
    return Case("bfloat16 (1, 2, 10, 8), block_q=4, block_k=6, causal: against float64 attention",
                (q, k, v, 4, 6), {"causal": True})


def _half_expected(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's attention in float64 on the case's bfloat16 inputs: ``out`` ``(..., T, D)``, ``lse`` ``(..., T)``."""
    q, k, v = (t.to(torch.float64) for t in case.args[:3])
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, T)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), _INF)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), scores.logsumexp(dim=-1)


def _judge_half(exercise: str, case: Case, got: Any) -> None:
    """The bfloat16 step: it runs, ``out`` has the inputs' dtype and ``lse`` the statistics' float32 (the exercise:
    "``m + log(l)`` into ``lse`` (in the float32 of the statistics)"; notebook 10's backward rebuilds the weights from
    it), and ``out`` and ``lse`` agree with float64 attention within bfloat16's tolerance."""
    if isinstance(got, BaseException):
        failed = raised(exercise, got, case)
        hint = symptoms.error_hint(got, sizes_of(case)) if failed.student_error is not None else None
        raise _hinted(failed, hint) from None
    if isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got):
        out, lse = got
        if out.dtype != torch.bfloat16:
            fail(exercise, f"returns out in {str(out.dtype).removeprefix('torch.')} for bfloat16 inputs: cast the "
                           f"output back to q.dtype. m, l and acc stay in float32; each query block's rows are "
                           f"(acc / l[..., None]).to(q.dtype).", case)
        stats = torch.promote_types(case.args[0].dtype, torch.float32)
        if lse.dtype != stats:
            fail(exercise, f"returns lse in {str(lse.dtype).removeprefix('torch.')} for bfloat16 inputs: lse stays in "
                           f"the statistics' {str(stats).removeprefix('torch.')} whatever the inputs' dtype, as m and l "
                           f"do: allocate it with dtype=stats (q.new_empty(q.shape[:-1], dtype=stats)), not in "
                           f"q.dtype. bfloat16 keeps only 8 significant bits, and notebook 10's backward rebuilds the "
                           f"weights p = exp(s - lse) from lse.", case)
    problem = _pair_difference(_half_expected(case), got, HALF_ATOL, HALF_RTOL)
    if problem:
        fail(exercise, f"{_sentence(problem)} In bfloat16, compute each tile in float32 (the statistics' dtype) and "
                       f"cast only the output rows back to q.dtype.", case)


def _flash_plan(hidden: bool) -> list[Step]:
    """Each case called, then watched; then the T = 40 case watched; then the bfloat16 case called."""
    cases = with_hidden("flash_attention_forward", _flash_cases)(hidden)
    name, shape, block_q, block_k = _STRUCTURE
    structure = Case(name, (*_qkv(*shape, seed=710), block_q, block_k), {"causal": True})
    steps = [s for c in cases for s in (Step(c.key(), c), Step(WATCHED + c.key(), c, "structure"))]
    half = _half_case()
    return steps + [Step(WATCHED + structure.key(), structure, "structure"), Step(HALF + half.key(), half)] \
        + ladder.steps(FORWARD_LADDER, hidden)


@symptoms.bonus
def _query_blocks_done(case: Case, got: Any, want: Any, computed: Any) -> int | None:
    """``j`` where the tiled forward computed the scores of its first ``j`` query blocks only (``computed``: the
    score entries the watcher counted on ``case``, :func:`_structure_run`; fewer than all blocks, at least one)
    and ``got``, ``(out, lse)``, is right on exactly their rows, in every (batch, head): the loop over query blocks
    ended early, a ``return`` inside it the first. ``None`` otherwise. The rows after them are not read (with the
    output from ``new_empty`` they hold whatever the memory held)."""
    q, k, v, block_q, block_k = case.args[:5]
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)
            and type(computed) is int and computed > 0 and got[0].shape == want[0].shape
            and got[1].shape == want[1].shape):
        return None
    causal = bool(case.kwargs.get("causal", True))
    T, Dv = q.shape[-2], v.shape[-1]
    heads = math.prod(q.shape[:-2])
    done = 0
    for j, q_start in enumerate(range(0, T, block_q)):
        q_end = min(q_start + block_q, T)
        if q_end >= T:
            return None
        # the score entries of this query block's tiles, as the watcher counts them (not a tile Dv keys wide)
        done += heads * sum((q_end - q_start) * (min(k_start + block_k, T) - k_start)
                            for k_start in range(0, q_end if causal else T, block_k)
                            if min(k_start + block_k, T) - k_start != Dv)
        if done == computed:
            break
        if done > computed:
            return None
    out, lse = (t.detach().double().cpu() for t in got)
    w_out, w_lse = (t.detach().double().cpu() for t in want)
    right = ~symptoms.off_rows(w_out, out) & ~symptoms.off_rows(w_lse[..., None], lse[..., None])  # (..., T)
    rows = right.reshape(-1, T).all(0)  # (T,)
    if j + 2 == -(-T // block_q) and T % block_q:
        return None  # only the last, shorter block left out: :func:`_rows_symptom` says so, its end
    return j + 1 if bool(rows[:q_end].all()) and not bool(rows[q_end:].all()) else None


def _query_blocks_text(case: Case, blocks: int) -> str:
    """The message of :func:`_query_blocks_done`."""
    q, block_q = case.args[0], case.args[3]
    T = q.shape[-2]
    end = min(blocks * block_q, T)
    if blocks == 1:
        return (f"only the first query block (rows 0..{end - 1}, block_q = {block_q}) was computed, and it is right; "
                f"the rows from {end} on were never written (they hold whatever out's memory held): the function "
                f"returns after the first query block. Is `return out, lse` indented inside the loop over query "
                f"blocks? It belongs after that loop, at the function's level, once every block is written.")
    return (f"only the first {blocks} query blocks (rows 0..{end - 1}) were computed, and they are right; the rows "
            f"from {end} on were never written: the loop over query blocks ends early. It must run over every block, "
            f"for q_start in range(0, T, block_q), T = q.shape[-2], and `return out, lse` come after it.")


def _flash_judge(plan: list[Step], outcomes: Outcomes) -> str:
    exercise = "flash_attention_forward"
    ref = _expected.reference
    calls = [s for s in plan if s.run == CALL and not s.key.startswith(HALF)]
    ladder.record(FORWARD_LADDER)
    record_families(exercise, [s.case for s in calls] + [r.case for r in FORWARD_LADDER.rungs])
    smallest = lambda defer=0: ladder.diagnose(FORWARD_LADDER, outcomes, defer)  # noqa: E731
    for step in plan:
        case = step.case
        if step.run == "structure":
            _judge_structure(exercise, outcomes, step)
            continue
        if step.key.startswith(HALF):
            _judge_half(exercise, case, outcomes[step.key])
            continue
        want = expect(exercise, case.key(), lambda: ref(exercise)(*_clone(case.args), **case.kwargs))
        if _expected.is_recording():
            mistake_outputs(exercise, case)
        found = outcomes[step.key]
        if isinstance(found, BaseException):
            failed = raised(exercise, found, case)
            hint = (short_block_hint(exercise, plan, outcomes, step, found) or _row_vector_hint(found, case)
                    or _leading_dims_hint(found, case) or _tile_product_hint(found, case)
                    or symptoms.error_hint(found, sizes_of(case)) or rung_symptom(FORWARD_LADDER, outcomes)
                    or smallest()) \
                if failed.student_error is not None else None
            raise _hinted(failed, hint) from None
        watched = outcomes[WATCHED + step.key] if WATCHED + step.key in outcomes else None
        early = _query_blocks_done(case, found, want, watched[1] if isinstance(watched, (list, tuple))
                                   and len(watched) == 2 else None)
        _compare_pair(exercise, case, found, want, 1e-5, 1e-4, smallest,
                      first=lambda: _query_blocks_text(case, early) if early else None)
    return (f"{len(calls)} cases agree with attention (out and lse), no (T, T) tensor is made, and causal tiles "
            f"wholly in the future are skipped ({'; '.join(s.case.name for s in calls)})")


check_flash_attention_forward = declare(
    Spec("flash_attention_forward", _flash_plan, _flash_judge, {"structure": _structure_run, ladder.RUN: ladder.call}),
    """Check ``flash_attention_forward(q, k, v, block_q, block_k, causal)``: ``(out, lse)`` equal to
    attention's, with no ``(T, T)`` tensor made and the causal tiles in the future skipped.""")


# ------------------------------------------------------------------------------------------
# flash_attention_triton
# ------------------------------------------------------------------------------------------
def _triton_cases() -> list[Case]:
    return [
        Case("(1, 1, 40, 16), causal, BLOCK_M=16, BLOCK_N=32: T not a multiple of the blocks",
             _qkv(1, 1, 40, 16, seed=720), {"causal": True, "block_m": 16, "block_n": 32}),
        Case("(2, 1, 20, 16), causal=False, BLOCK_M=BLOCK_N=16: T not a multiple of the blocks",
             _qkv(2, 1, 20, 16, seed=723), {"causal": False, "block_m": 16, "block_n": 16}),
        Case("(1, 1, 40, 32), causal, BLOCK_M=32, BLOCK_N=16, HEAD_DIM=32", _qkv(1, 1, 40, 32, seed=726),
             {"causal": True, "block_m": 32, "block_n": 16}),
    ]


_INCOMPATIBLE = re.compile(r"incompatible dimensions at index (\d+): (\d+) and (\d+)")


def _kernel_error_hint(error: BaseException, case: Case | None = None) -> str | None:
    """A kernel's error, in words: ``tl.dot`` of tiles whose inner sizes differ (k not transposed); a vector of one
    number per query row lined up with the features of a tile (sizes HEAD_DIM and BLOCK_M on the tile's last axis,
    with ``case``); two tiles of BLOCK_M and BLOCK_N meeting."""
    text = f"{type(error).__name__}: {error}"
    found = _INCOMPATIBLE.search(text)
    if found and case is not None and "block_m" in case.kwargs:
        sizes = {int(found.group(2)), int(found.group(3))}
        head, block_m = case.args[0].shape[-1], case.kwargs["block_m"]
        if found.group(1) == "1" and sizes == {head, block_m} and head == case.kwargs["block_n"]:
            return (f"a vector of BLOCK_M = {block_m} numbers, one per query row (m_new, alpha or l_i: (BLOCK_M,)), "
                    f"met the last axis of a tile of {head} columns, the scores' keys (BLOCK_N) or acc's features "
                    f"(HEAD_DIM): broadcasting lines a vector up with a tile's LAST axis. Give the row's number the "
                    f"query axis wherever it meets a tile: s - m_new[:, None], acc * alpha[:, None], acc / l_i[:, None].")
        if found.group(1) == "1" and sizes == {head, block_m}:
            return (f"a vector of BLOCK_M = {block_m} numbers, one per query row (alpha, l_i or m_i: (BLOCK_M,)), met "
                    f"the HEAD_DIM = {head} features of a (BLOCK_M, HEAD_DIM) tile along its last axis: broadcasting "
                    f"lines a vector up with a tile's LAST axis. Give the row's factor the query axis: acc = acc * "
                    f"alpha[:, None] + ... (and acc / l_i[:, None]). Where BLOCK_M equals HEAD_DIM this runs and "
                    f"scales each column by another query's factor instead.")
    if "reduction dimensions" in text or ("dot" in text.lower() and "shape" in text.lower()):
        return ("tl.dot needs the inner sizes to agree: the scores are tl.dot(q, tl.trans(k)), (BLOCK_M, HEAD_DIM) "
                "by (HEAD_DIM, BLOCK_N); tl.dot(q, k) without the transpose only runs when the tiles are square, "
                "and then computes the wrong product. For p @ v: tl.dot(p, v), (BLOCK_M, BLOCK_N) by "
                "(BLOCK_N, HEAD_DIM).")
    if "make_shape_compatible" in text or "incompatible dimensions" in text:
        return ("two tiles of different shapes met in one operation (a row of BLOCK_M queries against one of "
                "BLOCK_N keys): is a reduction taken over the wrong axis? Each query's statistics reduce its "
                "row of scores over the keys, axis 1: tl.max(s, 1) and tl.sum(p, 1) give (BLOCK_M,), as m_i and "
                "l_i are. (With BLOCK_M == BLOCK_N the shapes agree and the values are wrong instead.)")
    return shape_error_hint(error)


def _triton_expected(exercise: str, case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference ``flash_attention_forward`` on the case, with the kernel's block sizes."""
    kw = case.kwargs
    return expect(exercise, case.key(), lambda: _expected.reference("flash_attention_forward")(
        *_clone(case.args), kw["block_m"], kw["block_n"], causal=kw["causal"]))


class KernelSpec(Spec):
    """The spec of a Triton kernel exercise (notebooks 07 and 10): where Triton cannot run, the self-check
    is skipped with the reason (one line), while the grader fails the test: it always has Triton. Its judge
    reads the rules from the kernel's Python function first (:func:`kernel_rules`)."""

    def judged(self, student: Any, hidden: bool) -> None:
        exercise = self.exercise
        runs, how = flash.triton_status()
        if not runs:
            if hidden:
                fail(exercise, f"the grader needs Triton to grade this kernel: {how}.")
            print(f"⏭ {exercise}: skipped: {how}.")
            return
        super().judged(student, hidden)


def kernel_rules(exercise: str, outcomes: Outcomes) -> None:
    """The rules of ``exercise`` on the kernel's Python function (``kernel.fn``: ``@triton.jit`` wraps it, and
    the rules read source), first in a kernel's judge, as for any other exercise before its cases."""
    core.check_rules(exercise, getattr(outcomes.student, "fn", outcomes.student))


def launch_outcome(exercise: str, outcomes: Outcomes, step: Step, hint: Callable[[BaseException], str | None]
                   ) -> tuple[Any, bool]:
    """``(outputs, on_gpu)`` of a launch step (a runner's ``[outputs, "gpu" | "cpu"]``), refused
    (``spec.refuse``) in any other form; a launch that raised fails with ``hint(error)`` after the words.
    Used by notebooks 07 and 10."""
    found = outcomes[step.key]
    if isinstance(found, BaseException):
        failed = raised(exercise, found, step.case)
        raise _hinted(failed, hint(found) if failed.student_error is not None else None) from None
    if not (isinstance(found, (list, tuple)) and len(found) == 2 and found[1] in ("gpu", "cpu")):
        refuse(exercise, 'launch ([its outputs, where it ran: "gpu" or "cpu"])')
    return found[0], found[1] == "gpu"


def launched_on(devices: set) -> str:
    """Where a kernel's launches ran, for the ✅ line."""
    return "compiled for the GPU" if devices == {True} else "in Triton's interpreter on the CPU"


def _triton_judge(plan: list[Step], outcomes: Outcomes) -> str:
    exercise = "flash_attention_triton"
    kernel_rules(exercise, outcomes)
    ladder.record(KERNEL_LADDER)
    record_families(exercise, [s.case for s in plan])  # its rungs are read by the ladder alone
    smallest = lambda defer=0: ladder.diagnose(KERNEL_LADDER, outcomes, defer)  # noqa: E731
    devices = set()
    for step in plan:
        case = step.case
        want = _triton_expected(exercise, case)
        if _expected.is_recording():
            mistake_outputs(exercise, case)
        got, on_gpu = launch_outcome(exercise, outcomes, step, lambda error: _kernel_error_hint(error, case) or
                                     symptoms.error_hint(error, sizes_of(case)) or smallest())
        devices.add(on_gpu)
        atol = rtol = 5e-3 if on_gpu else 1e-5
        _compare_pair(exercise, case, got, want, atol, 1e-4 if not on_gpu else rtol, smallest)
    return (f"{len(plan)} launches agree with attention (out and lse), {launched_on(devices)} "
            f"({'; '.join(s.case.name for s in plan)})")


def _triton_run(kernel: Any, case: Case) -> list:
    """The runner of a launch: ``[(out, lse), device]`` of ``kernel`` launched on ``case`` with
    :func:`course_utils.flash.launch` (on the GPU where there is one: ``device`` is ``"gpu"``, else
    ``"cpu"``, Triton's interpreter), the outputs on the CPU. Raises what the launch raised. The sandboxed
    kernel may see no GPU where the grader's process does: the tolerance and the message follow where the
    kernel ran."""
    on_gpu = torch.cuda.is_available()
    args = tuple(a.cuda() if on_gpu else a for a in _clone(case.args))
    out, lse = flash.launch(kernel, *args, **case.kwargs)
    return [(out.cpu(), lse.cpu()), "gpu" if on_gpu else "cpu"]


check_flash_attention_triton = declare(
    KernelSpec("flash_attention_triton",
               lambda hidden: [Step(c.key(), c, "launch")
                               for c in with_hidden("flash_attention_triton", _triton_cases)(hidden)]
               + ladder.steps(KERNEL_LADDER, hidden),
               _triton_judge, {"launch": _triton_run}),
    """Check the Triton kernel ``flash_attention_triton``, launched with :func:`course_utils.flash.launch`.

    On a CPU it runs in Triton's interpreter (exact float32, tolerance 1e-5); on a GPU it is
    compiled, and float32 products use TF32 tensor cores, so the tolerance is 5e-3. Where Triton is
    not installed the self-check is skipped with the reason; the grader always has Triton.
    """)


# ------------------------------------------------------------------------------------------
# The smallest configuration that fails (:mod:`course_utils.checks.ladder`), for the tiled forward
# ------------------------------------------------------------------------------------------
_CARRY = ("what carries over from one key block to the next: the running maximum (m = m_new after each block), "
          "alpha = exp(m - m_new), and l and acc rescaled by alpha before the block's share is added? And, as "
          "block_q != block_k here for the first time: does each loop step by its own block size (the key loop by "
          "block_k) and end each block with it?")
_FRESH = ("what each query block starts afresh and where it reads and writes: m, l and acc set anew per query "
          "block, its rows q[..., q_start:q_end, :], and out and lse stored at the same rows?")


def _forward_rung(shape: tuple, block_q: int, block_k: int, causal: bool, seed: int, adds: str, suspects: str,
                  note: str = "") -> ladder.Rung:
    name = (f"{tuple(shape)}, block_q={block_q}, block_k={block_k}, {'causal' if causal else 'causal=False'}"
            f"{note}")
    return ladder.Rung(Case(name, (*_qkv(*shape, seed=seed), block_q, block_k), {"causal": causal}), adds,
                       suspects)


def forward_rungs() -> tuple[ladder.Rung, ...]:
    """The forward's ladder: one tile, then the tiles' features one at a time (also notebook 10's
    ``FlashAttention``, whose forward is this one)."""
    r = _forward_rung
    return (
        r((4, 4), 4, 4, False, 750, "", "the work on one tile: the scores q @ k^T scaled by 1/sqrt(D), their "
          "maximum and exponentials over the keys (dim=-1), the first update from m = -inf, l = 0, acc = 0 (alpha "
          "= exp(m - m_new) is 0 there), out = acc / l and lse = m + log(l)?", ": one tile"),
        r((4, 4), 4, 4, True, 750, "the causal mask", "the mask inside a tile: key j hidden from query i when "
          "k_start + j > q_start + i (set to -inf before the maximum), and the loop still reading the diagonal "
          "tile?", ": one tile"),
        r((8, 4), 8, 4, False, 751, "a second key block", _CARRY),
        r((8, 4), 4, 8, False, 752, "a second query block", _FRESH),
        r((8, 4), 4, 4, False, 753, "several query and key blocks (causal=False)",
          "which key blocks each query block reads when not causal: all of them, up to T (range(0, q_end if "
          "causal else T, block_k))?"),
        r((8, 4), 4, 4, True, 753, "several blocks with the causal mask",
          "which key blocks a causal query block reads (up to its end q_end, its diagonal tile included, the "
          "past ones unmasked) and the diagonal tile's mask from the global positions k_start + j > q_start + i?"),
        r((12, 4), 4, 6, True, 754, "block_q != block_k",
          "what must use each block size: the key loop's step block_k and the query loop's block_q, the key "
          "loop's end q_end (not a multiple of block_k), and the mask from both blocks' own starts?"),
        r((14, 4), 4, 6, True, 755, "a short last block (T not a multiple of the blocks)",
          "the last, shorter blocks: each ends at min(start + block, T), and its slices, mask and stores use that "
          "end?"),
        r((2, 2, 14, 4), 4, 6, True, 756, "batch and heads > 1",
          "the leading (batch, head) dimensions: sizes read from the end (T = q.shape[-2], D = q.shape[-1]), every "
          "index with ... in front (q[..., rows, :]), every reduction over dim=-1, and lse of shape (..., T)?"),
    )


FORWARD_LADDER = ladder.Ladder(
    "flash_attention_forward", forward_rungs,
    lambda case: _expected.reference("flash_attention_forward")(*_clone(case.args), **case.kwargs),
    lambda pair: [("out", pair[0]), ("lse", pair[1])])


def _kernel_rung(shape: tuple, block_m: int, block_n: int, causal: bool, seed: int, adds: str, suspects: str
                 ) -> ladder.Rung:
    name = f"{tuple(shape)}, {'causal' if causal else 'causal=False'}, BLOCK_M={block_m}, BLOCK_N={block_n}"
    return ladder.Rung(Case(name, _qkv(*shape, seed=seed), {"causal": causal, "block_m": block_m, "block_n": block_n}),
                       adds, suspects)


def _kernel_rungs() -> tuple[ladder.Rung, ...]:
    """The Triton forward's ladder: one tile, then one feature at a time; each launch is tiny (16 is tl.dot's
    smallest tile), as the interpreter runs them on a CPU."""
    r = _kernel_rung
    return (
        r((1, 1, 16, 16), 16, 16, False, 780, "", "the work on one tile, which without causal is all the first "
          "stage's (the loop without a mask): the pointers of Q, K and V (offsets times strides), s = tl.dot(q, "
          "tl.trans(k)) * scale, the update from m_i = -inf, l_i = 0 (m_new, alpha = exp(m_i - m_new), l_i, acc, "
          "m_i = m_new), and the stores of acc / l_i and m_i + log(l_i)?"),
        r((1, 1, 16, 16), 16, 16, True, 780, "the causal mask", "the diagonal stage, the only one a causal one-tile program "
          "runs: key cols hidden from query offs_m when cols > offs_m (tl.where to -inf before the maximum), and its "
          "update the same as the first stage's (the scale, m_new, alpha, l_i and acc rescaled)?"),
        r((1, 1, 32, 16), 32, 16, False, 781, "a second key block", "what carries over from one key block to the "
          "next: m_i = m_new after each block, alpha = exp(m_i - m_new), l_i and acc rescaled by alpha (in both "
          "stages), and the key pointers advanced by start_n?"),
        r((1, 1, 32, 16), 16, 16, True, 782, "several blocks with the causal mask", "the two stages of a causal "
          "program: the key blocks wholly in the past (lo = 0 up to start_m * BLOCK_M) without a mask, then the "
          "diagonal block(s) with it; each query block's rows offs_m = start_m * BLOCK_M + arange?"),
        r((1, 1, 48, 16), 16, 32, True, 783, "BLOCK_M != BLOCK_N", "what must use each block size: the diagonal "
          "stage's start rounded down to a key block, (start_m * BLOCK_M) // BLOCK_N * BLOCK_N, its end "
          "(start_m + 1) * BLOCK_M, and the masks from both blocks' offsets?"),
        r((1, 1, 20, 16), 16, 16, False, 784, "a short last block (T not a multiple of the blocks)", "the rows and "
          "keys past T: loads masked with offs_m < T and cols < T (other=0), scores of keys >= T set to -inf, and "
          "stores masked with offs_m < T?"),
        r((2, 2, 20, 16), 16, 16, True, 785, "batch and heads > 1", "the program's (batch, head) offset: every "
          "pointer of Q, K, V, O and LSE offset by bh with that tensor's stride (LSE by bh * T)?"),
    )


#: On a GPU the kernel computes in TF32 (the check's tolerance there is 5e-3); its rungs are compared at that
#: tolerance everywhere: every mistake here is off by far more.
KERNEL_LADDER = ladder.Ladder(
    "flash_attention_triton", _kernel_rungs,
    lambda case: _expected.reference("flash_attention_forward")(
        *_clone(case.args), case.kwargs["block_m"], case.kwargs["block_n"], causal=case.kwargs["causal"]),
    lambda pair: [("out", pair[0]), ("lse", pair[1])], atol=5e-3, rtol=5e-3, runner="launch",
    output=lambda found: found[0], twins=False, compiled_only=True)
