"""Every message the checks give on the known answers (tests/fixtures/answers), as JSON on stdout.

A maintainer's tool for changes to the check engine (issue 34 moved every check onto specs): dump the
messages before and after, and diff them. Each line is ``[notebook, exercise, label, test id, error
name or null, message]``, in a fixed order; the test cells run in-process with the instructor edition,
as ``tests/support/harness.test_verdicts`` runs them.

    python scripts/dump_messages.py [NN ...] > messages.jsonl

``--held-out DIR`` dumps instead the answers of a held-out batch: wrong answers written by someone who has seen
no check message, to measure whether the messages name a mistake before any check is changed for them (issue
36). ``DIR/nbNN.py`` defines ``HELDOUT = {exercise: {label: (source, description)}}``, ``description`` the
mistake in a teacher's words; each row then ends with it, for a reader to judge "does the message name it?".

    python scripts/dump_messages.py --held-out batch-D [NN ...] > batch-D.jsonl
"""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ is not installed: read it from here


def _known(notebook: str) -> list[tuple[str, str, str, str]]:
    """``(exercise, label, source, "")`` of each known answer of ``notebook`` (tests/fixtures/answers)."""
    from tests.fixtures.answers import load

    module = load(notebook)
    return [] if module is None else [(e, f"{kind}: {label}", source, "") for kind in ("WRONG", "RIGHT")
                                      for e, found in getattr(module, kind).items() for label, source in found.items()]


def _held_out(folder: Path, notebook: str) -> list[tuple[str, str, str, str]]:
    """``(exercise, label, source, description)`` of each answer of ``folder/nbNN.py``'s ``HELDOUT``."""
    import importlib.util

    path = folder / f"nb{notebook[:2]}.py"
    if not path.is_file():
        return []
    spec = importlib.util.spec_from_file_location(f"held_out_nb{notebook[:2]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [(e, label, source, description) for e, found in module.HELDOUT.items()
            for label, (source, description) in found.items()]


def main(argv: list[str]) -> int:
    from grader import course
    from tests.support import harness

    warnings.simplefilter("ignore")
    held_out = None
    if argv[:1] == ["--held-out"]:
        if len(argv) < 2 or not Path(argv[1]).is_dir():
            print("--held-out needs a folder of nbNN.py files, each defining HELDOUT", file=sys.stderr)
            return 2
        held_out, argv = Path(argv[1]), argv[2:]
    wanted = [n for n in course.available_notebooks() if not argv or n[:2] in argv]
    for notebook in wanted:
        answers = _known(notebook) if held_out is None else _held_out(held_out, notebook)
        for exercise, label, source, description in answers:
            try:
                with contextlib.redirect_stdout(sys.stderr):  # what the notebooks print is not a message
                    verdicts = harness.test_verdicts(notebook, exercise, str(source))
            except Exception as exc:  # noqa: BLE001 - the answer cell itself failed
                verdicts = (("answer cell", exc),)
            for gid, exc in verdicts:
                row = [notebook, exercise, label, gid, None if exc is None else type(exc).__name__,
                       "" if exc is None else str(exc)] + ([description] if held_out is not None else [])
                print(json.dumps(row, ensure_ascii=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
