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



def test_manual_seed_draws_what_torch_manual_seed_draws():
    draws = []
    for seed in (device.manual_seed, torch.manual_seed):
        seed(123)
        draws.append((torch.rand(4), torch.nn.Linear(3, 2).weight.detach(), torch.randint(0, 9, (5,))))
    for ours, torchs in zip(*draws):
        assert torch.equal(ours, torchs)


def test_manual_seed_is_torch_manual_seed_where_an_accelerator_exists(monkeypatch):
    seeded = []
    monkeypatch.setattr(torch, "manual_seed", seeded.append)
    monkeypatch.setattr(device, "_cpu_only", lambda: False)
    device.manual_seed(5)
    assert seeded == [5], "with a GPU, its generator must be seeded too"
    monkeypatch.setattr(device, "_cpu_only", lambda: True)
    device.manual_seed(6)
    assert seeded == [5], "the CPU's generator alone, where it is the only one"


def test_the_cpu_is_the_only_device_here_unless_torch_sees_another():
    others = torch.cuda.is_available() or device._mps_available()
    assert device._cpu_only() is not others
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
