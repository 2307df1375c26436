"""Cheats score 0 on their exercise under the real grader (issues 18 and 35), honest work keeps full marks.

Every cheat of ``tests/fixtures/cheats.py`` goes into an otherwise solved notebook, graded in one sandboxed
``autograde`` run with the rest of the suite's class (``tests/support/graded_class.py``: the solutions, untouched
notebooks and wrong answers of ``tests/grader_answers/test_autograde.py`` beside them). Each cheat's exercise scores 0 by the verdict computed
outside the kernel alone (the test cells' own scores, before the static rules' zeroes), and the
notebook's other tests keep their points. The policy on machinery (issue 35) names the cheats that use
it, and the rules checked on what ran name the operations of the ``ran`` cheats, those the policy does
not see included. The cheats of the issue's classes are shown to be real first: decided the old way,
in a process with the instructor edition (as the grading kernel was), whose checks read names alone,
each gets full marks. Notebook 03's and 04's cheats attack module exercises (a
class whose construction builds the reference's module, a forward that reads the expected output from
the checker's frames); notebook 05's attack ``count_parameters``, a function of a module (the reference's
count, imported by a computed name; the expected count read from the checker's frames); notebook 09's attack
its block (the check replaced) and its model (the expected logits read from the checker's frames).
"""

from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path

import pytest

from course_utils import rules
from grader import cells as nbcells
from grader import course, intake
from tests.fixtures import cheats
from tests.support import harness
from tests.support.graded_class import solved, submissions

NOTEBOOKS = sorted({c.notebook for c in cheats.CHEATS.values()})
pytestmark = pytest.mark.skipif(any(n not in course.available_notebooks() for n in NOTEBOOKS),
                                reason="notebooks 01 to 05 are not built")


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)[:60].strip("_")


def _student(name: str) -> str:
    """The submission cheat ``name`` is graded in: its own, or the one it joins (``Cheat.shares``)."""
    return _slug(cheats.CHEATS[name].shares or name)


def _partners(name: str) -> set[str]:
    """The exercises of every cheat graded in the submission of cheat ``name`` (its own included)."""
    return {c.exercise for n, c in cheats.CHEATS.items() if _student(n) == _student(name)}


def _calls(notebook: str, exercise: str | None, callee: str) -> bool:
    """Whether the solution's answer to ``exercise`` calls the exercise ``callee``."""
    answer = intake.load_source(notebook).answers.get(exercise)
    return answer is not None and re.search(rf"\b{callee}\(", answer.source) is not None


@pytest.fixture
def checks_restored():
    """Put the check engine back after a cheat has patched it in this process."""
    modules = [m for name, m in list(sys.modules.items())  # and the launcher notebook 10's cheat replaces
               if name.startswith(("course_utils.checks", "course_utils.backward")) and m]
    attributes = [(m, dict(vars(m))) for m in modules]
    functions = [f for m in modules for f in vars(m).values() if isinstance(f, types.FunctionType)]
    functions += [f.__wrapped__ for f in functions if isinstance(getattr(f, "__wrapped__", None), types.FunctionType)]
    codes = [(f, f.__code__) for f in functions]
    from course_utils import checks
    from course_utils.checks import spec

    specs = [(s, dict(vars(s))) for s in checks.SPECS.values()]  # a spec's judge, plan or runners replaced
    classes = [(spec.Spec, dict(vars(spec.Spec)))]  # its methods replaced (hand_out)
    yield
    for f, code in codes:
        f.__code__ = code
    for s, saved in specs:
        vars(s).clear()
        vars(s).update(saved)
    for cls, saved in classes:
        for key in set(vars(cls)) - set(saved):
            delattr(cls, key)
        for key, value in saved.items():
            if key not in ("__dict__", "__weakref__") and vars(cls).get(key) is not value:
                setattr(cls, key, value)
    for module, saved in attributes:
        for key in set(vars(module)) - set(saved):
            delattr(module, key)
        for key, value in saved.items():
            setattr(module, key, value)


@pytest.mark.parametrize("name", cheats.WORKED_INSIDE)
def test_the_cheat_worked_while_the_kernel_decided(name, checks_restored, capsys):
    cheat = cheats.CHEATS[name]
    harness.run_tests_with_answer(cheat.notebook, cheat.exercise, cheat.source)  # no failure: full marks


@pytest.mark.parametrize("name", cheats.FOUND_NOTHING_INSIDE)
def test_a_spec_runs_the_code_before_any_expected_value_exists(name, checks_restored, capsys):
    """A frames cheat against an exercise declared by a spec finds no expected value even in the instructor's
    kernel: the spec runs the student's code on its whole plan first, and only then does its judge compute
    what to expect."""
    cheat = cheats.CHEATS[name]
    with pytest.raises(AssertionError):
        harness.run_tests_with_answer(cheat.notebook, cheat.exercise, cheat.source)


@submissions("test_cheats")
def _submissions(taken: set) -> dict:
    """Every cheat's submission: the solved notebook with the cheat's answer (and those of the cheats that
    share it), and honest work beside them: the solution of each notebook that test_autograde.py submits in the
    same class, or, where it does not (that file not run, or not for this notebook), a solved notebook here."""
    Path(cheats.PAYLOAD_MARKER).unlink(missing_ok=True)
    answers: dict[tuple[str, str], dict[str, str]] = {}
    for name, cheat in cheats.CHEATS.items():  # a cheat that shares a submission puts its answer cell beside the other's
        answers.setdefault((_student(name), cheat.notebook), {})[cheat.exercise] = cheat.source
    found = {key: (solved(key[1], cells), next(c for n, c in cheats.CHEATS.items()
                                                  if (_student(n), c.notebook) == key))
             for key, cells in answers.items()}
    for notebook in NOTEBOOKS:
        shared = ("solution", notebook) in taken
        found[("solution" if shared else f"honest_{notebook[:2]}", notebook)] = (None if shared else solved(notebook), None)
    return found


@pytest.fixture(scope="module")
def graded(graded_class):
    """This file's submissions and the solutions beside them, graded in the suite's one class
    (``tests/support/graded_class.py``)."""
    plan = dict(graded_class.plans["test_cheats"])
    return {"plan": plan, "grades": graded_class.grades, "cells": graded_class.cells, "out": graded_class.out,
            "judged": graded_class.judged}


def _judged(graded, name: str, test: str | None = None) -> dict:
    """The cell of cheat ``name``'s test (default: its exercise's first) in ``results.json``: the judge's own
    score (``auto_score``) and message, and the static rules' zero (``comment``) apart."""
    cheat = cheats.CHEATS[name]
    return graded["judged"][(_student(name), cheat.notebook)][test or f"test_{cheat.exercise}"]


def _assert_said(graded, said: dict[str, str]) -> None:
    """Each cheat's test message, as the judge wrote it, holds the words ``said[cheat name]``: the reason it
    scored 0 outside the kernel (a static rule's zero, if any, is a comment beside it)."""
    for name, words in said.items():
        message = _judged(graded, name)["message"]
        assert words in message, f"{name}: {message!r} lacks {words!r}"


def test_honest_work_keeps_full_marks(graded):
    for (student, notebook), cheat in graded["plan"].items():
        if cheat is None:
            row = graded["grades"][(student, notebook)]
            assert float(row["score"]) == float(row["max_score"]) > 0, (student, row["status"], graded["cells"][(student, notebook)])


@pytest.mark.parametrize("name", list(cheats.CHEATS))
def test_each_cheat_scores_zero_on_its_exercise(graded, name):
    cheat = cheats.CHEATS[name]
    key = (_student(name), cheat.notebook)
    cells = graded["cells"][key]
    mine = harness.test_ids_for(cheat.exercise, cells, cheat.notebook)
    assert mine, f"no test cells for {cheat.exercise}"
    for gid in mine:
        assert float(cells[gid]["score"]) == 0, f"{name}: {gid} scored {cells[gid]['score']} ({cells[gid]['message']})"
        assert cells[gid]["message"], f"{name}: {gid} lost its points without a reason"
        judged = _judged(graded, name, gid)  # the verdict outside alone, whatever a static rule also says
        assert judged["auto_score"] == 0 and judged["message"], f"{name}: {gid} judged {judged}"
    for gid, cell in cells.items():
        other = nbcells.exercise_of_test(gid, course.EXERCISES[cheat.notebook])
        # The notebook's other tests still count (those whose answer calls the cheat's function aside:
        # the solution's context_vectors calls the student's softmax_stable; and those of a cheat sharing
        # this submission).
        if gid not in mine and other not in _partners(name) and \
                not any(_calls(cheat.notebook, other, e) for e in _partners(name)):
            assert float(cell["score"]) == float(cell["max_score"]), f"{name}: {gid} lost points: {cell['message']}"


def test_the_policy_names_the_machinery_of_each_cheat_that_uses_it(graded):
    """Issue 35: a cheat whose answer cell uses machinery no exercise needs loses its exercise's points by the
    static policy too, with the reason in the report; the ``ran`` cheats it does not see are named below."""
    for name, cheat in cheats.CHEATS.items():
        comment = _judged(graded, name)["comment"]
        if name in cheats.RAN_ONLY:
            assert not comment, f"{name}: the policy named it, so it proves nothing of the rules on what ran: {comment}"
        else:
            assert rules.policy_violations(cheat.source), f"{name}: the policy does not name it"
            assert comment.startswith("rule broken in the answer"), f"{name}: {comment!r}"


def test_each_ran_cheat_is_refused_for_what_it_ran(graded):
    """Issue 35: a forbidden library function reached by a name built at run time, under another name, called as
    its fused kernel or swapped in for the hidden cases, is refused with its rule's message by what it ran."""
    assert set(cheats.RAN_SAID) == {n for n, c in cheats.CHEATS.items() if c.kind == "ran"}
    _assert_said(graded, cheats.RAN_SAID)


def test_handoff_failures_say_why(graded):
    messages = {name: " ".join(c["message"] for gid, c in graded["judged"][(_student(name), cheat.notebook)].items()
                               if gid.startswith(f"test_{cheat.exercise}"))
                for name, cheat in cheats.CHEATS.items() if cheat.kind == "handoff"}
    said = {
        "softmax_stable: hand out a pickle that runs code when loaded": "could not be read as plain data",
        "softmax_stable: hand out a link to another file": "not a plain file",
        "softmax_stable: hand out a file too big to read": "over the limit",
        "softmax_stable: right outputs padded with an extra record": "more outputs came back than the test asked for",
        "softmax_stable: hand out a verdict instead of outputs": "does not have the hand-off's layout",
        "softmax_stable: forge the outputs from the recorded visible expectations": "values differ",
        "dot: forge the handed-out outputs": "values differ",
    }
    for name, words in said.items():
        assert words in messages[name], f"{name}: {messages[name]!r} lacks {words!r}"


def test_no_payload_ran_in_the_grader(graded):
    assert not os.path.exists(cheats.PAYLOAD_MARKER), "a handed-out pickle ran code in the grader's process"


@pytest.mark.parametrize("name", ["SelfAttention_v2: build the reference's module, imported by a computed name",
                                  "CausalAttention: build the reference's module, imported by a computed name",
                                  "count_parameters: count with the reference, imported by a computed name"])
def test_a_fully_judged_notebooks_kernel_cannot_import_the_reference(graded, name):
    """Notebooks 03 to 05 are judged entirely outside, so their kernels have the student edition: the
    answers imported by a computed name are not there to be found. An exercise checked with helpers
    (``modules.alone``) is tried again in a kernel of first tries, whose cut-down reference holds the helpers
    only: the answer is not there either, and that kernel's message (the first try's) is the verdict's."""
    message = _judged(graded, name)["message"]
    assert ("ImportError" in message and "not part of the student edition" in message) or \
        f"module 'course_utils.reference' has no attribute '{cheats.CHEATS[name].exercise}'" in message, message


def test_notebook_06_is_judged_outside_with_the_student_edition(graded):
    """Every exercise of notebook 06 is judged outside (its module classes' probes, the count of the fused
    kernel's calls, the timer's simulated devices), so its kernel has the student edition: the reference
    imported by a computed name is not there; a check replaced in the kernel hands nothing out; a timer
    that reads the expected median from the checker's frames finds none there."""
    said = {
        "MultiHeadAttentionCombinedQKV: build the reference's module, imported by a computed name":
            "not part of the student edition",
        "MHAPyTorchSDPA: replace the check through sys.modules": "no outcomes came back for the visible check of MHAPyTorchSDPA",
        "time_cuda_aware: return the expected median, read from the checker's frames": "never read time.perf_counter()",
    }
    _assert_said(graded, said)


def test_notebook_07_is_judged_outside_with_the_student_edition(graded):
    """Every exercise of notebook 07 is judged outside (the tiled attention's outputs and what the tensor
    watcher saw, the Triton kernel's (out, lse) per launch), so its kernel has the student edition: the
    reference imported by a computed name is not there; a tiled attention that reads the expected output
    from the checker's frames finds none there; a check replaced in the kernel hands nothing out."""
    said = {
        "online_softmax: the reference's, imported by a computed name": "not part of the student edition",
        "flash_attention_forward: return the expected (out, lse), read from the checker's frames": "out: ",
        "flash_attention_triton: replace the check through sys.modules": "no outcomes came back",
    }
    _assert_said(graded, said)


def test_notebook_10_is_judged_outside_with_the_student_edition(graded):
    """Every exercise of notebook 10 is judged outside (gradients, what the tensor watcher saw, the autograd
    Function's runs and what its forward keeps, the Triton kernel's (dk, dv) per launch), so its kernel has
    the student edition: the reference imported by a computed name is not there (in an answer, or in a
    launcher put in place of the course's); a backward that reads the expected gradients from the
    checker's frames finds none there; a check replaced in the kernel hands nothing out."""
    said = {
        "attention_backward_reference: the reference's, imported by a computed name": "not part of the student edition",
        "flash_attention_backward: return the expected (dq, dk, dv), read from the checker's frames": "dq: ",
        "FlashAttention: replace the check through sys.modules": "no outcomes came back",
        "flash_attention_backward_triton: the reference's (dk, dv) from a launcher put in place":
            "not part of the student edition",
    }
    _assert_said(graded, said)


def test_notebook_08s_functions_are_judged_outside(graded):
    """Notebook 08's functions are judged outside: a mask read from the checker's frames finds none there
    (the kernel's check compares nothing), and a check replaced in the kernel hands nothing out."""
    said = {
        "decode_causal_mask: return the expected mask, read from the checker's frames": "must be True",
        "sliding_window_mask: replace the check through sys.modules": "no outcomes came back",
    }
    _assert_said(graded, said)


def test_notebook_08_is_judged_outside_with_the_student_edition(graded):
    """Every exercise of notebook 08 is judged outside, so its kernel has the student edition: a class built
    from the reference's, imported by a computed name, finds no reference there; and the kernel the grader
    then runs for check_alone's first try holds only the helpers' answers (grader/reference_subset.py), where
    the class is not to be found either."""
    name = "GroupedQueryAttention: build the reference's module, imported by a computed name"
    message = _judged(graded, name)["message"]
    assert "has no attribute 'GroupedQueryAttention'" in message, message


def test_notebook_08s_kv_cache_is_judged_outside(graded):
    """Notebook 08's MultiHeadAttentionKVCache is judged outside as ordered sessions: a class whose forward
    returns the expected outputs read from the checker's frames finds none there (the kernel's check only
    runs the sessions' steps), and a check replaced in the kernel hands no session out."""
    said = {
        "MultiHeadAttentionKVCache: return the expected outputs, read from the checker's frames": "values differ",
        "MultiHeadAttentionKVCache: replace the check through sys.modules": "no outcomes came back",
    }
    _assert_said(graded, said)


def test_notebook_09s_judged_exercises_are_judged_outside(graded):
    """sinusoidal_positions, LearnedPositionalEmbedding and train_step are judged outside: a step that takes the
    expected trace from the checker's frames finds none there (the kernel's check compares nothing), and a check
    replaced in the kernel hands nothing out."""
    said = {
        "train_step: take the expected step, read from the checker's frames": "the returned loss is 0",
        "LearnedPositionalEmbedding: replace the check through sys.modules": "no outcomes came back",
    }
    _assert_said(graded, said)


def test_notebook_09_is_judged_outside_with_the_student_edition(graded):
    """TransformerBlock and TinyGPT are judged outside too, so 09's kernel has the student edition: a model whose
    forward returns the expected logits read from the checker's frames finds none there (the kernel only runs
    the planned passes and the cached path's trace), neither in the notebook's kernel nor in the kernel of
    TinyGPT's first try; and the block's check replaced in the kernel hands nothing out."""
    said = {
        "TinyGPT: return the expected logits, read from the checker's frames": "values differ",
        "TransformerBlock: replace the check through sys.modules": "no outcomes came back",
    }
    _assert_said(graded, said)
