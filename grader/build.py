"""Build the instructor notebooks in ``solutions/`` from their text sources, executed.

Each notebook's source is ``solutions/src/NN_name.py`` in jupytext's percent format: readable
diffs, reviewable in a pull request. Cell markers carry the nbgrader role in short form:

    # %% grade_id="dot"                 -> the answer cell of exercise ``dot`` (autograded answer);
                                           its body holds ``### BEGIN SOLUTION`` / ``### END SOLUTION``
    # %% grade_id="test_dot" points=2   -> a locked test cell worth 2 points; hidden tests go
                                           between ``### BEGIN HIDDEN TESTS`` / ``### END HIDDEN TESTS``
    # %% setup=true                     -> replaced by the Colab set-up cell (grader/templates)
    # %% shows="SelfAttention_v2"        -> "where we left off": the cell's own lines, then the source of
                                           each named class or function, read from course_utils.reference
                                           (or ``module:Name`` from another module) when the notebook is
                                           built. Only earlier notebooks' answers may be shown this way;
                                           the leak scan (tests/release/test_editions.py) holds that.

:func:`build` turns that into nbgrader's cell metadata, executes the notebook top to bottom in a
fresh kernel (nbclient), and writes ``solutions/NN_name.ipynb`` with its outputs.
"""

from __future__ import annotations

import importlib
import inspect
import os
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient
from nbconvert.preprocessors import CoalesceStreamsPreprocessor

from grader import course

KERNEL_NAME = "python3"
EXECUTION_TIMEOUT_S = 600


def nbgrader_metadata(cell: nbformat.NotebookNode) -> dict | None:
    """The nbgrader metadata for a source cell, from its short ``grade_id``/``points`` markers."""
    grade_id = cell.metadata.get("grade_id")
    if grade_id is None:
        return None
    points = cell.metadata.get("points")
    is_solution = "### BEGIN SOLUTION" in cell.source
    if points is not None and is_solution:
        raise ValueError(f"cell {grade_id!r}: a cell is either an answer (BEGIN SOLUTION) or a test (points), not both")
    if points is None and not is_solution:
        raise ValueError(f"cell {grade_id!r}: an answer cell needs ### BEGIN SOLUTION, a test cell needs points=N")
    return {
        "grade": points is not None,
        "grade_id": grade_id,
        "locked": points is not None,
        "schema_version": 3,
        "solution": is_solution,
        "task": False,
        **({"points": points} if points is not None else {}),
    }


def setup_cell_source(notebook: str) -> str:
    """The set-up cell of ``notebook``: the student edition's address from pyproject.toml (for Colab)
    and the notebook's name (for its PyTorch version check) filled in."""
    template = (Path(__file__).parent / "templates" / "setup_cell.py").read_text(encoding="utf-8")
    return (template.replace("{student_edition_url}", course.project_url("Student edition"))
            .replace("{notebook}", notebook).rstrip("\n"))


def shown_source(names: str) -> str:
    """The source code of each object named in ``names`` (space-separated; ``Name`` in
    ``course_utils.reference`` or ``module:Name``), one after the other."""
    parts = []
    for name in names.split():
        module, _, attr = name.rpartition(":")
        obj = getattr(importlib.import_module(module or "course_utils.reference"), attr)
        parts.append(inspect.getsource(obj).rstrip("\n"))
    return "\n\n\n".join(parts)


def source_to_notebook(path: Path) -> nbformat.NotebookNode:
    """Read a percent-format source and return an unexecuted notebook with nbgrader metadata."""
    nb = jupytext.read(path, fmt="py:percent")
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": KERNEL_NAME},
        "language_info": {"name": "python"},
    }
    if nb.cells and nb.cells[0].cell_type == "markdown":
        nb.cells[0].source = course.badge_markdown(path.stem) + "\n\n" + nb.cells[0].source
    seen: set[str] = set()
    for index, cell in enumerate(nb.cells):
        if cell.metadata.get("setup"):
            cell.source = setup_cell_source(path.stem)
        if cell.metadata.get("shows"):
            own = cell.source.rstrip("\n")
            cell.source = (own + "\n\n\n" if own else "") + shown_source(cell.metadata["shows"])
        meta = nbgrader_metadata(cell) if cell.cell_type == "code" else None
        tags = list(cell.metadata.get("tags", []))  # e.g. "nbval-ignore-output" on timing cells
        cell.metadata = {"nbgrader": meta} if meta else {}
        if tags:
            cell.metadata["tags"] = tags
        if meta:
            if meta["grade_id"] in seen:
                raise ValueError(f"{path.name}: grade_id {meta['grade_id']!r} is used twice")
            seen.add(meta["grade_id"])
            if meta["locked"]:
                cell.metadata.update({"deletable": False, "editable": False})
        # Stable cell ids keep rebuilt notebooks byte-identical when nothing changed.
        cell["id"] = meta["grade_id"].replace("_", "-") if meta else f"cell-{index:03d}"
    nbformat.validate(nb)
    return nb


def execute(nb: nbformat.NotebookNode, cwd: Path) -> nbformat.NotebookNode:
    """Run every cell top to bottom in a fresh kernel started in ``cwd``; raise on the first error."""
    env_backup = {k: os.environ.get(k) for k in ("PYTHONHASHSEED", "MPLBACKEND")}
    os.environ["PYTHONHASHSEED"] = "0"
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    try:
        client = NotebookClient(
            nb,
            timeout=EXECUTION_TIMEOUT_S,
            kernel_name=KERNEL_NAME,
            resources={"metadata": {"path": str(cwd)}},
            record_timing=False,
        )
        client.execute()
        # Printed text arrives in as many chunks as the kernel happened to flush; merge them so a
        # rebuild with the same outputs writes the same bytes.
        CoalesceStreamsPreprocessor().preprocess(nb, {})
    finally:
        for key, value in env_backup.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return nb


def build(names: list[str] | None = None, run: bool = True) -> list[Path]:
    """Build ``solutions/NAME.ipynb`` for each name (all notebooks with a source if ``None``)."""
    names = names or course.available_notebooks()
    written = []
    for name in names:
        src = course.sources_dir() / f"{name}.py"
        if not src.exists():
            raise FileNotFoundError(f"no source for notebook {name!r}: expected {src}")
        nb = source_to_notebook(src)
        if run:
            execute(nb, course.solutions_dir())
        out = course.solutions_dir() / f"{name}.ipynb"
        nbformat.write(nb, out)
        written.append(out)
    return written
