"""The verdict outside the kernel: the grader judges what the student's code handed out.

Every exercise's check is declared by a spec (``course_utils.checks.spec``: a plan of keyed calls, the
runners that make them, and a judge over their outcomes), and nothing in the student's kernel decides a grade:

1. **Hand-off in** (:func:`prepare`, the :class:`PrepareHandOff` step): a private folder for the kernel's
   outputs, and a file of each judged exercise's plans, visible and hidden, built here from the specs (the
   hidden cases are inputs: not secret; expected outputs are, and never leave this process). Where every
   exercise of the notebook is judged outside, the sandbox shows the kernel the student edition of
   ``course_utils`` (no answers, no hidden cases, no known mistakes). :class:`MarkTests` starts each test
   cell with ``probe.begin("<test id>")``.
2. **In the kernel**: each check call runs the plan the grader sent in, with the one executor the
   self-check runs (``spec.execute``), and the cell's outcomes are written when it ends, by key
   (``course_utils.checks.wire``: JSON and raw tensor bytes), with the source of the function checked and
   the ATen operations of ``rules.WATCHED_OPS`` its code ran (``probe.OpRecorder``).
3. **Outside** (:class:`JudgeOutside`, after execution and before nbgrader's ``SaveAutoGrades``): the
   solution's test cell runs again in this process with each name it passes to a check bound to a
   :class:`HandedOut`, whose outcomes must be exactly the plan's keys; the spec's own judge then runs on
   them against the live reference, so the ✅ or ❌ message is the one the self-check prints. The verdict
   replaces the test cell's outputs; formgrader, ``cells.csv``, feedback and the gradebook read it as usual.
   A test whose code ran an operation its exercise's rule forbids scores 0 with the rule's message
   (:func:`forbidden_ran`), whatever its outcomes.

The hand-off is untrusted data (:func:`load_handed_out`): a link, a special file, a file over
``wire.MAX_BYTES``, a file not in the hand-off's format (``wire.read_hand_off`` says what it refuses), a
record that is not a plan's outcomes, a malformed outcome (``wire.value_problem``), an unknown, missing or
repeated key, outcomes of another plan, or a runner's data that no run gives (``spec.Forged``): each scores
0 for that test with the reason in its message (``HandOffError``), and the notebook's other tests still
count. Nothing is ever unpickled, and no class is ever taken from the kernel: only names.

An exercise checked with the notebook's other exercises (a spec's ``helpers``, ``modules.alone``) hands out
both tries of ``check_alone``, each record marked with its try; a kernel of the student edition, which has
none of the reference's helpers, makes the second alone, and :meth:`JudgeOutside.first_tries` makes the
first in a kernel of its own that holds only those helpers' answers (``grader/reference_subset.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import io
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

from course_utils.checks.wire import (DTYPES, MAX_BYTES, MAX_ELEMENTS, MAX_RECORDS, MAX_TENSORS,  # noqa: E402,F401
                                      read_hand_off)

#: ``ename`` of a test whose hand-off could not be used.
HANDOFF_ERROR = "HandOffError"
#: Marks the line the grader adds at the top of each judged test cell.
PROBE_MARK = "# (added by the grader: this test's outputs are handed out and judged outside the kernel)"

_made: list[str] = []  # folders made by prepare() in this process, removed at exit if still there


@functools.lru_cache(maxsize=1)
def spec_of_each() -> dict[str, Any]:
    """exercise -> its ``course_utils.checks.spec.Spec``, for each exercise declared by one."""
    from course_utils import checks

    return dict(checks.SPECS)


def judged_exercises(notebook: str | None) -> list[str]:
    """The exercises of ``notebook`` that are judged outside the kernel (each declared by a spec), in the
    notebook's order."""
    from grader import course

    return [e for e in course.EXERCISES.get(notebook or "", []) if e in spec_of_each()]


def student_edition_kernel(notebook: str | None) -> bool:
    """Whether ``notebook``'s kernel can run with the student edition: every exercise judged outside."""
    from grader import course

    exercises = course.EXERCISES.get(notebook or "", [])
    return bool(exercises) and all(e in spec_of_each() for e in exercises)


# --------------------------------------------------------------------------------------------
# 1. The hand-off in
# --------------------------------------------------------------------------------------------
@dataclass
class HandOff:
    """The folders of one notebook's hand-off: ``outputs`` (the kernel writes), ``inputs`` (the
    grader's file of hidden inputs), and the exercises judged."""

    notebook: str
    outputs: str
    inputs: str
    exercises: list[str]
    student_edition: bool
    #: A cut-down reference the kernel sees (``grader/reference_subset.py``): a kernel of first tries.
    reference: str = ""

    def remove(self) -> None:
        for folder in (self.outputs, str(Path(self.inputs).parent)):
            shutil.rmtree(folder, ignore_errors=True)
            if folder in _made:
                _made.remove(folder)


def prepare(notebook: str | None, reference: str = "") -> HandOff | None:
    """The hand-off of ``notebook``, or ``None`` when none of its exercises is judged outside. With
    ``reference`` (a file of :mod:`grader.reference_subset`), the kernel sees the student edition with that
    file as its reference: a kernel that makes ``check_alone``'s first tries."""
    import torch

    from course_utils.checks import expected, probe

    exercises = judged_exercises(notebook)
    if not exercises:
        return None
    outputs = tempfile.mkdtemp(prefix="grader-probe-")
    inputs_dir = tempfile.mkdtemp(prefix="grader-probe-inputs-")
    _made.extend([outputs, inputs_dir])
    os.chmod(outputs, 0o700)
    inputs = Path(inputs_dir) / "inputs.pt"
    specs = spec_of_each()
    with expected.using(expected.LIVE):  # the plans and hidden cases: inputs, never an expected output
        plans = {e: {"visible": probe.encode_plan(specs[e].steps(False)),
                     "hidden": probe.encode_plan(specs[e].steps(True))} for e in exercises}
    torch.save({"format": probe.FORMAT, "plans": plans}, inputs)
    return HandOff(notebook or "", outputs, str(inputs), exercises,
                   bool(reference) or student_edition_kernel(notebook), reference)


@atexit.register
def _remove_left_over() -> None:
    for folder in list(_made):
        shutil.rmtree(folder, ignore_errors=True)


class MarkTests(NbGraderPreprocessor):
    """Start every judged test cell with ``probe.begin("<test id>")``, so that the kernel files its
    outputs under that test. Runs before execution; the line is marked with :data:`PROBE_MARK`."""

    def preprocess(self, nb: NotebookNode, resources: dict):
        from grader import cells

        exercises = judged_exercises(resources.get("nbgrader", {}).get("notebook"))
        if exercises:
            for cell in nb.cells:
                if cell.cell_type == "code" and cells.is_test(cell) and \
                        cells.exercise_of_test(cells.grade_id(cell), exercises):
                    cell.source = (f"{PROBE_MARK}\nfrom course_utils.checks import probe as _course_probe; "
                                   f"_course_probe.begin({cells.grade_id(cell)!r})\n{cell.source}")
        return nb, resources


class PrepareHandOff(NbGraderPreprocessor):
    """Make the notebook's hand-off (:func:`prepare`) before it runs: ``resources["course_handoff"]``, which
    the execution step binds into the kernel's sandbox, and ``resources["course_unexecuted"]``, the notebook
    as it goes in (for a kernel of ``check_alone``'s first tries, :meth:`JudgeOutside.first_tries`).
    ``resources["course_first_try_reference"]``: the cut-down reference such a kernel sees."""

    def preprocess(self, nb: NotebookNode, resources: dict):
        handoff = prepare(resources.get("nbgrader", {}).get("notebook"),
                          reference=resources.get("course_first_try_reference", ""))
        if handoff is not None:
            resources["course_handoff"] = handoff
            resources["course_unexecuted"] = copy.deepcopy(nb)
        return nb, resources


# --------------------------------------------------------------------------------------------
# 2. Reading the hand-off: untrusted data
# --------------------------------------------------------------------------------------------
class BadHandOff(ValueError):
    """What a kernel handed out cannot be used; the message says why, in words."""


def load_handed_out(folder: str | Path, test_id: str) -> tuple[list[dict], dict[str, str], dict[str, list[str]]]:
    """``(records, sources, ops)`` that test ``test_id`` handed out, checked; :class:`BadHandOff` says why not.
    ``ops``: exercise -> the ATen operations its code ran in the kernel (``probe.ops_ran``; none handed out
    for an exercise: none of ``rules.WATCHED_OPS`` ran)."""
    from course_utils.checks import wire

    try:
        loaded = wire.read_file(folder, test_id)
    except wire.BadFile as exc:
        raise BadHandOff(str(exc)) from None
    return _check_file(loaded, test_id)


def _check_file(loaded: Any, test_id: str) -> tuple[list[dict], dict[str, str], dict[str, list[str]]]:
    from course_utils.checks import probe

    if not isinstance(loaded, dict) or not {"format", "test", "records", "sources"} <= set(loaded) \
            <= {"format", "test", "records", "sources", "ops"}:
        raise BadHandOff("the result does not have the hand-off's layout")
    if loaded["format"] != probe.FORMAT or loaded["test"] != test_id:
        raise BadHandOff(f"the result is not this test's (format {loaded['format']!r}, test {loaded['test']!r})")
    records = loaded["records"]
    if not isinstance(records, list) or len(records) > MAX_RECORDS:
        raise BadHandOff(f"the result's records are not a list of at most {MAX_RECORDS}")
    for i, record in enumerate(records):
        why = _record_problem(record)
        if why:
            raise BadHandOff(f"record {i + 1} is malformed: {why}")
    sources = loaded["sources"]
    if not (isinstance(sources, dict) and all(_is_name(k) and isinstance(v, str) and len(v) <= probe.MAX_SOURCE
                                              for k, v in sources.items())):
        raise BadHandOff("the sources handed out are not a mapping of exercise names to short texts")
    ops = loaded.get("ops", {})
    if not (isinstance(ops, dict) and len(ops) <= 64 and all(
            _is_name(k) and isinstance(v, list) and len(v) <= probe.MAX_OPS
            and all(isinstance(op, str) and 0 < len(op) <= 100 for op in v) for k, v in ops.items())):
        raise BadHandOff("the operations handed out are not a mapping of exercise names to short lists of names")
    return records, sources, ops


def _is_name(value: Any) -> bool:
    from course_utils.checks import wire

    return wire.is_name(value)


def _record_problem(record: Any) -> str | None:
    from course_utils.checks import probe

    if not isinstance(record, dict) or not isinstance(record.get("exercise"), str):
        return "not a record of an exercise"
    if record.get("callable") is False:
        return None if set(record) == {"exercise", "callable", "type"} and _is_name(record["type"]) \
            else "a non-callable record with other fields"
    if "plan" in record:
        return _plan_record_problem(record)
    return "a record that is not the outcomes of a plan"


def _plan_record_problem(record: dict) -> str | None:
    """What is wrong with the outcomes of a spec's plan (``spec.Spec.check`` in the kernel), if anything."""
    from course_utils.checks import probe, spec, wire

    if not set(record) - {"attempt"} == {"exercise", "plan", "outcomes"} or record["plan"] not in ("visible", "hidden"):
        return "the outcomes of a plan without the plan's name, or with other fields"
    if "attempt" in record and not (type(record["attempt"]) is int and record["attempt"] in probe.ATTEMPTS):
        return f"a try of check_alone other than {list(probe.ATTEMPTS)}"
    outcomes = record["outcomes"]
    if not (isinstance(outcomes, list) and len(outcomes) <= MAX_RECORDS):
        return f"the outcomes are not a list of at most {MAX_RECORDS}"
    keys = set()
    for item in outcomes:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and len(item[0]) <= spec.MAX_KEY
                and item[0] not in keys and isinstance(item[1], dict)):
            return "an outcome that is not [a key of its own, the outcome]"
        keys.add(item[0])
        outcome = item[1]
        if set(outcome) - {"changed"} not in ({"result"}, {"error"}):
            return f"expected a result or an error, got fields {sorted(map(str, outcome))}"
        changed = outcome.get("changed", [])
        if not (isinstance(changed, list) and len(changed) <= 64 and all(type(i) is int and 0 <= i < 64 for i in changed)):
            return "changed is not a list of argument positions"
        why = wire.error_problem(outcome["error"]) if "error" in outcome else wire.value_problem(outcome["result"])
        if why:
            return why
    return None


# --------------------------------------------------------------------------------------------
# 3. The replay, and the verdict
# --------------------------------------------------------------------------------------------
def _replay_miss() -> type:
    from course_utils.checks import probe

    return probe.ReplayMiss


class HandOffFailure(_replay_miss()):  # type: ignore[misc]
    """The replay met a missing, forged or extra output. A ``BaseException``
    (``course_utils.checks.probe.ReplayMiss``), so that the check engine (which turns a student's
    ``Exception`` into a verdict) lets it through to the judge; only a diagnose's own call that the
    replay cannot answer is stopped there (``core.explain``: no hint then)."""


def _replayed() -> type:
    from course_utils.checks import probe

    return probe.Replayed


# --------------------------------------------------------------------------------------------
# Modules: rebuilt from their handed-out parameters, with their outputs replayed
# --------------------------------------------------------------------------------------------


class HandedOut(_replayed()):  # type: ignore[misc]
    """Stands for a student's code whose check is a spec (``course_utils.checks.spec``): the check asks it
    for the outcomes of its plan (:meth:`outcomes`), in the order the test cell makes its check calls, and
    runs its judge on them. The outcomes must be exactly the plan's keys, the one the grader sent in: an
    unknown key, a missing one, or outcomes of another plan are a :class:`HandOffFailure`. It is never
    called: a judge that called the student's code would be reading what no plan asked for."""

    __course_source__: str | None = None

    def __init__(self, exercise: str, records: list[dict]):
        self.exercise = exercise
        self.records = records
        self.used = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise HandOffFailure(f"the check of {self.exercise} called the student's code outside its plan")

    def outcomes(self, plan: list, hidden: bool) -> Any:
        from course_utils.checks import spec

        which = "hidden" if hidden else "visible"
        if self.used >= len(self.records):
            raise HandOffFailure(f"no outcomes came back for the {which} check of {self.exercise} (the kernel "
                                 f"stopped before it, or the hand-off was changed)")
        record = self.records[self.used]
        self.used += 1
        if record.get("plan") != which:
            raise HandOffFailure(f"outcomes of another plan than the {which} check's of {self.exercise} came back "
                                 f"(the hand-off was changed)")
        data = dict(record["outcomes"])
        asked = {step.key for step in plan}
        if set(data) != asked:
            odd = sorted(set(data) ^ asked)[:3]
            raise HandOffFailure(f"the outcomes of {self.exercise} are not those of the calls the grader asked "
                                 f"for ({', '.join(map(repr, odd))}): the hand-off was changed")
        return spec.Outcomes(self.exercise, data, missing=HandOffFailure)


@dataclass
class Verdict:
    """A judged test: its printed lines, and its error (``None`` when it passed)."""

    text: str
    ename: str | None = None
    evalue: str = ""

    def outputs(self) -> list[NotebookNode]:
        found = []
        if self.text:
            found.append(NotebookNode(output_type="stream", name="stdout", text=self.text))
        if self.ename is not None:
            found.append(NotebookNode(output_type="error", ename=self.ename, evalue=self.evalue,
                                      traceback=[f"\x1b[0;31m{self.ename}\x1b[0m: {self.evalue}"]))
        return found


def handed_out_for(name: str, records: list[dict], source: str | None) -> Any:
    """What stands for the student's ``name`` outside the kernel: a :class:`HandedOut` of its records (none, for
    a function the test cell passes beside the exercise's, whose outcomes are steps of the exercise's plan), or,
    where the kernel found nothing callable under that name, an object of the type it found."""
    mine = [r for r in records if r["exercise"] == name]
    if mine and mine[0].get("callable") is False:
        return type(mine[0]["type"], (), {})()
    return type(f"HandedOut_{name}", (HandedOut,), {"__course_source__": source})(name, mine)


def _names_read(source: str) -> set[str]:
    """The names a test cell reads that are not builtins (the exercise, ``checks``, a companion function)."""
    import ast
    import builtins

    return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            and not hasattr(builtins, n.id)}


def judge_test(notebook: str, test_id: str, records: list[dict], sources: dict[str, str],
               first_tries: bool = True, ops: dict[str, list[str]] | None = None) -> Verdict:
    """Run the solution's test cell ``test_id`` with each judged exercise replayed from ``records``.

    ``sources``: exercise -> the source of the student's function: what the kernel handed out (the
    function it actually checked, wherever it was defined), else the answer cell's (read by the grader).
    It only feeds the rules and the diagnoses that read code, so a forged one can cost points, never
    earn them: the grader checks the answer cells' rules itself, whatever the kernel says.
    ``first_tries``: whether the kernel made ``modules.check_alone``'s first tries (``probe.replaying``).
    ``ops``: exercise -> the ATen operations its code ran in the kernel: where one of them is forbidden,
    the test fails with the rule's own message (:func:`forbidden_ran`), whatever its outputs; where the
    source already breaks a rule, the check says so first, as the kernel would."""
    import torch

    from course_utils import checks
    from course_utils.checks import expected, probe
    from grader import intake

    src = intake.load_source(notebook)
    exercises = judged_exercises(notebook)
    refused = forbidden_ran([src.tests[test_id].exercise], ops or {}, sources)  # its own exercise only
    if refused is not None:
        return refused
    source = src.tests[test_id].source
    given = (set(exercises) | _names_read(source)) - {"checks", "torch"}
    replays = {name: handed_out_for(name, records, sources.get(name)) for name in sorted(given)}
    namespace: dict[str, Any] = {"__name__": "__judge__", "checks": checks, "torch": torch, **replays}
    printed = io.StringIO()
    try:
        with expected.using(expected.LIVE), probe.replaying(first_tries), contextlib.redirect_stdout(printed):
            exec(compile(source, f"<{test_id}>", "exec"), namespace)  # noqa: S102 - the solution's own test
    except _replay_miss() as failure:  # a HandOffFailure, or a check's own refusal of a replayed outcome
        return Verdict(printed.getvalue(), HANDOFF_ERROR, _handoff_message(src.tests[test_id].exercise, str(failure)))
    except Exception as exc:  # noqa: BLE001 - the check's verdict, as a kernel would show it
        return Verdict(printed.getvalue(), type(exc).__name__, str(exc))
    extra = [f"{r.exercise}: {len(r.records) - r.used}" for r in replays.values()
             if isinstance(r, HandedOut) and r.used < len(r.records)]
    unknown = sorted({r["exercise"] for r in records} - set(replays))
    if extra or unknown:
        why = "more outputs came back than the test asked for (" + ", ".join(extra + unknown) + \
              "): the hand-off was changed"
        return Verdict("", HANDOFF_ERROR, _handoff_message(src.tests[test_id].exercise, why))
    return Verdict(printed.getvalue())


def forbidden_ran(exercises: list[str], ops: dict[str, list[str]], sources: dict[str, str]) -> Verdict | None:
    """The failure of a test whose code ran an operation its exercise's rule forbids (``ops``: exercise ->
    the ATen operations its code ran, ``probe.ops_ran``), with the rule's message as a check gives it
    (``core.check_rules``'s form); ``None`` when none did, or where the exercise's source (``sources``)
    breaks a rule as written: the replayed check says that, as it did in the kernel. Only ``exercises``
    are read (a test's own: what another exercise's code ran costs that exercise's tests)."""
    from course_utils import rules

    for exercise in exercises:
        found = rules.op_violations(exercise, ops.get(exercise, ()))
        if found and not rules.find_violations(sources.get(exercise) or "", exercise):
            why = rules.RULES[exercise].why
            lines = "; ".join(str(v) for v in found)
            return Verdict("", "CheckFailed", f"❌ {exercise}: {lines}. {why[:1].upper()}{why[1:]}".strip())
    return None


def judge_handed_out(folder: str | Path, notebook: str, test_id: str, answers: dict[str, str],
                     first_tries: bool = True) -> Verdict:
    """The verdict of test ``test_id`` from what the kernel handed out into ``folder``; ``answers``:
    exercise -> the answer cell's source; ``first_tries``: whether that kernel made ``check_alone``'s
    first tries. :class:`BadHandOff` when the hand-off cannot be used."""
    records, seen, ops = load_handed_out(folder, test_id)
    return judge_test(notebook, test_id, records, {**answers, **seen}, first_tries, ops)


def _handoff_message(exercise: str, why: str) -> str:
    return f"❌ {exercise}: this test scores 0: {why}."


def answer_sources(nb: NotebookNode, exercises: list[str]) -> dict[str, str]:
    """name -> its definition in the submission's answer cells (the last one of that name): each exercise's,
    and each other function or class an answer cell defines (a companion the test cell passes beside it)."""
    import ast

    from grader import intake

    found = {}
    for gid, index in intake.answer_cells(nb).items():
        cell = nb.cells[index].source
        if gid in exercises:
            found[gid] = intake.definition_of(cell, gid)[0]
        try:
            defined = [n.name for n in ast.parse(cell).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        except SyntaxError:
            defined = []
        for name in defined:
            if name != gid:
                found[name] = intake.definition_of(cell, name)[0]
    return found


def _code_lines(source: str) -> list[str]:
    """``source``'s lines without their trailing spaces, blank lines left out."""
    return [line.rstrip() for line in source.splitlines() if line.strip()]


def _names_any(nb: NotebookNode, answers: dict[str, int], names: list[str]) -> bool:
    """Whether a code cell of ``nb`` other than a test cell names one of ``names`` (the helpers an exercise may
    call), the helper's own answer cell (``answers``: grade id -> index) left out for its own name. Where none
    does, no code of the student's can look a helper up by name (``modules.helpers_used``), so a kernel of first
    tries would make the same try as the first kernel. Reading the cells can only spare that kernel, never earn
    an answer points: its verdict would be the same."""
    import re

    from grader import cells

    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or cells.is_test(cell):
            continue
        if any(answers.get(name) != index and re.search(rf"\b{re.escape(name)}\b", cell.source) for name in names):
            return True
    return False


@functools.lru_cache(maxsize=None)
def _released_stubs(notebook: str) -> dict[str, str]:
    """exercise -> its stub in the released student notebook (what an answer not yet written is)."""
    import nbformat

    from grader import course

    path = course.notebooks_dir() / f"{notebook}.ipynb"
    if not path.is_file():
        return {}
    return answer_sources(nbformat.read(path, as_version=4), judged_exercises(notebook))


def _through_last(nb: NotebookNode, test_ids: set[str]) -> NotebookNode:
    """``nb`` without the cells after the last of the test cells ``test_ids``: only those tests' verdicts are read
    from a kernel of first tries, and a cell cannot change what ran before it (a test's records are written
    when its cell ends). Notebook 09's test of TinyGPT, for one, is cell 36 of 81: the tests of train_step and
    generate, and the figures, come after it."""
    from grader import cells

    last = max((i for i, cell in enumerate(nb.cells) if cells.grade_id(cell) in test_ids), default=None)
    if last is not None:
        del nb.cells[last + 1:]
    return nb


class JudgeOutside(NbGraderPreprocessor):
    """Write the verdict of every judged test cell into its outputs, from what the kernel handed out
    (see the module docstring). Runs after execution, before ``SaveAutoGrades``."""

    def preprocess(self, nb: NotebookNode, resources: dict):
        from grader import cells, intake
        from grader.execute import CELL_TIMEOUT, KERNEL_DIED, NOTEBOOK_TIMEOUT

        notebook = resources.get("nbgrader", {}).get("notebook")
        exercises = judged_exercises(notebook)
        if not exercises:
            return nb, resources
        handoff: HandOff | None = resources.get("course_handoff")
        sources = answer_sources(nb, exercises)
        known = intake.load_source(notebook).tests
        failed: list[tuple[NotebookNode, str, str]] = []
        try:
            for cell in nb.cells:
                if cell.cell_type != "code" or not cells.is_test(cell):
                    continue
                test_id = cells.grade_id(cell)
                exercise = cells.exercise_of_test(test_id, exercises)
                if exercise is None or test_id not in known:
                    continue
                limits = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"
                          and o.get("ename") in (CELL_TIMEOUT, KERNEL_DIED, NOTEBOOK_TIMEOUT, "SystemExit")]
                try:
                    if handoff is None:
                        raise BadHandOff("the grader prepared no hand-off for this notebook")
                    # A student-edition kernel made no first tries: it had none of the reference's helpers.
                    verdict = judge_handed_out(handoff.outputs, notebook, test_id, sources,
                                               first_tries=not handoff.student_edition or bool(handoff.reference))
                except BadHandOff as exc:
                    kernel = [f"{o.get('ename')}: {o.get('evalue')}" for o in cell.get("outputs", [])
                              if o.get("output_type") == "error"]
                    said = f" (the kernel's own error: {kernel[-1][:300]})" if kernel else ""
                    verdict = Verdict("", HANDOFF_ERROR, _handoff_message(exercise, f"{exc}{said}"))
                except Exception as exc:  # noqa: BLE001 - a fault of the grader's own costs this test, said so
                    print(f"grader.judge: could not judge {notebook} {test_id}: {type(exc).__name__}: {exc}",
                          file=sys.stderr)
                    verdict = Verdict("", "GraderError", f"the grader could not judge this test "
                                                         f"({type(exc).__name__}: {exc}); ask your instructor")
                cell.outputs = (limits if verdict.ename == HANDOFF_ERROR else []) + verdict.outputs()
                if verdict.ename is not None:
                    failed.append((cell, test_id, exercise))
            if handoff is not None and handoff.student_edition and not handoff.reference and failed:
                self.first_tries(nb, resources, notebook, failed, sources)
        finally:
            if handoff is not None:
                handoff.remove()
        return nb, resources

    def first_tries(self, nb: NotebookNode, resources: dict, notebook: str,
                    failed: list[tuple[NotebookNode, str, str]], sources: dict[str, str]) -> None:
        """``modules.check_alone``'s first tries, for the ``failed`` tests (cell, test id, exercise) of
        exercises checked with helpers: a kernel with the student edition made only the second try (the
        student's own helpers), so the notebook runs once more in a kernel whose reference holds only
        those helpers' answers (:func:`grader.reference_subset.first_try_groups`), and that kernel's
        verdict of those tests replaces the first: a pass if either try passes, else the first try's
        message, as ``check_alone`` gives it. Nothing else of that kernel's is read, so the helpers'
        answers it holds earn nothing. Where its hand-off cannot be used (unreadable, or a test's records
        that do not replay), the first verdict stands."""
        from grader import intake, reference_subset
        from grader.execute import RobustExecute

        unexecuted = resources.get("course_unexecuted")
        if unexecuted is None:
            return
        stubs = _released_stubs(notebook)
        named = reference_subset.alone_helpers(notebook)
        cells_of = intake.answer_cells(nb)
        for exercises, helpers in reference_subset.first_try_groups(notebook):
            # An answer still the released stub raises NotImplementedError whatever helpers it is given, and
            # a notebook whose code never names the exercise's helpers makes the same first try as its second.
            mine = [(cell, test_id) for cell, test_id, exercise in failed if exercise in exercises
                    and _code_lines(sources.get(exercise, "")) != _code_lines(stubs.get(exercise, ""))
                    and _names_any(nb, cells_of, named.get(exercise, []))]
            if not mine:
                continue
            folder = tempfile.mkdtemp(prefix="grader-first-try-")
            again = {k: v for k, v in resources.items() if k not in ("course_handoff", "course_unexecuted")}
            try:
                again["course_first_try_reference"] = str(reference_subset.write_subset(helpers, Path(folder)))
                nb_again, again = PrepareHandOff(parent=self.parent, config=self.config).preprocess(
                    _through_last(copy.deepcopy(unexecuted), {test_id for _, test_id in mine}), again)
                RobustExecute(parent=self.parent, config=self.config).preprocess(nb_again, again)
                handoff: HandOff | None = again.get("course_handoff")
                for cell, test_id in mine:
                    try:
                        if handoff is None:
                            raise BadHandOff("the grader prepared no hand-off")
                        verdict = judge_handed_out(handoff.outputs, notebook, test_id, sources)
                    except BadHandOff:
                        continue  # the second try's verdict stands
                    except Exception as exc:  # noqa: BLE001 - a fault of the grader's own: the first verdict stands
                        print(f"grader.judge: could not judge the first try of {notebook} {test_id}: "
                              f"{type(exc).__name__}: {exc}", file=sys.stderr)
                        continue
                    if verdict.ename == HANDOFF_ERROR:
                        continue  # records of that kernel's that do not replay: the second try's verdict stands
                    cell.outputs = verdict.outputs()
            finally:
                if again.get("course_handoff") is not None:
                    again["course_handoff"].remove()
                shutil.rmtree(folder, ignore_errors=True)
