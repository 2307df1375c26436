"""The student's JupyterLab in a real browser (Debian's Chromium driven by Playwright).

One JupyterLab for the module, started by ``scripts/lab.py`` exactly as ``make lab`` starts it, in a
temporary copy of ``notebooks/``. As a student would: open a notebook from the file browser, run
the cells above an exercise and see the figures, run the check on the stub, type a wrong answer and
then the right one with the keyboard, save; the saved files are graded by ``grader.autograde`` and
the feedback pages are opened in the browser. nbgrader's Validate button is clicked on a right and
a wrong notebook. Screenshots of every step go to ``test-artifacts/browser/`` (``make test`` says so).

A test of the test shows that a traceback wall and a console error from a notebook make these
checks fail. Without Chromium (``make test-tools`` installs it) the module skips and says why.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import nbformat
import pytest

from grader import course
from tests.fixtures import answers as wrong_answers
from tests.support.browser_lab import (ARTIFACTS, LAB_SCRIPT, ROOT, Console, Notebook, assert_check_message, chromium_path,
                               start_lab)

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")

NB01, NB04 = "01_dot_products", "04_causal_attention"
pytestmark = [
    pytest.mark.skipif(chromium_path() is None, reason="Chromium is not installed: `make test-tools` installs it "
                       "(as root, with apt-get), or install the `chromium` package yourself"),
    pytest.mark.skipif(not {NB01, NB04} <= set(course.available_notebooks()),
                       reason="notebooks 01 and 04 are not built"),
]
TIMEOUT_MS = 30_000  # a kernel's first cell imports torch; everything else takes well under a second
WRONG_QUERY = wrong_answers.load(NB01).WRONG["attention_scores_for_query"][
    "scores against the first token, not the query"]
SAVED: dict[str, Path] = {}  # notebook -> the file the round trip saved in the browser


class Grading:
    """The grader (``grader.autograde.autograde``, what `python -m grader autograde` runs) on the files
    the round trips saved, one student each so that two workers grade them side by side. It starts
    in a background thread as soon as both files are saved and runs while the browser clicks Validate."""

    def __init__(self):
        self.thread = self.out = None
        self.result: dict = {}

    def start(self, lab, base: Path) -> None:
        if self.thread is not None:
            return
        from grader.autograde import autograde

        subs, self.out = base / "submissions", base / "grading"
        for notebook, path in SAVED.items():
            (subs / f"browser_{notebook[:2]}").mkdir(parents=True)
            shutil.copy(path, subs / f"browser_{notebook[:2]}" / f"{notebook}.ipynb")

        def run():
            try:
                self.result["code"] = autograde(subs, self.out, workers=2, cell_timeout=30, notebook_timeout=120,
                                                memory=2 * 1024**3, progress=False)
            except BaseException as exc:  # noqa: BLE001 - re-raised in wait()
                self.result["error"] = exc

        self.thread = threading.Thread(target=run, name="autograde", daemon=True)
        self.thread.start()

    def wait(self) -> Path:
        self.thread.join(timeout=300)
        assert not self.thread.is_alive(), "autograde took over 300 s"
        if "error" in self.result:
            raise self.result["error"]
        assert self.result["code"] == 0, f"autograde exited with {self.result['code']}"
        return self.out


GRADING = Grading()


def solution(notebook: str, grade_id: str) -> str:
    """The solution's answer cell as a student would type it (no nbgrader markers)."""
    nb = nbformat.read(course.solutions_dir() / f"{notebook}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    return "\n".join(line for line in cell.source.splitlines() if "### BEGIN SOLUTION" not in line
                     and "### END SOLUTION" not in line)


def index_of(notebook: str, grade_id: str) -> int:
    nb = nbformat.read(ROOT / "notebooks" / f"{notebook}.ipynb", as_version=4)
    return next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def with_answers(notebook: str, answers: dict[str, str]) -> nbformat.NotebookNode:
    """The student notebook with these answer cells filled in (metadata untouched, as if typed)."""
    nb = nbformat.read(ROOT / "notebooks" / f"{notebook}.ipynb", as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return nb


BROKEN = [
    # A check that lets its traceback through: the wall the course's checks must never show.
    "def _compare(got):\n    raise ValueError(f'internal error comparing {got!r}')\n\n\n"
    "def check_answer(answer):\n    return _compare(answer)\n\n\ncheck_answer(42)",
    # Course content whose JavaScript fails in the page.
    "from IPython.display import Javascript, display\n\n"
    "display(Javascript(\"console.error('broken course content: the figure did not draw')\"))",
]


def prepare(folder: Path) -> None:
    """Extra notebooks next to the student's: 01 with every answer right (for Validate), and a broken
    notebook for the test of the test."""
    answers = {ex: solution(NB01, ex) for ex in course.EXERCISES[NB01]}
    nbformat.write(with_answers(NB01, answers), folder / "01_all_right.ipynb")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in BROKEN],
                                            metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                     "language": "python"}}),
                   folder / "broken_check.ipynb")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    base = tmp_path_factory.mktemp("lab")
    folder = base / "notebooks"
    shutil.copytree(ROOT / "notebooks", folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    prepare(folder)
    # A student's own settings: no "get notified about Jupyter news?" pop-up over the screenshots.
    news = base / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false"}))
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
           "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"), "JUPYTERLAB_SETTINGS_DIR": str(base / "settings")}
    server = start_lab(folder, ARTIFACTS / "jupyterlab.log", secrets.token_hex(16), env)
    yield server
    server.stop()
    if GRADING.thread is not None:  # let a grading cut short by a failure finish before the module ends
        GRADING.thread.join(timeout=300)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=chromium_path())
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def window(browser, lab):
    """One JupyterLab window for the module, as a student keeps one open; its console is watched."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    console = Console().attach(page)
    page.goto(lab.url("lab/workspaces/browser-tests"))
    page.locator(".jp-DirListing-item").first.wait_for()
    yield page, console
    context.close()


@pytest.fixture
def page(window, request):
    """The JupyterLab window; console errors during the test fail it, and a failing test leaves a
    screenshot of the moment it failed, ``FAILED-<test>.png``."""
    page, console = window
    seen, failed = len(console.errors), request.session.testsfailed
    yield page
    if request.session.testsfailed > failed:
        page.screenshot(path=str(ARTIFACTS / f"FAILED-{request.node.name}.png"))
    console.assert_clean(since=seen)


def test_lab_says_when_its_port_is_taken(lab):
    """`make lab` on a port that is in use (here, the running JupyterLab's) ends with one clear line
    naming the port and what to do, and exit code 1: no traceback, no JupyterLab on another port."""
    port = lab.base.rsplit(":", 1)[1]
    run = subprocess.run([sys.executable, str(LAB_SCRIPT), "--notebook-dir", str(lab.folder), "--port", port,
                          "--no-browser"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run
    assert f"Port {port} is already in use" in run.stderr and f"make lab PORT={int(port) + 1}" in run.stderr, run
    assert "Traceback" not in run.stderr + run.stdout and run.stdout == "", run


def round_trip(page, lab, notebook: str, exercise: str, above: list[tuple[int, int]], figure: int, wrong: str,
               case: str, right: str, prefix: str, also: dict[str, str] | None = None) -> None:
    """The student's path through one exercise, a screenshot per step. ``case``: words of the wrong
    answer's message that name the failing case; ``also`` (grade_id -> source) are typed into other
    answer cells before saving, without running them."""
    nb = Notebook.open(page, lab, f"{notebook}.ipynb")
    answer = index_of(notebook, exercise)
    check = index_of(notebook, f"test_{exercise}")
    nb.run_from(*above[0])  # up to the figure
    img = nb.cell(figure).locator(".jp-OutputArea-output img")
    img.wait_for()
    assert img.evaluate("el => el.naturalWidth > 100 && el.src.startsWith('data:image/png')")
    nb.shot(f"{prefix}-1-figure.png", figure)
    for first, last in above[1:]:
        nb.run_from(first, last)

    nb.run(answer)  # the stub, unchanged
    assert_check_message(nb.run(check), "not implemented yet")
    nb.shot(f"{prefix}-2-stub-check.png", check)

    nb.type_into(answer, wrong)
    nb.run(answer)
    assert_check_message(nb.run(check), "❌", case, wrong.hint)
    nb.shot(f"{prefix}-3-wrong-answer.png", check)

    nb.type_into(answer, right)
    nb.run(answer)
    assert_check_message(nb.run(check), "✅")
    for grade_id, source in (also or {}).items():
        nb.type_into(index_of(notebook, grade_id), source)
    nb.save()
    nb.shot(f"{prefix}-4-right-answer-saved.png", check)
    SAVED[notebook] = lab.folder / f"{notebook}.ipynb"
    nb.close()
    if {NB01, NB04} <= set(SAVED):
        GRADING.start(lab, lab.folder.parent / "graded")


def test_dot_round_trip(page, lab):
    """Notebook 01: the cells above exercise 1 (a 3-D figure), then `dot` as stub, wrong, right; a
    wrong `attention_scores_for_query` is typed too, for the feedback page to show its message."""
    bad = wrong_answers.load(NB01).WRONG["dot"]["adds instead of multiplying"]
    round_trip(page, lab, NB01, "dot", above=[(0, index_of(NB01, "dot") - 1)], figure=6, wrong=bad,
               case="on case 'book: x^1 . x^2'", right=solution(NB01, "dot"), prefix="01-dot",
               also={"attention_scores_for_query": WRONG_QUERY})


def test_causal_attention_round_trip(page, lab):
    """Notebook 04: set-up, the no-mask heat map, then `CausalAttention` as stub, wrong, right."""
    bad = next(iter(wrong_answers.load(NB04).WRONG["CausalAttention"].values()))
    batch = next(i for i, c in enumerate(nbformat.read(ROOT / "notebooks" / f"{NB04}.ipynb", 4).cells)
                 if c.source.startswith("batch = data.book_batch()"))
    round_trip(page, lab, NB04, "CausalAttention", above=[(0, 8), (batch, batch)], figure=8, wrong=bad,
               case="built with (3, 2, 6, 0.5)", right=solution(NB04, "CausalAttention"), prefix="04-causal")


def assert_no_hidden_tests(text: str) -> None:
    for secret in ("hidden=True", "HIDDEN TESTS", "hidden_cases"):
        assert secret not in text, f"{secret!r} shows:\n{text}"


def test_validate_passes_a_right_notebook(page, lab):
    """nbgrader's Validate button (its JupyterLab extension, as installed by the course) on notebook
    01 with every answer right."""
    nb = Notebook.open(page, lab, "01_all_right.ipynb")
    text = nb.validate()
    nb.shot("validate-1-passed.png")
    assert "Success! Your notebook passes all the tests." in text, text
    nb.close_dialog()
    nb.close()


def test_validate_names_the_failing_test(page, lab):
    """Validate on notebook 01 as the round trip saved it (`dot` right, `attention_scores_for_query`
    wrong, `attention_scores` untouched): it names the two failing checks with their messages, not
    `dot`'s, and shows no hidden test."""
    if NB01 not in SAVED:
        pytest.fail("the round trip of notebook 01 did not save it")
    nb = Notebook.open(page, lab, f"{NB01}.ipynb")
    text = nb.validate()
    nb.shot("validate-2-failed.png")
    assert text.count("The following cell failed") == 2, text
    assert "checks.check_attention_scores_for_query(attention_scores_for_query)" in text, text
    assert "❌" in text and " ".join(WRONG_QUERY.hint.split()) in " ".join(text.split()), text
    assert "checks.check_attention_scores(attention_scores)" in text and "not implemented yet" in text, text
    assert "check_dot" not in text, text
    assert "Traceback" not in text, text
    assert_no_hidden_tests(text)
    nb.close_dialog()
    nb.close()


def test_the_browser_checks_can_fail(page, window, lab):
    """The test of the test: a check cell that shows a traceback wall, and course content whose
    JavaScript logs an error, are caught by the same assertions the tests above rely on."""
    console = window[1]
    nb = Notebook.open(page, lab, "broken_check.ipynb")
    wall = nb.run(0)
    nb.shot("test-of-test-traceback-wall.png", 0)
    with pytest.raises(AssertionError, match="traceback wall"):
        assert_check_message(wall, "✅")

    seen = len(console.errors)
    with page.expect_console_message(lambda msg: msg.type == "error" and "broken course content" in msg.text):
        nb.run(1)
    with pytest.raises(AssertionError, match="broken course content"):
        console.assert_clean(since=seen)
    del console.errors[seen:]  # caught as it should be: not this test's failure
    nb.save()
    nb.close()


@pytest.fixture(scope="module")
def graded(lab):
    """The grader's results for the files saved in the browser: ``(out, {(student, notebook): row})``."""
    missing = {NB01, NB04} - set(SAVED)
    if missing:
        pytest.fail(f"the round trip did not save {sorted(missing)}")
    GRADING.start(lab, lab.folder.parent / "graded")
    out = GRADING.wait()
    from grader.feedback import feedback

    feedback(out)  # what `python -m grader feedback OUT` does
    rows = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return out, {(r["student_id"], r["notebook"]): r for r in rows}


@pytest.mark.parametrize("notebook, exercise", [(NB01, "dot"), (NB04, "CausalAttention")])
def test_saved_file_gets_the_points(graded, notebook, exercise):
    """The file JupyterLab saved gets full marks for the exercise typed in the browser, nothing for
    the others (stubs, and notebook 01's wrong `attention_scores_for_query`, whose message says why)."""
    row = graded[1][(f"browser_{notebook[:2]}", notebook)]
    cells = {c["grade_id"]: c for c in row["cells"]}
    typed = cells[f"test_{exercise}"]
    assert typed["passed"] and typed["score"] == typed["max_score"] > 0, cells
    others = [c for gid, c in cells.items() if gid != f"test_{exercise}"]
    assert others and all(c["score"] == 0 for c in others), cells
    assert row["score"] == typed["max_score"], row
    if notebook == NB01:
        query = cells["test_attention_scores_for_query"]
        assert WRONG_QUERY.hint in (query.get("comment") or "") + (query.get("message") or ""), query


@pytest.fixture(scope="module")
def offline(browser):
    """A browser context that refuses every request but file:// and records what was asked for."""
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    requested = []

    def refuse(route):
        requested.append(route.request.url)
        route.abort()

    context.route(lambda url: not url.startswith("file:"), refuse)
    yield context, requested
    context.close()


@pytest.mark.parametrize("student, notebook", [("browser_01", NB01), ("browser_04", NB04)])
def test_feedback_page(graded, offline, student, notebook):
    """`python -m grader feedback`'s page: every test with pass or fail, points and the check's
    message; no hidden test code; nothing fetched from the network."""
    out, rows = graded
    html = (out / "feedback" / student / f"{notebook}.html").read_text(encoding="utf-8")
    for external in ("<link", "<script", "@import", "url(", "src="):
        assert external not in html, f"the page loads {external}...: it must work offline"
    context, requested = offline
    page = context.new_page()
    console = Console().attach(page)
    page.goto((out / "feedback" / student / f"{notebook}.html").as_uri())
    page.screenshot(path=str(ARTIFACTS / f"feedback-{student}-{notebook}.png"), full_page=True)
    text = page.locator("body").inner_text()
    flat = " ".join(text.split())
    for cell in rows[(student, notebook)]["cells"]:
        verdict = "passed" if cell["passed"] else "failed"
        assert f"{cell['grade_id']}: {verdict} ({cell['score']:g} / {cell['max_score']:g})" in flat, (cell, text)
        message = " ".join((cell.get("comment") or cell.get("message") or "").split())
        assert message and message[:80] in flat, (cell, text)
    if notebook == NB01:
        assert " ".join(WRONG_QUERY.hint.split()) in flat, text
    assert_no_hidden_tests(text)
    assert requested == [], requested
    page.close()
    console.assert_clean()
