# %% [markdown]
# # 07 · FlashAttention from scratch
#
# Notebook 06 said that fused kernels "cut the matrix into tiles that stay in on-chip memory", and
# that this is why `F.scaled_dot_product_attention` never stores the `T x T` score matrix. This
# notebook shows **how** that is possible, and builds it. The key is a small change to the softmax of
# notebook 02: instead of looking at a whole row at once, it keeps a running maximum and a running
# sum, and **rescales** them each time a new block of scores arrives. That is the *online softmax*,
# and FlashAttention is attention built on it.
#
# **In this notebook you will**
# 1. see, number by number on the book's scores, why rescaling by `exp(m_old - m_new)` is exact, and
#    write the softmax that streams blocks of columns: `online_softmax`;
# 2. write FlashAttention-2's forward pass as a loop over tiles of queries and keys, which returns the
#    output and the log-sum-exp and skips the causal tiles wholly in the future: `flash_attention_forward`;
# 3. **measure** the peak memory of naive and tiled attention as `T` grows, compute where naive
#    attention stops fitting on a T4, an A100 and an H100, and count FLOPs against bytes moved
#    (arithmetic intensity), and what limits a real kernel beyond the bytes (the exponentials);
# 4. translate your loop into a **Triton** GPU kernel, with an unmasked stage and a masked diagonal
#    stage as production kernels do: `flash_attention_triton` (it runs in Triton's interpreter on a
#    CPU);
# 5. learn what the backward pass stores and what it recomputes.
#
# Shapes use these letters: `b` = batch size, `H` = number of heads, `T` = number of tokens,
# `D` = size of one head. Attention inputs are `(..., T, D)`: any batch dimensions in front.
# Tiles: `block_q` queries by `block_k` keys, written `Bq` and `Bk` in comments.
#
# How to work: fill in each cell that says `# YOUR CODE HERE`, run it, then run the check cell
# below it. A ✅ means your code agrees with ours on several inputs; a ❌ tells you what differs.

# %% setup=true

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from course_utils import bench, checks, data, flash, plotting

torch.manual_seed(123)
torch.set_num_threads(1)  # small tensors: one thread is as fast, and steady on a busy machine
print("torch", torch.__version__)

# %% [markdown]
# ## 0. The problem: a `T x T` matrix
#
# Here is causal attention as notebooks 03 and 04 taught it, for inputs `(..., T, D)`. Every line is
# fine; the problem is the shapes. `scores` and `weights` are `(..., T, T)`: their memory grows with
# the **square** of the sequence length.

# %%
def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention the direct way: (..., T, D) inputs, (..., T, D) output."""
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (..., T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # (T, T), True = hidden
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)  # (..., T, T)
    return weights @ v  # (..., T, D)


q, k, v = torch.randn(3, 2, 4, 8, 16).unbind(0)  # each (b=2, H=4, T=8, D=16)
print("agrees with SDPA:", torch.allclose(naive_attention(q, k, v),
                                          F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6))

# %% [markdown]
# For one layer of a 7B-parameter model (32 heads) and one sequence of 32,768 tokens, one score
# tensor in bfloat16 (2 bytes per number) is `32 * 32768^2 * 2` bytes:

# %%
print(f"{bench.score_matrix_bytes(1, 32, 32_768, torch.bfloat16) / 1e9:.0f} GB for one (1, 32, T, T) tensor")

# %% [markdown]
# The softmax makes a second tensor of the same size, the weights: together more than the 80 GB of
# an H100, for one layer, before anything else. Yet the output is only `(1, 32, 32768, 128)`, 268 MB.
# FlashAttention computes that output exactly while holding only a few small tiles of the score
# matrix at any time. To see how, we start with the softmax.

# %% [markdown]
# ## 1. The softmax, one block at a time
#
# Notebook 02's stable softmax of a row `x` is `exp(x - m) / l`, with `m = max(x)` and
# `l = sum(exp(x - m))`. Both `m` and `l` need the **whole** row. Can we compute them while the row
# streams past in blocks, seeing each block once?
#
# The maximum is easy: `m = max(m, max(block))`. The sum is the problem. Suppose the first blocks
# gave a maximum `m_old` and the sum `l_old = sum over those entries of exp(x_j - m_old)`. Then a block
# arrives with a larger entry, and the maximum becomes `m_new`. Every term already in `l_old` was
# computed against the wrong maximum. But
#
# $$e^{x_j - m_{old}} \cdot e^{m_{old} - m_{new}} = e^{x_j - m_{new}},$$
#
# so multiplying the **sum** by `alpha = exp(m_old - m_new)` fixes every one of its terms at once,
# without seeing them again:
#
# $$l_{new} = l_{old} \cdot e^{m_{old} - m_{new}} + \sum_{j \in \text{block}} e^{x_j - m_{new}}.$$
#
# This is exact: no approximation, only a different order of the same operations. And `alpha <= 1`,
# so nothing overflows.
#
# Let us follow it on the book's scores of "journey", streamed one score at a time (blocks of 1).

# %%
tokens = data.TOKENS
scores = data.book_inputs() @ data.book_inputs()[1]  # (6,): how well each token matches "journey"
print("scores:", scores)

m, l = torch.tensor(float("-inf")), torch.tensor(0.0)
print(f"{'token':>8s} {'score':>7s} {'m_old':>7s} {'m_new':>7s} {'alpha':>7s} {'l':>8s} {'direct sum':>10s}")
for i, x in enumerate(scores):
    m_new = torch.maximum(m, x)
    alpha = torch.exp(m - m_new)  # 0 on the first step: exp(-inf)
    l = l * alpha + torch.exp(x - m_new)
    direct = torch.exp(scores[: i + 1] - m_new).sum()  # what l must be: the sum so far, against m_new
    print(f"{tokens[i]:>8s} {x:7.4f} {m:7.4f} {m_new:7.4f} {alpha:7.4f} {l:8.5f} {direct:10.5f}")
    m = m_new

# %% [markdown]
# Read the "journey" row: the maximum grows from 0.9544 to 1.4950, so `alpha = exp(0.9544 - 1.4950) =
# 0.5824`, and the first term, `exp(0) = 1`, becomes `0.5824 = exp(0.9544 - 1.4950)`, exactly what
# it would have been against the new maximum. After that the maximum does not change, `alpha = 1`,
# and each new term is simply added. At every step `l` equals the direct sum.
#
# At the end, `m` and `l` are the maximum and the sum of the whole row, and a second pass writes
# `exp(x - m) / l`:

# %%
print("streamed:     ", torch.exp(scores - m) / l)
print("torch.softmax:", torch.softmax(scores, dim=-1))

# %% [markdown]
# ### Exercise 1: `online_softmax`
#
# Write `online_softmax(x, block_size)`: the softmax over the **last** dimension of `x`, shape
# `(..., n)`, computed by streaming blocks of `block_size` columns, `x[..., start:start + block_size]`
# (the last block may be shorter).
#
# - Keep, for every row, the running maximum `m` and sum `l`, shape `(..., 1)`: start with `-inf`
#   and `0`.
# - For each block: the new maximum `m_new`; then `l = l * exp(m - m_new) + sum(exp(block - m_new))`.
# - After the last block, return `exp(x - m) / l`, shape `(..., n)`.
#
# One trap: `-inf` entries (masked scores) are allowed. If a row's first block is all `-inf`, then
# `m_new = -inf` and `m - m_new = -inf - (-inf) = NaN`. Subtract `0` instead of `m_new` while
# `m_new` is still `-inf` (`torch.where`): `exp(-inf - 0) = 0` is the right contribution.
#
# **Rules** (the check and the grader apply them): write an explicit loop over the blocks, and never
# reduce a whole row at once; `softmax`, `log_softmax`, `softmin` and `logsumexp` (from `torch`, `F`
# or `nn`) are not allowed here.

# %% grade_id="online_softmax"
def online_softmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Softmax over the last dimension of x (..., n), streaming blocks of block_size columns."""
    ### BEGIN SOLUTION
    m = torch.full(x.shape[:-1] + (1,), float("-inf"), dtype=x.dtype, device=x.device)  # (..., 1)
    l = torch.zeros_like(m)  # (..., 1)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]  # (..., B)
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))  # (..., 1)
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # 0 while the row is all -inf
        l = l * torch.exp(m - shift) + torch.exp(block - shift).sum(dim=-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l  # (..., n)
    ### END SOLUTION

# %% grade_id="test_online_softmax" points=3
# Check: the book's scores, scores in the 1000s, a first block of -inf, a batch, and streaming.
checks.check_online_softmax(online_softmax)
### BEGIN HIDDEN TESTS
checks.check_online_softmax(online_softmax, hidden=True)
### END HIDDEN TESTS

# %%
print(online_softmax(scores, block_size=4))

# %% [markdown]
# ## 2. From the softmax to attention: tiles
#
# Attention's output for query `i` is a weighted sum of value rows, `o_i = sum_j p_ij v_j` with
# `p_ij = exp(s_ij - m_i) / l_i`. The division by `l_i` can wait until the end: keep the
# **unnormalised** sum `acc_i = sum_j exp(s_ij - m_i) v_j`. It is a sum of terms computed against the
# running maximum, exactly like `l`, so it is rescaled by the same `alpha` when the maximum grows:
#
# $$acc_{new} = \alpha \cdot acc_{old} + \sum_{j \in \text{block}} e^{s_{ij} - m_{new}} v_j,
# \qquad o_i = acc_i / l_i \text{ at the end.}$$
#
# FlashAttention-2 organises the work in **tiles**:
#
# - the outer loop takes a block of `block_q` queries, `q_blk` `(..., Bq, D)`, with its own `m`, `l`
#   `(..., Bq)` and `acc` `(..., Bq, D)`;
# - the inner loop streams blocks of `block_k` keys and values past it: one tile of scores
#   `q_blk @ k_blk^T` `(..., Bq, Bk)` at a time, never the whole row;
# - at the end of the inner loop the query block's output rows are final: `acc / l`.
#
# On a GPU, one block of queries is one *program* (a group of threads), and the tiles live in its
# fast on-chip memory (SRAM); only `Q`, `K`, `V` and the output travel to and from the large, slow
# memory (HBM). We write the same loop in plain PyTorch first.
#
# **Causal tiles.** With a causal mask, query `i` sees keys `0..i`. A tile whose first key comes after
# the block's last query is wholly in the future: every entry would be masked. FlashAttention does not
# compute and mask such a tile; it **skips** it, which halves the work for long sequences. Only the
# tiles that cross the diagonal need a mask. The picture for `T = 40`, `block_q = 8`, `block_k = 16`:

# %%
grid = flash.causal_block_grid(40, block_q=8, block_k=16)  # (5 query blocks, 3 key blocks)
fig, ax = plt.subplots(figsize=(4.2, 4.2))
ax.imshow(grid, cmap=plt.matplotlib.colors.ListedColormap(["white", "#f4a261", "#2a9d8f"]), vmin=0, vmax=2)
for (i, j), value in zip(torch.cartesian_prod(torch.arange(grid.shape[0]), torch.arange(grid.shape[1])).tolist(),
                         grid.flatten().tolist()):
    ax.text(j, i, ["skipped", "masked", "computed"][value], ha="center", va="center", fontsize=8)
ax.set_xticks(range(grid.shape[1]), [f"keys {16 * j}-{min(16 * j + 15, 39)}" for j in range(grid.shape[1])],
              rotation=30)
ax.set_yticks(range(grid.shape[0]), [f"queries {8 * i}-{8 * i + 7}" for i in range(grid.shape[0])])
ax.set_title("causal tiles, T=40: what the kernel does")
fig.tight_layout()
plt.show()
print(f"{int((grid == 0).sum())} of {grid.numel()} tiles skipped, {int((grid == 1).sum())} masked")

# %% [markdown]
# The inner loop for a query block that ends at `q_end` therefore runs over key blocks starting at
# `0, block_k, 2 * block_k, ...` **below `q_end`**, not below `T`. In a tile that crosses the diagonal,
# build the mask from positions: `cols > rows`, with `rows = arange(q_start, q_end)[:, None]` and
# `cols = arange(k_start, k_end)[None, :]`: a `(Bq, Bk)` mask, not a `(T, T)` one.
#
# **The log-sum-exp.** The function also returns, for every query, `lse_i = m_i + log(l_i) =
# log(sum_j exp(s_ij))`. It is one number per query, and it is all the backward pass needs to
# rebuild the attention weights later (section 6): `p_ij = exp(s_ij - lse_i)`.

# %% [markdown]
# ### Exercise 2: `flash_attention_forward`
#
# Write `flash_attention_forward(q, k, v, block_q, block_k, causal=True)`:
#
# - `q`, `k`, `v` have shape `(..., T, D)`; return `(out, lse)` with `out` `(..., T, D)` and
#   `lse` `(..., T)`;
# - the scores are scaled by `1/sqrt(D)` (scale `q_blk` once per query block);
# - loop over query blocks of `block_q` and, inside, over key/value blocks of `block_k` (the last block
#   of each may be shorter when `T` is not a multiple);
# - keep `m`, `l` `(..., Bq)` and `acc` `(..., Bq, D)` in **float32** (float64 if the inputs are
#   float64: `torch.promote_types(q.dtype, torch.float32)`), whatever the inputs' dtype: in bfloat16
#   a long running sum loses its last terms. Compute each tile in that dtype too;
# - for each tile: scores, (mask), new maximum, `alpha`, `p = exp(s - m_new[..., None])`, then update
#   `l` and `acc`;
# - when `causal`: skip the key blocks that start at or after `q_end`, and mask `cols > rows` in the
#   tiles that cross the diagonal;
# - write `acc / l[..., None]` into the output rows (in `q.dtype`), and `m + log(l)` into `lse` (in
#   the float32 of the statistics). You may allocate `out` and `lse` first (`q.new_empty(...)`) and
#   fill them slice by slice.
#
# **Rules** (the check and the grader apply them): loop over the tiles yourself, with explicit `for`
# loops; `softmax`, `log_softmax`, `logsumexp`, `F.scaled_dot_product_attention`, `flex_attention`,
# `nn.MultiheadAttention` and `F.multi_head_attention_forward` are not allowed here.
#
# The check compares `out` and `lse` with attention's for several shapes and block sizes, watches
# every tensor your code makes (no `(T, T)` tensor allowed, not even a mask; it names the line that
# made one) and counts the scores you compute (the future tiles must be skipped).

# %% grade_id="flash_attention_forward"
def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_q: int, block_k: int,
                            causal: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled attention: (..., T, D) inputs; returns out (..., T, D) and the log-sum-exp lse (..., T)."""
    ### BEGIN SOLUTION
    T, D = q.shape[-2], q.shape[-1]
    stats = torch.promote_types(q.dtype, torch.float32)  # m, l and acc: float32 at least
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))  # (..., T, D)
    lse = q.new_empty(q.shape[:-1], dtype=stats)  # (..., T)
    for q_start in range(0, T, block_q):
        q_end = min(q_start + block_q, T)
        q_blk = q[..., q_start:q_end, :].to(stats) / math.sqrt(D)  # (..., Bq, D)
        m = torch.full(q_blk.shape[:-1], float("-inf"), dtype=stats, device=q.device)  # (..., Bq)
        l = torch.zeros_like(m)  # (..., Bq)
        acc = torch.zeros(q_blk.shape[:-1] + (v.shape[-1],), dtype=stats, device=q.device)  # (..., Bq, D)
        for k_start in range(0, q_end if causal else T, block_k):  # causal: later key blocks are all future
            k_end = min(k_start + block_k, T)
            s = q_blk @ k[..., k_start:k_end, :].to(stats).transpose(-2, -1)  # (..., Bq, Bk)
            if causal and k_end - 1 > q_start:  # this tile crosses the diagonal
                rows = torch.arange(q_start, q_end, device=q.device)[:, None]  # (Bq, 1)
                cols = torch.arange(k_start, k_end, device=q.device)[None, :]  # (1, Bk)
                s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))  # (..., Bq)
            alpha = torch.exp(m - m_new)  # (..., Bq)
            p = torch.exp(s - m_new[..., None])  # (..., Bq, Bk)
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ v[..., k_start:k_end, :].to(stats)  # (..., Bq, D)
            m = m_new
        out[..., q_start:q_end, :] = (acc / l[..., None]).to(q.dtype)
        lse[..., q_start:q_end] = m + torch.log(l)
    return out, lse
    ### END SOLUTION

# %% grade_id="test_flash_attention_forward" points=5
# Check: out and lse against attention, T not a multiple of the blocks, no (T, T) tensor, skipped tiles.
checks.check_flash_attention_forward(flash_attention_forward)
### BEGIN HIDDEN TESTS
checks.check_flash_attention_forward(flash_attention_forward, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Your function against PyTorch's fused kernel, for a few block sizes, `T` not a multiple of them:

# %%
q, k, v = torch.randn(3, 2, 4, 50, 16).unbind(0)  # each (b=2, H=4, T=50, D=16)
expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (2, 4, 50, 16)
for block_q, block_k in [(8, 8), (16, 32), (50, 7), (64, 64)]:
    out, lse = flash_attention_forward(q, k, v, block_q, block_k)
    print(f"block_q={block_q:2d}, block_k={block_k:2d}: equal to SDPA within 1e-6: "
          f"{torch.allclose(out, expected, atol=1e-6, rtol=0)}, lse shape {tuple(lse.shape)}")

# %% [markdown]
# The block sizes change the order of the additions, so the results differ in the last bits of a
# float32 (about `1e-7`), never more. On a GPU, the block sizes are chosen so that a tile fits in a
# program's on-chip memory; here they only change how many small matrix products run.

# %% [markdown]
# ## 3. The memory lesson, measured
#
# PyTorch counts peak memory on a GPU (`torch.cuda.max_memory_allocated`), not on a CPU. So we count it
# ourselves: `flash.measure_peak_memory(fn, ...)` watches every tensor that `fn` makes (the same
# machinery the check used to find `(T, T)` tensors), adds up their bytes while they are alive, and
# returns the most held at once. The inputs are not counted; the output is.
#
# One sequence, 4 heads of size 64, float32, `T` from 256 to 2048. The tiled version uses tiles of
# 128 x 128. (While a notebook is graded, this sweep is skipped: `flash.grading()`.)

# %%
def peak_memory_sweep(seq_lens: list[int], heads: int = 4, head_dim: int = 64) -> dict[str, list[int]]:
    """Measured peak bytes of naive and tiled attention, for inputs (1, heads, T, head_dim)."""
    peaks: dict[str, list[int]] = {"naive": [], "tiled (yours)": []}
    for T in seq_lens:
        q, k, v = torch.randn(3, 1, heads, T, head_dim).unbind(0)  # each (1, H, T, D)
        peaks["naive"].append(flash.measure_peak_memory(naive_attention, q, k, v))
        peaks["tiled (yours)"].append(flash.measure_peak_memory(flash_attention_forward, q, k, v, 128, 128))
    return peaks


SEQ_LENS = [256, 512, 1024, 2048]
peaks = None  # stays None while grading
if flash.grading():
    print("skipped while grading")
else:
    peaks = peak_memory_sweep(SEQ_LENS)
    print(plotting.format_peaks(SEQ_LENS, peaks))

# %%
if peaks is not None:
    plotting.plot_peaks(SEQ_LENS, peaks, ylabel="peak tensor memory (MiB)",
                        title="measured on the CPU: naive grows like T², tiled like T",
                        reference=([2 * 4 * T * T * 4 for T in SEQ_LENS], "two (1, 4, T, T) float32 tensors"))
    plt.show()

# %% [markdown]
# Doubling `T` multiplies the naive peak by 4. The peak divided by the size of one `(1, 4, T, T)`
# float32 tensor says how many of them are alive at once:

# %%
if peaks is not None:
    for T, b in zip(SEQ_LENS, peaks["naive"]):
        print(f"T={T}: naive peak = {b / (4 * T * T * 4):.2f} float32 tensors of shape (1, 4, T, T)")

# %% [markdown]
# Three: the scores, the masked scores (`masked_fill` returns a copy) and the weights, plus the
# `(T, T)` boolean mask.
#
# The tiled peak grows more slowly than `T` at these sizes. Only part of it depends on `T`: the output
# `(1, 4, T, 64)` and `lse` `(1, 4, T)`, in float32 `4 * T * (64 + 1) * 4` bytes, which doubles with
# `T`. The rest is a fixed set of `(1, 4, 128, 128)` tiles (scores, `p`, a mask) and the `(1, 4, 128,
# 64)` accumulator, the same at every `T`:

# %%
if peaks is not None:
    for T, b in zip(SEQ_LENS, peaks["tiled (yours)"]):
        grows = 4 * T * (64 + 1) * 4  # out (1, 4, T, 64) and lse (1, 4, T), float32
        print(f"T={T:4d}: tiled peak {b / 2**20:.1f} MiB = output and lse {grows / 2**20:.2f} MiB "
              f"+ tiles {(b - grows) / 2**20:.2f} MiB")

# %% [markdown]
# For long sequences the output dominates and the tiled peak grows like `T`, while the naive one grows
# like `T^2`: their ratio grows like `T`.
#
# **Where does naive attention stop fitting?** Even a careful naive implementation holds two
# `(b, H, T, T)` tensors at once: the scores and the weights. In training, the weights of **every**
# layer are also kept for the backward pass, but even one layer in inference hits a wall. For a model
# with 32 heads in bfloat16, the largest `T` at which two such tensors fit in the whole memory of each
# GPU (nothing else in it). A T4 (compute capability 7.5) has no bfloat16: there the model runs in
# float16, also 2 bytes per number, so the limit is the same.

# %%
gpus = [("T4", 16e9, torch.float16), ("A100 40GB", 40e9, torch.bfloat16), ("A100 80GB", 80e9, torch.bfloat16),
        ("H100", 80e9, torch.bfloat16)]
print(f"{'GPU':10s} {'memory':>7s} {'dtype':>9s} {'batch 1':>9s} {'batch 8':>9s}   (largest T, naive, 32 heads)")
for name, memory, dtype in gpus:
    t1 = bench.max_seq_len_for_scores(memory, 1, 32, dtype, copies=2)
    t8 = bench.max_seq_len_for_scores(memory, 8, 32, dtype, copies=2)
    print(f"{name:10s} {memory / 1e9:5.0f} GB {str(dtype).removeprefix('torch.'):>9s} {t1:9,d} {t8:9,d}")

# %% [markdown]
# So a T4 runs out near 11,000 tokens for a single sequence (in float16), a 40 GB A100 near 17,700,
# and an 80 GB A100 or H100 at 25,000 (in bfloat16); with a batch of 8, at lengths `sqrt(8) = 2.8` times shorter. Tiled
# attention needs `Q`, `K`, `V`, the output and `lse`, about `4 * T * D * H` numbers: at `D = 128`
# that is 32 KB per token for 32 heads, so an 80 GB card would hold millions of tokens for the
# attention itself (the KV cache and the weights run out first; notebook 08).

# %% [markdown]
# ## 4. FLOPs against bytes: why tiling makes attention fast
#
# Memory size is half the story; memory **traffic** is the other. A GPU computes much faster than it
# reads memory. The ratio that decides which one limits a kernel is its **arithmetic intensity**:
# FLOPs done per byte moved between the large memory (HBM) and the chip.
#
# For one head, non-causal, `T` tokens, head size `D`, 2-byte numbers:
#
# - both implementations do the same matrix products: `Q K^T` and `P V`, `2 * T * T * D` FLOPs each;
# - **naive** writes the scores `S` to memory, reads them for the softmax, writes `P`, and reads `P`
#   again for `P V`: four trips of `T * T` numbers, plus reading `Q`, `K`, `V` and writing `O`;
# - **tiled** reads a block of `Q` once and writes its output once; for each of the `T / Bq` query
#   blocks it reads all of `K` and `V`. Scores never leave the chip.
#
# This is a simple **traffic model**, and an upper bound on the bytes: it assumes that every query
# block fetches `K` and `V` from HBM again, ignoring the GPU's L2 cache. We come back to that below.

# %%
def intensity(T: int, D: int, block_q: int | None = None, element_bytes: int = 2) -> tuple[float, float]:
    """(FLOPs, bytes moved) of one attention head, naive (block_q=None) or tiled."""
    flops = 2 * (2 * T * T * D)  # Q K^T and P V
    if block_q is None:
        numbers = 4 * T * T + 4 * T * D  # S written and read, P written and read; Q, K, V read, O written
    else:
        numbers = 2 * T * D + math.ceil(T / block_q) * 2 * T * D  # Q read, O written; K and V once per query block
    return flops, numbers * element_bytes


T_demo, D_demo = 4096, 64
print(f"one head, T={T_demo}, D={D_demo}, bf16")
for label, block_q in (("naive", None), ("tiled, block_q=64", 64), ("tiled, block_q=128", 128),
                       ("tiled, block_q=256", 256)):
    flops, moved = intensity(T_demo, D_demo, block_q)
    print(f"  {label:20s} {flops / 1e9:6.2f} GFLOP  {moved / 1e6:7.1f} MB  -> {flops / moved:6.1f} FLOP/byte")
print("ridge points (peak FLOP/s divided by bandwidth): below it a kernel waits for memory")
for key in ("T4", "A100", "H100"):
    spec = bench.GPU_SPECS[key]
    print(f"  {spec.name:14s} {spec.tensor_16bit_tflops * 1e12 / (spec.bandwidth_gbs * 1e9):6.1f} FLOP/byte")

# %% [markdown]
# Naive attention does about `D / 2` FLOPs per byte whatever `T` is: 32 here, far below the ridge
# point of every GPU in the list (a T4's is 203, an A100's 153, an H100's 295). It is
# **memory-bound**: the tensor cores sit idle while `S` and `P` travel to memory and back.
#
# Tiling removes the `T x T` traffic. What remains in the model is reading `K` and `V` once per query
# block, so the intensity becomes `T * block_q / (T + block_q)`, a little under `block_q` FLOPs per
# byte, whatever `D` is: the larger the tile that fits on the chip, the better. At `block_q = 128` it
# is 124 FLOP/byte, four times the naive one but still **below** every ridge point in the list, so by
# this model the kernel would still wait for memory, even on an H100. At 256 it is 241: past the
# ridge of a T4 and an A100, still below an H100's.
#
# **The L2 cache changes the picture.** `K` and `V` of one (batch, head) at `T = 4096`, `D = 64` in
# bfloat16 are `2 * 4096 * 64 * 2` bytes = 1 MiB, and an H100 has 50 MB of L2. The query blocks of
# the same head run at about the same time and read the same `K` and `V`, so most of those reads hit
# L2 instead of HBM. At best HBM sees `Q`, `K`, `V` and `O` once: `4 * T * D` numbers, `T / 2 = 2048`
# FLOPs per byte here, far past every ridge. The real traffic lies between the two counts, so the
# model's intensity is a **lower bound** (its bytes an upper bound), and real FlashAttention kernels
# are limited by compute, not by HBM. The roofline, with the model's points:

# %%
spec = bench.GPU_SPECS["H100"]
ridge = spec.tensor_16bit_tflops * 1e12 / (spec.bandwidth_gbs * 1e9)
xs = torch.logspace(0, 4, 100)
fig, ax = plt.subplots(figsize=(6, 4))
ax.plot(xs, torch.clamp(xs * spec.bandwidth_gbs / 1e3, max=spec.tensor_16bit_tflops), color="black",
        label=f"{spec.name} roofline")
for label, block_q, color in (("naive", None, "#e76f51"), ("tiled, block_q=128", 128, "#8ab17d"),
                              ("tiled, block_q=256", 256, "#2a9d8f")):
    flops, moved = intensity(T_demo, D_demo, block_q)
    reach = min(flops / moved * spec.bandwidth_gbs / 1e3, spec.tensor_16bit_tflops)
    ax.scatter([flops / moved], [reach], color=color, zorder=3, label=f"{label}: {flops / moved:.0f} FLOP/byte")
ax.axvline(ridge, color="gray", linestyle=":", label=f"ridge point {ridge:.0f} FLOP/byte")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("arithmetic intensity (FLOP/byte)")
ax.set_ylabel("attainable TFLOP/s")
ax.set_title("traffic model (no L2): memory-bound left of the ridge")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Compute-bound is not the end: the exponentials.** The tensor cores do only the two matrix
# products. Every score also needs one `exp` (plus a maximum, a sum and the rescaling), and `exp` runs
# on the much slower special-function units: an H100 does about 989 TFLOP/s of bf16 matrix products
# but only about 3.9 T exponentials per second (the FlashAttention-3 paper's figures). Per score,
# the products cost `4 * D` FLOPs and the softmax one `exp`:

# %%
TENSOR_TFLOPS, EXP_PER_S = 989e12, 3.9e12  # H100 SXM: dense bf16 matrix products, exponentials (FA3 paper)
for D in (64, 128, 256):
    matmul_s = 4 * D / TENSOR_TFLOPS  # seconds per score in the two products
    exp_s = 1 / EXP_PER_S  # seconds per score in its exp
    print(f"D={D:3d}: the exponentials take {exp_s / matmul_s:4.0%} of the products' time; if they do not "
          f"overlap, at most {matmul_s / (matmul_s + exp_s):4.0%} of the tensor cores' peak")

# %% [markdown]
# At `D = 64` the exponentials take as long as the products. In FlashAttention-2 the softmax of a
# tile waits for its product and the next product waits for the softmax, so the two do not overlap:
# it reaches only about 35 % of an H100's peak in the forward pass. That is the motivation of
# FlashAttention-3: overlap the softmax of one tile with the matrix products of the next (warp
# specialisation, asynchronous tensor cores), and it reaches about 75 %. Bytes first, then the
# exponentials: both limits are real.

# %% [markdown]
# ## 5. The same kernel in Triton
#
# [Triton](https://triton-lang.org) writes GPU kernels in Python. A kernel is a function decorated with
# `@triton.jit`; it is launched on a **grid** of programs, and each program works on blocks of numbers
# with `tl.load`, `tl.dot`, `tl.exp`, `tl.where` and `tl.store`. Our grid is `(number of query blocks,
# b * H)`: program `(i, bh)` computes the output rows of query block `i` for one (batch, head), exactly
# the body of your outer loop. Its tiles stay in the program's registers and shared memory.
#
# Without a GPU, `TRITON_INTERPRET=1` makes Triton run kernels in its **interpreter**: in Python, with
# NumPy, on the CPU. Slow (use small sizes), but the same code and the same results.
# `flash.use_interpreter_without_gpu()` sets it where there is no GPU. Triton runs on Linux (Colab
# included, where it comes with PyTorch); the course's set-up installs it there. Where it is missing,
# the next cell says so and prints the one command that installs it; Triton has no macOS or Windows
# build, so there use Colab for this section.

# %%
flash.use_interpreter_without_gpu()  # no GPU: TRITON_INTERPRET=1, before any kernel is defined
triton, tl = flash.import_triton()  # without Triton: stand-ins that let the next cell define the kernel
TRITON_RUNS, TRITON_HOW = flash.triton_status()
print("Triton:", TRITON_HOW)

# %% [markdown]
# ### Exercise 3: `flash_attention_triton`
#
# Translate the inner loop of your `flash_attention_forward` into the kernel below. One program is one
# iteration of your outer loop: query block `start_m`, for one (batch, head) `bh`. The kernel gives
# you the loop state, as it is when the loop over key blocks starts:
#
# | in the kernel | shape, dtype | in your Python loop |
# |---|---|---|
# | `offs_m` | `(BLOCK_M,)` int | `rows = arange(q_start, q_end)` (global positions, possibly past `T`) |
# | `q` | `(BLOCK_M, HEAD_DIM)` | `q_blk`, already loaded, **not** scaled: multiply the scores by `scale` |
# | `m_i`, `l_i` | `(BLOCK_M,)` float32 | `m`, `l` |
# | `acc` | `(BLOCK_M, HEAD_DIM)` float32 | `acc` |
# | `offs_n`, `offs_d` | `tl.arange(0, BLOCK_N)`, `tl.arange(0, HEAD_DIM)` | |
#
# After your code, the kernel divides `acc` by `l_i` and stores the output and `m_i + log(l_i)` (the
# natural log, as in your loop). Write the loop over key blocks, `start_n` in steps of `BLOCK_N`, in
# **two stages**, as section 2 taught and as production kernels do:
#
# 1. **the unmasked stage:** the key blocks that no query of this block can see past. When `CAUSAL`,
#    those wholly before the block's first query: `start_n` from 0 to `lo = (start_m * BLOCK_M) //
#    BLOCK_N * BLOCK_N`. When not, every full block: up to `lo = T // BLOCK_N * BLOCK_N`. No mask at
#    all, not even on the loads;
# 2. **the diagonal stage:** the rest, from `lo` to `hi` (`tl.minimum((start_m + 1) * BLOCK_M, T)` when
#    `CAUSAL`, else `T`). These blocks cross the diagonal or the end of the sequence: mask the loads of
#    key positions `>= T` (`other=0.0`), and in the scores keep only keys `< T` and, when `CAUSAL`,
#    not after the query. Use the global positions `start_n + offs_n` and `offs_m`, not tile-local
#    ones.
#
# Python to Triton: a slice `k[..., a:b, :]` is `tl.load` of pointers, built like the load of `q` in
# the kernel (`K + bh * stride_kb + cols[:, None] * stride_kt + offs_d[None, :]`); `a @ b.T` is
# `tl.dot(a, tl.trans(b))` (the shapes must match: `(BLOCK_M, HEAD_DIM)` by `(HEAD_DIM, BLOCK_N)`);
# `x.amax(-1)` is `tl.max(x, 1)`; `masked_fill` is `tl.where`; `torch.exp` is `tl.exp`. Give
# `tl.dot` operands of one dtype: `p.to(v.dtype)`. The update itself (`m_new`, `alpha`, `p`, `l`,
# `acc`) is your Python loop's, line for line; it appears in both stages (production kernels put it in
# one `@triton.jit` helper called twice, with a flag that says whether to mask).
#
# The host side (allocating the outputs, strides, the grid) is `flash.launch(kernel, q, k, v, causal,
# block_m, block_n)`. The check launches your kernel with tiles of different sizes (`BLOCK_M`,
# `BLOCK_N` and `HEAD_DIM` not all equal) and `T` not a multiple of them, causal or not.

# %% grade_id="flash_attention_triton"
@triton.jit
def flash_attention_triton(Q, K, V, O, LSE, stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt,
                           stride_ob, stride_ot, T, scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m = tl.program_id(0)  # which block of queries
    bh = tl.program_id(1)  # which (batch, head)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
    offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    offs_d = tl.arange(0, HEAD_DIM)  # (HEAD_DIM,)
    q = tl.load(Q + bh * stride_qb + offs_m[:, None] * stride_qt + offs_d[None, :],
                mask=offs_m[:, None] < T, other=0.0)  # (BLOCK_M, HEAD_DIM)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running maximum
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # unnormalised output
    ### BEGIN SOLUTION
    if CAUSAL:
        lo = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N  # key blocks before lo end before the first query
        hi = tl.minimum((start_m + 1) * BLOCK_M, T)  # key blocks from hi on are wholly in the future
    else:
        lo = T // BLOCK_N * BLOCK_N  # the full key blocks
        hi = T
    for start_n in range(0, lo, BLOCK_N):  # stage 1: no mask
        cols = start_n + offs_n  # (BLOCK_N,) key positions
        k = tl.load(K + bh * stride_kb + cols[:, None] * stride_kt + offs_d[None, :])  # (BLOCK_N, HEAD_DIM)
        v = tl.load(V + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :])  # (BLOCK_N, HEAD_DIM)
        s = tl.dot(q, tl.trans(k)) * scale  # (BLOCK_M, BLOCK_N)
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,)
        alpha = tl.exp(m_i - m_new)  # (BLOCK_M,)
        p = tl.exp(s - m_new[:, None])  # (BLOCK_M, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    for start_n in range(lo, hi, BLOCK_N):  # stage 2: the diagonal blocks (and the block past T), masked
        cols = start_n + offs_n  # (BLOCK_N,) key positions
        k = tl.load(K + bh * stride_kb + cols[:, None] * stride_kt + offs_d[None, :],
                    mask=cols[:, None] < T, other=0.0)  # (BLOCK_N, HEAD_DIM)
        v = tl.load(V + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :],
                    mask=cols[:, None] < T, other=0.0)  # (BLOCK_N, HEAD_DIM)
        s = tl.dot(q, tl.trans(k)) * scale  # (BLOCK_M, BLOCK_N)
        keep = cols[None, :] < T  # (1, BLOCK_N): keys past the end of the sequence are padding
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])  # (BLOCK_M, BLOCK_N)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,)
        alpha = tl.exp(m_i - m_new)  # (BLOCK_M,)
        p = tl.exp(s - m_new[:, None])  # (BLOCK_M, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    ### END SOLUTION
    acc = acc / l_i[:, None]
    tl.store(O + bh * stride_ob + offs_m[:, None] * stride_ot + offs_d[None, :], acc.to(O.dtype.element_ty),
             mask=offs_m[:, None] < T)
    tl.store(LSE + bh * T + offs_m, m_i + tl.log(l_i), mask=offs_m < T)

# %% grade_id="test_flash_attention_triton" points=4
# Check: your kernel, launched with flash.launch, against attention (out and lse), causal or not.
checks.check_flash_attention_triton(flash_attention_triton)
### BEGIN HIDDEN TESTS
checks.check_flash_attention_triton(flash_attention_triton, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Your kernel next to your Python loop and SDPA (in the interpreter, a tiny size: it runs each program
# in Python):

# %%
if TRITON_RUNS:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = torch.randn(3, 1, 2, 40, 16, device=device).unbind(0)  # each (1, 2, 40, 16)
    out_triton, lse_triton = flash.launch(flash_attention_triton, q, k, v, causal=True, block_m=16, block_n=16)
    out_python, lse_python = flash_attention_forward(q, k, v, 16, 16)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    tol = 5e-3 if device == "cuda" else 1e-5  # compiled, float32 products use TF32 tensor cores
    print(f"Triton equals SDPA within {tol:g}:     ", torch.allclose(out_triton, expected, atol=tol, rtol=0))
    print(f"Triton equals your loop within {tol:g}:", torch.allclose(out_triton, out_python, atol=tol, rtol=0),
          "(lse too:", torch.allclose(lse_triton, lse_python, atol=tol, rtol=0), ")")
else:
    print("skipped:", TRITON_HOW)

# %% [markdown]
# On a GPU the kernel is compiled, and we can time it against SDPA (which picks its own flash kernel),
# causal, forward only, with `bench.time_fn` (warm-up, CUDA events, median), in bfloat16, or in
# float16 on a GPU older than compute capability 8.0 (a T4, Colab's free GPU, has no bfloat16). The
# FLOPs of causal attention are half of `4 * b * H * T^2 * D` (notebook 06). Triton already
# pipelines the loads of a loop for us (`num_stages`: the next `K`/`V` block is fetched while the
# current one is computed), but our kernel lacks the other tricks of production kernels: `exp2` with
# `log2(e)` folded into the scale, block sizes, warps and stages tuned per GPU, and (FlashAttention-3)
# the softmax overlapped with the matrix products. Expect it within a small factor of SDPA, not equal
# to it.

# %% tags=["nbval-ignore-output"]
if TRITON_RUNS and torch.cuda.is_available():
    B, H, D = 4, 16, 64
    dtype = torch.bfloat16 if torch.cuda.get_device_capability() >= (8, 0) else torch.float16
    if dtype == torch.float16:
        print("this GPU is older than compute capability 8.0 (no bfloat16): timing in float16")
    peak = bench.peak_tflops("cuda", dtype)
    print(f"{'T':>6s} {'Triton ms':>10s} {'SDPA ms':>8s} {'Triton TFLOP/s':>15s} {'% of peak':>9s} {'SDPA TFLOP/s':>13s}")
    for T in (1024, 2048, 4096):
        q, k, v = torch.randn(3, B, H, T, D, device="cuda", dtype=dtype).unbind(0)
        flops = 4 * B * H * T * T * D // 2  # causal: half the tiles
        ours = bench.time_fn(lambda: flash.launch(flash_attention_triton, q, k, v, True, 128, 64), device="cuda")
        sdpa = bench.time_fn(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device="cuda")
        ours_tf, sdpa_tf = bench.tflops_per_s(flops, ours.median_s), bench.tflops_per_s(flops, sdpa.median_s)
        share = bench.percent_of_peak(ours_tf, peak)
        print(f"{T:6d} {ours.median_ms:10.3f} {sdpa.median_ms:8.3f} {ours_tf:15.1f} "
              f"{'?' if share is None else f'{share:.0f}%':>9s} {sdpa_tf:13.1f}")
else:
    print("timing skipped: it needs a CUDA GPU (the interpreter is far too slow to time)")

# %% [markdown]
# ## 6. The backward pass, in words
#
# Training needs gradients with respect to `Q`, `K` and `V`. They need the attention weights `P`.
# Naive attention keeps `P`, `(b, H, T, T)`, from the forward pass: the `T^2` memory again, per layer.
#
# FlashAttention keeps only the output `O` and the log-sum-exp `lse`, one number per query. In the
# backward pass it walks the same tiles again and **recomputes** each tile of scores `S = Q K^T / sqrt(D)`
# from `Q` and `K`, and the weights from them in one step, `P = exp(S - lse)`: no maximum and no sum
# to redo, because `lse` already holds both. With `dO`, the gradient of the output, and one more
# number per query, `delta_i = sum_d dO_id O_id`, each tile gives its share of the gradients:
# `dV += P^T dO`, `dP = dO V^T`, `dS = P * (dP - delta)`, `dQ += dS K / sqrt(D)`, `dK += dS^T Q / sqrt(D)`.
#
# Recomputing costs extra FLOPs (the score tiles are computed twice), yet the backward is **faster**,
# because it avoids reading a `T x T` tensor from memory: the trade from section 4 again, FLOPs for
# bytes. The memory each one keeps for the backward, per head, in bfloat16:

# %%
Ts = [1024, 2048, 4096, 8192, 16384, 32768]
D_bwd = 128
saved_naive = [T * T * 2 for T in Ts]  # P: (T, T)
saved_flash = [T * D_bwd * 2 + T * 4 for T in Ts]  # O: (T, D) in bf16, and lse: (T,) in float32
fig, ax = plt.subplots(figsize=(6, 4))
ax.plot(Ts, [b / 2**20 for b in saved_naive], "o-", color="#e76f51", label="naive: the weights P (T x T)")
ax.plot(Ts, [b / 2**20 for b in saved_flash], "o-", color="#2a9d8f", label="FlashAttention: O and lse")
ax.set_xscale("log", base=2)
ax.set_yscale("log", base=2)
ax.set_xlabel("sequence length T")
ax.set_ylabel("MiB kept for the backward, per head")
ax.set_title("what the forward pass leaves for the backward (D=128, bf16)")
ax.legend()
fig.tight_layout()
plt.show()
print(f"T={Ts[-1]}: naive keeps {saved_naive[-1] / 2**20:,.0f} MiB per head, FlashAttention "
      f"{saved_flash[-1] / 2**20:.1f} MiB")

# %% [markdown]
# ## Check your understanding
#
# Click a question to see the answer.
#
# <details><summary>1. The running maximum grows from 2 to 5. By what factor is the running sum multiplied, and why is that exact?</summary>
#
# By `alpha = exp(2 - 5) = exp(-3) ≈ 0.0498`. Each term of the sum was `exp(x_j - 2)`; multiplied by
# `exp(2 - 5)` it becomes `exp(x_j - 5)`, exactly the term against the new maximum. Rescaling the sum
# rescales all its terms at once, so nothing needs to be seen twice.
# </details>
#
# <details><summary>2. In FlashAttention, which quantities are rescaled by alpha, and which one is not?</summary>
#
# The running sum `l` and the unnormalised output `acc` are both sums of terms computed against the
# running maximum, so both are multiplied by `alpha`. The maximum `m` itself is replaced by `m_new`.
# Forgetting `alpha` on either gives wrong outputs whenever a later key block raises the maximum.
# </details>
#
# <details><summary>3. With T = 4096 and tiles of 128 x 128, how many tiles does causal attention compute, and how many does it skip?</summary>
#
# There are 32 x 32 = 1024 tiles. Query block `i` needs key blocks `0..i`: `1 + 2 + ... + 32 = 528`
# computed (32 of them on the diagonal, masked), 496 skipped. Almost half the work disappears, which is
# why causal FLOPs are counted as half of `4 b H T^2 D`.
# </details>
#
# <details><summary>4. Why does the function return the log-sum-exp, and not the maximum and the sum?</summary>
#
# The backward pass rebuilds each weight as `p_ij = exp(s_ij - lse_i)`, which needs exactly
# `lse = m + log(l)`: one number per query instead of two, and the weights come out normalised in one
# step.
# </details>
#
# <details><summary>5. Tiling does not change the FLOPs. Why is it faster?</summary>
#
# Because naive attention is limited by memory traffic, not by arithmetic: it writes and reads the
# `T x T` scores and weights to the GPU's large memory, about `D / 2` FLOPs per byte, far below the
# ridge point of a modern GPU. Tiled, the scores never leave the chip. Counting every read of `K` and
# `V` from HBM (an upper bound on the traffic), the intensity rises to a little under `block_q` FLOPs
# per byte: 124 at `block_q = 128`, still below an H100's ridge of 295. But the query blocks of one
# head share `K` and `V` through the L2 cache (1 MiB at `T = 4096`, `D = 64`), so the real traffic is
# much lower and the kernel is compute-bound. Then the next limit is the exponentials: one `exp` per
# score on slow special-function units, which in FlashAttention-2 do not overlap with the matrix
# products; it reaches about 35 % of an H100's peak.
# </details>
#
# <details><summary>6. An H100 has 80 GB. Naive causal attention with 32 heads in bf16 fails above about 25,000 tokens for one sequence. What is the limit for FlashAttention, and what runs out first in practice?</summary>
#
# The attention itself needs only `Q`, `K`, `V`, `O` (about `4 T D H` numbers) and `lse`, linear in `T`:
# millions of tokens would fit. In practice the model's weights, the activations kept for training, and
# at inference time the KV cache (notebook 08) run out long before that.
# </details>
#
# <details><summary>7. Find the bug: a student's loop passes on scores that arrive in decreasing order, but fails on others. Its update reads <code>l = alpha * l + p.sum(-1)</code> and <code>acc = acc + p @ v_blk</code>. What is wrong, and why do some inputs pass?</summary>
#
# `acc` is not rescaled by `alpha`. When no later key block raises the running maximum, `alpha = 1`
# at every step and the missing factor changes nothing, so those inputs pass. As soon as a later
# block holds a larger score, the old terms of `acc` stay computed against the old maximum. One
# query with scores `[1, 3]` in blocks of one, and values `10` and `20`: the right output is
# `(e^-2 * 10 + 20) / (e^-2 + 1) = 18.81`; the buggy loop gives `(10 + 20) / 1.135 = 26.42`. With the
# scores in the order `[3, 1]` both give `11.19`.
# </details>
#
# <details><summary>8. Predict the output: one query, two keys, both scaled scores equal to 1000. What is <code>lse</code>, and what does a loop that writes <code>lse = log(l)</code> return instead?</summary>
#
# `lse = log(e^1000 + e^1000) = 1000 + log 2 = 1000.693`. The loop keeps `m = 1000` and
# `l = e^0 + e^0 = 2`, so `m + log(l)` is right, while `log(l)` alone gives `0.693`: the maximum
# that was subtracted for stability is lost. The output `O` is the same either way, which is why
# this bug hides until the backward pass rebuilds `P = exp(S - lse)` from it.
# </details>

# %% [markdown]
# ## Recap
#
# - **Online softmax:** stream a row in blocks with a running maximum `m` and sum `l`; when the maximum
#   grows, multiply `l` by `exp(m_old - m_new)`. Exact, and it never overflows. Shift by 0 while the
#   maximum is still `-inf`.
# - **FlashAttention forward:** for each block of queries, stream key/value blocks past it, keeping
#   `m`, `l` and the unnormalised output `acc`, both `l` and `acc` rescaled by `alpha`; at the end
#   `out = acc / l` and `lse = m + log(l)`. No `(T, T)` tensor, not even a mask.
# - **Causal:** tiles wholly in the future are skipped, only diagonal tiles are masked: half the work.
# - **Memory:** naive attention's peak grows like `T^2` (three `(b, H, T, T)` tensors here, measured);
#   tiled grows like `T` (its fixed part is a few tiles). Naive 32-head attention in 2-byte numbers for
#   one sequence stops fitting near 11,000 tokens on a T4 (float16), 17,700 on a 40 GB A100 and 25,000
#   on an 80 GB A100 or H100 (bfloat16).
# - **Speed:** same FLOPs, far fewer bytes. The traffic model (every query block reads `K` and `V` from
#   HBM, an upper bound on the bytes) raises the intensity from about `D / 2` to a little under
#   `block_q` FLOPs per byte: 124 at `block_q = 128`, still below an H100's ridge. The L2 cache
#   shares `K` and `V` between query blocks, so real kernels are compute-bound, and then limited by
#   the exponentials: FlashAttention-2 reaches about 35 % of an H100's peak, FlashAttention-3 overlaps
#   the softmax with the products.
# - **Triton:** one program per query block and (batch, head), tiles in `tl.load` / `tl.dot`; an
#   unmasked stage for the blocks wholly in the past, a masked stage for the diagonal; Triton
#   pipelines the loads; the interpreter runs it on a CPU.
# - **Backward:** store `O` and `lse`, recompute the score tiles, `P = exp(S - lse)`.
#
# Notebook 08 turns to inference: generating text one token at a time with a KV cache, grouped-query
# attention and sliding windows.
