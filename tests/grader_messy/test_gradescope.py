"""Gradescope: ``python -m grader gradescope 01 --out autograder.zip``, checked two ways.

* Quick: unpacked into a temporary ``/autograder``-shaped root and run with the course's own Python
  (``GRADER_PYTHON``), where bubblewrap runs: the results' shape, messages and visibility.
* As Gradescope runs it, in its container played here: ``test_gradescope_container.py`` (``make
  test-gradescope``: its install takes minutes).

``results.json`` is checked against a JSON schema written from Gradescope's specification
(``tests/fixtures/gradescope/results.schema.json``)."""

from __future__ import annotations

import ast
import importlib.metadata
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

from grader import course, gradescope
from grader.cli import main
from grader.gradescope import ROOT_VARIABLE, failed_in_visible_part, hidden_lines
from grader.sandbox import check_bwrap
from tests.fixtures import submissions as cases
from tests.fixtures.gradescope import SCHEMA

pytestmark = pytest.mark.skipif(cases.NB not in course.available_notebooks(), reason="notebook 01 is not built")

#: Passes the visible check (2-D and 3-D inputs) and fails a hidden case (two batch dimensions).
SCORES_3D_ONLY = ("def attention_scores(inputs):\n    if inputs.dim() == 3:\n"
                  "        return torch.bmm(inputs, inputs.transpose(1, 2))\n    return inputs @ inputs.T")


@pytest.fixture(scope="module")
def autograder_zip(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gradescope") / "autograder.zip"
    assert main(["gradescope", "01", "--out", str(out)]) == 0
    return out


needs_bwrap = pytest.mark.skipif(not check_bwrap()[0], reason="the quick runs use the bubblewrap sandbox")


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
    if not check_bwrap()[0]:
        pytest.skip("the quick runs use the bubblewrap sandbox")
    nb = cases.filled(dot=cases.DOT_WRONG, attention_scores=SCORES_3D_ONLY)
    results, proc = run_autograder(autograder_zip, tmp_path_factory.mktemp("autograder"),
                                   {"my homework.ipynb": nbformat.writes(nb).encode()})
    return results, proc


def test_the_zip_follows_gradescope_s_layout(autograder_zip, tmp_path):
    with zipfile.ZipFile(autograder_zip) as z:
        names = set(z.namelist())
        modes = {i.filename: (i.external_attr >> 16) for i in z.infolist()}
        setup = z.read("setup.sh").decode()
    assert {"setup.sh", "run_autograder", "requirements.txt", f"solutions/{cases.NB}.ipynb", "grader/autograde.py",
            "grader/runas.py", "course_utils/reference.py", "constraints.txt", "pyproject.toml",
            "student/course_utils/checks/__init__.py"} <= names, "at the root, not in a folder"
    assert not any("__pycache__" in n for n in names)
    for script in ("setup.sh", "run_autograder"):
        assert modes[script] & stat.S_IXUSR, f"{script} must be executable"
    (tmp_path / "setup.sh").write_text(setup)
    assert subprocess.run(["bash", "-n", str(tmp_path / "setup.sh")]).returncode == 0
    assert '-r "$SOURCE/requirements.txt" -c "$SOURCE/constraints.txt"' in setup


def test_the_zip_holds_only_its_notebook_s_hidden_cases_recording_and_answers(autograder_zip):
    """Notebook 01's zip: its own hidden cases, recording, solution and answers; none of another
    notebook's. The student edition in it has no answers and no hidden cases at all."""
    with zipfile.ZipFile(autograder_zip) as z:
        names = set(z.namelist())
        reference = z.read("course_utils/reference.py").decode()
        stub = z.read("student/course_utils/reference.py").decode()
    assert {n for n in names if n.startswith("course_utils/instructor/")} == {
        "course_utils/instructor/__init__.py", "course_utils/instructor/nb01.py"}
    assert {n for n in names if n.startswith(("course_utils/expected/", "student/course_utils/expected/"))} == {
        "course_utils/expected/01_dot_products.pt", "student/course_utils/expected/01_dot_products.pt"}
    assert {n for n in names if n.startswith(("solutions/", "notebooks/"))} == {
        f"solutions/{cases.NB}.ipynb", f"solutions/src/{cases.NB}.py", f"notebooks/{cases.NB}.ipynb"}
    defined = {node.name for node in ast.parse(reference).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert defined == {"dot", "attention_scores_for_query", "attention_scores"}
    assert not any(n.startswith("student/course_utils/instructor") for n in names)
    assert not [node for node in ast.parse(stub).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                and node.name in course.EXERCISES[cases.NB]], "the student edition's reference is the stub"


def test_the_reference_subset_is_what_the_notebook_s_checks_need():
    """Notebook 08's checks compare with helpers of the same notebook; 02's need only its own answers."""
    assert set(gradescope.reference_names("02_softmax_and_context")) == {"softmax_naive", "softmax_stable",
                                                                         "context_vectors"}
    names = gradescope.reference_names("08_kv_cache_gqa_and_windows")
    assert set(course.EXERCISES["08_kv_cache_gqa_and_windows"]) <= set(names)
    assert not set(names) & set(course.EXERCISES["01_dot_products"] + course.EXERCISES["09_capstone_tiny_transformer"])


def _imported_distributions() -> set[str]:
    """The distributions whose modules the grader or course_utils import (the course's own and the
    standard library's left out)."""
    providers = importlib.metadata.packages_distributions()
    found = set()
    for package in ("grader", "course_utils"):
        for path in (course.repo_root() / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                           [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else [])
                for module in modules:
                    top = module.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ("grader", "course_utils", "__future__"):
                        found.update(providers.get(top, [top]))
    return {d.lower().replace("_", "-") for d in found}


@pytest.mark.parametrize("notebook", ["01_dot_products", "07_flash_attention_from_scratch"])
def test_requirements_hold_every_import_of_the_grader_at_the_course_s_versions(notebook):
    """One list (``GRADER_PACKAGES``) makes requirements.txt; it must name every distribution the grader
    and course_utils import (and the kernel's ipykernel), each at its version in constraints.txt."""
    pins = {}
    for line in gradescope.requirements(notebook).splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    wanted = _imported_distributions() | {"ipykernel"}
    if notebook not in gradescope.TRITON_NOTEBOOKS:
        wanted.discard("triton")
    assert wanted <= set(pins), f"missing from GRADER_PACKAGES: {sorted(wanted - set(pins))}"
    for name, version in pins.items():
        installed = importlib.metadata.version(name).split("+")[0]  # torch's "+cpu" is a build, not a version
        assert installed == version, f"{name}: constraints.txt says {version}, {installed} is installed"


def test_the_python_floor_admits_every_pinned_distribution():
    """setup.sh refuses a Python older than ``PYTHON_FLOOR``; every installed distribution of the course's
    environment must accept that version (soupsieve 4 asks for 3.11.5: Debian's 3.11.2 cannot install it)."""
    from packaging.specifiers import SpecifierSet

    floor = ".".join(map(str, gradescope.PYTHON_FLOOR))
    for dist in importlib.metadata.distributions():
        requires = dist.metadata.get("Requires-Python")
        if requires:
            assert SpecifierSet(requires).contains(floor), f"{dist.metadata['Name']} requires Python {requires}"
    assert not SpecifierSet(">=3.11.5").contains(".".join(map(str, (3, 11, 2)))), "the floor matters"


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


@needs_bwrap
def test_a_submission_without_the_notebook_gets_zero_and_says_why(autograder_zip, tmp_path):
    results, proc = run_autograder(autograder_zip, tmp_path, {"answers.pdf": b"%PDF-1.4"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jsonschema.validate(results, SCHEMA)
    assert all(t["score"] == 0 and t["status"] == "failed" and t["visibility"] == "visible" for t in results["tests"])
    assert "\n- answers.pdf: not a notebook (.pdf file)\n" in results["output"]


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


# ---------------------------------------------------------------------------------------------
# As Gradescope runs it: setup.sh, then run_autograder as root without bubblewrap


def test_a_grader_that_dies_still_leaves_a_valid_results_json(autograder_zip, tmp_path):
    """The grader killed (out of memory, say) before it wrote anything: run_autograder writes a score of 0
    and says that the autograder stopped, not the student's answers."""
    dying = tmp_path / "python"
    dying.write_text("#!/bin/sh\nkill -KILL $$\n")
    dying.chmod(0o755)
    root = tmp_path / "autograder"
    with zipfile.ZipFile(autograder_zip) as z:
        z.extractall(root / "source")
    (root / "submission").mkdir()
    (root / "submission" / "homework.ipynb").write_text(nbformat.writes(cases.solution()))
    script = root / "source" / "run_autograder"
    script.chmod(0o755)
    proc = subprocess.run([str(script)], capture_output=True, text=True, timeout=60, cwd=root,
                          env={"PATH": os.environ["PATH"], ROOT_VARIABLE: str(root), "GRADER_PYTHON": str(dying)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    jsonschema.validate(results, SCHEMA)
    assert results["score"] == 0 and results["tests"] == []
    assert results["output"].startswith("The autograder stopped before it could grade this submission")
    assert "wrote no results.json" in proc.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="a kernel's home is handed to another user by root")
def test_a_first_try_kernel_sees_the_student_edition_with_only_its_helpers_answers(tmp_path, monkeypatch):
    """Notebooks 08 and 09 run ``check_alone``'s first tries in a kernel whose reference holds a few
    helpers' answers: run as the kernel's user, that kernel gets a ``course_utils`` of its own, the
    student edition's files but that reference, and its home is the user's alone."""
    import pwd

    from grader import reference_subset, runas

    gradescope._student_edition("08_kv_cache_gqa_and_windows", tmp_path / "edition")
    monkeypatch.setenv(runas.EDITION_VARIABLE, str(tmp_path / "edition"))
    helpers = reference_subset.write_subset(["repeat_kv"], tmp_path / "subset")
    nobody = pwd.getpwnam("nobody")
    home = runas.make_home(nobody, str(helpers))
    try:
        package = home / "lib" / "course_utils"
        assert (package / "reference.py").read_text() == helpers.read_text()
        assert (package / "checks").resolve() == (tmp_path / "edition" / "course_utils" / "checks").resolve()
        assert not (package / "instructor").exists()
        assert (home.stat().st_uid, stat.S_IMODE(home.stat().st_mode)) == (nobody.pw_uid, 0o700)
        assert runas.kernel_env(home)["PYTHONPATH"] == str(home / "lib")
        plain = runas.make_home(nobody)
        assert runas.kernel_env(plain)["PYTHONPATH"] == str(tmp_path / "edition")
        shutil.rmtree(plain)
    finally:
        shutil.rmtree(home)


def test_the_notebook_s_time_limit_leaves_room_in_gradescope_s_timeout(tmp_path):
    """420 s by default, under Gradescope's default 10 minutes; ``--time-limit`` for a raised timeout, and
    the zip's README tells the instructor of a heavy notebook which settings to raise."""
    assert gradescope.TIME_LIMIT + 120 <= gradescope.GRADESCOPE_TIMEOUT
    assert main(["gradescope", "01", "--out", str(tmp_path / "a.zip")]) == 0
    assert main(["gradescope", "09", "--out", str(tmp_path / "b.zip"), "--time-limit", "1500"]) == 0
    with zipfile.ZipFile(tmp_path / "a.zip") as a, zipfile.ZipFile(tmp_path / "b.zip") as b:
        assert "--time-limit 420 " in a.read("run_autograder").decode()
        assert "--time-limit 1500 " in b.read("run_autograder").decode()
        assert "raise the Autograder timeout in Autograder Settings to at least 1680 s" in b.read("README.md").decode()
        assert "container with more memory" in b.read("README.md").decode()
        assert "leaves room for the rest." in a.read("README.md").decode()
        assert "raise" not in a.read("README.md").decode()


def test_setup_takes_only_a_released_python_at_the_floor(autograder_zip, tmp_path):
    """setup.sh's test of a Python: a release candidate (Ubuntu 22.04's python3.11 is 3.11.0rc1) and a
    Python under the floor fail it; this interpreter, and a released 3.12, pass."""
    with zipfile.ZipFile(autograder_zip) as z:
        setup = z.read("setup.sh").decode()
    released = setup[setup.index("released() {"):setup.index("\n}\n", setup.index("released() {")) + 3]

    def posing_as(version: tuple) -> str:  # this interpreter, with another sys.version_info
        path = tmp_path / f"python-{'-'.join(map(str, version))}"
        path.write_text(f"#!/bin/sh\nexec {sys.executable} -c \"import collections, sys; "
                        f"sys.version_info = collections.namedtuple('V', 'major minor micro releaselevel serial')"
                        f"{version!r}; exec(sys.argv[1])\" \"$2\"\n")
        path.chmod(0o755)
        return str(path)

    def accepts(python: str) -> bool:
        return subprocess.run(["bash", "-c", f"{released}\nreleased {python}"]).returncode == 0

    assert accepts(sys.executable)
    assert accepts(posing_as((3, 12, 0, "final", 0)))
    assert not accepts(posing_as((3, 11, 0, "candidate", 1)))
    assert not accepts(posing_as((3, 11, 2, "final", 0)))
    assert not accepts(posing_as((3, 10, 12, "final", 0)))
    assert 'die "no released Python 3.11.5 or newer could be had' in setup
