"""LMS downloads in: a Canvas, Moodle or nbgrader download laid out as ``SUBMISSIONS/<student_id>/<file>``.

The grader takes one folder per student (:mod:`grader.intake`). A learning management system gives
something else; :func:`open_download` turns it into that view, as **copies** (the download itself,
a ``.zip`` or the folder it was unpacked into, is only read), and says for every file where it came
from, whose it is, whether it was late and what the layout says about it. Which course notebook a
file is stays :mod:`grader.intake`'s business (by name, else by content), so an original file name
such as ``Copy of 01_dot_products (1).ipynb`` or ``homework.ipynb`` is recognised as it is today.

Layouts (``--layout``; ``auto`` picks the one that explains most of the files):

``canvas``
    "Download Submissions" of an assignment: every file at the top of the zip, named
    ``<name>[_LATE]_<user id>_<attachment id>_<original file name>``. Read from Canvas's own code,
    ``lib/content_zipper.rb`` of instructure/canvas-lms (``ContentZipper#get_filename`` and
    ``#add_upload_submission``): the name is the sortable name lower-cased with every character
    that is not a word character removed (``"Smith, Bob"`` -> ``smithbob``; Canvas also removes
    ``_<digits>_`` from names, so the first ``_<digits>_<digits>_`` ends the name), ``LATE`` marks a
    late submission, the user id is ``anon_<id>`` under anonymous grading, and text entries and
    URLs come as ``<name>_<user id>_text.html`` and ``..._link.html``. A file uploaded again under
    the same name gets ``-1``, ``-2`` before its extension (Canvas keeps names unique in the
    student's files): that suffix is taken off and noted, and of two files of one student for one
    notebook the later upload (the larger attachment id) counts. The student id is the Canvas user
    id; ``late`` is ``yes`` or ``no``.
``moodle``
    "Download all submissions": ``<Full Name>_<participant id>_assignsubmission_file_/<file>`` (with
    "Download submissions in folders") or ``<Full Name>_<participant id>_assignsubmission_file_<file>``
    (without). The pattern is the one Moodle's own tests use for the feedback-zip importer
    (``mod/assign/feedback/file/tests/importziplib_test.php``). The student id is Moodle's
    participant id; online text comes as ``..._assignsubmission_onlinetext_/onlinetext.html``.
``nbgrader``
    nbgrader's exchange layout, what ``nbgrader collect`` and ``zipcollect`` fill:
    ``submitted/<student>/<assignment>/<files>`` with nbgrader's ``timestamp.txt`` (noted, not graded).
    Given an nbgrader course folder, only its ``submitted/`` is read.
``folders``
    The grader's own ``SUBMISSIONS/<student_id>/<file>``. A folder in this layout is graded where it
    is, as always; a ``.zip`` of it is unpacked into the view.

A file that the layout does not explain (a stray file, a name that does not follow the pattern, a
path that leaves the zip, a file over :data:`MAX_FILE`) is placed at the top of the view, outside
every student folder, and its row in ``grades.csv`` says why: nothing is dropped silently. Hidden
files, ``__MACOSX`` and ``.ipynb_checkpoints`` are skipped, as :mod:`grader.intake` skips them.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable

from grader import intake
from grader.config import safe_name

LAYOUTS = ("canvas", "moodle", "nbgrader", "folders")
#: Largest file copied out of a download, bytes (a notebook is well under 10 MB).
MAX_FILE = 64 * 1024**2

CANVAS_FILE = re.compile(
    r"^(?:(?P<name>.*?)_)??(?:(?P<late>LATE)_)?(?P<uid>anon_[A-Za-z0-9]+|\d+)_(?P<fid>\d+)_(?P<orig>.+)$", re.S)
CANVAS_ONLINE = re.compile(r"^(?:(?P<name>.*?)_)??(?:(?P<late>LATE)_)?(?P<uid>anon_[A-Za-z0-9]+|\d+)_"
                           r"(?P<kind>text|link)\.html$", re.S)
CANVAS_RESUBMITTED = re.compile(r"^(?P<stem>.+?)-(?P<n>\d{1,3})(?P<ext>\.[A-Za-z0-9]+)?$")
MOODLE_PREFIX = re.compile(r"^(?P<name>.+?)_(?P<pid>\d+)_assignsubmission_(?P<plugin>[a-z0-9]+)_(?P<rest>.*)$", re.S)


class DownloadError(Exception):
    """The download cannot be read at all (the message says why, in one line)."""


@dataclass
class Entry:
    """One file of the download: its path there (``/``-separated) and how to read it."""

    path: str
    size: int
    mtime: float
    read: Callable[[], bytes]


@dataclass
class Placed:
    """What a layout makes of one file: whose it is and where it goes under the student's folder,
    or (``student_id`` empty) why the layout does not explain it."""

    student_id: str = ""
    target: str = ""
    name: str = ""
    late: str = ""
    notes: list[str] = field(default_factory=list)
    why: str = ""
    order: tuple = ()  # among one student's files, later uploads sort last


@dataclass
class FileInfo:
    """One file of the view and where it came from."""

    origin: str  # its path in the download: the ``file`` column of grades.csv
    student_id: str
    name: str = ""  # the student's name as the LMS wrote it
    late: str = ""  # "yes", "no", or "" where the layout does not say
    notes: list[str] = field(default_factory=list)  # for the status column
    why: str = ""  # set for files the layout does not explain: the row's status


@dataclass
class View:
    """A download as ``root/<student_id>/<file>``; ``files`` is keyed by the path under ``root``.
    An empty ``files`` means ``root`` is the instructor's own folder, read where it is."""

    root: Path
    layout: str
    files: dict[str, FileInfo] = field(default_factory=dict)
    remarks: list[str] = field(default_factory=list)  # one line each, for stderr

    def origin(self, rel: str) -> str:
        """The download path of the view file ``rel`` (itself in the ``folders`` layout)."""
        info = self.files.get(rel)
        return info.origin if info else rel

    def by_origin(self) -> dict[str, FileInfo]:
        return {info.origin: info for info in self.files.values()}


# ---------------------------------------------------------------------------------------------
# Reading a download


def _ignored(path: str) -> bool:
    """Hidden files and the folders :mod:`grader.intake` skips (``..`` is not hidden: it is a row)."""
    return any((part.startswith(".") and part not in (".", "..")) or part in intake.IGNORED_PARTS
               for part in PurePosixPath(path).parts)


def _zip_entries(path: Path) -> list[Entry]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise DownloadError(f"{path} is not a readable zip file ({exc})") from None
    found = []
    for info in archive.infolist():
        if info.is_dir():
            continue
        name = info.filename.replace("\\", "/")
        mtime = time.mktime(info.date_time + (0, 0, -1)) if info.date_time[0] >= 1980 else 0.0
        found.append(Entry(name, info.file_size, mtime, lambda info=info: archive.read(info)))
    return found


def _folder_entries(path: Path) -> list[Entry]:
    found = []
    for p in sorted(path.rglob("*")):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            found.append(Entry(p.relative_to(path).as_posix(), st.st_size, st.st_mtime, p.read_bytes))
    return found


def read_download(download: Path) -> tuple[list[Entry], list[str]]:
    """Every file of a ``.zip`` or a folder (hidden files, ``__MACOSX`` and checkpoints left out),
    and remarks for stderr. An nbgrader course folder is read from its ``submitted/`` only."""
    remarks = []
    if download.is_file():
        if download.suffix.lower() != ".zip":
            raise DownloadError(f"{download} is a file but not a .zip: give the submissions folder or the "
                                "LMS's download (.zip)")
        entries = _zip_entries(download)
    else:
        if (download / "submitted").is_dir() and (download / "source").is_dir():
            remarks.append(f"{download} is an nbgrader course folder: reading its submitted/ only")
            entries = [e for e in _folder_entries(download) if e.path.startswith("submitted/")]
        else:
            entries = _folder_entries(download)
    return [e for e in entries if not _ignored(e.path)], remarks


def _wrapper(entries: list[Entry]) -> str:
    """The one folder every file is in (a zip of the unpacked download), or ``""``."""
    firsts = {PurePosixPath(e.path).parts[0] for e in entries if len(PurePosixPath(e.path).parts) > 1}
    if len(firsts) == 1 and all(len(PurePosixPath(e.path).parts) > 1 for e in entries):
        return firsts.pop() + "/"
    return ""


# ---------------------------------------------------------------------------------------------
# The layouts: one function each, from a path (wrapper folder removed) to a Placed


def _unsafe(parts: tuple[str, ...]) -> bool:
    return any(p in ("", "..") for p in parts) or bool(parts and parts[0].startswith("/"))


def place_canvas(path: str) -> Placed:
    """A Canvas download's file: ``<name>[_LATE]_<user id>_<attachment id>_<file>`` at the top."""
    parts = PurePosixPath(path).parts
    if len(parts) != 1:
        return Placed(why="not a Canvas submission file: Canvas puts every file at the top of its zip")
    name = parts[0]
    online = CANVAS_ONLINE.match(name)
    if online:
        kind = "text entry" if online["kind"] == "text" else "website URL"
        return Placed(online["uid"], name, online["name"] or "", "yes" if online["late"] else "no",
                      [f"a Canvas {kind}, not a file upload"])
    m = CANVAS_FILE.match(name)
    if not m:
        return Placed(why="the Canvas layout does not explain this name "
                          "(expected <name>[_LATE]_<user id>_<file id>_<file name>)")
    original, notes = m["orig"], []
    again = CANVAS_RESUBMITTED.match(original)
    if again:
        notes.append(f"uploaded to Canvas as {original} (a file of that name was handed in before)")
        original = again["stem"] + (again["ext"] or "")
    return Placed(m["uid"], f"{m['fid']}/{original}", m["name"] or "", "yes" if m["late"] else "no", notes,
                  order=(int(m["fid"]),))


def place_moodle(path: str) -> Placed:
    """A Moodle download's file: ``<Full Name>_<id>_assignsubmission_<plugin>_`` then ``/<file>`` or ``<file>``."""
    parts = PurePosixPath(path).parts
    m = MOODLE_PREFIX.match(parts[0])
    if not m:
        return Placed(why="the Moodle layout does not explain this name "
                          "(expected <Full Name>_<id>_assignsubmission_file_/<file>)")
    if m["rest"] and len(parts) == 1:
        target = m["rest"]
    elif not m["rest"] and len(parts) > 1:
        target = "/".join(parts[1:])
    else:
        return Placed(why="the Moodle layout does not explain this path")
    notes = [] if m["plugin"] == "file" else [f"Moodle's {m['plugin']} submission, not a file upload"]
    return Placed(m["pid"], f"{m['plugin']}/{target}" if m["plugin"] != "file" else target, m["name"], "", notes)


def place_nbgrader(path: str) -> Placed:
    """nbgrader's exchange: ``submitted/<student>/<assignment>/<file>``."""
    parts = PurePosixPath(path).parts
    if len(parts) < 4 or parts[0] != "submitted":
        return Placed(why="the nbgrader layout does not explain this path "
                          "(expected submitted/<student>/<assignment>/<file>)")
    return Placed(parts[1], "/".join(parts[2:]))


def place_folders(path: str) -> Placed:
    """The grader's own layout: ``<student_id>/<file>``."""
    parts = PurePosixPath(path).parts
    if len(parts) < 2:
        return Placed(why="not in a student folder: put it in SUBMISSIONS/<student_id>/")
    return Placed(parts[0], "/".join(parts[1:]))


PLACE = {"canvas": place_canvas, "moodle": place_moodle, "nbgrader": place_nbgrader, "folders": place_folders}


def detect(paths: list[str]) -> str:
    """The layout that explains most of ``paths``; ``folders`` when no LMS layout explains any."""
    counts = {layout: sum(1 for p in paths if PLACE[layout](p).student_id) for layout in ("canvas", "moodle", "nbgrader")}
    best = max(counts, key=lambda k: counts[k])
    return best if counts[best] > 0 else "folders"


def _layout_of(entries: list[Entry], layout: str) -> tuple[str, list[str]]:
    """The layout (``layout`` unless ``auto``) and each entry's path as that layout reads it: with
    the folder that wraps everything removed (a zip of an unpacked download) where that explains
    more files."""
    raw = [e.path for e in entries]
    wrapper = _wrapper(entries)
    options = [raw] + ([[p[len(wrapper):] for p in raw]] if wrapper else [])
    lms_layouts = ("canvas", "moodle", "nbgrader") if layout == "auto" else (layout,)
    best = (0, "folders", raw)
    for paths in options:
        for candidate in lms_layouts:
            explained = sum(1 for p in paths if PLACE[candidate](p).student_id)
            if explained > best[0] or (candidate == layout and best[1] != layout):
                best = (explained, candidate, paths)
    chosen, paths = best[1], best[2]
    if chosen == "folders" and wrapper and all(len(PurePosixPath(p).parts) > 2 for p in raw):
        paths = options[1]  # a zip of the SUBMISSIONS folder itself: its sub-folders are the students
    return chosen, paths


# ---------------------------------------------------------------------------------------------
# The view


def _safe_parts(target: str) -> list[str]:
    return [p for p in PurePosixPath(target).parts if p not in ("", ".", "..", "/")]


def open_download(download: Path, view_root: Path, layout: str = "auto") -> View:
    """The download at ``download`` (a ``.zip`` or a folder) as ``SUBMISSIONS/<student_id>/<file>``.

    A folder in the ``folders`` layout is returned as it is (no copy). Anything else is copied into
    ``view_root`` (emptied first), one file at a time: never extracted blindly, so no zip member
    can write outside it. Raises :class:`DownloadError` when the download cannot be read.
    """
    if layout not in ("auto", *LAYOUTS):
        raise DownloadError(f"unknown layout {layout!r}: choose one of auto, {', '.join(LAYOUTS)}")
    download = Path(download)
    if download.is_dir() and layout == "folders":
        return View(download, "folders")
    entries, remarks = read_download(download)
    chosen, inner = _layout_of(entries, layout)
    if chosen == "folders" and download.is_dir():
        return View(download, "folders", remarks=remarks)
    view = View(view_root, chosen, remarks=remarks)
    if view_root.exists():
        shutil.rmtree(view_root)
    view_root.mkdir(parents=True)
    placed = [(entry, rel, PLACE[chosen](rel)) for entry, rel in zip(entries, inner)]
    _timestamps(placed)
    # Among one student's files, later uploads (Canvas: larger attachment ids) get later times, so
    # that the grader's newest-file rule takes the later upload.
    ranks: dict[int, int] = {}
    per_student: dict[str, int] = {}
    for i in sorted((i for i, (_, _, p) in enumerate(placed) if p.student_id and p.order),
                    key=lambda i: (placed[i][2].student_id, placed[i][2].order, placed[i][1])):
        sid = placed[i][2].student_id
        ranks[i] = per_student.get(sid, 0)
        per_student[sid] = ranks[i] + 1
    newest = max((e.mtime for e in entries), default=0.0)
    taken: set[str] = set()
    for i, (entry, rel, p) in enumerate(placed):
        if chosen == "nbgrader" and p.student_id and PurePosixPath(rel).name == "timestamp.txt":
            continue  # nbgrader's own record: a note on its folder's files (see _timestamps)
        why = p.why
        if not why and _unsafe(PurePosixPath(rel).parts):
            why = "unsafe path in the download (it would leave the folder)"
        if not why and entry.size > MAX_FILE:
            why = f"file too large ({entry.size / 1024**2:.0f} MB; a notebook is a few MB)"
        parts = _safe_parts(p.target) if not why else []
        if not why and not parts:
            why = "no file name"
        data = b""
        if not why:
            try:
                data = entry.read()
            except Exception as exc:  # noqa: BLE001 - a damaged member is a row, not a crash
                why = f"could not be read from the download ({type(exc).__name__}: {exc})"
        if why:
            name = safe_name(entry.path.replace("/", "_")).lstrip(".") or "file"
            out_rel = _unique(name, taken)
            (view_root / out_rel).write_bytes(b"")
            view.files[out_rel] = FileInfo(entry.path, "", why=why)
            continue
        out_rel = _unique("/".join([safe_name(p.student_id)] + parts), taken)
        target = view_root / out_rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        mtime = newest + ranks[i] if i in ranks else entry.mtime
        os.utime(target, (mtime, mtime))
        view.files[out_rel] = FileInfo(entry.path, safe_name(p.student_id), p.name, p.late, list(p.notes))
    return view


def _timestamps(placed: list[tuple[Entry, str, Placed]]) -> None:
    """nbgrader's ``timestamp.txt`` becomes a note on the files of its submission folder."""
    stamps = {}
    for entry, rel, p in placed:
        if p.student_id and PurePosixPath(rel).name == "timestamp.txt":
            try:
                stamps[str(PurePosixPath(rel).parent)] = entry.read().decode("utf-8", "replace").strip()[:40]
            except Exception:  # noqa: BLE001 - a broken timestamp is no reason to stop
                continue
    for entry, rel, p in placed:
        folder = str(PurePosixPath(rel).parent)
        if p.student_id and folder in stamps and PurePosixPath(rel).name != "timestamp.txt":
            p.notes.append(f"handed in {stamps[folder]} (nbgrader timestamp)")


def _unique(rel: str, taken: set[str]) -> str:
    candidate, n = rel, 1
    while candidate in taken:
        path = PurePosixPath(rel)
        candidate = str(path.with_name(f"{path.stem}.{n}{path.suffix}"))
        n += 1
    taken.add(candidate)
    return candidate


def describe(view: View) -> str:
    """One line for stderr: the layout and what was found."""
    students = {f.student_id for f in view.files.values() if f.student_id}
    odd = sum(1 for f in view.files.values() if f.why)
    extra = f", {odd} file{'s' if odd != 1 else ''} it does not explain (rows say why)" if odd else ""
    return f"{view.layout} layout: {len(view.files)} files of {len(students)} students{extra}"

