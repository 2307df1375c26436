"""Student notebooks are generated from the solutions, in sync, and leak nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import nbformat
import pytest

from course_utils import reference
from grader import course

NOTEBOOKS = course.available_notebooks()


def _grade_ids(nb) -> list[str]:
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "grade_id" in c.metadata.get("nbgrader", {})]


def test_all_six_notebooks_exist():
    assert NOTEBOOKS == list(course.NOTEBOOKS), f"missing sources: {set(course.NOTEBOOKS) - set(NOTEBOOKS)}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_design_exercises_are_graded(name):
    nb = nbformat.read(course.solutions_dir() / f"{name}.ipynb", as_version=4)
    ids = _grade_ids(nb)
    for exercise in course.EXERCISES[name]:
        assert exercise in ids, f"{name}: no answer cell with grade_id {exercise!r}"
        assert any(g == f"test_{exercise}" or g.startswith(f"test_{exercise}_") for g in ids), \
            f"{name}: no test cell for {exercise!r}"
        assert hasattr(reference, exercise), f"course_utils.reference has no {exercise}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_student_version_leaks_no_answers_or_hidden_tests(name):
    solution = nbformat.read(course.solutions_dir() / f"{name}.ipynb", as_version=4)
    student = nbformat.read(course.notebooks_dir() / f"{name}.ipynb", as_version=4)
    text = "\n".join(c.source for c in student.cells)
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text, f"notebooks/{name}.ipynb contains {marker!r}"
    hidden_lines = []
    for cell in solution.cells:
        inside = False
        for line in cell.source.splitlines():
            if "### BEGIN HIDDEN TESTS" in line:
                inside = True
            elif "### END HIDDEN TESTS" in line:
                inside = False
            elif inside and line.strip():
                hidden_lines.append(line.strip())
    assert hidden_lines, f"solutions/{name}.ipynb has no hidden tests"
    assert "checks.check_" in text, "the visible self-checks must stay in the student version"
    student_test_sources = [c.source for c in student.cells if c.metadata.get("nbgrader", {}).get("grade")]
    for line in hidden_lines:
        assert not any(line in src.splitlines() for src in student_test_sources), f"hidden test line leaked: {line}"
    assert all(not c.get("outputs") for c in student.cells if c.cell_type == "code"), "student versions have no outputs"
    assert "raise NotImplementedError()" in text


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_solutions_are_stored_executed_in_order(name):
    nb = nbformat.read(course.solutions_dir() / f"{name}.ipynb", as_version=4)
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1)), "solutions must be executed top to bottom from a clean kernel"
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, f"stored outputs contain an error: {errors[0].get('ename')}"


def _copy_course(tmp_path):
    root = course.repo_root()
    for item in ("solutions", "notebooks"):
        shutil.copytree(root / item, tmp_path / item)
    shutil.copy2(root / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _check_release(root) -> subprocess.CompletedProcess:
    env = dict(os.environ, COURSE_ROOT=str(root))
    return subprocess.run([sys.executable, "-m", "grader", "check-release", NOTEBOOKS[0]],
                          env=env, capture_output=True, text=True, timeout=300)


def test_check_release_passes_on_a_fresh_copy(tmp_path):
    result = _check_release(_copy_course(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_release_fails_on_a_stale_student_notebook(tmp_path):
    root = _copy_course(tmp_path)
    name = NOTEBOOKS[0]
    path = root / "solutions" / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].source += "\n\nA sentence added to the solution after the last release."
    nbformat.write(nb, path)
    result = _check_release(root)
    assert result.returncode == 1
    assert f"notebooks/{name}.ipynb" in result.stdout


def test_check_release_fails_on_a_missing_student_notebook(tmp_path):
    root = _copy_course(tmp_path)
    (root / "notebooks" / f"{NOTEBOOKS[0]}.ipynb").unlink()
    result = _check_release(root)
    assert result.returncode == 1 and NOTEBOOKS[0] in result.stdout
