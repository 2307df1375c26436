"""Gradescope: ``python -m grader gradescope NOTEBOOK --out autograder.zip``, and the runner inside it.

Gradescope's autograder specification (https://gradescope-autograders.readthedocs.io/en/latest/specs/):
the zip holds ``setup.sh`` (run once, as root, to build the image; Ubuntu) and ``run_autograder``
(run for every submission, from ``/autograder``) at its root; Gradescope unpacks it into
``/autograder/source``, puts the student's files in ``/autograder/submission`` and reads
``/autograder/results/results.json``: ``tests[]`` with ``name``, ``score``, ``max_score``, ``status``
(``passed``/``failed``), ``output`` and ``visibility`` (``visible``, ``hidden``, ``after_due_date``,
``after_published``), and optional ``score``, ``output``, ``output_format`` (``text``, ``html``,
``simple_format``, ``md``, ``ansi``), ``execution_time``, ``stdout_visibility``.

The zip holds one notebook's grading and nothing of the others': the grader, ``course_utils`` with
only that notebook's hidden cases (``instructor/nbNN.py``) and recording, a ``reference.py`` cut down
to the answers its checks compare with (:func:`reference_names`, ``grader/reference_subset.py``), the
solution and released notebook, ``requirements.txt`` (:data:`GRADER_PACKAGES` at the exact versions of
``constraints.txt``, which it carries too) and ``student/course_utils``, the student edition of the
package (``grader.edition``): what the student's kernel may import. ``setup.sh`` and
``run_autograder`` are ``grader/templates/gradescope/``.

In the container, :func:`run` (what ``run_autograder`` calls) grades the submitted ``.ipynb`` with
:func:`grader.autograde.autograde` in one process (no pool: Gradescope's default container has
768 MB), so a Gradescope grade is the grade ``grades.csv`` would give, repairs and rules included.
The student's kernel runs in bubblewrap where it can start; where it cannot (Docker's default
seccomp profile stops it), as the unprivileged user ``setup.sh`` created, with the student edition
only (``grader/runas.py``); without either, nothing is graded. Every process of that user is killed
before ``results.json`` is written, by the grader alone, last.

``results.json`` has one ``tests[]`` entry per test cell of the notebook. Its ``output`` is the
check's message (the ``❌`` line, or the rule the answer broke), never the test code: hidden tests
stay hidden. Visibility: a result that the visible check decided (it failed there, as the student
saw in the notebook), or a rule broken in the answer (the self-check shows the same), is
``visible`` at once; a result that depends on the hidden tests (they ran, passed or failed) is
``after_published``, shown when the instructor publishes the grades.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

from grader import course

#: The variable that points ``run_autograder`` and ``setup.sh`` at another root than ``/autograder`` (tests).
ROOT_VARIABLE = "AUTOGRADER_ROOT"
#: The student's folder in the grader's SUBMISSIONS view of one Gradescope submission.
STUDENT = "student"
#: The zip's folder holding the student edition of ``course_utils`` (``setup.sh`` copies it to ``/autograder/student``).
EDITION = "student"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
#: The unprivileged user ``setup.sh`` creates; the student's kernel runs as it where bubblewrap cannot.
KERNEL_USER = "gradescope-kernel"
#: Gradescope's default Autograder timeout, seconds (Autograder Settings: "Autograder timeout").
GRADESCOPE_TIMEOUT = 600
#: Seconds the notebook may run by default: what is left of Gradescope's 10 minutes after the image starts,
#: the grader imports torch and nbgrader (about 10 s each on one CPU) and the verdicts are judged.
TIME_LIMIT = 420
#: The notebooks whose grading comes near Gradescope's default container (768 MB): measured on the
#: course's 2-core machine, the solution peaks at 650 to 725 MiB (PSS, grader and kernel together) and
#: takes 30 to 50 s (README, "Gradescope's limits"). Their zip's README asks for a larger container.
HEAVY_NOTEBOOKS = ("08_kv_cache_gqa_and_windows", "09_capstone_tiny_transformer", "10_flash_attention_backward")
#: What the grader and the student's kernel import (distribution names): ``requirements.txt`` pins each
#: to its version in constraints.txt, and ``setup.sh`` installs that file with constraints.txt.
GRADER_PACKAGES = ("torch", "numpy", "matplotlib", "tqdm", "nbgrader", "nbformat", "nbclient", "nbconvert",
                   "jupyter_client", "jupyter_core", "ipykernel", "ipython", "traitlets", "SQLAlchemy", "alembic",
                   "copydetect", "jsonschema", "jupytext")
#: The oldest Python that installs constraints.txt (soupsieve 4, which nbconvert needs, asks for 3.11.5):
#: ``setup.sh`` takes a released Python of at least this version, or stops.
PYTHON_FLOOR = (3, 11, 5)
#: Notebooks whose checks run Triton kernels (by its interpreter on a CPU): Triton is installed for them.
TRITON_NOTEBOOKS = ("07_flash_attention_from_scratch", "10_flash_attention_backward")
TEMPLATES = Path(__file__).with_name("templates") / "gradescope"
#: Every output is plain text: Gradescope would otherwise render the top-level output as HTML
#: (``simple_format``), and a student's text is not markup.
FORMATS = {"output_format": "text", "test_output_format": "text", "test_name_format": "text"}

README = """# Gradescope autograder for {notebook}

Built by `python -m grader gradescope {notebook} --out autograder.zip` from the course's instructor
edition. Upload the zip as the autograder of a Gradescope programming assignment; students hand in
`{notebook}.ipynb` (any file name: the grader recognises the notebook by its content).

This zip holds this notebook's solution, hidden tests and the reference answers its checks need:
share it with course staff only. The notebook may run {time_limit} s; {advice}
"""


def _pins() -> dict[str, str]:
    """Distribution name (lower case, ``-`` for ``_``) -> exact version, from constraints.txt."""
    pins = {}
    for line in (course.repo_root() / "constraints.txt").read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line.strip())
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def requirements(notebook: str) -> str:
    """``requirements.txt`` of the zip: :data:`GRADER_PACKAGES` (and Triton for :data:`TRITON_NOTEBOOKS`)
    at their exact versions in constraints.txt. Raises ``RuntimeError`` naming a package it does not pin."""
    pins = _pins()
    names = [*GRADER_PACKAGES, *(["triton"] if notebook in TRITON_NOTEBOOKS else [])]
    missing = [n for n in names if n.lower().replace("_", "-") not in pins]
    if missing:
        raise RuntimeError(f"constraints.txt pins no version of {missing}")
    lines = ["# What the course's grader and the student's kernel import, at the course's exact versions",
             "# (grader.gradescope.GRADER_PACKAGES; installed with -c constraints.txt)."]
    return "\n".join(lines + [f"{n}=={pins[n.lower().replace('_', '-')]}" for n in names]) + "\n"


def reference_names(notebook: str) -> list[str]:
    """The reference's definitions the grader needs for ``notebook``: its exercises and every name of the
    reference that its checks (``course_utils/checks/nbNN.py``) or hidden cases (``instructor/nbNN.py``)
    mention, as a name, an attribute or a string (``expected.reference("...")``)."""
    from grader import reference_subset

    root = course.repo_root() / "course_utils"
    defined = set(reference_subset._defined(ast.parse(reference_subset.reference_path().read_text(encoding="utf-8"))))
    mentioned: set[str] = set(course.EXERCISES[notebook])
    for path in (root / "checks" / f"nb{notebook[:2]}.py", root / "instructor" / f"nb{notebook[:2]}.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if path.exists() else []:
            if isinstance(node, ast.Name):
                mentioned.add(node.id)
            elif isinstance(node, ast.Attribute):
                mentioned.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                mentioned.add(node.value)
    return reference_subset.needed(sorted(mentioned & defined))


def _kept(rel: str, notebook: str) -> bool:
    """Whether the course file ``rel`` (a path under the repository) belongs in ``notebook``'s zip."""
    parts = rel.split("/")
    if "__pycache__" in parts or rel.endswith(".pyc"):
        return False
    if rel.startswith("course_utils/instructor/"):
        return parts[-1] in ("__init__.py", f"nb{notebook[:2]}.py")
    if rel.startswith("course_utils/expected/"):
        return parts[-1] == f"{notebook}.pt"
    return rel != "course_utils/reference.py"  # written cut down


def _course_files(notebook: str) -> list[tuple[Path, str]]:
    """(file, path in the zip) of the course files the grader needs for ``notebook``."""
    root = course.repo_root()
    files = []
    for package in ("grader", "course_utils"):
        for path in sorted((root / package).rglob("*")):
            rel = path.relative_to(root).as_posix()
            if path.is_file() and _kept(rel, notebook):
                files.append((path, rel))
    for rel in (f"solutions/{notebook}.ipynb", f"solutions/src/{notebook}.py", f"notebooks/{notebook}.ipynb",
                "pyproject.toml", "constraints.txt"):
        if (root / rel).exists():
            files.append((root / rel, rel))
    return files


def _student_edition(notebook: str, folder: Path) -> None:
    """``folder/course_utils``: the student edition of the package (``grader.edition``'s rules: no answers,
    no hidden cases, the stub ``reference.py``) with ``notebook``'s recording."""
    from grader import edition

    package = folder / "course_utils"
    shutil.copytree(course.repo_root() / "course_utils", package, ignore=edition._ignore_instructor_only)
    shutil.copy2(edition.TEMPLATES / "reference.py", package / "reference.py")
    (package / "expected").mkdir()
    shutil.copy2(course.repo_root() / "course_utils" / "expected" / f"{notebook}.pt", package / "expected")


def _script(name: str, **values: object) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8").format(
        kernel_user=KERNEL_USER, floor=".".join(map(str, PYTHON_FLOOR)), floor_tuple=PYTHON_FLOOR, **values)


def build_autograder(notebook: str, out_zip: Path, time_limit: int | None = None) -> Path:
    """Write the Gradescope autograder zip of ``notebook`` (a course notebook name) to ``out_zip``; the
    notebook may run ``time_limit`` seconds (default :data:`TIME_LIMIT`)."""
    from grader import reference_subset

    time_limit = time_limit or TIME_LIMIT
    out_zip = Path(out_zip)
    out_zip.parent.mkdir(parents=True, exist_ok=True)
    timeout = (f"Gradescope's default Autograder timeout ({GRADESCOPE_TIMEOUT} s) leaves room for the rest."
               if time_limit + 120 <= GRADESCOPE_TIMEOUT else
               f"raise the Autograder timeout in Autograder Settings to at least {time_limit + 180} s.")
    if notebook in HEAVY_NOTEBOOKS:
        timeout += (" Grading this notebook comes near the default container's 768 MB of memory: in Autograder "
                    "Settings choose a container with more memory (and CPU). If your runs come near the "
                    "timeout on Gradescope's CPUs, raise the Autograder timeout and rebuild with a larger --time-limit.")
    advice = timeout
    texts = {"setup.sh": _script("setup.sh"),
             "run_autograder": _script("run_autograder", notebook=notebook, time_limit=time_limit),
             "README.md": README.format(notebook=notebook, time_limit=time_limit, advice=advice),
             "requirements.txt": requirements(notebook),
             "course_utils/reference.py": reference_subset.subset_source(reference_names(notebook))}
    tmp = out_zip.with_name(out_zip.name + ".partial")
    with tempfile.TemporaryDirectory(prefix="gradescope-build-") as build, \
            zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in texts.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = ((0o755 if name in ("setup.sh", "run_autograder") else 0o644) | stat.S_IFREG) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, text)
        for path, arcname in _course_files(notebook):
            z.write(path, arcname)
        _student_edition(notebook, Path(build))
        for path in sorted(Path(build).rglob("*")):
            if path.is_file():
                z.write(path, f"{EDITION}/{path.relative_to(build).as_posix()}")
    tmp.replace(out_zip)
    return out_zip


# ---------------------------------------------------------------------------------------------
# Inside Gradescope: grade one submission


def hidden_lines(source: str) -> set[int]:
    """1-based numbers of the lines of ``source`` inside ``### BEGIN/END HIDDEN TESTS`` blocks."""
    inside, lines = False, set()
    for number, line in enumerate(source.splitlines(), start=1):
        if line.strip().startswith(HIDDEN_BEGIN):
            inside = True
        if inside:
            lines.add(number)
        if line.strip().startswith(HIDDEN_END):
            inside = False
    return lines


def _check_calls(source: str) -> int:
    """How many ``check_*(...)`` calls the code ``source`` makes (as written, loops counted once)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return 0
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            count += name.startswith("check_")
    return count


def failed_in_visible_part(cell, visible_source: str) -> bool:
    """Whether a graded test cell failed in its visible check (the part the student ran in the
    notebook) rather than in its hidden tests.

    A check prints one ``✅`` line when it passes and raises when it fails, and the hidden tests
    run only after every visible check passed. So the cell failed in its visible part when it
    printed fewer ``✅`` lines than ``visible_source`` (the test cell without its hidden tests)
    makes check calls. Any doubt (no error, visible code that is not a check) answers ``False``,
    which keeps the result hidden until the grades are published.
    """
    ticks = 0
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            ticks += sum(1 for line in output.get("text", "").splitlines() if line.lstrip().startswith("✅"))
        elif output.get("output_type") == "error":
            return ticks < _check_calls(visible_source)
    return False


def _graded_cells(graded: Path) -> dict[str, object]:
    import nbformat

    from grader import cells as nbcells

    if not graded.exists():
        return {}
    nb = nbformat.read(graded, as_version=4)
    return {nbcells.grade_id(c): c for c in nb.cells if nbcells.is_test(c)}


def _why(status: str) -> str:
    """A file's status as the student reads it: what was wrong with it, without the grader's note that
    its name is not a course notebook's where the file could not be read at all."""
    parts = status.split("; ")
    if len(parts) > 1:
        parts = [p for p in parts if p != "unknown file name"]
    return "; ".join(parts)


def results_for(rows: list[dict], notebook: str, graded_nb: Path) -> dict:
    """Gradescope's results.json for the autograde ``rows`` of one submission."""
    from grader import intake

    src = intake.load_source(notebook)
    tests = sorted(src.tests.values(), key=lambda t: t.index)
    mine = [r for r in rows if r["notebook"] == notebook and r.get("cells")]
    others = [r for r in rows if r not in mine]
    def file(row: dict) -> str:  # as the student named it (the grader saw it in a folder "student/")
        return row["file"].split("/", 1)[1] if row["file"].startswith(f"{STUDENT}/") else row["file"]

    notes = [f"{file(r)}: {_why(r['status'])}" for r in others]
    if not mine:
        listed = "".join(f"\n- {note}" for note in notes) or "\n- no file was handed in"
        return {"output": f"Not graded: your submission holds no readable {notebook} notebook.{listed}\n"
                          f"Hand in your {notebook}.ipynb as Jupyter saved it (File > Save Notebook) and submit again.",
                "tests": [{"name": f"{t.exercise}: {t.grade_id}", "number": str(i), "score": 0.0,
                           "max_score": t.points, "status": "failed",
                           "output": "not graded: no readable notebook in the submission (see above)",
                           "visibility": "visible"} for i, t in enumerate(tests, start=1)],
                "stdout_visibility": "hidden", **FORMATS}
    row = mine[0]
    by_id = {c["grade_id"]: c for c in row["cells"]}
    graded = _graded_cells(graded_nb)
    entries = []
    for i, test in enumerate(tests, start=1):
        c = by_id.get(test.grade_id, {"score": 0.0, "max_score": test.points, "message": "not graded", "comment": ""})
        passed = c["max_score"] > 0 and c["score"] >= c["max_score"]
        has_hidden = bool(hidden_lines(test.source))
        cell = graded.get(test.grade_id)
        shown_now = (not has_hidden or bool(c.get("comment"))
                     or (not passed and cell is not None
                         and failed_in_visible_part(cell, intake.strip_hidden(test.source))))
        entries.append({"name": f"{test.exercise}: {test.grade_id}", "number": str(i),
                        "score": float(c["score"]), "max_score": float(c["max_score"]),
                        "status": "passed" if passed else "failed",
                        "output": (c.get("comment") or c.get("message") or "").strip(),
                        "visibility": "visible" if shown_now else "after_published"})
    output = f"{file(row)}: {row['status']}"
    if notes:
        output += "\nAlso handed in: " + "; ".join(notes)
    return {"output": output, "tests": entries, "stdout_visibility": "hidden", **FORMATS}


#: What the student reads when the grader could not grade (the instructor reads why in the log).
GRADER_FAILED = ("The autograder could not grade this submission because of a fault of its own, not because of "
                 "your answers; your instructor can see why. Submit again; if it happens again, tell your instructor.")


def _kernel_protection() -> str:
    """How the student's kernel will be kept from the answers here (one line for the instructor's log).

    Raises ``RuntimeError`` when neither bubblewrap nor the kernel's user can be had: the student's code
    would run as the grader, beside the answers."""
    from grader import runas
    from grader.sandbox import check_bwrap

    sandboxed, why = check_bwrap()
    if sandboxed:
        os.environ.pop(runas.USER_VARIABLE, None)
        return f"sandbox: {why}"  # "bubblewrap sandbox available (...)"
    try:
        user = runas.kernel_user()
    except runas.RunAsError as exc:
        raise RuntimeError(f"no sandbox ({why}) and {exc}: refusing to run the student's code") from None
    if user is None:
        raise RuntimeError(f"no sandbox ({why}) and no --kernel-user: refusing to run the student's code as "
                           f"{'root' if os.geteuid() == 0 else 'the grader'}")
    return (f"sandbox: not available ({why}); the kernel runs as {user.pw_name} (uid {user.pw_uid}) with the "
            f"student edition in {runas.edition()}")


def grade_submission(root: Path, notebook: str, time_limit: int = TIME_LIMIT) -> dict:
    """Grade ``root/submission`` with the course's grader, in this process; Gradescope's results (no timing).
    The grader's own messages go to stdout (the instructor's log) without the paths of its work folder,
    which is removed, followed by the instructor's report of the submission."""
    from grader import runas
    from grader.autograde import autograde
    from grader.intake import IGNORED_PARTS

    protection = _kernel_protection()
    print(protection)
    work = Path(tempfile.mkdtemp(prefix="gradescope-"))
    try:
        student = work / "submissions" / STUDENT
        student.mkdir(parents=True)
        submission = root / "submission"
        for path in sorted(submission.rglob("*")) if submission.is_dir() else []:
            rel = path.relative_to(submission)
            if path.is_file() and not any(p.startswith(".") or p in IGNORED_PARTS for p in rel.parts):
                (student / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, student / rel)
        out = work / "out"
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            code = autograde(work / "submissions", out, workers=0, allow_unsandboxed=True, progress=False,
                             layout="folders", notebook_timeout=time_limit)
        # The warning that student code runs with the grader's rights is not true of the kernel's user
        # (its protection is said above), and the work folder's paths are gone once this returns.
        text = re.sub(r"\n=+\n WARNING: GRADING WITHOUT A SANDBOX.*?\n=+\n", "\n", said.getvalue(), flags=re.S)
        if not protection.startswith("sandbox: bubblewrap"):
            text = text.replace("(UNSANDBOXED)", f"(the kernel as {os.environ.get(runas.USER_VARIABLE)})")
        text = text.replace(f"; see {out / 'grades.csv'} and {out / 'reports'}", " (the report is below)")
        print(text.strip().replace(str(out), "<grading folder, removed after grading>")
              .replace(str(work), "<work folder, removed after grading>"))
        rows = json.loads((out / "results.json").read_text(encoding="utf-8")) if (out / "results.json").exists() else []
        print(f"grader exit code {code}; rows:")
        for r in rows:
            print(f"  {r['file']}: {r['notebook']} {r['score']:g}/{r['max_score']:g} ({r['status']})")
        for report in sorted((out / "reports").glob("*.md")) if (out / "reports").is_dir() else []:
            print(f"\n--- the instructor's report ({report.name}) ---\n{report.read_text(encoding='utf-8')}")
        return results_for(rows, notebook, out / "nbgrader" / "autograded" / STUDENT / notebook / f"{notebook}.ipynb")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _end_student_processes() -> None:
    """Kill every process of the kernel's user (where kernels ran as one); raises if some survive."""
    from grader import runas

    try:
        user = runas.kernel_user()
    except runas.RunAsError:
        return
    if user is not None:
        seen = runas.kill_all(user)
        print(f"processes of {user.pw_name} left after grading: {seen} (killed)" if seen else
              f"processes of {user.pw_name} left after grading: none")


def write_results(results: Path, data: dict) -> Path:
    """``results/results.json`` with ``data``, written whole (a new file renamed over the old one) in a
    folder only root may read when the grader is root."""
    results.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(results, 0, 0)
        os.chmod(results, 0o700)
    partial = results / "results.json.partial"
    partial.unlink(missing_ok=True)
    with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=1, ensure_ascii=False))
    os.replace(partial, results / "results.json")
    return results / "results.json"


def run(root: Path, notebook: str, time_limit: int = TIME_LIMIT) -> int:
    """``run_autograder``'s work: grade, kill whatever the student's code left running, then write
    ``root/results/results.json`` (also when the grading itself fails: the student then reads that the
    grader failed, the instructor the traceback in stdout). Returns 0 once results.json is written."""
    start = time.time()
    try:
        data = grade_submission(root, notebook, time_limit)
    except Exception:  # noqa: BLE001 - results.json must be written whatever happens
        traceback.print_exc(file=sys.stdout)
        data = {"score": 0.0, "tests": [], "stdout_visibility": "hidden", **FORMATS,
                "output": GRADER_FAILED}
    try:
        _end_student_processes()
    except Exception:  # noqa: BLE001 - a process of the student's survived: no grade from this run
        traceback.print_exc(file=sys.stdout)
        data = {"score": 0.0, "tests": [], "stdout_visibility": "hidden", **FORMATS,
                "output": GRADER_FAILED}
    data["execution_time"] = round(time.time() - start)
    write_results(root / "results", data)
    return 0


def main(argv: list[str] | None = None) -> int:
    from grader import runas

    parser = argparse.ArgumentParser(prog="python -m grader.gradescope",
                                     description="grade /autograder/submission (what run_autograder runs)")
    parser.add_argument("root", nargs="?", default=os.environ.get(ROOT_VARIABLE, "/autograder"))
    parser.add_argument("--notebook", required=True)
    parser.add_argument("--time-limit", type=int, default=TIME_LIMIT, help="seconds the notebook may run")
    parser.add_argument("--kernel-user", default="", help="run the kernel as this user where bubblewrap cannot run")
    parser.add_argument("--edition", default="", help="the folder holding the student edition's course_utils")
    args = parser.parse_args(argv)
    if args.kernel_user:
        os.environ[runas.USER_VARIABLE] = args.kernel_user
        os.environ[runas.EDITION_VARIABLE] = args.edition
    return run(Path(args.root), args.notebook, args.time_limit)


if __name__ == "__main__":
    sys.exit(main())
