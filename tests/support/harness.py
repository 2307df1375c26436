"""Run a solution notebook's code in this process, so hidden tests can be tried on many answers fast.

nbgrader runs the same cells in a kernel; here we exec them in a dict namespace. Cell sources are
registered in ``linecache`` so that ``inspect.getsource`` (used by the rule checks) works as it
does in Jupyter.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import os
import sys
from pathlib import Path

import nbformat

from grader import cells as nbcells
from grader import course

grade_id = nbcells.grade_id


def test_ids_for(exercise: str, grade_ids, notebook: str | None = None) -> list[str]:
    """The test-cell grade ids of an exercise (``test_<exercise>``, ``test_<exercise>_*``), by the
    grader's own rule (:func:`grader.cells.exercise_of_test`: the longest exercise name wins)."""
    if notebook is not None:
        exercises = course.EXERCISES[notebook]
    else:
        exercises = [e for names in course.EXERCISES.values() for e in names]
    return nbcells.tests_of(exercise, grade_ids, exercises)


def solution_notebook(notebook: str) -> nbformat.NotebookNode:
    return nbformat.read(course.solutions_dir() / f"{notebook}.ipynb", as_version=4)


def run_source(source: str, namespace: dict, label: str) -> None:
    """Exec ``source`` in ``namespace`` under a file name that ``inspect`` can read back."""
    filename = f"<cell {label}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - the course's own cells


@contextlib.contextmanager
def _under_grader():
    old = os.environ.get("NBGRADER_EXECUTION")
    os.environ["NBGRADER_EXECUTION"] = "autograde"
    try:
        yield
    finally:
        if old is None:
            del os.environ["NBGRADER_EXECUTION"]
        else:
            os.environ["NBGRADER_EXECUTION"] = old


@functools.lru_cache(maxsize=None)
def _executed(notebook: str) -> tuple[dict, dict]:
    from course_utils.checks import expected

    nb = solution_notebook(notebook)
    namespace: dict = {"__name__": "__main__"}
    cells: dict = {}
    # As graded: live expectations, hidden tests included, and NBGRADER_EXECUTION set, so the
    # notebooks skip what no graded cell needs (training, timing sweeps), as they do under nbgrader.
    with expected.using(expected.LIVE), _under_grader():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            gid = grade_id(cell) or f"{index}"
            cells[gid] = cell.source
            run_source(cell.source, namespace, f"{notebook}:{gid}")
    import matplotlib.pyplot as plt

    plt.close("all")
    return namespace, cells


def exercises(notebook: str) -> list[str]:
    """Answer-cell grade ids of a notebook, in order."""
    nb = solution_notebook(notebook)
    return [grade_id(c) for c in nb.cells
            if c.get("metadata", {}).get("nbgrader", {}).get("solution") and grade_id(c)]


def visible_source(test_source: str) -> str:
    """A test cell as the student edition has it: nbgrader's own ``ClearHiddenTests`` removes the
    hidden-test region."""
    from nbformat.v4 import new_code_cell
    from nbgrader.preprocessors import ClearHiddenTests

    cell = new_code_cell(test_source)
    ClearHiddenTests()._remove_hidden_test_region(cell)
    return cell.source


def check_verdict(notebook: str, exercise: str, answer_source: str) -> tuple[bool, str]:
    """``(passed, message)`` of the exercise's visible test cells on ``answer_source``: what a
    student's self-check shows. ``message`` is the ✅ lines printed, or the error raised."""
    import contextlib
    import io

    base, cells = _executed(notebook)
    namespace = dict(base)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            run_source(answer_source, namespace, f"{notebook}:{exercise}:answer")
            for gid in test_ids_for(exercise, cells, notebook):
                run_source(visible_source(cells[gid]), namespace, f"{notebook}:{gid}:visible")
    except Exception as error:  # noqa: BLE001 - the verdict is the result
        return False, f"{type(error).__name__}: {error}"
    return True, out.getvalue()


@contextlib.contextmanager
def executions(log: list, replay: bool, earlier: list | None = None):
    """Inside the block, every run of a spec's plan (``spec.execute``: the one place a check runs the student's code)
    is written to ``log`` or, with ``replay``, taken back from it (the first run of the same exercise on the same
    plan) instead of run again.

    For ``tests/checks/test_parity.py``, which runs the same answer's self-check twice, live then recorded, to show
    that the recorded verdict and message are the live ones. Running the student's code is the same in both (a plan
    is plain data), so the recorded run judges the live run's outcomes, as the grader judges what a kernel handed
    out. A run that asked ``expected`` for anything (a runner that reads a recorded value, or the reference) is run
    again: its outcomes may depend on the edition. So is a plan the live check did not run on the same inputs
    (:func:`_same_plan`): a check's own caches may differ between the editions (a helper's verdict, say). Runs
    inside an ``expected.expect`` (the reference's, for a value the recorded check reads from the recording
    instead) are neither logged nor replayed.

    ``earlier``: runs of the same answer logged before (:func:`runs_of`: its test cells', in :func:`test_verdicts`);
    without ``replay``, a run of the same exercise on the same plan is taken from there instead of run again."""
    from course_utils.checks import expected, spec

    original, original_mode = spec.execute, expected.mode
    asked = [0]

    def counting_mode() -> str:
        asked[0] += 1
        return original_mode()

    def computing() -> bool:
        """Whether ``expected.expect`` is on the stack (however a module imported it)."""
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code is expected.expect.__code__:
                return True
            frame = frame.f_back
        return False

    def recording(exercise, plan, student, runners, tracebacks=None):
        if computing():  # the reference's run, for an expected value: the recorded check reads that value
            return original(exercise, plan, student, runners, tracebacks)
        taken = _take(earlier or [], exercise, plan)
        if taken is not None:
            log.append((exercise, list(plan), taken[0], {}))
            return dict(taken[0])
        before = asked[0]
        outcomes = original(exercise, plan, student, runners, tracebacks)
        log.append((exercise, list(plan), None if asked[0] != before else outcomes, dict(tracebacks or {})))
        return outcomes

    def replaying(exercise, plan, student, runners, tracebacks=None):
        taken = _take(log, exercise, plan)
        if taken is None:  # not run live so: run it now
            return original(exercise, plan, student, runners, tracebacks)
        if tracebacks is not None:
            tracebacks.update(taken[1])
        return dict(taken[0])

    spec.execute = replaying if replay else recording
    expected.mode = counting_mode
    try:
        yield log
    finally:
        spec.execute, expected.mode = original, original_mode


def _take(entries: list, exercise: str, plan) -> tuple[dict, dict] | None:
    """``(outcomes, tracebacks)`` of the first run in ``entries`` (:func:`executions`' log) of ``exercise`` on the
    same ``plan`` that may be judged again (it asked ``expected`` for nothing), removed from ``entries``; ``None``."""
    for index, (was, steps, outcomes, where) in enumerate(entries):
        if was == exercise and outcomes is not None and _same_plan(steps, plan):
            del entries[index]
            return outcomes, where
    return None


def _same_plan(a, b) -> bool:
    """Whether two plans (lists of ``spec.Step``) are the same steps with the same inputs."""
    import torch

    def same(x, y) -> bool:
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and \
                x.device == y.device and (x.device.type == "meta" or torch.equal(x, y))
        if isinstance(x, (list, tuple)):
            return type(x) is type(y) and len(x) == len(y) and all(same(i, j) for i, j in zip(x, y))
        if isinstance(x, dict):
            return isinstance(y, dict) and x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
        if isinstance(x, torch.nn.Module):  # a case's module (count_parameters'): the same layout and values
            return type(x) is type(y) and same(list(x.named_parameters()), list(y.named_parameters())) and \
                same(list(x.named_buffers()), list(y.named_buffers())) and \
                [p.requires_grad for p in x.parameters()] == [p.requires_grad for p in y.parameters()]
        if hasattr(x, "__dataclass_fields__"):
            return type(x) is type(y) and all(same(getattr(x, f), getattr(y, f)) for f in x.__dataclass_fields__)
        return type(x) is type(y) and x == y

    return same(list(a), list(b))


def run_tests_with_answer(notebook: str, exercise: str, answer_source: str) -> None:
    """Exec ``answer_source`` in place of the exercise's answer, then its test cells (hidden tests
    included). Raises whatever the first failing test cell raises."""
    base, cells = _executed(notebook)
    namespace = dict(base)
    run_source(answer_source, namespace, f"{notebook}:{exercise}:answer")
    tests = test_ids_for(exercise, cells, notebook)
    if not tests:
        raise LookupError(f"{notebook}: no test cells for exercise {exercise!r}")
    for gid in tests:
        run_source(cells[gid], namespace, f"{notebook}:{gid}")


@functools.lru_cache(maxsize=None)
def test_verdicts(notebook: str, exercise: str, answer_source: str) -> tuple[tuple[str, Exception | None], ...]:
    """``(test id, what its cell raised or None)`` for every test cell of the exercise (hidden tests
    included), each run whatever the cells before it did, with ``answer_source`` in place of the answer:
    the verdicts as a kernel with the instructor edition decides them. An answer cell that raises
    raises here.

    Kept for the process: ``tests/grader_answers/test_hidden_tests.py`` (is each wrong answer rejected,
    each right one passed?) and ``test_judge.py`` (is the verdict outside the kernel's?) ask for the
    same answers, and ``conftest.py`` (``SHARED_WORKER``) runs the two files in one worker, so each answer's test
    cells run once for both."""
    base, cells = _executed(notebook)
    namespace = dict(base)
    run_source(answer_source, namespace, f"{notebook}:{exercise}:answer")
    found, made, runs = [], [], []
    with _noting_outcomes(made), executions(runs, replay=False):
        for gid in test_ids_for(exercise, cells, notebook):
            try:
                run_source(cells[gid], namespace, f"{notebook}:{gid}")
                found.append((gid, None))
            except Exception as exc:  # noqa: BLE001 - the verdict
                exc.__traceback__ = None  # the frames (and their tensors) are not kept
                found.append((gid, exc))
    _RUNS[(notebook, exercise, answer_source)] = tuple((was, steps, outcomes, {}) for was, steps, outcomes, _ in runs)
    _PLANS_READ[(notebook, exercise, answer_source)] = tuple(
        (outcomes.exercise, outcomes.hidden, frozenset(outcomes), frozenset(outcomes.read)) for outcomes in made)
    return tuple(found)


#: ``(notebook, exercise, answer) -> the runs of plans`` (:func:`executions`' log, without tracebacks) of the test
#: cells of :func:`test_verdicts`.
_RUNS: dict[tuple[str, str, str], tuple] = {}


def runs_of(notebook: str, exercise: str, answer_source: str) -> list:
    """The plans the test cells of :func:`test_verdicts` ran on ``answer_source`` and what each gave (empty where
    they have not run in this process): for :func:`executions`' ``earlier``."""
    return list(_RUNS.get((notebook, exercise, answer_source), ()))


#: ``(notebook, exercise, answer) -> ((exercise, hidden, the plan's keys, the keys its judge read), ...)``, one
#: entry per spec check that judged in the test cells of :func:`test_verdicts`.
_PLANS_READ: dict[tuple[str, str, str], tuple[tuple[str, bool, frozenset, frozenset], ...]] = {}


def plans_read(notebook: str, exercise: str, answer_source: str) -> tuple[tuple[str, bool, frozenset, frozenset], ...]:
    """For each spec check the test cells of :func:`test_verdicts` judged (visible and hidden plans, each try of
    ``modules.alone``): ``(exercise, whether the plan was the hidden one, the keys its plan made, the keys its
    judge read)``."""
    test_verdicts(notebook, exercise, answer_source)
    return _PLANS_READ[(notebook, exercise, answer_source)]


@contextlib.contextmanager
def _noting_outcomes(made: list):
    """Every ``spec.Outcomes`` made in the block is appended to ``made`` (what its judge read is on it)."""
    from course_utils.checks import spec

    original = spec.Outcomes.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)

    spec.Outcomes.__init__ = init
    try:
        yield
    finally:
        spec.Outcomes.__init__ = original


def read_grading(out: Path) -> tuple[dict, dict]:
    """A grading output folder's ``grades.csv`` rows by ``(student_id, notebook)``, and its
    ``cells.csv`` rows by ``(student_id, notebook)`` then ``grade_id``."""
    import csv
    from collections import defaultdict

    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        grades = {(r["student_id"], r["notebook"]): r for r in csv.DictReader(f)}
    cells: dict = defaultdict(dict)
    with open(out / "cells.csv", newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            cells[(r["student_id"], r["notebook"])][r["grade_id"]] = r
    return grades, cells
