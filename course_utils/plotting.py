"""Figures the notebooks share: attention heatmaps, bar charts of weights, embeddings in 3-D, and
log-scaled axes that stay readable."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import torch


def _as_2d(weights: torch.Tensor) -> torch.Tensor:
    w = torch.as_tensor(weights).detach().to("cpu", torch.float32)
    if w.dim() != 2:
        raise ValueError(f"a heatmap needs a 2-D tensor (queries, keys), got shape {tuple(w.shape)}")
    return w


def _relative_luminance(rgba: Sequence[float]) -> float:
    """WCAG relative luminance of an RGB(A) colour with channels in ``[0, 1]``."""
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(float(c)) for c in rgba[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def text_color_for(rgba: Sequence[float], background: Sequence[float] = (1.0, 1.0, 1.0, 1.0)) -> str:
    """``"black"`` or ``"white"``, whichever contrasts more with a cell of colour ``rgba``.

    A transparent cell (``alpha == 0``, e.g. a NaN or ``-inf`` entry) shows ``background``.
    """
    if len(rgba) > 3 and float(rgba[3]) == 0.0:
        rgba = background
    lum = _relative_luminance(rgba)
    # WCAG contrast ratios against black (luminance 0) and white (luminance 1).
    return "black" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "white"


def annotation_colors(image: "plt.AxesImage", values: torch.Tensor) -> list[list[str]]:
    """Text colour for every cell of a heatmap: read from the cell's own colour on the colour scale.

    The colour of a cell is ``cmap(norm(value))``: its value normalised between ``vmin`` and ``vmax``,
    then looked up in the colormap. Dark cells (the lower half of viridis) get white text, light
    cells black text, whatever the values' mean is.
    """
    background = image.axes.get_facecolor() if image.axes is not None else (1.0, 1.0, 1.0, 1.0)
    cmap, norm = image.get_cmap(), image.norm
    colors = []
    for row in values.tolist():
        line = []
        for value in row:
            rgba = (0.0, 0.0, 0.0, 0.0) if value != value or abs(value) == float("inf") else cmap(norm(value))
            line.append(text_color_for(rgba, background))
        colors.append(line)
    return colors


def plot_attention(
    weights: torch.Tensor,
    tokens: Sequence[str] | None = None,
    title: str = "attention",
    ax: "plt.Axes | None" = None,
    annotate: bool = True,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    legend: tuple[str, str] | None = None,
) -> "plt.Axes":
    """Heatmap of a ``(Tq, Tk)`` matrix: rows are queries (who looks), columns keys (who is looked at).

    Args:
        weights: ``(Tq, Tk)`` scores or weights; moved to the CPU and detached.
        tokens: labels for both axes (must match ``Tq`` and ``Tk`` when the matrix is square).
        annotate: write each value in its cell (only for matrices up to 12 x 12), in black or white,
            whichever contrasts more with the cell's colour (see :func:`annotation_colors`).
        vmin, vmax: ends of the colour scale (default: the smallest and largest finite value).
        legend: for a boolean ``(Tq, Tk)`` mask: ``(label of False, label of True)``, e.g.
            ``("hidden", "may attend")``. The mask is drawn in two colours with a legend that names
            them, instead of a continuous colour bar (see :func:`plot_mask`).

    Returns:
        The matplotlib axes, for further styling.
    """
    if legend is not None:
        return plot_mask(weights, legend, tokens=tokens, title=title, ax=ax)
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
        colors = annotation_colors(image, w)
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                value = float(w[i, j])
                text = "-inf" if value == float("-inf") else f"{value:.2f}"
                ax.text(j, i, text, ha="center", va="center", fontsize=8, color=colors[i][j])
    return ax


#: The two colours of a boolean mask: False, True (viridis's ends, as in the heatmaps).
MASK_COLORS = ("#440154", "#fde725")


def plot_mask(
    mask: torch.Tensor,
    legend: tuple[str, str] = ("hidden", "may attend"),
    tokens: Sequence[str] | None = None,
    title: str = "mask",
    ax: "plt.Axes | None" = None,
) -> "plt.Axes":
    """A boolean ``(Tq, Tk)`` mask in two colours, with a legend that says what each colour means.

    Args:
        mask: ``(Tq, Tk)`` boolean (or 0/1) tensor; rows are queries, columns keys.
        legend: ``(label of False, label of True)``. Masks that mark what may be attended to are
            drawn with ``("hidden", "may attend")``; pass ``~mask`` for a mask that is True where hidden.
        tokens: labels for both axes, as in :func:`plot_attention`.
    """
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    m = _as_2d(torch.as_tensor(mask).bool())
    if len(legend) != 2:
        raise ValueError(f"legend needs two labels, (False, True), got {legend!r}")
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.55 * m.shape[1], 1.2 + 0.5 * m.shape[0]))
    ax.imshow(m.numpy(), cmap=ListedColormap(list(MASK_COLORS)), vmin=0, vmax=1)
    ax.set_xticks(range(m.shape[1]))
    ax.set_yticks(range(m.shape[0]))
    if tokens is not None:
        tokens = list(tokens)
        if len(tokens) >= max(m.shape):
            ax.set_xticks(range(m.shape[1]), tokens[: m.shape[1]], rotation=45, ha="right")
            ax.set_yticks(range(m.shape[0]), tokens[: m.shape[0]])
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title)
    handles = [Patch(facecolor=MASK_COLORS[1], edgecolor="gray", label=legend[1]),
               Patch(facecolor=MASK_COLORS[0], edgecolor="gray", label=legend[0])]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8)
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
    weights: torch.Tensor,
    tokens: Sequence[str],
    title: str = "attention weights",
    ax: "plt.Axes | None" = None,
    ylabel: str = "weight",
    fmt: str = "%.2f",
) -> "plt.Axes":
    """Bar chart of a ``(T,)`` vector, one bar per token.

    Args:
        weights: ``(T,)`` values: weights, raw scores, differences...
        tokens: one label per bar.
        ylabel: what the values are (``"weight"``, ``"score"``, ...).
        fmt: format of the number written on each bar.
    """
    w = torch.as_tensor(weights).detach().to("cpu", torch.float32)
    if w.dim() != 1 or w.shape[0] != len(tokens):
        raise ValueError(f"need a (T,) vector with one weight per token; got shape {tuple(w.shape)} for {len(tokens)} tokens")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3))
    bars = ax.bar(list(tokens), w.numpy())
    ax.bar_label(bars, fmt=fmt)
    if (w < 0).any():
        ax.axhline(0.0, color="black", linewidth=0.8)
    ax.margins(y=0.12)  # room for the numbers above (and below) the bars
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return ax


def spread_labels_3d(points: torch.Tensor, min_distance: float = 0.12, step: float = 0.07) -> torch.Tensor:
    """Label positions for ``(n, 3)`` points: each label sits at its point, moved down in ``z`` by
    ``step`` until it is at least ``min_distance`` away from every earlier label."""
    pts = torch.as_tensor(points, dtype=torch.float32)
    if pts.dim() != 2 or pts.shape[1] != 3:
        raise ValueError(f"need (n, 3) points, got shape {tuple(pts.shape)}")
    placed: list[torch.Tensor] = []
    for p in pts:
        spot = p.clone()
        for _ in range(20):
            if all(float((spot - q).norm()) >= min_distance for q in placed):
                break
            spot[2] -= step
        placed.append(spot)
    return torch.stack(placed) if placed else pts.clone()


def plot_embeddings_3d(
    vectors: torch.Tensor, tokens: Sequence[str], title: str = "token embeddings", ax: "plt.Axes | None" = None
) -> "plt.Axes":
    """Arrows from the origin to ``(T, 3)`` embeddings, labelled with their tokens, on labelled axes.

    Labels of points that lie close together are moved apart (:func:`spread_labels_3d`) and joined
    to their arrow tip by a thin line.
    """
    v = torch.as_tensor(vectors).detach().to("cpu", torch.float32)
    if v.dim() != 2 or v.shape[1] != 3 or v.shape[0] != len(tokens):
        raise ValueError(f"need (T, 3) vectors with one token each; got shape {tuple(v.shape)} for {len(tokens)} tokens")
    if ax is None:
        fig = plt.figure(figsize=(5.5, 5.5))
        ax = fig.add_subplot(projection="3d")
    tips = v.tolist()
    spots = spread_labels_3d(v * 1.04).tolist()
    for tip, spot, tok in zip(tips, spots, tokens):
        ax.quiver(0, 0, 0, *tip, arrow_length_ratio=0.08)
        if spot != [1.04 * c for c in tip]:
            ax.plot(*zip(tip, spot), color="gray", linewidth=0.6)
        ax.text(*spot, tok, fontsize=9)
    ax.set_xlim(0, 1); ax.set_ylim(0, 1); ax.set_zlim(0, 1)
    ax.set_xlabel("dimension 0"); ax.set_ylabel("dimension 1"); ax.set_zlabel("dimension 2")
    ax.set_title(title)
    return ax


def readable_log_axes(ax: "plt.Axes", x_values: Sequence[float] | None = None, base_x: int = 2) -> "plt.Axes":
    """Log axes whose ticks read as plain numbers: ``x`` ticks at ``x_values`` (e.g. 64, 128, 256)
    on a log base ``base_x`` scale, ``y`` ticks on a log 10 scale, with 2 and 5 labelled too when
    the data (plot it first) span at most three powers of ten."""
    ax.set_xscale("log", base=base_x)
    if x_values is not None:
        ax.set_xticks(list(x_values), [f"{v:g}" for v in x_values])
        ax.xaxis.set_minor_locator(mticker.NullLocator())
    ax.set_yscale("log")
    plain = mticker.FuncFormatter(lambda y, _: f"{y:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_locator(mticker.LogLocator(base=10, subs=(2.0, 5.0)))
    low, high = ax.get_ylim()
    few_decades = low > 0 and high / low <= 1e3
    ax.yaxis.set_minor_formatter(plain if few_decades else mticker.NullFormatter())
    ax.grid(True, which="both", alpha=0.3)
    return ax


def plot_roofline(
    points: Sequence[tuple[str, float]],
    spec: object,
    ax: "plt.Axes | None" = None,
    title: str = "memory-bound left of the ridge, compute-bound right",
    x_range: tuple[float, float] = (0.5, 1e4),
) -> "plt.Axes":
    """A roofline: attainable TFLOP/s against arithmetic intensity (FLOP/byte), on log axes.

    Args:
        points: ``(label, FLOP per byte)`` for each kernel; each is drawn on the roof, at
            ``min(intensity * bandwidth, peak)``, the most that intensity allows.
        spec: a :class:`course_utils.bench.GpuSpec` (its ``tensor_16bit_tflops`` and ``bandwidth_gbs``
            make the roof; the ridge point is their ratio).
        x_range: the intensities the roof is drawn over.
    """
    peak, bandwidth = float(spec.tensor_16bit_tflops), float(spec.bandwidth_gbs)
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4.2))
    xs = torch.logspace(torch.log10(torch.tensor(x_range[0])), torch.log10(torch.tensor(x_range[1])), 200)
    ax.plot(xs, torch.clamp(xs * bandwidth / 1e3, max=peak), color="black", label=f"{spec.name} roofline")
    ridge = peak * 1e12 / (bandwidth * 1e9)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (label, intensity) in enumerate(points):
        reach = min(intensity * bandwidth / 1e3, peak)
        ax.scatter([intensity], [reach], color=colors[k % len(colors)], zorder=3,
                   label=f"{label}: {intensity:.3g} FLOP/byte")
    ax.axvline(ridge, color="gray", linestyle=":", label=f"ridge point {ridge:.0f} FLOP/byte")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return ax


def format_peaks(seq_lens: Sequence[int], peaks: dict[str, Sequence[float]]) -> str:
    """One line per way of computing: its peak memory at each sequence length, in MiB to one decimal.

    ``peaks[name][i]`` is the peak in bytes at ``seq_lens[i]`` (notebooks 07 and 10 measure them with
    ``flash.measure_peak_memory`` and ``backward.peak_memory_with_backward``).
    """
    width = max(len(name) for name in peaks) + 1
    return "\n".join(f"{name:{width}s} " + "  ".join(f"T={T}: {b / 2**20:6.1f} MiB" for T, b in zip(seq_lens, values))
                     for name, values in peaks.items())


def plot_peaks(seq_lens: Sequence[int], peaks: dict[str, Sequence[float]], *, ylabel: str, title: str,
               reference: tuple[Sequence[float], str] | None = None) -> "plt.Figure":
    """Peak memory (bytes, shown in MiB) against the sequence length ``T`` on log axes, one line per way
    of computing; ``reference``: ``(bytes per T, label)``, drawn dotted in grey (e.g. the size of the
    ``(T, T)`` tensors the naive way keeps)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in peaks.items():
        ax.plot(seq_lens, [b / 2**20 for b in values], "o-", label=name)
    if reference is not None:
        values, label = reference
        ax.plot(seq_lens, [b / 2**20 for b in values], ":", color="gray", label=label)
    readable_log_axes(ax, seq_lens)
    ax.set_xlabel("sequence length T")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig
