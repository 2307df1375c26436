"""One declarative spec per exercise: a plan of calls, run in the kernel, judged as plain data.

A :class:`Spec` says everything a check of one exercise does with the student's code:

- its **plan**: every call the check makes to the student's code, each a :class:`Step` with a key of
  its own and plain-data inputs (a :class:`~course_utils.checks.core.Case`), the visible cases and,
  with ``hidden=True``, the hidden ones too;
- its **runners**: how the kernel runs a step that is more than ``student(*args, **kwargs)`` (a module
  built and run under the check's seed, a trace of what the code did), each a function of the
  student's code and the step's case that returns plain data;
- its **judge**: a function of the plan and the :class:`Outcomes` (the value or the error each step
  gave, by key) that returns the ✅ line's text or raises the ❌ message (``core.fail``).

Every runtime is derived from it (:meth:`Spec.check`):

- **self-check** (JupyterLab, Colab, nbval, the instructor's runs): build the plan, run it on the
  student's code, judge the outcomes, here in the kernel;
- **under the grader, in the kernel**: run the plan *the grader sent in* (it holds the hidden cases,
  ``probe.plan``) with the same executor, and hand the outcomes out by key; nothing is judged there;
- **under the grader, outside**: the grader binds the exercise's name to its stand-in of what was
  handed out (a ``probe.Replayed``, ``grader/judge.py``'s ``HandedOut``), whose :meth:`outcomes` refuses
  unknown keys and treats a missing key as a ``HandOffError``; the same judge then runs on them.

Outcomes always travel through :mod:`course_utils.checks.wire` (encoded, then decoded), in the
self-check too, so that the judge reads the same data in all three places and gives the same messages.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from course_utils.checks import core, modules, wire
from course_utils.checks import probe as _probe
from course_utils.checks.core import Case

#: How the kernel runs a step: ``runner(student, case) -> plain data`` (what :func:`wire.encode` takes).
Runner = Callable[[Any, Case], Any]
#: The judge: ``judge(plan, outcomes) -> the ✅ line's text``; raises ``core.CheckFailed`` on a mistake.
Judge = Callable[["list[Step]", "Outcomes"], str]

#: The built-in runner: ``student(*case.args, **case.kwargs)`` on copies of the tensor arguments.
CALL = "call"
#: Longest key of a step, in characters.
MAX_KEY = 300


class Forged(_probe.ReplayMiss):
    """An outcome that no honest run of the plan gives: a runner's plain data of the wrong shape or type.
    Only a kernel that was tampered with hands one out (the student controls it), so the grader scores the
    test 0 and says why (``HandOffError``). A ``BaseException``, as ``probe.ReplayMiss`` is: the check
    engine, which turns a student's ``Exception`` into a verdict, lets it through."""


def refuse(exercise: str, what: str) -> None:
    """Raise :class:`Forged`: ``what`` came back from ``exercise``'s runner in a form no run gives."""
    raise Forged(f"what came back from {exercise}'s {what} is not what the plan's run gives: the hand-off was changed")


@dataclass(frozen=True)
class Step:
    """One call the check makes to the student's code: ``key`` names it in the outcomes (unique in its
    plan), ``case`` holds its inputs (plain data: tensors, numbers, strings, tuples, module layouts), and
    ``run`` says how the kernel runs it (:data:`CALL`, or a runner of the spec's)."""

    key: str
    case: Case
    run: str = CALL


def calls(cases: Sequence[Case], prefix: str = "") -> list[Step]:
    """One :data:`CALL` step per case, keyed by the case's name (``prefix`` before it, for a second set of
    calls on the same cases)."""
    return [Step(f"{prefix}{case.key()}", case) for case in cases]


class Outcomes(Mapping):
    """What each step of a plan gave, by key: the decoded value (:func:`wire.decode`), or the exception it
    raised (:func:`wire.error_of`: same type name and message), never raised here.

    Reading a key the plan does not hold is an error of the spec's (``missing``: ``KeyError`` in a
    self-check; the grader's ``HandOffFailure``, a ``HandOffError`` for that test). Every key read is
    noted in :attr:`read` (the plan-covers-judge test holds them against the plan)."""

    def __init__(self, exercise: str, data: Mapping[str, dict], missing: type[BaseException] = KeyError):
        self.exercise = exercise
        self._data = dict(data)
        self._missing = missing
        self.read: set[str] = set()
        #: The student's code (or the grader's stand-in for it, which carries its source): for the
        #: diagnoses that read the code, never to be called.
        self.student: Any = None

    def _outcome(self, key: str) -> dict:
        self.read.add(key)
        if key not in self._data:
            raise self._missing(f"no outcome came back for {self.exercise}'s call {key!r}")
        return self._data[key]

    def __getitem__(self, key: str) -> Any:
        outcome = self._outcome(key)
        if "error" in outcome:
            return wire.error_of(outcome["error"]["type"], outcome["error"]["message"])
        return wire.decode(outcome["result"])

    def changed(self, key: str) -> list[int]:
        """The positions of the tensor arguments the call changed in place."""
        return list(self._outcome(key).get("changed", []))

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def _same(before: torch.Tensor, after: Any) -> bool:
    return isinstance(after, torch.Tensor) and before.dtype == after.dtype and before.shape == after.shape \
        and (before.device.type == "meta" or torch.equal(before, after.to(before.device)))


def run_step(exercise: str, step: Step, student: Any, runners: Mapping[str, Runner]) -> dict:
    """Run one step on the student's code and return its outcome as plain data: ``{"result": value}`` or
    ``{"error": {"type", "message"}}``, and ``"changed"``: the positions of the tensor arguments a
    :data:`CALL` changed in place. The only place a spec's calls run."""
    case = step.case
    args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in case.args)
    outcome: dict[str, Any] = {}
    try:
        with _probe._watching(exercise):
            if step.run == CALL:
                returned = student(*args, **case.kwargs)
            else:
                returned = runners[step.run](student, Case(case.name, args, dict(case.kwargs), build=case.build,
                                                           mode=case.mode))
        outcome["result"] = wire.encode(returned)
    except Exception as exc:  # noqa: BLE001 - an error in student code is an outcome
        outcome["error"] = wire.error_data(exc)
    if step.run == CALL:
        changed = [i for i, (old, new) in enumerate(zip(case.args, args))
                   if isinstance(old, torch.Tensor) and not _same(old, new)]
        if changed:
            outcome["changed"] = changed
    return outcome


def execute(exercise: str, plan: Sequence[Step], student: Any, runners: Mapping[str, Runner]) -> dict[str, dict]:
    """Every step of ``plan`` run in order (:func:`run_step`): key -> outcome, as plain data."""
    return {step.key: run_step(exercise, step, student, runners) for step in plan}


@dataclass
class Spec:
    """An exercise's whole check, declared once (see the module docstring).

    ``plan(hidden)`` gives the steps (:func:`calls` makes them for a function exercise: :func:`function_spec`).
    ``helpers()``: the other exercises of the notebook the student's code may call, each name -> its check
    (``modules.helper_checks``); the check then runs with the reference's versions of them
    (``modules.alone``), so that a wrong helper costs only the helper's points."""

    exercise: str
    plan: Callable[[bool], list[Step]]
    judge: Judge
    runners: dict[str, Runner] = field(default_factory=dict)
    helpers: Callable[[], dict[str, Callable]] | None = None

    def steps(self, hidden: bool) -> list[Step]:
        """The plan, checked: unique keys of at most :data:`MAX_KEY` characters, runners the spec has."""
        found = self.plan(hidden)
        keys = [s.key for s in found]
        if len(set(keys)) != len(keys) or any(len(k) > MAX_KEY for k in keys):
            raise ValueError(f"the plan of {self.exercise} has a key twice or one too long: {keys}")
        unknown = {s.run for s in found} - {CALL} - set(self.runners)
        if unknown:
            raise ValueError(f"the plan of {self.exercise} names runners it does not have: {sorted(unknown)}")
        return found

    def check(self, student: Any, hidden: bool = False) -> None:
        """The self-check, the kernel's part under the grader, or the grader's judgement: see the module
        docstring."""
        if self.helpers is not None:
            modules.alone(self.exercise, student, self.helpers(), lambda: self.judged(student, hidden),
                          lambda: self.hand_out(student, hidden))
        elif _probe.active(self.exercise):
            self.hand_out(student, hidden)
        else:
            self.judged(student, hidden)

    def hand_out(self, student: Any, hidden: bool) -> None:
        """In the kernel, under the grader: run the plan the grader sent in, hand the outcomes out."""
        exercise = self.exercise
        store = _probe._start(exercise, student)
        if store is None:  # nothing callable: that is handed out instead
            return
        plan = [Step(*step) for step in _probe.plan(exercise, hidden)]
        outcomes = execute(exercise, plan, student, self.runners)
        store.append(_probe._mark({"exercise": exercise, "plan": "hidden" if hidden else "visible",
                                   "outcomes": [[key, outcome] for key, outcome in outcomes.items()]}))
        _probe._handed(_probe._current[0])

    def judged(self, student: Any, hidden: bool) -> None:
        """The verdict, printed (✅) or raised (❌): on the outcomes of running the plan here, or, in the
        grader (``student`` is its ``probe.Replayed`` stand-in), on those the kernel handed out."""
        exercise = self.exercise
        core.require_callable(exercise, student)
        core.check_rules(exercise, student)
        plan = self.steps(hidden)
        if isinstance(student, _probe.Replayed):
            outcomes = student.outcomes(plan, hidden)
        else:
            outcomes = Outcomes(exercise, execute(exercise, plan, student, self.runners))
        outcomes.student = student
        core.passed(exercise, self.judge(plan, outcomes))


def declare(spec: Spec, doc: str) -> Callable[..., None]:
    """The public ``check_<exercise>(student, hidden=False)`` of ``spec``, with the docstring ``doc``; the
    spec is its attribute ``spec`` (the grader and the tests find it there)."""
    def check(student: Any, hidden: bool = False) -> None:
        spec.check(student, hidden)

    check.__name__ = check.__qualname__ = f"check_{spec.exercise}"
    check.__doc__ = doc
    check.spec = spec  # type: ignore[attr-defined]
    return core.check(check)


def with_hidden(exercise: str, visible: Callable[[], list[Case]]) -> Callable[[bool], list[Case]]:
    """``cases(hidden)``: the visible cases, and the exercise's hidden ones after them when ``hidden``."""
    def cases(hidden: bool) -> list[Case]:
        return visible() + (list(core.hidden_cases(exercise)) if hidden else [])
    return cases


# --------------------------------------------------------------------------------------------
# Functions: every case called, each outcome compared with the reference's
# --------------------------------------------------------------------------------------------
def raised(exercise: str, error: BaseException, case: Case | None) -> core.CheckFailed:
    """The failure for a case whose call raised ``error`` (``core.call_student``'s words)."""
    if isinstance(error, NotImplementedError):
        return core.CheckFailed(f"❌ {exercise}: {core.NOT_IMPLEMENTED}")
    said = str(error).strip()
    said += "" if said.endswith((".", "!", "?")) or not said else "."  # a hint may follow
    where = f" on case '{case.name}'" if case is not None else ""
    failed = core.CheckFailed(f"❌ {exercise}{where}: your code raised {type(error).__name__}: {said}")
    failed.student_error = error  # type: ignore[assignment]
    return failed


def judge_case(exercise: str, got: Any, changed: Sequence[int], want: Any, case: Case, *, atol: float = 1e-5,
               rtol: float = 1e-4, diagnose: core.Diagnose | None = None) -> None:
    """Fail if one call's outcome ``got`` (a value, or the exception it raised) is not ``want``, or if the
    call changed its input (``changed``); the message ends with a hint where one is found (``core.explain``)."""
    if isinstance(got, BaseException):
        failed = raised(exercise, got, case)
        raise core._hinted(failed, core.explain(exercise, case, got, want, diagnose)) from None
    if changed:
        core.fail(exercise, "your code changed its input tensor in place; work on a copy instead", case)
    problem = core._difference(want, got, atol, rtol)
    if problem:
        try:
            core.fail(exercise, f"{core._sentence(problem)} {core.describe_inputs(case.args)}.", case)
        except core.CheckFailed as error:
            raise core._hinted(error, core.explain(exercise, case, got, want, diagnose)) from None


def expected_output(exercise: str, case: Case, reference: str | None = None) -> Any:
    """The reference's output on ``case`` (:func:`expected.expect`: live, or recorded in the student edition);
    while recording, the known mistakes' outputs on it too (``core.mistake_outputs``)."""
    from course_utils.checks import expected

    ref = core.reference_function(reference or exercise)
    want = expected.expect(exercise, case.key(), lambda: ref(*core._clone(case.args), **case.kwargs))
    if expected.is_recording():
        core.mistake_outputs(exercise, case)
    return want


def compare_outcomes(exercise: str, plan: Sequence[Step], outcomes: Outcomes, *, reference: str | None = None,
                     atol: float = 1e-5, rtol: float = 1e-4, diagnose: core.Diagnose | None = None,
                     diagnose_for: Callable[[Any], core.Diagnose] | None = None) -> str:
    """The judge of a function exercise: each :data:`CALL` step's outcome against the reference's output
    on its case, in the plan's order; the ✅ line's text when all agree. ``diagnose_for(student)``: a
    diagnose that reads the student's code (``outcomes.student``), instead of ``diagnose``."""
    if diagnose_for is not None:
        diagnose = diagnose_for(outcomes.student)
    steps = [s for s in plan if s.run == CALL]
    for step in steps:
        want = expected_output(exercise, step.case, reference)
        judge_case(exercise, outcomes[step.key], outcomes.changed(step.key), want, step.case,
                   atol=atol, rtol=rtol, diagnose=diagnose)
    return f"{len(steps)} cases agree with the reference ({'; '.join(s.case.name for s in steps)})"


def function_spec(exercise: str, visible: Callable[[], list[Case]], *, reference: str | None = None,
                  atol: float = 1e-5, rtol: float = 1e-4, diagnose: core.Diagnose | None = None,
                  diagnose_for: Callable[[Any], core.Diagnose] | None = None,
                  helpers: Callable[[], dict[str, Callable]] | None = None) -> Spec:
    """The spec of a function exercise: each case called once (visible, then hidden), each outcome
    compared with the reference's (:func:`compare_outcomes`)."""
    cases = with_hidden(exercise, visible)
    return Spec(exercise, lambda hidden: calls(cases(hidden)),
                functools.partial(compare_outcomes, exercise, reference=reference, atol=atol, rtol=rtol,
                                  diagnose=diagnose, diagnose_for=diagnose_for), helpers=helpers)
