"""``python -m grader feedback DIR``: one HTML page per student and notebook, from ``DIR/results.json``.

Each page lists the student's score, what the grader repaired or flagged, and per test: pass or
fail, the check's message (what differs, on which case) and the test cell as the student saw it.
The hidden tests' code is never shown: the test text comes from the solution with every
``### BEGIN HIDDEN TESTS`` block removed, and error tracebacks (which quote the failing line) are
left out; only the check's own message is shown.

nbgrader's ``generate_feedback`` is not used because it renders the autograded notebook, whose
test cells contain the hidden tests.
"""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

from grader.config import safe_name
from grader.intake import strip_hidden

STYLE = """
body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
h1{font-size:1.4rem} .score{font-size:1.2rem;font-weight:bold}
.test{border:1px solid #ccc;border-radius:6px;margin:1rem 0;padding:.5rem 1rem}
.pass{border-left:6px solid #2a2} .fail{border-left:6px solid #c22}
pre{background:#f6f6f6;padding:.5rem;overflow-x:auto;white-space:pre-wrap}
.note{color:#555}
"""


def render(row: dict) -> str:
    """The HTML page for one graded notebook (a row of results.json)."""
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(row['notebook'])}: feedback for "
             f"{e(row['student_id'])}</title><style>{STYLE}</style></head><body>",
             f"<h1>{e(row['notebook'])} &middot; {e(row['student_id'])}</h1>",
             f"<p class='score'>Score: {row['score']:g} / {row['max_score']:g}</p>",
             f"<p class='note'>Status: {e(row['status'])}</p>"]
    if row.get("violations"):
        parts.append("<h2>Rules broken (0 points for the exercise)</h2><ul>"
                     + "".join(f"<li>{e(v)}</li>" for v in row["violations"]) + "</ul>")
    if row.get("repairs"):
        parts.append("<h2>Repaired by the grader</h2><ul>"
                     + "".join(f"<li>{e(v)}</li>" for v in row["repairs"]) + "</ul>")
    parts.append("<h2>Tests</h2>")
    for cell in row.get("cells", []):
        ok = cell.get("passed")
        message = cell.get("comment") or cell.get("message") or ""
        shown = strip_hidden(row.get("tests_shown", {}).get(cell["grade_id"], ""))
        parts.append(
            f"<div class='test {'pass' if ok else 'fail'}'><h3>{e(cell['grade_id'])}: "
            f"{'passed' if ok else 'failed'} ({cell['score']:g} / {cell['max_score']:g})</h3>"
            f"<p>{e(message) if message else ''}</p>"
            + (f"<details><summary>test cell (visible part)</summary><pre>{e(shown)}</pre></details>" if shown else "")
            + "</div>")
    parts.append("<p class='note'>Hidden tests ran too; their code is not shown, only their messages.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def feedback(out: Path) -> list[Path]:
    """Write ``out/feedback/<student>/<notebook>.html`` for every graded notebook in ``out/results.json``."""
    results_file = out / "results.json"
    if not results_file.exists():
        raise FileNotFoundError(f"{results_file} not found: run `python -m grader autograde ... --out {out}` first")
    rows = json.loads(results_file.read_text(encoding="utf-8"))
    folder = out / "feedback"
    shutil.rmtree(folder, ignore_errors=True)
    written = []
    for row in rows:
        if not row.get("student_id") or not row.get("cells"):
            continue
        path = folder / safe_name(row["student_id"]) / f"{safe_name(row['notebook'])}.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(row), encoding="utf-8")
        written.append(path)
    return written
