"""The course as another CPU computes it.

Students, JupyterHub images and CI runners have other CPUs than the machine a notebook was built on,
and float32 results differ between them in the last bits. PyTorch and MKL can be told to compute as a
plain SSE4.2 CPU would (``ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2``): under that
setting, the recordings must still be fresh and every stored notebook output must still match. So a
recording or an output that depends on the CPU fails here, where the course is built, not on a
student's laptop.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grader import course

#: What makes PyTorch and MKL compute as another CPU would: no AVX2 or AVX-512 kernels.
OTHER_CPU = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}


def _run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, **OTHER_CPU}
    return subprocess.run([sys.executable, *args], cwd=course.repo_root(), env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_setting_changes_how_pytorch_computes():
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    assert _run("-c", probe).stdout.strip() == "DEFAULT"


def test_the_recordings_are_fresh_on_another_cpu():
    code = ("import sys; from grader import record; problems = record.stale(); "
            "[print(f'{name}: {why}') for name, why in problems.items()]; sys.exit(1 if problems else 0)")
    done = _run("-c", code)
    assert done.returncode == 0, f"recordings that depend on the CPU:\n{done.stdout}{done.stderr[-3000:]}"


@pytest.mark.skipif(bool(os.environ.get("ATEN_CPU_CAPABILITY")),
                    reason="ATEN_CPU_CAPABILITY is already set: this run's own nbval is the other CPU's")
def test_stored_outputs_match_on_another_cpu():
    done = _run("-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header",
                "-o", "addopts=", "--nbval", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg",
                "--nbval-current-env", str(course.solutions_dir()))
    assert done.returncode == 0, f"stored outputs that depend on the CPU:\n{done.stdout[-6000:]}{done.stderr[-2000:]}"
