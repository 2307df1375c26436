# %% [markdown]
# # 02 · Softmax and context vectors: from scores to a weighted mix
#
# In notebook 01 every token got a **score** against every other token: a dot product, any real
# number. Attention now needs two more steps:
#
# 1. turn a row of scores into **weights** that are positive and add up to one;
# 2. use those weights to mix the tokens into a **context vector**.
#
# **In this notebook you will**
# 1. see why dividing scores by their sum is not good enough (negative scores break it);
# 2. write the softmax from its formula, `softmax_naive`, and watch it overflow on large scores;
# 3. fix the overflow with the max-subtraction trick: `softmax_stable`;
# 4. learn which `dim` a softmax must run over, and why;
# 5. compute context vectors for one query, then for all tokens at once: `context_vectors`;
# 6. read the whole thing as a library search: query = request, key = book title, value = contents.
#
# Shapes use the letters of notebook 01: `T` = number of tokens, `d` = size of one embedding,
# `b` = batch size. Fill in each `# YOUR CODE HERE` cell, run it, then run the check cell below it.

# %% setup=true

# %%
import math

import matplotlib.pyplot as plt
import torch

from course_utils import checks, data, plotting

torch.manual_seed(123)
print("torch", torch.__version__)

# %% [markdown]
# ## 1. Where we left off: scores for the query "journey"
#
# The book's sentence is a `(T, d) = (6, 3)` matrix. With "journey" (`inputs[1]`) as the query,
# its scores against all six tokens form a vector of shape `(6,)`, exactly as in notebook 01.

# %%
inputs = data.book_inputs()  # (6, 3)
tokens = data.TOKENS
query = inputs[1]  # (3,): "journey"
scores_2 = inputs @ query  # (6, 3) @ (3,) -> (6,)
print(scores_2)
print("shape:", scores_2.shape)

# %% [markdown]
# ## 2. What we want from weights
#
# The plan is to build a new vector for "journey" as a **weighted average** of all six token
# vectors. A weighted average needs weights that
#
# - are **never negative** (a token cannot contribute "minus 20 %"), and
# - **sum to 1** (so the result stays on the scale of the inputs).
#
# The simplest idea is to divide every score by the sum of the scores.

# %%
weights_sum_norm = scores_2 / scores_2.sum()  # (6,)
print("weights:", weights_sum_norm)
print("sum:    ", weights_sum_norm.sum())

# %% [markdown]
# That looks fine: all positive, sum 1. But it only worked because every score here happens to be
# positive. Dot products can be negative (notebook 01, question 3). Try a row of scores with a
# negative entry:

# %%
mixed = torch.tensor([2.0, -1.0, -0.5])  # (3,)
print("divided by the sum:", mixed / mixed.sum())
balanced = torch.tensor([1.0, -1.0, 0.5, -0.5])  # (4,), sums to 0
print("a row that sums to zero:", balanced / balanced.sum())

# %% [markdown]
# Sum-normalisation fails in two ways:
#
# - with `[2, -1, -0.5]` the "weights" are `[4, -2, -1]`: they sum to 1, but a token gets weight
#   4 and two get negative weights. That is not an average any more.
# - when the scores happen to sum to zero, we divide by zero and every "weight" is `inf` or `-inf`.
#
# We need a map that makes every score positive **before** normalising, and keeps the order
# (a higher score must still mean a higher weight).

# %% [markdown]
# ## 3. The softmax
#
# The exponential function does exactly that: `exp(s) > 0` for every real `s`, and it grows with
# `s`. Exponentiate, then divide by the sum:
#
# $$\mathrm{softmax}(s)_i = \frac{e^{s_i}}{\sum_j e^{s_j}} .$$
#
# On `[2, -1, -0.5]` this gives proper weights:

# %%
e = torch.exp(mixed)  # (3,), all positive
print("exp(scores):", e)
print("softmax:    ", e / e.sum())

# %% [markdown]
# The exponential also **sharpens** the distribution: a score that is larger by 1 gets
# `e ≈ 2.7` times the weight. Compare sum-normalisation and softmax on the "journey" scores.
# Before you run the cell, predict: which tokens gain weight, which lose?

# %%
weights_2 = torch.exp(scores_2) / torch.exp(scores_2).sum()  # (6,)
print("sum-normalised:", weights_sum_norm)
print("softmax:       ", weights_2)
print("softmax sums to", weights_2.sum())
print("PyTorch's torch.softmax agrees:", torch.allclose(weights_2, torch.softmax(scores_2, dim=0)))

# %% [markdown]
# These are the book's attention weights for "journey": `[0.1385, 0.2379, 0.2333, 0.1240,
# 0.1082, 0.1581]`. Softmax gives the two highest scores, "journey" (0.2278 → 0.2379) and
# "starts" (0.2249 → 0.2333), a little more, and takes it from "Your", "with" and "step". Only
# "one", the lowest score, does not lose: 0.1077 → 0.1082. Why so little change, and why does
# "one" gain? Going from `s / Σ s` to `e^s / Σ e^s` multiplies a token's weight by
# `(e^s / s) / (Σ e^s / Σ s)`, and the denominator is the same for all: here 2.86. Near `s = 1`,
# `e^s / s` is almost flat (its minimum, `e ≈ 2.72`, is at `s = 1`): for these scores, 0.71 to
# 1.50, it stays between 2.72 and 2.98. Both ends of the range sit a little above 2.86 ("one":
# 2.87), the middle a little below, so "one" gains as well. The sharpening shows when scores
# differ by several units (question 6 below).
#
# The two bar charts share their y axis, so equal heights mean equal weights. The differences are
# a hundredth at most, too small to see there, so the third chart shows them on their own scale:

# %%
fig, axes = plt.subplots(1, 3, figsize=(15, 3.2))
plotting.plot_weights_bar(weights_sum_norm, tokens, title="scores / sum(scores)", ax=axes[0])
plotting.plot_weights_bar(weights_2, tokens, title="softmax(scores)", ax=axes[1])
axes[1].sharey(axes[0])
axes[0].set_ylim(0, 0.3)
plotting.plot_weights_bar(weights_2 - weights_sum_norm, tokens, title="softmax minus sum-normalised",
                          ax=axes[2], ylabel="difference", fmt="%+.4f")
fig.tight_layout()
plt.show()

# %% [markdown]
# ### Exercise 1: `softmax_naive`
#
# Write `softmax_naive(x, dim=-1)` straight from the formula: `exp(x)` divided by the sum of
# `exp(x)` **along `dim`**. The result has the same shape as `x`, and every slice along `dim`
# sums to 1.
#
# - `x` may have any shape: `(T,)`, `(T, T)`, `(b, T, T)`, ...
# - Sum with `keepdim=True`, so that the sums keep a dimension of size 1 and broadcast back
#   over the right axis when you divide.
# - `torch.softmax`, `F.softmax` and `nn.Softmax` are not allowed here (the check says so).
#
# **Rules** (the check and the grader apply them): no library softmax: `softmax`, `log_softmax` and `softmin`
# (from `torch`, `F` or `nn`, as `nn.Softmax` and `nn.LogSoftmax`) are not allowed here.

# %% grade_id="softmax_naive"
def softmax_naive(x, dim=-1):
    """Softmax from the formula exp(x) / sum(exp(x)) along `dim`. Same shape as x."""
    ### BEGIN SOLUTION
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)
    ### END SOLUTION

# %% grade_id="test_softmax_naive" points=2
# Check your `softmax_naive` on the book's scores, a (6, 6) table and a (2, 5) tensor with dim=0.
checks.check_softmax_naive(softmax_naive)
### BEGIN HIDDEN TESTS
checks.check_softmax_naive(softmax_naive, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. The naive softmax overflows
#
# A `float32` can hold numbers up to about `3.4e38`. `exp(88.7)` is already about that large, so
# `exp` of anything bigger is `inf`. Scores of a few hundred are not unusual in a real model (in
# notebook 03 we see how dot products grow with the vector size).

# %%
print("exp(88) =", torch.exp(torch.tensor(88.0)))
print("exp(89) =", torch.exp(torch.tensor(89.0)))
big = torch.tensor([1000.0, 1001.0, 1002.0])  # (3,)
print("softmax_naive(big) =", softmax_naive(big))

# %% [markdown]
# `exp(1000)` is `inf`, and `inf / inf` is `nan`. Very negative scores fail the other way: every
# `exp` **underflows** to 0, and `0 / 0` is `nan` too.

# %%
small = torch.tensor([-1000.0, -1001.0, -1002.0])  # (3,)
print("exp(small)          =", torch.exp(small))
print("softmax_naive(small) =", softmax_naive(small))

# %% [markdown]
# ## 5. The fix: subtract the maximum
#
# Adding the same constant `c` to every score does not change the softmax:
#
# $$\frac{e^{s_i - c}}{\sum_j e^{s_j - c}} = \frac{e^{-c}\, e^{s_i}}{e^{-c} \sum_j e^{s_j}}
#   = \frac{e^{s_i}}{\sum_j e^{s_j}} .$$
#
# The factor `e^{-c}` cancels. So we may pick the `c` that is safest for the computer:
# **the maximum of the scores**. Then
#
# - every exponent `s_i - max` is `<= 0`, so `exp` is at most 1: no overflow;
# - the largest score gives `exp(0) = 1`, so the denominator is at least 1: no `0 / 0`.
#
# Let us check that shifting really changes nothing, on the "journey" scores:

# %%
for c in [0.0, 1.0, -5.0, scores_2.max().item()]:
    shifted = torch.exp(scores_2 - c) / torch.exp(scores_2 - c).sum()
    print(f"c = {c:7.4f}:", shifted)

# %% [markdown]
# And the large scores `[1000, 1001, 1002]` become `[-2, -1, 0]` after the shift: harmless.
# Their softmax is the same as the softmax of `[0, 1, 2]`.

# %%
shifted_big = big - big.max()  # (3,)
print("big - max(big):", shifted_big)
print("softmax:       ", torch.exp(shifted_big) / torch.exp(shifted_big).sum())
print("softmax of [0, 1, 2]:", softmax_naive(torch.tensor([0.0, 1.0, 2.0])))

# %% [markdown]
# ### One maximum per slice
#
# For a table of scores `(T, T)` with `dim=-1`, every **row** is its own softmax, so every row must
# subtract **its own** maximum: `x.amax(dim=dim, keepdim=True)` has shape `(T, 1)` and broadcasts
# over the row. (The maximum of the whole tensor would be correct on paper, but a row whose scores
# are all far below that global maximum underflows to `0 / 0`.)

# %%
two_rows = torch.tensor([[1000.0, 1001.0], [0.0, 1.0]])  # (2, 2): rows on very different scales
row_max = two_rows.amax(dim=-1, keepdim=True)  # (2, 1)
print("row maxima (2, 1):\n", row_max)
print("x - row max:\n", two_rows - row_max)
global_shift = two_rows - two_rows.max()  # one shift for the whole tensor
print("exp(x - global max):\n", torch.exp(global_shift))

# %% [markdown]
# ### `-inf` means "weight exactly 0"
#
# `exp(-inf) = 0`, so a score of `-inf` gets weight 0 and the rest of the row is normalised
# without it. Notebook 04 uses exactly this to hide future tokens. With the maximum subtracted this
# still works, as long as the row has at least one finite score (then its maximum is finite).
#
# A row made **only** of `-inf` has no sensible softmax (`0 / 0`); PyTorch returns `nan` there,
# and we never ask for it.

# %%
masked_row = torch.tensor([1.0, float("-inf"), 2.0, float("-inf")])  # (4,)
print("torch.softmax:", torch.softmax(masked_row, dim=-1))

# %% [markdown]
# ### Exercise 2: `softmax_stable`
#
# Write `softmax_stable(x, dim=-1)`: the same result as `softmax_naive` wherever that one works,
# and also correct for scores in the thousands (positive or negative) and for `-inf` entries.
#
# - Subtract the maximum **of each slice along `dim`** (keep the dimension!), then exponentiate
#   and normalise along `dim`.
# - Same shape as `x`; no library softmax.
#
# **Rules** (the check and the grader apply them): no library softmax: `softmax`, `log_softmax` and `softmin`
# (from `torch`, `F` or `nn`, as `nn.Softmax` and `nn.LogSoftmax`) are not allowed here.

# %% grade_id="softmax_stable"
def softmax_stable(x, dim=-1):
    """Softmax along `dim` that subtracts each slice's maximum first. Same shape as x."""
    ### BEGIN SOLUTION
    x_max = x.amax(dim=dim, keepdim=True)
    e = torch.exp(x - x_max)
    return e / e.sum(dim=dim, keepdim=True)
    ### END SOLUTION

# %% grade_id="test_softmax_stable" points=3
# Check your `softmax_stable`, also on scores in the 1000s and on -inf entries.
checks.check_softmax_stable(softmax_stable)
### BEGIN HIDDEN TESTS
checks.check_softmax_stable(softmax_stable, hidden=True)
### END HIDDEN TESTS

# %%
print("softmax_stable(big)  =", softmax_stable(big))
print("softmax_stable(small) =", softmax_stable(small))

# %% [markdown]
# From here on we use `torch.softmax`, which does the same max-subtraction inside.

# %% [markdown]
# ## 6. Which `dim`?
#
# Now let every token be a query. The score table `inputs @ inputs.T` is `(T, T) = (6, 6)`:
# **row `i` is query `i`**, column `j` is key `j`. Each query needs its own distribution over the
# keys, so each **row** must sum to 1: the softmax runs along the last dimension, `dim=-1`
# (here the same as `dim=1`).

# %%
attn_scores = inputs @ inputs.T  # (6, 3) @ (3, 6) -> (6, 6)
attn_weights = torch.softmax(attn_scores, dim=-1)  # (6, 6), each row sums to 1
print(attn_weights)
print("row sums:   ", attn_weights.sum(dim=-1))

# %% [markdown]
# Row 1 is the "journey" vector from section 3. With `dim=0` instead, every **column** would sum
# to 1: "how the keys' attention is shared out among the queries", which is not what a query needs.

# %%
wrong_dim = torch.softmax(attn_scores, dim=0)  # (6, 6), each column sums to 1
print("dim=0, row sums:   ", wrong_dim.sum(dim=-1))
print("dim=0, column sums:", wrong_dim.sum(dim=0))

# %% [markdown]
# With a batch `(b, T, T)` the difference is worse: `dim=0` would normalise **across the
# sentences of the batch**, mixing unrelated sentences. `dim=-1` means "the keys" for any number
# of batch dimensions, which is why attention code always writes `dim=-1`.

# %%
batch_scores = data.book_batch() @ data.book_batch().transpose(-2, -1)  # (2, 6, 6)
print("dim=-1, weights of sentence 0 == the table above:",
      torch.allclose(torch.softmax(batch_scores, dim=-1)[0], attn_weights))
print("dim=0, every entry is 0.5 (two identical sentences):\n", torch.softmax(batch_scores, dim=0)[0, :2])

# %% [markdown]
# The scores and the weights as heatmaps, rows = queries, columns = keys. Softmax keeps the
# pattern of the scores (bright stays bright) but puts every row on the same scale.

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
plotting.plot_attention(attn_scores, tokens, title="scores  inputs @ inputs.T", ax=axes[0])
plotting.plot_attention(attn_weights, tokens, title="weights  softmax(scores, dim=-1)", ax=axes[1])
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 7. A context vector for one query
#
# The **context vector** of "journey" is the weighted average of all token vectors, with the
# weights of row 1:
#
# $$z^{(2)} = \sum_i \alpha_{2i}\, x^{(i)} .$$
#
# With a loop over the six tokens, each `(3,)` vector scaled by its weight:

# %%
context_vec_2 = torch.zeros(inputs.shape[1])  # (3,)
for i, x_i in enumerate(inputs):
    context_vec_2 += weights_2[i] * x_i  # scalar * (3,)
print(context_vec_2)

# %% [markdown]
# `[0.4419, 0.6515, 0.5683]`, as in the book. The loop is a vector-matrix product:
# `(6,) @ (6, 3) -> (3,)`.

# %%
print(weights_2 @ inputs)

# %% [markdown]
# ## 8. All context vectors at once
#
# Stack the six weight rows into the `(6, 6)` matrix and the same product gives every context
# vector: `(T, T) @ (T, d) -> (T, d)`. Row `i` is the context vector of token `i`.

# %%
all_context_vecs = attn_weights @ inputs  # (6, 6) @ (6, 3) -> (6, 3)
print(all_context_vecs)
print("row 1 == the loop above:", torch.allclose(all_context_vecs[1], context_vec_2))

# %% [markdown]
# Each context vector is a blend that leans towards the tokens its query scores highly. Tokens
# that point the same way, like "journey" and "starts", score everything alike, so their context
# vectors (rows 1 and 2) are almost equal.

# %% [markdown]
# ### Exercise 3: `context_vectors`
#
# Put sections 6 and 8 together. `context_vectors(inputs)` takes `(..., T, d)`, with any number
# of batch dimensions, and returns `(..., T, d)`:
#
# 1. scores of every pair, `(..., T, T)` (your `attention_scores` of notebook 01);
# 2. softmax along the keys, `(..., T, T)`: use `softmax_stable` or `torch.softmax`, not the naive
#    one (large inputs give large scores);
# 3. weights times inputs, `(..., T, d)`.

# %% grade_id="context_vectors"
def context_vectors(inputs):
    """Simplified self-attention: softmax(inputs @ inputs^T) @ inputs, (..., T, d) -> (..., T, d)."""
    ### BEGIN SOLUTION
    scores = inputs @ inputs.transpose(-2, -1)  # (..., T, T)
    weights = softmax_stable(scores, dim=-1)  # (..., T, T)
    return weights @ inputs  # (..., T, d)
    ### END SOLUTION

# %% grade_id="test_context_vectors" points=3
checks.check_context_vectors(context_vectors)
### BEGIN HIDDEN TESTS
checks.check_context_vectors(context_vectors, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 9. The library analogy: query, key, value
#
# Here is the same computation in words. You walk into a library with a **request** ("something
# on neural networks"). Each book has a **title** on its spine and **contents** inside.
#
# - **query** = your request;
# - **keys** = the titles you compare the request with (one score per book);
# - **values** = the contents you take home, mixed by the weights.
#
# Attention does not pick one book: it takes a little of every book, more of the ones whose
# titles match. We describe each title by how much it is about three topics
# `[programming, machine learning, web]`, and each book's contents by four made-up numbers.

# %%
books = ["Python basics", "Intro to ML", "Web design", "Deep learning", "Data structures"]
titles = torch.tensor([  # keys: (5, 3), one row per book, topics [programming, ML, web]
    [1.0, 0.1, 0.2],
    [0.3, 1.0, 0.0],
    [0.2, 0.0, 1.0],
    [0.2, 1.2, 0.0],
    [1.0, 0.2, 0.1],
])
contents = torch.tensor([  # values: (5, 4), what each book holds
    [9.0, 1.0, 0.0, 2.0],
    [3.0, 8.0, 1.0, 0.0],
    [2.0, 0.0, 9.0, 1.0],
    [2.0, 9.0, 0.0, 3.0],
    [8.0, 2.0, 1.0, 1.0],
])
request = torch.tensor([0.2, 2.0, 0.0])  # query: (3,), "mostly machine learning"

book_scores = titles @ request  # (5, 3) @ (3,) -> (5,): one score per title
book_weights = torch.softmax(book_scores, dim=-1)  # (5,)
for name, s, w in zip(books, book_scores, book_weights):
    print(f"{name:16s} score {s.item():5.2f}   weight {w.item():.3f}")

# %% [markdown]
# The two machine-learning titles get most of the weight, but no book gets zero.

# %%
plotting.plot_weights_bar(book_weights, books, title="request 'mostly machine learning': weight per book",
                          fmt="%.3f")
plt.xticks(rotation=20)
plt.show()

# %% [markdown]
# What you take home is the weighted mix of the contents: `(5,) @ (5, 4) -> (4,)`. It is close to
# the contents of the two ML books, with a little of everything else.

# %%
answer = book_weights @ contents  # (4,)
print("mixed contents:", answer)

# %% [markdown]
# Several readers at once are several queries: a `(3, 3)` matrix of requests against the `(5, 3)`
# titles gives a `(3, 5)` table of scores, one row per reader, one softmax per row, and a
# `(3, 4)` block of answers. Rows are queries, columns are keys, as in section 6.

# %%
readers = ["ML student", "web developer", "programmer"]
requests = torch.tensor([  # queries: (3, 3)
    [0.2, 2.0, 0.0],
    [0.3, 0.0, 2.0],
    [2.0, 0.2, 0.2],
])
reader_scores = requests @ titles.T  # (3, 3) @ (3, 5) -> (3, 5)
reader_weights = torch.softmax(reader_scores, dim=-1)  # (3, 5), each row sums to 1
print("answers (3, 4):\n", reader_weights @ contents)

fig, axes = plt.subplots(1, 2, figsize=(12, 3.4))
for ax, table, title in [(axes[0], reader_scores, "scores  requests @ titles.T"),
                         (axes[1], reader_weights, "weights  softmax(dim=-1)")]:
    plotting.plot_attention(table, title=title, ax=ax)
    ax.set_xticks(range(len(books)), books, rotation=30, ha="right")
    ax.set_yticks(range(len(readers)), readers)
fig.tight_layout()
plt.show()

# %% [markdown]
# In this notebook every token used **its own embedding** for all three roles: query, key and
# value were the same vector. That is why the score table is symmetric: "journey" scores
# "starts" exactly as "starts" scores "journey". A real library keeps requests, titles and contents apart; in notebook 03 each role
# gets its own trainable projection.

# %% [markdown]
# ## Check your understanding
#
# Click a question to see the answer.
#
# <details><summary>1. Why not just divide the scores by their sum?</summary>
#
# Scores can be negative. Then some "weights" are negative and others larger than 1, and if the
# scores sum to zero we divide by zero. Softmax exponentiates first, so every weight is positive.
# </details>
#
# <details><summary>2. <code>softmax_naive(torch.tensor([1000., 1001.]))</code> gives <code>nan</code>. Why, and what does <code>softmax_stable</code> return?</summary>
#
# `exp(1000)` is `inf` in float32, and `inf / inf` is `nan`. Subtracting the maximum gives
# `[-1, 0]`, whose softmax is `[0.2689, 0.7311]`: the same as for `[0, 1]`.
# </details>
#
# <details><summary>3. Why is subtracting the maximum allowed at all?</summary>
#
# `softmax(x - c) = softmax(x)` for any constant `c`: the factor `exp(-c)` appears in the
# numerator and in the denominator and cancels. The maximum is the choice that keeps every
# exponent at or below zero.
# </details>
#
# <details><summary>4. <code>weights = torch.softmax(scores, dim=0)</code> for scores of shape <code>(b, T, T)</code>. What goes wrong?</summary>
#
# The softmax runs across the batch: entry `[k, i, j]` is normalised against the same position
# in the other sentences. Weights of one query no longer sum to 1 over its keys. Use `dim=-1`.
# </details>
#
# <details><summary>5. <code>inputs</code> is <code>(4, 10, 64)</code>. What are the shapes of the scores, the weights and <code>context_vectors(inputs)</code>?</summary>
#
# Scores and weights are `(4, 10, 10)`; the context vectors are `(4, 10, 64)`, the same shape as
# the inputs.
# </details>
#
# <details><summary>6. Predict the output: <code>torch.softmax(torch.tensor([1., 2., 3.]), dim=-1)</code> and <code>torch.softmax(torch.tensor([10., 20., 30.]), dim=-1)</code>. Same weights?</summary>
#
# No. The first gives `[0.0900, 0.2447, 0.6652]`. The second is the same scores times 10: the gaps
# become 10 instead of 1, and the weights become `[2.1e-09, 4.5e-05, 0.99995]`, almost one-hot.
# Softmax does not change when you *add* a constant to every score, but it does when you
# *multiply* them: only the differences between scores count.
# </details>
#
# <details><summary>7. Find the bug: <code>e = torch.exp(x - x.max()); return e / e.sum(dim=-1, keepdim=True)</code> for a <code>(T, T)</code> table. It never overflows. What is wrong?</summary>
#
# `x.max()` is the maximum of the whole table, not of each row. The result is still correct on
# paper, but a row whose scores are all far below that global maximum underflows: every `exp` is
# 0 and the row becomes `0 / 0 = nan` (section 5). Subtract each row's maximum:
# `x.amax(dim=-1, keepdim=True)`.
# </details>
#
# <details><summary>8. In the library, what would make one book get almost all the weight?</summary>
#
# A much larger score than the others, for example a longer (more insistent) request vector:
# multiplying the query by 10 multiplies every score by 10, and the softmax becomes nearly
# one-hot. Notebook 03 uses the same effect to explain the division by `sqrt(d_k)`.
# </details>

# %% [markdown]
# ## Recap
#
# - Weights must be positive and sum to 1; dividing by the sum fails for negative scores.
# - `softmax(s)_i = exp(s_i) / sum_j exp(s_j)`: positive, sums to 1, keeps the order, sharpens.
# - `exp` overflows above about 88 in float32. Since `softmax(x) = softmax(x - c)`, subtract each
#   slice's maximum (`keepdim=True`): no overflow, no `0 / 0`; `-inf` gets weight 0.
# - Rows are queries, so the softmax runs over the keys: `dim=-1`, for any batch dimensions.
# - Context vectors: `softmax(X Xᵀ) X`, `(..., T, d) -> (..., T, d)`; each row is a weighted
#   average of all tokens.
# - Query = request, key = title, value = contents. Next, in notebook 03, each role gets its own
#   trainable weight matrix, and the scores get divided by `sqrt(d_k)`.
