"""The student edition's self-checks say exactly what the instructor edition's say.

Every answer in tests/fixtures/answers, wrong and right, goes through the visible checks twice: with
expected values computed live from the reference (instructor edition) and read from a fresh
recording (student edition). Verdict and message must be identical: the recording holds every
value the checks need, including the outputs of the known mistakes that name a student's error.
The student's code runs once: in the answer's test cells (``harness.test_verdicts``, where
test_hidden_tests.py ran before in this process) or else in the live check; each check judges those
outcomes of the same plan (as the grader judges what a kernel handed out: ``harness.executions``).
"""

from __future__ import annotations

import pytest

from course_utils.checks import expected
from grader import course, record
from tests.support import harness
from tests.fixtures.answers import load

NOTEBOOKS = course.available_notebooks()


def _answers():
    for notebook in NOTEBOOKS:
        module = load(notebook)
        if module is None:
            continue
        for kind in ("WRONG", "RIGHT"):
            for exercise, answers in getattr(module, kind).items():
                for label, source in answers.items():
                    yield pytest.param(notebook, exercise, source, id=f"{notebook[:2]}-{exercise}-{kind.lower()}-{label}")


@pytest.fixture(scope="module")
def fresh_recording(tmp_path_factory):
    """A function that records a notebook now (once), into a temporary folder that the recorded
    checks read from while the tests of this module run."""
    folder = tmp_path_factory.mktemp("expected")
    saved = expected.DATA_DIR
    expected.DATA_DIR = folder
    expected.forget_loaded()

    def ensure(notebook: str) -> None:
        if not expected.data_file(notebook, folder).exists():
            record.write([notebook], folder)

    yield ensure
    expected.DATA_DIR = saved
    expected.forget_loaded()


@pytest.mark.parametrize("notebook, exercise, source", list(_answers()))
def test_recorded_checks_say_what_live_checks_say(fresh_recording, notebook, exercise, source):
    fresh_recording(notebook)
    harness._executed(notebook)  # the solution notebook's own checks run once, before and outside the log
    runs: list = []
    earlier = harness.runs_of(notebook, exercise, str(source))  # its test cells' runs, where they ran here
    with expected.using(expected.LIVE), harness.executions(runs, replay=False, earlier=earlier):
        live = harness.check_verdict(notebook, exercise, source)
    with expected.using(expected.RECORDED), harness.executions(runs, replay=True):
        recorded = harness.check_verdict(notebook, exercise, source)
    assert recorded == live


def test_recorded_mode_never_touches_the_reference(fresh_recording):
    with expected.using(expected.RECORDED), pytest.raises(expected.InstructorOnly, match="not used by the student"):
        expected.reference("dot")


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_every_recorded_self_check_passes_the_solution(fresh_recording, notebook):
    """How long each takes is printed by ``scripts/bench_checks.py`` (``make bench-grader``), not asserted."""
    fresh_recording(notebook)
    solution = harness.solution_notebook(notebook)
    answers = {harness.grade_id(c): c.source for c in solution.cells
               if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    with expected.using(expected.RECORDED):
        for exercise, source in answers.items():
            passed, message = harness.check_verdict(notebook, exercise, source)
            assert passed, message
