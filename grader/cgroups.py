"""Caps on one sandboxed kernel as a whole: how many processes it may run, and how much memory they
may hold together.

The sandbox's PID namespace ends every process with its kernel, and each process has an address-space
cap (``prlimit``), but while a kernel runs nothing else bounds it: ``RLIMIT_NPROC`` does not apply to
root, and the grader often runs as root (CI, containers). Thousands of processes would slow every
other student's kernel on the machine into its time limits, and a few hundred processes each just
under the memory cap would hold far more memory than the machine has. So each kernel runs in cgroups of
its own:

* ``pids``: ``pids.max`` = :data:`PIDS_MAX`; past it, ``fork`` fails inside the sandbox (the student's
  cell gets the error) and the rest of the machine is untouched;
* ``memory`` (where the machine has the controller and the grader may use it): the kernel's processes
  together may hold the kernel's memory cap (v1 ``memory.limit_in_bytes``, swap included; v2
  ``memory.max``, no swap); past it the kernel's own out-of-memory killer ends one of them, which
  costs that cell as any crash does, and the rest of the machine is untouched.

Where this process cannot make cgroups (no controller, or no right to write it: a user without
delegation), :func:`make_group` returns ``None`` (or a group without the memory cap) and the kernel
runs without that cap, as before; :func:`status` says why. Both cgroup v1 (a hierarchy per controller)
and v2 (the unified hierarchy) work.
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


def _own_group(controller: str = "pids") -> tuple[Path, str] | None:
    """``(folder of this process's cgroup for controller, "v1" | "v2")``, or ``None``."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:  # v1: "8:pids:/path"
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(",") and (_MOUNTS / controller).is_dir():
            return _MOUNTS / controller / path.lstrip("/"), "v1"
    for line in lines:  # v2: "0::/path"
        if line.startswith("0::") and controller in _read(_MOUNTS / "cgroup.controllers").split():
            return _MOUNTS / line[3:].lstrip("/"), "v2"
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class Group:
    """One kernel's cgroups (one folder per v1 hierarchy; one folder under v2): :meth:`join_prefix`
    puts a command in them, :meth:`remove` ends them. ``folder`` is the pids group's; ``memory_max``
    the memory cap in bytes, or ``None`` where the kernel has none."""

    def __init__(self, folder: Path, others: tuple[Path, ...] = (), memory_max: int | None = None):
        self.folder = folder
        self.folders = (folder, *[f for f in others if f != folder])
        self.memory_max = memory_max

    def join_prefix(self) -> list[str]:
        """Arguments to put before a command so that it (and all it starts) runs in these groups."""
        # sh -c SCRIPT sh PROCS... -- COMMAND...: writes its own pid into each PROCS file, then becomes COMMAND.
        script = 'for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 1; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *[str(f / "cgroup.procs") for f in self.folders], "--"]

    def remove(self) -> None:
        """End what is left in the groups, then remove them (best effort: a group that will not go is left)."""
        for folder in self.folders:
            _end(folder)


def _end(folder: Path) -> None:
    # Waits of 1 ms doubling to 20 ms (about 1 s in all): a killed process is gone within a few ms, and
    # this runs once per notebook graded.
    waits = [min(0.02, 0.001 * 2 ** i) for i in range(55)]
    for wait in waits:
        pids = [int(p) for p in _read(folder / "cgroup.procs").split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(wait)
    for wait in waits:
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(wait)


def make_group(pids_max: int = PIDS_MAX, memory_max: int | None = None) -> Group | None:
    """New cgroups for one kernel: at most ``pids_max`` processes, and with ``memory_max`` (bytes) at most
    that much memory for all of them together where a memory cgroup can be made here
    (:func:`memory_status`). ``None`` where no pids cgroup can be made here."""
    if status()[0] is False:
        return None
    group = _make(pids_max)
    if group is None or not memory_max or memory_max <= 0 or not memory_status()[0]:
        return group
    memory = _make_memory(memory_max, group.folder)
    return group if memory is None else Group(group.folder, (memory,), memory_max)


def _child(controller: str) -> Path | None:
    """A new, empty cgroup folder under this process's own for ``controller`` (``None`` if none can be made)."""
    found = _own_group(controller)
    if found is None:
        return None
    parent, version = found
    if version == "v2" and controller not in _read(parent / "cgroup.subtree_control").split():
        try:
            (parent / "cgroup.subtree_control").write_text(f"+{controller}")
        except OSError:
            return None
    folder = parent / f"grader-kernel-{uuid.uuid4().hex[:12]}"
    try:
        folder.mkdir()
    except OSError:
        return None
    return folder


def _make(pids_max: int) -> Group | None:
    folder = _child("pids")
    if folder is None:
        return None
    try:
        (folder / "pids.max").write_text(str(pids_max))
    except OSError:
        _end(folder)
        return None
    return Group(folder)


def _make_memory(memory_max: int, pids_folder: Path) -> Path | None:
    """The memory cgroup of a kernel: its ``pids`` folder itself under v2, a folder of its own under v1."""
    found = _own_group("memory")
    if found is None:
        return None
    version = found[1]
    if version == "v2":
        folder = pids_folder
        parent = folder.parent
        if "memory" not in _read(parent / "cgroup.subtree_control").split():
            try:
                (parent / "cgroup.subtree_control").write_text("+memory")
            except OSError:
                return None
        settings = [("memory.max", memory_max), ("memory.swap.max", 0)]
    else:
        folder = _child("memory")
        if folder is None:
            return None
        settings = [("memory.limit_in_bytes", memory_max), ("memory.memsw.limit_in_bytes", memory_max)]
    try:
        for name, value in settings:
            if name == settings[0][0] or (folder / name).exists():  # swap accounting may be off
                (folder / name).write_text(str(value))
    except OSError:
        if folder != pids_folder:
            _end(folder)
        return None
    return folder


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


@functools.lru_cache(maxsize=1)
def memory_status() -> tuple[bool, str]:
    """Whether a kernel's processes get a memory cap together here, and if not, why (tried once per process)."""
    found = _own_group("memory")
    if found is None:
        return False, "no memory cgroup controller is mounted here"
    group = _make(PIDS_MAX) if found[1] == "v2" else None
    if found[1] == "v2" and group is None:
        return False, f"this user cannot make cgroups under {found[0]}"
    folder = _make_memory(1024**3, group.folder if group is not None else Path())
    if group is not None:
        group.remove()
    elif folder is not None:
        _end(folder)
    if folder is None:
        return False, f"this user cannot make memory cgroups under {found[0]}"
    return True, f"each kernel's processes share its memory cap (memory cgroup {found[1]})"
