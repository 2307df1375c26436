"""Sharded grading: ``--shard K/N`` runs put back together by ``merge`` equal one unsharded run,
row for row and gradebook included. The same small class also shows that a limit or an exit in an
answer cell is named in the status, and that a rule comment lands on its own exercise."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from grader import course
from grader.autograde import autograde, limit_events, merge, parse_shard, shard_of
from grader.config import SETTINGS, gradebook_url
from tests.fixtures import submissions as cases

pytestmark = pytest.mark.skipif(cases.NB not in course.available_notebooks(), reason="notebook 01 is not built")

LIMITS = dict(cell_timeout=10, notebook_timeout=120, memory=2 * 1024**3, progress=False)
COPIED = ("from course_utils.reference import attention_scores_for_query as _ref\n\n"
          "def attention_scores_for_query(inputs, query):\n    return _ref(inputs, query)")
EXITS = "import sys\nsys.exit('bye')\n\ndef dot(x, y):\n    return (x * y).sum()"
#: One student per shard of three (``shard_of`` is a fixed hash, so these never move).
CLASS = {"cy": cases.filled(), "bo": cases.filled(attention_scores_for_query=COPIED), "ada": cases.filled(dot=EXITS)}


def _gradebook(out: Path, db_url: str | None = None) -> dict:
    """Every student's grades and comments in the gradebook of an output folder (or at ``db_url``)."""
    rows = {}
    with Gradebook(gradebook_url(out / "nbgrader", db_url), SETTINGS.course_id) as gb:
        for student in gb.students:
            for sub in gb.student_submissions(student.id):
                for nb in sub.notebooks:
                    rows[(student.id, nb.name)] = {
                        "grades": sorted((g.name, g.auto_score, g.manual_score, g.max_score) for g in nb.grades),
                        "comments": sorted((c.name, c.manual_comment) for c in nb.comments)}
    return rows


def _files(out: Path) -> dict[str, str]:
    wanted = ["grades.csv", "cells.csv", "results.json", "similarity.csv"] + \
             [str(p.relative_to(out)) for p in sorted((out / "reports").glob("*.md"))]
    return {name: (out / name).read_text(encoding="utf-8") for name in wanted}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("shards")
    subs = base / "submissions"
    assert sorted(shard_of(s, 3) for s in CLASS) == [0, 1, 2]
    for student, nb in CLASS.items():
        (subs / student).mkdir(parents=True)
        nbformat.write(nb, subs / student / f"{cases.NB}.ipynb")
    (subs / "notes.txt").write_text("a file outside any student folder")
    codes = {"single": autograde(subs, base / "single", workers=2, **LIMITS)}
    # One after the other: nbgrader changes the process's working folder while it registers an
    # assignment, so two gradings in threads of one process would pull it from under each other.
    for k in range(3):
        codes[k] = autograde(subs, base / f"shard{k}", workers=1, shard=(k, 3), **LIMITS)
    codes["merge"] = merge([base / f"shard{k}" for k in range(3)], base / "merged")
    return base, codes


def test_three_shards_merged_equal_one_run(runs):
    base, codes = runs
    assert set(codes.values()) == {0}, codes
    single, merged = _files(base / "single"), _files(base / "merged")
    assert single.keys() == merged.keys()
    for name in single:
        assert merged[name] == single[name], f"{name} differs between the merged shards and one run"
    assert _gradebook(base / "merged") == _gradebook(base / "single")
    for part in ("submitted", "autograded"):
        assert sorted(p.relative_to(base / "single") for p in (base / "single" / "nbgrader" / part).rglob("*.ipynb")) \
            == sorted(p.relative_to(base / "merged") for p in (base / "merged" / "nbgrader" / part).rglob("*.ipynb"))


def test_each_student_is_graded_in_exactly_one_shard(runs):
    base, _ = runs
    seen = []
    for k in range(3):
        with open(base / f"shard{k}" / "grades.csv", newline="") as f:
            seen += [(r["student_id"], r["file"]) for r in csv.DictReader(f)]
    assert sorted(seen) == sorted([(s, f"{s}/{cases.NB}.ipynb") for s in CLASS] + [("", "notes.txt")])


def test_rule_comment_lands_on_its_own_exercise(runs):
    """``test_attention_scores_for_query`` starts with ``test_attention_scores``: the reason must be
    written on ``attention_scores_for_query``, never on ``attention_scores``."""
    base, _ = runs
    comments = dict(_gradebook(base / "single")[("bo", cases.NB)]["comments"])
    assert "course_utils.reference" in (comments["attention_scores_for_query"] or "")
    assert not comments["attention_scores"] and not comments["dot"]


def test_an_exit_in_an_answer_cell_is_named_in_the_status(runs):
    base, _ = runs
    rows = {r["student_id"]: r for r in json.loads((base / "single" / "results.json").read_text())}
    assert "SystemExit in answer dot" in rows["ada"]["status"], rows["ada"]["status"]
    assert "SystemExit in answer dot" in (base / "single" / "reports" / "ada.md").read_text()
    assert "limits hit" not in rows["cy"]["status"]


def test_merge_refuses_what_is_not_a_grading_output(tmp_path):
    (tmp_path / "x").mkdir()
    assert merge([tmp_path / "x"], tmp_path / "out") == 2


@pytest.mark.parametrize("text, ok", [("0/3", (0, 3)), ("2/3", (2, 3)), ("3/3", None), ("-1/3", None), ("1", None),
                                      ("a/b", None), ("0/0", None)])
def test_shard_argument(text, ok):
    if ok:
        assert parse_shard(text) == ok
    else:
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(text)


def test_shards_are_stable_and_balanced():
    ids = [f"student{i:04d}" for i in range(3000)]
    counts = [sum(1 for s in ids if shard_of(s, 4) == k) for k in range(4)]
    assert all(650 < c < 850 for c in counts), counts
    assert shard_of("alice", 7) == 1, "a fixed hash (sha256), not Python's salted hash()"


def test_limit_events_name_every_cell_that_hit_a_limit():
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    def cell(source, ename, evalue="", **meta):
        c = new_code_cell(source, metadata={"nbgrader": meta} if meta else {})
        c.outputs = [new_output("error", ename=ename, evalue=evalue, traceback=[])]
        return c

    nb = new_notebook(cells=[
        cell("while True: pass", "CellTimeoutError", grade_id="dot", solution=True, grade=False),
        cell("import os; os._exit(1)", "KernelDied"),
        cell("x = torch.ones(10**10)", "RuntimeError", "[enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: "
             "can't allocate memory", grade_id="test_dot", grade=True, solution=False, points=2),
        cell("raise ValueError('my bug')", "ValueError"),
        cell("sys.exit()", "SystemExit"),
        cell("a", "NotebookTimeLimit"), cell("b", "NotebookTimeLimit")])
    assert limit_events(nb) == ["CellTimeoutError in answer dot (cell 1)", "KernelDied in cell 2",
                                "memory limit in test_dot (cell 3)", "SystemExit in cell 5",
                                "NotebookTimeLimit from cell 6 on"]


def test_one_settings_object_feeds_nbgrader_and_the_command_line():
    from grader.cli import build_parser
    from grader.config import load_config

    config = load_config(Path("/tmp/x"))
    assert config.CourseDirectory.course_id == SETTINGS.course_id
    assert config.Execute.timeout == SETTINGS.cell_timeout
    args = build_parser().parse_args(["autograde", "subs", "--out", "o"])
    assert (args.cell_timeout, args.notebook_timeout, args.memory_gb * 1024**3) == (
        SETTINGS.cell_timeout, SETTINGS.notebook_timeout, SETTINGS.memory)
    assert config.CourseDirectory.db_url == gradebook_url(Path("/tmp/x"))


def test_merged_gradebook_in_postgresql_equals_the_sqlite_one(runs):
    """Several teaching assistants can use formgrader on one class when the gradebook is a real
    database server: the merge writes the same rows there as one run writes into SQLite."""
    from tests.support import postgres

    if postgres.binaries() is None:
        pytest.skip("PostgreSQL is not installed and could not be (make test installs Debian's postgresql as root)")
    pytest.importorskip("psycopg2", reason="the psycopg2 driver is not installed")
    base, _ = runs
    with postgres.server() as url:
        assert merge([base / f"shard{k}" for k in range(3)], base / "merged_pg", db_url=url) == 0
        assert _gradebook(base / "merged_pg", url) == _gradebook(base / "single")
