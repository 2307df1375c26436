"""A class of messy and adversarial submissions for notebook 01, built from the course's own notebooks.

Most cases are generated with nbformat from ``solutions/01_dot_products.ipynb`` and
``notebooks/01_dot_products.ipynb`` so they follow the notebook as it changes; only truly odd
files live in ``files/``. :func:`build` writes them into ``SUBMISSIONS/<student>/...`` and returns
what the grader must make of each: :class:`Expect` per (student, notebook column).
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from grader import course

NB = "01_dot_products"
FILES = Path(__file__).parent / "files"
FULL = 7.0  # notebook 01: test_dot 2, test_attention_scores_for_query 2, test_attention_scores 3
POINTS = {"test_dot": 2.0, "test_attention_scores_for_query": 2.0, "test_attention_scores": 3.0}
#: A marker in the command line of the process that the "background" submission leaves running.
BACKGROUND_MARKER = "4242.4242"


@dataclass
class Expect:
    """What the grader must report for one row."""

    score: float | None  # exact total, or None when only the status matters
    status: list[str] = field(default_factory=list)  # substrings of the status column
    cells: dict[str, float] = field(default_factory=dict)  # grade_id -> exact score
    max_score: float | None = None
    what: str = ""  # the case, in words (for the report)


def _gid(cell) -> str | None:
    return (cell.get("metadata", {}).get("nbgrader") or {}).get("grade_id")


def solution() -> nbformat.NotebookNode:
    return nbformat.read(course.solutions_dir() / f"{NB}.ipynb", as_version=4)


def blank() -> nbformat.NotebookNode:
    return nbformat.read(course.notebooks_dir() / f"{NB}.ipynb", as_version=4)


def good_answers() -> dict[str, str]:
    """The solution's answer cells without the solution markers, as a student would have them."""
    return {_gid(c): "\n".join(l for l in c.source.splitlines() if "### " not in l)
            for c in solution().cells if (c.get("metadata", {}).get("nbgrader") or {}).get("solution")}


def filled(**answers: str) -> nbformat.NotebookNode:
    """The released student notebook with every answer filled in (``answers`` override)."""
    nb = blank()
    good = good_answers()
    for cell in nb.cells:
        gid = _gid(cell)
        if gid in good:
            cell.source = answers.get(gid, good[gid])
    return nb


def strip_metadata(nb: nbformat.NotebookNode, colab: bool = True) -> nbformat.NotebookNode:
    """What Colab or a copy and paste into a new notebook leaves: no nbgrader metadata at all."""
    nb = copy.deepcopy(nb)
    for i, cell in enumerate(nb.cells):
        cell.metadata = {"id": f"colab{i:03d}"} if colab else {}
        cell.pop("id", None)
    if colab:
        nb.metadata = {"colab": {"provenance": []}, "kernelspec": {"name": "python3", "display_name": "Python 3"}}
    return nb


def saved_by_colab(nb: nbformat.NotebookNode) -> bytes:
    """The file Colab writes: nbformat 4.0 (no cell ids), a random ``metadata.id`` per cell, its own
    ``colab`` keys on the notebook, cells and outputs, execution counts, and the outputs of the
    student's last run (here a failed check still on screen), with sources as lists of lines."""
    import json
    import random

    rng = random.Random(7)
    cells = []
    for i, cell in enumerate(nb.cells):
        meta = {**cell.metadata, "id": "".join(rng.choice("abcdefghijkLMNOPQ0123456789_-") for _ in range(12))}
        out = {"cell_type": cell.cell_type, "metadata": meta, "source": cell.source.splitlines(keepends=True)}
        if cell.cell_type == "code":
            meta["colab"] = {"base_uri": "https://localhost:8080/"}
            meta["outputId"] = f"{i:08x}-7c1e-4b55-9d6c-2f0e3a1b5c{i:02d}"
            out["execution_count"] = i + 1
            out["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["printed in Colab\n"]}]
            if (_gid(cell) or "").startswith("test_"):
                out["outputs"].append({"output_type": "error", "ename": "AssertionError",
                                       "evalue": "❌ dot on case 'book': values differ",
                                       "traceback": ["\u001b[0;31mAssertionError\u001b[0m: ❌ dot"]})
        cells.append(out)
    doc = {"nbformat": 4, "nbformat_minor": 0, "cells": cells, "metadata": {
        "colab": {"provenance": [], "name": f"{NB}.ipynb", "gpuType": "T4"}, "accelerator": "GPU",
        "kernelspec": {"name": "python3", "display_name": "Python 3"}, "language_info": {"name": "python"}}}
    return json.dumps(doc, indent=2, ensure_ascii=False).encode("utf-8")


def saved_by_vscode(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """What VS Code's Jupyter extension writes: ``vscode`` cell metadata, its own kernelspec and
    language_info, fresh cell ids, and the outputs of the last run."""
    nb = copy.deepcopy(nb)
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{i:04x}c0de"
        if cell.cell_type == "code":
            cell.metadata["vscode"] = {"languageId": "python"}
            cell.execution_count = i + 1
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="printed in VS Code\n")]
    nb.metadata = {"kernelspec": {"display_name": ".venv (3.11.7)", "language": "python", "name": "python3"},
                   "language_info": {"name": "python", "version": "3.11.7", "mimetype": "text/x-python",
                                     "file_extension": ".py", "pygments_lexer": "ipython3",
                                     "codemirror_mode": {"name": "ipython", "version": 3}}}
    return nb


def index_of(nb, grade_id: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if _gid(c) == grade_id)


def code(source: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(source)


def _write(folder: Path, name: str, nb_or_bytes, mtime: float | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if isinstance(nb_or_bytes, bytes):
        path.write_bytes(nb_or_bytes)
    else:
        nbformat.write(nb_or_bytes, path)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


# Answers that misbehave ------------------------------------------------------------------------

DOT_WRONG = "def dot(x, y):\n    total = torch.zeros(())\n    for i in range(len(x)):\n        total = total + x[i]\n    return total"
DOT_LIBRARY = "def dot(x, y):\n    return torch.dot(x, y)"
DOT_REFERENCE = ("from course_utils.reference import dot as _ref\n\n"
                 "def dot(x, y):\n    for _ in range(1):\n        pass\n    return _ref(x, y)")
DOT_STDERR = ("import sys, warnings\n\ndef dot(x, y):\n    sys.stderr.write('debug: computing a dot product\\n')\n"
              "    warnings.warn('a harmless warning from the student')\n    total = torch.zeros((), dtype=x.dtype)\n"
              "    for i in range(x.shape[0]):\n        total = total + x[i] * y[i]\n    return total")
DOT_OS_EXIT = "import os\n\ndef dot(x, y):\n    for _ in x:\n        os._exit(1)"
DOT_MEMORY = ("def dot(x, y):\n    hog = torch.ones(800_000_000)  # 3.2 GB, over the 2 GiB cap\n"
              "    total = torch.zeros((), dtype=x.dtype)\n    for i in range(x.shape[0]):\n"
              "        total = total + x[i] * y[i]\n    return total + hog[0] * 0")
SCORES_LOOP = "def attention_scores(inputs):\n    while True:\n        pass"
SCORES_STUBBORN = ("import time\n\ndef attention_scores(inputs):\n    while True:\n        try:\n"
                   "            time.sleep(0.2)\n        except KeyboardInterrupt:\n            pass")
QUERY_PATCH_TORCH = ("def attention_scores_for_query(inputs, query):\n    torch.allclose = lambda *a, **k: True\n"
                     "    return inputs @ query")
SCORES_WRONG = "def attention_scores(inputs):\n    return inputs @ inputs.T"


def build(root: Path, secrets: dict[str, str]) -> dict[tuple[str, str], Expect]:
    """Write the class into ``root``; return the expected outcome per (student, notebook column).

    ``secrets`` names what the sandbox must hide: ``solution`` (a file in solutions/),
    ``gradebook_dir`` (the nbgrader folder of the run), ``other_student`` (another student's
    submission), ``decoy`` (a folder standing for the instructor's own files), ``submissions`` and
    ``out``. The deleting case only targets temporary folders, never the repository.
    """
    plan: dict[tuple[str, str], Expect] = {}
    old = time.time() - 86400

    def put(student: str, nb, expect: Expect, name: str = f"{NB}.ipynb", sub: str = "", mtime=None, row=NB):
        _write(root / student / sub, name, nb, mtime)
        if expect is not None:
            plan[(student, row)] = expect

    full = Expect(FULL, ["ok"], dict(POINTS))
    put("solution", solution(), Expect(FULL, ["ok"], dict(POINTS), what="the solution notebook itself"))
    put("blank", blank(), Expect(0.0, ["ok"], {k: 0.0 for k in POINTS}, what="the untouched student notebook"))
    put("good", filled(), Expect(FULL, ["ok"], dict(POINTS), what="a correct submission"))

    # --- intake and repair --------------------------------------------------------------------
    put("colab", strip_metadata(filled()),
        Expect(FULL, ["ok", "metadata restored"], dict(POINTS), what="Colab: all nbgrader metadata lost"))
    put("colab_saved", saved_by_colab(filled()), Expect(FULL, ["ok"], dict(POINTS),
        what="saved by Colab: nbformat 4.0, colab metadata and ids, old outputs with a failed check"))
    put("vscode_saved", saved_by_vscode(filled()), Expect(FULL, ["ok"], dict(POINTS),
        what="saved by VS Code: vscode cell metadata, its kernelspec, cell ids, old outputs"))
    put("vscode_copy", strip_metadata(filled(), colab=False), Expect(FULL, ["ok", "metadata restored"], dict(POINTS),
        what="'Copy of ... (1).ipynb', in a nested folder, metadata lost"),
        name=f"Copy of {NB.replace('_', ' ').upper()} (1).ipynb", sub="week 1/final")

    nb = filled(dot=DOT_WRONG)
    nb.cells.insert(index_of(nb, "dot") + 1, copy.deepcopy(nb.cells[index_of(nb, "dot")]))  # duplicated answer...
    nb.cells[index_of(nb, "dot") + 1].source = good_answers()["dot"]  # ...the last definition is right
    nb.cells.insert(len(nb.cells), copy.deepcopy(nb.cells[index_of(nb, "test_dot")]))  # duplicated test cell
    test = nb.cells.pop(index_of(nb, "test_attention_scores"))  # a test moved above its answer
    nb.cells.insert(index_of(nb, "attention_scores") - 1, test)
    put("moved_dup", nb, Expect(FULL, ["ok", "duplicated cells ignored", "moved below their answer"], dict(POINTS),
                                what="answer and test duplicated (last answer right), a test moved above its answer"))

    nb = filled()
    del nb.cells[index_of(nb, "test_attention_scores")]
    put("deleted_test", nb, Expect(FULL, ["missing tests restored: test_attention_scores"], dict(POINTS),
                                   what="a test cell deleted"))

    nb = filled(dot=DOT_WRONG)
    nb.cells[index_of(nb, "test_dot")].source = "# I fixed the test\npass"
    nb = strip_metadata(nb)
    nb.cells.insert(0, code("print('scratch')"))
    put("edited_test", nb, Expect(5.0, ["restored: test_dot"], {**POINTS, "test_dot": 0.0},
                                  what="test cell replaced by `pass` and metadata lost; wrong dot"))

    nb = filled(dot=DOT_WRONG)
    nb.cells[index_of(nb, "test_dot")].source = "checks.check_dot(dot)  # edited but kept its metadata\nassert True"
    put("edited_locked", nb, Expect(5.0, ["edited tests restored: test_dot"], {**POINTS, "test_dot": 0.0},
                                    what="locked test cell edited, metadata kept; wrong dot"))

    put("stderr", filled(dot=DOT_STDERR), Expect(FULL, ["ok"], dict(POINTS),
                                                 what="a passing answer that writes to stderr and warns"))

    put("renamed", solution(), Expect(FULL, ["recognised by content"], dict(POINTS),
                                      what="unknown file name, recognised by its content"),
        name="assignment_final.ipynb")
    put("two_files", blank(), None, mtime=old)
    put("two_files", filled(), Expect(FULL, ["newest of 2 files"], dict(POINTS),
                                      what="two files for 01: the newest is graded"),
        name=f"{NB} (1).ipynb")

    # --- files that cannot be graded ------------------------------------------------------------
    put("odd", (FILES / "01_dot_products.py").read_bytes(), Expect(0.0, ["not a notebook (.py file)"],
        what="a .py file instead of the notebook"), name="01_dot_products.py", row="01_dot_products.py")
    put("odd", (FILES / "notes.txt").read_bytes(), Expect(0.0, ["not a notebook (.txt file)"],
        what="a text file"), name="notes.txt", row="notes.txt")
    put("broken_json", (FILES / "truncated.ipynb").read_bytes(),
        Expect(0.0, ["invalid notebook: not valid JSON"], what="a truncated .ipynb"))
    put("zero_bytes", b"", Expect(0.0, ["empty file"], what="a 0-byte .ipynb"))
    empty = nbformat.v4.new_notebook()
    empty.cells = [nbformat.v4.new_markdown_cell("nothing here"), code("")]
    put("empty_nb", empty, Expect(0.0, ["empty notebook"], what="a notebook without code"))
    put("other_course", (FILES / "other_course.ipynb").read_bytes(),
        Expect(0.0, ["another course's notebook", "fit_line"], what="another course's notebook under our name"))
    put("other_course", (FILES / "other_course.ipynb").read_bytes(),
        Expect(0.0, ["another course's notebook", "unknown file name"], what="another course's notebook, its own name"),
        name="hw3_regression.ipynb", row="hw3_regression.ipynb")
    put("unknown", strip_metadata(nbformat.v4.new_notebook(cells=[code("x = 1\nprint(x)")])),
        Expect(0.0, ["unknown file name"], what="an unrelated notebook with an unknown name"),
        name="scratch.ipynb", row="scratch.ipynb")
    (root / "loose.ipynb").write_bytes(nbformat.writes(blank()).encode())
    plan[("", "loose.ipynb")] = Expect(0.0, ["not in a student folder"], what="a file outside any student folder")

    # --- untrusted code ---------------------------------------------------------------------
    put("infinite_loop", filled(attention_scores=SCORES_LOOP),
        Expect(4.0, ["CellTimeoutError"], {**POINTS, "test_attention_scores": 0.0}, what="`while True: pass`"))
    put("stubborn_loop", filled(attention_scores=SCORES_STUBBORN),
        Expect(4.0, ["CellTimeoutError"], {**POINTS, "test_attention_scores": 0.0},
               what="a loop that swallows KeyboardInterrupt"))
    nb = filled(dot=DOT_MEMORY)
    nb.cells.insert(index_of(nb, "attention_scores"), code("hog = [0] * 600_000_000  # 4.8 GB of list"))
    put("memory_bomb", nb, Expect(5.0, ["ok", "memory limit"], {**POINTS, "test_dot": 0.0},
                                  what="3.2 GB tensor inside dot, 4.8 GB list in a scratch cell"))
    nb = filled()
    nb.cells.insert(index_of(nb, "attention_scores"), code("import sys\nsys.exit('bye')"))
    put("sys_exit", nb, Expect(FULL, ["ok"], dict(POINTS), what="sys.exit() in a cell"))
    put("os_exit", filled(dot=DOT_OS_EXIT), Expect(5.0, ["KernelDied"], {**POINTS, "test_dot": 0.0},
                                                   what="os._exit(1) inside dot"))
    nb = filled()
    nb.cells.insert(index_of(nb, "dot"), code(
        "import subprocess, threading, time\n"
        f"bg = subprocess.Popen(['sleep', '{BACKGROUND_MARKER}'])\n"
        "threading.Thread(target=lambda: [time.sleep(0.01) for _ in iter(int, 1)], daemon=True).start()\n"
        "print('left running:', bg.pid)"))
    put("background", nb, Expect(FULL, ["ok"], dict(POINTS), what="a background process and thread left running"))
    nb = filled()
    targets = [secrets["decoy"], secrets["submissions"], secrets["out"]]
    nb.cells.insert(index_of(nb, "dot"), code(
        "import os, shutil, pathlib\n"
        "shutil.rmtree(os.getcwd(), ignore_errors=True)\n"
        f"for p in {targets!r}:\n"
        "    shutil.rmtree(p, ignore_errors=True)\n"
        "    print('tried to delete', p, '-> still there for me:', os.path.exists(p))"))
    put("deleter", nb, Expect(FULL, ["ok"], dict(POINTS), what="a cell that deletes its folder and guessed paths"))
    nb = filled()
    nb.cells.insert(index_of(nb, "dot"), code(
        "import os, socket, urllib.request\n"
        "leaks = []\n"
        f"for p in {[secrets['solution'], secrets['other_student'], secrets['gradebook_dir'], secrets['decoy']]!r}:\n"
        "    try:\n"
        "        if os.path.isdir(p):\n"
        "            leaks.append((p, os.listdir(p)))\n"
        "        else:\n"
        "            leaks.append((p, open(p, 'rb').read(20)))\n"
        "    except OSError:\n"
        "        pass\n"
        "for host, port in [('1.1.1.1', 53), ('127.0.0.1', 22)]:\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=2).close()\n"
        "        leaks.append(('network', host))\n"
        "    except OSError:\n"
        "        pass\n"
        "print('SNOOP-RESULT', 'LEAKED' if leaks else 'NOTHING', leaks)"))
    put("snoop", nb, Expect(FULL, ["ok"], dict(POINTS),
                            what="reads solutions/, another student's file, the gradebook, the instructor's files; opens sockets"))

    # --- rules --------------------------------------------------------------------------------
    put("library_call", filled(dot=DOT_LIBRARY), Expect(5.0, ["rule broken", "torch.dot"], {**POINTS, "test_dot": 0.0},
                                                        what="torch.dot inside dot"))
    put("imports_reference", filled(dot=DOT_REFERENCE),
        Expect(5.0, ["rule broken", "course_utils.reference"], {**POINTS, "test_dot": 0.0},
               what="dot imports course_utils.reference"))
    put("patches_torch", filled(attention_scores_for_query=QUERY_PATCH_TORCH),
        Expect(5.0, ["rule broken", "torch.allclose"], {**POINTS, "test_attention_scores_for_query": 0.0},
               what="an answer reassigns torch.allclose"))
    nb = filled(attention_scores=SCORES_WRONG)
    nb.cells.insert(index_of(nb, "attention_scores"), code(
        "checks.check_attention_scores = lambda *args, **kwargs: print('✅ looks fine')"))
    put("patches_checks", nb, Expect(4.0, ["rule broken", "checks.check_attention_scores"],
                                     {**POINTS, "test_attention_scores": 0.0},
                                     what="an extra cell replaces a check with a no-op"))
    nb = filled(attention_scores=SCORES_WRONG)
    nb.cells.insert(index_of(nb, "attention_scores"), code(
        "exec('class checks:\\n    check_attention_scores = staticmethod(lambda *a, **k: None)')"))
    put("exec_checks", nb, Expect(4.0, ["ok"], {**POINTS, "test_attention_scores": 0.0},
                                  what="rebinds `checks` through exec (unseen by the rules): the tests re-import it"))
    return plan
