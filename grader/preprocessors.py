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
