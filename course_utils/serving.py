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
