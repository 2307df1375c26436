"""Notebook 05's hidden cases and known mistakes (instructor only; see the package docstring).

The mistakes of ``split_heads``, ``merge_heads`` and ``count_parameters`` are functions of a case's
arguments; those of ``MultiHeadAttention`` are mistaken classes with the reference's constructor,
built and run with the same seeds as the reference (so they create their layers in the book's
order, unless the order is the mistake). ``MultiHeadAttentionWrapper`` has none: its mistakes
(a repeated head, heads joined on the wrong dimension, added heads) are named by the check from
the output's shape and blocks alone. Notebook 06's mistakes reuse :class:`AttentionCore`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from course_utils.checks.core import Case, rand
from course_utils.instructor import Mistake


# ------------------------------------------------------------------------------------------
# Hidden cases (seeds 5500-5599 and names starting "hidden:": used nowhere in the student edition)
# ------------------------------------------------------------------------------------------
def _wrapper_cases() -> dict:
    """``configs``: more ``(constructor args, cases)`` for the value comparison; ``causal``: module
    cases (``build`` set) whose module must also see no future on ``args[0]``."""
    return {
        "configs": [
            ((4, 3, 8, 0.2, 3, True), [Case("hidden: qkv_bias=True, T=5", (rand(3, 5, 4, seed=5501),)),
                                       Case("hidden: T equal to context_length 8", (rand(1, 8, 4, seed=5502),))]),
            ((5, 4, 7, 0.0, 1), [Case("hidden: one head, (2, 7, 5)", (rand(2, 7, 5, seed=5503),))]),
            ((6, 2, 5, 0.1, 6), [Case("hidden: six heads, T=1", (rand(2, 1, 6, seed=5504),)),
                                 Case("hidden: six heads, T=5", (rand(2, 5, 6, seed=5505),))]),
            ((6, 2, 5, 0.0, 6), [Case("hidden: six heads without dropout, (2, 5, 6)", (rand(2, 5, 6, seed=5506),))]),
        ],
        "causal": [
            Case("hidden: causality of six heads, (2, 5, 6)", (rand(2, 5, 6, seed=5507),), build=(6, 2, 5, 0.0, 6)),
        ],
    }


def _split_cases() -> list[Case]:
    return [
        Case("hidden: (3, 7, 12), 4 heads", (rand(3, 7, 12, seed=5511), 4)),
        Case("hidden: one head, (2, 4, 8)", (rand(2, 4, 8, seed=5512), 1)),
        Case("hidden: head_dim 1, (2, 3, 5), 5 heads", (rand(2, 3, 5, seed=5513), 5)),
        Case("hidden: non-contiguous input (batch and tokens transposed)",
             (rand(6, 2, 8, seed=5514).transpose(0, 1), 2)),
        Case("hidden: T=1, (4, 1, 6), 2 heads", (rand(4, 1, 6, seed=5515), 2)),
        Case("hidden: more heads than tokens, (2, 3, 12), 6 heads", (rand(2, 3, 12, seed=5516), 6)),
    ]


def _merge_cases() -> list[Case]:
    # (b, T, H, D) transposed to (b, H, T, D): laid out in memory like the output of split_heads
    return [
        Case("hidden: non-contiguous (3, 4, 7, 1)", (rand(3, 7, 4, 1, seed=5521).transpose(1, 2),)),
        Case("hidden: one head, (2, 1, 4, 8)", (rand(2, 1, 4, 8, seed=5522),)),
        Case("hidden: (2, 8, 3, 2)", (rand(2, 8, 3, 2, seed=5523),)),
        Case("hidden: T=1, (3, 2, 1, 4)", (rand(3, 2, 1, 4, seed=5524),)),
        Case("hidden: non-contiguous (2, 3, 5, 4)", (rand(2, 5, 3, 4, seed=5525).transpose(1, 2),)),
    ]


def _mha_cases() -> dict:
    """Same shape as :func:`_wrapper_cases`."""
    return {
        "configs": [
            ((6, 12, 10, 0.1, 4, True), [Case("hidden: qkv_bias=True, T=7", (rand(3, 7, 6, seed=5531),))]),
            ((5, 4, 6, 0.0, 1), [Case("hidden: one head, (2, 6, 5)", (rand(2, 6, 5, seed=5532),))]),
            ((8, 16, 12, 0.2, 16), [Case("hidden: 16 heads of size 1", (rand(2, 12, 8, seed=5533),)),
                                    Case("hidden: 16 heads, T=1", (rand(3, 1, 8, seed=5534),))]),
            ((3, 2, 6, 0.0, 2), [Case("hidden: batch of 3, T=3", (rand(3, 3, 3, seed=5535),))]),
        ],
        "causal": [
            Case("hidden: causality of 16 heads, T=9", (rand(2, 9, 8, seed=5536),), build=(8, 16, 12, 0.0, 16)),
        ],
    }


def _count_cases() -> list[Case]:
    from course_utils import reference

    tied = nn.Sequential(nn.Linear(5, 5, bias=False), nn.Linear(5, 5, bias=False))
    tied[1].weight = tied[0].weight
    frozen_attention = nn.MultiheadAttention(8, 2, batch_first=True)
    frozen_attention.out_proj.requires_grad_(False)
    return [
        Case("hidden: MultiHeadAttentionWrapper(3, 2, 6, 0.0, 4, qkv_bias=True)",
             (reference.MultiHeadAttentionWrapper(3, 2, 6, 0.0, 4, True),)),
        Case("hidden: two layers sharing one weight", (tied,)),
        Case("hidden: a module without parameters", (nn.ReLU(),)),
        Case("hidden: CausalAttention(16, 8, 32, 0.1)", (reference.CausalAttention(16, 8, 32, 0.1),)),
        Case("hidden: nn.MultiheadAttention(8, 2) with a frozen out_proj", (frozen_attention,)),
    ]


HIDDEN = {
    "MultiHeadAttentionWrapper": _wrapper_cases,
    "split_heads": _split_cases,
    "merge_heads": _merge_cases,
    "MultiHeadAttention": _mha_cases,
    "count_parameters": _count_cases,
}


# ------------------------------------------------------------------------------------------
# split_heads and merge_heads: mistaken functions
# ------------------------------------------------------------------------------------------
SPLIT_WITHOUT_TRANSPOSE = ("view without transpose: x.view(b, num_heads, T, head_dim) has the right shape but cuts the "
                           "memory in the wrong places, so one 'head' holds pieces of several tokens. View as "
                           "(b, T, num_heads, head_dim) (split the last dim), then transpose(1, 2).")
MERGE_WITHOUT_TRANSPOSE = ("view without transpose: (b, num_heads, T, head_dim) reshaped straight to (b, T, d) puts "
                           "pieces of different tokens into one row. transpose(1, 2) to (b, T, num_heads, head_dim) "
                           "first, then .contiguous().view(...) or .reshape(...).")
HEADS_INTERLEAVED = ("heads interleaved: head h must get the contiguous columns h*head_dim:(h+1)*head_dim. View the "
                     "last dim as (num_heads, head_dim), not (head_dim, num_heads).")


def _split_shape(x: torch.Tensor, num_heads: int) -> tuple[int, int, int, int]:
    b, T, d = x.shape
    return b, T, num_heads, d // num_heads


def _split_without_transpose(x, num_heads):
    b, T, H, D = _split_shape(x, num_heads)
    return x.reshape(b, H, T, D)


def _split_no_transpose_at_all(x, num_heads):
    return x.reshape(*_split_shape(x, num_heads))


def _split_interleaved(x, num_heads):
    b, T, H, D = _split_shape(x, num_heads)
    return x.reshape(b, T, D, H).permute(0, 3, 1, 2)


def _split_wrong_pair(x, num_heads):
    return x.reshape(*_split_shape(x, num_heads)).transpose(0, 2)


def _split_sizes_swapped(x, num_heads):
    b, T, H, D = _split_shape(x, num_heads)
    return x.reshape(b, T, D, H).transpose(1, 2)


SPLIT_MISTAKES = [
    Mistake(SPLIT_WITHOUT_TRANSPOSE, _split_without_transpose),
    Mistake("the result is (b, T, num_heads, head_dim): the view is right, now swap the token and head dimensions "
            "with .transpose(1, 2) to get (b, num_heads, T, head_dim).", _split_no_transpose_at_all),
    Mistake(HEADS_INTERLEAVED, _split_interleaved),
    Mistake("the wrong pair of dimensions is transposed: after view(b, T, num_heads, head_dim), swap the token and "
            "head dimensions, transpose(1, 2).", _split_wrong_pair),
    Mistake("num_heads and head_dim are swapped: view(b, T, num_heads, d // num_heads), then transpose(1, 2) gives "
            "num_heads heads of head_dim columns.", _split_sizes_swapped),
]


def _merge_without_transpose(x):
    b, H, T, D = x.shape
    return x.reshape(b, T, H * D)


def _merge_interleaved(x):
    b, H, T, D = x.shape
    return x.permute(0, 2, 3, 1).reshape(b, T, H * D)


def _merge_wrong_pair(x):
    b, H, T, D = x.shape
    return x.transpose(2, 3).reshape(b, T, H * D)


MERGE_MISTAKES = [
    Mistake(MERGE_WITHOUT_TRANSPOSE, _merge_without_transpose),
    Mistake("heads interleaved: the result must hold head 0's head_dim columns, then head 1's, ... Use "
            "transpose(1, 2) (or permute(0, 2, 1, 3)), not permute(0, 2, 3, 1).", _merge_interleaved),
    Mistake("the wrong pair of dimensions is transposed: swap the head and token dimensions, transpose(1, 2), to "
            "get (b, T, num_heads, head_dim) before merging the last two.", _merge_wrong_pair),
]


# ------------------------------------------------------------------------------------------
# MultiHeadAttention: mistaken classes with the reference's constructor
# ------------------------------------------------------------------------------------------
class AttentionCore(nn.Module):
    """The attention core of the course's multi-head classes, one step per method, so that a mistake
    changes one step: split the heads, score, mask, scale, softmax, dropout, merge, project."""

    def split(self, t: torch.Tensor) -> torch.Tensor:
        b, T, _ = t.shape
        return t.view(b, T, self.num_heads, self.head_dim).transpose(1, 2)

    def merge(self, c: torch.Tensor) -> torch.Tensor:
        b, H, T, D = c.shape
        return c.transpose(1, 2).reshape(b, T, H * D)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return q @ k.transpose(-2, -1)

    def future(self, T: int) -> torch.Tensor:
        return self.mask[:T, :T].bool()

    def masked(self, s: torch.Tensor, fill: float = float("-inf")) -> torch.Tensor:
        return s.masked_fill(self.future(s.shape[-1]), fill)

    def scale(self) -> float:
        return math.sqrt(self.head_dim)

    def weights(self, s: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.masked(s) / self.scale(), dim=-1)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``(b, H, T, D)`` queries, keys, values -> ``(b, T, d_out)`` merged context, before out_proj."""
        return self.merge(self.dropout(self.weights(self.scores(q, k))) @ v)


class _MHA(AttentionCore):
    """The book's MultiHeadAttention."""

    order = ("W_query", "W_key", "W_value")

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.d_out, self.num_heads, self.head_dim = d_out, num_heads, d_out // num_heads
        for name in self.order:
            setattr(self, name, nn.Linear(d_in, d_out, bias=qkv_bias))
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.ones(context_length, context_length, dtype=torch.bool).triu(1))

    def project(self, x):
        return tuple(self.split(layer(x)) for layer in (self.W_query, self.W_key, self.W_value))

    def forward(self, x):
        return self.out_proj(self.attend(*self.project(x)))


def variant(base: type, name: str, **methods) -> type:
    """``base`` with some methods replaced: one mistake."""
    return type(name, (base,), methods)


def _mha(name: str, **methods) -> type:
    return variant(_MHA, name, **methods)


def _split_view_only(self, t):
    b, T, _ = t.shape
    return t.reshape(b, self.num_heads, T, self.head_dim)


def _split_interleaved_heads(self, t):
    b, T, _ = t.shape
    return t.reshape(b, T, self.head_dim, self.num_heads).permute(0, 3, 1, 2)


def _merge_view_only(self, c):
    b, H, T, D = c.shape
    return c.reshape(b, T, H * D)


def _diagonal_too(self, T):
    return self.mask[:T, :T].bool() | torch.eye(T, dtype=torch.bool, device=self.mask.device)


def _softmax_then_mask(self, s):
    return torch.softmax(s / self.scale(), dim=-1).masked_fill(self.future(s.shape[-1]), 0.0)


def _dropout_before_softmax(self, q, k, v):
    s = self.dropout(self.masked(self.scores(q, k)))
    return self.merge(torch.softmax(s / self.scale(), dim=-1) @ v)


def _dropout_on_context(self, q, k, v):
    return self.dropout(self.merge(self.weights(self.scores(q, k)) @ v))


def _dropout_on_values(self, q, k, v):
    return self.merge(self.weights(self.scores(q, k)) @ self.dropout(v))


def _dropout_always(self, q, k, v):
    w = nn.functional.dropout(self.weights(self.scores(q, k)), self.dropout.p, training=True)
    return self.merge(w @ v)


NO_SCALING = "the scores are not scaled: divide them by sqrt(head_dim) before the softmax."
SCALED_BY_D_OUT = ("the scores are divided by sqrt(d_out); each head divides by sqrt(head_dim), head_dim = d_out // "
                   "num_heads.")
SCALED_BY_HEAD_DIM = "the scores are divided by head_dim instead of sqrt(head_dim): divide by head_dim ** 0.5."
FILLED_WITH_ZERO = ("the masked scores are set to 0 instead of -inf: a score of 0 still gets the weight exp(0) = 1, so "
                    "the future is seen. Fill with -inf (float('-inf') or -torch.inf).")
NOT_RENORMALISED = ("each row of weights no longer sums to 1: the future is zeroed after the softmax, which had "
                    "already spread each row over all T keys. Mask the scores with -inf before the softmax.")
NO_MASK = ("no mask is applied: every position sees the future. Fill the scores where self.mask is True (cut to "
           "[:T, :T]) with -inf before the softmax.")
DIAGONAL_MASKED = ("the diagonal is masked too: token 0 has no allowed key left, so its row of scores is all masked and "
                   "it spreads its weight over the future (with -inf: 0/0 = NaN). A token must see itself: mask only "
                   "j > i (triu with diagonal=1).")
INVERTED_MASK = ("the mask is inverted: it hides the past (j < i) instead of the future (j > i). Use triu with "
                 "diagonal=1, not tril.")
SOFTMAX_OVER_QUERIES = ("the softmax is over the queries (dim=-2): each row of weights must sum to 1, so take it over "
                        "the keys, dim=-1.")
TRANSPOSED_SCORES = ("the scores are transposed (keys @ queries^T), or W_query and W_key swap roles (created in another "
                     "order than W_query, W_key, W_value?): row i must be query i against every key, "
                     "queries @ keys.transpose(2, 3).")
DROPOUT_BEFORE_SOFTMAX = ("dropout is applied to the scores, before the softmax: apply it to the attention weights, "
                          "after the softmax.")
DROPOUT_ON_CONTEXT = ("dropout is applied to the context vectors (or after out_proj): apply it to the attention weights, "
                      "before multiplying by the values.")
DROPOUT_ON_VALUES = "dropout is applied to the values: apply it to the attention weights."
DROPOUT_ALWAYS = ("dropout is active in eval() mode: use self.dropout (nn.Dropout), or F.dropout(weights, p, "
                  "training=self.training).")


def core_mistakes(base: type) -> list[Mistake]:
    """The mistakes any of the course's multi-head classes can make in its attention core."""
    def v(name, **methods):
        return variant(base, name, **methods)

    return [
        Mistake(MERGE_WITHOUT_TRANSPOSE.replace("(b, T, d)", "(b, T, d_out)"), v("MergeWithoutTranspose",
                                                                                 merge=_merge_view_only)),
        Mistake(SCALED_BY_D_OUT, v("ScaledByDout", scale=lambda self: math.sqrt(self.d_out))),
        Mistake(NO_SCALING, v("NoScaling", scale=lambda self: 1.0)),
        Mistake(SCALED_BY_HEAD_DIM, v("ScaledByHeadDim", scale=lambda self: float(self.head_dim))),
        Mistake(FILLED_WITH_ZERO, v("FilledWithZero", weights=lambda self, s: torch.softmax(
            self.masked(s, 0.0) / self.scale(), dim=-1))),
        Mistake(NOT_RENORMALISED, v("MaskAfterSoftmax", weights=_softmax_then_mask)),
        Mistake(NO_MASK, v("NoMask", masked=lambda self, s, fill=0.0: s)),
        *[Mistake(DIAGONAL_MASKED, v("DiagonalMasked", future=_diagonal_too,
                                     masked=lambda self, s, fill=float("-inf"), big=big: s.masked_fill(
                                         self.future(s.shape[-1]), big)))
          for big in (float("-inf"), -1e9)],
        Mistake(INVERTED_MASK, v("Inverted", future=lambda self, T: self.mask[:T, :T].bool().mT)),
        Mistake(SOFTMAX_OVER_QUERIES, v("SoftmaxOverQueries", weights=lambda self, s: torch.softmax(
            self.masked(s) / self.scale(), dim=-2))),
        Mistake(TRANSPOSED_SCORES, v("Transposed", scores=lambda self, q, k: k @ q.transpose(-2, -1))),
        Mistake(DROPOUT_BEFORE_SOFTMAX, v("DropoutBeforeSoftmax", attend=_dropout_before_softmax)),
        Mistake(DROPOUT_ON_CONTEXT, v("DropoutOnContext", attend=_dropout_on_context)),
        Mistake(DROPOUT_ON_VALUES, v("DropoutOnValues", attend=_dropout_on_values)),
        Mistake(DROPOUT_ALWAYS, v("DropoutAlways", attend=_dropout_always)),
    ]


MHA_MISTAKES = [
    Mistake("view without transpose when splitting the heads: .view(b, num_heads, T, head_dim) mixes tokens across "
            "heads; view as (b, T, num_heads, head_dim), then transpose(1, 2).", _mha("SplitWithoutTranspose",
                                                                                      split=_split_view_only)),
    Mistake("view without transpose, both when splitting and when merging the heads: view as (b, T, num_heads, "
            "head_dim), then transpose(1, 2); merge with transpose(1, 2), then reshape.",
            _mha("NoTransposeAtAll", split=_split_view_only, merge=_merge_view_only)),
    Mistake(HEADS_INTERLEAVED, _mha("InterleavedHeads", split=_split_interleaved_heads)),
    Mistake("out_proj is created but not applied: return self.out_proj(context), not the merged context itself.",
            _mha("OutProjNotApplied", forward=lambda self, x: self.attend(*self.project(x)))),
    Mistake("the values are not W_value(x): multiply the weights by values = self.W_value(x), split into heads.",
            _mha("ValuesFromKeys", project=lambda self, x: tuple(self.split(layer(x)) for layer in (
                self.W_query, self.W_key, self.W_key)))),
    *core_mistakes(_MHA),
    *[Mistake(f"the projections are created in the order {', '.join(order)}: create W_query, W_key, W_value (then "
              f"out_proj), so that the course's seed gives them the book's weights.",
              _mha("Order_" + "_".join(order), order=order))
      for order in (("W_query", "W_value", "W_key"), ("W_value", "W_query", "W_key"),
                    ("W_value", "W_key", "W_query"), ("W_key", "W_value", "W_query"))],
]


# ------------------------------------------------------------------------------------------
# count_parameters: mistaken functions of a module
# ------------------------------------------------------------------------------------------
BUFFERS_COUNTED = ("buffers are counted too (the mask is a buffer): buffers are not trained. Count "
                   "module.parameters() with requires_grad, not state_dict() or buffers().")
TENSORS_COUNTED = "that is the number of parameter TENSORS; count their elements with p.numel()."


def _with_buffers(module: nn.Module, count: int) -> int | None:
    return count if any(True for _ in module.buffers()) else None


def _unless_zero(count: int) -> int | None:
    return count or None


def _own_parameters_each(module):
    """Every module's own trainable parameters, a shared one once per module that holds it."""
    return sum(p.numel() for m in module.modules() for p in m.parameters(recurse=False) if p.requires_grad)


COUNT_MISTAKES = [
    Mistake("parameters with requires_grad=False are counted too: count only the trainable ones, "
            "`if p.requires_grad`.", lambda module: sum(p.numel() for p in module.parameters())),
    # Without buffers these count something else (a shared weight twice, frozen parameters): named below.
    Mistake(BUFFERS_COUNTED, lambda module: _with_buffers(
        module, sum(t.numel() for t in module.state_dict().values()))),
    Mistake(BUFFERS_COUNTED, lambda module: _with_buffers(module, sum(
        p.numel() for p in module.parameters() if p.requires_grad) + sum(b.numel() for b in module.buffers()))),
    Mistake(TENSORS_COUNTED, lambda module: len([p for p in module.parameters() if p.requires_grad])),
    Mistake(TENSORS_COUNTED, lambda module: len(list(module.parameters()))),
    Mistake("the biases are forgotten: every parameter counts, weights and biases alike.",
            lambda module: sum(p.numel() for n, p in module.named_parameters() if "bias" not in n and p.requires_grad)),
    # Both give 0 on a module without frozen (or own) parameters, which tells nothing: left to the check.
    Mistake("only the frozen parameters (requires_grad=False) are counted: count those with requires_grad=True.",
            lambda module: _unless_zero(sum(p.numel() for p in module.parameters() if not p.requires_grad))),
    Mistake("only the module's own parameters are counted, not its submodules': module.parameters() visits "
            "every submodule (recurse=True, the default).",
            lambda module: _unless_zero(sum(p.numel() for p in module.parameters(recurse=False) if p.requires_grad))),
    Mistake("a weight shared by two layers is counted twice: module.parameters() yields each shared tensor once.",
            _own_parameters_each),
]


MISTAKES = {
    "split_heads": SPLIT_MISTAKES,
    "merge_heads": MERGE_MISTAKES,
    "MultiHeadAttention": MHA_MISTAKES,
    "count_parameters": COUNT_MISTAKES,
}
