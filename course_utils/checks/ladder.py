"""The smallest configuration that fails (issue 36): a ladder of tiny cases, each adding one feature to the last.

When a check has failed, the message says WHERE the mistake lies as a fact (the first rung that goes wrong, and
which outputs differ there) and the likely cause as a question (the pieces of code that only matter from that rung
on). Each exercise declares its ladder once, as plain data (:class:`Ladder`: its :class:`Rung` s, what each one adds,
what it suspects); :func:`steps` puts the rungs in the exercise's plan (they run in the kernel with the other
steps, as a spec's runs must: under the grader the judge runs outside it), and :func:`diagnose` reads their
outcomes. Expected values come from :func:`core.expect` like every other (live from the reference, or the
recording of the student edition); a rung without one is skipped, never guessed.

:func:`diagnose` never raises and rounds nothing (it prints no number but sizes): a hint is a bonus. It is used
after an exercise's specific hints, so a known mistake keeps its own words.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from course_utils.checks import core, symptoms
from course_utils.checks import expected as _expected
from course_utils.checks.core import Case
from course_utils.checks.spec import RUNG_PREFIX, Step, is_rung  # noqa: F401 - is_rung: ladder.is_rung

#: The runner name of a rung's step (a plain call of the student's code on the rung's case).
RUN = "ladder"


@dataclass(frozen=True)
class Rung:
    """One configuration: ``case`` (tiny), ``adds`` (what it adds to the rung before, in a few words, e.g. "a
    second key block"), and ``suspects`` (the question: the code that only matters from this rung on)."""

    case: Case
    adds: str
    suspects: str


@dataclass(frozen=True)
class Ladder:
    """An exercise's rungs, smallest first, and how to read them. ``make()`` builds the rungs on first use
    (:attr:`rungs`): nothing is computed when the checks are imported, as the grader's fork server does before it
    forks (a parallel PyTorch operation there starts OpenMP threads, on which a forked process deadlocks).
    ``reference(case)`` computes the expected output of a rung (called through :func:`core.expect`, so the student
    edition reads a recording),
    ``parts(output)`` names the outputs to compare (``[("out", tensor), ("lse", tensor)]``; default: the output
    itself), ``atol``/``rtol`` the tolerance of the check. ``runner``: the spec's runner of a rung (default
    :data:`RUN`, a plain call; a kernel's launch runner for a Triton exercise), and ``output(outcome)`` the output
    in what that runner hands out (default: the outcome itself). ``twins``: whether a flag's twin rung being right
    means the flag is misread (not where the flag picks another code path, as a kernel's stages do).
    ``compiled_only``: the rungs run only where the code runs compiled (a Triton kernel on a GPU,
    :func:`compiled_here`); in Triton's interpreter a kernel's seven rungs cost about 0.2 s a check."""

    exercise: str
    make: Callable[[], Sequence[Rung]]
    reference: Callable[[Case], Any]
    parts: Callable[[Any], list[tuple[str, Any]]] | None = None
    atol: float = 1e-5
    rtol: float = 1e-4
    runner: str = RUN
    output: Callable[[Any], Any] | None = None
    twins: bool = True
    compiled_only: bool = False

    @functools.cached_property
    def rungs(self) -> tuple[Rung, ...]:
        """The rungs, built once (their cases' tensors are seeded: the same each time)."""
        return tuple(self.make())


def call(student: Any, case: Case) -> Any:
    """The runner of a rung: the student's code on the rung's case (copies of its tensors: ``spec.run_step``)."""
    return student(*case.args, **case.kwargs)


def compiled_here() -> bool:
    """Whether a Triton kernel runs compiled here (a GPU), not in the interpreter."""
    return torch.cuda.is_available()


def steps(ladder: Ladder, hidden: bool = False) -> list:
    """The rungs as steps of the exercise's visible plan (the ladder's runner; keys start with :data:`spec.RUNG_PREFIX`);
    none in the hidden plan: a diagnosis runs once per check, and a hidden plan's judge finds no rung and says
    nothing of them (:func:`diagnose`). A Triton kernel's rungs take about 0.2 s in the interpreter."""
    if hidden or (ladder.compiled_only and not compiled_here()):
        return []
    return [Step(RUNG_PREFIX + rung.case.key(), rung.case, ladder.runner) for rung in ladder.rungs]


def ran(ladder: Ladder, outcomes: Any, count: int | None = None) -> bool:
    """Whether the first ``count`` rungs (every rung where ``count`` is None) ran: only the visible plan runs them."""
    return all(RUNG_PREFIX + rung.case.key() in outcomes for rung in ladder.rungs[:count])


def outcome(ladder: Ladder, outcomes: Any, rung: Rung) -> Any:
    """A rung's output, or the exception its run raised."""
    got = outcomes[RUNG_PREFIX + rung.case.key()]
    return got if isinstance(got, BaseException) or ladder.output is None else ladder.output(got)


def expected_output(ladder: Ladder, rung: Rung) -> Any:
    """A rung's expected output (live, or recorded in the student edition)."""
    case = rung.case
    return core.expect(ladder.exercise, RUNG_PREFIX + case.key(), lambda: ladder.reference(case))


def record(ladder: Ladder) -> None:
    """While recording (``make build``), compute every rung's expected output, so the student edition holds it
    (a judge calls this where it records the known mistakes' outputs)."""
    if _expected.is_recording():
        for rung in ladder.rungs:
            expected_output(ladder, rung)


def _parts(ladder: Ladder, value: Any) -> list[tuple[str, Any]]:
    return ladder.parts(value) if ladder.parts else [("the output", value)]


def _wrong_parts(ladder: Ladder, want: Any, got: Any) -> list[str] | None:
    """The names of the outputs of ``got`` that differ from ``want`` (``[]``: all agree); ``None`` when ``got``
    has not the form of ``want`` at all (a tuple of another length, no tensor)."""
    wanted, found = _parts(ladder, want), None
    try:
        found = _parts(ladder, got)
    except Exception:  # noqa: BLE001 - a hint is a bonus
        return None
    if len(found) != len(wanted):
        return None
    return [name for (name, w), (_, g) in zip(wanted, found)
            if core.tensor_difference(w, g, ladder.atol, ladder.rtol) is not None]


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _twins(a: Case, b: Case) -> bool:
    """Whether two rungs' cases have the same configuration (tensor shapes, sizes) and differ only in one flag (a
    keyword such as ``causal``)."""
    differ = [k for k in a.kwargs if k in b.kwargs and a.kwargs[k] != b.kwargs[k]]
    return len(a.args) == len(b.args) and set(a.kwargs) == set(b.kwargs) and len(differ) == 1 and \
        type(a.kwargs[differ[0]]) is bool and all(
        (x.shape == y.shape if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else
         type(x) is type(y) and not isinstance(x, torch.Tensor) and x == y) for x, y in zip(a.args, b.args))


def right(ladder: Ladder, outcomes: Any, index: int) -> Rung | None:
    """Rung ``index`` when it has its expected value and its outcome agrees with it; else ``None``."""
    if index >= len(ladder.rungs):
        return None
    rung = ladder.rungs[index]
    found = _compared(ladder, outcomes, rung)
    return rung if found is not None and found[2] == [] else None


def _compared(ladder: Ladder, outcomes: Any, rung: Rung) -> tuple[Any, Any, list] | None:
    """``(output, expected, the wrong parts)`` of a rung that ran without raising and has its expected value; else
    ``None``."""
    got = outcome(ladder, outcomes, rung)
    if isinstance(got, BaseException):
        return None
    try:
        want = expected_output(ladder, rung)
    except _expected.MissingExpectation:
        return None
    return got, want, _wrong_parts(ladder, want, got)


_NOT_ON_PURPOSE = re.compile(r"values to unpack|invalid literal|could not convert|not in list|math domain", re.I)


def _refused(got: Any) -> bool:
    """Whether ``got`` is a ValueError that reads as raised on purpose (a check of the input), not one that Python
    raised by accident (unpacking, conversions)."""
    return isinstance(got, ValueError) and not _NOT_ON_PURPOSE.search(str(got))


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"'{text[0][:120]}'" if text else "no message"


@symptoms.bonus
def diagnose(ladder: Ladder, outcomes: Any, defer: int = 0) -> str | None:
    """The first rung whose outcome is wrong (raised, or differs), as a fact, with its question; ``None`` when
    every rung agrees (the failing case has something no rung has), a rung lacks its expected value or its
    outcome. Where a later rung of the same configuration with another flag (its twin: causal where this one is
    not) is right, that is said instead: the code acts as if the flag were the twin's.

    ``outcomes``: the check's :class:`spec.Outcomes` (rungs looked up by key). ``defer``: say nothing where one
    of the first ``defer`` rungs is the first to fail and no twin is right (there a check's own symptom hints,
    which gradients agree, say more than "wrong from the smallest case on")."""
    if not ran(ladder, outcomes):
        return None  # the hidden plan's outcomes: no rung ran there (:func:`steps`)
    right: list[Rung] = []
    for rung in ladder.rungs:
        try:
            want = expected_output(ladder, rung)
        except _expected.MissingExpectation:
            return None
        got = outcome(ladder, outcomes, rung)
        if isinstance(got, BaseException):
            fact = f"your code raises {type(got).__name__} there"
        else:
            wrong = _wrong_parts(ladder, want, got)
            if wrong == []:
                right.append(rung)
                continue
            fact = (f"{_and(wrong)} differ{'s' if len(wrong) == 1 else ''} there" if wrong
                    else "its output has not the expected form there")
        where = f"{rung.case.name}"
        later = next((r for i in range(len(right) + 1, len(ladder.rungs))
                      if ladder.twins and _twins(rung.case, ladder.rungs[i].case) and (r := right(ladder, outcomes, i)) is not None),
                     None)
        if later is not None:
            said = (f"already the smallest configuration fails ({where}: {fact})" if not right else
                    f"right on the {len(right)} smaller configuration{'s' if len(right) > 1 else ''} (up to "
                    f"{right[-1].case.name}), wrong from {rung.adds} on ({where}: {fact})")
            flags = [k for k in rung.case.kwargs if rung.case.kwargs[k] != later.case.kwargs[k]]
            asked = " and ".join(f"{k}={rung.case.kwargs[k]}" for k in flags)
            other = " and ".join(f"{k}={later.case.kwargs[k]}" for k in flags)
            return (f"{said}, yet the same configuration with {other} is right: does your code act as if {other} "
                    f"where {asked} is asked (the flag read wrongly, or not at all)?")
        if _refused(got):
            said = ("already the smallest configuration" if not right else
                    f"right on the {len(right)} smaller configuration{'s' if len(right) > 1 else ''} (up to "
                    f"{right[-1].case.name}), but {rung.case.name}")
            return (f"{said} raises your own ValueError ({_first_line(got)}), yet that input is valid: it has an "
                    f"expected result, not an error. The condition of your raise refuses too much: check its bound "
                    f"(off by one: >= where > is meant, or <= where <) so that it rejects only what the text forbids.")
        if len(right) < defer:
            return None
        if not right:
            return (f"already the smallest configuration fails ({where}: {fact}), so the mistake is in what every "
                    f"case runs: {rung.suspects}")
        upto = right[-1].case.name
        return (f"right on the {len(right)} smaller configuration{'s' if len(right) > 1 else ''} (up to {upto}), "
                f"wrong from {rung.adds} on ({where}: {fact}). So the mistake is in what only matters from there "
                f"on: {rung.suspects}")
    return None


@symptoms.bonus
def first_wrong(ladder: Ladder, outcomes: Any) -> tuple[Rung, Any, Any] | None:
    """``(rung, output, expected)`` of the first rung whose output (not an exception) differs from its expected value,
    for a check's own symptoms to read where the failing case itself raised; ``None`` where a rung before it raised,
    lacks its outcome or its expected value, or every rung agrees."""
    if not ran(ladder, outcomes):
        return None
    for rung in ladder.rungs:
        found = _compared(ladder, outcomes, rung)
        if found is None:
            return None
        if found[2] != []:
            return rung, found[0], found[1]
    return None
