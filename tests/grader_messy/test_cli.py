"""The command line never crashes: every subcommand answers ``--help``, every bad argument is one
line on stderr and exit code 2, and an empty class or an empty shard is a valid, empty result
(the CSVs with their headers, an empty gradebook) that ``merge`` takes. Nothing here grades a
notebook, so the whole file runs in seconds."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from grader import course
from grader.autograde import GRADES_COLUMNS, autograde, shard_of
from grader.cli import build_parser, main
from grader.config import SETTINGS, gradebook_url


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``python -m grader ARGV`` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    out, err = capsys.readouterr()
    return code, out, err


def subcommands() -> list[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)


def test_the_commands_the_docs_name_all_exist():
    assert {"build", "record", "release", "check-release", "autograde", "merge", "feedback", "export",
            "gradescope"} <= set(subcommands())


@pytest.mark.parametrize("command", subcommands())
def test_every_subcommand_answers_help(command, capsys):
    code, out, err = run_cli([command, "--help"], capsys)
    assert code == 0, err
    assert out.startswith(f"usage: python -m grader {command}")


@pytest.mark.parametrize("command", subcommands())
def test_every_subcommand_refuses_an_unknown_option_in_one_line(command, capsys):
    code, out, err = run_cli([command, "--no-such-option"], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("python -m grader") and "error:" in err  # the option, or a missing argument first
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def done(tmp_path_factory) -> Path:
    """The output of grading an empty class (one run for the module: a new nbgrader gradebook
    costs seconds, most of it nbgrader asking alembic for its schema version)."""
    empty = tmp_path_factory.mktemp("empty_class")
    out = tmp_path_factory.mktemp("graded") / "done"
    assert autograde(empty, out, allow_unsandboxed=True, progress=False) == 0
    return out


@pytest.fixture
def places(tmp_path, done):
    """An empty submissions folder, a file, a graded-nothing output folder and a missing path."""
    empty = tmp_path / "empty"
    empty.mkdir()
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("x")
    return {"empty": empty, "file": a_file, "done": done, "missing": tmp_path / "missing", "out": tmp_path / "out",
            "tmp": tmp_path}


#: (argument list with {placeholders}, words the one error line must contain).
BAD = [
    ([], "required: command"),
    (["no-such-command"], "invalid choice"),
    (["build", "99"], "unknown notebook '99'"),
    (["record", "xx"], "unknown notebook 'xx'"),
    (["release", "99"], "unknown notebook"),
    (["release", "--out", "{file}"], "is a file"),
    (["release", "--out", "{done}"], "is not a student edition"),
    (["check-release", "99"], "unknown notebook"),
    (["autograde", "{missing}", "--out", "{out}"], "does not exist"),
    (["autograde", "{file}", "--out", "{out}"], "not a .zip"),
    (["autograde", "{empty}", "--out", "{file}"], "is a file"),
    (["autograde", "{empty}", "--out", "{empty}/inside"], "must not be inside the submissions"),
    (["autograde", "{empty}", "--out", "{tmp}"], "must not be inside --out"),
    (["autograde", "{empty}"], "required: --out"),
    (["autograde", "{empty}", "--out", "{out}", "--workers", "0"], "--workers: 0 must be at least 1"),
    (["autograde", "{empty}", "--out", "{out}", "--workers", "-3"], "--workers: -3 must be at least 1"),
    (["autograde", "{empty}", "--out", "{out}", "--workers", "two"], "not a whole number"),
    (["autograde", "{empty}", "--out", "{out}", "--shard", "x"], "--shard 'x': write K/N"),
    (["autograde", "{empty}", "--out", "{out}", "--shard", "3/3"], "K must be 0 to N-1"),
    (["autograde", "{empty}", "--out", "{out}", "--cell-timeout", "0"], "--cell-timeout"),
    (["autograde", "{empty}", "--out", "{out}", "--notebook-timeout", "-1"], "--notebook-timeout"),
    (["autograde", "{empty}", "--out", "{out}", "--memory-gb", "-1"], "--memory-gb"),
    (["autograde", "{empty}", "--out", "{out}", "--memory-gb", "nan"], "--memory-gb"),
    (["autograde", "{empty}", "--out", "{out}", "--similarity-max-share", "0"], "--similarity-max-share"),
    (["autograde", "{empty}", "--out", "{out}", "--layout", "blackboard"], "invalid choice: 'blackboard'"),
    (["autograde", "{empty}", "--out", "{out}", "--db-url", "not a database"], "is not a database address"),
    (["autograde", "{empty}", "--out", "{out}", "--roster", "{file}"], "go with --export canvas"),
    (["autograde", "{empty}", "--out", "{out}", "--export", "moodle"], "invalid choice: 'moodle'"),
    (["autograde", "{empty}", "--out", "{out}", "--export", "canvas", "--assignment", "99=x"], "unknown notebook"),
    (["autograde", "{empty}", "--out", "{out}", "--export", "canvas", "--assignment", "01"], "write NN=TITLE"),
    (["autograde", "{empty}", "--out", "{out}", "--export", "canvas", "--roster", "{missing}"], "no such file"),
    (["autograde", "{empty}", "--out", "{out}", "--export", "canvas", "--roster", "{file}"], "no ID, SIS User ID"),
    (["merge", "{missing}", "--out", "{out}"], "no results.json"),
    (["merge", "{done}", "--out", "{file}"], "is a file"),
    (["merge", "{done}", "--out", "{done}"], "not one of the shards"),
    (["merge", "--out", "{out}"], "required: shards"),
    (["feedback", "{missing}"], "results.json not found"),
    (["export", "canvas", "{missing}"], "grades.csv not found"),
    (["export", "blackboard", "{done}"], "invalid choice"),
    (["export", "canvas", "{done}", "--out", "{done}"], "is a folder"),
    (["export", "canvas", "{done}", "--assignments", "{missing}"], "no such file"),
    (["gradescope", "99", "--out", "{out}.zip"], "unknown notebook"),
    (["gradescope", "01", "--out", "{out}.txt"], "Gradescope takes a .zip"),
    (["gradescope", "01", "--out", "{done}"], "is a folder"),
]


@pytest.mark.parametrize("argv, words", BAD, ids=[" ".join(a) or "(nothing)" for a, _ in BAD])
def test_a_bad_argument_is_one_line_and_exit_2(argv, words, places, capsys):
    code, out, err = run_cli([a.format(**places) for a in argv], capsys)
    assert code == 2, (code, err)
    assert len(err.strip().splitlines()) == 1, err
    assert words in err and "Traceback" not in err, err
    assert not places["out"].exists(), "a refused command must not start writing"


def test_a_refused_command_from_the_shell_is_one_line_without_traceback(tmp_path):
    """The real entry point, ``python -m grader``, as an instructor types it."""
    proc = subprocess.run([sys.executable, "-m", "grader", "autograde", str(tmp_path / "nope"), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                          cwd=course.repo_root())
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "does not exist" in proc.stderr, proc.stderr


def _csv(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def _students(out: Path) -> list[str]:
    with Gradebook(gradebook_url(out / "nbgrader"), SETTINGS.course_id) as gb:
        return [s.id for s in gb.students]


def test_an_empty_class_is_an_empty_result(done, capsys):
    assert _csv(done / "grades.csv") == [GRADES_COLUMNS]
    assert _csv(done / "cells.csv")[0][:5] == ["student_id", "notebook", "grade_id", "score", "max_score"]
    assert len(_csv(done / "cells.csv")) == 1 and len(_csv(done / "similarity.csv")) == 1
    assert json.loads((done / "results.json").read_text()) == []
    assert _students(done) == [], "the gradebook opens, with nobody in it"
    code, out, err = run_cli(["feedback", done], capsys)
    assert code == 0 and "wrote 0 feedback pages" in out, err


def test_a_shard_that_receives_no_student_succeeds_and_merge_takes_it(tmp_path, done, capsys):
    """One student, two shards: the shard without the student writes an empty result and exits 0
    (a Slurm array does not fail), and the merge of both shards and of an empty class holds the
    student's row and nothing else. The student's file is not a notebook, so nothing is graded."""
    subs = tmp_path / "subs"
    (subs / "solo").mkdir(parents=True)
    (subs / "solo" / "essay.txt").write_text("I wrote my answers in a text file")
    home = shard_of("solo", 2)
    for k in (0, 1):
        code, _, err = run_cli(["autograde", subs, "--out", tmp_path / f"shard{k}", "--shard", f"{k}/2",
                                "--allow-unsandboxed"], capsys)
        assert code == 0, err
        rows = _csv(tmp_path / f"shard{k}" / "grades.csv")
        assert len(rows) == (2 if k == home else 1), rows
    assert _students(tmp_path / f"shard{1 - home}") == []
    code, _, err = run_cli(["merge", tmp_path / "shard0", tmp_path / "shard1", done, "--out", tmp_path / "all"],
                           capsys)
    assert code == 0, err
    rows = _csv(tmp_path / "all" / "grades.csv")
    assert rows == _csv(tmp_path / f"shard{home}" / "grades.csv")
    assert rows[1][:2] == ["solo", "essay.txt"] and "not a notebook (.txt file)" in rows[1][4]
    assert _students(tmp_path / "all") == []  # nothing graded, nothing in the gradebook


def test_the_library_call_refuses_as_the_command_does(tmp_path, capsys):
    """``autograde()`` itself (what the tests and scripts call) checks its paths before any work."""
    (tmp_path / "file").write_text("x")
    assert autograde(tmp_path / "missing", tmp_path / "out", progress=False) == 2
    assert autograde(tmp_path, tmp_path / "file", progress=False) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "is a file" in err and not (tmp_path / "out").exists()


def test_an_unexpected_failure_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    """A bug or a broken environment is still one line (``GRADER_DEBUG=1`` shows the traceback)."""
    from grader import autograde as ag

    def broken(*args, **kwargs):
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(ag, "autograde", broken)
    (tmp_path / "subs").mkdir()
    code, _, err = run_cli(["autograde", tmp_path / "subs", "--out", tmp_path / "out"], capsys)
    assert code == 1 and err.strip() == ("python -m grader autograde: error: RuntimeError: the disk is full "
                                         "(run with GRADER_DEBUG=1 for the traceback)")
    monkeypatch.setenv("GRADER_DEBUG", "1")
    with pytest.raises(RuntimeError):
        main(["autograde", str(tmp_path / "subs"), "--out", str(tmp_path / "out")])
