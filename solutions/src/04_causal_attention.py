# %% [markdown]
# # 04 · Causal attention: hiding the future
#
# In notebook 03 every token could attend to every other token, including the ones that come
# **after** it. A language model that writes text one token at a time cannot do that: when it
# predicts token 4, tokens 5, 6, ... do not exist yet. **Causal attention** (also called masked
# attention) enforces this: position `i` may only look at positions `0..i`.
#
# **In this notebook you will**
# 1. mask the future in two ways (zero it after softmax and renormalise, or set it to `-inf` before
#    softmax) and see why both give the same weights: `causal_mask`;
# 2. put the steps in the right order (scale, mask, softmax, dropout): `causal_attention_weights`;
# 3. learn what dropout does to attention weights, and why the survivors are scaled by `1/(1-p)`;
# 4. keep the mask inside a module with `register_buffer`, and see what breaks without it;
# 5. write a batched, causal, dropout-equipped attention class: `CausalAttention`.
#
# Shapes use these letters: `b` = batch size, `T` = number of tokens in the input,
# `d_in` = embedding size, `d_out` = size of queries, keys and values (`d_k` for the keys),
# `context_length` = the largest `T` a module accepts.
#
# How to work: fill in each cell that says `# YOUR CODE HERE`, run it, then run the check cell
# below it. A ✅ means your code agrees with ours on several inputs; a ❌ tells you what differs.

# %% setup=true

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn as nn

from course_utils import checks, data, plotting
from course_utils.device import describe_device, get_device

torch.manual_seed(123)
print("torch", torch.__version__)

# %% [markdown]
# ## 0. Where notebook 03 left us
#
# `SelfAttention_v2(d_in, d_out)` holds three `nn.Linear` layers. For an input `x` of shape
# `(T, d_in)` it computes
#
# - queries `Q = W_query(x)`, keys `K = W_key(x)`, values `V = W_value(x)`, each `(T, d_out)`;
# - scores `Q @ K.T`, shape `(T, T)`: row `i` says how well query `i` matches every key;
# - weights `softmax(scores / sqrt(d_k))` along the last dimension: each row sums to 1;
# - context vectors `weights @ V`, shape `(T, d_out)`.
#
# Here is that class, with the `scaled_dot_product_attention` it calls: our answer from notebook 03,
# shown so that this notebook never depends on your own earlier answer. Run the cell.

# %% shows="scaled_dot_product_attention SelfAttention_v2"
# Our answer from notebook 03.
import math

import torch
import torch.nn as nn

from course_utils.validation import check_last_dim, check_rank_at_least, check_same_last_dim

# %% [markdown]
# We rebuild the book's module with seed 789 and look at its weights for our six-token sentence.

# %%
inputs = data.book_inputs()  # (6, 3)
tokens = data.TOKENS
d_in, d_out = 3, 2

torch.manual_seed(789)
sa_v2 = SelfAttention_v2(d_in, d_out)

queries = sa_v2.W_query(inputs)  # (6, 2)
keys = sa_v2.W_key(inputs)  # (6, 2)
attn_scores = queries @ keys.T  # (6, 6)
attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)  # (6, 6)
print(attn_weights)

# %% [markdown]
# Every entry is non-zero. Row 1 ("journey") spends weight on "starts", "with", "one" and "step",
# tokens that come later in the sentence. The upper-right triangle of the heatmap is the future.

# %%
plotting.plot_attention(attn_weights.detach(), tokens, title="no mask: every token sees every token")
plt.show()

# %% [markdown]
# ## 1. Why the future must be hidden
#
# A GPT-style model is trained to predict the **next** token at every position at once: from
# "Your" predict "journey", from "Your journey" predict "starts", and so on. The whole sentence is
# in the input during training. If position 1 could attend to position 2, it could simply copy
# the answer, and the model would learn nothing it can use at generation time, when position 2
# has not been written yet.
#
# So we want weights where entry `(i, j)` is zero whenever `j > i`: a **lower-triangular** matrix.

# %% [markdown]
# ## 2. First attempt: zero the future after softmax
#
# `torch.tril` keeps the lower triangle (diagonal included) of a matrix and zeroes the rest.
# Applied to a matrix of ones, it gives a mask of shape `(T, T)`: 1 where a token may look, 0 where
# it may not.

# %%
context_length = attn_scores.shape[0]  # 6
mask_simple = torch.tril(torch.ones(context_length, context_length))  # (6, 6), 1 = allowed
print(mask_simple)

# %% [markdown]
# Multiplying the weights by this mask zeroes the future...

# %%
masked_simple = attn_weights * mask_simple  # (6, 6)
print(masked_simple)
print("row sums:", masked_simple.sum(dim=-1))

# %% [markdown]
# ...but the rows no longer sum to 1: row 0 keeps only 0.19 of its weight. The fix is to divide
# each row by its own sum. `keepdim=True` keeps the sums as a `(6, 1)` column so that the division
# broadcasts over each row.

# %%
row_sums = masked_simple.sum(dim=-1, keepdim=True)  # (6, 1)
masked_simple_norm = masked_simple / row_sums  # (6, 6)
print(masked_simple_norm)

# %% [markdown]
# Token 0 now gives all its attention to itself (it has nobody else), token 1 splits it
# 0.5517 / 0.4483 between "Your" and itself, and so on.

# %% [markdown]
# ## 3. Better: `-inf` before softmax
#
# Softmax computes `exp(s_j) / Σ_k exp(s_k)`. Since `exp(-inf) = 0`, a score set to `-inf` gets
# weight exactly 0 and does not count in the denominator either. So instead of fixing the weights
# afterwards we fix the **scores** beforehand.
#
# The mask now marks what to **hide**: `torch.triu(..., diagonal=1)` is 1 strictly above the
# diagonal. `masked_fill(mask, value)` writes `value` wherever the boolean `mask` is True.

# %%
mask = torch.triu(torch.ones(context_length, context_length), diagonal=1).bool()  # (6, 6), True = future
masked = attn_scores.masked_fill(mask, -torch.inf)  # (6, 6)
print(masked)

# %%
attn_weights_causal = torch.softmax(masked / keys.shape[-1] ** 0.5, dim=-1)  # (6, 6)
print(attn_weights_causal)
print("same as mask-then-renormalise:", torch.allclose(attn_weights_causal, masked_simple_norm))

# %% [markdown]
# ### Why the two methods agree
#
# Write `e_j = exp(s_j / sqrt(d_k))` for row `i`, and `Z = Σ_{all k} e_k`. Softmax then `tril`
# then renormalising gives
#
# $$\frac{e_j / Z}{\sum_{k \le i} e_k / Z} = \frac{e_j}{\sum_{k \le i} e_k},$$
#
# because the full denominator `Z` cancels. That is exactly softmax over the allowed keys only,
# which is what `-inf` produces. The future's scores influenced nothing: they entered `Z` and
# left again.
#
# The `-inf` version is still the one to use: one softmax instead of softmax, multiply, sum and
# divide, and it cannot break when the allowed weights underflow. Here is a row whose future score
# is much larger than its past:

# %%
row = torch.tensor([[0.0, 200.0]])  # one query, two keys; key 1 is in the future
future = torch.tensor([[False, True]])
after = torch.softmax(row, dim=-1) * (~future)  # weight of key 0 underflows to 0 first
print("softmax, zero the future, renormalise:", after / after.sum(dim=-1, keepdim=True))
print("-inf before softmax:                  ", torch.softmax(row.masked_fill(future, -torch.inf), dim=-1))

# %% [markdown]
# The first method computes `0 / 0 = nan`; the second gives the right answer, `[1, 0]`.
#
# Side by side, the weights before and after the causal mask:

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
plotting.plot_attention(attn_weights.detach(), tokens, title="before the mask", ax=axes[0], vmin=0, vmax=1)
plotting.plot_attention(attn_weights_causal.detach(), tokens, title="causal: the future is 0", ax=axes[1], vmin=0, vmax=1)
fig.tight_layout()
plt.show()

# %% [markdown]
# ### Exercise 1: `causal_mask`
#
# Write `causal_mask(num_tokens)` that returns a **boolean** tensor of shape `(T, T)` with
# `T = num_tokens`, True exactly where a position must **not** be attended: entry `[i, j]` is
# True when `j > i`. The diagonal is False (a token always sees itself).
#
# Hint: `torch.triu` with `diagonal=1`, on ones, then `.bool()` (or pass `dtype=torch.bool`).

# %% grade_id="causal_mask"
def causal_mask(num_tokens: int) -> torch.Tensor:
    """Boolean (T, T) mask, True where j > i: the future that position i must not see."""
    ### BEGIN SOLUTION
    return torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool), diagonal=1)
    ### END SOLUTION

# %% grade_id="test_causal_mask" points=2
# Check your `causal_mask` for several sizes: dtype, diagonal, and every entry.
checks.check_causal_mask(causal_mask)
### BEGIN HIDDEN TESTS
checks.check_causal_mask(causal_mask, hidden=True)
### END HIDDEN TESTS

# %%
print(causal_mask(4).int())

# %% [markdown]
# ## 4. The order of the steps
#
# Causal attention weights are computed in this order:
#
# 1. **scores** `Q @ K^T`, shape `(..., T, T)`;
# 2. **scale**: divide by `sqrt(d_k)` (notebook 03: keeps the softmax from saturating);
# 3. **mask** the future with `-inf`;
# 4. **softmax** over the last dimension (the keys);
# 5. **dropout** (next section), only while training.
#
# Steps 2 and 3 can be swapped (`-inf / sqrt(d_k)` is still `-inf`), but the mask must come before
# the softmax, and dropout after it: dropout before softmax would zero scores, and a zero score
# still gets weight `exp(0) = 1`.

# %% [markdown]
# ### Exercise 2: `causal_attention_weights`
#
# Write `causal_attention_weights(queries, keys)`:
# - `queries` and `keys` have shape `(..., T, d_k)`, with any number of batch dimensions in `...`
#   (none, a batch, or a batch and heads);
# - return the causal attention weights, shape `(..., T, T)`: divided by `sqrt(d_k)`, future masked
#   with `-inf`, softmax over the last dimension. No dropout here.
#
# Use `keys.transpose(-2, -1)`, not `keys.T`, so that batch dimensions work (notebook 01).
#
# **Rules** (the check and the grader apply them): `F.scaled_dot_product_attention`, `flex_attention`, `nn.MultiheadAttention` and
# `F.multi_head_attention_forward` are not allowed here.

# %% grade_id="causal_attention_weights"
def causal_attention_weights(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Scaled, causally masked, softmaxed weights: (..., T, d_k), (..., T, d_k) -> (..., T, T)."""
    ### BEGIN SOLUTION
    T, d_k = queries.shape[-2], keys.shape[-1]
    scores = queries @ keys.transpose(-2, -1)  # (..., T, T)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=scores.device), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))  # the (T, T) mask broadcasts over ...
    return torch.softmax(scores / math.sqrt(d_k), dim=-1)
    ### END SOLUTION

# %% grade_id="test_causal_attention_weights" points=3
# Check: the book's weights (the 0.5517 / 0.4483 row), random inputs, and what goes wrong if not.
checks.check_causal_attention_weights(causal_attention_weights)
### BEGIN HIDDEN TESTS
checks.check_causal_attention_weights(causal_attention_weights, hidden=True)
### END HIDDEN TESTS

# %%
print(causal_attention_weights(queries, keys))  # the book's numbers again

# %% [markdown]
# ## 5. Dropout on attention weights
#
# **Dropout** is a regularisation used only during training: each entry is zeroed with
# probability `p`, so the model cannot lean on any single connection. Here it is applied to the
# attention weights: each query randomly loses some of the tokens it attends to.
#
# If half the entries disappear, every output would shrink to about half its size in training and
# jump back at test time. PyTorch uses **inverted dropout**: the surviving entries are multiplied
# by `1 / (1 - p)`, so the **expected** value of every entry stays the same. With `p = 0.5` the
# survivors are doubled. (The book uses 0.5 to make the effect visible; GPT models use 0.1 or 0.2.)

# %%
torch.manual_seed(123)
dropout = nn.Dropout(0.5)  # p = 0.5
example = torch.ones(6, 6)  # (6, 6)
print(dropout(example))

# %% [markdown]
# Zeros and twos, no ones: the kept entries are `1 / (1 - 0.5) = 2`. On a large tensor the mean
# stays close to 1, which is the point of the scaling:

# %%
big = torch.ones(1000, 1000)
print(f"mean after dropout(0.5): {dropout(big).mean().item():.4f}")
print(f"fraction zeroed:         {(dropout(big) == 0).float().mean().item():.4f}")

# %% [markdown]
# Applied to the causal weights, some rows lose most of their weight (row 1 loses everything in
# this draw) and the survivors are doubled. Rows no longer sum to 1 in training; on average they do.

# %%
torch.manual_seed(123)
dropped = dropout(attn_weights_causal)  # (6, 6)
print(dropped)

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
plotting.plot_attention(attn_weights_causal.detach(), tokens, title="causal weights", ax=axes[0], vmin=0, vmax=2)
plotting.plot_attention(dropped.detach(), tokens, title="after dropout(0.5): zeros and doubled values", ax=axes[1],
                        vmin=0, vmax=2)
fig.tight_layout()
plt.show()

# %% [markdown]
# Dropout must switch off when the model is used. `nn.Dropout` follows the module's mode:
# `.train()` (the default) drops, `.eval()` passes the input through unchanged. A model calls
# `.eval()` on all its submodules at once.

# %%
dropout.eval()
print("eval() mode, output equals input:", torch.equal(dropout(attn_weights_causal), attn_weights_causal))
dropout.train()
print("train() mode, output equals input:", torch.equal(dropout(attn_weights_causal), attn_weights_causal))

# %% [markdown]
# ## 6. Batches
#
# Modules receive batches: `(b, T, d_in)`. The book stacks the sentence twice, shape `(2, 6, 3)`.
# Scores become `(b, T, T)` with `queries @ keys.transpose(1, 2)`; the `(T, T)` mask broadcasts
# over the batch dimension, so one mask serves every sentence.

# %%
batch = data.book_batch()  # (2, 6, 3)
print("batch.shape:", batch.shape)
scores_b = batch @ batch.transpose(1, 2)  # (2, 6, 6)
print("masked scores for a batch:", scores_b.masked_fill(causal_mask(6), -torch.inf).shape)

# %% [markdown]
# ## 7. Keeping the mask in the module: `register_buffer`
#
# A `CausalAttention` module builds its mask once, in `__init__`, for the longest input it will
# accept (`context_length`). The mask is not trained, so it is not an `nn.Parameter`. But it must
# still travel with the module: when the model is saved (`state_dict`), converted
# (`.to(torch.float64)`) or moved to a GPU (`.to("cuda")`). `self.register_buffer("mask", tensor)`
# declares exactly that: a tensor that belongs to the module without being trained.
#
# Two tiny modules show the difference. Both hold a float mask (like the book's) and one linear
# layer; one registers the mask, the other stores it as a plain attribute.

# %%
class WithBuffer(nn.Module):
    def __init__(self, context_length: int):
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))


class WithAttribute(nn.Module):
    def __init__(self, context_length: int):
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.mask = torch.triu(torch.ones(context_length, context_length), diagonal=1)  # plain attribute


print("buffer:   ", list(WithBuffer(4).state_dict().keys()))
print("attribute:", list(WithAttribute(4).state_dict().keys()))

# %% [markdown]
# The plain attribute is missing from `state_dict`: a saved model would lose it (harmless for a
# mask you can rebuild, fatal for state you cannot). Next, `.to(...)` converts parameters **and
# buffers**, but knows nothing about other attributes:

# %%
for module in (WithBuffer(4), WithAttribute(4)):
    module.to(torch.float64)
    print(f"{type(module).__name__:13s} weight: {module.linear.weight.dtype},  mask: {module.mask.dtype}")

# %% [markdown]
# The same happens with devices. `get_device()` picks a GPU when there is one. On a GPU, the
# attribute's mask would stay on the CPU and the forward pass would fail with *"Expected all
# tensors to be on the same device"*. Without a GPU we use PyTorch's `"meta"` device as a
# stand-in: tensors there have shapes but no data, and a module can be moved to it like to a GPU.

# %%
device = get_device()
print("this machine:", describe_device(device))
target = device if device.type != "cpu" else torch.device("meta")  # a second device to move to
for module in (WithBuffer(4), WithAttribute(4)):
    module.to(target)
    print(f"{type(module).__name__:13s} weight on {module.linear.weight.device},  mask on {module.mask.device}")

# %% [markdown]
# Rule of thumb: every tensor a module needs in `forward` is either a parameter (trained) or a
# buffer (not trained). Then `.to(device)` is one line for the whole model.

# %% [markdown]
# ## 8. The mask for shorter inputs
#
# The buffer is `(context_length, context_length)`, but an input may have fewer tokens,
# `T = num_tokens < context_length`. The scores are then `(b, T, T)` and the mask must be cut to
# match: `self.mask[:num_tokens, :num_tokens]`. The top-left corner of a causal mask is the causal
# mask of the shorter length:

# %%
big_mask = causal_mask(6)  # the buffer, built for context_length = 6
print(torch.equal(big_mask[:4, :4], causal_mask(4)))

# %% [markdown]
# An input **longer** than `context_length` cannot be handled: the slice stops at the buffer's
# size and the shapes no longer match, so PyTorch raises an error. That is correct: the module was
# built for at most `context_length` tokens.

# %% [markdown]
# ### Exercise 3: `CausalAttention`
#
# Write the class `CausalAttention(d_in, d_out, context_length, dropout, qkv_bias=False)`:
#
# - in `__init__`, create **in this order** `self.W_query`, `self.W_key`, `self.W_value`
#   (`nn.Linear(d_in, d_out, bias=qkv_bias)` each), then `self.dropout = nn.Dropout(dropout)`, then
#   register the boolean `(context_length, context_length)` causal mask as a buffer named `mask`;
# - `forward(x)`: `x` is `(b, T, d_in)` with `T <= context_length`; return the context vectors
#   `(b, T, d_out)`: project, score, scale, mask (cut to `T`), softmax, dropout, multiply by the values.
#
# The order of creation matters: with `torch.manual_seed(123)` your weights will then equal the
# book's, and so will your outputs. You may reuse your `causal_mask` for the buffer.
#
# **Rules** (the check and the grader apply them): `F.scaled_dot_product_attention`, `flex_attention`, `nn.MultiheadAttention` and
# `F.multi_head_attention_forward` are not allowed here.

# %% grade_id="CausalAttention"
class CausalAttention(nn.Module):
    """Single-head causal self-attention with dropout on the weights.

    Input (b, T, d_in) with T <= context_length; output (b, T, d_out).
    """

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, qkv_bias: bool = False):
        super().__init__()
        ### BEGIN SOLUTION
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)  # weight (d_out, d_in)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        mask = torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask)  # (context_length, context_length), True = future
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        b, num_tokens, d_in = x.shape
        queries = self.W_query(x)  # (b, T, d_out)
        keys = self.W_key(x)  # (b, T, d_out)
        values = self.W_value(x)  # (b, T, d_out)
        scores = queries @ keys.transpose(1, 2)  # (b, T, T)
        scores = scores.masked_fill(self.mask[:num_tokens, :num_tokens], -torch.inf)
        weights = torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1)  # (b, T, T)
        weights = self.dropout(weights)  # only active in train() mode
        return weights @ values  # (b, T, d_out)
        ### END SOLUTION

# %% grade_id="test_CausalAttention" points=5
# Check: outputs in eval() and train() mode, the buffer, shorter and longer inputs, no future leaks.
checks.check_CausalAttention(CausalAttention)
### BEGIN HIDDEN TESTS
checks.check_CausalAttention(CausalAttention, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# With the book's seed your class prints the book's context vectors, shape `(2, 6, 2)`:

# %%
torch.manual_seed(123)
ca = CausalAttention(d_in, d_out, context_length=batch.shape[1], dropout=0.0)
context_vecs = ca(batch)  # (2, 6, 2)
print(context_vecs)
print("context_vecs.shape:", context_vecs.shape)

# %% [markdown]
# The mask is part of the module's state, a 4-token input works, and a 7-token input is refused:

# %%
print("state_dict keys:", list(ca.state_dict().keys()))
print("4 tokens ->", tuple(ca(batch[:, :4]).shape))
try:
    ca(torch.rand(2, 7, d_in))
except RuntimeError as err:
    print("7 tokens -> RuntimeError:", str(err).splitlines()[0])

# %% [markdown]
# Finally, dropout inside the module: in `train()` mode two calls differ, in `eval()` mode they
# are identical.

# %%
torch.manual_seed(123)
ca_drop = CausalAttention(d_in, d_out, context_length=6, dropout=0.5)
ca_drop.train()
print("train(): two calls equal?", torch.equal(ca_drop(batch), ca_drop(batch)))
ca_drop.eval()
print("eval():  two calls equal?", torch.equal(ca_drop(batch), ca_drop(batch)))

# %% [markdown]
# ## Check your understanding
#
# Click a question to see the answer.
#
# <details><summary>1. In a causal mask built with <code>triu(..., diagonal=1)</code>, what does True at <code>[2, 4]</code> mean?</summary>
#
# Query 2 ("starts") may not attend to key 4 ("one"), because token 4 comes later. True marks what
# is hidden. With `diagonal=0` the diagonal would be hidden too, and token 0 would have nothing
# left to attend to: its softmax row would be all `-inf`, which gives `nan`.
# </details>
#
# <details><summary>2. Why does masking after softmax need a renormalisation, and masking with <code>-inf</code> before softmax does not?</summary>
#
# Zeroing entries after softmax removes part of each row's mass, so the rows sum to less than 1.
# With `-inf` the softmax itself only distributes mass over the allowed keys: `exp(-inf) = 0`
# adds nothing to the denominator. Both give the same weights (the full denominator cancels),
# but the `-inf` version is shorter and cannot produce `0 / 0`.
# </details>
#
# <details><summary>3. Why would <code>masked_fill(mask, 0)</code> not hide the future?</summary>
#
# A score of 0 is an ordinary score: `exp(0) = 1`, so the future token still gets a weight (often a
# large one, since real scores can be negative). Only `-inf` (or a very large negative number like
# `-1e9`) becomes weight 0.
# </details>
#
# <details><summary>4. With dropout p = 0.2, what happens to a weight of 0.5 that survives, and why?</summary>
#
# It becomes `0.5 / (1 - 0.2) = 0.625`. Each entry survives with probability 0.8, so its expected
# value is `0.8 · 0.625 = 0.5`: the scaling keeps the expected output equal in training and
# evaluation, where dropout does nothing.
# </details>
#
# <details><summary>5. You store the mask as <code>self.mask = torch.triu(...)</code> and call <code>model.to("cuda")</code>. What happens?</summary>
#
# The parameters move to the GPU, the mask stays on the CPU, and `masked_fill` fails because its
# tensors live on different devices. The mask is also missing from `state_dict`. With
# `register_buffer` it moves and is saved with the module.
# </details>
#
# <details><summary>6. Your module has context_length = 1024 and gets 10 tokens. Which part of the mask does it use?</summary>
#
# The top-left `(10, 10)` corner, `self.mask[:10, :10]`, which is exactly the causal mask for 10
# tokens. Scores are `(b, 10, 10)`, so the shapes match.
# </details>
#
# <details><summary>7. Predict the output: <code>torch.softmax(torch.tensor([[1., 2., 3.]]).masked_fill(causal_mask(3)[1:2], -torch.inf), dim=-1)</code>. (Row 1 of the mask is <code>[False, False, True]</code>.)</summary>
#
# `tensor([[0.2689, 0.7311, 0.0000]])`: the third score becomes `-inf` and gets weight exactly 0,
# and the first two share the weight as `softmax([1, 2])` would: `e / (e + e²)` and `e² / (e + e²)`.
# </details>
#
# <details><summary>8. Find the bug: <code>weights = self.dropout(scores); weights = torch.softmax(weights.masked_fill(mask, -torch.inf), dim=-1)</code>. What is wrong, and would the check notice?</summary>
#
# Dropout runs on the scores, before the softmax. A score zeroed by dropout still gets weight
# `exp(0) / Σ`, so nothing is actually dropped, and the survivors, doubled, make the softmax
# sharper. The rows still sum to 1 and the output looks plausible; only a comparison in `train()`
# mode with the same random seed (as the check does) shows the difference. Dropout goes after
# the softmax.
# </details>

# %% [markdown]
# ## Recap
#
# - Causal attention: position `i` attends only to positions `0..i`. Weights above the diagonal are 0.
# - Mask with `-inf` before softmax: `scores.masked_fill(mask, -inf)` with a boolean mask that is True
#   above the diagonal, `triu(ones(T, T), diagonal=1)`. It equals zeroing after softmax and
#   renormalising, but is simpler and numerically safe.
# - Order: scores, divide by `sqrt(d_k)`, mask, softmax, dropout, times values.
# - Dropout zeroes weights with probability `p` and scales survivors by `1/(1-p)`; only in `train()` mode.
# - Tensors a module needs but does not train are **buffers** (`register_buffer`): saved in
#   `state_dict`, moved by `.to(...)`. Cut the mask to the input: `mask[:T, :T]`.
# - `CausalAttention`: `(b, T, d_in) -> (b, T, d_out)`.
#
# One causal head looks at the sentence in one way. In notebook 05 we run several heads side by side
# (**multi-head attention**), first as a list of `CausalAttention` modules, then as one efficient module.
