"""One graded class for the test files that grade submissions through the real, sandboxed ``autograde``.

``tests/grader_answers/test_autograde.py`` (the solution, the untouched notebook and known-wrong answers of
every notebook), ``tests/grader_messy/test_cheats.py`` (every cheat in an otherwise solved notebook),
``tests/checks/test_capstone.py`` (notebook 09 wrong in one helper only) and ``tests/grader_messy/test_warm.py``
(every known answer of notebook 01, which it grades again with cold kernels) each register the submissions
they need with :func:`submissions`. The session fixture ``graded_class`` (``tests/conftest.py``) writes every
registered submission into one class and grades it in one ``autograde`` call, as an instructor grades a whole
class: the cheats are graded beside honest and wrong work, so a cheat that reached the next notebook on its
worker would cost that notebook its points. The files run in one pytest worker (``SHARED_WORKER`` in the root
``conftest.py``), so the class is graded once for all (one grading run's start-up, its warm parents, and a
notebook two files submit graded once, not twice). Run one file alone and only its own submissions are graded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import nbformat

from grader import course
from tests.fixtures.answers import load
from tests.support import harness


def answer_sets(notebook: str, kind: str, depth: int | None = None) -> list[dict[str, str]]:
    """The known answers of ``kind`` (``"WRONG"`` or ``"RIGHT"``, tests/fixtures/answers) of ``notebook`` as the
    answer cells of submissions: submission k takes the k-th answer of every exercise that has one (k < ``depth``,
    default every answer), ``{grade_id: source}``. The same k gives the same submission in every file that asks."""
    module = load(notebook)
    if module is None:
        return []
    per_exercise = {ex: list(answers.values())[:depth] for ex, answers in getattr(module, kind).items()}
    count = max((len(v) for v in per_exercise.values()), default=0)
    return [{ex: v[k] for ex, v in per_exercise.items() if k < len(v)} for k in range(count)]


def solved(notebook: str, answers: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """The released student notebook with its answer cells filled in, as a student would hand it in:
    ``answers[grade_id]`` where given, else the solution's code (without the solution markers)."""
    student = nbformat.read(course.notebooks_dir() / f"{notebook}.ipynb", as_version=4)
    solution = harness.solution_notebook(notebook)
    answers = answers or {}
    theirs = {harness.grade_id(c): c.source for c in solution.cells if harness.grade_id(c)}
    for cell in student.cells:
        gid = harness.grade_id(cell)
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution") and gid:
            cell.source = "\n".join(line for line in answers.get(gid, theirs[gid]).splitlines() if "### " not in line)
    return student


#: The limits of the class's run: a cheat that spins ends at the cell's limit, well before the test's own.
LIMITS = dict(cell_timeout=30, notebook_timeout=300, progress=False)

#: A builder: given the ``(student_id, notebook)`` submissions of the files built before it (by name), its own
#: ``{(student_id, notebook): (notebook node, or None for one of those, what the test expects of it)}``.
Builder = Callable[[set], dict[tuple[str, str], tuple[nbformat.NotebookNode | None, Any]]]
_BUILDERS: dict[str, Builder] = {}


def submissions(name: str) -> Callable[[Builder], Builder]:
    """Register ``builder`` (a decorator) as the submissions of test file ``name`` in the graded class.
    Builders run in the order of their names."""
    def register(builder: Builder) -> Builder:
        _BUILDERS[name] = builder
        return builder
    return register


@dataclass
class GradedClass:
    """What one ``autograde`` run of the class left: its exit code, ``grades.csv`` rows by ``(student,
    notebook)``, ``cells.csv`` rows by ``(student, notebook)`` then ``grade_id``, ``results.json``'s judged
    cells likewise, each file's plan (``(student, notebook) -> what it expects``) and each submission's bytes
    before grading."""

    code: int
    out: Path
    grades: dict
    cells: dict
    judged: dict
    plans: dict[str, dict] = field(default_factory=dict)
    originals: dict[Path, bytes] = field(default_factory=dict)


def grade(folder: Path) -> GradedClass:
    """Write every registered file's submissions under ``folder`` and grade them in one run (2 workers)."""
    from grader.autograde import autograde

    subs, out = folder / "submissions", folder / "grading"
    plans: dict[str, dict] = {}
    taken: set[tuple[str, str]] = set()
    for name, builder in sorted(_BUILDERS.items()):
        plans[name] = {}
        for (student, notebook), (nb, expect) in builder(set(taken)).items():
            path = subs / student / f"{notebook}.ipynb"
            if nb is None:  # another file's submission, which this file reads too
                assert (student, notebook) in taken, f"{name}: no submission {student}/{notebook} to share"
            else:
                assert (student, notebook) not in taken, f"{name}: submission {student}/{notebook} is another file's"
                path.parent.mkdir(parents=True, exist_ok=True)
                nbformat.write(nb, path)
                taken.add((student, notebook))
            plans[name][(student, notebook)] = expect
    originals = {p: p.read_bytes() for p in subs.rglob("*.ipynb")}
    code = autograde(subs, out, workers=2, **LIMITS)
    grades, cells = harness.read_grading(out)
    judged = {(r["student_id"], r["notebook"]): {c["grade_id"]: c for c in r["cells"]}
              for r in json.loads((out / "results.json").read_text())}
    return GradedClass(code, out, grades, cells, judged, plans, originals)
