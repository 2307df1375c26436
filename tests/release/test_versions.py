"""The Python and PyTorch versions the course declares are the ones its code needs and is tested on.

- Each notebook's PyTorch floor (``course_utils.versions``) covers every API it and its checks use,
  read from the student notebook and the student package (``API_FLOORS``: the release that added each).
- ``pyproject.toml`` declares the highest floor, so ``course_utils`` installs beside any torch that runs
  every notebook, Colab's included, and nothing older.
- The set-up cell says in one line, naming the version, when a kernel's torch is too old.
- The student package compiles under every Python the project declares that this machine has.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import nbformat
import pytest
from torch.torch_version import TorchVersion

from course_utils import versions
from grader import course

ROOT = course.repo_root()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
STUDENT_PACKAGE = [p for p in (ROOT / "course_utils").rglob("*.py")
                   if "instructor" not in p.parts and p.name != "reference.py"]


def _declared(name: str) -> str:
    (spec,) = [d for d in PYPROJECT["project"]["dependencies"] if re.match(rf"{name}\b", d)]
    return re.search(r">=\s*([\d.]+)", spec).group(1)


def _uses(text: str) -> set[str]:
    return {api for api in versions.API_FLOORS if api in text}


def _check_module(notebook: str) -> Path:
    return ROOT / "course_utils" / "checks" / f"nb{notebook[:2]}.py"


@pytest.mark.parametrize("notebook", course.available_notebooks())
def test_each_notebook_floor_covers_the_apis_it_uses(notebook):
    nb = nbformat.read(course.notebooks_dir() / f"{notebook}.ipynb", as_version=4)
    used = _uses("\n".join(c.source for c in nb.cells if c.cell_type == "code"))
    if _check_module(notebook).exists():
        used |= _uses(_check_module(notebook).read_text())
    used |= _uses((ROOT / "course_utils" / "checks" / "core.py").read_text())
    need, _ = versions.torch_needed(notebook)
    too_new = {api: versions.API_FLOORS[api] for api in used if TorchVersion(versions.API_FLOORS[api]) > need}
    assert not too_new, f"{notebook} needs torch {need} by course_utils.versions, but uses {too_new}"


def test_pyproject_declares_the_highest_floor():
    highest = max((versions.torch_needed(n)[0] for n in course.available_notebooks()), key=TorchVersion)
    floors_in_package = {versions.API_FLOORS[a] for p in STUDENT_PACKAGE for a in _uses(p.read_text())}
    assert TorchVersion(highest) >= max(floors_in_package, key=TorchVersion)
    assert _declared("torch") == highest


def test_the_setup_cell_names_the_version_a_notebook_needs(capsys):
    assert versions.require("08_kv_cache_gqa_and_windows", installed="2.4.1") is not None
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "PyTorch 2.5 or newer" in out and "2.4.1" in out and "pip install" in out
    assert versions.require("01_dot_products", installed="2.4.1") is None
    assert versions.require("01_dot_products", installed="2.2.0+cpu") is not None
    assert versions.require("08_kv_cache_gqa_and_windows", installed="2.13.0+cpu") is None
    assert capsys.readouterr().out.count("\n") == 1


@pytest.mark.parametrize("notebook", course.available_notebooks())
def test_every_notebook_runs_the_version_check_first(notebook):
    nb = nbformat.read(course.notebooks_dir() / f"{notebook}.ipynb", as_version=4)
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert f'require("{notebook}")' in first_code.source


def _pythons() -> list[str]:
    """Every Python of the declared range on this machine, other than this one: on PATH, or pyenv's."""
    floor = tuple(int(x) for x in re.search(r">=\s*([\d.]+)", PYPROJECT["project"]["requires-python"]).group(1).split("."))
    candidates = [shutil.which(f"python{floor[0]}.{minor}") for minor in range(floor[1], 20)]
    candidates += sorted(str(p) for p in Path.home().glob(f".pyenv/versions/{floor[0]}.*/bin/python{floor[0]}"))
    found: dict[str, str] = {}
    for exe in filter(None, candidates):
        done = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                              text=True)
        version = done.stdout.strip()
        if done.returncode == 0 and version and tuple(map(int, version.split("."))) >= floor[:2]:
            found.setdefault(version, exe)
    return [found[v] for v in sorted(found, key=lambda v: tuple(map(int, v.split("."))))]


@pytest.mark.parametrize("python", _pythons() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no Python of the declared range on this machine"))])
def test_the_student_package_compiles_under_each_declared_python(python):
    code = ("import sys, pathlib; bad = []\n"
            "for p in sys.argv[1:]:\n"
            "    try: compile(pathlib.Path(p).read_text(), p, 'exec')\n"
            "    except SyntaxError as e: bad.append(f'{p}: {e}')\n"
            "print('\\n'.join(bad)); sys.exit(1 if bad else 0)")
    done = subprocess.run([python, "-c", code, *map(str, STUDENT_PACKAGE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_declared_triton_is_the_one_the_kernels_need():
    """``pyproject.toml`` asks for the Triton whose interpreter runs notebooks 07 and 10's kernels
    (``flash.TRITON_FLOOR``), and an older one makes their checks say so instead of running."""
    from unittest import mock

    from course_utils import flash

    (spec,) = [d for d in PYPROJECT["project"]["optional-dependencies"]["dev"] if d.startswith("triton")]
    assert re.search(r">=\s*([\d.]+)", spec).group(1) == flash.TRITON_FLOOR
    with mock.patch("importlib.metadata.version", return_value="3.1.0"):
        runs, why = flash.triton_status()
    assert not runs and "Triton 3.1.0" in why and f"the {flash.TRITON_FLOOR} these kernels need" in why


def test_make_test_torch_floor_runs_the_declared_floor():
    """``make test-torch-floor`` runs the student notebooks on the oldest torch ``pyproject.toml`` admits."""
    makefile = (ROOT / "Makefile").read_text()
    floor = re.search(r"^TORCH_FLOOR := ([\d.]+)$", makefile, re.M).group(1)
    assert TorchVersion(floor) == TorchVersion(_declared("torch")), (floor, _declared("torch"))
