# %% [markdown]
# # 06 · Efficient attention on a GPU
#
# Notebook 05 ended with `MultiHeadAttention`: batched, causal, several heads, correct. This
# notebook is about making the same computation **fast**, and about measuring "fast" honestly.
#
# **In this notebook you will**
# 1. compute Q, K and V with one matrix product instead of three: `MultiHeadAttentionCombinedQKV`;
# 2. write the same attention with `torch.einsum`, and read its index strings;
# 3. hand the core to PyTorch's fused kernel `F.scaled_dot_product_attention`: `MHAPyTorchSDPA`;
#    then try an explicit mask, `nn.MultiheadAttention` and FlexAttention;
# 4. check every version against the reference **before** timing anything;
# 5. count the FLOPs of attention (`attention_flops`) and compare achieved TFLOP/s with the GPU's peak;
# 6. see why the naive version is limited by memory: the `T x T` score matrix;
# 7. find out which SDPA backend ran (flash, memory-efficient, cuDNN, math) and how to choose one;
# 8. time code properly: write a timer that warms up, synchronises and takes the median
#    (`time_cuda_aware`), then time inference and training, and `torch.compile`.
#
# Shapes use these letters: `b` = batch size, `T` = number of tokens, `d_in`/`d_out` = input/output
# size, `H` = number of heads, `D` = size of one head (`d_out // H`).
#
# **Every cell runs on a CPU too.** On a CPU the sizes are small and the timings only show the
# method; on a GPU (for example Colab's T4: *Runtime → Change runtime type*) the same cells use
# larger sizes and the numbers become meaningful.
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
from course_utils.device import describe_device, get_device, under_grader

_ = torch.manual_seed(123)

# %% [markdown]
# ## 0. The device and the sizes
#
# `get_device()` picks CUDA if there is a GPU, else the CPU. The benchmark sizes depend on it: a
# GPT-2-small-like layer (`d = 768`, 12 heads) in 16-bit floats on a GPU, something tiny in float32
# on a CPU so the notebook finishes in well under a minute.
#
# On a GPU we use **bfloat16** when the card supports it (Ampere, compute capability 8, and newer)
# and **float16** otherwise (a T4 is 7.5): tensor cores only run 16-bit (and TF32/8-bit) inputs.

# %% tags=["nbval-ignore-output"]
device = get_device()
ON_GPU = device.type == "cuda"
if ON_GPU:
    DTYPE = torch.bfloat16 if torch.cuda.get_device_capability(device)[0] >= 8 else torch.float16
    BATCH, D_MODEL, NUM_HEADS = 8, 768, 12
    big_gpu = torch.cuda.get_device_properties(device).total_memory > 40e9  # a 16 GB T4 stops at 2048
    SEQ_LENS = [256, 512, 1024, 2048] + ([4096] if big_gpu else [])
    WARMUP, REPEATS = 5, 20
else:
    DTYPE = torch.float32
    BATCH, D_MODEL, NUM_HEADS = 2, 128, 4
    SEQ_LENS = [64, 128, 256]
    WARMUP, REPEATS = 2, 5
    # One thread: on a shared or busy CPU, several threads of one matrix product wait for the slowest
    # one, and single runs can take ten times longer. One thread is slower but steady.
    torch.set_num_threads(1)
HEAD_DIM = D_MODEL // NUM_HEADS
CONTEXT_LENGTH = max(SEQ_LENS)
print("device:", describe_device(device), "| torch", torch.__version__)
print(f"dtype {DTYPE}, batch {BATCH}, d_model {D_MODEL}, {NUM_HEADS} heads of {HEAD_DIM}, T in {SEQ_LENS}")

# %% [markdown]
# ## 1. Where notebook 05 left us
#
# `MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads)` makes **three**
# projections, splits each into heads, and runs masked softmax attention on `(b, H, T, D)` tensors:
#
# | step | shape |
# |---|---|
# | `x` | `(b, T, d_in)` |
# | `W_query(x)`, `W_key(x)`, `W_value(x)`, split into heads | `(b, H, T, D)` each |
# | scores `Q @ K^T`, masked, softmaxed, dropout | `(b, H, T, T)` |
# | `weights @ V`, heads merged, `out_proj` | `(b, T, d_out)` |
#
# Here is that class, with the helpers it calls (`causal_mask` from notebook 04, `split_heads` and
# `merge_heads` from notebook 05): our answers from notebooks 04 and 05, shown so that this
# notebook never depends on your own earlier answers. Run the cell.

# %% shows="causal_mask split_heads merge_heads MultiHeadAttention"
# Our answers from notebooks 04 and 05.
import math

import torch
import torch.nn as nn

from course_utils.validation import check_heads_divide, check_input_3d

# %% [markdown]
# With the book's seed and sentence it prints the book's numbers:

# %%
batch = data.book_batch()  # (2, 6, 3)
torch.manual_seed(123)
mha = MultiHeadAttention(d_in=3, d_out=2, context_length=6, dropout=0.0, num_heads=2)
print(mha(batch))

# %% [markdown]
# ## 2. One projection instead of three
#
# `W_query`, `W_key` and `W_value` all read the same `x`. Stacking their weights gives one
# `nn.Linear(d_in, 3 * d_out)`: one larger matrix product, which a GPU runs more efficiently than
# three small ones (fewer kernel launches, better use of the hardware).
#
# The output `qkv = self.qkv(x)` has shape `(b, T, 3 * d_out)`. What its last dimension holds
# depends on how the rows of `self.qkv.weight`, `(3 * d_out, d_in)`, are stacked: output `j` is
# row `j` times `x`. **In this course** the rows are `W_query`'s, then `W_key`'s, then
# `W_value`'s (that is how `bench.copy_weights` fills them, below), so the last dimension holds
# all of Q (`d_out` numbers), all of K, all of V; and inside each, head 0's `D` numbers, then
# head 1's, ... For that layout the right view is
#
# `qkv.view(b, T, 3, H, D)`  — "which of q/k/v" first, then "which head", then the head's numbers.
#
# `view(b, T, H, 3, D)` has the same number of elements and raises no error, but for this layout
# it slices the numbers differently: each "head" would get pieces of Q, K and V. It is the right
# view for weights stacked **head by head** (q, k, v of head 0, then of head 1, ...), the layout
# of GPT-NeoX and Megatron-LM checkpoints. The two you will meet most use ours:
#
# - GPT-2's `c_attn` is a `Conv1D` whose weight is stored transposed, `(d_in, 3 * d_out) = (768, 2304)`;
#   its output columns are all of Q, all of K, all of V (Hugging Face splits them with
#   `split(768, dim=2)`);
# - `nn.MultiheadAttention.in_proj_weight` is `(3 * d_out, d_in)` with the rows of `W_q`, `W_k`,
#   `W_v` stacked in that order (section 5).
#
# A view only reinterprets memory: when you load someone else's weights, find out their layout.
# Then
#
# `permute(2, 0, 3, 1, 4)` → `(3, b, H, T, D)`, and `unbind(0)` → three `(b, H, T, D)` tensors.
#
# A tiny example with `d_out = 4`, `H = 2` (so `D = 2`) and numbers we can follow:

# %%
qkv_demo = torch.arange(12.0).view(1, 1, 12)  # (b=1, T=1, 3 * d_out = 12)
right = qkv_demo.view(1, 1, 3, 2, 2).permute(2, 0, 3, 1, 4)  # (3, b, H, T, D)
wrong = qkv_demo.view(1, 1, 2, 3, 2).permute(3, 0, 2, 1, 4)  # (3, b, H, T, D), wrong slicing
print("right: queries of head 0 and 1:", right[0, 0, :, 0].tolist(), "keys:", right[1, 0, :, 0].tolist())
print("wrong: queries of head 0 and 1:", wrong[0, 0, :, 0].tolist(), "keys:", wrong[1, 0, :, 0].tolist())

# %% [markdown]
# With the right view, queries are numbers 0-3 (the first `d_out`), keys 4-7, values 8-11. With
# the wrong one the "queries" mix numbers from all three blocks.
#
# ### Exercise 1: `MultiHeadAttentionCombinedQKV`
#
# Write `MultiHeadAttentionCombinedQKV(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)`.
# Create, **in this order**:
# - `self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)`,
# - `self.out_proj = nn.Linear(d_out, d_out)`,
# - `self.dropout = nn.Dropout(dropout)`,
# - the causal mask as a buffer (`self.register_buffer("mask", ...)`, True above the diagonal). A
#   buffer moves with `model.to(device)` (essential on a GPU) and is saved in `state_dict`, but is
#   not a trainable parameter: notebook 04 showed what breaks without it.
#
# `forward(x)`: `x` is `(b, T, d_in)` with `T <= context_length`; return `(b, T, d_out)`. Compute
# attention exactly as in notebook 05 (divide by `sqrt(D)`, mask the future with `-inf`, softmax,
# dropout on the weights), without `F.scaled_dot_product_attention`: that is the next exercise.
#
# **Rules** (the check and the grader apply them): `F.scaled_dot_product_attention`, `flex_attention`, `nn.MultiheadAttention` and
# `F.multi_head_attention_forward` are not allowed here.

# %% grade_id="MultiHeadAttentionCombinedQKV"
class MultiHeadAttentionCombinedQKV(nn.Module):
    """Multi-head causal attention with one (d_in -> 3 * d_out) projection for Q, K and V.

    Input (b, T, d_in) with T <= context_length; output (b, T, d_out).
    """

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.d_out = d_out
        ### BEGIN SOLUTION
        self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)  # weight (3 * d_out, d_in)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), diagonal=1))
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        b, T, _ = x.shape
        qkv = self.qkv(x)  # (b, T, 3 * d_out)
        qkv = qkv.view(b, T, 3, self.num_heads, self.head_dim)  # (b, T, 3, H, D)
        qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, b, H, T, D)
        queries, keys, values = qkv.unbind(0)  # each (b, H, T, D)
        scores = queries @ keys.transpose(-2, -1)  # (b, H, T, T)
        scores = scores.masked_fill(self.mask[:T, :T], -torch.inf)
        weights = torch.softmax(scores / self.head_dim**0.5, dim=-1)
        weights = self.dropout(weights)  # only active in train() mode
        context = (weights @ values).transpose(1, 2).reshape(b, T, self.d_out)  # (b, T, d_out)
        return self.out_proj(context)
        ### END SOLUTION

# %% grade_id="test_MultiHeadAttentionCombinedQKV" points=4
# Check: outputs for the same seed as the reference, shorter inputs, no future leaks, the mask buffer.
checks.check_MultiHeadAttentionCombinedQKV(MultiHeadAttentionCombinedQKV)
### BEGIN HIDDEN TESTS
checks.check_MultiHeadAttentionCombinedQKV(MultiHeadAttentionCombinedQKV, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# The combined layer creates its weights in a different order than three separate layers, so the
# same seed gives different numbers. To compare the two classes we **copy** the weights:
# `qkv.weight` is `W_query.weight`, `W_key.weight` and `W_value.weight` stacked on top of each
# other, `(3 * d_out, d_in)`. `bench.copy_weights(source, target)` does that (and the same for the
# other variants below). Then both compute the same function:

# %%
combined = bench.copy_weights(mha, MultiHeadAttentionCombinedQKV(3, 2, 6, 0.0, 2))
print("qkv.weight.shape:", tuple(combined.qkv.weight.shape))
print("same output as notebook 05:", torch.allclose(combined(batch), mha(batch), atol=1e-6))

# %% [markdown]
# ## 3. The same attention with `einsum`
#
# `torch.einsum` names every dimension with a letter; letters missing from the output are summed
# over. The two matrix products of attention, for `q`, `k`, `v` of shape `(b, T, H, D)`:
#
# - scores: `einsum("bqhd,bkhd->bhqk", q, k)`: for each batch, head, query `q` and key `k`, sum over `d`;
# - context: `einsum("bhqk,bkhd->bqhd", weights, v)`: for each query, sum over the keys `k`.
#
# No `transpose` needed: the output string says where each dimension goes. (With matrix
# products, `k.mT` is a short way to write `k.transpose(-2, -1)`: the transpose of the last two
# dimensions, whatever comes before them.) Our
# `MultiHeadAttentionEinsum`, below, has the same parameters as `MultiHeadAttention` (it inherits
# its constructor), so the same seed gives the same weights:

# %% shows="MultiHeadAttentionEinsum"
import math

import torch

from course_utils.validation import check_input_3d

# %%
torch.manual_seed(123)
mha_einsum = MultiHeadAttentionEinsum(d_in=3, d_out=2, context_length=6, dropout=0.0, num_heads=2)
print("same output as notebook 05:", torch.allclose(mha_einsum(batch), mha(batch), atol=1e-6))
q = torch.randn(2, 5, 3, 4)  # (b, T, H, D)
k = torch.randn(2, 5, 3, 4)
scores_einsum = torch.einsum("bqhd,bkhd->bhqk", q, k)  # (b, H, T, T)
scores_matmul = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1)  # (b, H, T, D) @ (b, H, D, T)
print("einsum scores", tuple(scores_einsum.shape), "equal to the matmul version:",
      torch.allclose(scores_einsum, scores_matmul, atol=1e-6))

# %% [markdown]
# ## 4. PyTorch's fused attention: `F.scaled_dot_product_attention`
#
# `F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)` (SDPA)
# computes `softmax(q @ k^T / sqrt(D) + mask) @ v` for `q`, `k`, `v` of shape `(..., T, D)`. It
# chooses among several implementations (section 10); the fused ones never store the `(T, T)`
# matrix. With `is_causal=True` it applies the causal mask itself:

# %%
torch.manual_seed(0)
q, k, v = torch.randn(3, 2, 4, 6, 8).unbind(0)  # each (b=2, H=4, T=6, D=8)
by_hand = torch.softmax((q @ k.transpose(-2, -1) / 8**0.5).masked_fill(causal_mask(6), -torch.inf), dim=-1) @ v
fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)
print("is_causal=True equals our masked attention:", torch.allclose(fused, by_hand, atol=1e-6))

# %% [markdown]
# **Mind the mask convention.** A boolean `attn_mask` for SDPA says where attention is
# **allowed** (True = may attend). Our `causal_mask` says the opposite (True = the future,
# blocked). So pass `~causal_mask(T)`. Passing `causal_mask(T)` itself lets every token see only
# the tokens after it, and leaves the last token nothing to see at all. Since PyTorch 2.5 SDPA
# returns zeros for such a fully masked row, on every backend; a plain `torch.softmax` over a row
# of `-inf` gives NaN instead. The zeros look harmless, which makes the mistake easy to miss:

# %%
allowed = ~causal_mask(6)  # (T, T), True on and below the diagonal
explicit = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
inverted = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(6))
print("attn_mask=~causal_mask equals is_causal=True:", torch.allclose(explicit, fused, atol=1e-6))
print("attn_mask=causal_mask (wrong way round) equals it:", torch.allclose(inverted, fused, atol=1e-6))
print("last row of the wrong version (token 5 may see nothing):", inverted[0, 0, 5, :3])
print("torch.softmax of a fully masked row:", torch.softmax(torch.full((4,), -torch.inf), dim=-1))

# %% [markdown]
# **Dropout** is an argument, `dropout_p`, not a module: SDPA applies it to the weights inside the
# kernel. SDPA does not know whether the module is training, so pass `dropout_p=self.dropout if
# self.training else 0.0` — passing `self.dropout` unconditionally would also drop weights at
# evaluation time.
#
# ### Exercise 2: `MHAPyTorchSDPA`
#
# Write `MHAPyTorchSDPA(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False)`.
# Create, **in this order**, `self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)` and
# `self.out_proj = nn.Linear(d_out, d_out)`; keep `dropout` as a number in `self.dropout`. No mask
# buffer is needed with `is_causal=True`.
#
# `forward(x)`: `x` is `(b, T, d_in)`; split `qkv` as in exercise 1 into three `(b, H, T, D)`
# tensors, call `F.scaled_dot_product_attention` once with `is_causal=True` (and the right
# `dropout_p`), merge the heads to `(b, T, d_out)` and apply `out_proj`. No `softmax` of your own.
#
# **Rules** (the check and the grader apply them): no `softmax` of your own; `flex_attention`, `nn.MultiheadAttention` and
# `F.multi_head_attention_forward` are not allowed here.

# %% grade_id="MHAPyTorchSDPA"
class MHAPyTorchSDPA(nn.Module):
    """Multi-head causal attention whose core is F.scaled_dot_product_attention.

    Input (b, T, d_in) with T <= context_length; output (b, T, d_out).
    """

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.d_out = d_out
        self.context_length = context_length
        ### BEGIN SOLUTION
        self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = dropout  # a probability: SDPA applies dropout itself
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        b, T, _ = x.shape
        qkv = self.qkv(x).view(b, T, 3, self.num_heads, self.head_dim)  # (b, T, 3, H, D)
        queries, keys, values = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (b, H, T, D)
        dropout_p = self.dropout if self.training else 0.0
        context = F.scaled_dot_product_attention(queries, keys, values, dropout_p=dropout_p, is_causal=True)
        context = context.transpose(1, 2).reshape(b, T, self.d_out)  # (b, T, d_out)
        return self.out_proj(context)
        ### END SOLUTION

# %% grade_id="test_MHAPyTorchSDPA" points=4
# Check: outputs for the same seed as the reference, one SDPA call, no future leaks.
checks.check_MHAPyTorchSDPA(MHAPyTorchSDPA)
### BEGIN HIDDEN TESTS
checks.check_MHAPyTorchSDPA(MHAPyTorchSDPA, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### SDPA with an explicit mask
#
# `with_explicit_mask(MHAPyTorchSDPA)`, below, is your class with one change: it keeps the causal
# mask as a buffer and, whenever your `forward` asks SDPA for `is_causal=True`, passes
# `attn_mask=~mask[:T, :T]` instead (SDPA's boolean mask means True = "may attend"). Same result; but
# with an arbitrary mask SDPA cannot skip the blocks above the diagonal and some fused kernels refuse
# a mask, so it may run a slower backend. We time it below.

# %% shows="course_utils.instructor.bench_impls:with_explicit_mask"
import inspect
from unittest import mock

import torch
import torch.nn.functional as F

# %%
MHASDPAExplicitMask = with_explicit_mask(MHAPyTorchSDPA)  # your class, with SDPA given an explicit mask
explicit_mha = bench.copy_weights(mha, MHASDPAExplicitMask(3, 2, 6, 0.0, 2))
print("explicit-mask SDPA equals notebook 05:", torch.allclose(explicit_mha(batch), mha(batch), atol=1e-6))

# %% [markdown]
# ## 5. `nn.MultiheadAttention`
#
# PyTorch also ships a complete module, `nn.MultiheadAttention(embed_dim, num_heads, dropout,
# bias, batch_first=True)`. Three things differ from our classes:
#
# - it needs `d_in == d_out` (both are `embed_dim`);
# - its `in_proj_weight` is exactly our combined `qkv.weight`, `(3 * d_out, d_in)`; one `bias`
#   flag switches the biases of the input *and* the output projection together;
# - its boolean `attn_mask` means **True = NOT allowed**: the same convention as our
#   `causal_mask`, the opposite of SDPA's. Two PyTorch functions, two conventions: always check.
#
# With `need_weights=False` it does not return the `(T, T)` weights and can call SDPA inside;
# with the default `need_weights=True` it must build them. `MHAPyTorchClass`, below, wraps it with
# the book's constructor; `bench.copy_weights` fills `in_proj_weight` from our three matrices.

# %% shows="course_utils.instructor.bench_impls:MHAPyTorchClass"
import torch
import torch.nn as nn

from course_utils.validation import check_input_3d

# %%
torch.manual_seed(123)
mha_square = MultiHeadAttention(d_in=4, d_out=4, context_length=6, dropout=0.0, num_heads=2)
x_square = torch.rand(2, 6, 4)  # (b, T, d) with d_in == d_out
torch_mha = bench.copy_weights(mha_square, MHAPyTorchClass(4, 4, 6, 0.0, 2)).eval()
print("in_proj_weight:", tuple(torch_mha.multihead_attn.in_proj_weight.shape))
print("nn.MultiheadAttention equals notebook 05:", torch.allclose(torch_mha(x_square), mha_square(x_square), atol=1e-6))
out_blocked, _ = torch_mha.multihead_attn(x_square, x_square, x_square, attn_mask=~causal_mask(6), need_weights=False)
print("with SDPA's convention (~mask) instead, it sees the future:",
      not torch.allclose(out_blocked[:, 1:], mha_square(x_square)[:, 1:], atol=1e-4))

# %% [markdown]
# ## 6. FlexAttention
#
# FlexAttention (`torch.nn.attention.flex_attention`, PyTorch 2.5+) lets you describe a mask as a
# small Python function, `mask_mod(b, h, q_idx, kv_idx) -> bool` (True = may attend), and compiles
# it into a FlashAttention-style kernel. For causal attention: `q_idx >= kv_idx`.
# `create_block_mask` turns that function into a block-sparse mask: `128 x 128` tiles that lie
# entirely in the future are skipped, not computed and thrown away. Sliding windows, document
# masks or prefix-LM masks are one line each.
#
# `MHAFlexAttention`, below, is a multi-head attention module with the book's constructor whose core
# is `flex_attention` with that causal `mask_mod` (`bench.causal_mask_mod`):

# %% shows="course_utils.instructor.bench_impls:MHAFlexAttention"
import warnings

import torch
import torch.nn as nn

from course_utils.bench import causal_mask_mod
from course_utils.validation import check_heads_divide, check_input_3d

# %% [markdown]
# The fused kernel only exists under `torch.compile`, and compiling is slow on a CPU (many
# seconds). Without compiling, FlexAttention still runs, but materialises the full score matrix:
# correct, not fast. We try it and print what happened:

# %% tags=["nbval-ignore-output"]
FLEX_OK, FLEX_HOW = bench.flex_attention_status(device, head_dim=1)  # the demo below has heads of size 1
print("FlexAttention:", "available," if FLEX_OK else "skipped:", FLEX_HOW)
if FLEX_OK:
    from torch.nn.attention.flex_attention import create_block_mask

    block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, 256, 256, device="cpu")
    print(block_mask)  # which 128 x 128 blocks are computed
    flex_mha = bench.copy_weights(mha, MHAFlexAttention(3, 2, 6, 0.0, 2, compile=ON_GPU))
    with torch.no_grad():  # on a CPU FlexAttention has no backward pass, so no graph either
        print("FlexAttention equals notebook 05:", torch.allclose(flex_mha(batch), mha(batch), atol=1e-6))

# %% [markdown]
# ## 7. All versions, checked before anything is timed
#
# A fast wrong answer is worthless, and a benchmark that times a broken version is misleading.
# So every implementation is built with the **same weights** (copied from one seeded notebook-05
# module), run on the same input, and compared with the reference output. Only those that agree
# are timed. `bench.verify(expected, got)` returns `None` or a sentence saying what differs.

# %%
def build_all(d_model: int, context_length: int, num_heads: int) -> dict[str, nn.Module]:
    """Every implementation with the weights of one seeded MultiHeadAttention, in eval() mode."""
    args = (d_model, d_model, context_length, 0.0, num_heads)
    torch.manual_seed(123)
    source = MultiHeadAttention(*args)
    variants = {
        "notebook 05": source,
        "combined QKV": MultiHeadAttentionCombinedQKV(*args),
        "einsum": MultiHeadAttentionEinsum(*args),
        "SDPA is_causal": MHAPyTorchSDPA(*args),
        "SDPA explicit mask": MHASDPAExplicitMask(*args),
        "nn.MultiheadAttention": MHAPyTorchClass(*args),
    }
    if FLEX_OK:
        variants["FlexAttention"] = MHAFlexAttention(*args, compile=ON_GPU)
    return {name: bench.copy_weights(source, m).eval() for name, m in variants.items()}


models = {name: m.to(device=device, dtype=DTYPE) for name, m in build_all(D_MODEL, CONTEXT_LENGTH, NUM_HEADS).items()}
x_check = torch.randn(BATCH, SEQ_LENS[0], D_MODEL, generator=torch.Generator().manual_seed(1)).to(device)
with torch.no_grad():
    expected = models["notebook 05"].float()(x_check)  # reference output in float32
    models["notebook 05"].to(DTYPE)
    verdicts = {name: bench.verify(expected, m(x_check.to(DTYPE))) for name, m in models.items()}
for name, problem in verdicts.items():
    print(f"{name:22s} {'agrees with the reference' if problem is None else 'WRONG: ' + problem}")
correct = {name: m for name, m in models.items() if verdicts[name] is None}

# %% [markdown]
# The gate also catches a bug. Here is SDPA with `is_causal` forgotten: your `MHAPyTorchSDPA`, run
# with an SDPA that drops the `is_causal=True` it is given (`bench.forgetting_causal` plants that
# bug in any class). `bench.checked_time` refuses to time it and says why.

# %%
ForgotCausal = bench.forgetting_causal(MHAPyTorchSDPA)  # your class, with is_causal=True lost on the way to SDPA
broken = bench.copy_weights(mha, ForgotCausal(3, 2, 6, 0.0, 2))
try:
    bench.checked_time(lambda: broken(batch), mha(batch).detach(), name="ForgotCausal")
except bench.IncorrectImplementation as exc:
    print(exc)

# %% [markdown]
# ## 8. Counting FLOPs
#
# A **FLOP** is one floating-point operation (an add or a multiply). Attention's core is two
# matrix products per head:
#
# - scores `Q @ K^T`: `(T, D) @ (D, T)` → `T * T` entries, each a dot product of length `D`:
#   `T^2 * D` multiply-adds;
# - context `weights @ V`: `(T, T) @ (T, D)` → `T * D` entries, each a sum over `T` keys: `T^2 * D`
#   multiply-adds.
#
# A multiply-add is 2 FLOPs, so one head costs `2 * 2 * T^2 * D`, and the batch
# `4 * B * H * T^2 * D`. With a causal mask half of the scores are never needed, and a good kernel
# skips them: count half. (Softmax, scaling and masking cost `O(T^2)`, not `O(T^2 D)`; the
# projections cost `O(T d^2)`. We leave both out: the quantity that grows fastest with `T` is the
# one that matters here.)
#
# ### Exercise 3: `attention_flops`
#
# Write `attention_flops(batch, num_heads, seq_len, head_dim, causal=True)` returning the forward
# FLOPs `4 * B * H * T^2 * D`, halved when `causal` is True, as an integer.

# %% grade_id="attention_flops"
def attention_flops(batch: int, num_heads: int, seq_len: int, head_dim: int, causal: bool = True) -> int:
    """Forward FLOPs of Q K^T and weights @ V for (batch, num_heads, seq_len, head_dim) tensors."""
    ### BEGIN SOLUTION
    flops = 4 * batch * num_heads * seq_len**2 * head_dim
    return flops // 2 if causal else flops
    ### END SOLUTION

# %% grade_id="test_attention_flops" points=2
checks.check_attention_flops(attention_flops)
### BEGIN HIDDEN TESTS
checks.check_attention_flops(attention_flops, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# For a GPT-2-small layer (12 heads of 64) on a batch of 8 sequences of 1024 tokens:

# %%
for T in (1024, 2048, 4096):
    f = attention_flops(8, 12, T, 64)
    print(f"T={T:5d}: {f:>16,} FLOPs = {f / 1e9:7.1f} GFLOP (causal)")

# %% [markdown]
# Doubling `T` quadruples the work. Dividing FLOPs by the measured time gives the **achieved
# throughput** in TFLOP/s (10^12 FLOP/s), which we compare with the GPU's **peak**: the most its
# tensor cores can do. The peak depends on the data type. Dense figures (no sparsity) from the
# vendor data sheets, kept in `bench.GPU_SPECS`:

# %%
print(f"{'GPU':14s} {'FP16/BF16 tensor':>17s} {'FP32':>7s} {'memory':>8s} {'bandwidth':>10s}")
for spec in dict.fromkeys(bench.GPU_SPECS.values()):
    bf16 = "" if spec.bf16_supported else " (FP16 only)"
    print(f"{spec.name:14s} {spec.tensor_16bit_tflops:>8.1f} TFLOP/s{bf16:12s} {spec.fp32_tflops:>5.1f} "
          f"{spec.memory_gb:>6.0f} GB {spec.bandwidth_gbs:>7,.0f} GB/s")
print()
for spec in dict.fromkeys(bench.GPU_SPECS.values()):
    print(f"- {spec.source}")

# %% [markdown]
# Two remarks on reading the table:
# - the A100, H100 and H200 data sheets print the tensor-core number *with 2:4 sparsity* (two of
#   every four weights zero), twice the dense number; normal attention is dense, so we halved it
#   (the table shows the dense figures). The T4 (Turing) has no sparsity support: its 65 TFLOP/s
#   is already dense, and appears unchanged;
# - the FP32 column is for plain float32. PyTorch uses it for float32 matrix products unless you
#   allow TF32, with `torch.set_float32_matmul_precision("high")` (or the older
#   `torch.backends.cuda.matmul.allow_tf32 = True`): then float32 products run on the tensor cores
#   (Ampere and newer) with a 10-bit mantissa, faster and a little less precise.

# %% [markdown]
# ## 9. Why the naive version is limited by memory
#
# The naive classes build the scores as a `(b, H, T, T)` tensor, then mask it (a new tensor),
# scale and softmax it (another), apply dropout (another), and read it again for `weights @ V`.
# Each of those steps does a handful of FLOPs per element while reading and writing every
# element from GPU memory: a few FLOPs per 8 or 16 bytes moved.
#
# A GPU does far more arithmetic per second than it can move bytes: an H100 SXM has
# 989.5 TFLOP/s against 3.35 TB/s, so it needs about **295 FLOPs per byte** to keep its tensor
# cores busy. The softmax step has about 1. It is **memory-bound**: the time goes into moving the
# `T x T` matrix, and the tensor cores wait. Fused kernels (FlashAttention, memory-efficient) cut
# the matrix into tiles that stay in on-chip memory (SRAM) and never write it out.
#
# How big is one score tensor? `b * H * T^2` elements times the bytes per element:

# %%
B_MEM, H_MEM = 8, 12  # GPT-2 small: 12 heads, batch of 8
dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
print(f"one (b={B_MEM}, H={H_MEM}, T, T) score tensor:")
for T in (1024, 4096, 16384, 32768):
    sizes = ", ".join(f"{name} {bench.score_matrix_bytes(B_MEM, H_MEM, T, dt) / 1e9:8.2f} GB"
                      for name, dt in dtypes.items() if name != "float16")
    print(f"  T={T:6d}: {sizes}")
print()
print("largest T for which ONE such tensor fits in the whole GPU memory:")
for spec in (bench.GPU_SPECS["T4"], bench.GPU_SPECS["A100"], bench.GPU_SPECS["H100"], bench.GPU_SPECS["H200"]):
    t32 = bench.max_seq_len_for_scores(spec.memory_gb * 1e9, B_MEM, H_MEM, torch.float32)
    t16 = bench.max_seq_len_for_scores(spec.memory_gb * 1e9, B_MEM, H_MEM, torch.bfloat16)
    print(f"  {spec.name:14s} {spec.memory_gb:4.0f} GB: float32 T <= {t32:6,}, 16-bit T <= {t16:6,}")

# %% [markdown]
# And that is one tensor; training keeps several of them for the backward pass. The fused kernels
# need memory proportional to `T`, not `T^2`. The figure shows the growth on log-log axes: a
# straight line of slope 2.

# %%
Ts = [2**p for p in range(8, 17)]
fig, ax = plt.subplots(figsize=(6.5, 4))
for name, dt in (("float32", torch.float32), ("bfloat16 / float16", torch.bfloat16)):
    ax.plot(Ts, [bench.score_matrix_bytes(B_MEM, H_MEM, T, dt) / 1e9 for T in Ts], marker="o", label=f"scores, {name}")
for spec, style in ((bench.GPU_SPECS["T4"], ":"), (bench.GPU_SPECS["H100"], "--"), (bench.GPU_SPECS["H200"], "-.")):
    ax.axhline(spec.memory_gb, color="gray", linestyle=style, label=f"{spec.name}: {spec.memory_gb:.0f} GB")
plotting.readable_log_axes(ax, Ts)
ax.tick_params(axis="x", labelrotation=45)
ax.set_xlabel("sequence length T")
ax.set_ylabel("GB")
ax.set_title(f"one (b={B_MEM}, H={H_MEM}, T, T) score tensor")
ax.legend(fontsize=9)
fig.tight_layout()
plt.show()

# %% [markdown]
# On a GPU we can also **measure** the extra memory of one forward pass with
# `torch.cuda.max_memory_allocated` (`bench.peak_memory`). On a CPU this is not available:
# Python's `tracemalloc` does not see PyTorch's allocator, so the helper says so and returns None.

# %% tags=["nbval-ignore-output"]
T_mem = SEQ_LENS[-1]
x_mem = torch.randn(BATCH, T_mem, D_MODEL, device=device, dtype=DTYPE)
for name in ("notebook 05", "SDPA is_causal"):
    try:
        with torch.no_grad():
            report = bench.peak_memory(lambda: correct[name](x_mem), device)
    except torch.cuda.OutOfMemoryError:
        report = "out of memory"
        torch.cuda.empty_cache()
    one_matrix = bench.score_matrix_bytes(BATCH, NUM_HEADS, T_mem, DTYPE)
    print(f"{name:16s} T={T_mem}: {report}; one score tensor would be {one_matrix / 2**20:.1f} MiB")

# %% [markdown]
# ## 10. Which SDPA backend ran?
#
# `F.scaled_dot_product_attention` is a dispatcher. For each call it checks the device, dtype,
# head size, mask and dropout, and runs the first backend that accepts them:
#
# | backend | what it is | where it runs |
# |---|---|---|
# | **flash** | FlashAttention-2: tiles in SRAM, never stores `T x T` | NVIDIA Ampere (A100, RTX 30xx) and newer (H100, H200); FP16/BF16 only; on a GPU no arbitrary mask (`is_causal` only). Not on a T4 (Turing). A separate CPU flash kernel exists, and it does accept a mask (see its output below) |
# | **memory-efficient** | the xFormers kernel, also tiled | most NVIDIA GPUs including the T4; FP32 too; accepts a mask |
# | **cuDNN** | NVIDIA's fused attention in cuDNN 9 | NVIDIA Ampere and newer (compute capability 8.0+); which GPUs PyTorch tries it on first, before flash, changes between versions (Hopper, H100/H200, first of all) |
# | **math** | plain PyTorch ops, stores `T x T` | everywhere: the fallback (and on a CPU whenever dropout is on) |
#
# So on a Colab T4 in FP16 you get memory-efficient attention, on an A100 or H100 in BF16 flash
# or cuDNN, and on a CPU the CPU flash kernel or math. To **force** a backend, wrap the call in
# `torch.nn.attention.sdpa_kernel(SDPBackend.X)`; if that backend cannot run these inputs, SDPA
# raises an error instead of silently falling back. `bench.sdpa_backends_available` tries each one:

# %% tags=["nbval-ignore-output"]
from torch.nn.attention import SDPBackend, sdpa_kernel

q, k, v = torch.randn(3, BATCH, NUM_HEADS, SEQ_LENS[0], HEAD_DIM, device=device, dtype=DTYPE).unbind(0)
for backend, status in bench.sdpa_backends_available(q, k, v).items():
    print(f"  {backend:20s} {status}")
with sdpa_kernel(SDPBackend.MATH):  # force the fallback, e.g. to compare numbers
    out_math = F.scaled_dot_product_attention(q, k, v, is_causal=True)
print("forced math backend agrees with the default:",
      bench.verify(F.scaled_dot_product_attention(q, k, v, is_causal=True), out_math) is None)

# %% [markdown]
# Which one did a call actually use? `bench.sdpa_backend_used(fn)` watches the ATen operators that
# run during `fn()`: each fused backend has its own. (`torch.profiler` shows the same operator
# names.) Dropout or an explicit mask can change the choice:

# %% tags=["nbval-ignore-output"]
calls = {
    "is_causal=True": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "explicit bool mask": lambda: F.scaled_dot_product_attention(
        q, k, v, attn_mask=~causal_mask(q.shape[-2], device=device)),
    "is_causal + dropout 0.1": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1),
}
for label, fn in calls.items():
    print(f"  {label:24s} -> {', '.join(bench.sdpa_backend_used(fn))}")

# %% [markdown]
# ## 11. Timing done right
#
# Four rules, and what goes wrong without each:
#
# 1. **Warm up.** The first calls pay one-time costs: memory allocation, choosing kernels, CUDA
#    context start-up, and with `torch.compile` the whole compilation.
# 2. **Synchronise.** A CUDA kernel launch returns immediately; the GPU works in the background.
#    A clock read right after `model(x)` measures the *launch*, not the work. Call
#    `torch.cuda.synchronize()` before reading the clock, or record **CUDA events** on the GPU's
#    own timeline (`bench.time_fn` does this on a GPU).
# 3. **Take the median of repeats.** Other processes, clock boosts and the cache make single runs
#    noisy; the median ignores the outliers.
# 4. **Time what you will run.** Inference: `model.eval()` and `torch.no_grad()` (no graph is
#    recorded). Training: forward **and** backward, because the backward costs about twice the
#    forward.
#
# ### Exercise 4: `time_cuda_aware`
#
# Write the timer yourself. `time_cuda_aware(fn, warmup=3, repeats=10)` returns the **median**
# time of one call of `fn()`, in **seconds** (a float):
#
# 1. call `fn()` `warmup` times without timing them;
# 2. then `repeats` times: read the clock with `time.perf_counter()`, call `fn()`, read it again,
#    and keep the difference;
# 3. when `torch.cuda.is_available()`, call `torch.cuda.synchronize()` right before starting the
#    clock (so no work queued earlier is charged to this call) and right before stopping it (so
#    this call's work is finished). On a machine without a GPU, `torch.cuda.synchronize()` raises:
#    synchronise only where the device needs it;
# 4. return the median of the `repeats` times (`statistics.median`).
#
# `time` and `statistics` are imported at the top of the notebook. Without a GPU, how can the
# check tell whether you synchronise? It runs your timer on a **simulated GPU**: it replaces
# `time.perf_counter` by a fake clock and `torch.cuda.synchronize` by a fake device, whose work
# only finishes when it is synchronised, and whose first calls are slow. An unsynchronised timer
# measures only the launches there (about 0.01 ms), and a timer without warm-up the slow calls.
# So write `time.perf_counter()`, not `from time import perf_counter`, and no CUDA events.
#
# **Rules** (the check and the grader apply them): write the timer yourself: `bench.time_fn`, `checked_time`, `Timer` and `timeit`
# are not allowed here.

# %% grade_id="time_cuda_aware"
def time_cuda_aware(fn, warmup: int = 3, repeats: int = 10) -> float:
    """Median seconds of one fn() call: warmup untimed calls, then repeats timed ones, synchronising CUDA."""
    ### BEGIN SOLUTION
    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
    ### END SOLUTION

# %% grade_id="test_time_cuda_aware" points=3
# Check: on a simulated GPU (work finishes only when synchronised, slow first calls) and a CPU without CUDA.
checks.check_time_cuda_aware(time_cuda_aware)
### BEGIN HIDDEN TESTS
checks.check_time_cuda_aware(time_cuda_aware, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# Now the rules on a real model. First the cold call alone; then, after a warm-up, the same warm
# calls timed without synchronising and with your timer. The warm-up comes first so that the
# two warm timings differ only in the synchronisation; they are taken in turn, 15 pairs or more.
# On a GPU the unsynchronised time is the launch only, far too small. On a CPU there is nothing to
# wait for: the two are the same measurement, and any difference between them is noise (large on
# a busy machine: compare the spread printed last).

# %% tags=["nbval-ignore-output"]
model = correct["notebook 05"]
x_time = torch.randn(BATCH, SEQ_LENS[-1], D_MODEL, device=device, dtype=DTYPE)


def forward():
    with torch.no_grad():
        return model(x_time)


bench.synchronize(device)
t0 = time.perf_counter()
forward()
bench.synchronize(device)
cold_s = time.perf_counter() - t0  # the first call, with its one-time costs

for _ in range(WARMUP):
    forward()
bench.synchronize(device)
unsynced, synced = [], []
PAIRS = max(REPEATS, 15)  # cheap here: one forward pass each
for _ in range(PAIRS):  # the two kinds in turn, so that a busy machine slows both alike
    t0 = time.perf_counter()
    forward()  # no synchronize: on a GPU this only measures the launch
    unsynced.append(time.perf_counter() - t0)
    bench.synchronize(device)  # let the queued work finish before the next measurement
    synced.append(time_cuda_aware(forward, warmup=0, repeats=1))  # already warm

print(f"first (cold) call:                  {1e3 * cold_s:8.3f} ms")
print(f"warm, without synchronize (median): {1e3 * statistics.median(unsynced):8.3f} ms   (on a GPU: the launch only)")
print(f"warm, time_cuda_aware (median):     {1e3 * statistics.median(synced):8.3f} ms")
warm = bench.time_fn(forward, device=device, warmup=WARMUP, repeats=REPEATS)
print(f"bench.time_fn, for comparison:      {warm}")
print(f"spread of bench.time_fn's repeats (max - min) / median: {warm.spread:.0%}")

# %% [markdown]
# Now every correct implementation at every sequence length, inference and training. You timed one
# call by hand above; from here the course's runner does the same for all of them:
# `bench.run(models, config, flops, expected_from)` checks each module against the expected output
# at every `T` (a wrong one is reported, never timed), then times it with `bench.time_fn` (the same
# method as your timer, plus CUDA events on a GPU). FLOPs come from your `attention_flops`
# (training: 3x the forward, see `bench.training_flops`), then TFLOP/s and the percentage of the
# peak where the GPU is known. `bench.format_table` prints the medians.
#
# The 3x is a convention: the backward pass does about twice the forward's matrix products (one
# for the gradient of each input of a product). FlashAttention's papers count **3.5x** for
# attention instead, because their backward also recomputes the scores `Q K^T` instead of storing
# them (2.5x the forward for the backward alone). Two TFLOP/s figures computed with different
# conventions cannot be compared directly.
# The TFLOP/s count only the attention core, so at small `T`, where the projections dominate,
# they understate the work done. (While a notebook is graded, this sweep is skipped: no graded cell
# needs its timings.)

# %% tags=["nbval-ignore-output"]
config = bench.BenchConfig(str(device), str(DTYPE).replace("torch.", ""), batch=BATCH, d_model=D_MODEL,
                           num_heads=NUM_HEADS, seq_lens=SEQ_LENS, modes=["inference", "training"],
                           warmup=WARMUP, repeats=REPEATS)
peak = bench.peak_tflops(device, DTYPE)
print(f"peak for {DTYPE}: {peak if peak is not None else 'unknown (not a GPU in the table)'}")
result = None  # stays None while grading
if under_grader():
    print("skipped while grading")
else:
    result = bench.run(correct, config, flops=attention_flops, expected_from=["notebook 05", "SDPA is_causal"],
                       log=lambda line: None)
    for mode in config.modes:
        print()
        print(bench.format_table(result, mode, baseline="SDPA is_causal"))  # SDPA never stores T x T

# %% [markdown]
# The same numbers as a figure. On a GPU the naive versions grow like `T^2` in time *and* memory,
# and SDPA pulls away as `T` grows; on a CPU with these tiny sizes the curves mostly show
# overheads, so do not draw conclusions from them.

# %% tags=["nbval-ignore-output"]
if result is not None:
    bench.plot_results(result)
    plt.show()

# %% [markdown]
# ### `torch.compile`
#
# `torch.compile(model)` traces the forward into a graph and generates fused kernels for it (for
# example, the scale + mask + softmax + dropout chain of the naive version becomes one kernel that
# reads the scores once). The first call compiles, which takes seconds to minutes: exactly why
# warm-up matters. On a CPU compiling needs a C++ compiler and is slow, so this cell only runs on
# a GPU unless you set `TRY_COMPILE = True`.

# %% tags=["nbval-ignore-output"]
TRY_COMPILE = ON_GPU and not under_grader()  # compiling takes a while: never while grading
if not TRY_COMPILE:
    print("torch.compile skipped: " + ("while grading" if under_grader() else
                                       "no GPU here (set TRY_COMPILE = True to try it on the CPU; it takes a while)"))
else:
    T = SEQ_LENS[-1] if ON_GPU else SEQ_LENS[0]
    x_T = torch.randn(BATCH, T, D_MODEL, device=device, dtype=DTYPE)
    for name in ("notebook 05", "SDPA is_causal"):
        compiled = torch.compile(correct[name])
        t0 = time.perf_counter()
        with torch.no_grad():
            problem = bench.verify(correct[name](x_T), compiled(x_T))  # the first call compiles
        bench.synchronize(device)
        compile_s = time.perf_counter() - t0
        if problem:
            print(f"{name}: compiled version is wrong ({problem}); not timed")
            continue
        with torch.no_grad():
            eager = bench.time_fn(lambda: correct[name](x_T), device=device, warmup=WARMUP, repeats=REPEATS)
            fast = bench.time_fn(lambda: compiled(x_T), device=device, warmup=WARMUP, repeats=REPEATS)
        print(f"{name:16s} T={T}: eager {eager.median_ms:8.3f} ms, compiled {fast.median_ms:8.3f} ms "
              f"(first call incl. compilation {compile_s:.1f} s)")

# %% [markdown]
# ### The benchmark script
#
# The same comparison over a longer sweep, with a JSON file of results and a plot, is one command
# (it checks every implementation before timing it, too):
#
# ```
# python -m course_utils.bench --out bench-results      # add --help for the options
# ```
#
# On a busy shared CPU, `--threads 1` gives steadier numbers: when more threads want to run than
# there are free cores, a parallel matrix product waits for its slowest thread, and single runs
# can take ten times longer than usual.
#
# On a Colab GPU, run it in a cell with `!python -m course_utils.bench` and look at
# `bench-results/attention_bench.png`.

# %% [markdown]
# ## Check your understanding
#
# Click a question to see the answer.
#
# <details><summary>1. <code>qkv</code> has shape <code>(b, T, 3 * d_out)</code>. Why is <code>view(b, T, 3, H, D)</code> right here and <code>view(b, T, H, 3, D)</code> wrong, although both run?</summary>
#
# Because of how the weight rows are stacked. In this course (and in GPT-2's `c_attn` and
# `nn.MultiheadAttention.in_proj_weight`) the output is laid out as all of Q, then all of K, then
# all of V: the weight is `W_query`, `W_key`, `W_value` stacked. The first view reads it that way.
# The second assumes head-major order (q, k, v of head 0, then head 1, ...), which is right only
# for weights stacked that way (GPT-NeoX, Megatron-LM); on ours it gives each "query" numbers from
# Q, K and V. A view only reinterprets memory; it cannot know what the numbers mean.
# </details>
#
# <details><summary>2. You pass <code>attn_mask=causal_mask(T)</code> to <code>F.scaled_dot_product_attention</code>. What happens?</summary>
#
# For SDPA a boolean True means "may attend", so every token attends only to the future, and the
# last token to nothing: its row is fully masked, and SDPA returns zeros there (on every backend,
# since PyTorch 2.5), where `torch.softmax` over a row of `-inf` would give NaN. Use
# `~causal_mask(T)` or, better, `is_causal=True`. `nn.MultiheadAttention` uses the opposite
# convention (True = blocked).
# </details>
#
# <details><summary>3. Causal attention with B=1, H=1, T=4, D=2: how many FLOPs?</summary>
#
# `4 * 1 * 1 * 16 * 2 = 128`, halved: `64`. Two products of `T^2 * D = 32` multiply-adds each, 2 FLOPs per
# multiply-add, half of it masked.
# </details>
#
# <details><summary>4. Your timing of a GPU model is 0.05 ms for any T. What is most likely wrong?</summary>
#
# No synchronisation: the clock measured the kernel launch, which returns at once. Synchronise
# (`torch.cuda.synchronize()`) before reading the clock, or use CUDA events, and warm up first.
# </details>
#
# <details><summary>5. Why is the naive attention memory-bound rather than compute-bound?</summary>
#
# Its mask, softmax and dropout steps each read and write the whole `(b, H, T, T)` tensor from GPU
# memory and do only a few FLOPs per element, far below the ~300 FLOPs per byte an H100 needs to keep
# its tensor cores busy. Fused kernels keep tiles of that matrix in on-chip memory and never write it out.
# </details>
#
# <details><summary>6. On a T4, which SDPA backend runs for FP16 causal attention, and why not flash?</summary>
#
# Memory-efficient attention. PyTorch's FlashAttention-2 kernel needs an Ampere or newer GPU
# (compute capability 8.0+); the T4 is Turing (7.5).
# </details>
#
# <details><summary>7. Find the bug: a timer on a GPU reads <code>t0 = time.perf_counter(); model(x); torch.cuda.synchronize(); t1 = time.perf_counter()</code>, right after ten untimed calls of <code>model(x)</code>. The first repeat is far slower than the rest. Why?</summary>
#
# The ten warm-up calls were queued, not finished: nothing waited for them. The first repeat's
# `synchronize` waits for all of them, and charges their time to that repeat. Synchronise before
# starting the clock too. (The median of several repeats hides one such outlier, which is one
# reason to take the median; a mean would not.)
# </details>
#
# <details><summary>8. Predict the output: on a GPU, <code>time_cuda_aware(lambda: model(x), 3, 10)</code> gives 2.0 ms at <code>T = 1024</code>. Roughly what do you expect at <code>T = 2048</code> for the naive attention, if the <code>(T, T)</code> work dominates?</summary>
#
# About 8 ms: the FLOPs and the size of the score matrix both grow like `T^2`, so doubling `T`
# quadruples the time. At small `T` the projections (which grow like `T`) and fixed overheads
# weigh more, and the growth is slower.
# </details>

# %% [markdown]
# ## Recap
#
# - One `nn.Linear(d_in, 3 * d_out)` replaces three projections; split it with
#   `view(b, T, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)`.
# - `einsum` writes the attention products with named indices and no transposes.
# - `F.scaled_dot_product_attention(q, k, v, dropout_p=..., is_causal=True)` runs a fused kernel that
#   never stores `T x T`; its boolean mask means True = allowed, `nn.MultiheadAttention`'s True = blocked.
# - FlexAttention describes masks as functions and compiles them into block-sparse fused kernels.
# - Attention's core costs `4 * B * H * T^2 * D` FLOPs (half when causal); naive attention also
#   stores `B * H * T^2` scores, which is what limits it on a GPU: memory traffic, then memory size.
# - Check correctness first, then time with warm-up, synchronisation (or CUDA events) and the
#   median of repeats, as your `time_cuda_aware` does; time training as forward plus backward
#   (3x the forward's FLOPs by the usual convention, 3.5x in FlashAttention's papers).
