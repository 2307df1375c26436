"""pytest's set-up for the whole repository, loaded whatever path pytest is given (solutions/ included)."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.support import other_cpu, warm_kernel

_KERNELS: list[Path] = []


def pytest_configure(config):
    # nbval runs every solution notebook in a kernel that computes as another CPU would
    # (tests/support/other_cpu.py): the spec lives in a folder of this run's own, put first on JUPYTER_PATH.
    # Its kernels are forked from a pre-imported parent (tests/support/warm_kernel.py) where that is sound;
    # COURSE_COLD_KERNELS=1 starts every one cold.
    data_dir = Path(tempfile.mkdtemp(prefix="course-kernels-"))
    cold = os.environ.get("COURSE_COLD_KERNELS", "") not in ("", "0")
    if not cold:
        warm_kernel.register()
    other_cpu.install_kernel(data_dir, provisioner="" if cold else warm_kernel.PROVISIONER)
    _KERNELS.append(data_dir)
    # The grader's registered gradebooks (grader.config.cache_dir) are kept in this run's own folder, made
    # before pytest-xdist starts its workers (they inherit it), not in the user's ~/.cache: a run of the
    # tests leaves nothing behind, and each run registers the course as a class graded the first time would.
    if not os.environ.get("GRADER_CACHE_DIR"):
        cache = Path(tempfile.mkdtemp(prefix="course-grader-cache-"))
        os.environ["GRADER_CACHE_DIR"] = str(cache)
        _KERNELS.append(cache)
    os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(data_dir), os.environ.get("JUPYTER_PATH")) if p)


def pytest_unconfigure(config):
    for folder in _KERNELS:
        shutil.rmtree(folder, ignore_errors=True)


#: Test files that run in one pytest-xdist worker (``make test``: ``--dist loadfile``), because they share
#: what a process keeps: every solution notebook run in the process (``harness._executed``, 5 to 10 s each)
#: and the in-process verdicts of every known answer (``harness.test_verdicts``); or the graded class.
SHARED_WORKER = {
    "tests/grader_answers/test_judge.py": "known-answers",
    "tests/grader_answers/test_hidden_tests.py": "known-answers",
    "tests/checks/test_parity.py": "known-answers",
    "tests/checks/test_specs.py": "known-answers",
    "tests/grader_answers/test_handed_out.py": "known-answers",
    "tests/checks/test_serving.py": "known-answers",
    # The suite's one graded class (tests/support/graded_class.py), graded once for the files that submit to it.
    "tests/grader_answers/test_autograde.py": "graded-class",
    "tests/grader_messy/test_cheats.py": "graded-class",
    "tests/checks/test_capstone.py": "graded-class",
    "tests/grader_messy/test_warm.py": "graded-class",
}


#: The live expectations of the known-answers files, kept for the process: they judge about 1,500 answers
#: against the same cases and ask for 690 keys about 23,000 times (``expected.remembering``).
_EXPECTATIONS: dict = {}


@pytest.fixture(autouse=True)
def _known_answers_remember_expectations(request):
    """In the files of the ``known-answers`` group, each live expectation is computed once per worker."""
    if SHARED_WORKER.get(request.node.nodeid.split("::", 1)[0]) != "known-answers":
        yield
        return
    from course_utils.checks import expected

    with expected.remembering(_EXPECTATIONS):
        yield


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadfile`` every test file is one unit of work (a graded class, a JupyterLab, a
    notebook's kernel under nbval are made once per file), except that the files of
    :data:`SHARED_WORKER` form one unit together. (``--dist loadgroup`` would need pytest-xdist to rename
    test ids, which it cannot do under pytest 9.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return SHARED_WORKER.get(path, path)

    return SharedFileScheduling(config, log)
