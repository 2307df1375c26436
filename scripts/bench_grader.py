"""Throughput of ``python -m grader autograde``: notebooks graded per minute with 1 and 2 workers.

    .venv/bin/python scripts/bench_grader.py [--students 8] [--workers 1 2] [--notebook 01_dot_products]

Builds a class of ``--students`` copies of the released notebook with the solution's answers
filled in (so every test runs in full), grades it once per worker count into a temporary folder,
and prints wall time and notebooks per minute. Not a test: timings depend on the machine.
``GRADER_JUDGE_OUTSIDE=0`` in the environment measures the grader with every verdict decided in the
student's kernel, as before grader/judge.py (for a before/after comparison on one machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402

from grader import course  # noqa: E402
from grader.autograde import autograde  # noqa: E402


def solved(name: str) -> nbformat.NotebookNode:
    """The released notebook with the solution's answers (markers removed) filled in."""
    student = nbformat.read(course.notebooks_dir() / f"{name}.ipynb", as_version=4)
    solution = nbformat.read(course.solutions_dir() / f"{name}.ipynb", as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in solution.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in student.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = "\n".join(l for l in answers[gid].splitlines() if "### " not in l)
    return student


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--notebook", default="01_dot_products")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-grader-") as tmp:
        subs = Path(tmp) / "submissions"
        nb = solved(args.notebook)
        for i in range(args.students):
            (subs / f"student{i:03d}").mkdir(parents=True)
            nbformat.write(nb, subs / f"student{i:03d}" / f"{args.notebook}.ipynb")
        for workers in args.workers:
            out = Path(tmp) / f"out{workers}"
            start = time.perf_counter()
            code = autograde(subs, out, workers=workers, progress=False)
            seconds = time.perf_counter() - start
            text = (out / "grades.csv").read_text()
            assert code == 0 and text.count(",ok") == args.students, text
            rows.append({"workers": workers, "notebooks": args.students, "seconds": round(seconds, 1),
                         "per_minute": round(60 * args.students / seconds, 1)})
            print(f"{workers} worker(s): {args.students} notebooks in {seconds:.1f} s = "
                  f"{60 * args.students / seconds:.1f} notebooks/minute", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
