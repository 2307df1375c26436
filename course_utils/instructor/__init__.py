"""The instructor-only half of the checks: hidden cases and known mistakes. Never released.

One module per notebook (``nb01.py`` ...), each defining

    HIDDEN   = {exercise: function () -> the hidden cases, in the shape that exercise's check takes}
    MISTAKES = {exercise: [Mistake(hint, wrong), ...]}
    FAMILIES = {exercise: {family: function (case) -> [[words, output], ...]}}  (where a check models one)

A mistake is a plausible wrong answer written as code: for a function exercise, ``wrong`` takes a
case's arguments and returns what the mistaken function would (``None`` where the mistake cannot
show on that input); for a module exercise, ``wrong`` is a mistaken class with the reference's
constructor. The checks compare a failing student output with these outputs, and name the mistake
whose output it matches. A family is many such mistakes written as one model, the right computation
with one thing changed (a comparison turned, a slice shifted, an operand swapped), each member named
by the words the check completes; its model is the answer with one edit, so it lives here too. The
student edition ships only the outputs on the visible cases, recorded by ``make build``; this
package, like ``course_utils.reference``, stays with the instructor.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from course_utils.checks.core import Case, construct, module_output

NOTEBOOK_MODULES = ("nb01", "nb02", "nb03", "nb04", "nb05", "nb06", "nb07", "nb08", "nb09", "nb10", "nb11")


@dataclass(frozen=True)
class Mistake:
    """A known mistake: the hint a student reads, and the wrong code that produces it."""

    hint: str
    wrong: Callable[..., Any]


def _modules() -> list:
    found = []
    for name in NOTEBOOK_MODULES:
        try:
            found.append(importlib.import_module(f"course_utils.instructor.{name}"))
        except ModuleNotFoundError as exc:
            if exc.name != f"course_utils.instructor.{name}":
                raise
    return found


def hidden(exercise: str) -> Any:
    """The hidden cases of ``exercise``."""
    for module in _modules():
        if exercise in getattr(module, "HIDDEN", {}):
            return module.HIDDEN[exercise]()
    raise LookupError(f"no hidden cases are defined for {exercise!r} in course_utils.instructor")


def mistakes(exercise: str) -> list[Mistake]:
    """The known mistakes of ``exercise`` (an empty list when none is written down)."""
    for module in _modules():
        if exercise in getattr(module, "MISTAKES", {}):
            return list(module.MISTAKES[exercise])
    return []


def outputs(exercise: str, case: Case) -> list[list]:
    """``[[hint, output], ...]`` of every known mistake of ``exercise`` that applies to ``case``.

    A mistake that raises or returns ``None`` on this input does not apply to it and is left out.
    """
    found = []
    for mistake in mistakes(exercise):
        try:
            if case.build is not None:
                value = module_output(construct(mistake.wrong, case.build), case)
            else:
                value = mistake.wrong(*[a.clone() if hasattr(a, "clone") else a for a in case.args], **case.kwargs)
        except Exception:  # noqa: BLE001 - a mistake that cannot run on this input does not apply
            continue
        if value is not None:
            found.append([mistake.hint, value.detach() if hasattr(value, "detach") else value])
    return found


def families(exercise: str) -> list[str]:
    """The names of ``exercise``'s families of mistakes (``FAMILIES[exercise]`` of its notebook's module)."""
    return [name for module in _modules() for name in getattr(module, "FAMILIES", {}).get(exercise, {})]


def family(exercise: str, name: str, case: Case) -> list[list]:
    """``[[words, output], ...]`` of the members of ``exercise``'s family of mistakes ``name`` on ``case`` (a model
    may leave out those that give the right output there; an empty list where the exercise models no such family)."""
    for module in _modules():
        if name in getattr(module, "FAMILIES", {}).get(exercise, {}):
            return module.FAMILIES[exercise][name](case)
    return []
