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


def test_a_library_not_implemented_error_is_not_the_stub():
    """Only the stub's NotImplementedError (no message) reads as 'not implemented yet'; PyTorch's own, with words,
    reads as any raised error (issue 36: F.cross_entropy given integer logits), in the kernel and out of it."""
    from course_utils.checks import core, wire

    assert core.is_stub_error(NotImplementedError()) and core.is_stub_error(wire.error_of("NotImplementedError", ""))
    assert not core.is_stub_error(NotImplementedError('"log_softmax_lastdim_kernel_impl" not implemented for \'Long\''))
    assert not core.is_stub_error(ValueError())
    assert core.is_stub_data("NotImplementedError", "") and not core.is_stub_data("NotImplementedError", "no kernel")

    def scores(x):
        raise NotImplementedError("no kernel for this dtype")
    msg = _message(checks.check_attention_scores, scores)
    assert "not implemented yet" not in msg and "your code raised NotImplementedError: no kernel for this dtype" in msg


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


def test_a_failed_check_shows_its_message_not_a_traceback_wall(tmp_path):
    """In Jupyter a failed check draws as its ❌ message in red; a student's own error still shows
    the student's line; the cell still fails for nbgrader (0 points) and nbval (an error output)."""
    import nbformat
    from nbclient import NotebookClient
    from nbgrader.utils import determine_grade

    test_meta = {"nbgrader": {"grade": True, "solution": False, "locked": True, "grade_id": "test_dot",
                              "points": 2, "schema_version": 3}}
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from course_utils import checks"),
        nbformat.v4.new_code_cell("def dot(x, y):\n    total = 0\n    for i in range(len(x)):\n"
                                  "        total = total + 2 * x[i] * y[i]\n    return total"),
        nbformat.v4.new_code_cell("checks.check_dot(dot)", metadata=test_meta),
        nbformat.v4.new_code_cell("def dot(x, y):\n    total = 0\n    for i in range(len(x)):\n"
                                  "        total = total + undefined_name * x[i]\n    return total"),
        nbformat.v4.new_code_cell("checks.check_dot(dot)", metadata=test_meta),
    ])
    NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout=120,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    wrong, raised = nb.cells[2], nb.cells[4]
    for cell in (wrong, raised):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert errors, "the cell must still fail"
        assert determine_grade(cell)[0] == 0, "nbgrader must give the failing check 0 points"
    shown = "\n".join(wrong.outputs[-1].traceback)
    assert "❌ dot on case" in shown and "\x1b[0;31m" in shown
    assert "core.py" not in shown and "Traceback" not in shown and "nb01.py" not in shown, shown
    shown = "\n".join(raised.outputs[-1].traceback)
    assert "total = total + undefined_name * x[i]" in shown, "the student's own line must be shown"
    assert "NameError" in shown and "❌ dot" in shown
    assert "core.py" not in shown, shown


def test_remembered_expectations_are_computed_once_per_key_and_only_live():
    """``expected.remembering`` (the known-answers files' store, conftest.py) gives a live key's first value again;
    recorded values, recordings and everything outside the block are untouched."""
    from course_utils.checks import expected

    runs = []

    def compute(value):
        runs.append(value)
        return torch.tensor([float(value)])

    store: dict = {}
    with expected.using(expected.LIVE), expected.remembering(store):
        first = expected.expect("demo", "case a", lambda: compute(1))
        again = expected.expect("demo", "case a", lambda: compute(2))
        other = expected.expect("demo", "case b", lambda: compute(3))
    assert runs == [1, 3] and again is first and other.item() == 3 and set(store) == {"demo|case a", "demo|case b"}
    with expected.using(expected.LIVE):
        assert expected.expect("demo", "case a", lambda: compute(4)).item() == 4  # outside the block: live again
    with expected.recording() as recorded, expected.remembering(store):
        assert expected.expect("demo", "case a", lambda: compute(5)).item() == 5  # a recording computes anew
    assert runs == [1, 3, 4, 5] and recorded["demo|case a"].item() == 5


@pytest.mark.parametrize("code, words", [
    ("torch.zeros(3, 4).transpose(1, 2)", "a dimension numbered from the front"),
    ("torch.zeros(3, 4).transpose(-3, -1)", "the code counts on more dimensions than this input has"),
])
def test_a_dimension_out_of_range_is_translated_by_where_it_was_counted_from(code, words):
    """PyTorch's 'Dimension out of range' (issue 36, batch T): a dimension counted from the front on an input with
    fewer leading dimensions, or one counted from the end past the first, each said as what it is."""
    from course_utils.checks import symptoms

    with pytest.raises(IndexError) as raised:
        eval(code)
    assert words in symptoms.error_hint(raised.value)
