"""The course as another CPU computes it.

Students, JupyterHub images and CI runners have other CPUs than the machine a notebook was built on,
and float32 results differ between them in the last bits. PyTorch and MKL can be told to compute as a
plain SSE4.2 CPU would (``ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2``): under that
setting, the recordings must still be fresh and every stored notebook output must still match. So a
recording or an output that depends on the CPU fails here, where the course is built, not on a
student's laptop.

The stored outputs are checked by nbval itself, whose kernel computes as another CPU would
(tests/support/other_cpu.py); the tests below show that it does, and run ``python -m grader check-release`` there
(which ``make test`` runs this way only: a stale recording fails on any CPU).
"""

from __future__ import annotations

import os
import subprocess
import sys

from jupyter_client.manager import start_new_kernel

from grader import course
from tests.support.other_cpu import KERNEL_NAME, OTHER_CPU

PROBE = "import torch; print(torch.backends.cpu.get_cpu_capability())"


def _run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, **OTHER_CPU}
    return subprocess.run([sys.executable, *args], cwd=course.repo_root(), env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_setting_changes_how_pytorch_computes():
    assert _run("-c", PROBE).stdout.strip() == "DEFAULT"


def test_nbval_runs_the_notebooks_in_the_other_cpus_kernel(pytestconfig):
    assert pytestconfig.getoption("nbval_kernel_name") == KERNEL_NAME
    assert not pytestconfig.getoption("nbval_current_env"), "--nbval-current-env would run nbval on this CPU"
    manager, client = start_new_kernel(kernel_name=KERNEL_NAME)
    try:
        printed: list[str] = []
        reply = client.execute_interactive(
            PROBE + "; import sys; print(sys.executable)", timeout=60,
            output_hook=lambda msg: printed.append(msg["content"].get("text", "")))
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    capability, executable = "".join(printed).split()
    assert capability == "DEFAULT"
    assert os.path.realpath(executable) == os.path.realpath(sys.executable), "the kernel must run this environment's Python"


def test_check_release_passes_on_another_cpu():
    """``python -m grader check-release`` as a maintainer on another CPU runs it: the student notebooks are in
    sync with the solutions and every recording is fresh. A stale recording fails here on any CPU; a
    recording that depends on the CPU fails here too."""
    done = _run("-m", "grader", "check-release")
    assert done.returncode == 0, f"check-release on another CPU:\n{done.stdout[-4000:]}{done.stderr[-3000:]}"
