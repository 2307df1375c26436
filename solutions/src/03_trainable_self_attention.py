# %% [markdown]
# # 03 · Trainable self-attention: queries, keys and values of their own
#
# In notebook 02 every token used its own embedding in all three roles: as the query that asks,
# as the key that is compared, and as the value that is mixed in. Nothing in that computation
# can learn. Real attention gives each role its own **trainable weight matrix**, `W_q`, `W_k` and
# `W_v`, and divides the scores by `sqrt(d_k)` before the softmax.
#
# **In this notebook you will**
# 1. project one token to a query, key and value by hand and follow it to a context vector;
# 2. find out with an experiment **why** the scores are divided by `sqrt(d_k)`;
# 3. write the general formula `softmax(Q Kᵀ / sqrt(d_k)) V`: `scaled_dot_product_attention`;
# 4. pack it into a module with `nn.Parameter`: `SelfAttention_v1`;
# 5. see why `nn.Linear` is the better building block: `SelfAttention_v2`;
# 6. solve the book's exercise 3.1 and learn how `nn.Linear` stores its weight: `copy_v2_weights_to_v1`.
#
# Shapes: `T` tokens (`Tq` queries, `Tk` keys), `d_in` = embedding size, `d_out` = size of a
# projection, `d_k` = size of a query/key vector, `d_v` = size of a value vector, `b` = batch.

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
# ## 1. Three projections
#
# A projection is a matrix product: a token `x` of shape `(d_in,)` times a matrix `W` of shape
# `(d_in, d_out)` gives a vector of shape `(d_out,)`. We use three matrices:
#
# - `W_query`: turns a token into its **query** `q = x W_q` ("what am I looking for?");
# - `W_key`: turns a token into its **key** `k = x W_k` ("what do I offer to be found by?");
# - `W_value`: turns a token into its **value** `v = x W_v` ("what do I hand over?").
#
# In the library picture of notebook 02: request, title and contents are now three different
# things computed from the same token. Training adjusts the three matrices.
#
# As in the book, the embeddings have `d_in = 3` and we project to `d_out = 2` (GPT models use
# the same size for both; different sizes make the shapes easier to follow).

# %%
inputs = data.book_inputs()  # (6, 3)
tokens = data.TOKENS
x_2 = inputs[1]  # (3,): "journey"
d_in = inputs.shape[1]  # 3
d_out = 2
print("x_2 =", x_2, " d_in =", d_in, " d_out =", d_out)

# %% [markdown]
# The book fills the matrices with uniform random numbers from `[0, 1)`. `nn.Parameter` marks a
# tensor as a trainable weight; `requires_grad=False` only keeps the printouts short here.
# With `torch.manual_seed(123)` you get the book's numbers.

# %%
torch.manual_seed(123)
W_query = nn.Parameter(torch.rand(d_in, d_out), requires_grad=False)  # (3, 2)
W_key = nn.Parameter(torch.rand(d_in, d_out), requires_grad=False)  # (3, 2)
W_value = nn.Parameter(torch.rand(d_in, d_out), requires_grad=False)  # (3, 2)
print(W_query)

# %% [markdown]
# ## 2. One query, step by step
#
# The query of "journey": `(3,) @ (3, 2) -> (2,)`.

# %%
query_2 = x_2 @ W_query  # (3,) @ (3, 2) -> (2,)
print("query_2 =", query_2, " shape:", query_2.shape)

# %% [markdown]
# Every token needs a key and a value: the whole `(6, 3)` sentence times each matrix gives
# `(6, 2)`: row `i` is token `i`'s key (or value).

# %%
keys = inputs @ W_key  # (6, 3) @ (3, 2) -> (6, 2)
values = inputs @ W_value  # (6, 2)
print("keys.shape:  ", keys.shape)
print("values.shape:", values.shape)

# %% [markdown]
# The score of query 2 against key 2 is their dot product, as in notebook 01, but now between a
# query and a key rather than between two embeddings:

# %%
attn_score_22 = query_2 @ keys[1]  # (2,) @ (2,) -> ()
print(attn_score_22)

# %% [markdown]
# Against all six keys at once: `(2,) @ (2, 6) -> (6,)`.

# %%
attn_scores_2 = query_2 @ keys.T  # (6,)
print(attn_scores_2)

# %% [markdown]
# Now the new step. Before the softmax the scores are divided by `sqrt(d_k)`, the square root of
# the size of the keys (here `d_k = 2`). Section 3 shows why.

# %%
d_k = keys.shape[-1]  # 2
attn_weights_2 = torch.softmax(attn_scores_2 / math.sqrt(d_k), dim=-1)  # (6,)
print(attn_weights_2)

# %% [markdown]
# The context vector mixes the **values** (no longer the inputs): `(6,) @ (6, 2) -> (2,)`.

# %%
context_vec_2 = attn_weights_2 @ values  # (2,)
print(context_vec_2)

# %% [markdown]
# These are the book's numbers: `query_2 = [0.4306, 1.4551]`, score `1.8524`, weights
# `[0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820]`, context vector `[0.3061, 0.8210]`.

# %% [markdown]
# ## 3. Why divide by `sqrt(d_k)`? A variance experiment
#
# Take a query `q` and a key `k` with `d_k` independent entries, each of mean 0 and variance 1
# (roughly what a well-initialised layer produces). Their dot product `q·k = q_1 k_1 + ... +
# q_{d_k} k_{d_k}` is a sum of `d_k` independent terms, each of variance 1. Variances of
# independent terms add up, so
#
# $$\mathrm{Var}(q \cdot k) = d_k, \qquad \mathrm{Var}\!\left(\frac{q \cdot k}{\sqrt{d_k}}\right) = 1 .$$
#
# Let us measure it: 2,000 random pairs for each `d_k` from 2 to 1024.

# %%
torch.manual_seed(0)
dims = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
var_raw, var_scaled = [], []
for dk in dims:
    q = torch.randn(2000, dk)  # (2000, d_k)
    k = torch.randn(2000, dk)  # (2000, d_k)
    dots = (q * k).sum(dim=-1)  # (2000,): one dot product per pair
    var_raw.append(dots.var().item())
    var_scaled.append((dots / math.sqrt(dk)).var().item())
for dk, vr, vs in zip(dims, var_raw, var_scaled):
    print(f"d_k = {dk:5d}   Var(q.k) = {vr:8.1f}   Var(q.k / sqrt(d_k)) = {vs:5.2f}")

# %% [markdown]
# Why does the size of the scores matter? Softmax reacts to **differences** between scores. When
# the scores spread over a range of 30 or 100, the largest one takes almost all the weight: the
# softmax becomes nearly one-hot, and its gradient nearly zero, so the model stops learning.
#
# Second measurement: 500 queries, each against `T = 16` random keys. How much weight does the
# top key get on average, with and without the scaling?

# %%
torch.manual_seed(1)
T_keys = 16
top_raw, top_scaled = [], []
for dk in dims:
    q = torch.randn(500, 1, dk)  # (500, 1, d_k): one query per row
    k = torch.randn(500, T_keys, dk)  # (500, 16, d_k): 16 keys per query
    scores = (q @ k.transpose(-2, -1)).squeeze(1)  # (500, 16)
    top_raw.append(torch.softmax(scores, dim=-1).amax(dim=-1).mean().item())
    top_scaled.append(torch.softmax(scores / math.sqrt(dk), dim=-1).amax(dim=-1).mean().item())
for dk, tr, ts in zip(dims, top_raw, top_scaled):
    print(f"d_k = {dk:5d}   top weight unscaled = {tr:.3f}   scaled = {ts:.3f}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
axes[0].loglog(dims, var_raw, "o-", label="q·k")
axes[0].loglog(dims, var_scaled, "s-", label="q·k / sqrt(d_k)")
axes[0].loglog(dims, dims, ":", color="gray", label="d_k (theory)")
axes[0].set_xlabel("d_k"); axes[0].set_ylabel("variance of the score")
axes[0].set_title("score variance grows like d_k"); axes[0].legend()
axes[1].semilogx(dims, top_raw, "o-", label="softmax(q·k)")
axes[1].semilogx(dims, top_scaled, "s-", label="softmax(q·k / sqrt(d_k))")
axes[1].axhline(1 / T_keys, color="gray", ls=":", label="uniform, 1/16")
axes[1].set_xlabel("d_k"); axes[1].set_ylabel("weight of the top key (mean)")
axes[1].set_title(f"peakiness of the softmax over {T_keys} keys"); axes[1].legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# Without scaling, at `d_k = 64` (the head size of GPT-2) the top key already takes most of the
# weight, and from a few hundred on the softmax is practically one-hot. Divided by `sqrt(d_k)`,
# the scores keep variance 1 whatever `d_k` is, and the softmax stays equally soft. Dividing by
# `d_k` itself would overdo it: the variance would shrink like `1/d_k` and the weights would
# flatten towards uniform.

# %% [markdown]
# ## 4. All queries at once, and the general formula
#
# Stack the queries too: `Q = X W_q`, `K = X W_k`, `V = X W_v`, each `(T, d_out)`. Then all
# scores are `Q Kᵀ`, `(T, T)`, and
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V .$$

# %%
queries = inputs @ W_query  # (6, 2)
all_weights = torch.softmax(queries @ keys.T / math.sqrt(d_k), dim=-1)  # (6, 6)
all_context = all_weights @ values  # (6, 6) @ (6, 2) -> (6, 2)
print(all_context)
print("row 1 == context_vec_2:", torch.allclose(all_context[1], context_vec_2))

# %% [markdown]
# Unlike notebook 02, the table of weights is **not symmetric** any more: how much "journey"
# attends to "step" is no longer how much "step" attends to "journey", because queries and keys
# are different projections.

# %%
plotting.plot_attention(all_weights, tokens, title="softmax(Q Kᵀ / sqrt(d_k)), random W_q, W_k")
plt.show()

# %% [markdown]
# Nothing in the formula needs the queries and the keys to come from the same sequence. In a
# translation model the queries come from the sentence being written and the keys and values
# from the source sentence (**cross-attention**). Only the sizes must fit:
#
# | tensor | shape |
# |---|---|
# | queries | `(..., Tq, d_k)` |
# | keys | `(..., Tk, d_k)` |
# | values | `(..., Tk, d_v)` |
# | `Q Kᵀ` and the weights | `(..., Tq, Tk)` |
# | output | `(..., Tq, d_v)` |
#
# The softmax runs over the **keys**: the last dimension, as in notebook 02.

# %% [markdown]
# ### Exercise 1: `scaled_dot_product_attention`
#
# Write `scaled_dot_product_attention(queries, keys, values)` for the shapes in the table above
# (any number of batch dimensions `...`, `Tq` may differ from `Tk`, `d_v` from `d_k`).
#
# - Swap only the last two dimensions of the keys: `keys.transpose(-2, -1)`, not `keys.T`.
# - `d_k` is the size of the **keys**, `keys.shape[-1]`.
# - `torch.softmax` is allowed; `F.scaled_dot_product_attention` is not (it comes in notebook 06).
#
# **Rules** (the check and the grader apply them): `F.scaled_dot_product_attention`, `nn.MultiheadAttention` and
# `F.multi_head_attention_forward` are not allowed here.

# %% grade_id="scaled_dot_product_attention"
def scaled_dot_product_attention(queries, keys, values):
    """softmax(Q K^T / sqrt(d_k)) V.

    queries (..., Tq, d_k), keys (..., Tk, d_k), values (..., Tk, d_v) -> (..., Tq, d_v).
    """
    ### BEGIN SOLUTION
    d_k = keys.shape[-1]
    scores = queries @ keys.transpose(-2, -1)  # (..., Tq, Tk)
    weights = torch.softmax(scores / math.sqrt(d_k), dim=-1)  # (..., Tq, Tk)
    return weights @ values  # (..., Tq, d_v)
    ### END SOLUTION

# %% grade_id="test_scaled_dot_product_attention" points=3
checks.check_scaled_dot_product_attention(scaled_dot_product_attention)
### BEGIN HIDDEN TESTS
checks.check_scaled_dot_product_attention(scaled_dot_product_attention, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Your function reproduces section 4, and it accepts 3 queries against 6 keys just as well:

# %%
print(scaled_dot_product_attention(queries, keys, values))
print("3 queries, 6 keys ->", scaled_dot_product_attention(queries[:3], keys, values).shape)

# %% [markdown]
# ## 5. A module with `nn.Parameter`
#
# A PyTorch layer is a subclass of `nn.Module`: `__init__` creates the weights, `forward` computes
# the output. A tensor wrapped in `nn.Parameter` and stored as an attribute is **registered**:
# it appears in `module.parameters()` (so an optimiser trains it), in `state_dict()` (so it is
# saved), and it moves with `module.to(device)`.

# %% [markdown]
# ### Exercise 2: `SelfAttention_v1`
#
# Write the book's first self-attention class. `SelfAttention_v1(d_in, d_out)`:
#
# - `__init__` creates `self.W_query`, `self.W_key`, `self.W_value`, **in this order**, each
#   `nn.Parameter(torch.rand(d_in, d_out))`. The order matters: with a fixed seed it decides which
#   random numbers each matrix gets, and the check compares with the book's numbers.
# - `forward(x)` takes `x` of shape `(..., T, d_in)` and returns the context vectors
#   `(..., T, d_out)`: project to queries, keys, values, then attention as in exercise 1 (you may
#   call your `scaled_dot_product_attention`).

# %% grade_id="SelfAttention_v1"
class SelfAttention_v1(nn.Module):
    """Self-attention with nn.Parameter weights. (..., T, d_in) -> (..., T, d_out)."""

    def __init__(self, d_in, d_out):
        super().__init__()
        ### BEGIN SOLUTION
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))  # (d_in, d_out)
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        queries = x @ self.W_query  # (..., T, d_out)
        keys = x @ self.W_key  # (..., T, d_out)
        values = x @ self.W_value  # (..., T, d_out)
        scores = queries @ keys.transpose(-2, -1)  # (..., T, T)
        weights = torch.softmax(scores / math.sqrt(keys.shape[-1]), dim=-1)
        return weights @ values  # (..., T, d_out)
        ### END SOLUTION

# %% grade_id="test_SelfAttention_v1" points=3
checks.check_SelfAttention_v1(SelfAttention_v1)
### BEGIN HIDDEN TESTS
checks.check_SelfAttention_v1(SelfAttention_v1, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# With the book's seed your class prints the book's output; row 1 is `context_vec_2` from
# section 2, because the matrices are created in the same order from the same seed.

# %%
torch.manual_seed(123)
sa_v1 = SelfAttention_v1(d_in, d_out)
print(sa_v1(inputs))  # (6, 2)
for name, p in sa_v1.named_parameters():
    print(name, tuple(p.shape))

# %% [markdown]
# ## 6. Why `torch.rand` is a poor initialisation
#
# `torch.rand` draws from `[0, 1)`: every weight is positive, with mean 0.5, whatever the layer's
# size. Let us see what that does to a realistic size, `d_in = 768` (GPT-2 small) projected to
# `d_out = 64` (one head), with inputs of mean 0 and variance 1.

# %%
torch.manual_seed(2)
big_in, big_out = 768, 64
W_rand = torch.rand(big_in, big_out)  # (768, 64), the v1 way
linear = nn.Linear(big_in, big_out, bias=False)  # weight (64, 768), the v2 way
bound = 1 / math.sqrt(big_in)
print(f"torch.rand:  min {W_rand.min():.3f}  max {W_rand.max():.3f}  mean {W_rand.mean():.3f}")
print(f"nn.Linear:   min {linear.weight.min():.3f}  max {linear.weight.max():.3f}  "
      f"mean {linear.weight.mean():.4f}   (1/sqrt(d_in) = {bound:.3f})")

# %% [markdown]
# `nn.Linear` draws its weights from `U(-1/sqrt(d_in), 1/sqrt(d_in))`: centred on zero, and the
# wider the input, the smaller each weight. An output is a sum of `d_in` terms `x_i w_i`; its
# variance is `d_in · E[w²]`, which is `1/3` for `nn.Linear` whatever `d_in` is, but `d_in / 3 = 256`
# for `torch.rand`: standard deviations of `sqrt(1/3) ≈ 0.58` and `sqrt(256) = 16`. Moreover the
# outputs of one token all share the same large positive-weighted sum.
#
# A standard deviation measured on a few tokens is itself noisy (with 10 tokens this one comes out
# anywhere between about 11 and 21), so we measure on 2,000 random tokens: a `(2000, 768) @ (768, 64)`
# product, a few milliseconds.

# %%
x_many = torch.randn(2000, big_in)  # (2000, 768): 2,000 random tokens
out_rand = x_many @ W_rand  # (2000, 64)
out_linear = linear(x_many)  # (2000, 64)
print(f"outputs, torch.rand weights: std {out_rand.std():6.2f}   (predicted 16)")
print(f"outputs, nn.Linear weights:  std {out_linear.std():6.2f}   (predicted {math.sqrt(1 / 3):.2f})")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), sharex=True)
axes[0].hist(out_rand.flatten().numpy(), bins=60, color="tab:red")
axes[0].set_title("x @ torch.rand(768, 64)")
axes[1].hist(out_linear.detach().flatten().numpy(), bins=60, color="tab:blue")
axes[1].set_title("nn.Linear(768, 64)(x)")
for ax in axes:
    ax.set_xlabel("output value (same scale in both panels)")
    ax.set_ylabel(f"count (of {out_rand.numel():,} outputs)")
fig.tight_layout()
plt.show()

# %% [markdown]
# Queries and keys of that size make scores in the hundreds or thousands, even after dividing by
# `sqrt(64) = 8`, and the softmax turns one-hot (section 3). With `nn.Linear` the weights stay soft
# (ten of the tokens, so that a uniform weight is 0.1):

# %%
torch.manual_seed(3)
x_big = x_many[:10]  # (10, 768)
for label, make in [("torch.rand", lambda: torch.rand(big_in, big_out)),
                    ("nn.Linear ", lambda: nn.Linear(big_in, big_out, bias=False).weight.T.detach())]:
    W_q, W_k = make(), make()  # each (768, 64)
    scores = (x_big @ W_q) @ (x_big @ W_k).T / math.sqrt(big_out)  # (10, 10)
    top = torch.softmax(scores, dim=-1).amax(dim=-1)  # (10,): largest weight of each query
    print(f"{label}: score std {scores.std():8.2f}   mean top weight {top.mean():.3f}   (uniform = 0.1)")

# %% [markdown]
# ## 7. `nn.Parameter` vs `nn.Linear`
#
# | | `nn.Parameter(torch.rand(d_in, d_out))` | `nn.Linear(d_in, d_out, bias=...)` |
# |---|---|---|
# | what it is | a tensor, registered as a weight | a module that owns a weight (and a bias) |
# | stored shape | `(d_in, d_out)`, as you wrote it | `weight`: `(d_out, d_in)`; `bias`: `(d_out,)` |
# | computes | you write `x @ W` | `layer(x) = x @ weight.T + bias` |
# | initialisation | whatever you wrote | `U(-1/sqrt(d_in), 1/sqrt(d_in))` |
# | bias | you would add it yourself | one flag |
#
# The transposed storage is the one surprise. It is a convention (one row of `weight` per output
# unit); the arithmetic is the same:

# %%
torch.manual_seed(4)
layer = nn.Linear(d_in, d_out, bias=False)
print("layer.weight.shape:", layer.weight.shape, " = (d_out, d_in)")
print("layer(inputs) == inputs @ layer.weight.T:", torch.allclose(layer(inputs), inputs @ layer.weight.T))

# %% [markdown]
# ### Exercise 3: `SelfAttention_v2`
#
# The same module with `nn.Linear` projections. `SelfAttention_v2(d_in, d_out, qkv_bias=False)`:
#
# - `__init__` creates `self.W_query`, `self.W_key`, `self.W_value`, in this order, each
#   `nn.Linear(d_in, d_out, bias=qkv_bias)`;
# - `forward(x)`: `(..., T, d_in) -> (..., T, d_out)`; call the layers, `self.W_query(x)`, instead
#   of multiplying by a matrix.

# %% grade_id="SelfAttention_v2"
class SelfAttention_v2(nn.Module):
    """Self-attention with nn.Linear projections. (..., T, d_in) -> (..., T, d_out)."""

    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        ### BEGIN SOLUTION
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)  # weight (d_out, d_in)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        queries = self.W_query(x)  # (..., T, d_out)
        keys = self.W_key(x)
        values = self.W_value(x)
        return scaled_dot_product_attention(queries, keys, values)  # (..., T, d_out)
        ### END SOLUTION

# %% grade_id="test_SelfAttention_v2" points=3
checks.check_SelfAttention_v2(SelfAttention_v2)
### BEGIN HIDDEN TESTS
checks.check_SelfAttention_v2(SelfAttention_v2, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# With the book's seed 789 your class prints the book's output. The numbers differ from v1's
# because the weights are initialised differently, not because the computation is different.

# %%
torch.manual_seed(789)
sa_v2 = SelfAttention_v2(d_in, d_out)
print(sa_v2(inputs))  # (6, 2)
for name, p in sa_v2.named_parameters():
    print(name, tuple(p.shape))

# %% [markdown]
# ## 8. The book's exercise 3.1: from v2 to v1
#
# If `SelfAttention_v1` is given the weights of a `SelfAttention_v2` (without biases), both must
# compute the same thing. v2 computes `x @ weight.T` with `weight` of shape `(d_out, d_in)`; v1
# computes `x @ W` with `W` of shape `(d_in, d_out)`. So
#
# $$W^{\text{v1}} = (\text{weight}^{\text{v2}})^\top \quad\text{for each of query, key and value.}$$
#
# Copying `weight` without the transpose either fails with a shape error or, when `d_in ==
# d_out`, silently computes something else.

# %% [markdown]
# ### Exercise 4: `copy_v2_weights_to_v1`
#
# Write `copy_v2_weights_to_v1(sa_v2, sa_v1)`, which changes `sa_v1` in place so that afterwards
# `sa_v1(x)` equals `sa_v2(x)` for every input. It returns nothing.
#
# - Copy into the existing parameters, `sa_v1.W_query` and so on, keeping them `nn.Parameter`s:
#   for example `sa_v1.W_query.data.copy_(...)`, or `.copy_` inside `with torch.no_grad():`, or
#   assign a new `nn.Parameter(...)`.
# - `sa_v2` must not change. `sa_v2` is built with `qkv_bias=False`.

# %% grade_id="copy_v2_weights_to_v1"
def copy_v2_weights_to_v1(sa_v2, sa_v1):
    """Give sa_v1 the (transposed) projection weights of sa_v2, in place. Returns None."""
    ### BEGIN SOLUTION
    with torch.no_grad():
        sa_v1.W_query.copy_(sa_v2.W_query.weight.T)  # (d_out, d_in).T -> (d_in, d_out)
        sa_v1.W_key.copy_(sa_v2.W_key.weight.T)
        sa_v1.W_value.copy_(sa_v2.W_value.weight.T)
    ### END SOLUTION

# %% grade_id="test_copy_v2_weights_to_v1" points=2
checks.check_copy_v2_weights_to_v1(copy_v2_weights_to_v1)
### BEGIN HIDDEN TESTS
checks.check_copy_v2_weights_to_v1(copy_v2_weights_to_v1, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# After the copy, the v1 module gives v2's output, the book's numbers for seed 789:

# %%
torch.manual_seed(123)
sa_v1 = SelfAttention_v1(d_in, d_out)
copy_v2_weights_to_v1(sa_v2, sa_v1)
print(sa_v1(inputs))
print("same as sa_v2:", torch.allclose(sa_v1(inputs), sa_v2(inputs)))

# %% [markdown]
# ## Check your understanding
#
# Click a question to see the answer.
#
# <details><summary>1. <code>x</code> is <code>(2, 6, 768)</code> and <code>W_query</code> is <code>nn.Linear(768, 64)</code>. What are the shapes of <code>W_query.weight</code>, the queries, the scores and the output of self-attention?</summary>
#
# `weight` is `(64, 768)`; the queries, keys and values are `(2, 6, 64)`; the scores and weights
# `(2, 6, 6)`; the output `(2, 6, 64)`.
# </details>
#
# <details><summary>2. Why <code>sqrt(d_k)</code> and not <code>d_k</code>?</summary>
#
# The variance of a dot product of `d_k` independent unit-variance terms is `d_k`, so its typical
# size (standard deviation) is `sqrt(d_k)`. Dividing by `sqrt(d_k)` brings the variance back to 1.
# Dividing by `d_k` would shrink it to `1/d_k`, and for large `d_k` every softmax would be almost
# uniform.
# </details>
#
# <details><summary>3. With 3 queries and 10 keys of size 16, and values of size 8, what is the shape of the weights, and of the output? Which dimension sums to 1?</summary>
#
# Weights `(3, 10)`, output `(3, 8)`. Each row (one query, over its 10 keys, `dim=-1`) sums to 1.
# </details>
#
# <details><summary>4. Why does the attention weight table stop being symmetric in this notebook?</summary>
#
# Score `(i, j)` is `q_i · k_j = (x_i W_q) · (x_j W_k)`. Swapping `i` and `j` gives
# `(x_j W_q) · (x_i W_k)`, a different number unless `W_q` and `W_k` are related. In notebook 02
# both were the identity, so the table was symmetric.
# </details>
#
# <details><summary>5. The book's own answer to exercise 3.1 is <code>sa_v1.W_query = nn.Parameter(sa_v2.W_query.weight.T)</code>. How does that differ from copying with <code>copy_</code>?</summary>
#
# Both give the same outputs. The book's version makes a new parameter that **shares memory**
# with v2's weight (`.T` is a view), so training one module would also change the other. `copy_`
# writes the numbers into v1's own tensor: the two modules stay independent.
# </details>
#
# <details><summary>6. Why can <code>copy_v2_weights_to_v1</code> not handle <code>qkv_bias=True</code>?</summary>
#
# v1 computes `x @ W` with no bias term: there is nowhere to put v2's biases, and without them the
# outputs differ.
# </details>
#
# <details><summary>7. Find the bug: <code>sa_v1.W_query.data.copy_(sa_v2.W_query.weight)</code> with <code>d_in = d_out = 4</code>. No error is raised. What goes wrong?</summary>
#
# `weight` is `(d_out, d_in)`, v1's matrix `(d_in, d_out)`. With `d_in == d_out` both are `(4, 4)`,
# so the copy works without complaint, but v1 then computes `x @ weight` instead of
# `x @ weight.T`: different outputs. Only a comparison of outputs (as the check does) finds it;
# copy `weight.T`.
# </details>
#
# <details><summary>8. Predict the output: with <code>d_k = 100</code>, queries and keys of unit-variance entries, roughly how large is a typical raw score <code>q·k</code>, and a scaled one?</summary>
#
# The raw score has variance `d_k = 100`, so a typical size (standard deviation) of 10; divided
# by `sqrt(100) = 10` it has variance 1, a typical size of 1. Section 3 measured exactly this.
# </details>

# %% [markdown]
# ## Recap
#
# - Each token gets a query `x W_q`, a key `x W_k` and a value `x W_v`; only the values are mixed.
# - Attention: `softmax(Q Kᵀ / sqrt(d_k)) V`, `(..., Tq, d_k), (..., Tk, d_k), (..., Tk, d_v) ->
#   (..., Tq, d_v)`, softmax over the keys (`dim=-1`).
# - Dot products of `d_k`-dimensional vectors have variance `d_k`; dividing by `sqrt(d_k)` keeps
#   the softmax from turning one-hot as `d_k` grows.
# - `nn.Parameter` registers a tensor as a weight; `nn.Linear` is a module with a well-scaled
#   initialisation, an optional bias, and a weight stored as `(d_out, d_in)`: `x @ weight.T`.
# - Exercise 3.1: v1's matrix is v2's weight **transposed**.
#
# So far every token may attend to every other token, including the ones that come **later** in
# the sentence. A language model that predicts the next word must not see the future: notebook 04
# masks it.
