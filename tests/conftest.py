import matplotlib
import pytest

# Figures drawn by notebook code run in this process (tests/support/harness.py) go nowhere. Only this
# process: setting MPLBACKEND in the environment would leak into the kernels nbval starts, and
# their figure outputs would no longer match the stored ones.
matplotlib.use("Agg")

# tests/fixtures/submissions/ holds deliberately broken student files for the grader's tests; they are
# data, not notebooks for nbval to execute.
collect_ignore_glob = ["fixtures/*"]


@pytest.fixture(scope="session")
def student_edition(tmp_path_factory):
    """The student edition of every notebook, built as `python -m grader release` builds it, and the
    wheel pip builds from it: ``(folder, wheel)``."""
    from grader import course
    from grader.edition import build_edition
    from tests.support import studentenv

    root = tmp_path_factory.mktemp("edition")
    folder = build_edition(course.available_notebooks(), root / "release")
    return folder, studentenv.build_wheel(folder, root / "dist")
