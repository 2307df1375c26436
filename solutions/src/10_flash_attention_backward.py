# %% [markdown]
# # 10 · The FlashAttention backward pass
#
# Notebook 07 built FlashAttention's forward pass and ended with the backward pass **in words**: keep
# the output `O` and the log-sum-exp `lse`, and recompute the attention weights tile by tile when the
# gradients are needed. This notebook writes that backward pass, checks it against autograd, wraps
# forward and backward into a `torch.autograd.Function` that PyTorch can train with, and then trains
# notebook 09's tiny GPT on **your own** attention kernel.
#
# **In this notebook you will**
# 1. derive the gradients of attention, `dQ`, `dK` and `dV`, and see why the softmax's backward needs,
#    besides the tile of `P`, only one number per query, `delta = rowsum(dO ∘ O)`; write them untiled:
#    `attention_backward_reference`;
# 2. write FlashAttention-2's backward pass tile by tile, key blocks outside, rebuilding the weights
#    from `lse`, without any `(T, T)` tensor and skipping the causal tiles in the future, in float32
#    inside each tile even for bfloat16 inputs: `flash_attention_backward`;
# 3. join forward and backward in a `torch.autograd.Function` that keeps only `q`, `k`, `v`, `o` and
#    `lse`, and pass `torch.autograd.gradcheck`: `FlashAttention`;
# 4. **measure** what the forward pass keeps for the backward, yours against autograd's;
# 5. train the tiny GPT of notebook 09 with your `FlashAttention` as its attention core, and compare it
#    with PyTorch's kernel: the same accuracy, the loss curves on top of each other, and the time;
# 6. going further: write the key-block loop for `dK` and `dV` as a **Triton** kernel,
#    `flash_attention_backward_triton` (it runs in Triton's interpreter on a CPU);
# 7. read what a production backward adds: grouped-query attention, dropout, more of
#    `torch.autograd.Function`, and the tricks of a fast Triton kernel.
#
# Shapes use these letters: `b` = batch size, `H` = number of heads, `T` = number of tokens,
# `D` = size of one head. Attention inputs are `(..., T, D)`: any batch dimensions in front.
# `delta` (never `D`) is the vector `rowsum(dO ∘ O)`, `(..., T)`, of section 1.
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

from course_utils import backward, bench, checks, flash, plotting, tasks, training

torch.manual_seed(123)
torch.set_num_threads(1)  # small tensors: one thread is as fast, and steady on a busy machine
print("torch", torch.__version__)

# %% [markdown]
# ## 0. Where notebook 07 left us
#
# `flash_attention_forward(q, k, v, block_q, block_k, causal=True)` returns the output `o`
# `(..., T, D)` and the log-sum-exp `lse` `(..., T)`, one number per query:
# `lse_i = log(sum_j exp(s_ij))`, with `s_ij` the scaled scores. Here it is: our answer from
# notebook 07, shown so that this notebook never depends on your own earlier answers. Run the cell.

# %% shows="_check_block flash_attention_forward"
# Our answer from notebook 07.
import math

import torch

from course_utils.validation import check_rank_at_least, check_same_last_dim

# %%
q, k, v = torch.randn(3, 2, 4, 50, 16).unbind(0)  # each (b=2, H=4, T=50, D=16)
o, lse = flash_attention_forward(q, k, v, block_q=16, block_k=16)  # (2, 4, 50, 16), (2, 4, 50)
print("o equals SDPA within 1e-5:", torch.allclose(o, F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                                     atol=1e-5, rtol=0), "| lse shape:", tuple(lse.shape))

# %% [markdown]
# ## 1. The gradients of attention
#
# Training needs, for a loss `L`, the gradients `dQ = ∂L/∂Q`, `dK` and `dV`. The backward pass
# receives `dO = ∂L/∂O`, the gradient of the output, `(..., T, D)`, and walks the forward pass
# backwards. The forward pass, for one head, was three steps:
#
# $$S = Q K^T \cdot \text{scale}, \qquad P = \text{softmax}(S) \text{ (row by row)}, \qquad O = P V,$$
#
# with `scale = 1/sqrt(D)`, and `S`, `P` of shape `(T, T)`. Backwards, one step at a time:
#
# - **`O = P V`**, a matrix product, gives two gradients: `dV = Pᵀ dO` (value `j` collects
#   `P_ij dO_i` from every query `i` that looked at it) and `dP = dO Vᵀ`, `(T, T)`.
# - **The softmax.** Row `i` of `P` depends on row `i` of `S` only. Moving one score `S_ij` moves
#   every weight of the row (they sum to 1), and the chain rule gives
#   `dS_ij = P_ij (dP_ij − Σ_l P_il dP_il)`. The sum is one number per query, and it has a shortcut:
#   `Σ_l P_il dP_il = Σ_l P_il (dO_i · v_l) = dO_i · (Σ_l P_il v_l) = dO_i · o_i`. So
#
# $$\delta_i = \text{rowsum}(dO \circ O)_i, \qquad dS = P \circ (dP - \delta),$$
#
#   where `∘` multiplies entry by entry. In code we call this vector `delta`, `(..., T)`, one number
#   per query (`D` stays the head size). It is computed from the **output**, before any tile: no row
#   of `P` is needed for it. Each tile then needs only its own entries of `P` and `dP`, and `delta`.
# - **`S = Q Kᵀ · scale`** gives `dQ = dS K · scale` and `dK = dSᵀ Q · scale`.
#
# A causal mask changes nothing in these formulas: masked entries have `P_ij = 0`, so their `dS_ij`
# is 0 too. Let us check the shortcut for `delta` on random numbers, with autograd's `P`:

# %%
T_demo, D_demo = 6, 4
q, k, v, do = torch.randn(4, T_demo, D_demo, dtype=torch.float64).unbind(0)  # each (T=6, D=4)
p = torch.softmax(q @ k.T / math.sqrt(D_demo), dim=-1)  # (6, 6)
o = p @ v  # (6, 4)
dp = do @ v.T  # (6, 6)
print("rowsum(P ∘ dP):", [round(x, 4) for x in (p * dp).sum(-1).tolist()])
print("rowsum(dO ∘ O):", [round(x, 4) for x in (do * o).sum(-1).tolist()])

# %% [markdown]
# The same numbers: one from a `(T, T)` product, the other from two `(T, D)` tensors that the forward
# pass already has.
#
# **The recompute form.** The backward needs `P`, `(T, T)`. Autograd keeps it from the forward pass;
# FlashAttention does not. It rebuilds each tile of `P` from `Q`, `K` and the saved `lse`:
# `P_ij = exp(S_ij − lse_i)`. No maximum or sum is needed again: `lse_i = log Σ_j exp(S_ij)` already
# holds both, and `exp(S_ij − lse_i) = exp(S_ij) / Σ_j exp(S_ij)` is the softmax.

# %% [markdown]
# ### Exercise 1: `attention_backward_reference`
#
# Write `attention_backward_reference(q, k, v, do, causal=True)`: the plain formulas above, untiled.
#
# - `q`, `k`, `v` and `do` have shape `(..., T, D)`; return `(dq, dk, dv)`, shaped like `q`, `k`, `v`;
# - recompute the forward pass: `s` `(..., T, T)` scaled by `1/sqrt(D)`; when `causal`, fill the
#   entries above the diagonal with `-inf` (`torch.ones(T, T, dtype=torch.bool).triu(1)` is True
#   there); `p = softmax(s)`; `o = p @ v`;
# - then `dv`, `dp`, `delta` (keep its last dimension: `(..., T, 1)`), `ds`, `dq`, `dk`, in that order.
#
# This is the formula that the tiled version will be tested against. The check compares it with
# autograd's gradients in float64, also on scores large enough (over 709) that `exp` overflows unless
# each row's maximum is subtracted first, as `torch.softmax` does.
#
# **Rules** (the check and the grader apply them): no autograd, since it is what you are rebuilding:
# `backward`, `torch.autograd.grad`, `vjp`, `jacobian` and `enable_grad` are not allowed here, and
# neither are `scaled_dot_product_attention` and `flex_attention`.

# %% grade_id="attention_backward_reference"
def attention_backward_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                                 causal: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of attention for the output gradient do: (..., T, D) inputs -> (dq, dk, dv)."""
    ### BEGIN SOLUTION
    T, D = q.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(D)
    s = q @ k.transpose(-2, -1) * scale  # (..., T, T)
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    p = torch.softmax(s, dim=-1)  # (..., T, T)
    o = p @ v  # (..., T, D)
    dv = p.transpose(-2, -1) @ do  # (..., T, D)
    dp = do @ v.transpose(-2, -1)  # (..., T, T)
    delta = (do * o).sum(dim=-1, keepdim=True)  # (..., T, 1)
    ds = p * (dp - delta)  # (..., T, T)
    dq = ds @ k * scale  # (..., T, D)
    dk = ds.transpose(-2, -1) @ q * scale  # (..., T, D)
    return dq, dk, dv
    ### END SOLUTION

# %% grade_id="test_attention_backward_reference" points=3
# Check: dq, dk and dv against autograd in float64, causal or not, with batch dimensions and large scores.
checks.check_attention_backward_reference(attention_backward_reference)
### BEGIN HIDDEN TESTS
checks.check_attention_backward_reference(attention_backward_reference, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. The backward pass in tiles
#
# The formulas need `P`, `dP` and `dS`, three `(T, T)` matrices. As in the forward pass, FlashAttention
# never holds them: it works on one `(Bq, Bk)` tile at a time. For the tile of query block `i` and key
# block `j`:
#
# ```
# S_ij  = Q_i K_jᵀ · scale                    (Bq, Bk)   recomputed
# P_ij  = exp(S_ij − lse_i)                   (Bq, Bk)   rebuilt, never stored
# dV_j += P_ijᵀ dO_i                          (Bk, D)
# dP_ij = dO_i V_jᵀ                           (Bq, Bk)
# dS_ij = P_ij ∘ (dP_ij − delta_i)            (Bq, Bk)
# dQ_i += dS_ij K_j · scale                   (Bq, D)
# dK_j += dS_ijᵀ Q_i · scale                  (Bk, D)
# ```
#
# **Which loop goes outside?** `dK_j` and `dV_j` are sums over **all query blocks**; `dQ_i` is a sum
# over **all key blocks**. Whatever the order, one of them is summed across the outer loop.
# FlashAttention-2 puts the **key blocks outside**: on a GPU each program owns one key block, keeps
# `K_j`, `V_j` and its running `dK_j`, `dV_j` in fast on-chip memory for the whole inner loop over
# query blocks, and writes them to memory once, at the end. It has two matrices to accumulate and
# `dQ` one, so this order keeps the larger part on chip.
#
# **What `dQ` costs.** Every key block adds a share to `dQ_i`, and on a GPU the programs of different
# key blocks run **at the same time**. There are three ways out.
#
# - **Atomic additions** into a float32 buffer for `dQ` in GPU memory, cast to the inputs' dtype at
#   the end. FlashAttention-2 and FlashAttention-3 both do this. The order of the additions varies
#   from run to run, so `dQ` differs in its last bits; both libraries have a deterministic option
#   that makes the additions wait for each other in a fixed order, which is slower.
# - **A second loop inside the same program** (Triton's tutorial kernel): after its key block, each
#   program takes one query block and loops over the key blocks for that block's `dQ`, recomputing
#   `S`, `P`, `dP` and `dS` once more. No atomics, deterministic, more FLOPs.
# - **A second kernel** with query blocks outside, that recomputes the tiles for `dQ` alone: the same
#   trade as the second loop, with one more launch.
#
# In Python on a CPU nothing runs at the same time: we simply add into the rows of `dq`.
#
# **Causal tiles.** A key block is seen only by queries at or after its first key: for the key block
# starting at `k_start`, the query blocks that end at or before `k_start` are wholly in the "past" of
# every key in it (all their weights are masked), and are skipped. The inner loop therefore starts at
# the query block holding position `k_start`, `(k_start // block_q) * block_q`. The tiles that cross
# the diagonal are masked as in the forward pass. In the picture (`T = 40`, `block_q = 8`,
# `block_k = 16`), read each **column**: the inner loop of one key block runs from the first tile that
# is not white, downwards.

# %%
grid = flash.causal_block_grid(40, block_q=8, block_k=16)  # (5 query blocks, 3 key blocks)
fig, ax = plt.subplots(figsize=(4.2, 4.2))
ax.imshow(grid, cmap=plt.matplotlib.colors.ListedColormap(["white", "#f4a261", "#2a9d8f"]), vmin=0, vmax=2)
for (i, j), value in zip(torch.cartesian_prod(torch.arange(grid.shape[0]), torch.arange(grid.shape[1])).tolist(),
                         grid.flatten().tolist()):
    ax.text(j, i, ["skipped", "masked", "computed"][value], ha="center", va="center", fontsize=8)
for j in range(grid.shape[1]):
    first = int((grid[:, j] > 0).nonzero()[0])
    ax.annotate("", xy=(j + 0.38, grid.shape[0] - 0.6), xytext=(j + 0.38, first - 0.4),
                arrowprops=dict(arrowstyle="->", color="black"))
ax.set_xticks(range(grid.shape[1]), [f"keys {16 * j}-{min(16 * j + 15, 39)}" for j in range(grid.shape[1])],
              rotation=30)
ax.set_yticks(range(grid.shape[0]), [f"queries {8 * i}-{8 * i + 7}" for i in range(grid.shape[0])])
ax.set_title("backward, key blocks outside (arrows: inner loop)")
fig.tight_layout()
plt.show()

# %% [markdown]
# ### Exercise 2: `flash_attention_backward`
#
# Write `flash_attention_backward(q, k, v, o, lse, do, block_q, block_k, causal=True)`:
#
# - `q`, `k`, `v`, `o`, `do` are `(..., T, D)`, `lse` is `(..., T)` (the forward's outputs);
#   return `(dq, dk, dv)`, shaped like `q`, `k`, `v`;
# - **float32 inside**, as notebook 07's forward: `acc = torch.promote_types(q.dtype, torch.float32)`
#   is float32 for bfloat16, float16 and float32 inputs (float64 stays float64). Compute `delta`, every
#   tile and the running `dk_blk`, `dv_blk` in `acc` (`.to(acc)` on each block you slice), make `dq`,
#   `dk`, `dv` with `dtype=acc`, and return them cast back, `dq.to(q.dtype)` and so on. Two reasons: the
#   forward's `lse` is float32 even for bfloat16 inputs, and a product of a float32 tile with a bfloat16
#   one raises "expected m1 and m2 to have the same dtype"; and a long sum in bfloat16 (8 significant
#   bits) loses its small terms. For float32 inputs every `.to(acc)` does nothing;
# - first `delta = (do.to(acc) * o.to(acc)).sum(-1)`, `(..., T)`, and `dq`, `dk`, `dv` full of zeros
#   (`torch.zeros(q.shape, dtype=acc, device=q.device)`, and the same for `k` and `v`);
# - the **outer loop over key blocks** of `block_k` (`k_blk`, `v_blk` `(..., Bk, D)`), with `dk_blk`,
#   `dv_blk` `(..., Bk, D)` starting at zero; the **inner loop over query blocks** of `block_q`: from 0,
#   or when `causal` from `(k_start // block_q) * block_q`;
# - in each tile, the seven lines above: `s` (scaled, and when `causal` masked with `cols > rows`
#   where the tile crosses the diagonal, as in notebook 07), `p = exp(s - lse[..., q_start:q_end,
#   None])`, then `dv_blk`, `dp`, `ds`, the rows of `dq` (`dq[..., q_start:q_end, :] += ...`) and `dk_blk`;
# - after the inner loop, write `dk_blk` and `dv_blk` into their rows of `dk` and `dv`.
#
# The check compares with autograd for several shapes and block sizes (the last block of a loop may be
# shorter), watches every tensor your code makes (no `(T, T)` tensor, not even a mask) and counts the
# score entries you compute: the causal tiles in the future must be skipped, and each tile is computed
# once (one pass: no second pass for `dq`).
#
# **Rules** (the check and the grader apply them): loop over the tiles. No autograd (`backward`,
# `torch.autograd.grad`, `vjp`, `jacobian`, `enable_grad`), no `scaled_dot_product_attention` or
# `flex_attention`, no library softmax (`softmax`, `log_softmax`) or `logsumexp`, and not your
# `attention_backward_reference`.

# %% grade_id="flash_attention_backward"
def flash_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                             lse: torch.Tensor, do: torch.Tensor, block_q: int, block_k: int,
                             causal: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tiled backward: (..., T, D) inputs, lse (..., T) -> (dq, dk, dv), no (T, T) tensor."""
    ### BEGIN SOLUTION
    order = "flash_attention_backward(q, k, v, o, lse, do, block_q, block_k, causal)"
    _check_block(block_q, "block_q", order)  # a bool here is most often the causal flag, given in apply's order
    _check_block(block_k, "block_k", order)
    T, D = q.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(D)
    acc = torch.promote_types(q.dtype, torch.float32)  # tiles and sums in float32 at least, as the forward
    delta = (do.to(acc) * o.to(acc)).sum(dim=-1)  # (..., T)
    dq, dk, dv = (torch.zeros(t.shape, dtype=acc, device=t.device) for t in (q, k, v))  # (..., T, D) each
    for k_start in range(0, T, block_k):
        k_end = min(k_start + block_k, T)
        k_blk, v_blk = k[..., k_start:k_end, :].to(acc), v[..., k_start:k_end, :].to(acc)  # (..., Bk, D)
        dk_blk, dv_blk = torch.zeros_like(k_blk), torch.zeros_like(v_blk)  # (..., Bk, D)
        first = (k_start // block_q) * block_q if causal else 0  # earlier query blocks see none of these keys
        for q_start in range(first, T, block_q):
            q_end = min(q_start + block_q, T)
            q_blk, do_blk = q[..., q_start:q_end, :].to(acc), do[..., q_start:q_end, :].to(acc)  # (..., Bq, D)
            s = q_blk @ k_blk.transpose(-2, -1) * scale  # (..., Bq, Bk)
            if causal and k_end - 1 > q_start:  # the tile crosses the diagonal
                rows = torch.arange(q_start, q_end, device=q.device)[:, None]  # (Bq, 1)
                cols = torch.arange(k_start, k_end, device=q.device)[None, :]  # (1, Bk)
                s = s.masked_fill(cols > rows, float("-inf"))
            p = torch.exp(s - lse[..., q_start:q_end, None])  # (..., Bq, Bk)
            dv_blk = dv_blk + p.transpose(-2, -1) @ do_blk  # (..., Bk, D)
            dp = do_blk @ v_blk.transpose(-2, -1)  # (..., Bq, Bk)
            ds = p * (dp - delta[..., q_start:q_end, None])  # (..., Bq, Bk)
            dq[..., q_start:q_end, :] += ds @ k_blk * scale  # (..., Bq, D)
            dk_blk = dk_blk + ds.transpose(-2, -1) @ q_blk * scale  # (..., Bk, D)
        dk[..., k_start:k_end, :] = dk_blk
        dv[..., k_start:k_end, :] = dv_blk
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)  # back to the inputs' dtypes
    ### END SOLUTION

# %% grade_id="test_flash_attention_backward" points=5
# Check: dq, dk, dv against autograd, T not a multiple of the blocks, no (T, T) tensor, skipped tiles.
checks.check_flash_attention_backward(flash_attention_backward)
### BEGIN HIDDEN TESTS
checks.check_flash_attention_backward(flash_attention_backward, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Your tiles against your untiled formulas, for a few block sizes, `T` not a multiple of them:

# %%
q, k, v, do = torch.randn(4, 2, 4, 50, 16).unbind(0)  # each (b=2, H=4, T=50, D=16)
o, lse = flash_attention_forward(q, k, v, 16, 16)
untiled = attention_backward_reference(q, k, v, do)  # (dq, dk, dv)
for block_q, block_k in [(8, 8), (16, 32), (50, 7), (64, 64)]:
    tiled = flash_attention_backward(q, k, v, o, lse, do, block_q, block_k)
    same = all(torch.allclose(a, b, atol=1e-5, rtol=0) for a, b in zip(tiled, untiled))
    print(f"block_q={block_q:2d}, block_k={block_k:2d}: dq, dk, dv equal to the untiled formulas within 1e-5: {same}")

# %% [markdown]
# ## 3. Forward and backward together: `torch.autograd.Function`
#
# Autograd builds the backward of every operation it records. To give it **our** backward for a whole
# piece of computation, we write a subclass of `torch.autograd.Function` with two static methods:
#
# - `forward(ctx, ...)` computes the output without recording anything (autograd is off inside it)
#   and puts on `ctx` what the backward will need: tensors with `ctx.save_for_backward(...)`, other
#   values (flags, sizes) as attributes, `ctx.causal = causal`;
# - `backward(ctx, grad_output)` reads them back (`ctx.saved_tensors`, in the order they were saved)
#   and returns **one gradient per argument of `forward`**, in order: a tensor for each input that
#   may need one, `None` for the others (a bool, an int).
#
# It is used through `FlashAttention.apply(q, k, v, causal, block_q, block_k)`, with positional
# arguments. The torch of this course (2.13) also takes keywords, but only after every argument before
# them: `FlashAttention.apply(q, k, v, block_q=16)` fails with "missing required argument: 'causal'",
# because `apply` does not fill in `forward`'s defaults. Older releases, such as the 2.5 the course
# supports, reject any keyword argument to `apply`. Positional arguments work everywhere.
# `ctx.save_for_backward` is the right place for tensors: autograd checks that they were not changed
# in place before the backward runs, and frees them after it.
#
# Note the order: `apply` takes `causal` before the block sizes, while `flash_attention_forward` and
# `flash_attention_backward` take it after them, `(..., block_q, block_k, causal)`.

# %% [markdown]
# ### Exercise 3: `FlashAttention`
#
# Write the class `FlashAttention(torch.autograd.Function)`:
#
# - `forward(ctx, q, k, v, causal=True, block_q=32, block_k=32)`: call notebook 07's
#   `flash_attention_forward` (section 0) for `o` and `lse`; save **exactly** `q`, `k`, `v`, `o` and `lse`
#   with `ctx.save_for_backward`, keep `causal`, `block_q` and `block_k` on `ctx`; return `o`;
# - `backward(ctx, do)`: call your `flash_attention_backward` and return `dq, dk, dv` and `None` for
#   each of the three other arguments.
#
# **Half precision.** With bfloat16 inputs, notebook 07's forward returns `o` in bfloat16 and `lse` in
# float32; your backward (Exercise 2) computes its tiles in float32 and returns bfloat16 gradients.
# Nothing else changes here. Under `torch.autocast`, decorate `forward` with
# `@torch.amp.custom_fwd(device_type="cuda")` and `backward` with `@torch.amp.custom_bwd(device_type="cuda")`
# (below `@staticmethod`): the backward then runs with the same autocast state as the forward. With
# `custom_fwd(device_type="cuda", cast_inputs=torch.bfloat16)`, inside an autocast region, the forward
# receives its floating-point inputs cast to bfloat16 and runs with autocast off.
#
# The check compares the output and the gradients with autograd's in float64, looks at what the
# forward keeps (no `P`: no `(T, T)` tensor, neither saved nor as an attribute of `ctx`), runs
# `torch.autograd.gradcheck`, compares with PyTorch's SDPA in float32 at `T = 256`, causal and
# not, with blocks that do not divide 256, and runs one case in bfloat16 (output and gradients within
# 1e-2 of float64 attention on the same bfloat16 inputs).
#
# **Rules** (the check and the grader apply them): no autograd inside the class (`backward`,
# `torch.autograd.grad`, `vjp`, `jacobian`, `enable_grad`), no `scaled_dot_product_attention` or
# `flex_attention`, no `softmax`, `log_softmax` or `logsumexp`, and not the untiled
# `attention_backward_reference`: each would bring back the `(T, T)` matrix.

# %% grade_id="FlashAttention"
class FlashAttention(torch.autograd.Function):
    """FlashAttention.apply(q, k, v, causal, block_q, block_k): (..., T, D) -> (..., T, D)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, block_q: int = 32,
                block_k: int = 32) -> torch.Tensor:
        ### BEGIN SOLUTION
        o, lse = flash_attention_forward(q, k, v, block_q, block_k, causal)  # (..., T, D), (..., T)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k
        return o
        ### END SOLUTION

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        ### BEGIN SOLUTION
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, ctx.block_q, ctx.block_k, ctx.causal)
        return dq, dk, dv, None, None, None
        ### END SOLUTION

# %% grade_id="test_FlashAttention" points=5
# Check: output and gradients, what forward keeps, gradcheck, and SDPA's gradients at T = 256.
checks.check_FlashAttention(FlashAttention)
### BEGIN HIDDEN TESTS
checks.check_FlashAttention(FlashAttention, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# `torch.autograd.gradcheck` compares the gradients your backward returns with **numerical** ones:
# it nudges every input entry by a tiny `eps` and watches the output move. That needs float64 (in
# float32 the nudge drowns in rounding) and small sizes (two forward passes per input entry):

# %%
inputs = tuple(torch.randn(1, 2, 7, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))  # q, k, v
for causal in (True, False):
    ok = torch.autograd.gradcheck(lambda q, k, v: FlashAttention.apply(q, k, v, causal, 3, 2), inputs)
    print(f"gradcheck, causal={causal}: {ok}")

# %% [markdown]
# And against PyTorch's own kernel in float32, `T = 256`, blocks of 48 queries by 40 keys. The
# cell prints the largest difference it measures, rounded to one digit: float32 rounding, with the
# additions in a different order. It varies with the CPU (nbval skips it); the check allows `1e-4`.

# %%
# NBVAL_IGNORE_OUTPUT
# (nbval skips this cell's output: the last digits of float32 sums depend on the CPU)
q, k, v, do = torch.randn(4, 1, 4, 256, 32).unbind(0)  # each (1, H=4, T=256, D=32)
for causal in (True, False):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    FlashAttention.apply(*leaves, causal, 48, 40).backward(do)
    ours = [t.grad for t in leaves]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*leaves, is_causal=causal).backward(do)
    largest = max((a - t.grad).abs().max().item() for a, t in zip(ours, leaves))
    print(f"causal={causal}: the largest difference from SDPA's dq, dk, dv is {largest:.0e}")

# %% [markdown]
# ## 4. What the forward pass keeps for the backward, measured
#
# `backward.saved_for_backward(fn, q, k, v)` runs `fn` with autograd on and lists every tensor that
# autograd keeps for the backward pass (with `torch.autograd.graph.saved_tensors_hooks`, which sees
# each tensor as it is saved). Three ways to compute causal attention, one head of `T = 256`, `D = 64`:
# attention written with a matrix product and a softmax (autograd records every step), PyTorch's SDPA,
# and yours.

# %%
def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention from a product and a softmax, as notebook 04 wrote it: (..., T, D) -> (..., T, D)."""
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (..., T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # (T, T), True = hidden
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v  # (..., T, D)


ways = {
    "naive (autograd)": naive_attention,
    "SDPA": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "yours": lambda q, k, v: FlashAttention.apply(q, k, v, True, 64, 64),
}
q, k, v = torch.randn(3, 1, 1, 256, 64).unbind(0)  # each (1, 1, T=256, D=64)
for name, fn in ways.items():
    saved = backward.saved_for_backward(fn, q, k, v)
    made = [s for s in saved if not s.is_input]
    print(f"{name:17s} keeps {len(saved)} tensors; made by the forward: "
          f"{', '.join(str(s) for s in made)}: {sum(s.nbytes for s in made) / 1024:.0f} KiB")

# %% [markdown]
# The naive version keeps the weights `P`, `(1, 1, 256, 256)`, and the `(256, 256)` mask; yours keeps
# the output and `lse` besides the inputs, and so does SDPA: on a CPU it **is** a FlashAttention
# kernel, and it saves exactly what yours saves.
#
# What does that mean for a whole training step? `backward.peak_memory_with_backward(fn, q, k, v)`
# measures the peak of the tensors alive during the forward **and** the backward pass, with notebook
# 07's tensor watcher, autograd on this time. Four heads of 64, float32, `T` from 128 to 1024, yours
# with tiles of 64 by 64 (skipped while grading):

# %%
SEQ_LENS = [128, 256, 512, 1024]
peaks = None  # stays None while grading
if flash.grading():
    print("skipped while grading")
else:
    peaks = {"naive (autograd)": [], "yours": []}
    for T in SEQ_LENS:
        q, k, v = torch.randn(3, 1, 4, T, 64).unbind(0)  # each (1, H=4, T, D=64)
        peaks["naive (autograd)"].append(backward.peak_memory_with_backward(naive_attention, q, k, v))
        peaks["yours"].append(backward.peak_memory_with_backward(
            lambda q, k, v: FlashAttention.apply(q, k, v, True, 64, 64), q, k, v))
    print(plotting.format_peaks(SEQ_LENS, peaks))

# %%
if peaks is not None:
    plotting.plot_peaks(SEQ_LENS, peaks, ylabel="peak tensor memory, forward + backward (MiB)",
                        title="measured on the CPU: naive grows like T², yours like T")
    plt.show()

# %% [markdown]
# At `T = 128` the two are level. Yours has a fixed workspace: the `(b, H, Bq, Bk)` tiles `S`, `P`,
# `dP` and `dS` alive inside the loop, and the running `dk_blk` and `dv_blk`. A tile of 64 by 64 is a
# quarter of the `(128, 128)` matrix, and a few of them at once weigh about as much as naive's `P` and
# mask. With tiles of 128 by 128, one tile would be the whole matrix, and yours would be above naive
# there. From `T = 256` on, the workspace stays the same while `P` grows like `T²`.
#
# In a model, every layer's forward pass keeps its tensors until the backward pass reaches it: with
# naive attention that is a `(b, H, T, T)` tensor per layer, all alive at the same time. With
# FlashAttention, a layer keeps `q`, `k`, `v`, `o` and `lse`: memory linear in `T`, and the `(T, T)`
# tiles live only inside the loops.

# %% [markdown]
# ## 5. The capstone on your own kernel
#
# Now let your `FlashAttention` train a model. Here is notebook 09's `TinyGPT` with its parts and its
# `train_step`: our answers from notebooks 04, 05, 08 and 09, shown so that nothing depends on your
# earlier answers. Run the cell.

# %% shows="causal_mask split_heads merge_heads MultiHeadAttention MultiHeadAttentionKVCache sinusoidal_positions LearnedPositionalEmbedding TransformerBlock TinyGPT train_step"
# Our answers from notebooks 04, 05, 08 and 09.
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils.validation import check_heads_divide, check_input_3d

# %% [markdown]
# Each block's attention computes queries, keys and values, then its **core**: the scores, the mask,
# the softmax and the weighted sum of the values, then `out_proj`. `backward.swap_attention_core(model,
# core)` keeps every weight and replaces that core, in every block, by `core(q, k, v)` on `(b, H, T, D)`
# tensors (read it in `course_utils/backward.py`, about 20 lines). We build the same model twice, from
# the same seed, once with PyTorch's SDPA as its core and once with yours, and train both the same
# way: the digit-reversal task of notebook 09, with 6 digits (`T = 12`), 80 steps, tiles of 8 by 8.
#
# **While grading, nothing is trained** (`training.train` returns at once and says so).

# %%
task = tasks.ReversalTask(num_digits=6, held_out_size=1000, seed=0)
config = dict(vocab_size=tasks.VOCAB_SIZE, d_model=32, num_heads=2, num_layers=2,
              context_length=task.context_length, dropout=0.0)
SEED, STEPS = 0, 80
cores = {
    "SDPA": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),  # (b, H, T, D)
    "your FlashAttention": lambda q, k, v: FlashAttention.apply(q, k, v, True, 8, 8),  # (b, H, T, D)
}
models = {}
for name, core in cores.items():
    torch.manual_seed(SEED)  # the same starting weights for both
    models[name] = backward.swap_attention_core(TinyGPT(**config), core)
print(f"{sum(p.numel() for p in models['SDPA'].parameters()):,} parameters each")

# %%
# NBVAL_IGNORE_OUTPUT
# (nbval skips this cell's output: the progress bars depend on the machine)
runs = {name: training.train(model, train_step, task, steps=STEPS, seed=SEED, eval_every=40, desc=name)
        for name, model in models.items()}

# %%
if runs["SDPA"].skipped:
    print("training was skipped while grading")
else:
    for name, run in runs.items():
        print(f"{name:20s} held-out exact-answer accuracy {run.final_accuracy:.0%}, final loss {run.losses[-1]:.2f}")
    print("the same accuracy:", runs["SDPA"].final_accuracy == runs["your FlashAttention"].final_accuracy)
    gap = max(abs(a - b) for a, b in zip(runs["SDPA"].losses, runs["your FlashAttention"].losses))
    print("loss curves within 1e-3 of each other at every step:", gap < 1e-3)
    training.plot_losses(runs, title="the same model, PyTorch's attention core or yours")
    plt.show()

# %% [markdown]
# The two curves lie on top of each other: the same model, the same batches, the same gradients up to
# float32 rounding. Your kernel trains a transformer.
#
# **And the time?** One training step of each model, on the same batch, median of 10 (on this CPU;
# the numbers depend on the machine):

# %% tags=["nbval-ignore-output"]
if runs["SDPA"].skipped:
    print("timing skipped while grading")
else:
    batch = task.batch(64, torch.Generator().manual_seed(1))
    per_step = {}
    for name, model in models.items():
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        per_step[name] = bench.time_fn(lambda: train_step(model, batch, optimizer), repeats=10).median_ms
        print(f"{name:20s} {per_step[name]:6.1f} ms per training step")
    print(f"yours takes {per_step['your FlashAttention'] / per_step['SDPA']:.1f} times as long")

# %% [markdown]
# Yours is slower, and that is expected. SDPA runs each attention, forward and backward, as one
# compiled C++ kernel. Yours runs a Python loop: each backward tile does five small matrix products
# (`S`, `Pᵀ dO`, `dP`, `dS K`, `dSᵀ Q`) and about as many other operations (slices, `exp`, the mask, a
# subtraction), and each one pays Python's and PyTorch's fixed cost per call, a few microseconds,
# whatever the tile's size. Here the tiles are tiny (8 by 8), so that fixed cost is almost all of the
# attention's time. The ratio printed above is for a whole training step, and the rest of the step
# (embeddings, the feed-forward layers, the loss, the optimizer) costs the same in both models, so the
# attention alone is slowed down more than that ratio says.
#
# The arithmetic is the same; what FlashAttention gains on a GPU comes from running the whole loop
# **inside one kernel**, tiles in on-chip memory, which is what notebook 07's Triton kernel does for the
# forward pass. The Python version's job is to be right, and readable: it is the specification a fast
# kernel is tested against.

# %% [markdown]
# ## 6. Going further: dK and dV in Triton
#
# Notebook 07 wrote the forward loop as a Triton kernel. The backward's key-block loop maps onto Triton
# the same way: **one program per key block** and (batch, head), grid `(number of key blocks, b * H)`.
# Program `(j, bh)` loads `K_j` and `V_j` once, keeps `dk` and `dv` `(BLOCK_N, HEAD_DIM)` in its
# registers while the query blocks stream past, and writes them once at the end: exactly why
# FlashAttention-2 puts the key blocks outside. `dQ` is left out here: it would need atomic additions
# into a float32 buffer (FlashAttention-2 and -3), or a second loop over key blocks in the same program
# (Triton's tutorial), as section 2 says. On a CPU it runs in Triton's interpreter, as in notebook 07;
# where Triton is not installed this section is skipped and says so. The host side (`delta =
# rowsum(dO ∘ O)` computed with PyTorch, the strides, the grid) is `backward.launch_backward(kernel, q,
# k, v, o, lse, do, causal, block_m, block_n)`: read it in `course_utils/backward.py`.

# %%
flash.use_interpreter_without_gpu()  # no GPU: TRITON_INTERPRET=1, before any kernel is defined
triton, tl = flash.import_triton()  # without Triton: stand-ins that let the next cell define the kernel
TRITON_RUNS, TRITON_HOW = flash.triton_status()
print("Triton:", TRITON_HOW)

# %% [markdown]
# ### Exercise 4: `flash_attention_backward_triton`
#
# The kernel below is given except for the body of the loop over query blocks. What it has when the
# loop starts, for its `BLOCK_N` key positions `offs_n`:
#
# - `k`, `v` `(BLOCK_N, HEAD_DIM)`, this program's keys and values, already loaded;
# - `dk`, `dv` `(BLOCK_N, HEAD_DIM)`, float32 zeros: add to them;
# - `offs_m = tl.arange(0, BLOCK_M)`, `offs_d = tl.arange(0, HEAD_DIM)`, `base = bh * stride_b`; the
#   loop runs `start_m` over the query blocks, from the first one that sees these keys when `CAUSAL`.
#
# In the loop body, your Python tile in Triton:
#
# 1. `rows = start_m + offs_m`; load `q` and `do` `(BLOCK_M, HEAD_DIM)` as `k` is loaded above (with
#    `rows` for `offs_n` and `mask=rows[:, None] < T`), and `lse` and `delta` `(BLOCK_M,)` with
#    `tl.load(LSE + bh * T + rows, mask=rows < T, other=0.0)` (the same from `DELTA`);
# 2. `s = tl.dot(q, tl.trans(k)) * scale`, `(BLOCK_M, BLOCK_N)`;
# 3. the weights: `keep = (rows[:, None] < T) & (offs_n[None, :] < T)`, and when `CAUSAL`
#    `keep = keep & (offs_n[None, :] <= rows[:, None])`; then `p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)`;
# 4. `dv += tl.dot(tl.trans(p).to(do.dtype), do)`, `dp = tl.dot(do, tl.trans(v))`,
#    `ds = p * (dp - delta[:, None])`, `dk += tl.dot(tl.trans(ds).to(q.dtype), q) * scale`.
#
# The two casts matter in half precision. `lse` and `delta` are float32, so `p` and `ds` are float32,
# and `tl.dot` needs both operands of one dtype: with bfloat16 inputs, `tl.dot` of a float32 `p` and a
# bfloat16 `do` is refused. Cast `p` and `ds` to the inputs' dtype just before the product, as
# FlashAttention's kernels do; `tl.dot` still adds up in float32, into the float32 `dk` and `dv`. For
# float32 inputs the casts change nothing.
#
# After the loop the kernel stores `dk` and `dv`. If this section is skipped on your machine, write
# the body anyway: the grader runs it.

# %% grade_id="flash_attention_backward_triton"
@triton.jit
def flash_attention_backward_triton(Q, K, V, DO, LSE, DELTA, DK, DV, stride_b, stride_t, T, scale,
                                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                    CAUSAL: tl.constexpr):
    start_n = tl.program_id(0)  # which block of keys
    bh = tl.program_id(1)  # which (batch, head)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
    offs_m = tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    offs_d = tl.arange(0, HEAD_DIM)  # (HEAD_DIM,)
    base = bh * stride_b
    k = tl.load(K + base + offs_n[:, None] * stride_t + offs_d[None, :], mask=offs_n[:, None] < T,
                other=0.0)  # (BLOCK_N, HEAD_DIM)
    v = tl.load(V + base + offs_n[:, None] * stride_t + offs_d[None, :], mask=offs_n[:, None] < T,
                other=0.0)  # (BLOCK_N, HEAD_DIM)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0  # earlier query blocks see none of these keys
    for start_m in range(lo, T, BLOCK_M):
        ### BEGIN SOLUTION
        rows = start_m + offs_m  # (BLOCK_M,) query positions
        q = tl.load(Q + base + rows[:, None] * stride_t + offs_d[None, :], mask=rows[:, None] < T,
                    other=0.0)  # (BLOCK_M, HEAD_DIM)
        do = tl.load(DO + base + rows[:, None] * stride_t + offs_d[None, :], mask=rows[:, None] < T,
                     other=0.0)  # (BLOCK_M, HEAD_DIM)
        lse = tl.load(LSE + bh * T + rows, mask=rows < T, other=0.0)  # (BLOCK_M,)
        delta = tl.load(DELTA + bh * T + rows, mask=rows < T, other=0.0)  # (BLOCK_M,)
        s = tl.dot(q, tl.trans(k)) * scale  # (BLOCK_M, BLOCK_N)
        keep = (rows[:, None] < T) & (offs_n[None, :] < T)
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= rows[:, None])
        p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)  # (BLOCK_M, BLOCK_N)
        dv += tl.dot(tl.trans(p).to(do.dtype), do)  # (BLOCK_N, HEAD_DIM); p is float32: cast for tl.dot
        dp = tl.dot(do, tl.trans(v))  # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])  # (BLOCK_M, BLOCK_N)
        dk += tl.dot(tl.trans(ds).to(q.dtype), q) * scale  # (BLOCK_N, HEAD_DIM)
        ### END SOLUTION
    tl.store(DK + base + offs_n[:, None] * stride_t + offs_d[None, :], dk.to(DK.dtype.element_ty),
             mask=offs_n[:, None] < T)
    tl.store(DV + base + offs_n[:, None] * stride_t + offs_d[None, :], dv.to(DV.dtype.element_ty),
             mask=offs_n[:, None] < T)

# %% grade_id="test_flash_attention_backward_triton" points=3
# Check: your kernel, launched with backward.launch_backward, against autograd (dk and dv), causal or not.
checks.check_flash_attention_backward_triton(flash_attention_backward_triton)
### BEGIN HIDDEN TESTS
checks.check_flash_attention_backward_triton(flash_attention_backward_triton, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Your kernel next to your Python loop (in the interpreter, a tiny size: it runs each program in Python):

# %%
if TRITON_RUNS:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v, do = torch.randn(4, 1, 2, 40, 16, device=device).unbind(0)  # each (1, 2, 40, 16)
    o, lse = flash_attention_forward(q, k, v, 16, 16)
    dk_triton, dv_triton = backward.launch_backward(flash_attention_backward_triton, q, k, v, o, lse, do,
                                                    causal=True, block_m=16, block_n=16)
    _, dk_python, dv_python = flash_attention_backward(q, k, v, o, lse, do, 16, 16)
    tol = 5e-3 if device == "cuda" else 1e-5  # compiled, float32 products use TF32 tensor cores
    print(f"Triton's dk and dv equal your loop's within {tol:g}:",
          torch.allclose(dk_triton, dk_python, atol=tol, rtol=0) and torch.allclose(dv_triton, dv_python, atol=tol,
                                                                                     rtol=0))
else:
    print("skipped:", TRITON_HOW)

# %% [markdown]
# ## 7. What a production backward adds
#
# Four things this notebook leaves out, one paragraph each.
#
# **Grouped-query attention.** With notebook 08's GQA, `n_rep` query heads share one key/value head.
# Each of them adds its own share to that head's `dK` and `dV`, so the backward sums over the group:
# from per-query-head gradients `(b, H, T, D)`, `dk.view(b, G, n_rep, T, D).sum(dim=2)` is
# `(b, G, T, D)`. Autograd does this sum for you through `repeat_kv`'s copy; a group-aware kernel adds
# the shares of its `n_rep` query heads itself.
#
# **Dropout.** Dropout on the attention weights zeroes entries of `P`, and the backward must zero the
# same entries. FlashAttention stores no `(T, T)` dropout mask either: the forward draws each tile's
# mask from a counter-based random generator (Philox), and keeps only its seed and offset; the
# backward draws the same tile's mask again from them.
#
# **More of `torch.autograd.Function`.** `ctx.needs_input_grad` is a tuple of booleans, one per
# argument of `forward`: a backward can skip `dq` (and return `None`) when `q` needs no gradient.
# `@torch.autograd.function.once_differentiable` under `@staticmethod` on `backward` says it cannot be
# differentiated again: a second-order gradient then raises an error instead of a wrong result. And the
# newer style splits `forward(q, k, v, ...)`, without `ctx`, from `setup_context(ctx, inputs, output)`,
# which saves what the backward needs; `torch.func` transforms (`vmap`, `grad`) need it, and `apply`
# then fills in `forward`'s defaults, so keyword arguments work on torch 2.13. `setup_context` sees
# only the inputs and the output, so `forward` must return `lse` as a second output (marked with
# `ctx.mark_non_differentiable`).
#
# **A production Triton backward.** Triton's tutorial kernel and FlashAttention's kernels go further
# than Exercise 4. The tiles that cross the diagonal are looped over apart from the others, so only
# they pay for the mask. `exp2` replaces `exp`: `K` is multiplied once by `scale · log2(e)` on the host
# and `lse` is kept in base 2, which saves a multiplication per entry. And `P` and `dS` are cast to
# float16 or bfloat16 before `tl.dot`, as your two casts do, so that the products run on the tensor
# cores while adding up in float32.

# %% [markdown]
# ## Check your understanding
#
# Click a question to see the answer.
#
# <details><summary>1. Predict the output: every row of dS sums to the same number, whatever q, k, v and
# dO are. Which number? Run the cell below to check.</summary>
#
# **Zero.** `rowsum(dS)_i = Σ_j P_ij dP_ij − delta_i Σ_j P_ij = delta_i − delta_i · 1 = 0`. It says that
# adding the same constant to every score of a row changes nothing (the softmax does not see it), so the
# loss has no gradient in that direction. It is also a quick test for a backward pass: a `dS` whose rows
# do not sum to 0 has a wrong `delta`, or a wrong `P` (rebuilt without `lse`, or unmasked), whose rows do
# not sum to 1.
# </details>

# %%
q, k, v, do = torch.randn(4, 2, 6, 4, dtype=torch.float64).unbind(0)  # each (2, T=6, D=4)
p = torch.softmax(q @ k.transpose(-2, -1) / 2, dim=-1)  # (2, 6, 6); D = 4, so scale = 1/2
dp = do @ v.transpose(-2, -1)  # (2, 6, 6)
ds = p * (dp - (do * (p @ v)).sum(-1, keepdim=True))  # (2, 6, 6)
print("every row of dS sums to 0 (within 1e-12):", bool(ds.sum(-1).abs().max() < 1e-12))

# %% [markdown]
# <details><summary>2. Find the bug: a student computes delta inside the inner loop, from the tile:
# <code>delta_blk = (p * dp).sum(-1, keepdim=True)</code>, then <code>ds = p * (dp - delta_blk)</code>. The
# check passes when <code>block_k >= T</code> and fails otherwise. Why?</summary>
#
# `delta_i = Σ_j P_ij dP_ij` sums over **all** keys `j` of row `i`. One tile holds only `block_k` of
# them, so `(p * dp).sum(-1)` is a partial sum: right only when one key block covers the whole row.
# Compute `delta = rowsum(dO ∘ O)` once, before the loops: the same number, read from the output, and
# it needs no row of `P` at all.
# </details>
#
# <details><summary>3. Find the bug: the backward forgets the causal mask, but skips the future tiles.
# Which gradients are wrong?</summary>
#
# All three, in almost every row. In the tiles that cross the diagonal, `P = exp(S − lse)` is no longer 0
# above the diagonal: the rebuilt weights give each query some weight on its future keys of the same key
# block. That reaches every query but the last of each key block, and every key but the first. With `T =
# 40` and tiles of 8 queries by 16 keys, 37 of the 40 rows of each of `dQ`, `dK` and `dV` are wrong
# (measured); only rows 15, 31, 39 of `dQ`, and rows 0, 16, 32 of `dK` and `dV`, survive. The forward
# masked these entries, so the backward must mask them the same way.
# </details>
#
# <details><summary>4. The backward recomputes S = Q Kᵀ for every tile. How many matrix products of a
# tile's size does it do, against the forward's two?</summary>
#
# Five: `S = Q Kᵀ` again, `dV += Pᵀ dO`, `dP = dO Vᵀ`, `dQ += dS K` and `dK += dSᵀ Q`. So the backward
# does about 2.5 times the forward's FLOPs, and one of its five products (`S`) is pure recomputation.
# It is still faster than writing `P` to GPU memory in the forward and reading it back: that `(T, T)`
# traffic is what makes naive attention memory-bound (notebook 07, section 4). FlashAttention, which
# never moves it, is compute-bound at long sequences, and spends FLOPs, which a GPU has to spare, to
# save bytes. With a second loop for `dQ` it is seven: `S`, `dP` and `dQ` again.
# </details>
#
# <details><summary>5. Why can't FlashAttention save P in bfloat16 to be cheaper, instead of recomputing
# it?</summary>
#
# It would still be `T × T` numbers per head and layer: at `T = 32,768` and 32 heads that is 64 GiB for
# one layer in bfloat16. Halving a quadratic memory leaves it quadratic. `lse` is `T` numbers.
# </details>
#
# <details><summary>6. Your backward returns <code>None</code> for <code>causal</code>, <code>block_q</code>
# and <code>block_k</code>. What happens if it returns only three values?</summary>
#
# Autograd stops with "function FlashAttentionBackward returned an incorrect number of gradients
# (expected 6, got 3)": `backward` must return one value per argument of `forward`, `None` where there
# is no gradient.
# </details>

# %% [markdown]
# ## Recap
#
# - **Gradients of attention:** `dV = Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ∘ (dP − delta)` with
#   `delta = rowsum(dO ∘ O)`, `dQ = dS K · scale`, `dK = dSᵀ Q · scale`. `delta` needs no row of `P`.
# - **Recompute, do not store:** the forward keeps `q`, `k`, `v`, `o` and `lse`; the backward rebuilds
#   each tile `P = exp(S − lse)`.
# - **Loop order:** key blocks outside, so `dK` and `dV` of a key block stay on chip and are written
#   once; `dQ` gets a share from every key block: atomic additions into a float32 buffer
#   (FlashAttention-2 and -3), or a second loop over key blocks (Triton's tutorial).
# - **Half precision:** tiles, `delta` and the sums in float32, as the forward; the gradients cast back
#   to the inputs' dtype at the end; in Triton, `p` and `ds` cast to the inputs' dtype for `tl.dot`.
# - **Causal:** for a key block, the query blocks before it are skipped; diagonal tiles are masked.
# - **`torch.autograd.Function`:** `forward(ctx, ...)` with `ctx.save_for_backward`, `backward(ctx,
#   grad)` returning one gradient per input (`None` for non-tensors); `gradcheck` in float64.
# - **Memory, measured:** naive attention keeps `P` and the mask for every layer; FlashAttention keeps
#   tensors linear in `T`, as PyTorch's SDPA does.
# - **Your kernel trains a model:** the same loss curve and accuracy as SDPA; slower in Python, because
#   every tile pays per-call overhead that a fused kernel does not.
# - **Triton:** one program per key block and (batch, head) keeps `dk` and `dv` on chip and writes them
#   once; `dQ` would need atomic additions or a second loop over key blocks.
