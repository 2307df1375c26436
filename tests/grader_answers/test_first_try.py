"""``modules.check_alone``'s first try under the grader (docs/threat-model.md, "Decided: the first try in a kernel
of its own"): a kernel without the reference's helpers hands out no first try; one that has them, the
instructor edition's or the cut-down reference of ``grader/reference_subset.py``, hands out both."""

from __future__ import annotations

import sys
import types

import pytest

from course_utils import reference
from grader import intake, judge, reference_subset
from tests.support import harness
from tests.grader_answers.test_judge import _GQA_TEST, _OWN_REPEAT, NB08, _handed_out

NB02 = "02_softmax_and_context"


def _tries(records: list[dict]) -> set:
    return {r.get("attempt") for r in records}


def _hand_out(monkeypatch, module) -> list[dict]:
    harness._executed(NB08)  # the notebook's own cells first (cached), with the whole reference
    monkeypatch.setitem(sys.modules, "course_utils.reference", module)
    handoff, _ = _handed_out(NB08, "GroupedQueryAttention", _OWN_REPEAT, monkeypatch)
    try:
        return judge.load_handed_out(handoff.outputs, _GQA_TEST)[0]
    finally:
        handoff.remove()


def test_without_the_reference_only_the_second_try_is_handed_out(monkeypatch):
    """The student edition's kernel: importing the reference fails, so the check hands out the runs with
    the student's own repeat_kv only."""
    records = _hand_out(monkeypatch, None)  # None in sys.modules: the import raises ImportError
    assert records and _tries(records) == {2}


def test_without_the_reference_an_answer_without_helpers_hands_out_no_first_try_either(monkeypatch):
    """Whether a first try was made depends on the kernel only, never on the answer: the grader knows
    which kernel it ran, so it knows which tries to read."""
    from tests.fixtures.answers import load

    inline = load(NB08).RIGHT["GroupedQueryAttention"]["queries grouped instead of keys repeated"]
    assert "repeat_kv(" not in inline
    harness._executed(NB08)  # the notebook's own cells first (cached), with the whole reference
    monkeypatch.setitem(sys.modules, "course_utils.reference", None)
    handoff, _ = _handed_out(NB08, "GroupedQueryAttention", inline, monkeypatch)
    try:
        assert _tries(judge.load_handed_out(handoff.outputs, _GQA_TEST)[0]) == {2}
    finally:
        handoff.remove()


def _student_edition_verdicts(monkeypatch, exercise: str, answer: str) -> dict[str, tuple]:
    """test id -> the verdict (ename, first line of the message) of ``answer``'s hand-off from a kernel
    without the reference, judged as from a student-edition kernel (no first tries) and as from one
    with them."""
    from grader import autograde

    harness._executed(NB08)
    monkeypatch.setitem(sys.modules, "course_utils.reference", None)
    handoff, cells = _handed_out(NB08, exercise, answer, monkeypatch)
    monkeypatch.setitem(sys.modules, "course_utils.reference", reference)
    sources = {exercise: intake.definition_of(answer, exercise)[0]}
    try:
        return {(gid, first): (v.ename, v.evalue.splitlines()[0] if v.evalue else "")
                for gid in harness.test_ids_for(exercise, cells, NB08) for first in (False, True)
                for v in [judge.judge_handed_out(handoff.outputs, NB08, gid, sources, first_tries=first)]}
    finally:
        handoff.remove()


@pytest.mark.parametrize("exercise", ["GroupedQueryAttention", "apply_rope", "MultiHeadAttentionKVCache"])
def test_honest_work_passes_from_the_second_try_alone(monkeypatch, exercise):
    """A right answer's hand-off from a student-edition kernel passes when judged as one (so no kernel of
    first tries is needed: honest work costs nothing more); judged as if first tries had been made, the
    missing first try is a HandOffError, so the grader's knowledge of the kernel is what decides."""
    from grader import intake

    answer = intake.load_source(NB08).answers[exercise].source
    verdicts = _student_edition_verdicts(monkeypatch, exercise, answer)
    assert verdicts
    for (gid, first), (ename, message) in verdicts.items():
        if first:
            assert ename == judge.HANDOFF_ERROR, (gid, ename, message)
        else:
            assert ename is None, (gid, ename, message)


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
    from course_utils.checks import ladder, wire

    passes = [p for r in first for k, o in r["outcomes"] if not ladder.is_rung(k)  # the probed builds
              for p in wire.decode(o["result"])["passes"]]
    assert sum("error" in p for p in passes) > 100  # our repeat_kv, called in the student's order


def test_a_missing_helper_in_the_reference_hands_out_no_first_try(monkeypatch):
    """A reference without the helper the answer uses (the wrong group's) makes no first try with it."""
    subset = types.ModuleType("course_utils.reference")
    exec(compile(reference_subset.subset_source(["rope_angles"]), "reference_subset", "exec"),  # noqa: S102
         subset.__dict__)
    assert _tries(_hand_out(monkeypatch, subset)) == {2}


# --------------------------------------------------------------------------------------------
# One mistake costs one exercise in every notebook (tests/fixtures/answers: ALONE)
# --------------------------------------------------------------------------------------------
def _alone_fixtures() -> list:
    from grader import course
    from tests.fixtures.answers import load

    found = []
    for notebook in course.NOTEBOOKS:
        module = load(notebook)
        for label, (exercise, helper, wrong, right) in getattr(module, "ALONE", {}).items():
            found.append(pytest.param(notebook, exercise, helper, str(wrong), right, id=f"{notebook[:2]}: {label}"))
    return found


ALONE = _alone_fixtures()


def test_every_exercise_that_calls_another_has_a_fixture():
    """Each exercise checked with helpers (a checks module's HELPERS, grader/reference_subset.py) has a fixture
    of a wrong helper under a right answer, in 02 to 05 and 10 (06 and 07 have no such exercise)."""
    have = {(p.values[0], p.values[1]) for p in ALONE}
    for notebook in ("02_softmax_and_context", "03_trainable_self_attention", "04_causal_attention",
                     "05_multi_head_attention", "10_flash_attention_backward"):
        helpers = reference_subset.alone_helpers(notebook)
        assert helpers, notebook
        assert {(notebook, exercise) for exercise in helpers} <= have, notebook


def _verdicts_of(monkeypatch, notebook: str, exercise: str, source: str, first_tries: bool) -> dict:
    """test id -> (error name, message) of ``source``'s test cells, handed out by an in-process grading kernel
    and judged outside: a kernel with the reference's helpers (``first_tries``: a kernel of first tries), or
    without them (the student edition's, which hands out the second tries alone)."""
    import contextlib

    from course_utils.checks import expected
    from grader import autograde

    harness._executed(notebook)  # the notebook's own cells first (cached), with the whole reference
    if not first_tries:
        monkeypatch.setitem(sys.modules, "course_utils.reference", None)  # the import raises ImportError
        prepare = judge.prepare

        def with_reference(*args, **kwargs):  # the grader's process, which builds the plans, has the reference
            with pytest.MonkeyPatch.context() as grader:
                grader.setitem(sys.modules, "course_utils.reference", reference)
                return prepare(*args, **kwargs)

        monkeypatch.setattr(judge, "prepare", with_reference)
    with expected.using(expected.RECORDED) if not first_tries else contextlib.nullcontext():  # as that edition
        handoff, cells = _handed_out(notebook, exercise, source, monkeypatch)
    monkeypatch.setitem(sys.modules, "course_utils.reference", reference)
    sources = {exercise: intake.definition_of(source, exercise)[0]}
    try:
        return {gid: (v.ename, v.evalue) for gid in harness.test_ids_for(exercise, cells, notebook)
                for v in [judge.judge_handed_out(handoff.outputs, notebook, gid, sources, first_tries=first_tries)]}
    finally:
        handoff.remove()


@pytest.mark.parametrize("notebook, exercise, helper, wrong, right", ALONE)
def test_a_wrong_helper_costs_only_its_own_points(monkeypatch, notebook, exercise, helper, wrong, right):
    """The helper's tests take its points; the exercise's tests, with that helper in the notebook, keep theirs:
    in the instructor's kernel, and judged outside from a kernel of first tries (our helpers swapped in, the
    verdict ``check_alone`` gives). From the student edition's kernel alone (the second try: the student's own
    helper) the exercise fails: the kernel of first tries is what keeps its points."""
    assert any(exc is not None for _, exc in harness.test_verdicts(notebook, helper, wrong)), "the wrong helper passed"
    both = wrong + "\n" + right
    inside = harness.test_verdicts(notebook, exercise, both)
    assert inside and all(exc is None for _, exc in inside), inside
    judged = _verdicts_of(monkeypatch, notebook, exercise, both, first_tries=True)
    assert judged and all(ename is None for ename, _ in judged.values()), judged
    alone = _verdicts_of(monkeypatch, notebook, exercise, both, first_tries=False)
    assert any(ename not in (None, judge.HANDOFF_ERROR) for ename, _ in alone.values()), \
        f"the test proves nothing: no double penalty to undo ({alone})"
    honest = _verdicts_of(monkeypatch, notebook, exercise, right, first_tries=False)
    assert all(ename is None for ename, _ in honest.values()), honest  # honest work needs no kernel of first tries


@pytest.mark.parametrize("notebook, exercise, helper, wrong, right", ALONE)
def test_the_student_edition_names_the_helper_to_fix_first(notebook, exercise, helper, wrong, right):
    """Student edition (recorded expectations, no reference code): the exercise's visible check, with the wrong
    helper, either passes or names that helper first, with check_alone's message; nothing of the reference runs."""
    from course_utils.checks import expected

    with expected.using(expected.RECORDED):
        passed, message = harness.check_verdict(notebook, exercise, wrong + "\n" + right)
    assert not passed or helper == "softmax_stable", message  # context_vectors' visible inputs cannot overflow exp
    if not passed:
        assert f"your {exercise} uses your {helper}, which does not pass its own check yet" in message, message


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# --------------------------------------------------------------------------------------------
# Through the grader's own steps, in the real sandbox: 08's kernel has the student edition
# --------------------------------------------------------------------------------------------
_COMPUTED_IMPORT = '''
import importlib


class GroupedQueryAttention(torch.nn.Module):
    def __new__(cls, *args, **kwargs):
        answers = importlib.import_module("course_utils." + "".join(["refer", "ence"]))
        return getattr(answers, "GroupedQueryAttention")(*args, **kwargs)
'''


def _graded(monkeypatch, tmp_path, answers: dict[str, str], notebook: str = NB08,
            keep: set[str] | None = None) -> tuple[dict[str, list], list[str]]:
    """Notebook 08's repeat_kv and GroupedQueryAttention (their answer and test cells, after the set-up, the
    imports and the answers of 04 and 05 that the notebook shows), or all of ``notebook`` (``keep=None``), with
    ``answers`` in their answer cells, through MarkTests, PrepareHandOff, RobustExecute and JudgeOutside as the grader
    composes them (its kernel has the student edition): (test id -> its outputs, the tests that failed in that kernel and
    were tried again in a kernel of first tries)."""
    import nbformat

    from grader import sandbox
    from grader.autograde import autograde_config
    from grader.execute import RobustExecute
    from grader.judge import JudgeOutside, MarkTests, PrepareHandOff

    ok, why = sandbox.check_bwrap()
    if not ok:
        pytest.skip(why)
    assert judge.student_edition_kernel(notebook), f"{notebook}'s kernel has the student edition"
    tried_again: list[str] = []
    first_tries = JudgeOutside.first_tries

    def spy(self, nb, resources, notebook, failed, sources):
        tried_again.extend(test_id for _, test_id, _ in failed)
        first_tries(self, nb, resources, notebook, failed, sources)

    monkeypatch.setattr(JudgeOutside, "first_tries", spy)
    nb = harness.solution_notebook(notebook)
    if notebook == NB08:
        code = [c for c in nb.cells if c.cell_type == "code"]
        keep = {"repeat_kv", "test_repeat_kv", "GroupedQueryAttention", _GQA_TEST}
        nb.cells = code[:3] + [c for c in code if harness.grade_id(c) in keep]  # set-up, imports, 04's and 05's answers
    for cell in nb.cells:
        if harness.grade_id(cell) in answers:
            cell.source = answers[harness.grade_id(cell)]
    config = autograde_config()
    resources = {"nbgrader": {"notebook": notebook}, "metadata": {"path": str(tmp_path)}}
    for step in (MarkTests, PrepareHandOff, RobustExecute, JudgeOutside):
        nb, resources = step(config=config).preprocess(nb, resources)
    return {harness.grade_id(c): c.get("outputs", []) for c in nb.cells if harness.grade_id(c)}, tried_again


def _errors(outputs: list) -> list[str]:
    return [f"{o['ename']}: {o['evalue']}" for o in outputs if o.get("output_type") == "error"]


def test_a_wrong_helper_costs_only_its_own_points_in_a_student_edition_kernel(monkeypatch, tmp_path):
    """A wrong repeat_kv under a right GroupedQueryAttention: the first kernel (student edition) finds the
    class wrong with the student's own repeat_kv; the kernel of first tries, which holds our repeat_kv and
    no other answer, finds it right. Without that second kernel, the class would lose its points too."""
    from tests.fixtures.answers import load

    nb08 = load(NB08)
    wrong = next(iter(nb08.WRONG["repeat_kv"].values()))
    answers = {"repeat_kv": str(wrong), "GroupedQueryAttention": nb08._GQA}
    outputs, tried_again = _graded(monkeypatch, tmp_path, answers)
    assert _errors(outputs["test_repeat_kv"]), "the wrong repeat_kv passed"
    assert _GQA_TEST in tried_again, "the test proves nothing: the class passed in the first kernel"
    assert "test_repeat_kv" in tried_again  # failed, but repeat_kv is no exercise of a first try: its verdict stays
    assert not _errors(outputs[_GQA_TEST]), _errors(outputs[_GQA_TEST])


def test_a_class_that_imports_the_answer_scores_zero_in_both_kernels(monkeypatch, tmp_path):
    """The reference's class imported by a computed name: the student edition has no reference, and the
    kernel of first tries has only repeat_kv's (and the cache class's helpers), so both tries fail."""
    outputs, tried_again = _graded(monkeypatch, tmp_path, {"GroupedQueryAttention": _COMPUTED_IMPORT})
    assert _GQA_TEST in tried_again
    errors = " ".join(_errors(outputs[_GQA_TEST]))
    assert errors and ("ImportError" in errors or "GroupedQueryAttention" in errors), errors


def test_only_written_answers_get_a_kernel_of_first_tries(monkeypatch):
    """An answer still the released stub raises NotImplementedError whatever helpers it is given, so an
    untouched notebook costs no second kernel; nor does one whose code never names the exercise's helpers
    (outside test cells); a written answer that failed and may call a helper gets one per group."""
    import nbformat

    from grader import intake
    from grader.execute import RobustExecute
    from grader.judge import JudgeOutside

    runs: list[str] = []

    def execute(self, nb, resources, km=None):
        runs.append(resources["course_first_try_reference"])
        return nb, resources

    from tests.fixtures.answers import load

    monkeypatch.setattr(RobustExecute, "preprocess", execute)
    answer_cell = next(c for c in harness.solution_notebook(NB08).cells
                       if harness.grade_id(c) == "GroupedQueryAttention")
    nb = nbformat.v4.new_notebook(cells=[answer_cell])
    resources = {"nbgrader": {"notebook": NB08}, "course_unexecuted": nb}
    stub = judge._released_stubs(NB08)["GroupedQueryAttention"]
    answer = intake.load_source(NB08).answers["GroupedQueryAttention"].source
    failed = [(nbformat.v4.new_code_cell(), _GQA_TEST, "GroupedQueryAttention")]
    answer_cell.source = stub
    JudgeOutside().first_tries(nb, resources, NB08, failed, {"GroupedQueryAttention": stub})
    assert runs == []
    answer_cell.source = answer
    JudgeOutside().first_tries(nb, resources, NB08, failed, {"GroupedQueryAttention": answer})
    assert len(runs) == 1
    # An answer that names no helper, in a notebook whose other code names none either: the same try again.
    inline = load(NB08).RIGHT["GroupedQueryAttention"]["queries grouped instead of keys repeated"]
    answer_cell.source = inline
    JudgeOutside().first_tries(nb, resources, NB08, failed, {"GroupedQueryAttention": inline})
    assert len(runs) == 1
    nb.cells.append(nbformat.v4.new_code_cell("def my_repeat(k, n):\n    return repeat_kv(k, n)"))  # a cell of its own
    JudgeOutside().first_tries(nb, resources, NB08, failed, {"GroupedQueryAttention": inline})
    assert len(runs) == 2


def test_a_kernel_of_first_tries_runs_no_cell_after_the_last_test_it_is_for(monkeypatch):
    """Only the failed tests' verdicts are read from a kernel of first tries, so it stops after the last of them."""
    import nbformat

    from grader.execute import RobustExecute
    from grader.judge import JudgeOutside

    ran: list[list[str]] = []

    def execute(self, nb, resources, km=None):
        ran.append([c.source for c in nb.cells])
        return nb, resources

    monkeypatch.setattr(RobustExecute, "preprocess", execute)
    answer_cell = next(c for c in harness.solution_notebook(NB08).cells
                       if harness.grade_id(c) == "GroupedQueryAttention")
    test_cell = nbformat.v4.new_code_cell("checks.check_GroupedQueryAttention(GroupedQueryAttention)")
    test_cell.metadata["nbgrader"] = {"grade_id": _GQA_TEST, "grade": True, "points": 1}
    after = nbformat.v4.new_code_cell("print('training for minutes')")
    nb = nbformat.v4.new_notebook(cells=[answer_cell, test_cell, after])
    resources = {"nbgrader": {"notebook": NB08}, "course_unexecuted": nb}
    failed = [(nbformat.v4.new_code_cell(), _GQA_TEST, "GroupedQueryAttention")]
    JudgeOutside().first_tries(nb, resources, NB08, failed, {"GroupedQueryAttention": answer_cell.source})
    assert len(ran) == 1 and len(ran[0]) == 2 and "training for minutes" not in "".join(ran[0])
    assert len(nb.cells) == 3  # the notebook graded keeps every cell


def test_an_overflowing_softmax_stable_costs_context_vectors_nothing_in_the_grader(monkeypatch, tmp_path):
    """Notebook 02 through the grader's own steps, in the real sandbox: an overflowing softmax_stable under a
    right context_vectors that calls it. The student edition's kernel finds context_vectors wrong with the
    student's own softmax_stable; the kernel of first tries, whose reference holds only softmax_naive and
    softmax_stable, finds it right. softmax_stable loses its points; context_vectors keeps its own."""
    from tests.fixtures.answers import load

    nb02 = load(NB02)
    context, helper, wrong, right = nb02.ALONE["a wrong softmax_stable under a right context_vectors"]
    outputs, tried_again = _graded(monkeypatch, tmp_path, {helper: str(wrong), context: right}, NB02)
    assert _errors(outputs["test_softmax_stable"]), "the overflowing softmax_stable passed"
    assert "test_context_vectors" in tried_again, "the test proves nothing: context_vectors passed in the first kernel"
    assert not _errors(outputs["test_context_vectors"]), _errors(outputs["test_context_vectors"])
    assert not any(_errors(outputs[gid]) for gid in ("test_softmax_naive",)), "a right answer lost its points"


def test_a_kernel_of_first_tries_whose_records_do_not_replay_leaves_the_first_verdict(monkeypatch):
    """The kernel of first tries runs the student's code again; where its records of a test do not replay (a
    HandOffError: forged, cut short), the first kernel's verdict stands, message and all. A verdict of its
    that replays (a pass, or the first try's failure) replaces it."""
    import nbformat

    from grader.execute import RobustExecute
    from grader.judge import JudgeOutside

    class Folder:
        outputs = "unused"

        def remove(self) -> None:
            pass

    def execute(self, nb, resources, km=None):
        resources["course_handoff"] = Folder()
        return nb, resources

    monkeypatch.setattr(RobustExecute, "preprocess", execute)
    answer_cell = next(c for c in harness.solution_notebook(NB08).cells
                       if harness.grade_id(c) == "GroupedQueryAttention")
    nb = nbformat.v4.new_notebook(cells=[answer_cell])
    answer = answer_cell.source
    first = [nbformat.v4.new_output("error", ename="CheckFailed", evalue="the first kernel's message", traceback=[])]
    for verdict, kept in ((judge.Verdict("", judge.HANDOFF_ERROR, "forged"), True), (judge.Verdict("✅ passed\n"), False)):
        monkeypatch.setattr(judge, "judge_handed_out", lambda *args, v=verdict, **kwargs: v)
        cell = nbformat.v4.new_code_cell(outputs=list(first))
        resources = {"nbgrader": {"notebook": NB08}, "course_unexecuted": nb}
        JudgeOutside().first_tries(nb, resources, NB08, [(cell, _GQA_TEST, "GroupedQueryAttention")],
                                   {"GroupedQueryAttention": answer})
        assert (cell.outputs == first) is kept, cell.outputs
