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
        #: Whether these are the outcomes of the hidden plan (set with the plan they answer): a judge that reads
        #: the hidden cases' names or groups asks for them again from the instructor edition, which has them.
        self.hidden = False
        #: key -> the traceback of the error a step raised, where the step ran in this process (a self-check):
        #: the failure then shows the student's own lines (``core.CheckFailed._render_traceback_``).
        self.tracebacks: dict[str, Any] = {}

    def _outcome(self, key: str) -> dict:
        self.read.add(key)
        if key not in self._data:
            raise self._missing(f"no outcome came back for {self.exercise}'s call {key!r}")
        return self._data[key]

    def __getitem__(self, key: str) -> Any:
        outcome = self._outcome(key)
        if "error" in outcome:
            error = wire.error_of(outcome["error"]["type"], outcome["error"]["message"])
            where = self.tracebacks.get(key)  # in a self-check: where the student's code raised it
            return error.with_traceback(where) if where is not None else error
        return wire.decode(outcome["result"])

    def changed(self, key: str) -> list[int]:
        """The positions of the tensor arguments the call changed in place."""
        return list(self._outcome(key).get("changed", []))

    def __contains__(self, key: object) -> bool:
        """Whether the plan made ``key`` (asking is not reading it)."""
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def _same(before: torch.Tensor, after: Any) -> bool:
    """Whether a call left its tensor argument as it was (NaN where there was NaN counts as unchanged)."""
    if not (isinstance(after, torch.Tensor) and before.dtype == after.dtype and before.shape == after.shape):
        return False
    if before.device.type == "meta":
        return True
    after = after.to(before.device)
    if before.is_floating_point() or before.is_complex():
        return bool(torch.all((before == after) | (torch.isnan(before) & torch.isnan(after))))
    return torch.equal(before, after)


def run_step(exercise: str, step: Step, student: Any, runners: Mapping[str, Runner],
             tracebacks: dict | None = None) -> dict:
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
        if tracebacks is not None:
            tracebacks[step.key] = exc.__traceback__
    if step.run == CALL:
        changed = [i for i, (old, new) in enumerate(zip(case.args, args))
                   if isinstance(old, torch.Tensor) and not _same(old, new)]
        if changed:
            outcome["changed"] = changed
    return outcome


def execute(exercise: str, plan: Sequence[Step], student: Any, runners: Mapping[str, Runner],
            tracebacks: dict | None = None) -> dict[str, dict]:
    """Every step of ``plan`` run in order (:func:`run_step`): key -> outcome, as plain data; ``tracebacks``
    (a self-check's) receives where each error was raised."""
    return {step.key: run_step(exercise, step, student, runners, tracebacks) for step in plan}


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

    def verdict(self, plan: Sequence[Step], outcomes: "Outcomes") -> str:
        """The judge's verdict on ``outcomes`` of ``plan``, given the plan without a ladder's rungs: the rungs are
        read by ``ladder.diagnose`` (by key, after a failure), never judged as cases."""
        return self.judge([step for step in plan if not is_rung(step)], outcomes)

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
            tracebacks: dict[str, Any] = {}
            outcomes = Outcomes(exercise, execute(exercise, plan, student, self.runners, tracebacks))
            outcomes.tracebacks = tracebacks
        outcomes.student, outcomes.hidden = student, hidden
        core.passed(exercise, self.verdict(plan, outcomes))


#: The start of a ladder's rung's key (:mod:`course_utils.checks.ladder` makes the rungs; the judge never sees them).
RUNG_PREFIX = "ladder: "


def is_rung(step: Any) -> bool:
    """Whether a plan's step (or a step's key) is a ladder's rung (:meth:`Spec.verdict` leaves them out)."""
    return str(step if isinstance(step, str) else getattr(step, "key", "")).startswith(RUNG_PREFIX)


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
    if core.is_stub_error(error):
        return core.CheckFailed(f"❌ {exercise}: {core.NOT_IMPLEMENTED}")
    said = str(error).strip()
    said += "" if said.endswith((".", "!", "?")) or not said else "."  # a hint may follow
    where = f" on case '{case.name}'" if case is not None else ""
    failed = core.CheckFailed(f"❌ {exercise}{where}: your code raised {type(error).__name__}: {said}")
    failed.student_error = error  # type: ignore[assignment]
    return failed


def judge_case(exercise: str, got: Any, changed: Sequence[int], want: Any, case: Case, *, atol: float = 1e-5,
               rtol: float = 1e-4, diagnose: core.Diagnose | None = None,
               smallest: Callable[[], str | None] = lambda: None) -> None:
    """Fail if one call's outcome ``got`` (a value, or the exception it raised) is not ``want``, or if the
    call changed its input (``changed``); the message ends with a hint where one is found (``core.explain``),
    else ``smallest()`` (the exercise's ladder, :mod:`course_utils.checks.ladder`)."""
    if isinstance(got, BaseException):
        failed = raised(exercise, got, case)
        raise core._hinted(failed, core.explain(exercise, case, got, want, diagnose)
                           or (smallest() if failed.student_error is not None else None)) from None
    if changed:
        core.fail(exercise, "your code changed its input tensor in place; work on a copy instead", case)
    problem = core._difference(want, got, atol, rtol)
    if problem:
        try:
            core.fail(exercise, f"{core._sentence(problem)} {core.describe_inputs(case.args)}.", case)
        except core.CheckFailed as error:
            raise core._hinted(error, core.explain(exercise, case, got, want, diagnose) or smallest()) from None


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
                     diagnose_for: Callable[[Outcomes], core.Diagnose] | None = None,
                     smallest: Callable[[], str | None] = lambda: None) -> str:
    """The judge of a function exercise: each :data:`CALL` step's outcome against the reference's output
    on its case, in the plan's order; the ✅ line's text when all agree. ``diagnose_for(outcomes)``: a
    diagnose that reads the student's code (``outcomes.student``) or other outcomes, instead of ``diagnose``.
    ``smallest()``: the exercise's ladder, the last hint (:func:`judge_case`)."""
    if diagnose_for is not None:
        diagnose = diagnose_for(outcomes)
    steps = [s for s in plan if s.run == CALL]
    for step in steps:
        want = expected_output(exercise, step.case, reference)
        judge_case(exercise, outcomes[step.key], outcomes.changed(step.key), want, step.case,
                   atol=atol, rtol=rtol, diagnose=diagnose, smallest=smallest)
    return f"{len(steps)} cases agree with the reference ({'; '.join(s.case.name for s in steps)})"


def function_spec(exercise: str, visible: Callable[[], list[Case]], *, reference: str | None = None,
                  atol: float = 1e-5, rtol: float = 1e-4, diagnose: core.Diagnose | None = None,
                  diagnose_for: Callable[[Outcomes], core.Diagnose] | None = None,
                  helpers: Callable[[], dict[str, Callable]] | None = None) -> Spec:
    """The spec of a function exercise: each case called once (visible, then hidden), each outcome
    compared with the reference's (:func:`compare_outcomes`)."""
    cases = with_hidden(exercise, visible)
    return Spec(exercise, lambda hidden: calls(cases(hidden)),
                functools.partial(compare_outcomes, exercise, reference=reference, atol=atol, rtol=rtol,
                                  diagnose=diagnose, diagnose_for=diagnose_for), helpers=helpers)


# --------------------------------------------------------------------------------------------
# Modules: each construction described, each forward pass run on a module built for it
# --------------------------------------------------------------------------------------------
#: The runners of a module exercise: ``"build"`` describes a construction (:func:`describe_build`),
#: ``"forward"`` builds the module and runs one forward pass (``core.module_output``).
BUILD, FORWARD = "build", "forward"


def describe_build(cls: Any, case: Case, attributes: Sequence[str] = ()) -> dict:
    """``cls(*case.build)`` under the course's seed (``core.construct``), as plain data: ``{"name": the
    class's name, "module": whether it is an ``nn.Module``, "type": its type's name, "shapes": its
    parameters' shapes in creation order, "kinds": {attribute: its kind (``probe.kind_of``)} for each of
    ``attributes``}``, or ``{"name", "error": [type name, message]}`` when the constructor raised."""
    name = getattr(cls, "__name__", None)
    name = name if isinstance(name, str) else "it"
    try:
        module = core.construct(cls, case.build)
    except Exception as exc:  # noqa: BLE001 - what the constructor raised is an outcome
        error = wire.error_data(exc)
        return {"name": name, "error": [error["type"], error["message"]]}
    if not isinstance(module, torch.nn.Module):
        return {"name": name, "module": False, "type": type(module).__name__}
    return {"name": name, "module": True, "type": type(module).__name__,
            "shapes": [list(p.shape) for p in module.parameters()],
            "kinds": {a: _probe.kind_of(_probe._attribute(module, a)) for a in attributes}}


def run_forward(cls: Any, case: Case) -> Any:
    """The output of one forward pass of ``cls(*case.build)``, built and run under the course's seeds."""
    return core.module_output(core.construct(cls, case.build), case)


def build_key(build: tuple) -> str:
    """The key of a construction's step."""
    return f"build {build}"


def module_plan(configs: Sequence[tuple[tuple, Sequence[Case]]], train: bool = False) -> list[Step]:
    """A module exercise's plan: for each ``(constructor arguments, cases)``, the construction described
    (once for each distinct set of arguments), then a forward pass per case, in ``eval`` mode and, with ``train``, in ``train`` mode too."""
    found: list[Step] = []
    for build, cases in configs:
        if build_key(build) not in {s.key for s in found}:  # a construction is the same each time: described once
            found.append(Step(build_key(build), Case(cases[0].name if cases else "construction", build=build), BUILD))
        for mode in ("eval", "train") if train else ("eval",):
            for case in cases:
                mcase = Case(case.name, case.args, case.kwargs, build=build, mode=mode)
                found.append(Step(f"forward {mcase.key()}", mcase, FORWARD))
    return found


def judge_build(exercise: str, built: Any, case: Case, *, reference: str | None = None,
                diagnose: core.Diagnose | None = None) -> None:
    """Fail unless the construction ``built`` (:func:`describe_build`'s outcome for ``case.build``) is an
    ``nn.Module`` whose parameters have the reference's shapes in the reference's order (equal seeds then
    give equal weights): ``core.build_student``'s words, with a hint where one is found."""
    if isinstance(built, BaseException) or not (isinstance(built, dict) and isinstance(built.get("name"), str)):
        refuse(exercise, "description of a construction")
    build = case.build
    want = core.expected_parameter_shapes(exercise, build, reference=reference)
    try:
        if "error" in built:
            kind, message = built["error"]
            if core.is_stub_data(kind, message):
                core.fail(exercise, core.NOT_IMPLEMENTED)
            core.fail(exercise, f"constructing {built['name']}{build} raised {kind}: {message}")
        if not built.get("module"):
            core.fail(exercise, f"{built['name']} must be an nn.Module subclass")
        got = [tuple(s) for s in built["shapes"]]
        if got != want:
            core.fail(exercise, f"constructor arguments {build}: expected parameters of shapes {want} "
                                f"(in this order), got {got}. Create the layers in the order the exercise gives, "
                                f"with the same sizes.")
    except core.CheckFailed as error:
        raise core._hinted(error, core.explain(exercise, case, error, None, diagnose)) from None


def judge_forward(exercise: str, got: Any, want: Any, case: Case, *, atol: float = 1e-5, rtol: float = 1e-4,
                  diagnose: core.Diagnose | None = None, smallest: Callable[[], str | None] = lambda: None) -> None:
    """Fail if one forward pass's outcome ``got`` is not ``want`` (``core._compare_forward``'s words); the hint is
    ``core.explain``'s, else ``smallest()`` (the exercise's ladder, :mod:`course_utils.checks.ladder`)."""
    label = Case(f"{case.name}, {case.mode}() mode, built with {case.build}", case.args, case.kwargs)
    if isinstance(got, BaseException):
        raise core._hinted(raised(exercise, got, label),
                           core.explain(exercise, case, got, want, diagnose) or smallest()) from None
    problem = core._difference(want, got, atol, rtol)
    if problem:
        hint = core.explain(exercise, case, got, want, diagnose)
        if hint is None and case.mode == "train":
            hint = "dropout must act on the attention weights, after softmax, and only in training mode."
        hint = hint or smallest()
        try:
            core.fail(exercise, f"{core._sentence(problem)} Input shape {core.describe_shape(case.args[0])}.", label)
        except core.CheckFailed as error:
            raise core._hinted(error, hint) from None


def compare_module_outcomes(exercise: str, plan: Sequence[Step], outcomes: Outcomes, *, reference: str | None = None,
                            atol: float = 1e-5, rtol: float = 1e-4, diagnose: core.Diagnose | None = None,
                            diagnose_for: Callable[[Outcomes], core.Diagnose] | None = None) -> str:
    """The judge of a module exercise (:func:`module_plan`): each construction against the reference's
    parameter shapes, then each forward pass against the reference module's output (``train`` passes only
    where outputs drawn at random are comparable here: ``core.modes_to_compare``)."""
    if diagnose_for is not None:
        diagnose = diagnose_for(outcomes)
    modes = core.modes_to_compare(exercise, any(s.case.mode == "train" for s in plan))
    count = 0
    for step in plan:
        if step.run == BUILD:
            judge_build(exercise, outcomes[step.key], step.case, reference=reference, diagnose=diagnose)
        elif step.run == FORWARD and step.case.mode in modes:
            want = core.reference_output(exercise, step.case, reference)
            from course_utils.checks import expected

            if expected.is_recording():
                core.mistake_outputs(exercise, step.case)
            judge_forward(exercise, outcomes[step.key], want, step.case, atol=atol, rtol=rtol, diagnose=diagnose)
            count += 1
    return f"{count} module outputs agree with the reference"


def module_spec(exercise: str, visible: Callable[[], list[tuple[tuple, list[Case]]]], *, train: bool = False,
                attributes: Sequence[str] = (), reference: str | None = None, atol: float = 1e-5, rtol: float = 1e-4,
                diagnose: core.Diagnose | None = None,
                diagnose_for: Callable[[Outcomes], core.Diagnose] | None = None,
                helpers: Callable[[], dict[str, Callable]] | None = None) -> Spec:
    """The spec of a module exercise (a module compared case by case): each ``(constructor arguments,
    cases)`` of ``visible()`` (and the hidden ones), built under the course's seed and described, then run
    on each case (:func:`module_plan`, :func:`compare_module_outcomes`). ``attributes``: the attributes
    whose kinds the diagnoses read (:func:`describe_build`)."""
    configs = with_hidden(exercise, visible)
    return Spec(exercise, lambda hidden: module_plan(configs(hidden), train),
                functools.partial(compare_module_outcomes, exercise, reference=reference, atol=atol, rtol=rtol,
                                  diagnose=diagnose, diagnose_for=diagnose_for),
                runners={BUILD: functools.partial(describe_build, attributes=tuple(attributes)), FORWARD: run_forward},
                helpers=helpers)


def built_of(outcomes: Outcomes, build: tuple) -> dict | None:
    """What the construction with ``build`` gave (:func:`describe_build`), or ``None`` where it raised."""
    found = outcomes[build_key(build)]
    return found if isinstance(found, dict) and "error" not in found else None


# --------------------------------------------------------------------------------------------
# A module probed: one construction, then forward passes in order, each with its mode, seed, copy
# --------------------------------------------------------------------------------------------
#: The runner of a probed module (:func:`probe_plan`, :func:`run_module`, read back by :class:`ModuleView`).
MODULE = "module"
#: How a probed forward pass's module was converted first: ``None`` (as built), ``"float64"`` or ``"meta"``
#: (``copy.deepcopy(module).to(...)``, made once, at its first pass).
COPIES = (None, "float64", "meta")


def probe_step(build: tuple, passes: Sequence[tuple], name: str = "construction", key: str | None = None) -> Step:
    """The step of one probed construction: ``cls(*build)`` under the course's seed, then each of ``passes``,
    ``(mode, seed, copy, x, kwargs)``, in order on the same module (``seed``: set right before the pass,
    ``None`` for 7; ``copy``: one of :data:`COPIES`; ``kwargs``: a dict of plain numbers, or ``None``)."""
    for mode, seed, copy_, x, kwargs in passes:
        if mode not in ("eval", "train") or copy_ not in COPIES or not isinstance(x, torch.Tensor):
            raise ValueError(f"a probed pass is (mode, seed, copy, x, kwargs): {mode, seed, copy_, type(x).__name__}")
    return Step(key or f"module {build}", Case(name, (tuple(tuple(p) for p in passes),), build=build), MODULE)


def run_module(cls: Any, case: Case, *, attributes: Sequence[str] = (), count: Sequence[str] = (),
               prepare: Callable[[Any], Any] | None = None, within: Callable[[tuple], Any] | None = None,
               tied: bool = False, values: Sequence[str] = ()) -> dict:
    """The kernel's part of a probed construction (:func:`probe_step`), as plain data:
    ``{"built": describe_build(...) with "structure" (``probe.structure_of``), "tied" (with ``tied``),
    "values" (``probe.snapshot`` of ``values``, after ``prepare``), "meta_left" (what ``.to("meta")`` left
    behind) or "copy_error", "prepare_error"; "passes": [{"value": output} or {"error": [type, message]},
    with "calls": {name: count} of ``count``'s torch functions (``probe.CallCounter``)]}``. ``prepare(module)``
    runs before the passes; ``within(pass)`` is a context each pass runs in."""
    import contextlib
    import copy as _copy

    from course_utils.device import manual_seed

    built = describe_build(cls, case, attributes)
    found: dict[str, Any] = {"built": built, "passes": []}
    if "error" in built or not built["module"]:
        return found
    module = core.construct(cls, case.build)
    built["structure"] = _probe.structure_of(module)
    if tied:
        built["tied"] = _probe.tied_parameters(module)
    if prepare is not None:
        try:
            prepare(module)
        except Exception as exc:  # noqa: BLE001 - the check refuses such a module before any pass
            built["prepare_error"] = [type(exc).__name__, wire.error_data(exc)["message"]]
            return found
    if values:  # name (dots as "__") -> the attribute's value, or None where the module has none
        built["values"] = {path.replace(".", "__"): None if "missing" in state else wire.decode(state["value"])
                           for path, state in _probe.snapshot(module, values).items()}
    copies: dict[str, Any] = {}
    for p in case.args[0]:
        mode, seed, copy_, x, kwargs = p
        target = module
        if copy_ is not None:
            if copy_ not in copies:
                try:
                    copies[copy_] = _copy.deepcopy(module).to(torch.float64 if copy_ == "float64" else copy_)
                    if copy_ == "meta":
                        built["meta_left"] = _probe.left_behind(copies[copy_])
                except Exception as exc:  # noqa: BLE001
                    error = wire.error_data(exc)
                    built["copy_error"] = [error["type"], error["message"]]
                    break
            target = copies[copy_]
        counters = [_probe.CallCounter(name) for name in count]
        one: dict[str, Any] = {}
        try:
            getattr(target, mode)()
            manual_seed(7 if seed is None else seed)
            with contextlib.ExitStack() as stack:
                for counter in counters:
                    stack.enter_context(counter)
                if within is not None:
                    stack.enter_context(within(p))
                one["value"] = target(x.clone(), **(kwargs or {}))
        except Exception as exc:  # noqa: BLE001 - a pass's error is an outcome
            error = wire.error_data(exc)
            one["error"] = [error["type"], error["message"]]
        if counters:
            one["calls"] = {c.name: min(c.count, _probe.MAX_CALLS) for c in counters}
        found["passes"].append(one)
    return found


class ModuleView:
    """A probed construction as the judge reads it (:func:`run_module`'s outcome for a :func:`probe_step`):
    :attr:`built` (the construction's description) and :meth:`forward`, each pass looked up by what it was
    (mode, seed, copy, input, keyword arguments) among the step's passes. A pass the step does not make is
    a ``KeyError`` (the judge reads outside its plan); an outcome of the wrong form is :class:`Forged`."""

    def __init__(self, exercise: str, step: Step, outcome: Any):
        passes = step.case.args[0]
        ok = isinstance(outcome, dict) and set(outcome) == {"built", "passes"} and isinstance(outcome["built"], dict) \
            and isinstance(outcome["passes"], list) and len(outcome["passes"]) <= len(passes) and all(
                isinstance(p, dict) and set(p) - {"calls"} in ({"value"}, {"error"}) for p in outcome["passes"])
        if not ok:
            refuse(exercise, "probed construction")
        self.exercise, self.step, self.built = exercise, step, outcome["built"]
        self._passes, self._outcomes = passes, outcome["passes"]

    def index(self, mode: str, seed: int | None, x: torch.Tensor, copy: str | None = None,
              kwargs: dict | None = None) -> int:
        """Where the pass ``(mode, seed, copy, x, kwargs)`` is in the step (``KeyError`` if it makes none)."""
        for i, (m, s, c, px, kw) in enumerate(self._passes):
            if (m, s, c, kw or {}) == (mode, seed, copy, kwargs or {}) and px.dtype == x.dtype and \
                    px.shape == x.shape and px.device.type == x.device.type and \
                    (x.device.type == "meta" or torch.equal(px, x)):
                return i
        raise KeyError(f"{self.exercise}'s step {self.step.key!r} makes no {mode}() pass with seed {seed}, copy "
                       f"{copy} on an input of shape {tuple(x.shape)}")

    def ran(self, i: int) -> bool:
        """Whether pass ``i`` ran (a copy that failed stops the passes after it)."""
        return i < len(self._outcomes)

    def forward(self, mode: str, seed: int | None, x: torch.Tensor, copy: str | None = None,
                kwargs: dict | None = None) -> Any:
        """The output of that pass, or the exception it raised (not raised)."""
        i = self.index(mode, seed, x, copy, kwargs)
        if not self.ran(i):
            refuse(self.exercise, "passes (fewer than the plan's without a copy that failed)") \
                if "copy_error" not in self.built else None
            return None
        one = self._outcomes[i]
        if "error" in one:
            return wire.error_of(*one["error"])
        return one["value"]

    def calls(self, mode: str, seed: int | None, x: torch.Tensor, copy: str | None = None,
              kwargs: dict | None = None) -> dict:
        """The counted torch functions' calls of that pass (``run_module``'s ``count``)."""
        i = self.index(mode, seed, x, copy, kwargs)
        return dict(self._outcomes[i].get("calls", {})) if self.ran(i) else {}
