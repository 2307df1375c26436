"""Make the student notebooks: nbgrader's ``generate_assignment`` on each solution notebook.

``solutions/`` and ``notebooks/`` stay flat (one file per notebook); nbgrader's own course layout
(``source/<assignment>/<notebook>.ipynb``, ``release/...``) is built in a temporary folder.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import nbformat

from grader import course
from grader.config import make_api


class ReleaseError(RuntimeError):
    """nbgrader could not generate a student version."""


def generate_student_versions(names: list[str], out_dir: Path) -> dict[str, Path]:
    """Write the student version of each solution notebook into ``out_dir``; return name -> path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    with tempfile.TemporaryDirectory(prefix="course-release-") as tmp:
        root = Path(tmp)
        api = make_api(root)
        for name in names:
            src = course.solutions_dir() / f"{name}.ipynb"
            if not src.exists():
                raise ReleaseError(f"{src} does not exist: build it first with `python -m grader build {name}`")
            (root / "source" / name).mkdir(parents=True)
            shutil.copy2(src, root / "source" / name / src.name)
            result = api.generate_assignment(name, force=True, create=True)
            if not result["success"]:
                raise ReleaseError(f"nbgrader could not release {name}:\n{result.get('error') or result.get('log')}")
            produced = root / "release" / name / src.name
            nb = nbformat.read(produced, as_version=4)
            target = out_dir / src.name
            nbformat.write(nb, target)
            written[name] = target
    return written


def release(names: list[str] | None = None) -> list[Path]:
    """Regenerate ``notebooks/`` from ``solutions/``."""
    names = names or course.available_notebooks()
    return list(generate_student_versions(names, course.notebooks_dir()).values())


def stale_notebooks(names: list[str] | None = None) -> list[str]:
    """Names whose file in ``notebooks/`` differs from a fresh release of ``solutions/`` (or is missing)."""
    names = names or course.available_notebooks()
    with tempfile.TemporaryDirectory(prefix="course-check-") as tmp:
        fresh = generate_student_versions(names, Path(tmp))
        stale = []
        for name, path in fresh.items():
            current = course.notebooks_dir() / path.name
            if not current.exists() or current.read_bytes() != path.read_bytes():
                stale.append(name)
        return stale
