"""The engine behind every self-check: run the student's code and the reference on the same inputs
and explain the first difference in words.

A check prints ``✅ ...`` when everything agrees. Otherwise it raises ``AssertionError`` whose
message names the exercise, the input case, and what differs (shape, NaNs, the largest error and
where, a causality leak and at which position). The same call therefore works as a student's
self-check and inside an nbgrader test cell.

Expected values never come from answer code in this module: they are asked of
:mod:`course_utils.checks.expected`, which computes them from the reference in the instructor
edition and reads them from the recording in the student edition. The same holds for the outputs
of known mistakes, which name a student's mistake when their output matches one exactly.
"""

from __future__ import annotations

import math
import re
import sysconfig
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from course_utils import rules, versions
from course_utils.device import manual_seed
from course_utils.checks import expected as _expected
from course_utils.checks import symptoms as _symptoms
from course_utils.checks.expected import expect


class CheckFailed(AssertionError):
    """A self-check found a difference; the message says which and where.

    In Jupyter it shows as its message alone, in the error colour (IPython's ``_render_traceback_``
    hook): the engine's own frames say nothing to a student. When the student's code raised the
    error, the lines of *their* code that led to it come first. The cell still fails, for nbgrader
    and nbval alike: only how the error is drawn changes.
    """

    #: The exception the student's code raised, when that is what failed the check.
    student_error: BaseException | None = None

    def _render_traceback_(self) -> list[str]:
        lines = []
        error = self.student_error
        if error is not None and error.__traceback__ is not None:
            frames = [f for f in traceback.extract_tb(error.__traceback__) if _is_students(f.filename)]
            if frames:
                lines += ["Your code raised an error here:", *"".join(traceback.format_list(frames)).rstrip("\n")
                          .splitlines(), f"{type(error).__name__}: {error}", ""]
        return lines + [f"\x1b[0;31m{self}\x1b[0m"]


_LIBRARY_DIRS = tuple(str(Path(p).resolve()) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                                       sysconfig.get_paths()["platlib"], Path(__file__).parent.parent})


def _is_students(filename: str) -> bool:
    """Whether a traceback frame is the student's code (a notebook cell), not a library's or ours."""
    try:
        resolved = str(Path(filename).resolve())
    except (OSError, ValueError):
        return True
    return not resolved.startswith(_LIBRARY_DIRS)


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
    #: For a module: the constructor arguments it is built with, and the mode it runs in.
    build: tuple | None = None
    mode: str = "eval"

    def key(self) -> str:
        """The case's name in the recording: its name, and for a module how it was built and run."""
        return self.name if self.build is None else f"{self.build} {self.mode}() {self.name}"


#: ``diagnose(case, got, expected) -> hint or None``: names the likely mistake behind a failing case.
#: ``got`` is the student's output, or the exception their code raised.
Diagnose = Callable[[Case, object, object], "str | None"]

NOT_IMPLEMENTED = "not implemented yet: replace `raise NotImplementedError()` with your code and run the cell"


def is_stub_error(error: object) -> bool:
    """Whether ``error`` is the stub's own ``NotImplementedError`` (``raise NotImplementedError()``, which says
    nothing), the one error that reads as :data:`NOT_IMPLEMENTED`. PyTorch raises ``NotImplementedError`` too, with
    words (``F.cross_entropy`` given integer logits: '"log_softmax_lastdim_kernel_impl" not implemented for
    'Long''; a module without ``forward``): those read as any other error the student's code raised. An error
    handed out of the kernel comes back with its text only (``wire.error_of``), so the text is what counts."""
    if not isinstance(error, NotImplementedError):
        return False
    try:
        return not str(error).strip()
    except Exception:  # noqa: BLE001 - a student's exception whose __str__ fails
        return False


def is_stub_data(kind: object, message: object) -> bool:
    """:func:`is_stub_error` for an error handed out as plain data, its type's name ``kind`` and its text."""
    return kind == "NotImplementedError" and isinstance(message, str) and not message.strip()


_STUB_LINE = re.compile(r"^\s*raise NotImplementedError(\(\s*\))?\s*(#.*)?$", re.MULTILINE)


def is_stub_source(source: str) -> bool:
    """Whether ``source`` still holds the stub's line, ``raise NotImplementedError()`` (a message-less raise):
    :func:`is_stub_error` read off the code."""
    return bool(_STUB_LINE.search(source or ""))


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


def describe_inputs(args: Sequence[Any]) -> str:
    """``Input shapes: (2, 6, 3), (2, 6, 3)``; numbers are shown as values (``Inputs: 2, 4, 128, 64``)."""
    if all(isinstance(a, torch.Tensor) for a in args):
        return "Input shapes: " + ", ".join(describe_shape(a) for a in args)
    shown = [describe_shape(a) if isinstance(a, torch.Tensor) else
             repr(a) if isinstance(a, (int, float, bool, str)) else type(a).__name__ for a in args]
    return "Inputs: " + ", ".join(shown)


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
    if expected.dtype == torch.bool or got.dtype == torch.bool:
        if got.dtype != expected.dtype:
            return f"expected a tensor of dtype {expected.dtype}, got dtype {got.dtype}"
        g, e = got.detach().cpu(), expected.detach().cpu()
        wrong = (g != e).nonzero()
        if len(wrong):
            i = wrong[0].tolist()
            return (f"{len(wrong)} of {e.numel()} entries differ; first at {_format_index(i)}: "
                    f"expected {bool(e[tuple(i)])}, got {bool(g[tuple(i)])}")
        return None
    g = got.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    nan_got = torch.isnan(g) & ~torch.isnan(e)
    if nan_got.any():
        i = nan_got.nonzero()[0].tolist()
        return (f"got NaN at {_format_index(i)} ({int(nan_got.sum())} NaNs in all) where {e[tuple(i)].item():.4g} "
                f"was expected: an overflow, 0/0 or inf - inf somewhere (or, in a kernel's output, an entry never written)?")
    nan_expected = torch.isnan(e) & ~torch.isnan(g)
    if nan_expected.any():
        i = nan_expected.nonzero()[0].tolist()
        return f"at {_format_index(i)} expected NaN, got {g[tuple(i)].item():.4g}"
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
        want, have = e[idx].item(), g[idx].item()
        digits = _digits_to_tell_apart(want, have)
        return (f"values differ at {int(bad.sum())} of {e.numel()} entries; largest error {err[idx].item():.3g} "
                f"at {_format_index(idx)}: expected {want:.{digits}g}, got {have:.{digits}g}")
    return None


def _digits_to_tell_apart(want: float, have: float) -> int:
    """Significant digits that show how ``want`` and ``have`` differ, 4 at least and 8 at most.

    Enough digits to see the error, and no more: digits past the error are float noise that another
    CPU prints differently.
    """
    gap = abs(want - have)
    size = max(abs(want), abs(have))
    if gap == 0 or size == 0:
        return 4
    return max(4, min(8, math.ceil(math.log10(size / gap)) + 1))


def call_student(exercise: str, fn: Callable, case: Case) -> Any:
    """Call the student's code, turning its exceptions into a readable failure."""
    try:
        return fn(*case.args, **case.kwargs)
    except CheckFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - any error in student code becomes a verdict
        if is_stub_error(exc):
            fail(exercise, NOT_IMPLEMENTED)
        try:
            said = str(exc).strip()
            said += "" if said.endswith((".", "!", "?")) or not said else "."  # a hint may follow
            fail(exercise, f"your code raised {type(exc).__name__}: {said}", case)
        except CheckFailed as error:
            error.student_error = exc
            raise error from exc


def check_rules(exercise: str, obj: object) -> None:
    """Fail if the source of ``obj`` breaks a rule of :mod:`course_utils.rules`."""
    source = rules.source_of(obj) or ""
    if is_stub_source(source):
        fail(exercise, NOT_IMPLEMENTED)
    found = rules.find_violations(source, exercise) if source else []
    if found:
        why = rules.RULES.get(exercise, rules.Rule()).why
        lines = "; ".join(str(v) for v in found)
        fail(exercise, f"{lines}. {why[:1].upper()}{why[1:]}".strip())  # the reason is a sentence of its own


def require_callable(exercise: str, obj: object) -> None:
    """Fail with a clear message if ``obj`` is not something we can call."""
    if not callable(obj):
        fail(exercise, f"expected a function or class, got {type(obj).__name__}: did you run the cell that defines it?")


def hidden_cases(exercise: str) -> Any:
    """The hidden cases of ``exercise`` (their shape is the check's own business).

    They live in ``course_utils.instructor.hidden``, which only the instructor edition (and so the
    grading sandbox) has; asking for them in the student edition raises a clear error.
    """
    try:
        return _expected.instructor().hidden(exercise)
    except _expected.InstructorOnly as exc:
        raise _expected.InstructorOnly(f"hidden test cases of {exercise} are used only when grading: {exc}") from exc


def reference_function(name: str) -> Callable:
    """The reference ``name`` as a callable that is looked up only when it runs (instructor edition)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return _expected.reference(name)(*args, **kwargs)
    return call


def mistake_outputs(exercise: str, case: Case) -> list:
    """``[[hint, output], ...]``: what each known mistake of ``exercise`` gives on ``case``.

    The mistakes themselves are code in ``course_utils.instructor``; the student edition
    holds only their recorded outputs on the visible cases.
    """
    return expect(exercise, f"mistakes: {case.key()}", lambda: _expected.instructor().outputs(exercise, case))


def family_outputs(exercise: str, case: Case, name: str) -> list:
    """``[[words, output], ...]``: what each member of ``exercise``'s family of mistakes ``name`` gives on ``case``
    (issue 36; a family may leave out the members that give the right answer there).

    A family's model is the right computation with one thing changed, so it is the answer with one edit: it is code
    in ``course_utils.instructor`` (``FAMILIES``), and the student edition holds only its recorded outputs on the
    visible cases, as for :func:`mistake_outputs`.
    """
    return expect(exercise, f"family {name}: {case.key()}",
                  lambda: _expected.instructor().family(exercise, name, case))


def record_families(exercise: str, cases: list[Case]) -> None:
    """While recording (``make build``), the outputs of every family of ``exercise`` (its ``FAMILIES`` in
    ``course_utils.instructor``) on each of ``cases``: a check asks for them only where an answer fails, which the
    reference it records never does."""
    if _expected.is_recording():
        names = _expected.instructor().families(exercise)
        for case in cases:
            for name in names:
                family_outputs(exercise, case, name)


def explain(exercise: str, case: Case, got: Any, want: Any, diagnose: "Diagnose | None" = None) -> str | None:
    """One sentence naming the likely mistake behind ``got`` (an output or an exception), or ``None``.

    In this order: a known mistake whose output ``got`` matches exactly (NaNs included); the
    exercise's own ``diagnose``; a transformation of the expected output that explains ``got`` (a
    constant factor, a transpose). A hint is a bonus: the failure stands without it, and no Exception
    escapes (a diagnosis that finds a handed-out outcome forged, ``spec.Forged``, is not one).
    """
    try:
        if isinstance(got, (NotImplementedError, CheckFailed)) and NOT_IMPLEMENTED in str(got):
            return None
        if not isinstance(got, BaseException):
            for hint, output in mistake_outputs(exercise, case):
                if _difference(output, got, 1e-5, 1e-4) is None:
                    return hint
        if diagnose is not None:
            hint = diagnose(case, got, want)
            if hint:
                return hint
        if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor):
            return transformation_hint(want, got)
        if isinstance(got, BaseException):
            shapes = [tuple(t.shape) for t in (*case.args, want) if isinstance(t, torch.Tensor)]
            return shape_error_hint(got, shapes) or _symptoms.error_hint(got) or pair_error_hint(got)
    except Exception:  # noqa: BLE001 - a hint is a bonus
        return None
    return None


# ------------------------------------------------------------------------------------------
# Symptom diagnoses shared by every check (additive: each returns a hint or ``None``). Stable names,
# used by the notebooks' own checks too: ``name_factor`` (a factor's simple name, log 2 included),
# ``transformation_hint`` (an exact multiple, a transpose), ``shape_error_hint`` (a raw PyTorch shape
# error translated into what it means).
# ------------------------------------------------------------------------------------------
_MATMUL_ERROR = re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")
_BATCH_MATMUL_ERROR = re.compile(r"Expected size for first two dimensions of batch2 tensor to be: \[(\d+), (\d+)\] "
                                 r"but got: \[(\d+), (\d+)\]")


_RETURN_PAIR = re.compile(r"torch\.return_types\.(max|min|sort|topk|kthvalue|mode|median)\b")


def pair_error_hint(error: BaseException) -> str | None:
    """A ``(values, indices)`` pair used where a tensor was meant: ``x.max(dim=...)`` (and ``min``, ``sort``,
    ``topk``, ...) given a dimension returns both, and PyTorch's error names the pair's type."""
    found = _RETURN_PAIR.search(str(error))
    if not found:
        return None
    op = found.group(1)
    also = " or x.amax(dim, keepdim=True)" if op == "max" else " or x.amin(dim, keepdim=True)" if op == "min" else ""
    return (f"torch.{op} over a dimension returns a pair (values, indices), and the pair was used where a tensor was "
            f"meant: take its .values (x.{op}(dim, keepdim=True).values{also}).")


def shape_error_hint(error: BaseException, shapes: Sequence[Sequence[int]] = ()) -> str | None:
    """What a raw PyTorch shape error raised inside the student's code means, in words; ``None`` for
    any other error.

    ``mat1 and mat2 shapes cannot be multiplied (4x3 and 4x2)`` becomes "a matrix product of a
    (4, 3) and a (4, 2) operand: the first's columns (3) must equal the second's rows (4)", with a
    missing transpose named when transposing an operand would make it fit. A broadcasting error
    names the two sizes and the dimension; it names a reduction without keepdim only where that is what
    the sizes show: a tensor of one of ``shapes`` (the case's tensors, e.g. its inputs and the expected
    output) combined with itself reduced over one dimension fails with exactly these sizes at this
    dimension (issue 36: a guess that blamed keepdim for every broadcast misled).
    """
    text = str(error)
    match = _MATMUL_ERROR.search(text)
    if match:
        r1, c1, r2, c2 = (int(g) for g in match.groups())
        fix = ""
        if c1 == c2:
            fix = f" Transposing the second operand would fit: (A @ B.T) is ({r1}, {c1}) @ ({c2}, {r2}), a missing transpose?"
        elif r1 == r2:
            fix = f" Transposing the first operand would fit: (A.T @ B) is ({c1}, {r1}) @ ({r2}, {c2}), a missing transpose?"
        return (f"a matrix product of a ({r1}, {c1}) and a ({r2}, {c2}) operand: the first's columns ({c1}) must "
                f"equal the second's rows ({r2}).{fix} Print the shapes of both operands on that line.")
    match = _BATCH_MATMUL_ERROR.search(text)
    if match:
        want_b, want_k, got_b, got_k = (int(g) for g in match.groups())
        return (f"a batched matrix product whose operands do not fit: the second operand needs {want_k} rows "
                f"(the first's last size) and a batch of {want_b}, but has {got_k} rows and a batch of {got_b}. "
                f"A missing transpose(-2, -1), or operands in the wrong order?")
    match = _symptoms.broadcast_sizes(text)
    if match:
        a, b, dim = match
        saw = (f"two tensors combined element by element do not broadcast: one has {a} entries along "
               f"{'a dimension' if dim is None else f'dimension {dim}'}, the other {b}.")
        lost = _lost_reduction(a, b, dim, shapes)
        if lost is None:
            return f"{saw} Print the shapes of both operands on that line: which one has a size you did not mean there?"
        shape, r, reduced = lost
        return (f"{saw} These are the sizes of a {_shape_text(shape)} tensor meeting itself reduced over dimension "
                f"{r} without keepdim, {_shape_text(reduced)}: did a reduction lose its dimension? Keep it with "
                f"keepdim=True (or index [..., None]) so that the result lines up with the tensor it is combined with.")
    return None


def _shape_text(shape: Sequence[int]) -> str:
    return f"({shape[0]},)" if len(shape) == 1 else str(tuple(shape))


def _broadcast_failure(first: Sequence[int], second: Sequence[int]) -> tuple[int, int, int] | None:
    """``(a, b, dim)`` of the error PyTorch raises when tensors of these shapes are combined element by element
    (it compares sizes from the last dimension on and names the first pair that differs, neither of them 1)."""
    n = max(len(first), len(second))
    for i in range(n - 1, -1, -1):
        sa = first[i - n + len(first)] if i >= n - len(first) else 1
        sb = second[i - n + len(second)] if i >= n - len(second) else 1
        if sa != sb and 1 not in (sa, sb):
            return sa, sb, i
    return None


def _lost_reduction(a: int, b: int, dim: int | None, shapes: Sequence[Sequence[int]]
                    ) -> tuple[tuple[int, ...], int, tuple[int, ...]] | None:
    """``(shape, r, reduced)`` where a tensor of one of ``shapes`` combined with itself reduced over dimension
    ``r`` without keepdim (``reduced``), in either order, fails with sizes ``a``, ``b`` at ``dim`` (any dimension
    where ``dim`` is ``None``); else ``None``."""
    for shape in shapes:
        shape = tuple(int(n) for n in shape)
        for r in range(len(shape)):
            reduced = shape[:r] + shape[r + 1:]
            for first, second in ((shape, reduced), (reduced, shape)):
                found = _broadcast_failure(first, second)
                if found is not None and found[:2] == (a, b) and dim in (None, found[2]):
                    return shape, r, reduced
    return None


def transformation_hint(want: torch.Tensor, got: torch.Tensor) -> str | None:
    """Name a simple transformation that turns the expected output into ``got``, if there is one:
    the last two dimensions swapped, or every value multiplied by the same factor."""
    if got.shape != want.shape:
        if want.dim() >= 2 and got.shape == want.transpose(-2, -1).shape and \
                tensor_difference(want.transpose(-2, -1), got) is None:
            return "your output is the expected one with its last two dimensions swapped: a transpose too many or too few?"
        return None
    g, w = got.detach().to(torch.float64).cpu(), want.detach().to(torch.float64).cpu()
    if not (torch.isfinite(g).all() and torch.isfinite(w).all()):
        return None
    if w.dim() >= 2 and w.shape[-1] == w.shape[-2] and tensor_difference(w.transpose(-2, -1), g) is None:
        return "your output is the expected one transposed (rows and columns swapped): check the order of a matmul or a transpose."
    nonzero = w.abs() > 1e-6
    if nonzero.sum() < 2 or not torch.equal(nonzero, g.abs() > 1e-6 * max(1.0, float(g.abs().max()))):
        return None
    ratio = g[nonzero] / w[nonzero]
    factor = float(ratio.mean())
    if abs(factor - 1) < 1e-3 or not torch.allclose(ratio, torch.full_like(ratio, factor), rtol=1e-3, atol=1e-6):
        return None
    return f"every value is {factor:.4g} times the expected one{name_factor(factor)}: a scaling too many, or a wrong one?"


def name_factor(factor: float) -> str:
    """`` (= 1/sqrt(2))``-style name of a factor, when it is a simple one; ``ln 2`` and ``1/ln 2``
    (= log2(e)) say that natural and base-2 logarithms were mixed."""
    for value, text in ((factor, ""), (1 / factor, "1/")):
        if math.isclose(value, math.log(2), rel_tol=1e-4):
            return (f" (= {'1/ln 2 = log2(e)' if text else 'ln 2'}: natural and base-2 logarithms mixed up; "
                    f"log2(x) = ln(x) / ln 2)")
    for value, text in ((factor, ""), (1 / factor, "1/")):
        for n in range(2, 4097):
            if math.isclose(value, math.sqrt(n), rel_tol=1e-4) and int(math.isqrt(n)) ** 2 != n:
                return f" (= {text}sqrt({n}))"
            if math.isclose(value, n, rel_tol=1e-4):
                return f" (= {text}{n}{f' = {text}sqrt({n * n})' if n * n <= 4096 else ''})"
    return ""


def _hinted(error: CheckFailed, hint: str | None) -> CheckFailed:
    if not hint:
        return error
    hinted = CheckFailed(f"{error} Hint: {hint}")
    hinted.student_error = error.student_error
    return hinted


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


#: Every module in a check is built right after ``torch.manual_seed(BUILD_SEED)`` and run right after
#: ``torch.manual_seed(FORWARD_SEED)``: equal seeds give the student's and the reference module equal
#: weights (the course's classes create their parameters in the book's order) and equal dropout.
BUILD_SEED, FORWARD_SEED = 123, 7


def construct(cls: Callable, build: tuple, seed: int = BUILD_SEED) -> Any:
    """``cls(*build)`` right after ``torch.manual_seed(seed)``."""
    manual_seed(seed)
    return cls(*build)


def module_output(module: Any, case: Case, seed: int = FORWARD_SEED) -> Any:
    """``module(*case.args)`` in ``case.mode`` (``eval`` or ``train``) right after ``torch.manual_seed(seed)``."""
    getattr(module, case.mode)()
    manual_seed(seed)
    return module(*_clone(case.args), **case.kwargs)


def parameter_shapes(module: Any) -> list[tuple[int, ...]]:
    """The shapes of ``module.parameters()``, in creation order."""
    return [tuple(p.shape) for p in module.parameters()]


def expected_parameter_shapes(exercise: str, build: tuple, *, reference: str | None = None,
                              seed: int = BUILD_SEED) -> list[tuple[int, ...]]:
    """The parameter shapes of the reference module built with ``build`` (live or recorded)."""
    ref_name = reference or exercise
    want = expect(exercise, f"parameter shapes {build}",
                  lambda: parameter_shapes(construct(_expected.reference(ref_name), build, seed)))
    return [tuple(s) for s in want]


def reference_output(exercise: str, case: Case, reference: str | None = None) -> Any:
    """The reference module's output on a module case (built with ``case.build``, run in ``case.mode``)."""
    return expect(exercise, case.key(),
                  lambda: module_output(construct(_expected.reference(reference or exercise), case.build), case))


def random_outputs_comparable(exercise: str, kind: str = "dropout") -> bool:
    """Whether outputs drawn at random (``kind``: ``dropout`` or ``sampling``) can be compared here, and
    if not, a line that says why.

    Read from a recording, they are only comparable where this PyTorch draws the same numbers from a
    seed as the one that recorded them (:func:`course_utils.versions.same_random_stream`). Live (the
    grader, the instructor) they always are.
    """
    if _expected.mode() != _expected.RECORDED or versions.same_random_stream(kind):
        return True
    what, drawn = ("outputs with dropout (train() mode)", "dropout masks") if kind == "dropout" \
        else ("sampled tokens", "samples")
    print(f"ℹ️ {exercise}: {what} are not compared here: from the same seed, your PyTorch {torch.__version__} "
          f"draws different {drawn} from the PyTorch that recorded these checks. The grader compares them.")
    return False


def modes_to_compare(exercise: str, train: bool) -> tuple[str, ...]:
    """The modes whose outputs a module check compares: ``eval``, and ``train`` when ``train`` is set
    and outputs with dropout are comparable here (:func:`random_outputs_comparable`)."""
    return ("eval", "train") if train and random_outputs_comparable(exercise) else ("eval",)


def causal_inputs(x: torch.Tensor) -> list[torch.Tensor]:
    """The inputs :func:`check_causal` gives after ``x`` itself: for each position ``t`` but the last,
    ``x`` with the tokens after ``t`` replaced by other random values."""
    found = []
    for t in range(x.shape[1] - 1):
        changed = x.clone()
        changed[:, t + 1:] = rand(*changed[:, t + 1:].shape, seed=1000 + t) * 3
        found.append(changed)
    return found


def check_causal(exercise: str, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, *, quiet: bool = True) -> None:
    """Fail if output position ``i`` of ``fn(x)`` (shape ``(b, T, ...)``) depends on a token after ``i``.

    For each position ``t`` the tokens after ``t`` are replaced by other random values; every
    output up to ``t`` must stay the same.
    """
    base = call_student(exercise, fn, Case("causality", (x.clone(),)))
    T = x.shape[1]
    for t, changed in enumerate(causal_inputs(x)):
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


def check(fn: Callable) -> Callable:
    """Mark ``fn`` as a public self-check: it runs without disturbing the caller's random state."""
    return preserve_rng(fn)


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
