"""Every hidden test must be able to fail: each known-wrong answer is rejected by its exercise's
test cells, and each correct alternative passes them. Runs the cells in-process (milliseconds)."""

from __future__ import annotations

import pytest

from grader import course
from tests.support import harness
from tests.fixtures.answers import Wrong, load

NOTEBOOKS = course.available_notebooks()


def _cases(kind: str):
    for notebook in NOTEBOOKS:
        module = load(notebook)
        if module is None:
            continue
        for exercise, answers in getattr(module, kind).items():
            for label, source in answers.items():
                yield pytest.param(notebook, exercise, source, id=f"{notebook[:2]}-{exercise}-{label}")


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_every_exercise_has_wrong_and_right_answers(notebook):
    module = load(notebook)
    assert module is not None, f"tests/fixtures/answers has no module for {notebook}"
    for exercise in harness.exercises(notebook):
        assert len(module.WRONG.get(exercise, {})) >= 3, f"{notebook}: fewer than 3 wrong answers for {exercise}"
        assert module.RIGHT.get(exercise), f"{notebook}: no correct alternative for {exercise}"


@pytest.mark.parametrize("notebook, exercise, source", list(_cases("WRONG")))
def test_wrong_answer_is_rejected(notebook, exercise, source, capsys):
    with pytest.raises(Exception) as info:
        harness.run_tests_with_answer(notebook, exercise, source)
    # A self-check failure must explain itself: it names the exercise, and the mistake.
    if isinstance(info.value, AssertionError):
        assert exercise in str(info.value), f"message does not name the exercise: {info.value}"
    assert isinstance(source, Wrong), "state the hint its message must contain: wrong(source, hint)"
    assert source.hint in str(info.value), f"the message does not name the mistake ({source.hint!r}): {info.value}"


@pytest.mark.parametrize("notebook, exercise, source", list(_cases("RIGHT")))
def test_correct_alternative_passes(notebook, exercise, source, capsys):
    harness.run_tests_with_answer(notebook, exercise, source)


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_solution_passes_its_own_tests(notebook):
    nb = harness.solution_notebook(notebook)
    for cell in nb.cells:
        gid = harness.grade_id(cell)
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution") and gid:
            harness.run_tests_with_answer(notebook, gid, cell.source)
