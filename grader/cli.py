"""Command line: ``python -m grader {build,record,release,check-release,autograde,merge,feedback,export,gradescope}``.

Every bad argument is one line on stderr and exit code 2 (argparse's own errors included, see
:class:`Parser`); an unexpected failure is one line and exit code 1 (``GRADER_DEBUG=1`` shows the
traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from grader import course
from grader.config import SETTINGS


class UsageError(Exception):
    """A bad argument, found after parsing: one line on stderr, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (``prog: error: ...``), exit code 2 as before."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def _memory_gb(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GiB") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a number of GiB, 0 for no cap")
    return value


def _names(args: argparse.Namespace) -> list[str] | None:
    from grader.exports import ExportError, notebook_of

    if not args.notebooks:
        return None
    try:
        return [notebook_of(raw) for raw in args.notebooks]
    except ExportError as exc:
        raise UsageError(str(exc)) from None


def _new_folder(path: str | None, option: str = "--out") -> None:
    """A UsageError when ``path`` is an existing file (a folder is wanted)."""
    if path and Path(path).exists() and not Path(path).is_dir():
        raise UsageError(f"{option} {path} is a file: give a folder")


def cmd_build(args: argparse.Namespace) -> int:
    from grader.build import build

    for path in build(_names(args), run=not args.no_execute):
        print(f"built {path.relative_to(course.repo_root())}")
    return cmd_record(args)


def cmd_record(args: argparse.Namespace) -> int:
    from grader.record import write

    for path in write(_names(args)):
        print(f"recorded {path.relative_to(course.repo_root())}")
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    from grader.edition import build_edition
    from grader.release import release

    names = _names(args)
    if args.out:
        from grader.edition import MARKER

        _new_folder(args.out)
        out = Path(args.out)
        if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists():
            raise UsageError(f"--out {out} exists and is not a student edition built by this command; "
                             "give a new folder")
    for path in release(names):
        print(f"released {path.relative_to(course.repo_root())}")
    out = build_edition(names, Path(args.out) if args.out else None)
    from grader.leaks import scan_edition

    found = scan_edition(out)
    if found:
        for leak in found:
            print(f"LEAK {leak}")
        print(f"the student edition in {out} gives answers away: do not publish it")
        return 1
    print(f"student edition: {out} (publish this folder to students; never publish the repository itself)")
    return 0


def cmd_check_release(args: argparse.Namespace) -> int:
    from grader.release import stale_notebooks

    from grader.record import stale as stale_recordings

    code = 0
    stale = stale_notebooks(_names(args))
    if stale:
        for name in stale:
            print(f"notebooks/{name}.ipynb differs from a fresh release of solutions/{name}.ipynb")
        print("run `python -m grader release` (or `make release`) and commit the result")
        code = 1
    else:
        print("notebooks/ is in sync with solutions/")
    recordings = stale_recordings(_names(args))
    for name, problem in recordings.items():
        print(f"course_utils/expected/{name}.pt is stale ({problem}): rebuild it with "
              f"`make build NOTEBOOKS={name[:2]}` (or `python -m grader record {name[:2]}`) and commit the result")
        code = 1
    if not recordings:
        print("course_utils/expected/ matches the reference and the checks")
    return code


def _export_settings(args: argparse.Namespace) -> dict | None:
    """The ``--export`` options checked before any grading: ``None`` when no export is asked for."""
    from grader.exports import ExportError, read_roster, read_titles

    if not getattr(args, "export", None):
        if args.roster or args.assignment or args.assignments:
            raise UsageError("--roster, --assignment and --assignments go with --export canvas")
        return None
    try:
        titles = read_titles(args.assignment, [Path(f) for f in args.assignments or []])
        if args.roster:
            read_roster(Path(args.roster))
    except ExportError as exc:
        raise UsageError(str(exc)) from None
    return {"titles": titles, "roster": Path(args.roster) if args.roster else None}


def _export(grading: Path, settings: dict | None, out_csv: Path | None = None) -> int:
    if settings is None:
        return 0
    from grader.exports import ExportError, export_canvas

    try:
        path, warnings = export_canvas(grading, out_csv, settings["titles"], settings["roster"])
    except ExportError as exc:
        print(exc, file=sys.stderr)
        return 2
    for line in warnings:
        print(f"canvas export: {line}", file=sys.stderr)
    print(f"Canvas gradebook: {path} (Grades -> Import in Canvas)", file=sys.stderr)
    return 0


def _check_db_url(url: str | None) -> None:
    if not url:
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        make_url(url)
    except ArgumentError:
        raise UsageError(f"--db-url {url!r} is not a database address (e.g. postgresql://host/dbname)") from None


def cmd_autograde(args: argparse.Namespace) -> int:
    from grader.autograde import autograde, parse_shard

    try:
        shard = parse_shard(args.shard) if args.shard else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    _check_db_url(args.db_url)
    export = _export_settings(args)
    code = autograde(Path(args.submissions), Path(args.out), workers=args.workers,
                     allow_unsandboxed=args.allow_unsandboxed, cell_timeout=args.cell_timeout,
                     notebook_timeout=args.notebook_timeout, memory=int(args.memory_gb * 1024**3),
                     similarity_max_share=args.similarity_max_share, shard=shard, db_url=args.db_url,
                     layout=args.layout, cold_kernels=args.cold_kernels)
    if code == 2:
        return code
    return max(code, _export(Path(args.out), export))


def cmd_merge(args: argparse.Namespace) -> int:
    from grader.autograde import merge

    _new_folder(args.out)
    _check_db_url(args.db_url)
    export = _export_settings(args)
    code = merge([Path(d) for d in args.shards], Path(args.out), similarity_max_share=args.similarity_max_share,
                 db_url=args.db_url)
    if code == 2:
        return code
    return max(code, _export(Path(args.out), export))


def cmd_feedback(args: argparse.Namespace) -> int:
    from grader.feedback import feedback

    if not (Path(args.out) / "results.json").is_file():
        raise UsageError(f"{Path(args.out) / 'results.json'} not found: give the --out folder of "
                         "`python -m grader autograde`")
    written = feedback(Path(args.out))
    print(f"wrote {len(written)} feedback pages under {Path(args.out) / 'feedback'}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if not (Path(args.grading) / "grades.csv").is_file():
        raise UsageError(f"{Path(args.grading) / 'grades.csv'} not found: give the --out folder of "
                         "`python -m grader autograde` (or merge)")
    if args.out and Path(args.out).is_dir():
        raise UsageError(f"--out {args.out} is a folder: give the CSV file to write")
    return _export(Path(args.grading), _export_settings(args), Path(args.out) if args.out else None)


def cmd_gradescope(args: argparse.Namespace) -> int:
    from grader.gradescope import build_autograder

    names = _names(argparse.Namespace(notebooks=[args.notebook]))
    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder: give the .zip file to write (e.g. autograder.zip)")
    if out.suffix.lower() != ".zip":
        raise UsageError(f"--out {out}: Gradescope takes a .zip (e.g. autograder.zip)")
    if names[0] not in course.available_notebooks() or not (course.solutions_dir() / f"{names[0]}.ipynb").exists():
        raise UsageError(f"{names[0]} is not built yet: run `python -m grader build {names[0][:2]}` first")
    path = build_autograder(names[0], out, args.time_limit)
    print(f"wrote {path}: upload it as the autograder of a Gradescope programming assignment "
          "(students hand in the .ipynb)", file=sys.stderr)
    return 0


def similarity_and_db(p: argparse.ArgumentParser) -> None:
    """Options that ``autograde`` and ``merge`` share."""
    from grader.similarity import MAX_SHARE

    p.add_argument("--similarity-max-share", type=_positive_int, default=MAX_SHARE, metavar="N",
                   help="copy detection (similarity.csv, instructor only) ignores code found in more than N "
                        f"students' answers to an exercise, as MOSS does (default {MAX_SHARE})")
    p.add_argument("--db-url", help="the merged gradebook's database, e.g. postgresql://host/dbname, so several "
                                    "graders can use formgrader at once (default: SQLite in DIR/nbgrader)")


def export_options(p: argparse.ArgumentParser, flag: bool = True) -> None:
    """The Canvas export's options (``autograde``, ``merge`` and ``export``)."""
    if flag:
        p.add_argument("--export", choices=["canvas"],
                       help="also write DIR/canvas.csv, the gradebook CSV that Canvas imports (a view of grades.csv)")
    p.add_argument("--roster", metavar="CSV",
                   help="Canvas's gradebook export (or a CSV with Student, ID, SIS User ID, SIS Login ID, Section): "
                        "fills those columns and matches students by any of the three ids")
    p.add_argument("--assignment", action="append", metavar="NN=TITLE",
                   help="the Canvas assignment of a notebook, as its column is titled in Canvas's export, e.g. "
                        "01=\"01 Dot products (12345)\" (repeat for each notebook)")
    p.add_argument("--assignments", action="append", metavar="CSV",
                   help="the same from a file: one line notebook,title per notebook")


def build_parser() -> argparse.ArgumentParser:
    from grader.lms import LAYOUTS

    parser = Parser(prog="python -m grader",
                    description="Build and release the course's notebooks; grade a class (from student folders or "
                                "a Canvas, Moodle or nbgrader download), merge shards, write feedback pages, export "
                                "grades to Canvas, and build a Gradescope autograder.",
                    epilog="A bad argument is one line on stderr and exit code 2; GRADER_DEBUG=1 shows the "
                           "traceback of an unexpected error.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="solutions/src/*.py -> solutions/*.ipynb, executed top to bottom")
    p.add_argument("notebooks", nargs="*", help="notebook names (default: all)")
    p.add_argument("--no-execute", action="store_true", help="write the notebooks without running them")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("record", help="record the expected values of the visible checks into course_utils/expected/")
    p.add_argument("notebooks", nargs="*")
    p.set_defaults(func=cmd_record)

    p = sub.add_parser("release", help="solutions/ -> notebooks/ (student versions, via nbgrader), then the "
                                       "student edition in release/")
    p.add_argument("notebooks", nargs="*", help="the notebooks released so far (default: all)")
    p.add_argument("--out", help="folder of the student edition (default: release/)")
    p.set_defaults(func=cmd_release)

    p = sub.add_parser("check-release", help="exit 1 and name the file if notebooks/ is stale")
    p.add_argument("notebooks", nargs="*")
    p.set_defaults(func=cmd_check_release)

    p = sub.add_parser("autograde", help="grade SUBMISSIONS/<student>/<notebook>.ipynb (or an LMS download) into DIR")
    p.add_argument("submissions", help="folder with one sub-folder per student, or a Canvas, Moodle or nbgrader "
                                       "download (.zip or unpacked)")
    p.add_argument("--out", required=True, help="output folder: grades.csv, cells.csv, reports")
    p.add_argument("--layout", choices=["auto", *LAYOUTS], default="auto",
                   help="how SUBMISSIONS is laid out (default: recognised from the file names); an LMS download "
                        "is copied into DIR/intake/<student_id>/ first")
    p.add_argument("--workers", type=_positive_int, default=1, help="students graded in parallel (processes)")
    p.add_argument("--allow-unsandboxed", action="store_true",
                   help="grade without the bubblewrap sandbox where it cannot run (student code gets your rights)")
    p.add_argument("--cold-kernels", action="store_true",
                   help="start every kernel afresh (about 3 s of imports each) instead of forking it from a warm, "
                        "pre-imported parent in the sandbox")
    p.add_argument("--cell-timeout", type=_positive_int, default=SETTINGS.cell_timeout,
                   help=f"seconds per cell before it is interrupted (default {SETTINGS.cell_timeout})")
    p.add_argument("--notebook-timeout", type=_positive_int, default=SETTINGS.notebook_timeout,
                   help=f"seconds per notebook in all (default {SETTINGS.notebook_timeout})")
    p.add_argument("--memory-gb", type=_memory_gb, default=SETTINGS.memory / 1024**3,
                   help=f"memory (address space) per student kernel, GiB, 0 for no cap "
                        f"(default {SETTINGS.memory / 1024**3:g})")
    p.add_argument("--shard", metavar="K/N",
                   help="grade only the K-th of N shares of the students (K from 0 to N-1; a stable hash of the "
                        "student id decides), e.g. $SLURM_ARRAY_TASK_ID/8 or $JOB_COMPLETION_INDEX/8; "
                        "put the shards together with `python -m grader merge`")
    similarity_and_db(p)
    export_options(p)
    p.set_defaults(func=cmd_autograde)

    p = sub.add_parser("merge", help="combine the --out folders of sharded autograde runs into DIR, exactly "
                                     "as one unsharded run writes it")
    p.add_argument("shards", nargs="+", help="the --out folders of the shards")
    p.add_argument("--out", required=True, help="output folder (new)")
    similarity_and_db(p)
    export_options(p)
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("feedback", help="DIR/feedback/<student>/<notebook>.html from an autograde run "
                                        "(per test: pass/fail and the check's message; hidden tests' code is never shown)")
    p.add_argument("out", help="the --out folder of `autograde`")
    p.set_defaults(func=cmd_feedback)

    p = sub.add_parser("export", help="write DIR/grades.csv as an LMS gradebook to import (canvas)")
    p.add_argument("to", choices=["canvas"], help="the LMS")
    p.add_argument("grading", help="the --out folder of `autograde` or `merge`")
    p.add_argument("--out", help="the CSV to write (default: GRADING/canvas.csv)")
    export_options(p, flag=False)
    p.set_defaults(func=cmd_export, export="canvas")

    p = sub.add_parser("gradescope", help="a Gradescope autograder (.zip) for one notebook: setup.sh, "
                                          "run_autograder and the course's grader")
    p.add_argument("notebook", help="the notebook, e.g. 01 or 01_dot_products")
    p.add_argument("--out", required=True, help="the .zip to write, e.g. autograder.zip")
    p.add_argument("--time-limit", type=_positive_int, default=None,
                   help="seconds the notebook may run on Gradescope (default 420, under its 10 minutes)")
    p.set_defaults(func=cmd_gradescope)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{parser.prog} {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one line for the instructor, the traceback on request
        if os.environ.get("GRADER_DEBUG"):
            raise
        print(f"{parser.prog} {args.command}: error: {type(exc).__name__}: {exc} "
              "(run with GRADER_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
