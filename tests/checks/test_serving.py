"""Notebook 11 (serving) judged outside the kernel, as the grader does, on its declarative specs.

Every known answer's plan and judge are held together by ``tests/checks/test_specs.py``, and a right and a
wrong answer per exercise cross the hand-off in ``tests/grader_answers/test_handed_out.py``. Here:

- an outcome no honest run gives (a session item of another form, counts that do not add up to the runs) is
  refused with a ``HandOffError`` that says so, and a changed value fails as the check would fail it.
"""

from __future__ import annotations

import pytest
import torch

from course_utils.checks import nb11
from grader import course, intake, judge
from tests.fixtures.answers import load
from tests.grader_answers.test_judge import _handed_out

NOTEBOOK = "11_serving_paged_attention_and_speculative_decoding"
EXERCISES = course.EXERCISES[NOTEBOOK]
ANSWERS = load(NOTEBOOK)


def _honest(exercise: str, monkeypatch) -> tuple[str, list[dict], dict[str, str]]:
    """The visible test's records of the right answer, as the kernel hands them out."""
    source = next(iter(ANSWERS.RIGHT[exercise].values()))
    handoff, _ = _handed_out(NOTEBOOK, exercise, source, monkeypatch)
    try:
        test = f"test_{exercise}"
        records, seen, _ = judge.load_handed_out(handoff.outputs, test)
    finally:
        handoff.remove()
    return test, records, {exercise: intake.definition_of(source, exercise)[0], **seen}


def _outcome(records: list[dict], key: str) -> dict:
    """The visible plan's outcome of step ``key`` (its ``result``, as plain data)."""
    record = next(r for r in records if r.get("plan") == "visible")
    return next(outcome for k, outcome in record["outcomes"] if k == key)["result"]


def _number(value: int) -> dict:
    return {"kind": "number", "type": "int", "value": value}


def test_the_honest_hand_offs_pass(monkeypatch):
    for exercise in EXERCISES:
        test, records, sources = _honest(exercise, monkeypatch)
        verdict = judge.judge_test(NOTEBOOK, test, records, sources)
        assert verdict.ename is None, (exercise, verdict.evalue)


def test_a_session_item_of_another_form_is_refused(monkeypatch):
    test, records, sources = _honest("PagedKVCache", monkeypatch)
    key = nb11._visible_sessions()[0].key()
    _outcome(records, key)["items"][1]["items"].append(_number(0))  # ["ok", value, 0]: no run gives it
    verdict = judge.judge_test(NOTEBOOK, test, records, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "hand-off was changed" in verdict.evalue


def test_a_changed_block_table_fails_as_the_check_would(monkeypatch):
    test, records, sources = _honest("PagedKVCache", monkeypatch)
    key = nb11._visible_sessions()[1].key()
    session = _outcome(records, key)["items"]
    tables = [i for i, op in enumerate(nb11._visible_sessions()[1].args[1]) if op[0] == "block_table"]
    session[1 + tables[1]]["items"][1] = session[1 + tables[0]]["items"][1]  # sequence 2 given sequence 1's blocks
    verdict = judge.judge_test(NOTEBOOK, test, records, sources)
    assert verdict.ename == "CheckFailed" and "two sequences hold the same block" in verdict.evalue


def test_sampled_counts_that_do_not_add_up_are_refused(monkeypatch):
    test, records, sources = _honest("speculative_generate", monkeypatch)
    sampled = next(c for c in nb11._speculative_cases() if len(c.args) == 8)
    counts = _outcome(records, sampled.key())["items"][0]["value"]
    counts[0, 0] += 1  # one run more than the plan made
    verdict = judge.judge_test(NOTEBOOK, test, records, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "sampled runs" in verdict.evalue


def test_forged_counts_of_the_right_total_fail_the_statistical_test(monkeypatch):
    test, records, sources = _honest("speculative_generate", monkeypatch)
    sampled = next(c for c in nb11._speculative_cases() if len(c.args) == 8)
    counts = _outcome(records, sampled.key())["items"][0]["value"]
    counts.copy_(torch.zeros_like(counts))
    counts[0, 0] = sampled.args[6]  # every run wrote the same two tokens
    verdict = judge.judge_test(NOTEBOOK, test, records, sources)
    assert verdict.ename == "CheckFailed" and "chi-square" in verdict.evalue


def test_the_false_alarm_rate_is_stated_and_the_stand_ins_make_the_test_accurate():
    """Each of the 9 cells of a sampled case expects at least 20 runs (the chi-square approximation holds),
    and the known mistakes move the first token's law far enough to be caught every time."""
    for case in nb11._speculative_cases():
        if len(case.args) != 8:
            continue
        law, runs = nb11.target_law(case), case.args[6]
        assert float(law.sum()) == pytest.approx(1.0)
        assert float(law.min()) * runs >= 20
        laws = nb11.first_token_laws(case)
        p = laws.pop("right")
        for name, wrong in laws.items():
            assert runs * float(((wrong - p) ** 2 / p).sum()) > 100, name  # noncentrality against a cut near 32
    assert nb11.ALPHA == 1e-4
