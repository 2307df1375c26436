"""Every spec's judge reads only what its plan makes (issue 34's plan-covers-judge test).

For each exercise declared by a spec (``course_utils.checks.SPECS``), the plan with its hidden cases runs
in this process on the reference and on every known wrong answer of ``tests/fixtures/answers``, through the
one executor the kernel runs (``spec.execute``), and the judge reads the outcomes:

- a read of a key the plan does not make fails here (``Outcomes`` raises), so the grader, which judges
  only what the kernel handed out for the plan it sent, can always answer the judge;
- the reference passes, each wrong answer fails with its hint.

Each correct alternative passes its test cells in ``tests/grader_answers/test_hidden_tests.py``, hidden plan
included, and that test holds what the judge read there against the plan (``harness.plans_read``): its plan is
not run a second time here.

The plan also crosses into the kernel as plain data (``probe.encode_plan`` and ``probe.plan``): each must
come back as it went. What crosses back, the hand-off, is tested in ``tests/grader_answers/test_judge.py``.
"""

from __future__ import annotations

import pytest
import torch

from course_utils import checks
from course_utils.checks import core, expected, layouts, probe, spec
from grader import course
from tests.fixtures.answers import load
from tests.support import harness

SPECS = checks.SPECS


def _notebook_of(exercise: str) -> str:
    return next(n for n, found in course.EXERCISES.items() if exercise in found)


def _answers():
    for exercise in sorted(SPECS):
        notebook = _notebook_of(exercise)
        yield pytest.param(notebook, exercise, None, id=f"{exercise}-reference")
        module = load(notebook)
        for label, source in (module.WRONG.get(exercise, {}) if module else {}).items():
            yield pytest.param(notebook, exercise, source, id=f"{exercise}-wrong-{label}")


def _student(notebook: str, exercise: str, source: str | None):
    if source is None:
        return expected.reference(exercise)
    namespace = dict(harness._executed(notebook)[0])
    harness.run_source(str(source), namespace, f"{notebook}:{exercise}:answer")
    return namespace[exercise]


@pytest.mark.parametrize("notebook, exercise, source", list(_answers()))
def test_the_judge_reads_only_what_the_plan_makes(notebook, exercise, source, capsys):
    declared = SPECS[exercise]
    with expected.using(expected.LIVE):
        student = _student(notebook, exercise, source)
        plan = declared.steps(hidden=True)
        outcomes = spec.Outcomes(exercise, spec.execute(exercise, plan, student, declared.runners))
        outcomes.student, outcomes.hidden = student, True
        try:
            core.check_rules(exercise, student)
            text = declared.verdict(plan, outcomes)
            error = None
        except core.CheckFailed as exc:
            error = exc
    assert outcomes.read <= {s.key for s in plan}  # Outcomes raised on any other read already
    if source is None:
        assert error is None, f"the reference failed: {error}"
        assert text
    else:
        assert error is not None, f"the wrong {exercise} passed the hidden plan"
        if not source.visible_only:  # else named by the self-check only (test_hidden_tests holds it to its hint)
            assert source.hint in str(error), f"the message does not name the mistake ({source.hint!r}): {error}"


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):  # a meta tensor (a probed pass on a meta copy) has no values to compare
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and \
            a.device.type == b.device.type and (a.device.type == "meta" or torch.equal(a, b))
    if isinstance(a, torch.nn.Module):  # a module crosses as its layout (count_parameters' cases)
        return isinstance(b, torch.nn.Module) and layouts.module_layout(a) == layouts.module_layout(b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("exercise", sorted(SPECS))
def test_each_plan_crosses_into_the_kernel_as_it_went(exercise, monkeypatch):
    with expected.using(expected.LIVE):
        plans = {which: SPECS[exercise].steps(which == "hidden") for which in ("visible", "hidden")}
    monkeypatch.setattr(probe, "_inputs", {"plans": {exercise: {w: probe.encode_plan(p) for w, p in plans.items()}}})
    for which, plan in plans.items():
        back = probe.plan(exercise, which == "hidden")
        assert [(k, r) for k, _, r in back] == [(s.key, s.run) for s in plan]
        for (_, case, _), step in zip(back, plan):
            assert (case.name, case.build, case.mode) == (step.case.name, step.case.build, step.case.mode)
            assert _same(case.args, step.case.args) and _same(case.kwargs, step.case.kwargs), step.key


def test_a_judge_that_reads_outside_its_plan_fails_here():
    outcomes = spec.Outcomes("dot", {"a": {"result": {"kind": "none"}}})
    assert outcomes["a"] is None
    with pytest.raises(KeyError, match="'b'"):
        outcomes["b"]
