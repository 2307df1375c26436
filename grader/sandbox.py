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

from jupyter_client.manager import AsyncKernelManager
from traitlets import Bool, Integer, List, Unicode

from grader import cgroups, runas
from grader.config import SETTINGS

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


#: Settings that make PyTorch and MKL compute as another CPU would; passed on to the kernel where set.
CPU_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")
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


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel runs in bubblewrap (or, if ``sandbox`` is off, only under limits).

    nbclient creates one per notebook (``Execute.kernel_manager_class``); the traits below are
    set through the nbgrader config.
    """

    sandbox = Bool(True, help="run the kernel in bubblewrap").tag(config=True)
    memory_limit = Integer(DEFAULT_MEMORY, help="address-space cap for the kernel, bytes (0: none)").tag(config=True)
    bwrap = Unicode("", help="bubblewrap executable (default: found on PATH)").tag(config=True)
    extra_env = List(Unicode(), help="VAR=VALUE pairs for the kernel's environment").tag(config=True)
    # Set per notebook by ``grader.execute.RobustExecute`` (see ``grader/judge.py``).
    probe_dir = Unicode("", help="the grader's folder the kernel hands its outputs out to")
    probe_inputs = Unicode("", help="the grader's file of hidden inputs the kernel reads")
    student_edition = Bool(False, help="show the kernel course_utils without answers or hidden cases")
    reference_subset = Unicode("", help="with student_edition: a file of a few helpers' answers "
                                        "(grader/reference_subset.py) shown as course_utils/reference.py")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        from grader import warm

        # The grading process's warm parent (grader/warm.py), or None: cold kernels. A warm kernel's files
        # live in a folder of its own under the parent's staging folder, where the parent can bind them.
        self._warm = warm.current() if self.sandbox else None
        self._stage = self._warm.stage() if self._warm is not None else None
        # Unix sockets in a private folder, bound into the sandbox at the same path.
        self._socket_dir = str(self._stage / "sockets") if self._stage is not None \
            else tempfile.mkdtemp(prefix="grader-kernel-")
        os.chmod(self._socket_dir, 0o700)
        self.transport = "ipc"
        self.ip = os.path.join(self._socket_dir, "k")
        self.connection_file = os.path.join(self._socket_dir, "kernel.json")

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        inner = super().format_kernel_cmd(extra_arguments)
        # Interrupt over the control channel: a SIGINT to the process group would hit bubblewrap
        # itself (which then ends the sandbox) rather than only the kernel.
        self.kernel_spec.interrupt_mode = "message"
        if not self.sandbox:
            user = runas.kernel_user()  # Gradescope: no bubblewrap, the kernel runs as an unprivileged user
            if user is not None:
                runas.hand_over(user, writable=[self._socket_dir], readable=[])
                return [*runas.drop_prefix(user), *limits_prefix(self.memory_limit), *inner]
            return [*limits_prefix(self.memory_limit), *inner]
        if self._forks():
            return inner  # for the record only: the warm parent forks the kernel (_async_launch_kernel)
        exe = self.bwrap or bwrap_path()
        if not exe:
            raise RuntimeError("bubblewrap is not available; refusing to run student code unsandboxed")
        cmd = sandbox_command(inner, socket_dir=self._socket_dir, memory=self.memory_limit, bwrap=exe,
                              probe_dir=self.probe_dir, probe_inputs=self.probe_inputs,
                              student_edition=self.student_edition, reference=self.reference_subset)
        # Caps on the kernel's processes, and on the memory they hold together (grader/cgroups.py), where
        # this machine lets the grader set them.
        self._remove_pids_group()
        self._pids_group = cgroups.make_group(memory_max=self.memory_limit or None)
        return (self._pids_group.join_prefix() if self._pids_group is not None else []) + cmd

    def _remove_pids_group(self) -> None:
        group = getattr(self, "_pids_group", None)
        if group is not None:
            group.remove()
            self._pids_group = None

    def _forks(self) -> bool:
        """Whether this kernel is forked from the warm parent: a sandboxed student-edition kernel (the one
        edition the parent imported) in a grading process with warm kernels on."""
        return self._warm is not None and self.sandbox and self.student_edition

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        if self._forks():
            try:
                process = self._warm.spawn(self._stage, connection_file=self.connection_file,
                                           env=kernel_env(self.probe_dir, self.probe_inputs), probe_dir=self.probe_dir,
                                           probe_inputs=self.probe_inputs, reference=self.reference_subset,
                                           memory=self.memory_limit)
            except (OSError, ValueError) as exc:
                print(f"grader: a warm kernel could not start ({exc}); this one is cold", file=sys.stderr)
                self._warm = None
                kernel_cmd = self.format_kernel_cmd()
            else:
                provisioner = self.provisioner
                provisioner.process, provisioner.pid, provisioner.pgid = process, process.pid, None
                provisioner.cwd = kw.get("cwd")
                self._reconcile_connection_info(provisioner.connection_info)
                return
        await super()._async_launch_kernel(kernel_cmd, **kw)

    async def _async_start_kernel(self, **kw):
        # The kernel's own banner goes to its stdout; the student's output travels over ZeroMQ.
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stdin", subprocess.DEVNULL)
        user = None if self.sandbox else runas.kernel_user()
        if user is not None:  # its own empty home, the student edition, only the hand-off of the grader's
            self._home = runas.make_home(user, self.reference_subset)
            hand_off = probe_env(self.probe_dir, self.probe_inputs, inside=False) if self.probe_dir else {}
            runas.hand_over(user, writable=[self.probe_dir], readable=[self.probe_inputs])
            kw["env"] = runas.kernel_env(self._home, extra=hand_off)
            kw["cwd"] = str(self._home)
        elif not self.sandbox and self.probe_dir and self.probe_inputs:
            # Unsandboxed (--allow-unsandboxed) the kernel inherits the environment: add the hand-off.
            kw["env"] = {**(kw.get("env") or os.environ),
                         **probe_env(self.probe_dir, self.probe_inputs, inside=False)}
        return await super()._async_start_kernel(**kw)

    start_kernel = _async_start_kernel  # type: ignore[assignment]

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        self._remove_pids_group()
        user = None if self.sandbox else runas.kernel_user()
        if user is not None:  # nothing the student's code started outlives its kernel
            runas.kill_all(user)
            shutil.rmtree(getattr(self, "_home", "") or "/nonexistent", ignore_errors=True)
        if not restart:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            if self._stage is not None:
                shutil.rmtree(self._stage, ignore_errors=True)

    cleanup_resources = _async_cleanup_resources  # type: ignore[assignment]
