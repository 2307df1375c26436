"""Gradescope: ``python -m grader gradescope 01 --out autograder.zip``, unpacked into a temporary
``/autograder``-shaped root and run there as Gradescope runs it (``run_autograder``, pointed at the
root by ``AUTOGRADER_ROOT``); ``results.json`` is checked against a JSON schema written from
Gradescope's specification (``tests/fixtures/gradescope/results.schema.json``). One notebook is
graded; a submission without a notebook costs no grading."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import nbformat
import pytest

from grader import course
from grader.cli import main
from grader.gradescope import ROOT_VARIABLE, failed_in_visible_part, hidden_lines
from tests.fixtures import submissions as cases

pytestmark = pytest.mark.skipif(cases.NB not in course.available_notebooks(), reason="notebook 01 is not built")

SCHEMA = json.loads((Path(__file__).parents[1] / "fixtures" / "gradescope" / "results.schema.json").read_text())
#: Passes the visible check (2-D and 3-D inputs) and fails a hidden case (two batch dimensions).
SCORES_3D_ONLY = ("def attention_scores(inputs):\n    if inputs.dim() == 3:\n"
                  "        return torch.bmm(inputs, inputs.transpose(1, 2))\n    return inputs @ inputs.T")


@pytest.fixture(scope="module")
def autograder_zip(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gradescope") / "autograder.zip"
    assert main(["gradescope", "01", "--out", str(out)]) == 0
    return out


def run_autograder(zip_path: Path, root: Path, files: dict[str, bytes]) -> tuple[dict, subprocess.CompletedProcess]:
    """Set up ``root`` as Gradescope does (the zip in ``source/``, ``run_autograder`` copied to the
    root, the student's files in ``submission/``), run it, and return results.json and the run."""
    with zipfile.ZipFile(zip_path) as z:
        z.extractall(root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    os.chmod(root / "run_autograder", 0o755)
    (root / "submission").mkdir(parents=True)
    for name, data in files.items():
        (root / "submission" / name).write_bytes(data)
    env = {**os.environ, ROOT_VARIABLE: str(root), "GRADER_PYTHON": sys.executable}
    env.pop("COURSE_ROOT", None)
    proc = subprocess.run([str(root / "run_autograder")], capture_output=True, text=True, env=env, timeout=600,
                          cwd=root)
    results = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    return results, proc


@pytest.fixture(scope="module")
def graded(autograder_zip, tmp_path_factory):
    nb = cases.filled(dot=cases.DOT_WRONG, attention_scores=SCORES_3D_ONLY)
    results, proc = run_autograder(autograder_zip, tmp_path_factory.mktemp("autograder"),
                                   {"my homework.ipynb": nbformat.writes(nb).encode()})
    return results, proc


def test_the_zip_follows_gradescope_s_layout(autograder_zip, tmp_path):
    with zipfile.ZipFile(autograder_zip) as z:
        names = set(z.namelist())
        modes = {i.filename: (i.external_attr >> 16) for i in z.infolist()}
        setup = z.read("setup.sh").decode()
    assert {"setup.sh", "run_autograder", f"solutions/{cases.NB}.ipynb", "grader/autograde.py",
            "course_utils/reference.py", "constraints.txt", "pyproject.toml"} <= names, "at the root, not in a folder"
    assert not any(n.startswith("solutions/") and cases.NB not in n for n in names), "only this notebook's solution"
    assert not any("__pycache__" in n for n in names)
    for script in ("setup.sh", "run_autograder"):
        assert modes[script] & stat.S_IXUSR, f"{script} must be executable"
    (tmp_path / "setup.sh").write_text(setup)
    assert subprocess.run(["bash", "-n", str(tmp_path / "setup.sh")]).returncode == 0
    assert "bubblewrap" in setup and "-c constraints.txt" in setup


def test_results_json_follows_the_specification(graded):
    results, proc = graded
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jsonschema.validate(results, SCHEMA)
    assert [t["name"] for t in results["tests"]] == [f"{e}: test_{e}" for e in
                                                     ("dot", "attention_scores_for_query", "attention_scores")]
    assert sum(t["max_score"] for t in results["tests"]) == cases.FULL


def test_one_entry_per_test_cell_with_the_check_s_message(graded):
    results, _ = graded
    tests = {t["name"].split(": ")[1]: t for t in results["tests"]}
    dot, query, scores = tests["test_dot"], tests["test_attention_scores_for_query"], tests["test_attention_scores"]
    assert (dot["score"], dot["status"]) == (0.0, "failed") and "❌" in dot["output"]
    assert (query["score"], query["status"]) == (2.0, "passed")
    assert (scores["score"], scores["status"]) == (0.0, "failed") and "❌" in scores["output"]
    assert results["output"].startswith("my homework.ipynb: ok; recognised by content as 01_dot_products")


def test_visible_checks_show_at_once_and_hidden_tests_after_publishing(graded):
    """The visible check of ``dot`` failed: the student saw that in the notebook, so it shows at once.
    ``attention_scores`` passed its visible check and failed a hidden case, and
    ``attention_scores_for_query`` passed everything: both wait for the grades to be published."""
    tests = {t["name"].split(": ")[1]: t for t in graded[0]["tests"]}
    assert tests["test_dot"]["visibility"] == "visible"
    assert tests["test_attention_scores_for_query"]["visibility"] == "after_published"
    assert tests["test_attention_scores"]["visibility"] == "after_published"


def test_no_test_code_reaches_the_student(graded):
    text = json.dumps(graded[0], ensure_ascii=False)
    for code in ("BEGIN HIDDEN", "hidden=True", "checks.check_", "course_utils"):
        assert code not in text, code
    assert graded[0]["stdout_visibility"] == "hidden", "the grader's log is for the instructor"


def test_a_submission_without_the_notebook_gets_zero_and_says_why(autograder_zip, tmp_path):
    results, proc = run_autograder(autograder_zip, tmp_path, {"answers.pdf": b"%PDF-1.4"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jsonschema.validate(results, SCHEMA)
    assert all(t["score"] == 0 and t["status"] == "failed" and t["visibility"] == "visible" for t in results["tests"])
    assert "(answers.pdf: not a notebook (.pdf file))" in results["output"]


def test_where_a_test_cell_failed_is_read_from_its_checks():
    """Each passing check prints one ✅ line and hidden tests run only after the visible checks
    passed: fewer ✅ lines than visible check calls means the visible part failed."""
    source = "checks.check_f(f)\nchecks.check_g(g)\n### BEGIN HIDDEN TESTS\nchecks.check_f(f, hidden=True)\n### END HIDDEN TESTS\n"
    assert hidden_lines(source) == {3, 4, 5}
    visible = "checks.check_f(f)\nchecks.check_g(g)\n"

    def cell(ticks: int, error: bool = True):
        c = nbformat.v4.new_code_cell(source)
        c.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✅ fine\n" * ticks)]
        if error:
            c.outputs.append(nbformat.v4.new_output("error", ename="CheckFailed", evalue="❌", traceback=["❌"]))
        return c

    assert failed_in_visible_part(cell(0), visible) is True
    assert failed_in_visible_part(cell(1), visible) is True  # the second visible check failed
    assert failed_in_visible_part(cell(2), visible) is False  # both passed: a hidden test failed
    assert failed_in_visible_part(cell(2, error=False), visible) is False  # nothing failed
    assert failed_in_visible_part(cell(0), "assert f(1) == 2") is False  # not a check: keep it hidden
