"""The engine behind every self-check: run the student's code and the reference on the same inputs
and explain the first difference in words.

A check prints ``✅ ...`` when everything agrees. Otherwise it raises ``AssertionError`` whose
message names the exercise, the input case, and what differs (shape, NaNs, the largest error and
where, a causality leak and at which position). The same call therefore works as a student's
self-check and inside an nbgrader test cell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from course_utils import rules


class CheckFailed(AssertionError):
    """A self-check found a difference; the message says which and where."""


@dataclass
class Case:
    """One input to try.

    Attributes:
        name: what a student reads, e.g. ``"batch of 2, T=5, d=4"``.
        args: positional arguments for both the student's and the reference function.
        kwargs: keyword arguments for both.
    """

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


#: ``diagnose(case, got) -> hint or None``: names the likely mistake behind a failing case.
Diagnose = Callable[[Case, object], "str | None"]


def fail(exercise: str, message: str, case: Case | None = None) -> None:
    """Raise :class:`CheckFailed` with a message in the course's format."""
    where = f" on case '{case.name}'" if case is not None else ""
    raise CheckFailed(f"❌ {exercise}{where}: {message}")


def passed(exercise: str, what: str) -> None:
    """Print the success line of a check."""
    print(f"✅ {exercise}: {what}")


def describe_shape(x: Any) -> str:
    """``(2, 6, 3)`` for a tensor, the type name for anything else."""
    if isinstance(x, torch.Tensor):
        return str(tuple(x.shape))
    return type(x).__name__


def _format_index(index: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(i)) for i in index) + "]"


def tensor_difference(expected: torch.Tensor, got: Any, atol: float = 1e-5, rtol: float = 1e-4) -> str | None:
    """``None`` if ``got`` matches ``expected``; otherwise one sentence saying how it differs.

    Compares type, shape, NaN/inf placement and values (``|got - expected| <= atol + rtol*|expected|``),
    reporting the largest error and its index.
    """
    if not isinstance(got, torch.Tensor):
        return f"expected a torch.Tensor of shape {tuple(expected.shape)}, got {type(got).__name__}"
    if tuple(got.shape) != tuple(expected.shape):
        hint = ""
        if got.numel() == expected.numel():
            hint = " (same number of elements: a reshape, transpose or missing dimension?)"
        elif got.dim() == expected.dim() - 1:
            hint = " (one dimension missing: does your code handle batch dimensions?)"
        return f"expected shape {tuple(expected.shape)}, got {tuple(got.shape)}{hint}"
    if not got.dtype.is_floating_point and expected.dtype.is_floating_point:
        return f"expected a floating-point tensor, got dtype {got.dtype}"
    g = got.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    if g.dtype == torch.bool or e.dtype == torch.bool:
        g, e = g.to(torch.bool), e.to(torch.bool)
        wrong = (g != e).nonzero()
        if len(wrong):
            i = wrong[0].tolist()
            return (f"{len(wrong)} of {e.numel()} entries differ; first at {_format_index(i)}: "
                    f"expected {bool(e[tuple(i)])}, got {bool(g[tuple(i)])}")
        return None
    nan_got = torch.isnan(g) & ~torch.isnan(e)
    if nan_got.any():
        i = nan_got.nonzero()[0].tolist()
        return (f"got NaN at {_format_index(i)} ({int(nan_got.sum())} NaNs in all) where {e[tuple(i)].item():.4g} "
                f"was expected: an overflow, 0/0 or inf - inf somewhere?")
    inf_mismatch = (torch.isinf(g) | torch.isinf(e)) & (g != e)
    if inf_mismatch.any():
        i = inf_mismatch.nonzero()[0].tolist()
        return f"at {_format_index(i)} expected {e[tuple(i)].item():.4g}, got {g[tuple(i)].item():.4g}"
    finite = torch.isfinite(e) & torch.isfinite(g)
    err = torch.where(finite, (g - e).abs(), torch.zeros_like(g))
    allowed = atol + rtol * e.abs()
    bad = err > torch.where(finite, allowed, torch.full_like(allowed, math.inf))
    if bad.any():
        worst = torch.argmax(torch.where(bad, err, torch.zeros_like(err)))
        i = list(torch.unravel_index(worst, e.shape)) if e.dim() else []
        idx = tuple(int(k) for k in i)
        return (f"values differ at {int(bad.sum())} of {e.numel()} entries; largest error {err[idx].item():.3g} "
                f"at {_format_index(idx)}: expected {e[idx].item():.6g}, got {g[idx].item():.6g}")
    return None


def call_student(exercise: str, fn: Callable, case: Case) -> Any:
    """Call the student's code, turning its exceptions into a readable failure."""
    try:
        return fn(*case.args, **case.kwargs)
    except NotImplementedError:
        fail(exercise, "not implemented yet: replace `raise NotImplementedError()` with your code and run the cell")
    except CheckFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - any error in student code becomes a verdict
        fail(exercise, f"your code raised {type(exc).__name__}: {exc}", case)


def check_rules(exercise: str, obj: object) -> None:
    """Fail if the source of ``obj`` breaks a rule of :mod:`course_utils.rules`."""
    source = rules.source_of(obj) or ""
    if "raise NotImplementedError" in source:
        fail(exercise, "not implemented yet: replace `raise NotImplementedError()` with your code and run the cell")
    found = rules.find_violations(source, exercise) if source else []
    if found:
        why = rules.RULES.get(exercise, rules.Rule()).why
        lines = "; ".join(str(v) for v in found)
        fail(exercise, f"{lines}. {why}".strip())


def require_callable(exercise: str, obj: object) -> None:
    """Fail with a clear message if ``obj`` is not something we can call."""
    if not callable(obj):
        fail(exercise, f"expected a function or class, got {type(obj).__name__}: did you run the cell that defines it?")


def compare_function(
    exercise: str,
    student: Callable,
    reference: Callable,
    cases: Sequence[Case],
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    rules_apply: bool = True,
    quiet: bool = False,
    diagnose: "Diagnose | None" = None,
) -> None:
    """Run ``student`` and ``reference`` on every case; fail on the first difference.

    Inputs are cloned for each call so that an in-place change by the student cannot affect the
    reference, and a student function that modifies its input is reported.

    ``diagnose(case, got)``, if given, looks at the student's output on a failing case (or the
    exception their code raised) and returns one sentence naming the likely mistake, added to the
    message as a hint; ``None`` or an error inside it leaves the plain message.
    """
    require_callable(exercise, student)
    if rules_apply:
        check_rules(exercise, student)
    for case in cases:
        try:
            _compare_case(exercise, student, reference, case, atol, rtol)
        except CheckFailed as exc:
            hint = _hint(diagnose, student, case) if diagnose else None
            if hint:
                raise CheckFailed(f"{exc} Hint: {hint}") from None
            raise
    if not quiet:
        passed(exercise, f"{len(cases)} cases agree with the reference ({'; '.join(c.name for c in cases)})")


def _hint(diagnose: "Diagnose", student: Callable, case: Case) -> str | None:
    """The diagnosis of the student's output on ``case``; never raises (a hint is a bonus)."""
    try:
        try:
            got = student(*_clone(case.args), **case.kwargs)
        except Exception as error:  # noqa: BLE001 - the diagnosis may explain the error
            got = error
        return diagnose(case, got)
    except Exception:  # noqa: BLE001
        return None


def _compare_case(exercise: str, student: Callable, reference: Callable, case: Case, atol: float, rtol: float) -> None:
    """Fail if ``student`` differs from ``reference`` on one case (or changes its input)."""
    ref_case = Case(case.name, _clone(case.args), dict(case.kwargs))
    stu_case = Case(case.name, _clone(case.args), dict(case.kwargs))
    expected = reference(*ref_case.args, **ref_case.kwargs)
    got = call_student(exercise, student, stu_case)
    for before, after in zip(case.args, stu_case.args):
        if isinstance(before, torch.Tensor) and not torch.equal(before, after):
            fail(exercise, "your code changed its input tensor in place; work on a copy instead", case)
    problem = _difference(expected, got, atol, rtol)
    if problem:
        fail(exercise, f"{_sentence(problem)} Input shapes: {', '.join(describe_shape(a) for a in case.args)}", case)


def _sentence(text: str) -> str:
    """``text`` ending in exactly one full stop (or its own ``?``/``!``)."""
    return text if text.endswith((".", "?", "!")) else text + "."


def _difference(expected: Any, got: Any, atol: float, rtol: float) -> str | None:
    if isinstance(expected, torch.Tensor):
        return tensor_difference(expected, got, atol, rtol)
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return f"expected a number, got {type(got).__name__}"
        if not math.isclose(got, expected, rel_tol=rtol, abs_tol=atol):
            return f"expected {expected:,}, got {got:,}"
        return None
    if expected != got:
        return f"expected {expected!r}, got {got!r}"
    return None


def _clone(args: tuple) -> tuple:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def rand(*shape: int, seed: int, low: float = -1.0, high: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Uniform random tensor from its own generator, so cases never depend on global RNG state."""
    g = torch.Generator().manual_seed(seed)
    return low + (high - low) * torch.rand(*shape, generator=g, dtype=dtype)


def build_pair(exercise: str, student_cls: Callable, reference_cls: Callable, args: tuple, seed: int = 123):
    """Construct the student's and the reference module from the same seed and arguments.

    Because the course's classes create their parameters in the book's order, equal seeds give
    equal weights, whatever the student names things internally.
    """
    require_callable(exercise, student_cls)
    torch.manual_seed(seed)
    reference = reference_cls(*args)
    torch.manual_seed(seed)
    try:
        student = student_cls(*args)
    except NotImplementedError:
        fail(exercise, "not implemented yet: replace `raise NotImplementedError()` with your code and run the cell")
    except Exception as exc:  # noqa: BLE001
        fail(exercise, f"constructing {getattr(student_cls, '__name__', 'it')}{args} raised {type(exc).__name__}: {exc}")
    ref_params = [tuple(p.shape) for p in reference.parameters()]
    stu_params = [tuple(p.shape) for p in student.parameters()]
    if ref_params != stu_params:
        fail(exercise, f"constructor arguments {args}: expected parameters of shapes {ref_params} (in this order), "
                       f"got {stu_params}. Create the layers in the order the exercise gives, with the same sizes.")
    return student, reference


def compare_module(
    exercise: str,
    student_cls: Callable,
    reference_cls: Callable,
    configs: Sequence[tuple[tuple, Sequence[Case]]],
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    train: bool = False,
    quiet: bool = False,
    diagnose: "Callable[[tuple, Case], str | None] | None" = None,
) -> None:
    """For each ``(constructor_args, cases)``: build both modules with one seed and compare outputs.

    Outputs are compared in ``eval()`` mode; with ``train=True`` also in ``train()`` mode with the
    same RNG seed before each forward, which only agrees when dropout is applied to the same
    tensor, in the same place, as in the reference. ``diagnose(constructor_args, case)``, if given,
    names the likely mistake behind a failure, added to the message as a hint.
    """
    check_rules(exercise, student_cls)
    count = 0
    for args, cases in configs:
        case = cases[0] if cases else Case("construction")
        try:
            student, reference = build_pair(exercise, student_cls, reference_cls, args)
            modes = ("eval", "train") if train else ("eval",)
            for mode in modes:
                getattr(student, mode)()
                getattr(reference, mode)()
                for case in cases:
                    _compare_forward(exercise, student, reference, case, f"{mode}() mode, built with {args}", atol, rtol)
                    count += 1
        except CheckFailed as exc:
            try:
                hint = diagnose(args, case) if diagnose else None
            except Exception:  # noqa: BLE001 - a hint is a bonus; the failure stands without it
                hint = None
            if hint:
                raise CheckFailed(f"{exc} Hint: {hint}") from None
            raise
    if not quiet:
        passed(exercise, f"{count} module outputs agree with the reference")


def _compare_forward(exercise: str, student: Any, reference: Any, case: Case, how: str, atol: float, rtol: float) -> None:
    """Fail if one forward pass of ``student`` differs from ``reference`` (same seed before each)."""
    label = Case(f"{case.name}, {how}", case.args, case.kwargs)
    torch.manual_seed(7)
    expected = reference(*_clone(case.args), **case.kwargs)
    torch.manual_seed(7)
    got = call_student(exercise, student, Case(label.name, _clone(case.args), case.kwargs))
    problem = _difference(expected, got, atol, rtol)
    if problem:
        hint = ""
        if how.startswith("train"):
            hint = " Dropout must act on the attention weights, after softmax, and only in training mode."
        fail(exercise, f"{_sentence(problem)} Input shape {describe_shape(case.args[0])}.{hint}", label)


def check_causal(exercise: str, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, *, quiet: bool = True) -> None:
    """Fail if output position ``i`` of ``fn(x)`` (shape ``(b, T, ...)``) depends on a token after ``i``.

    For each position ``t`` the tokens after ``t`` are replaced by other random values; every
    output up to ``t`` must stay the same.
    """
    base = call_student(exercise, fn, Case("causality", (x.clone(),)))
    T = x.shape[1]
    for t in range(T - 1):
        changed = x.clone()
        changed[:, t + 1:] = rand(*changed[:, t + 1:].shape, seed=1000 + t) * 3
        out = call_student(exercise, fn, Case("causality", (changed,)))
        if not isinstance(out, torch.Tensor) or not isinstance(base, torch.Tensor) or out.shape != base.shape:
            fail(exercise, f"output shape changed between calls: {describe_shape(base)} vs {describe_shape(out)}")
        diff = (out[:, : t + 1] - base[:, : t + 1]).abs()
        if diff.max() > 1e-5:
            pos = int(diff.amax(dim=tuple(i for i in range(diff.dim()) if i != 1)).argmax())
            fail(exercise, f"the future leaks: output at position {pos} changed when only tokens "
                           f"{t + 1}..{T - 1} changed (largest change {diff.max().item():.3g}). "
                           f"Position {pos} must only see tokens 0..{pos}: is the mask applied, and above the diagonal?")
    if not quiet:
        passed(exercise, f"no position sees the future ({T} positions checked)")


def preserve_rng(check: Callable) -> Callable:
    """Run ``check`` without disturbing the caller's random state.

    Checks seed the global generator to build the student's and the reference module alike;
    without this, running a check cell would change every random number drawn after it in the
    student's notebook.
    """
    import functools

    @functools.wraps(check)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            return check(*args, **kwargs)

    return wrapper
