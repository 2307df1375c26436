"""``modules.check_alone``'s first try under the grader (docs/design.md, "Decided: the first try in a kernel
of its own"): a kernel without the reference's helpers hands out no first try; one that has them, the
instructor edition's or the cut-down reference of ``grader/reference_subset.py``, hands out both."""

from __future__ import annotations

import sys
import types

import pytest

from course_utils import reference
from grader import judge, reference_subset
from tests.support import harness
from tests.grader_answers.test_judge import _GQA_TEST, _OWN_REPEAT, NB08, _handed_out


def _tries(records: list[dict]) -> set:
    return {r.get("attempt") for r in records}


def _hand_out(monkeypatch, module) -> list[dict]:
    harness._executed(NB08)  # the notebook's own cells first (cached), with the whole reference
    monkeypatch.setitem(sys.modules, "course_utils.reference", module)
    handoff, _ = _handed_out(NB08, "GroupedQueryAttention", _OWN_REPEAT, monkeypatch)
    try:
        return judge.load_hand_off(handoff.outputs, _GQA_TEST)[0]
    finally:
        handoff.remove()


def test_without_the_reference_only_the_second_try_is_handed_out(monkeypatch):
    """The student edition's kernel: importing the reference fails, so the check hands out the runs with
    the student's own repeat_kv only."""
    records = _hand_out(monkeypatch, None)  # None in sys.modules: the import raises ImportError
    assert records and _tries(records) == {2}


def test_with_the_cut_down_reference_both_tries_are_handed_out(monkeypatch):
    """A first-try kernel: the cut-down reference holds repeat_kv (not GroupedQueryAttention), and the
    first try runs with it, as it does with the instructor edition's."""
    subset = types.ModuleType("course_utils.reference")
    exec(compile(reference_subset.subset_source(["repeat_kv"]), "reference_subset", "exec"),  # noqa: S102
         subset.__dict__)
    assert not hasattr(subset, "GroupedQueryAttention")
    cut = _hand_out(monkeypatch, subset)
    assert _tries(cut) == {1, 2}
    full = _hand_out(monkeypatch, reference)
    assert len(cut) == len(full) and [r.get("attempt") for r in cut] == [r.get("attempt") for r in full]
    first = [r for r in cut if r.get("attempt") == 1]
    assert sum("error" in r for r in first if "mode" in r) > 100  # our repeat_kv, called in the student's order


def test_a_missing_helper_in_the_reference_hands_out_no_first_try(monkeypatch):
    """A reference without the helper the answer uses (the wrong group's) makes no first try with it."""
    subset = types.ModuleType("course_utils.reference")
    exec(compile(reference_subset.subset_source(["rope_angles"]), "reference_subset", "exec"),  # noqa: S102
         subset.__dict__)
    assert _tries(_hand_out(monkeypatch, subset)) == {2}


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
