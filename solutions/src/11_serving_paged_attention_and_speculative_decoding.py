# %% [markdown]
# # 11 · Serving many users at once: a paged KV cache, paged attention and speculative decoding
#
# Notebook 08 cached the keys and values of **one** sequence in one contiguous tensor, and notebook 09
# generated one batch whose rows all had the same length. A server for a language model does neither:
# thousands of users send prompts of every length, each answer stops at its own time, and new requests
# arrive while others are half written. The KV cache is most of the GPU memory such a server uses, so how
# it stores that cache decides how many users it can serve at once.
#
# This notebook builds the idea at the heart of vLLM (Kwon et al., "Efficient Memory Management for Large
# Language Model Serving with PagedAttention", SOSP 2023): keep the cache in **fixed-size blocks**, like an
# operating system keeps memory in pages, and give each sequence a **block table** that lists its blocks.
#
# **In this notebook you will**
# 1. see how much memory a cache of one maximum-length tensor per sequence wastes;
# 2. write a KV cache made of blocks, with a free list and a block table per sequence: `PagedKVCache`;
# 3. draw its pool of blocks, and **measure** the memory it wastes on a realistic mix of lengths,
#    against one maximum-length tensor per sequence;
# 4. write the attention of one decoding step for a batch of sequences of different lengths, reading
#    the keys and values straight from their blocks, with grouped-query heads: `paged_attention`;
# 5. serve a trained model to many requests with **continuous batching**: requests join and leave the
#    batch at every step, and wait or are preempted when the blocks run out: `ContinuousBatcher`;
#    count its steps and time it against static batching;
# 6. write **speculative decoding**: a small draft model proposes `k` tokens, the target checks them in
#    one pass, and a rejection rule keeps the target's distribution exactly: `speculative_generate`;
#    measure how the acceptance rate and the target passes saved change with `k` and the draft's quality;
# 7. read what a real server adds: prefix sharing, chunked prefill, scheduling.
#
# Shapes use these letters: `b` = number of sequences in a batch, `H` = number of query heads,
# `kv` = number of key/value heads (`H` is a multiple of it, notebook 08's grouped-query attention),
# `D` = size of one head, `T` = number of tokens of a sequence, `B` = block size (tokens per block),
# `N` = number of blocks in the pool.
#
# How to work: fill in each cell that says `# YOUR CODE HERE`, run it, then run the check cell
# below it. A ✅ means your code agrees with ours on several inputs; a ❌ tells you what differs.

# %% setup=true

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from course_utils import checks, serving, tasks, training

torch.manual_seed(123)
torch.set_num_threads(1)  # small tensors: one thread is as fast, and steady on a busy machine
print("torch", torch.__version__)

# %% [markdown]
# ## 0. Where notebook 08 left us
#
# Notebook 08's `MultiHeadAttentionKVCache` keeps, in every layer, two tensors `cache_k` and `cache_v`
# of shape `(b, H, T, D)` and concatenates each new token's key and value to them. That is fine for one
# sequence. A server that holds many sequences at once has two bad choices with contiguous tensors:
#
# - **grow each sequence's tensor** as it writes: every `torch.cat` copies the whole cache, and the
#   memory fragments into pieces of every size;
# - **reserve the maximum length up front** (what servers did before vLLM): a request that may write up
#   to 2,048 tokens gets 2,048 slots at once, even if it stops after 50.
#
# The second wastes most of the memory. How much, for requests of these lengths?

# %%
lengths = serving.request_lengths(200, seed=0)  # prompt + answer of 200 requests, in tokens
MAX_LEN = 2048
used = sum(lengths)
reserved = serving.reserved_contiguous(lengths, MAX_LEN)
print(f"200 requests: median {sorted(lengths)[100]} tokens, longest {max(lengths)}, {used:,} tokens in all")
print(f"one {MAX_LEN}-slot tensor per request reserves {reserved:,} slots: {1 - used / reserved:.1%} of them unused")

# %% [markdown]
# The lengths are made up but shaped like chat traffic: log-normal, a median of about 200 tokens, a few
# requests ten times longer. Reserving the maximum for each leaves 85 % of the slots empty. The
# vLLM paper measured real systems of 2022 storing tokens in only 20 % to 38 % of their KV cache memory;
# the rest was reserved and never used, or lost between allocations.

# %% [markdown]
# ## 1. A KV cache in blocks
#
# The fix comes from operating systems. Cut the memory into **blocks** of `B` token slots each, all the
# same size, in one big **pool**: `key_blocks` and `value_blocks`, each `(N, kv, B, D)`. A sequence gets
# a block only when its tokens reach it, and its **block table** lists its blocks in order:
#
# ```
# sequence 7's block table: [4, 1, 6]      B = 4
# token t of sequence 7  ->  block table[t // B], slot t % B
# tokens 0..3 in block 4, tokens 4..7 in block 1, tokens 8..9 in block 6 (slots 2, 3 free)
# ```
#
# The blocks of one sequence need not be next to each other, nor in order, so any free block will do:
# a **free list** holds the numbers of the blocks no sequence owns. When a sequence finishes, its blocks
# go back on the free list for the next request. A sequence wastes at most the unused slots of its last
# block, fewer than `B`.

# %% [markdown]
# ### Exercise 1: `PagedKVCache`
#
# Write `PagedKVCache(num_blocks, block_size, num_kv_heads, head_dim)`:
# - `__init__`: the pool, `self.key_blocks` and `self.value_blocks`, each a float32 tensor of zeros
#   `(num_blocks, num_kv_heads, block_size, head_dim)`; a free list holding every block; an empty
#   block table for each sequence to come (a `dict` from sequence id to a list of block numbers is
#   simplest), and the number of tokens each sequence holds.
# - `allocate(seq_id)`: start an empty sequence. It takes **no** block yet.
# - `append(seq_id, k, v)`: `k` and `v` are `(num_kv_heads, T_new, head_dim)`, the keys and values of
#   `T_new` new tokens (one token while decoding, a whole prompt at once). Take the blocks the new tokens
#   reach from the free list, **the lowest-numbered free block first** (so that your block tables match
#   ours), then write token `t` (counted from the sequence's start) into block `table[t // block_size]`,
#   slot `t % block_size`. `T_new` may cross several block boundaries.
# - If the free list is too short, `append` raises a `RuntimeError` whose message names the sequence and
#   the number of blocks it needed (e.g. `"out of blocks: sequence 6 needs 2 more blocks ..."`), and
#   changes **nothing**: check before you take any block.
# - `gather(seq_id)`: the sequence's keys and values in token order, `(k, v)`, each
#   `(num_kv_heads, T, head_dim)`.
# - `block_table(seq_id)`: the list of the sequence's blocks, in order (a copy, as a `list` of `int`).
# - `free(seq_id)`: its blocks go back to the free list, and the sequence is forgotten.
# - `num_free_blocks`: how many blocks are free, a **property** (`@property`).
# - A `seq_id` that is not allocated (or was freed) raises a `KeyError` in `append`, `gather`,
#   `block_table` and `free`.
#
# Hint: `append` can write every new token at once. Their positions `length + torch.arange(T_new)` give
# each token's block (index a tensor of the table) and slot, both `(T_new,)`; `self.key_blocks[blocks, :, slots]`
# is then `(T_new, kv, D)`, so it takes `k.transpose(0, 1)`. A loop over the tokens works too, but is
# slow: the memory count below appends 61,271 tokens five times.
#
# `gather` can index the pool with the whole table at once: `self.key_blocks[table]` is
# `(n, kv, B, D)` for a table of `n` blocks; bring the blocks next to each other along the tokens
# (`transpose(0, 1)`, then `reshape` to `(kv, n * B, D)`) and keep the first `T` tokens.

# %% grade_id="PagedKVCache"
class PagedKVCache:
    """A pool of key/value blocks (num_blocks, num_kv_heads, block_size, head_dim), a free list, and a
    block table per sequence."""

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int):
        ### BEGIN SOLUTION
        self.block_size = block_size
        self.key_blocks = torch.zeros(num_blocks, num_kv_heads, block_size, head_dim)  # (N, kv, B, D)
        self.value_blocks = torch.zeros(num_blocks, num_kv_heads, block_size, head_dim)
        self.free_list = list(range(num_blocks))  # free block numbers, lowest first
        self.tables = {}  # seq_id -> its blocks, in token order
        self.lengths = {}  # seq_id -> tokens written
        ### END SOLUTION

    @property
    def num_free_blocks(self) -> int:
        ### BEGIN SOLUTION
        return len(self.free_list)
        ### END SOLUTION

    def allocate(self, seq_id: int) -> None:
        ### BEGIN SOLUTION
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} is already allocated")
        self.tables[seq_id] = []
        self.lengths[seq_id] = 0
        ### END SOLUTION

    def append(self, seq_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
        ### BEGIN SOLUTION
        if seq_id not in self.tables:
            raise KeyError(f"sequence {seq_id} is not allocated (or was freed)")
        table = self.tables[seq_id]
        length, new = self.lengths[seq_id], k.shape[1]
        needed = math.ceil((length + new) / self.block_size) - len(table)  # blocks the new tokens start
        if needed > len(self.free_list):
            raise RuntimeError(f"out of blocks: sequence {seq_id} needs {needed} more blocks for its {new} "
                               f"new tokens, but only {len(self.free_list)} are free")
        for _ in range(needed):
            table.append(self.free_list.pop(0))  # the lowest-numbered free block
        positions = torch.arange(length, length + new)  # (T_new,) each new token's place in the sequence
        blocks = torch.tensor(table, dtype=torch.long)[positions // self.block_size]  # (T_new,)
        slots = positions % self.block_size  # (T_new,)
        self.key_blocks[blocks, :, slots] = k.transpose(0, 1)  # (T_new, kv, D): every new token at once
        self.value_blocks[blocks, :, slots] = v.transpose(0, 1)
        self.lengths[seq_id] = length + new
        ### END SOLUTION

    def gather(self, seq_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        ### BEGIN SOLUTION
        table = self.block_table(seq_id)
        num_kv_heads, head_dim = self.key_blocks.shape[1], self.key_blocks.shape[3]
        length = self.lengths[seq_id]
        k = self.key_blocks[table].transpose(0, 1).reshape(num_kv_heads, -1, head_dim)  # (kv, n * B, D)
        v = self.value_blocks[table].transpose(0, 1).reshape(num_kv_heads, -1, head_dim)
        return k[:, :length], v[:, :length]  # (kv, T, D) each
        ### END SOLUTION

    def block_table(self, seq_id: int) -> list[int]:
        ### BEGIN SOLUTION
        if seq_id not in self.tables:
            raise KeyError(f"sequence {seq_id} is not allocated (or was freed)")
        return list(self.tables[seq_id])
        ### END SOLUTION

    def free(self, seq_id: int) -> None:
        ### BEGIN SOLUTION
        table = self.block_table(seq_id)
        self.free_list = sorted(self.free_list + table)
        del self.tables[seq_id], self.lengths[seq_id]
        ### END SOLUTION

# %% grade_id="test_PagedKVCache" points=4
# Check: sessions of allocate, append, gather, block_table, free and num_free_blocks on your cache and on
# ours: the same results after every operation, each token in the pool where the block table says, and
# the error when the blocks run out.
checks.check_PagedKVCache(PagedKVCache)
### BEGIN HIDDEN TESTS
checks.check_PagedKVCache(PagedKVCache, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. The pool, drawn
#
# A small pool of 12 blocks of 4 slots, and four requests as a server sees them: three arrive, the
# second finishes and is freed, a fourth arrives and takes the freed blocks, and the first one writes on.
# Each cell below is one block, labelled with its owner and its place in the owner's table (`s3:1` is
# sequence 3's second block). Keys and values of one number each (`kv = 1`, `D = 1`) are enough to count.

# %%
pool = PagedKVCache(num_blocks=12, block_size=4, num_kv_heads=1, head_dim=1)
one_token = torch.zeros(1, 1, 1)  # (kv, T_new, D): one token's key or value


def write(cache, seq_id, tokens):
    """Append `tokens` tokens of zeros to sequence `seq_id` (their values do not matter here)."""
    zeros = torch.zeros(1, tokens, 1)
    cache.append(seq_id, zeros, zeros)


fig, axes = plt.subplots(3, 1, figsize=(10, 4.2))
for seq, tokens in ((0, 6), (1, 9), (2, 3)):
    pool.allocate(seq)
    write(pool, seq, tokens)
serving.plot_pool(pool, [0, 1, 2, 3], axes[0], "sequences 0, 1 and 2 hold 6, 9 and 3 tokens")
pool.free(1)
pool.allocate(3)
write(pool, 3, 10)
serving.plot_pool(pool, [0, 1, 2, 3], axes[1], "sequence 1 finished; sequence 3 (10 tokens) took its blocks")
write(pool, 0, 5)
serving.plot_pool(pool, [0, 1, 2, 3], axes[2], "sequence 0 wrote 5 more tokens: its blocks are not contiguous")
fig.tight_layout()
plt.show()
print("block tables:", {seq: pool.block_table(seq) for seq in (0, 2, 3)})
print("free blocks:", pool.num_free_blocks)

# %% [markdown]
# Sequence 3 took blocks 2, 3 and 4, which sequence 1 had just freed (the lowest-numbered free blocks
# first). Sequence 0's table is then `[0, 1, 6]`: its third block is the lowest one still free. Attention
# never needs a sequence's blocks to be side by side; it only needs the table, as section 4 shows.

# %% [markdown]
# ## 3. How much memory is wasted?
#
# Back to the 200 requests of section 0. Fill a pool with all of them using **your** `PagedKVCache`, and
# count what it holds: `num_blocks - num_free_blocks` blocks in use, `B` slots each. The only waste is the
# tail of each sequence's last block. The smaller the blocks, the less waste; real servers use 16 tokens
# per block (vLLM's default), because tiny blocks make the tables long and the memory reads short.

# %%
block_sizes = [1, 4, 16, 64, 256]
paged_waste = {}
for block_size in block_sizes:
    blocks_needed = sum(math.ceil(n / block_size) for n in lengths)
    cache = PagedKVCache(num_blocks=blocks_needed, block_size=block_size, num_kv_heads=1, head_dim=1)
    serving.fill(cache, lengths)
    in_use = blocks_needed - cache.num_free_blocks
    paged_waste[block_size] = 1 - used / (in_use * block_size)
    print(f"block_size {block_size:3d}: {in_use:5d} blocks, {in_use * block_size:6,} slots, "
          f"{paged_waste[block_size]:5.1%} unused")
contiguous_waste = 1 - used / reserved

# %%
fig, ax = plt.subplots(figsize=(8, 3.6))
names = ["one tensor\nof 2,048 per request"] + [f"blocks of {B}" for B in block_sizes]
values = [100 * contiguous_waste] + [100 * paged_waste[B] for B in block_sizes]
bars = ax.bar(names, values, color=["tab:red"] + ["tab:blue"] * len(block_sizes))
ax.bar_label(bars, fmt="%.1f%%", fontsize=8)
ax.set_ylabel("reserved KV cache slots unused (%)")
ax.set_title("200 requests, median about 200 tokens")
ax.set_ylim(0, 100)
fig.tight_layout()
plt.show()

# %% [markdown]
# With blocks of 16, under 4 % of the slots are unused, against 85 % for one maximum-length tensor
# per request: for the same memory, a server with paged blocks holds many times more sequences at once.
# (The vLLM paper reports the same: under 4 % wasted.) Blocks of 256 leave 31 % unused, because most
# requests are shorter than one block.

# %% [markdown]
# ## 4. Attention that reads the blocks
#
# At every decoding step, each sequence of the batch has **one** new query per head and attends to all
# its cached keys. The sequences have different lengths, so the batch is **ragged**: a `(b, H, T, D)`
# tensor of keys would need padding to the longest, and a copy of every cache, at every step. Paged
# attention instead reads each sequence's keys and values from the pool through its block table.
#
# The batch arrives as plain tensors, as a GPU kernel would get them:
# - `q`: `(b, H, D)`, the new token's query of every sequence;
# - `key_blocks`, `value_blocks`: the pool, `(N, kv, B, D)`;
# - `block_tables`: `(b, max_blocks)` int64, row `i` sequence `i`'s table, **padded with -1** up to the
#   longest table;
# - `seq_lens`: `(b,)` int64, how many tokens each sequence holds (its new token's key and value are
#   already appended, as in notebook 08).
#
# Sequence `i` holds `ceil(seq_lens[i] / B)` blocks: the rest of its row is -1, padding, and the last
# block's slots past `seq_lens[i]` hold no token of it. Neither may count.

# %% [markdown]
# ### Exercise 2: `paged_attention`
#
# Write `paged_attention(q, key_blocks, value_blocks, block_tables, seq_lens)` returning the attention
# output `(b, H, D)`: for each sequence `i` and head `h`, `softmax(q[i, h] · K_i / sqrt(D)) · V_i` over the
# sequence's `seq_lens[i]` keys (no causal mask: the new token sees all its past).
# - **Grouped-query heads**: query head `h` reads key/value head `h // (H // kv)`, as notebook 08's
#   `repeat_kv` arranged them. Do it without a copy of the cache per query head: view the `H` queries of
#   a sequence as `(kv, H // kv, D)` and let the matrix product broadcast over the group.
# - **Read only what is the sequence's own**: its first `ceil(seq_lens[i] / B)` blocks, never a `-1`, and
#   its first `seq_lens[i]` slots. The check fills every other slot with `inf`, as unwritten memory may
#   hold anything: masking a score to `-inf` is not enough, because weight 0 times `inf` is NaN.
# - Raise a `ValueError` if `H` is not a multiple of `kv`.
#
# A loop over the `b` sequences is fine (a GPU kernel runs one program per sequence and head). Hint: the
# keys of sequence `i` are `key_blocks[blocks]`, `(n, kv, B, D)`, arranged as in `gather`.
#
# **Rule** (the check and the grader apply it): `F.scaled_dot_product_attention`, FlexAttention
# (`flex_attention`), `nn.MultiheadAttention` (and `F.multi_head_attention_forward`), and copying the heads
# with `repeat_interleave` (or `repeat_kv`) are not allowed.

# %% grade_id="paged_attention"
def paged_attention(q: torch.Tensor, key_blocks: torch.Tensor, value_blocks: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """q (b, H, D), pools (N, kv, B, D), block_tables (b, max_blocks) padded with -1, seq_lens (b,) -> (b, H, D)."""
    ### BEGIN SOLUTION
    b, num_heads, head_dim = q.shape
    num_kv_heads, block_size = key_blocks.shape[1], key_blocks.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)  # (b, H, D)
    for i in range(b):
        length = int(seq_lens[i])
        blocks = block_tables[i, : math.ceil(length / block_size)]  # its own blocks, no -1
        k = key_blocks[blocks].transpose(0, 1).reshape(num_kv_heads, -1, head_dim)[:, :length]  # (kv, T, D)
        v = value_blocks[blocks].transpose(0, 1).reshape(num_kv_heads, -1, head_dim)[:, :length]
        queries = q[i].view(num_kv_heads, group, head_dim)  # (kv, group, D)
        scores = queries @ k.transpose(-2, -1) / math.sqrt(head_dim)  # (kv, group, T)
        out[i] = (torch.softmax(scores, dim=-1) @ v).reshape(num_heads, head_dim)  # (H, D)
    return out
    ### END SOLUTION

# %% grade_id="test_paged_attention" points=4
# Check: ragged batches with the blocks scattered over the pool, grouped-query heads, and a pool whose
# free slots hold inf.
checks.check_paged_attention(paged_attention)
### BEGIN HIDDEN TESTS
checks.check_paged_attention(paged_attention, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. One decoding step of a ragged batch, end to end
#
# Now both pieces together. Three sequences of 5, 13 and 2 tokens share a pool of blocks of 4 in your
# `PagedKVCache`; each then gets a new token, whose key and value are appended first. `paged_attention`
# reads the blocks; PyTorch's `F.scaled_dot_product_attention` reads each sequence's gathered keys and
# values, one sequence at a time, with each key/value head copied for its query heads (notebook 08's
# `repeat_kv`). 4 query heads share 2 key/value heads.

# %%
H, KV, D, B = 4, 2, 8, 4
cache = PagedKVCache(num_blocks=10, block_size=B, num_kv_heads=KV, head_dim=D)
g = torch.Generator().manual_seed(0)
prompt_lengths = {10: 5, 11: 13, 12: 2}  # seq_id -> tokens already there
for seq, length in prompt_lengths.items():
    cache.allocate(seq)
for t in range(max(prompt_lengths.values()) + 1):  # the sequences take turns, as a server's steps do
    for seq, length in prompt_lengths.items():
        if t <= length:  # `length` tokens, then the new one
            cache.append(seq, torch.randn(KV, 1, D, generator=g), torch.randn(KV, 1, D, generator=g))

seq_ids = list(prompt_lengths)
tables = [cache.block_table(seq) for seq in seq_ids]
width = max(len(t) for t in tables)
block_tables = torch.tensor([t + [-1] * (width - len(t)) for t in tables])  # (b, max_blocks)
seq_lens = torch.tensor([prompt_lengths[seq] + 1 for seq in seq_ids])  # (b,)
q = torch.randn(len(seq_ids), H, D, generator=g)  # (b, H, D)
print("block tables:\n", block_tables)
print("seq_lens:", seq_lens.tolist())

paged = paged_attention(q, cache.key_blocks, cache.value_blocks, block_tables, seq_lens)  # (b, H, D)
one_by_one = []
for i, seq in enumerate(seq_ids):
    k, v = cache.gather(seq)  # (KV, T, D) each
    k, v = k.repeat_interleave(H // KV, dim=0), v.repeat_interleave(H // KV, dim=0)  # (H, T, D): a copy per head
    one_by_one.append(F.scaled_dot_product_attention(q[i, :, None], k, v)[:, 0])  # (H, 1, D) -> (H, D)
one_by_one = torch.stack(one_by_one)  # (b, H, D)
print("paged attention == attention on each gathered sequence:", torch.allclose(paged, one_by_one, atol=1e-6))

# %% [markdown]
# The tables interleave, because the sequences took turns: sequence 10's blocks are 0 and 3, sequence
# 11's are 1, 4, 5 and 6. The output is the same: attention does not care where the blocks are, only what the table says.
#
# What this Python version does not show is why it is fast. A GPU kernel such as vLLM's runs one
# program per (sequence, head) that walks the block table and loads each block straight from the pool
# into on-chip memory, as notebook 07's FlashAttention loads tiles: no gathered copy, no padding to the
# longest sequence. Your loop gathers each sequence's blocks into a new tensor first; the kernel never
# does.

# %% [markdown]
# ## 6. Models to serve
#
# The rest of the notebook serves real models: notebook 09's `TinyGPT`, trained on its digit-reversal task
# with 6 digits (a prompt is 6 digits and the separator, the answer the 6 digits reversed). Here are
# `TinyGPT`, `generate` and `train_step` with their parts: our answers from notebooks 04, 05, 08 and 09,
# shown so that nothing depends on your earlier answers. Run the cell.

# %% shows="causal_mask split_heads merge_heads MultiHeadAttention MultiHeadAttentionKVCache sinusoidal_positions LearnedPositionalEmbedding TransformerBlock TinyGPT generate train_step"
# Our answers from notebooks 04, 05, 08 and 09.
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils.validation import check_heads_divide, check_input_3d

# %% [markdown]
# The **target** has 2 blocks of `d_model = 32`: section 7 serves it to many requests at once. Section 8
# speeds it up with a **draft**: 1 block of `d_model = 16`, about a seventh of the target's parameters,
# trained for 0, 40 and 100 steps to give drafts of three qualities.
# Training takes a few seconds (and is skipped while grading: `training.train` returns at once).

# %%
task = tasks.ReversalTask(num_digits=6, held_out_size=1000, seed=0)
common = dict(vocab_size=tasks.VOCAB_SIZE, context_length=task.context_length, dropout=0.0)
torch.manual_seed(0)
target = TinyGPT(d_model=32, num_heads=2, num_layers=2, **common)
drafts = {}
for steps in (0, 40, 100):
    torch.manual_seed(1)
    drafts[steps] = TinyGPT(d_model=16, num_heads=2, num_layers=1, **common)
print(f"target: {sum(p.numel() for p in target.parameters()):,} parameters; "
      f"each draft: {sum(p.numel() for p in drafts[0].parameters()):,}")

# %%
# NBVAL_IGNORE_OUTPUT
# (nbval skips this cell's output: the progress bars depend on the machine)
training.train(target, train_step, task, steps=100, seed=0, eval_every=50, desc="target")
for steps, draft in drafts.items():
    if steps:
        training.train(draft, train_step, task, steps=steps, seed=1, eval_every=steps, desc=f"draft, {steps} steps")

# %% [markdown]
# ## 7. Continuous batching
#
# A server decodes many requests together: one forward pass writes one token for each request of the
# batch, and reads the weights once for all of them. The simple way is a **static batch**: take `B`
# requests, decode them together until the longest one is finished, then take the next `B`. Every request
# that finished early keeps its place, writing nothing, while the longest one runs on.
#
# **Continuous batching** (Yu et al., "Orca", OSDI 2022; vLLM schedules this way) decides at **every
# step**: a finished request leaves the batch at once and its blocks go back to the free list, and a
# waiting request joins as soon as the batch has room and the cache has blocks for it. A joining request
# first reads its whole prompt in one pass (the *prefill*); then it is decoded with the others.
#
# When the blocks run out in the middle of an answer (every running request may need a new block at the
# same step), a request is **preempted**: its blocks are freed and it goes back to the front of the queue.
# When it is admitted again, it reads its prompt and the tokens it had written in one prefill, and goes on
# where it was (vLLM's "recompute"). Nothing of it is lost and nothing else is corrupted.
#
# The model is given: `serving.PagedTinyGPT(target)` runs the trained `TinyGPT` on a paged cache whose
# key/value heads are the model's layers' heads side by side (`num_kv_heads = layers × heads`).
# `model(cache, seq_ids, tokens, positions)` reads, for each sequence `seq_ids[i]` (allocated in the
# cache), its new tokens `tokens[i]` (a 1-D tensor of token ids) at positions `positions[i]`,
# `positions[i] + 1`, ...; it attends to what the cache holds of the sequence and to its new tokens,
# appends their keys and values to the cache, and returns the logits of each sequence's last new token,
# `(len(seq_ids), vocab_size)`. All the sequences go through the weights together: one forward pass.

# %% [markdown]
# ### Exercise 3: `ContinuousBatcher`
#
# Write `ContinuousBatcher(model, cache, max_batch_size)`, greedy generation for many requests:
# - `add_request(prompt_ids, max_new_tokens) -> int`: `prompt_ids` is `(T0,)`; queue the request and return
#   its id, `0, 1, 2, ...` in order. `max_new_tokens` is at least 1.
# - `step() -> dict[int, int]`: one step, returning `{request id: the token it wrote}`. In this order:
#   1. **Admit**: while requests wait and fewer than `max_batch_size` run, look at the first waiting
#      request. Its tokens are its prompt and what it wrote so far (nothing, unless it was preempted). If
#      the cache has fewer free blocks than `ceil(len(tokens) / block_size)` (`block_size` is
#      `cache.key_blocks.shape[2]`), stop admitting. Otherwise `cache.allocate(id)`, add it to the
#      running requests, prefill it alone, `model(cache, [id], [tokens], [0])`, and it writes the argmax
#      of the logits.
#   2. **Decode** every other running request in **one** call: each feeds its last written token at
#      position `len(prompt) + len(written) - 1` (the tokens its cache holds). A request whose cache
#      holds a multiple of `block_size` tokens needs a new block for it: while more requests need one than
#      `cache.num_free_blocks`, **preempt** the newest running request (free its blocks, remove it from
#      the running requests, put it first in the queue). Each decoded request writes its argmax.
#   3. **Finish**: a running request that has written `max_new_tokens` tokens leaves, and its blocks are
#      freed at once.
# - `run() -> dict[int, list[int]]`: step until no request waits or runs; return every request's tokens.
#
# Each request must write exactly the tokens it would write alone (greedy). The check runs your batcher on
# a stand-in model and cache, step by step, and compares each step's tokens, the free blocks after it,
# and the model's calls with ours.

# %% grade_id="ContinuousBatcher"
class ContinuousBatcher:
    """Greedy generation for many requests, joining and leaving the batch at every step."""

    def __init__(self, model, cache, max_batch_size: int):
        ### BEGIN SOLUTION
        self.model, self.cache, self.max_batch_size = model, cache, max_batch_size
        self.block_size = cache.key_blocks.shape[2]
        self.prompts, self.limits, self.written = [], [], []  # per request id
        self.waiting = []  # request ids, first admitted first
        self.running = []  # request ids, in the order they were admitted
        ### END SOLUTION

    def add_request(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> int:
        ### BEGIN SOLUTION
        self.prompts.append([int(t) for t in prompt_ids])
        self.limits.append(max_new_tokens)
        self.written.append([])
        self.waiting.append(len(self.prompts) - 1)
        return len(self.prompts) - 1
        ### END SOLUTION

    def step(self) -> dict[int, int]:
        ### BEGIN SOLUTION
        wrote = {}
        while self.waiting and len(self.running) < self.max_batch_size:  # 1. admit, in order
            rid = self.waiting[0]
            tokens = self.prompts[rid] + self.written[rid]  # after a preemption: recompute what it wrote
            if math.ceil(len(tokens) / self.block_size) > self.cache.num_free_blocks:
                break
            self.waiting.pop(0)
            self.cache.allocate(rid)
            self.running.append(rid)
            logits = self.model(self.cache, [rid], [torch.tensor(tokens)], [0])  # the prefill, (1, V)
            wrote[rid] = int(logits[0].argmax())
            self.written[rid].append(wrote[rid])
        while True:  # 2. decode the others: first make room, preempting the newest
            decode = [rid for rid in self.running if rid not in wrote]
            held = {rid: len(self.prompts[rid]) + len(self.written[rid]) - 1 for rid in decode}
            if sum(n % self.block_size == 0 for n in held.values()) <= self.cache.num_free_blocks:
                break
            newest = self.running.pop()
            self.cache.free(newest)
            self.waiting.insert(0, newest)
        if decode:
            logits = self.model(self.cache, decode, [torch.tensor(self.written[rid][-1:]) for rid in decode],
                                [held[rid] for rid in decode])  # (len(decode), V): one forward pass
            for rid, row in zip(decode, logits):
                wrote[rid] = int(row.argmax())
                self.written[rid].append(wrote[rid])
        for rid in list(self.running):  # 3. finished requests leave, their blocks freed at once
            if len(self.written[rid]) == self.limits[rid]:
                self.cache.free(rid)
                self.running.remove(rid)
        return wrote
        ### END SOLUTION

    def run(self) -> dict[int, list[int]]:
        ### BEGIN SOLUTION
        while self.waiting or self.running:
            self.step()
        return {rid: list(tokens) for rid, tokens in enumerate(self.written)}
        ### END SOLUTION

# %% grade_id="test_ContinuousBatcher" points=4
# Check: requests of different lengths, too few blocks (requests wait, then are preempted), step by step
# and with run(), on a stand-in model and cache.
checks.check_ContinuousBatcher(ContinuousBatcher)
### BEGIN HIDDEN TESTS
checks.check_ContinuousBatcher(ContinuousBatcher, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### Serving the trained model
#
# 24 held-out prompts, each asking for between 1 and 6 digits of its answer (a mix of lengths), served
# with your `ContinuousBatcher` and your `PagedKVCache`: 40 blocks of 4, 4 requests at a time. Each
# request's tokens should be what `generate` writes for its prompt alone. The loop stops with an error if a
# step writes no token: then no request can run or join, and the loop would never end.

# %%
paged = serving.PagedTinyGPT(target)
held_out = task.held_out()
prompts = held_out.inputs[:24, : task.num_digits + 1]  # (24, 7): 6 digits and the separator
wanted = [1 + (3 * i) % task.num_digits for i in range(24)]  # 1 to 6 new tokens per request
requests = [(prompt, n) for prompt, n in zip(prompts, wanted)]

batcher = ContinuousBatcher(paged, paged.make_cache(PagedKVCache, num_blocks=40, block_size=4), max_batch_size=4)
for prompt, n in requests:
    batcher.add_request(prompt, n)
continuous_steps = 0
while batcher.waiting or batcher.running:
    wrote = batcher.step()
    continuous_steps += 1
    if not wrote:  # nothing ran and nothing joined: the loop would never end
        raise RuntimeError(f"step {continuous_steps} wrote no token, with {len(batcher.waiting)} requests waiting and "
                           f"{len(batcher.running)} running: do finished requests free their blocks?")
served = {rid: tokens for rid, tokens in enumerate(batcher.written)}
alone = {rid: generate(target, prompt[None], n, temperature=0.0)[0, len(prompt):].tolist()
         for rid, (prompt, n) in enumerate(requests)}
print("every request wrote what generate writes for it alone:", served == alone)

static, static_steps = serving.static_batching(
    paged, paged.make_cache(PagedKVCache, num_blocks=40, block_size=4), requests, batch_size=4)
print("static batching writes the same tokens:", static == alone)
print(f"{sum(wanted)} tokens in {continuous_steps} steps (continuous) against {static_steps} (static)")

# %% [markdown]
# Both write the same tokens, but the static batches wait for their longest request: four requests
# asking for 1, 4, 1 and 4 tokens hold their four places for 4 steps (a prefill, then 3 decoding steps),
# and the short ones write nothing after their first token. The continuous batcher gives a finished
# request's place to the next one at once. The steps, and the tokens per second on this CPU (the median of
# 3 runs of each; skipped while grading):

# %%
# NBVAL_IGNORE_OUTPUT
# (nbval skips this cell's output: the times depend on the machine)
import time

if training.grading():
    print("grading now: timing skipped")
else:
    seconds = {"continuous": [], "static": []}
    for _ in range(3):
        began = time.perf_counter()
        batcher = ContinuousBatcher(paged, paged.make_cache(PagedKVCache, 40, 4), max_batch_size=4)
        for prompt, n in requests:
            batcher.add_request(prompt, n)
        batcher.run()
        seconds["continuous"].append(time.perf_counter() - began)
        began = time.perf_counter()
        serving.static_batching(paged, paged.make_cache(PagedKVCache, 40, 4), requests, batch_size=4)
        seconds["static"].append(time.perf_counter() - began)
    rate = {way: sum(wanted) / sorted(times)[1] for way, times in seconds.items()}  # tokens per second
    for way in rate:
        print(f"{way:10s}: {rate[way]:6.0f} tokens per second")
    fig, (ax_steps, ax_rate) = plt.subplots(1, 2, figsize=(9, 3.2))
    ax_steps.bar(["continuous", "static"], [continuous_steps, static_steps], color=["tab:blue", "tab:red"])
    ax_steps.set_ylabel("steps for the 24 requests")
    ax_steps.set_title("steps (each: the prefills, then one decoding pass)")
    ax_rate.bar(list(rate), list(rate.values()), color=["tab:blue", "tab:red"])
    ax_rate.set_ylabel("tokens per second (this CPU)")
    ax_rate.set_title("throughput, median of 3 runs")
    fig.tight_layout()
    plt.show()

# %% [markdown]
# Here the two are about as fast (on the CPU we wrote this on, within a few percent), although the
# continuous batcher takes 17 steps against 24. `PagedTinyGPT` attends one sequence at a time in a Python
# loop and each prefill is a pass of its own, so the cost of a step grows with the requests in it: an idle
# place in a static batch costs almost nothing on a CPU. On a GPU it is the other way round. A decoding step costs about the same
# whether it carries 1 request or 64, because it is memory-bound: it reads all the weights either way. A
# static batch's idle places are wasted work; a continuous batcher keeps the batch full, and with the
# memory paged attention saves, the batch can be much larger. The Orca paper reports 36.9 times the
# throughput of NVIDIA's FasterTransformer, which batches whole requests, at the same latency, for GPT-3
# 175B.
#
# This batcher still reads each joining prompt in a pass of its own, and the model attends with
# `cache.gather`: a real server mixes prefills into the decoding pass and reads the blocks with paged
# attention (your Exercise 2) inside the GPU kernel.

# %% [markdown]
# ## 8. Speculative decoding: a small model guesses, the large one checks
#
# A decoding step of a large model is **memory-bound** (notebook 08, section 7): it reads every weight
# and the whole KV cache to write one token, and the arithmetic units mostly wait. Reading `k + 1` new
# tokens in one pass reads the same weights and costs about the same time. Speculative decoding
# (Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", 2023; Chen et al.,
# "Accelerating Large Language Model Decoding with Speculative Sampling", 2023) turns that into speed:
#
# 1. a small, fast **draft** model writes `k` tokens, one at a time, as usual;
# 2. the large **target** model reads all `k` in **one** forward pass with its KV cache. That pass gives
#    the target's distribution `p` at each draft token, and one more after the last;
# 3. draft token `d`, which the draft chose with probability `q(d)`, is **accepted** with probability
#    `min(1, p(d) / q(d))`: always when the target likes it at least as much as the draft did;
# 4. at the first rejection, the round writes one token drawn from the **residual** `max(0, p - q)`,
#    normalised, and throws the later draft tokens away. If all `k` are accepted, the target's last
#    distribution gives a **bonus** token for free.
#
# Every round runs the target once and writes between 1 and `k + 1` tokens. The rule in steps 3 and 4 is
# what makes it exact: the probability of writing token `x` is `min(p(x), q(x))` (accepted) plus
# `(1 - Σ min(p, q)) · max(0, p(x) - q(x)) / Σ max(0, p - q)` (rejected, then drawn from the residual), and
# since `Σ max(0, p - q) = 1 - Σ min(p, q)`, that sum is exactly `p(x)`. The output has the **target's**
# distribution, whatever the draft; a good draft only makes it faster.
#
# At temperature 0 both distributions put all their weight on their argmax: a draft token is accepted
# exactly when it is the target's argmax, and a rejection writes the target's argmax. The output is then
# the target's greedy output, token for token.

# %% [markdown]
# Cutting a cache back is the one new tool: after a rejection, both models have read draft tokens that are
# now thrown away. `serving.truncate_cache(model, n)` keeps the first `n` tokens of every block's
# `cache_k` and `cache_v` (a view, nothing recomputed) and sets `model.num_cached = n`. Read it in
# `course_utils/serving.py`.

# %% [markdown]
# ### Exercise 4: `speculative_generate`
#
# Write `speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4, temperature=0.0)` returning
# `(tokens, stats)`: `tokens` is `(1, T0 + max_new_tokens)`, as `generate` returns for a prompt of one
# sequence `(1, T0)`; `stats` is the dict `{"proposed": ..., "accepted": ..., "target_calls": ...}`: draft
# tokens proposed, draft tokens accepted, and the target's forward passes.
#
# Both models are used with their KV caches, as `generate` uses them: `reset_cache()` at the start and at
# the end, and `model(new_ids, use_cache=True)` reads only the tokens the cache does not hold yet
# (`tokens[:, model.num_cached:]`). Put `target.eval()` and `draft.eval()` first. Then, until
# `max_new_tokens` tokens are written, one **round**:
# 1. `n = min(k, tokens still to write - 1)` proposals (0 in the last round when one token is left).
# 2. **Draft**: `n` times, read the tokens the draft has not read (the first time: everything after its
#    cache; then the last proposal), take the last position's logits, and choose a proposal: the argmax
#    at temperature 0, else draw from `q = softmax(logits / temperature)` with `torch.multinomial` (keep
#    `q`).
# 3. **Target**: one forward pass, `target(torch.cat([tokens[:, target.num_cached:], proposals], dim=1),
#    use_cache=True)`; its last `n + 1` positions give the target's logits at each proposal and after the
#    last one. Count the pass in `stats["target_calls"]`, and the `n` proposals in `stats["proposed"]`.
# 4. **Accept** the proposals in order. At temperature 0: proposal `j` is accepted if it is the argmax of
#    the target's logits `j`; else write that argmax instead and end the round. Above 0: with
#    `p = softmax(logits / temperature)`, accept `d` if `torch.rand(())` is below `p[d] / q[d]`; else
#    draw the token written instead from `max(0, p - q)`, normalised, and end the round. If all `n` are
#    accepted, add the **bonus** token: the argmax of the target's last logits (temperature 0) or a draw
#    from its `p`. Add the accepted proposals to `stats["accepted"]`.
# 5. **Roll back**: the target has read the rejected proposals and the draft may have too. Cut the target's
#    cache to all the tokens written but the last (`serving.truncate_cache(target, tokens.shape[1] - 1)`),
#    and the draft's to that too if it holds more.
#
# Raise a `ValueError` for a prompt of more than one sequence (each sequence accepts a different number of
# tokens; servers run speculation per sequence).
#
# The check runs your function on stand-in models with a cache of their own (they also have a
# `truncate_cache`, which `serving.truncate_cache` calls): at temperature 0 it compares your tokens with
# the target's greedy `generate` and your stats with ours; at temperature 1 it draws 600 runs and tests
# whether your first two tokens follow the target's distribution (a chi-square test whose false-alarm rate
# is 1 in 10,000: a correct answer fails it that rarely, and with the check's fixed seeds it gives the same
# verdict every time).

# %% grade_id="speculative_generate"
@torch.no_grad()
def speculative_generate(target, draft, prompt_ids: torch.Tensor, max_new_tokens: int, k: int = 4,
                         temperature: float = 0.0) -> tuple[torch.Tensor, dict]:
    """prompt_ids (1, T0) -> (tokens (1, T0 + max_new_tokens), {"proposed", "accepted", "target_calls"})."""
    ### BEGIN SOLUTION
    if prompt_ids.dim() != 2 or prompt_ids.shape[0] != 1:
        raise ValueError(f"prompt_ids must be (1, T0): one sequence, got {tuple(prompt_ids.shape)}")
    stats = {"proposed": 0, "accepted": 0, "target_calls": 0}
    target.eval()
    draft.eval()
    target.reset_cache()
    draft.reset_cache()
    tokens = prompt_ids  # (1, T)
    end = prompt_ids.shape[1] + max_new_tokens
    while tokens.shape[1] < end:
        n = min(k, end - tokens.shape[1] - 1)
        proposals, qs = [], []
        for j in range(n):
            new = tokens[:, draft.num_cached:] if j == 0 else proposals[-1].view(1, 1)
            logits = draft(new, use_cache=True)[0, -1]  # (V,)
            if temperature == 0:
                proposals.append(logits.argmax())
            else:
                qs.append(torch.softmax(logits / temperature, dim=-1))  # (V,)
                proposals.append(torch.multinomial(qs[-1], 1)[0])
        drafted = torch.stack(proposals).view(1, n) if n else tokens[:, :0]  # (1, n)
        logits = target(torch.cat([tokens[:, target.num_cached:], drafted], dim=1), use_cache=True)[0, -(n + 1):]
        stats["target_calls"] += 1
        stats["proposed"] += n
        kept = []
        for j in range(n + 1):  # logits (n + 1, V): one row per proposal, one for the bonus
            if temperature == 0:
                best = logits[j].argmax()
                if j < n and best == proposals[j]:
                    kept.append(best)
                    continue
                kept.append(best)  # the target's token instead of a rejected one, or the bonus
                break
            p = torch.softmax(logits[j] / temperature, dim=-1)  # (V,)
            if j == n:
                kept.append(torch.multinomial(p, 1)[0])  # the bonus
                break
            if torch.rand(()) < p[proposals[j]] / qs[j][proposals[j]]:
                kept.append(proposals[j])
                continue
            residual = (p - qs[j]).clamp(min=0)
            kept.append(torch.multinomial(residual / residual.sum(), 1)[0])
            break
        stats["accepted"] += len(kept) - 1
        tokens = torch.cat([tokens, torch.stack(kept).view(1, -1)], dim=1)
        serving.truncate_cache(target, tokens.shape[1] - 1)
        serving.truncate_cache(draft, min(draft.num_cached, tokens.shape[1] - 1))
    target.reset_cache()
    draft.reset_cache()
    return tokens, stats
    ### END SOLUTION

# %% grade_id="test_speculative_generate" points=4
# Check: greedy runs on stand-in models (the target's greedy tokens, our stats), and 600 sampled runs whose
# first two tokens must follow the target's distribution.
checks.check_speculative_generate(speculative_generate)
### BEGIN HIDDEN TESTS
checks.check_speculative_generate(speculative_generate, hidden=True)
### END HIDDEN TESTS

# %% [markdown]
# ### The same tokens, fewer target passes
#
# Greedy, on 30 held-out prompts (6 digits and the separator, `(1, 7)` each): speculative decoding with the
# best draft against the target's own `generate`.

# %%
prompts = held_out.inputs[:30, : task.num_digits + 1]  # (30, 7)
same = all(
    torch.equal(speculative_generate(target, drafts[100], prompt[None], task.num_digits, k=3)[0],
                generate(target, prompt[None], task.num_digits, temperature=0.0))
    for prompt in prompts)
print("speculative decoding writes the target's greedy tokens for all 30 prompts:", same)

# %% [markdown]
# How often are the draft's tokens accepted, and how many target passes does each new token cost? For
# each draft and `k` from 1 to 5, greedy, the 30 prompts, 6 new tokens each (`generate` pays 6 target
# passes: 1 per token). Skipped while grading.

# %%
# NBVAL_IGNORE_OUTPUT
# (nbval skips this cell's output: the trained models' numbers depend on the CPU's rounding)
ks = [1, 2, 3, 5]
sweep = {}
if training.grading():
    print("grading now: the sweep is skipped")
else:
    for steps, draft in drafts.items():
        for k in ks:
            totals = {"proposed": 0, "accepted": 0, "target_calls": 0}
            for prompt in prompts:
                _, stats = speculative_generate(target, draft, prompt[None], task.num_digits, k=k)
                totals = {name: totals[name] + stats[name] for name in totals}
            sweep[steps, k] = (totals["accepted"] / totals["proposed"],
                               totals["target_calls"] / (len(prompts) * task.num_digits))
            print(f"draft trained {steps:3d} steps, k={k}: {sweep[steps, k][0]:5.1%} of proposals accepted, "
                  f"{sweep[steps, k][1]:.2f} target passes per new token")

# %%
if sweep:
    fig, (ax_accept, ax_calls) = plt.subplots(1, 2, figsize=(11, 3.8))
    for steps in drafts:
        ax_accept.plot(ks, [100 * sweep[steps, k][0] for k in ks], marker="o", label=f"draft, {steps} steps")
        ax_calls.plot(ks, [sweep[steps, k][1] for k in ks], marker="o", label=f"draft, {steps} steps")
    ax_calls.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="generate (no draft)")
    ax_accept.set_xlabel("k (proposals per round)")
    ax_accept.set_ylabel("proposals accepted (%)")
    ax_accept.set_title("acceptance rate")
    ax_calls.set_xlabel("k (proposals per round)")
    ax_calls.set_ylabel("target forward passes per new token")
    ax_calls.set_title("target passes (lower is faster)")
    ax_calls.set_ylim(0, 1.1)
    for ax in (ax_accept, ax_calls):
        ax.set_xticks(ks)
        ax.legend(fontsize=8)
    fig.tight_layout()
    plt.show()
    print("the best draft with k=5 needs fewer target passes than with k=1:", sweep[100, 5][1] < sweep[100, 1][1])
    print("the untrained draft saves almost nothing: over 0.8 target passes per token at every k:",
          all(sweep[0, k][1] > 0.8 for k in ks))

# %% [markdown]
# The draft trained for 100 steps is right every time here, so a larger `k` writes more tokens per target
# pass: with `k = 5` a whole answer of 6 digits costs one target pass and 5 draft passes. (`k = 2` and
# `k = 3` tie: both need two rounds for 6 tokens, 3 + 3 or 4 + 2.) The draft trained for 40 steps gets
# about one proposal in four right at `k = 1`, and fewer at larger `k`: after its first mistake in a round,
# the rest of the round's proposals count as proposed but are thrown away. The untrained draft is
# almost always rejected, and nearly every round pays one target pass for one token, plus the draft's
# work: slower than no speculation at all. In a real system the draft is 10 to 100 times cheaper than the target,
# `k` is 3 to 8, and the speed-up (2 to 3 times is common) depends on how often the draft agrees with the
# target: on predictable text (code, repetition) more than on creative text.
#
# Three things this notebook leaves out: a **batch** of sequences, each accepting a different number of
# tokens (a paged cache makes that easy: each sequence's cache is cut back on its own); drafts without a
# second model (Medusa's extra heads, EAGLE, or n-grams looked up in the prompt); and a **tree** of
# proposals checked in one pass with a tree-shaped attention mask.

# %% [markdown]
# ## 9. What a real server adds
#
# - **Prefix sharing**. Requests that start with the same system prompt can share its blocks: a block
#   table may list a block that another table lists too, with a count of its users, and a block is copied
#   only when one of them writes into it ("copy on write"). Your `PagedKVCache` forbids that on purpose.
# - **Chunked prefill**. A long prompt read in one pass delays every running request's next token; servers
#   cut prompts into chunks and mix them into the decoding steps.
# - **Scheduling**: which request to preempt, whether to swap its blocks to CPU memory instead of
#   recomputing them, and how to keep a step's batch within the GPU's memory and time budget.

# %% [markdown]
# ## Check your understanding
#
# Click a question to see the answer.
#
# <details><summary>1. Predict the output: a pool of blocks of 16. A request holds 33 tokens. How many
# blocks does it own, and how many of their slots are unused? Run the cell below to check.</summary>
#
# `ceil(33 / 16) = 3` blocks, 48 slots, 15 of them unused: the first token of the third block took a
# whole block. At most `B - 1` slots per sequence are ever unused.
# </details>

# %%
check = PagedKVCache(num_blocks=4, block_size=16, num_kv_heads=1, head_dim=1)
check.allocate(0)
write(check, 0, 33)
print("blocks owned:", len(check.block_table(0)), "unused slots:", 16 * len(check.block_table(0)) - 33)

# %% [markdown]
# <details><summary>2. Find the bug: <code>free</code> puts the blocks back on the free list but leaves
# the sequence's table in the dict. What goes wrong, and when?</summary>
#
# Nothing at first. Then a new request takes those blocks and writes into them, and any later read of
# the freed sequence (a late `gather`, a stale entry in the batch) sees the new request's keys; worse, an
# `append` to the freed sequence overwrites the new request's tokens. A freed block must be listed in
# exactly one place: the free list. The check asks `block_table` of a freed sequence and expects a
# `KeyError`.
# </details>
#
# <details><summary>3. Why does <code>append</code> check that enough blocks are free before it takes
# any?</summary>
#
# A server that runs out of blocks preempts a request and tries again later. If the failed `append` had
# taken some blocks and written some tokens, the sequence would hold half a prompt and blocks that no
# retry frees: memory leaks, and a corrupted cache that a later read would trust. All or nothing.
# </details>
#
# <details><summary>4. In <code>paged_attention</code>, why is masking the padding's scores to
# <code>-inf</code> not enough?</summary>
#
# The weight of a masked score is `exp(-inf) = 0`, but the output is a sum of weights times **values**,
# and `0 × inf` and `0 × NaN` are NaN. Memory that no sequence wrote may hold anything, so the values of
# padding slots must never enter the product: slice them away (or zero them with `torch.where`).
# </details>
#
# <details><summary>5. With 32 query heads and 8 key/value heads, how many times does your
# <code>paged_attention</code> read each cached key?</summary>
#
# Once per sequence, for 4 query heads at a time: viewing the 32 queries as `(8, 4, D)` lets one matrix
# product serve the 4 heads of a group. `repeat_kv` would first copy every key 4 times, which is the
# memory traffic grouped-query attention exists to avoid.
# </details>
#
# <details><summary>6. A continuous batcher admits a request, then has to preempt it two steps later. What
# does the request lose, and what does the server lose?</summary>
#
# The request loses nothing: the tokens it wrote are kept, and when it is admitted again it reads its
# prompt and those tokens in one prefill and goes on with the same next token. The server loses the work of
# its keys and values, computed twice. vLLM can also *swap* a preempted request's blocks to CPU memory
# and back, which costs transfers instead of computation.
# </details>
#
# <details><summary>7. Find the bug: after a rejection, <code>speculative_generate</code> cuts back the
# target's cache but not the draft's. The output at temperature 0 is still the target's greedy output.
# Why, and what gets worse?</summary>
#
# The target checks every token, so a confused draft can only be rejected more often: the output stays
# right. But the draft's cache still holds the rejected proposals, so its next proposals continue a text
# that was thrown away (at the wrong positions, too): fewer are accepted, and each round pays a target
# pass for fewer tokens. Only the stats show the bug, which is why the check compares them.
# </details>
#
# <details><summary>8. A draft proposes <code>d</code> with <code>q(d) = 0.5</code>; the target gives it
# <code>p(d) = 0.2</code>. With what probability is it accepted? Why not reject it outright, since the
# target likes it less?</summary>
#
# `min(1, 0.2 / 0.5) = 0.4`. Rejecting it outright would make `d` impossible, while the target writes it 1
# time in 5. Accepting it with probability 0.4 gives `d` exactly `0.5 × 0.4 = 0.2` of the time from
# accepted proposals; a rejection then never draws `d` again, because the residual `max(0, p - q)` is 0 at
# `d`.
# </details>

# %% [markdown]
# ## Recap
#
# - A server holds many sequences of unknown length. One maximum-length tensor per sequence leaves about
#   85 % of the slots unused on our chat-like mix of lengths.
# - A **paged KV cache** keeps one pool of blocks, `(N, kv, B, D)`, a free list, and a **block table** per
#   sequence: token `t` lives in block `table[t // B]`, slot `t % B`. Blocks are taken when the tokens
#   reach them and given back when the sequence finishes. The waste is the tail of each last block: under
#   4 % with blocks of 16 here.
# - **Paged attention** decodes a ragged batch straight from the pool: each sequence's own blocks, its
#   first `seq_lens[i]` slots, grouped-query heads sharing each key without a copy.
# - **Speculative decoding**: a draft proposes `n = min(k, left - 1)` tokens, the target reads them in one
#   pass, each is accepted with probability `min(1, p/q)`, the first rejection draws from `max(0, p - q)`
#   normalised, and full acceptance earns a bonus token; both caches are cut back after every round. The
#   output has the target's distribution exactly (its greedy tokens at temperature 0), and a good draft
#   writes several tokens per target pass.
# - **Continuous batching**: at every step, admit waiting requests while the batch has room and the cache
#   has their blocks (a prefill each), decode all the others in one pass, free a finished request's blocks at
#   once, and preempt the newest request (recomputed later) when the blocks run out. Each request writes
#   what it would alone, in fewer steps than static batches.
# - With the block table, a server also shares prefixes between requests: the rest of modern LLM serving
#   builds on it.
