"""Run a student's kernel inside a bubblewrap sandbox, with time and memory limits.

The kernel sees a minimal, read-only file system built from a whitelist: the system's ``/usr``,
the Python installation and virtual environment, and the ``course_utils`` package (the test
cells need it). It does *not* see ``solutions/``, the rest of the repository (``.git`` holds
the solutions too), the grading folder with the gradebook, the submissions of anyone, or the
instructor's home. It has no network (``--unshare-all``), a private in-memory ``/tmp`` as its
working directory, an empty environment, and a memory cap (``prlimit --as``). Every process it
starts lives in its own PID namespace and dies with the kernel.

The kernel talks to the grader over Unix sockets (ZeroMQ ``ipc`` transport) in a private folder
bound into the sandbox: TCP on localhost would need the host's network.

Where bubblewrap cannot run (macOS, containers without user namespaces), :func:`check_bwrap`
says why; the grader then refuses to grade unless the instructor passes ``--allow-unsandboxed``.

This module builds the commands; the kernel manager that starts kernels with them, cold, forked from a
warm parent or as another user, is :class:`grader.kernels.SandboxedKernelManager`.
"""

from __future__ import annotations

import functools
import multiprocessing.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from grader.config import CPU_VARIABLES, SETTINGS

#: Memory per kernel (address space), bytes. torch needs ~1 GiB of address space to import.
DEFAULT_MEMORY = SETTINGS.memory
#: Size of the sandbox's private /tmp (in memory).
TMP_SIZE = 256 * 1024**2
#: Largest file the kernel may write, bytes.
MAX_FILE = 64 * 1024**2

_SYSTEM_RO = ["/usr", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/passwd",
              "/etc/group", "/etc/nsswitch.conf", "/etc/localtime", "/etc/fonts", "/etc/alternatives"]


def bwrap_path() -> str | None:
    """The bubblewrap executable (``$GRADER_BWRAP`` overrides, for tests), or ``None``."""
    override = os.environ.get("GRADER_BWRAP")
    if override is not None:
        return override if Path(override).is_file() else None
    return shutil.which("bwrap")


def check_bwrap() -> tuple[bool, str]:
    """Whether a bubblewrap sandbox with every namespace can start here, and if not, why."""
    exe = bwrap_path()
    if exe is None:
        return False, ("bubblewrap (`bwrap`) is not installed. On Debian/Ubuntu: "
                       "`sudo apt-get install -y bubblewrap` (or `make sandbox`).")
    cmd = [exe, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev",
           "--proc", "/proc", "--tmpfs", "/tmp", "true"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bubblewrap could not start: {exc}"
    if proc.returncode != 0:
        return False, ("bubblewrap is installed but cannot create a sandbox here (user namespaces "
                       f"disabled? inside a container?): {proc.stderr.strip() or proc.returncode}")
    return True, f"bubblewrap sandbox available ({exe})"


def readable_paths() -> list[str]:
    """Host paths the kernel needs to read: Python, the venv, and the course_utils package only."""
    import course_utils

    paths = [sys.base_prefix, sys.prefix, str(Path(sys.executable).resolve().parent.parent),
             str(Path(course_utils.__file__).resolve().parent)]
    # Packages installed elsewhere on sys.path (site-packages of the venv are already in).
    seen: list[str] = []
    for p in paths:
        p = str(Path(p).resolve())
        if p not in seen and Path(p).exists():
            seen.append(p)
    return seen


_adopted: list[Path | None] = []  # the font list a grading process was handed by its caller


def font_cache() -> Path | None:
    """A folder holding matplotlib's font list (``None`` if it cannot be built): the one the grading
    run handed this process (:func:`adopt_font_cache`), else one built once per process.

    Every kernel starts with an empty home in the sandbox, where matplotlib would build its font list
    again (about 0.5 s of CPU per notebook graded). The list is built once instead, from the same
    fonts the sandbox shows (``/usr``, ``/etc/fonts``, matplotlib's own) and an empty home, and each
    sandbox reads it through a read-only bind.
    """
    return _adopted[0] if _adopted else _build_font_cache()


def adopt_font_cache(folder: Path | None) -> None:
    """Use ``folder`` (built by :func:`font_cache` in the grading run's own process, which removes it
    when it ends) instead of building one in this grading process."""
    _adopted[:] = [folder] if folder is not None and folder.is_dir() else []


@functools.lru_cache(maxsize=1)
def _build_font_cache() -> Path | None:
    folder = Path(tempfile.mkdtemp(prefix="grader-mplconfig-"))
    # Removed when this process ends: multiprocessing's exit hooks run in the grading pool's workers,
    # where atexit's do not (a worker leaves through os._exit).
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(str(folder),), kwargs={"ignore_errors": True},
                                  exitpriority=0)
    home = folder / "home"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "MPLCONFIGDIR": str(folder / "mpl"),
           "MPLBACKEND": "Agg", "LANG": "C.UTF-8"}
    try:
        subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], env=env, capture_output=True,
                       timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    built = folder / "mpl"
    return built if any(built.glob("fontlist-*.json")) else None


#: Where the kernel sees the grader's hand-off folders (``grader/judge.py``): the folder it writes its
#: outputs to, and the read-only folder of the hidden inputs.
PROBE_DIR_INSIDE = "/tmp/course-probe"
PROBE_INPUTS_INSIDE = "/tmp/course-probe-inputs"


def student_edition_binds(reference: str = "") -> list[str]:
    """bubblewrap arguments that show the kernel the student edition of ``course_utils``: its
    ``instructor/`` folder empty, ``reference.py`` replaced by the student edition's stub (which
    raises ``ImportError``), or by ``reference`` (a file of a few helpers' answers,
    ``grader/reference_subset.py``), and that file's compiled copies emptied. Mounted over the
    package's own read-only bind, so nothing is copied."""
    from grader.edition import TEMPLATES

    package = Path(_course_utils_dir())
    args = ["--tmpfs", str(package / "instructor"),
            "--ro-bind", reference or str(TEMPLATES / "reference.py"), str(package / "reference.py")]
    for compiled in sorted((package / "__pycache__").glob("reference.*.pyc")):
        args += ["--ro-bind", "/dev/null", str(compiled)]
    return args


def _course_utils_dir() -> str:
    import course_utils

    return str(Path(course_utils.__file__).resolve().parent)


def probe_env(probe_dir: str, probe_inputs: str, *, inside: bool) -> dict[str, str]:
    """The kernel's environment variables that switch the hand-off on (:mod:`course_utils.checks.probe`):
    the paths as the kernel sees them, inside the sandbox or not."""
    from course_utils.checks import probe

    if inside:
        return {probe.DIR_VARIABLE: PROBE_DIR_INSIDE,
                probe.INPUTS_VARIABLE: f"{PROBE_INPUTS_INSIDE}/{Path(probe_inputs).name}"}
    return {probe.DIR_VARIABLE: probe_dir, probe.INPUTS_VARIABLE: probe_inputs}


def kernel_env(probe_dir: str = "", probe_inputs: str = "") -> dict[str, str]:
    """The sandboxed kernel's whole environment (a cold kernel's and a warm one's alike)."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp/home",
           "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/home/.matplotlib", "LANG": "C.UTF-8",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "NBGRADER_EXECUTION": "autograde", "COURSE_SANDBOX": "1",
           # course_utils where the grader has it (bound below), installed or not (Gradescope's zip).
           "PYTHONPATH": str(Path(_course_utils_dir()).parent)}
    # How this machine's PyTorch and MKL are told to compute (another CPU's instructions, issue 17): the
    # kernel computes as the grader does, as it would on one machine whose CPU they describe. The grader
    # compares the kernel's outputs with the reference's, computed in its own process.
    env.update({key: os.environ[key] for key in CPU_VARIABLES if os.environ.get(key)})
    if probe_dir and probe_inputs:
        env.update(probe_env(probe_dir, probe_inputs, inside=True))
    return env


def sandbox_command(inner: list[str], *, socket_dir: str, memory: int, bwrap: str, probe_dir: str = "",
                    probe_inputs: str = "", student_edition: bool = False, reference: str = "",
                    extra: list[str] | None = None) -> list[str]:
    """``inner`` wrapped in bubblewrap (see the module docstring) and ``prlimit``.

    With ``probe_dir`` and ``probe_inputs`` (a folder and a file of the grader's, ``grader/judge.py``)
    the kernel writes its outputs into that folder and reads the hidden inputs from that file; with
    ``student_edition`` it sees ``course_utils`` without the answers and the hidden cases, and with
    ``reference`` too (a file the grader wrote, ``grader/reference_subset.py``) it sees that file as
    ``course_utils/reference.py``: a few helpers' answers, nothing else. ``extra``: more bubblewrap
    arguments (the warm parent's, ``grader/warm.py``), after every bind above.

    Every capability is dropped (``--cap-drop ALL``): run as root, bubblewrap would otherwise leave the
    kernel all of them inside its user namespace, enough to unmount what hides ``instructor/``."""
    if reference and not student_edition:
        raise ValueError("a cut-down reference is shown only over the student edition")
    cmd = [bwrap, "--unshare-all", "--die-with-parent", "--clearenv", "--cap-drop", "ALL",
           # The private /tmp comes first: a later mount on top of it would hide the binds below
           # whenever the course itself lives under /tmp (a CI checkout, say).
           "--proc", "/proc", "--dev", "/dev", "--size", str(TMP_SIZE), "--tmpfs", "/tmp"]
    for src in _SYSTEM_RO:
        if os.path.lexists(src):
            cmd += ["--ro-bind", src, src]
    for link in ("bin", "lib", "lib64", "sbin"):
        target = Path("/") / link
        if target.is_symlink():
            cmd += ["--symlink", os.readlink(target), str(target)]
        elif target.is_dir():
            cmd += ["--ro-bind", str(target), str(target)]
    for path in readable_paths():
        cmd += ["--ro-bind", path, path]
    if student_edition:
        cmd += student_edition_binds(reference)
    cmd += ["--dir", "/tmp/work", "--dir", "/tmp/home", "--dir", "/tmp/home/.matplotlib",
            "--bind", socket_dir, socket_dir,
            "--chdir", "/tmp/work"]
    fonts = font_cache()
    for listing in sorted(fonts.glob("fontlist-*.json")) if fonts is not None else []:
        cmd += ["--ro-bind", str(listing), f"/tmp/home/.matplotlib/{listing.name}"]
    env = kernel_env(probe_dir, probe_inputs)
    if probe_dir and probe_inputs:
        cmd += ["--bind", probe_dir, PROBE_DIR_INSIDE,
                "--ro-bind", str(Path(probe_inputs).parent), PROBE_INPUTS_INSIDE]
    cmd += extra or []
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    return cmd + ["--", *limits_prefix(memory), *inner]


def limits_prefix(memory: int) -> list[str]:
    """``prlimit`` arguments for the memory and file-size caps (empty where prlimit is missing)."""
    exe = shutil.which("prlimit")
    if exe is None or memory <= 0:
        return []
    return [exe, f"--as={memory}", f"--fsize={MAX_FILE}", "--core=0", "--"]
