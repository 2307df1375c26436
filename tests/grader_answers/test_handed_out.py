"""The grader's side of a spec (issue 34): the plan goes in, the outcomes come out by key, the same judge runs.

``tests/checks/test_specs.py`` proves each judge reads only what its plan makes, on every known answer, in
one process. This file proves the crossing: for each exercise declared by a spec, the reference's answer and
one known mistake run as a grading kernel runs them (``probe.begin``, the plan the grader sent in, the
hand-off written when the cell ends), and the verdict the grader then gives outside is the one the test
cell gives in the instructor's kernel. And what comes back is refused where it is not the plan's: an
unknown key, a missing one, another plan's outcomes, a malformed outcome, a runner's data of the wrong form.
"""

from __future__ import annotations

import pytest
import torch

from course_utils import checks
from course_utils.checks import wire
from grader import course, intake, judge
from tests.fixtures.answers import load
from tests.grader_answers.test_judge import _handed_out
from tests.support import harness


def _notebook_of(exercise: str) -> str:
    return next(n for n, found in course.EXERCISES.items() if exercise in found)


def _pairs():
    for exercise in sorted(checks.SPECS):
        notebook = _notebook_of(exercise)
        module = load(notebook)
        right = next(iter(module.RIGHT[exercise].values()))
        wrong = next(iter(module.WRONG[exercise].values()))
        yield pytest.param(notebook, exercise, right, id=f"{exercise}-right")
        yield pytest.param(notebook, exercise, wrong, id=f"{exercise}-wrong")


def _hand_out(notebook: str, exercise: str, source: str, monkeypatch) -> tuple[judge.HandOff, list[str]]:
    """Run ``source`` and the exercise's test cells as the grading kernel does; the hand-off and test ids."""
    handoff, cells = _handed_out(notebook, exercise, str(source), monkeypatch)
    return handoff, harness.test_ids_for(exercise, cells, notebook)


@pytest.mark.parametrize("notebook, exercise, source", list(_pairs()))
def test_the_verdict_outside_is_the_test_cells(notebook, exercise, source, monkeypatch, capsys):
    want = {gid: (None, "") if exc is None else (type(exc).__name__, str(exc))
            for gid, exc in harness.test_verdicts(notebook, exercise, str(source))}
    handoff, tests = _hand_out(notebook, exercise, source, monkeypatch)
    try:
        sources = {exercise: intake.definition_of(str(source), exercise)[0]}
        for gid in tests:
            verdict = judge.judge_handed_out(handoff.outputs, notebook, gid, sources)
            assert (verdict.ename, verdict.evalue) == want[gid], gid
    finally:
        handoff.remove()


# --------------------------------------------------------------------------------------------
# What comes back is refused where it is not the plan's
# --------------------------------------------------------------------------------------------
NB01, TEST = "01_dot_products", "test_dot"
DOT = "def dot(x, y):\n    total = 0.0\n    for a, b in zip(x, y):\n        total = total + a * b\n    return total\n"


@pytest.fixture
def handed(monkeypatch):
    """A right ``dot`` handed out as a kernel does: ``(the hand-off, its data)``; rewrite it with :func:`_rewrite`."""
    handoff, _ = _hand_out(NB01, "dot", DOT, monkeypatch)
    data = wire.read_file(handoff.outputs, TEST)
    yield handoff, data
    handoff.remove()


def _rewrite(handoff, data) -> judge.Verdict:
    wire.write_hand_off(data, wire.hand_off_path(handoff.outputs, TEST))
    return judge.judge_handed_out(handoff.outputs, NB01, TEST, {"dot": DOT})


def _plans(data) -> list[dict]:
    return [r for r in data["records"] if "plan" in r]


def test_an_honest_hand_off_passes(handed):
    handoff, data = handed
    assert [r["plan"] for r in _plans(data)] == ["visible", "hidden"]
    assert _rewrite(handoff, data).ename is None


@pytest.mark.parametrize("change, words", [
    (lambda r: r["outcomes"].append(["a call nobody asked for", {"result": {"kind": "none"}}]), "not those of the calls"),
    (lambda r: r["outcomes"].pop(), "not those of the calls"),
    (lambda r: r.__setitem__("plan", "visible"), "another plan"),
])
def test_outcomes_that_are_not_the_plans_score_zero(handed, change, words):
    handoff, data = handed
    change(_plans(data)[1])
    verdict = _rewrite(handoff, data)
    assert verdict.ename == judge.HANDOFF_ERROR and words in verdict.evalue, verdict.evalue


@pytest.mark.parametrize("outcome, words", [
    ({"result": {"kind": "tensor", "value": "1.0"}}, "not a plain torch.Tensor"),
    ({"result": {"kind": "none"}, "error": {"type": "ValueError", "message": ""}}, "a result or an error"),
    ({"error": {"type": "no such type!", "message": ""}}, "without a type name"),
    ({"result": {"kind": "none"}, "changed": ["x"]}, "argument positions"),
])
def test_a_malformed_outcome_is_refused(handed, outcome, words):
    """Refused as the file is read (``JudgeOutside`` scores the test 0 with the reason)."""
    handoff, data = handed
    _plans(data)[0]["outcomes"][0][1] = outcome
    with pytest.raises(judge.BadHandOff, match=words):
        _rewrite(handoff, data)


def test_a_key_given_twice_is_refused(handed):
    handoff, data = handed
    record = _plans(data)[0]
    record["outcomes"].append(list(record["outcomes"][0]))
    with pytest.raises(judge.BadHandOff, match="a key of its own"):
        _rewrite(handoff, data)


def test_a_forged_outcome_in_the_plans_form_is_judged_as_it_is(handed):
    """The kernel is the student's: outcomes it forges in the plan's form are judged as any other, here a
    wrong value that fails with the check's own message. The grader's defence is that no expected value is
    in the kernel to copy (the student edition, and no hidden output ever enters it)."""
    handoff, data = handed
    for key, outcome in _plans(data)[0]["outcomes"]:
        outcome["result"] = {"kind": "tensor", "value": torch.tensor(0.5)}
    verdict = _rewrite(handoff, data)
    assert verdict.ename == "CheckFailed" and "❌ dot on case" in verdict.evalue, verdict.evalue


def test_a_runners_data_of_the_wrong_form_scores_zero(monkeypatch):
    """A runner's outcome (notebook 03's copy between modules) that no run of the plan gives: the judge refuses
    it (``spec.Forged``), and the grader says the hand-off was changed."""
    notebook, exercise = "03_trainable_self_attention", "copy_v2_weights_to_v1"
    source = next(iter(load(notebook).RIGHT[exercise].values()))
    handoff, tests = _hand_out(notebook, exercise, source, monkeypatch)
    try:
        data = wire.read_file(handoff.outputs, tests[0])
        record = next(r for r in data["records"] if "plan" in r)
        record["outcomes"][0][1] = {"result": wire.encode({"v2": [True, True], "v1": []})}
        wire.write_hand_off(data, wire.hand_off_path(handoff.outputs, tests[0]))
        verdict = judge.judge_handed_out(handoff.outputs, notebook, tests[0],
                                         {exercise: intake.definition_of(str(source), exercise)[0]})
        assert verdict.ename == judge.HANDOFF_ERROR and "the hand-off was changed" in verdict.evalue, verdict.evalue
    finally:
        handoff.remove()
