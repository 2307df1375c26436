"""The kernel's side of grading outside the kernel: run the student's function, hand the outputs out.

Under the grader, for the exercises it judges itself (see ``grader/judge.py``), a check does not
compare anything in the student's kernel. :func:`course_utils.checks.core.compare_function` calls
:func:`record` instead, which runs the student's function on every case, visible and hidden, and
writes what came back to a folder that the grader reads once the kernel has exited:

- a tensor (detached, on the CPU, a plain ``torch.Tensor``), a number, ``None``, a string, or a
  list or tuple of those;
- an exception, as its type name and its message text;
- anything else as its type name only;
- for a module exercise (:func:`record_module`, the kernel's part of ``compare_module``): each
  construction under the check's seed, as the module's parameters (names, in creation order, and
  values) and the kinds of the attributes the check names (``Parameter``, ``Linear``... from
  :data:`KINDS`, never a class), or what the constructor raised or returned; then the module's
  output on every case, in every mode the check runs, under the check's seed;
- for a module check that probes the module (notebook 04's ``CausalAttention``,
  :func:`record_module_probes`): each construction once, with its make-up (buffers, tensors kept
  as plain attributes, what ``.to("meta")`` left behind), and every forward pass the check makes
  (:class:`Probe`: mode, the seed set before it, the copy it runs on, the input);
- for a module whose outputs depend on every call before them (notebook 08's KV cache,
  :func:`record_sessions`): each construction the check makes and, in the check's order, every
  :class:`Step` it makes on that module (forward passes with or without the cache, ``reset_cache()``,
  ``.to``, deep copies), each step's outcome and, after it, a :func:`snapshot` of the state the check
  reads (the cache);
- a tensor on the ``meta`` device (a stand-in for a GPU) as its dtype and shape;
- for a forward pass whose check counts calls of a torch function (notebook 06's one call of
  ``F.scaled_dot_product_attention``), how often it called it (:class:`CallCounter`);
- for a check that runs the student's code its own way (notebook 06's timer on a simulated
  device), what it observed per case (:func:`record_runs`);
- for a function that changes modules in place (``record(..., prepare=..., attributes=...)``):
  what it returned or raised, and what it left in the named attributes of each module it was
  given (their kinds and values, or ``unchanged``);
- for a function of a module whose values do not matter (notebook 05's ``count_parameters``,
  ``record(..., layouts=True)``): each module it was given as its layout (:func:`module_layout`:
  submodules, parameters' shapes, dtypes and ``requires_grad``, buffers, shared tensors), beside
  its output; its hidden modules arrive as layouts too, rebuilt here (:func:`build_layout`);

and, once per exercise, the source of the function checked (for the rules and the diagnoses that
read code, as ``check_rules`` in the kernel read it), and the ATen operations of ``rules.WATCHED_OPS``
that the student's code ran while the kernel ran it for the grader (:class:`OpRecorder`: a library
softmax reached by a name built at run time still dispatches ``aten._softmax``), which the grader holds
against the exercise's rule (``rules.op_violations``). An exercise checked with the notebook's other
exercises (``modules.alone``) hands its records out once per try of ``modules.check_alone``, each
marked with its try (``"attempt"``, :func:`trying`).

The grader then replays these outputs through the same checks, in its own process, against the
reference. Nothing in this kernel decides a verdict, and nothing here holds an answer, an expected
value or a hidden *output*: the hidden *inputs* reach the kernel as data that the grader wrote
(:func:`hidden_cases`).

The grader switches this on with environment variables that only its sandboxed kernel sees:

- ``COURSE_PROBE_DIR``: the folder to write into, one file per test cell, ``<test id>.handoff``
  (:func:`write_hand_off`: JSON for the plain data, raw bytes for the tensors; no pickle, so the
  grader reads it with ``json`` and ``torch.frombuffer`` alone);
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

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from course_utils.checks import wire
from course_utils.checks.wire import (DIR_VARIABLE, FORMAT, HAND_OFF_MAGIC, INPUTS_VARIABLE, MAX_DEPTH,  # noqa: F401
                                      MAX_INT_BITS, MAX_ITEMS, MAX_MESSAGE, MAX_OPS, MAX_SOURCE, TENSOR_KEY,
                                      error_of, hand_off_path, write_hand_off)
from course_utils.device import manual_seed

#: Most parameters handed out for one module.
MAX_PARAMETERS = 256
#: The kinds an attribute of a module is handed out as (see :func:`kind_of`).
KINDS = ("Parameter", "Tensor", "Linear", "Module", "None", "other")


class ReplayMiss(BaseException):
    """Raised by the grader's replay of a student's code (``grader/judge.py``) for a call it has no
    handed-out output for. A ``BaseException``, so that the check engine, which turns a student's
    ``Exception`` into a verdict, lets it through; only the diagnoses' path (``core.explain``) stops
    it, since a hint is a bonus."""

_current: list[str] = []  # the test cell running now: [] or [test id]
_records: dict[str, list[dict]] = {}  # test id -> what its checks handed out so far
_pending: dict[str, int] = {}  # test id -> its records of finished check calls, not yet written
_sources: dict[str, dict[str, str]] = {}  # test id -> exercise -> the source of the function checked
_ops: dict[str, dict[str, set]] = {}  # test id -> exercise -> the ATen operations its code dispatched (OpRecorder)
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
    return enabled() and (exercise in _grader_inputs().get("exercises", {})
                          or exercise in _grader_inputs().get("plans", {}))


def plan(exercise: str, hidden: bool) -> list[tuple[str, Any, str]]:
    """The plan the grader sent in for ``exercise``'s check (visible, or with ``hidden`` the hidden one too):
    ``(key, case, run)`` of each step (``spec.Step``), its case rebuilt from plain data (:func:`encode_plan`)."""
    steps = _grader_inputs()["plans"][exercise]["hidden" if hidden else "visible"]
    return [(str(s["key"]), _decode_cases([s["case"]])[0], str(s["run"])) for s in steps]


def encode_plan(steps: Sequence[Any]) -> list[dict]:
    """A spec's plan as plain data for the inputs file (the grader's side of :func:`plan`)."""
    return [{"key": s.key, "run": s.run, "case": encode_cases([s.case])[0]} for s in steps]


def active(exercise: str) -> bool:
    """Whether a check of ``exercise`` should hand its outputs out now: under the grader, for an
    exercise it judges, inside one of its test cells."""
    return bool(_current) and judged(exercise)


def begin(test_id: str) -> None:
    """Start test cell ``test_id``: what its checks hand out replaces anything handed out before
    under that id (a cell run again after a kernel restart). The test ends with the cell."""
    global _hooked
    _end()  # a test cell whose end went unnoticed (no IPython) is written now
    _current[:] = [test_id]
    _records[test_id] = []
    _sources[test_id] = {}
    _ops[test_id] = {}
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
    """The end of a cell (IPython's ``post_run_cell``): the test that ran in it is over, and what its
    check calls handed out is written, once (:func:`_handed`)."""
    _current.clear()
    for test_id, complete in list(_pending.items()):
        del _records[test_id][complete:]  # a check call cut short (a time limit) hands out none of its cases
        _save(test_id)
    _pending.clear()


def _handed(test_id: str) -> None:
    """A check call of test ``test_id`` has handed out all it will: its records are written when the
    cell ends (:func:`_end`). Written once per cell, not once per call: a file rewritten after every
    call costs time that grows with the square of the records (536 records and about 1 MB for the
    hidden test of notebook 08's cache class). A kernel that dies in the cell hands out nothing of it,
    which scores that test 0, as a missing call does."""
    _pending[test_id] = len(_records.get(test_id, []))


def hidden_cases(exercise: str) -> Any:
    """The hidden cases of ``exercise`` as the grader handed them in (inputs only): cases, or for a
    module exercise ``(constructor_args, cases)`` pairs, or a mapping of named groups of these."""
    return _decode_cases(_grader_inputs()["exercises"][exercise])


def _decode_cases(cases: Any) -> Any:
    from course_utils.checks.core import Case

    def case(c: dict) -> Case:
        build = tuple(c["module_build"]) if "module_build" in c else None
        found = Case(c["name"], _rebuilt_args(c), dict(c["kwargs"]), build=build, mode=str(c.get("mode", "eval")))
        if "chunks" in c:  # a sequence read in pieces with a cache (notebook 08's DecodeCase): plain data here
            found.chunks, found.dtype = [int(n) for n in c["chunks"]], getattr(torch, str(c["dtype"]))
        return found

    if isinstance(cases, dict):  # named groups of cases (notebook 04's module: configs, causal)
        return {k: _decode_cases(v) for k, v in cases.items()}
    return [(tuple(c["build"]), [case(k) for k in c["cases"]]) if "build" in c else
            tuple(c["arguments"]) if "arguments" in c else
            dict(c["spec"]) if "spec" in c else case(c) for c in cases]


def encode_cases(cases: Any) -> Any:
    """Cases (or a module exercise's ``(constructor_args, cases)`` pairs, or constructor arguments alone,
    or a mapping of named groups of these) as plain data for the inputs file (the grader's side of
    :func:`hidden_cases`)."""
    def case(c: Any) -> dict:
        found = {"name": c.name, "kwargs": dict(c.kwargs), **_args_with_layouts(c.args)}
        if c.build is not None:
            found["module_build"] = list(c.build)
        if getattr(c, "mode", "eval") != "eval":
            found["mode"] = c.mode
        if hasattr(c, "chunks"):  # read in pieces with a cache: the pieces' sizes and the dtype travel too
            found["chunks"], found["dtype"] = list(c.chunks), str(c.dtype).removeprefix("torch.")
        return found

    if isinstance(cases, dict):
        return {k: encode_cases(v) for k, v in cases.items()}
    def config(c: tuple) -> dict:
        if all(v is None or isinstance(v, (bool, int, float, str)) for v in c):
            return {"arguments": list(c)}  # constructor arguments alone (a build that must raise)
        return {"build": list(c[0]), "cases": [case(k) for k in c[1]]}

    # a dict: a check's own spec of a run, plain data (notebook 09's train_step: sizes, optimizer, seed)
    return [config(c) if isinstance(c, tuple) else {"spec": dict(c)} if isinstance(c, dict) else case(c)
            for c in cases]


def _args_with_layouts(args: Sequence[Any]) -> dict:
    """``{"args": [...]}`` for the inputs file, each module argument as ``None`` there and its
    :func:`module_layout` under ``"module_args"``: ``[[position, layout], ...]``."""
    modules = [[i, module_layout(a)] for i, a in enumerate(args) if isinstance(a, torch.nn.Module)]
    found: dict[str, Any] = {"args": [None if isinstance(a, torch.nn.Module) else a for a in args]}
    if modules:
        found["module_args"] = modules
    return found


def _rebuilt_args(c: dict) -> tuple:
    """A handed-in case's arguments, each module rebuilt from its layout (:func:`build_layout`)."""
    args = list(c["args"])
    for i, layout in c.get("module_args", []):
        args[i] = build_layout(layout)
    return tuple(args)


# --------------------------------------------------------------------------------------------
# A case's inputs, handed out beside its output
# --------------------------------------------------------------------------------------------
def inputs_of(args: Sequence[Any], kwargs: dict, layouts: bool = False) -> dict:
    """A call's inputs as plain data (:func:`encode`): ``{"args": <list>, "kwargs": {name: value}}``;
    a module among them as its parameters (``{"kind": "module", "parameters": [[name, tensor], ...]}``),
    or with ``layouts`` as its make-up (``{"kind": "layout", "layout": module_layout(module)}``: for a
    function of a module whose values do not matter, ``count_parameters``).

    The grader compares them with the inputs it gave: tensors by dtype, shape and values (floating
    point up to ``torch.testing.assert_close``'s tolerance for the dtype, since the kernel and the
    grader may round float32 arithmetic differently; everything else exactly).
    """
    return {"args": encode(list(args), modules=True, layouts=layouts),
            "kwargs": {str(k): encode(kwargs[k], modules=True, layouts=layouts) for k in sorted(kwargs, key=str)}}


# --------------------------------------------------------------------------------------------
# What came back, as plain data
# --------------------------------------------------------------------------------------------
def encode(value: Any, depth: int = 0, modules: bool = False, layouts: bool = False) -> dict:
    """A returned value as plain data (:func:`wire.encode`); with ``modules`` (a call's inputs), an
    ``nn.Module`` as ``{"kind": "module", "parameters": ...}`` (:func:`parameters_of`), or with ``layouts``
    as ``{"kind": "layout", "layout": ...}`` (:func:`module_layout`)."""
    def module(v: Any) -> dict | None:
        if not isinstance(v, torch.nn.Module):
            return None
        if layouts:
            return {"kind": "layout", "layout": module_layout(v)}
        return {"kind": "module", "parameters": parameters_of(v)}

    return wire.encode(value, depth, module if modules else None)


def _plain(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` detached, on the CPU, as a plain strided ``torch.Tensor`` (``None`` for another layout or
    a tensor without data)."""
    if t.device.type == "meta":
        return None
    t = t.detach().to("cpu")
    return t.as_subclass(torch.Tensor).clone() if t.layout == torch.strided else None


def parameters_of(module: torch.nn.Module) -> list[list]:
    """``[[name, tensor], ...]``: the module's parameters in ``named_parameters()`` order (creation
    order, a module's own before its children's), as plain tensors."""
    found = []
    for name, p in module.named_parameters():
        plain = _plain(p)
        found.append([name, plain if plain is not None else torch.zeros(0)])
        if len(found) > MAX_PARAMETERS:  # the grader refuses it; no need to copy more
            break
    return found


def tied_parameters(module: torch.nn.Module) -> list[list[str]]:
    """``[[name, earlier], ...]``: each name under which a parameter of ``module`` appears again, beside the
    name it first appeared under, in ``named_parameters(remove_duplicate=False)`` order (one module used
    twice, ``[Block()] * n``; a head tied to an embedding). :func:`parameters_of` names each parameter once."""
    first: dict[int, str] = {}
    found = []
    for name, parameter in module.named_parameters(remove_duplicate=False):
        if id(parameter) in first:
            found.append([name, first[id(parameter)]])
        else:
            first[id(parameter)] = name
        if len(found) > MAX_PARAMETERS:  # the grader refuses it; no need to look further
            break
    return found


def kind_of(value: Any) -> str:
    """What an attribute of a module is, as one of :data:`KINDS` (a name, never a class)."""
    if isinstance(value, torch.nn.Parameter):
        return "Parameter"
    if isinstance(value, torch.Tensor):
        return "Tensor"
    if isinstance(value, torch.nn.Linear):
        return "Linear"
    if isinstance(value, torch.nn.Module):
        return "Module"
    return "None" if value is None else "other"


def _type_name(value: Any) -> str:
    name = type(value).__name__
    return name if isinstance(name, str) and name.isidentifier() and len(name) <= 100 else "object"


def attribute_state(value: Any) -> dict:
    """An attribute of a module as plain data: ``{"kind": <one of KINDS>, "type": <its type's name>}``,
    and ``"value"``: a tensor attribute's numbers, or a linear layer's weight."""
    kind = kind_of(value)
    state: dict[str, Any] = {"kind": kind, "type": _type_name(value)}
    tensor = value if kind in ("Parameter", "Tensor") else getattr(value, "weight", None) if kind == "Linear" else None
    if isinstance(tensor, torch.Tensor):
        plain = _plain(tensor)
        if plain is not None:
            state["value"] = plain
    return state


def _attribute(module: Any, name: str) -> Any:
    try:
        return getattr(module, name, None)
    except Exception:  # noqa: BLE001 - a student's __getattr__ that raises something else
        return None


def _same_state(a: dict, b: dict) -> bool:
    if {k: v for k, v in a.items() if k != "value"} != {k: v for k, v in b.items() if k != "value"}:
        return False
    if ("value" in a) != ("value" in b):
        return False
    return "value" not in a or (a["value"].dtype == b["value"].dtype and torch.equal(a["value"], b["value"]))


def module_states(module: Any, attributes: Sequence[str]) -> dict[str, dict]:
    """name -> :func:`attribute_state` of each of ``attributes`` of ``module``."""
    return {name: attribute_state(_attribute(module, name)) for name in attributes}


_error = wire.error_data


def _start(exercise: str, student: Any) -> list[dict] | None:
    """The current test's records, with the source of ``student`` noted; ``None`` (and a record
    saying so) when ``student`` cannot be called."""
    from course_utils import rules

    test_id = _current[0]
    store = _records.setdefault(test_id, [])
    source = rules.source_of(student) if callable(student) else None
    if source is not None:  # what the rules and the diagnoses that read code read, as the kernel sees it
        _sources.setdefault(test_id, {})[exercise] = source[:MAX_SOURCE]
    if not callable(student):
        store.append({"exercise": exercise, "callable": False, "type": type(student).__name__})
        _handed(test_id)
        return None
    return store


def record(exercise: str, student: Callable, cases: Sequence[Any], *,
           prepare: Callable[[Any], tuple] | None = None, attributes: Sequence[str] = (),
           layouts: bool = False) -> None:
    """Run ``student`` on every case and hand out what came back (the kernel's whole part of
    :func:`course_utils.checks.core.compare_function` under the grader). Never compares.

    ``prepare(case)``: the arguments of the call, made from the case's (e.g. modules holding its
    tensors), when they are not the case's own; then, for a function that changes modules in place,
    ``attributes`` names what of each module argument is handed out after the call (``"after"``:
    :func:`attribute_state` of each, or ``{"kind": "unchanged"}`` where it is exactly as before).
    ``layouts``: a module argument is handed out as its make-up, not its values (:func:`inputs_of`).
    """
    store = _start(exercise, student)
    if store is None:
        return
    for case in cases:
        args = prepare(case) if prepare is not None else \
            tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in case.args)
        entry: dict[str, Any] = _mark({"exercise": exercise,
                                       "inputs": inputs_of(args if prepare else case.args, case.kwargs, layouts)})
        before = [module_states(a, attributes) if attributes and isinstance(a, torch.nn.Module) else None
                  for a in args]
        try:
            with _watching(exercise):
                returned = student(*args, **case.kwargs)
            entry["result"] = encode(returned)
        except Exception as exc:  # noqa: BLE001 - an error in student code is an outcome to hand out
            entry["error"] = _error(exc)
        if attributes:
            after = []
            for arg, was in zip(args, before):
                now = module_states(arg, attributes) if was is not None else None
                after.append(None if now is None else
                             {n: {"kind": "unchanged"} if _same_state(was[n], s) else s for n, s in now.items()})
            entry["after"] = after
        elif prepare is None:
            changed = [i for i, (old, new) in enumerate(zip(case.args, args))
                       if isinstance(old, torch.Tensor) and not _same(old, new)]
            if changed:
                entry["changed_inputs"] = changed
        store.append(entry)
    _handed(_current[0])  # once per check call: a call cut short (a time limit, a crash) hands out none of its cases


def record_module(exercise: str, student_cls: Callable, configs: Sequence[tuple[tuple, Sequence[Any]]], *,
                  train: bool = False, attributes: Sequence[str] = ()) -> None:
    """Build the student's module for every ``(constructor_args, cases)`` and run it on every case,
    as :func:`course_utils.checks.core.compare_module` would, and hand out what came back. Never compares.

    Records, in the order the check makes them:

    - a construction, ``{"exercise", "build": <inputs_of(constructor_args)>, "cls": {"name", "text"}}``
      with ``"module": {"parameters": parameters_of(module), "attributes": {name: kind}}`` (the kind of
      each of ``attributes``, :func:`kind_of`), or ``"result"`` when the constructor gave something
      else than an ``nn.Module``, or ``"error"`` when it raised;
    - then each forward pass of that module, ``{"exercise", "build", "mode": "eval" | "train",
      "inputs", "result" | "error"}``, under the check's seeds (``core.construct``, ``core.module_output``).
    """
    from course_utils.checks.core import Case, module_output

    store = _start(exercise, student_cls)
    if store is None:
        return
    label = _label(student_cls)
    for build, cases in configs:
        build_inputs = inputs_of(build, {})
        module = _record_construction(store, exercise, student_cls, build, build_inputs, label,
                                      lambda m: {"parameters": parameters_of(m),
                                                 "attributes": {a: kind_of(_attribute(m, a)) for a in attributes}})
        if module is None:
            continue
        for mode in ("eval", "train") if train else ("eval",):
            for case in cases:
                forward: dict[str, Any] = _mark({"exercise": exercise, "build": build_inputs, "mode": mode,
                                                 "inputs": inputs_of(case.args, case.kwargs)})
                try:
                    with _watching(exercise):
                        returned = module_output(module, Case(case.name, case.args, case.kwargs, build=build, mode=mode))
                    forward["result"] = encode(returned)
                except Exception as exc:  # noqa: BLE001
                    forward["error"] = _error(exc)
                store.append(forward)
    _handed(_current[0])


#: How a probed forward pass's module was converted first: ``None`` (as built), ``"float64"``
#: (``copy.deepcopy(module).to(torch.float64)``) or ``"meta"`` (``copy.deepcopy(module).to("meta")``).
COPIES = (None, "float64", "meta")
#: Most buffers, plain tensor attributes or tensors left behind handed out for one module.
MAX_STRUCTURE = 64


#: The tries of ``modules.check_alone`` a record may be marked as (``"attempt"``: :func:`trying`, or a writer's
#: own ``attempt``): 1 with the reference's helpers swapped in, 2 with the student's own.
ATTEMPTS = (1, 2)
_first_tries: list[bool] = []  # while the grader replays a hand-off: whether it holds check_alone's first tries


@contextlib.contextmanager
def replaying(first_tries: bool):
    """While the grader replays a hand-off: whether the kernel that wrote it made ``modules.check_alone``'s
    first tries (it had the reference's helpers: the instructor edition, or a cut-down reference). A
    student-edition kernel makes none, and its hand-off holds the second tries alone. The grader knows
    which kernel it ran; the kernel's word is not asked."""
    _first_tries.append(first_tries)
    try:
        yield
    finally:
        _first_tries.pop()


def first_tries_handed_out() -> bool:
    """Whether the hand-off being replayed holds ``modules.check_alone``'s first tries (:func:`replaying`)."""
    return _first_tries[-1] if _first_tries else True


_trying: list[int] = []  # in the kernel: which of check_alone's tries the records handed out now belong to


@contextlib.contextmanager
def trying(attempt: int):
    """In the kernel: every record handed out inside is marked as ``attempt`` (:data:`ATTEMPTS`) of
    ``modules.check_alone``'s tries (``modules.alone``), unless its writer is told another. Outside,
    the replay reads each try's records alone (``modules.replayed_tries``)."""
    if attempt not in ATTEMPTS:
        raise ValueError(f"a try of check_alone is one of {ATTEMPTS}, not {attempt!r}")
    _trying.append(attempt)
    try:
        yield
    finally:
        _trying.pop()


def _attempt(given: int | None = None) -> int | None:
    """The try a record belongs to: ``given``, else the one :func:`trying` set, else ``None``."""
    return given if given is not None else (_trying[-1] if _trying else None)


def _mark(entry: dict, attempt: int | None = None) -> dict:
    """``entry`` marked with its try of check_alone (:func:`_attempt`), where there is one."""
    attempt = _attempt(attempt)
    if attempt is not None:
        entry["attempt"] = attempt
    return entry


@dataclass
class Probe:
    """One forward pass a module check makes: in ``mode``, right after ``torch.manual_seed(seed)``
    (``None``: the check sets no seed of its own before it), on ``x``, of the module as built or of a
    converted copy (:data:`COPIES`)."""

    mode: str
    seed: int | None
    x: torch.Tensor
    copy: str | None = None
    #: Keyword arguments of the forward pass, plain numbers (notebook 09's ``start=``); ``None``: none.
    kwargs: dict | None = None

    def same(self, other: "Probe") -> bool:
        return (self.mode, self.seed, self.copy, self.kwargs or {}) == \
            (other.mode, other.seed, other.copy, other.kwargs or {}) and \
            self.x.dtype == other.x.dtype and self.x.shape == other.x.shape and \
            self.x.device == other.x.device and (self.x.device.type == "meta" or torch.equal(self.x, other.x))


def structure_of(module: torch.nn.Module) -> dict:
    """What a check reads of a module's make-up, as plain data: ``buffers`` (``[name, shape, dtype,
    in state_dict]``), ``plain`` (tensors kept as plain attributes: ``[name, shape, dtype]``)."""
    try:
        kept = set(module.state_dict().keys())
    except Exception:  # noqa: BLE001 - a state_dict that fails: no buffer is in it
        kept = set()
    buffers = [[n, list(b.shape), str(b.dtype).removeprefix("torch."), n in kept]
               for n, b in list(module.named_buffers())[:MAX_STRUCTURE + 1]]
    plain = [[n, list(v.shape), str(v.dtype).removeprefix("torch.")]
             for n, v in list(vars(module).items()) if isinstance(v, torch.Tensor)][:MAX_STRUCTURE + 1]
    return {"buffers": buffers, "plain": plain}


def left_behind(meta: torch.nn.Module) -> list[list[str]]:
    """``[[name, device], ...]``: the tensors of a module that ``.to("meta")`` did not move (its
    parameters and buffers, then its plain tensor attributes), as ``modules.check_moves_with_module``
    lists them."""
    left = [[n, str(v.device)] for n, v in list(meta.named_parameters()) + list(meta.named_buffers())
            if v.device.type != "meta"]
    left += [[n, str(v.device)] for n, v in vars(meta).items() if isinstance(v, torch.Tensor)]
    return left[:MAX_STRUCTURE + 1]


def record_module_probes(exercise: str, student_cls: Callable, plan: Sequence[tuple[tuple, Sequence[Probe]]],
                         count: Sequence[str] = (), attempt: int | None = None,
                         prepare: Callable[[torch.nn.Module], Any] | None = None,
                         within: Callable[[Probe], Any] | None = None, tied: bool = False,
                         values: Sequence[str] = ()) -> None:
    """Build the student's module for every ``(constructor_args, probes)`` of ``plan`` and hand out
    what a module check reads of it: the construction (as :func:`record_module`, with its
    :func:`structure_of`), then each :class:`Probe`'s forward pass, ``{"exercise", "build", "mode",
    "seed", "copy", "inputs", "result" | "error"}``. The first probe of a converted copy makes it
    (``copy.deepcopy``, then ``.to``), and the construction's structure then also says what
    ``.to("meta")`` left behind (``"meta_left"``), or what the copy raised (``"copy_error"``).

    The grader looks the forward passes up by construction, mode, seed, copy and inputs
    (``judge.KeyedModuleReplay``), so the checks outside may ask for them in any order, and some
    (a diagnosis's) not at all. ``count``: torch functions (:data:`COUNTED`) whose calls each forward
    pass also hands out, ``"calls": {name: count}`` (:class:`CallCounter`). ``attempt`` (:data:`ATTEMPTS`):
    which of ``modules.check_alone``'s tries these runs are (1: with the reference's helpers swapped in, 2:
    with the student's own), written on every record, so that the replay tells the tries apart
    (``judge.KeyedModuleReplay.attempt``). ``prepare(module)``: done to each module once its
    construction is handed out, before its forward passes (notebook 09 loads its test weights; a
    module it raises for runs none). ``within(probe)``: a context each forward pass runs in (notebook
    09 runs a meta copy's under its ``OneDevice`` mode, as its check does). A probe's ``kwargs`` go to
    the forward pass and out with its inputs. ``tied``: the construction also hands out the names under
    which a parameter appears again (``"tied"``, :func:`tied_parameters`), so the module rebuilt outside
    shares them as the kernel's did (notebook 09's check names ``[Block()] * n``). ``values``: plain
    attributes the check reads (notebook 09's ``context_length``), handed out as :func:`snapshot` does
    (``"values"``), after ``prepare``. Never compares.
    """
    import copy as _copy

    store = _start(exercise, student_cls)
    if store is None:
        return
    label = _label(student_cls)

    def describe(m: torch.nn.Module) -> dict:
        found = {"parameters": parameters_of(m), "attributes": {}, "structure": structure_of(m)}
        if tied:
            found["tied"] = tied_parameters(m)
        return found

    for build, probes in plan:
        build_inputs = inputs_of(build, {})
        module = _record_construction(store, exercise, student_cls, build, build_inputs, label, describe)
        if attempt is not None:
            store[-1]["attempt"] = attempt
        if module is None:
            continue
        structure = store[-1]["module"]["structure"]  # what a copy leaves behind is added below
        if prepare is not None:
            try:
                prepare(module)
            except Exception:  # noqa: BLE001 - the check refuses such a module before any forward pass
                continue
        if values:
            store[-1]["module"]["values"] = snapshot(module, values)
        copies: dict[str, Any] = {}
        for p in probes:
            forward: dict[str, Any] = {"exercise": exercise, "build": build_inputs, "mode": p.mode, "seed": p.seed,
                                       "copy": p.copy, "inputs": inputs_of((p.x,), p.kwargs or {})}
            _mark(forward, attempt)
            target = module
            if p.copy is not None:
                if p.copy not in copies:
                    try:
                        converted = _copy.deepcopy(module).to(torch.float64 if p.copy == "float64" else p.copy)
                        if p.copy == "meta":
                            structure["meta_left"] = left_behind(converted)
                        copies[p.copy] = converted
                    except Exception as exc:  # noqa: BLE001
                        structure["copy_error"] = _error(exc)
                        break
                target = copies[p.copy]
            counters = [CallCounter(name) for name in count]
            try:
                getattr(target, p.mode)()
                manual_seed(7 if p.seed is None else p.seed)
                with contextlib.ExitStack() as counting:
                    counting.enter_context(_watching(exercise))
                    for counter in counters:
                        counting.enter_context(counter)
                    if within is not None:
                        counting.enter_context(within(p))
                    forward["result"] = encode(target(p.x.clone(), **(p.kwargs or {})))
            except Exception as exc:  # noqa: BLE001
                forward["error"] = _error(exc)
            if counters:
                forward["calls"] = {c.name: min(c.count, MAX_CALLS) for c in counters}
            store.append(forward)
    _handed(_current[0])


def _record_construction(store: list, exercise: str, student_cls: Any, build: tuple, build_inputs: dict,
                         label: dict, describe: Callable[[torch.nn.Module], dict]) -> torch.nn.Module | None:
    """Build ``student_cls(*build)`` under the checks' seed and hand out the construction: what the
    constructor raised or returned, or ``describe(module)``. Returns the module, or ``None`` when there is
    none to run."""
    from course_utils.checks.core import construct

    entry: dict[str, Any] = _mark({"exercise": exercise, "build": build_inputs, "cls": label})
    try:
        with _watching(exercise):
            module = construct(student_cls, build)
    except Exception as exc:  # noqa: BLE001 - an error in student code is an outcome to hand out
        entry["error"] = _error(exc)
        store.append(entry)
        return None
    if not isinstance(module, torch.nn.Module):
        entry["result"] = encode(module)
        store.append(entry)
        return None
    entry["module"] = describe(module)
    store.append(entry)
    return module


def _label(student_cls: Any) -> dict:
    try:
        name, text = getattr(student_cls, "__name__", None), str(student_cls)[:MAX_MESSAGE]
    except Exception:  # noqa: BLE001 - a class whose name or text cannot be read: the checks' messages say "it"
        name, text = None, ""
    return {"name": name if isinstance(name, str) and len(name) <= MAX_MESSAGE else None, "text": text}


def _same(before: torch.Tensor, after: Any) -> bool:
    if isinstance(after, torch.Tensor) and "meta" in (before.device.type, after.device.type):
        return before.device == after.device and before.shape == after.shape  # no data to compare
    return isinstance(after, torch.Tensor) and torch.equal(before, after)


# --------------------------------------------------------------------------------------------
# Calls counted: how an output was computed (notebook 06: one call of the fused kernel)
# --------------------------------------------------------------------------------------------
#: Torch functions whose calls a module check counts, by name.
COUNTED = ("scaled_dot_product_attention",)
#: Most calls of a counted function handed out for one forward pass (a count above is handed out as this).
MAX_CALLS = 1000


class CallCounter(TorchFunctionMode):
    """Counts the calls of the torch function named ``name`` (one of :data:`COUNTED`) made while active.

    In the kernel, a check's spy; under the grader, :func:`record_module_probes` hands each forward
    pass's count out. In the grader's replay (``grader/judge.py``) no student code runs: a replayed
    forward pass adds the calls the kernel counted for it to every counter active then
    (:func:`add_replayed_calls`), so the check reads the count it would have read in the kernel.
    """

    _active: list["CallCounter"] = []

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.count = 0

    def __enter__(self) -> "CallCounter":
        CallCounter._active.append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        if self in CallCounter._active:
            CallCounter._active.remove(self)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == self.name:
            self.count += 1
        return func(*args, **(kwargs or {}))


def add_replayed_calls(calls: dict[str, int]) -> None:
    """Add ``calls`` (name -> count, as a forward pass handed them out) to every :class:`CallCounter`
    active now: the grader's replay of a forward pass that made them in the kernel."""
    for counter in CallCounter._active:
        counter.count += calls.get(counter.name, 0)


# --------------------------------------------------------------------------------------------
# The ATen operations the student's code ran (the rules, checked on what ran: ``rules.op_violations``)
# --------------------------------------------------------------------------------------------


class OpRecorder(TorchDispatchMode):
    """Notes every ATen operation dispatched while active, into ``seen`` (a set of operators).

    A :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees the operations below Python and
    below composite functions: ``F.softmax``, ``x.softmax`` and ``getattr(torch, "soft" + "max")`` all
    dispatch ``aten._softmax``; ``@`` dispatches ``aten.mm``, ``aten.bmm`` or ``aten.dot``; SDPA one of
    its fused kernels, or ``aten._safe_softmax`` on its math path. It changes nothing it sees. It
    declares itself an infrastructure mode that handles higher-order operators, so that FlexAttention's
    eager path (``torch.compile`` underneath) runs under it and is seen as ``flex_attention``, not refused.
    """

    supports_higher_order_operators = True

    @classmethod
    def is_infra_mode(cls) -> bool:
        return True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Not wrapped in torch._disable_dynamo: its first call would import torch._dynamo, 1.3 s per kernel.
        return False

    def __init__(self, seen: set) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(func)
        return func(*args, **(kwargs or {}))


def op_name(func: Any) -> str:
    """An operator's name without its overload: ``aten._softmax`` for ``aten._softmax.default``,
    ``flex_attention`` for the FlexAttention higher-order operator."""
    return str(getattr(func, "overloadpacket", func))


@contextlib.contextmanager
def _watching(exercise: str):
    """Record the ATen operations run inside (:class:`OpRecorder`) as ``exercise``'s in the current test,
    for an exercise whose rule forbids some (``rules.forbidden_ops``); for any other, nothing."""
    from course_utils import rules

    if not (_current and rules.forbidden_ops(exercise)):
        yield
        return
    seen = _ops.setdefault(_current[0], {}).setdefault(exercise, set())
    with OpRecorder(seen):
        yield


def ops_ran(test_id: str) -> dict[str, list[str]]:
    """exercise -> the operations of ``rules.WATCHED_OPS`` its code ran in test ``test_id``, sorted (plain data
    for the hand-off)."""
    from course_utils import rules

    return {exercise: sorted({op_name(f) for f in seen} & rules.WATCHED_OPS)[:MAX_OPS]
            for exercise, seen in _ops.get(test_id, {}).items()}


# --------------------------------------------------------------------------------------------
# Code a check runs its own way (notebook 06's timer on a simulated device)
# --------------------------------------------------------------------------------------------
class Replayed:
    """The base of the grader's stand-ins for a student's code (``grader/judge.py``'s ``Replay``). A
    check that runs the student's code its own way hands out what it observed (:func:`record_runs`),
    and asks a stand-in for that instead of running it (:func:`run_or_replay`)."""


def record_runs(exercise: str, student: Any, cases: Sequence[Any], run: Callable[[Any, Any], Any],
                attempt: int | None = None) -> None:
    """Hand out ``run(student, case)`` for every case (the kernel's part of a check that runs the
    student's code its own way, e.g. on a simulated device): what ``run`` returns (plain data: what
    the student's code gave, and what the check observed of it) or raises. Never compares.

    Each record is ``{"exercise", "inputs": inputs_of(case.args, case.kwargs), "result" | "error"}``,
    as :func:`record` writes them, so the grader replays them the same way: its stand-in for the
    student's code, called with a case's arguments, checks them and returns (or raises) what ``run``
    did in the kernel (:func:`run_or_replay`). ``attempt`` (:data:`ATTEMPTS`): which of
    ``modules.check_alone``'s tries these runs are, written on each record, as for :func:`record_module_probes`
    (a module class's runs: notebook 09's cached path, read outside by its keyed replay's ``ran``).
    """
    store = _start(exercise, student)
    if store is None:
        return
    for case in cases:
        entry: dict[str, Any] = _mark({"exercise": exercise, "inputs": inputs_of(case.args, case.kwargs)}, attempt)
        try:
            with _watching(exercise):
                returned = run(student, case)
            entry["result"] = encode(returned)
        except Exception as exc:  # noqa: BLE001 - an error in student code is an outcome to hand out
            entry["error"] = _error(exc)
        store.append(entry)
    _handed(_current[0])


def run_or_replay(student: Any, case: Any, run: Callable[[Any, Any], Any]) -> Any:
    """``run(student, case)``; in the grader's replay (``student`` is a :class:`Replayed`), what the
    kernel's ``run`` handed out for the same case (:func:`record_runs`), which is untrusted: the check
    must refuse a malformed one with :class:`ReplayMiss`. A module class's replay answers through its
    ``ran`` (its call builds a module)."""
    if isinstance(student, Replayed):
        return getattr(student, "ran", student)(*case.args, **case.kwargs)
    return run(student, case)


def _save(test_id: str) -> None:
    """Write test ``test_id``'s records (:func:`write_hand_off`: a new file moved into place, so a reader
    never sees half)."""
    write_hand_off({"format": FORMAT, "test": test_id, "records": _records[test_id],
                    "sources": _sources.get(test_id, {}), "ops": ops_ran(test_id)},
                   hand_off_path(os.environ[DIR_VARIABLE], test_id))


# --------------------------------------------------------------------------------------------
# A module as plain data: its layout (notebook 05's count_parameters takes a module)
# --------------------------------------------------------------------------------------------
#: Tensor types a layout's parameters and buffers may have.
LAYOUT_DTYPES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128",
                 "int8", "int16", "int32", "int64", "uint8", "bool")
#: Most modules, parameters and buffers in one layout, how deep its submodules nest, and most numbers
#: its tensors hold together (GPT-2 small's attention and its mask: 3.4 million).
MAX_LAYOUT_MODULES, MAX_LAYOUT_TENSORS, MAX_LAYOUT_DEPTH, MAX_LAYOUT_ELEMENTS = 256, 256, 16, 2**23


class BadLayout(ValueError):
    """A module layout that cannot be rebuilt; the message says why, in words."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def module_layout(module: torch.nn.Module) -> dict:
    """What a module is made of, as plain data (no class, no value): a tree of its submodules,
    ``{"parameters": [[name, shape, dtype, requires_grad, tied], ...], "buffers": [[name, shape, dtype,
    persistent, tied], ...], "children": [[name, <layout> | path], ...]}``, each list in registration
    order. ``tied`` is ``None``, or the dotted path of the earlier parameter (buffer) that is the same
    tensor; a child given as a path (``""``: the module itself) is the same module as the earlier one
    there. Enough to count parameters (trainable, frozen, shared once) and buffers as the module does;
    no class travels, so code that asks a submodule's class (``isinstance(m, nn.Linear)``) sees plain
    ``nn.Module`` containers in a module rebuilt from it.
    """
    modules: dict[int, str] = {}
    tensors: dict[str, dict[int, str]] = {"parameters": {}, "buffers": {}}

    def entries(kind: str, items: dict, prefix: str, flag: Callable[[str, torch.Tensor], bool]) -> list[list]:
        found = []
        for name, t in items.items():
            if t is None:  # a slot registered empty (nn.Linear(bias=False)'s bias): nothing to count
                continue
            seen = tensors[kind]
            found.append([name, list(t.shape), _dtype_name(t.dtype), flag(name, t), seen.get(id(t))])
            seen.setdefault(id(t), prefix + name)
        return found

    def walk(m: torch.nn.Module, path: str) -> dict:  # pre-order, own tensors first: as nn.Module walks
        modules[id(m)] = path
        prefix = f"{path}." if path else ""
        own = {"parameters": entries("parameters", m._parameters, prefix, lambda _, p: bool(p.requires_grad)),
               "buffers": entries("buffers", m._buffers, prefix, lambda n, _: n not in m._non_persistent_buffers_set)}
        own["children"] = [[name, modules[id(c)] if id(c) in modules else walk(c, prefix + name)]
                           for name, c in m._modules.items() if c is not None]
        return own

    return walk(module, "")


def _layout_name(name: Any) -> bool:
    """A name a layout's parameter, buffer or submodule may be rebuilt under: an identifier (no private
    one, nothing ``nn.Module`` has) or a position (``"0"``)."""
    return isinstance(name, str) and 0 < len(name) <= 100 and (name.isdigit() or (
        name.isidentifier() and not name.startswith("_") and not hasattr(torch.nn.Module, name)
        and name not in _MODULE_FIELDS))


_MODULE_FIELDS = frozenset(vars(torch.nn.Module()))  # what every module has (training, _parameters...)


def layout_problem(layout: Any) -> str | None:
    """What is wrong with a module layout (:func:`module_layout`'s form, within the ``MAX_LAYOUT_*``
    limits), or ``None``. Reads it as untrusted data: never builds anything."""
    import math

    count = {"modules": 0, "tensors": 0, "elements": 0}
    firsts: dict[str, dict[str, tuple]] = {"parameters": {}, "buffers": {}}  # path -> (shape, dtype, flag)
    paths: set[str] = set()

    def limits() -> str | None:  # checked as each part is read: shared parts of forged data cannot blow up
        if count["modules"] > MAX_LAYOUT_MODULES or count["tensors"] > MAX_LAYOUT_TENSORS:
            return f"over {MAX_LAYOUT_MODULES} modules or {MAX_LAYOUT_TENSORS} tensors"
        if count["elements"] > MAX_LAYOUT_ELEMENTS:
            return f"its tensors hold {count['elements']:,} numbers, over the limit of {MAX_LAYOUT_ELEMENTS:,}"
        return None

    def tensor_problem(kind: str, item: Any, prefix: str) -> str | None:
        if not (isinstance(item, list) and len(item) == 5 and _layout_name(item[0])):
            what = "requires_grad" if kind == "parameters" else "persistent"
            return f"a {kind[:-1]} is not [name, shape, dtype, {what}, tied] under a plain name"
        name, shape, dtype, flag, tied = item
        if not (isinstance(shape, list) and len(shape) <= 8 and all(type(n) is int and 0 <= n <= 2**31 for n in shape)):
            return f"{kind[:-1]} {prefix + name!r} has a shape that is not a short list of sizes"
        if dtype not in LAYOUT_DTYPES or type(flag) is not bool:
            return f"{kind[:-1]} {prefix + name!r} has an unsupported dtype or a flag that is not True or False"
        if kind == "parameters" and flag and not dtype.startswith(("float", "bfloat", "complex")):
            return f"parameter {prefix + name!r} requires grad but is not floating point"
        count["tensors"] += 1
        if tied is not None:
            if firsts[kind].get(tied) != (shape, dtype, flag):
                return f"{kind[:-1]} {prefix + name!r} is tied to {str(tied)[:100]!r}, not an earlier one like it"
            return limits()
        firsts[kind][prefix + name] = (shape, dtype, flag)
        count["elements"] += math.prod(shape)
        return limits()

    def node_problem(node: Any, path: str, depth: int) -> str | None:
        if not (isinstance(node, dict) and set(node) == {"parameters", "buffers", "children"}
                and all(isinstance(v, list) for v in node.values())):
            return f"module {path!r} is not {{parameters, buffers, children}} lists"
        if depth > MAX_LAYOUT_DEPTH:
            return f"submodules nest deeper than {MAX_LAYOUT_DEPTH}"
        if sum(map(len, node.values())) > MAX_LAYOUT_TENSORS:
            return f"module {path!r} has over {MAX_LAYOUT_TENSORS} parameters, buffers and submodules"
        count["modules"] += 1
        if limits():
            return limits()
        paths.add(path)
        prefix, names = (f"{path}." if path else ""), set()
        for kind in ("parameters", "buffers"):
            for item in node[kind]:
                why = tensor_problem(kind, item, prefix)
                if why:
                    return why
                names.add(item[0])
        for item in node["children"]:
            if not (isinstance(item, list) and len(item) == 2 and _layout_name(item[0])):
                return f"a submodule of {path!r} is not [name, layout or path] under a plain name"
            names.add(item[0])
            child = item[1]
            if isinstance(child, str):
                if child not in paths:
                    return f"submodule {prefix + item[0]!r} is the same as {child[:100]!r}, not an earlier module"
            else:
                why = node_problem(child, prefix + item[0], depth + 1)
                if why:
                    return why
        if len(names) != len(node["parameters"]) + len(node["buffers"]) + len(node["children"]):
            return f"module {path!r} has two parameters, buffers or submodules of one name"
        return None

    return node_problem(layout, "", 0)


def build_layout(layout: Any) -> torch.nn.Module:
    """A module of the make-up ``layout`` describes (:func:`module_layout`): plain ``nn.Module``
    containers holding ``nn.Parameter``s and buffers of those names, shapes, dtypes and flags, filled
    with ones (values do not matter to what a layout is for), with the same tensors and submodules
    shared. So ``module_layout(build_layout(x)) == x``. :class:`BadLayout` says what is wrong with a
    malformed one, before anything is built."""
    why = layout_problem(layout)
    if why:
        raise BadLayout(f"not a module layout: {why}")
    modules: dict[str, torch.nn.Module] = {}
    tensors: dict[str, dict[str, torch.Tensor]] = {"parameters": {}, "buffers": {}}

    def made(kind: str, path: str, shape: list, dtype: str, flag: bool, tied: str | None) -> torch.Tensor:
        if tied is not None:
            return tensors[kind][tied]
        t = torch.ones(shape, dtype=getattr(torch, dtype))
        t = torch.nn.Parameter(t, requires_grad=flag) if kind == "parameters" else t
        tensors[kind][path] = t
        return t

    def build(node: dict, path: str) -> torch.nn.Module:
        module = modules[path] = torch.nn.Module()
        prefix = f"{path}." if path else ""
        for name, shape, dtype, flag, tied in node["parameters"]:
            module.register_parameter(name, made("parameters", prefix + name, shape, dtype, flag, tied))
        for name, shape, dtype, flag, tied in node["buffers"]:
            module.register_buffer(name, made("buffers", prefix + name, shape, dtype, flag, tied), persistent=flag)
        for name, child in node["children"]:
            module.add_module(name, modules[child] if isinstance(child, str) else build(child, prefix + name))
        return module

    return build(layout, "")


# --------------------------------------------------------------------------------------------
# Ordered sessions: a module whose outputs depend on every call before them (a KV cache)
# --------------------------------------------------------------------------------------------
#: What one step of a session does (:class:`Step`): a forward pass, a call of one of the module's own
#: methods (:data:`SESSION_METHODS`), a conversion in place with ``.to`` (:data:`TO_TARGETS`), or a deep
#: copy whose own steps follow it (``copy.deepcopy(module)``: a session of its own).
STEP_OPS = ("forward", "call", "to", "copy")
#: The module's own methods a session step may call, by name (notebook 08's and 09's cache).
SESSION_METHODS = ("reset_cache",)
#: What ``.to`` may convert a session's module into: a dtype, or the ``meta`` device (a stand-in for a GPU).
TO_TARGETS = ("float32", "float64", "meta")
#: Most steps of one session, sessions of one hand-off, and names one snapshot watches.
MAX_STEPS, MAX_SESSIONS, MAX_WATCHED = 512, 256, 16


@dataclass
class Step:
    """One thing a check does to a module whose outputs depend on the calls before them, in order:
    ``op`` (:data:`STEP_OPS`): ``"forward"`` (``module(x, **kwargs)`` in ``mode``, right after
    ``torch.manual_seed(seed)``; ``None``: no seed of the check's own), ``"call"`` (the method ``name``,
    no arguments), ``"to"`` (``module.to(name)``, in place), or ``"copy"`` (``copy.deepcopy(module)``,
    then ``steps`` on the copy). ``optional``: a step the check makes only to diagnose a failure
    (the replay skips it when the check asks for the next one instead)."""

    op: str
    mode: str = "eval"
    seed: int | None = None
    x: torch.Tensor | None = None
    kwargs: dict = field(default_factory=dict)
    name: str | None = None
    steps: list = field(default_factory=list)
    optional: bool = False


@dataclass
class Session:
    """A construction ``cls(*build)`` (under the checks' seed) and the :class:`Step` s a check then makes on
    that module, in its order; ``watch``: the attributes (dotted paths: ``cache_k``, ``att.cache_k``,
    ``num_cached``) the check reads of the module's state, handed out after the construction and after
    every step (:func:`snapshot`). ``optional``: a construction only a diagnosis makes."""

    build: tuple
    steps: list = field(default_factory=list)
    watch: tuple = ()
    optional: bool = False


_MISSING = object()


def _watched(module: Any, path: str) -> tuple[Any, Any, str]:
    """``(owner, value, leaf)`` of the dotted ``path`` of ``module`` (``_MISSING`` where it is not there)."""
    *parts, leaf = path.split(".")
    owner = module
    for part in parts:
        try:
            owner = getattr(owner, part)
        except Exception:  # noqa: BLE001 - a student's __getattr__ that raises
            return None, _MISSING, leaf
    try:
        return owner, getattr(owner, leaf, _MISSING), leaf
    except Exception:  # noqa: BLE001
        return owner, _MISSING, leaf


def snapshot(module: Any, watch: Sequence[str]) -> dict:
    """What a check reads of a module's state, as plain data: for each watched (dotted) name,
    ``{"value": encode(value), "buffer": registered as a buffer, "saved": in state_dict()}``, or
    ``{"missing": True}`` where the module has no such attribute."""
    try:
        saved = set(module.state_dict().keys())
    except Exception:  # noqa: BLE001 - a state_dict that fails: nothing is in it
        saved = set()
    found: dict[str, Any] = {}
    for path in watch:
        owner, value, leaf = _watched(module, path)
        if value is _MISSING:
            found[path] = {"missing": True}
            continue
        buffers = getattr(owner, "_buffers", None)
        found[path] = {"value": encode(value), "buffer": isinstance(buffers, dict) and leaf in buffers,
                       "saved": path in saved}
    return found


def record_sessions(exercise: str, student_cls: Callable, sessions: Sequence[Session],
                    attempt: int | None = None) -> None:
    """Build the student's module for every :class:`Session` and make its steps, in order, handing out
    each construction (as :func:`record_module_probes` does, with ``"session"``: its number, and
    ``"optional"``) and each step's outcome: ``{"exercise", "build", "session", "step", "op", ...,
    "result" | "error"}`` with, for a forward pass, its ``mode``, ``seed`` and ``inputs``; for a call,
    the method's ``name`` (``"lookup": True`` when the module has no such method); for ``.to``, its
    ``target`` (and for ``meta`` what stayed behind, ``"left"``); for a copy, the number of the copy's
    own session (``"child"``), whose steps follow. After the construction and every step, the
    watched state (``"state"``, :func:`snapshot`). Each construction also says which call of this
    function in the test cell (for this ``attempt``) made it (``"run"``: 0, 1...): a check called twice
    in one cell (its visible, then its hidden cases) hands out two runs, and the replay reads them one
    per call of the check (``judge.SessionReplay.begin``). Never compares.

    The grader answers the check's calls strictly in this order, one session per module
    (``judge.SessionReplay``): a call out of order, missing or extra scores 0. ``attempt``: which of
    ``modules.check_alone``'s tries these are, as for :func:`record_module_probes`.
    """
    import copy as _copy

    store = _start(exercise, student_cls)
    if store is None:
        return
    label = _label(student_cls)
    numbers = [max((r["session"] for r in store if isinstance(r.get("session"), int)), default=-1) + 1]
    this_run = len({r["run"] for r in store if r.get("exercise") == exercise and "run" in r
                    and r.get("attempt") == attempt})

    def new_session() -> int:
        numbers[0] += 1
        return numbers[0] - 1

    def run(module: Any, steps: Sequence[Step], number: int, build_inputs: dict, watch: tuple) -> None:
        for j, step in enumerate(steps):
            entry: dict[str, Any] = {"exercise": exercise, "build": build_inputs, "session": number, "step": j,
                                     "op": step.op, "optional": step.optional}
            if attempt is not None:
                entry["attempt"] = attempt
            child = None
            try:
                with torch.no_grad(), _watching(exercise):
                    if step.op == "forward":
                        entry.update(mode=step.mode, seed=step.seed, inputs=inputs_of((step.x,), step.kwargs))
                        getattr(module, step.mode)()
                        manual_seed(7 if step.seed is None else step.seed)
                        entry["result"] = encode(module(step.x.clone(), **step.kwargs))
                    elif step.op == "call":
                        entry["name"] = step.name
                        try:
                            method = getattr(module, step.name)
                        except Exception:
                            entry["lookup"] = True
                            raise
                        entry["result"] = encode(method())
                    elif step.op == "to":
                        entry["target"] = step.name
                        module.to(torch.float64 if step.name == "float64" else
                                  torch.float32 if step.name == "float32" else "meta")
                        if step.name == "meta":
                            entry["left"] = left_behind(module)
                        entry["result"] = encode(None)
                    else:  # a copy, whose steps are a session of their own
                        entry["child"] = new_session()
                        child = _copy.deepcopy(module)
                        entry["result"] = encode(None)
            except Exception as exc:  # noqa: BLE001 - an error in student code is an outcome to hand out
                entry.pop("result", None)
                entry["error"] = _error(exc)
                child = None
            if watch:
                entry["state"] = snapshot(module, watch)
            store.append(entry)
            if child is not None:
                run(child, step.steps, entry["child"], build_inputs, watch)

    for session in sessions:
        build_inputs = inputs_of(session.build, {})
        module = _record_construction(store, exercise, student_cls, session.build, build_inputs, label,
                                      lambda m: {"parameters": parameters_of(m), "attributes": {},
                                                 "structure": structure_of(m)})
        number = new_session()
        store[-1].update(session=number, optional=session.optional, run=this_run)
        if attempt is not None:
            store[-1]["attempt"] = attempt
        if module is None:
            continue
        if session.watch:
            store[-1]["state"] = snapshot(module, session.watch)
        run(module, session.steps, number, build_inputs, tuple(session.watch))
    _handed(_current[0])


#: Set while a check's diagnosis runs (:func:`diagnosis`): the grader's session replay then gives the
#: constructions a diagnosis makes (``Session(optional=True)``), not the check's own.
_diagnosing: list[bool] = []


@contextlib.contextmanager
def diagnosis():
    """Mark the code inside as a diagnosis's (a hint's), for the grader's session replay."""
    _diagnosing.append(True)
    try:
        yield
    finally:
        _diagnosing.pop()


def diagnosing() -> bool:
    """Whether a diagnosis runs now (:func:`diagnosis`)."""
    return bool(_diagnosing)
