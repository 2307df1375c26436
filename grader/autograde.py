"""``python -m grader autograde SUBMISSIONS --out DIR [--workers N]``: grade a class with nbgrader.

Layout in:  ``SUBMISSIONS/<student_id>/<notebook>.ipynb`` (any subset of the course's notebooks;
nested folders and names such as ``Copy of 01_dot_products (1).ipynb`` are fine), or a Canvas,
Moodle or nbgrader download (``.zip`` or unpacked), which :mod:`grader.lms` lays out that way in
``DIR/intake`` first (``--layout``); the ``file`` column then names the file in the download.

Layout out:
  ``DIR/grades.csv``   one row per submitted file (per notebook and student), with a ``status``,
                       ``late`` and the student's name where the LMS download gives them
  ``DIR/cells.csv``    one row per graded test cell
  ``DIR/results.json`` everything above plus each test's message (used by ``grader feedback``)
  ``DIR/reports/<student>.md``  what was graded, repaired, flagged, per test
  ``DIR/similarity.csv`` near-identical answers (instructor only; see :mod:`grader.similarity`)
  ``DIR/nbgrader/``    one nbgrader course folder: ``gradebook.db`` (every student), ``submitted/``
                       (the repaired copies) and ``autograded/``, usable with nbgrader's formgrader

How: :func:`autograde` is four steps (see also :mod:`grader.intake`, :mod:`grader.sandbox`,
:mod:`grader.execute`, and :mod:`grader.config` for every default):

1. :func:`take_in`, in this process: every file is read defensively and matched to a course
   notebook by name, else by content; a copy is repaired (``intake.REPAIRS``) and its answer cells
   are checked against :mod:`course_utils.rules`. Of several files of one student for one notebook,
   the newest is taken. The originals are never written. ``--shard K/N`` keeps one share of the
   students (:func:`shard_of`, a stable hash of the student id).
2. :func:`grade`, in ``workers`` processes, one student at a time per process: a private nbgrader
   course folder per student (so no two processes write one SQLite file), nbgrader's own
   ``autograde`` with the kernel sandboxed and time- and memory-limited.
3. :func:`merge_into_gradebook`, in this process: each student's grades go into the course
   gradebook (SQLite in ``DIR/nbgrader``, or ``--db-url``). A rule broken in an answer sets that
   exercise's tests to 0 through nbgrader's manual-score override, with the reason as the
   grader's comment.
4. :func:`write_outputs`: the CSVs, ``results.json``, copy detection and the reports.

:func:`merge` (``python -m grader merge``) puts the outputs of sharded runs back together into
exactly what one unsharded run writes.

Every run rebuilds ``DIR`` from the submissions as they are now, so re-running gives the same
grades and a newer file from a student replaces the earlier grade.
"""

from __future__ import annotations

import ast
import contextlib
import csv
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from traitlets.config import Config

from course_utils import rules
from grader import cells as nbcells
from grader import course, intake, integrity, lms, similarity
from grader.config import SETTINGS, Settings, cache_dir, ensure_venv_on_path, gradebook_url, make_api, safe_name
from grader.intake import IntakeError, Submission

GRADES_COLUMNS = ["student_id", "notebook", "score", "max_score", "status", "file", "late", "student_name",
                  "integrity"]
CELLS_COLUMNS = ["student_id", "notebook", "grade_id", "score", "max_score", "passed", "message"]
SIMILARITY_COLUMNS = ["notebook", "exercise", "student_a", "student_b", "similarity", "matched_tokens"]

SANDBOX_REFUSAL = """
==============================================================================
 REFUSING TO GRADE: the bubblewrap sandbox cannot run here.
 {why}
 Student notebooks are untrusted code. Without the sandbox they run with YOUR
 rights: they can read solutions/, the gradebook and other students' files,
 use the network, and change files. Install bubblewrap (Debian/Ubuntu:
 `sudo apt-get install -y bubblewrap`, or `make sandbox`), or, only if you
 accept the risk, pass --allow-unsandboxed.
==============================================================================
"""

UNSANDBOXED_WARNING = """
==============================================================================
 WARNING: GRADING WITHOUT A SANDBOX (--allow-unsandboxed).
 {why}
 Student code runs with your rights. Time and memory limits still apply.
==============================================================================
"""


@dataclass
class CellResult:
    grade_id: str
    score: float
    max_score: float
    auto_score: float | None = None
    manual_score: float | None = None
    message: str = ""
    comment: str = ""

    @property
    def passed(self) -> bool:
        return self.max_score > 0 and self.score >= self.max_score


@dataclass
class Result:
    student_id: str
    notebook: str
    score: float
    max_score: float
    status: str
    file: str
    cells: list[CellResult] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    tests_shown: dict[str, str] = field(default_factory=dict)  # grade_id -> visible test text
    answers: dict[str, str] = field(default_factory=dict)  # exercise -> the student's answer cell
    late: str = ""  # "yes"/"no" where the LMS download says (Canvas), else ""
    student_name: str = ""  # the student's name as the LMS download wrote it, else ""


@dataclass
class Job:
    """One recognised, repaired notebook to grade."""

    sub_index: int
    student_id: str
    notebook: str
    file: str
    repaired: str  # the repaired notebook, JSON text
    notes: list[str]
    repairs: list[str]
    zero: dict[str, str]  # test grade_id -> reason it scores 0 (a broken rule)
    violations: list[str]
    answers: dict[str, str]


# ---------------------------------------------------------------------------------------------
# nbgrader set-up


def autograde_config(settings: Settings | None = None) -> Config:
    """Course additions to nbgrader's autograde pipeline: restore imports, robust sandboxed Execute,
    stderr is not a failure."""
    from nbgrader.converters.autograde import Autograde

    from grader.preprocessors import RestoreImports, StderrIsNotFailure

    settings = settings or SETTINGS
    config = Config()
    steps = list(Autograde.class_traits()["autograde_preprocessors"].default())
    execute_index = next(i for i, step in enumerate(steps) if step.__name__ == "Execute")
    from grader.execute import RobustExecute
    from grader.judge import JudgeOutside, MarkTests, PrepareHandOff

    # The exercises judged outside the kernel (grader/judge.py): MarkTests starts each test cell with its
    # hand-off line, PrepareHandOff makes the hand-off (its folders, each spec's plan), and JudgeOutside
    # writes the verdicts into the test cells, after execution and before nbgrader's SaveAutoGrades reads them.
    judged = [MarkTests, PrepareHandOff] if settings.judge_outside else []
    steps[execute_index:execute_index + 1] = [RestoreImports, *judged, RobustExecute, StderrIsNotFailure,
                                              *([JudgeOutside] if settings.judge_outside else [])]
    config.Autograde.autograde_preprocessors = steps
    config.OverwriteCells.add_missing_cells = False  # intake already restored missing tests
    # nbconvert validates the notebook after each of the pipeline's steps (about 17, a twentieth of a second
    # per notebook); once, after the last step, is as strict for what is saved.
    config.Exporter.optimistic_validation = True
    config.RobustExecute.kernel_manager_class = "grader.kernels.SandboxedKernelManager"
    config.RobustExecute.timeout = settings.cell_timeout
    config.RobustExecute.notebook_timeout = settings.notebook_timeout
    config.RobustExecute.startup_timeout = settings.startup_timeout
    config.SandboxedKernelManager.sandbox = settings.sandbox
    config.SandboxedKernelManager.memory_limit = settings.memory
    config.RobustExecute.disk_limit = settings.disk_limit
    return config


def prepare_course(root: Path, notebooks: list[str]) -> None:
    """A fresh nbgrader course folder at ``root``: the solution notebooks as its sources, each
    registered as an assignment in the folder's SQLite gradebook.

    The registered gradebook is kept in :func:`grader.config.cache_dir` under a hash of everything
    registration reads (:func:`_registration_key`): a later run with the same solution notebooks, nbgrader
    and configuration copies it instead of running nbgrader's ``generate_assignment`` again (seconds);
    any change to one of them gives a new key, so a cached gradebook is never a stale one."""
    if root.exists():
        shutil.rmtree(root)
    for name in notebooks:
        src = course.solutions_dir() / f"{name}.ipynb"
        (root / "source" / name).mkdir(parents=True)
        shutil.copy2(src, root / "source" / name / src.name)
    if not notebooks:
        register_assignments(root, notebooks)
        return
    folder = _gradebook_cache()
    cached = folder / f"{_registration_key(root, notebooks)}.db" if folder is not None else None
    if cached is not None and cached.is_file():
        shutil.copyfile(cached, root / "gradebook.db")
        if _assignments(root / "gradebook.db") == set(notebooks):
            return
        (root / "gradebook.db").unlink()  # damaged: registered again below, and the cache rewritten
    register_assignments(root, notebooks)
    if cached is None:
        return
    partial = cached.with_name(f"{cached.stem}.{os.getpid()}.partial")
    try:  # written whole, then renamed: a run beside this one reads a complete file or none
        cached.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(cached.parent, 0o700)  # it holds the hidden tests, as the course's gradebook does
        shutil.copyfile(root / "gradebook.db", partial)
        os.replace(partial, cached)
    except OSError:  # no cache where it cannot be written: the next run registers again
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)


def _gradebook_cache() -> Path | None:
    """The folder of registered gradebooks, or ``None`` (no cache) where a kernel could read it: inside
    Python's, the virtual environment's or ``course_utils``' folder, which the sandbox shows."""
    from grader.sandbox import readable_paths

    folder = cache_dir() / "gradebooks"
    if any(folder.resolve().is_relative_to(path) for path in readable_paths()):
        return None
    return folder


def _assignments(db: Path) -> set[str]:
    """The assignments a SQLite gradebook registers (empty where it cannot be read)."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
            return {name for (name,) in connection.execute("SELECT name FROM assignment")}
    except sqlite3.Error:
        return set()


#: Bump when registration changes in a way the key below does not see.
REGISTRATION_VERSION = 1


def _registration_key(root: Path, notebooks: list[str]) -> str:
    """A hash of what a registered gradebook depends on: each source notebook as copied to ``root/source``
    (its bytes), the course id, the nbgrader configuration file, nbgrader's version and its gradebook
    schema's, and :data:`REGISTRATION_VERSION`."""
    import nbgrader

    from grader.config import CONFIG_FILE, alembic_head

    digest = hashlib.sha256()
    for part in (f"v{REGISTRATION_VERSION}", nbgrader.__version__, alembic_head(), SETTINGS.course_id,
                 CONFIG_FILE.read_text(encoding="utf-8")):
        digest.update(part.encode() + b"\0")
    for name in sorted(notebooks):
        for path in sorted((root / "source" / name).iterdir()):
            digest.update(f"{name}/{path.name}".encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def register_assignments(root: Path, notebooks: list[str], db_url: str | None = None) -> None:
    """Make a gradebook know the course's assignments (their cells and points) from the sources in
    ``root/source``: the SQLite one in ``root``, or the one at ``db_url`` (e.g. PostgreSQL). With no
    notebooks (an empty class or shard), an empty gradebook that nbgrader's tools open as usual. Only
    nbgrader's own configuration is needed (not :func:`autograde_config`, whose preprocessors import
    torch): registration reads none of the grading pipeline."""
    if not notebooks:
        root.mkdir(parents=True, exist_ok=True)
        ensure_venv_on_path()  # nbgrader stamps a new database with the `alembic` command
        with Gradebook(gradebook_url(root, db_url), SETTINGS.course_id):
            pass
        return
    api = make_api(root, db_url=db_url)
    for name in notebooks:
        result = api.generate_assignment(name, force=True, create=True)
        if not result["success"]:
            where = f" in {db_url}" if db_url else ""
            raise RuntimeError(f"nbgrader could not register {name}{where}:\n{result.get('error') or result.get('log')}")
    shutil.rmtree(root / "release", ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# 1. Intake


def _allowed_imports(src: intake.SourceNotebook) -> set[str]:
    return set(src.imports.splitlines())


def _strip_allowed_imports(source: str, allowed: set[str]) -> str:
    """``source`` without top-level import statements that the course notebook itself has."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    body = [n for n in tree.body if not (isinstance(n, (ast.Import, ast.ImportFrom)) and ast.unparse(n) in allowed)]
    if len(body) == len(tree.body):
        return source
    tree.body = body
    return ast.unparse(tree)


def _unanswered(code: str) -> bool:
    """Whether every function in ``code`` still only raises ``NotImplementedError`` (the stub)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not funcs:
        return False
    for f in funcs:
        body = [n for n in f.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        if not body or not all(isinstance(n, (ast.Raise, ast.Pass)) for n in body):
            return False
    return True


def _course_cells(src_name: str) -> set[str]:
    """Normalised text of the solution notebook's ungraded code cells (the course's own cells)."""
    nb = nbformat.read(course.solutions_dir() / f"{src_name}.ipynb", as_version=4)
    return {intake.normalise(c.source) for c in nb.cells if c.cell_type == "code" and not nbcells.metadata(c)}


def check_rules(nb: nbformat.NotebookNode, src: intake.SourceNotebook) -> tuple[dict[str, str], list[str]]:
    """Test grade_id -> reason for each test that a broken rule sets to 0, and the list of findings.

    An answer cell is checked with :func:`course_utils.rules.find_violations` for its exercise
    (the same call as the student's self-check, so the same reason), and as a whole with the policy on
    machinery no exercise needs (:func:`course_utils.rules.policy_violations`: computed names on modules,
    ``sys.modules``, ``exec``, frames...), read here from the submitted source, outside the kernel; any
    other code cell a student added or changed is checked with the general rules and the policy (no
    reference, no patching of torch, builtins or the test helpers), and a finding there zeroes every test
    below it.
    """
    allowed = _allowed_imports(src)
    course_cells = _course_cells(src.name)
    zero: dict[str, str] = {}
    findings: list[str] = []
    test_positions = {nbcells.grade_id(cell): i for i, cell in enumerate(nb.cells) if nbcells.is_test(cell)}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        gid = nbcells.grade_id(cell)
        if nbcells.is_test(cell):
            continue  # the course's own test cell
        if nbcells.is_answer(cell) and gid in src.answers:
            own, rest = intake.definition_of(cell.source, gid)
            found = [] if _unanswered(own) else [str(v) for v in rules.find_violations(own, gid)]
            found += [str(v) for v in rules.find_violations(_strip_allowed_imports(rest, allowed))] \
                if rest.strip() else []
            # Other exercises defined in the same cell get their own rules.
            for other in intake.defined_names(rest):
                if other in src.answers and other != gid:
                    found += [str(v) for v in rules.find_violations(intake.definition_of(rest, other)[0], other)]
            found += [str(v) for v in rules.policy_violations(cell.source)]
            if found:
                why = rules.RULES.get(gid, rules.Rule()).why
                reason = f"{gid}: " + "; ".join(dict.fromkeys(found)) + (f". {why}" if why else "")
                findings.append(reason)
                for test_id, test in src.tests.items():
                    if test.exercise == gid:
                        zero.setdefault(test_id, "rule broken in the answer: " + reason)
            continue
        if intake.normalise(cell.source) in course_cells:
            continue  # the course's own cell, unchanged
        found = [str(v) for v in rules.find_violations(_strip_allowed_imports(cell.source, allowed))]
        found += [str(v) for v in rules.policy_violations(cell.source)]
        if found:
            reason = f"cell {i + 1}: " + "; ".join(dict.fromkeys(found))
            findings.append(reason + " (a cell outside the answers; every test below it scores 0)")
            for test_id, pos in test_positions.items():
                if pos > i:
                    zero.setdefault(test_id, "test machinery tampered with above this test: " + reason)
    return zero, findings


def _visible_tests(src: intake.SourceNotebook) -> dict[str, str]:
    return {gid: intake.strip_hidden(t.source).rstrip() for gid, t in src.tests.items()}


def take_in_one(sub: Submission, index: int, submissions: Path, names: list[str],
                view: lms.View | None = None) -> Job | Result:
    """Read, recognise and repair one submission: a :class:`Job` to grade, or a final row. With a
    ``view`` (an LMS download, :mod:`grader.lms`), the ``file`` column is the file's path in the download."""
    rel = sub.path.relative_to(submissions).as_posix()
    file = view.origin(rel) if view is not None else rel
    notes = list(sub.notes)

    def row(status: str, notebook: str | None = None) -> Result:
        nb_name = notebook or sub.notebook
        max_score = intake.load_source(nb_name).max_score if nb_name in names else 0.0
        return Result(sub.student_id, nb_name or sub.path.name, 0.0, max_score,
                      "; ".join([status] + notes), file)

    if not sub.student_id:
        return row(sub.status)
    try:
        nb = intake.read_notebook(sub.path)
    except IntakeError as exc:
        return row(str(exc) if sub.notebook or sub.path.suffix.lower() != ".ipynb"
                   else f"{exc}; unknown file name")
    if not intake.has_code(nb):
        return row("empty notebook: no code in it")
    notebook = sub.notebook
    if notebook is not None and notebook not in names:
        return row(f"{notebook} is not part of the course yet (no solutions/{notebook}.ipynb)")
    if notebook is None:
        guess, score = intake.recognise_any(nb, names)
        if guess is None or score < 2:
            ids = sorted({nbcells.grade_id(c) for c in nb.cells} - {None})
            if ids:
                return row("another course's notebook: unknown file name and nbgrader ids "
                           + ", ".join(ids[:5]))
            return row("unknown file name: not one of the course's notebooks ("
                       + ", ".join(names) + ")")
        notebook = guess
        notes.insert(0, f"recognised by content as {guess}")
    src = intake.load_source(notebook)
    rec = intake.recognise(nb, src)
    if rec.score == 0:
        what = ("nbgrader ids " + ", ".join(sorted(rec.foreign_ids)[:5])) if rec.foreign_ids else "no exercise or test of it"
        return row(f"another course's notebook: named {notebook} but has {what}", notebook)
    repaired, repairs = intake.repair(nb, src)
    zero, violations = check_rules(repaired, src)
    answers = {gid: repaired.cells[i].source for gid, i in intake.answer_cells(repaired).items()}
    return Job(index, sub.student_id, notebook, file, nbformat.writes(repaired), notes, repairs,
               zero, violations, answers)


# ---------------------------------------------------------------------------------------------
# 2. Grading (runs in worker processes)


def _messages(nb: nbformat.NotebookNode) -> dict[str, str]:
    """Test grade_id -> what its check said (error name and message, or its printed lines)."""
    out = {}
    for cell in nb.cells:
        meta = nbcells.metadata(cell)
        if not (meta.get("grade") and meta.get("grade_id")):
            continue
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            e = errors[-1]
            out[meta["grade_id"]] = f"{e.get('ename', 'Error')}: {e.get('evalue', '')}".strip()
        else:
            text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
            out[meta["grade_id"]] = text.strip()[-2000:]
    return out


def _read_grades(root: Path, notebook: str, student: str) -> list[CellResult] | None:
    with Gradebook(gradebook_url(root), SETTINGS.course_id) as gb:
        try:
            nb = gb.find_submission_notebook(notebook, notebook, student)
        except MissingEntry:
            return None
        cells = []
        for grade in sorted(nb.grades, key=lambda g: g.name):
            if grade.max_score:
                cells.append(CellResult(grade.name, float(grade.score or 0.0), float(grade.max_score),
                                        grade.auto_score, grade.manual_score))
        return cells


def _apply_zero(root: Path, notebook: str, student: str, zero: dict[str, str]) -> None:
    """nbgrader's manual override: 0 for each test in ``zero``, the reason as a comment."""
    with Gradebook(gradebook_url(root), SETTINGS.course_id) as gb:
        nb = gb.find_submission_notebook(notebook, notebook, student)
        for grade in nb.grades:
            if grade.name in zero:
                grade.manual_score = 0.0
                grade.needs_manual_grade = False
        for comment in nb.comments:
            reasons = [r for t, r in zero.items() if intake.load_source(notebook).tests.get(t)
                       and intake.load_source(notebook).tests[t].exercise == comment.name]
            if reasons:
                comment.manual_comment = reasons[0]
        gb.db.commit()


def grade_student(jobs: list[Job], master: str, work: str, settings: Settings) -> list[Result]:
    """Autograde one student's notebooks in a private nbgrader course folder ``work``."""
    import warnings

    warnings.filterwarnings("ignore", message=".*not in session.*")  # nbgrader's own SQLAlchemy noise
    master_root, root = Path(master), Path(work)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    shutil.copy2(master_root / "gradebook.template.db", root / "gradebook.db")
    api = make_api(root, autograde_config(settings))
    results = []
    for job in jobs:
        src = intake.load_source(job.notebook)
        shutil.copytree(master_root / "source" / job.notebook, root / "source" / job.notebook, dirs_exist_ok=True)
        status_parts = []
        target = root / "submitted" / job.student_id / job.notebook / f"{job.notebook}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(job.repaired, encoding="utf-8")
        try:
            outcome = _autograde_one(api, job)
            ok = outcome["success"]
            error = "" if ok else _last_error_line(outcome)
            if not ok and os.environ.get("GRADER_DEBUG"):
                print(outcome.get("log"), outcome.get("error"), file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 - one broken notebook never stops the batch
            ok, error = False, f"{type(exc).__name__}: {exc}"
        cells = _read_grades(root, job.notebook, job.student_id) if ok else None
        if not ok or cells is None:
            status_parts.append("grading failed: " + (error or "no grades recorded"))
            cells = [CellResult(t.grade_id, 0.0, t.points, message="not graded") for t in src.tests.values()]
        else:
            if job.zero:
                _apply_zero(root, job.notebook, job.student_id, job.zero)
                cells = _read_grades(root, job.notebook, job.student_id) or cells
            graded = root / "autograded" / job.student_id / job.notebook / f"{job.notebook}.ipynb"
            graded_nb = nbformat.read(graded, as_version=4) if graded.exists() else None
            messages = _messages(graded_nb) if graded_nb is not None else {}
            for c in cells:
                c.message = messages.get(c.grade_id, "")
                if c.grade_id in job.zero:
                    c.comment = job.zero[c.grade_id]
            status_parts.append("ok")
            events = limit_events(graded_nb) if graded_nb is not None else []
        if job.repairs:
            status_parts.append("repaired: " + ", ".join(job.repairs))
        if job.violations:
            status_parts.append("rule broken: " + " | ".join(job.violations))
        if ok and events:
            status_parts.append("limits hit: " + ", ".join(events))
        status_parts += job.notes
        score = float(sum(c.score for c in cells))
        results.append(Result(job.student_id, job.notebook, score, src.max_score, "; ".join(status_parts),
                              job.file, cells, job.repairs, job.violations, _visible_tests(src), job.answers))
    return results


def _autograde_one(api, job: Job) -> dict:
    """nbgrader's autograde of one notebook. Where its warm parent (:mod:`grader.warm`) died meanwhile, the
    notebook is graded again from the start with cold kernels: it is never lost, nor judged on a half run."""
    from grader import warm

    parent, lost = warm.current(), warm.lost()
    outcome = api.autograde(job.notebook, job.student_id, force=True, create=True)
    if parent is not None and (not parent.alive() or warm.lost() != lost):
        print(f"grader: the warm parent ended while grading {job.student_id}/{job.notebook}; "
              "graded again with cold kernels", file=sys.stderr)
        with warm.suspended():
            outcome = api.autograde(job.notebook, job.student_id, force=True, create=True)
    return outcome


def _where(cell, index: int) -> str:
    gid = nbcells.grade_id(cell)
    if nbcells.is_answer(cell):
        return f"answer {gid} (cell {index + 1})"
    if nbcells.is_test(cell):
        return f"{gid} (cell {index + 1})"
    return f"cell {index + 1}"


def limit_events(nb: nbformat.NotebookNode) -> list[str]:
    """Every cell of a graded notebook that a limit or an exit stopped, wherever it is: an answer
    cell that hangs at its top level costs the tests below it as surely as a test that hangs.

    ``"CellTimeoutError in answer dot (cell 5)"``, ``"KernelDied in test_dot (cell 6)"``,
    ``"memory limit in cell 3"``, ``"disk limit in answer dot (cell 5)"``, ``"SystemExit in cell 9"``,
    ``"NotebookTimeLimit from cell 12 on"``.
    """
    from grader.execute import CELL_TIMEOUT, DISK_LIMIT_WORDS, KERNEL_DIED, NOTEBOOK_TIMEOUT

    found: list[str] = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") != "error":
                continue
            name, text = out.get("ename", ""), f"{out.get('ename', '')} {out.get('evalue', '')}"
            if name == NOTEBOOK_TIMEOUT:
                found.append(f"{NOTEBOOK_TIMEOUT} from {_where(cell, index)} on")
                return found
            if name == KERNEL_DIED and DISK_LIMIT_WORDS in text:
                found.append(f"disk limit in {_where(cell, index)}")
            elif name in (CELL_TIMEOUT, KERNEL_DIED, "SystemExit"):
                found.append(f"{name} in {_where(cell, index)}")
            elif "MemoryError" in text or "can't allocate memory" in text or "DefaultCPUAllocator" in text:
                found.append(f"memory limit in {_where(cell, index)}")
    return list(dict.fromkeys(found))


def _last_error_line(result: dict) -> str:
    text = (result.get("error") or result.get("log") or "").strip().splitlines()
    return text[-1] if text else "unknown error"


# ---------------------------------------------------------------------------------------------
# 3. Merge and write


def merge_into_gradebook(root: Path, results: list[Result], files_root: Callable[[Result], Path],
                         db_url: str | None = None) -> None:
    """Write each graded notebook's scores into the course gradebook and copy its files in.

    ``files_root(result)`` is the nbgrader course folder that holds that result's ``submitted/``
    and ``autograded/`` files (a worker's private folder, or a shard's output). ``db_url``: the
    gradebook's address (default: SQLite in ``root``).
    """
    import warnings

    warnings.filterwarnings("ignore", message=".*not in session.*")  # nbgrader's own SQLAlchemy noise
    with Gradebook(gradebook_url(root, db_url), SETTINGS.course_id) as gb:
        for r in results:
            if not r.cells or r.status.startswith("grading failed"):
                continue
            gb.update_or_create_student(r.student_id)
            gb.update_or_create_submission(r.notebook, r.student_id)
            nb = gb.find_submission_notebook(r.notebook, r.notebook, r.student_id)
            by_id = {c.grade_id: c for c in r.cells}
            for grade in nb.grades:
                c = by_id.get(grade.name)
                if c is not None:
                    grade.auto_score = c.auto_score
                    grade.manual_score = c.manual_score
                    grade.needs_manual_grade = False
            exercises = list(intake.load_source(r.notebook).answers)
            for comment in nb.comments:
                reasons = [c.comment for c in r.cells
                           if c.comment and nbcells.exercise_of_test(c.grade_id, exercises) == comment.name]
                if reasons:
                    comment.manual_comment = reasons[0]
            gb.db.commit()
            for part in ("submitted", "autograded"):
                src = files_root(r) / part / r.student_id / r.notebook
                if src.exists():
                    shutil.copytree(src, root / part / r.student_id / r.notebook, dirs_exist_ok=True)


def write_csvs(out: Path, results: list[Result]) -> None:
    """``grades.csv`` (with the instructor-only ``integrity`` column: :mod:`grader.integrity`) and ``cells.csv``."""
    out.mkdir(parents=True, exist_ok=True)
    flags = integrity.flags(results)
    with open(out / "grades.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(GRADES_COLUMNS)
        for r in results:
            writer.writerow([r.student_id, r.notebook, f"{r.score:g}", f"{r.max_score:g}", r.status, r.file,
                             r.late, r.student_name, integrity.column(flags, r.student_id, r.notebook)])
    with open(out / "cells.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CELLS_COLUMNS)
        for r in results:
            for c in r.cells:
                message = c.comment or c.message
                writer.writerow([r.student_id, r.notebook, c.grade_id, f"{c.score:g}", f"{c.max_score:g}",
                                 "yes" if c.passed else "no", message.splitlines()[0] if message else ""])


def write_results(out: Path, results: list[Result]) -> None:
    data = []
    for r in results:
        d = asdict(r)
        for c, cd in zip(r.cells, d["cells"]):
            cd["passed"] = c.passed
        data.append(d)
    (out / "results.json").write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")


def write_similarity(out: Path, pairs: list[similarity.Pair]) -> None:
    """``DIR/similarity.csv``: one row per flagged pair (header only when there is none)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "similarity.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(SIMILARITY_COLUMNS)
        for p in sorted(pairs):
            writer.writerow([p.notebook, p.exercise, p.student_a, p.student_b, f"{p.similarity:.3f}", p.matched_tokens])


def write_reports(out: Path, results: list[Result], similar: list[similarity.Pair] | None = None) -> None:
    """``DIR/reports/<student>.md``: per notebook, the file, status, repairs, findings, each test;
    then the student's pairs in ``similar``, if any, under "Similarity (instructor only)", and the
    dynamic code in their answers, if any, under "Integrity (instructor only)"."""
    flags = integrity.flags(results)
    folder = out / "reports"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    by_student: dict[str, list[Result]] = {}
    for r in results:
        by_student.setdefault(r.student_id or "_no_student_folder", []).append(r)
    for student, rows in by_student.items():
        lines = [f"# Grading report: {student}", ""]
        for r in rows:
            lines += [f"## {r.notebook}: {r.score:g} / {r.max_score:g}", "",
                      f"- file: `{r.file}`", f"- status: {r.status}"]
            lines += [f"- repaired: {x}" for x in r.repairs]
            lines += [f"- **rule broken** (0 for the exercise): {x}" for x in r.violations]
            if r.cells:
                lines += ["", "| test | score | result | message |", "|---|---|---|---|"]
                for c in r.cells:
                    msg = (c.comment or c.message or "").replace("|", "\\|").replace("\n", " ")[:300]
                    lines.append(f"| {c.grade_id} | {c.score:g} / {c.max_score:g} | "
                                 f"{'pass' if c.passed else 'FAIL'} | {msg} |")
            lines.append("")
        mine = [p for p in similar or [] if student in (p.student_a, p.student_b)]
        if mine:
            lines += ["## Similarity (instructor only)", "",
                      "Answers near-identical after normalising names, comments, formatting and strings "
                      "(see similarity.csv): a lead to read both, not a verdict; no score depends on it.", "",
                      "| notebook | exercise | similar to | similarity | matched tokens |", "|---|---|---|---|---|"]
            lines += [f"| {p.notebook} | {p.exercise} | {p.student_b if p.student_a == student else p.student_a} "
                      f"| {p.similarity:.2f} | {p.matched_tokens} |" for p in mine]
            lines.append("")
        lines += integrity.report_section(flags, student)
        (folder / f"{safe_name(student)}.md").write_text("\n".join(lines), encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# The command: take_in -> grade -> merge -> write_outputs


def sandbox_settings(allow_unsandboxed: bool) -> tuple[bool, str]:
    """(use the sandbox, message); raises ``PermissionError`` when refused."""
    from grader.sandbox import check_bwrap

    ok, why = check_bwrap()
    if ok:
        return True, why
    if not allow_unsandboxed:
        raise PermissionError(SANDBOX_REFUSAL.format(why=why))
    return False, UNSANDBOXED_WARNING.format(why=why)


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)``: the K-th of N shares, counted from 0 (a Slurm array index or a
    Kubernetes completion index as it comes)."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: write K/N, e.g. 0/4 (the first of four shares)") from None
    if n < 1 or not 0 <= k < n:
        raise ValueError(f"--shard {text!r}: K must be 0 to N-1 and N at least 1 (K counts from 0)")
    return k, n


def shard_of(key: str, shards: int) -> int:
    """The share a student belongs to: a stable hash of the student id (the same on every machine
    and every run, so a re-run or a late submission lands in the same shard)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % shards


def _shard_key(sub: Submission, submissions: Path) -> str:
    # A file outside any student folder has no student id: its path places it instead.
    return sub.student_id or str(sub.path.relative_to(submissions))


def _mtime(path: Path) -> tuple[float, str]:
    return path.stat().st_mtime, str(path)


#: What the grading processes import before any work, once per grading run (see :func:`pool_context`).
PRELOAD = ["torch", "nbgrader.apps.api", "grader.autograde", "grader.execute", "grader.judge", "grader.sandbox",
           "course_utils.checks", "course_utils.reference"]


def pool_context() -> multiprocessing.context.BaseContext:
    """The start method of the grading processes: a fork server that has imported :data:`PRELOAD`.

    Each grading process is then a fork of a process that has already imported torch, nbgrader and the
    course (about 3 s of CPU each, paid once per run instead of once per worker; a test session that
    grades many small classes pays it once per process). The fork server itself is a fresh interpreter,
    started with no thread running, so forking it is safe where forking this process (which may run
    threads) would not be. Where there is no fork server (not POSIX), ``spawn``: a fresh interpreter each.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def start_fork_server() -> None:
    """Start the grading processes' fork server (:func:`pool_context`) now, without waiting for it: it
    imports :data:`PRELOAD` (seconds) while this process checks the sandbox, reads the submissions and
    prepares the course, instead of after. Nothing where there is no fork server, or it already runs."""
    if pool_context().get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def grading_pool(workers: int, sandboxed: bool = True, warm_memory: int | None = None,
                 warm_meta: bool = True, prestarted: "warm.Prestarted | None" = None) -> ProcessPoolExecutor:
    """``workers`` grading processes (:func:`pool_context`), each with this process's environment as it
    is now and, for sandboxed kernels, this process's matplotlib font list (:func:`grader.sandbox.font_cache`,
    built once per process instead of once per grading process). With ``warm_memory`` (the kernels'
    memory cap, bytes), each grading process adopts one of the warm parents of ``prestarted``
    (:func:`grader.warm.prestart`), or starts its own (:mod:`grader.warm`) at once
    (``warm_meta``: :func:`grader.warm.needs_meta`)."""
    from grader import sandbox

    fonts = sandbox.font_cache() if sandboxed else None
    return ProcessPoolExecutor(max_workers=max(1, workers), mp_context=pool_context(), initializer=_start_worker,
                               initargs=(dict(os.environ), str(fonts or ""), warm_memory, warm_meta, prestarted))


def _start_worker(environment: dict[str, str], fonts: str, warm_memory: int | None = None,
                  warm_meta: bool = True, prestarted: "warm.Prestarted | None" = None) -> None:
    """A grading process's environment is its caller's at the time of the call (as a spawned process's
    would be), not the fork server's, which an earlier call started; its font list is its caller's."""
    from grader import sandbox, warm

    os.environ.clear()
    os.environ.update(environment)
    sandbox.adopt_font_cache(Path(fonts) if fonts else None)
    if warm_memory is not None:
        warm.enable(warm_memory, warm_meta, prestarted.claim() if prestarted is not None else None)


def _run_pool(per_student: dict[str, list[Job]], workers: int, root: Path, work_root: Path,
              settings: Settings, record, prestarted: "warm.Prestarted | None" = None) -> list[str]:
    """Grade students in a process pool, calling ``record(jobs, results)`` for each; return the
    students whose worker process died. ``prestarted``: warm parents for the pool's processes."""
    from concurrent.futures.process import BrokenProcessPool

    broken = []
    if workers == 0:  # in this process: one submission where memory is short (Gradescope), no pool
        for sid, js in per_student.items():
            try:
                rows = grade_student(js, str(root), str(work_root / sid), settings)
            except Exception as exc:  # noqa: BLE001 - a failure costs its student only
                rows = [Result(j.student_id, j.notebook, 0.0, intake.load_source(j.notebook).max_score,
                               f"grading failed: {type(exc).__name__}: {exc}", j.file) for j in js]
            record(js, rows)
        return broken
    warm_memory = settings.memory if settings.sandbox and settings.warm_kernels else None
    from grader import warm

    meta = warm.needs_meta(sorted({j.notebook for js in per_student.values() for j in js}))
    with grading_pool(workers, settings.sandbox, warm_memory, meta, prestarted) as pool:
        futures = {pool.submit(grade_student, js, str(root), str(work_root / sid), settings): sid
                   for sid, js in per_student.items()}
        for future in as_completed(futures):
            sid = futures[future]
            js = per_student[sid]
            try:
                rows = future.result()
            except BrokenProcessPool:
                broken.append(sid)
                continue
            except Exception as exc:  # noqa: BLE001 - a failure costs its student only
                rows = [Result(j.student_id, j.notebook, 0.0, intake.load_source(j.notebook).max_score,
                               f"grading failed: {type(exc).__name__}: {exc}", j.file) for j in js]
            record(js, rows)
    return sorted(broken)


def take_in(submissions: Path, names: list[str], shard: tuple[int, int] | None = None,
            view: lms.View | None = None) -> tuple[list[Job | Result], int]:
    """Every file of the class (or of one shard), read, recognised and repaired: a :class:`Job` to
    grade or a final row each, and the number of files seen.

    The one place of the newest-file rule: where a student sent several files that are the same
    course notebook (by name, or recognised by content), the newest (modification time) is taken
    and the others are named in its status. ``view``: the LMS download that ``submissions`` was
    laid out from (:func:`grader.lms.open_download`); its notes join the status, and a file its
    layout does not explain gets a row saying why.
    """
    subs = intake.discover(submissions)
    if view is not None and view.files:
        for sub in subs:
            info = view.files.get(sub.path.relative_to(submissions).as_posix())
            if info is not None:
                sub.notes = sub.notes + info.notes
                if info.why:
                    sub.status = info.why
    if shard is not None:
        subs = [s for s in subs if shard_of(_shard_key(s, submissions), shard[1]) == shard[0]]
    taken = [take_in_one(sub, i, submissions, names, view) for i, sub in enumerate(subs)]

    def shown(path: Path, student_dir: Path) -> str:
        return view.origin(path.relative_to(submissions).as_posix()) if view is not None and view.files \
            else str(path.relative_to(student_dir))
    groups: dict[tuple[str, str], list[int]] = {}
    for i, t in enumerate(taken):
        if t.student_id and t.notebook in names:
            groups.setdefault((t.student_id, t.notebook), []).append(i)
    dropped: set[int] = set()
    for indices in groups.values():
        if len(indices) < 2:
            continue
        indices.sort(key=lambda i: _mtime(subs[i].path))
        newest, older = indices[-1], indices[:-1]
        student_dir = submissions / taken[newest].student_id
        note = (f"newest of {len(indices)} files graded (ignored: "
                + ", ".join(shown(subs[i].path, student_dir) for i in older) + ")")
        kept = taken[newest]
        if isinstance(kept, Job):
            kept.notes.append(note)
        else:
            kept.status = "; ".join([kept.status, note])
        dropped.update(older)
    return [t for i, t in enumerate(taken) if i not in dropped], len(subs)


def grade(jobs: list[Job], out: Path, settings: Settings, workers: int, progress: bool) -> tuple[dict[int, Result], Path]:
    """Grade every job in ``workers`` processes, one student at a time per process, each in a
    private nbgrader course folder under ``out/work``. A worker that dies (it should not: student
    code runs in the kernel, not in the worker) breaks the whole pool; its students are then graded
    again one at a time, each in a fresh pool. Returns the rows by job and the work folder."""
    root = out / "nbgrader"
    work_root = out / "work"
    if settings.warm_kernels and len(jobs) < 2 * max(1, workers):
        # A warm parent's imports cost about what one cold kernel's and a half do: with fewer than two
        # notebooks per grading process, cold kernels are as fast.
        settings = settings.with_(warm_kernels=False)
    per_student: dict[str, list[Job]] = {}
    for job in jobs:
        per_student.setdefault(job.student_id, []).append(job)
    # Students with the most notebooks first (longest job first): a worker that takes a whole class's
    # eleven notebooks last grades alone at the end while the other waits (the suite's graded class
    # spent its last 23 s so, with one of two workers idle).
    per_student = dict(sorted(per_student.items(), key=lambda item: -len(item[1])))
    prestarted = None
    if settings.warm_kernels and settings.sandbox and workers > 0:
        from grader import warm

        # The pool's warm parents start now, beside the pool's fork server: both import for seconds, and
        # the parents need not wait for the fork server (nor the registration below) to start.
        prestarted = warm.prestart(min(workers, len(per_student)), settings.memory,
                                   warm.needs_meta(sorted({j.notebook for j in jobs})), pool_context())
    try:
        return _grade_in_pools(jobs, per_student, root, work_root, settings, workers, progress, prestarted)
    finally:
        if prestarted is not None:
            prestarted.end()


def _grade_in_pools(jobs: list[Job], per_student: dict[str, list[Job]], root: Path, work_root: Path,
                    settings: Settings, workers: int, progress: bool,
                    prestarted: "warm.Prestarted | None") -> tuple[dict[int, Result], Path]:
    prepare_course(root, sorted({j.notebook for j in jobs}))
    if not jobs:  # an empty class or shard: an empty gradebook, nothing to grade
        return {}, work_root
    shutil.copy2(root / "gradebook.db", root / "gradebook.template.db")
    shutil.rmtree(work_root, ignore_errors=True)
    graded: dict[int, Result] = {}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), unit="notebook", desc="autograding", file=sys.stderr)

    def record(js: list[Job], rows: list[Result]) -> None:
        for j, r in zip(js, rows):
            graded[j.sub_index] = r
        if bar is not None:
            bar.update(len(js))

    for sid in _run_pool(per_student, workers, root, work_root, settings, record, prestarted):
        for sid2 in _run_pool({sid: per_student[sid]}, 1, root, work_root, settings, record):
            js = per_student[sid2]
            record(js, [Result(j.student_id, j.notebook, 0.0, intake.load_source(j.notebook).max_score,
                               "grading failed: the grading process crashed twice", j.file) for j in js])
    if bar is not None:
        bar.close()
    return graded, work_root


def write_outputs(out: Path, results: list[Result], similarity_max_share: int = similarity.MAX_SHARE) -> None:
    """The CSVs, ``results.json``, copy detection and the reports, from the final rows."""
    results.sort(key=lambda r: (r.student_id, r.notebook, r.file))
    write_csvs(out, results)
    write_results(out, results)
    # Copy detection, after the grades are written: its own file and the reports only, never
    # results.json (the students' feedback) or a score.
    try:
        similar = similarity.find_similar(results, max_share=similarity_max_share)
        write_similarity(out, similar)
    except Exception as exc:  # noqa: BLE001 - copy detection is a lead, never a reason to lose the reports
        similar = []
        print(f"copy detection failed ({type(exc).__name__}: {exc}); similarity.csv was not written", file=sys.stderr)
    write_reports(out, results, similar)


def check_paths(submissions: Path, out: Path) -> str | None:
    """Why ``submissions`` and ``out`` cannot be used (one line), or ``None``."""
    if not submissions.exists():
        return f"submissions {submissions} does not exist: give the folder of student folders or the LMS's download (.zip)"
    if submissions.is_file() and submissions.suffix.lower() != ".zip":
        return f"submissions {submissions} is a file but not a .zip: give the submissions folder or the LMS's download"
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file: give a folder (it is created if missing)"
    if out == submissions or submissions in out.parents:
        return "--out must not be inside the submissions folder"
    if out in submissions.parents:
        return f"the submissions must not be inside --out {out} (that folder is rebuilt on every run)"
    return None


def autograde(submissions: Path, out: Path, workers: int = 1, allow_unsandboxed: bool = False, *,
              cell_timeout: int | None = None, notebook_timeout: int | None = None,
              memory: int | None = None, progress: bool = True,
              similarity_max_share: int = similarity.MAX_SHARE, shard: tuple[int, int] | None = None,
              db_url: str | None = None, layout: str = "auto", cold_kernels: bool = False) -> int:
    """Grade every submission (or one shard's: ``shard=(K, N)``); write the CSVs, reports and
    gradebook, in ``workers`` grading processes (0: in this process, as Gradescope's one submission
    does). Limits not given come from :data:`grader.config.SETTINGS`. Returns the exit code:
    0 when every submission got a row (an empty class or shard included: the CSVs with their
    headers and an empty gradebook), 2 when the arguments are unusable or grading was refused (no
    sandbox; the reason is one line on stderr), 1 otherwise.
    ``submissions``: ``SUBMISSIONS/<student_id>/...``, or an LMS download (Canvas, Moodle, nbgrader;
    a folder or a ``.zip``), laid out by :mod:`grader.lms` into ``out/intake`` (``layout``: ``auto``
    or one of :data:`grader.lms.LAYOUTS`).
    ``similarity_max_share``: copy detection ignores code found in more students' answers than this.
    ``db_url``: where the merged gradebook lives (default: SQLite in ``out/nbgrader``).
    ``cold_kernels``: start every kernel afresh instead of forking it from a warm parent (:mod:`grader.warm`);
    where no warm parent can run, kernels are cold anyway and one line says why."""
    submissions, out = Path(submissions).resolve(), Path(out).resolve()
    problem = check_paths(submissions, out)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        sandbox, message = sandbox_settings(allow_unsandboxed)
    except PermissionError as exc:
        print(exc, file=sys.stderr)
        return 2
    if workers > 0:
        start_fork_server()  # its imports overlap everything up to the first notebook graded
    if not sandbox:
        print(message, file=sys.stderr)
    warm_check = None
    if sandbox and not cold_kernels:
        from grader import warm

        warm_check = warm.check_in_background()  # answered before grading, below
    names = [n for n in course.available_notebooks() if (course.solutions_dir() / f"{n}.ipynb").exists()]

    out.mkdir(parents=True, exist_ok=True)
    try:
        view = lms.open_download(submissions, out / "intake", layout)
    except lms.DownloadError as exc:
        print(exc, file=sys.stderr)
        return 2
    for remark in view.remarks:
        print(remark, file=sys.stderr)
    if view.files:
        print(lms.describe(view), file=sys.stderr)
    else:  # read where it is: no view of an earlier run's download stays beside these grades
        shutil.rmtree(out / "intake", ignore_errors=True)
    taken, seen = take_in(view.root, names, shard, view)
    if not seen:
        print(f"no submitted files in {submissions}: writing an empty result", file=sys.stderr)
    jobs = [t for t in taken if isinstance(t, Job)]
    warm_kernels, why = warm_check() if warm_check is not None else (False, "")
    if warm_check is not None and not warm_kernels:
        print(f"grader: cold kernels ({why})", file=sys.stderr)
    settings = SETTINGS.with_(sandbox=sandbox, cell_timeout=cell_timeout, notebook_timeout=notebook_timeout,
                              memory=memory, db_url=db_url, warm_kernels=warm_kernels)
    graded, work_root = grade(jobs, out, settings, workers, progress)
    results = [graded.get(t.sub_index) if isinstance(t, Job) else t for t in taken]
    lost = sum(1 for r in results if r is None)
    results = [r for r in results if r is not None]
    if view.files:
        found = view.by_origin()
        for r in results:
            if r.file in found:
                r.late, r.student_name = found[r.file].late, found[r.file].name

    root = out / "nbgrader"
    if settings.db_url:
        register_assignments(root, sorted({j.notebook for j in jobs}), settings.db_url)
    merge_into_gradebook(root, results, lambda r: work_root / r.student_id, settings.db_url)
    (root / "gradebook.template.db").unlink(missing_ok=True)
    shutil.rmtree(work_root, ignore_errors=True)
    write_outputs(out, results, similarity_max_share)
    ok = sum(1 for r in results if r.status.startswith("ok"))
    where = f" (shard {shard[0]}/{shard[1]})" if shard else ""
    print(f"graded {ok} of {len(results)} submitted files{where} ({'sandboxed' if sandbox else 'UNSANDBOXED'}); "
          f"see {out / 'grades.csv'} and {out / 'reports'}", file=sys.stderr)
    return 0 if not lost else 1


# ---------------------------------------------------------------------------------------------
# Putting shards back together


def read_results(out: Path) -> list[Result]:
    """The rows an autograde run wrote to ``out/results.json``."""
    rows = json.loads((out / "results.json").read_text(encoding="utf-8"))
    results = []
    for row in rows:
        cells = [CellResult(**{k: v for k, v in c.items() if k != "passed"}) for c in row.pop("cells")]
        results.append(Result(**row, cells=cells))
    return results


def merge(shard_dirs: list[Path], out: Path, similarity_max_share: int = similarity.MAX_SHARE,
          db_url: str | None = None) -> int:
    """Combine the ``--out`` folders of sharded runs into ``out``: the CSVs, ``results.json``,
    reports, copy detection (over the whole class) and one gradebook with every student's
    submitted and autograded files: what one unsharded run writes. Returns the exit code."""
    out = Path(out).resolve()
    shard_dirs = [Path(d).resolve() for d in shard_dirs]
    missing = [str(d) for d in shard_dirs if not (d / "results.json").exists()]
    if missing:
        print("not the output of `python -m grader autograde` (no results.json): " + ", ".join(missing), file=sys.stderr)
        return 2
    if out in shard_dirs:
        print("--out must be a new folder, not one of the shards", file=sys.stderr)
        return 2
    results: list[Result] = []
    home: dict[tuple[str, str, str], Path] = {}
    for d in shard_dirs:
        for r in read_results(d):
            key = (r.student_id, r.notebook, r.file)
            if key in home:
                print(f"{r.student_id}/{r.file} is in two shards ({home[key].name}, {d.name}): "
                      "were they cut with the same N?", file=sys.stderr)
                return 1
            home[key] = d / "nbgrader"
            results.append(r)
    out.mkdir(parents=True, exist_ok=True)
    root = out / "nbgrader"
    notebooks = sorted({r.notebook for r in results if r.cells and not r.status.startswith("grading failed")})
    prepare_course(root, notebooks)
    if db_url:
        register_assignments(root, notebooks, db_url)
    merge_into_gradebook(root, results, lambda r: home[(r.student_id, r.notebook, r.file)], db_url)
    write_outputs(out, results, similarity_max_share)
    print(f"merged {len(shard_dirs)} shards: {len(results)} rows; see {out / 'grades.csv'}", file=sys.stderr)
    return 0
