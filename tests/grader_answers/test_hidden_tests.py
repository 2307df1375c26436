"""Every hidden test must be able to fail: each known-wrong answer is rejected by its exercise's
test cells, and each correct alternative passes them. Runs the cells in-process (milliseconds)."""

from __future__ import annotations

import pytest

from course_utils import checks
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


def _first_failure(notebook: str, exercise: str, source: str) -> Exception | None:
    """What the first failing test cell of the exercise raised with ``source`` as the answer (or the
    answer cell itself), as a kernel deciding the verdicts shows it; ``None`` if every cell passed."""
    try:
        verdicts = harness.test_verdicts(notebook, exercise, str(source))
    except Exception as exc:  # noqa: BLE001 - the answer cell itself failed
        return exc
    assert verdicts, f"{notebook}: no test cells for exercise {exercise!r}"
    return next((exc for _, exc in verdicts if exc is not None), None)


@pytest.mark.parametrize("notebook, exercise, source", list(_cases("WRONG")))
def test_wrong_answer_is_rejected(notebook, exercise, source, capsys):
    error = _first_failure(notebook, exercise, source)
    assert error is not None, f"{notebook}: the wrong {exercise} passed every test cell"
    # A self-check failure must explain itself: it names the exercise, and the mistake.
    if isinstance(error, AssertionError):
        assert exercise in str(error), f"message does not name the exercise: {error}"
    assert isinstance(source, Wrong), "state the hint its message must contain: wrong(source, hint)"
    assert source.hint in str(error), f"the message does not name the mistake ({source.hint!r}): {error}"


@pytest.mark.parametrize("notebook, exercise, source", list(_cases("RIGHT")))
def test_correct_alternative_passes(notebook, exercise, source, capsys):
    error = _first_failure(notebook, exercise, source)
    if error is not None:
        raise error
    # Its hidden plan ran in the test cells, as the grader's kernel runs it: the judge read only what the
    # plan made (issue 34's plan-covers-judge test; tests/checks/test_specs.py holds it for the reference
    # and each wrong answer).
    judged = harness.plans_read(notebook, exercise, str(source))
    if exercise in checks.SPECS:
        assert any(ex == exercise and hidden for ex, hidden, _, _ in judged), f"the hidden plan of {exercise} was not judged"
    for ex, _, made, read in judged:
        assert read <= made, f"{ex}'s judge read outcomes its plan does not make: {sorted(read - made)}"


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_solution_passes_its_own_tests(notebook):
    nb = harness.solution_notebook(notebook)
    for cell in nb.cells:
        gid = harness.grade_id(cell)
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution") and gid:
            harness.run_tests_with_answer(notebook, gid, cell.source)
