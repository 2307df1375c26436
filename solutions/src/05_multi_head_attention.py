# %% [markdown]
# # 05 · Multi-head attention: several views of one sentence
#
# One causal attention head (notebook 04) learns **one** way of relating tokens: one set of
# queries, keys and values, one `(T, T)` weight pattern. Language has many relations at once
# (which noun a verb belongs to, what the previous word was, where a quote started), so a
# transformer runs several heads side by side and combines their outputs: **multi-head attention**.
#
# **In this notebook you will**
# 1. stack causal heads and concatenate their outputs: `MultiHeadAttentionWrapper` (and the book's
#    exercise 3.2);
# 2. compute all heads with one big projection and cut it into heads with `view` and `transpose`:
#    `split_heads`, and put them back together with `contiguous`: `merge_heads`;
# 3. multiply 4-D tensors, one matrix product per batch entry **and** head;
# 4. write the efficient module with an output projection: `MultiHeadAttention`, and show it computes
#    the same as the wrapper when the weights are tied;
# 5. count parameters: `count_parameters`, and the size of GPT-2's attention (exercise 3.3).
#
# Shapes use these letters: `b` = batch size, `T` = number of tokens, `d_in` = embedding size,
# `H` = number of heads (`num_heads`), `D` = size of one head (`head_dim`), `d_out` = output size.
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

torch.manual_seed(123)
print("torch", torch.__version__)

# %% [markdown]
# ## 0. Where notebook 04 left us
#
# `CausalAttention(d_in, d_out, context_length, dropout)` takes a batch `(b, T, d_in)` and returns
# context vectors `(b, T, d_out)`. Inside: queries, keys and values `(b, T, d_out)`, scores
# `(b, T, T)` divided by `sqrt(d_out)`, the future masked with `-inf` using a buffer cut to `[:T, :T]`,
# softmax, dropout, and the weighted sum of the values.
#
# Here is that class, with the `causal_mask` it builds its buffer with: our answer from notebook 04,
# shown so that this notebook never depends on your own earlier answer. Run the cell.

# %% shows="causal_mask CausalAttention"
# Our answer from notebook 04.
import math

import torch
import torch.nn as nn

from course_utils.validation import check_input_3d

# %% [markdown]
# With seed 123 on the book's batch:

# %%
batch = data.book_batch()  # (2, 6, 3): the sentence twice
tokens = data.TOKENS
b, context_length, d_in = batch.shape

torch.manual_seed(123)
ca = CausalAttention(d_in, 2, context_length, 0.0)
print(ca(batch)[0])  # (6, 2): the first sentence's context vectors

# %% [markdown]
# ## 1. Several heads, side by side
#
# The simplest multi-head attention builds `num_heads` independent `CausalAttention` modules, runs
# each on the same input, and concatenates their outputs along the **last** dimension:
#
# - head `h` returns `(b, T, d_out)`;
# - `torch.cat([...], dim=-1)` glues them into `(b, T, num_heads * d_out)`.
#
# Each token's output is then its context vector from head 0, followed by the one from head 1, and so
# on. Because the heads have their own weights, each can attend in its own way.
#
# `nn.ModuleList` holds the heads: a plain Python list would hide them from `.parameters()`,
# `.to(...)` and `state_dict`, just as a plain attribute hid the mask in notebook 04.

# %% [markdown]
# ### Exercise 1: `MultiHeadAttentionWrapper`
#
# Write `MultiHeadAttentionWrapper(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)`:
# - `__init__`: `self.heads`, an `nn.ModuleList` of `num_heads` **new** `CausalAttention(d_in, d_out,
#   context_length, dropout, qkv_bias)` modules, created one after the other;
# - `forward(x)`: `x` is `(b, T, d_in)`; return `(b, T, num_heads * d_out)`.
#
# Here `d_out` is the output size of **one** head.
#
# **Rules** (the check and the grader apply them): `F.scaled_dot_product_attention`, `flex_attention`, `nn.MultiheadAttention` and
# `F.multi_head_attention_forward` are not allowed here.

# %% grade_id="MultiHeadAttentionWrapper"
class MultiHeadAttentionWrapper(nn.Module):
    """num_heads independent causal heads; (b, T, d_in) -> (b, T, num_heads * d_out)."""

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False):
        super().__init__()
        ### BEGIN SOLUTION
        self.heads = nn.ModuleList(
            [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]
        )
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        return torch.cat([head(x) for head in self.heads], dim=-1)  # H x (b, T, d_out) -> (b, T, H * d_out)
        ### END SOLUTION

# %% grade_id="test_MultiHeadAttentionWrapper" points=3
# Check: the book's numbers, exercise 3.2, dropout in train() mode, distinct heads, the concat dim.
checks.check_MultiHeadAttentionWrapper(MultiHeadAttentionWrapper)
### BEGIN HIDDEN TESTS
checks.check_MultiHeadAttentionWrapper(MultiHeadAttentionWrapper, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# With the book's seed, two heads of size 2 give 4 columns. The first two columns are exactly the
# single head from section 0 (the first head is built first, from the same random numbers).

# %%
torch.manual_seed(123)
mha_wrapper = MultiHeadAttentionWrapper(d_in, 2, context_length, 0.0, num_heads=2)
context_vecs = mha_wrapper(batch)  # (2, 6, 4)
print(context_vecs)
print("context_vecs.shape:", context_vecs.shape)

# %% [markdown]
# ### The book's exercise 3.2: a two-dimensional output with two heads
#
# The wrapper's output size is `num_heads * d_out`. To get 2 columns with 2 heads, each head must
# have `d_out = 1`: one number per token per head.

# %%
torch.manual_seed(123)
mha_2d = MultiHeadAttentionWrapper(d_in, 1, context_length, 0.0, num_heads=2)
print(mha_2d(batch))
print("shape:", mha_2d(batch).shape)  # (2, 6, 2)

# %% [markdown]
# ## 2. One big projection instead of many small ones
#
# The wrapper runs its heads one after another: `3 * H` small matrix products for the projections
# and `H` separate attention computations. A GPU is much faster at a few big products than at many
# small ones.
#
# The trick: put the query weights of all heads into **one** `nn.Linear(d_in, H * D)`. Its output
# `(b, T, H * D)` holds every head's queries side by side: columns `0..D-1` are head 0's, columns
# `D..2D-1` head 1's, and so on. Check it with the wrapper's two heads:

# %%
big_query = nn.Linear(d_in, 4, bias=False)  # two heads of D = 2
with torch.no_grad():
    big_query.weight.copy_(torch.cat([head.W_query.weight for head in mha_wrapper.heads], dim=0))  # (4, 3)
q_all = big_query(batch)  # (2, 6, 4)
print("head 0's queries are columns 0:2 ->", torch.allclose(q_all[..., 0:2], mha_wrapper.heads[0].W_query(batch)))
print("head 1's queries are columns 2:4 ->", torch.allclose(q_all[..., 2:4], mha_wrapper.heads[1].W_query(batch)))

# %% [markdown]
# (`nn.Linear` stores its weight as `(out_features, in_features)`, so stacking the heads' weights
# along dim 0 stacks their output columns.)
#
# To compute attention per head we now need the queries as `(b, H, T, D)`: one `(T, D)` matrix per
# batch entry and head.

# %% [markdown]
# ## 3. Splitting heads: `view`, then `transpose`
#
# Two steps, shown on a tensor of consecutive numbers so that you can follow every entry. One
# sentence (`b = 1`) of `T = 3` tokens with `d_out = 4`, split into `H = 2` heads of `D = 2`:

# %%
x = torch.arange(12.0).view(1, 3, 4)  # (b, T, d_out) = (1, 3, 4); token t holds 4t .. 4t+3
print(x)

# %% [markdown]
# **Step 1, `view(b, T, H, D)`**: cut the last dimension of each token into `H` pieces of `D`.
# Nothing moves in memory; each token's row `[0, 1, 2, 3]` is read as `[[0, 1], [2, 3]]`:
# head 0 gets `[0, 1]`, head 1 gets `[2, 3]`.

# %%
x_view = x.view(1, 3, 2, 2)  # (b, T, H, D)
print(x_view)

# %% [markdown]
# **Step 2, `transpose(1, 2)`**: swap the token and head dimensions, `(b, T, H, D) -> (b, H, T, D)`.
# Now `[0, h]` is head `h`'s `(T, D)` matrix: head 0 holds columns 0-1 of every token, head 1
# columns 2-3.

# %%
x_heads = x_view.transpose(1, 2)  # (b, H, T, D) = (1, 2, 3, 2)
print(x_heads)

# %% [markdown]
# Why not directly `x.view(b, H, T, D)`? It has the right shape, but `view` only re-reads the flat
# memory `0, 1, ..., 11` in order: "head 0" would get `0..5`, which is token 0's four numbers plus
# half of token 1. Tokens and heads are mixed up.

# %%
print(x.view(1, 2, 3, 2))  # right shape, wrong content: head 0 holds tokens 0 and 1 mixed

# %% [markdown]
# ### Exercise 2: `split_heads`
#
# Write `split_heads(x, num_heads)`: `x` is `(b, T, d)` with `d` divisible by `num_heads`; return
# `(b, num_heads, T, d // num_heads)`, head `h` holding columns `h*D:(h+1)*D` of every token.

# %% grade_id="split_heads"
def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(b, T, d) -> (b, num_heads, T, d // num_heads)."""
    ### BEGIN SOLUTION
    b, T, d = x.shape
    return x.view(b, T, num_heads, d // num_heads).transpose(1, 2)
    ### END SOLUTION

# %% grade_id="test_split_heads" points=2
checks.check_split_heads(split_heads)
### BEGIN HIDDEN TESTS
checks.check_split_heads(split_heads, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Matrix products on 4-D tensors
#
# `@` multiplies the **last two** dimensions and treats all others as batch dimensions. With
# queries and keys of shape `(b, H, T, D)`, `queries @ keys.transpose(2, 3)` is
# `(b, H, T, D) @ (b, H, D, T) -> (b, H, T, T)`: every batch entry and every head gets its own
# `(T, T)` score matrix, in one call.
#
# The book's example tensor `a` has `b = 1`, `H = 2`, `T = 3`, `D = 4`:

# %%
a = torch.tensor([[[[0.2745, 0.6584, 0.2775, 0.8573],
                    [0.8993, 0.0390, 0.9268, 0.7388],
                    [0.7179, 0.7058, 0.9156, 0.4340]],

                   [[0.0772, 0.3565, 0.1479, 0.5331],
                    [0.4066, 0.2318, 0.4545, 0.9737],
                    [0.4606, 0.5159, 0.4220, 0.5786]]]])  # (1, 2, 3, 4)
print(a @ a.transpose(2, 3))  # (1, 2, 3, 3)

# %% [markdown]
# The same numbers, one head at a time with ordinary 2-D products:

# %%
first_head = a[0, 0, :, :]  # (3, 4)
print("first head:\n", first_head @ first_head.T)
second_head = a[0, 1, :, :]
print("second head:\n", second_head @ second_head.T)

# %% [markdown]
# ## 5. Merging heads: `transpose`, then `contiguous().view`
#
# After attention each head has context vectors `(b, H, T, D)`. To undo the split we swap back to
# `(b, T, H, D)` and glue the heads of each token together: `(b, T, H * D)`. The obvious code fails:

# %%
context = x_heads.contiguous()  # like weights @ values: a new (b, H, T, D) tensor, stored row by row
back = context.transpose(1, 2)  # (b, T, H, D) = (1, 3, 2, 2)
try:
    back.view(1, 3, 4)
except RuntimeError as err:
    print("RuntimeError:", err)

# %% [markdown]
# `transpose` does not move any numbers; it only changes the **strides**, the steps in memory that
# lead from one index to the next. The result is no longer laid out row by row
# (`is_contiguous()` is False), and `view`, which never copies, cannot express the new shape.
# `.contiguous()` copies the data into row order first; `.reshape` does the same, copying only when
# it has to.

# %%
print("strides of context:", context.stride(), " contiguous:", context.is_contiguous())
print("strides of back:   ", back.stride(), " contiguous:", back.is_contiguous())
print(back.contiguous().view(1, 3, 4))
print("reshape gives the same:", torch.equal(back.reshape(1, 3, 4), back.contiguous().view(1, 3, 4)))
print("and it is x again:     ", torch.equal(back.reshape(1, 3, 4), x))

# %% [markdown]
# ### Exercise 3: `merge_heads`
#
# Write `merge_heads(x)`: `x` is `(b, H, T, D)`; return `(b, T, H * D)`, the inverse of
# `split_heads`, so that `merge_heads(split_heads(x, H))` gives `x` back. Expect a non-contiguous
# input (the output of a `transpose`).

# %% grade_id="merge_heads"
def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(b, H, T, D) -> (b, T, H * D), the inverse of split_heads."""
    ### BEGIN SOLUTION
    b, H, T, D = x.shape
    return x.transpose(1, 2).contiguous().view(b, T, H * D)
    ### END SOLUTION

# %% grade_id="test_merge_heads" points=2
checks.check_merge_heads(merge_heads)
### BEGIN HIDDEN TESTS
checks.check_merge_heads(merge_heads, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. The output projection, `out_proj`
#
# After merging, each token's vector is its heads' outputs side by side: the first `D` numbers come
# only from head 0, the next `D` only from head 1. `MultiHeadAttention` adds one more
# `nn.Linear(d_out, d_out)`, called `out_proj`, that mixes them: every output number can combine
# what all heads found. It is not strictly needed (the wrapper has none), but GPT-2 and most
# transformers use it, and it costs `d_out * d_out + d_out` parameters.

# %% [markdown]
# ### Exercise 4: `MultiHeadAttention`
#
# Write `MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)`:
#
# - `d_out` is now the **total** output size; each head has `head_dim = d_out // num_heads`
#   (raise an error, e.g. with `assert`, if it does not divide);
# - create **in this order**: `self.W_query`, `self.W_key`, `self.W_value` (`nn.Linear(d_in, d_out,
#   bias=qkv_bias)`), `self.out_proj = nn.Linear(d_out, d_out)`, `self.dropout = nn.Dropout(dropout)`,
#   and the `(context_length, context_length)` causal mask as a buffer named `mask`;
# - `forward(x)`: `(b, T, d_in)` -> `(b, T, d_out)`: project; split into heads `(b, H, T, D)`;
#   scores `(b, H, T, T)`; divide by `sqrt(head_dim)`; mask (cut to `T`); softmax; dropout; times the
#   values; merge the heads to `(b, T, d_out)`; `out_proj`.
#
# You may call your `split_heads` and `merge_heads`, or write the `view`/`transpose` steps inline.
#
# **Rules** (the check and the grader apply them): `F.scaled_dot_product_attention`, `flex_attention`, `nn.MultiheadAttention` and
# `F.multi_head_attention_forward` are not allowed here.

# %% grade_id="MultiHeadAttention"
class MultiHeadAttention(nn.Module):
    """Causal multi-head attention with split weights; (b, T, d_in) -> (b, T, d_out)."""

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False):
        super().__init__()
        ### BEGIN SOLUTION
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads  # D
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)  # all heads at once: (d_in -> H * D)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)  # mixes the heads
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), diagonal=1))
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        b, num_tokens, _ = x.shape
        H, D = self.num_heads, self.head_dim
        queries = self.W_query(x).view(b, num_tokens, H, D).transpose(1, 2)  # (b, H, T, D)
        keys = self.W_key(x).view(b, num_tokens, H, D).transpose(1, 2)
        values = self.W_value(x).view(b, num_tokens, H, D).transpose(1, 2)
        scores = queries @ keys.transpose(2, 3)  # (b, H, T, T)
        scores = scores.masked_fill(self.mask[:num_tokens, :num_tokens], -torch.inf)
        weights = torch.softmax(scores / D ** 0.5, dim=-1)
        weights = self.dropout(weights)
        context = (weights @ values).transpose(1, 2)  # (b, T, H, D)
        context = context.contiguous().view(b, num_tokens, self.d_out)  # (b, T, d_out)
        return self.out_proj(context)
        ### END SOLUTION

# %% grade_id="test_MultiHeadAttention" points=5
# Check: outputs in eval() and train() mode, the buffer, shorter and longer inputs, no future leaks.
checks.check_MultiHeadAttention(MultiHeadAttention)
### BEGIN HIDDEN TESTS
checks.check_MultiHeadAttention(MultiHeadAttention, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# With the book's seed and `d_out = 2`, two heads of size 1:

# %%
torch.manual_seed(123)
mha = MultiHeadAttention(d_in, 2, context_length, 0.0, num_heads=2)
context_vecs = mha(batch)  # (2, 6, 2)
print(context_vecs)
print("context_vecs.shape:", context_vecs.shape)

# %% [markdown]
# ### `d_out` means two different things
#
# The same arguments give different sizes in the two classes:
#
# | | `d_out` is | output of `(…, d_out=2, …, num_heads=2)` | size of one head |
# |---|---|---|---|
# | `MultiHeadAttentionWrapper` | the size of **one head** | `(b, T, 4)` | 2 |
# | `MultiHeadAttention` | the **total** size | `(b, T, 2)` | 1 |
#
# To build "the same" model both ways, give the wrapper `d_out // num_heads`.

# %%
print("wrapper(d_out=2, num_heads=2):", tuple(mha_wrapper(batch).shape))
print("MultiHeadAttention(d_out=2, num_heads=2):", tuple(mha(batch).shape), " head_dim =", mha.head_dim)

# %% [markdown]
# ## 7. Same computation, fewer calls: tying the weights
#
# Is `MultiHeadAttention` really the wrapper in disguise? Build a wrapper with two heads of size 2 and
# a `MultiHeadAttention` with `d_out = 4`, two heads. Copy head `h`'s weights into rows
# `h*2:(h+1)*2` of the big matrices (`nn.Linear` weights are `(out, in)`, so a head's output columns
# are rows of the weight), and make `out_proj` the identity so that it changes nothing.

# %%
torch.manual_seed(123)
wrapper = MultiHeadAttentionWrapper(d_in, 2, context_length, 0.0, num_heads=2)  # heads of D = 2
split = MultiHeadAttention(d_in, 4, context_length, 0.0, num_heads=2)  # d_out = 4 = 2 heads x 2

with torch.no_grad():
    for h, head in enumerate(wrapper.heads):
        rows = slice(h * 2, (h + 1) * 2)
        split.W_query.weight[rows] = head.W_query.weight  # (2, 3) into rows of a (4, 3) matrix
        split.W_key.weight[rows] = head.W_key.weight
        split.W_value.weight[rows] = head.W_value.weight
    split.out_proj.weight.copy_(torch.eye(4))  # (4, 4) identity
    split.out_proj.bias.zero_()

print("same outputs:", torch.allclose(wrapper(batch), split(batch), atol=1e-6))

# %% [markdown]
# Identical. `MultiHeadAttention` does the wrapper's work with 3 projections instead of `3 * H`, one
# batched score product instead of `H`, plus `out_proj`. In a trained model `out_proj` is not the
# identity, so the two are different models with the same attention core.

# %% [markdown]
# ## 8. What do the heads look at?
#
# `MultiHeadAttention` returns context vectors, not weights. To see the weights we repeat its first
# steps with its own projections: split the queries and keys into heads, score, scale, mask,
# softmax. The result is `(b, H, T, T)`: one heatmap per head. We use a module with 4 heads of size 4
# so that the patterns have room to differ (untrained weights, so the patterns are random, but
# already different per head).

# %%
def head_weights(module: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """Causal attention weights of every head, (b, T, d_in) -> (b, H, T, T), computed like forward."""
    T = x.shape[1]
    with torch.no_grad():
        q = split_heads(module.W_query(x), module.num_heads)  # (b, H, T, D)
        k = split_heads(module.W_key(x), module.num_heads)
        scores = (q @ k.transpose(2, 3)).masked_fill(module.mask[:T, :T], -torch.inf)  # (b, H, T, T)
        return torch.softmax(scores / module.head_dim ** 0.5, dim=-1)


torch.manual_seed(123)
mha4 = MultiHeadAttention(d_in, 16, context_length, 0.0, num_heads=4)
w = head_weights(mha4, batch * 4)  # inputs scaled up a little so the differences are visible
print("weights:", tuple(w.shape))
plotting.plot_attention_grid(w[0], tokens, suptitle="one causal heatmap per head (untrained weights)")
plt.show()

# %% [markdown]
# ## 9. Counting parameters
#
# A parameter is a trained number. `module.parameters()` yields every `nn.Parameter` of a module and
# its submodules (each shared tensor once); `p.numel()` is the number of entries of one of them.
# Frozen parameters (`requires_grad=False`) are not trained, and buffers like the mask are not
# parameters at all.

# %% [markdown]
# ### Exercise 5: `count_parameters`
#
# Write `count_parameters(module)` that returns, as a Python `int`, the number of **trainable**
# parameters: the sum of `numel()` over the parameters with `requires_grad=True`.

# %% grade_id="count_parameters"
def count_parameters(module: nn.Module) -> int:
    """Number of trainable parameters (requires_grad=True) of module."""
    ### BEGIN SOLUTION
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
    ### END SOLUTION

# %% grade_id="test_count_parameters" points=2
checks.check_count_parameters(count_parameters)
### BEGIN HIDDEN TESTS
checks.check_count_parameters(count_parameters, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### The book's exercise 3.3: GPT-2 sized attention
#
# The smallest GPT-2 has 768-dimensional embeddings, 12 heads (of 64) and a context of 1024 tokens.
# The book's exercise builds it with the default `qkv_bias=False`:

# %%
gpt2_attention = MultiHeadAttention(d_in=768, d_out=768, context_length=1024, dropout=0.0, num_heads=12)
print(f"{count_parameters(gpt2_attention):,} trainable parameters")

# %% [markdown]
# Where they come from: three projections `768 × 768` without bias, plus `out_proj` with its bias.
# The mask is a buffer: a million entries, but not trained and not counted.
#
# The real GPT-2 **does** have biases on its query, key and value projections (its `c_attn`
# layer), `3 × 768` more numbers. With `qkv_bias=True`, as when loading GPT-2's weights, the count
# is 2,362,368:

# %%
projections = 3 * 768 * 768
qkv_biases = 3 * 768
out_proj = 768 * 768 + 768
mask_entries = gpt2_attention.mask.numel()
print(f"W_query + W_key + W_value: {projections:>9,}")
print(f"out_proj:                  {out_proj:>9,}")
print(f"total, qkv_bias=False:     {projections + out_proj:>9,}")
print(f"their biases (GPT-2):      {qkv_biases:>9,}")
print(f"total, qkv_bias=True:      {projections + qkv_biases + out_proj:>9,}")
print(f"mask buffer (not counted): {mask_entries:>9,}")
gpt2_with_bias = MultiHeadAttention(768, 768, 1024, 0.0, num_heads=12, qkv_bias=True)
print(f"count_parameters with qkv_bias=True: {count_parameters(gpt2_with_bias):,}")

# %% [markdown]
# The wrapper with the same total output size needs heads of `768 // 12 = 64`: the same projection
# parameters, but no `out_proj`. Giving it `d_out=768` (the confusion of section 6) would build
# twelve 768-wide heads, twelve times the projections:

# %%
print(f"wrapper, 12 heads of 64:  {count_parameters(MultiHeadAttentionWrapper(768, 64, 1024, 0.0, 12)):>11,}")
print(f"wrapper, 12 heads of 768: {count_parameters(MultiHeadAttentionWrapper(768, 768, 1024, 0.0, 12)):>11,}")

# %% [markdown]
# ## Check your understanding
#
# Click a question to see the answer.
#
# <details><summary>1. <code>MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=3)</code> on a <code>(4, 5, 3)</code> input: output shape?</summary>
#
# `(4, 5, 6)`: three heads of size 2, concatenated on the last dimension. Each head alone returns
# `(4, 5, 2)`.
# </details>
#
# <details><summary>2. Why <code>nn.ModuleList([CausalAttention(...) for _ in range(n)])</code> and not <code>nn.ModuleList([head] * n)</code>?</summary>
#
# `[head] * n` is a list holding the **same** module `n` times: all "heads" share one set of weights
# and compute the same thing, so the output is one head repeated. The comprehension builds `n`
# different modules with their own weights.
# </details>
#
# <details><summary>3. Queries are <code>(b, T, d_out)</code>. Why <code>view(b, T, H, D).transpose(1, 2)</code> and not <code>view(b, H, T, D)</code>?</summary>
#
# `view` reads memory in order. Each token's `d_out` numbers are stored together, so they must be
# split in the last dimension (`T, H, D`). `view(b, H, T, D)` has the right shape but fills "head 0"
# with the first `T * D` numbers, which belong to the first few tokens, not to head 0.
# </details>
#
# <details><summary>4. When does <code>view</code> raise an error that <code>reshape</code> does not?</summary>
#
# When the tensor is not contiguous (for example right after `transpose`) and the new shape cannot be
# described by strides over the existing memory. `view` never copies, so it refuses; `reshape` copies
# when it must. `.contiguous().view(...)` makes the copy explicit.
# </details>
#
# <details><summary>5. <code>MultiHeadAttention(d_in=768, d_out=768, ..., num_heads=12)</code>: what is <code>head_dim</code>, and what scale divides the scores?</summary>
#
# `head_dim = 768 // 12 = 64`, and each head's scores are divided by `sqrt(64) = 8`: the dot products
# inside a head have 64 terms, not 768.
# </details>
#
# <details><summary>6. Why doesn't <code>count_parameters</code> count the mask, and what would <code>sum(t.numel() for t in model.state_dict().values())</code> give for GPT-2's attention?</summary>
#
# The mask is a buffer: saved with the model but never trained. `state_dict` includes buffers, so that
# sum gives `2,360,064 + 1,048,576 = 3,408,640` (for the book's `qkv_bias=False` version), which
# overstates the model by a million numbers.
# </details>
#
# <details><summary>7. Predict the output: <code>x = torch.arange(12.).view(1, 2, 6)</code> holds 2 tokens of <code>d_out = 6</code>. What is <code>split_heads(x, 3)[0, 1]</code>, head 1?</summary>
#
# `tensor([[2., 3.], [8., 9.]])`, shape `(T, D) = (2, 2)`. Token 0 holds `0..5`, token 1 `6..11`;
# with 3 heads of size 2, head 1 owns numbers 2-3 of every token: `[2, 3]` from token 0 and
# `[8, 9]` from token 1.
# </details>
#
# <details><summary>8. Find the bug: in <code>forward</code>, <code>scores = queries @ keys.transpose(2, 3) / self.head_dim</code>. Everything runs. What is wrong, and what would you see?</summary>
#
# The scores are divided by `head_dim`, not by `sqrt(head_dim)`: too small by a factor
# `sqrt(head_dim)` (8 for GPT-2's heads of 64). The softmax becomes flatter, closer to uniform,
# and the outputs differ from the reference by a smooth amount rather than a crash. Divide by
# `self.head_dim ** 0.5`.
# </details>

# %% [markdown]
# ## Recap
#
# - Multi-head attention runs `H` causal heads side by side; their outputs are concatenated on the last
#   dimension. The wrapper does it with a list of `CausalAttention` modules: `d_out` per head.
# - `MultiHeadAttention` computes all heads with one projection per Q, K, V (`d_out` total,
#   `head_dim = d_out // H`), splits with `view(b, T, H, D).transpose(1, 2)`, scores with one 4-D
#   product `(b, H, T, D) @ (b, H, D, T) -> (b, H, T, T)`, merges with
#   `transpose(1, 2).contiguous().view(b, T, d_out)` (or `reshape`) and mixes heads with `out_proj`.
# - With tied weights and an identity `out_proj` both give the same outputs.
# - Count trainable parameters with `sum(p.numel() for p in m.parameters() if p.requires_grad)`;
#   GPT-2 small's attention has 2,360,064 with the book's `qkv_bias=False`, and 2,362,368 with the
#   query, key and value biases that the real GPT-2 has.
#
# Notebook 06 takes this module to a GPU: one combined QKV projection, `einsum`, and PyTorch's fused
# `scaled_dot_product_attention`, with careful timing.
