"""``python -m grader autograde SUBMISSIONS --out DIR``: grade a class with nbgrader.

Layout in:  ``SUBMISSIONS/<student_id>/<notebook>.ipynb`` (any subset of the course's notebooks).
Layout out: ``DIR/grades.csv`` (one row per submitted file), ``DIR/cells.csv`` (one row per graded
test cell), and ``DIR/nbgrader/``, the nbgrader course folder (gradebook, autograded copies).

Submissions are never modified: nbgrader grades copies. A student's failure is a row with a
status, never a crash of the batch.
"""

from __future__ import annotations

import csv
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from traitlets.config import Config

from grader import course
from grader.config import make_api

GRADES_COLUMNS = ["student_id", "notebook", "score", "max_score", "status", "file"]
CELLS_COLUMNS = ["student_id", "notebook", "grade_id", "score", "max_score"]


@dataclass
class Submission:
    """One file found in the submissions folder."""

    student_id: str
    path: Path
    notebook: str | None  # the course notebook it is, or None if unrecognised
    status: str = "ok"


@dataclass
class CellResult:
    grade_id: str
    score: float
    max_score: float


@dataclass
class Result:
    student_id: str
    notebook: str
    score: float
    max_score: float
    status: str
    file: str
    cells: list[CellResult] = field(default_factory=list)


def match_notebook(filename: str) -> str | None:
    """The course notebook a submitted file name stands for, or ``None``."""
    stem = Path(filename).stem
    for name in course.NOTEBOOKS:
        if stem == name:
            return name
    return None


def discover(submissions: Path) -> list[Submission]:
    """Every file under ``submissions/<student_id>/``, with the notebook it is recognised as."""
    if not submissions.is_dir():
        raise FileNotFoundError(f"submissions folder {submissions} does not exist")
    found = []
    for student_dir in sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for path in sorted(p for p in student_dir.rglob("*") if p.is_file()):
            if any(part.startswith(".") for part in path.relative_to(student_dir).parts):
                continue  # .ipynb_checkpoints, .DS_Store
            notebook = match_notebook(path.name)
            status = "ok" if notebook else "unknown file: not one of the course's notebooks"
            found.append(Submission(student_dir.name, path, notebook, status))
    return found


def autograde_config() -> Config:
    """Course additions to nbgrader's autograde pipeline."""
    from nbgrader.converters.autograde import Autograde

    from grader.preprocessors import StderrIsNotFailure

    config = Config()
    steps = list(Autograde.class_traits()["autograde_preprocessors"].default())
    execute_index = next(i for i, step in enumerate(steps) if step.__name__ == "Execute")
    steps.insert(execute_index + 1, StderrIsNotFailure)
    config.Autograde.autograde_preprocessors = steps
    return config


def prepare_course(root: Path, notebooks: list[str]):
    """A fresh nbgrader course folder at ``root`` with each notebook registered as an assignment."""
    if root.exists():
        shutil.rmtree(root)
    api = make_api(root, autograde_config())
    for name in notebooks:
        src = course.solutions_dir() / f"{name}.ipynb"
        (root / "source" / name).mkdir(parents=True)
        shutil.copy2(src, root / "source" / name / src.name)
        result = api.generate_assignment(name, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader could not register {name}:\n{result.get('error') or result.get('log')}")
    return api


def grade_one(api, root: Path, sub: Submission) -> Result:
    """Autograde one recognised submission; failures become a status, not an exception."""
    assert sub.notebook is not None
    target = root / "submitted" / sub.student_id / sub.notebook / f"{sub.notebook}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sub.path, target)
    result = api.autograde(sub.notebook, sub.student_id, force=True, create=True)
    status = sub.status if result["success"] else "grading failed: " + _last_error_line(result)
    return collect(root, sub, status)


def collect(root: Path, sub: Submission, status: str) -> Result:
    """Read one submission's scores back from the gradebook."""
    max_score = _max_score(root, sub.notebook)
    row = Result(sub.student_id, sub.notebook, 0.0, max_score, status, str(sub.path))
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", "attention-course") as gb:
        try:
            nb = gb.find_submission_notebook(sub.notebook, sub.notebook, sub.student_id)
        except MissingEntry:
            return row
        for grade in sorted(nb.grades, key=lambda g: g.name):
            if grade.max_score:
                row.cells.append(CellResult(grade.name, float(grade.score or 0.0), float(grade.max_score)))
        row.score = float(sum(c.score for c in row.cells))
    return row


def _max_score(root: Path, notebook: str) -> float:
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", "attention-course") as gb:
        return float(gb.find_notebook(notebook, notebook).max_score)


def _last_error_line(result: dict) -> str:
    text = (result.get("error") or result.get("log") or "").strip().splitlines()
    return text[-1] if text else "unknown error"


def write_csvs(out: Path, results: list[Result]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "grades.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(GRADES_COLUMNS)
        for r in results:
            writer.writerow([r.student_id, r.notebook, f"{r.score:g}", f"{r.max_score:g}", r.status, r.file])
    with open(out / "cells.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CELLS_COLUMNS)
        for r in results:
            for c in r.cells:
                writer.writerow([r.student_id, r.notebook, c.grade_id, f"{c.score:g}", f"{c.max_score:g}"])


def autograde(submissions: Path, out: Path, workers: int = 1, allow_unsandboxed: bool = False) -> int:
    """Grade every submission; write the CSVs. Returns 0 when every submission got a row."""
    subs = discover(submissions)
    out.mkdir(parents=True, exist_ok=True)
    root = (out / "nbgrader").resolve()
    notebooks = sorted({s.notebook for s in subs if s.notebook})
    api = prepare_course(root, notebooks)
    results = []
    for sub in subs:
        if sub.notebook is None:
            results.append(Result(sub.student_id, Path(sub.path).stem, 0.0, 0.0, sub.status, str(sub.path)))
            continue
        try:
            results.append(grade_one(api, root, sub))
        except Exception as exc:  # noqa: BLE001 - one broken submission never stops the batch
            results.append(Result(sub.student_id, sub.notebook, 0.0, _max_score(root, sub.notebook),
                                  f"grading failed: {type(exc).__name__}: {exc}", str(sub.path)))
    write_csvs(out, results)
    graded = sum(1 for r in results if r.status == "ok")
    print(f"graded {graded} of {len(results)} submitted files; see {out / 'grades.csv'}")
    return 0 if len(results) == len(subs) else 1
