"""The self-checks explain failures in words a student can act on."""

from __future__ import annotations

import pytest
import torch

from course_utils import checks, reference
from course_utils.checks.core import tensor_difference


def _message(check, fn) -> str:
    with pytest.raises(AssertionError) as info:
        check(fn)
    return str(info.value)


def test_pass_prints_a_verdict(capsys):
    checks.check_attention_scores(reference.attention_scores)
    assert "✅ attention_scores" in capsys.readouterr().out


def test_not_implemented_is_named():
    def dot(x, y):
        raise NotImplementedError()
    assert "not implemented yet" in _message(checks.check_dot, dot)


def test_wrong_shape_names_expected_and_actual():
    msg = _message(checks.check_attention_scores, lambda x: x.transpose(-2, -1) @ x)
    assert "expected shape (6, 6), got (3, 3)" in msg and "book sentence" in msg


def test_wrong_values_give_largest_error_and_index():
    msg = _message(checks.check_attention_scores_for_query, lambda inputs, q: inputs @ q + torch.tensor([0, 0, 0.5, 0, 0, 0]))
    assert "largest error 0.5" in msg and "[2]" in msg


def test_batch_failure_says_which_case():
    msg = _message(checks.check_attention_scores, lambda x: x @ x.T)
    assert "batch of 2" in msg


def test_nan_is_reported():
    diff = tensor_difference(torch.ones(3), torch.tensor([1.0, float("nan"), 1.0]))
    assert "NaN at [1]" in diff


def test_forbidden_call_is_reported_with_the_reason():
    def dot(x, y):
        return torch.dot(x, y)
    msg = _message(checks.check_dot, dot)
    assert "torch.dot" in msg and "loop" in msg


def test_in_place_change_of_input_is_reported():
    def attention_scores(x):
        x.mul_(1.0).add_(0.0)
        x[..., 0, 0] = 5.0
        return reference.attention_scores(x)
    assert "changed its input" in _message(checks.check_attention_scores, attention_scores)


def test_causality_leak_names_the_position():
    def leaky(x):  # position i averages all tokens: sees the future
        return x.mean(dim=1, keepdim=True).expand_as(x)
    with pytest.raises(AssertionError, match=r"future leaks: output at position 0"):
        checks.check_causal("leaky", leaky, torch.randn(1, 4, 3))


def test_checks_leave_the_random_state_alone():
    torch.manual_seed(42)
    expected = torch.rand(3)
    torch.manual_seed(42)
    checks.check_CausalAttention(reference.CausalAttention)  # seeds the generator internally
    assert torch.equal(torch.rand(3), expected)
