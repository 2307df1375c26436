"""Throughput of ``python -m grader autograde``: warm kernels, cold kernels and plain nbgrader, in one run.

    .venv/bin/python scripts/bench_grader.py [--students 16] [--workers 2]
        [--notebooks 02_softmax_and_context 08_kv_cache_gqa_and_windows] [--plain 02_softmax_and_context]
        [--breakdown 3] [--json FILE]

For each notebook, builds a class of ``--students`` copies of the released notebook with the solution's
answers filled in (so every test runs in full) and grades it with ``--workers`` processes twice: with warm
kernels (each forked from a pre-imported parent, grader/warm.py) and with ``--cold-kernels``; for the
``--plain`` notebooks also with plain ``nbgrader autograde`` (one process, no sandbox, no hand-off, every
verdict in the kernel). Prints notebooks per minute for each, and the ratios, and for ours the serial
start-up (from the run's start to the first cell of any kernel: the checks, intake, the course's gradebook,
the grading processes and their warm parents) and the serial finish (from the last cell's reply to the end:
merging, the CSVs, copy detection, the reports), read from the cell timings nbclient keeps in the graded
notebooks. The first warm run also pays for the grading processes' fork server (later runs of the same
process reuse it), and registers each notebook unless its gradebook is cached from an earlier run
(``grader.autograde.prepare_course``). Then grades ``--breakdown``
notebooks of each one in this process, warm and cold, and prints where a notebook's time goes: the
kernel's start (a fork, or a fresh interpreter and its imports: these then fall in the cells), the cells,
the hand-off (hidden inputs written, folders made) and the judging outside the kernel.

Not a test: timings depend on the machine and on what else runs on it; nothing here is asserted. Where
it may make a cgroup v1 ``cpuacct`` group (root), it also prints the CPU-seconds each way took, all
processes together, and the notebooks per minute that makes on ``--workers`` idle cores: on a machine
shared with other work, wall time says more about the others' load than about the grader.
``GRADER_JUDGE_OUTSIDE=0`` in the environment measures the grader with every verdict decided in the
student's kernel, as before grader/judge.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402

from grader import course  # noqa: E402
from tests.support.graded_class import solved  # noqa: E402


def make_class(folder: Path, name: str, students: int) -> Path:
    subs = folder / f"submissions-{name}"
    nb = solved(name)
    for i in range(students):
        (subs / f"student{i:03d}").mkdir(parents=True)
        nbformat.write(nb, subs / f"student{i:03d}" / f"{name}.ipynb")
    return subs


class CpuClock:
    """CPU-seconds used by this process and everything it starts (the fork server, the grading processes,
    their sandboxes and kernels), read from a cgroup v1 ``cpuacct`` group of its own; ``None`` where this
    process cannot make one. On a shared machine, wall time depends on the others' load; this does not."""

    def __init__(self) -> None:
        self.folder = Path("/sys/fs/cgroup/cpuacct") / f"bench-grader-{os.getpid()}"
        try:
            self.folder.mkdir()
            (self.folder / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            self.folder = None

    def close(self) -> None:
        """Move every process left in the group back to its parent group, and remove the group."""
        if self.folder is None:
            return
        for pid in (self.folder / "cgroup.procs").read_text().split():
            try:
                (self.folder.parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        try:
            self.folder.rmdir()
        except OSError:
            pass

    def seconds(self) -> float | None:
        if self.folder is None:
            return None
        return int((self.folder / "cpuacct.usage").read_text()) / 1e9


def grade_ours(subs: Path, out: Path, workers: int, cold: bool, students: int) -> tuple[float, float | None, float | None]:
    """Seconds the run took, the serial start-up (from the run's start to the first cell's start in any
    kernel) and the serial finish (from the last cell's reply to the run's end); ``None`` where the graded
    notebooks hold no timing."""
    from grader.autograde import autograde

    start, clock = time.perf_counter(), time.time()
    code = autograde(subs, out, workers=workers, progress=False, cold_kernels=cold)
    seconds = time.perf_counter() - start
    text = (out / "grades.csv").read_text()
    if code != 0 or text.count(",ok") != students:
        print(f"  (not every notebook was graded: exit {code})\n{text}", file=sys.stderr)
    first, last = cell_times(out / "nbgrader" / "autograded")
    return (seconds, None if first is None else first - clock,
            None if last is None else clock + seconds - last)


def cell_times(folder: Path) -> tuple[float | None, float | None]:
    """The earliest start and the latest reply of any cell in the graded notebooks under ``folder``, as
    nbclient records them (``metadata.execution``, UTC), in seconds since the epoch."""
    from datetime import datetime

    def seconds(stamp: str) -> float:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    starts, ends = [], []
    for path in folder.glob("*/*/*.ipynb"):
        for cell in nbformat.read(path, as_version=4).cells:
            timing = cell.get("metadata", {}).get("execution", {})
            if "iopub.execute_input" in timing:
                starts.append(seconds(timing["iopub.execute_input"]))
            if "shell.execute_reply" in timing:
                ends.append(seconds(timing["shell.execute_reply"]))
    return (min(starts) if starts else None), (max(ends) if ends else None)


def grade_plain(subs: Path, work: Path, name: str, students: int) -> float:
    """Plain ``nbgrader autograde``: nbgrader's own pipeline in one process, its default kernel, no sandbox."""
    from grader.config import make_api

    (work / "source" / name).mkdir(parents=True)
    shutil.copy2(course.solutions_dir() / f"{name}.ipynb", work / "source" / name / f"{name}.ipynb")
    api = make_api(work)
    assert api.generate_assignment(name, force=True, create=True)["success"]
    for folder in sorted(subs.iterdir()):
        target = work / "submitted" / folder.name / name
        target.mkdir(parents=True)
        shutil.copy2(folder / f"{name}.ipynb", target / f"{name}.ipynb")
    start = time.perf_counter()
    ok = sum(api.autograde(name, folder.name, force=True, create=True)["success"] for folder in sorted(subs.iterdir()))
    seconds = time.perf_counter() - start
    if ok != students:
        print(f"  (plain nbgrader graded {ok} of {students})", file=sys.stderr)
    return seconds


def breakdown(folder: Path, name: str, count: int, cold: bool) -> dict[str, float]:
    """Seconds per notebook in each part of grading, graded here one at a time (see the docstring)."""
    from grader import autograde as ag
    from grader import judge, warm
    from grader.config import SETTINGS
    from grader.execute import RobustExecute

    spent: dict[str, float] = defaultdict(float)
    judging = [0]  # inside the judge (its first tries' kernels count as judging, not as the notebook's)

    def add(part: str, seconds: float) -> None:
        if part == "judging" or not judging[0]:
            spent[part] += seconds

    def timed(owner, attribute: str, part: str, is_async: bool = False):
        original = getattr(owner, attribute)
        if is_async:
            async def wrapper(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return await original(*args, **kwargs)
                finally:
                    add(part, time.perf_counter() - start)
        else:
            def wrapper(*args, **kwargs):
                start = time.perf_counter()
                judging[0] += part == "judging"
                try:
                    return original(*args, **kwargs)
                finally:
                    judging[0] -= part == "judging"
                    add(part, time.perf_counter() - start)
        setattr(owner, attribute, wrapper)
        return original

    subs = make_class(folder, name, count)
    root = folder / "course"
    ag.prepare_course(root, [name])
    shutil.copy2(root / "gradebook.db", root / "gradebook.template.db")
    jobs = [t for t in ag.take_in(subs, [name])[0] if isinstance(t, ag.Job)]
    settings = SETTINGS.with_(warm_kernels=not cold)
    if not cold:
        warm.enable(settings.memory)
        warm.current().ready()  # the parent's imports: once per grading process, not per notebook
    # nbconvert calls the sync wrappers (bound to nbclient's coroutines), a restart the coroutines.
    saved = [(RobustExecute, attribute, timed(RobustExecute, attribute, "kernel start", attribute.startswith("async")))
             for attribute in ("start_new_kernel", "start_new_kernel_client", "async_start_new_kernel",
                               "async_start_new_kernel_client")]
    saved += [(RobustExecute, "preprocess", timed(RobustExecute, "preprocess", "execute")),
              (judge, "prepare", timed(judge, "prepare", "hand-off")),
              (judge.JudgeOutside, "preprocess", timed(judge.JudgeOutside, "preprocess", "judging"))]
    try:
        start = time.perf_counter()
        for job in jobs:
            ag.grade_student([job], str(root), str(folder / "work" / job.student_id), settings)
        spent["total"] = time.perf_counter() - start
    finally:
        for owner, attribute, original in saved:
            setattr(owner, attribute, original)
        warm.disable()
    spent["cells"] = spent["execute"] - spent["hand-off"] - spent["kernel start"]
    spent["nbgrader and the rest"] = spent["total"] - spent["execute"] - spent["judging"]
    return {k: v / len(jobs) for k, v in spent.items() if k != "execute"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--notebooks", nargs="+", default=["02_softmax_and_context", "08_kv_cache_gqa_and_windows"])
    parser.add_argument("--plain", nargs="*", default=["02_softmax_and_context"],
                        help="notebooks also graded with plain nbgrader autograde")
    parser.add_argument("--breakdown", type=int, default=3, help="notebooks per part-by-part timing (0: none)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at the start", flush=True)

    rows = []
    clock = CpuClock()
    with tempfile.TemporaryDirectory(prefix="bench-grader-") as tmp:
        for name in args.notebooks:
            subs = make_class(Path(tmp), name, args.students)
            found, cpu_found = {}, {}
            for mode in ["warm", "cold"] + (["plain"] if name in args.plain else []):
                cpu_start = clock.seconds()
                serial = None
                if mode == "plain":
                    seconds = grade_plain(subs, Path(tmp) / f"plain-{name}", name, args.students)
                    workers = 1
                else:
                    seconds, *serial = grade_ours(subs, Path(tmp) / f"out-{mode}-{name}", args.workers,
                                                  mode == "cold", args.students)
                    workers = args.workers
                found[mode] = 60 * args.students / seconds
                cpu = clock.seconds() - cpu_start if cpu_start is not None else None
                row = {"notebook": name, "mode": mode, "workers": workers, "notebooks": args.students,
                       "seconds": round(seconds, 1), "per_minute": round(found[mode], 1)}
                text = (f"{name} {mode:5s} ({workers} worker{'s' if workers > 1 else ''}): {args.students} notebooks in "
                        f"{seconds:.1f} s = {found[mode]:.1f} notebooks/minute")
                if cpu is not None:
                    # What the same work would take on `workers` idle cores of this machine, at best.
                    idle = 60 * args.students / (cpu / min(workers, os.cpu_count() or 1))
                    cpu_found[mode] = idle
                    row.update(cpu_seconds=round(cpu, 1), idle_per_minute=round(idle, 1))
                    text += f"; {cpu:.1f} CPU-s ({cpu / args.students:.2f} per notebook) = {idle:.1f}/minute on idle cores"
                if serial and None not in serial:
                    # Before the first cell of any kernel (checks, intake, the course's gradebook, the grading
                    # processes and their warm parents) and after the last (merging, the CSVs, the reports).
                    row.update(startup_seconds=round(serial[0], 1), finish_seconds=round(serial[1], 1))
                    text += f"; serial start-up {serial[0]:.1f} s (run start to first cell), finish {serial[1]:.1f} s"
                row["load"] = round(os.getloadavg()[0], 1)
                text += f"; load {row['load']}"
                rows.append(row)
                print(text, flush=True)
            line = f"{name}: warm is {found['warm'] / found['cold']:.2f}x cold"
            if "plain" in found:
                line += f", {found['warm'] / found['plain']:.2f}x plain nbgrader"
            if cpu_found:
                line += f"; by CPU time: {cpu_found['warm'] / cpu_found['cold']:.2f}x cold"
                if "plain" in cpu_found:
                    line += f", {cpu_found['warm'] / cpu_found['plain']:.2f}x plain nbgrader"
            print(line, f"(load average now {os.getloadavg()[0]:.1f})", flush=True)
        if args.breakdown:
            for name in args.notebooks:
                for mode in ("warm", "cold"):
                    parts = breakdown(Path(tmp) / f"parts-{mode}-{name}", name, args.breakdown, mode == "cold")
                    rows.append({"notebook": name, "mode": mode, "breakdown": {k: round(v, 2) for k, v in parts.items()}})
                    print(f"{name} {mode}: per notebook " + ", ".join(
                        f"{k} {parts[k]:.2f} s" for k in ("kernel start", "cells", "hand-off", "judging",
                                                          "nbgrader and the rest", "total")), flush=True)
    clock.close()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
