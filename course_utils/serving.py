"""Given helpers of notebook 11 (serving): a mix of request lengths, the memory a cache reserves for it,
and a picture of a paged cache's pool of blocks."""

from __future__ import annotations

from typing import Any, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import ListedColormap


def request_lengths(n: int, seed: int = 0, median: float = 200.0, max_len: int = 2048) -> list[int]:
    """``n`` request lengths (prompt plus answer, in tokens) like chat traffic: log-normal with the given
    median (most requests short, a few long), at least 1 and at most ``max_len``."""
    g = torch.Generator().manual_seed(seed)
    drawn = torch.exp(torch.randn(n, generator=g, dtype=torch.float64) + torch.log(torch.tensor(median)))
    return [int(min(max_len, max(1, round(x)))) for x in drawn.tolist()]


def reserved_contiguous(lengths: Sequence[int], max_len: int) -> int:
    """Token slots a cache of one ``max_len`` tensor per sequence reserves for ``lengths``."""
    return len(lengths) * max_len


def fill(cache: Any, lengths: Sequence[int], first_id: int = 0) -> list[int]:
    """Allocate one sequence per length in ``cache`` and append that many tokens of zeros to each (their
    values do not matter for counting); returns the sequence ids."""
    num_kv_heads, head_dim = cache.key_blocks.shape[1], cache.key_blocks.shape[3]
    ids = []
    for i, length in enumerate(lengths):
        seq = first_id + i
        cache.allocate(seq)
        zeros = torch.zeros(num_kv_heads, length, head_dim)
        cache.append(seq, zeros, zeros)
        ids.append(seq)
    return ids


def plot_pool(cache: Any, seq_ids: Sequence[int], ax: "plt.Axes | None" = None, title: str = "") -> "plt.Axes":
    """The pool of blocks as a strip of cells, one per block, coloured by the sequence that owns it (white:
    free), each cell labelled with its place in that sequence's block table (``s2:0`` = sequence 2's first
    block). ``seq_ids``: every sequence that may appear, in colour order (one not allocated now is skipped,
    so that a sequence keeps its colour from one picture to the next)."""
    num_blocks = cache.key_blocks.shape[0]
    owner = torch.full((num_blocks,), -1)
    labels = [""] * num_blocks
    for colour, seq in enumerate(seq_ids):
        try:
            table = cache.block_table(seq)
        except KeyError:  # not allocated now
            continue
        for place, block in enumerate(table):
            owner[block] = colour
            labels[block] = f"s{seq}:{place}"
    colours = ["white"] + [plt.get_cmap("tab10")(i % 10) for i in range(len(seq_ids))]
    if ax is None:
        _, ax = plt.subplots(figsize=(min(14, 0.7 * num_blocks + 1), 1.4))
    ax.imshow((owner + 1)[None].numpy(), cmap=ListedColormap(colours), vmin=-0.5, vmax=len(seq_ids) + 0.5,
              aspect="auto")
    for block, label in enumerate(labels):
        ax.text(block, 0, label or "free", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(num_blocks))
    ax.set_yticks([])
    ax.set_xlabel("block number in the pool")
    ax.set_xticks([x - 0.5 for x in range(1, num_blocks)], minor=True)
    ax.grid(which="minor", color="grey", linewidth=0.8)
    ax.tick_params(which="minor", length=0)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def truncate_cache(model: Any, num_tokens: int) -> None:
    """Keep only the first ``num_tokens`` tokens of ``model``'s KV caches, as if it had read no more: a
    notebook 09 ``TinyGPT`` (each block's ``att.cache_k`` and ``att.cache_v``, ``(b, H, T, D)``, and
    ``model.num_cached``), or any model with a ``truncate_cache(num_tokens)`` method of its own. Cheap: a view
    of the first ``num_tokens`` positions, nothing recomputed."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be at least 0, got {num_tokens}")
    own = getattr(model, "truncate_cache", None)
    if callable(own):
        own(num_tokens)
        return
    for block in model.blocks:
        att = block.att
        if att.cache_k is not None:
            att.cache_k = att.cache_k[:, :, :num_tokens]  # (b, H, num_tokens, D)
            att.cache_v = att.cache_v[:, :, :num_tokens]
    model.num_cached = min(model.num_cached, num_tokens)


class PagedTinyGPT:
    """Notebook 09's ``TinyGPT`` served from a paged KV cache, for a continuous batcher.

    The cache holds every layer's keys and values side by side as its key/value heads: ``num_kv_heads =
    num_layers * num_heads`` (layer ``l``'s heads are ``l * H .. (l + 1) * H - 1``), ``head_dim`` the model's.
    ``model(cache, seq_ids, tokens, positions)`` reads, for each sequence ``seq_ids[i]`` (allocated in the
    cache), its new tokens ``tokens[i]`` (a 1-D tensor of token ids) at positions ``positions[i] ..``, attending
    to the tokens its cache holds and, causally, to its new ones; it appends the new tokens' keys and values
    to the cache and returns the logits of each sequence's last new token, ``(len(seq_ids), vocab_size)``.
    All the sequences' tokens go through the weights together: one forward pass for the whole batch."""

    def __init__(self, model: Any):
        self.model = model.eval()
        first = model.blocks[0].att
        self.num_layers, self.num_heads, self.head_dim = len(model.blocks), first.num_heads, first.head_dim
        self.context_length = model.context_length

    def make_cache(self, cache_class: Any, num_blocks: int, block_size: int) -> Any:
        """A cache for this model: ``cache_class(num_blocks, block_size, num_layers * num_heads, head_dim)``."""
        return cache_class(num_blocks, block_size, self.num_layers * self.num_heads, self.head_dim)

    @torch.no_grad()
    def __call__(self, cache: Any, seq_ids: Sequence[int], tokens: Sequence[torch.Tensor],
                 positions: Sequence[int]) -> torch.Tensor:
        import math

        m, H, D = self.model, self.num_heads, self.head_dim
        sizes = [len(t) for t in tokens]
        x = torch.cat([m.pos_emb(m.tok_emb(t.view(1, -1)), start=int(p))[0]  # (T_i, d): tokens plus positions
                       for t, p in zip(tokens, positions)])  # (S, d): every sequence's new tokens
        past = [cache.gather(seq) for seq in seq_ids]  # each (L * H, T_past, D)
        new_k: list[list[torch.Tensor]] = [[] for _ in seq_ids]
        new_v: list[list[torch.Tensor]] = [[] for _ in seq_ids]
        for layer, block in enumerate(m.blocks):
            att, h = block.att, block.norm1(x)  # (S, d)
            q, k, v = (w(h).view(-1, H, D).transpose(0, 1) for w in (att.W_query, att.W_key, att.W_value))  # (H, S, D)
            outs, start = [], 0
            for i, size in enumerate(sizes):
                heads = slice(layer * H, (layer + 1) * H)
                ki = torch.cat([past[i][0][heads], k[:, start:start + size]], dim=1)  # (H, T_past + T_i, D)
                vi = torch.cat([past[i][1][heads], v[:, start:start + size]], dim=1)
                new_k[i].append(k[:, start:start + size])
                new_v[i].append(v[:, start:start + size])
                scores = q[:, start:start + size] @ ki.transpose(1, 2) / math.sqrt(D)  # (H, T_i, T_past + T_i)
                n_past = ki.shape[1] - size
                future = torch.ones(size, size, dtype=torch.bool).triu(1)  # new token j sees new tokens <= j
                scores[:, :, n_past:] = scores[:, :, n_past:].masked_fill(future, float("-inf"))
                outs.append((torch.softmax(scores, dim=-1) @ vi).transpose(0, 1).reshape(size, H * D))
                start += size
            x = x + att.out_proj(torch.cat(outs))  # (S, d)
            x = x + block.ff(block.norm2(x))
        for i, seq in enumerate(seq_ids):
            cache.append(seq, torch.cat(new_k[i]), torch.cat(new_v[i]))  # (L * H, T_i, D) each
        last = torch.tensor(sizes).cumsum(0) - 1  # each sequence's last new token
        return m.out_head(m.final_norm(x[last]))  # (n, vocab_size)


def static_batching(model: Any, cache: Any, requests: Sequence[tuple[torch.Tensor, int]],
                    batch_size: int) -> tuple[dict[int, list[int]], int]:
    """Greedy generation in fixed batches, for comparison with continuous batching: requests ``(prompt (T0,),
    max_new_tokens)`` taken ``batch_size`` at a time, each batch prefilled, then decoded together until its
    longest request is finished (a finished request keeps its place and its blocks until then), then freed.
    Returns each request's tokens and the number of steps (one per decoding pass, one per batch's prefill)."""
    written: dict[int, list[int]] = {}
    steps = 0
    for first in range(0, len(requests), batch_size):
        batch = list(range(first, min(first + batch_size, len(requests))))
        for rid in batch:
            cache.allocate(rid)
            written[rid] = [int(model(cache, [rid], [requests[rid][0]], [0])[0].argmax())]
        steps += 1
        while True:
            live = [rid for rid in batch if len(written[rid]) < requests[rid][1]]
            if not live:
                break
            logits = model(cache, live, [torch.tensor(written[rid][-1:]) for rid in live],
                           [len(requests[rid][0]) + len(written[rid]) - 1 for rid in live])
            for rid, row in zip(live, logits):
                written[rid].append(int(row.argmax()))
            steps += 1
        for rid in batch:
            cache.free(rid)
    return written, steps
