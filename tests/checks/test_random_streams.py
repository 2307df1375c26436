"""Outputs drawn at random (dropout masks, sampled tokens) read from a recording are compared only where
this PyTorch draws the numbers of the one that recorded them; elsewhere a line says they are not, and
live checks (the grader's) always compare them.

The student edition's checks compare with outputs recorded by the course's PyTorch (2.13). PyTorch 2.5,
the oldest the course admits, draws other dropout masks and other ``torch.multinomial`` samples from the
same seed: a right answer would get a ❌ there (``make test-torch-floor`` runs the notebooks on it).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_utils import checks, reference, versions
from course_utils.checks import core, expected


class DropoutOnTheOutput(reference.CausalAttention):
    """A wrong CausalAttention: right in eval() mode, dropout on the output instead of the weights."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dropout, self.dropout = self.dropout, nn.Identity()
        try:
            return dropout(super().forward(x))
        finally:
            self.dropout = dropout


@pytest.fixture()
def other_torch(monkeypatch):
    """As if this PyTorch drew other numbers than the one that recorded the expectations."""
    monkeypatch.setattr(versions, "RECORDED_RANDOM_STREAMS",
                        {kind: "another torch's " + value for kind, value in versions.random_streams().items()})


def test_this_torch_draws_what_the_recordings_were_made_with():
    assert versions.same_random_stream("dropout") and versions.same_random_stream("sampling")


def test_the_streams_leave_the_global_random_state_alone():
    torch.manual_seed(3)
    before = torch.get_rng_state()
    versions.random_streams.__wrapped__()  # not the cached result: the drawing itself
    assert torch.equal(torch.get_rng_state(), before)


def test_recorded_dropout_outputs_are_compared_on_the_recording_torch(capsys):
    with expected.using(expected.RECORDED), pytest.raises(core.CheckFailed, match="train\\(\\) mode"):
        checks.check_CausalAttention(DropoutOnTheOutput)
    assert "not compared here" not in capsys.readouterr().out


def test_on_another_torch_recorded_dropout_outputs_are_left_out_and_it_says_so(other_torch, capsys):
    with expected.using(expected.RECORDED):
        checks.check_CausalAttention(reference.CausalAttention)
        checks.check_CausalAttention(DropoutOnTheOutput)  # its mistake shows only in train() mode
    out = capsys.readouterr().out
    assert ("ℹ️ CausalAttention: outputs with dropout (train() mode) are not compared here: from the same seed, "
            f"your PyTorch {torch.__version__} draws different dropout masks") in out
    assert "The grader compares them." in out


def test_live_checks_compare_dropout_outputs_on_any_torch(other_torch):
    with expected.using(expected.LIVE), pytest.raises(core.CheckFailed, match="train\\(\\) mode"):
        checks.check_CausalAttention(DropoutOnTheOutput)


def test_on_another_torch_recorded_samples_are_left_out_and_greedy_tokens_still_compared(other_torch, capsys):
    with expected.using(expected.RECORDED):
        checks.check_generate(reference.generate)
    assert "ℹ️ generate: sampled tokens are not compared here" in capsys.readouterr().out

    def always_first(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
        return reference.generate(model, prompt_ids, max_new_tokens, 0.0, top_k, use_cache)[..., :1].expand(
            -1, prompt_ids.shape[1] + max_new_tokens).clone()

    with expected.using(expected.RECORDED), pytest.raises(core.CheckFailed, match="greedy"):
        checks.check_generate(always_first)
