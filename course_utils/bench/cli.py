"""The benchmark command: ``python -m course_utils.bench``."""

from __future__ import annotations

from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_utils.bench [--out DIR] ...``: the benchmark of notebook 06's implementations.

    The runner compares the exercises' answers, so it lives in the instructor edition
    (``course_utils.instructor.bench_impls``); it is imported only here, when the command runs.
    Where it is missing (the student edition), exit with a one-line message.
    """
    try:
        from course_utils.instructor.bench_impls import main as run
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("course_utils.instructor"):
            raise
        raise SystemExit(
            "python -m course_utils.bench: the benchmark runner is part of the instructor edition of the "
            "course; notebook 06 times the implementations itself."
        ) from None
    return run(argv)

