"""How fast the student's self-checks and the grader's copy detection are. Not a test: it prints.

    .venv/bin/python scripts/bench_checks.py [--students 200] [--repeats 5]

1. Every visible self-check of every notebook, run on the solution's answer with the recorded
   expectations (as in the student edition): the median time of each, and the slowest per notebook.
   Target: under 0.5 s each, so that a check cell answers at once.
2. Copy detection (``grader.similarity.find_similar``) on a synthetic class of ``--students`` students
   answering every exercise of notebooks 01 to 06 (``tests/support/synthetic_class.py``), wall and CPU
   time. Target: under 10 s of CPU for 200 students.

Correctness comes first: a self-check that fails on the solution, or a class whose planted copies
are not all found, stops the benchmark before anything is timed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_utils.checks import expected  # noqa: E402
from grader import course  # noqa: E402
from grader.similarity import find_similar  # noqa: E402
from tests.support import harness  # noqa: E402
from tests.support.synthetic_class import SYNTHETIC_EXERCISES, synthetic_class  # noqa: E402

SELF_CHECK_TARGET_S = 0.5
SIMILARITY_TARGET_CPU_S = 10.0


def bench_self_checks(repeats: int) -> None:
    print(f"self-checks on the solution, recorded expectations, median of {repeats} (target < {SELF_CHECK_TARGET_S} s)")
    print(f"{'notebook':36s} {'slowest check':30s} {'seconds':>8s}")
    with expected.using(expected.RECORDED):
        for notebook in course.available_notebooks():
            solution = harness.solution_notebook(notebook)
            answers = {harness.grade_id(c): c.source for c in solution.cells
                       if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
            times = {}
            for exercise, source in answers.items():
                with contextlib.redirect_stdout(io.StringIO()):  # the first call runs the notebook's cells
                    passed, message = harness.check_verdict(notebook, exercise, source)  # correctness, and warm-up
                if not passed:
                    raise SystemExit(f"{notebook} {exercise}: the self-check fails on the solution: {message}")
                runs = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    harness.check_verdict(notebook, exercise, source)
                    runs.append(time.perf_counter() - start)
                times[exercise] = statistics.median(runs)
            slowest = max(times, key=times.get)
            flag = "" if times[slowest] < SELF_CHECK_TARGET_S else "  over target"
            print(f"{notebook:36s} {slowest:30s} {times[slowest]:8.3f}{flag}")


def bench_similarity(students: int) -> None:
    results, author = synthetic_class(students)
    start, cpu = time.perf_counter(), time.process_time()
    pairs = find_similar(results)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    wrong = [(p.exercise, p.student_a, p.student_b) for p in pairs if author[(p.exercise, p.student_a)] !=
             author[(p.exercise, p.student_b)]]
    if wrong:
        raise SystemExit(f"copy detection flagged students who did not copy: {wrong[:3]}")
    flag = "" if cpu < SIMILARITY_TARGET_CPU_S else "  over target"
    print(f"copy detection: {students} students x {SYNTHETIC_EXERCISES} exercises in {elapsed:.2f} s "
          f"({cpu:.2f} s of CPU, target < {SIMILARITY_TARGET_CPU_S:.0f} s; {len(pairs)} pairs flagged){flag}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    bench_self_checks(args.repeats)
    bench_similarity(args.students)


if __name__ == "__main__":
    main()
