"""Notebook 09's hidden cases and known mistakes (instructor only; see the package docstring).

The mistakes of ``sinusoidal_positions`` are functions of ``(num_positions, d_model)``; those of the
modules are mistaken classes with the reference's constructor that load the checks' test weights
(:func:`course_utils.checks.nb09.set_test_weights`) as the checked modules do; those of
``train_step`` are traces (:func:`course_utils.checks.nb09.step_trace`) of a mistaken step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from course_utils import reference
from course_utils.checks.core import Case, rand
from course_utils.checks.nb09 import generate_trace, set_test_weights, step_trace, tokens
from course_utils.instructor import Mistake


# ------------------------------------------------------------------------------------------
# Hidden cases (seeds 9900-9999 and names starting "hidden:": used nowhere in the student edition)
# ------------------------------------------------------------------------------------------
def _sinusoid_cases() -> list[Case]:
    return [
        Case("hidden: 50 positions, d_model=64", (50, 64)),
        Case("hidden: 3 positions, d_model=10", (3, 10)),
        Case("hidden: 100 positions, d_model=2", (100, 2)),
    ]


def _learned_cases() -> list:
    return [
        ((5, 6), [Case("hidden: (4, 3, 6)", (rand(4, 3, 6, seed=9901),)),
                  Case("hidden: (1, 5, 6), T = context_length", (rand(1, 5, 6, seed=9902),))]),
        ((1, 3), [Case("hidden: context_length 1", (rand(2, 1, 3, seed=9903),))]),
    ]


def _block_cases() -> list:
    return [
        ((16, 4, 7, 0.1), [Case("hidden: four heads with dropout, (2, 7, 16)", (rand(2, 7, 16, seed=9911, low=-2, high=2),)),
                           Case("hidden: T=1", (rand(3, 1, 16, seed=9912, low=-2, high=2),))]),
        ((6, 1, 4, 0.0), [Case("hidden: one head, (2, 4, 6)", (rand(2, 4, 6, seed=9913, low=-3, high=3),))]),
    ]


def _gpt_cases() -> list:
    return [
        ((13, 16, 4, 3, 8, 0.1), [Case("hidden: three blocks, dropout 0.1, ids (2, 8)", (tokens(2, 8, 13, seed=9921),)),
                                  Case("hidden: one token", (tokens(3, 1, 13, seed=9922),))]),
        ((5, 6, 1, 1, 4, 0.0), [Case("hidden: one head, one block, ids (4, 3)", (tokens(4, 3, 5, seed=9923),))]),
        ((9, 12, 3, 2, 7, 0.1, "sinusoidal"), [Case("hidden: sinusoidal positions, dropout 0.1, ids (2, 7)",
                                                   (tokens(2, 7, 9, seed=9924),))]),
    ]


def _step_cases() -> list[dict]:
    return [
        {"vocab_size": 9, "d": 5, "b": 4, "T": 7, "answer_from": [0, 2, 5, 6], "optimizer": "SGD with momentum",
         "steps": 3, "seed": 9931},
        {"vocab_size": 6, "d": 3, "b": 1, "T": 9, "answer_from": 8, "optimizer": "SGD", "steps": 2, "seed": 9932},
        {"vocab_size": 8, "d": 6, "b": 3, "T": 5, "answer_from": 2, "optimizer": "AdamW", "steps": 2, "seed": 9933,
         "dropout": 0.3},
    ]


def _generate_cases() -> list[dict]:
    base = {"vocab_size": 9, "d": 5, "top_k": None, "prefill": 0}
    return [
        {**base, "name": "hidden: one sequence, a one-token prompt, 9 tokens read of 9", "context_length": 9, "b": 1,
         "runs": [(1, 9)], "temperature": 0.0, "use_cache": True, "seed": 9941},
        {**base, "name": "hidden: max_new_tokens=0 returns the prompt", "context_length": 6, "b": 2, "runs": [(4, 0)],
         "temperature": 1.0, "use_cache": True, "seed": 9942},
        {**base, "name": "hidden: top_k larger than the vocabulary", "context_length": 12, "b": 3, "runs": [(2, 8)],
         "temperature": 1.3, "top_k": 50, "use_cache": True, "seed": 9943},
        {**base, "name": "hidden: top_k=1 at temperature 3 is greedy", "context_length": 12, "b": 3, "runs": [(3, 7)],
         "temperature": 3.0, "top_k": 1, "use_cache": False, "seed": 9944},
        {**base, "name": "hidden: sampling at temperature 0.8 without the cache, five rows", "context_length": 10,
         "b": 5, "runs": [(2, 6)], "temperature": 0.8, "use_cache": False, "seed": 9945},
        {**base, "name": "hidden: three calls on one model with the cache", "context_length": 10, "b": 2,
         "runs": [(5, 5), (1, 4), (3, 7)], "temperature": 0.6, "top_k": 4, "use_cache": True, "seed": 9946},
        {**base, "name": "hidden: greedy after a stale cache of 6 tokens", "context_length": 10, "b": 2,
         "runs": [(3, 4)], "temperature": 0.0, "use_cache": True, "seed": 9947, "prefill": 6},
        {**base, "name": "hidden: a prompt longer than context_length", "context_length": 5, "b": 1,
         "runs": [(6, 1)], "temperature": 0.0, "use_cache": False, "seed": 9948, "says": ["6", "5"],
         "explain": "name the tokens the model would read, T0 + max_new_tokens - 1 = 6, and context_length = 5"},
    ]


HIDDEN = {
    "sinusoidal_positions": _sinusoid_cases,
    "LearnedPositionalEmbedding": _learned_cases,
    "TransformerBlock": _block_cases,
    "TinyGPT": _gpt_cases,
    "train_step": _step_cases,
    "generate": _generate_cases,
}


# ------------------------------------------------------------------------------------------
# sinusoidal_positions: mistaken functions
# ------------------------------------------------------------------------------------------
def _angles(num_positions: int, d_model: int, start: int = 0, exponent=None) -> torch.Tensor:
    positions = torch.arange(start, start + num_positions, dtype=torch.float32).unsqueeze(1)  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
    power = exponent(two_i, d_model) if exponent else two_i / d_model
    return positions / 10000.0 ** power  # (P, d/2)


def _interleave(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    return torch.stack([first, second], dim=-1).flatten(-2)  # (P, d/2, 2) -> (P, d)


def _sinusoid(num_positions, d_model, **kw):
    a = _angles(num_positions, d_model, **kw)
    return _interleave(torch.sin(a), torch.cos(a))


SINUSOID_MISTAKES = [
    Mistake("sin and cos are swapped: even columns (0, 2, ...) hold sin, odd columns (1, 3, ...) hold cos.",
            lambda P, d: _interleave(torch.cos(_angles(P, d)), torch.sin(_angles(P, d)))),
    Mistake("the sines fill the first half of the columns and the cosines the second half: interleave them, "
            "sin in column 2i and cos in column 2i + 1 (encodings[:, 0::2] and encodings[:, 1::2]).",
            lambda P, d: torch.cat([torch.sin(_angles(P, d)), torch.cos(_angles(P, d))], dim=1)),
    Mistake("the exponent is i / d_model for the pair index i: it must be 2i / d_model (the column index of the sine, "
            "divided by d_model), so torch.arange(0, d_model, 2) / d_model.",
            lambda P, d: _sinusoid(P, d, exponent=lambda two_i, dm: two_i / 2 / dm)),
    Mistake("the positions multiply 10000^(2i/d_model) instead of dividing by it: the angle is pos / 10000^(2i/d_model), "
            "so the frequencies fall from 1 to about 1/10000 across the columns.",
            lambda P, d: _sinusoid(P, d, exponent=lambda two_i, dm: -two_i / dm)),
    Mistake("the positions start at 1: position 0 is the first token, so use torch.arange(num_positions).",
            lambda P, d: _sinusoid(P, d, start=1)),
    Mistake("every column pair turns at the same speed, one radian per position: the exponent 2i / d_model became 0 "
            "(integer division 2i // d_model, or integer tensors?). Divide as floats: torch.arange(0, d_model, 2) "
            "/ d_model.", lambda P, d: _sinusoid(P, d, exponent=lambda two_i, dm: two_i * 0)),
    Mistake("the cosine in column 2i + 1 uses the exponent (2i + 1) / d_model: both columns of a pair share ONE "
            "frequency, 1 / 10000^(2i / d_model), computed from the sine's column 2i.",
            lambda P, d: _interleave(torch.sin(_angles(P, d)), torch.cos(
                _angles(P, d, exponent=lambda two_i, dm: (two_i + 1) / dm)))),
    Mistake("the frequencies use log10 instead of the natural log: exp(-2i * ln(10000) / d_model) needs "
            "math.log(10000.0), not math.log10.",
            lambda P, d: _sinusoid(P, d, exponent=lambda two_i, dm: two_i * 4.0 / dm / math.log(10000.0))),
]


# ------------------------------------------------------------------------------------------
# Modules: mistaken classes that load the checks' test weights
# ------------------------------------------------------------------------------------------
def _tested(cls: type) -> type:
    """``cls`` whose constructor ends by loading the checks' test weights."""
    def __init__(self, *args, **kwargs):
        cls.__init__(self, *args, **kwargs)
        set_test_weights(self)
    return type(cls.__name__, (cls,), {"__init__": __init__})


class _Learned(reference.LearnedPositionalEmbedding):
    def positions(self, T: int, device) -> torch.Tensor:
        return torch.arange(T, device=device)

    def forward(self, x):
        return x + self.embedding(self.positions(x.shape[1], x.device))


def _learned(name: str, **methods) -> type:
    return _tested(type(name, (_Learned,), methods))


LEARNED_MISTAKES = [
    Mistake("the positions are reversed: the first token gets position vector 0, so look up torch.arange(T).",
            _learned("Reversed", positions=lambda self, T, device: torch.arange(T - 1, -1, -1, device=device))),
    Mistake("the positions start at 1: the first token gets row 0 of the table, torch.arange(T).",
            _learned("FromOne", positions=lambda self, T, device: torch.arange(1, T + 1, device=device))),
    Mistake("the last T rows of the table are used: the first token gets row 0, so look up torch.arange(T) (rows "
            "0..T-1).", _learned("LastRows", positions=lambda self, T, device: torch.arange(
                self.context_length - T, self.context_length, device=device))),
    Mistake("the position vectors multiply x: ADD them, x + positions (each token's vector moves by its "
            "position's vector).", _learned("Multiplied", forward=lambda self, x: x * self.embedding(
                self.positions(x.shape[1], x.device)))),
]


class _Block(reference.TransformerBlock):
    """The reference block, one step per method, so that a mistake changes one step."""

    def attention_branch(self, x):
        return self.drop_resid(self.att(self.norm1(x)))

    def ff_branch(self, x):
        return self.drop_resid(self.ff(self.norm2(x)))

    def forward(self, x):
        x = x + self.attention_branch(x)
        return x + self.ff_branch(x)


def _block(name: str, **methods) -> type:
    return _tested(type(name, (_Block,), methods))


def _post_ln(self, x):
    x = self.norm1(x + self.drop_resid(self.att(x)))
    return self.norm2(x + self.drop_resid(self.ff(x)))


def _norm_after_branch(self, x):
    x = x + self.drop_resid(self.norm1(self.att(x)))
    return x + self.drop_resid(self.norm2(self.ff(x)))


def _relu_ff(self, x):
    h = torch.relu(self.ff[0](self.norm2(x)))
    return self.drop_resid(self.ff[2](h))


def _dropout_after_add(self, x):
    x = self.drop_resid(x + self.att(self.norm1(x)))
    return self.drop_resid(x + self.ff(self.norm2(x)))


def _normalised_residual(self, x):
    h = self.norm1(x)
    x = h + self.drop_resid(self.att(h))
    h = self.norm2(x)
    return h + self.drop_resid(self.ff(h))


def _att_normalised_residual(self, x):
    h = self.norm1(x)
    x = h + self.drop_resid(self.att(h))
    return x + self.ff_branch(x)


def _ff_normalised_residual(self, x):
    x = x + self.attention_branch(x)
    h = self.norm2(x)
    return h + self.drop_resid(self.ff(h))


def _parallel(self, x):
    return x + self.attention_branch(x) + self.ff_branch(x)


def _tanh_ff(self, x):
    h = F.gelu(self.ff[0](self.norm2(x)), approximate="tanh")
    return self.drop_resid(self.ff[2](h))


POST_LN = ("the LayerNorm comes after the residual addition (post-LN, the original 2017 transformer): this block is "
           "pre-LN, like GPT-2: x = x + att(norm1(x)), then x = x + ff(norm2(x)).")
NO_RESIDUAL_ATT = ("the residual connection around the attention is missing: add the branch's output back to its "
                   "input, x = x + dropout(att(norm1(x))).")
NO_RESIDUAL_FF = ("the residual connection around the feed-forward network is missing: return x + "
                  "dropout(ff(norm2(x))), not the branch alone.")

BLOCK_MISTAKES = [
    Mistake(NO_RESIDUAL_ATT, _block("NoResidualAtt", forward=lambda self, x: (lambda h: h + self.ff_branch(h))(
        self.attention_branch(x)))),
    Mistake(NO_RESIDUAL_FF, _block("NoResidualFF", forward=lambda self, x: self.ff_branch(x + self.attention_branch(x)))),
    Mistake("no residual connections at all: each branch's output is added back to its input, x = x + branch(x).",
            _block("NoResidual", forward=lambda self, x: self.ff_branch(self.attention_branch(x)))),
    Mistake(POST_LN, _block("PostLN", forward=_post_ln)),
    Mistake("the LayerNorm is applied to the branch's output instead of its input: normalise first, "
            "x + dropout(att(norm1(x))).", _block("NormAfterBranch", forward=_norm_after_branch)),
    Mistake("the feed-forward network uses ReLU: GPT-2's uses GELU (nn.GELU()) between its two layers.",
            _block("ReLU", ff_branch=_relu_ff)),
    Mistake("norm1 is used before both branches: norm2 belongs before the feed-forward network.",
            _block("Norm1Twice", ff_branch=lambda self, x: self.drop_resid(self.ff(self.norm1(x))))),
    Mistake("norm1 and norm2 are swapped: norm1 goes before the attention, norm2 before the feed-forward network.",
            _block("NormsSwapped", attention_branch=lambda self, x: self.drop_resid(self.att(self.norm2(x))),
                   ff_branch=lambda self, x: self.drop_resid(self.ff(self.norm1(x))))),
    Mistake("dropout is applied after the residual addition: drop the branch's output BEFORE adding it to x, so "
            "that the residual path itself is never dropped.", _block("DropoutAfterAdd", forward=_dropout_after_add)),
    Mistake("the residual branches have no dropout: x = x + dropout(att(norm1(x))) and x + dropout(ff(norm2(x))).",
            _block("NoResidualDropout", attention_branch=lambda self, x: self.att(self.norm1(x)),
                   ff_branch=lambda self, x: self.ff(self.norm2(x)))),
    Mistake("norm1 is never applied: the attention must read the normalised input, att(norm1(x)).",
            _block("NoNorm1", attention_branch=lambda self, x: self.drop_resid(self.att(x)))),
    Mistake("norm2 is never applied: the feed-forward network must read the normalised input, ff(norm2(x)).",
            _block("NoNorm2", ff_branch=lambda self, x: self.drop_resid(self.ff(x)))),
    Mistake("the residual adds the NORMALISED x: h = norm1(x); x = h + att(h) puts the norm on the residual path. "
            "Keep the un-normalised x for the addition: x = x + att(norm1(x)).",
            _block("NormalisedResidual", forward=_normalised_residual)),
    Mistake("the attention's residual adds the NORMALISED x: x was overwritten by norm1(x) before the attention. Keep "
            "the un-normalised x for the addition: x = x + att(norm1(x)).",
            _block("AttNormalisedResidual", forward=_att_normalised_residual)),
    Mistake("the feed-forward's residual adds the NORMALISED x: x was overwritten by norm2(x) before the feed-forward "
            "network, so the second residual adds norm2(x) instead of the block's x after the attention. Keep it: "
            "x = x + ff(norm2(x)).", _block("FFNormalisedResidual", forward=_ff_normalised_residual)),
    Mistake("the two branches run side by side on the same x (x + att(norm1(x)) + ff(norm2(x))): the feed-forward "
            "branch must read x AFTER the attention's residual addition.", _block("Parallel", forward=_parallel)),
    Mistake("the feed-forward network uses GELU's tanh approximation (nn.GELU(approximate='tanh'), as the original "
            "GPT-2 code does): this course's block uses the exact nn.GELU().", _block("TanhGELU", ff_branch=_tanh_ff)),
]


class _GPT(reference.TinyGPT):
    """The reference model, one step per method."""

    def embed(self, idx):
        return self.pos_emb(self.tok_emb(idx))

    def forward(self, idx):
        x = self.blocks(self.drop_emb(self.embed(idx)))
        return self.out_head(self.final_norm(x))


def _gpt(name: str, **methods) -> type:
    return _tested(type(name, (_GPT,), methods))


def _positions_after_blocks(self, idx):
    x = self.blocks(self.drop_emb(self.tok_emb(idx)))
    return self.out_head(self.final_norm(self.pos_emb(x)))


def _positions_after_dropout(self, idx):
    x = self.blocks(self.pos_emb(self.drop_emb(self.tok_emb(idx))))
    return self.out_head(self.final_norm(x))


def _each_block_from_embeddings(self, idx):
    x = self.drop_emb(self.embed(idx))
    h = x
    for block in self.blocks:
        h = block(x)
    return self.out_head(self.final_norm(h))


def _norm_after_every_block(self, idx):
    x = self.drop_emb(self.embed(idx))
    for block in self.blocks:
        x = self.final_norm(block(x))
    return self.out_head(x)


def _blocks_reversed(self, idx):
    x = self.drop_emb(self.embed(idx))
    for block in reversed(self.blocks):
        x = block(x)
    return self.out_head(self.final_norm(x))


POSITIONS_AFTER_BLOCKS = ("the positions are added after the blocks: the attention then never sees them and cannot "
                          "tell the order of the tokens. Add them to the token embeddings, before the first block.")

GPT_MISTAKES = [
    Mistake(POSITIONS_AFTER_BLOCKS, _gpt("PositionsAfterBlocks", forward=_positions_after_blocks)),
    Mistake("no positions are added: the model sees the tokens only. Add self.pos_emb's vectors to the token "
            "embeddings.", _gpt("NoPositions", embed=lambda self, idx: self.tok_emb(idx))),
    Mistake("the final LayerNorm is not applied: logits = out_head(final_norm(x)).",
            _gpt("NoFinalNorm", forward=lambda self, idx: self.out_head(self.blocks(self.drop_emb(self.embed(idx)))))),
    Mistake("the logits are passed through a softmax: return the raw logits; F.cross_entropy applies log-softmax "
            "itself.", _gpt("Softmax", forward=lambda self, idx: torch.softmax(_GPT.forward(self, idx), dim=-1))),
    Mistake("the token embeddings are scaled by sqrt(d_model) (as in the 2017 transformer): GPT-2 adds them to the "
            "positions unscaled.", _gpt("Scaled", embed=lambda self, idx: self.pos_emb(
                self.tok_emb(idx) * math.sqrt(self.tok_emb.embedding_dim)))),
    Mistake("dropout acts on the token embeddings before the positions are added: drop the sum, "
            "drop_emb(tokens + positions).", _gpt("DropoutBeforePositions", forward=_positions_after_dropout)),
    Mistake("the embeddings get no dropout: x = drop_emb(tok_emb(idx) + positions) before the first block.",
            _gpt("NoEmbeddingDropout", forward=lambda self, idx: self.out_head(self.final_norm(self.blocks(
                self.embed(idx)))))),
    Mistake("every block reads the embeddings instead of the previous block's output, so only the last block "
            "counts: x = block(x) in the loop.", _gpt("EachBlockFromEmbeddings", forward=_each_block_from_embeddings)),
    Mistake("final_norm is applied after every block: apply it once, after the last block (each block's residual "
            "path stays free of norms).", _gpt("NormAfterEveryBlock", forward=_norm_after_every_block)),
    Mistake("the token embeddings are added twice: pos_emb(x) already returns x + the position vectors, so "
            "x = pos_emb(tok_emb(idx)), not tok_emb(idx) + pos_emb(tok_emb(idx)).",
            _gpt("TokensTwice", embed=lambda self, idx: self.tok_emb(idx) + self.pos_emb(self.tok_emb(idx)))),
    Mistake("the blocks run in reverse order: x passes blocks[0] first, then blocks[1], ...",
            _gpt("BlocksReversed", forward=_blocks_reversed)),
]


# ------------------------------------------------------------------------------------------
# train_step: traces of mistaken steps
# ------------------------------------------------------------------------------------------
def _all_positions(model, batch, optimizer):
    inputs, targets, _ = batch
    logits = model(inputs)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _no_zero_grad(model, batch, optimizer):
    inputs, targets, mask = batch
    loss = F.cross_entropy(model(inputs)[mask], targets[mask])
    loss.backward()
    optimizer.step()
    return loss.item()


def _no_step(model, batch, optimizer):
    inputs, targets, mask = batch
    loss = F.cross_entropy(model(inputs)[mask], targets[mask])
    optimizer.zero_grad()
    loss.backward()
    return loss.item()


def _zero_grad_before_step(model, batch, optimizer):
    inputs, targets, mask = batch
    loss = F.cross_entropy(model(inputs)[mask], targets[mask])
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()
    return loss.item()


def _summed(model, batch, optimizer):
    inputs, targets, mask = batch
    loss = F.cross_entropy(model(inputs)[mask], targets[mask], reduction="sum")
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _unshifted(model, batch, optimizer):
    inputs, targets, mask = batch
    loss = F.cross_entropy(model(inputs)[mask], inputs[mask])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _prompt_only(model, batch, optimizer):
    inputs, targets, mask = batch
    if mask.all():
        return None
    loss = F.cross_entropy(model(inputs)[~mask], targets[~mask])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _loss_before_step_after(model, batch, optimizer):
    inputs, targets, mask = batch
    optimizer.zero_grad()
    loss = F.cross_entropy(model(inputs)[mask], targets[mask])
    loss.backward()
    optimizer.step()
    return F.cross_entropy(model(inputs)[mask], targets[mask]).item()


def _softmax_first(model, batch, optimizer):
    inputs, targets, mask = batch
    loss = F.cross_entropy(torch.softmax(model(inputs)[mask], dim=-1), targets[mask])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _nll_on_logits(model, batch, optimizer):
    inputs, targets, mask = batch
    loss = F.nll_loss(model(inputs)[mask], targets[mask])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _log_softmax_over_positions(model, batch, optimizer):
    inputs, targets, mask = batch
    loss = F.nll_loss(F.log_softmax(model(inputs)[mask], dim=0), targets[mask])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _eval_mode(model, batch, optimizer):
    model.eval()
    return reference.train_step(model, batch, optimizer)


def _last_position_only(model, batch, optimizer):
    inputs, targets, mask = batch
    loss = F.cross_entropy(model(inputs)[:, -1], targets[:, -1])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _shifted_twice(model, batch, optimizer):
    inputs, targets, mask = batch
    logits = model(inputs)
    keep = mask[:, 1:]
    if not keep.any():
        return None
    loss = F.cross_entropy(logits[:, :-1][keep], targets[:, 1:][keep])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _mean_per_sequence(model, batch, optimizer):
    inputs, targets, mask = batch
    losses = F.cross_entropy(model(inputs).transpose(1, 2), targets, reduction="none")  # (b, T)
    loss = ((losses * mask).sum(dim=1) / mask.sum(dim=1)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _traced(step, applies=lambda spec: True):
    def trace(spec):
        if not applies(spec):
            return None
        result = step_trace(step, spec)
        return None if any(loss is None for loss in result["loss"]) else result
    return trace


def _with_sgd(spec) -> bool:
    """Where a mistake's steps are recorded with SGD only: its gradients are so small in places that AdamW, which
    divides each by its own size, turns rounding into steps of the learning rate (another CPU then records other
    parameters, 0.07 apart)."""
    return spec["optimizer"] == "SGD"


STEP_MISTAKES = [
    Mistake("the loss is taken over every position, the prompt's digits too: they are random and cannot be "
            "predicted. Take the loss on the answer positions only: logits[answer_mask], targets[answer_mask].",
            _traced(_all_positions)),
    Mistake("the loss is taken on the prompt positions instead of the answer positions: select "
            "logits[answer_mask], targets[answer_mask].", _traced(_prompt_only)),
    Mistake("optimizer.zero_grad() is never called, so every backward adds to the gradients of the steps before: call "
            "optimizer.zero_grad() in every step, before loss.backward().", _traced(_no_zero_grad)),
    Mistake("optimizer.step() is never called: the gradients are computed but the parameters never change.",
            _traced(_no_step)),
    Mistake("the gradients were gone when optimizer.step() ran: either loss.backward() is never called, or "
            "optimizer.zero_grad() runs between loss.backward() and optimizer.step() and wipes them. Call "
            "optimizer.zero_grad() BEFORE loss.backward(), then optimizer.step().", _traced(_zero_grad_before_step)),
    Mistake("the loss is summed over the answer tokens: take their mean (F.cross_entropy's default reduction).",
            _traced(_summed)),
    Mistake("the targets are the inputs themselves: the model must predict the NEXT token, which is in targets.",
            _traced(_unshifted)),
    Mistake("the returned loss is computed again after the step: return the loss you stepped with, loss.item().",
            _traced(_loss_before_step_after)),
    Mistake("a softmax is applied before F.cross_entropy: cross_entropy takes the raw logits and applies "
            "log-softmax itself. A softmax first squashes the logits into 0..1, so the loss can hardly move.",
            _traced(_softmax_first)),
    Mistake("F.nll_loss is given the raw logits: it expects LOG-probabilities. Use F.cross_entropy on the logits "
            "(or F.nll_loss(F.log_softmax(logits, dim=-1), targets)).", _traced(_nll_on_logits)),
    Mistake("the log-softmax is taken over dim=0, the answer positions, of the (n, V) logits: each prediction's "
            "log-probabilities must be normalised over the vocabulary, F.log_softmax(logits[answer_mask], dim=-1) "
            "before F.nll_loss (or F.cross_entropy on the logits, which does both).",
            _traced(_log_softmax_over_positions, _with_sgd)),
    Mistake("the model is switched to eval() inside train_step: dropout must stay on while training (training.train "
            "sets model.train(); answer_accuracy switches to eval() itself).", _traced(_eval_mode)),
    Mistake("the loss is taken at the last position only: every answer position predicts a token, so take "
            "logits[answer_mask] and targets[answer_mask].", _traced(_last_position_only)),
    Mistake("the targets are shifted once more: targets[:, t] already is the token after inputs[:, t], so compare "
            "logits[answer_mask] with targets[answer_mask] as they are.", _traced(_shifted_twice)),
    Mistake("each sequence's loss is averaged first, then the sequences: with different numbers of answer tokens "
            "per row that weights tokens unequally. Take one mean over all answer tokens, "
            "F.cross_entropy(logits[answer_mask], targets[answer_mask]).", _traced(_mean_per_sequence)),
]


# ------------------------------------------------------------------------------------------
# generate: traces of mistaken generation loops (one flaw each)
# ------------------------------------------------------------------------------------------
@torch.no_grad()
def _generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, *, flaw=""):
    """``reference.generate`` with one ``flaw`` (named below)."""
    if max_new_tokens < 0 or temperature < 0 or (top_k is not None and top_k < 1):
        raise ValueError(f"bad argument: max_new_tokens, temperature or top_k ({max_new_tokens}, {temperature}, {top_k})")
    T0 = prompt_ids.shape[1]
    needed = T0 + max_new_tokens - 1
    if flaw != "no length check" and needed > model.context_length:
        raise ValueError(f"{needed} positions, but context_length is {model.context_length}")
    model.eval()
    if use_cache and flaw != "no reset":
        model.reset_cache()
    tokens = prompt_ids
    for step in range(max_new_tokens):
        if use_cache:
            new = tokens if step == 0 or flaw == "whole sequence with the cache" else tokens[:, -1:]
            logits = model(new, use_cache=True)
        else:
            logits = model(tokens)
        logits = logits[:, 0] if flaw == "first position" else logits[:, -1]  # (b, V)
        if flaw == "divides before the greedy check":
            logits = logits / temperature  # at temperature 0: +-inf, NaN where a logit is 0
        if temperature == 0 and flaw != "samples at temperature 0" or flaw == "always greedy":
            next_token = logits.argmax(dim=-1, keepdim=True)
        else:
            if flaw == "temperature multiplies":
                logits = logits * temperature
            elif flaw not in ("temperature after softmax", "samples at temperature 0", "divides before the greedy check"):
                logits = logits / temperature
            if top_k is not None:
                k = min(top_k, logits.shape[-1])
                if flaw == "top_k keeps the smallest":
                    kth = torch.topk(logits, k, dim=-1, largest=False).values[:, -1:]
                    logits = logits.masked_fill(logits > kth, float("-inf"))
                elif flaw == "top_k keeps k + 1":
                    kth = torch.topk(logits, min(k + 1, logits.shape[-1]), dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                elif flaw == "top_k keeps only the largest":
                    kth = torch.topk(logits, k, dim=-1).values[:, :1]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                elif flaw == "top_k keeps k - 1":
                    kth = torch.topk(logits, k, dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits <= kth, float("-inf"))
                elif flaw == "top_k threshold from probabilities":
                    kth = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                elif flaw == "top_k threshold from indices":
                    kth = torch.topk(logits, k, dim=-1).indices[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                elif flaw == "sample among the top k":
                    values, indices = torch.topk(logits, k, dim=-1)
                    choice = torch.multinomial(torch.softmax(values, dim=-1), num_samples=1)
                    tokens = torch.cat([tokens, indices.gather(1, choice)], dim=1)
                    continue
                else:
                    kth = torch.topk(logits, k, dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=0 if flaw == "softmax over the batch" else -1)
            if flaw == "temperature after softmax":
                probs = probs / temperature
            next_token = torch.multinomial(probs, num_samples=1)
        tokens = torch.cat([tokens, next_token], dim=1)
    if use_cache and flaw != "no reset":
        model.reset_cache()
    return tokens[:, T0:] if flaw == "prompt dropped" else tokens


def _generation(flaw: str, applies=lambda spec: True):
    def trace(spec):
        if not applies(spec):
            return None
        return generate_trace(lambda *args, **kwargs: _generate(*args, **kwargs, flaw=flaw), spec)
    return trace


def _top_k_below_vocabulary(spec) -> bool:
    """A top-k that drops tokens: where top_k keeps every token, a threshold taken from other values (probabilities,
    indices) is still some number, and its few sampled tokens can agree with other mistakes by chance."""
    return spec.get("top_k") is not None and spec["top_k"] < spec["vocab_size"] and spec.get("temperature", 0) > 0


GENERATE_MISTAKES = [
    Mistake("the temperature has no effect: the tokens are those of sampling at temperature 1. Is it applied on "
            "every path (with top_k too), and to the logits? Divide the LOGITS by the temperature, then take the "
            "softmax: dividing the probabilities after the softmax changes nothing, as torch.multinomial renormalises "
            "them.", _generation("temperature after softmax")),
    Mistake("the logits are multiplied by the temperature: DIVIDE them, logits / temperature (a high temperature "
            "flattens the distribution).", _generation("temperature multiplies")),
    Mistake("top_k keeps the k SMALLEST logits: keep the k largest, torch.topk(logits, k).values[:, -1:] is the k-th "
            "largest, and every logit below it becomes -inf.", _generation("top_k keeps the smallest")),
    Mistake("top_k keeps only k - 1 tokens: the k-th largest logit itself stays, so mask logits < kth, not <= kth.",
            _generation("top_k keeps k - 1")),
    Mistake("top_k keeps k + 1 candidates: the sampling kept one token too many. The threshold is the k-th largest "
            "logit, torch.topk(logits, k).values[:, -1:] (or the sorted logits' column k - 1, not column k), and every "
            "logit below it becomes -inf, so exactly k tokens stay.", _generation("top_k keeps k + 1")),
    Mistake("the top-k threshold is the k-th largest PROBABILITY (a topk of the softmax), but it is compared with the "
            "logits: a number between 0 and 1 against logits keeps every token whose logit is above it, not the top k. "
            "Take the k-th largest of the logits themselves, torch.topk(logits, k, dim=-1).values[:, -1:], and mask "
            "logits < kth.", _generation("top_k threshold from probabilities", _top_k_below_vocabulary)),
    Mistake("the top-k threshold is taken from torch.topk(...).indices, a token id, instead of .values, the k-th "
            "largest logit: the logits are compared with a position in the vocabulary. Use torch.topk(logits, k, "
            "dim=-1).values[:, -1:] and mask logits < kth.", _generation("top_k threshold from indices", _top_k_below_vocabulary)),
    Mistake("at temperature 0 the logits are divided by the temperature before the greedy branch: dividing by 0 "
            "makes them +-inf (NaN where a logit is 0), so argmax picks a wrong token. Test temperature == 0 first and "
            "take logits.argmax(dim=-1, keepdim=True) of the raw logits; divide by the temperature only when sampling.",
            _generation("divides before the greedy check")),
    Mistake("top_k keeps only the largest logit: the threshold is the k-th largest, the LAST of the k values, "
            "torch.topk(logits, k).values[:, -1:], not the first (values[:, :1], the maximum), which leaves one token "
            "to sample, as if greedy.", _generation("top_k keeps only the largest")),
    Mistake("the softmax is taken over dim=0, the batch: each row's probabilities must sum to 1 over the vocabulary, "
            "torch.softmax(logits / temperature, dim=-1).", _generation("softmax over the batch")),
    Mistake("at temperature 0 you sample: temperature 0 means greedy, logits.argmax(dim=-1, keepdim=True), no "
            "sampling.", _generation("samples at temperature 0")),
    Mistake("you always take the argmax: with a temperature above 0, sample with torch.multinomial from the softmax "
            "of logits / temperature.", _generation("always greedy")),
    Mistake("you sample among the k values torch.topk returns and map the choice back: the distribution is right, "
            "but the random draws are not ours. Sample from the full (b, V) softmax, with -inf outside the top k, as "
            "the exercise says.", _generation("sample among the top k")),
    Mistake("the logits of the FIRST position are used: the last position predicts the next token, logits[:, -1].",
            _generation("first position")),
    Mistake("the output is only the new tokens: return the prompt followed by them, (b, T0 + max_new_tokens).",
            _generation("prompt dropped")),
    Mistake("with use_cache=True every step feeds the whole sequence: the cache already holds the earlier tokens, so "
            "they are stored twice. After the prompt, feed only tokens[:, -1:].",
            _generation("whole sequence with the cache")),
    Mistake("model.reset_cache() is never called: the cache still holds the tokens of an earlier sequence when the "
            "prompt is read. Call it before reading the prompt.", _generation("no reset")),
]


MISTAKES = {
    "sinusoidal_positions": SINUSOID_MISTAKES,
    "LearnedPositionalEmbedding": LEARNED_MISTAKES,
    "TransformerBlock": BLOCK_MISTAKES,
    "TinyGPT": GPT_MISTAKES,
    "train_step": STEP_MISTAKES,
    "generate": GENERATE_MISTAKES,
}
