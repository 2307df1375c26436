"""Every message the checks give on the known answers (tests/fixtures/answers), as JSON on stdout.

A maintainer's tool for changes to the check engine (issue 34 moved every check onto specs): dump the
messages before and after, and diff them. Each line is ``[notebook, exercise, label, test id, error
name or null, message]``, in a fixed order; the test cells run in-process with the instructor edition,
as ``tests/support/harness.test_verdicts`` runs them.

    python scripts/dump_messages.py [NN ...] > messages.jsonl
"""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ is not installed: read it from here


def main(argv: list[str]) -> int:
    from grader import course
    from tests.fixtures.answers import load
    from tests.support import harness

    warnings.simplefilter("ignore")
    wanted = [n for n in course.available_notebooks() if not argv or n[:2] in argv]
    for notebook in wanted:
        module = load(notebook)
        answers = [] if module is None else [(e, f"{kind}: {label}", source) for kind in ("WRONG", "RIGHT")
                                             for e, found in getattr(module, kind).items() for label, source in found.items()]
        for exercise, label, source in answers:
            try:
                with contextlib.redirect_stdout(sys.stderr):  # what the notebooks print is not a message
                    verdicts = harness.test_verdicts(notebook, exercise, str(source))
            except Exception as exc:  # noqa: BLE001 - the answer cell itself failed
                verdicts = (("answer cell", exc),)
            for gid, exc in verdicts:
                row = [notebook, exercise, label, gid, None if exc is None else type(exc).__name__,
                       "" if exc is None else str(exc)]
                print(json.dumps(row, ensure_ascii=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
