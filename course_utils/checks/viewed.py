"""The checks every attention module must pass, read from a probed construction (``spec.ModuleView``).

:mod:`course_utils.checks.modules` holds these checks for a module in hand (``check_finite``,
``check_causal_module``, ``check_dropout_modes``, ``check_moves_with_module``, ...). A spec's judge never holds
the student's module: it reads what the kernel's run of the plan gave (``spec.run_module``, one step per
construction with its forward passes in order). Here are the same checks, with the same words, on that view;
the passes each one reads are listed by :func:`causal_passes` and the other ``*_passes`` helpers, so that a
plan and its judge are written from one list. (Notebooks 08 and 09 use them; modules.py's own rewrite for
04-06 may absorb them.)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from course_utils.checks import expected as _expected
from course_utils.checks import spec, wire
from course_utils.checks.core import (
    NOT_IMPLEMENTED,
    Case,
    CheckFailed,
    causal_inputs,
    construct,
    describe_shape,
    expect,
    expected_parameter_shapes,
    fail,
    module_output,
    tensor_difference,
)
from course_utils.checks.modules import _later_tokens_changed

#: A pass of a probed construction: ``(mode, seed, copy, x, kwargs)`` (``spec.probe_step``).
Pass = tuple


def student_error(exercise: str, error: BaseException, case: Case) -> CheckFailed:
    """The failure ``core.call_student`` gives when the student's code raised ``error`` on ``case``."""
    if isinstance(error, NotImplementedError):
        return CheckFailed(f"❌ {exercise}: {NOT_IMPLEMENTED}")
    said = str(error).strip()
    said += "" if said.endswith((".", "!", "?")) or not said else "."
    try:
        fail(exercise, f"your code raised {type(error).__name__}: {said}", case)
    except CheckFailed as failed:
        failed.student_error = error  # type: ignore[assignment]
        return failed
    raise AssertionError("unreachable")


def called(exercise: str, got: Any, case: Case) -> Any:
    """``got`` (a pass's outcome), or the failure ``core.call_student`` raises when it is an error."""
    if isinstance(got, BaseException):
        raise student_error(exercise, got, case)
    return got


def built(exercise: str, view: spec.ModuleView, build: tuple, *, reference: str | None = None) -> None:
    """Fail as ``core.build_student`` does unless the construction is an ``nn.Module`` whose parameters have the
    reference's shapes, in the reference's order."""
    found = view.built
    if not isinstance(found, dict) or not isinstance(found.get("name"), str):
        spec.refuse(exercise, "description of a construction")
    want = expected_parameter_shapes(exercise, build, reference=reference)
    if "error" in found:
        kind, message = found["error"]
        if kind == "NotImplementedError":
            fail(exercise, NOT_IMPLEMENTED)
        fail(exercise, f"constructing {found['name']}{build} raised {kind}: {message}")
    if not found.get("module"):
        fail(exercise, f"{found['name']} must be an nn.Module subclass")
    got = [tuple(s) for s in found["shapes"]]
    if got != want:
        fail(exercise, f"constructor arguments {build}: expected parameters of shapes {want} "
                       f"(in this order), got {got}. Create the layers in the order the exercise gives, with the "
                       f"same sizes.")


def shapes(exercise: str, view: spec.ModuleView) -> list[tuple[int, ...]] | None:
    """``modules.student_shapes`` on the view: the parameter shapes, ``None`` where the construction raised or is no
    module; a stub's NotImplementedError fails."""
    found = view.built
    if "error" in found:
        if found["error"][0] == "NotImplementedError":
            fail(exercise, NOT_IMPLEMENTED)
        return None
    return [tuple(s) for s in found["shapes"]] if found.get("module") else None


def check_shapes(exercise: str, view: spec.ModuleView, build: tuple,
                 specific: Callable[[list, list, tuple], "str | None"] | None = None) -> None:
    """``modules.check_shapes`` on the view."""
    from course_utils.checks.modules import shape_problem

    want = expected_parameter_shapes(exercise, build)
    got = shapes(exercise, view)
    if got is None or got == want:
        return
    problem = (specific(got, want, build) if specific else None) or shape_problem(got, want, build)
    if problem:
        fail(exercise, f"built with {build}: expected parameters of shapes {want} (in this order), got {got}: "
                       f"{problem}.")


def check_finite(exercise: str, view: spec.ModuleView, x: torch.Tensor, where: str) -> None:
    """``modules.check_finite`` on the pass ``("eval", 7, None, x)``."""
    out = called(exercise, view.forward("eval", 7, x), Case(f"{where}, eval()", (x,)))
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        return
    bad = ~torch.isfinite(out)
    if not bad.any():
        return
    b, t = (bad.nonzero()[0].tolist() + [0, 0])[:2]
    what = "NaN" if torch.isnan(out).any() else "inf"
    rows = sorted({int(i) for i in bad.nonzero()[:, 1].tolist()}) if out.dim() >= 2 else []
    cause = ""
    if rows == [0]:
        cause = (" Only position 0 is affected: its row of scores is all -inf, so the softmax divides 0 by 0. "
                 "The diagonal is masked too: a token must see itself. Mask only j > i (triu with diagonal=1)")
    elif what == "NaN":
        cause = (" NaN comes from 0/0 or inf - inf: a softmax over a row whose scores are all -inf, or -inf "
                 "used after the softmax. Which positions can each row see, and when is the mask applied?")
    fail(exercise, f"{where}: the output holds {what} (first at batch {b}, position {t}; positions {rows[:8]}).{cause}")


def causal_passes(x: torch.Tensor) -> list[Pass]:
    """The passes :func:`check_causal` reads on ``x`` (``modules.causal_probes``: eval, no seed of its own)."""
    xs = [x, *causal_inputs(x)] + ([_later_tokens_changed(x)] if x.shape[1] > 2 else [])
    return [("eval", None, None, v, None) for v in xs]


def leak(exercise: str, view: spec.ModuleView, x: torch.Tensor) -> None:
    """``core.check_causal`` on the view: fail if output position ``i`` depends on a token after ``i``."""
    base = called(exercise, view.forward("eval", None, x), Case("causality", (x,)))
    T = x.shape[1]
    for t, changed in enumerate(causal_inputs(x)):
        out = called(exercise, view.forward("eval", None, changed), Case("causality", (changed,)))
        if not isinstance(out, torch.Tensor) or not isinstance(base, torch.Tensor) or out.shape != base.shape:
            fail(exercise, f"output shape changed between calls: {describe_shape(base)} vs {describe_shape(out)}")
        diff = (out[:, : t + 1] - base[:, : t + 1]).abs()
        if diff.max() > 1e-5:
            pos = int(diff.amax(dim=tuple(i for i in range(diff.dim()) if i != 1)).argmax())
            fail(exercise, f"the future leaks: output at position {pos} changed when only tokens "
                           f"{t + 1}..{T - 1} changed (largest change {diff.max().item():.3g}). "
                           f"Position {pos} must only see tokens 0..{pos}: is the mask applied, and above the diagonal?")


def check_causal(exercise: str, view: spec.ModuleView, x: torch.Tensor) -> None:
    """``modules.check_causal_module`` on the view (its passes: :func:`causal_passes`)."""
    try:
        leak(exercise, view, x)
    except CheckFailed as err:
        if "at position 0 " in str(err) and x.shape[1] > 2:
            changed = view.forward("eval", None, _later_tokens_changed(x))
            base = view.forward("eval", None, x)
            if isinstance(changed, BaseException) or isinstance(base, BaseException):
                raise called(exercise, changed if isinstance(changed, BaseException) else base, Case("x")) from None
            moved = (changed[:, 1] - base[:, 1]).abs().max().item()
            if moved < 1e-5:
                raise CheckFailed(f"{err} Only position 0 leaks: the diagonal is masked too, so row 0 has no "
                                  f"allowed key left and spreads its weight over every token. Use triu with "
                                  f"diagonal=1") from None
            raise CheckFailed(f"{err} Every position leaks: are the masked scores -inf when they reach a softmax over "
                              f"the keys (dim=-1)? A score of 0 still gets weight exp(0) = 1, and a mask applied "
                              f"after the softmax must be followed by a renormalisation.") from None
        raise


def not_causal(exercise: str, views: Callable[[tuple], spec.ModuleView]) -> Callable:
    """``modules.not_causal`` on views (``views(build)``): when no known mistake explains a difference, say whether
    the module sees the future on the case's input (its passes: :func:`causal_passes`, on the case's build)."""
    def diagnose(case: Case, got: object, want: object) -> str | None:
        if isinstance(got, BaseException) or case.build is None or not case.args:
            return None
        x = case.args[0]
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] < 2:
            return None
        try:
            leak(exercise, views(case.build), x)
        except CheckFailed as error:
            text = str(error)
            if "the future leaks" in text:
                return "your module is not causal: " + text.split(": ", 1)[1]
        return None
    return diagnose


def dropout_passes(x: torch.Tensor) -> list[Pass]:
    """The passes :func:`check_dropout_modes` reads: eval then train, each under seeds 1 and 2."""
    return [(mode, seed, None, x, None) for mode in ("eval", "train") for seed in (1, 2)]


def check_dropout_modes(exercise: str, view: spec.ModuleView, x: torch.Tensor, where: str,
                        fix: str = "module") -> None:
    """``modules.check_dropout_modes`` on the view (its passes: :func:`dropout_passes`)."""
    from course_utils.checks.modules import DROPOUT_FIX

    in_eval, in_train = DROPOUT_FIX[fix]
    a = called(exercise, view.forward("eval", 1, x), Case(f"{where}, eval()", (x,)))
    b = called(exercise, view.forward("eval", 2, x), Case(f"{where}, eval()", (x,)))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and \
            not torch.allclose(a, b, equal_nan=True):
        fail(exercise, f"{where}: dropout is active in eval() mode: two calls in eval() gave different outputs. {in_eval}")
    a = called(exercise, view.forward("train", 1, x), Case(f"{where}, train()", (x,)))
    b = called(exercise, view.forward("train", 2, x), Case(f"{where}, train()", (x,)))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and \
            torch.allclose(a, b, equal_nan=True):
        fail(exercise, f"{where}: no dropout in train() mode: with dropout > 0 two calls gave the same output. {in_train}")


def moves_passes(x: torch.Tensor) -> list[Pass]:
    """The passes :func:`check_moves_with_module` reads: a float64 copy and a meta copy, each under seed 7."""
    return [("eval", 7, "float64", x.to(torch.float64), None), ("eval", 7, "meta", x.to("meta"), None)]


def check_moves_with_module(exercise: str, view: spec.ModuleView, build: tuple, x: torch.Tensor, where: str) -> None:
    """``modules.check_moves_with_module`` on the view (its passes: :func:`moves_passes`)."""
    case = Case("float64 input", (x.to(torch.float64),), build=build)
    want = expect(exercise, f"after .to(torch.float64): {case.key()}",
                  lambda: module_output(construct(_expected.reference(exercise), build).to(torch.float64), case))
    x64, meta = x.to(torch.float64), x.to("meta")
    _copied(view, view.index("eval", 7, x64, "float64"))
    got = called(exercise, view.forward("eval", 7, x.to(torch.float64), "float64"),
                 Case(f"{where}, after .to(torch.float64)", (x,)))
    problem = tensor_difference(want, got)
    if problem:
        fail(exercise, f"{where}: after module.to(torch.float64) with a float64 input: {problem}. "
                       f"Do not fix a dtype inside forward; let the buffers and parameters follow the module")
    _copied(view, view.index("eval", 7, meta, "meta"))
    left = view.built.get("meta_left")
    if not (isinstance(left, list) and all(isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p)
                                           for p in left)):
        spec.refuse(exercise, "tensors left behind by .to('meta')")
    if left:
        fail(exercise, f"{where}: after module.to('meta') these tensors stayed behind: "
                       f"{[f'{n} ({d})' for n, d in left]}. On a GPU they would stay on the CPU. Make them parameters "
                       f"or buffers")
    got = view.forward("eval", 7, meta, "meta")
    if isinstance(got, BaseException):
        fail(exercise, f"{where}: after module.to('meta') (a stand-in for .to('cuda')) the forward pass raised "
                       f"{type(got).__name__}: {got}. Every tensor forward uses must move with the module "
                       f"(a buffer), or be created on x.device")


def _copied(view: spec.ModuleView, i: int) -> None:
    """Raise what making the copy of pass ``i`` raised (``copy.deepcopy(module).to(...)``), as the check in hand
    lets it through, where that copy could not be made."""
    if not view.ran(i):
        error = view.built.get("copy_error")
        if not (isinstance(error, list) and len(error) == 2 and all(isinstance(s, str) for s in error)):
            spec.refuse(view.exercise, "passes (fewer than the plan's without a copy that failed)")
        raise wire.error_of(*error)


def hidden_plan(plan: Sequence[spec.Step], visible: Callable[[], list[spec.Step]]) -> bool:
    """Whether ``plan`` is the hidden one: it differs from the ``visible()`` plan in its keys or in its steps' passes.
    A judge of probed constructions then reads the hidden cases' names and groups from the instructor edition (the
    grader's, or a self-check with ``hidden=True``), which has them: the steps carry only the inputs."""
    def shape(steps: Sequence[spec.Step]) -> list:
        return [(s.key, len(s.case.args[0]) if s.run == spec.MODULE else 0) for s in steps]
    return shape(plan) != shape(visible())


def views_of(exercise: str, plan: Sequence[spec.Step], outcomes: spec.Outcomes) -> dict[tuple, spec.ModuleView]:
    """Each probed construction of ``plan`` (``spec.MODULE`` steps), by its constructor arguments."""
    return {step.case.build: spec.ModuleView(exercise, step, outcomes[step.key])
            for step in plan if step.run == spec.MODULE}
