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

from grader import course

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


def _exercise_for_test(test_id: str, exercises: list[str]) -> str:
    """``test_dot`` -> ``dot``; ``test_softmax_stable_overflow`` -> ``softmax_stable`` (longest prefix)."""
    rest = test_id[len("test_"):] if test_id.startswith("test_") else test_id
    candidates = [e for e in exercises if rest == e or rest.startswith(e + "_")]
    return max(candidates, key=len) if candidates else rest


def _top_level_imports(cells: list) -> str:
    lines = []
    for cell in cells:
        if cell.cell_type != "code" or cell.get("metadata", {}).get("nbgrader"):
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
        meta = cell.get("metadata", {}).get("nbgrader")
        if not meta or not meta.get("grade_id"):
            continue
        kind = "test" if meta.get("grade") and not meta.get("solution") else "answer"
        raw.append((index, cell, meta, kind))
    exercises = [m["grade_id"] for _, _, m, k in raw if k == "answer"]
    cells = []
    for index, cell, meta, kind in raw:
        gid = meta["grade_id"]
        cells.append(SourceCell(
            grade_id=gid, kind=kind, index=index, source=cell.source, metadata=dict(meta),
            exercise=gid if kind == "answer" else _exercise_for_test(gid, exercises),
            points=float(meta.get("points", 0) or 0)))
    # Never let the prelude rebind an exercise's own name (e.g. an import from the reference).
    imports = "\n".join(line for line in _top_level_imports(nb.cells).splitlines()
                         if not any(re.search(rf"\b{re.escape(e)}\b", line) for e in exercises))
    return SourceNotebook(name, cells, imports)


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
    superseded: list[Path] = field(default_factory=list)  # older files for the same notebook

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
    """Every file under ``submissions/<student_id>/`` (nested folders too), with its notebook.

    Two files of one student for the same notebook: the newest (modification time) is graded and
    the other is named in its status. Hidden files, ``.ipynb_checkpoints`` and ``__MACOSX`` are
    skipped; a file directly in ``submissions/`` gets a row saying it is not in a student folder.
    """
    if not submissions.is_dir():
        raise FileNotFoundError(f"submissions folder {submissions} does not exist")
    found: list[Submission] = []
    for path in sorted(p for p in submissions.iterdir() if p.is_file() and not p.name.startswith(".")):
        found.append(Submission("", path, None, "not in a student folder: put it in SUBMISSIONS/<student_id>/"))
    for student_dir in sorted(p for p in submissions.iterdir() if p.is_dir() and not _ignored(Path(p.name))):
        per_notebook: dict[str, list[Submission]] = {}
        for path in sorted(p for p in student_dir.rglob("*") if p.is_file()):
            if _ignored(path.relative_to(student_dir)):
                continue
            sub = Submission(student_dir.name, path, match_notebook(path.name))
            if sub.notebook:
                per_notebook.setdefault(sub.notebook, []).append(sub)
            else:
                found.append(sub)
        for subs in per_notebook.values():
            subs.sort(key=lambda s: (s.path.stat().st_mtime, str(s.path)))
            newest = subs[-1]
            newest.superseded = [s.path for s in subs[:-1]]
            if newest.superseded:
                newest.notes.append(f"newest of {len(subs)} files graded (ignored: "
                                    + ", ".join(str(p.relative_to(student_dir)) for p in newest.superseded) + ")")
            found.append(newest)
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
        gid = (cell.get("metadata", {}).get("nbgrader") or {}).get("grade_id")
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


def repair(nb: nbformat.NotebookNode, src: SourceNotebook) -> tuple[nbformat.NotebookNode, list[str]]:
    """A copy of ``nb`` with the solution's nbgrader metadata on the right cells; what was repaired.

    Returns the repaired notebook and a list of short phrases (empty when nothing needed fixing).
    """
    rec = recognise(nb, src)
    repairs: list[str] = []
    original_meta = {i: (c.get("metadata", {}).get("nbgrader") or {}).get("grade_id") for i, c in enumerate(nb.cells)}
    lost_meta = [gid for gid, i in rec.answers.items() if original_meta.get(i) != gid]
    lost_meta += [gid for gid, i in rec.tests.items() if original_meta.get(i) != gid]

    cells: list[nbformat.NotebookNode] = []
    position: dict[str, int] = {}  # grade id -> index in `cells`
    answer_at = {i: gid for gid, i in rec.answers.items()}
    test_at = {i: gid for gid, i in rec.tests.items()}
    for index, cell in enumerate(nb.cells):
        new = _plain(cell)
        if index in answer_at:
            gid = answer_at[index]
            new.metadata["nbgrader"] = copy.deepcopy(src.answers[gid].metadata)
        elif index in test_at:
            gid = test_at[index]
            test = src.tests[gid]
            new = _code_cell(test.source, {"deletable": False, "editable": False, "nbgrader": test.metadata})
        else:
            gid = None
        if gid:
            position[gid] = len(cells)
        cells.append(new)

    # Tests above their answer (cells moved): move them just below the answer.
    moved = []
    for test_id in sorted(rec.tests, key=lambda t: src.tests[t].index):
        exercise = src.exercise_of_test(test_id)
        if exercise in position and position[test_id] < position[exercise]:
            cell = cells.pop(position[test_id])
            position = {g: (p - 1 if p > position[test_id] else p) for g, p in position.items() if g != test_id}
            cells.insert(position[exercise] + 1, cell)
            position = {g: (p + 1 if p > position[exercise] else p) for g, p in position.items()}
            position[test_id] = position[exercise] + 1
            moved.append(test_id)

    # Missing or edited tests: insert the solution's cell after its answer, or after the previous
    # graded cell of the solution, or at the end.
    restored = []
    for test in sorted(src.tests.values(), key=lambda t: t.index):
        if test.grade_id in position:
            continue
        anchor = position.get(test.exercise)
        if anchor is None:
            earlier = [position[c.grade_id] for c in src.cells if c.index < test.index and c.grade_id in position]
            anchor = max(earlier) if earlier else len(cells) - 1
        # after the answer and after any test already placed right below it
        at = anchor + 1
        while at < len(cells) and (cells[at].get("metadata", {}).get("nbgrader") or {}).get("grade"):
            at += 1
        cells.insert(at, _code_cell(test.source, {"deletable": False, "editable": False, "nbgrader": test.metadata}))
        position = {g: (p + 1 if p >= at else p) for g, p in position.items()}
        position[test.grade_id] = at
        restored.append(test.grade_id)

    # Unique, valid cell ids (copy and paste duplicates them; Colab's may be missing).
    seen: set[str] = set()
    for cell in cells:
        cid = cell.get("id")
        if not cid or cid in seen or not re.fullmatch(r"[a-zA-Z0-9-_]{1,64}", str(cid)):
            cell["id"] = random_cell_id()
        seen.add(cell["id"])

    out = nbformat.v4.new_notebook()
    out.metadata = copy.deepcopy(nb.metadata)
    out.nbformat, out.nbformat_minor = 4, 5
    out.cells = cells

    if lost_meta:
        repairs.append("metadata restored (" + ", ".join(sorted(lost_meta)) + ")")
    if rec.duplicated:
        repairs.append("duplicated cells ignored (" + ", ".join(sorted(rec.duplicated)) + ")")
    if moved:
        repairs.append("moved below their answer: " + ", ".join(moved))
    edited = [t for t in restored if t in rec.edited_tests]
    missing = [t for t in restored if t not in rec.edited_tests]
    if edited:
        repairs.append("edited tests restored: " + ", ".join(edited))
    if missing:
        repairs.append("missing tests restored: " + ", ".join(missing))
    absent = [e for e in src.answers if e not in rec.answers]
    if absent:
        repairs.append("no answer found for: " + ", ".join(absent))
    return out, repairs


def answer_cells(nb: nbformat.NotebookNode) -> dict[str, int]:
    """grade_id -> index of the answer cells of a repaired notebook."""
    out = {}
    for i, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader") or {}
        if meta.get("solution") and meta.get("grade_id"):
            out[meta["grade_id"]] = i
    return out
