"""Command line: ``python -m grader {build,record,release,check-release,autograde,merge,feedback}``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader import course
from grader.config import SETTINGS


def _names(args: argparse.Namespace) -> list[str] | None:
    if not args.notebooks:
        return None
    names = []
    for raw in args.notebooks:
        stem = Path(raw).stem
        matches = [n for n in course.NOTEBOOKS if n == stem or n.startswith(stem + "_")]
        if len(matches) != 1:
            raise SystemExit(f"unknown notebook {raw!r}; the course has: {', '.join(course.NOTEBOOKS)}")
        names.append(matches[0])
    return names


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


def cmd_autograde(args: argparse.Namespace) -> int:
    from grader.autograde import autograde, parse_shard

    try:
        shard = parse_shard(args.shard) if args.shard else None
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    return autograde(Path(args.submissions), Path(args.out), workers=args.workers,
                     allow_unsandboxed=args.allow_unsandboxed, cell_timeout=args.cell_timeout,
                     notebook_timeout=args.notebook_timeout, memory=int(args.memory_gb * 1024**3),
                     similarity_max_share=args.similarity_max_share, shard=shard, db_url=args.db_url)


def cmd_merge(args: argparse.Namespace) -> int:
    from grader.autograde import merge

    return merge([Path(d) for d in args.shards], Path(args.out), similarity_max_share=args.similarity_max_share,
                 db_url=args.db_url)


def cmd_feedback(args: argparse.Namespace) -> int:
    from grader.feedback import feedback

    written = feedback(Path(args.out))
    print(f"wrote {len(written)} feedback pages under {Path(args.out) / 'feedback'}")
    return 0


def similarity_and_db(p: argparse.ArgumentParser) -> None:
    """Options that ``autograde`` and ``merge`` share."""
    from grader.similarity import MAX_SHARE

    p.add_argument("--similarity-max-share", type=int, default=MAX_SHARE, metavar="N",
                   help="copy detection (similarity.csv, instructor only) ignores code found in more than N "
                        f"students' answers to an exercise, as MOSS does (default {MAX_SHARE})")
    p.add_argument("--db-url", help="the merged gradebook's database, e.g. postgresql://host/dbname, so several "
                                    "graders can use formgrader at once (default: SQLite in DIR/nbgrader)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__)
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

    p = sub.add_parser("autograde", help="grade SUBMISSIONS/<student>/<notebook>.ipynb into DIR")
    p.add_argument("submissions", help="folder with one sub-folder per student")
    p.add_argument("--out", required=True, help="output folder: grades.csv, cells.csv, reports")
    p.add_argument("--workers", type=int, default=1, help="students graded in parallel (processes)")
    p.add_argument("--allow-unsandboxed", action="store_true",
                   help="grade without the bubblewrap sandbox where it cannot run (student code gets your rights)")
    p.add_argument("--cell-timeout", type=int, default=SETTINGS.cell_timeout,
                   help=f"seconds per cell before it is interrupted (default {SETTINGS.cell_timeout})")
    p.add_argument("--notebook-timeout", type=int, default=SETTINGS.notebook_timeout,
                   help=f"seconds per notebook in all (default {SETTINGS.notebook_timeout})")
    p.add_argument("--memory-gb", type=float, default=SETTINGS.memory / 1024**3,
                   help=f"memory (address space) per student kernel, GiB (default {SETTINGS.memory / 1024**3:g})")
    p.add_argument("--shard", metavar="K/N",
                   help="grade only the K-th of N shares of the students (K from 0 to N-1; a stable hash of the "
                        "student id decides), e.g. $SLURM_ARRAY_TASK_ID/8 or $JOB_COMPLETION_INDEX/8; "
                        "put the shards together with `python -m grader merge`")
    similarity_and_db(p)
    p.set_defaults(func=cmd_autograde)

    p = sub.add_parser("merge", help="combine the --out folders of sharded autograde runs into DIR, exactly "
                                     "as one unsharded run writes it")
    p.add_argument("shards", nargs="+", help="the --out folders of the shards")
    p.add_argument("--out", required=True, help="output folder (new)")
    similarity_and_db(p)
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("feedback", help="DIR/feedback/<student>/<notebook>.html from an autograde run "
                                        "(per test: pass/fail and the check's message; hidden tests' code is never shown)")
    p.add_argument("out", help="the --out folder of `autograde`")
    p.set_defaults(func=cmd_feedback)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
