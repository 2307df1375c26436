# %% [markdown]
# # 01 · Dot products: how one token scores another
#
# Attention starts with a very small idea: to decide how much token A should "listen to" token B,
# multiply their vectors entry by entry and add the results up. That number is a **dot product**.
#
# **In this notebook you will**
# 1. see a sentence as a matrix of embedding vectors, shape `(T, d)`;
# 2. compute a dot product by hand, then write `dot` yourself;
# 3. score one query token against every token: `attention_scores_for_query`;
# 4. score every pair at once with one matrix product, also for a batch of sentences: `attention_scores`.
#
# Shapes use these letters: `T` = number of tokens, `d` = size of one embedding, `b` = batch size.
#
# How to work: fill in each cell that says `# YOUR CODE HERE`, run it, then run the check cell
# below it. A ✅ means your code agrees with ours on several inputs; a ❌ tells you what differs.
#
# **Rules for every answer cell.** Some exercises forbid a library function (the exercise says
# which). The grader checks this in two ways: it reads your code, and it watches which PyTorch
# operations your code actually runs. So a forbidden function counts however you reach it, even
# through a name you build at run time.
#
# No exercise needs Python's machinery for reaching into other code, so an answer cell that uses
# it scores 0 for that exercise, with the reason in your report:
# - `getattr`, `setattr`, `delattr` or `hasattr` on a module with a name built at run time;
# - `sys.modules`, `globals()[...]`, `vars()` or `locals()` used as a dict;
# - `exec`, `eval`, `compile`, `__import__` or `importlib`;
# - frames (`sys._getframe`, `inspect.stack`, `f_back`...), `gc` or `ctypes`;
# - dunder attributes other than `__init__`, `__name__`, `__qualname__`, `__doc__` and `__version__`,
#   and torch's private parts (`torch._C`...);
# - IPython's events and `set_custom_exc`.
#
# `getattr(self, name)` on your own layer and `super().__init__()` are fine.

# %% setup=true

# %%
import torch
import matplotlib.pyplot as plt

from course_utils import checks, data, plotting

torch.manual_seed(123)
print("torch", torch.__version__)

# %% [markdown]
# ## 1. A sentence is a matrix
#
# A language model turns each token (a word or a piece of a word) into a vector of numbers, its
# **embedding**. Real models use hundreds or thousands of numbers per token. To keep things
# visible we use the book's example with only **3** numbers per token.
#
# The sentence *"Your journey starts with one step"* has 6 tokens, so it becomes a matrix of
# shape `(T, d) = (6, 3)`: one row per token.

# %%
inputs = data.book_inputs()  # (6, 3): row i is the embedding of token i
tokens = data.TOKENS
print(tokens)
print(inputs)
print("inputs.shape:", inputs.shape)

# %% [markdown]
# With 3 numbers per token we can draw each embedding as an arrow in space, one axis per
# dimension. Tokens whose arrows point the same way ("journey" and "starts", so close that their
# labels had to be moved apart) will turn out to score each other highly.

# %%
plotting.plot_embeddings_3d(inputs, tokens, title="six token embeddings, d = 3")
plt.show()

# %% [markdown]
# ## 2. The dot product, by hand
#
# For two vectors of the same length `n`, the dot product is
#
# $$x \cdot y = x_1 y_1 + x_2 y_2 + \dots + x_n y_n .$$
#
# Take "Your" `x¹ = [0.43, 0.15, 0.89]` and "journey" `x² = [0.55, 0.87, 0.66]`:
#
# `0.43·0.55 + 0.15·0.87 + 0.89·0.66 = 0.2365 + 0.1305 + 0.5874 = 0.9544`
#
# The cell below does the same sum with a loop, then with PyTorch's `torch.dot`. Both give a
# **0-dimensional tensor**: a single number that still lives in PyTorch.

# %%
x1, x2 = inputs[0], inputs[1]  # each (3,)
total = torch.tensor(0.0)
for i in range(len(x1)):
    total = total + x1[i] * x2[i]
print("loop:     ", total)
print("torch.dot:", torch.dot(x1, x2))
print("shape of the result:", total.shape)

# %% [markdown]
# ### Exercise 1: `dot`
#
# Write `dot(x, y)` for two 1-D tensors of equal length `n`. Use an explicit `for` loop: the point
# is to see the arithmetic. `torch.dot`, `@` and `torch.matmul` are not allowed here (the check
# says so if you use them). Return a 0-dim tensor.
#
# Shapes: `x` is `(n,)`, `y` is `(n,)`, the result is `()`.
#
# **Rules** (the check and the grader apply them): multiply and add in an explicit `for` loop. No library product:
# `torch.dot`, `matmul`, `mm`, `mv`, `inner`, `vdot`, `einsum`, `tensordot` and the `@` operator are
# not allowed here.

# %% grade_id="dot"
def dot(x, y):
    """Dot product of two 1-D tensors x (n,) and y (n,), computed with a loop. Returns a 0-dim tensor."""
    ### BEGIN SOLUTION
    total = torch.zeros((), dtype=x.dtype)
    for i in range(x.shape[0]):
        total = total + x[i] * y[i]
    return total
    ### END SOLUTION

# %% grade_id="test_dot" points=2
# Check your `dot`: compares it with the reference on the book's vectors and a few others.
checks.check_dot(dot)
### BEGIN HIDDEN TESTS
checks.check_dot(dot, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Dot product as similarity
#
# Why use the dot product as a score? It is large when two vectors are long and point the same
# way, near zero when they are at right angles, and negative when they point apart.
#
# If we divide by both lengths we get the **cosine similarity**, which only measures direction.
# Attention uses the raw dot product: a vector's length also carries information, and the
# softmax in the next notebook turns the raw scores into weights.

# %%
a = torch.tensor([1.0, 0.0])
for name, b in [("same direction", torch.tensor([2.0, 0.0])),
                ("right angle", torch.tensor([0.0, 2.0])),
                ("opposite", torch.tensor([-2.0, 0.0]))]:
    cos = torch.dot(a, b) / (a.norm() * b.norm())
    print(f"{name:15s} dot = {torch.dot(a, b).item():5.1f}   cosine = {cos.item():5.2f}")

# %% [markdown]
# ## 4. Scores for one query
#
# In self-attention every token takes a turn as the **query**: the token that asks "who here is
# relevant to me?". Let us make "journey" (`inputs[1]`) the query and score it against all six
# tokens, itself included. The result has one score per token: shape `(T,) = (6,)`.

# %%
query = inputs[1]  # (3,)
scores_2 = torch.empty(inputs.shape[0])  # (6,)
for i, x_i in enumerate(inputs):
    scores_2[i] = torch.dot(x_i, query)
print(scores_2)

# %% [markdown]
# "journey" scores highest with itself (1.4950) and with "starts" (1.4754), whose embedding
# points almost the same way. "one" scores lowest.

# %%
plotting.plot_weights_bar(scores_2, tokens, title="scores of every token for the query 'journey'", ylabel="score")
plt.show()

# %% [markdown]
# ### Exercise 2: `attention_scores_for_query`
#
# Write `attention_scores_for_query(inputs, query)`:
# - `inputs` has shape `(T, d)`, `query` has shape `(d,)`;
# - return a tensor of shape `(T,)` whose entry `i` is `inputs[i] · query`.
#
# A loop works. A single matrix-vector product works too: `(T, d) @ (d,) -> (T,)`. Try both.

# %% grade_id="attention_scores_for_query"
def attention_scores_for_query(inputs, query):
    """Scores of one query (d,) against every row of inputs (T, d). Returns (T,)."""
    ### BEGIN SOLUTION
    return inputs @ query
    ### END SOLUTION

# %% grade_id="test_attention_scores_for_query" points=2
checks.check_attention_scores_for_query(attention_scores_for_query)
### BEGIN HIDDEN TESTS
checks.check_attention_scores_for_query(attention_scores_for_query, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Every pair at once
#
# Now let every token be a query in turn. Score `(i, j)` is the dot product of token `i` (the
# query) with token `j` (the key). With two loops:

# %%
T = inputs.shape[0]
scores_loop = torch.empty(T, T)  # (6, 6)
for i in range(T):
    for j in range(T):
        scores_loop[i, j] = torch.dot(inputs[i], inputs[j])
print(scores_loop)

# %% [markdown]
# The same table is one matrix product. `inputs` is `(T, d)` and `inputs.T` is `(d, T)`, so
# `inputs @ inputs.T` is `(T, T)`: entry `(i, j)` is row `i` of `inputs` times column `j` of
# `inputs.T`, which is exactly `inputs[i] · inputs[j]`.

# %%
scores = inputs @ inputs.T  # (6, 3) @ (3, 6) -> (6, 6)
print(scores)
print("same as the loops:", torch.allclose(scores, scores_loop))

# %% [markdown]
# Row 1 is the vector we computed for the query "journey". The table is symmetric (`score[i, j]
# == score[j, i]`) because here queries and keys are the same vectors; from notebook 03 on they
# will be different projections and the symmetry goes away.

# %%
plotting.plot_attention(scores, tokens, title="dot-product scores, inputs @ inputs.T")
plt.show()

# %% [markdown]
# ## 6. Batch dimensions
#
# Models process many sentences at once. A batch of `b` sentences of `T` tokens is a tensor of
# shape `(b, T, d)`. We want scores of shape `(b, T, T)`: one table per sentence.
#
# `.T` reverses **all** dimensions, which for a 3-D tensor is wrong: `(b, T, d).T` is `(d, T, b)`.
# What we need is to swap only the last two: `x.transpose(-2, -1)` (or `x.mT`), giving
# `(b, d, T)`. Then `@` multiplies the last two dimensions and treats the others as a batch.

# %%
batch = data.book_batch()  # (2, 6, 3): the sentence twice
print("batch.shape:", batch.shape)
print("batch.transpose(-2, -1).shape:", batch.transpose(-2, -1).shape)
batch_scores = batch @ batch.transpose(-2, -1)  # (2, 6, 3) @ (2, 3, 6) -> (2, 6, 6)
print("batch_scores.shape:", batch_scores.shape)
print("each sentence's table equals the one above:", torch.allclose(batch_scores[1], scores))

# %% [markdown]
# ### Exercise 3: `attention_scores`
#
# Write `attention_scores(inputs)` for `inputs` of shape `(..., T, d)`, where `...` is any number
# of batch dimensions (zero, one, or more). Return `(..., T, T)` with entry `[..., i, j]` equal to
# the dot product of token `i` and token `j` of the same sentence.

# %% grade_id="attention_scores"
def attention_scores(inputs):
    """All pairwise dot products: (..., T, d) -> (..., T, T)."""
    ### BEGIN SOLUTION
    return inputs @ inputs.transpose(-2, -1)
    ### END SOLUTION

# %% grade_id="test_attention_scores" points=3
checks.check_attention_scores(attention_scores)
### BEGIN HIDDEN TESTS
checks.check_attention_scores(attention_scores, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## Check your understanding
#
# Click a question to see the answer.
#
# <details><summary>1. <code>inputs</code> is <code>(4, 10, 64)</code>. What is the shape of <code>attention_scores(inputs)</code>?</summary>
#
# `(4, 10, 10)`: 4 sentences, each with a 10 × 10 table of scores. The embedding size 64 is
# summed away inside each dot product.
# </details>
#
# <details><summary>2. Why is <code>inputs @ inputs.T</code> wrong for a batch?</summary>
#
# `.T` reverses every dimension, so `(b, T, d)` becomes `(d, T, b)` and the product either fails
# or mixes sentences. Swap only the last two dimensions with `transpose(-2, -1)`.
# </details>
#
# <details><summary>3. Two embeddings point in opposite directions. What sign does their score have?</summary>
#
# Negative. Scores can be any real number, which is why the next notebook needs a normalisation
# that copes with negative values.
# </details>
#
# <details><summary>4. Predict the output: <code>x = torch.tensor([1., 2., 3.])</code>. What do <code>x * x</code>, <code>x @ x</code> and <code>(x * x).sum(dim=-1, keepdim=True)</code> print?</summary>
#
# `tensor([1., 4., 9.])`: `*` multiplies entry by entry and keeps the shape `(3,)`.
# `tensor(14.)`: `@` of two 1-D tensors is their dot product, a 0-dim tensor.
# `tensor([14.])`: the same sum, but `keepdim=True` keeps a dimension of size 1, shape `(1,)`.
# </details>
#
# <details><summary>5. Find the bug: a student writes <code>scores = inputs.T @ inputs</code> for the <code>(6, 3)</code> sentence. It runs without an error. What is wrong?</summary>
#
# The result is `(3, 6) @ (6, 3) -> (3, 3)`: one entry per pair of *dimensions*, summed over the
# tokens, instead of one per pair of tokens. The transpose is on the wrong side: `inputs @ inputs.T`
# is `(6, 6)`. Checking the shape against the one you expect, `(T, T)`, catches it at once.
# </details>

# %% [markdown]
# ## Recap
#
# - A sentence of `T` tokens is a `(T, d)` matrix; a batch is `(b, T, d)`.
# - The dot product of two tokens is their **attention score**: large when they point the same way.
# - Scores of one query against all tokens: `(T, d) @ (d,) -> (T,)`.
# - Scores of all pairs: `X @ X.transpose(-2, -1)`, `(..., T, d) -> (..., T, T)`.
#
# Scores are raw numbers of any size and sign. In notebook 02 we turn them into **weights** that
# are positive and sum to one, and use them to mix the tokens into context vectors.
