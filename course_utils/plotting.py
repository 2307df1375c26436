"""Figures the notebooks share: attention heatmaps and bar charts of weights."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import torch


def _as_2d(weights: torch.Tensor) -> torch.Tensor:
    w = torch.as_tensor(weights).detach().to("cpu", torch.float32)
    if w.dim() != 2:
        raise ValueError(f"a heatmap needs a 2-D tensor (queries, keys), got shape {tuple(w.shape)}")
    return w


def plot_attention(
    weights: torch.Tensor,
    tokens: Sequence[str] | None = None,
    title: str = "attention",
    ax: "plt.Axes | None" = None,
    annotate: bool = True,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
) -> "plt.Axes":
    """Heatmap of a ``(Tq, Tk)`` matrix: rows are queries (who looks), columns keys (who is looked at).

    Args:
        weights: ``(Tq, Tk)`` scores or weights; moved to the CPU and detached.
        tokens: labels for both axes (must match ``Tq`` and ``Tk`` when the matrix is square).
        annotate: write each value in its cell (only for matrices up to 12 x 12).

    Returns:
        The matplotlib axes, for further styling.
    """
    w = _as_2d(weights)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.55 * w.shape[1], 0.8 + 0.5 * w.shape[0]))
    finite = w[torch.isfinite(w)]
    image = ax.imshow(
        torch.where(torch.isfinite(w), w, torch.full_like(w, float("nan"))).numpy(),
        cmap=cmap,
        vmin=vmin if vmin is not None else (float(finite.min()) if finite.numel() else None),
        vmax=vmax if vmax is not None else (float(finite.max()) if finite.numel() else None),
    )
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if tokens is not None:
        tokens = list(tokens)
        if len(tokens) >= max(w.shape):
            ax.set_xticks(range(w.shape[1]), tokens[: w.shape[1]], rotation=45, ha="right")
            ax.set_yticks(range(w.shape[0]), tokens[: w.shape[0]])
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title)
    if annotate and max(w.shape) <= 12:
        mid = float(finite.mean()) if finite.numel() else 0.0
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                value = float(w[i, j])
                text = "-inf" if value == float("-inf") else f"{value:.2f}"
                ax.text(j, i, text, ha="center", va="center", fontsize=8,
                        color="black" if value > mid else "white")
    return ax


def plot_attention_grid(
    weights: torch.Tensor,
    tokens: Sequence[str] | None = None,
    titles: Sequence[str] | None = None,
    suptitle: str | None = None,
) -> "plt.Figure":
    """One heatmap per leading index of a ``(n, Tq, Tk)`` tensor, side by side (e.g. one per head)."""
    w = torch.as_tensor(weights).detach().to("cpu", torch.float32)
    if w.dim() != 3:
        raise ValueError(f"plot_attention_grid needs shape (n, Tq, Tk), got {tuple(w.shape)}")
    n = w.shape[0]
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.4), squeeze=False)
    for k in range(n):
        title = titles[k] if titles is not None else f"head {k}"
        plot_attention(w[k], tokens, title=title, ax=axes[0, k], annotate=w.shape[-1] <= 8, vmin=0.0, vmax=1.0)
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    return fig


def plot_weights_bar(
    weights: torch.Tensor, tokens: Sequence[str], title: str = "attention weights", ax: "plt.Axes | None" = None
) -> "plt.Axes":
    """Bar chart of a ``(T,)`` vector of weights, one bar per token."""
    w = torch.as_tensor(weights).detach().to("cpu", torch.float32)
    if w.dim() != 1 or w.shape[0] != len(tokens):
        raise ValueError(f"need a (T,) vector with one weight per token; got shape {tuple(w.shape)} for {len(tokens)} tokens")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3))
    bars = ax.bar(list(tokens), w.numpy())
    ax.bar_label(bars, fmt="%.2f")
    ax.set_ylabel("weight")
    ax.set_title(title)
    return ax
