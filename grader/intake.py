"""Intake: find every submitted file, recognise which course notebook it is, and repair a copy.

Nothing here writes to the submissions folder: :func:`repair` returns a new notebook object.

Recognition never relies on nbgrader metadata alone, because JupyterLab, Colab, VS Code and copy
and paste lose or duplicate it. A submitted cell is matched to the solution notebook by what it
contains:

* an **answer cell** is the cell holding the *last* top-level definition (``def``/``class``/
  assignment) of an exercise name, as Python would use it;
* a **test cell** is a cell whose text is the released test cell's visible text (or the full
  source text), whitespace ignored, or a cell whose nbgrader metadata names a test with its text
  intact.

The repaired copy carries the solution's nbgrader metadata on exactly those cells and none on
the others; a test cell that is missing or edited is restored from the solution notebook, right
after its exercise's answer; a test cell that ended up above its answer is moved below it.
Every change is recorded as a short phrase for the ``status`` column and the student's report.
"""

from __future__ import annotations

import ast
import copy
import json
import re
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import nbformat
from nbformat.v4.nbbase import random_cell_id

from grader import cells, course

HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[ \t]*\n?", re.M | re.S)
IGNORED_PARTS = {"__MACOSX", ".ipynb_checkpoints", "__pycache__"}


# ---------------------------------------------------------------------------------------------
# The course side: what each solution notebook contains.


@dataclass
class SourceCell:
    grade_id: str
    kind: str  # "answer" or "test"
    index: int  # position in the solution notebook
    source: str  # full text (tests: with hidden tests)
    metadata: dict
    exercise: str  # the exercise it defines (answer) or tests (test)
    points: float = 0.0


@dataclass
class SourceNotebook:
    name: str
    cells: list[SourceCell]
    imports: str  # the notebook's own top-level import lines, re-run before every test cell

    @property
    def answers(self) -> dict[str, SourceCell]:
        return {c.grade_id: c for c in self.cells if c.kind == "answer"}

    @property
    def tests(self) -> dict[str, SourceCell]:
        return {c.grade_id: c for c in self.cells if c.kind == "test"}

    @property
    def max_score(self) -> float:
        return float(sum(c.points for c in self.cells if c.kind == "test"))

    def exercise_of_test(self, test_id: str) -> str:
        return self.tests[test_id].exercise


def strip_hidden(text: str) -> str:
    """``text`` without its ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` blocks."""
    return HIDDEN.sub("", text)


def normalise(text: str) -> str:
    """Text compared for matching: lines stripped, blank lines dropped."""
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def _top_level_imports(nb_cells: list) -> str:
    lines = []
    for cell in nb_cells:
        if cell.cell_type != "code" or cells.metadata(cell):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                lines.append(ast.unparse(node))
    return "\n".join(dict.fromkeys(lines))


@lru_cache(maxsize=None)
def load_source(name: str) -> SourceNotebook:
    """The graded cells of ``solutions/<name>.ipynb``."""
    nb = nbformat.read(course.solutions_dir() / f"{name}.ipynb", as_version=4)
    raw = []
    for index, cell in enumerate(nb.cells):
        if cells.grade_id(cell):
            raw.append((index, cell, cells.metadata(cell), "test" if cells.is_test(cell) else "answer"))
    exercises = [m["grade_id"] for _, _, m, k in raw if k == "answer"]
    found = []
    for index, cell, meta, kind in raw:
        gid = meta["grade_id"]
        found.append(SourceCell(
            grade_id=gid, kind=kind, index=index, source=cell.source, metadata=dict(meta),
            exercise=gid if kind == "answer" else (cells.exercise_of_test(gid, exercises) or gid),
            points=float(meta.get("points", 0) or 0)))
    # Never let the prelude rebind an exercise's own name (e.g. an import from the reference).
    imports = "\n".join(line for line in _top_level_imports(nb.cells).splitlines()
                         if not any(re.search(rf"\b{re.escape(e)}\b", line) for e in exercises))
    return SourceNotebook(name, found, imports)


# ---------------------------------------------------------------------------------------------
# Finding files and their notebook.


@dataclass
class Submission:
    """One file found in the submissions folder."""

    student_id: str
    path: Path
    notebook: str | None  # the course notebook it is, or None if unrecognised
    status: str = "ok"
    notes: list[str] = field(default_factory=list)  # intake remarks for the status column

    @property
    def label(self) -> str:
        """The notebook column: the course name, or the file name where it is not recognised."""
        return self.notebook or self.path.name


def match_notebook(filename: str, names: list[str] | None = None) -> str | None:
    """The course notebook a file name stands for, tolerant of how people save files.

    ``01_dot_products.ipynb``, ``01_Dot_Products (1).ipynb``, ``Copy of 01_dot_products.ipynb``,
    ``01_dot_products-Copy1.ipynb``, ``01 dot products.ipynb`` all give ``01_dot_products``.
    """
    names = list(names or course.NOTEBOOKS)
    p = Path(filename)
    if p.suffix.lower() != ".ipynb":
        return None
    stem = p.stem.strip().lower()
    stem = re.sub(r"^(copy of |copia de |kopie von )+", "", stem)
    stem = re.sub(r"(\s*\(\d+\)|[-_ ]copy\d*|[-_ ]v\d+|[-_ ]final)+$", "", stem)
    stem = re.sub(r"[\s\-]+", "_", stem).strip("_")
    for name in names:
        if stem == name:
            return name
    for name in names:  # "01_dot_products_alice"
        if stem.startswith(name + "_"):
            return name
    return None


def _ignored(rel: Path) -> bool:
    return any(part.startswith(".") or part in IGNORED_PARTS for part in rel.parts)


def discover(submissions: Path) -> list[Submission]:
    """Every file under ``submissions/<student_id>/`` (nested folders too), with its notebook by name.

    Hidden files, ``.ipynb_checkpoints`` and ``__MACOSX`` are skipped; a file directly in
    ``submissions/`` gets a row saying it is not in a student folder. Several files of one student
    for the same notebook are all returned: ``grader.autograde.take_in`` keeps the newest.
    """
    if not submissions.is_dir():
        raise FileNotFoundError(f"submissions folder {submissions} does not exist")
    found: list[Submission] = []
    for path in sorted(p for p in submissions.iterdir() if p.is_file() and not p.name.startswith(".")):
        found.append(Submission("", path, None, "not in a student folder: put it in SUBMISSIONS/<student_id>/"))
    for student_dir in sorted(p for p in submissions.iterdir() if p.is_dir() and not _ignored(Path(p.name))):
        for path in sorted(p for p in student_dir.rglob("*") if p.is_file()):
            if not _ignored(path.relative_to(student_dir)):
                found.append(Submission(student_dir.name, path, match_notebook(path.name)))
    found.sort(key=lambda s: (s.student_id, s.label, str(s.path)))
    return found


# ---------------------------------------------------------------------------------------------
# Reading a file defensively.


class IntakeError(Exception):
    """The file cannot be graded; the message is the row's status."""


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """The file as an nbformat-4 notebook, or :class:`IntakeError` saying what is wrong with it."""
    if path.suffix.lower() != ".ipynb":
        kind = path.suffix.lower() or "no extension"
        raise IntakeError(f"not a notebook ({kind} file)")
    data = path.read_bytes()
    if not data.strip():
        raise IntakeError("empty file (0 bytes of content)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise IntakeError("not a notebook: the file is binary, not JSON text") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise IntakeError(f"invalid notebook: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(obj, dict) or "cells" not in obj and "worksheets" not in obj:
        raise IntakeError("invalid notebook: JSON without notebook cells")
    try:
        with warnings.catch_warnings():  # duplicate or missing cell ids are repaired later
            warnings.simplefilter("ignore")
            nb = nbformat.reads(text, as_version=4, capture_validation_error={})
    except Exception as exc:  # noqa: BLE001 - any nbformat complaint is a status
        raise IntakeError(f"invalid notebook: {type(exc).__name__}: {exc}") from None
    for cell in nb.cells:
        if not isinstance(cell.get("source", ""), str):
            raise IntakeError("invalid notebook: a cell's source is not text")
    return nb


def has_code(nb: nbformat.NotebookNode) -> bool:
    return any(c.cell_type == "code" and c.source.strip() for c in nb.cells)


# ---------------------------------------------------------------------------------------------
# Matching and repair.


def defined_names(source: str) -> list[str]:
    """Top-level names a cell defines (``def``, ``class``, ``name = ...``), in order."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return re.findall(r"^(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)", source, flags=re.M)
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def _test_text_matches(cell_source: str, test: SourceCell) -> bool:
    got = normalise(strip_hidden(cell_source))
    return got == normalise(strip_hidden(test.source)) and bool(got)


@dataclass
class Recognition:
    answers: dict[str, int]  # exercise -> index of the cell with its last definition
    tests: dict[str, int]  # test grade_id -> index of the matching cell (last intact one)
    edited_tests: set[str]  # tests whose cell kept its metadata but whose text was changed
    duplicated: set[str]  # grade ids found on more than one cell
    foreign_ids: set[str]  # nbgrader grade ids that are not this notebook's

    @property
    def score(self) -> int:
        return len(self.answers) + len(self.tests)


def recognise(nb: nbformat.NotebookNode, src: SourceNotebook) -> Recognition:
    answers: dict[str, int] = {}
    tests: dict[str, int] = {}
    edited: set[str] = set()
    seen_ids: dict[str, int] = {}
    foreign: set[str] = set()
    known = {c.grade_id for c in src.cells}
    for index, cell in enumerate(nb.cells):
        gid = cells.grade_id(cell)
        if gid:
            seen_ids[gid] = seen_ids.get(gid, 0) + 1
            if gid not in known:
                foreign.add(gid)
        if cell.cell_type != "code":
            continue
        matched_test = next((t for t in src.tests.values() if _test_text_matches(cell.source, t)), None)
        if matched_test is not None:
            tests[matched_test.grade_id] = index
            continue
        if gid in src.tests:
            edited.add(gid)
            continue
        for name in defined_names(cell.source):
            if name in src.answers:
                answers[name] = index
        if gid in src.answers and gid not in answers:
            answers[gid] = index  # metadata says so and nothing else defines it (yet)
    edited -= set(tests)
    duplicated = {g for g, n in seen_ids.items() if n > 1}
    return Recognition(answers, tests, edited, duplicated, foreign)


def recognise_any(nb: nbformat.NotebookNode, names: list[str]) -> tuple[str | None, int]:
    """The course notebook whose exercises and tests ``nb`` contains most of (name, score)."""
    best: tuple[str | None, int] = (None, 0)
    for name in names:
        score = recognise(nb, load_source(name)).score
        if score > best[1]:
            best = (name, score)
    return best


def _plain(cell: nbformat.NotebookNode) -> nbformat.NotebookNode:
    cell = copy.deepcopy(cell)
    cell.metadata.pop("nbgrader", None)
    cell.metadata.pop("deletable", None)
    cell.metadata.pop("editable", None)
    return cell


def _code_cell(source: str, metadata: dict) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source=source)
    cell.metadata.update(copy.deepcopy(metadata))
    return cell


def _positions(nb_cells: list) -> dict[str, int]:
    """grade id -> index, read from the metadata that :func:`reattach_metadata` put on the cells."""
    return {gid: i for i, cell in enumerate(nb_cells) if (gid := cells.grade_id(cell))}


def _test_cell(test: SourceCell) -> nbformat.NotebookNode:
    """The solution's test cell, locked, as nbgrader released it."""
    return _code_cell(test.source, {"deletable": False, "editable": False, "nbgrader": test.metadata})


# Each repair is ``(nb, src, rec) -> (nb, notes)``: it takes the notebook as the previous step left
# it, the solution's cells and what recognition found in the submitted file, and returns a new
# notebook and the phrases it adds to the status. The steps run in the order of REPAIRS.


def reattach_metadata(nb: nbformat.NotebookNode, src: SourceNotebook, rec: Recognition):
    """Put the solution's nbgrader metadata on the recognised cells, and on no other cell; the
    recognised test cells get the solution's text (hidden tests included)."""
    answer_at = {i: gid for gid, i in rec.answers.items()}
    test_at = {i: gid for gid, i in rec.tests.items()}
    out = []
    for index, cell in enumerate(nb.cells):
        new = _plain(cell)
        if index in answer_at:
            new.metadata["nbgrader"] = copy.deepcopy(src.answers[answer_at[index]].metadata)
        elif index in test_at:
            new = _test_cell(src.tests[test_at[index]])
        out.append(new)
    lost = sorted(gid for gid, i in [*rec.answers.items(), *rec.tests.items()]
                  if cells.grade_id(nb.cells[i]) != gid)
    notes = []
    if lost:
        notes.append("metadata restored (" + ", ".join(lost) + ")")
    if rec.duplicated:
        notes.append("duplicated cells ignored (" + ", ".join(sorted(rec.duplicated)) + ")")
    return _with_cells(nb, out), notes


def move_tests_below_answers(nb: nbformat.NotebookNode, src: SourceNotebook, rec: Recognition):
    """A test cell above its answer (cells moved around) goes just below the answer."""
    out = list(nb.cells)
    moved = []
    for test_id in sorted(rec.tests, key=lambda t: src.tests[t].index):
        where = _positions(out)
        exercise = src.exercise_of_test(test_id)
        if exercise in where and where[test_id] < where[exercise]:
            cell = out.pop(where[test_id])
            out.insert(where[exercise], cell)  # the answer moved up by one: this is just below it
            moved.append(test_id)
    return _with_cells(nb, out), (["moved below their answer: " + ", ".join(moved)] if moved else [])


def restore_missing_tests(nb: nbformat.NotebookNode, src: SourceNotebook, rec: Recognition):
    """A missing or edited test cell is inserted from the solution: after its answer (and the tests
    already below it), else after the previous graded cell of the solution, else at the end."""
    out = list(nb.cells)
    restored = []
    for test in sorted(src.tests.values(), key=lambda t: t.index):
        where = _positions(out)
        if test.grade_id in where:
            continue
        anchor = where.get(test.exercise)
        if anchor is None:
            earlier = [where[c.grade_id] for c in src.cells if c.index < test.index and c.grade_id in where]
            anchor = max(earlier) if earlier else len(out) - 1
        at = anchor + 1
        while at < len(out) and cells.metadata(out[at]).get("grade"):
            at += 1
        out.insert(at, _test_cell(test))
        restored.append(test.grade_id)
    notes = []
    edited = [t for t in restored if t in rec.edited_tests]
    missing = [t for t in restored if t not in rec.edited_tests]
    if edited:
        notes.append("edited tests restored: " + ", ".join(edited))
    if missing:
        notes.append("missing tests restored: " + ", ".join(missing))
    return _with_cells(nb, out), notes


def fresh_cell_ids(nb: nbformat.NotebookNode, src: SourceNotebook, rec: Recognition):
    """Unique, valid cell ids (copy and paste duplicates them; Colab's may be missing)."""
    seen: set[str] = set()
    for cell in nb.cells:
        cid = cell.get("id")
        if not cid or cid in seen or not re.fullmatch(r"[a-zA-Z0-9-_]{1,64}", str(cid)):
            cell["id"] = random_cell_id()
        seen.add(cell["id"])
    return nb, []


def note_missing_answers(nb: nbformat.NotebookNode, src: SourceNotebook, rec: Recognition):
    """No repair: say which exercises have no answer at all (their tests will fail)."""
    absent = [e for e in src.answers if e not in rec.answers]
    return nb, (["no answer found for: " + ", ".join(absent)] if absent else [])


#: The repairs, in the order they run.
REPAIRS = [reattach_metadata, move_tests_below_answers, restore_missing_tests, fresh_cell_ids,
           note_missing_answers]


def _with_cells(nb: nbformat.NotebookNode, new_cells: list) -> nbformat.NotebookNode:
    out = nbformat.v4.new_notebook()
    out.metadata = copy.deepcopy(nb.metadata)
    out.nbformat, out.nbformat_minor = 4, 5
    out.cells = new_cells
    return out


def repair(nb: nbformat.NotebookNode, src: SourceNotebook) -> tuple[nbformat.NotebookNode, list[str]]:
    """A copy of ``nb`` with the solution's nbgrader metadata on the right cells; what was repaired.

    Runs :data:`REPAIRS` in order. Returns the repaired notebook and a list of short phrases (empty
    when nothing needed fixing). ``nb`` itself is never changed.
    """
    rec = recognise(nb, src)
    notes: list[str] = []
    for step in REPAIRS:
        nb, more = step(nb, src, rec)
        notes += more
    return nb, notes


def definition_of(source: str, name: str) -> tuple[str, str]:
    """``(the last top-level definition of name in source, the rest of the cell)``: an answer cell's function
    or class as the student wrote it (the whole source, and nothing else, when it defines no ``name``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source, ""
    lines = source.splitlines()
    target = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            target = node
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            target = node
    if target is None:
        return source, ""
    start = min([target.lineno] + [d.lineno for d in getattr(target, "decorator_list", [])]) - 1
    end = target.end_lineno or target.lineno
    own = "\n".join(lines[start:end])
    rest = "\n".join(lines[:start] + lines[end:])
    return own, rest


def answer_cells(nb: nbformat.NotebookNode) -> dict[str, int]:
    """grade_id -> index of the answer cells of a repaired notebook."""
    return {cells.grade_id(cell): i for i, cell in enumerate(nb.cells) if cells.is_answer(cell)}
