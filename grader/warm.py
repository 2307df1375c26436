"""Warm kernels: each grading process keeps one warm parent in the sandbox and forks a kernel per notebook.

A cold kernel spends 2.5 to 3.5 s importing torch, numpy, matplotlib, ipykernel and the checks before
its first cell. The warm parent (:mod:`grader.zygote`, inside bubblewrap, started as a cold kernel is:
same binds, same environment, the student edition of ``course_utils``, the same limits) pays that once
per grading process; each kernel is then a fork of it in namespaces of its own (see the zygote's
docstring), with the notebook's own hand-off folder, hidden inputs and cut-down reference bound
where a cold kernel sees them. The precedents: SageMathCell's forking kernel manager, Android's
zygote, ``multiprocessing``'s fork server with preloaded modules.

Here, the grader's side: :func:`enable` (a grading process's start), :func:`current` (the parent,
``None`` where kernels are cold), :class:`WarmParent` (starting it, asking it for a kernel, finding that
kernel's process on this machine) and :class:`KernelProcess` (the handle a kernel manager holds).
Where the parent cannot run (no bubblewrap, not Linux, no user namespaces inside the sandbox),
:func:`check` says why and the grader uses cold kernels.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing.util
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from grader import cgroups, sandbox

#: Where the warm parent sees this module's partner (bound read-only: the sandbox shows no ``grader``).
ZYGOTE_INSIDE = "/run/grader/zygote.py"
#: Where a forked kernel's file system is staged before its /tmp is laid out, and matplotlib's font list.
STASH_INSIDE = "/run/grader-stash"
#: Where a forked kernel sees the parent's /tmp for a moment, to bind again what the sandbox shows under it.
OLD_TMP_INSIDE = "/run/grader-old-tmp"
FONTS_INSIDE = "/run/grader-fonts"

_state: dict = {"parent": None, "enabled": False, "memory": 0, "meta": True, "lost": 0, "suspended": 0, "said": False}
_lock = threading.Lock()


def check() -> tuple[bool, str]:
    """Whether a warm parent can run here (a quick try: a sandboxed process makes the namespaces a
    forked kernel needs), and if not, why."""
    if sys.platform != "linux" or not hasattr(os, "pidfd_open"):
        return False, f"warm kernels need Linux with pidfd_open (this is {sys.platform})"
    exe = sandbox.bwrap_path()
    if exe is None:
        return False, "bubblewrap is not installed"
    probe = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)\n"
             "assert libc.unshare(0x10000000 | 0x00020000 | 0x20000000 | 0x08000000 | 0x04000000 | 0x40000000) == 0, "
             "os.strerror(ctypes.get_errno())\n")
    with tempfile.TemporaryDirectory(prefix="grader-warm-check-") as folder:
        cmd = sandbox.sandbox_command([sys.executable, "-c", probe], socket_dir=folder, memory=0, bwrap=exe)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"the sandbox could not start: {exc}"
    if done.returncode != 0:
        return False, ("a sandboxed process cannot make user, mount and PID namespaces here: "
                       + (done.stderr.strip().splitlines() or ["?"])[-1])
    return True, "warm kernels: one pre-imported parent per grading process, a fresh fork per notebook"


#: Notebooks from this one on run the checks' meta-device probes, which import torch._dynamo and sympy
#: lazily (about 1 CPU-s): their parent imports those too.
META_FROM = "04"


def needs_meta(notebooks: list[str]) -> bool:
    """Whether a parent for ``notebooks`` should import the meta device's lazy parts."""
    return any(name[:2] >= META_FROM for name in notebooks)


def check_in_background() -> Callable[[], tuple[bool, str]]:
    """:func:`check`, started now in a thread (its sandboxed probe takes a second on a busy machine, which the
    grader spends reading the submissions meanwhile): call what this returns for the answer (it waits)."""
    answers: list[tuple[bool, str]] = []

    def run() -> None:
        try:
            answers.append(check())
        except Exception as exc:  # noqa: BLE001 - said, and kernels are cold
            answers.append((False, f"the check failed: {type(exc).__name__}: {exc}"))
    thread = threading.Thread(target=run, name="warm-check", daemon=True)
    thread.start()

    def answer() -> tuple[bool, str]:
        thread.join()
        return answers[0]
    return answer


def enable(memory: int, meta: bool = True, started: "Started | None" = None) -> None:
    """Grade this process's notebooks with warm kernels; start the parent now (it imports while the
    grader prepares the first notebook), or adopt ``started``, one the grader's main process started for
    this process (:class:`Prestarted`). ``meta``: see :func:`needs_meta`."""
    _state.update(enabled=True, memory=memory, meta=meta)
    if started is not None:
        with _lock:
            _state["parent"] = WarmParent(memory, meta, started=started)
    current()


def disable() -> None:
    """Cold kernels from now on in this process; the parent, if any, is stopped."""
    _state["enabled"] = False
    parent = _state["parent"]
    _state["parent"] = None
    if parent is not None:
        parent.close()


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Cold kernels inside the ``with`` block (a notebook graded again after its parent died)."""
    _state["suspended"] += 1
    try:
        yield
    finally:
        _state["suspended"] -= 1


def lost() -> int:
    """How many times this process's warm parent was found dead (each notebook it served then is graded
    again with a cold kernel, :func:`grader.autograde.grade_student`)."""
    return _state["lost"]


def current() -> "WarmParent | None":
    """This process's warm parent (started, or restarted after it died), or ``None``: cold kernels."""
    if not _state["enabled"] or _state["suspended"]:
        return None
    with _lock:
        parent = _state["parent"]
        if parent is not None and not parent.alive():
            parent.close()
            if not parent.served:  # it never got ready: it will not on a second try either
                _say(f"grader: the warm parent could not start ({parent.why()}); using cold kernels")
                _state.update(enabled=False, parent=None)
                return None
            _state["lost"] += 1
            parent = None
        if parent is None:
            try:
                parent = WarmParent(_state["memory"], _state["meta"])
            except OSError as exc:
                _say(f"grader: the warm parent could not start ({exc}); using cold kernels")
                _state["enabled"] = False
                return None
            _state["parent"] = parent
        return parent


def _say(line: str) -> None:
    if not _state["said"]:
        _state["said"] = True
        print(line, file=sys.stderr, flush=True)


def ignored_signals() -> list[int]:
    """The signals this process ignores: a kernel it starts ignores them too (an ignored signal stays
    ignored through ``execve``; ``subprocess`` resets only SIGPIPE and SIGXFSZ), so a forked one must."""
    found = []
    for sig in signal.valid_signals():
        if sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            if signal.getsignal(sig) is signal.SIG_IGN:
                found.append(int(sig))
        except (OSError, ValueError):
            pass
    return found


def adopt_hand_off(handoff, parent: "WarmParent") -> None:
    """Move a notebook's hand-off folders (``grader.judge.HandOff``) into ``parent``'s staging folder,
    where the notebook's forked kernels can have them bound; the judge reads them from there."""
    home = Path(tempfile.mkdtemp(prefix="handoff-", dir=parent.folder))
    outputs = home / "outputs"
    inputs_dir = home / "inputs"
    shutil.move(handoff.outputs, outputs)
    shutil.move(str(Path(handoff.inputs).parent), inputs_dir)
    handoff.outputs = str(outputs)
    handoff.inputs = str(inputs_dir / Path(handoff.inputs).name)


class KernelProcess:
    """A forked kernel's PID 1 as seen from here (not this process's child): what a ``Popen`` is to the
    kernel manager. Killing it ends every process of the kernel's PID namespace. With ``init=False``, a
    kernel forked as it is (the tests' warm kernels, ``tests/support/warm_kernel.py``), which takes every
    signal."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int, group: "cgroups.Group | None", kernel_pid: int = 0, *, init: bool = True):
        self.pid = pid
        self.init = init
        self.kernel_pid = kernel_pid  # the kernel itself (PID 2 of its namespace)
        self.returncode: int | None = None
        self._fd = os.pidfd_open(pid)
        self._group = group

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._fd], [], [], 0)[0]:
            self._ended()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"kernel {self.pid}", timeout)
            self._ended()
        return self.returncode  # type: ignore[return-value]

    def _ended(self) -> None:
        self.returncode = -signal.SIGKILL  # not our child: its status is its parent's to read
        os.close(self._fd)
        self._fd = -1
        if self._group is not None:
            self._group.remove()

    def send_signal(self, signum: int) -> None:
        # PID 1 of a namespace takes only SIGKILL (and SIGSTOP) from outside it: every stop is a kill.
        if self.returncode is None and self._fd >= 0 and signum:
            signal.pidfd_send_signal(self._fd, signal.SIGKILL if self.init else signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    terminate = kill


@dataclass
class Started:
    """A warm parent just started (:func:`start`): what a grading process needs to use it. It pickles (for a
    grading process that adopts it, :class:`Prestarted`) without ``process``, the ``Popen`` of the process
    that started it; the adopter follows the parent by its PID instead (a pidfd)."""

    folder: Path
    channel: socket.socket  # the grader's end; the parent holds the other
    channel_inode: int  # the parent's end, which no kernel may hold
    pid: int
    group: "cgroups.Group | None"
    fonts: list[str]
    keep: list[str]
    process: "subprocess.Popen | None" = field(default=None, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "process": None}


def start(memory: int, meta: bool = True) -> Started:
    """Start a warm parent: ``bwrap ... python zygote.py FD`` under the kernel's limits (``memory``, bytes), in
    its own staging folder and cgroup. It imports in the background; :meth:`WarmParent.ready` waits for it."""
    folder = Path(tempfile.mkdtemp(prefix="grader-warm-"))
    os.chmod(folder, 0o700)
    fonts = sandbox.font_cache()
    # What the sandbox shows under /tmp (Python, the virtual environment, course_utils: where the course
    # itself lives under /tmp), which each kernel's fresh /tmp must show again; never the staging folder.
    keep = sorted(p for p in sandbox.readable_paths() if Path(p).is_relative_to("/tmp"))
    if any(folder.resolve().is_relative_to(p) for p in keep):
        raise OSError(f"the staging folder {folder} lies inside a folder the kernel reads")
    extra = ["--ro-bind", str(Path(__file__).with_name("zygote.py")), ZYGOTE_INSIDE, "--dir", STASH_INSIDE,
             "--dir", OLD_TMP_INSIDE]
    if fonts is not None:
        extra += ["--ro-bind", str(fonts), FONTS_INSIDE]
    if os.geteuid() == 0:
        # Run as root, the parent maps uid 0 into each kernel's user namespace, which Linux allows only
        # to a process that may set file capabilities (its own namespace's, not the machine's).
        extra += ["--cap-add", "CAP_SETFCAP"]
    exe = sandbox.bwrap_path()
    if exe is None:
        raise OSError("bubblewrap is not installed")
    ours, theirs = socket.socketpair()
    cmd = sandbox.sandbox_command([sys.executable, ZYGOTE_INSIDE, str(theirs.fileno()), "meta" if meta else "plain"],
                                  socket_dir=str(folder), memory=memory, bwrap=exe, student_edition=True, extra=extra)
    group = cgroups.make_group(memory_max=memory or None)
    prefix = group.join_prefix() if group is not None else []
    process = subprocess.Popen(prefix + cmd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL)
    inode = os.fstat(theirs.fileno()).st_ino
    theirs.close()
    return Started(folder, ours, inode, process.pid, group,
                   sorted(p.name for p in fonts.glob("fontlist-*.json")) if fonts is not None else [], keep, process)


class Prestarted:
    """Warm parents the grader's main process starts for a grading pool's processes (:func:`prestart`), so
    that they import beside the pool's fork server instead of after it: each grading process adopts one
    (:meth:`claim`, in its initializer). The main process stays their parent: :meth:`end` stops and reaps
    them once the pool has ended (a grading process that adopted one stops it when it leaves)."""

    def __init__(self, started: list[Started], counter: Any):
        self.started = started
        self._counter = counter  # a ``multiprocessing`` Value shared by the pool's processes

    def claim(self) -> "Started | None":
        """The next parent nobody took (``None`` when all are taken); the others' channels are closed here."""
        with self._counter.get_lock():
            index = self._counter.value
            self._counter.value += 1
        for i, other in enumerate(self.started):
            if i != index:
                other.channel.close()
        return self.started[index] if index < len(self.started) else None

    def end(self) -> None:
        """In the process that started them: stop those still running, reap them, remove their folders."""
        for started in self.started:
            started.channel.close()
            _stop(started.process, started.group, started.folder)


def prestart(count: int, memory: int, meta: bool, context: Any) -> "Prestarted | None":
    """``count`` warm parents for a pool of ``context`` (its ``Value`` counts the claims); ``None`` where one
    cannot start here (each grading process then starts its own, or says why it cannot)."""
    started: list[Started] = []
    try:
        for _ in range(count):
            started.append(start(memory, meta))
    except OSError:
        Prestarted(started, None).end()
        return None
    return Prestarted(started, context.Value("i", 0))


class WarmParent:
    """One grading process's warm parent: ``bwrap ... python zygote.py FD`` under the kernel's limits, started
    here (:func:`start`) or adopted (``started``: one the grader's main process started, :class:`Prestarted`)."""

    def __init__(self, memory: int, meta: bool = True, *, started: Started | None = None):
        if started is None:
            started = start(memory, meta)
            self.process: "subprocess.Popen | KernelProcess" = started.process  # type: ignore[assignment]
        else:  # not this process's child: followed by a pidfd, as a forked kernel is
            self.process = KernelProcess(started.pid, None, init=False)
        self.folder, self.fonts, self.keep, self.group = started.folder, started.fonts, started.keep, started.group
        self.channel_inode = started.channel_inode
        self._count = itertools.count()
        self._channel = started.channel
        self._reader = started.channel.makefile("r", encoding="utf-8")
        self.hello: dict | None = None
        # A grading process leaves through os._exit: multiprocessing's exit hooks run there, atexit's do not.
        multiprocessing.util.Finalize(self, WarmParent.close, args=(self,), exitpriority=1)

    def alive(self) -> bool:
        return self.process.poll() is None and (self.hello is None or bool(self.hello.get("ready")))

    @property
    def served(self) -> bool:
        """Whether it got ready (imported, said hello) at all."""
        return bool(self.hello and self.hello.get("ready"))

    def why(self) -> str:
        """Why it is not serving, in words."""
        if self.hello is not None and not self.hello.get("ready"):
            return str(self.hello.get("error"))
        return f"it ended with exit status {self.process.poll()}"

    def _line(self, timeout: float) -> dict:
        self._channel.settimeout(timeout)
        try:
            line = self._reader.readline()
        except (OSError, TimeoutError) as exc:
            raise OSError(f"the warm parent did not answer: {exc}") from exc
        if not line:
            raise OSError(f"the warm parent ended (exit status {self.process.poll()})")
        return json.loads(line)

    def ready(self, timeout: float = 180) -> dict:
        """The parent's hello once it has imported (``seconds``, ``modules``); ``OSError`` if it cannot."""
        if self.hello is None:
            try:
                self.hello = self._line(timeout)
            except OSError as exc:
                self.hello = {"ready": False, "error": str(exc)}
                self.process.kill()
            if not self.hello.get("ready"):
                raise OSError(f"the warm parent could not import: {self.hello.get('error')}")
        return self.hello

    def stage(self) -> Path:
        """A new folder for one kernel's files (its sockets, its reference) under the staging folder."""
        folder = self.folder / f"k{next(self._count)}"
        (folder / "sockets").mkdir(parents=True)
        os.chmod(folder / "sockets", 0o700)
        return folder

    def spawn(self, stage: Path, *, connection_file: str, env: dict[str, str], probe_dir: str = "",
              probe_inputs: str = "", reference: str = "", memory: int = 0) -> KernelProcess:
        """A forked kernel for one notebook: ``connection_file`` in ``stage/sockets``; with ``probe_dir``
        and ``probe_inputs`` (moved under the staging folder, :func:`adopt_hand_off`) its hand-off, with
        ``reference`` its cut-down reference. It runs in a cgroup of its own, as a cold kernel does."""
        def rel(path: str) -> str:
            return str(Path(path).resolve().relative_to(self.folder.resolve()))

        request = {"warm_root": str(self.folder), "stash": STASH_INSIDE, "fonts_dir": FONTS_INSIDE, "fonts": self.fonts,
                   "tmp_size": sandbox.TMP_SIZE, "socket_dir": str(stage / "sockets"), "sources": {},
                   "connection_file": connection_file, "env": env, "keep": self.keep, "old_tmp": OLD_TMP_INSIDE,
                   "ignored": ignored_signals()}
        request["sources"]["sockets"] = rel(str(stage / "sockets"))
        if probe_dir and probe_inputs:
            request.update(probe_dir=sandbox.PROBE_DIR_INSIDE, probe_inputs_dir=sandbox.PROBE_INPUTS_INSIDE)
            request["sources"].update(probe=rel(probe_dir), inputs=rel(str(Path(probe_inputs).parent)))
        if reference:
            shutil.copyfile(reference, stage / "reference.py")
            request["reference"] = str(Path(sandbox._course_utils_dir()) / "reference.py")
            request["sources"]["reference"] = rel(str(stage / "reference.py"))
        self.ready()
        self._channel.sendall((json.dumps(request) + "\n").encode())
        reply = self._line(120)
        if "pid" not in reply:
            raise OSError(f"the warm parent could not fork a kernel: {reply.get('error')}")
        init, kernel = self._host_pids(int(reply["pid"]))
        group = cgroups.make_group(memory_max=memory or None)
        if group is not None:
            try:
                for folder in group.folders:
                    for pid in (init, kernel):
                        (folder / "cgroup.procs").write_text(str(pid))
            except OSError:
                group.remove()
                os.kill(init, signal.SIGKILL)
                raise
        return KernelProcess(init, group, kernel)

    def _host_pids(self, inner: int) -> tuple[int, int]:
        """(PID 1 of the forked kernel's namespace, the kernel) as this machine numbers them: found among
        this parent's descendants by the PID the parent gave (its own namespace's numbering)."""
        table: dict[int, tuple[int, list[int]]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                text = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
            table[int(entry)] = (int(fields.get("PPid", "0")), [int(x) for x in fields.get("NSpid", "").split()])

        def descends(pid: int) -> bool:
            for _ in range(16):
                if pid == self.process.pid:
                    return True
                pid = table.get(pid, (0, []))[0]
                if pid <= 1:
                    return False
            return False

        init = [pid for pid, (_, ns) in table.items() if len(ns) >= 3 and ns[-1] == 1 and ns[-2] == inner
                and descends(pid)]
        if len(init) != 1:
            raise OSError(f"the forked kernel {inner} was not found on this machine ({len(init)} candidates)")
        kernel = [pid for pid, (ppid, _) in table.items() if ppid == init[0]]
        if len(kernel) != 1:
            raise OSError(f"the forked kernel's process was not found ({len(kernel)} candidates)")
        return init[0], kernel[0]

    def close(self) -> None:
        """Stop the parent and every kernel it forked; remove its folders and cgroups."""
        with contextlib.suppress(OSError):
            self._channel.close()
        _stop(self.process, self.group, self.folder)


def _stop(process: "subprocess.Popen | KernelProcess | None", group: "cgroups.Group | None", folder: Path) -> None:
    """Kill a warm parent's process (where this process holds one) and wait for it; end its cgroup (and what is
    left in it) and remove its staging folder."""
    if process is not None:
        if process.poll() is None:
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
    if group is not None:
        group.remove()
    shutil.rmtree(folder, ignore_errors=True)
