"""Figures: annotation colours follow the colour scale, labels are parameters, 3-D labels do not collide."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

from course_utils import data, plotting


def _text_colors(ax) -> dict[str, str]:
    return {t.get_text(): t.get_color() for t in ax.texts}


def test_annotation_colour_follows_the_colour_scale_not_the_mean():
    # With vmin=0, vmax=1 every value here is in the dark lower part of viridis, although half of
    # them lie above the mean: the old `value > mean` rule wrote dark text on them.
    w = torch.tensor([[0.05, 0.10], [0.15, 0.20]])
    ax = plotting.plot_attention(w, vmin=0.0, vmax=1.0)
    assert set(_text_colors(ax).values()) == {"white"}
    # The light upper part of the scale gets dark text, whatever the mean.
    ax = plotting.plot_attention(torch.tensor([[0.80, 0.85], [0.90, 0.95]]), vmin=0.0, vmax=1.0)
    assert set(_text_colors(ax).values()) == {"black"}
    plt.close("all")


def test_annotation_colour_switches_near_the_middle_of_the_scale():
    w = torch.tensor([[0.0, 0.25, 0.75, 1.0]])
    colors = _text_colors(plotting.plot_attention(w, vmin=0.0, vmax=1.0))
    assert colors == {"0.00": "white", "0.25": "white", "0.75": "black", "1.00": "black"}
    plt.close("all")


def test_annotation_colour_follows_a_reversed_colormap():
    w = torch.tensor([[0.0, 1.0]])
    colors = _text_colors(plotting.plot_attention(w, vmin=0.0, vmax=1.0, cmap="viridis_r"))
    assert colors == {"0.00": "black", "1.00": "white"}
    plt.close("all")


def test_minus_inf_cells_show_the_background_and_get_dark_text():
    scores = torch.tensor([[1.0, float("-inf")], [0.5, 2.0]])
    colors = _text_colors(plotting.plot_attention(scores))
    assert colors["-inf"] == "black"  # the axes' white background shows through a masked cell
    plt.close("all")


def test_text_color_for_extremes():
    assert plotting.text_color_for((0.0, 0.0, 0.0, 1.0)) == "white"
    assert plotting.text_color_for((1.0, 1.0, 1.0, 1.0)) == "black"
    assert plotting.text_color_for((0.0, 0.0, 0.0, 0.0), background=(0.0, 0.0, 0.0, 1.0)) == "white"


def test_bar_chart_y_label_is_a_parameter():
    ax = plotting.plot_weights_bar(torch.arange(6.0), data.TOKENS, ylabel="score")
    assert ax.get_ylabel() == "score"
    assert plotting.plot_weights_bar(torch.ones(6) / 6, data.TOKENS).get_ylabel() == "weight"
    plt.close("all")


def test_bar_chart_number_format():
    ax = plotting.plot_weights_bar(torch.tensor([0.0004, -0.0069]), ["a", "b"], fmt="%+.4f")
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["+0.0004", "-0.0069"]
    plt.close("all")


def test_3d_plot_has_axis_labels_and_separate_labels():
    ax = plotting.plot_embeddings_3d(data.book_inputs(), data.TOKENS)
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_zlabel()
    spots = torch.tensor([t.get_position_3d() for t in ax.texts])  # (6, 3)
    gaps = torch.cdist(spots, spots) + torch.eye(len(spots)) * 10
    assert gaps.min() >= 0.12  # "journey" and "starts" point almost the same way, their labels do not touch
    plt.close("all")


def test_spread_labels_leaves_distant_points_alone():
    points = torch.tensor([[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    assert torch.equal(plotting.spread_labels_3d(points), points)
    with pytest.raises(ValueError, match=r"\(n, 3\)"):
        plotting.spread_labels_3d(torch.ones(4))


def test_readable_log_axes_show_plain_numbers():
    fig, ax = plt.subplots()
    ax.plot([64, 128, 256], [0.5, 2.0, 9.0])
    plotting.readable_log_axes(ax, [64, 128, 256])
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "128", "256"]
    assert any(t.get_text() == "1" for t in ax.get_yticklabels())
    plt.close(fig)


def test_peaks_print_one_aligned_line_per_way_in_mib():
    peaks = {"naive": [2 * 2**20, 8 * 2**20], "tiled (yours)": [1.5 * 2**20, 1.75 * 2**20]}
    lines = plotting.format_peaks([256, 512], peaks).splitlines()
    assert lines == ["naive          T=256:    2.0 MiB  T=512:    8.0 MiB",
                     "tiled (yours)  T=256:    1.5 MiB  T=512:    1.8 MiB"]


def test_peak_plot_draws_each_way_and_the_reference_in_mib():
    peaks = {"naive": [2 * 2**20, 8 * 2**20], "yours": [2**20, 2 * 2**20]}
    fig = plotting.plot_peaks([256, 512], peaks, ylabel="peak (MiB)", title="t",
                              reference=([4 * 2**20, 16 * 2**20], "two (T, T) tensors"))
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["naive", "yours", "two (T, T) tensors"]
    assert list(ax.get_lines()[0].get_ydata()) == [2.0, 8.0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log" and ax.get_ylabel() == "peak (MiB)"
    plt.close(fig)
