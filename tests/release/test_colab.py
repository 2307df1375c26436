"""Colab as a student meets it: the badge, and the set-up cell run as Colab runs it.

Each student notebook is executed in a fresh kernel that has the course's torch but no
``course_utils``, with a stand-in ``google.colab`` module imported at start-up as Colab does, so the
set-up cell takes its Colab branch. ``COURSE_UTILS_FROM`` points its ``pip install`` at the wheel of the
local student edition instead of the network (``PIP_NO_INDEX`` makes sure nothing is downloaded). The
notebook, as released, must run top to bottom with every check saying "not implemented yet", and the
install must leave torch, numpy and matplotlib alone.

Colab runs Python 3.12 with PyPI's torch (a CUDA build). ``make test-colab`` builds such an environment
(``.venv-colab``) and runs this module in it, through ``COURSE_STUDENT_PYTHON``; ``make test`` runs it in the
course environment (Python 3.11, the CPU build of torch).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest

from grader import course
from tests.support import studentenv

NOTEBOOKS = course.available_notebooks()
KEPT = ("torch", "numpy", "matplotlib")
#: The interpreter whose environment stands in for Colab's (torch, numpy, matplotlib, ipykernel, pip).
COLAB_PYTHON = Path(os.environ.get(studentenv.STUDENT_PYTHON) or sys.executable)


@pytest.fixture(scope="module")
def colab(student_edition, tmp_path_factory):
    """A fresh environment that imports a stand-in ``google.colab`` at start-up, and its kernel."""
    _, wheel = student_edition
    root = tmp_path_factory.mktemp("colab")
    python, site = studentenv.fresh_venv(root, COLAB_PYTHON)
    (site / "google" / "colab").mkdir(parents=True)
    (site / "google" / "__init__.py").write_text("")
    (site / "google" / "colab" / "__init__.py").write_text('"""Stand-in for Colab\'s own module."""\n')
    (site / "colab_startup.pth").write_text("import google.colab\n")
    versions = "import torch, numpy, matplotlib; print(torch.__version__, numpy.__version__, matplotlib.__version__)"
    before = studentenv.run(python, versions, root).stdout
    assert before, "the course's torch, numpy and matplotlib must be importable in the fresh environment"
    assert studentenv.run(python, "import course_utils", root).returncode != 0, "course_utils is already there"
    jupyter = studentenv.add_kernel(root, python, "colab", {
        "COURSE_UTILS_FROM": str(wheel), "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    studentenv.add_kernel(root, python, "colab-offline", {
        "COURSE_UTILS_FROM": "git+https://example.invalid/no-such-repository", "PIP_NO_INDEX": "1"})
    return {"python": python, "site": site, "jupyter": jupyter, "root": root, "before": before, "versions": versions}


@pytest.fixture(scope="module")
def colab_runs(colab, student_edition, tmp_path_factory):
    """Every student notebook, as released (stubs in its answer cells), run top to bottom in the Colab
    stand-in, two kernels at a time. The first run installs course_utils; the others find it installed,
    as a Colab session would. (tests/release/test_editions.py runs them again with the answers filled in.)"""
    from concurrent.futures import ThreadPoolExecutor

    folder, _ = student_edition

    def run(name: str):
        nb = nbformat.read(folder / "notebooks" / f"{name}.ipynb", as_version=4)
        try:
            studentenv.execute(nb, colab["jupyter"], "colab", tmp_path_factory.mktemp(name[:2]), allow_errors=True)
        except Exception as exc:  # noqa: BLE001 - reported by the test of this notebook
            return nb, exc
        return nb, None

    first = run(NOTEBOOKS[0])  # one install, not two racing each other
    with ThreadPoolExecutor(max_workers=2) as pool:
        rest = dict(zip(NOTEBOOKS[1:], pool.map(run, NOTEBOOKS[1:])))
    return {NOTEBOOKS[0]: first, **rest}


def _errors(cell) -> list:
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_setup_cell_installs_course_utils_as_colab_would(colab, colab_runs, name):
    nb, error = colab_runs[name]
    assert error is None, f"{name} did not run: {error}"
    setup = next(c for c in nb.cells if c.cell_type == "code")
    assert not _errors(setup), f"{name}: the set-up cell failed: {_errors(setup)}"
    assert "course_utils installed from" in studentenv.output_text(setup), "the set-up cell took no Colab branch"
    after = studentenv.run(colab["python"], colab["versions"], colab["root"]).stdout
    assert after == colab["before"], f"the install changed torch, numpy or matplotlib: {colab['before']} -> {after}"
    installed = sorted(p.name for p in colab["site"].iterdir() if p.name.split("-")[0] in KEPT)
    assert not installed, f"pip installed its own {installed} into the environment"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_released_notebook_runs_in_colab_and_every_check_says_not_implemented(colab, colab_runs, name):
    """As released, a notebook runs top to bottom in Colab, and every check cell says "not implemented
    yet". (Demonstration cells that use a function not written yet raise, as they would for the student.)
    Where the environment's Triton cannot run the kernels, a Triton check says that instead, naming the
    version it needs."""
    nb, error = colab_runs[name]
    assert error is None, f"{name} did not run: {error}"
    checks = [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    assert checks, f"{name} has no check cell"
    for cell in checks:
        text = studentenv.output_text(cell)
        if "⏭" in text and not studentenv.triton_runs(colab["python"], colab["root"]):  # course_utils installed now
            assert all(words in text for words in studentenv.TRITON_TOO_OLD), text[:300]
            continue
        assert "not implemented yet" in text, f"{name}: a check on a stub says: {text[:300]}"


def test_a_failed_install_says_so_in_one_line(colab, student_edition, tmp_path):
    folder, _ = student_edition
    nb = nbformat.read(folder / "notebooks" / f"{NOTEBOOKS[0]}.ipynb", as_version=4)
    nb.cells = [c for c in nb.cells if c.cell_type == "code"][:1]
    studentenv.execute(nb, colab["jupyter"], "colab-offline", tmp_path, allow_errors=True)
    errors = [o for o in nb.cells[0].outputs if o.output_type == "error"]
    assert errors and errors[0].ename == "SystemExit", nb.cells[0].outputs
    message = errors[0].evalue
    assert message.startswith("Could not install course_utils from git+https://example.invalid/no-such-repository")
    assert "run this cell again" in message and "\n" not in message
    assert not any("Traceback" in (o.get("text", "")) for o in nb.cells[0].outputs), "a pip traceback was shown"


def test_the_stand_in_runs_the_python_and_torch_it_was_given(colab):
    """The fresh environment runs ``COURSE_STUDENT_PYTHON`` (Python 3.12 under ``make test-colab``) with
    that environment's torch, not the course environment's."""
    import subprocess

    what = "import platform, torch; print(platform.python_version(), torch.__version__, torch.__file__)"
    want = subprocess.run([str(COLAB_PYTHON), "-c", what], capture_output=True, text=True,
                          env=studentenv.clean_env()).stdout
    got = studentenv.run(colab["python"], what, colab["root"]).stdout
    assert got and got == want, f"the stand-in runs {got!r}, not {want!r}"


def test_every_notebook_opens_with_its_colab_badge(student_edition):
    folder, _ = student_edition
    for name in NOTEBOOKS:
        nb = nbformat.read(folder / "notebooks" / f"{name}.ipynb", as_version=4)
        first = nb.cells[0]
        assert first.cell_type == "markdown" and first.source.startswith(course.colab_badge(name)), name
        assert ("Change runtime type → GPU" in first.source) == (name in course.GPU_NOTEBOOKS), name


def test_readme_tables_carry_the_badges(student_edition):
    folder, _ = student_edition
    for readme in (course.repo_root() / "README.md", folder / "README.md"):
        text = readme.read_text(encoding="utf-8")
        for name in NOTEBOOKS:
            assert course.colab_badge(name) in text, f"{readme}: no Colab badge for {name}"
