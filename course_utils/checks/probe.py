"""The kernel's side of grading outside the kernel: the plans in, the outcomes out.

Under the grader, every check is a spec (:mod:`course_utils.checks.spec`) and nothing is compared in the
student's kernel. The grader switches this on with two environment variables that only its sandboxed kernel
sees (:mod:`course_utils.checks.wire` names them): ``COURSE_PROBE_INPUTS``, the grader's file of each judged
exercise's plans (:func:`plan`: keyed steps whose cases are plain data; a module among a case's arguments
travels as its layout, :func:`module_layout`, rebuilt here by :func:`build_layout`), and
``COURSE_PROBE_DIR``, the folder the outcomes go to. A test cell starts with ``probe.begin("<test id>")`` (a
line the grader adds); each check call in it runs the grader's plan and adds its outcomes
(``spec.Spec.hand_out``), and the cell's hand-off file is written once, when the cell ends (:func:`_end`):
the outcomes by key, the source of the function checked (for the rules and the diagnoses that read code),
and the ATen operations of ``rules.WATCHED_OPS`` that the student's code ran (:class:`OpRecorder`), which
the grader holds against the exercise's rule. A check call cut short hands out none of its outcomes.

This module also holds what the kernel's runners read of a module as plain data (:func:`structure_of`,
:func:`left_behind`, :func:`tied_parameters`, :func:`kind_of`, :func:`snapshot`), the counter of a torch
function's calls (:class:`CallCounter`), and the marks of ``modules.check_alone``'s two tries
(:func:`trying`). Everything here is untrusted on the grader's side: the student controls this kernel.
Outside a test cell, and wherever these variables are not set (JupyterLab, Colab, nbval, the instructor's
own runs), checks run and judge here as always.
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
from course_utils.checks.layouts import build_layout, module_layout
from course_utils.device import manual_seed

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
    """``{"format", "plans": {exercise: {"visible": [step, ...], "hidden": [...]}}}`` as the grader wrote it
    (read once; :func:`plan`)."""
    global _inputs
    if _inputs is None:
        _inputs = torch.load(os.environ[INPUTS_VARIABLE], map_location="cpu", weights_only=True)
    return _inputs


def judged(exercise: str) -> bool:
    """Whether the grader judges ``exercise`` itself (so the kernel only hands outputs out)."""
    return enabled() and exercise in _grader_inputs().get("plans", {})


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


# --------------------------------------------------------------------------------------------
# What came back, as plain data
# --------------------------------------------------------------------------------------------
def tied_parameters(module: torch.nn.Module) -> list[list[str]]:
    """``[[name, earlier], ...]``: each name under which a parameter of ``module`` appears again, beside the
    name it first appeared under, in ``named_parameters(remove_duplicate=False)`` order (one module used
    twice, ``[Block()] * n``; a head tied to an embedding)."""
    first: dict[int, str] = {}
    found = []
    for name, parameter in module.named_parameters(remove_duplicate=False):
        if id(parameter) in first:
            found.append([name, first[id(parameter)]])
        else:
            first[id(parameter)] = name
        if len(found) > wire.MAX_ITEMS:  # more would not cross the hand-off; no need to look further
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


def _attribute(module: Any, name: str) -> Any:
    try:
        return getattr(module, name, None)
    except Exception:  # noqa: BLE001 - a student's __getattr__ that raises something else
        return None


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
    converted copy (``spec.COPIES``)."""

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


# --------------------------------------------------------------------------------------------
# Calls counted: how an output was computed (notebook 06: one call of the fused kernel)
# --------------------------------------------------------------------------------------------
#: Most calls of a counted function handed out for one forward pass (a count above is handed out as this).
MAX_CALLS = 1000


class CallCounter(TorchFunctionMode):
    """Counts the calls of the torch function named ``name`` (one of :data:`COUNTED`) made while active.

    In the kernel, a check's spy; under the grader, ``spec.run_module`` hands each forward
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


def _save(test_id: str) -> None:
    """Write test ``test_id``'s records (:func:`write_hand_off`: a new file moved into place, so a reader
    never sees half)."""
    write_hand_off({"format": FORMAT, "test": test_id, "records": _records[test_id],
                    "sources": _sources.get(test_id, {}), "ops": ops_ran(test_id)},
                   hand_off_path(os.environ[DIR_VARIABLE], test_id))


# --------------------------------------------------------------------------------------------
# Ordered sessions: a module whose outputs depend on every call before them (a KV cache)
# --------------------------------------------------------------------------------------------
#: Most steps of one session, sessions of one hand-off, and names one snapshot watches.
MAX_STEPS, MAX_SESSIONS, MAX_WATCHED = 512, 256, 16


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
        found[path] = {"value": wire.encode(value), "buffer": isinstance(buffers, dict) and leaf in buffers,
                       "saved": path in saved}
    return found


