"""The one place that reads nbgrader's metadata on a cell: its grade id, whether it is an answer or
a test, and which exercise a test belongs to.

Answer and test are nbgrader's own rules (``nbgrader.utils.is_solution`` and ``is_grade``): an
answer cell is a solution cell with a grade id (the exercise's name), a test cell is a graded cell
that is not a solution. A test's exercise comes from its grade id: ``test_<exercise>`` or
``test_<exercise>_<anything>``, and where two exercises fit (``test_attention_scores_for_query``
fits ``attention_scores`` and ``attention_scores_for_query``) the longest name wins.
"""

from __future__ import annotations

from typing import Iterable

import nbformat
from nbgrader import utils


def metadata(cell) -> dict:
    """The cell's ``nbgrader`` metadata, or ``{}`` (also where a messy file has it as null or a string)."""
    meta = cell.get("metadata", {}).get("nbgrader") if isinstance(cell.get("metadata"), dict) else None
    return meta if isinstance(meta, dict) else {}


def grade_id(cell) -> str | None:
    """The cell's grade id, or ``None``."""
    return metadata(cell).get("grade_id") or None


def _nbgrader_view(cell):
    """The cell as ``nbgrader.utils`` read it, with ``metadata.nbgrader`` always a dict."""
    return nbformat.from_dict({"cell_type": cell.get("cell_type"), "metadata": {"nbgrader": metadata(cell)}})


def is_answer(cell) -> bool:
    """A solution cell with a grade id: where a student writes an exercise."""
    return bool(utils.is_solution(_nbgrader_view(cell)) and grade_id(cell))


def is_test(cell) -> bool:
    """A graded cell that is not a solution: the course's locked test cell."""
    view = _nbgrader_view(cell)
    return bool(utils.is_grade(view) and not utils.is_solution(view) and grade_id(cell))


def exercise_of_test(test_id: str, exercises: Iterable[str]) -> str | None:
    """The exercise a test grade id belongs to, of ``exercises`` (longest match), or ``None``.

    >>> exercise_of_test("test_attention_scores_for_query", ["attention_scores", "attention_scores_for_query"])
    'attention_scores_for_query'
    >>> exercise_of_test("test_softmax_stable_overflow", ["softmax_naive", "softmax_stable"])
    'softmax_stable'
    """
    if not test_id.startswith("test_"):
        return None
    rest = test_id[len("test_"):]
    fits = [e for e in exercises if rest == e or rest.startswith(e + "_")]
    return max(fits, key=len) if fits else None


def tests_of(exercise: str, test_ids: Iterable[str], exercises: Iterable[str]) -> list[str]:
    """The test grade ids among ``test_ids`` that belong to ``exercise``, in their order."""
    exercises = list(exercises)
    return [t for t in test_ids if exercise_of_test(t, exercises) == exercise]
