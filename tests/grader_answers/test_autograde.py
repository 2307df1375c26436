"""End to end through real nbgrader: a class of submissions built from the course's own notebooks.

For every notebook: the solution submitted as a student gets full marks; the untouched student
notebook gets 0 on every test cell and still gets its rows; each set of known-wrong answers
(tests/fixtures/answers) loses points on the exercises it breaks; correct alternatives get full marks.
All submissions are graded in one ``autograde`` call, as an instructor would: the suite's one graded class
(``tests/support/graded_class.py``), where the cheats of ``tests/grader_messy/test_cheats.py`` are graded too.
"""

from __future__ import annotations

import os

import nbformat
import pytest

from grader import course
from tests.support import harness
from tests.support.graded_class import answer_sets, solved, submissions

#: ``COURSE_E2E_NOTEBOOKS="07 08"`` grades only those notebooks (while writing one); default: all.
NOTEBOOKS = [n for n in course.available_notebooks()
             if not os.environ.get("COURSE_E2E_NOTEBOOKS")
             or n[:2] in os.environ["COURSE_E2E_NOTEBOOKS"].split()]


#: Each graded submission runs its whole notebook in a sandboxed kernel (3 to 11 s each), and one
#: submission can carry only one answer per exercise, so a notebook costs one run per answer of its
#: deepest exercise. ``make test`` sends, per notebook, the solution, the untouched notebook and the
#: first WRONG_DEPTH wrong answers of every exercise (the issue's own mistakes first) through
#: nbgrader: three graded runs per notebook show that the sandboxed, nbgrader-scored pipeline gives
#: full marks and takes points as the test cells say. Every right and wrong answer goes through the
#: same test cells (hidden ones included) and the same rules in
#: tests/grader_answers/test_hidden_tests.py, and every message in tests/checks/test_parity.py.
#: ``COURSE_E2E_DEPTH=all`` (or a number) also sends that many right and wrong answers here.
_DEPTH = os.environ.get("COURSE_E2E_DEPTH", "")
WRONG_DEPTH = 10**6 if _DEPTH == "all" else int(_DEPTH or 1)
RIGHT_DEPTH = 10**6 if _DEPTH == "all" else int(_DEPTH or 0)


@submissions("test_autograde")
def _submissions(taken: set) -> dict:
    """Per notebook: the solution, the untouched notebook, and the known answers (the depths above)."""
    found = {}
    for name in NOTEBOOKS:
        found[("solution", name)] = (nbformat.read(course.solutions_dir() / f"{name}.ipynb", as_version=4),
                                     {"full": True})
        found[("blank", name)] = (nbformat.read(course.notebooks_dir() / f"{name}.ipynb", as_version=4), {"zero": True})
        for k, answers in enumerate(answer_sets(name, "WRONG", WRONG_DEPTH)):
            found[(f"wrong_{k}", name)] = (solved(name, answers), {"wrong": set(answers)})
        for k, answers in enumerate(answer_sets(name, "RIGHT", RIGHT_DEPTH)):
            found[(f"right_{k}", name)] = (solved(name, answers), {"full": True})
    return found


@pytest.fixture(scope="module")
def graded(graded_class):
    """This file's submissions, graded in the suite's one class (``tests/support/graded_class.py``)."""
    plan = graded_class.plans["test_autograde"]
    cells = {key: {gid: (float(r["score"]), float(r["max_score"])) for gid, r in rows.items()}
             for key, rows in graded_class.cells.items()}
    return {"code": graded_class.code, "plan": plan, "cells": cells,
            "grades": {key: row for key, row in graded_class.grades.items() if key in plan},
            "originals": graded_class.originals}


def test_every_submission_gets_a_row_and_exit_0(graded):
    assert graded["code"] == 0
    assert set(graded["grades"]) == set(graded["plan"])


def test_originals_are_untouched(graded):
    for path, content in graded["originals"].items():
        assert path.read_bytes() == content, f"{path} was modified by the grader"


def _plan_items(graded, key):
    return [(s, n, e) for (s, n), e in graded["plan"].items() if key in e]


def test_full_marks(graded):
    for student, name, _ in _plan_items(graded, "full"):
        row = graded["grades"][(student, name)]
        assert float(row["max_score"]) > 0
        assert float(row["score"]) == float(row["max_score"]), (
            f"{student}/{name}: {row['score']} of {row['max_score']} ({row['status']}); "
            f"cells: {graded['cells'][(student, name)]}")


def test_untouched_notebook_scores_zero_on_every_test_cell(graded):
    for student, name, _ in _plan_items(graded, "zero"):
        cells = graded["cells"][(student, name)]
        solution_cells = graded["cells"][("solution", name)]
        assert set(cells) == set(solution_cells), f"{name}: the blank submission is missing rows"
        assert all(score == 0 for score, _ in cells.values()), f"{name}: blank got points: {cells}"


def test_each_wrong_answer_loses_points(graded):
    checked = 0
    for student, name, expect in _plan_items(graded, "wrong"):
        cells = graded["cells"][(student, name)]
        for exercise in expect["wrong"]:
            ids = harness.test_ids_for(exercise, cells)
            assert ids, f"{name}: no graded cells for {exercise}"
            score = sum(cells[i][0] for i in ids)
            max_score = sum(cells[i][1] for i in ids)
            assert score < max_score, f"{student}/{name}: the wrong {exercise} kept all {max_score} points"
            checked += 1
    assert checked >= min(3, WRONG_DEPTH) * 3 or NOTEBOOKS != course.available_notebooks(), \
        "notebook 01 alone has at least three wrong answers for each of three exercises"


def test_stderr_in_a_passing_test_cell_keeps_its_points():
    from nbformat.v4 import new_code_cell, new_output
    from nbgrader.utils import determine_grade

    from grader.preprocessors import StderrIsNotFailure

    cell = new_code_cell("checks.check_dot(dot)", metadata={"nbgrader": {
        "grade": True, "solution": False, "locked": True, "grade_id": "test_dot", "points": 2, "schema_version": 3}})
    cell.outputs = [new_output("stream", name="stderr", text="UserWarning: To copy construct from a tensor ...\n"),
                    new_output("stream", name="stdout", text="✅ dot: 3 cases agree\n")]
    assert determine_grade(cell)[0] == 0, "nbgrader alone scores any stderr as a failure"
    cell, _ = StderrIsNotFailure().preprocess_cell(cell, {}, 0)
    assert determine_grade(cell)[0] == 2
    assert "copy construct" in cell.outputs[0]["text"], "the warning text is kept for feedback"
    failing = new_code_cell("x", metadata=cell.metadata)
    failing.outputs = [new_output("error", ename="AssertionError", evalue="❌ dot", traceback=[])]
    failing, _ = StderrIsNotFailure().preprocess_cell(failing, {}, 0)
    assert determine_grade(failing)[0] == 0, "a raised error still fails"
