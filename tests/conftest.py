import os

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


@pytest.fixture(scope="session")
def graded_class(tmp_path_factory):
    """The class of every file that registered submissions (``tests/support/graded_class.py``), graded
    in one sandboxed ``autograde`` run."""
    from tests.support import graded_class

    return graded_class.grade(tmp_path_factory.mktemp("class"))


# ---------------------------------------------------------------------------------------------
# `make test` runs pytest on two workers (`-n 2 --dist loadfile --no-loadscope-reorder`). Each test
# file runs whole on one worker, so its module fixtures (a graded class, a JupyterLab, one notebook's
# kernel under nbval) are made once (three files that share what a process keeps run together:
# SHARED_WORKER in conftest.py), and the longest files start first, so that both workers finish
# at about the same time. `pytest` alone still runs everything, in file order.

#: The longest test files, longest first (measured: CPU-seconds per file of a whole run with
#: scripts/profile_tests.py, 2026-11-27, kernels and grading processes included, less what warm kernels
#: save in nbval and the student environment); the rest follow in order. A file whose graded class
#: keeps both cores busy counts as long as its CPU says, not as its wall time on a busy machine.
LONGEST_FIRST = [
    "tests/grader_answers/test_judge.py",  # with test_hidden_tests.py, test_parity.py, test_specs.py... (conftest.py)
    "tests/grader_answers/test_hidden_tests.py",  # before test_parity.py, which judges the runs of its test cells
    "tests/grader_messy/test_cheats.py",  # the one graded class (conftest.py), 240, with the three files below
    "tests/grader_answers/test_autograde.py",
    "tests/grader_messy/test_warm.py",  # 60
    "tests/checks/test_capstone.py",  # 15
    "tests/release/test_editions.py",  # 75
    "tests/release/test_browser.py",  # 60
    "tests/grader_messy/test_grader_e2e.py",  # 45
    "tests/release/test_colab.py",  # make test-colab only
    "tests/grader_answers/test_first_try.py",  # 30
    "solutions/09_capstone_tiny_transformer.ipynb",  # 25 (nbval)
    "tests/grader_messy/test_grader_shards.py",  # 25
    "tests/grader_messy/test_gradescope.py",  # 18
    "tests/grader_messy/test_similarity.py",  # 17
    "tests/release/test_other_cpu.py",  # 16
    "tests/release/test_release.py",  # 16
    "solutions/08_kv_cache_gqa_and_windows.ipynb",  # 12
    "solutions/10_flash_attention_backward.ipynb",  # 10
    "solutions/06_efficient_attention_gpu.ipynb",  # 9
    "solutions/07_flash_attention_from_scratch.ipynb",  # 6
    "tests/grader_messy/test_lms.py",
]


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker collects; the first one's order is the plan
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable within a file
