"""The verdict outside the kernel: the grader judges what the student's code handed out.

For the exercises in :data:`JUDGED` (functions checked by ``core.compare_function``, modules by
``core.compare_module``, notebook 03's copy of weights between modules, and notebook 04's
``CausalAttention``, whose checks probe the module: :data:`KEYED`), nothing in the student's kernel
decides a grade:

1. **Hand-off in** (:func:`prepare`, called by ``grader.execute.RobustExecute``): a private folder
   for the kernel's outputs and a file of the hidden inputs (inputs are not secret; expected outputs
   are). Where every exercise of the notebook is judged, the sandbox shows the kernel the student
   edition of ``course_utils`` (no answers, no hidden cases, no known mistakes).
2. **In the kernel** (:mod:`course_utils.checks.probe`): each test cell starts with
   ``probe.begin("<test id>")`` (:class:`MarkTests` adds the line); ``compare_function`` runs the
   student's function on every case and writes what came back, without comparing;
   ``compare_module`` builds the student's module for each constructor's arguments under the
   check's seed and writes its parameters, the kinds of the attributes the diagnoses read, and its
   output on every case; a function that changes modules in place also writes what it left in them;
   a module check that probes the module (:data:`KEYED`) writes each construction's make-up
   (buffers, plain tensors, what ``.to("meta")`` left) and every forward pass its checks make, with
   mode, seed, copy and input (``probe.record_module_probes``); a function of a module
   (:data:`LAYOUT_INPUTS`, ``count_parameters``) is given modules rebuilt from the layouts handed in
   (``probe.build_layout``), and each module it was given goes out as its layout beside the output.
3. **Outside** (:class:`JudgeOutside`, after execution and before nbgrader's ``SaveAutoGrades``): in
   the grader's own process, each judged test cell's check calls, taken from the *solution's* test
   cell, run again with the exercise's name bound to a :class:`Replay` of the recorded outputs
   (a :class:`ModuleReplay` for a module: its construction gives a real ``nn.Module`` rebuilt from
   the handed-out parameters, whose forward passes replay the kernel's outputs; a
   :class:`KeyedModuleReplay` for a :data:`KEYED` one, which looks them up instead, and hands the
   check's counter the calls of a counted torch function that the kernel handed out with each
   forward pass, ``probe.CallCounter``; a check that runs the student's code its own way, notebook
   06's timer on a simulated device, asks the :class:`Replay` for what the kernel observed per case,
   ``probe.record_runs`` and ``probe.run_or_replay``).
   The comparison, the known mistakes and the diagnoses run against the live reference, so the ✅
   or ❌ message is the one a kernel would print. The verdict replaces the test cell's outputs (an
   error output, or none); formgrader, ``cells.csv``, feedback and the gradebook read it as usual.

The rules are also checked on what ran: the kernel hands out, beside the outputs, which ATen operations
of ``course_utils.rules.WATCHED_OPS`` the student's code dispatched while it ran for the grader
(``probe.OpRecorder``), and a test whose code ran an operation its exercise's rule forbids scores 0, with
the rule's own message, whatever its outputs (:func:`forbidden_ran`; a source that breaks a rule as
written is told so first, as the kernel did): a library softmax reached by a name built at run time,
or swapped in for the student's function, runs ``aten._softmax`` all the same.

The kernel's hand-off is untrusted data (:func:`load_results`): a link, a special file, a file over
``wire.MAX_BYTES``, a file that is not in the hand-off's format (JSON and raw tensor bytes,
``course_utils.checks.wire``, which says what it refuses), a record of the wrong shape
or type (a module's parameters that are not plain tensors or do not rebuild, an attribute kind off
:data:`course_utils.checks.probe.KINDS`, a make-up or a forward pass's seed or copy that is malformed,
a module layout that ``probe.layout_problem`` refuses), an output computed from other inputs than
the grader's (a count of another module's layout included) or by another construction, a missing
output or one too many: each scores
0 for that test with the reason in its message, and the notebook's other tests still count. Nothing
is ever unpickled (no unpickler runs on the kernel's files, not even ``torch.load(weights_only=True)``),
and no class is ever taken from the kernel: only names from a fixed list.

Notebook 08's functions hand out every call their checks make (a dtype pass, the calls that must
raise), and a function the test cell passes beside the exercise's (``sliding_window_mask_mod``) hands
out its outcomes under its own name, replayed under that name (:data:`COMPANIONS`). Its
``GroupedQueryAttention`` hands out both tries of ``modules.check_alone`` (the reference's
``repeat_kv`` swapped in, then the student's own), each record marked ``"attempt": 1`` or ``2``; the
:class:`KeyedModuleReplay` reads only the try the check is replaying (``modules.replayed_tries``), and an
unmarked record, or one marked otherwise, never stands for either. Its ``MultiHeadAttentionKVCache``,
whose outputs depend on every call before them (:data:`SESSIONS`), hands out ordered sessions
(``probe.record_sessions``: each construction and every step the check makes on it, in order, with
the cache's state after each), answered strictly in that order by a :class:`SessionReplay`.

Notebook 09's ``TransformerBlock`` and ``TinyGPT`` are :data:`KEYED` too (their constructions also hand out the
names under which a parameter appears twice, ``"tied"``, and plain attributes the check reads, ``"values"``), and
each build's KV-cache path goes out as one trace of plain data (``course_utils.checks.cached``) through
``probe.record_runs``, which the keyed replay answers by its inputs (:meth:`KeyedModuleReplay.ran`).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import io
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

#: Exercises judged outside the kernel: every check of theirs is ``core.compare_function`` or
#: ``core.compare_module`` calls, or (``copy_v2_weights_to_v1``) a call that hands out what it left in
#: the modules it was given, or (:data:`KEYED`) a module check whose probes are all handed out.
JUDGED = frozenset({
    "dot", "attention_scores_for_query", "attention_scores",  # 01
    "softmax_naive", "softmax_stable", "context_vectors",  # 02
    "scaled_dot_product_attention", "SelfAttention_v1", "SelfAttention_v2", "copy_v2_weights_to_v1",  # 03
    "causal_mask", "causal_attention_weights", "CausalAttention",  # 04
    # Every exercise of 05 and 06 is judged outside, so their kernels have the student edition
    # (count_parameters' modules travel as layouts: LAYOUT_INPUTS).
    "MultiHeadAttentionWrapper", "split_heads", "merge_heads", "MultiHeadAttention", "count_parameters",  # 05
    "MultiHeadAttentionCombinedQKV", "MHAPyTorchSDPA", "attention_flops", "time_cuda_aware",  # 06
})
# Every exercise of 07 is judged outside too, so its kernel has the student edition: the tiled
# attention's checks hand out, beside the outputs, what the tensor watcher saw of each run as plain
# data (``probe.record_runs``), and the Triton kernel's check hands out (out, lse) of each launch.
JUDGED = JUDGED | frozenset({"online_softmax", "flash_attention_forward", "flash_attention_triton"})  # 07
# Every exercise of 10 too, so its kernel has the student edition: the reference formulas' gradients, the
# tiled backward's (with what the tensor watcher saw, as 07's forward), the Triton kernel's (dk, dv) per
# launch, and for the autograd Function what each run gave, what its forward keeps (shapes and which of
# q, k, v, o, lse each saved tensor is) and what gradcheck said, all as plain data.
JUDGED = JUDGED | frozenset({"attention_backward_reference", "flash_attention_backward",  # 10
                             "FlashAttention", "flash_attention_backward_triton"})
#: Module exercises whose checks probe the module (buffers, modes, causality, copies moved with
#: ``.to``): the kernel hands out every forward pass they make (``probe.record_module_probes``), and
#: the replay looks each up by construction, mode, seed, copy and inputs (:class:`KeyedModuleReplay`).
KEYED = frozenset({"CausalAttention", "MultiHeadAttentionWrapper", "MultiHeadAttention",
                   "MultiHeadAttentionCombinedQKV", "MHAPyTorchSDPA"})
#: Function exercises whose module arguments travel as their make-up, not their values
#: (``probe.module_layout``): in the inputs file, and beside each output handed out. The kernel
#: counts a module rebuilt from the grader's layout; the replay checks the layout is the grader's.
LAYOUT_INPUTS = frozenset({"count_parameters"})
# Notebook 08: its functions are judged outside, and so is GroupedQueryAttention (KEYED: every
# construction and forward pass, each record marked with its try of check_alone, ``probe.ATTEMPTS``);
# MultiHeadAttentionKVCache below, as ordered sessions. 08's kernel has the student edition, so it hands
# out check_alone's second tries alone (the student's own helpers); where one fails, the first (the
# reference's helpers swapped in) is made in a kernel of its own that holds only those helpers' answers
# (:meth:`JudgeOutside.first_tries`, ``grader/reference_subset.py``).
JUDGED = JUDGED | frozenset({"decode_causal_mask", "rope_angles", "apply_rope", "repeat_kv",
                             "GroupedQueryAttention", "sliding_window_mask"})  # 08
KEYED = KEYED | frozenset({"GroupedQueryAttention"})  # 08: both of check_alone's tries, each marked (attempt)
# Notebook 08's MultiHeadAttentionKVCache: its outputs depend on every call before them (the cache), so its
# kernel hands out ordered sessions (``probe.record_sessions``), both of check_alone's tries, each marked.
JUDGED = JUDGED | frozenset({"MultiHeadAttentionKVCache"})  # 08
#: Module exercises whose outputs depend on the calls before them (a cache): the kernel builds each
#: construction the check makes and runs the check's whole ordered sequence of steps on it (forward passes
#: with or without the cache, ``reset_cache()``, ``.to``, copies), handing out each step's outcome and the
#: cache's state after it (``probe.record_sessions``); the replay answers the check's calls strictly in
#: that order, one module at a time (:class:`SessionReplay`).
SESSIONS = frozenset({"MultiHeadAttentionKVCache"})  # 08
#: Functions a judged test cell hands to its check beside the exercise's (a second function of the same
#: answer cell), by their name -> the exercise's: the kernel hands out their outcomes under their own
#: name, and the replay binds a :class:`Replay` of them to that name. One the kernel was given as
#: ``None`` (or anything not callable) replays as an object of that type's name, which the check
#: refuses: a hand-off cannot skip a companion's check by saying there was none.
COMPANIONS = {"sliding_window_mask_mod": "sliding_window_mask"}  # 08
# Notebook 09, in part: sinusoidal_positions (its odd d_model's call handed out too), train_step (each spec's trace
# on the check's stand-in model, or what was raised, as plain data: ``probe.record_runs``) and
# LearnedPositionalEmbedding (KEYED: every construction with the test weights loaded and every forward pass, a
# ``start=`` among their inputs). TransformerBlock and TinyGPT stayed in the kernel at first (their checks feed a
# stateful KV cache in pieces, and TinyGPT's check_alone needs the reference's helpers): see below.
JUDGED = JUDGED | frozenset({"sinusoidal_positions", "LearnedPositionalEmbedding", "train_step"})  # 09
# generate too: its check runs it on the check's own stand-in model with a cache (nb09.CachedStandInLM), and each
# spec's trace (the tokens or what was raised, and the model's calls, per call of generate) goes out as plain data.
JUDGED = JUDGED | frozenset({"generate"})  # 09
KEYED = KEYED | frozenset({"LearnedPositionalEmbedding"})  # 09
# And the block and the model: KEYED (every construction, test weights loaded, with the names under which a parameter
# appears twice and TinyGPT's context_length, and every forward pass without the cache), and per build the cached
# path's trace (``checks.cached.cached_trace``: the pieces fed with use_cache=True, the whole input, the reset, and
# what the hints read, on a copy), as plain data through ``probe.record_runs``, read by the keyed replay's ``ran``.
# TinyGPT's tries of check_alone are marked, as GroupedQueryAttention's. So every exercise of 09 is judged outside,
# and its kernel has the student edition.
JUDGED = JUDGED | frozenset({"TransformerBlock", "TinyGPT"})  # 09
KEYED = KEYED | frozenset({"TransformerBlock", "TinyGPT"})  # 09
from course_utils.checks.wire import (DTYPES, MAX_BYTES, MAX_ELEMENTS, MAX_RECORDS, MAX_TENSORS,  # noqa: E402,F401
                                      read_hand_off)

#: ``ename`` of a test whose hand-off could not be used.
HANDOFF_ERROR = "HandOffError"
#: Marks the line the grader adds at the top of each judged test cell.
PROBE_MARK = "# (added by the grader: this test's outputs are handed out and judged outside the kernel)"

_made: list[str] = []  # folders made by prepare() in this process, removed at exit if still there


@functools.lru_cache(maxsize=1)
def spec_of_each() -> dict[str, Any]:
    """exercise -> its ``course_utils.checks.spec.Spec``, for each exercise declared by one."""
    from course_utils import checks

    return dict(checks.SPECS)


def judged_exercises(notebook: str | None) -> list[str]:
    """The exercises of ``notebook`` that are judged outside the kernel, in the notebook's order."""
    from grader import course

    return [e for e in course.EXERCISES.get(notebook or "", []) if e in JUDGED]


def student_edition_kernel(notebook: str | None) -> bool:
    """Whether ``notebook``'s kernel can run with the student edition: every exercise judged outside."""
    from grader import course

    exercises = course.EXERCISES.get(notebook or "", [])
    return bool(exercises) and all(e in JUDGED for e in exercises)


# --------------------------------------------------------------------------------------------
# 1. The hand-off in
# --------------------------------------------------------------------------------------------
@dataclass
class HandOff:
    """The folders of one notebook's hand-off: ``outputs`` (the kernel writes), ``inputs`` (the
    grader's file of hidden inputs), and the exercises judged."""

    notebook: str
    outputs: str
    inputs: str
    exercises: list[str]
    student_edition: bool
    #: A cut-down reference the kernel sees (``grader/reference_subset.py``): a kernel of first tries.
    reference: str = ""

    def remove(self) -> None:
        for folder in (self.outputs, str(Path(self.inputs).parent)):
            shutil.rmtree(folder, ignore_errors=True)
            if folder in _made:
                _made.remove(folder)


def prepare(notebook: str | None, reference: str = "") -> HandOff | None:
    """The hand-off of ``notebook``, or ``None`` when none of its exercises is judged outside. With
    ``reference`` (a file of :mod:`grader.reference_subset`), the kernel sees the student edition with that
    file as its reference: a kernel that makes ``check_alone``'s first tries."""
    import torch

    from course_utils.checks import expected, probe

    exercises = judged_exercises(notebook)
    if not exercises:
        return None
    outputs = tempfile.mkdtemp(prefix="grader-probe-")
    inputs_dir = tempfile.mkdtemp(prefix="grader-probe-inputs-")
    _made.extend([outputs, inputs_dir])
    os.chmod(outputs, 0o700)
    inputs = Path(inputs_dir) / "inputs.pt"
    specs = spec_of_each()
    with expected.using(expected.LIVE):  # the plans and hidden cases: inputs, never an expected output
        plans = {e: {"visible": probe.encode_plan(specs[e].steps(False)),
                     "hidden": probe.encode_plan(specs[e].steps(True))} for e in exercises if e in specs}
        hidden = {e: probe.encode_cases(expected.instructor().hidden(e)) for e in exercises if e not in specs}
    torch.save({"format": probe.FORMAT, "exercises": hidden, "plans": plans}, inputs)
    return HandOff(notebook or "", outputs, str(inputs), exercises,
                   bool(reference) or student_edition_kernel(notebook), reference)


@atexit.register
def _remove_left_over() -> None:
    for folder in list(_made):
        shutil.rmtree(folder, ignore_errors=True)


class MarkTests(NbGraderPreprocessor):
    """Start every judged test cell with ``probe.begin("<test id>")``, so that the kernel files its
    outputs under that test. Runs before execution; the line is marked with :data:`PROBE_MARK`."""

    def preprocess(self, nb: NotebookNode, resources: dict):
        from grader import cells

        exercises = judged_exercises(resources.get("nbgrader", {}).get("notebook"))
        if exercises:
            for cell in nb.cells:
                if cell.cell_type == "code" and cells.is_test(cell) and \
                        cells.exercise_of_test(cells.grade_id(cell), exercises):
                    cell.source = (f"{PROBE_MARK}\nfrom course_utils.checks import probe as _course_probe; "
                                   f"_course_probe.begin({cells.grade_id(cell)!r})\n{cell.source}")
        return nb, resources


class PrepareHandOff(NbGraderPreprocessor):
    """Make the notebook's hand-off (:func:`prepare`) before it runs: ``resources["course_handoff"]``, which
    the execution step binds into the kernel's sandbox, and ``resources["course_unexecuted"]``, the notebook
    as it goes in (for a kernel of ``check_alone``'s first tries, :meth:`JudgeOutside.first_tries`).
    ``resources["course_first_try_reference"]``: the cut-down reference such a kernel sees."""

    def preprocess(self, nb: NotebookNode, resources: dict):
        handoff = prepare(resources.get("nbgrader", {}).get("notebook"),
                          reference=resources.get("course_first_try_reference", ""))
        if handoff is not None:
            resources["course_handoff"] = handoff
            resources["course_unexecuted"] = copy.deepcopy(nb)
        return nb, resources


# --------------------------------------------------------------------------------------------
# 2. Reading the hand-off: untrusted data
# --------------------------------------------------------------------------------------------
class BadHandOff(ValueError):
    """What a kernel handed out cannot be used; the message says why, in words."""


def load_results(folder: str | Path, test_id: str) -> list[dict]:
    """The records test ``test_id`` handed out, checked; :class:`BadHandOff` says why not."""
    return load_hand_off(folder, test_id)[0]


def load_hand_off(folder: str | Path, test_id: str) -> tuple[list[dict], dict[str, str]]:
    """``(records, sources)`` that test ``test_id`` handed out, checked; :class:`BadHandOff` says why not.
    ``sources``: exercise -> the source of the function checked, as the kernel read it."""
    records, sources, _ = load_handed_out(folder, test_id)
    return records, sources


def load_handed_out(folder: str | Path, test_id: str) -> tuple[list[dict], dict[str, str], dict[str, list[str]]]:
    """``(records, sources, ops)`` that test ``test_id`` handed out, checked; :class:`BadHandOff` says why not.
    ``ops``: exercise -> the ATen operations its code ran in the kernel (``probe.ops_ran``; none handed out
    for an exercise: none of ``rules.WATCHED_OPS`` ran)."""
    from course_utils.checks import wire

    try:
        loaded = wire.read_file(folder, test_id)
    except wire.BadFile as exc:
        raise BadHandOff(str(exc)) from None
    return _check_file(loaded, test_id)


def _check_file(loaded: Any, test_id: str) -> tuple[list[dict], dict[str, str], dict[str, list[str]]]:
    from course_utils.checks import probe

    if not isinstance(loaded, dict) or not {"format", "test", "records", "sources"} <= set(loaded) \
            <= {"format", "test", "records", "sources", "ops"}:
        raise BadHandOff("the result does not have the hand-off's layout")
    if loaded["format"] != probe.FORMAT or loaded["test"] != test_id:
        raise BadHandOff(f"the result is not this test's (format {loaded['format']!r}, test {loaded['test']!r})")
    records = loaded["records"]
    if not isinstance(records, list) or len(records) > MAX_RECORDS:
        raise BadHandOff(f"the result's records are not a list of at most {MAX_RECORDS}")
    for i, record in enumerate(records):
        why = _record_problem(record)
        if why:
            raise BadHandOff(f"record {i + 1} is malformed: {why}")
    sources = loaded["sources"]
    if not (isinstance(sources, dict) and all(_is_name(k) and isinstance(v, str) and len(v) <= probe.MAX_SOURCE
                                              for k, v in sources.items())):
        raise BadHandOff("the sources handed out are not a mapping of exercise names to short texts")
    ops = loaded.get("ops", {})
    if not (isinstance(ops, dict) and len(ops) <= 64 and all(
            _is_name(k) and isinstance(v, list) and len(v) <= probe.MAX_OPS
            and all(isinstance(op, str) and 0 < len(op) <= 100 for op in v) for k, v in ops.items())):
        raise BadHandOff("the operations handed out are not a mapping of exercise names to short lists of names")
    return records, sources, ops


def _is_name(value: Any) -> bool:
    from course_utils.checks import wire

    return wire.is_name(value)


def _record_problem(record: Any) -> str | None:
    from course_utils.checks import probe

    if not isinstance(record, dict) or not isinstance(record.get("exercise"), str):
        return "not a record of an exercise"
    if record.get("callable") is False:
        return None if set(record) == {"exercise", "callable", "type"} and _is_name(record["type"]) \
            else "a non-callable record with other fields"
    if "plan" in record:
        return _plan_record_problem(record)
    if "build" in record:
        return _module_record_problem(record)
    keys = set(record) - {"exercise", "inputs", "changed_inputs", "after", "attempt"}
    why = _inputs_problem(record.get("inputs"))
    if why:
        return why
    if "attempt" in record and not (type(record["attempt"]) is int and record["attempt"] in probe.ATTEMPTS):
        return f"a try of check_alone other than {list(probe.ATTEMPTS)}"
    if keys not in ({"result"}, {"error"}):
        return f"expected a result or an error, got fields {sorted(map(str, keys))}"
    changed = record.get("changed_inputs", [])
    if not (isinstance(changed, list) and len(changed) <= 64 and all(type(i) is int and 0 <= i < 64 for i in changed)):
        return "changed_inputs is not a list of argument positions"
    if "after" in record:
        why = _after_problem(record["after"], len(record["inputs"]["args"]["items"]))
        if why:
            return why
    return _outcome_problem(record)


def _plan_record_problem(record: dict) -> str | None:
    """What is wrong with the outcomes of a spec's plan (``spec.Spec.check`` in the kernel), if anything."""
    from course_utils.checks import probe, spec, wire

    if not set(record) - {"attempt"} == {"exercise", "plan", "outcomes"} or record["plan"] not in ("visible", "hidden"):
        return "the outcomes of a plan without the plan's name, or with other fields"
    if "attempt" in record and not (type(record["attempt"]) is int and record["attempt"] in probe.ATTEMPTS):
        return f"a try of check_alone other than {list(probe.ATTEMPTS)}"
    outcomes = record["outcomes"]
    if not (isinstance(outcomes, list) and len(outcomes) <= MAX_RECORDS):
        return f"the outcomes are not a list of at most {MAX_RECORDS}"
    keys = set()
    for item in outcomes:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and len(item[0]) <= spec.MAX_KEY
                and item[0] not in keys and isinstance(item[1], dict)):
            return "an outcome that is not [a key of its own, the outcome]"
        keys.add(item[0])
        outcome = item[1]
        if set(outcome) - {"changed"} not in ({"result"}, {"error"}):
            return f"expected a result or an error, got fields {sorted(map(str, outcome))}"
        changed = outcome.get("changed", [])
        if not (isinstance(changed, list) and len(changed) <= 64 and all(type(i) is int and 0 <= i < 64 for i in changed)):
            return "changed is not a list of argument positions"
        why = wire.error_problem(outcome["error"]) if "error" in outcome else wire.value_problem(outcome["result"])
        if why:
            return why
    return None


def _outcome_problem(record: dict) -> str | None:
    """What is wrong with a record's ``error`` or ``result``, if anything."""
    from course_utils.checks import probe

    if "error" in record:
        error = record["error"]
        if not (isinstance(error, dict) and set(error) == {"type", "message"} and _is_name(error["type"])
                and isinstance(error["message"], str) and len(error["message"]) <= probe.MAX_MESSAGE):
            return "an error without a type name and a message"
        return None
    return _value_problem(record["result"], 0)


def _build_and_try_problem(record: dict) -> str | None:
    """What is wrong with a module record's constructor arguments or its try of ``check_alone``, or ``None``."""
    from course_utils.checks import probe

    why = _inputs_problem(record.get("build"))
    if why:
        return f"its constructor arguments: {why}"
    if "attempt" in record and not (type(record["attempt"]) is int and record["attempt"] in probe.ATTEMPTS):
        return f"a try of check_alone other than {list(probe.ATTEMPTS)}"
    return None


def _module_record_problem(record: dict) -> str | None:
    """What is wrong with a module exercise's record (``probe.record_module``): a construction or a
    forward pass."""
    from course_utils.checks import probe

    if "session" in record:
        return _session_record_problem(record)
    why = _build_and_try_problem(record)
    if why:
        return why
    if "mode" in record:  # a forward pass
        if record["mode"] not in ("eval", "train"):
            return "a forward pass in a mode other than eval or train"
        why = _inputs_problem(record.get("inputs"))
        if why:
            return why
        if "seed" in record and not (record["seed"] is None or (type(record["seed"]) is int
                                                                and 0 <= record["seed"] < 2**63)):
            return "a forward pass whose seed is not a whole number"
        if "copy" in record and record["copy"] not in probe.COPIES:
            return f"a forward pass of a copy other than {list(probe.COPIES)}"
        if "calls" in record and not (isinstance(record["calls"], dict) and set(record["calls"]) <= set(probe.COUNTED)
                                      and all(type(n) is int and 0 <= n <= probe.MAX_CALLS
                                              for n in record["calls"].values())):
            return (f"a forward pass's count of calls is not a whole number from 0 to {probe.MAX_CALLS} for each of "
                    f"{list(probe.COUNTED)}")
        keys = set(record) - {"exercise", "build", "mode", "inputs", "seed", "copy", "calls", "attempt"}
        if keys not in ({"result"}, {"error"}):
            return f"expected a forward pass's result or error, got fields {sorted(map(str, keys))}"
        return _outcome_problem(record)
    label = record.get("cls")
    if not (isinstance(label, dict) and set(label) == {"name", "text"} and isinstance(label["text"], str)
            and len(label["text"]) <= probe.MAX_MESSAGE and (label["name"] is None or (
                isinstance(label["name"], str) and len(label["name"]) <= probe.MAX_MESSAGE))):
        return "a construction without the name of the class built"
    keys = set(record) - {"exercise", "build", "cls", "attempt"}
    if keys not in ({"module"}, {"result"}, {"error"}):
        return f"expected a module, a result or an error of the construction, got fields {sorted(map(str, keys))}"
    if "module" not in record:
        return _outcome_problem(record)
    module = record["module"]
    if not (isinstance(module, dict) and set(module) - {"structure", "tied", "values"} == {"parameters", "attributes"}):
        return "a module without its parameters and attributes (and nothing else)"
    if "structure" in module:
        why = _structure_problem(module["structure"], module["parameters"])
        if why:
            return why
    why = _parameters_problem(module["parameters"])
    if why:
        return why
    if "tied" in module:
        why = _tied_problem(module["tied"], module["parameters"])
        if why:
            return why
    if "values" in module:
        why = _state_problem(module["values"])
        if why:
            return f"its plain attributes: {why}"
    kinds = module["attributes"]
    if not (isinstance(kinds, dict) and len(kinds) <= 64 and all(_attribute_name(k) for k in kinds)
            and all(v in probe.KINDS for v in kinds.values())):
        return f"a module's attributes are not names with kinds from {list(probe.KINDS)}"
    return None


#: The fields every step of a session has (``probe.record_sessions``), and those of each kind of step.
_STEP_FIELDS = {"exercise", "build", "session", "step", "op", "optional", "attempt", "state"}
_STEP_OWN = {"forward": {"mode", "seed", "inputs"}, "call": {"name", "lookup"}, "to": {"target", "left"},
             "copy": {"child"}}


def _watched_name(path: Any) -> bool:
    """A dotted name a session's snapshot may watch (``cache_k``, ``att.cache_k``, ``blocks.0.att.cache_k``)."""
    return isinstance(path, str) and 0 < len(path) <= 200 and all(
        part.isdigit() or _attribute_name(part) and part not in _module_instance_names() for part in path.split("."))


def _state_problem(state: Any) -> str | None:
    """What is wrong with a session's snapshot of the watched state (``probe.snapshot``), if anything."""
    from course_utils.checks import probe

    if not (isinstance(state, dict) and len(state) <= probe.MAX_WATCHED and all(_watched_name(k) for k in state)):
        return f"a module's state is not a mapping of at most {probe.MAX_WATCHED} attribute names"
    for entry in state.values():
        if entry == {"missing": True}:
            continue
        if not (isinstance(entry, dict) and set(entry) == {"value", "buffer", "saved"}
                and type(entry["buffer"]) is bool and type(entry["saved"]) is bool):
            return "a module's state entry is not a value with whether it is a buffer and saved in state_dict"
        why = _value_problem(entry["value"], 0)
        if why:
            return f"a module's state holds {why}"
        if entry["buffer"] and entry["value"]["kind"] not in ("tensor", "meta", "none"):
            return "a module's state has a buffer that is not a tensor"
    return None


def _session_record_problem(record: dict) -> str | None:
    """What is wrong with a record of an ordered session (``probe.record_sessions``): a construction or a step."""
    from course_utils.checks import probe

    if not (type(record["session"]) is int and 0 <= record["session"] < probe.MAX_SESSIONS):
        return f"a session number that is not a whole number below {probe.MAX_SESSIONS}"
    if type(record.get("optional")) is not bool:
        return "a session's record without whether it is optional"
    if "state" in record:
        why = _state_problem(record["state"])
        if why:
            return why
    if "op" not in record:  # a construction: as any module's, with its session's number and its run
        if not (type(record.get("run")) is int and 0 <= record["run"] < probe.MAX_SESSIONS):
            return "a session's construction without the number of the check's call that made it"
        rest = {k: v for k, v in record.items() if k not in ("session", "optional", "state", "run")}
        return _module_record_problem(rest)
    why = _build_and_try_problem(record)
    if why:
        return why
    op = record["op"]
    if op not in probe.STEP_OPS or not (type(record.get("step")) is int and 0 <= record["step"] < probe.MAX_STEPS):
        return f"a step that is not one of {list(probe.STEP_OPS)} with its place (below {probe.MAX_STEPS})"
    keys = set(record) - _STEP_FIELDS - _STEP_OWN[op]
    if keys not in ({"result"}, {"error"}):
        return f"expected a step's result or error, got fields {sorted(map(str, keys))}"
    if op == "forward":
        if record.get("mode") not in ("eval", "train") or not (record.get("seed") is None or (
                type(record.get("seed")) is int and 0 <= record["seed"] < 2**63)):
            return "a forward pass whose mode is not eval or train, or whose seed is not a whole number"
        why = _inputs_problem(record.get("inputs"))
        if why:
            return why
    elif op == "call":
        if record.get("name") not in probe.SESSION_METHODS or record.get("lookup", True) is not True \
                or ("lookup" in record and "error" not in record):
            return f"a call of a method other than {list(probe.SESSION_METHODS)}"
    elif op == "to":
        left = record.get("left", [])
        if record.get("target") not in probe.TO_TARGETS or ("left" in record and record["target"] != "meta") or not (
                isinstance(left, list) and len(left) <= probe.MAX_STRUCTURE and all(
                    isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and 0 < len(e[0]) <= 300
                    and all(p.isidentifier() or p.isdigit() for p in e[0].split(".")) and isinstance(e[1], str)
                    and 0 < len(e[1]) <= 40 and e[1] != "meta" for e in left)):
            return f"a conversion into other than {list(probe.TO_TARGETS)}, or a malformed list of what stayed behind"
    elif not (type(record.get("child")) is int and 0 <= record["child"] < probe.MAX_SESSIONS):
        return "a copy without the number of its own session"
    return _outcome_problem(record)


def _tied_problem(tied: Any, parameters: list) -> str | None:
    """What is wrong with a module's names of parameters that appear again (``probe.tied_parameters``):
    each ``[name, earlier]`` must name a handed-out parameter under a new dotted name."""
    from course_utils.checks import probe

    names = {p[0] for p in parameters}
    if not (isinstance(tied, list) and len(tied) <= probe.MAX_PARAMETERS):
        return f"its parameters that appear again are not a list of at most {probe.MAX_PARAMETERS}"
    seen: set[str] = set()
    for item in tied:
        if not (isinstance(item, list) and len(item) == 2 and _watched_name(item[0]) and item[1] in names
                and item[0] not in names and item[0] not in seen):
            return "a parameter that appears again is not [a new dotted name, the name of a parameter handed out]"
        seen.add(item[0])
    return None


def _shape_problem(shape: Any, dtype: Any) -> str | None:
    if not (isinstance(shape, list) and len(shape) <= 8 and all(type(n) is int and 0 <= n <= 2**31 for n in shape)):
        return "a shape that is not a short list of sizes"
    if dtype not in DTYPES:
        return f"an unsupported dtype {str(dtype)[:40]!r}"
    return None


def _structure_problem(structure: Any, parameters: Any) -> str | None:
    """What is wrong with a module's handed-out make-up (``probe.structure_of``, and what ``.to("meta")``
    left or what the copy raised), if anything."""
    import math

    from course_utils.checks import probe

    if not (isinstance(structure, dict) and {"buffers", "plain"} <= set(structure)
            <= {"buffers", "plain", "meta_left", "copy_error"}):
        return "a module's make-up without its buffers and plain tensors (and nothing else)"
    buffers, plain = structure["buffers"], structure["plain"]
    if not (isinstance(buffers, list) and isinstance(plain, list) and len(buffers) <= probe.MAX_STRUCTURE
            and len(plain) <= probe.MAX_STRUCTURE):
        return f"a module's buffers or plain tensors are not lists of at most {probe.MAX_STRUCTURE}"
    taken = {p[0] for p in parameters if isinstance(p, list) and p} if isinstance(parameters, list) else set()
    total = 0
    for item in buffers:
        if not (isinstance(item, list) and len(item) == 4 and isinstance(item[0], str) and type(item[3]) is bool):
            return "a buffer is not [name, shape, dtype, in state_dict]"
        parts = item[0].split(".")
        if not all((p.isidentifier() and not p.startswith("_")) or p.isdigit() for p in parts) or item[0] in taken:
            return f"a buffer has a malformed or repeated name {item[0][:100]!r}"
        taken.add(item[0])
    for item in plain:
        if not (isinstance(item, list) and len(item) == 3 and _plain_name(item[0])) or item[0] in taken:
            return "a plain tensor attribute is not [name, shape, dtype] under a name of its own"
        taken.add(item[0])
    for item in buffers + plain:
        why = _shape_problem(item[1], item[2])
        if why:
            return f"a buffer or plain tensor has {why}"
        total += math.prod(item[1])
    if total > MAX_ELEMENTS:
        return f"a module's buffers and plain tensors hold {total:,} numbers, over the limit of {MAX_ELEMENTS:,}"
    left = structure.get("meta_left", [])
    if not (isinstance(left, list) and len(left) <= probe.MAX_STRUCTURE and all(
            isinstance(e, list) and len(e) == 2 and e[0] in taken and isinstance(e[1], str) and 0 < len(e[1]) <= 40
            and e[1] != "meta" for e in left)):
        return "what .to('meta') left behind is not a list of the module's tensors and their devices"
    if "copy_error" in structure:
        error = structure["copy_error"]
        if not (isinstance(error, dict) and set(error) == {"type", "message"} and _is_name(error["type"])
                and isinstance(error["message"], str) and len(error["message"]) <= probe.MAX_MESSAGE):
            return "a copy's error without a type name and a message"
    return None


def _plain_name(name: Any) -> bool:
    """A name a plain tensor attribute may be rebuilt under: nothing ``nn.Module`` or the replay uses."""
    import torch

    return _is_name(name) and not name.startswith(("__", "_course")) and not hasattr(torch.nn.Module, name) \
        and name not in _module_instance_names()


@functools.lru_cache(maxsize=1)
def _module_instance_names() -> frozenset[str]:
    import torch

    return frozenset(vars(torch.nn.Module()))


def _attribute_name(name: Any) -> bool:
    """A name a module's attribute may be rebuilt under: no private name, nothing ``nn.Module`` has."""
    import torch

    return _is_name(name) and not name.startswith("_") and not hasattr(torch.nn.Module, name)


def _parameters_problem(parameters: Any) -> str | None:
    """What is wrong with a module's handed-out parameters (``probe.parameters_of``), if anything."""
    from course_utils.checks import probe

    if not isinstance(parameters, list) or len(parameters) > probe.MAX_PARAMETERS:
        return f"a module's parameters are not a list of at most {probe.MAX_PARAMETERS}"
    names, total = set(), 0
    for item in parameters:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and len(item[0]) <= 300):
            return "a module's parameter is not a [name, tensor] pair"
        name, value = item
        parts = name.split(".")
        if not all((p.isidentifier() and not p.startswith("_")) or p.isdigit() for p in parts) or name in names:
            return f"a module's parameter has a malformed or repeated name {name[:100]!r}"
        names.add(name)
        why = _value_problem({"kind": "tensor", "value": value}, 0)
        if why:
            return f"a module's parameter {name!r} is {why}"
        total += value.numel()
    if total > MAX_ELEMENTS:
        return f"a module's parameters hold {total:,} numbers, over the limit of {MAX_ELEMENTS:,}"
    return None


def _after_problem(after: Any, count: int) -> str | None:
    """What is wrong with what a call left in the modules it was given (``probe.record``'s ``after``)."""
    from course_utils.checks import probe

    if not (isinstance(after, list) and len(after) == count):
        return "what the call left in its arguments is not one entry per argument"
    for states in after:
        if states is None:
            continue
        if not (isinstance(states, dict) and len(states) <= 64 and all(_attribute_name(k) for k in states)):
            return "what the call left in a module is not a mapping of attribute names"
        for state in states.values():
            if isinstance(state, dict) and set(state) == {"kind"} and state["kind"] == "unchanged":
                continue
            if not (isinstance(state, dict) and state.get("kind") in probe.KINDS and _is_name(state.get("type"))):
                return "an attribute left by the call without a kind and a type name"
            tensor_kind = state["kind"] in ("Parameter", "Tensor", "Linear")
            if set(state) - {"kind", "type"} != ({"value"} if tensor_kind and "value" in state else set()):
                return "an attribute left by the call with other fields"
            if "value" in state:
                why = _value_problem({"kind": "tensor", "value": state["value"]}, 0)
                if why:
                    return f"an attribute left by the call holds {why}"
    return None


def _inputs_problem(inputs: Any) -> str | None:
    """What is wrong with a record's handed-out inputs (:func:`course_utils.checks.probe.inputs_of`), if anything."""
    if not (isinstance(inputs, dict) and set(inputs) == {"args", "kwargs"} and isinstance(inputs["kwargs"], dict)):
        return "no inputs of its call"
    if not (isinstance(inputs["args"], dict) and inputs["args"].get("kind") == "list"):
        return "its inputs' arguments are not a list"
    if len(inputs["kwargs"]) > 64 or not all(_is_name(k) for k in inputs["kwargs"]):
        return "its inputs' keyword arguments are not named"
    for value in [inputs["args"], *inputs["kwargs"].values()]:
        why = _value_problem(value, 0, modules=True)
        if why:
            return f"its inputs hold {why}"
    return None


def same_inputs(handed: dict, given: dict) -> bool:
    """Whether inputs handed out by the kernel are the ones the grader gave (both as
    :func:`course_utils.checks.probe.inputs_of` writes them): the same structure, types, dtypes and
    shapes; floating-point values up to ``torch.testing.assert_close``'s tolerance for their dtype
    (another CPU's rounding of the same arithmetic), NaN and infinities in the same places; everything
    else equal."""
    return (set(handed["kwargs"]) == set(given["kwargs"]) and _same_value(handed["args"], given["args"])
            and all(_same_value(handed["kwargs"][k], given["kwargs"][k]) for k in given["kwargs"]))


def _same_value(a: dict, b: dict) -> bool:
    import math

    import torch

    kind = a["kind"]
    if kind != b["kind"]:
        return False
    if kind == "tensor":
        x, y = a["value"], b["value"]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.is_floating_point() or x.is_complex():
            if torch.equal(x, y):  # the usual case, and a quick one
                return True
            if not torch.allclose(x, y, rtol=0.05, atol=1e-3, equal_nan=True):  # looser than any dtype's: quickly not
                return False
            try:
                torch.testing.assert_close(x, y, equal_nan=True, check_stride=False)
            except AssertionError:
                return False
            return True
        return torch.equal(x, y)
    if kind == "meta":
        return a["dtype"] == b["dtype"] and a["shape"] == b["shape"]
    if kind == "number":
        if a["type"] != b["type"]:
            return False
        if a["type"] == "float":
            u, v = a["value"], b["value"]
            return (math.isnan(u) and math.isnan(v)) or u == v or math.isclose(u, v, rel_tol=1.3e-6, abs_tol=1e-5)
        return a["value"] == b["value"]
    if kind in ("list", "tuple"):
        return len(a["items"]) == len(b["items"]) and all(_same_value(u, v) for u, v in zip(a["items"], b["items"]))
    if kind == "module":  # an argument that is a module: its parameters, by name and value
        return [n for n, _ in a["parameters"]] == [n for n, _ in b["parameters"]] and all(
            _same_value({"kind": "tensor", "value": x}, {"kind": "tensor", "value": y})
            for (_, x), (_, y) in zip(a["parameters"], b["parameters"]))
    if kind == "layout":  # a module argument as its make-up: plain data, equal or not
        return a["layout"] == b["layout"]
    if kind == "text":
        return a["value"] == b["value"]
    if kind == "other":
        return a["type"] == b["type"]
    return kind == "none"


def _value_problem(value: Any, depth: int, modules: bool = False) -> str | None:
    """What is wrong with a handed-out value (``wire.value_problem``), if anything; ``modules``: a module
    (as its parameters, or its layout) may be among them, as among a call's inputs."""
    from course_utils.checks import probe, wire

    def module(value: dict) -> str | None:
        kind, keys = value["kind"], set(value)
        if kind == "module":
            return _parameters_problem(value.get("parameters")) if keys == {"kind", "parameters"} \
                else "a module value with other fields"
        if kind == "layout":  # a module argument as its make-up (LAYOUT_INPUTS)
            why = probe.layout_problem(value.get("layout")) if keys == {"kind", "layout"} else "it has other fields"
            return f"a module layout that is malformed: {why}" if why else None
        return wire.NOT_MINE

    return wire.value_problem(value, depth, module if modules else None)


def _decode(value: dict) -> Any:
    from course_utils.checks import wire

    return wire.decode(value)


# --------------------------------------------------------------------------------------------
# 3. The replay, and the verdict
# --------------------------------------------------------------------------------------------
def _replay_miss() -> type:
    from course_utils.checks import probe

    return probe.ReplayMiss


class HandOffFailure(_replay_miss()):  # type: ignore[misc]
    """The replay met a missing, forged or extra output. A ``BaseException``
    (``course_utils.checks.probe.ReplayMiss``), so that the check engine (which turns a student's
    ``Exception`` into a verdict) lets it through to the judge; only a diagnose's own call that the
    replay cannot answer is stopped there (``core.explain``: no hint then)."""


def _exception(error: dict) -> Exception:
    """An exception of the recorded type name (a builtin one where that name is one) whose text is
    the recorded message (``probe.error_of``)."""
    from course_utils.checks import probe

    return probe.error_of(error["type"], error["message"])


def _replayed() -> type:
    from course_utils.checks import probe

    return probe.Replayed


class Replay(_replayed()):  # type: ignore[misc]
    """Stands for a student's function in the grader's process: each call returns (or raises) what
    the student's function gave in the kernel on the same inputs, in the order the checks call it.

    A function that changed modules in place (its record has ``"after"``) leaves in the modules it is
    given what it left in the kernel's: each named attribute rebuilt as a real ``nn.Parameter``,
    tensor, ``nn.Linear`` or ``nn.Module`` of the recorded kind, or kept as the grader's own where the
    kernel saw it ``unchanged`` (so that the checks' exact comparisons with the inputs come out as
    they did in the kernel).

    A call whose inputs are not those the recorded output was computed from, or a call with no
    recorded output left, raises :class:`HandOffFailure`. ``__course_source__`` (set on a subclass)
    is the student's function's source (see :func:`judge_test`), for the rules and the diagnoses
    that read code.
    """

    __course_source__: str | None = None

    def __init__(self, exercise: str, records: list[dict]):
        self.exercise = exercise
        self.records = records
        self.used = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from course_utils.checks import probe

        if self.used >= len(self.records):
            raise HandOffFailure(f"no output came back for input {self.used + 1} that the test gives "
                                 f"{self.exercise} (the kernel stopped before it, or the hand-off was changed)")
        record = self.records[self.used]
        self.used += 1
        if not same_inputs(record["inputs"], probe.inputs_of(args, kwargs, self.exercise in LAYOUT_INPUTS)):
            raise HandOffFailure(f"output {self.used} of {self.exercise} was not computed from the inputs the "
                                 f"grader gave (the hand-off was changed)")
        for i in record.get("changed_inputs", []):
            if i < len(args) and hasattr(args[i], "set_"):
                import torch

                args[i].set_(torch.zeros(args[i].numel() + 1, dtype=args[i].dtype))  # changed, as in the kernel
        for arg, states in zip(args, record.get("after", [])):
            if states is not None:
                _leave_in(arg, states, self.exercise)
        if "error" in record:
            raise _exception(record["error"])
        return _decode(record["result"])


# --------------------------------------------------------------------------------------------
# Modules: rebuilt from their handed-out parameters, with their outputs replayed
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _replay_linear_class() -> type:
    import torch

    class ReplayLinear(torch.nn.Linear):
        """An ``nn.Linear`` (for the checks' ``isinstance``) holding only what was handed out."""

        def __init__(self, weight: Any = None):  # noqa: D107
            torch.nn.Module.__init__(self)
            self.in_features = self.out_features = 0
            if weight is not None:
                self.weight = torch.nn.Parameter(weight.clone(), requires_grad=weight.is_floating_point())
                self.out_features, self.in_features = tuple(weight.shape) if weight.dim() == 2 else (0, 0)
                self.register_parameter("bias", None)

    return ReplayLinear


def _attribute_value(state: dict) -> Any:
    """An attribute as handed out (``probe.attribute_state``): a real ``nn.Parameter``, tensor,
    ``nn.Linear`` or ``nn.Module``, or an object of the type's name."""
    import torch

    kind, name, value = state["kind"], state["type"], state.get("value")
    if kind == "Parameter":
        return torch.nn.Parameter(value.clone(), requires_grad=value.is_floating_point()) if value is not None \
            else torch.nn.Parameter(torch.zeros(0))
    if kind == "Tensor":
        plain = value.clone() if value is not None else torch.zeros(0)
        return plain if name == "Tensor" else plain.as_subclass(type(name, (torch.Tensor,), {}))
    if kind == "Linear":
        base = _replay_linear_class()
        return (base if name == "Linear" else type(name, (base,), {}))(value)
    if kind == "Module":
        return (torch.nn.Module if name == "Module" else type(name, (torch.nn.Module,), {}))()
    if kind == "None":
        return None
    return type(name, (), {})()


def _rebind(module: Any, name: str, value: Any) -> None:
    """Make ``getattr(module, name)`` give ``value``, registered as the kernel's was where it is a
    parameter or a module."""
    import torch

    for store in ("_parameters", "_modules", "_buffers"):
        getattr(module, store, {}).pop(name, None)
    module.__dict__.pop(name, None)
    if isinstance(value, (torch.nn.Parameter, torch.nn.Module)):
        setattr(module, name, value)
    else:
        object.__setattr__(module, name, value)


def _leave_in(arg: Any, states: dict, exercise: str) -> None:
    """Leave in the module ``arg`` what the student's call left in the kernel's (``"after"``)."""
    import torch

    if not isinstance(arg, torch.nn.Module):
        raise HandOffFailure(f"what {exercise} left in its arguments was handed out for one that is not a module "
                             f"(the hand-off was changed)")
    for name, state in states.items():
        if state["kind"] != "unchanged":
            _rebind(arg, name, _attribute_value(state))


def _leave_on_cpu(module: Any, left: set[str]) -> None:
    """After a rebuilt module's ``.to("meta")``: the tensors named in ``left`` (those the kernel's module left
    behind) are put back on the CPU, as zeros of their shape and dtype, and its plain tensor attributes not
    named there follow it to ``meta``. ``module`` has ``_course_owner`` (:func:`_replay_module_class`)."""
    import torch

    tensors = dict(module.named_parameters()) | dict(module.named_buffers())
    for name in left & set(tensors):
        owner, leaf = module._course_owner(name)
        kept = torch.zeros(tensors[name].shape, dtype=tensors[name].dtype)
        if leaf in owner._parameters:
            owner._parameters[leaf] = torch.nn.Parameter(kept, requires_grad=kept.is_floating_point())
        else:
            owner._buffers[leaf] = kept
    for name, value in list(vars(module).items()):
        if isinstance(value, torch.Tensor) and name not in left:
            object.__setattr__(module, name, value.to("meta"))


def _settle(module: Any, state: dict, exercise: str) -> None:
    """Leave in the rebuilt ``module`` (it has ``_course_owner``) the state handed out (``probe.snapshot``:
    dotted name -> value, whether a buffer and saved in ``state_dict``, or missing); a name that would
    replace one of its parameters or submodules raises :class:`HandOffFailure`."""
    import torch

    for path, entry in state.items():
        try:
            owner, leaf = module._course_owner(path, create=True)
        except (KeyError, AttributeError, TypeError):
            raise HandOffFailure(f"the state handed out for {exercise} names {path[:100]!r}, which is not an "
                                 f"attribute it can have (the hand-off was changed)") from None
        if leaf in owner._parameters or leaf in owner._modules:
            raise HandOffFailure(f"the state handed out for {exercise} replaces its {path[:100]!r} "
                                 f"(the hand-off was changed)")
        owner._buffers.pop(leaf, None)
        owner._non_persistent_buffers_set.discard(leaf)
        owner.__dict__.pop(leaf, None)
        if entry.get("missing"):
            continue
        value = _decode(entry["value"])
        if entry["buffer"]:
            owner._buffers[leaf] = value if isinstance(value, torch.Tensor) else None
            if not entry["saved"]:
                owner._non_persistent_buffers_set.add(leaf)
        else:
            object.__setattr__(owner, leaf, value)


@functools.lru_cache(maxsize=None)
def _replay_module_class() -> type:
    import torch

    from course_utils.checks import probe

    class ReplayModule(torch.nn.Module):
        """A student's module rebuilt from what the kernel handed out: its parameters (names, in
        order, and values), the kinds of the attributes the check named, and a forward pass that
        replays the kernel's outputs (:meth:`ModuleReplay.forward`)."""

        def __init__(self, replay: "ModuleReplay", build: dict, module: dict):
            super().__init__()
            object.__setattr__(self, "_course_replay", replay)
            object.__setattr__(self, "_course_build", build)
            kinds = module["attributes"]
            for name, value in module["parameters"]:
                *path, leaf = name.split(".")
                owner: torch.nn.Module = self
                for depth, part in enumerate(path):
                    child = owner._modules.get(part)
                    if child is None:
                        linear = depth == 0 and kinds.get(part) == "Linear"
                        child = _replay_linear_class()() if linear else torch.nn.Module()
                        owner.add_module(part, child)
                    owner = child
                owner.register_parameter(leaf, torch.nn.Parameter(value.clone(), requires_grad=value.is_floating_point()))
            for child in self._modules.values():  # a layer without a bias has bias None, as nn.Linear's
                if isinstance(child, torch.nn.Linear) and "bias" not in child._parameters:
                    child.register_parameter("bias", None)
            built = dict(self.named_parameters())
            for name, earlier in module.get("tied", []):  # one parameter under a second name, as the kernel's
                owner, leaf = self._course_owner(name, create=True)
                if leaf in owner._parameters or leaf in owner._modules:
                    raise ValueError(f"parameter {name!r} appears twice")
                owner.register_parameter(leaf, built[earlier])
            structure = module.get("structure")
            object.__setattr__(self, "_course_structure", structure or {})
            object.__setattr__(self, "_course_copy", None)
            for name, shape, dtype, kept in (structure or {}).get("buffers", []):
                owner, leaf = self._course_owner(name, create=True)
                owner.register_buffer(leaf, torch.zeros(shape, dtype=getattr(torch, dtype)), persistent=kept)
            for name, shape, dtype in (structure or {}).get("plain", []):
                object.__setattr__(self, name, torch.zeros(shape, dtype=getattr(torch, dtype)))
            for name, kind in kinds.items():
                found = getattr(self, name, None)
                if kind == "None" and found is None:
                    continue
                if found is None or probe.kind_of(found) != kind:
                    object.__setattr__(self, name, _attribute_value({"kind": kind, "type": kind if kind != "other"
                                                                     else "object"}))
            if [n for n, _ in self.named_parameters()] != [n for n, _ in module["parameters"]]:
                raise ValueError("its parameters do not rebuild in the order handed out")
            _settle(self, module.get("values", {}), replay.exercise)  # plain attributes the check reads

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self._course_replay.forward(self, args, kwargs)

        def _course_owner(self, name: str, create: bool = False) -> tuple[torch.nn.Module, str]:
            *path, leaf = name.split(".")
            owner: torch.nn.Module = self
            for part in path:
                child = owner._modules.get(part)
                if child is None:
                    if not create:
                        raise KeyError(name)
                    child = torch.nn.Module()
                    owner.add_module(part, child)
                owner = child
            return owner, leaf

        def _apply(self, fn: Any, recurse: bool = True) -> Any:
            """Convert as ``nn.Module`` does, noting into what (:data:`probe.COPIES`: the forward passes
            of a converted copy are looked up as such); after ``.to("meta")`` exactly the tensors the
            kernel's copy left behind stay on the CPU."""
            converted = fn(torch.zeros(1))
            if converted.device.type == "meta":
                copy = "meta"
            elif converted.dtype == torch.float64:
                copy = "float64"
            else:
                copy = self._course_copy if converted.dtype == torch.float32 else str(converted.dtype)
            error = self._course_structure.get("copy_error")
            if error is not None and copy in ("meta", "float64"):
                raise _exception(error)
            result = super()._apply(fn, recurse)
            object.__setattr__(self, "_course_copy", copy)
            if copy == "meta" and self._course_structure:
                _leave_on_cpu(self, {name for name, _ in self._course_structure.get("meta_left", [])})
            return result

        def __deepcopy__(self, memo: dict) -> Any:
            import copy

            for shared in (self._course_replay, self._course_build, self._course_structure):
                memo[id(shared)] = shared
            new = type(self).__new__(type(self))
            memo[id(self)] = new
            for key, value in self.__dict__.items():
                object.__setattr__(new, key, copy.deepcopy(value, memo))
            return new

    return ReplayModule


class ModuleReplay(Replay):
    """Stands for a student's module class in the grader's process. ``cls(*build)`` gives what the
    kernel's construction with those arguments gave: a :class:`ReplayModule`-like ``nn.Module`` rebuilt
    from the handed-out parameters, the object the constructor returned, or the error it raised.
    Each forward pass of that module returns (or raises) the kernel's output for that input, mode and
    construction, in the order the check runs them.

    A construction is taken in order; calling the class again with the arguments of the last one
    (a diagnose looking at the module again) gives it again. Anything else, or inputs other than the
    grader's, raises :class:`HandOffFailure`.
    """

    def __init__(self, exercise: str, records: list[dict]):
        super().__init__(exercise, records)
        self._last: dict | None = None  # the last construction taken

    def _take(self, what: str, match: Any) -> dict:
        """The next record, which ``match`` must accept (:class:`HandOffFailure` if there is none or it does not)."""
        if self.used >= len(self.records):
            raise HandOffFailure(f"no {what} came back for {self.exercise} at step {self.used + 1} of the test "
                                 f"(the kernel stopped before it, or the hand-off was changed)")
        record = self.records[self.used]
        if not match(record):
            raise HandOffFailure(f"output {self.used + 1} of {self.exercise} is not the {what} the grader asked for: "
                                 f"another kind of output, or one computed from other inputs (the hand-off was changed)")
        self.used += 1
        return record

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from course_utils.checks import probe

        given = probe.inputs_of(args, kwargs)
        upcoming = self.records[self.used] if self.used < len(self.records) else None

        def construction(r: dict) -> bool:
            return "build" in r and "mode" not in r and same_inputs(r["build"], given)

        if (upcoming is None or not construction(upcoming)) and self._last is not None \
                and same_inputs(self._last["build"], given):
            record = self._last  # built again (a diagnose looks at it): the same construction
        else:
            record = self._last = self._take("construction", construction)
        return self._construct(record, given)

    def _construct(self, record: dict, given: dict) -> Any:
        """What the construction ``record`` gave, for constructor arguments ``given``."""
        label = record["cls"]
        if label["name"] is not None:
            self.__name__ = label["name"]
        else:
            self.__dict__.pop("__name__", None)
        self._text = label["text"]
        if "error" in record:
            raise _exception(record["error"])
        if "result" in record:
            return _decode(record["result"])
        try:
            return _replay_module_class()(self, given, record["module"])
        except (ValueError, KeyError, TypeError, RuntimeError, AttributeError) as exc:
            raise HandOffFailure(f"the module handed out for {self.exercise} cannot be rebuilt ({exc})") from None

    def __str__(self) -> str:
        return getattr(self, "_text", "") or super().__str__()

    def forward(self, module: Any, args: tuple, kwargs: dict) -> Any:
        from course_utils.checks import probe

        mode = "train" if module.training else "eval"
        given = probe.inputs_of(args, kwargs)
        record = self._take("forward pass", lambda r: "mode" in r and r["mode"] == mode and same_inputs(
            r["build"], module._course_build) and same_inputs(r["inputs"], given))
        if "error" in record:
            raise _exception(record["error"])
        return _decode(record["result"])


class KeyedModuleReplay(ModuleReplay):
    """A :class:`ModuleReplay` for a module check that probes the module (:data:`KEYED`): a
    construction is looked up by its arguments, as often as the check builds it; a forward pass by
    construction, mode, the seed the check set right before it (``torch.initial_seed()``; else one
    the kernel ran under no seed of the check's), the copy it runs on (as built, or converted with
    ``.to(torch.float64)`` or ``.to("meta")``) and inputs. Passes the kernel handed out that the check
    does not ask for (a diagnosis's, when there is nothing to diagnose) are left unread; one it asks
    for that did not come back raises :class:`HandOffFailure`.

    ``attempt``: which of ``modules.check_alone``'s tries the check is replaying (``None``: a check
    without tries). Only the records the kernel marked as that try are looked at (``probe.ATTEMPTS``,
    ``probe.record_module_probes``), so one try's outputs never stand for the other's."""

    attempt: int | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        from course_utils.checks import probe

        given = probe.inputs_of(args, kwargs)
        for record in self.records:
            if "build" in record and "mode" not in record and record.get("attempt") == self.attempt \
                    and same_inputs(record["build"], given):
                self._last = record
                built = self._construct(record, given)
                if isinstance(built, torch.nn.Module):  # its passes name the record's own arguments
                    object.__setattr__(built, "_course_build", record["build"])
                return built
        raise HandOffFailure(f"no construction of {self.exercise} with the arguments the grader gave came back "
                             f"(the kernel stopped before it, or the hand-off was changed)")

    def ran(self, *args: Any, **kwargs: Any) -> Any:
        """What the kernel's run of the check's own procedure on these inputs gave (``probe.record_runs``:
        notebook 09's cached path), looked up by its inputs within the try replayed; ``probe.run_or_replay``
        asks this. One that did not come back raises :class:`HandOffFailure`."""
        from course_utils.checks import probe

        given = probe.inputs_of(args, kwargs)
        for record in self.records:
            if "build" not in record and "inputs" in record and record.get("attempt") == self.attempt \
                    and same_inputs(record["inputs"], given):
                if "error" in record:
                    raise _exception(record["error"])
                return _decode(record["result"])
        raise HandOffFailure(f"no output came back for a run of {self.exercise} that the test makes (the kernel "
                             f"stopped before it, or the hand-off was changed)")

    def forward(self, module: Any, args: tuple, kwargs: dict) -> Any:
        import torch

        from course_utils.checks import probe

        mode, seed, copy = "train" if module.training else "eval", torch.initial_seed(), module._course_copy
        given = probe.inputs_of(args, kwargs)
        build = module._course_build
        found = [r for r in self.records if "mode" in r and r["mode"] == mode and r.get("copy") == copy
                 and r.get("attempt") == self.attempt and (r["build"] is build or same_inputs(r["build"], build)) and same_inputs(r["inputs"], given)]
        record = next((r for r in found if r.get("seed") == seed), None) or \
            next((r for r in found if r.get("seed") is None), None)
        if record is None:
            raise HandOffFailure(f"no output came back for a forward pass of {self.exercise} that the test makes "
                                 f"({mode}() mode, seed {seed}{f', a {copy} copy' if copy else ''}, input shape "
                                 f"{tuple(args[0].shape) if args and hasattr(args[0], 'shape') else '?'}): the "
                                 f"kernel stopped before it, or the hand-off was changed")
        probe.add_replayed_calls(record.get("calls", {}))  # the calls a check counts (probe.CallCounter)
        if "error" in record:
            raise _exception(record["error"])
        return _decode(record["result"])


@functools.lru_cache(maxsize=None)
def _session_module_class() -> type:
    import torch

    from course_utils.checks import probe

    class SessionModule(_replay_module_class()):  # type: ignore[misc, valid-type]
        """A student's module rebuilt from its construction, whose every step (a forward pass, a call of
        ``reset_cache``, ``.to``, a deep copy) is answered from its session, in order
        (:class:`SessionReplay`), and whose watched state follows what the kernel's module held."""

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self._course_replay.forward(self, args, kwargs)

        def __getattr__(self, name: str) -> Any:
            if name in probe.SESSION_METHODS and "_course_session" in self.__dict__:
                return self._course_replay.method(self, name)
            return super().__getattr__(name)

        def _apply(self, fn: Any, recurse: bool = True) -> Any:
            if "_course_session" not in self.__dict__:
                return torch.nn.Module._apply(self, fn, recurse)
            converted = fn(torch.zeros(1))
            target = "meta" if converted.device.type == "meta" else str(converted.dtype).removeprefix("torch.")
            record = self._course_replay.take(self, "to", lambda r: r["target"] == target, f".to({target})")
            if "error" in record:
                self._course_replay.settle(self, record)
                raise _exception(record["error"])
            result = torch.nn.Module._apply(self, fn, recurse)
            if target == "meta":  # exactly what the kernel's module left behind stays on the CPU
                _leave_on_cpu(self, {name for name, _ in record.get("left", [])})
            self._course_replay.settle(self, record)
            return result

        def __deepcopy__(self, memo: dict) -> Any:
            if "_course_session" not in self.__dict__:
                return super().__deepcopy__(memo)
            record = self._course_replay.take(self, "copy", lambda r: True, "copy (copy.deepcopy)")
            self._course_replay.settle(self, record)
            if "error" in record:
                raise _exception(record["error"])
            new = super().__deepcopy__(memo)
            object.__setattr__(new, "_course_session", record["child"])
            return new

    return SessionModule


class SessionReplay(ModuleReplay):
    """A :class:`ModuleReplay` for a module whose outputs depend on every call before them (:data:`SESSIONS`:
    a cache). Each construction the check makes takes the next one the kernel handed out (a diagnosis's,
    ``probe.diagnosis``, the next one of the diagnoses' with its arguments), and each module answers the
    check's steps strictly in the order its session recorded them (``probe.record_sessions``): a forward
    pass checks its mode, the seed the check set, and its inputs; ``reset_cache()``, ``.to(...)`` and
    ``copy.deepcopy`` are steps too, and after each the module's watched state (the cache) becomes what the
    kernel's held. A step out of order, missing or of other inputs, or (on a pass) a construction or step
    left unread, raises :class:`HandOffFailure`; steps marked optional (a diagnosis's) may be skipped.

    ``attempt``: which of ``modules.check_alone``'s tries the check is replaying, as for
    :class:`KeyedModuleReplay`. A check calls :meth:`begin` first, each time it is called: each call
    reads its own run of sessions (a test cell that checks its visible, then its hidden cases)."""

    attempt: int | None = None

    def __init__(self, exercise: str, records: list[dict]):
        super().__init__(exercise, records)
        self._run = -1  # which call of the check is replayed (begin())
        self._taken: set[int] = set()  # id() of the constructions taken
        self._cursor: dict[int, int] = {}  # session -> its next step
        self._constructions = [r for r in records if "session" in r and "op" not in r]
        self._steps: dict[int, list[dict]] = {}
        for r in records:
            if "op" in r:
                self._steps.setdefault(r["session"], []).append(r)
        self._problem = self._consistency()

    def _consistency(self) -> str | None:
        """What makes these records no set of sessions (numbers repeated, steps out of order, a copy's session
        claimed twice), or ``None``. Also notes which construction each session comes from."""
        roots: dict[int, dict] = {}
        for r in self._constructions:
            if r["session"] in roots:
                return f"two constructions of {self.exercise} claim session {r['session']}"
            roots[r["session"]] = r
        self._root = dict(roots)
        for number in sorted(self._steps, key=lambda n: (n not in roots, n)):  # constructions' first, then copies'
            steps = self._steps[number]
            if [r["step"] for r in steps] != list(range(len(steps))):
                return f"the steps of session {number} of {self.exercise} are not in order"
            if number not in self._root:
                return f"session {number} of {self.exercise} has steps but no construction or copy"
            for r in steps:
                if r.get("attempt") != self._root[number].get("attempt"):
                    return f"session {number} of {self.exercise} mixes steps of two tries"
                if r["op"] == "copy" and "error" not in r:
                    if r["child"] in self._root:
                        return f"session {r['child']} of {self.exercise} is claimed twice"
                    self._root[r["child"]] = self._root[number]
        return None

    def begin(self) -> None:
        """A check starts (each call of the check reads its own run of sessions, ``probe.record_sessions``):
        the run before, whose check passed, must have been read whole."""
        why = self.left_over(final=False) if self._run >= 0 else None
        if why:
            raise HandOffFailure(f"more outputs came back than the test asked for ({self.exercise}: {why}): the "
                                 f"hand-off was changed")
        self._run += 1

    def _check(self) -> None:
        if self._problem:
            raise HandOffFailure(f"{self._problem} (the hand-off was changed)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from course_utils.checks import probe

        self._check()
        given = probe.inputs_of(args, kwargs)
        optional = probe.diagnosing()
        pending = [r for r in self._constructions if r.get("attempt") == self.attempt and r["run"] == max(self._run, 0)
                   and r["optional"] == optional and id(r) not in self._taken]
        if optional:
            record = next((r for r in pending if same_inputs(r["build"], given)), None)
        else:
            record = pending[0] if pending and same_inputs(pending[0]["build"], given) else None
        if record is None:
            raise HandOffFailure(f"the construction of {self.exercise} that the test makes next did not come back "
                                 f"(the kernel stopped before it, or the hand-off was changed or reordered)")
        self._taken.add(id(record))
        self._last = record
        return self._construct(record, given)

    def _construct(self, record: dict, given: dict) -> Any:
        if "module" not in record:
            return super()._construct(record, given)
        label = record["cls"]
        if label["name"] is not None:
            self.__name__ = label["name"]
        else:
            self.__dict__.pop("__name__", None)
        self._text = label["text"]
        try:
            built = _session_module_class()(self, record["build"], record["module"])
        except (ValueError, KeyError, TypeError, RuntimeError, AttributeError) as exc:
            raise HandOffFailure(f"the module handed out for {self.exercise} cannot be rebuilt ({exc})") from None
        object.__setattr__(built, "_course_session", record["session"])
        self.settle(built, record)
        return built

    def take(self, module: Any, op: str, match: Any, what: str) -> dict:
        """The next step of ``module``'s session, which must be an ``op`` that ``match`` accepts (optional steps
        that are not are skipped); :class:`HandOffFailure` if there is none or it is another."""
        self._check()
        number = module._course_session
        steps, at = self._steps.get(number, []), self._cursor.get(number, 0)
        while at < len(steps) and steps[at]["optional"] and not (steps[at]["op"] == op and match(steps[at])):
            at += 1  # a diagnosis's step that the check does not make
        if at >= len(steps):
            raise HandOffFailure(f"no {what} of {self.exercise} came back for step {at + 1} of one of its modules "
                                 f"(the kernel stopped before it, or the hand-off was changed)")
        record = steps[at]
        if record["op"] != op or not match(record):
            raise HandOffFailure(f"step {at + 1} of a module of {self.exercise} is not the {what} the test makes "
                                 f"next: another step, or one of other inputs (the hand-off was changed or reordered)")
        self._cursor[number] = at + 1
        return record

    def settle(self, module: Any, record: dict) -> None:
        """Leave in ``module`` the watched state the kernel's module had after ``record`` (``probe.snapshot``)."""
        _settle(module, record.get("state", {}), self.exercise)

    def method(self, module: Any, name: str) -> Any:
        """``module.<name>``, a method the kernel's session called (:data:`probe.SESSION_METHODS`): the step
        is taken now; where the kernel's module had no such method, the error it gave is raised now."""
        record = self.take(module, "call", lambda r: r["name"] == name, f"call of {name}()")
        if record.get("lookup"):
            self.settle(module, record)
            raise _exception(record["error"])

        def call() -> Any:
            self.settle(module, record)
            if "error" in record:
                raise _exception(record["error"])
            return _decode(record["result"])
        return call

    def forward(self, module: Any, args: tuple, kwargs: dict) -> Any:
        import torch

        from course_utils.checks import probe

        mode, seed = "train" if module.training else "eval", torch.initial_seed()
        given = probe.inputs_of(args, kwargs)
        shape = tuple(args[0].shape) if args and hasattr(args[0], "shape") else "?"
        record = self.take(module, "forward", lambda r: r["mode"] == mode and r["seed"] in (None, seed)
                           and same_inputs(r["inputs"], given), f"forward pass ({mode}() mode, input shape {shape})")
        self.settle(module, record)
        if "error" in record:
            raise _exception(record["error"])
        return _decode(record["result"])

    def left_over(self, final: bool = True) -> str | None:
        """After a pass: the constructions and steps of the try and the run replayed that the test did not read
        (a diagnosis's may stay unread), said in words, or ``None``. A run after the last the check began
        (:meth:`begin`) is left over too, once the test has ended (``final``)."""
        if self._problem:
            return self._problem
        run = max(self._run, 0)
        unbuilt = [r for r in self._constructions if r.get("attempt") == self.attempt and not r["optional"]
                   and r["run"] == run and id(r) not in self._taken]
        unread = sum(1 for number, steps in self._steps.items()
                     if self._root[number].get("attempt") == self.attempt and not self._root[number]["optional"]
                     and self._root[number]["run"] == run
                     for r in steps[self._cursor.get(number, 0):] if not r["optional"])
        later = {r["run"] for r in self._constructions if r["run"] > run} if final else set()
        if unbuilt or unread or later:
            return f"{len(unbuilt)} constructions and {unread} steps" + (f", {len(later)} runs" if later else "")
        return None


class HandedOut(_replayed()):  # type: ignore[misc]
    """Stands for a student's code whose check is a spec (``course_utils.checks.spec``): the check asks it
    for the outcomes of its plan (:meth:`outcomes`), in the order the test cell makes its check calls, and
    runs its judge on them. The outcomes must be exactly the plan's keys, the one the grader sent in: an
    unknown key, a missing one, or outcomes of another plan are a :class:`HandOffFailure`. It is never
    called: a judge that called the student's code would be reading what no plan asked for."""

    __course_source__: str | None = None

    def __init__(self, exercise: str, records: list[dict]):
        self.exercise = exercise
        self.records = records
        self.used = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise HandOffFailure(f"the check of {self.exercise} called the student's code outside its plan")

    def outcomes(self, plan: list, hidden: bool) -> Any:
        from course_utils.checks import spec

        which = "hidden" if hidden else "visible"
        if self.used >= len(self.records):
            raise HandOffFailure(f"no outcomes came back for the {which} check of {self.exercise} (the kernel "
                                 f"stopped before it, or the hand-off was changed)")
        record = self.records[self.used]
        self.used += 1
        if record.get("plan") != which:
            raise HandOffFailure(f"outcomes of another plan than the {which} check's of {self.exercise} came back "
                                 f"(the hand-off was changed)")
        data = dict(record["outcomes"])
        asked = {step.key for step in plan}
        if set(data) != asked:
            odd = sorted(set(data) ^ asked)[:3]
            raise HandOffFailure(f"the outcomes of {self.exercise} are not those of the calls the grader asked "
                                 f"for ({', '.join(map(repr, odd))}): the hand-off was changed")
        return spec.Outcomes(self.exercise, data, missing=HandOffFailure)


@dataclass
class Verdict:
    """A judged test: its printed lines, and its error (``None`` when it passed)."""

    text: str
    ename: str | None = None
    evalue: str = ""

    def outputs(self) -> list[NotebookNode]:
        found = []
        if self.text:
            found.append(NotebookNode(output_type="stream", name="stdout", text=self.text))
        if self.ename is not None:
            found.append(NotebookNode(output_type="error", ename=self.ename, evalue=self.evalue,
                                      traceback=[f"\x1b[0;31m{self.ename}\x1b[0m: {self.evalue}"]))
        return found


def replay_for(exercise: str, records: list[dict], source: str | None) -> Any:
    """What stands for the student's ``exercise`` in the replay: a :class:`Replay` of its records,
    or, when the kernel found no callable under that name, an object of the type it found."""
    mine = [r for r in records if r["exercise"] == exercise]
    if mine and mine[0].get("callable") is False:
        return type(mine[0]["type"], (), {})()
    if exercise in spec_of_each():
        return type(f"HandedOut_{exercise}", (HandedOut,), {"__course_source__": source})(exercise, mine)
    base = SessionReplay if exercise in SESSIONS else KeyedModuleReplay if exercise in KEYED else \
        ModuleReplay if any("build" in r for r in mine) else Replay
    return type(f"Replay_{exercise}", (base,), {"__course_source__": source})(exercise, mine)


def judge_test(notebook: str, test_id: str, records: list[dict], sources: dict[str, str],
               first_tries: bool = True, ops: dict[str, list[str]] | None = None) -> Verdict:
    """Run the solution's test cell ``test_id`` with each judged exercise replayed from ``records``.

    ``sources``: exercise -> the source of the student's function: what the kernel handed out (the
    function it actually checked, wherever it was defined), else the answer cell's (read by the grader).
    It only feeds the rules and the diagnoses that read code, so a forged one can cost points, never
    earn them: the grader checks the answer cells' rules itself, whatever the kernel says.
    ``first_tries``: whether the kernel made ``modules.check_alone``'s first tries (``probe.replaying``).
    ``ops``: exercise -> the ATen operations its code ran in the kernel: where one of them is forbidden,
    the test fails with the rule's own message (:func:`forbidden_ran`), whatever its outputs; where the
    source already breaks a rule, the check says so first, as the kernel would."""
    import torch

    from course_utils import checks
    from course_utils.checks import expected, probe
    from grader import intake

    src = intake.load_source(notebook)
    exercises = judged_exercises(notebook)
    refused = forbidden_ran([src.tests[test_id].exercise], ops or {}, sources)  # its own exercise only
    if refused is not None:
        return refused
    replays = {e: replay_for(e, records, sources.get(e)) for e in exercises}
    replays.update({name: replay_for(name, records, sources.get(name))
                    for name, owner in COMPANIONS.items() if owner in exercises})
    namespace: dict[str, Any] = {"__name__": "__judge__", "checks": checks, "torch": torch, **replays}
    printed = io.StringIO()
    try:
        with expected.using(expected.LIVE), probe.replaying(first_tries), contextlib.redirect_stdout(printed):
            exec(compile(src.tests[test_id].source, f"<{test_id}>", "exec"), namespace)  # noqa: S102 - the solution's own test
    except _replay_miss() as failure:  # a HandOffFailure, or a check's own refusal of a replayed outcome
        return Verdict(printed.getvalue(), HANDOFF_ERROR, _handoff_message(src.tests[test_id].exercise, str(failure)))
    except Exception as exc:  # noqa: BLE001 - the check's verdict, as a kernel would show it
        return Verdict(printed.getvalue(), type(exc).__name__, str(exc))
    extra = [f"{r.exercise}: {len(r.records) - r.used}" for r in replays.values()
             if isinstance(r, (Replay, HandedOut)) and not isinstance(r, (KeyedModuleReplay, SessionReplay))
             and r.used < len(r.records)]
    extra += [f"{r.exercise}: {why}" for r in replays.values() if isinstance(r, SessionReplay) and (why := r.left_over())]
    unknown = sorted({r["exercise"] for r in records} - set(replays))
    if extra or unknown:
        why = "more outputs came back than the test asked for (" + ", ".join(extra + unknown) + \
              "): the hand-off was changed"
        return Verdict("", HANDOFF_ERROR, _handoff_message(src.tests[test_id].exercise, why))
    return Verdict(printed.getvalue())


def forbidden_ran(exercises: list[str], ops: dict[str, list[str]], sources: dict[str, str]) -> Verdict | None:
    """The failure of a test whose code ran an operation its exercise's rule forbids (``ops``: exercise ->
    the ATen operations its code ran, ``probe.ops_ran``), with the rule's message as a check gives it
    (``core.check_rules``'s form); ``None`` when none did, or where the exercise's source (``sources``)
    breaks a rule as written: the replayed check says that, as it did in the kernel. Only ``exercises``
    are read (a test's own: what another exercise's code ran costs that exercise's tests)."""
    from course_utils import rules

    for exercise in exercises:
        found = rules.op_violations(exercise, ops.get(exercise, ()))
        if found and not rules.find_violations(sources.get(exercise) or "", exercise):
            why = rules.RULES[exercise].why
            lines = "; ".join(str(v) for v in found)
            return Verdict("", "CheckFailed", f"❌ {exercise}: {lines}. {why[:1].upper()}{why[1:]}".strip())
    return None


def judge_handed_out(folder: str | Path, notebook: str, test_id: str, answers: dict[str, str],
                     first_tries: bool = True) -> Verdict:
    """The verdict of test ``test_id`` from what the kernel handed out into ``folder``; ``answers``:
    exercise -> the answer cell's source; ``first_tries``: whether that kernel made ``check_alone``'s
    first tries. :class:`BadHandOff` when the hand-off cannot be used."""
    records, seen, ops = load_handed_out(folder, test_id)
    return judge_test(notebook, test_id, records, {**answers, **seen}, first_tries, ops)


def _handoff_message(exercise: str, why: str) -> str:
    return f"❌ {exercise}: this test scores 0: {why}."


def answer_sources(nb: NotebookNode, exercises: list[str]) -> dict[str, str]:
    """exercise -> its definition in the submission's answer cell (the last one of that name)."""
    from grader import intake

    found = {}
    for gid, index in intake.answer_cells(nb).items():
        if gid in exercises:
            found[gid] = intake.definition_of(nb.cells[index].source, gid)[0]
            for name in (n for n, owner in COMPANIONS.items() if owner == gid):  # in the same answer cell
                found[name] = intake.definition_of(nb.cells[index].source, name)[0]
    return found


def _code_lines(source: str) -> list[str]:
    """``source``'s lines without their trailing spaces, blank lines left out."""
    return [line.rstrip() for line in source.splitlines() if line.strip()]


def _names_any(nb: NotebookNode, answers: dict[str, int], names: list[str]) -> bool:
    """Whether a code cell of ``nb`` other than a test cell names one of ``names`` (the helpers an exercise may
    call), the helper's own answer cell (``answers``: grade id -> index) left out for its own name. Where none
    does, no code of the student's can look a helper up by name (``modules.helpers_used``), so a kernel of first
    tries would make the same try as the first kernel. Reading the cells can only spare that kernel, never earn
    an answer points: its verdict would be the same."""
    import re

    from grader import cells

    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or cells.is_test(cell):
            continue
        if any(answers.get(name) != index and re.search(rf"\b{re.escape(name)}\b", cell.source) for name in names):
            return True
    return False


@functools.lru_cache(maxsize=None)
def _released_stubs(notebook: str) -> dict[str, str]:
    """exercise -> its stub in the released student notebook (what an answer not yet written is)."""
    import nbformat

    from grader import course

    path = course.notebooks_dir() / f"{notebook}.ipynb"
    if not path.is_file():
        return {}
    return answer_sources(nbformat.read(path, as_version=4), judged_exercises(notebook))


class JudgeOutside(NbGraderPreprocessor):
    """Write the verdict of every judged test cell into its outputs, from what the kernel handed out
    (see the module docstring). Runs after execution, before ``SaveAutoGrades``."""

    def preprocess(self, nb: NotebookNode, resources: dict):
        from grader import cells, intake
        from grader.execute import CELL_TIMEOUT, KERNEL_DIED, NOTEBOOK_TIMEOUT

        notebook = resources.get("nbgrader", {}).get("notebook")
        exercises = judged_exercises(notebook)
        if not exercises:
            return nb, resources
        handoff: HandOff | None = resources.get("course_handoff")
        sources = answer_sources(nb, exercises)
        known = intake.load_source(notebook).tests
        failed: list[tuple[NotebookNode, str, str]] = []
        try:
            for cell in nb.cells:
                if cell.cell_type != "code" or not cells.is_test(cell):
                    continue
                test_id = cells.grade_id(cell)
                exercise = cells.exercise_of_test(test_id, exercises)
                if exercise is None or test_id not in known:
                    continue
                limits = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"
                          and o.get("ename") in (CELL_TIMEOUT, KERNEL_DIED, NOTEBOOK_TIMEOUT, "SystemExit")]
                try:
                    if handoff is None:
                        raise BadHandOff("the grader prepared no hand-off for this notebook")
                    # A student-edition kernel made no first tries: it had none of the reference's helpers.
                    verdict = judge_handed_out(handoff.outputs, notebook, test_id, sources,
                                               first_tries=not handoff.student_edition or bool(handoff.reference))
                except BadHandOff as exc:
                    kernel = [f"{o.get('ename')}: {o.get('evalue')}" for o in cell.get("outputs", [])
                              if o.get("output_type") == "error"]
                    said = f" (the kernel's own error: {kernel[-1][:300]})" if kernel else ""
                    verdict = Verdict("", HANDOFF_ERROR, _handoff_message(exercise, f"{exc}{said}"))
                except Exception as exc:  # noqa: BLE001 - a fault of the grader's own costs this test, said so
                    print(f"grader.judge: could not judge {notebook} {test_id}: {type(exc).__name__}: {exc}",
                          file=sys.stderr)
                    verdict = Verdict("", "GraderError", f"the grader could not judge this test "
                                                         f"({type(exc).__name__}: {exc}); ask your instructor")
                cell.outputs = (limits if verdict.ename == HANDOFF_ERROR else []) + verdict.outputs()
                if verdict.ename is not None:
                    failed.append((cell, test_id, exercise))
            if handoff is not None and handoff.student_edition and not handoff.reference and failed:
                self.first_tries(nb, resources, notebook, failed, sources)
        finally:
            if handoff is not None:
                handoff.remove()
        return nb, resources

    def first_tries(self, nb: NotebookNode, resources: dict, notebook: str,
                    failed: list[tuple[NotebookNode, str, str]], sources: dict[str, str]) -> None:
        """``modules.check_alone``'s first tries, for the ``failed`` tests (cell, test id, exercise) of
        exercises checked with helpers: a kernel with the student edition made only the second try (the
        student's own helpers), so the notebook runs once more in a kernel whose reference holds only
        those helpers' answers (:func:`grader.reference_subset.first_try_groups`), and that kernel's
        verdict of those tests replaces the first: a pass if either try passes, else the first try's
        message, as ``check_alone`` gives it. Nothing else of that kernel's is read, so the helpers'
        answers it holds earn nothing. Where its hand-off cannot be used (unreadable, or a test's records
        that do not replay), the first verdict stands."""
        from grader import intake, reference_subset
        from grader.execute import RobustExecute

        unexecuted = resources.get("course_unexecuted")
        if unexecuted is None:
            return
        stubs = _released_stubs(notebook)
        named = reference_subset.alone_helpers(notebook)
        cells_of = intake.answer_cells(nb)
        for exercises, helpers in reference_subset.first_try_groups(notebook):
            # An answer still the released stub raises NotImplementedError whatever helpers it is given, and
            # a notebook whose code never names the exercise's helpers makes the same first try as its second.
            mine = [(cell, test_id) for cell, test_id, exercise in failed if exercise in exercises
                    and _code_lines(sources.get(exercise, "")) != _code_lines(stubs.get(exercise, ""))
                    and _names_any(nb, cells_of, named.get(exercise, []))]
            if not mine:
                continue
            folder = tempfile.mkdtemp(prefix="grader-first-try-")
            again = {k: v for k, v in resources.items() if k not in ("course_handoff", "course_unexecuted")}
            try:
                again["course_first_try_reference"] = str(reference_subset.write_subset(helpers, Path(folder)))
                nb_again, again = PrepareHandOff(parent=self.parent, config=self.config).preprocess(
                    copy.deepcopy(unexecuted), again)
                RobustExecute(parent=self.parent, config=self.config).preprocess(nb_again, again)
                handoff: HandOff | None = again.get("course_handoff")
                for cell, test_id in mine:
                    try:
                        if handoff is None:
                            raise BadHandOff("the grader prepared no hand-off")
                        verdict = judge_handed_out(handoff.outputs, notebook, test_id, sources)
                    except BadHandOff:
                        continue  # the second try's verdict stands
                    except Exception as exc:  # noqa: BLE001 - a fault of the grader's own: the first verdict stands
                        print(f"grader.judge: could not judge the first try of {notebook} {test_id}: "
                              f"{type(exc).__name__}: {exc}", file=sys.stderr)
                        continue
                    if verdict.ename == HANDOFF_ERROR:
                        continue  # records of that kernel's that do not replay: the second try's verdict stands
                    cell.outputs = verdict.outputs()
            finally:
                if again.get("course_handoff") is not None:
                    again["course_handoff"].remove()
                shutil.rmtree(folder, ignore_errors=True)
