"""nbgrader preprocessors the course adds to the autograding pipeline."""

from __future__ import annotations

from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.preprocessors import NbGraderPreprocessor


class StderrIsNotFailure(NbGraderPreprocessor):
    """Relabel ``stderr`` output of graded cells as ``stdout``, keeping its text.

    nbgrader treats any ``stderr`` stream in a test cell as a failure, so a passing test that
    triggers a harmless ``UserWarning`` from torch (or a tqdm bar) scores 0. A test fails when it
    raises, which nbgrader records as an ``error`` output; that is left untouched.
    """

    def preprocess_cell(self, cell: NotebookNode, resources: ResourcesDict, cell_index: int):
        if cell.cell_type == "code" and utils.is_grade(cell):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "stream" and output.get("name") == "stderr":
                    output["name"] = "stdout"
        return cell, resources


#: Marks the line the grader adds at the top of each test cell (stripped again in feedback).
PRELUDE_MARK = "# (added by the grader: the course's imports, so the tests use the real helpers)"


class RestoreImports(NbGraderPreprocessor):
    """Re-run the course notebook's own import lines at the top of every test cell.

    A test then always calls the real ``checks`` and ``torch``, even if a student deleted the
    import cell or rebound ``checks`` in a way the static rules did not see (``exec``). The
    lines come from the solution notebook, not from the submission.
    """

    def preprocess(self, nb: NotebookNode, resources: ResourcesDict):
        from grader import intake

        name = resources.get("nbgrader", {}).get("notebook")
        try:
            self._prelude = intake.load_source(name).imports if name else ""
        except FileNotFoundError:
            self._prelude = ""
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell: NotebookNode, resources: ResourcesDict, cell_index: int):
        if self._prelude and cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell):
            cell.source = f"{PRELUDE_MARK}\n{self._prelude}\n{cell.source}"
        return cell, resources
