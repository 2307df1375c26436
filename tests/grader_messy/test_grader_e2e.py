"""End to end: a class of messy and adversarial submissions (tests/fixtures/submissions) graded in one run.

One ``autograde`` call with two workers grades every case; the tests below check each row's
score and status, that nothing outside the sandbox was read, deleted or left running, that the
gradebook agrees with the CSVs, that the feedback pages hide the hidden tests, and that a re-run
gives the same grades and a re-submission replaces the earlier one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import nbformat
import pytest

from grader import course
from grader.autograde import autograde
from grader.feedback import feedback
from tests.fixtures import submissions as cases
from tests.support import harness, studentenv

pytestmark = pytest.mark.skipif("01_dot_products" not in course.available_notebooks(),
                                reason="notebook 01 is not built")

LIMITS = dict(cell_timeout=10, notebook_timeout=120, memory=2 * 1024**3, progress=False)


def _read(out: Path):
    return harness.read_grading(out)


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("class")
    subs, out, decoy = base / "submissions", base / "grading", base / "instructor_files"
    decoy.mkdir()
    (decoy / "secret.txt").write_text("the instructor's own file")
    secrets = {"solution": str(course.solutions_dir() / "01_dot_products.ipynb"),
               "other_student": str(subs / "good" / "01_dot_products.ipynb"),
               "gradebook_dir": str(out / "nbgrader"), "decoy": str(decoy),
               "submissions": str(subs), "out": str(out)}
    plan = cases.build(subs, secrets)
    before = _digest(subs)
    code = autograde(subs, out, workers=2, **LIMITS)
    grades, cells = _read(out)
    return {"code": code, "plan": plan, "grades": grades, "cells": cells, "subs": subs, "out": out,
            "decoy": decoy, "before": before}


def test_every_file_gets_one_row_and_exit_0(graded):
    assert graded["code"] == 0
    assert set(graded["grades"]) == set(graded["plan"]), set(graded["grades"]) ^ set(graded["plan"])


def test_case_outcomes(graded):
    """Every case's score, per-test scores and status words (the list is in tests/fixtures/submissions)."""
    problems = []
    for key, expect in sorted(graded["plan"].items()):
        row = graded["grades"][key]
        where = f"{key[0]}/{key[1]} ({expect.what})"
        if expect.score is not None and float(row["score"]) != expect.score:
            problems.append(f"{where}: score {row['score']}, expected {expect.score:g}; status: {row['status']}")
        for word in expect.status:
            if word not in row["status"]:
                problems.append(f"{where}: status {row['status']!r} lacks {word!r}")
        for grade_id, score in expect.cells.items():
            got = graded["cells"][key].get(grade_id)
            if got is None or float(got["score"]) != score:
                problems.append(f"{where}: {grade_id} scored {got and got['score']}, expected {score:g}")
    assert not problems, "\n".join(problems)


def test_ungradable_files_have_no_test_rows(graded):
    for key, expect in graded["plan"].items():
        if not expect.cells:
            assert key not in graded["cells"], key


def test_originals_are_untouched(graded):
    assert _digest(graded["subs"]) == graded["before"]


def _printed(path: Path) -> str:
    """What the cells of a graded notebook printed, each cell's outputs joined (``studentenv.output_text``): on a
    busy machine the kernel may send one ``print`` as two outputs (its first words, then the rest)."""
    return "\n".join(studentenv.output_text(c) for c in nbformat.read(path, as_version=4).cells)


def test_sandbox_hid_everything_and_deleted_nothing(graded):
    out = graded["out"]
    snoop = _printed(out / "nbgrader/autograded/snoop/01_dot_products/01_dot_products.ipynb")
    assert "SNOOP-RESULT NOTHING []" in snoop, "the snooping cell could read files or reach the network"
    assert (graded["decoy"] / "secret.txt").exists()
    assert (course.solutions_dir() / "01_dot_products.ipynb").exists()
    deleter = _printed(out / "nbgrader/autograded/deleter/01_dot_products/01_dot_products.ipynb")
    assert "tried to delete" in deleter and "still there for me: True" not in deleter  # the guessed paths did not even exist in there


def test_no_background_process_survives(graded):
    alive = []
    for proc in Path("/proc").iterdir():
        try:
            if cases.BACKGROUND_MARKER in (proc / "cmdline").read_bytes().decode(errors="replace"):
                alive.append(proc.name)
        except OSError:
            continue
    assert not alive, f"processes left running by a submission: {alive}"


def test_a_disk_flood_was_stopped_and_cleaned_up(graded):
    """The flood's kernel was stopped (its status says so) and none of its files is left on the
    grader's disk: the hand-off folder was emptied, the socket folder went with its kernel."""
    import glob
    import tempfile

    assert "disk limit in cell" in graded["grades"][("disk_flood", cases.NB)]["status"]
    left = glob.glob(os.path.join(tempfile.gettempdir(), "grader-*", "flood-*"))
    assert not left, f"files of the flood are still on the grader's disk: {left[:3]}"


def test_a_fork_bomb_stopped_at_the_process_cap(graded):
    """Through the grader's own kernel manager, a kernel's processes are capped (grader/cgroups.py)."""
    import re

    from grader import cgroups

    capped, why = cgroups.status()
    if not capped:
        pytest.skip(f"no process cap on this machine: {why}")
    (path,) = (graded["out"] / "nbgrader" / "autograded" / "fork_bomb").rglob("*.ipynb")
    text = _printed(path)
    got = re.search(r"FORK-BOMB-GOT (\d+)", text)
    assert got and int(got.group(1)) < cgroups.PIDS_MAX, text[-500:]


def test_dynamic_code_is_flagged_for_the_instructor_only(graded):
    out = graded["out"]
    grades, _ = _read(out)
    flagged = {key: row["integrity"] for key, row in grades.items() if row["integrity"]}
    assert set(flagged) == {("dynamic_code", "01_dot_products")}, flagged
    assert "dot line 4: sys.modules" in flagged[("dynamic_code", "01_dot_products")]
    assert "getattr with a name computed" in flagged[("dynamic_code", "01_dot_products")]
    report = (out / "reports" / "dynamic_code.md").read_text()
    assert "## Integrity (instructor only)" in report and "| 01_dot_products | dot | 4 |" in report
    assert "Integrity" not in (out / "results.json").read_text()
    assert all("Integrity" not in p.read_text() for p in (out / "reports").glob("*.md") if p.stem != "dynamic_code")


def test_rule_reasons_match_the_self_check(graded):
    """The grader's reason is the one the student's own self-check gives for the same code."""
    from course_utils.checks.core import CheckFailed, check_rules

    from tests.support.harness import run_source

    namespace: dict = {}
    run_source("import torch\n" + cases.DOT_LIBRARY, namespace, "library_call")
    with pytest.raises(CheckFailed) as info:
        check_rules("dot", namespace["dot"])
    assert "uses `torch.dot`, which this exercise does not allow" in str(info.value)
    assert "uses `torch.dot`, which this exercise does not allow" in graded["grades"][("library_call", cases.NB)]["status"]
    report = (graded["out"] / "reports" / "library_call.md").read_text()
    assert "rule broken" in report and "torch.dot" in report


def test_gradebook_agrees_with_the_csv(graded):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{graded['out'] / 'nbgrader' / 'gradebook.db'}", "attention-course") as gb:
        for (student, notebook), row in graded["grades"].items():
            if not graded["cells"].get((student, notebook)) or row["status"].startswith("grading failed"):
                continue
            nb = gb.find_submission_notebook(notebook, notebook, student)
            assert float(nb.score) == float(row["score"]), (student, notebook)


def test_reports_and_feedback_pages(graded):
    out = graded["out"]
    assert (out / "reports" / "colab.md").read_text().count("metadata restored") >= 1
    pages = feedback(out)
    page = (out / "feedback" / "edited_test" / "01_dot_products.html").read_text()
    assert out / "feedback" / "edited_test" / "01_dot_products.html" in pages
    assert "test_dot: failed" in page and "test_attention_scores: passed" in page
    assert "CheckFailed" in page  # the check's message is there
    for page_path in pages:
        text = page_path.read_text()
        assert "hidden=True" not in text and "BEGIN HIDDEN" not in text, page_path
    data = json.loads((out / "results.json").read_text())
    assert all("hidden=True" not in json.dumps(r.get("tests_shown", {})) for r in data)


def test_rerun_is_idempotent_and_resubmission_replaces_the_grade(graded, tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    for student in ("good", "blank"):
        shutil.copytree(graded["subs"] / student, subs / student)
    # Graded again, on their own, into an output folder that already exists: the same rows as the
    # class's run gave them (a row depends on its own file only).
    assert autograde(subs, out, workers=2, **LIMITS) == 0
    again_grades, again_cells = _read(out)
    students = {"good", "blank"}
    assert {k: v for k, v in graded["grades"].items() if k[0] in students} == again_grades
    assert {k: v for k, v in graded["cells"].items() if k[0] in students} == dict(again_cells)
    # "blank" re-submits a solved notebook (a newer file): the grade is replaced.
    newer = subs / "blank" / "01_dot_products (resubmitted).ipynb"
    nbformat.write(cases.filled(), newer)
    os.utime(newer, (os.path.getmtime(newer) + 60,) * 2)
    assert autograde(subs, out, workers=1, **LIMITS) == 0
    grades, _ = _read(out)
    assert float(grades[("blank", cases.NB)]["score"]) == cases.FULL
    assert "newest of 2 files" in grades[("blank", cases.NB)]["status"]
    assert len([k for k in grades if k[0] == "blank"]) == 1


def test_refuses_without_sandbox_unless_allowed(tmp_path, monkeypatch, capsys):
    subs, out = tmp_path / "subs", tmp_path / "out"
    (subs / "alice").mkdir(parents=True)
    nbformat.write(cases.filled(), subs / "alice" / "01_dot_products.ipynb")
    monkeypatch.setenv("GRADER_BWRAP", str(tmp_path / "no-bwrap-here"))
    assert autograde(subs, out, **LIMITS) == 2
    assert "REFUSING TO GRADE" in capsys.readouterr().err
    assert not (out / "grades.csv").exists()
    assert autograde(subs, out, allow_unsandboxed=True, **LIMITS) == 0
    assert "GRADING WITHOUT A SANDBOX" in capsys.readouterr().err
    grades, _ = _read(out)
    assert float(grades[("alice", cases.NB)]["score"]) == cases.FULL
