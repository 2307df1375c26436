"""Fast checks of the grader's intake: file names, broken files, recognition and repair (no kernels)."""

from __future__ import annotations

import re

import nbformat
import pytest

from grader import course, intake
from grader.autograde import check_rules
from tests.fixtures import submissions as cases

pytestmark = pytest.mark.skipif("01_dot_products" not in course.available_notebooks(),
                                reason="notebook 01 is not built")


@pytest.mark.parametrize("name", ["01_dot_products.ipynb", "01_Dot_Products (1).ipynb", "Copy of 01_dot_products.ipynb",
                                  "01_dot_products-Copy1.ipynb", "01 dot products.ipynb", "01_DOT_PRODUCTS_final.ipynb",
                                  "01_dot_products_alice.ipynb"])
def test_file_names_people_produce(name):
    assert intake.match_notebook(name) == "01_dot_products"


@pytest.mark.parametrize("name", ["01_dot_products.py", "dot_products.ipynb", "notes.txt", "07_transformers.ipynb"])
def test_other_names_are_not_matched(name):
    assert intake.match_notebook(name) is None


def test_broken_files_say_what_is_wrong(tmp_path):
    for name, data, words in [("a.ipynb", b"", "empty file"), ("b.ipynb", b"{\"cells\": [", "not valid JSON"),
                              ("c.ipynb", b"\x89PNG\r\n\x1a\n\x00\xff", "not"), ("d.ipynb", b"[1, 2]", "without notebook cells"),
                              ("e.txt", b"hello", "not a notebook (.txt file)")]:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(intake.IntakeError, match=re.escape(words)):
            intake.read_notebook(tmp_path / name)


def _graded_ids(nb):
    return [(c.metadata.get("nbgrader") or {}).get("grade_id") for c in nb.cells if c.metadata.get("nbgrader")]


def test_repair_of_a_notebook_without_metadata_restores_the_solution_layout():
    src = intake.load_source(cases.NB)
    nb, repairs = intake.repair(cases.strip_metadata(cases.filled()), src)
    assert _graded_ids(nb) == [c.grade_id for c in src.cells]
    assert any("metadata restored" in r for r in repairs)
    tests = [c for c in nb.cells if (c.metadata.get("nbgrader") or {}).get("grade")]
    assert all("BEGIN HIDDEN TESTS" in c.source for c in tests)  # the full test, hidden part included
    assert all(c.metadata.get("editable") is False for c in tests)


def test_intact_submission_needs_no_repair():
    nb, repairs = intake.repair(cases.filled(), intake.load_source(cases.NB))
    assert repairs == []


def test_last_definition_wins_and_test_follows_it():
    src = intake.load_source(cases.NB)
    nb = cases.filled(dot=cases.DOT_WRONG)
    extra = cases.code(cases.good_answers()["dot"])
    nb.cells.append(extra)  # the right dot, defined again at the very end
    repaired, repairs = intake.repair(nb, src)
    answer = intake.answer_cells(repaired)["dot"]
    assert repaired.cells[answer].source == extra.source
    test_at = next(i for i, c in enumerate(repaired.cells) if (c.metadata.get("nbgrader") or {}).get("grade_id") == "test_dot")
    assert test_at == answer + 1
    assert any("moved below their answer" in r for r in repairs)


def test_unanswered_stub_is_not_a_rule_violation():
    src = intake.load_source(cases.NB)
    zero, findings = check_rules(cases.blank(), src)
    assert zero == {} and findings == []


def test_rule_violations_zero_only_the_affected_tests():
    src = intake.load_source(cases.NB)
    zero, findings = check_rules(intake.repair(cases.filled(dot=cases.DOT_LIBRARY), src)[0], src)
    assert set(zero) == {"test_dot"} and "torch.dot" in findings[0]


# ---------------------------------------------------------------------------------------------
# Each repair on its own (intake.REPAIRS runs them in order).


def _step(step, nb):
    src = intake.load_source(cases.NB)
    return step(nb, src, intake.recognise(nb, src))


def test_reattach_metadata_puts_it_on_recognised_cells_only():
    nb = cases.strip_metadata(cases.filled())
    nb.cells.append(nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {"grade_id": "dot", "solution": True}}))
    out, notes = _step(intake.reattach_metadata, nb)
    src = intake.load_source(cases.NB)
    assert _graded_ids(out) == [c.grade_id for c in src.cells], "one cell per grade id, the stray copy is plain"
    assert notes and notes[0].startswith("metadata restored (")
    assert nb.cells[-1].metadata["nbgrader"]["grade_id"] == "dot", "the input notebook is not changed"


def test_move_tests_below_answers_moves_only_misplaced_tests():
    nb, _ = intake.repair(cases.filled(), intake.load_source(cases.NB))
    ids = _graded_ids(nb)
    answer, test = ids.index("dot"), ids.index("test_dot")
    cells = list(nb.cells)
    graded = [i for i, c in enumerate(cells) if c.metadata.get("nbgrader")]
    a, t = graded[answer], graded[test]
    cells.insert(a, cells.pop(t))  # the test now sits just above its answer
    nb.cells = cells
    out, notes = _step(intake.move_tests_below_answers, nb)
    assert notes == ["moved below their answer: test_dot"]
    assert _graded_ids(out) == ids


def test_restore_missing_tests_puts_each_after_its_answer():
    nb, _ = intake.repair(cases.filled(), intake.load_source(cases.NB))
    ids = _graded_ids(nb)
    nb.cells = [c for c in nb.cells if (c.metadata.get("nbgrader") or {}).get("grade_id") != "test_dot"]
    out, notes = _step(intake.restore_missing_tests, nb)
    assert notes == ["missing tests restored: test_dot"]
    assert _graded_ids(out) == ids


def test_fresh_cell_ids_makes_them_unique_and_valid():
    nb = cases.filled()
    nb.cells[1]["id"] = nb.cells[0]["id"]
    nb.cells[2]["id"] = "not valid!"
    out, notes = _step(intake.fresh_cell_ids, nb)
    ids = [c["id"] for c in out.cells]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[a-zA-Z0-9-_]{1,64}", i) for i in ids)
    assert notes == []


def test_note_missing_answers_names_them():
    nb = cases.filled()
    nb.cells = [c for c in nb.cells if "def dot(" not in c.source]
    _, notes = _step(intake.note_missing_answers, nb)
    assert notes == ["no answer found for: dot"]


def test_repairs_run_in_the_listed_order():
    assert [s.__name__ for s in intake.REPAIRS] == [
        "reattach_metadata", "move_tests_below_answers", "restore_missing_tests", "fresh_cell_ids",
        "note_missing_answers"]
