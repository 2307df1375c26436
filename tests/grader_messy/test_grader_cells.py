"""grader.cells: the one reader of nbgrader metadata, and which exercise a test belongs to."""

from __future__ import annotations

import nbformat
import pytest

from grader import cells, course, intake
from tests.support import harness


def _cell(**meta):
    return nbformat.v4.new_code_cell("x", metadata={"nbgrader": meta} if meta else {})


def test_answer_and_test_follow_nbgrader_rules():
    assert cells.is_answer(_cell(grade_id="dot", solution=True, grade=False))
    assert not cells.is_test(_cell(grade_id="dot", solution=True, grade=False))
    assert cells.is_test(_cell(grade_id="test_dot", solution=False, grade=True, points=2))
    assert not cells.is_answer(_cell(grade_id="test_dot", solution=False, grade=True))
    assert not cells.is_answer(_cell()) and not cells.is_test(_cell())


@pytest.mark.parametrize("broken", [None, "text", 3])
def test_messy_metadata_is_read_as_none(broken):
    cell = nbformat.v4.new_code_cell("x")
    cell.metadata["nbgrader"] = broken
    assert cells.metadata(cell) == {} and cells.grade_id(cell) is None
    assert not cells.is_answer(cell) and not cells.is_test(cell)


def test_longest_exercise_name_wins():
    """Both names are real exercises of one notebook: a prefix rule alone gives the wrong one."""
    exercises = course.EXERCISES["01_dot_products"]
    assert cells.exercise_of_test("test_attention_scores_for_query", exercises) == "attention_scores_for_query"
    assert cells.exercise_of_test("test_attention_scores", exercises) == "attention_scores"
    assert cells.exercise_of_test("test_dot_hidden", exercises) == "dot"
    assert cells.exercise_of_test("test_nothing", exercises) is None
    assert cells.tests_of("attention_scores", ["test_attention_scores", "test_attention_scores_for_query"],
                          exercises) == ["test_attention_scores"]


@pytest.mark.parametrize("notebook", course.available_notebooks())
def test_every_test_cell_belongs_to_exactly_the_exercise_it_tests(notebook):
    """Every test of every notebook maps to its own exercise, the same way in the grader and the
    test harness (no name may be claimed by a shorter exercise that it starts with)."""
    src = intake.load_source(notebook)
    exercises = list(src.answers)
    for test_id, test in src.tests.items():
        assert test.exercise in exercises, f"{notebook}: {test_id} belongs to no exercise"
        assert "check_" + test.exercise + "(" in test.source, f"{notebook}: {test_id} does not check {test.exercise}"
        assert harness.test_ids_for(test.exercise, src.tests, notebook).count(test_id) == 1
        for other in exercises:
            if other != test.exercise:
                assert test_id not in harness.test_ids_for(other, src.tests, notebook)


def _contract() -> dict[str, list[str]]:
    """notebook -> the exercises docs/design.md's contract table names (its third column, in backquotes)."""
    import re

    found = {}
    for line in (course.repo_root() / "docs" / "design.md").read_text(encoding="utf-8").splitlines():
        row = re.match(r"\| `(\d\d_\w+)\.ipynb` \|.*\|(.*)\|\s*$", line)
        if row:
            found[row.group(1)] = re.findall(r"`(\w+)`", row.group(2))
    return found


def test_exercises_agree_with_contract_reference_checks_and_sources():
    """course.EXERCISES (read from the sources), the contract in docs/design.md, the answer cells of each built
    notebook, course_utils.reference and the checks name the same exercises."""
    import course_utils.checks as checks
    import course_utils.reference as reference

    contract = _contract()
    for notebook in course.available_notebooks():
        assert contract.get(notebook) == list(course.EXERCISES[notebook]), f"docs/design.md's row of {notebook}"
        assert list(intake.load_source(notebook).answers) == list(course.EXERCISES[notebook]), notebook
        for exercise in course.EXERCISES[notebook]:
            assert hasattr(reference, exercise), f"course_utils.reference has no {exercise}"
            assert hasattr(checks, f"check_{exercise}"), f"course_utils.checks has no check_{exercise}"


def test_every_rule_belongs_to_an_exercise():
    """A rule keyed by a misspelt or renamed exercise would silently never apply."""
    from course_utils import rules

    exercises = {e for names in course.EXERCISES.values() for e in names}
    assert set(rules.RULES) <= exercises, set(rules.RULES) - exercises
