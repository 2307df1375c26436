"""Warm kernels for the tests: a kernel whose spec names :data:`PROVISIONER` (nbval's, for every solution
notebook: :data:`tests.support.other_cpu.KERNEL_NAME`; the student environment's,
:func:`tests.support.studentenv.add_kernel`) is forked from a pre-imported parent instead of importing
torch, numpy, matplotlib, ipykernel and ``course_utils`` anew (1.5 to 3 CPU-s a kernel).

The parent is the grader's (``grader/zygote.py``) run as ``zygote.py FD plain-fork``: no sandbox (these are
the course's own notebooks, in the edition the kernel's Python has), one fork per kernel. Each pytest
process keeps one parent per interpreter and environment, started with the first such kernel's
environment and working folder, so it imports what that kernel would import, as that kernel would
(``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``, ``OMP_NUM_THREADS`` and ``MPLBACKEND`` are read once,
at import or first use). Each fork then starts as a cold kernel starts: its own environment (with what
the imports set in it), working folder, umask and session, every inherited file descriptor closed,
Python's start-up signal handlers, Python's, numpy's and torch's generators seeded afresh from the
system's entropy, a new ``IPKernelApp``. ``tests/grader_messy/test_warm.py`` compares a forked kernel with
a cold one. String hashes keep the parent's random ``PYTHONHASHSEED`` (a set of strings iterates in the same
order in every kernel of one parent, as in no two cold ones); no notebook's output may depend on it, as
on a cold kernel it would change from run to run.

A kernel starts cold instead, and the tests still pass as before, where its working folder would import
another copy of a package the parent imported, where the parent showed a warning while importing (a fork
would not show it again), or where the parent cannot start (not Linux). ``COURSE_COLD_KERNELS=1`` starts
every kernel cold (conftest.py).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from importlib.machinery import PathFinder
from pathlib import Path

from jupyter_client.provisioning import KernelProvisionerFactory, LocalProvisioner
from jupyter_client.provisioning.factory import EntryPoint

from grader import warm

#: The provisioner's name in a kernel spec's ``metadata.kernel_provisioner`` (see :func:`register`).
PROVISIONER = "course-warm-fork"
ZYGOTE = Path(warm.__file__).with_name("zygote.py")
#: The variables a kernel's environment may differ in from the parent's: set per kernel or per test, read
#: by no import.
PER_KERNEL = ("JPY_", "PYTEST_CURRENT_TEST")

_state: dict = {"parents": {}, "off": "", "forked": 0, "cold": 0}
_lock = threading.Lock()


def register() -> None:
    """Make :data:`PROVISIONER` known to this process's kernel managers (an entry point of our own, without
    installing one)."""
    KernelProvisionerFactory.provisioners[PROVISIONER] = EntryPoint(
        name=PROVISIONER, value=f"{__name__}:WarmProvisioner", group=KernelProvisionerFactory.GROUP_NAME)


def spec_metadata() -> dict:
    """What a kernel spec's ``metadata`` holds to be started by :data:`PROVISIONER`: nothing where this process
    has not registered it (``COURSE_COLD_KERNELS=1``)."""
    if PROVISIONER not in KernelProvisionerFactory.provisioners:
        return {}
    return {"kernel_provisioner": {"provisioner_name": PROVISIONER}}


def counts() -> dict[str, int]:
    """How many kernels this process forked and started cold."""
    return {"forked": _state["forked"], "cold": _state["cold"]}


def _lasting(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(PER_KERNEL)}


class _Parent:
    """A pre-imported parent: ``PYTHON grader/zygote.py FD plain-fork``, in ``env`` and ``cwd``."""

    def __init__(self, python: str, env: dict[str, str], cwd: str):
        self.env = env
        self.lock = threading.Lock()  # one request at a time (kernels may start from several threads)
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [python, str(ZYGOTE), str(theirs.fileno()), "plain-fork"], pass_fds=(theirs.fileno(),),
            env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        theirs.close()
        self.channel = ours
        self.reader = ours.makefile("r", encoding="utf-8")
        self.hello = self._line(300)
        atexit.register(self.close)

    def _line(self, timeout: float) -> dict:
        self.channel.settimeout(timeout)
        line = self.reader.readline()
        if not line:
            raise OSError(f"the warm parent ended (exit status {self.process.poll()})")
        return json.loads(line)

    def why_not(self, env: dict[str, str], cwd: str) -> str:
        """Why a kernel in ``env`` and ``cwd`` must start cold (empty: it may be forked)."""
        if not self.hello.get("ready"):
            return f"the warm parent could not import: {self.hello.get('error')}"
        if self.hello.get("warned"):
            return f"the warm parent was warned while importing ({self.hello['warned'][0]})"
        if self.process.poll() is not None:
            return "the warm parent ended"
        lasting = _lasting(env)
        if lasting != self.env:
            names = sorted(k for k in lasting.keys() | self.env.keys() if lasting.get(k) != self.env.get(k))
            return f"its environment differs in {', '.join(names)}"
        for name, origin in self.hello["origins"].items():
            spec = PathFinder.find_spec(name, [cwd])
            if spec is not None and spec.origin != origin:
                return f"its working folder has another {name}"
        return ""

    def fork(self, request: dict) -> int:
        with self.lock:
            self.channel.sendall((json.dumps(request) + "\n").encode())
            reply = self._line(60)
        if "pid" not in reply:
            raise OSError(f"the warm parent could not fork a kernel: {reply.get('error')}")
        return int(reply["pid"])

    def close(self) -> None:
        self.channel.close()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def _parent(python: str, env: dict[str, str], cwd: str) -> _Parent | None:
    """The parent for kernels of ``python`` in ``env`` (one per interpreter and environment, started with
    the first such kernel's working folder), or ``None`` where none can run."""
    if sys.platform != "linux" or not hasattr(os, "pidfd_open"):
        _state["off"] = "warm kernels need Linux with pidfd_open"
        return None
    key = (python, tuple(sorted(_lasting(env).items())))
    with _lock:
        if key not in _state["parents"]:
            try:
                _state["parents"][key] = _Parent(python, _lasting(env), cwd)
            except (OSError, ValueError) as exc:
                _state["off"] = f"the warm parent could not start ({exc})"
                return None
        return _state["parents"][key]


class WarmProvisioner(LocalProvisioner):
    """A local provisioner whose kernel is forked from this process's warm parent where that is sound (see
    the module's docstring); otherwise the kernel starts cold, as :class:`LocalProvisioner` starts it.
    ``forked`` says which."""

    forked = False
    sockets = ""

    async def pre_launch(self, **kwargs):
        # Unix sockets in a folder of this kernel's own, as the grader's kernels have (grader/kernels.py), not
        # TCP ports: the manager picks free ports and closes them, and the kernel binds them later; one that
        # something took meanwhile (another kernel's client connecting, say) killed the kernel before it
        # answered ("Kernel died before replying to kernel_info"), with two kernels starting at once.
        km = self.parent
        if km is not None and not self.sockets:
            self.sockets = tempfile.mkdtemp(prefix="course-kernel-")
            km.transport, km.ip = "ipc", os.path.join(self.sockets, "k")
        return await super().pre_launch(**kwargs)

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart)
        if self.sockets and not restart:
            shutil.rmtree(self.sockets, ignore_errors=True)
            self.sockets = ""

    async def launch_kernel(self, cmd: list[str], **kwargs):
        env = dict(kwargs.get("env") or os.environ)
        if not kwargs.get("independent"):
            env["JPY_PARENT_PID"] = str(os.getpid())  # as jupyter_client.launcher.launch_kernel sets it
        cwd = os.path.abspath(kwargs.get("cwd") or os.getcwd())  # as Popen takes it, from here
        self.forked = False
        if cmd[1:4] == ["-m", "ipykernel_launcher", "-f"] and len(cmd) == 5:
            parent = _parent(cmd[0], env, cwd)
            why = parent.why_not(env, cwd) if parent is not None else _state["off"]
            if not why:
                umask = os.umask(0o022)
                os.umask(umask)
                try:
                    pid = parent.fork({"connection_file": cmd[4], "env": env, "cwd": cwd, "umask": umask,
                                       "ignored": warm.ignored_signals()})
                except (OSError, ValueError):
                    pass  # cold, below
                else:
                    self.process = warm.KernelProcess(pid, None, init=False)
                    self.pid = self.pgid = pid  # the kernel leads a session of its own
                    self.cwd = cwd
                    self.forked = True
                    with _lock:
                        _state["forked"] += 1
                    return self.connection_info
        with _lock:
            _state["cold"] += 1
        return await super().launch_kernel(cmd, **kwargs)
