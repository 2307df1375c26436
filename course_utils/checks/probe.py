"""The kernel's side of grading outside the kernel: run the student's function, hand the outputs out.

Under the grader, for the exercises it judges itself (see ``grader/judge.py``), a check does not
compare anything in the student's kernel. :func:`course_utils.checks.core.compare_function` calls
:func:`record` instead, which runs the student's function on every case, visible and hidden, and
writes what came back to a folder that the grader reads once the kernel has exited:

- a tensor (detached, on the CPU, a plain ``torch.Tensor``), a number, ``None``, a string, or a
  list or tuple of those;
- an exception, as its type name and its message text;
- anything else as its type name only;

and, once per exercise, the source of the function checked (for the rules and the diagnoses that
read code, as ``check_rules`` in the kernel read it).

The grader then replays these outputs through the same checks, in its own process, against the
reference. Nothing in this kernel decides a verdict, and nothing here holds an answer, an expected
value or a hidden *output*: the hidden *inputs* reach the kernel as data that the grader wrote
(:func:`hidden_cases`).

The grader switches this on with environment variables that only its sandboxed kernel sees:

- ``COURSE_PROBE_DIR``: the folder to write into, one file per test cell, ``<test id>.pt``
  (``torch.save`` of plain data and tensors, read back with ``torch.load(weights_only=True)``);
- ``COURSE_PROBE_INPUTS``: the grader's file of the judged exercises and their hidden cases.

A test cell starts with ``probe.begin("<test id>")`` (a line the grader adds); the end of the cell
ends the test. Outside a test cell, and wherever these variables are not set (JupyterLab, Colab,
nbval, the instructor's own runs), checks compare as always.

Everything here is untrusted on the grader's side: the student controls this kernel and may write
anything into the folder. :func:`inputs_of` hands each case's inputs out beside its output, so that
the grader can check that an output was computed from the inputs it asked for (up to the rounding of
another CPU: the grader and the kernel may compute float32 inputs in different last bits).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

#: The folder the kernel writes its outputs to (set by the grader in the sandboxed kernel only).
DIR_VARIABLE = "COURSE_PROBE_DIR"
#: The grader's file of judged exercises and their hidden cases (read-only in the kernel).
INPUTS_VARIABLE = "COURSE_PROBE_INPUTS"
#: Version of the hand-off format; the grader refuses any other.
FORMAT = 1
#: Longest exception message kept, in characters.
MAX_MESSAGE = 2000
#: Longest source of a checked function kept, in characters.
MAX_SOURCE = 100_000
#: How deep a returned list or tuple is followed, and how long it may be.
MAX_DEPTH, MAX_ITEMS = 4, 64

_current: list[str] = []  # the test cell running now: [] or [test id]
_records: dict[str, list[dict]] = {}  # test id -> what its checks handed out so far
_sources: dict[str, dict[str, str]] = {}  # test id -> exercise -> the source of the function checked
_inputs: dict[str, Any] | None = None
_hooked = False


def enabled() -> bool:
    """Whether the grader asked this kernel to hand outputs out."""
    return bool(os.environ.get(DIR_VARIABLE)) and bool(os.environ.get(INPUTS_VARIABLE))


def _grader_inputs() -> dict[str, Any]:
    """``{"format": 1, "exercises": {exercise: [case, ...]}}`` as the grader wrote it (read once)."""
    global _inputs
    if _inputs is None:
        _inputs = torch.load(os.environ[INPUTS_VARIABLE], map_location="cpu", weights_only=True)
    return _inputs


def judged(exercise: str) -> bool:
    """Whether the grader judges ``exercise`` itself (so the kernel only hands outputs out)."""
    return enabled() and exercise in _grader_inputs().get("exercises", {})


def active(exercise: str) -> bool:
    """Whether a check of ``exercise`` should hand its outputs out now: under the grader, for an
    exercise it judges, inside one of its test cells."""
    return bool(_current) and judged(exercise)


def begin(test_id: str) -> None:
    """Start test cell ``test_id``: what its checks hand out replaces anything handed out before
    under that id (a cell run again after a kernel restart). The test ends with the cell."""
    global _hooked
    _current[:] = [test_id]
    _records[test_id] = []
    _sources[test_id] = {}
    _save(test_id)
    if not _hooked:
        try:
            from IPython import get_ipython

            shell = get_ipython()
        except ImportError:
            shell = None
        if shell is not None:
            shell.events.register("post_run_cell", _end)
        _hooked = True


def _end(*_: Any) -> None:
    _current.clear()


def hidden_cases(exercise: str) -> list:
    """The hidden cases of ``exercise`` as the grader handed them in (inputs only)."""
    from course_utils.checks.core import Case

    return [Case(c["name"], tuple(c["args"]), dict(c["kwargs"])) for c in _grader_inputs()["exercises"][exercise]]


def encode_cases(cases: Sequence[Any]) -> list[dict]:
    """Cases as plain data for the inputs file (the grader's side of :func:`hidden_cases`)."""
    return [{"name": c.name, "args": list(c.args), "kwargs": dict(c.kwargs)} for c in cases]


# --------------------------------------------------------------------------------------------
# A case's inputs, handed out beside its output
# --------------------------------------------------------------------------------------------
def inputs_of(args: Sequence[Any], kwargs: dict) -> dict:
    """A call's inputs as plain data (:func:`encode`): ``{"args": <list>, "kwargs": {name: value}}``.

    The grader compares them with the inputs it gave: tensors by dtype, shape and values (floating
    point up to ``torch.testing.assert_close``'s tolerance for the dtype, since the kernel and the
    grader may round float32 arithmetic differently; everything else exactly).
    """
    return {"args": encode(list(args)), "kwargs": {str(k): encode(kwargs[k]) for k in sorted(kwargs, key=str)}}


# --------------------------------------------------------------------------------------------
# What came back, as plain data
# --------------------------------------------------------------------------------------------
def encode(value: Any, depth: int = 0) -> dict:
    """A returned value as plain data: ``{"kind": "tensor" | "number" | "none" | "text" | "list" |
    "tuple" | "other", ...}``."""
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu")
        if t.layout != torch.strided:
            return {"kind": "other", "type": type(value).__name__}
        return {"kind": "tensor", "value": t.as_subclass(torch.Tensor).clone()}
    if isinstance(value, (bool, int, float)):
        return {"kind": "number", "type": type(value).__name__, "value": value}
    if value is None:
        return {"kind": "none"}
    if isinstance(value, str) and len(value) <= MAX_MESSAGE:
        return {"kind": "text", "value": value}
    if isinstance(value, (list, tuple)) and depth < MAX_DEPTH and len(value) <= MAX_ITEMS:
        return {"kind": type(value).__name__, "items": [encode(v, depth + 1) for v in value]}
    return {"kind": "other", "type": type(value).__name__}


def _error(exc: BaseException) -> dict:
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a student's exception whose __str__ fails
        message = ""
    return {"type": type(exc).__name__, "message": message[:MAX_MESSAGE]}


def record(exercise: str, student: Callable, cases: Sequence[Any]) -> None:
    """Run ``student`` on every case and hand out what came back (the kernel's whole part of
    :func:`course_utils.checks.core.compare_function` under the grader). Never compares."""
    from course_utils import rules

    test_id = _current[0]
    store = _records.setdefault(test_id, [])
    source = rules.source_of(student) if callable(student) else None
    if source is not None:  # what the rules and the diagnoses that read code read, as the kernel sees it
        _sources.setdefault(test_id, {})[exercise] = source[:MAX_SOURCE]
    if not callable(student):
        store.append({"exercise": exercise, "callable": False, "type": type(student).__name__})
        _save(test_id)
        return
    for case in cases:
        entry: dict[str, Any] = {"exercise": exercise, "inputs": inputs_of(case.args, case.kwargs)}
        args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in case.args)
        try:
            entry["result"] = encode(student(*args, **case.kwargs))
        except Exception as exc:  # noqa: BLE001 - an error in student code is an outcome to hand out
            entry["error"] = _error(exc)
        changed = [i for i, (before, after) in enumerate(zip(case.args, args))
                   if isinstance(before, torch.Tensor) and not _same(before, after)]
        if changed:
            entry["changed_inputs"] = changed
        store.append(entry)
    _save(test_id)  # once per check call: a call cut short (a time limit, a crash) hands out none of its cases


def _same(before: torch.Tensor, after: Any) -> bool:
    return isinstance(after, torch.Tensor) and torch.equal(before, after)


def _save(test_id: str) -> None:
    """Write test ``test_id``'s records (a new file moved into place, so a reader never sees half)."""
    folder = Path(os.environ[DIR_VARIABLE])
    path = folder / f"{test_id}.pt"
    partial = folder / f".{test_id}.pt.partial"
    torch.save({"format": FORMAT, "test": test_id, "records": _records[test_id],
                "sources": _sources.get(test_id, {})}, partial)
    os.replace(partial, path)
