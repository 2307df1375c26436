"""Gradescope: ``python -m grader gradescope NOTEBOOK --out autograder.zip``, and the runner inside it.

Gradescope's autograder specification (https://gradescope-autograders.readthedocs.io/en/latest/specs/):
the zip holds ``setup.sh`` (run once, as root, to build the image; Ubuntu) and ``run_autograder``
(run for every submission, from ``/autograder``) at its root; Gradescope unpacks it into
``/autograder/source``, puts the student's files in ``/autograder/submission`` and reads
``/autograder/results/results.json``: ``tests[]`` with ``name``, ``score``, ``max_score``, ``status``
(``passed``/``failed``), ``output`` and ``visibility`` (``visible``, ``hidden``, ``after_due_date``,
``after_published``), and optional ``score``, ``output``, ``execution_time``, ``stdout_visibility``.

The zip carries the course's grader, ``course_utils`` (instructor edition: the hidden tests need
it), the one solution notebook and the pinned versions; ``setup.sh`` installs them and bubblewrap.
:func:`run` (what ``run_autograder`` calls) grades the submitted ``.ipynb`` with
:func:`grader.autograde.autograde`, so a Gradescope grade is the grade ``grades.csv`` would give,
repairs and rules included. The student's kernel runs in the bubblewrap sandbox where the container
lets bubblewrap run; where it cannot, it runs unsandboxed inside Gradescope's own per-submission
container, and the instructor-only stdout says so.

``results.json`` has one ``tests[]`` entry per test cell of the notebook. Its ``output`` is the
check's message (the ``❌`` line, or the rule the answer broke), never the test code: hidden tests
stay hidden. Visibility: a result that the visible check decided (it failed there, as the student
saw in the notebook), or a rule broken in the answer (the self-check shows the same), is
``visible`` at once; a result that depends on the hidden tests (they ran, passed or failed) is
``after_published``, shown when the instructor publishes the grades.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import stat
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

from grader import course

#: The variable that points ``run_autograder`` at another root than ``/autograder`` (tests).
ROOT_VARIABLE = "AUTOGRADER_ROOT"
#: The student's folder in the grader's SUBMISSIONS view of one Gradescope submission.
STUDENT = "student"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu): the course's
# Python packages at their pinned versions (CPU build of PyTorch) and bubblewrap, the grader's sandbox.
set -euo pipefail
cd /autograder/source
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq bubblewrap python3-venv python3-pip >/dev/null
PY=python3
if command -v python3.11 >/dev/null 2>&1 || apt-get install -y -qq python3.11 python3.11-venv >/dev/null 2>&1; then
  PY=python3.11
fi
"$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -c constraints.txt \\
  --extra-index-url https://download.pytorch.org/whl/cpu -e .
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission, from /autograder: it grades the student's .ipynb in
# /autograder/submission with the course's grader (sandboxed where bubblewrap runs) and writes
# /autograder/results/results.json. ${root_variable} points it at another root (the course's tests
# use a temporary one), GRADER_PYTHON at another Python with the course installed.
ROOT="${{{root_variable}:-/autograder}}"
PY="${{GRADER_PYTHON:-$ROOT/source/.venv/bin/python}}"
export COURSE_ROOT="$ROOT/source"
cd "$ROOT"
exec "$PY" -m grader.gradescope "$ROOT" --notebook {notebook}
"""

README = """# Gradescope autograder for {notebook}

Built by `python -m grader gradescope {notebook} --out autograder.zip` from the course's instructor
edition. Upload the zip as the autograder of a Gradescope programming assignment; students hand in
`{notebook}.ipynb` (any file name: the grader recognises the notebook by its content).

This zip holds the solution notebook with its hidden tests and the reference answers: share it
with course staff only.
"""


def _course_files(notebook: str) -> list[tuple[Path, str]]:
    """(file, path in the zip) of everything the grader needs for ``notebook``."""
    root = course.repo_root()
    files = []
    for package in ("grader", "course_utils"):
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.append((path, path.relative_to(root).as_posix()))
    for rel in (f"solutions/{notebook}.ipynb", f"solutions/src/{notebook}.py", f"notebooks/{notebook}.ipynb",
                "pyproject.toml", "constraints.txt"):
        if (root / rel).exists():
            files.append((root / rel, rel))
    return files


def build_autograder(notebook: str, out_zip: Path) -> Path:
    """Write the Gradescope autograder zip of ``notebook`` (a course notebook name) to ``out_zip``."""
    out_zip = Path(out_zip)
    out_zip.parent.mkdir(parents=True, exist_ok=True)
    scripts = {"setup.sh": SETUP_SH,
               "run_autograder": RUN_AUTOGRADER.format(root_variable=ROOT_VARIABLE, notebook=notebook),
               "README.md": README.format(notebook=notebook)}
    tmp = out_zip.with_name(out_zip.name + ".partial")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in scripts.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = ((0o755 if name != "README.md" else 0o644) | stat.S_IFREG) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, text)
        for path, arcname in _course_files(notebook):
            z.write(path, arcname)
    tmp.replace(out_zip)
    return out_zip


# ---------------------------------------------------------------------------------------------
# Inside Gradescope: grade one submission


def hidden_lines(source: str) -> set[int]:
    """1-based numbers of the lines of ``source`` inside ``### BEGIN/END HIDDEN TESTS`` blocks."""
    inside, lines = False, set()
    for number, line in enumerate(source.splitlines(), start=1):
        if line.strip().startswith(HIDDEN_BEGIN):
            inside = True
        if inside:
            lines.add(number)
        if line.strip().startswith(HIDDEN_END):
            inside = False
    return lines


def _check_calls(source: str) -> int:
    """How many ``check_*(...)`` calls the code ``source`` makes (as written, loops counted once)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return 0
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            count += name.startswith("check_")
    return count


def failed_in_visible_part(cell, visible_source: str) -> bool:
    """Whether a graded test cell failed in its visible check (the part the student ran in the
    notebook) rather than in its hidden tests.

    A check prints one ``✅`` line when it passes and raises when it fails, and the hidden tests
    run only after every visible check passed. So the cell failed in its visible part when it
    printed fewer ``✅`` lines than ``visible_source`` (the test cell without its hidden tests)
    makes check calls. Any doubt (no error, visible code that is not a check) answers ``False``,
    which keeps the result hidden until the grades are published.
    """
    ticks = 0
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            ticks += sum(1 for line in output.get("text", "").splitlines() if line.lstrip().startswith("✅"))
        elif output.get("output_type") == "error":
            return ticks < _check_calls(visible_source)
    return False


def _graded_cells(graded: Path) -> dict[str, object]:
    import nbformat

    from grader import cells as nbcells

    if not graded.exists():
        return {}
    nb = nbformat.read(graded, as_version=4)
    return {nbcells.grade_id(c): c for c in nb.cells if nbcells.is_test(c)}


def results_for(rows: list[dict], notebook: str, graded_nb: Path) -> dict:
    """Gradescope's results.json for the autograde ``rows`` of one submission."""
    from grader import intake

    src = intake.load_source(notebook)
    tests = sorted(src.tests.values(), key=lambda t: t.index)
    mine = [r for r in rows if r["notebook"] == notebook and r.get("cells")]
    others = [r for r in rows if r not in mine]
    def file(row: dict) -> str:  # as the student named it (the grader saw it in a folder "student/")
        return row["file"].split("/", 1)[1] if row["file"].startswith(f"{STUDENT}/") else row["file"]

    notes = [f"{file(r)}: {r['status']}" for r in others]
    if not mine:
        why = "; ".join(notes) or "no file was handed in"
        return {"output": f"{notebook} was not graded: no notebook of it was found in your submission ({why}). "
                          f"Hand in your {notebook}.ipynb.",
                "tests": [{"name": f"{t.exercise}: {t.grade_id}", "number": str(i), "score": 0.0,
                           "max_score": t.points, "status": "failed", "output": "not graded: no notebook found",
                           "visibility": "visible"} for i, t in enumerate(tests, start=1)],
                "stdout_visibility": "hidden"}
    row = mine[0]
    by_id = {c["grade_id"]: c for c in row["cells"]}
    graded = _graded_cells(graded_nb)
    entries = []
    for i, test in enumerate(tests, start=1):
        c = by_id.get(test.grade_id, {"score": 0.0, "max_score": test.points, "message": "not graded", "comment": ""})
        passed = c["max_score"] > 0 and c["score"] >= c["max_score"]
        has_hidden = bool(hidden_lines(test.source))
        cell = graded.get(test.grade_id)
        shown_now = (not has_hidden or bool(c.get("comment"))
                     or (not passed and cell is not None
                         and failed_in_visible_part(cell, intake.strip_hidden(test.source))))
        entries.append({"name": f"{test.exercise}: {test.grade_id}", "number": str(i),
                        "score": float(c["score"]), "max_score": float(c["max_score"]),
                        "status": "passed" if passed else "failed",
                        "output": (c.get("comment") or c.get("message") or "").strip(),
                        "visibility": "visible" if shown_now else "after_published"})
    output = f"{file(row)}: {row['status']}"
    if notes:
        output += "\nAlso handed in: " + "; ".join(notes)
    return {"output": output, "tests": entries, "stdout_visibility": "hidden"}


def grade_submission(root: Path, notebook: str) -> dict:
    """Grade ``root/submission`` with the course's grader; Gradescope's results (no timing)."""
    from grader.autograde import autograde
    from grader.intake import IGNORED_PARTS
    from grader.sandbox import check_bwrap

    work = Path(tempfile.mkdtemp(prefix="gradescope-"))
    try:
        student = work / "submissions" / STUDENT
        student.mkdir(parents=True)
        submission = root / "submission"
        for path in sorted(submission.rglob("*")) if submission.is_dir() else []:
            rel = path.relative_to(submission)
            if path.is_file() and not any(p.startswith(".") or p in IGNORED_PARTS for p in rel.parts):
                (student / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, student / rel)
        sandboxed, why = check_bwrap()
        print(f"sandbox: {why}" if sandboxed else
              f"sandbox: NOT AVAILABLE ({why}); the student's code runs unsandboxed in Gradescope's container")
        out = work / "out"
        code = autograde(work / "submissions", out, workers=1, allow_unsandboxed=True, progress=False,
                         layout="folders")
        rows = json.loads((out / "results.json").read_text(encoding="utf-8")) if (out / "results.json").exists() else []
        print(f"grader exit code {code}; rows:")
        for r in rows:
            print(f"  {r['file']}: {r['notebook']} {r['score']:g}/{r['max_score']:g} ({r['status']})")
        return results_for(rows, notebook, out / "nbgrader" / "autograded" / STUDENT / notebook / f"{notebook}.ipynb")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(root: Path, notebook: str) -> int:
    """``run_autograder``'s work: grade, then write ``root/results/results.json`` (also when the
    grading itself fails: the student then sees that it did, the instructor the traceback in stdout)."""
    start = time.time()
    try:
        data = grade_submission(root, notebook)
    except Exception:  # noqa: BLE001 - results.json must be written whatever happens
        traceback.print_exc(file=sys.stdout)
        data = {"score": 0.0, "tests": [], "stdout_visibility": "hidden",
                "output": "The autograder could not grade this submission; your instructor can see why. "
                          "Check that you handed in the notebook (.ipynb) and submit again."}
    data["execution_time"] = round(time.time() - start)
    results = root / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "results.json").write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.gradescope",
                                     description="grade /autograder/submission (what run_autograder runs)")
    parser.add_argument("root", nargs="?", default=os.environ.get(ROOT_VARIABLE, "/autograder"))
    parser.add_argument("--notebook", required=True)
    args = parser.parse_args(argv)
    return run(Path(args.root), args.notebook)


if __name__ == "__main__":
    sys.exit(main())
