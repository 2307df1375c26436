"""Computing as another CPU would, for the tests.

Students, JupyterHub images and CI runners have other CPUs than the machine a notebook was built on,
and float32 results differ between them in the last bits. PyTorch and MKL can be told to compute as a
plain SSE4.2 CPU would: ``ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2``.

nbval re-executes every solution notebook in a kernel named :data:`KERNEL_NAME` (``addopts`` in
``pyproject.toml``), which runs this environment's Python under that setting. The stored outputs are
made by ``make build`` on the build machine's own CPU, so every ``pytest`` run checks that they read the
same on another CPU: an output that prints float noise fails where the course is built, not on a
student's laptop.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: What makes PyTorch and MKL compute as another CPU would: no AVX2 or AVX-512 kernels.
OTHER_CPU = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}

#: The Jupyter kernel nbval runs the solution notebooks in.
KERNEL_NAME = "course-other-cpu"


def install_kernel(data_dir: Path, provisioner: str = "") -> Path:
    """Write the kernel spec :data:`KERNEL_NAME` under ``data_dir`` (a folder for ``JUPYTER_PATH``):
    this Python, computing as another CPU would, started by the kernel provisioner named ``provisioner``
    (default: jupyter_client's own). Returns the spec's folder."""
    folder = data_dir / "kernels" / KERNEL_NAME
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python (computing as another CPU)", "language": "python",
            "env": dict(OTHER_CPU), "metadata": {"debugger": False}}
    if provisioner:
        spec["metadata"]["kernel_provisioner"] = {"provisioner_name": provisioner}
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    return folder
