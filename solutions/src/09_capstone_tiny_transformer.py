# %% [markdown]
# # 09 · Capstone: train a tiny transformer with your own attention
#
# Every attention weight you have drawn so far came from **random** weights. In this notebook a
# model finally learns. You will put notebook 05's multi-head attention, with notebook 08's KV cache,
# into a complete GPT-style model, train it on your CPU in a few seconds, look at what its heads
# learned to attend to, and let it write with the cache.
#
# The task is **reversing a sequence of digits**: after `3 1 4 1 5 9 2 6 |` the model must write
# `6 2 9 5 1 4 1 3`. It needs attention (the next digit sits somewhere else in the sequence), and it
# needs to know *where* each digit sits. Position vectors tell the model that directly. Without
# them, one causal block cannot solve the task; two blocks learn most of it, because the causal mask
# itself leaks a little order, but far more slowly and not all of it (section 8 shows both).
#
# **In this notebook you will**
# 1. see that attention alone cannot tell word order: it is **permutation-equivariant**;
# 2. give tokens positions, fixed (`sinusoidal_positions`) or learned (`LearnedPositionalEmbedding`);
# 3. build a pre-LayerNorm transformer block (`TransformerBlock`) and a whole model (`TinyGPT`);
# 4. write one training step with the loss on the answer only (`train_step`), and train;
# 5. show what positions buy (sinusoidal ones train about as well as learned ones; without any,
#    the model learns slowly or not at all) and that attention replaced by an average fails;
# 6. find the head that does the reversal in the trained model's attention maps;
# 7. write text with notebook 08's KV cache (`generate`): greedy or sampled, and time the cache.
#
# Shapes use these letters: `b` = batch size, `T` = number of tokens, `d` = `d_model` (the size of
# every token's vector), `H` = number of heads, `V` = vocabulary size, `L` = number of blocks.
#
# How to work: fill in each cell that says `# YOUR CODE HERE`, run it, then run the check cell
# below it. A ✅ means your code agrees with ours on several inputs; a ❌ tells you what differs.

# %% setup=true

# %%
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils import checks, tasks, training

torch.manual_seed(123)
torch.set_num_threads(1)  # small tensors: one thread is as fast, and steady on a busy machine
print("torch", torch.__version__)

# %% [markdown]
# ## 0. Where notebook 05 left us
#
# `MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads)` maps `(b, T, d_in)` to
# `(b, T, d_out)`: queries, keys and values split into `H` heads of `d_out // H`, scores divided by
# `sqrt(head_dim)`, the future masked with a buffer, softmax, dropout on the weights, the heads merged
# and mixed by `out_proj`. Here it is with its helpers: our answers from notebooks 04 and 05, shown
# so that this notebook never depends on your own earlier answers. Run the cell.

# %% shows="causal_mask split_heads merge_heads MultiHeadAttention"
# Our answers from notebooks 04 and 05.
import math

import torch
import torch.nn as nn

from course_utils.validation import check_heads_divide, check_input_3d

# %% [markdown]
# Notebook 08 gave the same attention a **KV cache**: `MultiHeadAttentionKVCache(d_in, d_out,
# context_length, dropout, num_heads)` has exactly `MultiHeadAttention`'s parameters and outputs, and
# `forward(x, use_cache=True)` treats `x` as the **next** tokens of a sequence: it keeps their keys and
# values in `cache_k` and `cache_v` (`(b, H, tokens so far, D)`), and their queries attend to every
# cached key. `reset_cache()` starts a new sequence. Our model's blocks use it, so that section 10
# can write text with the cache. Here is our answer from notebook 08, with its rotary positions
# (`rope=True`), which this notebook does not use. Run the cell.

# %% shows="rope_angles apply_rope MultiHeadAttentionKVCache"
# Our answers from notebook 08.

# %% [markdown]
# ## 1. Attention cannot tell order
#
# Look at what attention computes for token `i`: a weighted sum of the values, with weights from
# `query_i · key_j`. Nothing in it says *where* token `j` is. Shuffle the tokens, and every token
# finds the same keys and values as before, only in another order; a sum does not care about order.
#
# So without a mask, shuffling the input shuffles the output **the same way** and changes nothing
# else: attention is **permutation-equivariant**. Let us check it with a `MultiHeadAttention` whose
# mask we switch off (every entry False: every token sees every token).

# %%
torch.manual_seed(123)
full = MultiHeadAttention(d_in=4, d_out=4, context_length=5, dropout=0.0, num_heads=2)
full.mask.fill_(False)  # no mask: bidirectional attention
x = torch.randn(1, 5, 4)  # (b, T, d): five tokens
perm = torch.tensor([3, 0, 4, 1, 2])  # a shuffle of the five positions

out = full(x)  # (1, 5, 4)
out_of_shuffled = full(x[:, perm])  # the tokens shuffled, then attention
print("attention(shuffled x) == shuffled attention(x):", torch.allclose(out_of_shuffled, out[:, perm], atol=1e-6))

# %% [markdown]
# The causal mask breaks the symmetry only a little. Token `i` sees tokens `0..i`, but it sees them
# as a **bag**: shuffle the tokens before it and its own output does not change.

# %%
torch.manual_seed(123)
causal = MultiHeadAttention(d_in=4, d_out=4, context_length=5, dropout=0.0, num_heads=2)
prefix_shuffled = torch.tensor([2, 0, 3, 1, 4])  # the first four tokens shuffled, the last one kept
last = causal(x)[:, -1]  # (1, 4): the last token's output
last_after_shuffle = causal(x[:, prefix_shuffled])[:, -1]
print("last token's output unchanged:", torch.allclose(last, last_after_shuffle, atol=1e-6))

# %% [markdown]
# For our task this is fatal. After `3 1 4 |` a model must write `4`, the digit just before the
# separator; after `4 1 3 |` it must write `3`. A one-block model without positions sees the same bag
# `{1, 3, 4, |}` at the separator both times, so it gives the same answer both times: it is wrong on
# at least one. We must tell the model where each token is.

# %% [markdown]
# ## 2. Positions
#
# The fix is simple: add to every token's vector a vector that depends on its **position**, before
# the first block. Token `3` at position 0 and token `3` at position 2 then have different vectors,
# and the queries and keys can use the difference. There are two common choices: fixed vectors from
# a formula, and learned ones.
#
# ### Fixed: sinusoids
#
# The original transformer ("Attention Is All You Need", 2017) uses sines and cosines of different
# frequencies. For position `pos` and column pair `i` (columns `2i` and `2i + 1`):
#
# $$PE[pos, 2i] = \sin\left(\frac{pos}{10000^{2i / d}}\right), \qquad
#   PE[pos, 2i + 1] = \cos\left(\frac{pos}{10000^{2i / d}}\right)$$
#
# The first pair of columns turns fast (one radian per position), the last pair very slowly, like
# the hands of a clock. Every position gets a different vector, with values in `[-1, 1]`, for any
# number of positions; and a shift by `k` positions is the same rotation of each column pair for
# every `pos`, which makes relative offsets easy to compute from these vectors.

# %% [markdown]
# ### Exercise 1: `sinusoidal_positions`
#
# Write `sinusoidal_positions(num_positions, d_model)` returning the `(num_positions, d_model)`
# float tensor above: row `pos` for position `pos = 0, 1, ...`; sines in the even columns, cosines in
# the odd ones. Raise a `ValueError` if `d_model` is odd (sin and cos come in pairs).
#
# Hint: `torch.arange(0, d_model, 2)` gives the column numbers `2i`; build a `(num_positions, 1)`
# column of positions and a `(d_model // 2,)` row of frequencies, and let broadcasting make the
# `(num_positions, d_model // 2)` angles. `pe[:, 0::2] = ...` fills the even columns.

# %% grade_id="sinusoidal_positions"
def sinusoidal_positions(num_positions: int, d_model: int) -> torch.Tensor:
    """(num_positions, d_model): sin in the even columns, cos in the odd columns."""
    ### BEGIN SOLUTION
    if d_model % 2 != 0:
        raise ValueError(f"d_model must be even (sin and cos come in pairs), got {d_model}")
    pos = torch.arange(num_positions, dtype=torch.float32).unsqueeze(1)  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)  # (d/2,)
    angles = pos / 10000 ** (two_i / d_model)  # (P, d/2)
    pe = torch.zeros(num_positions, d_model)  # (P, d)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe
    ### END SOLUTION

# %% grade_id="test_sinusoidal_positions" points=2
# Check: three sizes, and an odd d_model.
checks.check_sinusoidal_positions(sinusoidal_positions)
### BEGIN HIDDEN TESTS
checks.check_sinusoidal_positions(sinusoidal_positions, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Each row is one position's vector; each column a wave over the positions, slower to the right.
# In exercise 4 this table becomes one option of the model, `TinyGPT(..., positions="sinusoidal")`,
# and section 8 trains it.

# %%
pe = sinusoidal_positions(64, 32)  # (64, 32)
fig, (ax_map, ax_waves) = plt.subplots(1, 2, figsize=(11, 3.8))
image = ax_map.imshow(pe.numpy(), cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
ax_map.set_xlabel("column (dimension of the vector)")
ax_map.set_ylabel("position")
ax_map.set_title("sinusoidal_positions(64, 32)")
fig.colorbar(image, ax=ax_map, label="value")
for column in (0, 6, 14, 30):
    ax_waves.plot(pe[:, column].numpy(), label=f"column {column}")
ax_waves.set_xlabel("position")
ax_waves.set_ylabel("value")
ax_waves.set_title("some columns: fast on the left, slow on the right")
ax_waves.legend(fontsize=8, loc="lower left")
fig.tight_layout()
plt.show()

# %% [markdown]
# Add the positions to the inputs of section 1, and the symmetry is gone: the shuffled input now
# gives other outputs, not the old ones shuffled.

# %%
with_positions = x + sinusoidal_positions(5, 4)  # (1, 5, 4) + (5, 4)
shuffled_with_positions = x[:, perm] + sinusoidal_positions(5, 4)  # positions stay in place
print("still equivariant:", torch.allclose(full(shuffled_with_positions), full(with_positions)[:, perm], atol=1e-6))

# %% [markdown]
# ### Learned: one trained vector per position
#
# GPT-2 does something simpler: a table of `context_length` vectors, one per position, trained with
# the rest of the model. That is an `nn.Embedding(context_length, d_model)` looked up with the
# positions `0, 1, ..., T-1` instead of token ids. It cannot handle more positions than it was built
# for, but it learns whatever position code the task needs.

# %% [markdown]
# ### Exercise 2: `LearnedPositionalEmbedding`
#
# Write `LearnedPositionalEmbedding(context_length, d_model)`:
# - `__init__`: `self.embedding = nn.Embedding(context_length, d_model)`;
# - `forward(x, start=0)`: `x` is `(b, T, d_model)` (token embeddings); return `x` plus the vectors of
#   positions `start .. start + T - 1`, shape `(b, T, d_model)`. Make the positions with
#   `torch.arange(start, start + T, device=x.device)`, so that the module works on any device.
#   `start` is 0 for a whole sequence; section 10 passes the number of tokens a KV cache already
#   holds, so that new tokens continue where the cache stopped.
# - Positions past the table (`start + T > context_length`) must raise a **`ValueError` that names
#   the limit**, e.g. `f"positions {start}..{start + T - 1}, but context_length is {self.context_length}"`.
#   (`nn.Embedding` would raise an `IndexError` by itself, deep inside PyTorch; the course's modules
#   all raise a `ValueError`, here and in notebook 08.)

# %% grade_id="LearnedPositionalEmbedding"
class LearnedPositionalEmbedding(nn.Module):
    """x (b, T, d_model) -> x + the learned vectors of positions start..start+T-1."""

    def __init__(self, context_length: int, d_model: int):
        super().__init__()
        ### BEGIN SOLUTION
        self.context_length = context_length
        self.embedding = nn.Embedding(context_length, d_model)  # (context_length, d_model)
        ### END SOLUTION

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        ### BEGIN SOLUTION
        T = x.shape[1]
        if start + T > self.context_length:
            raise ValueError(f"positions {start}..{start + T - 1}, but context_length is {self.context_length}")
        positions = torch.arange(start, start + T, device=x.device)  # (T,)
        return x + self.embedding(positions)  # (b, T, d) + (T, d)
        ### END SOLUTION

# %% grade_id="test_LearnedPositionalEmbedding" points=2
# Check: outputs for several lengths and starts, too long an input (a ValueError), and a move to another device.
checks.check_LearnedPositionalEmbedding(LearnedPositionalEmbedding)
### BEGIN HIDDEN TESTS
checks.check_LearnedPositionalEmbedding(LearnedPositionalEmbedding, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Before training the table is random (`nn.Embedding` starts from a standard normal); training will
# shape it. The module adds `context_length * d_model` trained numbers:

# %%
positions = LearnedPositionalEmbedding(context_length=16, d_model=32)
print("table:", tuple(positions.embedding.weight.shape), "->", positions.embedding.weight.numel(), "parameters")
print("output:", tuple(positions(torch.zeros(2, 10, 32)).shape))  # (b, T, d): 10 of the 16 positions used

# %% [markdown]
# ## 3. The transformer block
#
# A transformer is a stack of identical **blocks**. Each block has two parts, and each part is a
# **residual branch**: its output is *added* to its input, so the block only has to learn a change,
# and gradients reach the lower blocks through the additions unchanged.
#
# 1. **Attention** lets each token collect information from earlier tokens.
# 2. A **feed-forward network** then works on each token alone: `Linear(d, 4d)`, GELU, `Linear(4d, d)`.
#    With its 4x wider middle layer it holds two thirds of each block's parameters: in GPT-2 small
#    (`d = 768`, 12 blocks) the feed-forward networks hold 56.7 M of the model's 124.4 M parameters,
#    the attention layers 28.3 M, and the token and position embeddings most of the rest (39.4 M).
#
# Each branch first normalises its input with `nn.LayerNorm(d)` (every token's vector to mean 0 and
# variance 1, then a trained scale and shift). GPT-2 normalises **before** each branch
# ("pre-LN"): the residual path from the input to the output passes no norm, which makes deep stacks
# train stably. The 2017 transformer normalised after the addition ("post-LN").
#
# ```
# x ─┬─ norm1 ─ attention ─ dropout ─(+)─┬─ norm2 ─ feed-forward ─ dropout ─(+)─ out
#    └───────────────────────────────────┘└──────────────────────────────────────┘
# ```

# %% [markdown]
# ### Exercise 3: `TransformerBlock`
#
# Write `TransformerBlock(d_model, num_heads, context_length, dropout)`, `(b, T, d)` -> `(b, T, d)`.
# Create, **in this order** (the check loads its test weights in parameter order):
# - `self.norm1 = nn.LayerNorm(d_model)`;
# - `self.att = MultiHeadAttentionKVCache(d_model, d_model, context_length, dropout, num_heads)`
#   (notebook 08's attention with a KV cache, section 0);
# - `self.norm2 = nn.LayerNorm(d_model)`;
# - `self.ff = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))`;
# - `self.drop_resid = nn.Dropout(dropout)`, for the output of each branch.
#
# `forward(x, use_cache=False)`: `x = x + drop_resid(att(norm1(x), use_cache=use_cache))`, then
# `x + drop_resid(ff(norm2(x)))`. The only new thing is `use_cache`, handed on to the attention: with
# `use_cache=True`, `x` holds the next tokens of the sequence whose keys and values `self.att` has
# cached (the feed-forward network works on each token alone, so it needs no cache).
#
# You may write your own attention module on `F.scaled_dot_product_attention` (notebook 06) instead
# of `MultiHeadAttentionKVCache`, if it has the same layers in the same order (`W_query`, `W_key`,
# `W_value`, `out_proj`), attributes `num_heads` and `head_dim` (section 9 reads them), and the same
# `forward(x, use_cache=False)` and `reset_cache()`.
#
# **Rule** (the check and the grader apply it): build the block from these parts. PyTorch's
# ready-made layers `nn.TransformerEncoderLayer`, `nn.TransformerDecoderLayer`,
# `nn.TransformerEncoder`, `nn.TransformerDecoder`, `nn.MultiheadAttention` and
# `F.multi_head_attention_forward` are not allowed: they skip the point.

# %% grade_id="TransformerBlock"
class TransformerBlock(nn.Module):
    """Pre-LN block: x + attention(norm1(x)), then x + ff(norm2(x)); (b, T, d) -> (b, T, d)."""

    def __init__(self, d_model: int, num_heads: int, context_length: int, dropout: float):
        super().__init__()
        ### BEGIN SOLUTION
        self.norm1 = nn.LayerNorm(d_model)
        self.att = MultiHeadAttentionKVCache(d_model, d_model, context_length, dropout, num_heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.drop_resid = nn.Dropout(dropout)
        ### END SOLUTION

    def forward(self, x: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        ### BEGIN SOLUTION
        x = x + self.drop_resid(self.att(self.norm1(x), use_cache=use_cache))  # (b, T, d)
        return x + self.drop_resid(self.ff(self.norm2(x)))  # (b, T, d)
        ### END SOLUTION

# %% grade_id="test_TransformerBlock" points=4
# Check: parameter shapes, outputs in eval() and train() mode, causality, dropout, .to(), and the
# cached path (the input fed in pieces with use_cache=True gives the whole input's outputs).
checks.check_TransformerBlock(TransformerBlock)
### BEGIN HIDDEN TESTS
checks.check_TransformerBlock(TransformerBlock, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# A block keeps the shape, so blocks stack. Where are its parameters?

# %%
block = TransformerBlock(d_model=32, num_heads=2, context_length=16, dropout=0.0)
for name, part in (("norm1", block.norm1), ("att", block.att), ("norm2", block.norm2), ("ff", block.ff)):
    print(f"{name:6s} {sum(p.numel() for p in part.parameters()):6,} parameters")
print("output:", tuple(block(torch.randn(2, 16, 32)).shape))  # (b, T, d)

# %% [markdown]
# The feed-forward network has twice the attention's parameters (`8d²` against `4d²`), as in GPT-2.

# %% [markdown]
# ## 4. The whole model
#
# A GPT maps token ids `(b, T)` to **logits** `(b, T, V)`: at every position, one score per
# vocabulary entry for the *next* token.
#
# 1. token embeddings `(b, T, d)`, plus position vectors;
# 2. dropout; the `L` blocks;
# 3. a final LayerNorm (the last block's output has passed no norm since its residual additions);
# 4. a linear **head** `d -> V` without bias: the logits.
#
# Because every block is causal and everything else works on each token alone, the logits at
# position `t` depend on tokens `0..t` only: the model can be trained on all positions at once and
# still never cheats by looking ahead.

# %% [markdown]
# ### Exercise 4: `TinyGPT`
#
# Write `TinyGPT(vocab_size, d_model, num_heads, num_layers, context_length, dropout,
# positions="learned")`. Create, in this order:
# - `self.tok_emb = nn.Embedding(vocab_size, d_model)`;
# - `self.pos_emb`: `LearnedPositionalEmbedding(context_length, d_model)` (exercise 2) when
#   `positions == "learned"`, or `training.FixedPositions(sinusoidal_positions(context_length,
#   d_model))` (exercise 1's table, kept as a buffer that is never trained) when
#   `positions == "sinusoidal"`; any other value raises a `ValueError`;
# - `self.drop_emb = nn.Dropout(dropout)`;
# - `self.blocks = nn.Sequential(...)` of `num_layers` new `TransformerBlock(d_model, num_heads,
#   context_length, dropout)`;
# - `self.final_norm = nn.LayerNorm(d_model)`;
# - `self.out_head = nn.Linear(d_model, vocab_size, bias=False)`.
#
# Also keep `self.context_length = context_length` and `self.num_cached = 0` (how many tokens the
# blocks' caches hold).
#
# `forward(idx, use_cache=False)`: `idx` holds token ids `(b, T)`; return the logits
# `(b, T, vocab_size)` (no softmax: the loss applies it). More than `context_length` tokens raise a
# `ValueError` that names the limit (your `pos_emb` already does).
# - With `use_cache=False` (training) the whole sequence is read: positions `0 .. T-1`, as always.
# - With `use_cache=True`, `idx` holds the **next** `T` tokens of the sequence in the caches: their
#   positions start at `start = self.num_cached` (`self.pos_emb(..., start=start)`), every block
#   gets `use_cache=True` (`nn.Sequential` passes one argument only, so loop:
#   `for block in self.blocks: x = block(x, use_cache=use_cache)`), and afterwards
#   `self.num_cached = start + T`.
#
# `reset_cache()`: empty every block's cache (`block.att.reset_cache()`) and set `self.num_cached`
# back to 0. A prompt read with `use_cache=True`, followed by one token at a time, then gives the
# same logits as `forward` on the whole sequence.
#
# **Rule**: as for the block, PyTorch's ready-made transformer layers (`nn.TransformerEncoderLayer`,
# `nn.TransformerDecoderLayer`, `nn.TransformerEncoder`, `nn.TransformerDecoder`,
# `nn.MultiheadAttention`, `F.multi_head_attention_forward`) are not allowed.
#
# The check builds your `TinyGPT` with the positions and blocks of exercises 1 to 3. While grading
# they are ours, so a mistake in one of those exercises costs only that exercise's points; in your
# own notebook they are yours, and the check says so when one of them is the problem.

# %% grade_id="TinyGPT"
class TinyGPT(nn.Module):
    """Token ids (b, T) -> next-token logits (b, T, vocab_size); positions: "learned" or "sinusoidal"."""

    def __init__(self, vocab_size: int, d_model: int, num_heads: int, num_layers: int, context_length: int,
                 dropout: float, positions: str = "learned"):
        super().__init__()
        ### BEGIN SOLUTION
        if positions not in ("learned", "sinusoidal"):
            raise ValueError(f"positions must be 'learned' or 'sinusoidal', got {positions!r}")
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        if positions == "learned":
            self.pos_emb = LearnedPositionalEmbedding(context_length, d_model)
        else:
            self.pos_emb = training.FixedPositions(sinusoidal_positions(context_length, d_model))  # a buffer
        self.drop_emb = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *[TransformerBlock(d_model, num_heads, context_length, dropout) for _ in range(num_layers)])
        self.final_norm = nn.LayerNorm(d_model)
        self.out_head = nn.Linear(d_model, vocab_size, bias=False)
        self.context_length = context_length
        self.num_cached = 0  # tokens held by the blocks' KV caches
        ### END SOLUTION

    def forward(self, idx: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        ### BEGIN SOLUTION
        start = self.num_cached if use_cache else 0  # the position of the first token of idx
        x = self.drop_emb(self.pos_emb(self.tok_emb(idx), start=start))  # (b, T, d): tokens plus positions
        for block in self.blocks:
            x = block(x, use_cache=use_cache)  # (b, T, d)
        if use_cache:
            self.num_cached = start + idx.shape[1]
        return self.out_head(self.final_norm(x))  # (b, T, V)
        ### END SOLUTION

    def reset_cache(self) -> None:
        """Empty every block's KV cache: the next use_cache=True call starts a new sequence."""
        ### BEGIN SOLUTION
        for block in self.blocks:
            block.att.reset_cache()
        self.num_cached = 0
        ### END SOLUTION

# %% grade_id="test_TinyGPT" points=4
# Check: parameter shapes, logits in eval() and train() mode (learned and sinusoidal positions), causality,
# and the cache: a sequence fed in pieces with use_cache=True gives the whole sequence's logits; reset_cache().
checks.check_TinyGPT(TinyGPT)
### BEGIN HIDDEN TESTS
checks.check_TinyGPT(TinyGPT, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. The task: reverse the digits
#
# `course_utils.tasks` draws sequences on the fly. Each is 8 random digits, the separator `|`
# (token 10), and the digits reversed: 17 tokens. The model reads a sequence without its last token
# (16 inputs) and must predict, at every position, the next token (16 targets: the same sequence
# shifted by one).
#
# Only the tokens after the separator can be predicted: the first 8 digits are random. So the loss
# counts the **answer positions** only, where `answer_mask` is True: the separator and the answer so
# far, each predicting the next answer digit.

# %%
task = tasks.ReversalTask(num_digits=8, held_out_size=1000, seed=0)
example = task.batch(2, torch.Generator().manual_seed(1))  # (inputs, targets, answer_mask), each (2, 16)
print("inputs: ", tasks.as_text(example.inputs[0]))
print("targets:", tasks.as_text(example.targets[0]))
print("answer: ", " ".join("^" if m else "." for m in example.answer_mask[0].tolist()))
print("shapes:", tuple(example.inputs.shape), tuple(example.targets.shape), tuple(example.answer_mask.shape),
      example.answer_mask.dtype)

# %% [markdown]
# Why attention must do the work: the input at position `t` (8 to 15) must be followed by the
# digit at position `15 - t`. Copying a token from another position is exactly what attention does,
# and only attention moves information between positions. The position to copy from depends on
# where you are, so the model also needs positions; and the digit is random, so no rule of thumb
# helps. A model has to look back at the right place every time: the **anti-diagonal** of the
# attention map.
#
# The 1000 held-out sequences (seed 0) never appear in training: `task.batch` draws again any row
# that equals one of them.

# %% [markdown]
# ## 6. One training step
#
# Training repeats one step: run the model, measure how wrong its next-token predictions are with
# the **cross-entropy** loss (the average of `-log p(right token)`), let `backward()` compute the
# gradient of that loss for every parameter, and let the optimizer move the parameters a little
# against it.
#
# Two things to get right:
# - `loss.backward()` **adds** to each parameter's `.grad`. Call `optimizer.zero_grad()` once per
#   step, before `backward()`, or every step also applies all the old gradients.
# - Boolean indexing picks the answer positions: `logits[answer_mask]` is `(n, V)` and
#   `targets[answer_mask]` is `(n,)`, for the `n` True entries.

# %% [markdown]
# ### Exercise 5: `train_step`
#
# Write `train_step(model, batch, optimizer)`: `batch` is `(inputs, targets, answer_mask)`.
# 1. `logits = model(inputs)`, `(b, T, V)`;
# 2. the loss: `F.cross_entropy` of the logits and targets at the answer positions only;
# 3. `optimizer.zero_grad()`, `loss.backward()`, `optimizer.step()`;
# 4. return the loss as a Python float (`loss.item()`), not the loss tensor: that tensor still holds
#    the step's whole computation graph, so a list of every step's loss (`training.train` keeps
#    one) would keep every step's graph alive.

# %% grade_id="train_step"
def train_step(model: nn.Module, batch: tuple, optimizer: torch.optim.Optimizer) -> float:
    """One step on the answer positions; returns the loss as a Python float."""
    ### BEGIN SOLUTION
    inputs, targets, answer_mask = batch
    logits = model(inputs)  # (b, T, V)
    loss = F.cross_entropy(logits[answer_mask], targets[answer_mask])  # (n, V) against (n,)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
    ### END SOLUTION

# %% grade_id="test_train_step" points=3
# Check: two steps on a small stand-in model: the loss, the gradients the optimizer used, the new parameters.
checks.check_train_step(train_step)
### BEGIN HIDDEN TESTS
checks.check_train_step(train_step, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 7. Training
#
# The loop is given (`training.train` in `course_utils/training.py`, about 30 lines: read it). Each
# step draws 64 new sequences and calls your `train_step` with the AdamW optimizer (learning rate
# 0.003); every 50 steps it measures the **exact-answer accuracy** on the held-out sequences: the
# fraction whose 8 answer digits are *all* right.
#
# **While grading, nothing is trained.** The grader sets the environment variable
# `NBGRADER_EXECUTION`; then `training.train` returns at once and says so. No graded cell needs a
# trained model, and grading stays fast. On your own machine everything below runs.
#
# The model: `d_model = 32`, 2 heads, 2 blocks, about 26,000 parameters; no dropout (the data is
# endless, so the model cannot overfit it). We train on the CPU: a model this small is no faster on
# a GPU. Seed 0 for the weights and for the batches.

# %%
print("grading now:", training.grading())
config = dict(vocab_size=tasks.VOCAB_SIZE, d_model=32, num_heads=2, num_layers=2,
              context_length=task.context_length, dropout=0.0)
SEED, STEPS = 0, 300
torch.manual_seed(SEED)
model = TinyGPT(**config)
print(f"{sum(p.numel() for p in model.parameters()):,} parameters")

# %%
# NBVAL_IGNORE_OUTPUT
# (nbval skips this cell's output: the progress bar and the time depend on the machine)
run = training.train(model, train_step, task, steps=STEPS, seed=SEED, eval_every=50)
if not run.skipped:
    print(f"{STEPS} steps in {run.seconds:.1f} s")

# %% [markdown]
# Loss and held-out accuracy. A run is deterministic on a given machine, but training amplifies the
# tiny rounding differences between CPUs, so the exact digits can differ on yours (nbval skips this
# cell's output; the next cell states what holds everywhere):

# %%
# NBVAL_IGNORE_OUTPUT
for step, accuracy in run.accuracy.items():
    print(f"step {step:4d}: loss {run.losses[step - 1]:.3f}, held-out exact-answer accuracy {accuracy:6.1%}")
print(f"final held-out accuracy: {run.final_accuracy:.1%}")

# %%
print(f"after {STEPS} steps, at least 95% of the held-out sequences are reversed exactly:",
      run.final_accuracy >= 0.95)

# %% [markdown]
# The loss stays near `ln 10 ≈ 2.3` (a guess among 10 digits) for a while, then drops steeply:
# the model has found *where* to look. That sudden drop is typical of attention learning to copy.

# %% [markdown]
# ## 8. What positions buy, and what attention buys
#
# Three changes to the same model, each trained the same way for 200 steps:
# - **sinusoidal positions**: `TinyGPT(**config, positions="sinusoidal")`, exercise 1's fixed table
#   instead of the learned one (one argument of exercise 4);
# - **no positions**: the position vectors are set to zero and frozen;
# - **a mean instead of attention**: every block's `att` is replaced by the plain average of the
#   tokens so far, the same weights `1/(t+1)` for every earlier token, whatever they hold.
#
# The given `CausalMean` module keeps the shapes, so the rest of the model is unchanged.

# %%
class CausalMean(nn.Module):
    """Uniform causal 'attention': token t gets the mean of tokens 0..t. (b, T, d) -> (b, T, d)."""

    def forward(self, x: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        if use_cache:
            raise ValueError("CausalMean keeps no cache")
        counts = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype).view(1, -1, 1)  # (1, T, 1)
        return x.cumsum(dim=1) / counts  # (b, T, d)


def without_positions(model: nn.Module) -> nn.Module:
    """The model with its position vectors set to zero and frozen (never trained)."""
    with torch.no_grad():
        for p in model.pos_emb.parameters():
            p.zero_()
            p.requires_grad_(False)
    return model


def with_mean_attention(model: nn.Module) -> nn.Module:
    """The model with every block's attention replaced by a causal mean."""
    for block in model.blocks:
        block.att = CausalMean()
    return model

# %%
# NBVAL_IGNORE_OUTPUT
# (nbval skips this cell's output: the progress bars and times depend on the machine)
SHORT = 200
variants = {
    "sinusoidal positions": lambda: TinyGPT(**config, positions="sinusoidal"),
    "no positions": lambda: without_positions(TinyGPT(**config)),
    "mean instead of attention": lambda: with_mean_attention(TinyGPT(**config)),
}
runs = {"learned positions": run}
for name, build in variants.items():
    torch.manual_seed(SEED)
    runs[name] = training.train(build(), train_step, task, steps=SHORT, seed=SEED, eval_every=50, desc=name)

# %% [markdown]
# Held-out exact-answer accuracy at steps 100 and 200 (the learned run is section 7's). As above,
# the exact digits depend on the CPU, so the cell after the table states what holds everywhere.

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'':26s} {'step 100':>9s} {'step 200':>9s}")
for name, r in runs.items():
    print(f"{name:26s} {r.accuracy.get(100, math.nan):9.1%} {r.accuracy.get(200, math.nan):9.1%}")
training.plot_losses(runs)
plt.show()

# %%
at_200 = {name: r.accuracy.get(SHORT, math.nan) for name, r in runs.items()}
print("learned and sinusoidal positions above 95% at step 200:",
      at_200["learned positions"] >= 0.95 and at_200["sinusoidal positions"] >= 0.95)
print("no positions and mean attention below 5% at step 200:",
      at_200["no positions"] < 0.05 and at_200["mean instead of attention"] < 0.05)

# %% [markdown]
# **Sinusoidal positions** train about as well as learned ones (a little slower at first: about 96%
# at step 100, where the learned ones are already at 100%): both give every position its own
# vector, and that is all this task needs. The fixed table has no parameters and exists for any number of
# positions; the learned one can shape itself to the task. GPT-2 learns its positions; most recent
# models rotate the queries and keys instead (RoPE, notebook 08).
#
# **A mean instead of attention** never learns: each token receives the same blur of all earlier
# tokens and cannot pick out the one digit it needs.
#
# **No positions** is more interesting than "it fails". One block can never solve the task (section
# 1: at the separator it sees a bag). But from the second block on, the causal mask leaks order:
# token `t` averages over `t + 1` tokens, so the first block's outputs already depend on how many
# tokens came before each one, and the second block can read positions from that. Decoder-only
# transformers without any position encoding ("NoPE", Kazemnejad et al., 2023) do learn. Here they
# learn far more slowly: 200 steps are not enough, so we ran it longer, outside this notebook.
#
# The curves below come from `scripts/position_ablation.py` (the same model, task, optimiser and
# seed, evaluated every 100 steps; about two minutes on one CPU core). They are stored as data in
# `course_utils/position_ablation.py`, so this cell only plots them; rerun the script to measure them
# on your machine.

# %%
from course_utils import position_ablation

fig, ax = plt.subplots(figsize=(8, 3.8))
for name, curve in position_ablation.CURVES.items():
    ax.plot(list(curve), [100 * a for a in curve.values()], label=name, linewidth=1.4)
ax.set_xlabel("training step")
ax.set_ylabel("held-out exact-answer accuracy (%)")
ax.set_title("learned, sinusoidal and no positions (scripts/position_ablation.py)")
ax.legend(fontsize=8, loc="center right")
fig.tight_layout()
plt.show()
nope = position_ablation.CURVES["none, seed 0"]
print("no positions, two blocks, seed 0:", ", ".join(f"step {s}: {nope[s]:.0%}" for s in (500, 1000, 2000, 4000, 6000)))
print("no positions, one block, best accuracy:", f"{max(position_ablation.CURVES['none, one block'].values()):.0%}")

# %% [markdown]
# Two blocks without positions learn most of the task, not all of it: under 1% of the held-out
# sequences at step 500, about a third at step 1000, half at step 2000 and about 70% at step 4000. Then
# the curve stops rising: from step 3500 to 6000 it moves between 67% and 79%, and step 6000 is below
# its best (seed 1 follows the same path). With positions the same model was at 100% after 100 steps.
# One block without positions stays at 0% for all 3000 steps, as section 1 predicts. So for two blocks,
# positions are not what makes the task learnable at all: they make it *easy* and complete, and that is
# why every transformer has them in some form.

# %% [markdown]
# ## 9. What did the heads learn?
#
# `training.attention_maps(model, inputs)` runs the model and recomputes every block's attention
# weights from its own `W_query` and `W_key`, as in notebook 05's section 8:
# `(L, b, H, T, T)`. To find the head that does the reversal we measure, for each head, the mean
# weight that answer position `t` puts on the digit it must copy next, position `15 - t` (the
# anti-diagonal), over 200 held-out sequences.

# %%
# NBVAL_IGNORE_OUTPUT
# (nbval skips this cell's output: the scores of a trained model depend on the CPU's rounding)
held_out = task.held_out()
maps = training.attention_maps(model, held_out.inputs[:200])  # (L, 200, H, T, T)
score = training.reversal_score(maps, task.num_digits)  # (L, H)
for layer in range(score.shape[0]):
    print(f"layer {layer}: " + "  ".join(f"head {h}: {score[layer, h]:.2f}" for h in range(score.shape[1])))
best = divmod(int(score.argmax()), score.shape[1])  # (layer, head)
print(f"the reversal head: layer {best[0]}, head {best[1]}")

# %%
print("a head puts more than half of its weight on the digit to copy:", bool(score.max() > 0.5))

# %% [markdown]
# Every head of the trained model on two held-out sequences (rows: queries, columns: the tokens they
# attend to; the framed head is the one named above):

# %%
for example in (0, 1):
    text = tasks.as_text(held_out.inputs[example]).split()
    training.plot_heads(maps[:, example], text, f"trained: {' '.join(text)}", highlight=best)
    plt.show()

# %% [markdown]
# Look at the bottom half of each map: the separator and the answer so far, the rows that predict the
# answer. The weight sits on the **anti-diagonal**: the separator looks at the last digit, the first
# answer digit at the second-to-last, and so on, exactly the digit to write next. A score near 1
# means a head copies from the right digit almost every time; the framed head does it best. In a
# model this small several heads learn the same pattern (the scores above say how well), which
# makes the model robust; bigger models on harder tasks split the work between heads. The top half
# (the random digits) does not matter: nothing is predicted there.
#
# Compare with notebook 05's "What do the heads look at?": there the weights were random and the
# patterns meant nothing. Here is the **same model before training** (the same seed gives the same
# starting weights): diffuse rows that spread over the earlier tokens, and no anti-diagonal.

# %%
torch.manual_seed(SEED)
untrained = TinyGPT(**config)
maps_before = training.attention_maps(untrained, held_out.inputs[:200])
print("reversal score before training:", [round(v, 2) for v in training.reversal_score(maps_before, task.num_digits).flatten().tolist()])
text = tasks.as_text(held_out.inputs[0]).split()
training.plot_heads(maps_before[:, 0], text, "the same model before training")
plt.show()

# %% [markdown]
# ## 10. Generation with the KV cache
#
# Generation writes one token at a time: run the model, take the logits of the **last** position
# (they predict the next token), choose a token, append it, repeat. The given `training.generate` does
# it by **full recompute**: each step runs the whole sequence again, although only one token is new.
#
# Your blocks hold notebook 08's KV cache, so the model can do better: read the prompt once with
# `use_cache=True` (every block keeps its keys and values), then feed only the newest token at each
# step. Each step then computes one token's queries, keys and values instead of the whole sequence's.
#
# Which token to choose? **Greedy** decoding takes the most likely one (`argmax`): right for our
# task, where there is one correct answer. Language models usually **sample** from the softmax instead,
# shaped by two knobs:
# - the **temperature** divides the logits before the softmax: below 1 it sharpens the distribution
#   (towards greedy), above 1 it flattens it (towards uniform). Dividing by 0 is undefined, so
#   temperature 0 meaning greedy is a convention, the one of OpenAI's API and vLLM, which we follow.
#   Hugging Face's `generate` asks for greedy with `do_sample=False` instead, and when it samples it
#   keeps the 50 largest logits (`top_k=50`) unless told otherwise;
# - **top-k** keeps only the `k` largest logits (the others get `-inf`, so probability 0), so that
#   the long tail of unlikely tokens is never drawn. Logits equal to the `k`-th largest are kept too,
#   so a tie can keep more than `k` tokens.
#
# ### Exercise 6: `generate`
#
# Write `generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=None, use_cache=True)`:
# `prompt_ids` holds token ids `(b, T0)`; return `(b, T0 + max_new_tokens)`: the prompt followed by
# the `max_new_tokens` new tokens.
# 1. Check the arguments first and raise a `ValueError` that names the argument when
#    `max_new_tokens < 0`, `temperature < 0`, or `top_k` is not `None` and below 1.
# 2. The model reads `T0 + max_new_tokens - 1` tokens (the last new token is never read). If that is
#    more than `model.context_length`, raise a `ValueError` **before calling the model**, naming both
#    numbers, e.g. `f"{T0} + {max_new_tokens} tokens need {needed} positions, but context_length is
#    {model.context_length}"`.
# 3. `model.eval()`. With `use_cache=True`: `model.reset_cache()`, then the first step reads the whole
#    prompt, `model(prompt_ids, use_cache=True)`, and every later step only the newest token,
#    `model(tokens[:, -1:], use_cache=True)`. With `use_cache=False`: every step reads the whole
#    sequence so far, `model(tokens)`.
# 4. The next token's logits are those of the last position, `logits[:, -1]`, `(b, V)`.
#    - `temperature == 0`: greedy, `logits.argmax(dim=-1, keepdim=True)`, `(b, 1)`.
#    - Otherwise divide the logits by `temperature`; with `top_k`, set every logit below the k-th
#      largest to `-inf` (`torch.topk(logits, k, dim=-1).values[:, -1:]` is the k-th largest, `(b, 1)`;
#      a `top_k` above the vocabulary size keeps every token); then
#      `torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)`, `(b, 1)`: sample from all
#      `V` probabilities (zero outside the top k), so that the same seed draws the same tokens as ours.
# 5. Append the new tokens with `torch.cat(..., dim=1)`. At the end, `model.reset_cache()` again, so
#    that no stale cache stays behind.
#
# `@torch.no_grad()` (given) switches off autograd: generation needs no gradients.
#
# Real generation adds three things this exercise leaves out. **Top-p** (nucleus) sampling keeps the
# fewest most likely tokens whose probabilities add up to at least `p`, however many that is.
# **Stopping**: each sequence ends at an end-of-sequence token or a stop string, not after a fixed
# number of tokens. **Ragged batches**: prompts of different lengths are padded (on the left for a
# decoder-only model), an attention mask hides the padding, the positions start at each prompt's
# first real token, and a sequence that has stopped is padded until the others stop too.
#
# The check uses a small stand-in model with a cache of its own (a running mean of the token vectors,
# not a transformer), so that only your `generate` is graded. It tells you which call read what, and
# at which position your tokens first differ from ours.

# %% grade_id="generate"
@torch.no_grad()
def generate(model: nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, use_cache: bool = True) -> torch.Tensor:
    """prompt_ids (b, T0) -> (b, T0 + max_new_tokens): greedy at temperature 0, else seeded sampling."""
    ### BEGIN SOLUTION
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be at least 0, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be 0 (greedy) or positive, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be None or at least 1, got {top_k}")
    T0 = prompt_ids.shape[1]
    needed = T0 + max_new_tokens - 1  # the last new token is never read
    if needed > model.context_length:
        raise ValueError(f"{T0} + {max_new_tokens} tokens need {needed} positions, "
                         f"but context_length is {model.context_length}")
    model.eval()
    if use_cache:
        model.reset_cache()
    tokens = prompt_ids  # (b, T0)
    for step in range(max_new_tokens):
        if use_cache:
            new = prompt_ids if step == 0 else tokens[:, -1:]  # the prompt, then the newest token
            logits = model(new, use_cache=True)[:, -1]  # (b, V)
        else:
            logits = model(tokens)[:, -1]  # (b, V): the whole sequence again
        if temperature == 0:
            next_token = logits.argmax(dim=-1, keepdim=True)  # (b, 1)
        else:
            logits = logits / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (b, 1)
                logits = logits.masked_fill(logits < kth, float("-inf"))
            next_token = torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)  # (b, 1)
        tokens = torch.cat([tokens, next_token], dim=1)  # (b, T + 1)
    if use_cache:
        model.reset_cache()
    return tokens
    ### END SOLUTION

# %% grade_id="test_generate" points=4
# Check: greedy and seeded sampling (temperature, top_k) with and without the cache, the calls your
# generate makes, reset_cache between calls, and the errors (too long, bad arguments).
checks.check_generate(generate)
### BEGIN HIDDEN TESTS
checks.check_generate(generate, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# The trained model, greedy, with the cache: it writes the reversal of unseen sequences. Without the
# cache both ways compute the same logits up to float32 rounding (their additions happen in another
# order), and here that rounding never changes which token is the largest: the same tokens.

# %%
prompts = held_out.inputs[:5, : task.num_digits + 1]  # (5, 9): the digits and the separator
written = generate(model, prompts, max_new_tokens=task.num_digits, temperature=0.0)  # (5, 17)
for row, digits in zip(written, prompts):
    answer = row[task.num_digits + 1:]
    right = torch.equal(answer, digits[: task.num_digits].flip(0))
    print(tasks.as_text(row), " ✓" if right else " ✗")
prompts = held_out.inputs[:200, : task.num_digits + 1]  # (200, 9)
with_cache = generate(model, prompts, task.num_digits, temperature=0.0)  # (200, 17)
without_cache = generate(model, prompts, task.num_digits, temperature=0.0, use_cache=False)
print("the same tokens with and without the cache:", torch.equal(with_cache, without_cache))

# %% [markdown]
# Sampling instead of greedy: at temperature 1 the trained model is so sure of each digit that
# sampling rarely changes anything; at temperature 3 the distribution flattens and mistakes appear;
# `top_k=1` keeps only the best logit, which is greedy again. (The exact numbers depend on the CPU's
# rounding; nbval skips this cell's output.)

# %%
# NBVAL_IGNORE_OUTPUT
truth = held_out.inputs[:200, : task.num_digits].flip(1)  # (200, 8): the right answers
for temperature, top_k in ((1.0, None), (3.0, None), (3.0, 1)):
    torch.manual_seed(0)
    sampled = generate(model, prompts, task.num_digits, temperature=temperature, top_k=top_k)  # (200, 17)
    exact = (sampled[:, task.num_digits + 1:] == truth).all(dim=1).float().mean()
    print(f"temperature {temperature}, top_k {top_k}: {exact:.0%} of 200 answers exactly right")

# %% [markdown]
# ### What the cache saves
#
# Our task writes 8 tokens after 9, too few for the cache to matter. To see the difference, time a
# bigger, untrained `TinyGPT` (4 blocks, `d_model = 64`, 512 positions) writing 240 tokens after a
# 16-token prompt, greedy, with and without the cache (the median of 3 runs each).
#
# Without the cache, step `t` runs all `t` tokens through every block: the work grows with `t`, so
# the whole generation costs about `n²/2` token-passes for `n` tokens. With the cache, each step runs
# one token (its attention still reads all `t` cached keys, but that is a small part of a step here),
# so the whole generation costs about `n`. The two ways take turns, three runs each, and we keep each
# one's median. While grading, this cell is skipped.

# %%
# NBVAL_IGNORE_OUTPUT
# (nbval skips this cell's output: the times depend on the machine)
if training.grading():
    print("grading now: timing skipped")
else:
    torch.manual_seed(0)
    big = TinyGPT(vocab_size=tasks.VOCAB_SIZE, d_model=64, num_heads=4, num_layers=4, context_length=512,
                  dropout=0.0).eval()
    prompt = torch.randint(0, tasks.VOCAB_SIZE, (1, 16), generator=torch.Generator().manual_seed(0))  # (1, 16)
    runs = {True: [], False: []}
    for _ in range(3):
        for use_cache in (True, False):  # taken in turns, so that a busy moment of the machine hits both
            began = time.perf_counter()
            generate(big, prompt, max_new_tokens=240, temperature=0.0, use_cache=use_cache)
            runs[use_cache].append(time.perf_counter() - began)
    seconds = {use_cache: sorted(times)[1] for use_cache, times in runs.items()}  # the median of 3
    print(f"240 tokens with the cache:    {seconds[True]:.2f} s")
    print(f"240 tokens without the cache: {seconds[False]:.2f} s "
          f"({seconds[False] / seconds[True]:.1f} times the time with the cache)")

# %% [markdown]
# On the CPU we wrote this on, the cache made these 240 tokens two to three times faster, and the gap
# grows with the length: from 120 to 240 new tokens the time with the cache about doubled, the time
# without it more than tripled.
#
# The `n²/2` count predicts far more: 32,520 token-passes without the cache (steps of 16 to 255
# tokens) against 255 with it, about 127 times fewer. The measured gain is much smaller because a
# forward pass of this tiny model has a fixed cost of more than a millisecond whatever the number of
# tokens (1.4 ms for 1 token and for 16 tokens on our CPU, against 11 ms for 255): Python's and
# PyTorch's cost per operation. The cached steps pay that fixed cost 240 times, and it is almost all of
# their time. For a large model, whose work per token is far above its fixed cost, the gain comes much
# closer to the count. The price is memory: the cache holds two `(b, H, T, D)` tensors per
# block (notebook 08 counts them for real models). Every serving system for large models decodes
# this way.

# %% [markdown]
# ## Check your understanding
#
# Click a question to see the answer.
#
# <details><summary>1. Predict the output: a <b>one-block</b> <code>TinyGPT</code> without positions
# reads <code>1 2 3 |</code> and <code>3 2 1 |</code>. Are its logits at the separator the same? At the first
# token? Run the cell below to check.</summary>
#
# At the separator they are **the same**: it attends to the bag `{1, 2, 3, |}` and its own vector,
# identical in both. At the first token they differ: it sees only itself, `1` in one case and `3` in
# the other. With two or more blocks the separator's logits can differ, because the first block's
# outputs already depend on how many tokens came before each one.
# </details>

# %%
torch.manual_seed(SEED)
one_block = without_positions(TinyGPT(**{**config, "num_layers": 1})).eval()
a = one_block(torch.tensor([[1, 2, 3, tasks.SEP]]))  # (1, 4, V)
b = one_block(torch.tensor([[3, 2, 1, tasks.SEP]]))
print("same logits at the separator:", torch.allclose(a[0, 3], b[0, 3], atol=1e-6))
print("same logits at the first token:", torch.allclose(a[0, 0], b[0, 0], atol=1e-6))

# %% [markdown]
# <details><summary>2. Find the bug: <code>loss.backward(); optimizer.zero_grad(); optimizer.step()</code>.
# What happens in training?</summary>
#
# `zero_grad` wipes the gradients that `backward` just computed, so `step` sees zeros (or `None`,
# the default since PyTorch 2.0) and the parameters do not move: the loss stays at its starting
# value. Zero the gradients **before** `backward`.
# </details>
#
# <details><summary>3. Find the bug: a <code>generate</code> with <code>use_cache=True</code> calls
# <code>model(tokens, use_cache=True)</code> at every step, on the whole sequence so far. What
# goes wrong?</summary>
#
# The cache already holds the keys and values of every earlier token, so each step stores them
# **again**: after the prompt of `T0` tokens and one step, the cache holds `T0` twice and the new
# token at position `2 T0`. The positions run past the real ones, the attention sees duplicates, the
# logits are wrong, and soon the cache passes `context_length` and raises. With the cache, feed only
# the newest token, `tokens[:, -1:]`.
# </details>
#
# <details><summary>4. Why is the loss taken on the answer positions only?</summary>
#
# The first 8 digits are random: no model can predict them better than 1 in 10. Their loss would
# stay near `ln 10` whatever the model does, adding noise to the gradient and hiding the progress on
# the part that can be learned.
# </details>
#
# <details><summary>5. Why add the positions before the first block, not after the last one?</summary>
#
# Attention decides where to look from the queries and keys, which are computed from the block's
# input. Positions added after the blocks reach only the head: every attention layer stays blind to
# order, and the model fails just like the one without positions.
# </details>
#
# <details><summary>6. The block is pre-LN. What would change with <code>x = norm1(x + att(x))</code>?</summary>
#
# That is post-LN (the 2017 transformer): every residual addition is followed by a norm, so the
# path from input to output passes a norm in every block. Deep post-LN stacks need a learning-rate
# warm-up to train at all. Pre-LN keeps a clean residual path, and its gradients are well behaved
# at the start, so it *can* train without a warm-up (Xiong et al., 2020, "On Layer Normalization in
# the Transformer Architecture"); in practice GPT-style models still warm up, because it helps
# Adam at the start. Both compute different functions, so the check tells them apart.
# </details>
#
# <details><summary>7. Held-out accuracy is measured with one forward pass, not with generation. Why
# is that the same?</summary>
#
# The forward pass predicts each answer digit from the *true* earlier digits. If all of a
# sequence's predictions are right, generation, which feeds back its own predictions, feeds back
# exactly the true digits, and so writes the same answer. If one prediction is wrong, both count
# the sequence as wrong.
# </details>
#
# <details><summary>8. Sinusoidal positions trained as well as learned ones in section 8. What can
# learned positions not do that sinusoids can?</summary>
#
# Handle more positions than they were built for: `nn.Embedding(context_length, d)` has no row for
# position `context_length`, while `sinusoidal_positions` gives a vector for any position. (Whether
# a model *uses* unseen positions well is another question: it never trained on them.) Learned
# positions are what GPT-2 uses; sinusoids need no parameters.
# </details>

# %% [markdown]
# ## Recap
#
# - Attention without positions is permutation-equivariant; with a causal mask each token still sees
#   its prefix as a bag. Position vectors, added to the token embeddings before the first block, fix it.
# - Sinusoidal positions: `sin` and `cos` of `pos / 10000^(2i/d)` in column pairs, a fixed buffer. Learned
#   positions: an `nn.Embedding(context_length, d)` looked up with `arange(T)`. `TinyGPT(...,
#   positions=...)` takes either.
# - A pre-LN block: `x + dropout(att(norm1(x)))`, then `x + dropout(ff(norm2(x)))`, with a 4x-wide
#   GELU feed-forward network. A GPT: embeddings plus positions, dropout, blocks, a final norm, a head.
# - A training step: logits, cross-entropy on the answer positions, `zero_grad`, `backward`, `step`.
# - The trained model reverses unseen sequences, with learned or sinusoidal positions alike. With a
#   mean instead of attention it never does. Without positions one block cannot; two blocks slowly learn
#   most of it (about 70%), because the causal mask leaks order (NoPE). One head's map shows the
#   anti-diagonal: the model learned where to look.
# - Generation: greedy at temperature 0, sampling with a temperature and top-k otherwise; with the
#   KV cache the prompt is read once and then one token per step, and greedy writes the same tokens as
#   a full recompute (the same logits up to rounding), faster for long sequences.
#
# Where next: try the copy task (`digits | digits`) and watch a diagonal appear instead, or make the
# sequences longer than the positions the model was trained on and see learned positions fail.
