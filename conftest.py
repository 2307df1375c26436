"""pytest's set-up for the whole repository, loaded whatever path pytest is given (solutions/ included)."""

import os
import shutil
import tempfile
from pathlib import Path

from tests.support import other_cpu

_KERNELS: list[Path] = []


def pytest_configure(config):
    # nbval runs every solution notebook in a kernel that computes as another CPU would
    # (tests/support/other_cpu.py): the spec lives in a folder of this run's own, put first on JUPYTER_PATH.
    data_dir = Path(tempfile.mkdtemp(prefix="course-kernels-"))
    other_cpu.install_kernel(data_dir)
    _KERNELS.append(data_dir)
    os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(data_dir), os.environ.get("JUPYTER_PATH")) if p)


def pytest_unconfigure(config):
    for folder in _KERNELS:
        shutil.rmtree(folder, ignore_errors=True)
