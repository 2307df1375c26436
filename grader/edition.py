"""Build the student edition: what an instructor publishes to students, and nothing more.

This repository is the instructor edition: solutions, hidden tests, the reference answers
(``course_utils.reference``), the hidden cases and known mistakes (``course_utils.instructor``)
and the grader. ``python -m grader release`` also writes ``release/``, a folder meant to be
published as the students' own repository or baked into a JupyterHub image:

    release/
      README.md, Makefile        a student's one-command set-up (``make lab``)
      pyproject.toml             the student package, installable with ``pip install <folder or git URL>``
      requirements.txt           exact versions (with constraints.txt) so outputs reproduce
      notebooks/NN_*.ipynb       the released student notebooks (stubs, visible checks only)
      course_utils/              the package without its instructor-only modules, with a
                                 ``reference.py`` that raises a clear ImportError, and
                                 ``expected/NN_*.pt``: the recorded expectations of the released notebooks

Releases follow deadlines: ``release 01 02 03`` builds an edition holding just those notebooks and
the recordings they need.
"""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path

from grader import course

#: Parts of ``course_utils`` that hold answers, hidden cases or known mistakes: never released.
INSTRUCTOR_ONLY = ("reference.py", "instructor")
#: Exact versions a student needs, taken from constraints.txt (their dependencies are constrained too).
STUDENT_REQUIREMENTS = ("torch", "numpy", "matplotlib", "tqdm", "jupyterlab", "ipykernel")
#: Exact versions a student needs only where they can run: Triton (notebook 07's kernel, run by its
#: interpreter on a CPU) has builds for Linux only.
STUDENT_LINUX_REQUIREMENTS = ("triton",)
TEMPLATES = Path(__file__).with_name("templates") / "student"
MARKER = ".student-edition"


def default_dir() -> Path:
    return course.repo_root() / "release"


def _pyproject() -> dict:
    return tomllib.loads((course.repo_root() / "pyproject.toml").read_text(encoding="utf-8"))


def student_edition_url() -> str:
    """Where students install the edition from (``[project.urls] "Student edition"``)."""
    return course.project_url("Student edition")


def _ignore_instructor_only(folder: str, names: list[str]) -> set[str]:
    ignored = {n for n in names if n in ("__pycache__",) or n.endswith(".pyc")}
    if Path(folder).resolve() == (course.repo_root() / "course_utils").resolve():
        ignored |= set(INSTRUCTOR_ONLY) | {"expected"}
    return ignored


def _notebook_table(names: list[str]) -> str:
    return "\n".join(f"| `{name}` {course.colab_badge(name)} | "
                     f"{', '.join(f'`{e}`' for e in course.EXERCISES[name])} |" for name in names)


def _requirements() -> str:
    pins = {}
    for line in (course.repo_root() / "constraints.txt").read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line.strip())
        if match:
            pins[match.group(1).lower()] = match.group(2)
    missing = [p for p in STUDENT_REQUIREMENTS + STUDENT_LINUX_REQUIREMENTS if p not in pins]
    if missing:
        raise RuntimeError(f"constraints.txt pins no version of {missing}")
    lines = ["# The course's exact versions: the packages a student needs, every dependency constrained.",
             "-c constraints.txt"]
    linux = [f"{p}=={pins[p]}; platform_system == 'Linux'" for p in STUDENT_LINUX_REQUIREMENTS]
    return "\n".join(lines + [f"{p}=={pins[p]}" for p in STUDENT_REQUIREMENTS] + linux) + "\n"


def build_edition(names: list[str] | None = None, out: Path | None = None) -> Path:
    """Write the student edition of the notebooks ``names`` (all by default) into ``out``.

    The notebooks are taken from ``notebooks/`` (make them with ``release`` first) and the
    recordings from ``course_utils/expected/`` (``make build`` writes them). ``out`` is replaced
    whole; a folder that is not an earlier student edition is never deleted.
    """
    names = names or course.available_notebooks()
    out = Path(out or default_dir())
    if out.exists():
        if not (out / MARKER).exists() and any(out.iterdir()):
            raise FileExistsError(f"{out} exists and is not a student edition built by this command; not replacing it")
        shutil.rmtree(out)
    root = course.repo_root()
    package = out / "course_utils"
    shutil.copytree(root / "course_utils", package, ignore=_ignore_instructor_only)
    shutil.copy2(TEMPLATES / "reference.py", package / "reference.py")
    (package / "expected").mkdir()
    for name in names:
        recording = root / "course_utils" / "expected" / f"{name}.pt"
        if not recording.exists():
            raise FileNotFoundError(f"{recording} is missing: run `python -m grader record {name[:2]}` (or make build)")
        shutil.copy2(recording, package / "expected" / recording.name)
        (out / "notebooks").mkdir(exist_ok=True)
        notebook = course.notebooks_dir() / f"{name}.ipynb"
        if not notebook.exists():
            raise FileNotFoundError(f"{notebook} is missing: run `python -m grader release {name[:2]}` first")
        shutil.copy2(notebook, out / "notebooks" / notebook.name)
    project = _pyproject()["project"]
    (out / "pyproject.toml").write_text(
        (TEMPLATES / "pyproject.toml").read_text(encoding="utf-8")
        .replace("{version}", project["version"])
        .replace("{requires_python}", project["requires-python"])
        .replace("{dependencies}", json.dumps(project["dependencies"])), encoding="utf-8")
    (out / "README.md").write_text((TEMPLATES / "README.md").read_text(encoding="utf-8")
                                   .replace("{notebook_table}", _notebook_table(names)), encoding="utf-8")
    shutil.copy2(TEMPLATES / "Makefile", out / "Makefile")
    (out / "scripts").mkdir()
    shutil.copy2(root / "scripts" / "lab.py", out / "scripts" / "lab.py")  # make lab: the URL, a taken port
    shutil.copy2(TEMPLATES / "gitignore", out / ".gitignore")
    shutil.copy2(root / "constraints.txt", out / "constraints.txt")
    (out / "requirements.txt").write_text(_requirements(), encoding="utf-8")
    (out / MARKER).write_text("built by `python -m grader release`; replaced whole by the next release\n",
                              encoding="utf-8")
    return out
