"""A cap on how many processes one sandboxed kernel may run: a fork bomb stops at it.

The sandbox's PID namespace ends every process with its kernel, and each process has a memory cap,
but while a kernel runs nothing bounds how many processes it starts: ``RLIMIT_NPROC`` does not apply to
root, and the grader often runs as root (CI, containers). Thousands of processes would slow every
other student's kernel on the machine into its time limits. So each kernel runs in a ``pids`` cgroup of
its own, with ``pids.max`` = :data:`PIDS_MAX`: past it, ``fork`` fails inside the sandbox (the student's
cell gets the error) and the rest of the machine is untouched.

Where this process cannot make cgroups (no ``pids`` controller, or no right to write it: a user
without delegation), :func:`make_group` returns ``None`` and the kernel runs without the cap, as before;
:func:`status` says why. Both cgroup v1 (a ``pids`` hierarchy) and v2 (the unified hierarchy) work.
"""

from __future__ import annotations

import functools
import os
import signal
import time
import uuid
from pathlib import Path

#: Most processes (threads included) one kernel may have at once: a kernel and its helpers use about 40.
PIDS_MAX = 512
_MOUNTS = Path("/sys/fs/cgroup")


def _own_group() -> tuple[Path, str] | None:
    """``(folder of this process's pids cgroup, "v1" | "v2")``, or ``None``."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:  # v1: "8:pids:/path"
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(",") and (_MOUNTS / "pids").is_dir():
            return _MOUNTS / "pids" / path.lstrip("/"), "v1"
    for line in lines:  # v2: "0::/path"
        if line.startswith("0::") and "pids" in _read(_MOUNTS / "cgroup.controllers").split():
            return _MOUNTS / line[3:].lstrip("/"), "v2"
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class Group:
    """One kernel's pids cgroup: :meth:`join_prefix` puts a command in it, :meth:`remove` ends it."""

    def __init__(self, folder: Path):
        self.folder = folder

    def join_prefix(self) -> list[str]:
        """Arguments to put before a command so that it (and all it starts) runs in this group."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.folder / "cgroup.procs")]

    def remove(self) -> None:
        """End what is left in the group, then remove it (best effort: a group that will not go is left)."""
        for _ in range(50):
            pids = [int(p) for p in _read(self.folder / "cgroup.procs").split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.02)
        for _ in range(50):
            try:
                self.folder.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)


def make_group(pids_max: int = PIDS_MAX) -> Group | None:
    """A new pids cgroup capped at ``pids_max`` processes, or ``None`` where none can be made here."""
    if status()[0] is False:
        return None
    return _make(pids_max)


def _make(pids_max: int) -> Group | None:
    found = _own_group()
    if found is None:
        return None
    parent, version = found
    if version == "v2" and "pids" not in _read(parent / "cgroup.subtree_control").split():
        try:
            (parent / "cgroup.subtree_control").write_text("+pids")
        except OSError:
            return None
    folder = parent / f"grader-kernel-{uuid.uuid4().hex[:12]}"
    try:
        folder.mkdir()
    except OSError:
        return None
    try:
        (folder / "pids.max").write_text(str(pids_max))
    except OSError:
        Group(folder).remove()
        return None
    return Group(folder)


@functools.lru_cache(maxsize=1)
def status() -> tuple[bool, str]:
    """Whether kernels get a process cap here, and if not, why (tried once per process)."""
    found = _own_group()
    if found is None:
        return False, "no pids cgroup controller is mounted here"
    group = _make(PIDS_MAX)
    if group is None:
        return False, f"this user cannot make pids cgroups under {found[0]}"
    group.remove()
    return True, f"each kernel is capped at {PIDS_MAX} processes (pids cgroup {found[1]})"
