# %% [markdown]
# # 08 · Generating text: the KV cache, grouped-query attention and sliding windows
#
# A language model writes one token at a time: it reads the prompt, predicts the next token, appends
# it, and runs again. Run naively, every step recomputes the keys and values of **every** earlier
# token, although they never change. Every modern LLM keeps them instead, in a **key/value cache**,
# and then fights the memory that cache takes: by sharing keys and values between heads
# (**grouped-query attention**) and by looking back only a fixed distance (**sliding windows**).
#
# **In this notebook you will**
# 1. build the mask for a few new queries against many keys: `decode_causal_mask`, and see, by running
#    it, why `is_causal=True` in PyTorch's SDPA is wrong for a decoding step;
# 2. give queries and keys their positions by turning them: rotary embeddings, `rope_angles` and
#    `apply_rope`, the positions of Llama, Mistral, Qwen and Gemma;
# 3. add a key/value cache to notebook 05's `MultiHeadAttention`: `MultiHeadAttentionKVCache`, check
#    that it gives exactly the outputs of a full forward, measure the time it saves per token, see what
#    `torch.cat` costs against a static cache, and rotate keys at `start + i` before caching them;
# 4. share key/value heads between query heads: `repeat_kv` and `GroupedQueryAttention`, compare with
#    SDPA's `enable_gqa=True`, and count what it saves at the size of a Llama model;
# 5. limit how far back a token looks: `sliding_window_mask`, written a second time as a FlexAttention
#    `mask_mod`, and keep the cache in a rolling buffer;
# 6. see on a roofline why a decoding step is memory-bound, and why that makes GQA fast.
#
# Shapes use these letters: `b` = batch size, `T` = number of tokens, `Tq` = number of queries,
# `Tk` = number of keys, `H` = number of query heads, `G` = number of key/value groups
# (`num_kv_groups`), `D` = size of one head (`head_dim`), `d_in`/`d_out` = input/output size.
#
# How to work: fill in each cell that says `# YOUR CODE HERE`, run it, then run the check cell
# below it. A ✅ means your code agrees with ours on several inputs; a ❌ tells you what differs.

# %% setup=true

# %%
import math
import statistics
import time

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils import bench, checks, data, plotting
from course_utils.device import under_grader  # True while nbgrader runs this notebook

torch.manual_seed(123)
print("torch", torch.__version__)

# %% [markdown]
# ## 0. Where notebook 05 left us
#
# `MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads)` takes `(b, T, d_in)` and
# returns `(b, T, d_out)`: it projects the input to queries, keys and values, splits them into
# `H` heads `(b, H, T, D)`, computes scores `(b, H, T, T)`, masks the future with a
# `(context_length, context_length)` buffer cut to `[:T, :T]`, and merges the heads through
# `out_proj`.
#
# Here is that class, with the helpers it calls: our answers from notebooks 04 and 05, shown so that
# this notebook never depends on your own earlier answers. Run the cell.

# %% shows="causal_mask split_heads merge_heads MultiHeadAttention"
# Our answers from notebooks 04 and 05.
import math

import torch
import torch.nn as nn

from course_utils.validation import check_heads_divide, check_input_3d

# %% [markdown]
# ## 1. Generating one token at a time
#
# To generate, a model runs on the prompt, takes the output at the **last** position to choose the
# next token, appends it, and runs again on the longer sequence. Without any cache, step `t` runs the
# whole model on all `t` tokens: the work per step grows with the length, and most of it is repeated.
#
# Which part is repeated? Causal attention gives position `i` only tokens `0..i`, so appending a
# token changes **nothing** at the earlier positions. We check it on a module with 2 heads:

# %%
torch.manual_seed(123)
mha = MultiHeadAttention(d_in=4, d_out=8, context_length=16, dropout=0.0, num_heads=2).eval()
x = torch.rand(1, 7, 4)  # (b, T, d_in): a "sequence" of 7 token vectors

with torch.no_grad():
    short = mha(x[:, :6])  # (1, 6, 8): the first 6 tokens
    longer = mha(x)  # (1, 7, 8): one token more
print("first 6 outputs unchanged by token 6:", torch.allclose(short, longer[:, :6], atol=1e-6))
print("keys of the first 6 tokens unchanged:", torch.equal(mha.W_key(x[:, :6]), mha.W_key(x)[:, :6]))

# %% [markdown]
# The keys and values of the old tokens are the same at every step: `W_key` and `W_value` act on each
# token alone. So we compute them **once**, keep them in a cache, and at each step compute only the
# new token's query, key and value. The new token's query is compared with all the cached keys.
#
# That step has a shape we have not met: **fewer queries than keys**. One new query `(b, H, 1, D)`
# against `t` cached keys `(b, H, t, D)` gives scores `(b, H, 1, t)`.

# %% [markdown]
# ## 2. The mask for new tokens: aligned to the bottom right
#
# Say 4 tokens are cached and 3 new ones arrive together (a prompt read in pieces, or several tokens
# checked at once). The 3 new queries are positions 4, 5 and 6; the keys are positions 0 to 6. Query
# 4 may see keys 0..4, query 6 all of them. That is the **last 3 rows** of the `(7, 7)` causal mask:
# the mask is aligned to the **bottom right** corner.

# %%
full = causal_mask(7)  # (7, 7), True = hidden
print(full[4:7].int())  # (3, 7): the rows of the 3 new queries

# %% [markdown]
# ### Exercise 1: `decode_causal_mask`
#
# Write `decode_causal_mask(num_queries, num_keys)` that returns a **boolean** tensor of shape
# `(Tq, Tk)` with `Tq = num_queries <= Tk = num_keys`, True where a key is in a query's future. The
# queries are the **last** `Tq` positions: query `i` sits at position `Tk - Tq + i`. Raise a
# `ValueError` when `num_queries > num_keys`.
#
# Hint: `torch.triu` takes any `diagonal`; with `Tq == Tk` your mask must equal `causal_mask(Tk)`.

# %% grade_id="decode_causal_mask"
def decode_causal_mask(num_queries: int, num_keys: int) -> torch.Tensor:
    """Boolean (Tq, Tk) mask, True where key j is in the future of query i (queries = the last Tq positions)."""
    ### BEGIN SOLUTION
    if num_queries > num_keys:
        raise ValueError(f"num_queries > num_keys ({num_queries} > {num_keys}): the queries are the last positions")
    offset = num_keys - num_queries  # keys before the first query
    return torch.triu(torch.ones(num_queries, num_keys, dtype=torch.bool), diagonal=offset + 1)
    ### END SOLUTION

# %% grade_id="test_decode_causal_mask" points=2
# Check: several (Tq, Tk), the dtype, and an error when there are more queries than keys.
checks.check_decode_causal_mask(decode_causal_mask)
### BEGIN HIDDEN TESTS
checks.check_decode_causal_mask(decode_causal_mask, hidden=True)
### END HIDDEN TESTS

# %%
print("3 new queries, 7 keys:\n", decode_causal_mask(3, 7).int())
print("1 new query, 7 keys: ", decode_causal_mask(1, 7).int())

# %% [markdown]
# One new token sees **every** key: a single decoding step needs no mask at all. A chunk of several
# new tokens does.
#
# ### The `is_causal=True` pitfall
#
# `F.scaled_dot_product_attention(q, k, v, is_causal=True)` (notebook 06) builds a causal mask for
# you. **Predict before you run the next cell:** one query, 5 keys, `is_causal=True`. Which keys does
# the query see?

# %%
torch.manual_seed(0)
q = torch.randn(1, 1, 1, 4)  # (b, H, Tq=1, D): the new token's query
k = torch.randn(1, 1, 5, 4)  # (b, H, Tk=5, D): 4 cached keys and the new one
v = torch.randn(1, 1, 5, 4)

sdpa_causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (1, 1, 1, 4)
right = F.scaled_dot_product_attention(q, k, v, attn_mask=~decode_causal_mask(1, 5))  # True = may attend
print("is_causal=True:         ", sdpa_causal.flatten())
print("decode_causal_mask:     ", right.flatten())
print("value of key 0 alone:   ", v[0, 0, 0])

# %% [markdown]
# With `is_causal=True` the new token's output is exactly the value of key 0: it saw **only the first
# token**. PyTorch's documentation says why: `is_causal=True` builds `tril(ones(Tq, Tk))`, aligned to
# the **top left**, as if the queries were the first `Tq` positions. For `Tq == Tk` both alignments
# are the same, which is why notebook 06 never noticed. For decoding it is wrong, and no error is
# raised: the model just generates nonsense. This is the bug that every KV-cache implementation meets.
#
# Two correct ways: pass the mask yourself (`attn_mask` is True where a query **may** attend, so
# `~decode_causal_mask(...)`), or use PyTorch's bottom-right causal bias:

# %%
from torch.nn.attention.bias import causal_lower_right

lower_right = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(1, 5))
print("causal_lower_right equals decode_causal_mask:", torch.allclose(lower_right, right, atol=1e-6))

# %% [markdown]
# Side by side, for 3 new queries and 7 keys:

# %%
top_left = torch.tril(torch.ones(3, 7, dtype=torch.bool))  # (3, 7), True = may attend: what is_causal=True uses
fig, axes = plt.subplots(1, 2, figsize=(12, 3.2))
plotting.plot_mask(~decode_causal_mask(3, 7), ("hidden", "may attend"), title="decode mask: bottom right (correct)",
                   ax=axes[0])
plotting.plot_mask(top_left, ("hidden", "may attend"), title="is_causal=True: top left (wrong here)", ax=axes[1])
for ax in axes:
    ax.set_yticks(range(3), [f"query {4 + i}" for i in range(3)])
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 3. Positions that survive the cache: rotary embeddings (RoPE)
#
# Attention by itself does not know where a token is. Notebook 09 adds a position vector to each token
# before attention. Most recent LLMs (Llama, Mistral, Qwen, Gemma) do something else: they **turn** each
# query and key by an angle that grows with its position, **rotary position embeddings** (RoPE, Su et
# al., 2021).
#
# A head's `D` numbers form `D / 2` pairs. At position `p`, pair `i` turns by the angle
# `p · θ_i`, with `θ_i = base^(-2i / D)`: pair 0 turns by one radian per position, the last pairs
# barely move, like the hands of a clock at different speeds. Turning a query at position `m` and a key
# at position `n` changes their dot product only through `m - n`: the score sees how **far apart** two
# tokens are, not where they are. The values are not turned.
#
# `base` is a hyperparameter of the model: 10,000 in the RoPE paper and in Llama 2, 500,000 in Llama 3.
# A larger base turns the slow pairs more slowly still, so that their angles do not come round again
# within a long context. We use 10,000.
#
# Which two numbers form a pair? Two conventions exist:
#
# - **neighbours**: `(x_0, x_1), (x_2, x_3), ...`, read as complex numbers. This is RoFormer's own
#   (the RoPE paper), GPT-J's, and Meta's original Llama code's.
# - **rotate-half** (GPT-NeoX, Hugging Face's Llama): dimension `i` pairs with `i + D/2`. **We follow
#   this one.**
#
# They are the same rotation with the dimensions listed in another order: put dimensions `0, 2, 4, ...`
# in the first half and `1, 3, 5, ...` in the second, and neighbours become rotate-half. Reordering the
# rows of `W_q` and `W_k` that way (the same order for both, so every score is unchanged) turns weights
# trained with one convention into weights for the other. Hugging Face's script that converts Meta's
# Llama weights does exactly that. Without that reordering, the weights of one convention give wrong
# scores in the other.
#
# **Longer contexts than in training.** Past the longest training context the slow pairs reach angles
# the model has never seen, and its quality drops. Context extension changes the angles, then
# fine-tunes briefly. *Position interpolation* divides every position by a factor `s`, so that `s`
# times the trained length maps onto trained angles. *NTK-aware scaling* raises `base` instead, which
# slows the slow pairs a lot and the fast pairs hardly at all. *YaRN* interpolates only the slow pairs,
# leaves the fast ones alone and scales the scores slightly. Llama 3.1 uses a rule of the same kind to
# go from 8,192 to 131,072 tokens.

# %% [markdown]
# ### Exercise 2: `rope_angles`
#
# Write `rope_angles(head_dim, max_positions, base=10000.0)` that returns the angles, a **float32**
# tensor of shape `(max_positions, head_dim // 2)` with `angle[p, i] = p · base^(-2i / head_dim)`, for
# positions `p = 0 .. max_positions - 1` and pairs `i = 0 .. head_dim / 2 - 1`. Raise a `ValueError`
# when `head_dim` is odd.
#
# Hint: `torch.arange(0, head_dim, 2)` gives `2i`; `torch.outer` multiplies every position by every
# frequency.

# %% grade_id="rope_angles"
def rope_angles(head_dim: int, max_positions: int, base: float = 10000.0) -> torch.Tensor:
    """(max_positions, head_dim // 2) float32: angle[p, i] = p * base ** (-2 i / head_dim)."""
    ### BEGIN SOLUTION
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim must be even (RoPE rotates pairs of dimensions), got {head_dim}")
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,): theta_i
    return torch.outer(torch.arange(max_positions, dtype=torch.float64), theta).float()  # (P, D/2)
    ### END SOLUTION

# %% grade_id="test_rope_angles" points=2
# Check: several head_dim, lengths and bases, float32, and an error for an odd head_dim.
checks.check_rope_angles(rope_angles)
### BEGIN HIDDEN TESTS
checks.check_rope_angles(rope_angles, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 3: `apply_rope`
#
# Write `apply_rope(x, positions)`: `x` holds queries or keys, shape `(..., T, D)` (for example
# `(b, H, T, D)`), and `positions` is a `(T,)` tensor of integers, the position of each of the `T`
# tokens. Split `x` into halves `x1 = x[..., :D/2]` and `x2 = x[..., D/2:]`; with `cos` and `sin` of
# the angles at those positions, `(T, D/2)`, return
#
# `torch.cat([x1 · cos - x2 · sin, x1 · sin + x2 · cos], dim=-1)`, the same shape as `x`.
#
# Return it in `x`'s dtype too: the angle table is float32, so cast `cos` and `sin` to `x.dtype` before
# the products (a bfloat16 `x` gives a bfloat16 output, not a float32 one).
#
# Use your `rope_angles` (with its default base). The check runs your function with **our**
# `rope_angles`, so that a mistake in Exercise 2 costs only Exercise 2's points.

# %% grade_id="apply_rope"
def apply_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(..., T, D) queries or keys turned pair by pair (x_i with x_(i + D/2)) at positions (T,)."""
    ### BEGIN SOLUTION
    D = x.shape[-1]
    angles = rope_angles(D, int(positions.max()) + 1)  # (P, D/2), float32 on the CPU
    angles = angles.to(x.device)[positions.to(x.device)]  # (T, D/2): the rows of these positions, on x's device
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]  # (..., T, D/2) each
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (..., T, D)
    ### END SOLUTION

# %% grade_id="test_apply_rope" points=3
# Check: several shapes, positions from 0 and a chunk at positions 10, 11, 12, and a bfloat16 `x`.
checks.check_apply_rope(apply_rope)
### BEGIN HIDDEN TESTS
checks.check_apply_rope(apply_rope, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Two checks of what RoPE promises, on your function. Written with complex numbers, pair `i` is
# `z = x1[i] + j·x2[i]`, and turning it by `φ` multiplies it by `e^{jφ}`: an independent way to compute
# the same thing. And the score of a turned query and key depends only on their distance:

# %%
torch.manual_seed(0)
x = torch.randn(2, 5, 8)  # (b, T, D): five tokens of one head
positions = torch.arange(5)
z = torch.complex(x[..., :4], x[..., 4:]) * torch.polar(torch.ones(5, 4), rope_angles(8, 5))  # (2, 5, 4) complex
print("complex rotation equals apply_rope:", torch.allclose(torch.cat([z.real, z.imag], dim=-1),
                                                            apply_rope(x, positions), atol=1e-6))
q, k = torch.randn(1, 8), torch.randn(1, 8)  # (1, D): one query and one key
scores = torch.tensor([(apply_rope(q, torch.tensor([m])) @ apply_rope(k, torch.tensor([m - 2])).T).item()
                       for m in (3, 10, 100)])  # query at m, key at m - 2: the same distance
print("query at 3, 10 and 100, key 2 positions earlier: the same score:", torch.allclose(scores, scores[0], atol=1e-4))

# %% [markdown]
# ## 4. The key/value cache
#
# A module with a cache keeps two tensors between calls:
#
# - `cache_k` and `cache_v`, shape `(b, H, t, D)`: the keys and values of the `t` tokens seen so far,
#   already split into heads.
#
# `forward(x, use_cache=True)` treats `x` `(b, T, d_in)` as the **next** `T` tokens:
#
# 1. `start` = the number of cached tokens: the position of the first new token;
# 2. project `x` to queries, keys and values, and split them into heads `(b, H, T, D)`;
# 3. append the new keys and values to the cache **along the token dimension** (`dim=2`):
#    `torch.cat([self.cache_k, keys], dim=2)` is `(b, H, start + T, D)`;
# 4. scores of the `T` new queries against all `start + T` keys: `(b, H, T, start + T)`;
# 5. mask with rows `start .. start + T - 1` of the causal mask, the bottom-right corner:
#    `self.mask[start:start + T, :start + T]`, which equals `decode_causal_mask(T, start + T)`;
# 6. softmax, dropout, times the cached values, merge the heads, `out_proj`, as before.
#
# `reset_cache()` empties the cache, so that the next call starts a new sequence at position 0.
#
# Keep the cache in **buffers** (notebook 04): `self.register_buffer("cache_k", None, persistent=False)`
# makes `cache_k` a buffer that starts empty (`None`), moves with `.to(device)`, and is not saved in
# `state_dict` (it is not part of the model). Assigning `self.cache_k = tensor` later fills it, and it
# stays a buffer. The check tests both: the filled cache must be a buffer, and not in `state_dict()`.

# %% [markdown]
# ### Exercise 4: `MultiHeadAttentionKVCache`
#
# Write `MultiHeadAttentionKVCache(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False,
# rope=False)`, a subclass of `MultiHeadAttention` (same parameters, created by `super().__init__`):
#
# - `__init__`: register the buffers `cache_k` and `cache_v`, both `None` at first;
# - `reset_cache()`: set both back to `None`;
# - `forward(x, use_cache=False)`: without the cache, notebook 05's forward (given, and it must leave
#   the cache alone); with `use_cache=True`, steps 1-6 above.
# - `rope=True`: turn the queries and the keys with `apply_rope` (section 3) right after splitting the
#   heads, at positions `start .. start + T - 1`: **before** the keys are cached. Without the cache,
#   `forward(x)` does the same with `start = 0` and leaves the cache alone (`super().forward` knows
#   nothing of RoPE). Values are never turned.
# - Errors: raise a `ValueError` (not an `assert`) when `x` has no tokens (an empty prompt), and a
#   `ValueError` whose message names the limit, `context_length`, when `start + T > context_length`
#   (the mask and the model's positions stop there). PyTorch's own shape errors do not count.
#
# A prompt, then one token at a time or chunks of several tokens, must give **exactly** the outputs of
# `forward` on the whole sequence. You may call your `decode_causal_mask`, `split_heads` and
# `merge_heads`, and your `apply_rope`; the check runs your class with **our** `decode_causal_mask` and
# `apply_rope`, so that a mistake in Exercise 1 or 3 costs only that exercise's points.
#
# Rules: do not use `nn.MultiheadAttention`, `F.multi_head_attention_forward` or `flex_attention`:
# extend notebook 05's `MultiHeadAttention` yourself. `F.scaled_dot_product_attention` is allowed, with
# the right mask.

# %% grade_id="MultiHeadAttentionKVCache"
class MultiHeadAttentionKVCache(MultiHeadAttention):
    """MultiHeadAttention that can read a sequence piece by piece, keeping earlier keys and values."""

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False, rope: bool = False):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        self.rope = rope  # turn queries and keys with apply_rope
        ### BEGIN SOLUTION
        self.register_buffer("cache_k", None, persistent=False)  # (b, H, tokens so far, D) once filled
        self.register_buffer("cache_v", None, persistent=False)
        ### END SOLUTION

    def reset_cache(self) -> None:
        """Forget the cached keys and values: the next use_cache=True call starts at position 0."""
        ### BEGIN SOLUTION
        self.cache_k, self.cache_v = None, None
        ### END SOLUTION

    def forward(self, x: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        """(b, T, d_in) -> (b, T, d_out); with use_cache=True, x holds the NEXT T tokens of the sequence."""
        if not use_cache and not self.rope:
            return super().forward(x)
        ### BEGIN SOLUTION
        b, T, _ = x.shape
        if T == 0:
            raise ValueError("empty input: use_cache=True needs at least one token")
        start = 0 if self.cache_k is None or not use_cache else self.cache_k.shape[2]  # first new token's position
        if start + T > self.mask.shape[0]:
            raise ValueError(f"{start} cached + {T} new tokens > context_length={self.mask.shape[0]}: reset_cache()")
        H, D = self.num_heads, self.head_dim
        queries = self.W_query(x).view(b, T, H, D).transpose(1, 2)  # (b, H, T, D)
        keys = self.W_key(x).view(b, T, H, D).transpose(1, 2)
        values = self.W_value(x).view(b, T, H, D).transpose(1, 2)
        if self.rope:  # turned at their own positions, BEFORE the keys are cached
            positions = torch.arange(start, start + T, device=x.device)
            queries, keys = apply_rope(queries, positions), apply_rope(keys, positions)
        if use_cache:
            if self.cache_k is not None:
                keys = torch.cat([self.cache_k, keys], dim=2)  # (b, H, start + T, D)
                values = torch.cat([self.cache_v, values], dim=2)
            self.cache_k, self.cache_v = keys, values
        scores = queries @ keys.transpose(2, 3)  # (b, H, T, start + T)
        scores = scores.masked_fill(self.mask[start:start + T, :start + T], -torch.inf)  # bottom-right rows
        weights = self.dropout(torch.softmax(scores / D ** 0.5, dim=-1))
        context = (weights @ values).transpose(1, 2).reshape(b, T, self.d_out)  # (b, T, d_out)
        return self.out_proj(context)
        ### END SOLUTION

# %% grade_id="test_MultiHeadAttentionKVCache" points=6
# Check (with our decode_causal_mask and apply_rope): forward without the cache; with the cache, a prompt
# then one token at a time, and a prompt then chunks of 2 and 1 tokens, against one full forward (batch 1
# and more, float64); the same with rope=True; reset_cache(); the cache in buffers, not in state_dict; a
# ValueError past context_length and for an empty prompt.
checks.check_MultiHeadAttentionKVCache(MultiHeadAttentionKVCache)
### BEGIN HIDDEN TESTS
checks.check_MultiHeadAttentionKVCache(MultiHeadAttentionKVCache, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# A prompt of 4 tokens, then the other 6 one at a time, against one forward over all 10, without and
# with RoPE:

# %%
torch.manual_seed(123)
cached = MultiHeadAttentionKVCache(d_in=4, d_out=8, context_length=16, dropout=0.0, num_heads=2).eval()
x = torch.rand(2, 10, 4)  # (b, T, d_in)

with torch.no_grad():
    whole = cached(x)  # (2, 10, 8): no cache
    cached.reset_cache()
    pieces = [cached(x[:, :4], use_cache=True)]  # the prompt: (2, 4, 8)
    for t in range(4, 10):
        pieces.append(cached(x[:, t:t + 1], use_cache=True))  # one token: (2, 1, 8)
step_by_step = torch.cat(pieces, dim=1)  # (2, 10, 8)
print("cache holds:", tuple(cached.cache_k.shape), "= (b, H, tokens, D)")
print("same outputs as the full forward (to 1e-6):", torch.allclose(step_by_step, whole, atol=1e-6))

torch.manual_seed(123)
turned = MultiHeadAttentionKVCache(d_in=4, d_out=8, context_length=16, dropout=0.0, num_heads=2, rope=True).eval()
with torch.no_grad():
    whole_rope = turned(x)  # (2, 10, 8): queries and keys turned at positions 0..9
    turned.reset_cache()
    pieces = [turned(x[:, :4], use_cache=True)] + [turned(x[:, t:t + 1], use_cache=True) for t in range(4, 10)]
print("with rope=True too:", torch.allclose(torch.cat(pieces, dim=1), whole_rope, atol=1e-6))

# %% [markdown]
# The same numbers up to float32 rounding (the products are summed in another order, so the last
# bits may differ: compare with a tolerance, never with `==`). One more token than `context_length`
# is refused:

# %%
try:
    with torch.no_grad():
        cached(torch.rand(2, 7, 4), use_cache=True)  # 10 cached + 7 new > 16
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# ### RoPE with the cache: turn at `start + i`, before caching
#
# A model with RoPE turns each new query and key **before** the key goes into the cache, at the
# token's real position: token `i` of a chunk that arrives after `start` cached tokens sits at position
# `start + i`. Cached keys keep their turn for good; nothing in the cache is touched again. The classic
# mistakes: positions that restart at 0 with every call, and keys turned a second time after they were
# cached (or cached unturned, then turned with the current call's positions). We decode raw queries and
# keys one token at a time, with your `apply_rope`:

# %%
torch.manual_seed(0)
T = 6
q, k, v = torch.randn(3, 1, 2, T, 8).unbind(0)  # each (b=1, H=2, T, D=8)
positions = torch.arange(T)
target = F.scaled_dot_product_attention(apply_rope(q, positions), apply_rope(k, positions), v,
                                        is_causal=True)  # (1, 2, T, 8): the whole sequence at once


def decode_with_rope(position_of) -> torch.Tensor:
    """Decode one token at a time; token t is turned at position position_of(t); returns (1, 2, T, 8)."""
    k_cache, outputs = None, []
    for t in range(T):
        at = torch.tensor([position_of(t)])
        k_new = apply_rope(k[:, :, t:t + 1], at)  # (1, 2, 1, 8): turned BEFORE it is cached
        k_cache = k_new if k_cache is None else torch.cat([k_cache, k_new], dim=2)  # (1, 2, t + 1, 8)
        q_new = apply_rope(q[:, :, t:t + 1], at)
        outputs.append(F.scaled_dot_product_attention(q_new, k_cache, v[:, :, :t + 1]))  # one token sees all
    return torch.cat(outputs, dim=2)


print("positions start + i:       ", torch.allclose(decode_with_rope(lambda t: t), target, atol=1e-5))
print("positions restarting at 0: ", torch.allclose(decode_with_rope(lambda t: 0), target, atol=1e-5))

# %% [markdown]
# ### Time per generated token
#
# We generate 16 tokens after prompts of growing length `T`, with and without the cache, on a module
# with `d = 128` and 8 heads, and report the time **per generated token**: the median of 7 runs, on
# one CPU thread. Each run sweeps all the lengths, so a moment when another program slows the machine
# down hits every length alike, and the median ignores the odd slow run. Without the cache,
# each step runs the whole sequence again: `T` projections and a `(T, T)` score matrix. With it, each
# step projects **one** token and computes one row of `T` scores.

# %% tags=["nbval-ignore-output"]
def time_per_token(module: MultiHeadAttentionKVCache, x: torch.Tensor, prompt_len: int, new_tokens: int,
                   use_cache: bool) -> float:
    """One run: seconds per token to generate `new_tokens` after `prompt_len` tokens of x."""
    with torch.no_grad():
        if use_cache:
            module.reset_cache()
            module(x[:, :prompt_len], use_cache=True)  # reading the prompt is not timed
        start = time.perf_counter()
        for t in range(prompt_len, prompt_len + new_tokens):
            if use_cache:
                module(x[:, t:t + 1], use_cache=True)  # (1, 1, d): the new token only
            else:
                module(x[:, :t + 1])  # (1, t + 1, d): everything again
        return (time.perf_counter() - start) / new_tokens


LENGTHS = (16, 32) if under_grader() else (32, 64, 128, 256, 512)  # a short sweep while grading
NEW, REPEATS = 16, (2 if under_grader() else 7)
WAYS = {"without cache": False, "with cache": True}
torch.manual_seed(0)
gen = MultiHeadAttentionKVCache(128, 128, LENGTHS[-1] + NEW, 0.0, 8).eval()
tokens = torch.rand(1, LENGTHS[-1] + NEW, 128)  # (1, T, d)
threads = torch.get_num_threads()
torch.set_num_threads(1)  # one thread: steadier numbers when other programs share the CPU
for use_cache in WAYS.values():  # warm-up: the first calls are slow
    time_per_token(gen, tokens, LENGTHS[-1], NEW, use_cache)
runs = {name: {T: [] for T in LENGTHS} for name in WAYS}
for _ in range(REPEATS):  # each run sweeps every length
    for name, use_cache in WAYS.items():
        for T in LENGTHS:
            runs[name][T].append(time_per_token(gen, tokens, T, NEW, use_cache))
per_token = {name: [statistics.median(runs[name][T]) for T in LENGTHS] for name in WAYS}
torch.set_num_threads(threads)
for i, T in enumerate(LENGTHS):
    print(f"T = {T:5d}: without cache {per_token['without cache'][i] * 1e3:6.2g} ms/token, "
          f"with cache {per_token['with cache'][i] * 1e3:6.2g} ms/token")

# %% [markdown]
# ### What `torch.cat` costs: a static cache
#
# `torch.cat([self.cache_k, keys], dim=2)` cannot grow a tensor in place: it allocates a new one of
# `start + T` tokens and **copies the whole cache** into it, at every step. Generating `n` tokens
# copies about `n² / 2` cached tokens in all: the same growth we wanted to get rid of, with a
# smaller constant. Production code (Hugging Face's `StaticCache`, vLLM, llama.cpp) allocates the
# cache **once**, for `context_length` tokens, and writes each new token into its slot:
#
# - `cache_k[:, :, start:start + T] = keys` copies only the `T` new tokens;
# - attention reads `cache_k[:, :, :start + T]`, a view of the filled slots (no copy).
#
# The price: the memory of a full context is reserved up front, even for a short sequence. Here is one
# step of each, appending one token `(1, H, 1, D)` to a cache of `t` tokens (`H = 8`, `D = 64`):

# %%
def append_cat(cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """(b, H, t, D) and (b, H, 1, D) -> a NEW (b, H, t + 1, D) tensor: all t cached tokens are copied."""
    return torch.cat([cache, new], dim=2)


def append_static(buffer: torch.Tensor, new: torch.Tensor, t: int) -> torch.Tensor:
    """Write token t into slot t of a preallocated (b, H, context_length, D) buffer; return the filled (b, H, t + 1, D) view."""
    buffer[:, :, t:t + 1] = new  # one token's keys are copied, nothing else
    return buffer[:, :, :t + 1]  # a view: no copy


torch.manual_seed(0)
cached_keys = torch.randn(1, 8, 100, 64)  # (b, H, t=100, D)
new_key = torch.randn(1, 8, 1, 64)  # (b, H, 1, D)
static_buffer = torch.zeros(1, 8, 256, 64)  # (b, H, context_length=256, D), allocated once
static_buffer[:, :, :100] = cached_keys
print("same cache both ways:", torch.equal(append_cat(cached_keys, new_key), append_static(static_buffer, new_key, 100)))


# %% tags=["nbval-ignore-output"]
def median_seconds(fn, repeats: int = 15) -> float:
    """Median wall time of `repeats` calls of fn()."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


CACHE_LENGTHS = (256, 1024) if under_grader() else (256, 1024, 4096, 8192)
keys_by_length = {t: torch.randn(1, 8, t, 64) for t in CACHE_LENGTHS}  # (1, H, t, D) for each length
buffer = torch.zeros(1, 8, CACHE_LENGTHS[-1] + 1, 64)  # preallocated once, for the longest sequence
torch.set_num_threads(1)
per_append = {"torch.cat": [median_seconds(lambda: append_cat(keys_by_length[t], new_key)) for t in CACHE_LENGTHS],
              "static buffer": [median_seconds(lambda: append_static(buffer, new_key, t)) for t in CACHE_LENGTHS]}
torch.set_num_threads(threads)

fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
for name, times in per_token.items():
    left.plot(LENGTHS, [x * 1e3 for x in times], "o-", label=name)
plotting.readable_log_axes(left, LENGTHS)
left.set_xlabel("tokens already in the sequence, T")
left.set_ylabel("ms per generated token (CPU, median)")
left.set_title("one attention layer, d = 128, 8 heads")
left.legend()
for name, times in per_append.items():
    right.plot(CACHE_LENGTHS, [x * 1e6 for x in times], "o-", label=name)
plotting.readable_log_axes(right, CACHE_LENGTHS)
right.set_xlabel("tokens in the cache, t")
right.set_ylabel("µs to append one token (CPU, median)")
right.set_title("appending one token's keys, H = 8, D = 64")
right.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# Left: without the cache, the time per token grows with `T` (the projections grow like `T`, the scores
# like `T²`); generating `n` tokens costs about `n²` work in all. With the cache it stays almost flat at
# these sizes, where the cost of each call dominates: one token's projections, and a dot product with
# each cached key.
#
# Right: `torch.cat` copies the whole cache, so appending one token costs time in proportion to the
# cache's length; the static buffer writes one slot, whatever the length. At these sizes the copy is
# small next to the rest of a step, but it grows with every token, in every layer.
#
# The price of a cache is memory. Each cached token stores one key and one value per head:

# %%
bytes_per_token = (gen.cache_k.element_size() * gen.cache_k[0, :, 0].numel()  # one token's keys, all heads
                   + gen.cache_v.element_size() * gen.cache_v[0, :, 0].numel())
print(f"cache now: {tuple(gen.cache_k.shape)} keys and as many values")
print(f"per token and sequence: {bytes_per_token} bytes = 2 (K and V) x {gen.d_out} (H x D) x 4 bytes (float32)")

# %% [markdown]
# That is for **one** attention layer. A real model multiplies it by its number of layers, and keeps
# one cache per sequence of the batch. Section 5 puts numbers on a Llama-sized model.

# %% [markdown]
# ## 5. Sharing keys and values: grouped-query attention
#
# In multi-head attention every head has its own keys and values, so the cache holds `2 · H · D`
# numbers per token and layer. **Grouped-query attention** (GQA, used by Llama 2 70B, Llama 3, Mistral,
# Qwen...) keeps all `H` query heads but only `G` key/value heads (`num_kv_groups`): query heads
# `0..n_rep-1` share key/value head 0, the next `n_rep` share head 1, and so on, with
# `n_rep = H // G`. The cache shrinks by a factor `H / G`. Two special cases:
#
# - `G = H`: every query head has its own key/value head: multi-head attention;
# - `G = 1`: all query heads share one key/value head: **multi-query attention** (MQA).
#
# To compute the scores, each key/value head is repeated `n_rep` times so that it lines up with its
# query heads: `(b, G, T, D) -> (b, H, T, D)`. With `G = 2` and `n_rep = 3`, heads `[k0, k1]` become
# `[k0, k0, k0, k1, k1, k1]`: copies of one head come **together**.

# %% [markdown]
# ### Exercise 5: `repeat_kv`
#
# Write `repeat_kv(x, n_rep)`: `x` is `(b, G, T, D)`; return `(b, G * n_rep, T, D)` where output head
# `h` is input head `h // n_rep`. With `n_rep = 1`, return `x` unchanged.
#
# Hint: `torch.repeat_interleave` with the right `dim`, or `x[:, :, None].expand(...)` then `reshape`.
# Think about which dimension holds the heads.

# %% grade_id="repeat_kv"
def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(b, G, T, D) -> (b, G * n_rep, T, D): each key/value head repeated n_rep times in a row."""
    ### BEGIN SOLUTION
    return x.repeat_interleave(n_rep, dim=1)
    ### END SOLUTION

# %% grade_id="test_repeat_kv" points=2
checks.check_repeat_kv(repeat_kv)
### BEGIN HIDDEN TESTS
checks.check_repeat_kv(repeat_kv, hidden=True)
### END HIDDEN TESTS

# %%
heads = torch.arange(2.0).view(1, 2, 1, 1)  # (b, G=2, T=1, D=1): head g holds the number g
print("repeat_kv:", repeat_kv(heads, 3).flatten().tolist())  # [0, 0, 0, 1, 1, 1]
print("repeat:   ", heads.repeat(1, 3, 1, 1).flatten().tolist(), "<- tiled: query head 1 would get group 1")

# %% [markdown]
# ### Exercise 6: `GroupedQueryAttention`
#
# Write `GroupedQueryAttention(d_in, d_out, context_length, dropout, num_heads, num_kv_groups,
# qkv_bias=False)`, built like `MultiHeadAttention`:
#
# - raise a `ValueError` unless `num_kv_groups` divides `num_heads` (and `num_heads` divides `d_out`);
# - create **in this order**: `self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)`, `self.W_key` and
#   `self.W_value` as `nn.Linear(d_in, num_kv_groups * head_dim, bias=qkv_bias)`, `self.out_proj =
#   nn.Linear(d_out, d_out)`, `self.dropout = nn.Dropout(dropout)`, and the causal mask buffer `mask`;
# - `forward(x)`: queries `(b, H, T, D)`; keys and values `(b, G, T, D)`, repeated to `(b, H, T, D)`
#   with `repeat_kv`; then exactly as `MultiHeadAttention` (scale by `sqrt(head_dim)`, mask, softmax,
#   dropout, values, merge, `out_proj`).
# - Errors: raise a `ValueError` whose message names the limit, `context_length`, when
#   `T > context_length` (as Exercise 4 does; PyTorch's own shape error does not count).
#
# The check runs your class with **our** `repeat_kv`, so that a mistake in Exercise 5 costs only
# Exercise 5's points (in the student edition, which has no answers, it asks you to fix `repeat_kv`
# first).
#
# Rules: write the attention yourself here: do not use `F.scaled_dot_product_attention`,
# `nn.MultiheadAttention`, `F.multi_head_attention_forward` or `flex_attention`. SDPA comes right after,
# to compare.

# %% grade_id="GroupedQueryAttention"
class GroupedQueryAttention(nn.Module):
    """Causal attention with num_heads query heads sharing num_kv_groups key/value heads; (b, T, d_in) -> (b, T, d_out)."""

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
                 num_kv_groups: int, qkv_bias: bool = False):
        super().__init__()
        ### BEGIN SOLUTION
        if d_out % num_heads != 0 or num_heads % num_kv_groups != 0:
            raise ValueError(f"num_heads must divide d_out and num_kv_groups must divide num_heads, got "
                             f"d_out={d_out}, num_heads={num_heads}, num_kv_groups={num_kv_groups}")
        self.d_out, self.num_heads, self.num_kv_groups = d_out, num_heads, num_kv_groups
        self.head_dim = d_out // num_heads
        self.n_rep = num_heads // num_kv_groups  # query heads per key/value head
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, num_kv_groups * self.head_dim, bias=qkv_bias)  # only G heads
        self.W_value = nn.Linear(d_in, num_kv_groups * self.head_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), 1))
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        b, T, _ = x.shape
        if T > self.mask.shape[0]:
            raise ValueError(f"the input has {T} tokens, more than context_length={self.mask.shape[0]}")
        H, G, D = self.num_heads, self.num_kv_groups, self.head_dim
        queries = self.W_query(x).view(b, T, H, D).transpose(1, 2)  # (b, H, T, D)
        keys = self.W_key(x).view(b, T, G, D).transpose(1, 2)  # (b, G, T, D)
        values = self.W_value(x).view(b, T, G, D).transpose(1, 2)
        keys, values = repeat_kv(keys, self.n_rep), repeat_kv(values, self.n_rep)  # (b, H, T, D)
        scores = (queries @ keys.transpose(2, 3)).masked_fill(self.mask[:T, :T], -torch.inf)  # (b, H, T, T)
        weights = self.dropout(torch.softmax(scores / D ** 0.5, dim=-1))
        return self.out_proj((weights @ values).transpose(1, 2).reshape(b, T, self.d_out))
        ### END SOLUTION

# %% grade_id="test_GroupedQueryAttention" points=5
# Check (with our repeat_kv): outputs for grouped, multi-head (G = H) and multi-query (G = 1) constructions,
# causality, dropout only in train(), a ValueError for too-long inputs, .to(float64), and an error when G
# does not divide H.
checks.check_GroupedQueryAttention(GroupedQueryAttention)
### BEGIN HIDDEN TESTS
checks.check_GroupedQueryAttention(GroupedQueryAttention, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### The same as SDPA with `enable_gqa=True`, and the two special cases
#
# `repeat_kv` makes **real copies**: `(b, G, T, D)` becomes `(b, H, T, D)` in memory, `n_rep` times the
# keys and values, for every layer and every step. Fused kernels never do that: they read key/value
# head `h // n_rep` directly while computing query head `h`. So does `F.scaled_dot_product_attention`
# with `enable_gqa=True` (PyTorch 2.5+), which accepts keys and values with fewer heads than the
# queries. We feed it our module's own projections:

# %%
torch.manual_seed(123)
gqa = GroupedQueryAttention(d_in=4, d_out=8, context_length=16, dropout=0.0, num_heads=4, num_kv_groups=2).eval()
x = torch.rand(2, 10, 4)  # (b, T, d_in)
with torch.no_grad():
    q = split_heads(gqa.W_query(x), 4)  # (2, 4, 10, 2): 4 query heads
    k = split_heads(gqa.W_key(x), 2)  # (2, 2, 10, 2): 2 key/value heads
    v = split_heads(gqa.W_value(x), 2)
    try:
        core = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # (2, 4, 10, 2)
        print("SDPA enable_gqa=True equals ours:",
              torch.allclose(gqa.out_proj(merge_heads(core)), gqa(x), atol=1e-6))
    except TypeError as err:  # torch < 2.5 has no enable_gqa
        print("skipped: this torch has no enable_gqa:", err)

# %% [markdown]
# With `num_kv_groups == num_heads` the parameters have the same shapes, in the same order, as
# `MultiHeadAttention`'s: with the same seed both modules have the same weights and give the same
# outputs. With `num_kv_groups == 1`, every query head shares one key and one value head.

# %%
torch.manual_seed(123)
as_mha = GroupedQueryAttention(4, 8, 16, 0.0, num_heads=4, num_kv_groups=4).eval()
torch.manual_seed(123)
reference_mha = MultiHeadAttention(4, 8, 16, 0.0, num_heads=4).eval()
with torch.no_grad():
    print("G = H is multi-head attention:", torch.equal(as_mha(x), reference_mha(x)))
mqa = GroupedQueryAttention(4, 8, 16, 0.0, num_heads=4, num_kv_groups=1)
print("G = 1, multi-query: W_key is", tuple(mqa.W_key.weight.shape), "= one head of D = 2")

# %% [markdown]
# ### What it saves at the size of a Llama model
#
# Llama 3 8B has `d = 4096`, 32 query heads of `D = 128`, 32 layers, a context of 8192 tokens, and
# stores its cache in bfloat16 (2 bytes per number). We build one attention layer with your class on
# PyTorch's `"meta"` device (shapes without data, so nothing is allocated), count its parameters, and
# compute the cache from the sizes of its key and value projections, for `G = 32` (MHA), `8` (GQA, what
# Llama 3 uses) and `1` (MQA).

# %%
LLAMA = {"d": 4096, "heads": 32, "layers": 32, "context": 8192, "bytes": 2}  # bfloat16 cache


def llama_like_row(num_kv_groups: int) -> dict:
    """Parameters of one attention layer and KV-cache bytes of the model (per token, per full context)."""
    with torch.device("meta"):
        layer = GroupedQueryAttention(LLAMA["d"], LLAMA["d"], LLAMA["context"], 0.0, LLAMA["heads"], num_kv_groups)
    params = sum(p.numel() for p in layer.parameters())
    kv_numbers = layer.W_key.out_features + layer.W_value.out_features  # per token and layer
    per_token = kv_numbers * LLAMA["bytes"] * LLAMA["layers"]
    return {"params": params, "per_token": per_token, "per_sequence": per_token * LLAMA["context"]}


rows = {name: llama_like_row(g) for name, g in (("MHA, G = 32", 32), ("GQA, G = 8", 8), ("MQA, G = 1", 1))}
print(f"{'':12s} {'params / layer':>15s} {'cache / token':>14s} {'cache, 8192 tokens':>19s}")
for name, r in rows.items():
    print(f"{name:12s} {r['params'] / 1e6:13.1f} M {r['per_token'] / 2**10:11.0f} KiB {r['per_sequence'] / 2**30:15.2f} GiB")

# %%
saved_per_layer = rows["MHA, G = 32"]["params"] - rows["GQA, G = 8"]["params"]
LLAMA3_8B_PARAMS = 8.03e9  # all of Llama 3 8B (with GQA): embeddings, attention, MLPs, norms
print(f"attention layer: {rows['MHA, G = 32']['params'] / 1e6:.1f} M -> {rows['GQA, G = 8']['params'] / 1e6:.1f} M "
      f"parameters ({-saved_per_layer / rows['MHA, G = 32']['params']:.1%})")
print(f"whole model: {LLAMA['layers'] * saved_per_layer / 1e9:.2f} B parameters fewer than with MHA "
      f"({LLAMA['layers'] * saved_per_layer / (LLAMA3_8B_PARAMS + LLAMA['layers'] * saved_per_layer):.1%} of the model)")
print(f"KV cache: {rows['MHA, G = 32']['per_token'] // rows['GQA, G = 8']['per_token']} times smaller")

# %% [markdown]
# Grouping changes all three:
#
# - **attention parameters**: `W_key` and `W_value` shrink from `d × d` to `d × G · D`, while `W_query` and
#   `out_proj` stay: 67.1 M → 41.9 M per attention layer, 37.5 % fewer;
# - **the whole model**: 32 layers × 25.2 M ≈ 0.8 B parameters fewer, about 9 % of a Llama 3 8B built with
#   MHA (most of the weights sit in the MLPs and embeddings, which grouping does not touch);
# - **the KV cache**: divided by `H / G`, 4 times smaller for Llama 3's 8 groups. This one matters most:
#   with a batch of 16 sequences of 8192 tokens, the MHA cache alone would need 16 × 4 GiB = 64 GiB,
#   more than the model's own 16 GB of weights; GQA needs a quarter of that.
#
# Quality suffers little with a few groups, more with MQA, which is why most recent models chose GQA.
#
# ### The GQA cache stores the `G` heads, not the `H`
#
# A GQA model decodes with a cache like Exercise 4's, with one rule: cache the keys and values
# **before** `repeat_kv`, as `(b, G, t, D)`, and repeat after reading them. Caching after the repeat
# would store each head `n_rep` times and save nothing. We decode our module token by token with such a
# cache, built from its own projections:

# %%
torch.manual_seed(123)
gqa = GroupedQueryAttention(d_in=4, d_out=8, context_length=16, dropout=0.0, num_heads=4, num_kv_groups=2).eval()
H, G = 4, 2  # 4 query heads share 2 key/value heads of D = 2
x = torch.rand(2, 10, 4)  # (b, T, d_in)
cache_k = cache_v = None
outputs = []
with torch.no_grad():
    for t in range(x.shape[1]):
        x_t = x[:, t:t + 1]  # (2, 1, 4): the new token
        q_t = split_heads(gqa.W_query(x_t), H)  # (2, H, 1, D)
        k_t = split_heads(gqa.W_key(x_t), G)  # (2, G, 1, D): cached as it is, G heads
        v_t = split_heads(gqa.W_value(x_t), G)
        cache_k = k_t if cache_k is None else torch.cat([cache_k, k_t], dim=2)  # (2, G, t + 1, D)
        cache_v = v_t if cache_v is None else torch.cat([cache_v, v_t], dim=2)
        keys, values = repeat_kv(cache_k, H // G), repeat_kv(cache_v, H // G)  # (2, H, t + 1, D): after reading
        weights = torch.softmax(q_t @ keys.transpose(2, 3) / math.sqrt(keys.shape[-1]), dim=-1)  # (2, H, 1, t + 1)
        outputs.append(gqa.out_proj(merge_heads(weights @ values)))  # (2, 1, 8); one new token needs no mask
    whole = gqa(x)  # (2, 10, 8)
print("cache holds:", tuple(cache_k.shape), f"= (b, G, tokens, D): {cache_k.shape[1]} heads, not {H}")
print("same outputs as the full forward (to 1e-6):", torch.allclose(torch.cat(outputs, dim=1), whole, atol=1e-6))

# %% [markdown]
# ## 6. Looking back a fixed distance: sliding windows
#
# With a **sliding window** of `w` tokens, query `i` sees only keys `i - w + 1 .. i`: itself and the
# `w - 1` tokens before it. Mistral 7B v0.1 used `w = 4096` in every layer (later Mistral versions
# dropped the window). Gemma 2 alternates windowed layers (`w = 4096`) and full layers one to one;
# Gemma 3 has 5 windowed layers (`w = 1024`) for each full one. Each layer looks back `w - 1`
# positions, but layers stack: after `L` windowed layers, information can travel `L · (w - 1)`
# positions.
#
# As a mask (True = hidden), entry `[i, j]` is True when `j > i` (the future) **or** `i - j >= w`
# (too far back). `w = 1`: each token sees only itself. `w >= T`: the ordinary causal mask.
#
# **FlexAttention** (`torch.nn.attention.flex_attention`, PyTorch 2.5+, notebook 06) describes a mask
# as a function instead of a tensor: `mask_mod(b, h, q_idx, kv_idx)` returns True where query `q_idx`
# **may** attend to key `kv_idx`. Mind the convention: it is the opposite of our masks, which mark
# what is hidden. `q_idx` and `kv_idx` arrive as tensors, so combine conditions with `&` and `|`,
# not `and`/`or`/`if`.

# %% [markdown]
# ### Exercise 7: `sliding_window_mask` and its `mask_mod`
#
# Write
# - `sliding_window_mask(num_tokens, window)`: a **boolean** `(T, T)` tensor, True where a key is hidden
#   from a query (the future, or `window` or more positions back). Raise a `ValueError` when `window < 1`;
# - `sliding_window_mask_mod(window)`: returns a function `mask_mod(b, h, q_idx, kv_idx)` that is True
#   where the query **may** attend, under the same rule.
#
# Hint: `i = torch.arange(T).unsqueeze(1)` and `j = torch.arange(T).unsqueeze(0)` broadcast to `(T, T)`.

# %% grade_id="sliding_window_mask"
def sliding_window_mask(num_tokens: int, window: int) -> torch.Tensor:
    """Boolean (T, T) mask, True where key j is hidden from query i: j > i, or i - j >= window."""
    ### BEGIN SOLUTION
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    distance = torch.arange(num_tokens).view(-1, 1) - torch.arange(num_tokens).view(1, -1)  # (T, T): i - j
    return (distance < 0) | (distance >= window)
    ### END SOLUTION


def sliding_window_mask_mod(window: int):
    """A FlexAttention mask_mod: True where query q_idx may attend to key kv_idx under the window."""
    def mask_mod(b, h, q_idx, kv_idx):
        ### BEGIN SOLUTION
        distance = q_idx - kv_idx
        return (distance >= 0) & (distance < window)
        ### END SOLUTION
    return mask_mod

# %% grade_id="test_sliding_window_mask" points=3
# Check: several sizes and windows (1 and T included), the dtype, window < 1 raises, and the mask_mod
# keeps exactly the entries that sliding_window_mask does not hide.
checks.check_sliding_window_mask(sliding_window_mask, sliding_window_mask_mod)
### BEGIN HIDDEN TESTS
checks.check_sliding_window_mask(sliding_window_mask, sliding_window_mask_mod, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Ten tokens with windows of 10 (the causal mask), 4 and 1:

# %%
fig, axes = plt.subplots(1, 3, figsize=(15, 4))
for ax, w in zip(axes, (10, 4, 1)):
    plotting.plot_mask(~sliding_window_mask(10, w), ("hidden", "may attend"), title=f"window = {w}", ax=ax)
fig.tight_layout()
plt.show()

# %% [markdown]
# ### The mask as a function: FlexAttention
#
# Eagerly on a CPU, FlexAttention calls your `mask_mod` on every `(q_idx, kv_idx)` pair (with
# `torch.vmap`) and computes the same attention as SDPA given the boolean mask. On a GPU, compiled, it
# turns the `mask_mod` into a fused kernel that skips the blocks that are entirely hidden: a window
# makes most of them hidden.

# %% tags=["nbval-ignore-output"]
FLEX_OK, FLEX_HOW = bench.flex_attention_status("cpu", compile=False)
print("FlexAttention here:", FLEX_HOW)

# %%
if FLEX_OK:
    import warnings

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 12, 8).unbind(0)  # each (b=1, H=2, T=12, D=8)
    block_mask = create_block_mask(sliding_window_mask_mod(4), None, None, 12, 12, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is not fused
        flex = flex_attention(q, k, v, block_mask=block_mask)  # (1, 2, 12, 8)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=~sliding_window_mask(12, 4))
    print("FlexAttention with your mask_mod equals SDPA with your mask:", torch.allclose(flex, sdpa, atol=1e-5))
else:
    print("skipped (the line above says why); the check compared the two rules directly")

# %% [markdown]
# ### How a window bounds the KV cache
#
# With a window of `w`, the token at position `t` needs only the keys and values of positions
# `t - w + 1 .. t`. Older entries will never be read again, so the cache can drop them: it keeps at
# most `w` tokens per layer, in a **rolling buffer** of `w` slots. Token `t` is written into slot
# `t mod w`, over the token `t - w` that no query will read again. The memory per sequence stops
# growing at `w` tokens, however long the text.
#
# Once the buffer has wrapped around, its slots are no longer in position order. That does not matter:
# attention is a weighted sum over a **set** of keys, and one new token may see every key in the
# buffer, so no mask is needed. (Positions live in the keys themselves: RoPE rotates them before they
# are cached.)
#
# We build the rolling buffer for raw queries, keys and values and decode one token at a time: the
# outputs equal attention with the full sliding-window mask.

# %%
torch.manual_seed(0)
T, w = 12, 4
q, k, v = torch.randn(3, 1, 2, T, 8).unbind(0)  # each (b=1, H=2, T, D=8)
target = F.scaled_dot_product_attention(q, k, v, attn_mask=~sliding_window_mask(T, w))  # (1, 2, T, 8)

k_buffer = torch.zeros(1, 2, w, 8)  # (b, H, w, D): the whole cache, allocated once
v_buffer = torch.zeros(1, 2, w, 8)
outputs = []
for t in range(T):
    slot = t % w  # token t overwrites token t - w
    k_buffer[:, :, slot] = k[:, :, t]
    v_buffer[:, :, slot] = v[:, :, t]
    filled = min(t + 1, w)  # slots holding a token so far
    outputs.append(F.scaled_dot_product_attention(q[:, :, t:t + 1], k_buffer[:, :, :filled],
                                                  v_buffer[:, :, :filled]))  # (1, 2, 1, 8): sees the whole buffer
print("rolling buffer gives the same outputs:", torch.allclose(torch.cat(outputs, dim=2), target, atol=1e-6))
print(f"slots in the buffer: {k_buffer.shape[2]} for a sequence of {T} tokens")
print("slot of each token:", [t % w for t in range(T)])

# %% [markdown]
# At the size of Mistral 7B v0.1 (the Llama-like layer above with 8 key/value groups, `w = 4096`), the
# cache of one sequence, with and without the window:

# %%
mistral_per_token = llama_like_row(8)["per_token"]  # bytes per token, all 32 layers, bfloat16
for length in (4096, 32768, 131072):
    print(f"{length:7d} tokens: full cache {mistral_per_token * length / 2**30:5.1f} GiB, "
          f"window of 4096: {mistral_per_token * min(length, 4096) / 2**30:4.1f} GiB")

# %% [markdown]
# ## 7. Why decoding is memory-bound: prefill against decode on the roofline
#
# Reading a prompt (**prefill**) and generating one token (**decode**) do very different work per
# byte. Take one layer's attention core, `Q Kᵀ` and `P V`, for `Tq` queries against `Tk` keys, with
# `H` query heads, `G` key/value heads of size `D`, and 2-byte numbers (bfloat16). It does
# `4 · H · Tq · Tk · D` FLOPs (two matmuls, 2 FLOPs per multiply-add), and must at least read the
# queries and write the outputs, `2 · H · Tq · D` numbers, and read the keys and values,
# `2 · G · Tk · D` numbers.
#
# - **Prefill**, `Tq = Tk = T`: the FLOPs grow like `T²`, the bytes like `T`. A causal prefill computes
#   only the scores at or below the diagonal, about half of them, so it does about half these FLOPs (we
#   count it that way below): still over a thousand FLOPs per byte at 4096 tokens, far right of the
#   ridge, compute-bound. (This counts every number once; notebook 07's tiles read `K` and `V` again for
#   each query block, which lowers it, but prefill stays the heavy, compute-hungry part.)
# - **Decode**, `Tq = 1`: the whole cache is read to compute one row of scores per query head. Each key
#   or value number read (2 bytes) takes part in one multiply-add (2 FLOPs) for each of the
#   `n_rep = H / G` query heads that share it: `2 · n_rep` FLOPs per 2 bytes, about `n_rep` FLOPs per
#   byte. **1 for MHA**, `n_rep` for GQA.
#
# That count assumes a **group-aware** kernel, which reads each key/value head once for its `n_rep`
# query heads (FlashAttention's kernels, SDPA with `enable_gqa=True`). With `repeat_kv`'s copies every
# query head reads a copy of its own, and decode is back to about 1 FLOP per byte.
#
# We place both on the same roofline as notebook 07, an H100, at Llama 3 8B's sizes (`H = 32`,
# `D = 128`) with 4096 tokens:

# %%
def attention_core_intensity(num_queries: int, num_keys: int, num_heads: int, num_kv_heads: int, head_dim: int,
                             element_bytes: int = 2, causal: bool = False) -> float:
    """FLOP per byte of one layer's attention core (Q K^T and P V) when each number is read or written once;
    causal (num_queries == num_keys): only the scores at or below the diagonal are computed."""
    scores = num_queries * (num_queries + 1) // 2 if causal else num_queries * num_keys  # per head
    flops = 4 * num_heads * scores * head_dim
    numbers = 2 * num_heads * num_queries * head_dim + 2 * num_kv_heads * num_keys * head_dim  # Q, O; K, V
    return flops / (numbers * element_bytes)


points = [("causal prefill of 4096 tokens, GQA (G = 8)", attention_core_intensity(4096, 4096, 32, 8, 128, causal=True)),
          ("decode, MHA (G = 32)", attention_core_intensity(1, 4096, 32, 32, 128)),
          ("decode, GQA (G = 8, n_rep = 4)", attention_core_intensity(1, 4096, 32, 8, 128)),
          ("decode, MQA (G = 1, n_rep = 32)", attention_core_intensity(1, 4096, 32, 1, 128))]
for label, flop_per_byte in points:
    print(f"{label:42s} {flop_per_byte:7.1f} FLOP/byte")
ax = plotting.plot_roofline(points, bench.GPU_SPECS["H100"], title="one layer's attention, Llama 3 8B sizes, 4096 tokens")
plt.show()

# %% [markdown]
# Every decode point sits on the memory slope, far left of the H100's ridge (295 FLOP/byte): a decode
# step's time is the time to **read the cache** (and the weights), while the tensor cores mostly wait.
# MHA uses less than 1 % of the chip's FLOPs there. Grouping does not remove any FLOPs; it removes
# **bytes**: with `G = 8` every key read serves 4 query heads, so the attention part of the step runs
# about 4 times faster, and MQA's about 32 times.
#
# The whole step gains less. At batch 1 it also reads every weight of the model: 16 GB for Llama 3 8B
# in bfloat16, against 2 GiB of cache for 4096 tokens with MHA and 0.5 GiB with GQA (32 layers, keys
# and values, 2 bytes each). The weights dominate there; the cache's share, and GQA's gain, grow with
# the batch and the length. And the memory the cache takes and the bandwidth it uses are the **same
# bytes**: a cache 4 times smaller both fits 4 times more sequences and is read 4 times faster.
# (Batching many sequences helps the weight matmuls, where one weight read serves every sequence, but
# not attention: each sequence reads its own cache.)

# %% [markdown]
# ## Check your understanding
#
# Click a question to see the answer.
#
# <details><summary>1. Predict: what does <code>decode_causal_mask(2, 5)</code> return?</summary>
#
# `[[F, F, F, F, T], [F, F, F, F, F]]`. The two queries are positions 3 and 4: query 3 may not see key
# 4, query 4 sees everything.
# </details>
#
# <details><summary>2. Predict: SDPA with 2 queries, 5 keys and <code>is_causal=True</code>. Which keys does each query see?</summary>
#
# Query 0 sees key 0 only, query 1 keys 0 and 1: the mask is `tril(ones(2, 5))`, aligned to the top
# left. The right answer for the last two positions is keys 0..3 and 0..4. No error is raised.
# </details>
#
# <details><summary>3. Find the bug: a student's cache works for the prompt and then raises <code>Sizes of tensors must match except in dimension 1</code> at the first new token. Their line is <code>self.cache_k = torch.cat([self.cache_k, keys], dim=1)</code> with keys of shape <code>(b, H, T, D)</code>.</summary>
#
# Dimension 1 holds the heads. Joining there needs every other dimension equal, but the cache has
# the prompt's tokens in dimension 2 and the new keys only one. The cache must grow along the tokens:
# `dim=2` for `(b, H, T, D)` (or `dim=1` if the cache is kept as `(b, T, H, D)`, before the transpose).
# </details>
#
# <details><summary>4. Why does the cache hold keys and values, but no queries?</summary>
#
# An old token's query is only used to compute that old token's output, which was already produced.
# A new token needs its own query and the keys and values of every token before it.
# </details>
#
# <details><summary>5. With the cache, generating <code>n</code> tokens after a prompt of <code>P</code> costs how many score computations, against how many without?</summary>
#
# With the cache, step `t` computes one row of `t` scores: about `n · P + n² / 2` scores in all.
# Without it, step `t` computes a full `t × t` matrix (half of it masked): about `n · P² + n² · P + n³ / 3`.
# </details>
#
# <details><summary>6. 32 query heads and 8 key/value groups: which key/value head does query head 13 use, and what would <code>keys.repeat(1, 4, 1, 1)</code> give it?</summary>
#
# `13 // 4 = 3`. With `repeat` (tiling) the heads come in the order 0..7, 0..7, ... so head 13 would
# get key/value head `13 % 8 = 5`: a different group, and no error.
# </details>
#
# <details><summary>7. A model has 32 layers, each with a window of 4096. Can the last token be influenced by a token 10,000 positions earlier?</summary>
#
# Yes: each layer moves information up to 4095 positions, so after 3 layers it can have travelled
# 12,285 positions. One layer alone cannot see it.
# </details>
#
# <details><summary>8. Find the bug: with RoPE and a cache, a student's outputs are right for the prompt and wrong for every later token. Their cached forward turns the new queries and keys with <code>apply_rope(q, torch.arange(T))</code>.</summary>
#
# The positions restart at 0 at every call: each new token is turned as if it were the first, so its
# scores against the cached keys see wrong distances. The prompt is right only because it does start at
# 0. Turn the new tokens at `torch.arange(start, start + T)`.
# </details>
#
# <details><summary>9. Predict: a decode step with 32 query heads and one key/value head (MQA) reads a cache of 4096 tokens. About how many FLOPs per byte?</summary>
#
# About 32: each key and value number read serves all 32 query heads. With MHA it would be about 1.
# </details>

# %% [markdown]
# ## Recap
#
# - When there are fewer queries than keys, the queries are the **last** positions: the causal mask is
#   aligned to the bottom right, `triu(ones(Tq, Tk), diagonal=Tk - Tq + 1)`. SDPA's `is_causal=True`
#   aligns it to the top left and silently breaks decoding; pass the mask, or `causal_lower_right`.
# - A **KV cache** keeps the keys and values `(b, H, t, D)` of the tokens seen so far, grows along the
#   token dimension, and makes each generated token cost one row of scores. It must reproduce the full
#   forward exactly; it costs `2 · H · D` numbers per token and layer. `torch.cat` copies the whole cache at
#   every step; a static cache, allocated once, writes each token into its slot.
# - **Grouped-query attention** shares `G` key/value heads among `H` query heads (`repeat_kv`: each
#   head repeated `H / G` times in a row); `G = H` is MHA, `G = 1` is MQA. The cache shrinks `H / G`
#   times (it stores the `G` heads; repeat after reading), the attention parameters by 37.5 % at Llama 3's
#   size, the whole model by about 9 %. Kernels and `enable_gqa` index head `h // n_rep` instead of copying.
# - A **sliding window** of `w` hides keys `w` or more positions back; as a FlexAttention `mask_mod` it
#   says where a query may attend. It caps the cache at `w` tokens per layer: a rolling buffer, token
#   `t` in slot `t mod w`.
#
# - **RoPE** turns each pair `(x_i, x_{i+D/2})` of a query or key by `p · base^(-2i/D)`, so scores depend
#   on distances only; with a cache, turn the new queries and keys at `start + i`, before caching.
# - **Prefill** is compute-bound (causal: half the FLOPs of all the scores); a **decode** step reads the
#   whole cache for about `n_rep` FLOPs per byte with a group-aware kernel (1 for MHA): it is
#   memory-bound, and GQA and MQA speed up its attention by reading fewer bytes.
#
# Notebook 09 puts attention into a complete tiny transformer and trains it.
