"""Grades out: views of ``DIR/grades.csv`` that a learning management system imports.

``grades.csv`` stays the one place with everything (:mod:`grader.autograde`); an export only reads
it, picks one row per student and notebook and lays it out as the LMS wants it.

Canvas (``--export canvas``, ``python -m grader export canvas DIR``): the gradebook CSV that Canvas's
Grades -> Import takes, laid out as Canvas's own export is (``lib/gradebook_exporter.rb`` of
instructure/canvas-lms): the columns ``Student, ID, SIS User ID, SIS Login ID, Section``, one column per
notebook titled as the Canvas assignment is, ``"<title> (<assignment id>)"`` (the instructor gives
the titles: ``--assignment 01="01 Dot products (12345)"`` or a CSV ``notebook,title``), then a
``    Points Possible`` row. Canvas matches students by ``ID`` (the Canvas user id, which a Canvas
download gives as the student id) or the SIS ids; ``--roster`` takes Canvas's own gradebook export
(or any CSV with those columns) to fill them in and to match students whose id in ``grades.csv`` is
their SIS user id or login. A blank cell changes nothing on import.
"""

from __future__ import annotations

import csv
from pathlib import Path

from grader import course

CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
POINTS_POSSIBLE = "    Points Possible"  # Canvas's own spelling, four spaces included


class ExportError(Exception):
    """Bad input to an export (one line: what and where)."""


def notebook_of(raw: str) -> str:
    """The course notebook ``raw`` names: ``01``, ``01_dot_products``, ``path/01_dot_products.ipynb``."""
    stem = Path(raw).stem if raw.endswith(".ipynb") or "/" in raw else raw
    matches = [n for n in course.NOTEBOOKS if n == stem or n.startswith(stem + "_")]
    if len(matches) != 1:
        raise ExportError(f"unknown notebook {raw!r}; the course has: {', '.join(course.NOTEBOOKS)}")
    return matches[0]


def read_titles(pairs: list[str] | None = None, files: list[Path] | None = None) -> dict[str, str]:
    """Notebook -> Canvas assignment column title, from ``NN=TITLE`` pairs and ``notebook,title`` CSVs."""
    titles: dict[str, str] = {}
    for path in files or []:
        path = Path(path)
        if not path.is_file():
            raise ExportError(f"--assignments {path}: no such file")
        with open(path, newline="", encoding="utf-8-sig") as f:
            for n, row in enumerate(csv.reader(f), start=1):
                if not row or not "".join(row).strip() or (n == 1 and row[0].strip().lower() == "notebook"):
                    continue
                if len(row) < 2 or not row[1].strip():
                    raise ExportError(f"--assignments {path}, line {n}: write notebook,title")
                titles[notebook_of(row[0].strip())] = row[1].strip()
    for pair in pairs or []:
        key, sep, title = pair.partition("=")
        if not sep or not title.strip():
            raise ExportError(f"--assignment {pair!r}: write NN=TITLE, e.g. 01=\"01 Dot products (12345)\"")
        titles[notebook_of(key.strip())] = title.strip()
    return titles


def read_grades(grading: Path) -> list[dict[str, str]]:
    """The rows of ``grading/grades.csv``."""
    path = Path(grading) / "grades.csv"
    if not path.is_file():
        raise ExportError(f"{path} not found: run `python -m grader autograde ... --out {grading}` first")
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def read_roster(path: Path) -> list[dict[str, str]]:
    """The students of a roster CSV (Canvas's gradebook export works as it is), without its
    "Points Possible" and muted-assignment rows."""
    path = Path(path)
    if not path.is_file():
        raise ExportError(f"--roster {path}: no such file")
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    columns = set(rows[0]) if rows else set()
    if not columns & {"ID", "SIS User ID", "SIS Login ID"}:
        raise ExportError(f"--roster {path}: no ID, SIS User ID or SIS Login ID column (Canvas's gradebook "
                          "export has them)")
    return [r for r in rows if any((r.get(k) or "").strip() for k in ("ID", "SIS User ID", "SIS Login ID"))
            and "Points Possible" not in (r.get("Student") or "")]


def _number(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def canvas_rows(grades: list[dict[str, str]], titles: dict[str, str],
                roster: list[dict[str, str]] | None = None) -> tuple[list[list[str]], list[str]]:
    """The Canvas gradebook CSV as rows, and warnings (one line each) for the instructor."""
    warnings = []
    graded = [r for r in grades if r.get("student_id") and r.get("notebook") in course.NOTEBOOKS]
    notebooks = [n for n in course.NOTEBOOKS if n in titles or any(r["notebook"] == n for r in graded)]
    untitled = [n for n in notebooks if n not in titles]
    if untitled:
        warnings.append("no Canvas assignment title for " + ", ".join(untitled) + ": the column is the notebook's "
                        "name, which Canvas imports as a new assignment (give --assignment NN=\"Title (id)\")")
    score: dict[tuple[str, str], float] = {}
    points: dict[str, float] = {}
    names: dict[str, str] = {}
    for r in graded:
        key = (r["student_id"], r["notebook"])
        score[key] = max(score.get(key, 0.0), float(r["score"] or 0))
        points[r["notebook"]] = max(points.get(r["notebook"], 0.0), float(r["max_score"] or 0))
        names.setdefault(r["student_id"], r.get("student_name") or "")
    for n in notebooks:
        if n not in points:
            try:
                from grader import intake

                points[n] = intake.load_source(n).max_score
            except (OSError, KeyError):
                pass
    header = CANVAS_COLUMNS + [titles.get(n, n) for n in notebooks]
    rows = [header, [POINTS_POSSIBLE, "", "", "", ""] + [_number(points[n]) if n in points else "" for n in notebooks]]
    students = sorted({sid for sid, _ in score})

    def cells(sid: str | None) -> list[str]:
        return [_number(score[(sid, n)]) if sid is not None and (sid, n) in score else "" for n in notebooks]

    if roster is None:
        odd = [s for s in students if not s.isdigit()]
        if odd:
            warnings.append(f"{len(odd)} student ids are not Canvas user ids ({', '.join(odd[:5])}"
                            f"{', ...' if len(odd) > 5 else ''}): Canvas will not match them; pass --roster")
        rows += [[names.get(s) or s, s, "", "", ""] + cells(s) for s in students]
        return rows, warnings
    matched: set[str] = set()
    for person in roster:
        keys = [(person.get(k) or "").strip() for k in ("ID", "SIS User ID", "SIS Login ID")]
        sid = next((k for k in keys if k and k in students), None)
        if sid is not None:
            matched.add(sid)
        rows.append([(person.get(c) or "").strip() for c in CANVAS_COLUMNS] + cells(sid))
    missing = [s for s in students if s not in matched]
    if missing:
        warnings.append(f"{len(missing)} graded students are not in the roster and were left out: "
                        f"{', '.join(missing[:10])}{', ...' if len(missing) > 10 else ''}")
    return rows, warnings


def export_canvas(grading: Path, out_csv: Path | None = None, titles: dict[str, str] | None = None,
                  roster: Path | None = None) -> tuple[Path, list[str]]:
    """Write the Canvas gradebook CSV of the grading folder ``grading`` (default
    ``grading/canvas.csv``); return its path and the warnings."""
    grades = read_grades(grading)
    rows, warnings = canvas_rows(grades, titles or {}, read_roster(roster) if roster else None)
    out_csv = Path(out_csv) if out_csv else Path(grading) / "canvas.csv"
    if out_csv.is_dir():
        raise ExportError(f"--out {out_csv} is a folder: give the CSV file to write")
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with open(out_csv, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return out_csv, warnings
