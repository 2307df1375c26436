"""Attention modules judged from their probed constructions (notebooks 04, 05, 06, 08 and 09).

A module exercise is more than its outputs: its output must be finite, its mask a registered buffer
cut to the input's length, dropout active only in ``train()``, no position may see the future, a
too-long input must raise, and everything must move with ``.to(dtype)`` and ``.to(device)``.

The kernel builds each construction once and runs every forward pass the check makes on it
(:func:`steps`: ``spec.probe_step`` and ``spec.run_module``); the judges here read what came back
(``spec.ModuleView``, :func:`views`) and never hold the student's module. Each names the mistake it
finds, in the words the checks have always used; :func:`module_class` runs them all in an order where a
symptom is never blamed on the wrong cause (NaN is looked at first). Notebooks 08 and 09 call the same
checks one by one, on a ``spec.ModuleView`` or on anything that offers its ``built``, ``forward``, ``index``
and ``ran`` (08's ``SessionView``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from course_utils.checks import expected as _expected
from course_utils.checks import spec, wire
from course_utils.checks.core import (
    NOT_IMPLEMENTED,
    is_stub_data,
    is_stub_error,
    Case,
    CheckFailed,
    call_student,
    check_causal,
    construct,
    expect,
    expected_parameter_shapes,
    fail,
    mistake_outputs,
    modes_to_compare,
    module_output,
    reference_output,
    tensor_difference,
)
from course_utils.checks.modules import (
    DROPOUT_FIX,
    ProbePlan,
    _class_inputs,
    _later_tokens_changed,
    causal_probes,
    shape_problem,
)
from course_utils.checks.probe import Probe

#: Constructor arguments -> what the probed step of that construction gave (:func:`views`).
Views = dict[tuple, spec.ModuleView]

# ------------------------------------------------------------------------------------------
# The plan: one probed step per construction
# ------------------------------------------------------------------------------------------


def steps(items: Sequence[tuple[tuple, Sequence[Probe]]]) -> list[spec.Step]:
    """One ``spec.probe_step`` per ``(constructor arguments, probes)`` of a :class:`modules.ProbePlan`."""
    return [spec.probe_step(tuple(build), [(p.mode, p.seed, p.copy, p.x, p.kwargs) for p in probes])
            for build, probes in items]


def _named(value: Any, size: int) -> bool:
    """Whether ``value`` is a list of ``size`` items, a name first."""
    return isinstance(value, list) and len(value) == size and isinstance(value[0], str)


def _pair(value: Any) -> bool:
    """Whether ``value`` is two strings (a type name and a message, a name and a device)."""
    return _named(value, 2) and isinstance(value[1], str)


def _shape(value: Any) -> bool:
    return isinstance(value, list) and all(type(n) is int and n >= 0 for n in value)


def _built_ok(built: dict) -> bool:
    """Whether a construction's description has the form ``spec.run_module`` gives it."""
    if not isinstance(built.get("name"), str):
        return False
    if "error" in built:
        return _pair(built["error"])
    if type(built.get("module")) is not bool or not isinstance(built.get("type"), str):
        return False
    if not built["module"]:
        return True
    structure = built.get("structure")
    return isinstance(built.get("shapes"), list) and all(_shape(s) for s in built["shapes"]) \
        and isinstance(structure, dict) and set(structure) == {"buffers", "plain"} \
        and isinstance(structure["buffers"], list) and isinstance(structure["plain"], list) \
        and all(_named(b, 4) and _shape(b[1]) and type(b[3]) is bool for b in structure["buffers"]) \
        and all(_named(p, 3) and _shape(p[1]) for p in structure["plain"]) \
        and isinstance(built.get("meta_left", []), list) and all(_pair(m) for m in built.get("meta_left", [])) \
        and ("copy_error" not in built or _pair(built["copy_error"]))


def views(exercise: str, plan: Sequence[spec.Step], outcomes: spec.Outcomes) -> Views:
    """Constructor arguments -> what the probed step of that construction gave (``spec.ModuleView``), its
    form checked (``spec.refuse`` otherwise: only a changed hand-off gives another)."""
    found: Views = {}
    for step in plan:
        if step.run == spec.MODULE:
            view = spec.ModuleView(exercise, step, outcomes[step.key])
            if not _built_ok(view.built):
                spec.refuse(exercise, "probed construction")
            found[step.case.build] = view
    return found


# ------------------------------------------------------------------------------------------
# One pass read back as a call (the engine's words for what it raised)
# ------------------------------------------------------------------------------------------
def replayed(got: Any) -> Callable[..., Any]:
    """A function that gives ``got`` back, or raises it when it is what the pass raised: an outcome read back
    as a call, for ``core.call_student`` (which gives a student's error the engine's words)."""
    def call(*_: Any, **__: Any) -> Any:
        if isinstance(got, BaseException):
            raise got
        return got
    return call


def passes(view: spec.ModuleView, mode: str, seed: int | None, copy: str | None = None) -> Callable[[torch.Tensor], Any]:
    """``x -> the output of the pass (mode, seed, copy) on x``, raising what it raised: the module as a
    check calls it (``core.check_causal`` takes one)."""
    return lambda x: replayed(view.forward(mode, seed, x, copy))()


def output(exercise: str, view: spec.ModuleView, mode: str, seed: int | None, x: torch.Tensor, what: str,
           copy: str | None = None) -> Any:
    """The output of one pass, or ``core.call_student``'s failure on the case ``what`` when it raised."""
    return call_student(exercise, replayed(view.forward(mode, seed, x, copy)), Case(what))


def _raised(exercise: str, view: spec.ModuleView, x: torch.Tensor) -> BaseException | None:
    """What the ``eval()`` pass (seed 7) on ``x`` raised, or ``None``; not implemented yet fails at once."""
    got = view.forward("eval", 7, x)
    if is_stub_error(got):
        fail(exercise, NOT_IMPLEMENTED)
    return got if isinstance(got, Exception) else None


def _copy_made(view: spec.ModuleView, x: torch.Tensor, copy: str) -> None:
    """Raise what converting the module into ``copy`` raised, where the pass on that copy did not run
    (as ``.to`` raised it in the kernel)."""
    if not view.ran(view.index("eval", 7, x, copy)):
        error = view.built.get("copy_error")
        if not (isinstance(error, list) and len(error) == 2 and all(isinstance(s, str) for s in error)):
            spec.refuse(view.exercise, "passes (fewer than the plan's without a copy that failed)")
        raise wire.error_of(*error)


# ------------------------------------------------------------------------------------------
# A construction
# ------------------------------------------------------------------------------------------
def built(exercise: str, view: spec.ModuleView, build: tuple, *, reference: str | None = None) -> None:
    """``core.build_student``'s verdict on the construction: fail unless it is an ``nn.Module`` whose
    parameters have the reference's shapes (``reference``'s, where given), in the reference's order."""
    found = view.built
    if not isinstance(found, dict) or not isinstance(found.get("name"), str):
        spec.refuse(exercise, "description of a construction")
    want = expected_parameter_shapes(exercise, build, reference=reference)
    if "error" in found:
        kind, message = found["error"]
        if is_stub_data(kind, message):
            fail(exercise, NOT_IMPLEMENTED)
        fail(exercise, f"constructing {found['name']}{build} raised {kind}: {message}")
    if not found.get("module"):
        fail(exercise, f"{found['name']} must be an nn.Module subclass")
    got = [tuple(s) for s in found["shapes"]]
    if got != want:
        fail(exercise, f"constructor arguments {build}: expected parameters of shapes {want} "
                       f"(in this order), got {got}. Create the layers in the order the exercise gives, with the "
                       f"same sizes.")


def student_shapes(exercise: str, view: spec.ModuleView) -> list[tuple[int, ...]] | None:
    """The parameter shapes of the construction, or ``None`` when it gave no module (reported later)."""
    found = view.built
    if "error" in found:
        if is_stub_data(*found["error"]):
            fail(exercise, NOT_IMPLEMENTED)
        return None
    return [tuple(s) for s in found["shapes"]] if found.get("module") else None


def check_shapes(exercise: str, view: spec.ModuleView, build: tuple,
                 specific: Callable[[list, list, tuple], "str | None"] | None = None) -> None:
    """Fail with a named cause when the construction's parameters have other shapes than expected and the
    difference is a known pattern (``modules.shape_problem``; otherwise :func:`built` reports it)."""
    want = expected_parameter_shapes(exercise, build)
    got = student_shapes(exercise, view)
    if got is None or got == want:
        return
    problem = (specific(got, want, build) if specific else None) or shape_problem(got, want, build)
    if problem:
        fail(exercise, f"built with {build}: expected parameters of shapes {want} (in this order), got {got}: "
                       f"{problem}.")


def module_checks(exercise: str, views_: Views, builds: Sequence[tuple],
                  specific: Callable[[list, list, tuple], "str | None"] | None = None) -> None:
    """What every module check does first (after the rules): the parameter shapes of every build."""
    for build in dict.fromkeys(builds):
        check_shapes(exercise, views_[build], build, specific)


# ------------------------------------------------------------------------------------------
# What a causal attention module must do
# ------------------------------------------------------------------------------------------
def finite(exercise: str, view: spec.ModuleView, x: torch.Tensor, where: str) -> None:
    """In ``eval()`` mode the output must be free of NaN and inf; say which position is not.

    Checked before anything else compares outputs: NaN is never equal to NaN, so a later check would
    blame the symptom on dropout or on the values.
    """
    out = output(exercise, view, "eval", 7, x, f"{where}, eval()")
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


def mask_buffer(exercise: str, view: spec.ModuleView, context_length: int, where: str) -> None:
    """The ``(context_length, context_length)`` mask must be a registered, persistent buffer."""
    shape = (context_length, context_length)
    structure = view.built["structure"]
    for name, size, _ in structure["plain"]:
        if tuple(size) == shape:
            fail(exercise, f"{where}: mask is a plain attribute, not a buffer: `self.{name} = ...` is not saved in "
                           f"state_dict and stays behind when the module moves with .to(device). Use "
                           f"self.register_buffer('{name}', ...)")
    buffers = [(name, kept) for name, size, _, kept in structure["buffers"] if tuple(size) == shape]
    if not buffers:
        found = [f"{n} {tuple(size)}" for n, size, _, _ in structure["buffers"]]
        fail(exercise, f"{where}: no buffer of shape {shape} found (buffers: {found or 'none'}). Build the mask for "
                       f"context_length in __init__ and register it with self.register_buffer('mask', ...)")
    missing = [n for n, kept in buffers if not kept]
    if len(missing) == len(buffers):
        fail(exercise, f"{where}: the mask buffer '{missing[0]}' is not in state_dict (persistent=False?). "
                       f"Register it as an ordinary buffer so that a saved model keeps it")


def truncated(exercise: str, view: spec.ModuleView, x_short: torch.Tensor, context_length: int, where: str) -> None:
    """An input shorter than ``context_length`` must work (the mask is cut to ``[:T, :T]``)."""
    exc = _raised(exercise, view, x_short)
    if exc is not None:
        fail(exercise, f"{where}: mask not truncated to num_tokens? With T={x_short.shape[1]} tokens and "
                       f"context_length={context_length} your forward raised {type(exc).__name__}: {exc}. "
                       f"Slice the buffer to mask[:num_tokens, :num_tokens]")


def too_long_raises(exercise: str, view: spec.ModuleView, d_in: int, context_length: int, where: str) -> None:
    """An input with ``context_length + 1`` tokens must raise: the mask does not cover it."""
    x = _class_inputs((d_in, None, context_length))[2]
    if _raised(exercise, view, x) is None:
        fail(exercise, f"{where}: an input of T = context_length + 1 = {context_length + 1} tokens returned "
                       f"an output instead of raising an error. The mask covers only context_length "
                       f"positions; is it rebuilt for every input instead of being a buffer?")


def dropout_modes(exercise: str, view: spec.ModuleView, x: torch.Tensor, where: str, fix: str = "module") -> None:
    """With dropout > 0: ``eval()`` must be deterministic, ``train()`` must not be (passes under seeds 1
    and 2). ``fix`` chooses the advice given (``modules.DROPOUT_FIX``)."""
    in_eval, in_train = DROPOUT_FIX[fix]
    a = output(exercise, view, "eval", 1, x, f"{where}, eval()")
    b = output(exercise, view, "eval", 2, x, f"{where}, eval()")
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and \
            not torch.allclose(a, b, equal_nan=True):
        fail(exercise, f"{where}: dropout is active in eval() mode: two calls in eval() gave different outputs. {in_eval}")
    a = output(exercise, view, "train", 1, x, f"{where}, train()")
    b = output(exercise, view, "train", 2, x, f"{where}, train()")
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and \
            torch.allclose(a, b, equal_nan=True):
        fail(exercise, f"{where}: no dropout in train() mode: with dropout > 0 two calls gave the same output. {in_train}")


def causal_module(exercise: str, view: spec.ModuleView, x: torch.Tensor) -> None:
    """No output position may depend on later tokens (``eval()`` passes under no seed of the check's:
    ``modules.causal_probes``)."""
    run = passes(view, "eval", None)
    try:
        check_causal(exercise, run, x)
    except CheckFailed as err:
        if "at position 0 " in str(err) and x.shape[1] > 2:
            changed = output(exercise, view, "eval", None, _later_tokens_changed(x), "x")
            base = output(exercise, view, "eval", None, x, "x")
            moved = (changed[:, 1] - base[:, 1]).abs().max().item()
            if moved < 1e-5:
                raise CheckFailed(f"{err} Only position 0 leaks: the diagonal is masked too, so row 0 has no "
                                  f"allowed key left and spreads its weight over every token. Use triu with "
                                  f"diagonal=1") from None
            raise CheckFailed(f"{err} Every position leaks: are the masked scores -inf when they reach a softmax over "
                              f"the keys (dim=-1)? A score of 0 still gets weight exp(0) = 1, and a mask applied "
                              f"after the softmax must be followed by a renormalisation.") from None
        raise


def moves_with_module(exercise: str, view: spec.ModuleView, build: tuple, x: torch.Tensor, where: str) -> None:
    """``.to(torch.float64)`` and ``.to('meta')`` must carry everything the forward pass needs (the passes of
    the float64 and the meta copy, seed 7)."""
    x64 = x.to(torch.float64)
    case = Case("float64 input", (x64,), build=build)
    want = expect(exercise, f"after .to(torch.float64): {case.key()}",
                  lambda: module_output(construct(_expected.reference(exercise), build).to(torch.float64), case))
    _copy_made(view, x64, "float64")
    got = output(exercise, view, "eval", 7, x64, f"{where}, after .to(torch.float64)", "float64")
    problem = tensor_difference(want, got)
    if problem:
        fail(exercise, f"{where}: after module.to(torch.float64) with a float64 input: {problem}. "
                       f"Do not fix a dtype inside forward; let the buffers and parameters follow the module")
    x_meta = x.to("meta")
    _copy_made(view, x_meta, "meta")
    found = view.built.get("meta_left")
    if not (isinstance(found, list) and all(isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p)
                                            for p in found)):
        spec.refuse(exercise, "tensors left behind by .to('meta')")
    left = [f"{n} ({device})" for n, device in found]
    if left:
        fail(exercise, f"{where}: after module.to('meta') these tensors stayed behind: {left}. On a GPU they would stay "
                       f"on the CPU. Make them parameters or buffers")
    got = view.forward("eval", 7, x_meta, "meta")
    if isinstance(got, BaseException):
        fail(exercise, f"{where}: after module.to('meta') (a stand-in for .to('cuda')) the forward pass raised "
                       f"{type(got).__name__}: {got}. Every tensor forward uses must move with the module "
                       f"(a buffer), or be created on x.device")


# ------------------------------------------------------------------------------------------
# Values compared, a class checked as a whole
# ------------------------------------------------------------------------------------------
def compare(exercise: str, views_: Views, configs: Sequence[tuple[tuple, Sequence[Case]]], *, train: bool = False,
            diagnose: Callable | None = None) -> None:
    """``core.compare_module``'s verdict (quiet) on the probed constructions: each construction, then its
    outputs (seed 7) in ``eval()`` mode and, with ``train``, in ``train()`` mode where comparable."""
    modes = modes_to_compare(exercise, train)
    for build, cases in configs:
        first = Case(cases[0].name if cases else "construction", cases[0].args if cases else (), build=build)
        spec.judge_build(exercise, views_[build].built, first, diagnose=diagnose)
        for mode in modes:
            for case in cases:
                mcase = Case(case.name, case.args, case.kwargs, build=build, mode=mode)
                want = reference_output(exercise, mcase)
                if _expected.is_recording():
                    mistake_outputs(exercise, mcase)
                got = views_[build].forward(mode, 7, case.args[0], kwargs=case.kwargs or None)
                spec.judge_forward(exercise, got, want, mcase, diagnose=diagnose)


def not_causal(exercise: str, views_: Views) -> Callable:
    """A ``diagnose`` for module comparisons: when no known mistake explains a difference, say whether the
    student's module sees the future on the case's input (the causal passes of its construction)."""
    def diagnose(case: Case, got: object, want: object) -> str | None:
        if isinstance(got, BaseException) or case.build is None or not case.args:
            return None
        x = case.args[0]
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] < 2:
            return None
        view = views_.get(tuple(case.build))
        if view is None or "error" in view.built or not view.built["module"]:
            return None
        try:
            with torch.no_grad():
                check_causal(exercise, passes(view, "eval", None), x)
        except CheckFailed as error:
            text = str(error)
            if "the future leaks" in text:
                return "your module is not causal: " + text.split(": ", 1)[1]
        return None
    return diagnose


def finite_then_values(exercise: str, views_: Views, config: tuple[tuple, list[Case]], diagnose: Callable) -> None:
    """The construction of ``config``'s arguments; its output must be finite (checked first: NaN is never
    equal to anything), then equal to the expected one in ``eval()`` mode, with known mistakes named."""
    build, cases = config
    built(exercise, views_[build], build)
    for case in cases:
        finite(exercise, views_[build], case.args[0], f"built with {build}, {case.name}")
    compare(exercise, views_, [config], diagnose=diagnose)


def module_class(exercise: str, views_: Views, configs: Sequence[tuple[tuple, Sequence[Case]]], *,
                 diagnose: Callable | None = None) -> str:
    """Everything a causal attention class must satisfy, then the value comparison; the ✅ line's text.

    ``configs`` is a list of ``(constructor_args, cases)`` as for :func:`compare`; the first config must
    have ``dropout > 0`` (the book's argument order: ``d_in, d_out, context_length, dropout, ...``). Every
    config's module is checked for a finite output, a mask buffer and causality before values are compared.
    """
    first = configs[0][0]
    d_in, context_length = first[0], first[2]
    where = f"built with {first}"
    view = views_[first]
    built(exercise, view, first)
    x_full, x_short, _ = _class_inputs(first)
    mask_buffer(exercise, view, context_length, where)
    truncated(exercise, view, x_short, context_length, where)
    finite(exercise, view, x_full, where)
    dropout_modes(exercise, view, x_full, where)
    causal_module(exercise, view, x_full)
    too_long_raises(exercise, view, d_in, context_length, where)
    for build, cases in configs[1:]:
        built(exercise, views_[build], build)
        mask_buffer(exercise, views_[build], build[2], f"built with {build}")
        for case in cases:
            finite(exercise, views_[build], case.args[0], f"built with {build}, {case.name}")
    compare(exercise, views_, configs, train=True, diagnose=diagnose)
    moves_with_module(exercise, view, first, x_short, where)
    return (f"outputs agree in eval() and train() mode for {len(configs)} constructions; the mask is a buffer, "
            f"cut to the input's length, and no position sees the future")


# ------------------------------------------------------------------------------------------
# Every pass the checks above make, per construction
# ------------------------------------------------------------------------------------------
def module_class_plan(configs: Sequence[tuple[tuple, Sequence[Case]]], first_extra: Sequence[Probe] = (),
                      causal: Sequence[Case] = (), plan: ProbePlan | None = None,
                      diagnosed_causal: bool = False) -> list[tuple[tuple, list[Probe]]]:
    """Every forward pass :func:`module_class` (then, on the hidden ``causal`` cases, built with
    ``case.build``: :func:`finite` and :func:`causal_module`) makes, per construction, in the order it makes
    them. ``first_extra``: the exercise's own passes of the first construction, made before; ``plan``: the
    passes of the checks made before, added to; ``diagnosed_causal``: the comparison's diagnosis is
    :func:`not_causal`."""
    first = configs[0][0]
    x_full, x_short, x_long = _class_inputs(first)
    plan = plan or ProbePlan()
    add = plan.add
    add(first, *first_extra, Probe("eval", 7, x_short), Probe("eval", 7, x_full),
        *[Probe(mode, seed, x_full) for mode in ("eval", "train") for seed in (1, 2)],
        *causal_probes(x_full), Probe("eval", 7, x_long))
    for build, cases in configs:
        add(build, *[Probe("eval", 7, case.args[0]) for case in cases])
    plan.compared(configs, train=True, diagnosed_causal=diagnosed_causal)
    add(first, Probe("eval", 7, x_short.to(torch.float64), "float64"), Probe("eval", 7, x_short.to("meta"), "meta"))
    for case in causal:
        add(case.build, Probe("eval", 7, case.args[0]))
    plan.causal(causal)
    return plan.items()


def attention_class_plan(builds: Sequence[tuple], values: tuple[tuple, Sequence[Case]],
                         configs: Sequence[tuple[tuple, Sequence[Case]]],
                         causal: Sequence[Case] = ()) -> list[tuple[tuple, list[Probe]]]:
    """Every construction and forward pass of :func:`attention_class`, in order: :func:`module_checks` on
    ``builds``, :func:`finite_then_values` on ``values`` (diagnosed by :func:`not_causal`), then
    :func:`module_class` on ``configs`` and the hidden ``causal`` cases (:func:`module_class_plan`)."""
    plan = ProbePlan()
    for build in builds:
        plan.add(build)
    plan.add(values[0], *[Probe("eval", 7, case.args[0]) for case in values[1]])
    plan.compared([values], diagnosed_causal=True)
    return module_class_plan(configs, causal=causal, plan=plan, diagnosed_causal=True)


def attention_class(exercise: str, views_: Views, builds: Sequence[tuple], values: tuple[tuple, list[Case]],
                    configs: Sequence[tuple[tuple, Sequence[Case]]], causal: Sequence[Case],
                    specific: Callable[[list, list, tuple], "str | None"] | None = None) -> str:
    """The usual check of a causal attention class (notebook 05's ``MultiHeadAttention``, 06's
    ``MultiHeadAttentionCombinedQKV``): :func:`module_checks` on ``builds``, :func:`finite_then_values` on
    ``values``, :func:`module_class` on ``configs``, then causality on the hidden ``causal`` cases; the ✅
    line's text. Its plan: :func:`attention_class_plan`."""
    module_checks(exercise, views_, builds, specific)
    diagnose = not_causal(exercise, views_)
    finite_then_values(exercise, views_, values, diagnose)
    text = module_class(exercise, views_, configs, diagnose=diagnose)
    for case in causal:
        built(exercise, views_[case.build], case.build)
        causal_module(exercise, views_[case.build], case.args[0])
    return text
