"""Helpers the notebooks share: device choice, example data, figures."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from course_utils import data, device, plotting


def test_get_device_falls_back_to_cpu_here():
    expected = "cuda" if torch.cuda.is_available() else ("mps" if device._mps_available() else "cpu")
    assert device.get_device().type == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA; the error path needs one without")
def test_asking_for_missing_cuda_is_a_clear_error():
    with pytest.raises(RuntimeError, match="cuda"):
        device.get_device("cuda")


def test_book_inputs_are_fresh_copies():
    a = data.book_inputs()
    a[0, 0] = 99.0
    assert data.book_inputs()[0, 0] == pytest.approx(0.43)
    assert data.book_batch().shape == (2, 6, 3)
    assert len(data.TOKENS) == 6


def test_heatmap_labels_and_shape_errors():
    ax = plotting.plot_attention(torch.softmax(torch.randn(6, 6), -1), data.TOKENS)
    assert [t.get_text() for t in ax.get_xticklabels()] == data.TOKENS
    with pytest.raises(ValueError, match="2-D"):
        plotting.plot_attention(torch.ones(2, 3, 3))
    fig = plotting.plot_attention_grid(torch.softmax(torch.randn(3, 4, 4), -1))
    assert len(fig.axes) == 6  # three heatmaps and their colour bars


def test_heatmap_accepts_minus_inf():
    scores = torch.randn(4, 4).masked_fill(torch.triu(torch.ones(4, 4, dtype=torch.bool), 1), float("-inf"))
    plotting.plot_attention(scores, title="masked")


def test_bar_chart_needs_one_weight_per_token():
    with pytest.raises(ValueError, match="one weight per token"):
        plotting.plot_weights_bar(torch.ones(5), data.TOKENS)
