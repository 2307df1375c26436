"""Record the expected values that the student edition's self-checks compare with.

Each notebook's checks are run on the reference answers while :func:`expected.recording` is
active: every value a visible check asks for (outputs, shapes, the outputs of the known mistakes)
is stored in ``course_utils/expected/<notebook>.pt``. ``make build`` writes these files;
``check-release`` fails when one differs from a fresh recording by more than arithmetic noise
(another CPU's float32 rounding is not a change; see :func:`expected.value_difference`).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

from course_utils.checks import expected
from grader import course


def record(notebook: str) -> dict[str, Any]:
    """Every expectation the visible checks of ``notebook`` ask for, computed from the reference."""
    from course_utils import checks, reference

    with expected.recording() as store, contextlib.redirect_stdout(io.StringIO()):
        for exercise in course.EXERCISES[notebook]:
            getattr(checks, f"check_{exercise}")(getattr(reference, exercise))
    return store


def write(names: list[str] | None = None, folder: Path | None = None) -> list[Path]:
    """Record each notebook (all by default) into ``folder`` (default ``course_utils/expected``).

    A file whose values agree with the fresh recording up to arithmetic noise is left untouched.
    """
    written = []
    for name in names or course.available_notebooks():
        path = expected.data_file(name, folder)
        fresh = record(name)
        # Kept as it is when only arithmetic noise differs: rebuilding on another CPU changes no file.
        if not (path.exists() and not expected.differences(expected.load(path), fresh)):
            expected.save(fresh, path)
        written.append(path)
    expected.forget_loaded()
    return written


def stale(names: list[str] | None = None, folder: Path | None = None) -> dict[str, str]:
    """Notebook -> what is wrong with its stored recording (missing, or which keys differ)."""
    problems = {}
    for name in names or course.available_notebooks():
        path = expected.data_file(name, folder)
        if not path.exists():
            problems[name] = f"{path.name} is missing"
            continue
        changed = expected.differences(expected.load(path), record(name))
        if changed:
            shown = "; ".join(f"{k!r}: {why}" for k, why in list(changed.items())[:3])
            problems[name] = f"{len(changed)} recorded values differ, e.g. {shown}"
    return problems
