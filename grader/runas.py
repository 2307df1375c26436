"""A student's kernel as an unprivileged user: the grader's protection where bubblewrap cannot run.

Gradescope's Docker containers run the autograder as root under Docker's default seccomp profile,
which stops bubblewrap. There the grader (root) starts each kernel as the user that ``setup.sh``
created (:data:`grader.gradescope.KERNEL_USER`), so that file permissions, not a sandbox, keep the
answers and the results out of the student's reach:

* the kernel is started through ``setpriv``: that user's uid and gid, no supplementary groups, no
  capabilities (inherited or bounding), ``no_new_privs`` (a set-uid program cannot give root back);
* its environment is built from nothing (:func:`kernel_env`): ``PYTHONPATH`` points at a
  student-edition copy of ``course_utils`` (``grader.edition``: no ``reference.py`` answers, no
  ``instructor/`` hidden cases), made readable to all by ``setup.sh``; its home and working folder
  are a fresh empty folder of its own;
* of the grader's folders it may write only its socket folder and the hand-off folder, and read only
  the hand-off's file of hidden inputs (inputs are not secret, ``grader/judge.py``): each is handed
  to the user by :func:`hand_over` just before the kernel starts;
* every process of the user is killed (:func:`kill_all`) whenever a kernel is cleaned up, so nothing
  the student started (a detached process, a daemon) outlives the kernel: the grader then reads the
  hand-off folder, and later writes ``results.json``, with no process of the student's left.

``/autograder/source`` (the grader, the notebook's hidden tests, the reference answers it needs) and
``/autograder/results`` are root's alone (``run_autograder`` makes them so). What this does not give
(no PID, network or mount namespace, no cgroup) is said in the README's Gradescope section.

Killing every process of the user assumes one kernel at a time: Gradescope's runner grades its one
submission in one process (``autograde(workers=0)``); a pool of grading processes must not share the user.

The grading process switches this on with :data:`USER_VARIABLE` (the user's name) and
:data:`EDITION_VARIABLE` (the folder holding the student edition's ``course_utils``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader.config import CPU_VARIABLES

#: The environment variable naming the user kernels run as (unset: the kernel runs as the grader).
USER_VARIABLE = "GRADER_KERNEL_USER"
#: The environment variable naming the folder that holds the student edition's ``course_utils``.
EDITION_VARIABLE = "GRADER_KERNEL_EDITION"


class RunAsError(RuntimeError):
    """Kernels cannot be run as the configured user here; the message says why."""


def kernel_user() -> pwd.struct_passwd | None:
    """The user kernels run as (``$GRADER_KERNEL_USER``), or ``None`` when that is not asked for.

    Raises :class:`RunAsError` when it is asked for but cannot be done: the grader is not root, the
    user does not exist or is root, or the student edition is missing."""
    name = os.environ.get(USER_VARIABLE, "")
    if not name:
        return None
    if os.geteuid() != 0:
        raise RunAsError(f"{USER_VARIABLE}={name}: only root can start a kernel as another user")
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        raise RunAsError(f"{USER_VARIABLE}={name}: no such user (setup.sh creates it)") from None
    if user.pw_uid == 0 or user.pw_gid == 0:
        raise RunAsError(f"{USER_VARIABLE}={name}: the kernel's user must not be root or in root's group")
    if shutil.which("setpriv") is None:
        raise RunAsError("setpriv (util-linux) is not installed: it starts the kernel as another user")
    edition()
    return user


def edition() -> Path:
    """The folder holding the student edition's ``course_utils`` (``$GRADER_KERNEL_EDITION``)."""
    folder = Path(os.environ.get(EDITION_VARIABLE, ""))
    if not str(folder) or not (folder / "course_utils" / "__init__.py").is_file():
        raise RunAsError(f"{EDITION_VARIABLE}={folder}: no student edition of course_utils there")
    if (folder / "course_utils" / "instructor").exists():
        raise RunAsError(f"{folder / 'course_utils'} holds instructor/: that is not the student edition")
    return folder


def drop_prefix(user: pwd.struct_passwd) -> list[str]:
    """``setpriv`` arguments that run the rest of a command as ``user`` with no privilege left."""
    return [shutil.which("setpriv") or "setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
            "--clear-groups", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]


def make_home(user: pwd.struct_passwd, reference: str = "") -> Path:
    """A fresh folder for one kernel, owned by ``user``: its home and working folder, and, with
    ``reference`` (a file of a few helpers' answers, ``grader/reference_subset.py``), a ``lib/`` whose
    ``course_utils`` is the student edition with that file as its ``reference.py``."""
    home = Path(tempfile.mkdtemp(prefix="grader-kernel-home-"))
    (home / ".matplotlib").mkdir()
    if reference:
        package = home / "lib" / "course_utils"
        package.mkdir(parents=True)
        source = edition() / "course_utils"
        for entry in source.iterdir():
            if entry.name not in ("reference.py", "__pycache__"):
                os.symlink(entry, package / entry.name)
        shutil.copyfile(reference, package / "reference.py")
        for path in (home / "lib", package, package / "reference.py"):
            os.chmod(path, 0o555 if path.is_dir() else 0o444)
    for path in (home, home / ".matplotlib"):
        os.chown(path, user.pw_uid, user.pw_gid)
        os.chmod(path, 0o700)
    return home


def kernel_env(home: Path, *, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The kernel's whole environment: nothing of the grader's but the CPU settings
    (``config.CPU_VARIABLES``), ``course_utils`` from the student edition (or ``home/lib``)."""
    lib = home / "lib"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
           "PYTHONPATH": str(lib if lib.is_dir() else edition()), "PYTHONNOUSERSITE": "1",
           "MPLBACKEND": "Agg", "MPLCONFIGDIR": str(home / ".matplotlib"), "LANG": "C.UTF-8",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "NBGRADER_EXECUTION": "autograde", "COURSE_SANDBOX": "1", "TMPDIR": str(home)}
    env.update({key: os.environ[key] for key in CPU_VARIABLES if os.environ.get(key)})
    env.update(extra or {})
    return env


def hand_over(user: pwd.struct_passwd, *, writable: list[str], readable: list[str]) -> None:
    """Let ``user`` write the folders ``writable`` (and the files in them) and read the files ``readable``
    (and traverse their folder); nothing else of the grader's changes owner or mode."""
    for folder in filter(None, writable):
        for path in [folder, *(os.path.join(folder, name) for name in os.listdir(folder))]:
            os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)
    for file in filter(None, readable):
        os.chmod(os.path.dirname(file), 0o711)
        os.chmod(file, 0o444)


def _uids(pid: int) -> set[int]:
    """The uids of a live process (none for a zombie, which runs nothing and is its parent's to reap)."""
    uids: set[int] = set()
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                    return set()
                if line.startswith("Uid:"):
                    uids = {int(v) for v in line.split()[1:]}
    except (OSError, ValueError, IndexError):
        return set()
    return uids


def processes_of(uid: int) -> list[int]:
    """The live processes any of whose uids (real, effective, saved, file system) is ``uid``."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and uid in _uids(int(p))]


def kill_all(user: pwd.struct_passwd, *, wait: float = 5.0) -> int:
    """Kill every process of ``user`` and wait until none is left; how many were seen. A process run as
    the user sends ``kill(-1, SIGKILL)`` (every process the user may signal, all at once, so a fork
    cannot slip past), and ``/proc`` is read until it shows none.

    Raises :class:`RunAsError` if some are still there after ``wait`` seconds."""
    seen: set[int] = set()
    deadline = time.monotonic() + wait
    killer = [*drop_prefix(user), sys.executable, "-I", "-S", "-c", "import os, signal; os.kill(-1, signal.SIGKILL)"]
    while True:
        left = processes_of(user.pw_uid)
        seen.update(left)
        if not left:
            return len(seen)
        if time.monotonic() > deadline:
            raise RunAsError(f"processes of {user.pw_name} still running after {wait:g} s: {left}")
        subprocess.run(killer, env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/", check=False)
        time.sleep(0.02)  # let the killed be reaped
