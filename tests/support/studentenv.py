"""A student's machine, simulated: the student edition built, a fresh virtual environment that holds
none of the instructor edition, and a Jupyter kernel that runs in it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from course_utils.checks import expected


def build_wheel(folder: Path, dist: Path) -> Path:
    """The wheel ``pip`` builds from the student edition at ``folder``."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(dist), str(folder)], check=True)
    (wheel,) = dist.glob("*.whl")
    return wheel


#: The interpreter whose environment stands in for a student's (Colab's, a laptop's): its torch, numpy,
#: matplotlib, ipykernel and pip. Default: the course environment's (``make test-colab`` sets another).
STUDENT_PYTHON = "COURSE_STUDENT_PYTHON"


def fresh_venv(root: Path, base: Path | None = None) -> tuple[Path, Path]:
    """A new virtual environment at ``root/venv``: ``(python, site-packages)``.

    The third-party packages (torch, numpy, matplotlib, ipykernel, pip) are those of the environment
    whose interpreter is ``base`` (default: ``$COURSE_STUDENT_PYTHON``, else this interpreter's), read as a plain
    folder on ``sys.path``: its ``.pth`` files, among them the instructor edition's editable install
    of ``course_utils``, are not processed from there. So nothing of the instructor edition is
    importable, and pip sees that environment's torch as installed.
    """
    base = Path(base or os.environ.get(STUDENT_PYTHON) or sys.executable)
    venv = root / "venv"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(run(python, purelib, root).stdout.strip())
    deps = sysconfig.get_paths()["purelib"] if base == Path(sys.executable) else run(base, purelib, root).stdout.strip()
    (site / "course_deps.pth").write_text(deps + "\n")
    return python, site


def install(wheel: Path, site: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "--target", str(site), str(wheel)], check=True)


def triton_runs(python: Path, cwd: Path) -> bool:
    """Whether an environment with ``course_utils`` installed can run the Triton kernels of notebooks 07
    and 10 (``flash.triton_status``: not where its Triton is older than ``flash.TRITON_FLOOR``)."""
    said = run(python, "from course_utils import flash; print(flash.triton_status()[0])", cwd)
    assert said.stdout.strip() in ("True", "False"), said.stderr
    return said.stdout.strip() == "True"


#: What a Triton check says where the environment's Triton cannot run the kernels (flash.triton_status).
TRITON_TOO_OLD = ("skipped: this kernel has Triton", "these kernels need")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would point a child at the instructor edition."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", expected.MODE_VARIABLE, "COURSE_ROOT")}
    env.update(extra)
    return env


def run(python: Path, code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code], cwd=cwd, capture_output=True, text=True, env=clean_env(**env))


def add_kernel(root: Path, python: Path, name: str, env: dict[str, str] | None = None) -> Path:
    """A kernel spec ``name`` that runs ``python``, each kernel forked from a parent that has imported what
    kernels import (tests/support/warm_kernel.py); returns the folder to put on ``JUPYTER_PATH``."""
    from tests.support import warm_kernel

    folder = root / "jupyter"
    spec = folder / "kernels" / name
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": name, "language": "python",
        "env": {"PYTHONPATH": "", "MPLBACKEND": "module://matplotlib_inline.backend_inline", **(env or {})},
        "metadata": warm_kernel.spec_metadata()}))
    return folder


def execute(nb, jupyter_path: Path, kernel: str, cwd: Path, allow_errors: bool, timeout: int = 300):
    """Run ``nb`` top to bottom in the kernel ``kernel`` whose spec lies under ``jupyter_path``.

    The kernel spec is looked up by a kernel manager of its own (no process-wide ``JUPYTER_PATH``), so
    several notebooks can run at once from threads.
    """
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    from grader.kernels import ReadyClient

    specs = KernelSpecManager(kernel_dirs=[str(Path(jupyter_path) / "kernels")])
    manager = AsyncKernelManager(kernel_name=kernel, kernel_spec_manager=specs, client_factory=ReadyClient)
    # Stopped at once after the last cell, as the grader stops its kernels: nothing a test reads happens
    # later, and a graceful exit costs 1 to 2 s per notebook of waiting for Python to wind torch down.
    # nbclient stops only a kernel it made itself unless told (cleanup_kc): without it, each kernel ran on
    # until the test session ended, and left its connection file in /tmp.
    NotebookClient(nb, km=manager, timeout=timeout, allow_errors=allow_errors, shutdown_kernel="immediate",
                   resources={"metadata": {"path": str(cwd)}}).execute(cleanup_kc=True)
    return nb


def output_text(cell) -> str:
    """What a cell printed, and the message of the error it raised."""
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.get("text", ""))
        elif out.output_type == "error":
            parts.append(f"{out.get('ename', '')}: {out.get('evalue', '')}")
    return "".join(parts)
