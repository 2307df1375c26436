"""LMS downloads in, Canvas gradebook out.

Canvas, Moodle and nbgrader downloads (``tests/fixtures/lms.py``, built from each LMS's documented
naming) are laid out as ``SUBMISSIONS/<student_id>/<file>`` and taken in without grading: every
file gets a row or a job, nothing is dropped, the originals are never written. One Canvas download
is graded end to end (one notebook through nbgrader), and its Canvas gradebook export checked
with and without a roster.
"""

from __future__ import annotations

import csv
import hashlib
import zipfile
from pathlib import Path

import pytest

from grader import course, exports, lms
from grader.autograde import Job, take_in
from grader.cli import main
from tests.fixtures import lms as downloads
from tests.fixtures import submissions as cases

pytestmark = pytest.mark.skipif(cases.NB not in course.available_notebooks(), reason="notebook 01 is not built")

BUILDERS = {"canvas": downloads.canvas, "moodle": downloads.moodle, "nbgrader": downloads.nbgrader_exchange}


def _names() -> list[str]:
    return [n for n in course.available_notebooks() if (course.solutions_dir() / f"{n}.ipynb").exists()]


def _digest(path: Path) -> dict[str, str]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _take(download: Path, view_root: Path, layout: str = "auto"):
    view = lms.open_download(download, view_root, layout)
    taken, _ = take_in(view.root, _names(), None, view)
    return view, {t.file: t for t in taken}


@pytest.mark.parametrize("layout", sorted(BUILDERS))
@pytest.mark.parametrize("form", ["as downloaded", "unpacked"])
def test_each_layout_is_recognised_and_every_file_gets_a_row(layout, form, tmp_path):
    download, expected = BUILDERS[layout](tmp_path / "lms")
    if form == "unpacked" and download.suffix == ".zip":
        download = downloads.unpack(download, tmp_path / "unpacked")
    before = _digest(download)
    view, taken = _take(download, tmp_path / "view")
    assert view.layout == layout
    assert set(taken) == {row.file for row in expected}, "every file of the download, and only those, has a row"
    for row in expected:
        got = taken[row.file]
        assert got.student_id == row.student_id, row.file
        status = "; ".join(got.notes) if isinstance(got, Job) else got.status
        assert isinstance(got, Job) == row.graded, (row.file, status)
        for word in row.status:
            if not (row.graded and word == "ok"):
                assert word in status, (row.file, status)
    assert _digest(download) == before, "the download itself is never written"
    forced = lms.open_download(download, tmp_path / "forced", layout)
    assert {k: (v.origin, v.student_id) for k, v in forced.files.items()} == \
           {k: (v.origin, v.student_id) for k, v in view.files.items()}


def test_canvas_names_as_canvas_writes_them():
    """``ContentZipper#get_filename``: ``<name>[_LATE]_<user id>_<attachment id>_<display name>``."""
    place = lms.place_canvas
    p = place("smithbob_1001_5001_01_dot_products.ipynb")
    assert (p.student_id, p.target, p.name, p.late, p.notes) == ("1001", "5001/01_dot_products.ipynb", "smithbob", "no", [])
    p = place("lovelaceada_LATE_1002_5010_01_dot_products-2.ipynb")
    assert (p.student_id, p.target, p.late) == ("1002", "5010/01_dot_products.ipynb", "yes")
    assert p.notes == ["uploaded to Canvas as 01_dot_products-2.ipynb (a file of that name was handed in before)"]
    p = place("o_brienpat_77_88_hw_1_2_3.ipynb")  # underscores in the name and in the file name
    assert (p.name, p.student_id, p.target) == ("o_brienpat", "77", "88/hw_1_2_3.ipynb")
    p = place("LATE_anon_Xk3q_901_notebook.ipynb")  # anonymous grading: no name, the anonymous id
    assert (p.student_id, p.target, p.late) == ("anon_Xk3q", "901/notebook.ipynb", "yes")
    p = place("smithbob_1001_text.html")
    assert p.student_id == "1001" and "text entry" in p.notes[0]
    for stray in ("readme.txt", "folder/smithbob_1001_5001_x.ipynb", "smithbob_x_y_z.ipynb"):
        assert not place(stray).student_id and place(stray).why, stray


def test_canvas_takes_the_later_upload_whatever_the_zip_times(tmp_path):
    """Canvas zips every file with one time; the larger attachment id is the later upload."""
    zip_path = downloads.write_zip(tmp_path / "c.zip", {
        f"bob_1_900_{cases.NB}-1.ipynb": downloads.no_code(),
        f"bob_1_100_{cases.NB}.ipynb": downloads.notebook_bytes(cases.filled())})
    _, taken = _take(zip_path, tmp_path / "view")
    assert list(taken) == [f"bob_1_900_{cases.NB}-1.ipynb"]
    assert f"newest of 2 files graded (ignored: bob_1_100_{cases.NB}.ipynb)" in taken[f"bob_1_900_{cases.NB}-1.ipynb"].status


def test_the_grader_s_own_folders_are_read_where_they_are(tmp_path):
    """A class in SUBMISSIONS/<student>/ (the messy fixture class) is not copied, whatever its files are called."""
    subs = tmp_path / "submissions"
    cases.build(subs, {"solution": "", "other_student": "", "gradebook_dir": "", "decoy": "", "submissions": str(subs),
                       "out": ""})
    view = lms.open_download(subs, tmp_path / "view")
    assert (view.layout, view.root, view.files) == ("folders", subs, {})
    assert not (tmp_path / "view").exists()


def test_a_zipped_submissions_folder_is_unpacked_into_the_view(tmp_path):
    zip_path = downloads.write_zip(tmp_path / "subs.zip", {
        f"submissions/ada/{cases.NB}.ipynb": downloads.no_code(),
        f"submissions/bob/work/{cases.NB}.ipynb": downloads.no_code()})
    view, taken = _take(zip_path, tmp_path / "view")
    assert view.layout == "folders"
    assert {t.student_id for t in taken.values()} == {"ada", "bob"}


def test_nothing_leaves_the_view_and_nothing_is_dropped(tmp_path, monkeypatch):
    """Members named ``../x`` or ``/x``, and files over the size cap, become rows; none is written
    outside the view."""
    monkeypatch.setattr(lms, "MAX_FILE", 1000)
    zip_path = downloads.write_zip(tmp_path / "evil.zip", {
        f"../escaped/{cases.NB}.ipynb": downloads.no_code(),
        f"/abs/{cases.NB}.ipynb": downloads.no_code(),
        f"ada/{cases.NB}.ipynb": downloads.no_code(),
        f"bob/{cases.NB}.ipynb": b" " * 5000})
    view, taken = _take(zip_path, tmp_path / "inside" / "view", "folders")
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "inside" / "escaped").exists()
    assert all(p.resolve().is_relative_to((tmp_path / "inside" / "view").resolve())
               for p in (tmp_path / "inside").rglob("*"))
    assert len(taken) == 4
    assert "unsafe path" in taken[f"../escaped/{cases.NB}.ipynb"].status
    assert "file too large" in taken[f"bob/{cases.NB}.ipynb"].status


def test_a_forced_layout_that_does_not_fit_explains_nothing_but_keeps_every_row(tmp_path):
    download, expected = downloads.canvas(tmp_path)
    view, taken = _take(download, tmp_path / "view", "moodle")
    assert view.layout == "moodle" and len(taken) == len(expected) + 1  # the older upload is a row too now
    assert all(not t.student_id and "Moodle layout does not explain" in t.status for t in taken.values())


def test_a_broken_download_is_one_line(tmp_path):
    bad = tmp_path / "submissions.zip"
    bad.write_bytes(b"this is not a zip")
    with pytest.raises(lms.DownloadError, match="not a readable zip"):
        lms.open_download(bad, tmp_path / "view")


# ---------------------------------------------------------------------------------------------
# One Canvas download graded end to end, and exported back to Canvas


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def canvas_graded(tmp_path_factory):
    """``python -m grader autograde <canvas zip> --export canvas``: one notebook graded."""
    base = tmp_path_factory.mktemp("canvas")
    download, expected = downloads.canvas(base)
    out = base / "grading"
    code = main(["autograde", str(download), "--out", str(out), "--export", "canvas",
                 "--assignment", "01=01 Dot products (12345)", "--cell-timeout", "30", "--notebook-timeout", "120"])
    return {"code": code, "out": out, "expected": expected, "base": base}


def test_a_canvas_download_is_graded_with_ids_names_and_lateness(canvas_graded):
    assert canvas_graded["code"] == 0
    grades = {r["file"]: r for r in _rows(canvas_graded["out"] / "grades.csv")}
    assert set(grades) == {row.file for row in canvas_graded["expected"]}
    for row in canvas_graded["expected"]:
        got = grades[row.file]
        assert (got["student_id"], got["late"], got["student_name"]) == (row.student_id, row.late, row.name), got
        for word in row.status:
            assert word in got["status"], (row.file, got["status"])
    bob = grades[f"smithbob_1001_5001_{cases.NB}.ipynb"]
    assert (bob["notebook"], float(bob["score"]), float(bob["max_score"])) == (cases.NB, cases.FULL, cases.FULL)
    assert (canvas_graded["out"] / "intake" / "1001").is_dir(), "the view the grader read is kept beside the grades"


def test_the_canvas_export_is_a_view_of_grades_csv(canvas_graded):
    with open(canvas_graded["out"] / "canvas.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "01 Dot products (12345)"]
    assert rows[1] == ["    Points Possible", "", "", "", "", "7"]
    assert rows[2:] == [["smithbob", "1001", "", "", "", "7"], ["lovelaceada", "1002", "", "", "", "0"]]


def test_the_canvas_export_matches_a_roster(canvas_graded, tmp_path, capsys):
    roster = downloads.roster(tmp_path / "roster.csv")
    titles = tmp_path / "titles.csv"
    titles.write_text("notebook,title\n01_dot_products,01 Dot products (12345)\n")
    target = tmp_path / "to_canvas.csv"
    assert main(["export", "canvas", str(canvas_graded["out"]), "--roster", str(roster), "--assignments", str(titles),
                 "--out", str(target)]) == 0
    with open(target, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[1][0] == "    Points Possible"
    assert rows[2:] == [["Smith, Bob", "1001", "S-1001", "bsmith", "Section A", "7"],
                        ["Lovelace, Ada", "1002", "S-1002", "alovelace", "Section B", "0"],
                        ["Young, Cy", "1003", "S-1003", "cyoung", "Section A", ""]]  # no submission: unchanged


def test_the_export_matches_sis_logins_and_names_the_students_it_cannot_place():
    grades = [{"student_id": "bsmith", "notebook": cases.NB, "score": "5", "max_score": "7", "student_name": ""},
              {"student_id": "ghost", "notebook": cases.NB, "score": "7", "max_score": "7", "student_name": ""},
              {"student_id": "", "notebook": "notes.txt", "score": "0", "max_score": "0", "student_name": ""}]
    roster = [{"Student": "Smith, Bob", "ID": "1001", "SIS User ID": "", "SIS Login ID": "bsmith", "Section": ""}]
    rows, warnings = exports.canvas_rows(grades, {}, roster)
    assert rows[0][-1] == cases.NB and rows[2] == ["Smith, Bob", "1001", "", "bsmith", "", "5"]
    assert len(rows) == 3
    assert any("no Canvas assignment title for 01_dot_products" in w for w in warnings)
    assert any("not in the roster" in w and "ghost" in w for w in warnings)
    _, warnings = exports.canvas_rows(grades, {cases.NB: "T (1)"})
    assert any("not Canvas user ids" in w and "bsmith" in w for w in warnings)


def test_the_file_column_names_files_of_the_download(canvas_graded):
    """grades.csv's file column names files of the download itself, so an instructor finds them."""
    with zipfile.ZipFile(next(canvas_graded["base"].glob("*.zip"))) as z:
        names = set(z.namelist())
    assert {r["file"] for r in _rows(canvas_graded["out"] / "grades.csv")} <= names


def test_a_download_cut_into_shards_merges_into_one_run(tmp_path):
    """``--shard`` works on the students of a download as on folders (Moodle's participant ids here;
    nothing in it needs grading): the merged shards equal one run, names and all."""
    from grader.autograde import autograde, merge

    download, _ = downloads.moodle(tmp_path)
    limits = dict(allow_unsandboxed=True, progress=False)
    assert autograde(download, tmp_path / "single", **limits) == 0
    for k in (0, 1):
        assert autograde(download, tmp_path / f"shard{k}", shard=(k, 2), **limits) == 0
    assert merge([tmp_path / "shard0", tmp_path / "shard1"], tmp_path / "merged") == 0
    for name in ("grades.csv", "results.json"):
        assert (tmp_path / "merged" / name).read_text() == (tmp_path / "single" / name).read_text(), name
    names = {r["student_id"]: r["student_name"] for r in _rows(tmp_path / "merged" / "grades.csv")}
    assert names == {"31": "Ada Lovelace", "32": "Bob Smith", "33": "Cy Young", "": ""}
